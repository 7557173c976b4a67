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
//! the receiver; the receiver runs the handler, then pushes the same
//! fragment back to its owner as an ACK; the owner completes and recycles
//! it.
//!
//! Everything decoded here comes from another process: [`Slot::decode`] and
//! [`read_frag`] check every field (reserved bit, type, owner, bounds,
//! length against capacity, capacity against the receiver's limit) and
//! return a typed [`FragError`].
#![allow(unsafe_code)]

use core::fmt;
use core::mem::size_of;

use crate::shm::{Region, ResolveError, SegmentTable, ShmOffset, ShmSafe};
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Alignment of every fragment (and so of the offsets that slots carry).
pub const FRAG_ALIGN: u64 = 8;
/// Bits of a slot value holding the fragment type.
pub const TYPE_MASK: u64 = 0b011;
/// Bit of a slot value flagging an error status.
pub const STATUS_BIT: u64 = 0b100;
/// Largest active-message tag (tags are 8-bit, as the seed's
/// `mca_btl_base_tag_t`).
pub const MAX_TAG: u32 = u8::MAX as u32;
/// Flag in [`FragHeader`]: the owner wants a completion callback.
pub const FLAG_COMPLETION: u32 = 1;

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SlotError {
    /// The value is the FIFO's FREE sentinel.
    Free,
    /// The reserved bit 63 is set.
    ReservedBit {
        /// The raw slot value.
        raw: u64,
    },
    /// PUT or GET, which this version does not carry in slots.
    UnsupportedType {
        /// The type found.
        kind: FragType,
        /// The raw slot value.
        raw: u64,
    },
    /// Encoding: the fragment offset is not [`FRAG_ALIGN`]-aligned.
    Misaligned {
        /// The offending offset.
        frag: ShmOffset,
    },
}

impl fmt::Display for SlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Free => write!(f, "slot holds the FREE sentinel"),
            Self::ReservedBit { raw } => {
                write!(f, "slot value {raw:#018x} has the reserved bit set")
            }
            Self::UnsupportedType { kind, raw } => {
                write!(f, "slot value {raw:#018x} has unsupported type {kind:?}")
            }
            Self::Misaligned { frag } => {
                write!(f, "fragment {frag:?} is not {FRAG_ALIGN}-byte aligned")
            }
        }
    }
}

impl core::error::Error for SlotError {}

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

    /// The same fragment as an ACK back to its owner, with `error` status.
    pub const fn into_ack(self, error: bool) -> Self {
        Self {
            kind: FragType::Ack,
            error,
            frag: self.frag,
        }
    }
}

/// The header at the start of every fragment, in shared memory. The
/// payload follows it immediately.
///
/// `owner` and `capacity` are written once when the owner carves its
/// fragments; `tag`, `len`, `cookie` and `flags` before each send. All are
/// atomics (relaxed; the FIFO's release/acquire publishes them), so a peer
/// scribbling on a header causes wrong values, never undefined behaviour.
#[repr(C, align(8))]
#[derive(Debug)]
pub struct FragHeader {
    owner: AtomicU32,
    capacity: AtomicU32,
    tag: AtomicU32,
    len: AtomicU32,
    cookie: AtomicU64,
    flags: AtomicU32,
    _reserved: AtomicU32,
}

// SAFETY: repr(C) integer atomics: no pointers, no Drop, any bit pattern
// valid, all mutation atomic.
unsafe impl ShmSafe for FragHeader {}

/// Size of [`FragHeader`]: the payload of a fragment at offset `o` starts
/// at `o + FRAG_HEADER_SIZE`.
pub const FRAG_HEADER_SIZE: usize = size_of::<FragHeader>();

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
    /// The owner's private token, echoed back in the ACK.
    pub cookie: u64,
    /// [`FLAG_COMPLETION`] and future flags.
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
        let header = FragHeader {
            owner: AtomicU32::new(u32::from(owner)),
            capacity: AtomicU32::new(capacity),
            tag: AtomicU32::new(0),
            len: AtomicU32::new(0),
            cookie: AtomicU64::new(0),
            flags: AtomicU32::new(0),
            _reserved: AtomicU32::new(0),
        };
        // The payload must fit in the region too.
        region.subregion(offset, FRAG_HEADER_SIZE.saturating_add(capacity as usize))?;
        // SAFETY: exclusive access to the header's bytes (caller's contract).
        unsafe { region.write_in_place(offset, header) }
    }

    /// Fills in a message before it is pushed (owner side). Published to
    /// the receiver by the FIFO push's release.
    pub fn set_message(&self, tag: u8, len: u32, cookie: u64, flags: u32) {
        self.tag.store(u32::from(tag), Ordering::Relaxed);
        self.len.store(len, Ordering::Relaxed);
        self.cookie.store(cookie, Ordering::Relaxed);
        self.flags.store(flags, Ordering::Relaxed);
    }

    /// Writes the owner and capacity again (owner side, before each send):
    /// they are set when the fragment is carved and never change, so
    /// rewriting them undoes any corruption of the header by another
    /// process, and the fragment is usable again from its next send on.
    pub fn restamp(&self, owner: u16, capacity: u32) {
        self.owner.store(u32::from(owner), Ordering::Relaxed);
        self.capacity.store(capacity, Ordering::Relaxed);
    }

    /// Reads each field once.
    pub fn snapshot(&self) -> (u32, u32, u32, u32, u64, u32) {
        (
            self.owner.load(Ordering::Relaxed),
            self.capacity.load(Ordering::Relaxed),
            self.tag.load(Ordering::Relaxed),
            self.len.load(Ordering::Relaxed),
            self.cookie.load(Ordering::Relaxed),
            self.flags.load(Ordering::Relaxed),
        )
    }
}

