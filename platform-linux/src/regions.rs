//! The table of registered memory: one per process, owned by the job API
//! and lent (`&mut`) to the transport that needs it during a call.
//!
//! A region is caller memory peers may get from and put into: borrowed for
//! the job's lifetime (`World::register(&'m mut [u8])`), owned by the table
//! (`register_owned`), or raw memory from C under the C ABI's contract.
//! Ids are never reused, so a key that outlived its region is refused
//! (unknown region), as is a forged one; every range a peer names is
//! checked against the region's length.
//!
//! Regions used by operations of our own that are still in flight (the
//! local side of a get or put, a send straight from a region) are pinned:
//! deregistering them is refused until the operations complete.
//!
//! # Safety
//!
//! The table turns the [`RawBuf`]s it holds into slices; the contract of
//! [`Regions::insert`] (or the owned box) keeps them valid, and `&mut self`
//! makes each mutable slice the only borrow out of the table.
#![allow(unsafe_code)]

use btl_core::rma::{RegionKey, RmaStatus};

use crate::idmap::IdMap;
use crate::rawbuf::RawBuf;

struct Region {
    mem: RawBuf,
    /// Operations of ours using it.
    pins: u32,
    /// Memory the table owns (register_owned); `mem` points into it.
    owned: Option<Box<[u8]>>,
}

/// Why a region could not be removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeregisterError {
    /// No region with that id.
    Unknown,
    /// Operations of ours still use it.
    Busy {
        /// How many.
        ops: u32,
    },
}

/// A region added or removed, for a transport that publishes them (the
/// shared-memory transport's region table: `Sm::apply_unpins`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Region `id` of `len` bytes at `addr` was added.
    Added {
        /// The region's id.
        id: u32,
        /// Its address in this process.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// Region `id` was removed.
    Removed(u32),
}

/// The registered regions of this process.
#[derive(Default)]
pub struct Regions {
    /// By id: ours (a counter), so the fast id hash; a peer's request only
    /// looks ids up, and a lookup of an absent id probes no further than
    /// one of a present one.
    map: IdMap<u32, Region>,
    next: u32,
    /// Whether additions and removals are kept in `changes`.
    track: bool,
    /// Additions and removals not yet taken ([`Self::drain_changes`]).
    changes: Vec<Change>,
}

impl std::fmt::Debug for Regions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Regions")
            .field("count", &self.map.len())
            .finish()
    }
}

impl Regions {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds memory the caller keeps valid, and accessed only through this
    /// table, until it is removed; returns its id.
    ///
    /// # Safety
    ///
    /// `mem` must be valid for reads and writes, and not accessed other
    /// than through this table (or by peers' single copy under the
    /// protocol), until [`Self::remove`] returns it.
    pub unsafe fn insert(&mut self, mem: RawBuf) -> u32 {
        self.add(mem, None)
    }

    /// Adds `len` bytes at `ptr` as a region of rank `me` (this process):
    /// its key; `None` (nothing added) for a null pointer with a non-zero
    /// length.
    ///
    /// # Safety
    ///
    /// As [`Self::insert`], for the `len` bytes at `ptr`.
    pub unsafe fn insert_raw(&mut self, me: u32, ptr: *mut u8, len: usize) -> Option<RegionKey> {
        let mem = RawBuf::from_raw(ptr, len)?;
        // SAFETY: the caller's promise.
        let id = unsafe { self.insert(mem) };
        Some(RegionKey {
            rank: me,
            id,
            len: len as u64,
        })
    }

    /// Adds a buffer the table owns; returns its id.
    pub fn insert_owned(&mut self, mut buf: Box<[u8]>) -> u32 {
        let mem = RawBuf::new_mut(&mut buf);
        // Moving the Box moves the pointer, not the heap allocation `mem`
        // names.
        self.add(mem, Some(buf))
    }

