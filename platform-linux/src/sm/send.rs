//! The send path: one fragment, the single-copy rendezvous, the pipelined
//! copy, and the choice between them by measurement; flush and barrier.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use btl_core::sm::engine::{PeerState, SendError};

use super::recv::{Done, Waiter};
use super::*;

/// Header of a single-copy rendezvous fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rndv {
    pub(super) tag: u8,
    pub(super) addr: u64,
    pub(super) len: u64,
}

impl Rndv {
    pub(super) const LEN: usize = 17;
    pub(super) fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0; Self::LEN];
        b[0] = self.tag;
        b[1..9].copy_from_slice(&self.addr.to_le_bytes());
        b[9..17].copy_from_slice(&self.len.to_le_bytes());
        b
    }
    pub(super) fn decode(b: &[u8]) -> Option<Self> {
        let b: &[u8; Self::LEN] = b.try_into().ok()?;
        Some(Self {
            tag: b[0],
            addr: u64::from_le_bytes(b[1..9].try_into().ok()?),
            len: u64::from_le_bytes(b[9..17].try_into().ok()?),
        })
    }
}

/// Header of a pipelined chunk: the message's total length, the user tag,
/// and this chunk's offset. Chunks of one message arrive in order (per-peer
/// order), so the offset is a check, not a reordering key. Padded to 32
/// bytes so that, after the 32-byte fragment header, the data starts on a
/// cache line of the (cache-line aligned) fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Chunk {
    pub(super) tag: u8,
    pub(super) total: u64,
    pub(super) offset: u64,
}

impl Chunk {
    pub(super) const LEN: usize = 32;
    pub(super) fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0; Self::LEN];
        b[0] = self.tag;
        b[1..9].copy_from_slice(&self.total.to_le_bytes());
        b[9..17].copy_from_slice(&self.offset.to_le_bytes());
        b
    }
    pub(super) fn decode(b: &[u8]) -> Option<Self> {
        let h = b.get(..Self::LEN)?;
        Some(Self {
            tag: h[0],
            total: u64::from_le_bytes(h[1..9].try_into().ok()?),
            offset: u64::from_le_bytes(h[9..17].try_into().ok()?),
        })
    }
}

/// How a large message travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Bulk {
    /// `process_vm_readv` by the receiver.
    SingleCopy,
    /// Through shared fragments.
    Pipelined,
    /// Through shared fragments, timed alone to refresh its measurement.
    ProbePipelined,
}

/// How long a bulk-rate measurement stays fresh.
pub(super) const BULK_REFRESH: Duration = Duration::from_secs(1);

/// Measured bulk rates to one peer (bytes per second, smoothed), for the
/// choice between single copy and the pipelined copy. Which is faster
/// depends on where the two processes run (shared cache or not) and that
/// changes under a hypervisor or a migrating scheduler: so it is measured
/// while running. Single-copy transfers are synchronous and timed as they
/// go; the pipelined copy is timed by draining before and after one message
/// once per [`BULK_REFRESH`]. The slower mechanism is retried once per
/// refresh period, so a change of placement is followed within about a
/// second.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct BulkRates {
    pub(super) single: f64,
    pub(super) pipelined: f64,
    pub(super) single_at: Option<Instant>,
    pub(super) pipelined_at: Option<Instant>,
    /// Samples taken of each; the first of each is a warm-up (page faults
    /// of fresh buffers) and is not counted.
    pub(super) single_n: u32,
    pub(super) pipelined_n: u32,
}

impl BulkRates {
    pub(super) fn choose(&self, now: Instant) -> Bulk {
        let stale = |t: Option<Instant>| t.is_none_or(|t| now.duration_since(t) > BULK_REFRESH);
        if self.single_n < 2 {
            Bulk::SingleCopy
        } else if self.pipelined_n < 2 {
            Bulk::ProbePipelined
        } else if stale(self.single_at) {
            Bulk::SingleCopy
        } else if stale(self.pipelined_at) {
            Bulk::ProbePipelined
        } else if self.pipelined > self.single {
            Bulk::Pipelined
        } else {
            Bulk::SingleCopy
        }
    }

    pub(super) fn record(&mut self, how: Bulk, bytes: usize, took: Duration) {
        let rate = bytes as f64 / took.as_secs_f64().max(1e-9);
        let (avg, at, n) = match how {
            Bulk::SingleCopy => (&mut self.single, &mut self.single_at, &mut self.single_n),
            Bulk::Pipelined | Bulk::ProbePipelined => (
                &mut self.pipelined,
                &mut self.pipelined_at,
                &mut self.pipelined_n,
            ),
        };
        *n = n.saturating_add(1);
        *avg = match *n {
            1 => 0.0,
            2 => rate,
            _ => 0.5 * *avg + 0.5 * rate,
        };
        *at = Some(Instant::now());
        log::debug!(
            "bulk rates: single copy {:.2} GB/s, pipelined {:.2} GB/s (after {how:?} of {bytes} bytes in {took:?})",
            self.single / 1e9,
            self.pipelined / 1e9
        );
    }
}

