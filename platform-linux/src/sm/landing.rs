//! Split single-copy rendezvous: the two processes copy a large message at
//! once, the receiver reading its first part from the sender's memory
//! (`process_vm_readv`) while the sender writes the rest into the
//! receiver's **landing buffer** for it (`process_vm_writev`). One core
//! reading alone is what limits a single copy (a 4 MiB copy split between
//! two cores runs at twice the rate; README).
//!
//! The protocol, per sender → receiver pair:
//!
//! 1. The receiver maps a landing buffer for the sender ([`Landing`]: a
//!    private anonymous mapping, a flag word then up to [`LANDING_CAP`]
//!    bytes of data, pages touched only as used, transparent huge pages
//!    advised) the first time that sender sends it a large single-copy
//!    message, and tells it the address
//!    ([`SM_LANDING`](btl_core::tags::SM_LANDING): a [`LandingAdRepr`],
//!    address and capacity). The sender checks once that the kernel lets
//!    it write there (it writes the flag's current value, 0); if not, it
//!    never splits to that receiver.
//! 2. A large single-copy message (at least `cma_split_min` bytes, at most
//!    the capacity) then travels as a split rendezvous
//!    ([`RndvSplitRepr`](btl_core::sm::wire::RndvSplitRepr)): the sender
//!    posts it and, right away in the same call, writes the message's
//!    bytes from `at` on into the landing buffer, then (after a fence) the
//!    message's sequence number into the flag word. The receiver reads the bytes before `at`
//!    into the landing buffer itself, waits for the flag to show the
//!    sequence number, and delivers the message from the landing buffer.
//!    A rendezvous stays at the head of the sender's queue until the
//!    receiver acknowledges it, so the landing buffer holds one message at
//!    a time.
//! 3. The receiver looks for the flag ([`PartWait`]) for at most
//!    [`SPLIT_WAIT`] from when its own part is in (the sender writes
//!    synchronously, right after posting; a live sender takes
//!    milliseconds for the largest message); then it reads the rest
//!    itself. A sender still writing then writes the same bytes into the
//!    same place, and it posts nothing after this message before its write
//!    returned, so no later message can meet a stale write. A sender that
//!    died meanwhile makes that read fail as any single copy from it does:
//!    the message is refused (its acknowledgement carries the error) and
//!    single copy from that sender is off.
//!
//! A progress pass never waits for the flag. When it is not in at the
//! first look, the receive stays pending (`State::splits`, re-checked by
//! every later pass: one look at the flag and the clock) and the engine
//! holds back its acknowledgement ([`Received::Held`]) until it ends:
//! that acknowledgement completes the rendezvous, after which the sender
//! releases the message's memory (which our own read of the rest needs
//! when the flag is late) and may post its next split message into this
//! same landing buffer. One pending receive per sender is the bound: a
//! sender posts nothing more to a receiver while a rendezvous to it waits
//! for its acknowledgement (the rendezvous heads the sender's queue, and
//! the fast box's hand-off rule keeps the box idle meanwhile), also when
//! the send was cancelled after it was posted (`Sm::cancel` keeps a posted
//! rendezvous at the head until it is acknowledged); a second split
//! rendezvous meanwhile is a violation. The engine keeps the order of
//! acknowledgements to the sender: whatever it would send after the held
//! one waits behind it.
//!
//! [`Received::Held`]: btl_core::sm::engine::Received::Held
//!
//! The sender writes only into the range the receiver advertised, by the
//! pid start-up established; the receiver validates every split
//! rendezvous against its own landing buffer (length within the capacity, `at`
//! within the length) and reads only its own memory or the sender's.
//! Dropping a landing buffer never unmaps it: it becomes inaccessible
//! (`PROT_NONE`) and its pages are returned (`MADV_DONTNEED`), so a write
//! from a sender that has not noticed our end fails instead of landing in
//! memory reused for something else.

use std::time::{Duration, Instant};

use btl_core::sm::wire::{LandingAdRepr, LANDING_DATA_OFF};
use btl_core::sync::{AtomicU64, Ordering};

