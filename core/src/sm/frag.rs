//! Fragments and the slot encoding (the seed's `MCA_BTL_SM_FRAG_TYPE_MASK`
//! and `MCA_BTL_SM_FRAG_STATUS_MASK`).
//!
//! A fragment is a [`FragHeader`] followed by its payload, allocated by its
//! owner in the owner's part of the segment at an offset aligned to
//! [`FRAG_ALIGN`]. A FIFO slot carries the fragment's [`ShmOffset`] with the
//! three low bits (free because of the alignment) reused:
//!
//! ```text
//!  63  62 ........ 48  47 ........................ 3   2        1..0
//! [ 0 ][ owner rank  ][ byte offset / 8            ][ error ][ type ]
//! ```
//!
//! type: `0` SEND, `1` ACK, `2` PUT and `3` GET (reserved, refused for now);
//! error: set on an ACK whose handler failed. A SEND carries the fragment to
//! the receiver (the owner field is the fragment's owner, the sender); the
//! receiver runs the handler, then pushes the same fragment back to its
//! owner as an ACK, whose owner field names the *acknowledging* rank instead
//! (the fragment is always the ACK receiver's own, at that offset of its
//! part), so the owner can check that the ACK came from the rank the
//! fragment was sent to; the owner completes and recycles it.
//!
//! Each header carries a sequence number (per sender and receiver, counted
//! by the sender) and a check word over every other field
//! ([`header_check`]), written by the owner before each send: a receiver
//! detects a header changed while in flight (the check), and a replayed,
//! duplicated or lost SEND (the sequence).
//!
//! Everything decoded here comes from another process: [`Slot::decode`] and
//! [`read_frag`] check every field (reserved bit, type, owner, bounds,
//! the check word, length against capacity, capacity against the
//! receiver's limit) and return a typed [`FragError`].
#![allow(unsafe_code)]

use core::mem::size_of;

use crate::shm::{OffsetError, Region, ResolveError, SegmentTable, ShmOffset, ShmSafe};
use crate::sync::{AtomicU32, Ordering};

/// Alignment of every fragment (and so of the offsets that slots carry).
pub const FRAG_ALIGN: u64 = 8;
/// Bits of a slot value holding the fragment type.
pub const TYPE_MASK: u64 = 0b011;
/// Bit of a slot value flagging an error status.
pub const STATUS_BIT: u64 = 0b100;
/// Largest active-message tag (tags are 8-bit, as the seed's
/// `mca_btl_base_tag_t`).
pub const MAX_TAG: u32 = u8::MAX as u32;

/// What a slot asks the receiver to do with the fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum FragType {
    /// Deliver the payload to the handler of its tag, then ACK.
    Send = 0,
    /// A fragment of ours came back: complete and recycle it.
    Ack = 1,
    /// Reserved for a shared-memory put.
    Put = 2,
    /// Reserved for a shared-memory get.
    Get = 3,
}

/// A decoded FIFO slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Slot {
    /// What to do with the fragment.
    pub kind: FragType,
    /// Error status (on an ACK: the handler failed or the fragment was bad).
    pub error: bool,
    /// Where the fragment is.
    pub frag: ShmOffset,
}

/// A slot value could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SlotError {
    /// The value is the FIFO's FREE sentinel.
    #[error("slot holds the FREE sentinel")]
    Free,
    /// The reserved bit 63 is set.
    #[error("slot value {raw:#018x} has the reserved bit set")]
    ReservedBit {
        /// The raw slot value.
        raw: u64,
    },
    /// PUT or GET, which this version does not carry in slots.
    #[error("slot value {raw:#018x} has unsupported type {kind:?}")]
    UnsupportedType {
        /// The type found.
        kind: FragType,
        /// The raw slot value.
        raw: u64,
    },
    /// Encoding: the fragment offset is not [`FRAG_ALIGN`]-aligned.
    #[error("fragment {frag:?} is not {FRAG_ALIGN}-byte aligned")]
    Misaligned {
        /// The offending offset.
        frag: ShmOffset,
    },
}