impl Sm {
    /// Pushes one fragment, progressing while no fragment is free or the
    /// peer's queue is full (with liveness checks and the timeout).
    pub(super) fn send_fragment(
        &mut self,
        peer: u32,
        tag: u8,
        parts: &[&[u8]],
        cookie: u64,
    ) -> Result<(), SmError> {
        if self.engine.congested() {
            self.progress();
        }
        // Fast path: a free fragment and room in the peer's queue.
        let mut first = Some(self.engine.send(peer, tag, parts, cookie));
        let mut result = Ok(());
        self.wait_until("a free fragment", Some(peer), |sm| {
            let attempt = first
                .take()
                .unwrap_or_else(|| sm.engine.send(peer, tag, parts, cookie));
            match attempt {
                Ok(()) => true,
                Err(SendError::NoFragment | SendError::Backlog { .. }) => false,
                Err(SendError::PeerFailed { peer }) => {
                    result = Err(SmError::PeerFailed { peer });
                    true
                }
                Err(SendError::InvalidPeer { peer }) => {
                    result = Err(SmError::InvalidPeer { peer });
                    true
                }
                Err(SendError::TooLarge { .. }) => {
                    result = Err(SmError::Unsupported("fragment larger than max_send_size"));
                    true
                }
            }
        })?;
        result
    }

    pub(super) fn cookie(&mut self, peer: u32, w: Waiter) -> u64 {
        let c = self.state.next_cookie;
        self.state.next_cookie += 1;
        self.state.waiters.insert(c, (peer, w));
        c
    }

    /// Sends `data` to local rank `peer` with `tag`. Returns when `data` may
    /// be reused: after the copy into shared fragments, or, for a single-copy
    /// transfer, after the receiver has read it. Errors: the peer failed,
    /// the tag is reserved, or a timeout.
    pub fn send(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), SmError> {
        self.send_inner(peer, tag, data, None)
    }

    /// As [`Self::send`], and `on_done` runs (inside a later
    /// [`Self::progress`]) once the receiver has handled the message, with
    /// the error if it could not.
    pub fn send_with_completion(
        &mut self,
        peer: u32,
        tag: u8,
        data: &[u8],
        on_done: impl FnOnce(Result<(), SmError>) + 'static,
    ) -> Result<(), SmError> {
        self.send_inner(peer, tag, data, Some(Box::new(on_done)))
    }

    pub(super) fn send_inner(
        &mut self,
        peer: u32,
        tag: u8,
        data: &[u8],
        on_done: Option<OnDone>,
    ) -> Result<(), SmError> {
        if tag > MAX_USER_TAG {
            return Err(SmError::ReservedTag { tag });
        }
        self.check_peer(peer)?;
        let max = self.engine.max_payload() as usize;
        if data.len() <= max {
            let cookie = match on_done {
                Some(cb) => self.cookie(peer, Waiter::Callback(cb)),
                None => 0,
            };
            return self.send_fragment(peer, tag, &[data], cookie);
        }
        let large = data.len() as u64 >= u64::from(self.params.min_rdma_pipeline_size);
        if self.state.cma_ok[peer as usize] && large {
            let now = Instant::now();
            match self.rates[peer as usize].choose(now) {
                Bulk::Pipelined => {}
                Bulk::ProbePipelined => {
                    // Measure the pipelined copy alone: drain, send, drain.
                    self.wait_until("our fragments to drain", Some(peer), |sm| {
                        sm.engine.in_flight_to(peer) == 0
                    })?;
                    let t0 = Instant::now();
                    self.send_chunked(peer, tag, data, on_done)?;
                    self.wait_until("the pipelined copy", Some(peer), |sm| {
                        sm.engine.in_flight_to(peer) == 0
                    })?;
                    self.rates[peer as usize].record(Bulk::Pipelined, data.len(), t0.elapsed());
                    return Ok(());
                }
                Bulk::SingleCopy => {
                    let done: Done = Rc::new(RefCell::new(None));
                    let cookie = self.cookie(peer, Waiter::Flag(done.clone()));
                    let hdr = Rndv {
                        tag,
                        addr: data.as_ptr() as u64,
                        len: data.len() as u64,
                    }
                    .encode();
                    self.send_fragment(peer, TAG_RNDV, &[&hdr], cookie)?;
                    let waited = self.wait_until("the receiver's single copy", Some(peer), |_| {
                        done.borrow().is_some()
                    });
                    if let Err(e) = waited {
                        self.state.waiters.remove(&cookie);
                        return Err(e);
                    }
                    if done.borrow().unwrap_or(false) {
                        self.rates[peer as usize].record(
                            Bulk::SingleCopy,
                            data.len(),
                            now.elapsed(),
                        );
                        if let Some(cb) = on_done {
                            cb(Ok(()));
                        }
                        return Ok(());
                    }
                    // The receiver could not read our memory (or had no
                    // handler): resend through fragments; a missing handler
                    // is reported there.
                    self.state.cma_ok[peer as usize] = false;
                    log::warn!("single copy to local rank {peer} failed at the receiver; resending through shared fragments");
                }
            }
        }
        self.send_chunked(peer, tag, data, on_done)
    }

