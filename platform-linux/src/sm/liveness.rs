//! Liveness and corruption: a peer that died, or left, is noticed by the
//! identity start-up established (pid and start time: never re-read from
//! the control record) and declared failed — its in-flight fragments and
//! queued work complete with an error, its one-sided operations too, and
//! the failure is reported once as [`TEvent::PeerFailed`]. A peer caught
//! corrupting shared memory is declared failed the same way, and told so
//! (a verdict in its control record); a verdict against us, in ours, makes
//! us fail its writer in turn.
//!
//! Each check also audits the structures that are not looked at on the
//! fast path: our rings' counters and headers (the engine's
//! [`btl_core::sm::engine::SmEngine::audit_rings`]) and every peer's
//! control record, which after start-up may only turn to [`RANK_DONE`]: a
//! changed pid, start time or probe, or a state that is neither ready nor
//! done, is a corruption of that peer's record, blamed on that peer.

use std::time::Instant;

use btl_core::sm::control::{Structure, Verdict, RANK_DONE, RANK_READY};
use btl_core::sm::engine::PeerState;
use btl_core::sync::Ordering;

use super::recv::Ctx;
use super::*;
use crate::ops::{OpError, TEvent};
use crate::regions::Regions;
use crate::segment;

/// Liveness checks in a row a reserved ring slot may stay unwritten before
/// the ring is declared broken (2 s at [`LIVENESS_INTERVAL`]: a live
/// writer holds a reservation for a few instructions, or for as long as it
/// is descheduled between them).
pub const STALL_CHECKS: u32 = 20;

/// Liveness checks during which a verdict is retried while the accused's
/// record holds another one (or a scribbler's value).
const ACCUSE_TRIES: u32 = 50;

/// Runs `f` with the engine's callbacks for work that delivers no message
/// (failing a peer, auditing rings: only completions and errors come out).
fn quiet<R>(st: &mut super::recv::State, f: impl FnOnce(&mut Ctx<'_, '_>) -> R) -> R {
    let mut regions = Regions::new();
    let mut ctx = Ctx {
        st,
        regions: &mut regions,
        sink: &mut |_: &mut Regions, _: TEvent<'_>| {},
    };
    f(&mut ctx)
}

impl Sm {
    /// Declares `peer` failed (once): everything of ours in flight to it or
    /// queued for it completes with an error.
    pub(super) fn fail(&mut self, peer: u32, why: &str) {
        if peer == self.me || peer >= self.nprocs || self.failed.contains(&peer) {
            return;
        }
        if self.departed.contains(&peer) {
            return;
        }
        log::error!(
            "local peer {peer} (pid {}) failed: {why}",
            self.state.peers[peer as usize].pid
        );
        self.retire(peer);
        self.failed.push(peer);
        self.to_report.push((peer, why.to_string()));
    }

    /// Declares `peer` failed for corrupting `structure` (`detail` says
    /// how), and tells it with a verdict in its control record.
    pub(super) fn fail_corrupt(&mut self, peer: u32, structure: Structure, detail: &str) {
        if self.failed.contains(&peer) || self.departed.contains(&peer) {
            return;
        }
        self.fail(
            peer,
            &format!("corrupted shared memory: {structure}: {detail}"),
        );
        if self.failed.contains(&peer) {
            self.accusations.push((peer, structure, 0));
            self.deliver_accusations();
        }
    }

    /// Writes the verdicts not delivered yet into the accused's records
    /// (one waits there at a time; retried at each liveness check).
    fn deliver_accusations(&mut self) {
        let me = self.me;
        let mut left = std::mem::take(&mut self.accusations);
        left.retain_mut(|(peer, structure, tries)| {
            let Ok(rec) = self.shm.get().control.record(*peer) else {
                return false;
            };
            if rec.accuse(me, *structure) {
                return false;
            }
            *tries += 1;
            *tries < ACCUSE_TRIES
        });
        self.accusations = left;
    }

    /// Declares failed the peers the last engine pass (or audit) blamed for
    /// a corruption, and those that sent malformed transport messages.
    pub(super) fn fail_blamed(&mut self) {
        for (peer, why) in std::mem::take(&mut self.state.blamed) {
            self.fail_corrupt(peer, why.structure(), &why.to_string());
        }
        for (peer, what) in std::mem::take(&mut self.state.violations) {
            self.fail_corrupt(peer, Structure::MessageProtocol, &what);
        }
    }

