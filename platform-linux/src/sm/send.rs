//! The send path, never blocking: a message up to a fragment goes into one
//! fragment at once; what cannot leave at once (no free fragment, the
//! peer's queue full, a large message) waits in the peer's own queue of
//! outgoing work ([`Out`](super::out::Out)), in order, and leaves as fragments free up
//! during progress. Large messages take the single-copy rendezvous or the
//! pipelined copy, chosen by measurement ([`super::bulk`]).
//!
//! Per-peer order holds across every path: nothing overtakes the head of
//! a peer's queue, and a rendezvous stays at the head until the receiver
//! acknowledges it (if the receiver cannot read our memory, the same
//! message is resent pipelined, still ahead of everything sent after it).

use std::time::Instant;

use btl_core::barrier::BarrierRepr;
use btl_core::sm::engine::{PeerState, SendError};
use btl_core::sm::wire::{
    ChunkRepr, GetDataRepr, LandingAdRepr, PutDataRepr, RndvRepr, RndvSplitRepr, RANGE_REQ_LEN,
};

use super::bulk::{probe_burst, Bulk, Probe, RATE_CLASSES};
use super::landing::ALIGN_SLACK;
use super::out::{Out, Stream, StreamKind};
use super::recv::Ctx;
use super::*;
use crate::cma;
use crate::ops::{OpError, OpId, PostError, Posted, RawBuf, RawParts, Sink};
use crate::regions::Regions;
use btl_core::sync::Ordering;

impl Sm {
    /// Whether `peer` can be sent to.
    pub(super) fn check_peer(&mut self, peer: u32) -> Result<(), PostError> {
        match self.shm.get().engine.peer_state(peer) {
            Some(PeerState::Connected) => Ok(()),
            Some(PeerState::Failed) => Err(PostError::PeerFailed),
            _ => Err(PostError::InvalidPeer),
        }
    }

    fn admit(&self, peer: u32, len: u64) -> Result<(), PostError> {
        let o = &self.out[peer as usize];
        if self.limits.admits(o.bytes, o.q.len() as u32, len) {
            Ok(())
        } else {
            Err(PostError::WouldBlock)
        }
    }

    fn enqueue(&mut self, peer: u32, item: Out) {
        let o = &mut self.out[peer as usize];
        if o.q.is_empty() {
            self.busy_peers += 1;
        }
        o.bytes += item.len();
        o.q.push_back(item);
    }

    fn dequeue(&mut self, peer: u32) -> Option<Out> {
        let o = &mut self.out[peer as usize];
        let item = o.q.pop_front()?;
        o.bytes = o.bytes.saturating_sub(item.len());
        if o.q.is_empty() {
            self.busy_peers -= 1;
        }
        Some(item)
    }