impl Slot {
    /// A slot for `frag`; fails if the offset is not [`FRAG_ALIGN`]-aligned.
    pub fn new(kind: FragType, frag: ShmOffset, error: bool) -> Result<Self, SlotError> {
        if frag.offset() % FRAG_ALIGN != 0 {
            return Err(SlotError::Misaligned { frag });
        }
        Ok(Self { kind, error, frag })
    }

    /// The 64-bit value to push into a FIFO (never the FREE sentinel: bit
    /// 63 is always clear).
    pub const fn encode(self) -> u64 {
        self.frag.raw() | (self.kind as u64) | if self.error { STATUS_BIT } else { 0 }
    }

    /// Decodes a value popped from a FIFO.
    pub fn decode(raw: u64) -> Result<Self, SlotError> {
        if raw == crate::sm::fifo::FREE {
            return Err(SlotError::Free);
        }
        let kind = match raw & TYPE_MASK {
            0 => FragType::Send,
            1 => FragType::Ack,
            2 => FragType::Put,
            _ => FragType::Get,
        };
        let frag = ShmOffset::from_raw(raw & !(TYPE_MASK | STATUS_BIT))
            .map_err(|_| SlotError::ReservedBit { raw })?;
        if matches!(kind, FragType::Put | FragType::Get) {
            return Err(SlotError::UnsupportedType { kind, raw });
        }
        Ok(Self {
            kind,
            error: raw & STATUS_BIT != 0,
            frag,
        })
    }

    /// The same fragment as an ACK back to its owner, with `error` status,
    /// sent by `acker`: the owner field of an ACK names the acknowledging
    /// rank (see the module docs). Fails only if `acker` does not fit the
    /// owner field.
    pub const fn into_ack(self, error: bool, acker: u16) -> Result<Self, OffsetError> {
        match ShmOffset::new(acker, self.frag.offset()) {
            Ok(frag) => Ok(Self {
                kind: FragType::Ack,
                error,
                frag,
            }),
            Err(e) => Err(e),
        }
    }
}

/// The header at the start of every fragment, in shared memory. The
/// payload follows it immediately.
///
/// The owner writes every field before each send ([`FragHeader::stamp`]),
/// `check` last; all are atomics (relaxed; the FIFO's release/acquire
/// publishes them), so a peer scribbling on a header causes wrong values,
/// never undefined behaviour, and the check word makes such a change
/// visible to the receiver.
#[repr(C, align(8))]
#[derive(Debug)]
pub struct FragHeader {
    owner: AtomicU32,
    capacity: AtomicU32,
    tag: AtomicU32,
    len: AtomicU32,
    seq: AtomicU32,
    flags: AtomicU32,
    check: AtomicU32,
    _reserved: AtomicU32,
}

// SAFETY: repr(C) integer atomics: no pointers, no Drop, any bit pattern
// valid, all mutation atomic.
unsafe impl ShmSafe for FragHeader {}

/// Size of [`FragHeader`]: the payload of a fragment at offset `o` starts
/// at `o + FRAG_HEADER_SIZE`.
pub const FRAG_HEADER_SIZE: usize = size_of::<FragHeader>();

/// Byte offsets of the header's fields (little endian `u32`s), for tools
/// and tests that write headers as a stranger would.
pub mod field {
    /// Owning local rank.
    pub const OWNER: usize = 0;
    /// Payload capacity.
    pub const CAPACITY: usize = 4;
    /// Tag.
    pub const TAG: usize = 8;
    /// Payload length.
    pub const LEN: usize = 12;
    /// Sequence number.
    pub const SEQ: usize = 16;
    /// Flags.
    pub const FLAGS: usize = 20;
    /// Check word.
    pub const CHECK: usize = 24;
}

