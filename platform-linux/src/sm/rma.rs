//! One-sided get and put between registered regions, over the shared-memory
//! transport's messages (internal tags 248–252), never blocking.
//!
//! The target validates every request against its region table — unknown
//! id, or a range outside the region, is refused with a status — so a peer
//! never reads or writes where it was not invited (a get without asking is
//! validated against the table the target publishes). Single copy is
//! `process_vm_readv` by the side that receives the data, with one
//! exception that side asks for: the tail of a split get.
//!
//! - get, single copy, without asking: when the target's region table
//!   (`btl_core::sm::regtab`, in its part of the segment) publishes the
//!   region and the range lies inside it, the requester reads it at once
//!   ([`Sm::get_direct`]); otherwise, as follows.
//! - get, single copy: the requester asks (request, region, offset,
//!   length); the target checks the range and answers with its address;
//!   the requester reads it into its own memory. Otherwise the target sends
//!   the data in fragments (served from its pinned region), then the
//!   answer.
//! - get, split single copy (from `cma_split_min`, 128 KiB by default):
//!   the request also names where the second half starts, the requester's
//!   address for it and a deadline (100 ms after the post, on
//!   `CLOCK_MONOTONIC`). The target answers with the address as above and
//!   then writes the second half into the requester's memory
//!   (`process_vm_writev`, in 4 MiB pieces, each begun only before the
//!   deadline) while the requester reads the first; a second answer says
//!   how much it wrote, and the requester reads the rest. Two cores copy
//!   at once: a 4 MiB get runs at about twice the rate of one reader. The
//!   requester keeps the destination for the target until that second
//!   answer, or — if it cancels the get or the target fails — until the
//!   deadline plus a second of grace, so a late write never lands in
//!   memory given back to its owner.
//! - put, single copy: the requester sends its source address; the target
//!   checks the range and reads the source into its region. Otherwise the
//!   data goes in fragments, each checked and copied into the region on
//!   arrival. Then the answer (status).
//!
//! Which: from `min_rdma_pipeline_size` on, as large messages (gets by
//! the measured faster mechanism, puts by single copy); below it, single
//! copy for more than one eager fragment's payload, fragments otherwise. A
//! single copy the kernel refuses falls back to fragments for that
//! operation and the peer.

use std::time::{Duration, Instant};

use btl_core::rma::RmaStatus;
use btl_core::sm::wire::{
    GetMode, GetReqRepr, LandingAdRepr, PutCmaRepr, PutDataRepr, RangeReqPacket, ReplyRepr,
    SplitTailRepr, GET_REQ_SPLIT_LEN,
};

use super::bulk::{Bulk, Probe};
use super::out::{Stream, StreamKind};
use super::{Sm, MAX_MESSAGE};
use crate::cma;
use crate::ops::{OpId, PostError, Posted, RawBuf, RawParts};
use crate::regions::Regions;

pub(super) use btl_core::tags::{
    SM_GET_DATA as TAG_GET_DATA, SM_GET_REQ as TAG_GET_REQ, SM_PUT_CMA as TAG_PUT_CMA,
    SM_PUT_DATA as TAG_PUT_DATA, SM_RMA_REPLY as TAG_RMA_REPLY,
};

/// How long after posting a split get its target may still begin writing
/// a piece of the tail (checked before each piece): the target answers a
/// ping-pong's get within microseconds and a window of 64 gets of 4 MiB
/// within some 15 ms; later, the requester reads the rest itself.
const SPLIT_DEADLINE: Duration = Duration::from_millis(100);
/// How long after that deadline a piece begun before it may still be
/// landing: one [`SPLIT_PIECE`] copy (under a millisecond) and the time
/// the target may be preempted within it. Until then, a cancelled split
/// get, or one whose target failed, does not give its memory back (see
/// [`State::split_release`](super::recv::State)).
const SPLIT_GRACE: Duration = Duration::from_secs(1);
/// The target writes the tail in pieces of this size, checking the
/// deadline before each.
const SPLIT_PIECE: usize = 4 << 20;

