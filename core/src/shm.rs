//! Shared-memory regions and relative addressing.
//!
//! Every process maps a shared segment at a different address, so nothing
//! stored in shared memory is a pointer: it is a [`ShmOffset`], the owning
//! local rank packed with a byte offset into that owner's region (as vader
//! packs `(rank, offset)`). An offset becomes a reference only through a
//! checked resolution — [`Region::resolve`] or [`SegmentTable::resolve`] —
//! that verifies the owner is known, the range is in bounds and the address
//! is aligned for the type. A peer is a separate process that may be buggy or
//! hostile: every failure is a typed [`ResolveError`], never undefined
//! behaviour and never a panic.
//!
//! Only types implementing the `unsafe` trait [`ShmSafe`] can be resolved:
//! `#[repr(C)]`, no pointers, no `Drop`, valid for every bit pattern, and
//! mutated only through atomics. The atomics of [`crate::sync`] qualify.
//!
//! # Safety
//!
//! This module holds the crate's raw-pointer code. The invariants:
//! - a [`Region`] is created only over memory valid for reads and writes for
//!   its whole length and lifetime ([`Region::from_raw_parts`]'s contract, or
//!   an exclusive borrow in [`Region::from_mut_slice`]);
//! - every pointer handed out is `base + offset` with `offset + size <= len`
//!   checked without overflow, and aligned for the target type;
//! - [`ShmSafe`] types are valid for any bytes, so reading memory a peer
//!   wrote (or scribbled on) is never an invalid value.
//!
//! # The concurrency model
//!
//! Shared memory is reached two ways, with different rules:
//!
//! - **atomics** — [`Region::resolve`] hands out `&T` for [`ShmSafe`] types
//!   (all `Sync`, all mutation atomic). These references may go to any
//!   thread: every access is an atomic operation, so nothing races;
//! - **byte copies** — [`Region::read_bytes`] and [`Region::write_bytes`] are
//!   plain `memcpy`s. Two copies of the same bytes, one of them a write, from
//!   two threads of this process without a happens-before between them are a
//!   data race: undefined behaviour. So a [`Region`] — the only way to copy
//!   bytes — is neither `Send` nor `Sync`: every region made from one root
//!   (one exclusive borrow in [`Region::from_mut_slice`], one
//!   [`Region::from_raw_parts`]) stays in the thread that made it, and safe
//!   code cannot copy bytes of one memory from two threads. Regions over the
//!   same memory in *different* threads exist only through
//!   [`Region::from_raw_parts`], whose contract makes the caller order their
//!   byte copies (the engine's SEND → ACK hand-over does, with the rings'
//!   release/acquire pairs; a miri test checks it).
//!
//! Other *processes* are outside the Rust memory model: an honest peer
//! publishes a payload before the release store that hands it over, so the
//! copy never races; a *misbehaving* peer that writes a payload while we
//! copy it can only make us read torn bytes (the hardware gives no stronger
//! failure for plain copies of `u8`s), and the protocol layers above treat
//! payload bytes as untrusted data.
//!
//! - **borrowed bytes** — [`Region::borrow_bytes`] (`unsafe`) lends the
//!   bytes themselves as a `&[u8]`, for handing a received payload to its
//!   consumer in place. Its caller promises what a `&[u8]` means: nothing
//!   writes the bytes while the borrow lives. Within this process the rules
//!   of byte copies apply (the region stays in its thread; other threads'
//!   regions over the memory are ordered by the protocol). For other
//!   processes the promise is the protocol's: the engine lends a payload
//!   only between a SEND and its ACK, when the owner does not touch the
//!   fragment. A peer that writes it anyway changes the bytes of its own
//!   message, never anything outside the checked range, and nothing of
//!   ours is derived from those bytes without the receiver's own checks —
//!   the trust every shared-memory transport puts in a peer of the same
//!   user (which can, with single copy, write our memory directly). Such
//!   a peer can make the borrowed bytes change under their consumer, as
//!   with the fast boxes' in-place payloads ([`crate::sm::fbox`]): a
//!   consumer that bases memory-safety decisions on payload bytes (an index
//!   it checks, then uses) copies them first.
#![allow(unsafe_code)]