/// The check word of a header with these fields: the fields paired into
/// three 64-bit words, each multiplied by its own odd constant (three
/// independent multiplies: a few cycles on the path of every message), the
/// products xored and folded to 32 bits. Not a defence against a forger
/// (who can compute it too), but any other change of a field while a
/// fragment is in flight — a stray write, a scribbling process — is caught
/// with probability about `1 - 2^-32`.
#[inline]
pub const fn header_check(
    owner: u32,
    capacity: u32,
    tag: u32,
    len: u32,
    seq: u32,
    flags: u32,
) -> u32 {
    let w0 = (owner as u64) | ((capacity as u64) << 32);
    let w1 = (tag as u64) | ((len as u64) << 32);
    let w2 = (seq as u64) | ((flags as u64) << 32);
    let h = w0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ w1.wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
        ^ w2.wrapping_mul(0x1656_67b1_9e37_79f9)
        ^ 0x5bd1_e995_7f4a_7c15;
    (h ^ (h >> 32)) as u32
}

/// A consistent snapshot of a fragment header (each field read once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FragInfo {
    /// Owning local rank.
    pub owner: u32,
    /// Payload capacity in bytes.
    pub capacity: u32,
    /// Active-message tag.
    pub tag: u8,
    /// Payload length in bytes.
    pub len: u32,
    /// Sequence number of the message from its owner to its receiver.
    pub seq: u32,
    /// Reserved for future flags (0).
    pub flags: u32,
}

impl FragHeader {
    /// Carves a fragment header at `offset` of the owner's `region`.
    ///
    /// # Safety
    ///
    /// No other thread or process may access the header's bytes while this
    /// runs (the owner initialises its fragments before publishing them).
    pub unsafe fn init<'a>(
        region: &Region<'a>,
        offset: u64,
        owner: u16,
        capacity: u32,
    ) -> Result<&'a FragHeader, ResolveError> {
        let owner = u32::from(owner);
        let header = FragHeader {
            owner: AtomicU32::new(owner),
            capacity: AtomicU32::new(capacity),
            tag: AtomicU32::new(0),
            len: AtomicU32::new(0),
            seq: AtomicU32::new(0),
            flags: AtomicU32::new(0),
            check: AtomicU32::new(header_check(owner, capacity, 0, 0, 0, 0)),
            _reserved: AtomicU32::new(0),
        };
        // The payload must fit in the region too.
        region.subregion(offset, FRAG_HEADER_SIZE.saturating_add(capacity as usize))?;
        // SAFETY: exclusive access to the header's bytes (caller's contract).
        unsafe { region.write_in_place(offset, header) }
    }

    /// Fills in every field for a send (owner side), the check word last.
    /// Published to the receiver by the FIFO push's release. Owner and
    /// capacity never change, but are written again: that undoes any
    /// corruption of the header by another process since the last send, so
    /// the fragment is usable again.
    #[inline]
    pub fn stamp(&self, owner: u16, capacity: u32, tag: u8, len: u32, seq: u32) {
        let r = Ordering::Relaxed;
        let owner = u32::from(owner);
        let tag = u32::from(tag);
        self.owner.store(owner, r);
        self.capacity.store(capacity, r);
        self.tag.store(tag, r);
        self.len.store(len, r);
        self.seq.store(seq, r);
        self.flags.store(0, r);
        self.check
            .store(header_check(owner, capacity, tag, len, seq, 0), r);
    }

    /// Reads each field once: owner, capacity, tag, len, seq, flags, check.
    #[inline]
    pub fn snapshot(&self) -> [u32; 7] {
        let r = Ordering::Relaxed;
        [
            self.owner.load(r),
            self.capacity.load(r),
            self.tag.load(r),
            self.len.load(r),
            self.seq.load(r),
            self.flags.load(r),
            self.check.load(r),
        ]
    }
}

