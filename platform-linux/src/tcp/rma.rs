//! One-sided get and put over TCP, never blocking: PUT/GET frames naming a
//! registered region, checked by the target, answered with a status (and,
//! for a get, the data). An operation larger than a frame is several
//! frames, each answered; it completes when every answer is in (with the
//! first refusal as its status). A put's data is written straight from the
//! caller's memory; a get's answer is read straight into it.
//!
//! # Safety
//!
//! Caller memory travels as [`RawBuf`] under that type's contract; the
//! `unsafe fn`s pass the contract on to their callers.
#![allow(unsafe_code)]

use btl_core::rma::RmaStatus;
use btl_core::tcp::wire::{FrameRepr, FrameType, RmaPacket, RmaRepr, RMA_HEADER_LEN};

use super::*;
use crate::ops::{PostError, Posted, RawBuf};

/// Answers to gets of at least this many bytes are written straight from
/// the pinned region (`serve_rma`); smaller ones are copied when the socket
/// does not take them at once (a copy that costs less than the pin's
/// bookkeeping, and leaves the region free to deregister at once).
pub(super) const PIN_ANSWER_MIN: u64 = 32 * 1024;

/// One of our PUT or GET frames, waiting for its answer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Wait {
    pub(super) peer: u32,
    pub(super) op: OpId,
    /// A get's destination for this frame's data (empty for a put).
    pub(super) dst: RawBuf,
}

/// An operation's frames still unanswered, and the first refusal.
#[derive(Clone, Copy, Debug)]
pub(super) struct OpState {
    pub(super) left: u32,
    pub(super) status: RmaStatus,
}

impl Tcp {
    /// Posts a put (`src` of ours to the peer) or a get (the peer's into
    /// `mem`), as frames of at most `max_frame` bytes, each answered.
    ///
    /// # Safety
    ///
    /// As [`Self::iput`] / [`Self::iget`].
    unsafe fn rma_post(
        &mut self,
        put: bool,
        peer: u32,
        id: u32,
        offset: u64,
        mem: RawBuf,
        op: OpId,
    ) -> Result<Posted, PostError> {
        if peer >= self.n || peer == self.me {
            return Err(PostError::InvalidPeer);
        }
        if self.peers[peer as usize].failed.is_some() {
            return Err(PostError::PeerFailed);
        }
        if mem.len() as u64 > MAX_MESSAGE {
            return Err(PostError::TooLarge { max: MAX_MESSAGE });
        }
        // The data is caller memory: only the frame count is bounded.
        let p = &self.peers[peer as usize];
        if !self.limits.admits(p.queued_bytes, p.queued_frames, 0) {
            return Err(PostError::WouldBlock);
        }
        let step = if put {
            (self.cfg.max_frame as usize - RMA_HEADER_LEN).max(1)
        } else {
            self.cfg.max_frame as usize
        };
        let frames = mem.len().div_ceil(step).max(1);
        self.rma_ops.insert(
            op,
            OpState {
                left: frames as u32,
                status: RmaStatus::Ok,
            },
        );
        let mut off = 0usize;
        for _ in 0..frames {
            let take = step.min(mem.len() - off);
            self.next_req += 1;
            let req = self.next_req;
            let part = mem.sub(off, take).unwrap_or_else(RawBuf::empty);
            let rma = RmaRepr {
                region: id,
                offset: offset + off as u64,
                len: take as u64,
            };
            let repr = FrameRepr {
                kind: if put { FrameType::Put } else { FrameType::Get },
                tag: 0,
                error: false,
                len: (RMA_HEADER_LEN + if put { take } else { 0 }) as u32,
                id: req,
            };
            let dst = if put { RawBuf::empty() } else { part };
            self.rma_wait.insert(req, Wait { peer, op, dst });
            let posted = if put {
                self.post_raw(peer, repr, &rma.to_bytes(), part, None)
            } else {
                self.post(peer, repr, &[&rma.to_bytes()], None)
            };
            if let Err(e) = posted {
                // Frames already posted are answered and ignored.
                self.cancel(op);
                return Err(e);
            }
            off += take;
        }
        Ok(Posted::Pending)
    }