    /// Sends the concatenation of `parts` to `peer` with `tag`, copying:
    /// the bytes may be reused when this returns. A message that cannot
    /// leave at once waits (copied) in the peer's queue; if that queue is
    /// full the post is refused with [`PostError::WouldBlock`].
    #[inline]
    pub fn isend(&mut self, peer: u32, tag: u8, parts: &[&[u8]]) -> Result<(), PostError> {
        if tag > MAX_USER_TAG {
            return Err(PostError::ReservedTag);
        }
        // The common case first, with no check of its own: nothing queued
        // to this peer and the engine takes the message at once (the
        // engine checks the peer's state and refuses what exceeds a
        // fragment, which goes on below).
        if self.out.get(peer as usize).is_some_and(|o| o.q.is_empty()) {
            match self.try_fragment(peer, tag, parts) {
                Ok(true) => return Ok(()),
                Ok(false) | Err(PostError::TooLarge { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        self.isend_queued(peer, tag, parts)
    }

    /// The fast path of [`Self::isend`]: the message into `peer`'s fast
    /// box, when nothing of ours waits in the peer's queue and the engine's
    /// box takes it ([`SmEngine::try_send_boxed`](btl_core::sm::engine::SmEngine::try_send_boxed)).
    /// True when sent; false when nothing happened (then [`Self::isend`]).
    #[inline(always)]
    pub fn try_send_boxed(&mut self, peer: u32, tag: u8, parts: &[&[u8]]) -> bool {
        self.out.get(peer as usize).is_some_and(|o| o.q.is_empty())
            && self.shm.get().engine.try_send_boxed(peer, tag, parts)
    }

    /// [`Self::isend`] of a message the engine did not take at once.
    #[inline(never)]
    fn isend_queued(&mut self, peer: u32, tag: u8, parts: &[&[u8]]) -> Result<(), PostError> {
        self.check_peer(peer)?;
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len as u64 > MAX_MESSAGE {
            return Err(PostError::TooLarge { max: MAX_MESSAGE });
        }
        self.admit(peer, len as u64)?;
        let data = parts.concat();
        if len <= self.shm.get().engine.max_payload() as usize {
            self.enqueue(peer, Out::Copy { tag, data });
        } else {
            let parts = RawParts::one(RawBuf::new(&data));
            // Moving the Vec moves its pointer, not the bytes `parts` names.
            self.enqueue_large(peer, tag, parts, Some(data), None);
        }
        self.pump(peer);
        Ok(())
    }

    /// Sends the concatenation of `parts` to `peer` with `tag` without
    /// copying large messages: a message up to a fragment that can leave at
    /// once is copied into its fragment ([`Posted::Done`]); one behind
    /// others, or larger, is read from `parts` when (while) it travels, and
    /// completes with [`TEvent::Done`] for `op`.
    ///
    /// # Safety
    ///
    /// The memory `parts` names must stay valid and unchanged until the
    /// operation completes (or is cancelled with [`Self::cancel`]).
    pub unsafe fn isend_raw(
        &mut self,
        peer: u32,
        tag: u8,
        parts: RawParts,
        op: OpId,
    ) -> Result<Posted, PostError> {
        PostError::check_message(tag, parts.len() as u64, MAX_MESSAGE)?;
        self.check_peer(peer)?;
        // Caller memory: only the message count is bounded.
        if parts.len() <= self.shm.get().engine.max_payload() as usize {
            if self.out[peer as usize].q.is_empty() {
                // SAFETY: the caller's promise; the slices are used before
                // returning.
                if unsafe { parts.with_slices(|s| self.try_fragment(peer, tag, s)) }? {
                    return Ok(Posted::Done);
                }
            }
            // Behind others (or the ring is full): it waits in the queue
            // as the caller's memory, not a staged copy (a pipelined
            // stream of small sends, as Open MPI's ob1 makes of a large
            // message without single copy, would otherwise allocate and
            // copy each fragment twice).
            self.admit(peer, 0)?;
            self.enqueue(peer, Out::Raw { tag, parts, op });
            self.pump(peer);
            return Ok(Posted::Pending);
        }
        self.admit(peer, 0)?;
        self.enqueue_large(peer, tag, parts, None, Some(op));
        self.pump(peer);
        Ok(Posted::Pending)
    }

    /// One fragment now if possible: `Ok(false)` if it must wait.
    #[inline]
    fn try_fragment(&mut self, peer: u32, tag: u8, parts: &[&[u8]]) -> Result<bool, PostError> {
        match self.shm.get().engine.send(peer, tag, parts, 0) {
            Ok(()) => Ok(true),
            Err(SendError::NoFragment | SendError::Backlog { .. }) => Ok(false),
            Err(SendError::PeerFailed { .. }) => Err(PostError::PeerFailed),
            Err(SendError::InvalidPeer { .. }) => Err(PostError::InvalidPeer),
            Err(SendError::TooLarge { max, .. }) => Err(PostError::TooLarge {
                max: u64::from(max),
            }),
        }
    }

    /// An internal message (reply, request, barrier): one fragment now, or
    /// queued in order; never refused for queue bounds (its size is fixed
    /// and its count bounded by the peer's own requests).
    pub(super) fn send_ctl(&mut self, peer: u32, tag: u8, bytes: &[u8]) -> Result<(), PostError> {
        self.check_peer(peer)?;
        if self.out[peer as usize].q.is_empty() && self.try_fragment(peer, tag, &[bytes])? {
            return Ok(());
        }
        self.enqueue(
            peer,
            Out::Copy {
                tag,
                data: bytes.to_vec(),
            },
        );
        Ok(())
    }

    /// Sends barrier message `msg` to `peer` (the job's barrier; they
    /// arrive as [`TEvent::Barrier`]).
    pub fn send_barrier(&mut self, peer: u32, msg: BarrierRepr) -> Result<(), PostError> {
        self.send_ctl(peer, TAG_BARRIER, &msg.to_bytes()[..msg.buffer_len()])
    }

    /// Queues a large message by the protocol measurement prefers.
    fn enqueue_large(
        &mut self,
        peer: u32,
        tag: u8,
        parts: RawParts,
        owned: Option<Vec<u8>>,
        op: Option<OpId>,
    ) {
        let large = parts.len() as u64 >= u64::from(self.params.min_rdma_pipeline_size);
        // A message the receiver's landing buffer takes goes by split
        // single copy without measuring: each byte is copied once, by one
        // of two cores at once, where the pipelined copy copies it twice
        // on the same two cores. Where the two processes share a cache the
        // pipelined copy can be faster (4 MiB: 29 against 25 GB/s), but
        // choosing by measurement while running goes wrong too often under
        // a hypervisor (README, "Messages and the two bulk protocols"), and
        // a wrong choice costs 3–8× where the processes do not share a
        // cache and 15 % where they do.
        let cma = self.state.cma_ok[peer as usize] && parts.contiguous().is_some();
        let how = if !large || !cma {
            Bulk::Pipelined
        } else if self.split_to(peer, parts.len()).is_some() {
            Bulk::SingleCopy
        } else {
            self.bulk_choice(peer, parts.len())
        };
        if large {
            let (single, pipelined, timed) = &mut self.large_sent;
            match how {
                Bulk::SingleCopy => *single += 1,
                Bulk::Pipelined => *pipelined += 1,
                Bulk::ProbePipelined => (*pipelined, *timed) = (*pipelined + 1, *timed + 1),
            }
        }
        let mut probe = Probe::No;
        if large && how != Bulk::SingleCopy {
            // A large message through fragments (single copy refused, or
            // measured slower): the pipeline needs its depth, so the
            // max-size pool may grow to its room from now on (start-up
            // keeps it small while single copy carries large messages).
            self.shm.get().engine.lift_pool_limits();
        }
        if large && how != Bulk::Pipelined {
            if let Some(buf) = parts.contiguous() {
                match how {
                    Bulk::SingleCopy => {
                        self.next_cookie += 1;
                        let cookie = self.next_cookie;
                        self.enqueue(
                            peer,
                            Out::Rndv {
                                tag,
                                buf,
                                owned,
                                op,
                                cookie,
                                pushed: None,
                                cancelled: false,
                            },
                        );
                        return;
                    }
                    Bulk::ProbePipelined => probe = self.next_probe(peer, parts.len()),
                    Bulk::Pipelined => {}
                }
            }
        }
        self.enqueue(
            peer,
            Out::Stream(Stream {
                kind: StreamKind::Message { tag },
                parts,
                _owned: owned,
                sent: 0,
                op,
                probe,
                pinned: None,
            }),
        );
    }

    /// Queues a stream of fragments (put or get data).
    pub(super) fn enqueue_stream(&mut self, peer: u32, s: Stream) {
        self.enqueue(peer, Out::Stream(s));
        self.pump(peer);
    }

    /// Moves `peer`'s queue along as far as fragments and its ring allow.
    /// Returns how many fragments went out.
    pub(super) fn pump(&mut self, peer: u32) -> usize {
        let mut slices = std::mem::take(&mut self.pump_pieces);
        let n = self.pump_with(peer, &mut slices);
        self.pump_pieces = slices;
        n
    }

    /// [`Self::pump`], with `slices` for the pieces of each fragment.
    fn pump_with(&mut self, peer: u32, slices: &mut Vec<RawBuf>) -> usize {
        let mut n = 0;
        loop {
            let max = self.shm.get().engine.max_payload() as usize;
            let Some(head) = self.out[peer as usize].q.front_mut() else {
                return n;
            };
            match head {
                Out::Copy { tag, data } => match self.shm.get().engine.send(peer, *tag, &[data], 0)
                {
                    Ok(()) => {
                        n += 1;
                        self.dequeue(peer);
                    }
                    Err(_) => return n,
                },
                Out::Raw { tag, parts, op } => {
                    let (tag, op) = (*tag, *op);
                    let engine = &mut self.shm.get().engine;
                    // SAFETY: the poster's promise (`isend_raw`): the
                    // memory is valid and unchanged until `op` completes,
                    // which is below, after the copy into the fragment.
                    if unsafe { parts.with_slices(|s| engine.send(peer, tag, s, 0)) }.is_err() {
                        return n;
                    }
                    n += 1;
                    self.dequeue(peer);
                    self.state.done.push((op, Ok(())));
                }
                Out::Rndv {
                    tag,
                    buf,
                    cookie,
                    pushed,
                    ..
                } => {
                    if pushed.is_some() {
                        return n;
                    }
                    let (tag, buf, cookie) = (*tag, *buf, *cookie);
                    let len = buf.len();
                    // Timed from here to the acknowledgement, our part of
                    // a split message included (see `BulkRates`).
                    let t0 = Instant::now();
                    let split = self.split_to(peer, len);
                    let rndv = RndvRepr {
                        tag,
                        addr: buf.addr(),
                        len: len as u64,
                    };
                    let sent = match split {
                        Some(ad) => {
                            self.split_seq[peer as usize] += 1;
                            let hdr = RndvSplitRepr {
                                rndv,
                                // Page-aligned, so each side copies whole
                                // pages.
                                at: ((len / 2) & !4095) as u64,
                                seq: self.split_seq[peer as usize],
                            };
                            let e = &mut self.shm.get().engine;
                            let sent = e.send(peer, TAG_RNDV_SPLIT, &[&hdr.to_bytes()], cookie);
                            // Our part right away, before anything else
                            // (the receiver waits for it).
                            sent.map(|()| self.write_split_part(peer, buf, ad, hdr))
                        }
                        None => {
                            let e = &mut self.shm.get().engine;
                            e.send(peer, TAG_RNDV, &[&rndv.to_bytes()], cookie)
                        }
                    };
                    if sent.is_err() {
                        return n;
                    }
                    if let Some(Out::Rndv { pushed, .. }) = self.out[peer as usize].q.front_mut() {
                        *pushed = Some(t0);
                    }
                    n += 1;
                    return n;
                }
                Out::Stream(s) => {
                    if s.probe == Probe::Drain {
                        if self.shm.get().engine.in_flight_to(peer) > 0 {
                            return n;
                        }
                        s.probe = Probe::Since {
                            t0: Instant::now(),
                            bytes: 0,
                            n: 0,
                        };
                    }
                    let total = s.parts.len();
                    while s.sent < total {
                        let (sent, total64) = (s.sent as u64, total as u64);
                        let mut hdr = [0u8; RANGE_REQ_LEN];
                        let mut put = |b: &[u8]| {
                            hdr[..b.len()].copy_from_slice(b);
                            b.len()
                        };
                        let hlen = match s.kind {
                            StreamKind::Message { tag } => put(&ChunkRepr {
                                tag,
                                total: total64,
                                offset: sent,
                            }
                            .to_bytes()),
                            StreamKind::PutData { req, id, offset } => put(&PutDataRepr {
                                req,
                                id,
                                offset,
                                total: total64,
                                chunk_off: sent,
                            }
                            .to_bytes()),
                            StreamKind::GetData { req } => {
                                put(&GetDataRepr { req, offset: sent }.to_bytes())
                            }
                        };
                        // A multiple of 64 bytes, so every chunk of the
                        // source and of the receiver's buffer keeps the same
                        // alignment (faster copies).
                        let step = (max - hlen) & !63;
                        let len = step.min(total - s.sent);
                        s.parts.range(s.sent, len, slices);
                        let tag = match s.kind {
                            StreamKind::Message { .. } => TAG_CHUNK,
                            StreamKind::PutData { .. } => btl_core::tags::SM_PUT_DATA,
                            StreamKind::GetData { .. } => btl_core::tags::SM_GET_DATA,
                        };
                        // The header and the pieces, gathered on the stack
                        // when few (one fragment of a contiguous stream:
                        // two), without an allocation per fragment.
                        let engine = &mut self.shm.get().engine;
                        let mut few: [&[u8]; 4] = [&[]; 4];
                        let mut many: Vec<&[u8]> = Vec::new();
                        let all: &[&[u8]] = if slices.len() < few.len() {
                            few[0] = &hdr[..hlen];
                            for (d, r) in few[1..].iter_mut().zip(slices.iter()) {
                                // SAFETY: the stream's memory is valid until
                                // it completes: the poster's promise
                                // (`isend_raw`, the job API's pinned
                                // regions) or its own staged copy.
                                *d = unsafe { r.as_slice() };
                            }
                            &few[..=slices.len()]
                        } else {
                            many.push(&hdr[..hlen]);
                            // SAFETY: as above.
                            many.extend(slices.iter().map(|r| unsafe { r.as_slice() }));
                            &many
                        };
                        if engine.send(peer, tag, all, 0).is_err() {
                            return n;
                        }
                        n += 1;
                        s.sent += len;
                    }
                    if let Probe::Since { t0, bytes, .. } = s.probe {
                        // Not changed before the drain below: a pass that
                        // returns here comes back to the same state.
                        let bytes = bytes + total;
                        match self.out[peer as usize].q.get_mut(1) {
                            // The burst goes on: the next message carries it.
                            Some(Out::Stream(next)) if matches!(next.probe, Probe::Next(_)) => {
                                let k = next.probe.index().unwrap_or(0);
                                next.probe = Probe::Since { t0, bytes, n: k };
                            }
                            _ => {
                                if self.shm.get().engine.in_flight_to(peer) > 0 {
                                    return n;
                                }
                                let class = self.rate_class(total);
                                self.rates[peer as usize][class].record(
                                    Bulk::Pipelined,
                                    bytes,
                                    t0.elapsed(),
                                );
                            }
                        }
                    }
                    if let Some(Out::Stream(s)) = self.dequeue(peer) {
                        if let Some(id) = s.pinned {
                            self.unpins.push(id);
                        }
                        if let (StreamKind::Message { .. }, Some(op)) = (s.kind, s.op) {
                            self.state.done.push((op, Ok(())));
                        }
                    }
                }
            }
        }
    }

    /// The measurement a large message of `len` bytes to `peer` joins when
    /// the pipelined copy is due for one: the next message of a burst
    /// still open at the back of the queue (same size class, fewer than
    /// [`probe_burst`] messages), none behind a full burst (its
    /// measurement is on its way), else a new burst.
    fn next_probe(&self, peer: u32, len: usize) -> Probe {
        let back = match self.out[peer as usize].q.back() {
            Some(Out::Stream(s)) => Some(s),
            _ => None,
        };
        let Some((n, back_len)) = back.and_then(|s| Some((s.probe.index()?, s.parts.len()))) else {
            return Probe::Drain;
        };
        if self.rate_class(back_len) != self.rate_class(len) {
            Probe::Drain
        } else if n + 1 < probe_burst(len) {
            Probe::Next(n + 1)
        } else {
            Probe::No
        }
    }

    /// The mechanism for a large transfer of `len` bytes with `peer` that
    /// single copy could carry: by measurement (`cma_measure`, see
    /// [`BulkRates`]), else single copy.
    pub(super) fn bulk_choice(&self, peer: u32, len: usize) -> Bulk {
        if self.params.cma_measure {
            self.rates[peer as usize][self.rate_class(len)].choose(Instant::now())
        } else {
            Bulk::SingleCopy
        }
    }

    /// The bulk-rate class of a transfer of `len` bytes: 0 below
    /// `cma_split_min` (or with splitting off); from it on, where single
    /// copy is split between the two processes, one class per factor of 4
    /// in size (1: up to 4 × `cma_split_min`, ..., [`RATE_CLASSES`] - 1:
    /// the rest). Rates per byte differ with the size (a split 1 MiB
    /// message moved at 53 GB/s where 4 MiB reached 21–25), so samples of
    /// one size class do not choose for another.
    pub(super) fn rate_class(&self, len: usize) -> usize {
        let min = self.state.split_min;
        if min == 0 || len < min {
            return 0;
        }
        let octaves = (len / min).ilog2() as usize;
        (1 + octaves / 2).min(RATE_CLASSES - 1)
    }

    /// `peer`'s landing buffer, if a message of `len` bytes to it goes by
    /// split rendezvous (see [`super::landing`]).
    fn split_to(&self, peer: u32, len: usize) -> Option<LandingAdRepr> {
        let st = &self.state;
        st.landing_to[peer as usize].filter(|ad| {
            st.split_min != 0
                && len >= st.split_min
                && (len as u64).saturating_add(ALIGN_SLACK as u64) <= ad.cap
        })
    }

    /// Writes our part of split rendezvous `hdr` (`buf[hdr.at..]`) into
    /// `peer`'s landing buffer `ad`, then its sequence number into the
    /// flag word (see [`super::landing`]). A write the kernel refuses stops
    /// splitting to that peer (the receiver then reads the rest itself
    /// after its wait).
    fn write_split_part(&mut self, peer: u32, buf: RawBuf, ad: LandingAdRepr, hdr: RndvSplitRepr) {
        let pid = self.state.peers[peer as usize].pid;
        let at = hdr.at as usize;
        let skew = super::landing::skew(buf.addr()) as u64;
        let (Some(part), Some(to)) = (
            buf.sub(at, buf.len() - at),
            ad.data_addr(skew + hdr.at)
                .and_then(|a| usize::try_from(a).ok()),
        ) else {
            return;
        };
        let flag = usize::try_from(ad.addr).unwrap_or(0);
        // SAFETY: `buf` is the message, valid until its rendezvous is
        // acknowledged (the poster's promise or our staged copy).
        let part = unsafe { part.as_slice() };
        // SAFETY: `pid` is another process (start-up refuses our own pid
        // for a peer), which told us this landing buffer for exactly these
        // writes and holds it for us (its size checked against `ad.cap` by
        // the caller; the receiver validates the header against its own).
        let r = unsafe { cma::write_remote(pid, to, part) }.and_then(|()| {
            // The data before the flag, for the receiver's Acquire load.
            btl_core::sync::fence(Ordering::SeqCst);
            // SAFETY: as above; the flag word at the buffer's start.
            unsafe { cma::write_remote(pid, flag, &hdr.seq.to_le_bytes()) }
        });
        match r {
            Ok(()) => self.state.split_out += 1,
            Err(e) => {
                log::warn!(
                    "writing our part of a split message into local rank {peer}'s memory failed \
                     ({e}); it reads our messages alone from now on"
                );
                self.state.landing_to[peer as usize] = None;
            }
        }
    }

    /// The receiver acknowledged a rendezvous (`ok`: it read our memory).
    pub(super) fn rndv_acked(&mut self, peer: u32, cookie: u64, ok: bool) {
        let matches = matches!(
            self.out[peer as usize].q.front(),
            Some(Out::Rndv { cookie: c, pushed: Some(_), .. }) if *c == cookie
        );
        if !matches {
            return;
        }
        let Some(Out::Rndv {
            tag,
            buf,
            owned,
            op,
            pushed,
            cancelled,
            ..
        }) = self.dequeue(peer)
        else {
            return;
        };
        if cancelled && !ok {
            // The caller gave the message up: not resent from its memory.
            log::warn!(
                "local rank {peer} could not read a cancelled {}-byte message; it is dropped",
                buf.len()
            );
            if let Some(op) = op {
                self.state.done.push((op, Err(OpError::Remote)));
            }
            return;
        }
        if ok {
            if let Some(t0) = pushed {
                let class = self.rate_class(buf.len());
                self.rates[peer as usize][class].record(Bulk::SingleCopy, buf.len(), t0.elapsed());
            }
            if let Some(op) = op {
                self.state.done.push((op, Ok(())));
            }
            return;
        }
        // The receiver could not read our memory: resend through fragments,
        // ahead of everything sent after it.
        self.state.cma_ok[peer as usize] = false;
        log::warn!(
            "single copy to local rank {peer} failed at the receiver; resending through shared fragments"
        );
        let item = Out::Stream(Stream {
            kind: StreamKind::Message { tag },
            parts: RawParts::one(buf),
            _owned: owned,
            sent: 0,
            op,
            probe: Probe::No,
            pinned: None,
        });
        let o = &mut self.out[peer as usize];
        if o.q.is_empty() {
            self.busy_peers += 1;
        }
        o.bytes += item.len();
        o.q.push_front(item);
    }

    /// Drops `peer`'s queued work, completing its operations with an error.
    pub(super) fn drop_queue(&mut self, peer: u32) {
        while let Some(item) = self.dequeue(peer) {
            let (op, pinned) = match item {
                Out::Copy { .. } => (None, None),
                Out::Raw { op, .. } => (Some(op), None),
                Out::Stream(s) => (
                    s.op.filter(|_| matches!(s.kind, StreamKind::Message { .. })),
                    s.pinned,
                ),
                Out::Rndv { op, .. } => (op, None),
            };
            if let Some(op) = op {
                self.state
                    .done
                    .push((op, Err(OpError::PeerFailed { peer })));
            }
            if let Some(id) = pinned {
                self.unpins.push(id);
            }
        }
    }

    /// Forgets operation `op` (a blocking call gave up on it): its queued
    /// work is dropped and no completion will be reported. Bytes already
    /// in fragments still arrive; a peer may still read memory it was told
    /// about (a rendezvous or a put's source), which is harmless to us. A
    /// rendezvous already posted stays at the head of its queue until the
    /// receiver acknowledges it, so that nothing sent after it overtakes it
    /// or reuses the landing buffer it may occupy; then `true` is returned,
    /// and its completion is still reported once the receiver is done with
    /// the memory.
    pub fn cancel(&mut self, op: OpId) -> bool {
        let mut kept = false;
        for peer in 0..self.nprocs {
            let o = &mut self.out[peer as usize];
            let before = o.q.len();
            o.q.retain_mut(|item| match item {
                Out::Stream(s) => s.op != Some(op),
                Out::Rndv {
                    op: o,
                    pushed,
                    cancelled,
                    ..
                } => {
                    if *o != Some(op) {
                        return true;
                    }
                    if pushed.is_none() {
                        return false;
                    }
                    *cancelled = true;
                    kept = true;
                    true
                }
                Out::Raw { op: o, .. } => *o != op,
                Out::Copy { .. } => true,
            });
            if o.q.len() != before {
                o.bytes = o.q.iter().map(Out::len).sum();
                if o.q.is_empty() {
                    self.busy_peers -= 1;
                }
            }
        }
        // A split get's target may be writing into its destination until
        // its second answer: the memory is the caller's again only once
        // that can no longer happen (at most a deadline and its grace
        // after the post, about a second; cancelling is what a blocking
        // call does after its timeout).
        self.state
            .await_split_writers(|w| w.op == op, "cancelling a get");
        self.state.waiting.retain(|_, w| w.op != op);
        self.state.done.retain(|(o, _)| *o != op);
        kept
    }

    /// Runs the engine once with `regions` and `sink`.
    pub(super) fn progress_engine(&mut self, regions: &mut Regions, sink: &mut Sink<'_>) -> usize {
        let mut ctx = Ctx {
            st: &mut self.state,
            regions,
            sink,
        };
        let n = self.shm.get().engine.progress(&mut ctx);
        if !self.state.bulk_samples.is_empty() {
            self.record_bulk_samples();
        }
        n
    }

    #[cold]
    #[inline(never)]
    fn record_bulk_samples(&mut self) {
        for (peer, how, bytes, took) in std::mem::take(&mut self.state.bulk_samples) {
            let class = self.rate_class(bytes);
            self.rates[peer as usize][class].record(how, bytes, took);
        }
    }

    /// Bytes and messages queued to peers in user space.
    pub fn queued(&self) -> (u64, usize) {
        self.out
            .iter()
            .fold((0, 0), |(b, n), o| (b + o.bytes, n + o.q.len()))
    }
}
