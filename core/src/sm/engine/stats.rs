//! The engine's counters ([`Stats`]): what went through the fast boxes,
//! what had to wait in a pending queue, and the ring slots stepped over.
//! Plain fields of the engine (no indirection on the send and receive
//! paths); read through [`SmEngine`](super::SmEngine)'s accessors.

/// Counters the engine keeps for the adapter's statistics.
#[derive(Clone, Copy, Debug)]
pub(super) struct Stats {
    /// Slot values that ever had to wait in a pending queue.
    queued_total: u64,
    /// Messages sent through fast boxes.
    fbox_sent: u64,
    /// Messages received through fast boxes.
    fbox_received: u64,
    /// Ring slots stepped over: left reserved by a failed writer.
    slots_skipped: u64,
}

impl Stats {
    /// All counters at zero.
    pub(super) const fn new() -> Self {
        Self {
            queued_total: 0,
            fbox_sent: 0,
            fbox_received: 0,
            slots_skipped: 0,
        }
    }

    /// A slot value went into a pending queue.
    #[inline(always)]
    pub(super) fn queued(&mut self) {
        self.queued_total += 1;
    }

    /// A message went into a fast box.
    #[inline(always)]
    pub(super) fn box_sent(&mut self) {
        self.fbox_sent += 1;
    }

    /// `n` messages were read from a fast box.
    #[inline(always)]
    pub(super) fn boxes_received(&mut self, n: u64) {
        self.fbox_received += n;
    }

    /// `n` ring slots were stepped over.
    #[inline]
    pub(super) fn skipped(&mut self, n: u64) {
        self.slots_skipped += n;
    }

    /// Slot values that ever had to wait in a pending queue.
    #[inline]
    pub(super) fn queued_total(&self) -> u64 {
        self.queued_total
    }

    /// Ring slots stepped over so far.
    #[inline]
    pub(super) fn slots_skipped(&self) -> u64 {
        self.slots_skipped
    }

    /// Messages sent through fast boxes.
    #[inline]
    pub(super) fn fbox_sent(&self) -> u64 {
        self.fbox_sent
    }

    /// Messages received through fast boxes.
    #[inline]
    pub(super) fn fbox_received(&self) -> u64 {
        self.fbox_received
    }
}