/// Most bytes of a message that travels split (the landing buffer's data
/// capacity): address space, touched only as far as messages reach.
pub(super) const LANDING_CAP: usize = 64 << 20;
/// Where the data area starts in the mapping (the flag word is at 0): a
/// page, as the protocol fixes it.
const DATA_OFF: usize = LANDING_DATA_OFF;

/// Where in the data area a message from the sender's address `addr`
/// starts: at the same offset modulo 64 as the sender's bytes, so the
/// kernel's copies in and out (`process_vm_readv` / `writev`) have source
/// and destination equally aligned: a `process_vm_readv` whose
/// destination lies 1–15 bytes after its source modulo a page runs at a
/// quarter of the rate (`rep movsb` in the kernel's `copy_to_user`: 2.9
/// GB/s against 12.3–13.7 for 1 MiB), which page-aligned data would meet
/// for every message from a buffer 4081–4095 bytes into a page. A message of
/// `len` bytes then needs `len + ALIGN_SLACK` bytes of capacity.
pub(super) fn skew(addr: u64) -> usize {
    // The data area starts at a page, so as aligned as address 0.
    crate::cma::aligned_offset(0, addr as usize)
}

/// The most [`skew`] adds to a message's extent in the data area, plus one.
pub(super) const ALIGN_SLACK: usize = crate::cma::ALIGN;
/// How long the receiver waits for the sender's part before reading it
/// itself.
pub(super) const SPLIT_WAIT: Duration = Duration::from_millis(50);

/// The receiver's wait for the sender's part of one split message (step 3
/// of the protocol): from `since`, until the flag shows `seq` or
/// [`SPLIT_WAIT`] has passed.
#[derive(Clone, Copy, Debug)]
pub(super) struct PartWait {
    seq: u64,
    since: Instant,
}

impl PartWait {
    /// The wait for the part of the message with sequence number `seq`,
    /// from `since` (when our own part is in).
    pub(super) fn new(seq: u64, since: Instant) -> Self {
        Self { seq, since }
    }

    /// Whether the sender's part is in `land`: the flag shows our
    /// sequence number (Acquire: pairs with the sender's fence between its
    /// data and its flag write).
    pub(super) fn arrived(&self, land: &Landing) -> bool {
        land.flag().load(Ordering::Acquire) == self.seq
    }

    /// Whether, at `now`, the wait is over without the sender's part: more
    /// than [`SPLIT_WAIT`] since it began.
    pub(super) fn late(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.since) > SPLIT_WAIT
    }
}

/// Our landing buffer for one sender.
#[derive(Debug)]
pub(super) struct Landing {
    map: Option<memmap2::MmapMut>,
}

impl Landing {
    /// Maps a landing buffer of [`LANDING_CAP`] bytes (address space only).
    pub(super) fn new() -> std::io::Result<Self> {
        let map = memmap2::MmapMut::map_anon(DATA_OFF + LANDING_CAP)?;
        // Transparent huge pages where the system allows them on advice
        // (`/sys/kernel/mm/transparent_hugepage/enabled` = madvise, as on
        // Debian; `never` still wins): the sender's `process_vm_writev`
        // pins the pages it writes and our reads fault them in, 512 times
        // fewer with 2 MiB pages (4 MiB messages: about 5 % more
        // bandwidth). Refused advice (a kernel without THP) only leaves
        // 4 KiB pages.
        // SAFETY: our own fresh mapping of exactly this range; advice
        // changes no contents and no protection.
        if let Err(e) = unsafe {
            rustix::mm::madvise(
                map.as_ptr() as *mut std::ffi::c_void,
                map.len(),
                rustix::mm::Advice::LinuxHugepage,
            )
        } {
            log::debug!("landing buffer: no transparent huge pages ({e})");
        }
        Ok(Self { map: Some(map) })
    }

    /// How the sender learns of it.
    pub(super) fn ad(&self) -> LandingAdRepr {
        LandingAdRepr {
            addr: self.map.as_ref().map_or(0, |m| m.as_ptr() as u64),
            cap: LANDING_CAP as u64,
        }
    }