    /// Stops talking to `peer`: fails its fragments in the engine, drops
    /// its queue and completes its operations with an error.
    fn retire(&mut self, peer: u32) {
        if let Some(f) = self.state.peer_failed.get_mut(peer as usize) {
            *f = true;
        }
        // Only completions come out of failing a peer (no receive).
        quiet(&mut self.state, |ctx| {
            self.shm.get().engine.fail_peer(peer, ctx)
        });
        self.state.partial[peer as usize] = None;
        self.state.acks.retain(|a| a.0 != peer);
        self.state.puts_in.retain(|&(p, _), _| p != peer);
        // A failed peer may be alive (declared failed for what it wrote):
        // the memory of a split get it may still be writing into is given
        // back only once it can no longer (see `Sm::cancel`).
        self.state
            .await_split_writers(|w| w.peer == peer, "a failed peer");
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

    /// Checks that every connected peer is still alive and its control
    /// record intact, takes a verdict against us, audits our rings, and
    /// declares failed whoever is dead or to blame (reported by the next
    /// progress pass). A peer that left cleanly is retired without being
    /// reported.
    pub fn check_peers(&mut self) {
        self.last_liveness = Instant::now();
        let (me, nprocs) = (self.me, self.nprocs);
        // A peer that declared us failed will not talk to us any more.
        let verdict = self
            .shm
            .get()
            .control
            .record(me)
            .ok()
            .and_then(|rec| rec.take_verdict(me, nprocs));
        match verdict {
            Some(Verdict::Accused { accuser, structure }) => self.fail(
                accuser,
                &format!(
                    "it declared us failed: corrupted shared memory: {structure} (as it found it)"
                ),
            ),
            Some(Verdict::Garbage { raw }) => {
                self.state.peer_errors += 1;
                log::error!(
                    "shared memory: our control record's verdict word holds {raw:#018x}, which \
                     no rank writes (cleared)"
                );
            }
            None => {}
        }
        for peer in 0..nprocs {
            if peer == me
                || self.failed.contains(&peer)
                || self.departed.contains(&peer)
                || self.shm.get().engine.peer_state(peer) != Some(PeerState::Connected)
            {
                continue;
            }
            let id = self.state.peers[peer as usize];
            let Ok(rec) = self.shm.get().control.record(peer) else {
                continue;
            };
            let r = Ordering::Relaxed;
            let state = rec.state.load(Ordering::Acquire);
            let fields = [
                ("pid", rec.pid.load(r), u64::from(id.pid)),
                ("start time", rec.start.load(r), id.start),
                ("probe address", rec.probe_addr.load(r), id.probe_addr),
                ("probe value", rec.probe_value.load(r), id.probe_value),
            ];
            if let Some((what, found, want)) = fields.iter().find(|f| f.1 != f.2) {
                let detail = format!(
                    "local rank {peer}'s control record: {what} is {found:#x}, was {want:#x} at start-up"
                );
                self.fail_corrupt(peer, Structure::ControlRecord, &detail);
            } else if state == RANK_DONE {
                // It left cleanly; whatever of ours it had not handled is
                // lost: complete it with an error, and send nothing more.
                if self.shm.get().engine.in_flight_to(peer) > 0 {
                    log::warn!("local peer {peer} left the job with messages of ours unhandled");
                }
                self.retire(peer);
                self.departed.push(peer);
            } else if state != RANK_READY {
                let detail =
                    format!("local rank {peer}'s control record: state {state:#010x} is no state");
                self.fail_corrupt(peer, Structure::ControlRecord, &detail);
            } else if !segment::process_alive(id.pid, id.start) {
                self.fail(peer, "the process died");
            }
        }
        let skipped = self.shm.get().engine.slots_skipped();
        quiet(&mut self.state, |ctx| {
            self.shm.get().engine.audit_rings(STALL_CHECKS, ctx)
        });
        if self.shm.get().engine.slots_skipped() != skipped {
            log::warn!(
                "shared memory: stepped over a receive-ring slot that a failed rank left \
                 reserved and unwritten (it died inside a send); the ring's other writers go on"
            );
        }
        self.fail_blamed();
        if !self.accusations.is_empty() {
            self.deliver_accusations();
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
