//! Liveness: a peer that died, or left, is noticed by its pid and start
//! time in the control area, and declared failed — its in-flight fragments
//! and queued work complete with an error, its one-sided operations too,
//! and the failure is reported once as [`TEvent::PeerFailed`].

use std::time::Instant;

use btl_core::sm::control::RANK_DONE;
use btl_core::sm::engine::PeerState;
use btl_core::sync::Ordering;

use super::recv::Ctx;
use super::*;
use crate::ops::{OpError, TEvent};
use crate::regions::Regions;
use crate::segment;

impl Sm {
    /// Declares `peer` failed (once): everything of ours in flight to it or
    /// queued for it completes with an error.
    pub(super) fn fail(&mut self, peer: u32, why: &str) {
        if self.engine.peer_state(peer) != Some(PeerState::Connected) {
            return;
        }
        log::error!(
            "local peer {peer} (pid {}) failed: {why}",
            self.state.pids.get(peer as usize).copied().unwrap_or(0)
        );
        self.retire(peer);
        self.failed.push(peer);
        self.to_report.push((peer, why.to_string()));
    }

    /// Stops talking to `peer`: fails its fragments in the engine, drops
    /// its queue and completes its operations with an error.
    fn retire(&mut self, peer: u32) {
        if let Some(f) = self.state.peer_failed.get_mut(peer as usize) {
            *f = true;
        }
        let mut regions = Regions::new();
        let mut ctx = Ctx {
            st: &mut self.state,
            regions: &mut regions,
            sink: &mut |_: &mut Regions, _: TEvent<'_>| {},
        };
        // Only completions come out of failing a peer (no receive).
        self.engine.fail_peer(peer, &mut ctx);
        self.state.partial[peer as usize] = None;
        self.state.acks.retain(|a| a.0 != peer);
        self.state.puts_in.retain(|&(p, _), _| p != peer);
        let lost: Vec<u64> = self
            .state
            .waiting
            .iter()
            .filter(|(_, w)| w.peer == peer)
            .map(|(&r, _)| r)
            .collect();
        for req in lost {
            if let Some(w) = self.state.waiting.remove(&req) {
                self.state
                    .done
                    .push((w.op, Err(OpError::PeerFailed { peer })));
            }
        }
        self.drop_queue(peer);
    }

    /// Checks that every connected peer is still alive (pid and start
    /// time), declaring dead ones failed (reported by the next progress
    /// pass). A peer that left cleanly is retired without being reported.
    pub fn check_peers(&mut self) {
        self.last_liveness = Instant::now();
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
                self.retire(peer);
                self.departed.push(peer);
            } else if !segment::process_alive(pid, start) {
                self.fail(peer, "the process died");
            }
        }
    }

    /// Checks liveness if [`LIVENESS_INTERVAL`] has passed since the last
    /// check.
    pub fn check_peers_every(&mut self, now: Instant) {
        if now.duration_since(self.last_liveness) >= LIVENESS_INTERVAL {
            self.check_peers();
        }
    }
}