/// A fragment read from shared memory failed validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum FragError {
    /// The slot value itself is bad.
    Slot(SlotError),
    /// The fragment (or its payload) is not inside its owner's region.
    Resolve(ResolveError),
    /// The header names another owner than the slot's offset.
    OwnerMismatch {
        /// Owner in the slot.
        slot_owner: u16,
        /// Owner in the header.
        header_owner: u32,
    },
    /// The header's capacity is larger than any fragment may be.
    CapacityTooLarge {
        /// Capacity in the header.
        capacity: u32,
        /// The receiver's limit.
        max: u32,
    },
    /// The payload length exceeds the fragment's capacity.
    LengthExceedsCapacity {
        /// Length in the header.
        len: u32,
        /// Capacity in the header.
        capacity: u32,
    },
    /// The tag does not fit the 8-bit tag space.
    BadTag {
        /// Tag in the header.
        tag: u32,
    },
}

impl From<SlotError> for FragError {
    fn from(e: SlotError) -> Self {
        Self::Slot(e)
    }
}

impl From<ResolveError> for FragError {
    fn from(e: ResolveError) -> Self {
        Self::Resolve(e)
    }
}

impl fmt::Display for FragError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Slot(e) => write!(f, "bad slot: {e}"),
            Self::Resolve(e) => write!(f, "bad fragment offset: {e}"),
            Self::OwnerMismatch {
                slot_owner,
                header_owner,
            } => write!(
                f,
                "fragment header names owner {header_owner}, slot names {slot_owner}"
            ),
            Self::CapacityTooLarge { capacity, max } => {
                write!(f, "fragment capacity {capacity} exceeds the limit {max}")
            }
            Self::LengthExceedsCapacity { len, capacity } => {
                write!(f, "fragment length {len} exceeds its capacity {capacity}")
            }
            Self::BadTag { tag } => write!(f, "fragment tag {tag} exceeds {MAX_TAG}"),
        }
    }
}

impl core::error::Error for FragError {}

/// A validated fragment: its header snapshot and its payload bytes.
#[derive(Clone, Copy, Debug)]
pub struct FragView<'a> {
    /// The header in shared memory (for the owner to reuse).
    pub header: &'a FragHeader,
    /// The snapshot the checks were made on: use these values, not fresh
    /// reads of the header.
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
}

/// Resolves and validates the fragment a slot names: known owner, header
/// in bounds and aligned, header owner equal to the slot's, capacity at most
/// `max_capacity`, length at most capacity, tag 8-bit, payload in bounds.
pub fn read_frag<'a, const N: usize>(
    table: &SegmentTable<'a, N>,
    frag: ShmOffset,
    max_capacity: u32,
) -> Result<FragView<'a>, FragError> {
    let region = table.region(frag.owner())?;
    let header: &'a FragHeader = region.resolve(frag.offset())?;
    let (owner, capacity, tag, len, cookie, flags) = header.snapshot();
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
        header,
        info: FragInfo {
            owner,
            capacity,
            tag,
            len,
            cookie,
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
        assert_eq!(s.into_ack(true).encode(), frag.raw() | 1 | STATUS_BIT);
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

    #[test]
    fn read_frag_validates_and_copies() {
        with_table(|t, r| {
            // SAFETY: nothing else touches the buffer.
            let h = unsafe { FragHeader::init(r, 64, 1, 100) }.unwrap();
            r.write_bytes(64 + FRAG_HEADER_SIZE as u64, b"payload!")
                .unwrap();
            h.set_message(7, 8, 0xabc, FLAG_COMPLETION);
            let at = ShmOffset::new(1, 64).unwrap();
            let v = read_frag(t, at, 4096).unwrap();
            assert_eq!(
                v.info,
                FragInfo {
                    owner: 1,
                    capacity: 100,
                    tag: 7,
                    len: 8,
                    cookie: 0xabc,
                    flags: FLAG_COMPLETION
                }
            );
            let mut out = [0u8; 8];
            v.copy_payload(&mut out).unwrap();
            assert_eq!(&out, b"payload!");
            assert!(v.copy_payload(&mut [0u8; 4]).is_err());

            // Hostile edits, each a typed error.
            assert!(matches!(
                read_frag(t, at, 64),
                Err(FragError::CapacityTooLarge { .. })
            ));
            h.set_message(7, 101, 0, 0);
            assert!(matches!(
                read_frag(t, at, 4096),
                Err(FragError::LengthExceedsCapacity { .. })
            ));
            h.tag.store(300, Ordering::Relaxed);
            h.len.store(1, Ordering::Relaxed);
            assert!(matches!(
                read_frag(t, at, 4096),
                Err(FragError::BadTag { tag: 300 })
            ));
            h.tag.store(1, Ordering::Relaxed);
            h.owner.store(2, Ordering::Relaxed);
            assert!(matches!(
                read_frag(t, at, 4096),
                Err(FragError::OwnerMismatch { .. })
            ));
            h.owner.store(1, Ordering::Relaxed);
            h.capacity.store(u32::MAX, Ordering::Relaxed);
            h.len.store(4000, Ordering::Relaxed);
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
    fn init_refuses_fragments_past_the_region() {
        with_table(|_, r| {
            // SAFETY: nothing else touches the buffer.
            assert!(unsafe { FragHeader::init(r, 480, 1, 64) }.is_err());
            // SAFETY: as above.
            assert!(unsafe { FragHeader::init(r, 4, 1, 8) }.is_err());
        });
    }
}