    pub(super) fn send_chunked(
        &mut self,
        peer: u32,
        tag: u8,
        data: &[u8],
        on_done: Option<OnDone>,
    ) -> Result<(), SmError> {
        // A multiple of 64 bytes, so every chunk of the source and of the
        // receiver's buffer keeps the same alignment (faster copies).
        let chunk = (self.engine.max_payload() as usize - Chunk::LEN) & !63;
        let total = data.len() as u64;
        let mut cb = on_done;
        let mut offset = 0usize;
        while offset < data.len() {
            let end = (offset + chunk).min(data.len());
            let hdr = Chunk {
                tag,
                total,
                offset: offset as u64,
            }
            .encode();
            let cookie = match (end == data.len(), cb.take()) {
                (true, Some(cb)) => self.cookie(peer, Waiter::Callback(cb)),
                (false, Some(c)) => {
                    cb = Some(c);
                    0
                }
                (_, None) => 0,
            };
            self.send_fragment(peer, TAG_CHUNK, &[&hdr, &data[offset..end]], cookie)?;
            offset = end;
        }
        Ok(())
    }

    /// Progresses until every fragment this process sent has been
    /// acknowledged and every acknowledgement it owes has left (or the peers
    /// concerned failed).
    pub fn flush(&mut self) -> Result<(), SmError> {
        self.wait_until("acknowledgements", None, |sm| {
            sm.engine.outstanding() == 0 && sm.engine.pending() == 0
        })
    }

    /// Waits until every live local rank has called `barrier` as many
    /// times as this one (all-to-all arrival messages on an internal tag).
    /// Failed or departed peers are not waited for.
    pub fn barrier(&mut self) -> Result<(), SmError> {
        self.barrier_epoch += 1;
        let epoch = self.barrier_epoch;
        let msg = epoch.to_le_bytes();
        let me = self.me;
        for peer in (0..self.nprocs).filter(|&p| p != me) {
            if self.engine.peer_state(peer) == Some(PeerState::Connected) {
                self.send_fragment(peer, TAG_BARRIER, &[&msg], 0)?;
            }
        }
        self.wait_until("the other local ranks at a barrier", None, |sm| {
            let live = (0..sm.nprocs)
                .filter(|&p| p != sm.me && sm.engine.peer_state(p) == Some(PeerState::Connected))
                .count() as u32;
            sm.state.barrier_arrivals.get(&epoch).copied().unwrap_or(0) >= live
        })?;
        self.state.barrier_arrivals.remove(&epoch);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    pub(super) fn bulk_choice_follows_measurements() {
        let mut r = BulkRates::default();
        let t = Instant::now();
        assert_eq!(r.choose(t), Bulk::SingleCopy);
        // First samples are warm-ups: slow (page faults), not counted.
        r.record(Bulk::SingleCopy, 1 << 20, Duration::from_millis(5));
        assert_eq!(r.choose(Instant::now()), Bulk::SingleCopy);
        r.record(Bulk::SingleCopy, 1 << 20, Duration::from_micros(100));
        assert_eq!(r.choose(Instant::now()), Bulk::ProbePipelined);
        r.record(Bulk::ProbePipelined, 1 << 20, Duration::from_millis(5));
        assert_eq!(r.choose(Instant::now()), Bulk::ProbePipelined);
        r.record(Bulk::ProbePipelined, 1 << 20, Duration::from_micros(50));
        assert_eq!(r.choose(Instant::now()), Bulk::Pipelined);
        // The placement changes: the pipelined copy becomes slow.
        for _ in 0..4 {
            r.record(Bulk::Pipelined, 1 << 20, Duration::from_micros(400));
        }
        assert_eq!(r.choose(Instant::now()), Bulk::SingleCopy);
        // A stale measurement is refreshed first.
        let later = Instant::now() + 2 * BULK_REFRESH;
        assert_eq!(r.choose(later), Bulk::SingleCopy);
    }

    #[test]
    pub(super) fn protocol_headers_roundtrip() {
        let r = Rndv {
            tag: 3,
            addr: 0xdead_beef,
            len: 1 << 33,
        };
        assert_eq!(Rndv::decode(&r.encode()), Some(r));
        assert_eq!(Rndv::decode(&[0; 5]), None);
        let c = Chunk {
            tag: 9,
            total: 100,
            offset: 40,
        };
        let mut b = c.encode().to_vec();
        b.extend_from_slice(b"data");
        assert_eq!(Chunk::decode(&b), Some(c));
        assert_eq!(Chunk::decode(&b[..10]), None);
    }
}
