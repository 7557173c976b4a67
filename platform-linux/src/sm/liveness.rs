//! Liveness and waiting: the blocking loop (poll, yield, sleep; liveness
//! checks every [`super::LIVENESS_INTERVAL`]) and declaring peers failed.

use std::time::{Duration, Instant};

use btl_core::sm::control::RANK_DONE;
use btl_core::sm::engine::PeerState;
use btl_core::sync::Ordering;

use super::*;
use crate::segment;

impl Sm {
    pub(super) fn fail(&mut self, peer: u32, why: &str) {
        if self.engine.peer_state(peer) == Some(PeerState::Connected) {
            log::error!(
                "local peer {peer} (pid {}) failed: {why}",
                self.state.pids.get(peer as usize).copied().unwrap_or(0)
            );
            if let Some(f) = self.state.peer_failed.get_mut(peer as usize) {
                *f = true;
            }
            self.engine.fail_peer(peer, &mut self.state);
            self.state.partial[peer as usize] = None;
            self.failed.push(peer);
        }
    }

    /// Checks that every connected peer is still alive (pid and start
    /// time), declaring dead ones failed. Returns the newly failed peers.
    pub fn check_peers(&mut self) -> Vec<u32> {
        self.last_liveness = Instant::now();
        let mut newly = Vec::new();
        for peer in 0..self.nprocs {
            if self.engine.peer_state(peer) != Some(PeerState::Connected) {
                continue;
            }
            let Ok(rec) = self.control.record(peer) else {
                continue;
            };
            let state = rec.state.load(Ordering::Acquire);
            let pid = rec.pid.load(Ordering::Relaxed) as u32;
            let start = rec.start.load(Ordering::Relaxed);
            if state == RANK_DONE {
                // It left cleanly; whatever of ours it had not handled is
                // lost: complete it with an error, and send nothing more.
                if self.engine.in_flight_to(peer) > 0 {
                    log::warn!("local peer {peer} left the job with messages of ours unhandled");
                }
                if let Some(f) = self.state.peer_failed.get_mut(peer as usize) {
                    *f = true;
                }
                self.engine.fail_peer(peer, &mut self.state);
                self.departed.push(peer);
            } else if !segment::process_alive(pid, start) {
                self.fail(peer, "the process died");
                newly.push(peer);
            }
        }
        newly
    }

    /// Progresses until `done(self)` is true, idling politely (spin, then
    /// yield, then short sleeps) and checking liveness every
    /// [`LIVENESS_INTERVAL`]. `peer` (if any) is the peer waited for: its
    /// failure ends the wait with [`SmError::PeerFailed`].
    pub fn wait_until(
        &mut self,
        what: &'static str,
        peer: Option<u32>,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> Result<(), SmError> {
        // Reading the clock costs as much as a shared-memory message here
        // (a vDSO call, slower under a hypervisor), so it is read only every
        // CLOCK_EVERY rounds: the timeout and the liveness interval are
        // coarse anyway.
        const CLOCK_EVERY: u32 = 256;
        let mut started: Option<Instant> = None;
        let mut idle = 0u32;
        let mut rounds = 0u32;
        loop {
            if done(self) {
                return Ok(());
            }
            if let Some(p) = peer {
                if self.engine.peer_state(p) == Some(PeerState::Failed) {
                    return Err(SmError::PeerFailed { peer: p });
                }
            }
            rounds = rounds.wrapping_add(1);
            if rounds % CLOCK_EVERY == 0 {
                let now = Instant::now();
                let t0 = *started.get_or_insert(now);
                if now.duration_since(self.last_liveness) >= LIVENESS_INTERVAL {
                    self.check_peers();
                }
                if now.duration_since(t0) > self.timeout {
                    return Err(SmError::Timeout {
                        what,
                        waited: now.duration_since(t0),
                    });
                }
            }
            if self.progress() > 0 {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            self.idle(idle);
        }
    }

    /// What to do on the `idle`-th consecutive empty poll: spin, then
    /// yield, then sleep 50 µs at a time.
    pub(crate) fn idle(&mut self, idle: u32) {
        let spin = if self.oversubscribed { 8 } else { 2000 };
        if idle == spin {
            // Let writers blocked on a partial lazy-free batch go on.
            self.engine.release_consumed();
        }
        if idle < spin {
            std::hint::spin_loop();
        } else if idle < spin + 5000 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    pub(super) fn check_peer(&mut self, peer: u32) -> Result<(), SmError> {
        match self.engine.peer_state(peer) {
            Some(PeerState::Connected) => Ok(()),
            Some(PeerState::Failed) => Err(SmError::PeerFailed { peer }),
            _ => Err(SmError::InvalidPeer { peer }),
        }
    }
}