    /// Writes `src` at `offset` of `peer`'s region `id`; completes with
    /// [`TEvent::Done`] for `op` once the target applied it (its refusal is
    /// the completion's status).
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
        // SAFETY: the caller's promise, passed on.
        unsafe { self.rma_post(true, peer, id, offset, src, op) }
    }

    /// Reads `dst.len()` bytes at `offset` of `peer`'s region `id` into
    /// `dst`; completes with [`TEvent::Done`] for `op` (the target's refusal
    /// is the completion's status).
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
        // SAFETY: the caller's promise, passed on.
        unsafe { self.rma_post(false, peer, id, offset, dst, op) }
    }

    /// A PUT or GET from `peer`: checked against our registered regions
    /// (unknown region or a range outside it is refused: the peer never
    /// writes or reads where it was not invited), then applied and answered.
    pub(super) fn serve_rma(
        &mut self,
        peer: u32,
        h: FrameRepr,
        payload: &[u8],
        regions: &mut Regions,
    ) {
        // The decoder validated the sub-header and, for PUT, that its length
        // matches the data.
        let parsed = payload
            .get(..RMA_HEADER_LEN)
            .ok_or(())
            .and_then(|b| RmaRepr::parse(&RmaPacket::new_unchecked(b)).map_err(|_| ()));
        let range = parsed
            .ok()
            .and_then(|r| regions.range_mut(r.region, r.offset, r.len).ok());
        // A get is answered straight from the region: `post` writes what
        // the socket takes at once from it and copies only the rest (no
        // copy of the whole range first: on a 1 MiB get that copy, into
        // fresh pages, was a fifth of the target's time); a large one
        // copies nothing (below).
        let (reply_kind, ok, data): (FrameType, bool, &[u8]) = match (h.kind, range) {
            (FrameType::Put, Some(dst)) => match payload.get(RMA_HEADER_LEN..) {
                Some(src) if src.len() == dst.len() => {
                    dst.copy_from_slice(src);
                    (FrameType::PutAck, true, &[])
                }
                _ => (FrameType::PutAck, false, &[]),
            },
            (FrameType::Get, Some(src)) => (FrameType::GetResp, true, src),
            (kind, None) => {
                log::warn!("tcp: refused a {kind:?} from {peer} outside our registered regions");
                let k = if kind == FrameType::Put {
                    FrameType::PutAck
                } else {
                    FrameType::GetResp
                };
                (k, false, &[])
            }
            _ => return,
        };
        let reply = FrameRepr {
            kind: reply_kind,
            tag: 0,
            error: !ok,
            len: data.len() as u32,
            id: h.id,
        };
        // Answers are never refused for queue bounds: they are bounded by
        // the peer's own requests.
        let posted = match parsed {
            // A large answer waits, if the socket does not take it at once,
            // as a reference into the region, pinned until it is written or
            // abandoned (with a window of gets in flight the socket is full,
            // and nearly every answer used to be copied whole into fresh
            // memory).
            Ok(r) if ok && reply_kind == FrameType::GetResp && r.len >= PIN_ANSWER_MIN => {
                let src = RawBuf::new(data);
                regions.pin(r.region);
                self.post_pinned_answer(peer, reply, src, r.region)
                    .inspect_err(|_| regions.unpin(r.region))
            }
            _ => self.post(peer, reply, &[data], None),
        };
        if let Err(e) = posted {
            log::warn!("tcp: cannot answer {peer}'s request: {e}");
        }
    }

    /// The answer to one of our frames. `into` is where a get's data went
    /// already (read straight into the destination) and how much of it.
    pub(super) fn on_rma_answer(
        &mut self,
        peer: u32,
        h: FrameRepr,
        payload: &[u8],
        into: Option<(RawBuf, usize)>,
    ) {
        let Some(w) = self.rma_wait.get(&h.id).copied().filter(|w| w.peer == peer) else {
            log::warn!("tcp: {:?} from {peer} for unknown request {}", h.kind, h.id);
            return;
        };
        self.rma_wait.remove(&h.id);
        let status = match (h.kind, h.error) {
            (_, true) => RmaStatus::OutOfBounds,
            (FrameType::GetResp, false) => match into {
                Some((_, got)) if got == w.dst.len() => RmaStatus::Ok,
                Some(_) => RmaStatus::CopyFailed,
                None if payload.len() == w.dst.len() => {
                    // SAFETY: the get's local memory, valid and ours until
                    // the get completes (RawBuf's contract).
                    unsafe { w.dst.as_mut_slice() }.copy_from_slice(payload);
                    RmaStatus::Ok
                }
                None => {
                    log::error!(
                        "tcp: rank {peer} answered a get of {} bytes with {}",
                        w.dst.len(),
                        payload.len()
                    );
                    RmaStatus::CopyFailed
                }
            },
            _ => RmaStatus::Ok,
        };
        let Some(st) = self.rma_ops.get_mut(&w.op) else {
            return;
        };
        st.left = st.left.saturating_sub(1);
        if st.status == RmaStatus::Ok {
            st.status = status;
        }
        if st.left == 0 {
            let status = st.status;
            self.rma_ops.remove(&w.op);
            self.done.push((
                w.op,
                match status {
                    RmaStatus::Ok => Ok(()),
                    s => Err(OpError::Refused(s)),
                },
            ));
        }
    }

    /// Completes `peer`'s unanswered operations with its failure.
    pub(super) fn fail_rma_of(&mut self, peer: u32) {
        let ops: Vec<OpId> = self
            .rma_wait
            .values()
            .filter(|w| w.peer == peer)
            .map(|w| w.op)
            .collect();
        self.rma_wait.retain(|_, w| w.peer != peer);
        for op in ops {
            if self.rma_ops.remove(&op).is_some() {
                self.done.push((op, Err(OpError::PeerFailed { peer })));
            }
        }
    }
}
