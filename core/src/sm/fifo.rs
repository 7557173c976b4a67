//! The shared-memory FIFO: a lock-free ring of 64-bit slots with many
//! writers and one reader (the seed's `sm_fifo_t`).
//!
//! Each receiver owns [`fifo_map_num`]`(num_fifos, nprocs)` of these rings
//! in its part of the segment; sender `s` writes into ring
//! `s & (num_fifos - 1)` ([`fifo_map`]).
//!
//! # Protocol
//!
//! The ring has `size` slots (a power of two), each holding a value or the
//! sentinel [`FREE`]. Three monotonically increasing 64-bit counters (no
//! ABA: they never wrap in practice) describe it:
//!
//! - `head`, shared by the writers: the next index to reserve;
//! - the reader's `tail` (private to the [`Consumer`]): the next index to
//!   read;
//! - `freed`, published by the reader: every index below it has been
//!   consumed *and* its slot reset to [`FREE`].
//!
//! A writer ([`Producer::push`]) reserves index `h` with a compare-and-swap
//! on `head`, allowed only while `h - freed < size` (it caches `freed` and
//! reloads it only when the ring looks full), then publishes its value with
//! a release store into slot `h % size`. The reservation, not the slot's
//! content, decides who may write a slot: the seed's "check the slot is
//! FREE, then write" is only safe under its writer lock, because without one
//! a writer still holding a reserved but unwritten slot of the previous lap
//! would be overwritten. (An earlier version also published with a
//! compare-and-swap from FREE, to detect a corrupted ring; it cost one more
//! cache miss per message on the critical path, and a peer that scribbles on
//! a ring defeats any such check anyway: the reader validates every value it
//! takes.)
//!
//! The reader ([`Consumer::pop`]) takes the slot at `tail` if it is not
//! FREE and advances `tail`; every `lazy_free` reads it resets the consumed
//! slots to FREE and publishes `freed = tail` (the seed's `fifo_lazy_free`:
//! one release store per batch instead of a cache-line bounce per message).
//! Per-writer order is kept because a writer's reservations are increasing
//! and the reader reads indices in order.
//!
//! A full ring hands the value back ([`PushError::Full`]); nothing is lost.
//!
//! # Failure model
//!
//! No lock exists: a writer that dies at any point leaves the other writers
//! free to go on. The one window is between a writer's reservation and its
//! publication (a few instructions): if it dies there, the reader stops at
//! that slot. [`Consumer::reservation_pending`] lets the owner see that state,
//! so a liveness check can tell a dead writer from a slow one.
//!
//! Every counter and slot lives in shared memory and may be scribbled on by
//! a misbehaving peer. All index arithmetic is wrapping and masked, so no
//! value of the shared state causes a panic or an out-of-bounds access; the
//! worst outcome is a lost or spurious value, which the fragment layer
//! ([`crate::sm::frag`]) then rejects when it decodes and resolves it.
//!
//! The reader can also tell that the shared state is wrong
//! ([`Consumer::audit`], off the fast path: the owner calls it with its
//! liveness checks): it alone writes `freed`, so a different value there
//! was written by someone else; honest writers never reserve beyond
//! `freed + size` nor leave `head` below what was read; the header's
//! geometry never changes; and a reserved slot left unwritten for many
//! audits is a writer that died inside its push (or a scribbled `head`).
#![allow(unsafe_code)]

use core::fmt;
use core::mem::size_of;

use crate::shm::{Region, ResolveError, ShmSafe};
use crate::sync::{AtomicU32, AtomicU64, CachePadded, Ordering, CACHE_LINE};

/// The sentinel of an empty slot (the seed's `SM_FIFO_FREE`). Never a valid
/// value: [`crate::sm::frag`] encodings always have bit 63 clear.
pub const FREE: u64 = u64::MAX;
/// Smallest ring (slots).
pub const MIN_SIZE: u32 = 2;
/// Largest ring (slots).
pub const MAX_SIZE: u32 = 1 << 30;

/// "BTLF" — marks an initialised ring.
const MAGIC: u32 = 0x4254_4c46;
/// Layout version of the ring header.
const VERSION: u32 = 1;

/// The writers' line: the next index to reserve.
#[repr(C)]
struct WriterLine {
    head: AtomicU64,
}