/// `CLOCK_MONOTONIC` in nanoseconds: the clock both processes of a node
/// read alike (the deadline of a split get is one; processes in different
/// time namespaces would disagree, which only makes the target stop
/// sooner or later — the requester still waits for its answer).
pub(super) fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// Work the engine's callbacks leave for `Sm::progress` (which may send;
/// the callbacks may not).
#[derive(Debug)]
pub(super) enum Work {
    /// Send an answer.
    Reply {
        peer: u32,
        req: u64,
        status: RmaStatus,
        addr: u64,
    },
    /// Serve a validated get in fragments.
    Serve { peer: u32, get: GetReqRepr },
    /// Answer a validated split get with the address and write its tail.
    Split {
        peer: u32,
        get: GetReqRepr,
        tail: SplitTailRepr,
    },
    /// Ask again for a get's data, in fragments.
    RetryGet { peer: u32, req: u64, wait: RmaWait },
    /// Send a put's data again, in fragments.
    RetryPut { peer: u32, req: u64, wait: RmaWait },
    /// Tell a sender of our landing buffer for it.
    Landing { peer: u32, ad: LandingAdRepr },
}

/// How one of our gets or puts travels.
#[derive(Clone, Copy, Debug)]
pub(super) enum WaitKind {
    /// A get by single copy: the answer carries the address to read.
    GetSingle { dst: RawBuf },
    /// A get by single copy split with the target: the first answer
    /// carries the address (we read `dst[..at]`), the second how much of
    /// the rest the target wrote into `dst` (we read what it did not).
    GetSplit {
        dst: RawBuf,
        at: usize,
        /// The target's address of the range, once it answered.
        src: Option<u64>,
        /// Whether our part was read.
        head_ok: bool,
        /// When the target can no longer be writing into `dst`.
        release: Instant,
    },
    /// A get in fragments, written into `dst` as they arrive.
    Get { dst: RawBuf, got: u64 },
    /// A put (by single copy, or in fragments).
    Put { single: bool, src: RawBuf },
}

/// One of our gets or puts, waiting for its answer.
#[derive(Clone, Copy, Debug)]
pub(super) struct RmaWait {
    pub(super) peer: u32,
    pub(super) op: OpId,
    pub(super) kind: WaitKind,
    /// The target's region and offset.
    pub(super) remote: (u32, u64),
    /// A large get whose transfer is timed for the bulk rates (see
    /// [`super::bulk::BulkRates`]), with when it was posted.
    pub(super) timed: Option<Instant>,
}

impl Sm {
    fn new_req(&mut self) -> u64 {
        self.next_req += 1;
        self.next_req
    }

    fn rma_ok(&mut self, peer: u32, len: u64) -> Result<(), PostError> {
        if peer == self.me {
            return Err(PostError::InvalidPeer);
        }
        self.check_peer(peer)?;
        if len > MAX_MESSAGE {
            return Err(PostError::TooLarge { max: MAX_MESSAGE });
        }
        Ok(())
    }

    /// Whether a one-sided transfer of `len` bytes with `peer` goes by
    /// single copy rather than fragments: the kernel allows it for the
    /// peer and the transfer is more than one eager fragment's payload (4
    /// KiB by default). Through fragments it costs the target a copy of
    /// every byte into them, the requester a copy out, and a hand-off per
    /// fragment, against one `process_vm_readv`; both ways take the same
    /// request/answer round trip. ob1's rendezvous over `rsm` gets every
    /// message above its eager limit (8256 B) this way: through fragments
    /// its latency was 2.3x vader's at 16 KiB and 64 KiB, by single copy
    /// 0.56-0.70x of that (`scripts/ompi-bench.sh`, README). Up to one
    /// eager fragment stays on fragments: one small hand-off, no system
    /// call. A get from `min_rdma_pipeline_size` on is large, as large
    /// messages are: [`Self::iget`] then follows the measured rates.
    fn single_copy_pays(&mut self, peer: u32, len: usize) -> bool {
        self.state.cma_ok[peer as usize] && len > self.shm.get().engine.eager_payload() as usize
    }

