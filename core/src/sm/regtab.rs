//! The region table: where a rank publishes, in its own part of the
//! segment, the memory regions it registered for one-sided operations, so
//! that a peer on the node can read them by single copy without asking
//! first ("direct gets").
//!
//! Without it, a single-copy get is a round trip before the copy: the
//! requester asks, the target checks its region table (private memory) and
//! answers with the address, then the requester reads. Under Open MPI's ob1
//! every rendezvous message over `rsm` is such a get, where vader reads the
//! sender's buffer at the address its registration handle carries, without
//! asking. With the table, the requester looks the region up itself,
//! checks the range, and reads: two hand-offs through the target's
//! progress loop less (measured: 0.1 µs of a 16 KiB message's 4.4).
//!
//! # What it holds
//!
//! [`ENTRIES`] entries of four 64-bit words, [`TABLE_BYTES`] in all: a
//! sequence word, the region's id word (the id plus one in its low 33
//! bits, 0 for an empty entry, and a 31-bit check of id, address and
//! length above them), its address in the owner's address space, its
//! length. Region `id` lives in
//! entry `id % ENTRIES`; a region whose entry is taken is not published
//! (its gets take the asking path). Only the owner writes its table
//! ([`RegionTable::publish`], [`RegionTable::withdraw`]); peers only read
//! ([`RegionTable::lookup`]).
//!
//! # Protocol: a sequence lock
//!
//! The owner makes the sequence word odd (Relaxed store, then a Release
//! fence), stores the three fields (Relaxed), then makes it even again
//! (Release). A reader loads the sequence (Acquire), the fields (Relaxed),
//! issues an Acquire fence, and loads the sequence again: if both loads
//! saw the same even value, no write overlapped the field loads, so the
//! three fields belong together. Every field is an atomic, so a racing
//! read is never undefined behaviour, only a retry. (The loom model in
//! `loom-tests` drives this code.)
//!
//! # Trust
//!
//! The table is shared memory: any process of the node can write it. A
//! lookup returns an entry only if its check matches its fields (as the
//! fragment headers' check does: a scribble is caught, with odds of 2^-31
//! of passing by chance), and what a reader does with an entry is read
//! `len` bytes at `addr + offset` of the owner's process into its own
//! buffer, after checking `offset + len` against the entry. So a scribbled
//! entry makes the get ask the owner; one forged with a matching check can
//! make it read the wrong bytes of the owner, or fail (`EFAULT`) and ask —
//! never write anywhere, never read past the reader's buffer. That is the
//! class of a scribble on a message's payload bytes, which no transport
//! can tell from data. A process
//! that can scribble on the table can read the owner's memory by single
//! copy anyway (the same user, the same ptrace rights), so the table opens
//! nothing new. What the owner's answer still gives that the table does
//! not: a refusal names its reason ([`crate::rma::RmaStatus`]); a lookup
//! that fails takes the asking path, which gives that answer.
//!
//! Withdrawal races with a reader exactly as the asking path's answer
//! does: a reader that looked the region up just before the owner
//! deregistered it may still read the memory once. That is the contract of
//! a registration (the owner keeps the memory until every peer is done with
//! it), not something either path can check.
#![allow(unsafe_code)]

use crate::shm::{Region, ResolveError, ShmSafe};
use crate::sync::{fence, AtomicU64, Ordering};

/// Bits of the id word that hold the id plus one.
const ID_BITS: u32 = 33;

/// The id word of region `id` at `addr`, `len` bytes: the id plus one,
/// and a check of all three above it.
const fn id_word(id: u32, addr: u64, len: u64) -> u64 {
    let h = (id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ addr.wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
        ^ len.wrapping_mul(0x1656_67b1_9e37_79f9)
        ^ 0x2545_f491_4f6c_dd1d;
    let check = (h ^ (h >> 29)) >> ID_BITS;
    (check << ID_BITS) | (id as u64 + 1)
}

/// Entries of a rank's table.
pub const ENTRIES: usize = 64;
/// Bytes of one entry.
pub const ENTRY_BYTES: usize = core::mem::size_of::<Entry>();
/// Bytes of a rank's table.
pub const TABLE_BYTES: usize = ENTRIES * ENTRY_BYTES;

/// One published region.
#[derive(Debug)]
#[repr(C)]
pub struct Entry {
    /// Odd while the owner writes the entry.
    seq: AtomicU64,
    /// The region's id word ([`id_word`]); 0: no region.
    id: AtomicU64,
    /// The region's address in its owner's process.
    addr: AtomicU64,
    /// The region's length in bytes.
    len: AtomicU64,
}

// SAFETY: repr(C) of integer atomics: no pointers, no Drop, every bit
// pattern valid, all mutation atomic.
unsafe impl ShmSafe for Entry {}

impl Entry {
    /// An empty entry (for memory built in place: tests, loom models; the
    /// segment's zeroed memory is already empty entries).
    pub fn new() -> Self {
        Self {
            seq: AtomicU64::new(0),
            id: AtomicU64::new(0),
            addr: AtomicU64::new(0),
            len: AtomicU64::new(0),
        }
    }
}

impl Default for Entry {
    fn default() -> Self {
        Self::new()
    }
}

/// A region as its table says: address in the owner's process and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Published {
    /// Address of the region's first byte in its owner's process.
    pub addr: u64,
    /// Length of the region in bytes.
    pub len: u64,
}