/// The reader's line: what it has freed, where it stopped, whether a reader
/// holds the ring.
#[repr(C)]
struct ReaderLine {
    freed: AtomicU64,
    tail: AtomicU64,
    claimed: AtomicU32,
    _reserved: AtomicU32,
}

/// Written once at initialisation, read-only afterwards.
#[repr(C)]
struct Meta {
    magic: AtomicU32,
    version: AtomicU32,
    size: AtomicU32,
    lazy_free: AtomicU32,
}

/// The ring's header in shared memory; the slots follow it.
#[repr(C)]
struct FifoHeader {
    writer: CachePadded<WriterLine>,
    reader: CachePadded<ReaderLine>,
    meta: CachePadded<Meta>,
}

// SAFETY: repr(C) aggregates of integer atomics and padding: no pointers, no
// Drop, every bit pattern valid, all mutation atomic.
unsafe impl ShmSafe for WriterLine {}
// SAFETY: as above.
unsafe impl ShmSafe for ReaderLine {}
// SAFETY: as above.
unsafe impl ShmSafe for Meta {}
// SAFETY: as above (CachePadded adds only padding).
unsafe impl ShmSafe for FifoHeader {}

/// Why a ring could not be initialised, attached or claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum FifoError {
    /// The size is not a power of two in `[MIN_SIZE, MAX_SIZE]`.
    #[error("FIFO size {size} is not a power of two between {MIN_SIZE} and {MAX_SIZE}")]
    InvalidSize {
        /// The size found or asked for.
        size: u32,
    },
    /// `lazy_free` is not in `[1, size / 2]`.
    #[error(
        "FIFO lazy-free count {lazy_free} is not between 1 and {} (half of size {size})",
        .size / 2
    )]
    InvalidLazyFree {
        /// The value found or asked for.
        lazy_free: u32,
        /// The ring's size.
        size: u32,
    },
    /// The ring's memory is not inside the region or not aligned.
    #[error("FIFO memory: {0}")]
    Resolve(ResolveError),
    /// No initialised ring at this offset (or it was overwritten).
    #[error("no initialised FIFO here (magic {found:#010x})")]
    BadMagic {
        /// The magic found.
        found: u32,
    },
    /// The ring was laid out by an incompatible version.
    #[error("FIFO layout version {found}, expected {VERSION}")]
    BadVersion {
        /// The version found.
        found: u32,
    },
    /// Another consumer holds the ring.
    #[error("the FIFO already has a consumer")]
    AlreadyClaimed,
    /// The reader's persisted state is inconsistent (`freed > tail`).
    #[error("FIFO reader state corrupted: freed {freed} is beyond tail {tail}")]
    CorruptedReaderState {
        /// Freed counter found.
        freed: u64,
        /// Tail found.
        tail: u64,
    },
}

wrap_from!(FifoError { Resolve(ResolveError) });

/// What [`Consumer::audit`] found wrong with the ring's shared state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RingFault {
    /// The header's magic, version, size or lazy-free count changed since
    /// the ring was attached.
    Header,
    /// `freed`, which only the reader writes, holds another value than the
    /// reader published.
    Freed {
        /// The value found.
        found: u64,
        /// The value the reader published.
        published: u64,
    },
    /// `head` is below what the reader has read, or more than a ring ahead
    /// of what it freed: no honest writer leaves it there.
    Head {
        /// The value found.
        head: u64,
        /// The reader's position.
        tail: u64,
        /// What the reader freed.
        freed: u64,
    },
    /// The slot at the reader's position was reserved but stayed unwritten
    /// for the given number of audits in a row.
    Stalled {
        /// The index of the slot.
        index: u64,
        /// Audits it has been seen stalled.
        audits: u32,
    },
}

impl fmt::Display for RingFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Header => write!(f, "ring header (geometry) changed after attach"),
            Self::Freed { found, published } => write!(
                f,
                "ring counter `freed` is {found}, but its reader published {published}"
            ),
            Self::Head { head, tail, freed } => write!(
                f,
                "ring counter `head` is {head}, impossible with the reader at {tail} having \
                 freed {freed}"
            ),
            Self::Stalled { index, audits } => write!(
                f,
                "ring slot {index} reserved but never written ({audits} checks in a row): a \
                 writer died inside its push, or `head` was changed"
            ),
        }
    }
}