    /// Reads `dst.len()` bytes at `offset` of `peer`'s region `id` into
    /// `dst`; completes with [`crate::ops::TEvent::Done`] for `op` (the
    /// target's refusal is the completion's status).
    ///
    /// # Safety
    ///
    /// `dst` must stay valid for writes, and unused otherwise, until the
    /// operation completes or is cancelled.
    pub unsafe fn iget(
        &mut self,
        peer: u32,
        id: u32,
        offset: u64,
        dst: RawBuf,
        op: OpId,
    ) -> Result<Posted, PostError> {
        self.rma_ok(peer, dst.len() as u64)?;
        let req = self.new_req();
        // Single copy or fragments; a large get as measured for this peer
        // (the same two mechanisms, and measurements, as large sends) and
        // timed for them; mid-size ones are not (they would skew the
        // rates). How a get is timed: `recv_reply`. Unlike a message, a
        // split get is measured too: its destination is the caller's, at
        // whatever alignment the caller chose, and the kernel's copy is
        // 4.5× slower at some (see `cma`; unmeasured, a 4 MiB get into a
        // buffer 8 bytes into a page ran at 5.4 GB/s against 20–22).
        let single_ok = self.single_copy_pays(peer, dst.len());
        let large = single_ok && dst.len() as u64 >= u64::from(self.params.min_rdma_pipeline_size);
        let (single, timed) = if large {
            (
                self.bulk_choice(peer, dst.len()) == Bulk::SingleCopy,
                Some(Instant::now()),
            )
        } else {
            (single_ok, None)
        };
        // A single copy from `cma_split_min` on is split with the target:
        // it writes the second half into `dst` while we read the first, so
        // two cores copy at once (4 MiB: 24 GB/s against 12 read by one
        // side; below 128 KiB the second answer's hand-off eats the gain).
        let split_min = self.state.split_min;
        let kind = if single && split_min != 0 && dst.len() >= split_min {
            WaitKind::GetSplit {
                dst,
                // Page-aligned, so each side copies whole pages.
                at: (dst.len() / 2) & !4095,
                src: None,
                head_ok: false,
                release: Instant::now(),
            }
        } else if single {
            if self.get_direct(peer, id, offset, dst, timed) {
                return Ok(Posted::Done);
            }
            WaitKind::GetSingle { dst }
        } else {
            WaitKind::Get { dst, got: 0 }
        };
        let wait = RmaWait {
            peer,
            op,
            kind,
            remote: (id, offset),
            timed,
        };
        self.send_get_req(req, wait)?;
        Ok(Posted::Pending)
    }

    /// A single-copy get without asking: when `peer`'s region table
    /// publishes region `id` and the range lies inside it, reads the range
    /// from the target's memory now; true when the get is done (the caller
    /// reports it complete at once, [`Posted::Done`]). Returns false,
    /// having done nothing the caller can see, when the table does not
    /// have the region or the read fails: the caller then asks the target,
    /// whose answer is the authority (a refusal with its reason, or the
    /// address).
    ///
    /// Not while an earlier one-sided operation of ours with `peer` waits
    /// for it: the get then asks, behind that operation in the ring, so a
    /// get posted after a put still reads what the put wrote (as over the
    /// asking path and over TCP).
    ///
    /// What this saves: the request and the answer, each a hand-off
    /// through the other process's progress loop (under Open MPI's ob1,
    /// where every rendezvous message over `rsm` is such a get, 0.1 µs of
    /// a 16 KiB message's 4.4: README, "Rendezvous messages").
    fn get_direct(
        &mut self,
        peer: u32,
        id: u32,
        offset: u64,
        dst: RawBuf,
        timed: Option<Instant>,
    ) -> bool {
        if !self.state.waiting.is_empty() && self.state.waiting.values().any(|w| w.peer == peer) {
            return false;
        }
        let Some(addr) = self
            .published(peer, id)
            .and_then(|p| p.range(offset, dst.len() as u64))
        else {
            return false;
        };
        // SAFETY: `dst` is the local side of our get, valid for writes and
        // unused by the caller until the operation completes (this
        // function's caller's contract).
        let d = unsafe { dst.as_mut_slice() };
        match self.state.cma_read(peer, addr, d) {
            Ok(()) => {
                self.state.rma_single_copies += 1;
                self.state.direct_gets += 1;
                if let Some(posted) = timed {
                    self.state
                        .time_get(peer, Bulk::SingleCopy, dst.len(), posted);
                }
                true
            }
            Err(e) => {
                log::debug!(
                    "direct get from local rank {peer} (region {id}) failed: {e}; asking the \
                     target"
                );
                false
            }
        }
    }

    fn send_get_req(&mut self, req: u64, mut wait: RmaWait) -> Result<(), PostError> {
        let (dst, mode) = match &mut wait.kind {
            WaitKind::GetSingle { dst } => (*dst, GetMode::SingleCopy),
            WaitKind::GetSplit {
                dst, at, release, ..
            } => {
                // The deadline on the clock the target reads; our release
                // taken after it, so it is never early.
                let deadline = monotonic_ns().saturating_add(SPLIT_DEADLINE.as_nanos() as u64);
                *release = Instant::now() + SPLIT_DEADLINE + SPLIT_GRACE;
                let tail = SplitTailRepr {
                    at: *at as u64,
                    dst: dst.addr() + *at as u64,
                    deadline,
                };
                (*dst, GetMode::Split(tail))
            }
            WaitKind::Get { dst, .. } => (*dst, GetMode::Fragments),
            WaitKind::Put { .. } => return Err(PostError::InvalidPeer),
        };
        let get = GetReqRepr {
            req,
            id: wait.remote.0,
            offset: wait.remote.1,
            len: dst.len() as u64,
            mode,
        };
        let mut msg = [0u8; GET_REQ_SPLIT_LEN];
        let msg = &mut msg[..get.buffer_len()];
        get.emit(&mut RangeReqPacket::new_unchecked(&mut *msg));
        self.send_ctl(wait.peer, TAG_GET_REQ, msg)?;
        self.state.waiting.insert(req, wait);
        Ok(())
    }

