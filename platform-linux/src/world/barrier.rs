//! The barrier's state ([`Barriers`]): our epoch counter, which peers
//! announced each epoch, and the epochs a peer gave up (a rank failed
//! before it reached them). The hub records the peers' barrier messages
//! here; `World::barrier` runs the schedule and reads them.

use std::collections::{HashMap, HashSet};

use btl_core::barrier::BarrierRepr;

/// Barrier arrivals and our epochs.
#[derive(Default)]
pub(super) struct Barriers {
    /// Barriers we entered so far (the last one's epoch).
    epoch: u64,
    /// Peers (global) that announced each barrier epoch.
    arrived: HashMap<u64, HashSet<u32>>,
    /// Barrier epochs a peer gave up: (the rank that failed, who said so).
    abandoned: HashMap<u64, (u32, u32)>,
}

impl Barriers {
    /// Enters the next barrier: its epoch (1 for the first).
    pub(super) fn begin(&mut self) -> u64 {
        self.epoch += 1;
        self.epoch
    }

    /// Records barrier message `msg` from peer `from` (global).
    pub(super) fn record(&mut self, from: u32, msg: BarrierRepr) {
        match msg {
            BarrierRepr::Arrived { epoch } => {
                self.arrived.entry(epoch).or_default().insert(from);
            }
            BarrierRepr::Abandoned { epoch, failed } => {
                self.abandoned.entry(epoch).or_insert((failed, from));
            }
        }
    }

    /// Whether peer `p` announced barrier `epoch`.
    pub(super) fn arrived(&self, epoch: u64, p: u32) -> bool {
        self.arrived.get(&epoch).is_some_and(|s| s.contains(&p))
    }

    /// Whether barrier `epoch` was given up: (the rank that failed, who
    /// said so).
    pub(super) fn abandoned(&self, epoch: u64) -> Option<(u32, u32)> {
        self.abandoned.get(&epoch).copied()
    }

    /// Forgets barrier `epoch`: whether some peer had told us it was given
    /// up.
    pub(super) fn end(&mut self, epoch: u64) -> bool {
        let told = self.abandoned.remove(&epoch).is_some();
        self.arrived.remove(&epoch);
        told
    }
}