/// A value could not be pushed; it is handed back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PushError {
    /// The ring is full (the seed's `OMPI_ERR_OUT_OF_RESOURCE`): retry after
    /// the reader has made room.
    #[error("FIFO full")]
    Full(u64),
    /// The value is the [`FREE`] sentinel, which cannot be stored.
    #[error("value {0:#x} is the FREE sentinel")]
    InvalidValue(u64),
}

impl PushError {
    /// The value that was not pushed.
    pub const fn into_value(self) -> u64 {
        match self {
            Self::Full(v) | Self::InvalidValue(v) => v,
        }
    }
}

/// A validated view of a ring in a region; hands out [`Producer`]s and the
/// one [`Consumer`].
#[derive(Clone, Copy)]
pub struct Fifo<'a> {
    header: &'a FifoHeader,
    slots: &'a [AtomicU64],
    mask: u64,
    lazy_free: u64,
}

impl fmt::Debug for Fifo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fifo")
            .field("size", &self.slots.len())
            .field("lazy_free", &self.lazy_free)
            .finish()
    }
}

fn check_geometry(size: u32, lazy_free: u32) -> Result<(), FifoError> {
    if !(MIN_SIZE..=MAX_SIZE).contains(&size) || !size.is_power_of_two() {
        return Err(FifoError::InvalidSize { size });
    }
    if lazy_free == 0 || lazy_free > size / 2 {
        return Err(FifoError::InvalidLazyFree { lazy_free, size });
    }
    Ok(())
}

impl<'a> Fifo<'a> {
    /// Alignment the ring's offset must have (in the address space of every
    /// process that maps it; segments are page aligned).
    pub const ALIGN: usize = CACHE_LINE;

    /// Bytes a ring of `fifo_size` slots occupies (header + slots, rounded
    /// up to [`Self::ALIGN`]); `None` on overflow.
    pub fn memory_size(fifo_size: u32) -> Option<usize> {
        let slots = size_of::<AtomicU64>().checked_mul(usize::try_from(fifo_size).ok()?)?;
        let bytes = size_of::<FifoHeader>().checked_add(slots)?;
        bytes.checked_next_multiple_of(Self::ALIGN)
    }

    /// Initialises a ring of `fifo_size` slots at `offset` in `region`, all
    /// slots FREE, and returns a view of it.
    ///
    /// # Safety
    ///
    /// Nothing else may access `[offset, offset + memory_size(fifo_size))`
    /// while this runs: a ring is initialised before it is published to
    /// peers (or re-initialised only after every peer has detached).
    pub unsafe fn init(
        region: &Region<'a>,
        offset: u64,
        fifo_size: u32,
        lazy_free: u32,
    ) -> Result<Self, FifoError> {
        check_geometry(fifo_size, lazy_free)?;
        // Check the whole ring fits before writing anything.
        let bytes =
            Self::memory_size(fifo_size).ok_or(FifoError::InvalidSize { size: fifo_size })?;
        region.subregion(offset, bytes)?;
        let new_u32 = |v: u32| AtomicU32::new(v);
        let header = FifoHeader {
            writer: CachePadded(WriterLine {
                head: AtomicU64::new(0),
            }),
            reader: CachePadded(ReaderLine {
                freed: AtomicU64::new(0),
                tail: AtomicU64::new(0),
                claimed: new_u32(0),
                _reserved: new_u32(0),
            }),
            meta: CachePadded(Meta {
                magic: new_u32(0),
                version: new_u32(VERSION),
                size: new_u32(fifo_size),
                lazy_free: new_u32(lazy_free),
            }),
        };
        // SAFETY: exclusive access to the ring's bytes (caller's contract).
        let header = unsafe { region.write_in_place(offset, header)? };
        let slots_at = offset
            .checked_add(size_of::<FifoHeader>() as u64)
            .ok_or(FifoError::InvalidSize { size: fifo_size })?;
        let slot_size = size_of::<AtomicU64>() as u64;
        for i in 0..u64::from(fifo_size) {
            // SAFETY: as above; `i * 8` cannot overflow for i < 2^30 and the
            // sum is bounds-checked by write_in_place.
            unsafe {
                region
                    .write_in_place(slots_at.saturating_add(i * slot_size), AtomicU64::new(FREE))?
            };
        }
        // Release: pairs with the Acquire load of the magic in `attach`, so an
        // attacher that sees the magic sees the initialised geometry and slots.
        header.meta.magic.store(MAGIC, Ordering::Release);
        Self::attach(region, offset)
    }