/// A fragment read from shared memory failed validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum FragError {
    /// The slot value itself is bad.
    #[error("bad slot: {0}")]
    Slot(SlotError),
    /// The fragment (or its payload) is not inside its owner's region.
    #[error("bad fragment offset: {0}")]
    Resolve(ResolveError),
    /// The header names another owner than the slot's offset.
    #[error("fragment header names owner {header_owner}, slot names {slot_owner}")]
    OwnerMismatch {
        /// Owner in the slot.
        slot_owner: u16,
        /// Owner in the header.
        header_owner: u32,
    },
    /// The header's capacity is larger than any fragment may be.
    #[error("fragment capacity {capacity} exceeds the limit {max}")]
    CapacityTooLarge {
        /// Capacity in the header.
        capacity: u32,
        /// The receiver's limit.
        max: u32,
    },
    /// The payload length exceeds the fragment's capacity.
    #[error("fragment length {len} exceeds its capacity {capacity}")]
    LengthExceedsCapacity {
        /// Length in the header.
        len: u32,
        /// Capacity in the header.
        capacity: u32,
    },
    /// The tag does not fit the 8-bit tag space.
    #[error("fragment tag {tag} exceeds {MAX_TAG}")]
    BadTag {
        /// Tag in the header.
        tag: u32,
    },
    /// The check word does not match the other fields: the header was
    /// changed after its owner wrote it.
    #[error(
        "fragment header changed after its owner wrote it (check word {stored:#010x}, \
                 fields give {computed:#010x})"
    )]
    BadCheck {
        /// The check word in the header.
        stored: u32,
        /// The check of the fields found.
        computed: u32,
    },
}

wrap_from!(FragError { Slot(SlotError), Resolve(ResolveError) });

/// A validated message: a fragment's header snapshot and its payload
/// bytes, or a record of a fast box ([`crate::sm::fbox`]) seen the same
/// way.
#[derive(Clone, Copy, Debug)]
pub struct FragView<'a> {
    /// The header in shared memory; `None` for a message from a fast box
    /// (it has no fragment).
    pub header: Option<&'a FragHeader>,
    /// The snapshot the checks were made on: use these values, not fresh
    /// reads of the header. For a fast-box message: the sender as owner,
    /// the length as capacity, sequence number and flags 0 (the box keeps
    /// its own sequence).
    pub info: FragInfo,
    /// Exactly `info.len` payload bytes.
    pub payload: Region<'a>,
}

impl FragView<'_> {
    /// Copies the payload into `dst[..len]`; `dst` must hold `info.len`
    /// bytes.
    pub fn copy_payload(&self, dst: &mut [u8]) -> Result<(), ResolveError> {
        let len = self.payload.len();
        match dst.get_mut(..len) {
            Some(d) => self.payload.read_bytes(0, d),
            None => Err(ResolveError::OutOfBounds {
                offset: 0,
                len: len as u64,
                region_len: dst.len() as u64,
            }),
        }
    }

    /// A copy of the payload if it is exactly `N` bytes (a fixed-size
    /// protocol header), else `None`.
    pub fn exact<const N: usize>(&self) -> Option<[u8; N]> {
        let mut b = [0u8; N];
        (self.info.len as usize == N && self.copy_payload(&mut b).is_ok()).then_some(b)
    }
}