    /// Writes `src` at `offset` of `peer`'s region `id`; completes with
    /// [`crate::ops::TEvent::Done`] for `op` once the target applied it
    /// (its refusal is the completion's status).
    ///
    /// # Safety
    ///
    /// `src` must stay valid and unchanged until the operation completes
    /// or is cancelled.
    pub unsafe fn iput(
        &mut self,
        peer: u32,
        id: u32,
        offset: u64,
        src: RawBuf,
        op: OpId,
    ) -> Result<Posted, PostError> {
        self.rma_ok(peer, src.len() as u64)?;
        let req = self.new_req();
        let single = self.single_copy_pays(peer, src.len());
        let wait = RmaWait {
            peer,
            op,
            kind: WaitKind::Put { single, src },
            remote: (id, offset),
            timed: None,
        };
        self.send_put(req, wait)?;
        Ok(Posted::Pending)
    }

    fn send_put(&mut self, req: u64, wait: RmaWait) -> Result<(), PostError> {
        let WaitKind::Put { single, src } = wait.kind else {
            return Err(PostError::InvalidPeer);
        };
        let (id, offset) = wait.remote;
        if single {
            let msg = PutCmaRepr {
                req,
                id,
                offset,
                len: src.len() as u64,
                src: src.addr(),
            }
            .to_bytes();
            self.send_ctl(wait.peer, TAG_PUT_CMA, &msg)?;
        } else {
            self.check_peer(wait.peer)?;
            if src.is_empty() {
                // Nothing to stream: one empty chunk, so the target answers.
                let hdr = PutDataRepr {
                    req,
                    id,
                    offset,
                    total: 0,
                    chunk_off: 0,
                };
                self.send_ctl(wait.peer, TAG_PUT_DATA, &hdr.to_bytes())?;
                self.state.waiting.insert(req, wait);
                return Ok(());
            }
            self.enqueue_stream(
                wait.peer,
                Stream {
                    kind: StreamKind::PutData { req, id, offset },
                    parts: RawParts::one(src),
                    _owned: None,
                    sent: 0,
                    op: None,
                    probe: Probe::No,
                    pinned: None,
                },
            );
        }
        self.state.waiting.insert(req, wait);
        Ok(())
    }

    /// Carries out what the callbacks queued (answers, serving gets,
    /// retries). Errors towards a failed peer are dropped (its operations
    /// completed with the failure).
    pub(super) fn do_work(&mut self, regions: &mut Regions) -> usize {
        let mut n = 0;
        while let Some(w) = (!self.state.work.is_empty()).then(|| self.state.work.remove(0)) {
            n += 1;
            let (peer, r) = match w {
                Work::Reply {
                    peer,
                    req,
                    status,
                    addr,
                } => (peer, self.reply(peer, req, status, addr)),
                Work::Serve { peer, get } => (peer, self.serve_get(regions, peer, get)),
                Work::Split { peer, get, tail } => {
                    (peer, self.serve_split(regions, peer, get, tail))
                }
                Work::RetryGet { peer, req, wait } => (peer, self.send_get_req(req, wait)),
                Work::Landing { peer, ad } => (
                    peer,
                    self.send_ctl(peer, super::TAG_LANDING, &ad.to_bytes()),
                ),
                Work::RetryPut {
                    peer, req, wait, ..
                } => (peer, self.send_put(req, wait)),
            };
            if let Err(e) = r {
                log::warn!("one-sided work for local rank {peer} not done: {e}");
            }
        }
        n
    }

    /// Answers `peer`'s get or put `req`.
    fn reply(
        &mut self,
        peer: u32,
        req: u64,
        status: RmaStatus,
        addr: u64,
    ) -> Result<(), PostError> {
        let r = ReplyRepr { req, status, addr };
        self.send_ctl(peer, TAG_RMA_REPLY, &r.to_bytes())
    }