    /// Attaches to a ring initialised (possibly by another process) at
    /// `offset`, validating its header.
    pub fn attach(region: &Region<'a>, offset: u64) -> Result<Self, FifoError> {
        let header: &'a FifoHeader = region.resolve(offset)?;
        // Acquire: pairs with the Release store of the magic in `init`.
        let magic = header.meta.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(FifoError::BadMagic { found: magic });
        }
        let version = header.meta.version.load(Ordering::Relaxed);
        if version != VERSION {
            return Err(FifoError::BadVersion { found: version });
        }
        let size = header.meta.size.load(Ordering::Relaxed);
        let lazy_free = header.meta.lazy_free.load(Ordering::Relaxed);
        check_geometry(size, lazy_free)?;
        let slots_at = offset
            .checked_add(size_of::<FifoHeader>() as u64)
            .ok_or(FifoError::InvalidSize { size })?;
        let slots: &'a [AtomicU64] = region.resolve_slice(slots_at, size as usize)?;
        Ok(Self {
            header,
            slots,
            mask: u64::from(size) - 1,
            lazy_free: u64::from(lazy_free),
        })
    }

    /// Number of slots.
    pub fn size(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Reads between two releases of consumed slots.
    pub fn lazy_free(&self) -> u32 {
        self.lazy_free as u32
    }

    /// A writer handle. Each writing thread or process uses its own; any
    /// number may exist at once.
    pub fn producer(&self) -> Producer<'a> {
        Producer {
            fifo: *self,
            cached_freed: self.header.reader.freed.load(Ordering::Acquire),
        }
    }

    /// Claims the ring's one reader handle; it resumes where the previous
    /// consumer (if any) stopped. Fails if another consumer holds it.
    pub fn claim_consumer(&self) -> Result<Consumer<'a>, FifoError> {
        let r = &self.header.reader;
        // Acquire: pairs with the Release in Consumer::drop, so the new
        // consumer sees the tail and freed values the old one left.
        if r.claimed
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Err(FifoError::AlreadyClaimed);
        }
        let freed = r.freed.load(Ordering::Relaxed);
        let tail = r.tail.load(Ordering::Relaxed);
        if freed > tail || tail - freed > self.mask + 1 {
            r.claimed.store(0, Ordering::Release);
            return Err(FifoError::CorruptedReaderState { freed, tail });
        }
        Ok(Consumer {
            fifo: *self,
            tail,
            freed,
            stalled: (0, 0),
        })
    }

    /// Slots reserved and not yet released by the reader (an upper bound on
    /// the values waiting, read racily: for diagnostics and heuristics).
    pub fn occupancy_hint(&self) -> u64 {
        let head = self.header.writer.head.load(Ordering::Relaxed);
        let freed = self.header.reader.freed.load(Ordering::Relaxed);
        head.wrapping_sub(freed).min(self.mask + 1)
    }

    #[inline]
    fn slot(&self, index: u64) -> &'a AtomicU64 {
        let i = (index & self.mask) as usize;
        debug_assert!(i < self.slots.len());
        // `mask + 1 == slots.len()` (attach), so this never goes out of range;
        // fall back to slot 0 rather than panic if that were ever violated.
        self.slots.get(i).unwrap_or(&self.slots[0])
    }
}

/// A writer's handle on a ring. `Send`, not `Sync`: one per writing thread.
#[derive(Debug)]
pub struct Producer<'a> {
    fifo: Fifo<'a>,
    cached_freed: u64,
}

impl Producer<'_> {
    /// Appends `value` (anything but [`FREE`]). Never blocks; on a full ring
    /// the value is handed back in [`PushError::Full`].
    #[inline]
    pub fn push(&mut self, value: u64) -> Result<(), PushError> {
        if value == FREE {
            return Err(PushError::InvalidValue(value));
        }
        let fifo = &self.fifo;
        let size = fifo.mask + 1;
        let head_atomic = &fifo.header.writer.head;
        let mut head = head_atomic.load(Ordering::Relaxed);
        loop {
            if head.wrapping_sub(self.cached_freed) >= size {
                // Acquire: pairs with the reader's Release store of `freed`,
                // so the FREE stores to the slots below `freed` are visible
                // to our slot store.
                self.cached_freed = fifo.header.reader.freed.load(Ordering::Acquire);
                if head.wrapping_sub(self.cached_freed) >= size {
                    return Err(PushError::Full(value));
                }
            }
            match head_atomic.compare_exchange_weak(
                head,
                head.wrapping_add(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(current) => head = current,
            }
        }
        // Index `head` is ours alone: the reservation rule (`head - freed <
        // size`) guarantees the reader freed this slot's previous lap, so a
        // plain store suffices (a compare-and-swap would first have to pull
        // the line over from the reader: one more cache miss on the critical
        // path of every message). Release: pairs with the reader's Acquire
        // load of the slot, making everything written before the push (the
        // fragment) visible to the reader.
        fifo.slot(head).store(value, Ordering::Release);
        Ok(())
    }

    /// The ring this handle writes to.
    pub fn fifo(&self) -> &Fifo<'_> {
        &self.fifo
    }
}