    /// The flag word the sender writes each message's sequence number
    /// into when its part is in.
    pub(super) fn flag(&self) -> &AtomicU64 {
        let m = self.map.as_ref().expect("mapped until dropped");
        // SAFETY: the mapping is page-aligned (so 8-aligned) and at least
        // a page long; its first 8 bytes are used only as this atomic
        // (written by us never, by the sender through the kernel, an
        // aligned 8-byte write; a torn value can never equal the awaited,
        // larger sequence number unless it is whole, since the bytes in
        // which old and new differ must all be new); it lives as long as
        // `self`.
        unsafe { &*(m.as_ptr() as *const AtomicU64) }
    }

    /// `len` bytes of data from offset `skew` (see [`skew`]; the range is
    /// clipped to [`LANDING_CAP`]).
    pub(super) fn data(&mut self, skew: usize, len: usize) -> &mut [u8] {
        let m = self.map.as_mut().expect("mapped until dropped");
        let start = skew.min(LANDING_CAP);
        let end = start.saturating_add(len).min(LANDING_CAP);
        &mut m[DATA_OFF + start..DATA_OFF + end]
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        let Some(map) = self.map.take() else {
            return;
        };
        let (ptr, len) = (map.as_ptr() as *mut std::ffi::c_void, map.len());
        // Never unmapped: a sender that has not noticed our end may still
        // write here, and the address range must not be reused meanwhile.
        std::mem::forget(map);
        // SAFETY: the range is our own mapping (forgotten just above, so
        // nothing of ours uses it again); making it inaccessible and
        // returning its pages affects only it.
        unsafe {
            if let Err(e) = rustix::mm::mprotect(ptr, len, rustix::mm::MprotectFlags::empty()) {
                log::warn!("a landing buffer could not be made inaccessible: {e}");
            }
            let _ = rustix::mm::madvise(ptr, len, rustix::mm::Advice::LinuxDontNeed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_landing_buffer_is_written_through_the_kernel_and_retired() {
        let mut l = Landing::new().unwrap();
        assert_eq!(l.flag().load(Ordering::Acquire), 0);
        let ad = l.ad();
        // Our own process writing into it as a sender would.
        let at = ad.data_addr(3).unwrap() as usize;
        // SAFETY: the range is our mapping, valid for writes, not
        // overlapping the source, with no reference into it during the
        // call and nothing else using it.
        unsafe { crate::cma::write_remote(std::process::id(), at, b"abc") }.unwrap();
        assert_eq!(&l.data(0, 6)[3..6], b"abc");
        assert_eq!(&l.data(2, 4)[1..4], b"abc");
        // Clipped to the capacity, never past the mapping.
        assert_eq!(l.data(LANDING_CAP - 2, 100).len(), 2);
        assert!(l.data(LANDING_CAP + 5, 1).is_empty());
        drop(l);
    }

    /// Sets `l`'s flag word to `seq`, as the sender's write does (the
    /// kernel's path is the first test's).
    fn set_flag(l: &Landing, seq: u64) {
        l.flag().store(seq, Ordering::Release);
    }

    #[test]
    fn a_part_is_in_once_the_flag_shows_its_sequence_number() {
        let l = Landing::new().unwrap();
        let w = PartWait::new(2, Instant::now());
        // Not in at the first look; in at a later one, once the flag shows
        // its number.
        assert!(!w.arrived(&l));
        set_flag(&l, 1);
        assert!(!w.arrived(&l), "the previous message's flag");
        set_flag(&l, 2);
        assert!(w.arrived(&l));
        assert!(w.arrived(&l));
    }

    #[test]
    fn a_wait_is_late_only_past_split_wait() {
        let t0 = Instant::now();
        let w = PartWait::new(1, t0);
        assert!(!w.late(t0));
        assert!(!w.late(t0 + SPLIT_WAIT));
        assert!(w.late(t0 + SPLIT_WAIT + Duration::from_nanos(1)));
        // A clock reading from before the wait is not late.
        assert!(!PartWait::new(1, t0 + SPLIT_WAIT * 2).late(t0));
    }

    #[test]
    fn skew_matches_the_senders_alignment() {
        for addr in [0u64, 1, 15, 63, 64, 4095, 4096 + 17, u64::MAX] {
            let k = skew(addr);
            assert!(k < ALIGN_SLACK);
            // The landing data (page-aligned) plus the skew is as aligned
            // modulo 64 as the sender's bytes.
            assert_eq!((DATA_OFF as u64 + k as u64) % 64, addr % 64);
        }
    }
}