use core::fmt;
use core::marker::PhantomData;
use core::mem::{align_of, size_of};
use core::ptr::NonNull;

/// Marks types that may live in memory shared with other processes.
///
/// # Safety
///
/// Implementors guarantee that the type is `#[repr(C)]` (or transparent),
/// holds no pointers or references, has no `Drop`, is valid for every bit
/// pattern of its size (a peer may write anything), and is `Sync`, with all
/// shared mutation done through atomics. (Under `cfg(loom)` the shim's
/// atomics are loom objects that are *not* valid for arbitrary bytes; loom
/// models only resolve memory that was initialised in place first.)
pub unsafe trait ShmSafe: Sync {}

// SAFETY: integer atomics are plain integers in memory: repr(C)-compatible,
// no pointers, valid for every bit pattern, mutated atomically.
unsafe impl ShmSafe for crate::sync::AtomicU64 {}
// SAFETY: as above.
unsafe impl ShmSafe for crate::sync::AtomicU32 {}
// SAFETY: as above.
unsafe impl ShmSafe for crate::sync::AtomicUsize {}
// SAFETY: `CachePadded` is repr(C) around `T` plus padding bytes, which are
// never read; the rest is `T`'s guarantee.
unsafe impl<T: ShmSafe> ShmSafe for crate::sync::CachePadded<T> {}

/// Number of bits of a [`ShmOffset`] holding the byte offset.
pub const OFFSET_BITS: u32 = 48;
/// Number of bits of a [`ShmOffset`] holding the owner's local rank.
pub const OWNER_BITS: u32 = 15;
/// Largest byte offset a [`ShmOffset`] can hold.
pub const MAX_OFFSET: u64 = (1 << OFFSET_BITS) - 1;
/// Largest owner (local rank) a [`ShmOffset`] can hold.
pub const MAX_OWNER: u16 = (1 << OWNER_BITS) - 1;
/// Bit 63 is reserved and must be zero.
const RESERVED_BIT: u64 = 1 << 63;

/// A position in shared memory: the owning local rank and a byte offset in
/// that owner's region. This, never a pointer, is what shared memory holds.
///
/// Layout of the 64-bit value: bits 0–47 byte offset, bits 48–62 owner,
/// bit 63 reserved (zero).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(transparent)]
pub struct ShmOffset(u64);

impl ShmOffset {
    /// Packs `owner` and `offset`; fails if either does not fit.
    pub const fn new(owner: u16, offset: u64) -> Result<Self, OffsetError> {
        if owner > MAX_OWNER {
            return Err(OffsetError::OwnerTooLarge { owner });
        }
        if offset > MAX_OFFSET {
            return Err(OffsetError::OffsetTooLarge { offset });
        }
        Ok(Self(((owner as u64) << OFFSET_BITS) | offset))
    }

    /// Interprets a raw value read from shared memory; fails if the reserved
    /// bit is set.
    pub const fn from_raw(raw: u64) -> Result<Self, OffsetError> {
        if raw & RESERVED_BIT != 0 {
            return Err(OffsetError::ReservedBit { raw });
        }
        Ok(Self(raw))
    }

    /// The raw 64-bit value, as stored in shared memory.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// The owner's local rank.
    pub const fn owner(self) -> u16 {
        (self.0 >> OFFSET_BITS) as u16 & MAX_OWNER
    }

    /// The byte offset within the owner's region.
    pub const fn offset(self) -> u64 {
        self.0 & MAX_OFFSET
    }