/// The reader's handle on a ring (one per ring, from
/// [`Fifo::claim_consumer`]). Dropping it persists its position and
/// releases the claim.
#[derive(Debug)]
pub struct Consumer<'a> {
    fifo: Fifo<'a>,
    tail: u64,
    freed: u64,
    /// The reader position at which the last audits found a stalled
    /// reservation, and how many audits in a row.
    stalled: (u64, u32),
}

impl Consumer<'_> {
    /// True when [`Self::pop`] would return `None` now: one load, what a
    /// poll of an empty ring costs.
    #[inline]
    pub fn is_empty(&self) -> bool {
        // Acquire as in `pop` (which reads the slot again).
        self.fifo.slot(self.tail).load(Ordering::Acquire) == FREE
    }

    /// Takes the next value, or `None` if the ring is empty. Never blocks.
    #[inline]
    pub fn pop(&mut self) -> Option<u64> {
        // Acquire: pairs with the writer's Release store that published the
        // value (and, before it, the fragment it names).
        let value = self.fifo.slot(self.tail).load(Ordering::Acquire);
        if value == FREE {
            return None;
        }
        self.tail = self.tail.wrapping_add(1);
        if self.tail.wrapping_sub(self.freed) >= self.fifo.lazy_free {
            self.release_consumed();
        }
        Some(value)
    }

    /// Resets every consumed slot to FREE now and publishes it to the
    /// writers (done automatically every `lazy_free` reads; call it when
    /// going idle so writers are not held back by a partial batch).
    pub fn release_consumed(&mut self) {
        if self.freed == self.tail {
            return;
        }
        let mut i = self.freed;
        while i != self.tail {
            // Relaxed: published by the Release store of `freed` below.
            self.fifo.slot(i).store(FREE, Ordering::Relaxed);
            i = i.wrapping_add(1);
        }
        // Release: pairs with the writers' Acquire load of `freed`, ordering
        // the FREE stores above before any reuse of those slots.
        self.fifo
            .header
            .reader
            .freed
            .store(self.tail, Ordering::Release);
        self.freed = self.tail;
    }

    /// True if a writer has reserved the next slot but not yet published its
    /// value. Transient for a live writer; if it lasts (see the owner's
    /// liveness check) the writer died inside its push.
    pub fn reservation_pending(&self) -> bool {
        let head = self.fifo.header.writer.head.load(Ordering::Relaxed);
        head != self.tail && self.fifo.slot(self.tail).load(Ordering::Relaxed) == FREE
    }

    /// Checks the ring's shared state against what this reader knows (see
    /// the module docs; not on the fast path: call it now and then, e.g.
    /// with liveness checks). A reservation stalled at the same slot for
    /// `stall_audits` calls in a row is a fault (0: never).
    pub fn audit(&mut self, stall_audits: u32) -> Result<(), RingFault> {
        let h = self.fifo.header;
        let r = Ordering::Relaxed;
        let size = self.fifo.mask + 1;
        if h.meta.magic.load(r) != MAGIC
            || h.meta.version.load(r) != VERSION
            || u64::from(h.meta.size.load(r)) != size
            || u64::from(h.meta.lazy_free.load(r)) != self.fifo.lazy_free
        {
            return Err(RingFault::Header);
        }
        let found = h.reader.freed.load(r);
        if found != self.freed {
            return Err(RingFault::Freed {
                found,
                published: self.freed,
            });
        }
        // Every value read was published after its writer reserved it, and
        // the reader's acquire of it orders this load after that
        // reservation: `head >= tail`. Writers reserve only below
        // `freed + size`, with `freed` at most what this reader published.
        let head = h.writer.head.load(r);
        if head.wrapping_sub(self.tail) > size || head.wrapping_sub(self.freed) > size {
            return Err(RingFault::Head {
                head,
                tail: self.tail,
                freed: self.freed,
            });
        }
        if head != self.tail && self.fifo.slot(self.tail).load(r) == FREE {
            let (at, n) = self.stalled;
            let n = if at == self.tail {
                n.saturating_add(1)
            } else {
                1
            };
            self.stalled = (self.tail, n);
            if stall_audits > 0 && n >= stall_audits {
                return Err(RingFault::Stalled {
                    index: self.tail,
                    audits: n,
                });
            }
        } else {
            self.stalled = (0, 0);
        }
        Ok(())
    }

    /// Steps over a reservation stalled at the reader's position, as if its
    /// value had been read, and returns whether there was one. For a
    /// reservation whose writer is known to have failed (killed inside its
    /// push: it never publishes), so the ring's other writers go on. A live
    /// writer that publishes into the slot afterwards loses that value or
    /// overwrites a later lap's; its sequence then breaks, which the
    /// fragment layer reports.
    pub fn skip_stalled(&mut self) -> bool {
        if !self.reservation_pending() {
            return false;
        }
        self.tail = self.tail.wrapping_add(1);
        self.stalled = (0, 0);
        if self.tail.wrapping_sub(self.freed) >= self.fifo.lazy_free {
            self.release_consumed();
        }
        true
    }

    /// Number of values read so far over the ring's life.
    pub fn position(&self) -> u64 {
        self.tail
    }

    /// The ring this handle reads.
    pub fn fifo(&self) -> &Fifo<'_> {
        &self.fifo
    }
}