impl Published {
    /// The owner's address of `[offset, offset + len)` of the region, if
    /// that range lies inside it (and the address does not overflow).
    pub fn range(&self, offset: u64, len: u64) -> Option<u64> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        self.addr.checked_add(offset)
    }
}

/// A rank's region table in the segment (see the module docs).
#[derive(Clone, Copy)]
pub struct RegionTable<'a> {
    entries: &'a [Entry],
}

impl core::fmt::Debug for RegionTable<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RegionTable")
            .field("entries", &self.entries.len())
            .finish()
    }
}

impl<'a> RegionTable<'a> {
    /// The table at `offset` of `region` ([`TABLE_BYTES`] bytes, 8-byte
    /// aligned). Fresh (zeroed) memory is an empty table.
    pub fn resolve(region: &Region<'a>, offset: u64) -> Result<Self, ResolveError> {
        Ok(Self {
            entries: region.resolve_slice::<Entry>(offset, ENTRIES)?,
        })
    }

    /// A table over entries already in memory (tests, models).
    pub fn new(entries: &'a [Entry]) -> Self {
        Self { entries }
    }

    fn entry(&self, id: u32) -> Option<&'a Entry> {
        let n = self.entries.len();
        (n > 0).then(|| &self.entries[id as usize % n])
    }

    /// Owner only: publishes region `id` at `addr`, `len` bytes. Returns
    /// false (nothing written) when its entry holds another region: that
    /// region's gets then take the asking path.
    pub fn publish(&self, id: u32, addr: u64, len: u64) -> bool {
        let Some(e) = self.entry(id) else {
            return false;
        };
        let current = e.id.load(Ordering::Relaxed);
        let mine = u64::from(id) + 1;
        if current != 0 && current & ((1 << ID_BITS) - 1) != mine {
            return false;
        }
        self.write(e, id_word(id, addr, len), addr, len);
        true
    }

    /// Owner only: withdraws region `id` if its entry holds it.
    pub fn withdraw(&self, id: u32) {
        if let Some(e) = self.entry(id) {
            let mine = u64::from(id) + 1;
            if e.id.load(Ordering::Relaxed) & ((1 << ID_BITS) - 1) == mine {
                self.write(e, 0, 0, 0);
            }
        }
    }

    /// Owner only: empties every entry (at start-up, in case the memory is
    /// not fresh).
    pub fn clear(&self) {
        for e in self.entries {
            if e.id.load(Ordering::Relaxed) != 0 {
                self.write(e, 0, 0, 0);
            }
        }
    }

    fn write(&self, e: &Entry, id: u64, addr: u64, len: u64) {
        let s = e.seq.load(Ordering::Relaxed);
        // Odd: a write is in progress. The Release fence orders this store
        // before the field stores below for a reader that sees a field
        // value written after it (its Acquire fence pairs with this one).
        e.seq.store(s | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        e.id.store(id, Ordering::Relaxed);
        e.addr.store(addr, Ordering::Relaxed);
        e.len.store(len, Ordering::Relaxed);
        // Even again, and larger: Release publishes the fields with it.
        e.seq.store((s | 1).wrapping_add(1), Ordering::Release);
    }

    /// Region `id` as the table says, if it is published there and no
    /// write overlapped the reading (a reader retries at most once more;
    /// after that, the caller takes the asking path).
    pub fn lookup(&self, id: u32) -> Option<Published> {
        let e = self.entry(id)?;
        for _ in 0..2 {
            let s1 = e.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                continue;
            }
            let found = e.id.load(Ordering::Relaxed);
            let addr = e.addr.load(Ordering::Relaxed);
            let len = e.len.load(Ordering::Relaxed);
            // Pairs with the owner's Release fence: if any field load saw
            // a value of a later write, the second load sees its odd (or
            // later) sequence.
            fence(Ordering::Acquire);
            let s2 = e.seq.load(Ordering::Relaxed);
            if s1 != s2 {
                continue;
            }
            return (found == id_word(id, addr, len)).then_some(Published { addr, len });
        }
        None
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::vec::Vec;

    fn table_memory() -> Vec<u64> {
        std::vec![0u64; TABLE_BYTES / 8]
    }

    #[test]
    fn id_word_fixture() {
        // Fixed values: a change of the function is a change of the
        // shared-memory format (CONTROL_VERSION).
        assert_eq!(id_word(0, 0, 0), 0x2545_f490_0000_0001);
        assert_eq!(id_word(3, 0x1000, 4096), 0xb37b_5226_0000_0004);
        assert_eq!(id_word(u32::MAX, 0, 0) & ((1 << ID_BITS) - 1), 1 << 32);
        assert_eq!(id_word(3, 0x1000, 4096), id_word(3, 0x1000, 4096));
        assert_ne!(id_word(3, 0x1000, 4096), id_word(3, 0x1000, 4095));
        assert_ne!(id_word(3, 0x1000, 4096), id_word(3, 0x1008, 4096));
        assert_ne!(id_word(3, 0x1000, 4096) >> ID_BITS, 0);
    }

    #[test]
    fn sizes() {
        assert_eq!(ENTRY_BYTES, 32);
        assert_eq!(TABLE_BYTES, 2048);
    }

    #[test]
    fn publish_lookup_withdraw() {
        let mut mem = table_memory();
        let region = Region::from_mut_slice(bytemuck_bytes(&mut mem));
        let t = RegionTable::resolve(&region, 0).unwrap();
        assert_eq!(t.lookup(3), None, "fresh memory is an empty table");
        assert!(t.publish(3, 0x1000, 4096));
        assert_eq!(
            t.lookup(3),
            Some(Published {
                addr: 0x1000,
                len: 4096
            })
        );
        // Another id of the same entry is not found, and cannot take it.
        let other = 3 + ENTRIES as u32;
        assert_eq!(t.lookup(other), None);
        assert!(!t.publish(other, 0x2000, 8));
        assert_eq!(t.lookup(3).map(|p| p.addr), Some(0x1000));
        // Republishing the same id updates it.
        assert!(t.publish(3, 0x3000, 16));
        assert_eq!(t.lookup(3).map(|p| (p.addr, p.len)), Some((0x3000, 16)));
        // Withdrawing another id changes nothing; withdrawing it empties.
        t.withdraw(other);
        assert!(t.lookup(3).is_some());
        t.withdraw(3);
        assert_eq!(t.lookup(3), None);
        assert!(t.publish(other, 0x2000, 8));
        assert_eq!(t.lookup(other).map(|p| p.addr), Some(0x2000));
        t.clear();
        assert_eq!(t.lookup(other), None);
    }

    #[test]
    fn ranges_are_checked() {
        let p = Published {
            addr: 0x1000,
            len: 100,
        };
        assert_eq!(p.range(0, 100), Some(0x1000));
        assert_eq!(p.range(40, 60), Some(0x1000 + 40));
        assert_eq!(p.range(40, 61), None);
        assert_eq!(p.range(u64::MAX, 2), None);
        assert_eq!(p.range(101, 0), None);
        let wraps = Published {
            addr: u64::MAX - 1,
            len: 100,
        };
        assert_eq!(wraps.range(10, 1), None);
    }

    #[test]
    fn a_write_in_progress_or_a_scribble_is_never_a_wrong_region() {
        let mut mem = table_memory();
        let region = Region::from_mut_slice(bytemuck_bytes(&mut mem));
        let t = RegionTable::resolve(&region, 0).unwrap();
        assert!(t.publish(5, 0x5000, 64));
        let e = &t.entries[5];
        // An odd sequence (a writer stopped half-way): not found.
        let s = e.seq.load(Ordering::Relaxed);
        e.seq.store(s | 1, Ordering::Relaxed);
        assert_eq!(t.lookup(5), None);
        e.seq.store((s | 1) + 1, Ordering::Relaxed);
        assert!(t.lookup(5).is_some());
        // A scribbled field fails the check: not found.
        let id_word = e.id.load(Ordering::Relaxed);
        for (word, v) in [(&e.addr, 0x5008), (&e.len, u64::MAX), (&e.id, 6)] {
            let old = word.load(Ordering::Relaxed);
            word.store(v, Ordering::Relaxed);
            assert_eq!(t.lookup(5), None, "scribbled to {v:#x}");
            word.store(old, Ordering::Relaxed);
        }
        assert!(t.lookup(5).is_some());
        // Only a forgery with its check passes; the range check still
        // bounds its use.
        e.len.store(u64::MAX, Ordering::Relaxed);
        e.id.store(super::id_word(5, 0x5000, u64::MAX), Ordering::Relaxed);
        let p = t.lookup(5).unwrap();
        assert_eq!(p.range(u64::MAX - 10, 20), None);
        // A taken entry (of another id, or scribbled) is not overwritten
        // by a publication; its own id's withdrawal empties it.
        assert!(!t.publish(5 + ENTRIES as u32, 1, 1));
        t.withdraw(5);
        assert_eq!(t.lookup(5), None);
        assert_ne!(id_word, 0);
        e.id.store(0xdead_beef_0000_0000, Ordering::Relaxed);
        assert!(
            !t.publish(5, 0x5000, 64),
            "a scribbled entry is not taken over"
        );
        assert_eq!(t.lookup(5), None);
        // A misaligned or short table does not resolve.
        assert!(RegionTable::resolve(&region, 4).is_err());
        assert!(RegionTable::resolve(&region, 8).is_err());
    }

    fn bytemuck_bytes(v: &mut [u64]) -> &mut [u8] {
        let len = core::mem::size_of_val(v);
        // SAFETY: u64s are plain bytes; the slice covers exactly `v`'s
        // memory and borrows it mutably for its lifetime.
        unsafe { core::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), len) }
    }
}