    /// The same owner, `bytes` further on; fails on overflow of the field.
    pub const fn add(self, bytes: u64) -> Result<Self, OffsetError> {
        match self.offset().checked_add(bytes) {
            Some(o) => Self::new(self.owner(), o),
            None => Err(OffsetError::OffsetTooLarge { offset: u64::MAX }),
        }
    }
}

impl fmt::Debug for ShmOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ShmOffset({}:{:#x})", self.owner(), self.offset())
    }
}

/// A [`ShmOffset`] could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum OffsetError {
    /// The owner does not fit in [`OWNER_BITS`] bits.
    #[error("owner {owner} exceeds the maximum local rank {MAX_OWNER}")]
    OwnerTooLarge {
        /// The owner given.
        owner: u16,
    },
    /// The offset does not fit in [`OFFSET_BITS`] bits.
    #[error("offset {offset:#x} exceeds the maximum {MAX_OFFSET:#x}")]
    OffsetTooLarge {
        /// The offset given.
        offset: u64,
    },
    /// A raw value had the reserved bit 63 set.
    #[error("shared-memory offset {raw:#018x} has the reserved bit set")]
    ReservedBit {
        /// The raw value.
        raw: u64,
    },
}

/// Resolving an offset into a reference failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ResolveError {
    /// No region is registered for this owner.
    #[error("offset names owner {owner}, which has no mapped region")]
    UnknownOwner {
        /// The owner named by the offset.
        owner: u16,
    },
    /// `[offset, offset + len)` is not inside the region.
    #[error("range {offset:#x}+{len} is outside the region of {region_len} bytes")]
    OutOfBounds {
        /// Byte offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// Length of the region.
        region_len: u64,
    },
    /// The address is not aligned for the type.
    #[error("offset {offset:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// Byte offset asked for.
        offset: u64,
        /// Alignment required.
        align: u32,
    },
}

/// A mapped region of (possibly shared) memory: base and length.
///
/// `Region` is a `Copy` view; it does not own the mapping. Its lifetime `'a`
/// is the mapping's. It is neither `Send` nor `Sync` (see the module's
/// concurrency model): the byte copies it offers must stay in one thread, so
/// two threads cannot write the same bytes through safe code. The `&T` it
/// resolves to (atomics) may be shared freely.
///
/// ```compile_fail
/// // Two threads copying into the same bytes through one region: refused
/// // at compile time (`Region` is not `Sync`).
/// let mut buf = [0u8; 8];
/// let r = btl_core::shm::Region::from_mut_slice(&mut buf);
/// std::thread::scope(|s| {
///     s.spawn(|| r.write_bytes(0, b"a"));
///     s.spawn(|| r.write_bytes(0, b"b"));
/// });
/// ```
///
/// ```compile_fail
/// // Nor can a copy of it be sent to another thread (`Region` is not `Send`).
/// let mut buf = [0u8; 8];
/// let r = btl_core::shm::Region::from_mut_slice(&mut buf);
/// std::thread::scope(|s| {
///     s.spawn(move || r.write_bytes(0, b"a"));
///     r.write_bytes(0, b"b").unwrap();
/// });
/// ```
#[derive(Clone, Copy)]
pub struct Region<'a> {
    // NonNull makes the type neither Send nor Sync, which the concurrency
    // model requires: do not add `unsafe impl Send/Sync`.
    base: NonNull<u8>,
    len: usize,
    _mapping: PhantomData<&'a [u8]>,
}

impl fmt::Debug for Region<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("base", &self.base)
            .field("len", &self.len)
            .finish()
    }
}