impl Drop for Consumer<'_> {
    fn drop(&mut self) {
        let r = &self.fifo.header.reader;
        r.tail.store(self.tail, Ordering::Relaxed);
        // Release: pairs with the Acquire CAS in claim_consumer.
        r.claimed.store(0, Ordering::Release);
    }
}

/// How many receive rings a process owns: `min(num_fifos, nprocs)` (the
/// seed's `FIFO_MAP_NUM`).
pub fn fifo_map_num(num_fifos: u32, nprocs: u32) -> u32 {
    num_fifos.min(nprocs)
}

/// The ring of a receiver that `sender` writes into: `sender & (num_fifos -
/// 1)` (the seed's `FIFO_MAP`). `num_fifos` must be a power of two (verified
/// parameters are).
pub fn fifo_map(sender: u32, num_fifos: u32) -> u32 {
    debug_assert!(
        num_fifos.is_power_of_two(),
        "num_fifos must be a power of two"
    );
    sender & num_fifos.wrapping_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// A cache-line aligned buffer for a ring.
    fn buffer(bytes: usize) -> Vec<CachePadded<[u64; CACHE_LINE / 8]>> {
        let lines = bytes.div_ceil(CACHE_LINE);
        let mut v = Vec::with_capacity(lines);
        v.resize_with(lines, || CachePadded([0u64; CACHE_LINE / 8]));
        v
    }

    fn region(buf: &mut [CachePadded<[u64; CACHE_LINE / 8]>]) -> Region<'_> {
        let len = core::mem::size_of_val(buf);
        // SAFETY: the buffer is exclusively borrowed for the region's
        // lifetime and only accessed through it.
        let bytes = unsafe { core::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), len) };
        Region::from_mut_slice(bytes)
    }

    /// Runs `f` on a fresh ring of `size` slots (`lazy_free` `lazy`) at the
    /// start of a buffer of its own.
    fn with_fifo(size: u32, lazy: u32, f: impl FnOnce(&Fifo<'_>)) {
        let mut buf = buffer(Fifo::memory_size(size).unwrap());
        let r = region(&mut buf);
        // SAFETY: fresh buffer, nothing else accesses it.
        let fifo = unsafe { Fifo::init(&r, 0, size, lazy) }.unwrap();
        f(&fifo);
    }

    #[test]
    fn memory_size_rounds_and_detects_overflow() {
        let s = Fifo::memory_size(4096).unwrap();
        assert_eq!(s % CACHE_LINE, 0);
        assert!(s >= 4096 * 8 + 3 * CACHE_LINE);
        assert!(Fifo::memory_size(u32::MAX).is_some() || cfg!(target_pointer_width = "32"));
    }

    #[test]
    fn push_pop_in_order_with_wraparound() {
        with_fifo(4, 1, |fifo| {
            let mut p = fifo.producer();
            let mut c = fifo.claim_consumer().unwrap();
            assert_eq!(c.pop(), None);
            for round in 0..10u64 {
                for i in 0..4 {
                    p.push(round * 10 + i).unwrap();
                }
                assert_eq!(p.push(99), Err(PushError::Full(99)));
                for i in 0..4 {
                    assert_eq!(c.pop(), Some(round * 10 + i));
                }
                assert_eq!(c.pop(), None);
            }
        });
    }

    #[test]
    fn lazy_free_holds_slots_until_batch() {
        with_fifo(8, 4, |fifo| {
            let mut p = fifo.producer();
            let mut c = fifo.claim_consumer().unwrap();
            for i in 0..8 {
                p.push(i).unwrap();
            }
            assert!(matches!(p.push(8), Err(PushError::Full(8))));
            for i in 0..3 {
                assert_eq!(c.pop(), Some(i));
            }
            // Three consumed, but under lazy_free = 4 nothing is released yet.
            assert!(matches!(p.push(8), Err(PushError::Full(8))));
            assert_eq!(c.pop(), Some(3));
            for i in 8..12 {
                p.push(i).unwrap();
            }
            assert!(p.push(12).is_err());
            // Explicit release of a partial batch.
            assert_eq!(c.pop(), Some(4));
            c.release_consumed();
            p.push(12).unwrap();
            let rest: Vec<u64> = core::iter::from_fn(|| c.pop()).collect();
            assert_eq!(rest, vec![5, 6, 7, 8, 9, 10, 11, 12]);
        });
    }

    #[test]
    fn free_sentinel_is_refused() {
        with_fifo(2, 1, |fifo| {
            assert_eq!(
                fifo.producer().push(FREE),
                Err(PushError::InvalidValue(FREE))
            );
        });
    }

    #[test]
    fn geometry_is_validated() {
        let mut buf = buffer(Fifo::memory_size(8).unwrap());
        let r = region(&mut buf);
        for (size, lazy) in [(0, 1), (1, 1), (3, 1), (6, 1), (8, 0), (8, 5)] {
            // SAFETY: fresh buffer, exclusive.
            let res = unsafe { Fifo::init(&r, 0, size, lazy) };
            assert!(res.is_err(), "{size} {lazy}");
        }
        // Too big for the region.
        // SAFETY: as above.
        let res = unsafe { Fifo::init(&r, 0, 32, 1) };
        assert!(matches!(res, Err(FifoError::Resolve(_))));
        // Misaligned offset.
        // SAFETY: as above.
        assert!(unsafe { Fifo::init(&r, 8, 2, 1) }.is_err());
    }

    #[test]
    fn attach_rejects_garbage_and_finds_initialised() {
        let mut buf = buffer(Fifo::memory_size(8).unwrap());
        let r = region(&mut buf);
        assert!(matches!(
            Fifo::attach(&r, 0),
            Err(FifoError::BadMagic { found: 0 })
        ));
        // SAFETY: fresh buffer.
        let fifo = unsafe { Fifo::init(&r, 0, 8, 2) }.unwrap();
        fifo.producer().push(42).unwrap();
        let again = Fifo::attach(&r, 0).unwrap();
        assert_eq!((again.size(), again.lazy_free()), (8, 2));
        assert_eq!(again.claim_consumer().unwrap().pop(), Some(42));
        // Corrupt the geometry: attach refuses, no panic.
        fifo.header.meta.size.store(7, Ordering::Relaxed);
        assert!(matches!(
            Fifo::attach(&r, 0),
            Err(FifoError::InvalidSize { size: 7 })
        ));
        fifo.header.meta.size.store(1 << 20, Ordering::Relaxed);
        assert!(Fifo::attach(&r, 0).is_err());
    }

    #[test]
    fn one_consumer_at_a_time_and_it_resumes() {
        with_fifo(4, 2, |fifo| {
            let mut p = fifo.producer();
            for i in 0..3 {
                p.push(i).unwrap();
            }
            let mut c = fifo.claim_consumer().unwrap();
            assert_eq!(
                fifo.claim_consumer().unwrap_err(),
                FifoError::AlreadyClaimed
            );
            assert_eq!(c.pop(), Some(0));
            drop(c);
            let mut c = fifo.claim_consumer().unwrap();
            assert_eq!(c.pop(), Some(1));
            assert_eq!(c.pop(), Some(2));
            assert_eq!(c.pop(), None);
        });
    }

    #[test]
    fn corrupted_state_never_panics() {
        with_fifo(4, 1, |fifo| {
            // Garbage counters: every push and pop stays in bounds, no panic.
            fifo.header
                .writer
                .head
                .store(u64::MAX - 1, Ordering::Relaxed);
            fifo.header.reader.freed.store(u64::MAX, Ordering::Relaxed);
            let mut p = fifo.producer();
            for v in 0..10 {
                let _ = p.push(v);
            }
            // The claim checks the reader's persisted state.
            assert!(fifo.claim_consumer().is_err());
            fifo.header.reader.freed.store(0, Ordering::Relaxed);
            let mut c = fifo.claim_consumer().unwrap();
            for _ in 0..10 {
                let _ = c.pop();
            }
            drop(c);
            fifo.header.reader.freed.store(3, Ordering::Relaxed);
            fifo.header.reader.tail.store(1, Ordering::Relaxed);
            assert!(matches!(
                fifo.claim_consumer(),
                Err(FifoError::CorruptedReaderState { freed: 3, tail: 1 })
            ));
        });
    }

    #[test]
    fn reservation_pending_is_visible() {
        with_fifo(4, 1, |fifo| {
            let c = fifo.claim_consumer().unwrap();
            assert!(!c.reservation_pending());
            // Simulate a writer that reserved and died before publishing.
            fifo.header.writer.head.store(1, Ordering::Relaxed);
            assert!(c.reservation_pending());
        });
    }

    #[test]
    fn a_stalled_reservation_can_be_stepped_over() {
        with_fifo(4, 1, |fifo| {
            let mut c = fifo.claim_consumer().unwrap();
            assert!(!c.skip_stalled(), "nothing reserved");
            // A writer reserved index 0 and died; another pushed after it.
            fifo.header.writer.head.store(1, Ordering::Relaxed);
            let mut p = fifo.producer();
            p.push(7).unwrap();
            assert_eq!(c.pop(), None, "the reader waits at the stalled slot");
            assert!(c.skip_stalled());
            assert_eq!(c.pop(), Some(7));
            assert_eq!(c.pop(), None);
            assert!(!c.skip_stalled(), "nothing pending any more");
            // The ring goes on: every slot is usable again, in order.
            for v in 10..20 {
                p.push(v).unwrap();
                assert_eq!(c.pop(), Some(v));
            }
            assert_eq!(c.audit(3), Ok(()));
        });
    }

    #[test]
    fn threads_many_writers_one_reader() {
        const WRITERS: u64 = 3;
        const PER: u64 = if cfg!(miri) { 50 } else { 20_000 };
        with_fifo(16, 4, |fifo| {
            std::thread::scope(|s| {
                for w in 0..WRITERS {
                    let mut p = fifo.producer();
                    s.spawn(move || {
                        for i in 0..PER {
                            let mut v = (w << 32) | i;
                            loop {
                                match p.push(v) {
                                    Ok(()) => break,
                                    Err(PushError::Full(back)) => {
                                        v = back;
                                        std::thread::yield_now();
                                    }
                                    Err(e) => panic!("{e}"),
                                }
                            }
                        }
                    });
                }
                let mut c = fifo.claim_consumer().unwrap();
                let mut next = [0u64; WRITERS as usize];
                let mut got = 0;
                while got < WRITERS * PER {
                    match c.pop() {
                        Some(v) => {
                            let (w, i) = ((v >> 32) as usize, v & 0xffff_ffff);
                            assert_eq!(i, next[w], "writer {w} out of order");
                            next[w] += 1;
                            got += 1;
                        }
                        None => std::thread::yield_now(),
                    }
                }
                assert_eq!(c.pop(), None);
            });
        });
    }

    #[test]
    fn fifo_mapping() {
        assert_eq!(fifo_map_num(4, 2), 2);
        assert_eq!(fifo_map_num(1, 8), 1);
        assert_eq!(fifo_map(5, 4), 1);
        assert_eq!(fifo_map(5, 1), 0);
        // With fewer processes than rings, every sender still maps below
        // fifo_map_num.
        for s in 0..3 {
            assert!(fifo_map(s, 4) < fifo_map_num(4, 3));
        }
    }
}