/// Resolves and validates the fragment a slot names: known owner, header
/// in bounds and aligned, check word matching, header owner equal to the
/// slot's, capacity at most `max_capacity`, length at most capacity, tag
/// 8-bit, payload in bounds. (The sequence number is the engine's to
/// check.)
pub fn read_frag<'a, const N: usize>(
    table: &SegmentTable<'a, N>,
    frag: ShmOffset,
    max_capacity: u32,
) -> Result<FragView<'a>, FragError> {
    let region = table.region(frag.owner())?;
    let header: &'a FragHeader = region.resolve(frag.offset())?;
    let [owner, capacity, tag, len, seq, flags, check] = header.snapshot();
    let computed = header_check(owner, capacity, tag, len, seq, flags);
    if check != computed {
        return Err(FragError::BadCheck {
            stored: check,
            computed,
        });
    }
    if owner != u32::from(frag.owner()) {
        return Err(FragError::OwnerMismatch {
            slot_owner: frag.owner(),
            header_owner: owner,
        });
    }
    if capacity > max_capacity {
        return Err(FragError::CapacityTooLarge {
            capacity,
            max: max_capacity,
        });
    }
    if len > capacity {
        return Err(FragError::LengthExceedsCapacity { len, capacity });
    }
    let tag = u8::try_from(tag).map_err(|_| FragError::BadTag { tag })?;
    let payload_at =
        frag.offset()
            .checked_add(FRAG_HEADER_SIZE as u64)
            .ok_or(ResolveError::OutOfBounds {
                offset: frag.offset(),
                len: FRAG_HEADER_SIZE as u64,
                region_len: region.len() as u64,
            })?;
    let payload = region.subregion(payload_at, len as usize)?;
    Ok(FragView {
        header: Some(header),
        info: FragInfo {
            owner,
            capacity,
            tag,
            len,
            seq,
            flags,
        },
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::fifo::FREE;
    use core::ptr::NonNull;
    use std::vec;

    #[test]
    fn slot_roundtrip_all_kinds() {
        let frag = ShmOffset::new(3, 0x40).unwrap();
        for kind in [FragType::Send, FragType::Ack] {
            for error in [false, true] {
                let s = Slot::new(kind, frag, error).unwrap();
                let raw = s.encode();
                assert_ne!(raw, FREE);
                assert_eq!(Slot::decode(raw), Ok(s));
            }
        }
        let s = Slot::new(FragType::Send, frag, false).unwrap();
        // The ACK names the acknowledging rank (5) with the same offset.
        let ack = s.into_ack(true, 5).unwrap();
        assert_eq!(
            ack.encode(),
            ShmOffset::new(5, 0x40).unwrap().raw() | 1 | STATUS_BIT
        );
        assert!(s.into_ack(false, crate::shm::MAX_OWNER + 1).is_err());
    }

    #[test]
    fn slot_fixtures() {
        // owner 2, offset 0x1000, ACK with error.
        let raw: u64 = 0x0002_0000_0000_1005;
        let s = Slot::decode(raw).unwrap();
        assert_eq!(s.kind, FragType::Ack);
        assert!(s.error);
        assert_eq!((s.frag.owner(), s.frag.offset()), (2, 0x1000));
        assert_eq!(s.encode(), raw);
    }

    #[test]
    fn bad_slots_are_errors() {
        assert_eq!(Slot::decode(FREE), Err(SlotError::Free));
        assert!(matches!(
            Slot::decode(1 << 63),
            Err(SlotError::ReservedBit { .. })
        ));
        assert!(matches!(
            Slot::decode(0x40 | 2),
            Err(SlotError::UnsupportedType {
                kind: FragType::Put,
                ..
            })
        ));
        assert!(matches!(
            Slot::decode(0x40 | 3),
            Err(SlotError::UnsupportedType {
                kind: FragType::Get,
                ..
            })
        ));
        assert!(Slot::new(FragType::Send, ShmOffset::new(0, 4).unwrap(), false).is_err());
    }

    fn with_table(f: impl FnOnce(&SegmentTable<'_, 4>, &Region<'_>)) {
        let mut buf = vec![0u64; 64];
        // SAFETY: the buffer outlives the region and is accessed only
        // through it.
        let region =
            unsafe { Region::from_raw_parts(NonNull::new(buf.as_mut_ptr().cast()).unwrap(), 512) };
        let mut t = SegmentTable::new();
        t.insert(1, region).unwrap();
        f(&t, &region);
        drop(buf);
    }

    /// Writes the fields as a buggy but consistent owner would: with a
    /// matching check word.
    fn write_consistent(h: &FragHeader, owner: u32, capacity: u32, tag: u32, len: u32) {
        let r = Ordering::Relaxed;
        h.owner.store(owner, r);
        h.capacity.store(capacity, r);
        h.tag.store(tag, r);
        h.len.store(len, r);
        h.seq.store(0, r);
        h.flags.store(0, r);
        h.check
            .store(header_check(owner, capacity, tag, len, 0, 0), r);
    }

    #[test]
    fn read_frag_validates_and_copies() {
        with_table(|t, r| {
            // SAFETY: nothing else touches the buffer.
            let h = unsafe { FragHeader::init(r, 64, 1, 100) }.unwrap();
            r.write_bytes(64 + FRAG_HEADER_SIZE as u64, b"payload!")
                .unwrap();
            h.stamp(1, 100, 7, 8, 41);
            let at = ShmOffset::new(1, 64).unwrap();
            let v = read_frag(t, at, 4096).unwrap();
            assert_eq!(
                v.info,
                FragInfo {
                    owner: 1,
                    capacity: 100,
                    tag: 7,
                    len: 8,
                    seq: 41,
                    flags: 0
                }
            );
            let mut out = [0u8; 8];
            v.copy_payload(&mut out).unwrap();
            assert_eq!(&out, b"payload!");
            assert!(v.copy_payload(&mut [0u8; 4]).is_err());

            // Any field changed after the stamp: the check word says so.
            for (at_field, value) in [
                (field::OWNER, 2u32),
                (field::CAPACITY, 50),
                (field::TAG, 8),
                (field::LEN, 7),
                (field::SEQ, 42),
                (field::FLAGS, 1),
                (field::CHECK, 0),
            ] {
                h.stamp(1, 100, 7, 8, 41);
                r.write_bytes(64 + at_field as u64, &value.to_le_bytes())
                    .unwrap();
                assert!(
                    matches!(read_frag(t, at, 4096), Err(FragError::BadCheck { .. })),
                    "field at {at_field}"
                );
            }

            // Consistent but impossible headers, each a typed error.
            write_consistent(h, 1, 100, 7, 8);
            assert!(matches!(
                read_frag(t, at, 64),
                Err(FragError::CapacityTooLarge { .. })
            ));
            write_consistent(h, 1, 100, 7, 101);
            assert!(matches!(
                read_frag(t, at, 4096),
                Err(FragError::LengthExceedsCapacity { .. })
            ));
            write_consistent(h, 1, 100, 300, 1);
            assert!(matches!(
                read_frag(t, at, 4096),
                Err(FragError::BadTag { tag: 300 })
            ));
            write_consistent(h, 2, 100, 1, 1);
            assert!(matches!(
                read_frag(t, at, 4096),
                Err(FragError::OwnerMismatch { .. })
            ));
            write_consistent(h, 1, u32::MAX, 1, 4000);
            assert!(matches!(
                read_frag(t, at, u32::MAX),
                Err(FragError::Resolve(_))
            ));
            assert!(matches!(
                read_frag(t, ShmOffset::new(2, 64).unwrap(), 4096),
                Err(FragError::Resolve(ResolveError::UnknownOwner { owner: 2 }))
            ));
            assert!(read_frag(t, ShmOffset::new(1, 508).unwrap(), 4096).is_err());
            assert!(read_frag(t, ShmOffset::new(1, 1 << 40).unwrap(), 4096).is_err());
        });
    }

    #[test]
    fn header_check_fixture() {
        // Fixed values: a change of the function is a change of the
        // shared-memory format.
        assert_eq!(header_check(0, 0, 0, 0, 0, 0), 0x249b_9580);
        assert_eq!(header_check(1, 64, 7, 8, 0, 0), 0xac5f_e661);
        assert_ne!(
            header_check(1, 64, 7, 8, 0, 0),
            header_check(1, 64, 7, 8, 1, 0)
        );
        assert_ne!(
            header_check(1, 64, 7, 8, 0, 0),
            header_check(1, 64, 8, 7, 0, 0)
        );
    }

    #[test]
    fn init_refuses_fragments_past_the_region() {
        with_table(|_, r| {
            // SAFETY: nothing else touches the buffer.
            assert!(unsafe { FragHeader::init(r, 480, 1, 64) }.is_err());
            // SAFETY: as above.
            assert!(unsafe { FragHeader::init(r, 4, 1, 8) }.is_err());
        });
    }
}