    fn add(&mut self, mem: RawBuf, owned: Option<Box<[u8]>>) -> u32 {
        let id = self.next;
        // Ids are never reused: after 2^32 registrations the counter wraps,
        // skipping ids still present.
        self.next = self.next.wrapping_add(1);
        while self.map.contains_key(&self.next) {
            self.next = self.next.wrapping_add(1);
        }
        if self.track {
            self.changes.push(Change::Added {
                id,
                addr: mem.addr(),
                len: mem.len() as u64,
            });
        }
        self.map.insert(
            id,
            Region {
                mem,
                pins: 0,
                owned,
            },
        );
        id
    }

    /// Keeps additions and removals from now on, for [`Self::drain_changes`]
    /// (a transport that publishes the regions turns it on).
    pub fn track_changes(&mut self) {
        self.track = true;
    }

    /// Whether additions or removals wait to be taken.
    #[inline]
    pub fn has_changes(&self) -> bool {
        !self.changes.is_empty()
    }

    /// The additions and removals since the last call, in order (the
    /// list keeps its memory: one registration after another allocates
    /// nothing).
    pub fn drain_changes(&mut self) -> std::vec::Drain<'_, Change> {
        self.changes.drain(..)
    }

    /// Removes region `id`; hands back the buffer if the table owned it.
    pub fn remove(&mut self, id: u32) -> Result<Option<Box<[u8]>>, DeregisterError> {
        match self.map.get(&id) {
            None => Err(DeregisterError::Unknown),
            Some(r) if r.pins > 0 => Err(DeregisterError::Busy { ops: r.pins }),
            Some(_) => {
                if self.track {
                    self.changes.push(Change::Removed(id));
                }
                Ok(self.map.remove(&id).and_then(|r| r.owned))
            }
        }
    }

    /// Whether `key` names one of rank `me`'s regions as it is: ours, with
    /// the region's length (a key that outlived its region is not).
    fn owns(&self, me: u32, key: &RegionKey) -> bool {
        key.rank == me && self.len_of(key.id).map(|l| l as u64) == Some(key.len)
    }

    /// Removes rank `me`'s region `key`, as [`Self::remove`]; a key that is
    /// not one of ours as it is ([`Self::owns`]) is unknown.
    pub fn remove_key(
        &mut self,
        me: u32,
        key: &RegionKey,
    ) -> Result<Option<Box<[u8]>>, DeregisterError> {
        if !self.owns(me, key) {
            return Err(DeregisterError::Unknown);
        }
        self.remove(key.id)
    }

    /// The local side of a one-sided operation of rank `me`: `[offset,
    /// offset + len)` of its region `key`, checked as [`Self::range`]; a key
    /// that is not one of ours as it is is an unknown region.
    pub fn local_range(
        &self,
        me: u32,
        key: &RegionKey,
        offset: u64,
        len: u64,
    ) -> Result<RawBuf, RmaStatus> {
        if !self.owns(me, key) {
            return Err(RmaStatus::UnknownRegion);
        }
        self.range(key.id, offset, len)
    }

    /// A one-sided operation whose target is this process: copies `mem`
    /// into `[offset, offset + mem.len())` of region `id` (`put`), or that
    /// range into `mem`; the range is checked as [`Self::range`], and the
    /// two may overlap.
    ///
    /// # Safety
    ///
    /// `mem` must be valid for reads (a put) or writes (a get) of its
    /// length.
    pub unsafe fn copy_local(
        &mut self,
        put: bool,
        mem: RawBuf,
        id: u32,
        offset: u64,
    ) -> Result<(), RmaStatus> {
        let theirs = self.range(id, offset, mem.len() as u64)?;
        // SAFETY: both ranges are ours (a region and `mem`);
        // `copy` handles overlap.
        unsafe {
            if put {
                std::ptr::copy(
                    mem.as_slice().as_ptr(),
                    theirs.as_mut_slice().as_mut_ptr(),
                    mem.len(),
                );
            } else {
                std::ptr::copy(
                    theirs.as_slice().as_ptr(),
                    mem.as_mut_slice().as_mut_ptr(),
                    mem.len(),
                );
            }
        }
        Ok(())
    }

    /// Length of region `id`.
    pub fn len_of(&self, id: u32) -> Option<usize> {
        self.map.get(&id).map(|r| r.mem.len())
    }

    /// Number of regions.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True if there are none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// `[offset, offset + len)` of region `id`, checked: unknown id or a
    /// range outside the region is refused.
    pub fn range(&self, id: u32, offset: u64, len: u64) -> Result<RawBuf, RmaStatus> {
        let r = self.map.get(&id).ok_or(RmaStatus::UnknownRegion)?;
        let (off, len) = (
            usize::try_from(offset).map_err(|_| RmaStatus::OutOfBounds)?,
            usize::try_from(len).map_err(|_| RmaStatus::OutOfBounds)?,
        );
        r.mem.sub(off, len).ok_or(RmaStatus::OutOfBounds)
    }

    /// The bytes of a checked range, writable.
    pub fn range_mut(&mut self, id: u32, offset: u64, len: u64) -> Result<&mut [u8], RmaStatus> {
        let raw = self.range(id, offset, len)?;
        // SAFETY: `insert`'s contract (and the Box for owned regions): the
        // memory is valid and accessed only through this table, and
        // `&mut self` makes this the only borrow out of the table.
        Ok(unsafe { raw.as_mut_slice() })
    }

    /// The bytes of region `id`.
    pub fn get(&self, id: u32) -> Option<&[u8]> {
        let r = self.map.get(&id)?;
        // SAFETY: as in `range_mut`; `&self` allows only shared borrows.
        Some(unsafe { r.mem.as_slice() })
    }

    /// The bytes of region `id`, writable.
    pub fn get_mut(&mut self, id: u32) -> Option<&mut [u8]> {
        let r = self.map.get(&id)?;
        // SAFETY: as in `range_mut`.
        Some(unsafe { r.mem.as_mut_slice() })
    }

    /// Marks region `id` as used by one more operation of ours.
    pub fn pin(&mut self, id: u32) {
        if let Some(r) = self.map.get_mut(&id) {
            r.pins += 1;
        }
    }

    /// Ends one [`Self::pin`].
    pub fn unpin(&mut self, id: u32) {
        if let Some(r) = self.map.get_mut(&id) {
            r.pins = r.pins.saturating_sub(1);
        }
    }

    /// Ends one [`Self::pin`] per id in `ids`, emptying it: the pins a
    /// transport queued as the data reading those regions left (a get's
    /// answer written or abandoned), ended before it hands out the next
    /// message (see `Sm::apply_unpins`, `Tcp::apply_unpins`). Out of line:
    /// callers look at `ids` first, and a pass seldom finds any.
    #[cold]
    #[inline(never)]
    pub fn unpin_queued(&mut self, ids: &mut Vec<u32>) {
        for id in ids.drain(..) {
            self.unpin(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_and_ids_not_reused() {
        let mut t = Regions::new();
        let a = t.insert_owned(vec![1u8; 16].into_boxed_slice());
        assert_eq!(t.range(a, 8, 8).map(|r| r.len()), Ok(8));
        assert_eq!(
            t.range(a, 8, 9).map(|r| r.len()),
            Err(RmaStatus::OutOfBounds)
        );
        assert_eq!(
            t.range(a, u64::MAX, 2).map(|r| r.len()),
            Err(RmaStatus::OutOfBounds)
        );
        assert_eq!(
            t.range(a + 1, 0, 1).map(|r| r.len()),
            Err(RmaStatus::UnknownRegion)
        );
        t.range_mut(a, 0, 2).unwrap().copy_from_slice(&[7, 8]);
        assert_eq!(&t.get(a).unwrap()[..3], &[7, 8, 1]);
        t.pin(a);
        assert_eq!(t.remove(a), Err(DeregisterError::Busy { ops: 1 }));
        t.unpin(a);
        let back = t.remove(a).unwrap().unwrap();
        assert_eq!(back[0], 7);
        let b = t.insert_owned(vec![0u8; 4].into_boxed_slice());
        assert_ne!(a, b);
        assert_eq!(t.remove(a), Err(DeregisterError::Unknown));
    }
}