    /// Serves a validated get in fragments from our (pinned) region, then
    /// answers.
    fn serve_get(
        &mut self,
        regions: &mut Regions,
        peer: u32,
        get: GetReqRepr,
    ) -> Result<(), PostError> {
        let src = match regions.range(get.id, get.offset, get.len) {
            Ok(src) => src,
            Err(status) => {
                // Deregistered meanwhile.
                return self.reply(peer, get.req, status, 0);
            }
        };
        self.check_peer(peer)?;
        if get.len >= u64::from(self.params.min_rdma_pipeline_size) {
            // A large transfer through fragments: the pool may grow to the
            // pipeline's depth, as for a large send (`enqueue_large`), not
            // stay at the start-up size kept while single copy carries
            // large messages.
            self.shm.get().engine.lift_pool_limits();
        }
        regions.pin(get.id);
        self.enqueue_stream(
            peer,
            Stream {
                kind: StreamKind::GetData { req: get.req },
                parts: RawParts::one(src),
                _owned: None,
                sent: 0,
                op: None,
                probe: Probe::No,
                pinned: Some(get.id),
            },
        );
        self.reply(peer, get.req, RmaStatus::Ok, 0)
    }

    /// Serves a validated split get: answers with the range's address (the
    /// requester reads the part before `tail.at`), writes the rest into the
    /// requester's memory at `tail.dst` in pieces while the deadline has
    /// not passed, then answers with how many bytes of the rest it wrote
    /// (the requester reads the others).
    ///
    /// The requester asked for this write into the destination of its own
    /// get and keeps that memory for it until our second answer (or until
    /// the deadline's grace has passed); we write nothing but our region's
    /// bytes, only into that process (the pid start-up established, never
    /// ourselves) and only inside the range it named.
    fn serve_split(
        &mut self,
        regions: &mut Regions,
        peer: u32,
        get: GetReqRepr,
        tail: SplitTailRepr,
    ) -> Result<(), PostError> {
        let src = match regions.range(get.id, get.offset, get.len) {
            Ok(src) => src,
            Err(status) => {
                // Deregistered meanwhile.
                return self.reply(peer, get.req, status, 0);
            }
        };
        self.reply(peer, get.req, RmaStatus::Ok, src.addr())?;
        let written = self.write_tail(peer, src, tail);
        self.reply(peer, get.req, RmaStatus::Ok, written)
    }

    /// Writes `src[tail.at..]` to `tail.dst` in `peer`'s memory, piece by
    /// piece while `tail.deadline` has not passed; returns the bytes
    /// written (a prefix of the tail). A write the kernel refuses stops
    /// the writes to that peer for good (it reads everything itself).
    fn write_tail(&mut self, peer: u32, src: RawBuf, tail: SplitTailRepr) -> u64 {
        let p = peer as usize;
        let pid = self.state.peers[p].pid;
        let at = usize::try_from(tail.at).unwrap_or(usize::MAX);
        let Some(rest) = src.sub(at, src.len().saturating_sub(at)) else {
            return 0;
        };
        if !self.state.split_write_ok[p] || pid == self.state.own_pid {
            return 0;
        }
        // SAFETY: `src` is a range of one of our registered regions,
        // validated just now; nothing of ours writes it during this call.
        let rest = unsafe { rest.as_slice() };
        let mut done = 0;
        while done < rest.len() && monotonic_ns() < tail.deadline {
            let n = (rest.len() - done).min(SPLIT_PIECE);
            let Some(to) = tail
                .dst
                .checked_add(done as u64)
                .and_then(|a| usize::try_from(a).ok())
            else {
                break;
            };
            // SAFETY: `pid` is another process (checked above), the peer
            // start-up identified, which asked us to write this range of
            // the destination of its own get (`tail.dst` is its address of
            // byte `tail.at`) and keeps that memory for it until our
            // answer or the deadline's grace.
            match unsafe { cma::write_remote(pid, to, &rest[done..done + n]) } {
                Ok(()) => done += n,
                Err(e) => {
                    log::warn!(
                        "writing a split get's part into local rank {peer} failed ({e}); \
                         it reads its gets itself from now on"
                    );
                    self.state.split_write_ok[p] = false;
                    break;
                }
            }
        }
        self.state.split_written += done as u64;
        done as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_clock_moves_forward() {
        let (a, b) = (monotonic_ns(), monotonic_ns());
        assert!(a > 0 && b >= a);
    }
}