impl<'a> Region<'a> {
    /// A region over `len` bytes at `base`.
    ///
    /// # Safety
    ///
    /// `base..base + len` must be valid for reads and writes for all of `'a`
    /// (a live mapping), `len <= isize::MAX`, and, while `'a` lasts, the
    /// memory must be accessed only through `ShmSafe` types (atomics) and
    /// byte copies — never through Rust references to non-atomic data.
    ///
    /// If other regions over the same memory exist in other threads of this
    /// process (each thread making its own with this function), every byte
    /// copy through this region must be ordered (happens-before) with every
    /// byte copy of the same bytes through them that writes, or the two are
    /// a data race. The engine's protocol orders them when every thread runs
    /// one engine of a different rank and nothing else in the process
    /// writes the memory; within one thread (all regions derived from this
    /// one) nothing more is needed.
    pub unsafe fn from_raw_parts(base: NonNull<u8>, len: usize) -> Self {
        debug_assert!(len <= isize::MAX as usize);
        Self {
            base,
            len,
            _mapping: PhantomData,
        }
    }

    /// A region over an exclusively borrowed buffer (in-process use: tests,
    /// benchmarks, a single address space).
    pub fn from_mut_slice(buf: &'a mut [u8]) -> Self {
        let len = buf.len();
        // The slice pointer is never null; NonNull::from keeps provenance.
        let base = NonNull::from(buf).cast::<u8>();
        Self {
            base,
            len,
            _mapping: PhantomData,
        }
    }

    /// Length in bytes.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// True if the region has no bytes.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The base address (for diagnostics and alignment checks).
    pub fn base_addr(&self) -> usize {
        self.base.as_ptr() as usize
    }

    /// Checks `[offset, offset + len)` is inside and `align`-aligned, and
    /// returns the offset as `usize`.
    fn check(&self, offset: u64, len: usize, align: usize) -> Result<usize, ResolveError> {
        let oob = ResolveError::OutOfBounds {
            offset,
            len: len as u64,
            region_len: self.len as u64,
        };
        let start = usize::try_from(offset).map_err(|_| oob)?;
        let end = start.checked_add(len).ok_or(oob)?;
        if end > self.len {
            return Err(oob);
        }
        if (self.base_addr().wrapping_add(start)) % align != 0 {
            return Err(ResolveError::Misaligned {
                offset,
                align: align as u32,
            });
        }
        Ok(start)
    }

    /// A pointer to `start`, already checked to be in bounds.
    fn ptr_at(&self, start: usize) -> NonNull<u8> {
        debug_assert!(start <= self.len);
        // SAFETY: `start <= len` was checked by `check`, so the result is
        // inside (or one past) the allocation `base..base+len`.
        unsafe { self.base.add(start) }
    }

    /// Resolves `offset` to a `&T` after checking bounds and alignment.
    pub fn resolve<T: ShmSafe>(&self, offset: u64) -> Result<&'a T, ResolveError> {
        let start = self.check(offset, size_of::<T>(), align_of::<T>())?;
        let ptr = self.ptr_at(start).cast::<T>();
        // SAFETY: in bounds and aligned (checked above); the memory is live
        // for 'a (Region's contract); `T: ShmSafe` is valid for any bytes and
        // only mutated through atomics, so a shared reference is sound.
        Ok(unsafe { ptr.as_ref() })
    }

    /// Resolves `count` consecutive `T`s starting at `offset`.
    pub fn resolve_slice<T: ShmSafe>(
        &self,
        offset: u64,
        count: usize,
    ) -> Result<&'a [T], ResolveError> {
        let bytes = size_of::<T>()
            .checked_mul(count)
            .ok_or(ResolveError::OutOfBounds {
                offset,
                len: u64::MAX,
                region_len: self.len as u64,
            })?;
        let start = self.check(offset, bytes, align_of::<T>())?;
        let ptr = self.ptr_at(start).cast::<T>();
        // SAFETY: `count` Ts fit in bounds and the start is aligned (checked
        // above); liveness and validity as in `resolve`.
        Ok(unsafe { core::slice::from_raw_parts(ptr.as_ptr(), count) })
    }

    /// Writes `value` at `offset` (in-place initialisation) and returns a
    /// reference to it.
    ///
    /// # Safety
    ///
    /// Nothing else (thread or process) may access
    /// `[offset, offset + size_of::<T>())` while this runs: initialisation
    /// happens before the memory is published to peers.
    pub unsafe fn write_in_place<T: ShmSafe>(
        &self,
        offset: u64,
        value: T,
    ) -> Result<&'a T, ResolveError> {
        let start = self.check(offset, size_of::<T>(), align_of::<T>())?;
        let ptr = self.ptr_at(start).cast::<T>();
        // SAFETY: in bounds and aligned (checked); no concurrent access
        // (caller's contract); `T` has no Drop, so overwriting the old bytes
        // without dropping them leaks nothing.
        unsafe { ptr.as_ptr().write(value) };
        // SAFETY: just initialised; shared access is sound for ShmSafe types.
        Ok(unsafe { ptr.as_ref() })
    }

    /// A sub-region `[offset, offset + len)`.
    pub fn subregion(&self, offset: u64, len: usize) -> Result<Region<'a>, ResolveError> {
        let start = self.check(offset, len, 1)?;
        Ok(Region {
            base: self.ptr_at(start),
            len,
            _mapping: PhantomData,
        })
    }

    /// The region's bytes themselves, borrowed (zero copy): a payload handed
    /// to its consumer in place. The region is already bounds-checked (it is
    /// a [`Region::subregion`] or a whole mapping), so the slice covers
    /// exactly `base..base + len`; the borrow is tied to `&self`, so it
    /// cannot outlive the region value it came from.
    ///
    /// # Safety
    ///
    /// While the returned slice lives, nothing may write its bytes: no
    /// thread of this process (through any region over the memory or
    /// otherwise), and no other process mapping the memory. The engine
    /// keeps this for an honest peer by lending a payload only between its
    /// SEND and the ACK that returns it (the owner does not touch a
    /// fragment in flight); what a peer breaking the protocol can do is
    /// described in the module's concurrency model ("borrowed bytes").
    pub unsafe fn borrow_bytes(&self) -> &[u8] {
        // SAFETY: `base..base + len` is live and readable for 'a
        // (Region's contract), which outlives the `&self` borrow; `len <=
        // isize::MAX` (from_raw_parts' contract, or a Rust slice); `u8` is
        // valid for any bytes; nothing writes the range while the slice
        // lives (this function's contract).
        unsafe { core::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`.
    pub fn read_bytes(&self, offset: u64, dst: &mut [u8]) -> Result<(), ResolveError> {
        let start = self.check(offset, dst.len(), 1)?;
        let src = self.ptr_at(start);
        // SAFETY: the source range is in bounds and live (checked above,
        // Region's contract); `dst` is a distinct exclusive borrow, so the
        // ranges do not overlap. No other thread of this process writes the
        // range meanwhile: regions are not Send/Sync, and regions of other
        // threads order their copies with ours (`from_raw_parts`' contract).
        // Races with a misbehaving peer process: module docs. That is
        // `copy_bytes`' contract (copy_nonoverlapping's).
        unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `src` into the region at `offset`.
    pub fn write_bytes(&self, offset: u64, src: &[u8]) -> Result<(), ResolveError> {
        let start = self.check(offset, src.len(), 1)?;
        let dst = self.ptr_at(start);
        // SAFETY: the destination range is in bounds and writable (checked
        // above, Region's contract); `src` is a Rust borrow, which cannot
        // alias memory accessed only through the region. No other thread of
        // this process copies the range meanwhile (as in `read_bytes`):
        // `copy_bytes`' contract (copy_nonoverlapping's).
        unsafe { copy_bytes(src.as_ptr(), dst.as_ptr(), src.len()) };
        Ok(())
    }
}

/// Most bytes [`copy_bytes`] hands the C library's `memcpy` at once when
/// the two addresses are close modulo a page.
pub const COPY_PIECE: usize = 2048;

/// Copies `len` bytes from `src` to `dst`, as `copy_nonoverlapping` does,
/// but never as one large `memcpy` when `dst` lies 1 to 63 bytes after
/// `src` modulo 4096.
///
/// Why: x86-64 glibc (2.36, Debian 12) copies a few KiB and more with
/// `rep movsb`, which AMD Zen 4 (this machine's EPYC, under KVM) runs at
/// 3.5 GB/s instead of 55 when the destination lies 1–15 bytes after the
/// source modulo a page (a C loop of 32 KiB `memcpy`s, every offset from 0
/// to 80 measured). Fragment payloads sit at fixed offsets and user
/// buffers anywhere (an array's second element, say), so some messages
/// meet it on every copy. In pieces of [`COPY_PIECE`] bytes `memcpy`
/// takes its vector loop, 50 GB/s at those offsets. The window is kept to
/// 63 bytes for other CPUs' variants of the same effect; everywhere else
/// this is one call.
///
/// # Safety
///
/// As `core::ptr::copy_nonoverlapping`: `src` readable and `dst` writable
/// for `len` bytes, the ranges not overlapping.
#[inline]
pub unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    let gap = page_gap(dst as usize, src as usize);
    if len <= COPY_PIECE || gap == 0 || gap >= 64 {
        // SAFETY: the caller's promise.
        unsafe { core::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    // SAFETY: the caller's promise.
    unsafe { copy_in_pieces(src, dst, len) };
}

/// How many bytes `dst` lies after `src` modulo a page (4096): what decides
/// whether a `rep movsb` copy between them is slow (see [`copy_bytes`]).
#[inline]
pub fn page_gap(dst: usize, src: usize) -> usize {
    dst.wrapping_sub(src) & 4095
}

/// [`copy_bytes`]'s copy in pieces.
///
/// # Safety
///
/// As [`copy_bytes`].
#[inline(never)]
unsafe fn copy_in_pieces(src: *const u8, dst: *mut u8, len: usize) {
    let mut done = 0;
    while done < len {
        let n = COPY_PIECE.min(len - done);
        // SAFETY: `done + n <= len`: inside both ranges (the caller's
        // promise for `len` bytes).
        unsafe { core::ptr::copy_nonoverlapping(src.add(done), dst.add(done), n) };
        done += n;
    }
}

/// The regions of up to `N` owners (local ranks), indexed by owner; the one
/// place a [`ShmOffset`] read from shared memory is turned into a reference.
#[derive(Debug)]
pub struct SegmentTable<'a, const N: usize> {
    regions: [Option<Region<'a>>; N],
}

impl<const N: usize> Default for SegmentTable<'_, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a, const N: usize> SegmentTable<'a, N> {
    /// An empty table.
    pub const fn new() -> Self {
        Self { regions: [None; N] }
    }

    /// Registers `region` as `owner`'s; returns the previous one, if any.
    pub fn insert(
        &mut self,
        owner: u16,
        region: Region<'a>,
    ) -> Result<Option<Region<'a>>, ResolveError> {
        let slot = self
            .regions
            .get_mut(usize::from(owner))
            .ok_or(ResolveError::UnknownOwner { owner })?;
        Ok(slot.replace(region))
    }

    /// Forgets `owner`'s region (the peer is gone).
    pub fn remove(&mut self, owner: u16) -> Option<Region<'a>> {
        self.regions
            .get_mut(usize::from(owner))
            .and_then(Option::take)
    }

    /// `owner`'s region.
    pub fn region(&self, owner: u16) -> Result<&Region<'a>, ResolveError> {
        self.regions
            .get(usize::from(owner))
            .and_then(Option::as_ref)
            .ok_or(ResolveError::UnknownOwner { owner })
    }

    /// Resolves `at` to a `&T`: known owner, in bounds, aligned.
    pub fn resolve<T: ShmSafe>(&self, at: ShmOffset) -> Result<&'a T, ResolveError> {
        self.region(at.owner())?.resolve(at.offset())
    }

    /// Copies bytes at `at` into `dst`.
    pub fn read_bytes(&self, at: ShmOffset, dst: &mut [u8]) -> Result<(), ResolveError> {
        self.region(at.owner())?.read_bytes(at.offset(), dst)
    }

    /// Copies `src` to `at`.
    pub fn write_bytes(&self, at: ShmOffset, src: &[u8]) -> Result<(), ResolveError> {
        self.region(at.owner())?.write_bytes(at.offset(), src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::{AtomicU64, Ordering};
    use std::vec;

    #[test]
    fn offset_packing_roundtrips() {
        let o = ShmOffset::new(7, 0x1234_5678).unwrap();
        assert_eq!(o.owner(), 7);
        assert_eq!(o.offset(), 0x1234_5678);
        assert_eq!(ShmOffset::from_raw(o.raw()), Ok(o));
        assert_eq!(o.add(8).unwrap().offset(), 0x1234_5680);
        let max = ShmOffset::new(MAX_OWNER, MAX_OFFSET).unwrap();
        assert_eq!((max.owner(), max.offset()), (MAX_OWNER, MAX_OFFSET));
    }

    #[test]
    fn copies_close_modulo_a_page_go_in_pieces_and_arrive_whole() {
        // Every gap the piecewise path takes (1..64 bytes modulo a page),
        // lengths around the piece size, and the one-call paths beside.
        let src: std::vec::Vec<u8> = (0..3 * COPY_PIECE + 700)
            .map(|i| (i * 7 + 3) as u8)
            .collect();
        for gap in [0usize, 1, 8, 15, 16, 63, 64, 100] {
            for len in [
                0,
                1,
                COPY_PIECE,
                COPY_PIECE + 1,
                2 * COPY_PIECE + 9,
                src.len() - 100,
            ] {
                let mut dst = vec![0u8; src.len() + 4096 + 64];
                // The destination start `gap` bytes after the source's
                // position modulo 4096.
                let s_mod = src.as_ptr() as usize % 4096;
                let d_mod = dst.as_ptr() as usize % 4096;
                let at = (s_mod + gap + 4096 - d_mod) % 4096;
                let d = &mut dst[at..at + len];
                // SAFETY: `len` bytes of each, distinct allocations.
                unsafe { copy_bytes(src.as_ptr(), d.as_mut_ptr(), len) };
                assert_eq!(&dst[at..at + len], &src[..len], "gap {gap} len {len}");
                assert!(dst[..at].iter().all(|&b| b == 0), "gap {gap} len {len}");
                assert!(
                    dst[at + len..].iter().all(|&b| b == 0),
                    "gap {gap} len {len}"
                );
            }
        }
    }

    #[test]
    fn offset_limits_are_errors() {
        assert_eq!(
            ShmOffset::new(MAX_OWNER + 1, 0),
            Err(OffsetError::OwnerTooLarge {
                owner: MAX_OWNER + 1
            })
        );
        assert!(ShmOffset::new(0, MAX_OFFSET + 1).is_err());
        assert!(ShmOffset::from_raw(1 << 63).is_err());
        assert!(ShmOffset::new(0, MAX_OFFSET).unwrap().add(1).is_err());
        assert!(ShmOffset::new(0, 1).unwrap().add(u64::MAX).is_err());
    }

    #[test]
    fn resolve_checks_bounds_and_alignment() {
        let mut buf = vec![0u64; 8];
        let bytes = buf.len() * 8;
        // SAFETY: the Vec's buffer is live for the test and accessed only
        // through the region.
        let region = unsafe {
            Region::from_raw_parts(NonNull::new(buf.as_mut_ptr().cast()).unwrap(), bytes)
        };
        let a: &AtomicU64 = region.resolve(8).unwrap();
        a.store(5, Ordering::Relaxed);
        assert_eq!(
            region
                .resolve::<AtomicU64>(8)
                .unwrap()
                .load(Ordering::Relaxed),
            5
        );
        assert!(matches!(
            region.resolve::<AtomicU64>(4),
            Err(ResolveError::Misaligned {
                offset: 4,
                align: 8
            })
        ));
        assert!(matches!(
            region.resolve::<AtomicU64>(60),
            Err(ResolveError::OutOfBounds { .. }) | Err(ResolveError::Misaligned { .. })
        ));
        assert!(matches!(
            region.resolve::<AtomicU64>(64),
            Err(ResolveError::OutOfBounds { .. })
        ));
        assert!(region.resolve::<AtomicU64>(u64::MAX - 3).is_err());
        assert!(region.resolve_slice::<AtomicU64>(0, 8).is_ok());
        assert!(region.resolve_slice::<AtomicU64>(8, 8).is_err());
        assert!(region.resolve_slice::<AtomicU64>(0, usize::MAX).is_err());
        drop(buf);
    }

    #[test]
    fn bytes_roundtrip_and_bounds() {
        let mut buf = vec![0u8; 32];
        let region = Region::from_mut_slice(&mut buf);
        region.write_bytes(3, b"hello").unwrap();
        let mut out = [0u8; 5];
        region.read_bytes(3, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert!(region.write_bytes(30, b"abc").is_err());
        assert!(region.read_bytes(u64::MAX, &mut out).is_err());
        let sub = region.subregion(3, 5).unwrap();
        sub.read_bytes(0, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert!(region.subregion(30, 5).is_err());
    }

    #[test]
    fn borrowed_bytes_are_the_region_itself() {
        let mut buf = vec![0u8; 32];
        let base = buf.as_ptr() as usize;
        let region = Region::from_mut_slice(&mut buf);
        region.write_bytes(4, b"in place").unwrap();
        let sub = region.subregion(4, 8).unwrap();
        // SAFETY: nothing writes the buffer while the slice lives.
        let b = unsafe { sub.borrow_bytes() };
        assert_eq!(b, b"in place");
        assert_eq!(b.as_ptr() as usize, base + 4);
        let empty = region.subregion(32, 0).unwrap();
        // SAFETY: as above.
        assert!(unsafe { empty.borrow_bytes() }.is_empty());
    }

    #[test]
    fn table_resolves_only_known_owners() {
        let mut a = vec![0u64; 4];
        let mut b = vec![0u64; 4];
        // SAFETY: both buffers outlive the table and are accessed only
        // through it.
        let (ra, rb) = unsafe {
            (
                Region::from_raw_parts(NonNull::new(a.as_mut_ptr().cast()).unwrap(), 32),
                Region::from_raw_parts(NonNull::new(b.as_mut_ptr().cast()).unwrap(), 32),
            )
        };
        let mut t: SegmentTable<'_, 4> = SegmentTable::new();
        t.insert(0, ra).unwrap();
        t.insert(2, rb).unwrap();
        assert!(t.insert(4, rb).is_err());
        let x: &AtomicU64 = t.resolve(ShmOffset::new(2, 16).unwrap()).unwrap();
        x.store(9, Ordering::Relaxed);
        assert_eq!(
            t.resolve::<AtomicU64>(ShmOffset::new(2, 16).unwrap())
                .unwrap()
                .load(Ordering::Relaxed),
            9
        );
        assert_eq!(
            t.resolve::<AtomicU64>(ShmOffset::new(1, 0).unwrap())
                .unwrap_err(),
            ResolveError::UnknownOwner { owner: 1 }
        );
        assert_eq!(
            t.resolve::<AtomicU64>(ShmOffset::new(100, 0).unwrap())
                .unwrap_err(),
            ResolveError::UnknownOwner { owner: 100 }
        );
        assert!(t.remove(2).is_some());
        assert!(t
            .resolve::<AtomicU64>(ShmOffset::new(2, 0).unwrap())
            .is_err());
        drop((a, b));
    }
}
