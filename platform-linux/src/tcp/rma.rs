//! One-sided get and put over TCP, never blocking: PUT/GET frames naming a
//! registered region, checked by the target, answered with a status (and,
//! for a get, the data). An operation larger than a frame is several
//! frames, each answered; it completes when every answer is in (with the
//! first refusal as its status). A put's data is written straight from the
//! caller's memory; a get's answer is read straight into it.
//!
//! This file owns the one-sided operations' state, [`Rma`]: our frames
//! waiting for their answer ([`Wait`], by request id), our operations'
//! bookkeeping ([`OpState`]) and the request ids; and the target side's
//! decision on a peer's request ([`answer`]). It writes nothing: the
//! transport (`Tcp`, in `mod.rs`) posts the frames it describes and hands
//! it the answers, with the completions list to fill.
//!
//! # Safety
//!
//! Caller memory travels as [`RawBuf`] under that type's contract; a get's
//! answer is copied into it only while the get is waiting (registered and
//! neither completed nor cancelled).
#![allow(unsafe_code)]

use btl_core::rma::RmaStatus;
use btl_core::tcp::wire::{FrameRepr, FrameType, RmaPacket, RmaRepr, RMA_HEADER_LEN};

use crate::idmap::IdMap;
use crate::ops::{OpError, OpId, RawBuf};
use crate::regions::Regions;

/// Answers to gets of at least this many bytes are written straight from
/// the pinned region (`serve_rma`); smaller ones are copied when the socket
/// does not take them at once (a copy that costs less than the pin's
/// bookkeeping, and leaves the region free to deregister at once).
pub(super) const PIN_ANSWER_MIN: u64 = 32 * 1024;

/// Completions to report at the end of a pass (the transport's list).
pub(super) type Done = Vec<(OpId, Result<(), OpError>)>;

/// One of our PUT or GET frames, waiting for its answer.
#[derive(Clone, Copy, Debug)]
struct Wait {
    peer: u32,
    op: OpId,
    /// A get's destination for this frame's data (empty for a put).
    dst: RawBuf,
}

/// An operation's frames still unanswered, and the first refusal.
#[derive(Clone, Copy, Debug)]
struct OpState {
    left: u32,
    status: RmaStatus,
}

/// Our one-sided operations in flight: their frames waiting for answers
/// and the state of each operation.
#[derive(Debug, Default)]
pub(super) struct Rma {
    /// The last request id given out.
    next_req: u64,
    /// Our get/put frames waiting for their answer, by request id.
    wait: IdMap<u64, Wait>,
    /// Our get/put operations: frames still unanswered and the first
    /// refusal.
    ops: IdMap<OpId, OpState>,
}

impl Rma {
    /// Whether no frame of ours waits for an answer.
    #[inline]
    pub(super) fn nothing_waits(&self) -> bool {
        self.wait.is_empty()
    }

    /// Whether no frame waits and no operation is open.
    pub(super) fn is_idle(&self) -> bool {
        self.wait.is_empty() && self.ops.is_empty()
    }

    /// Opens operation `op`, of `frames` frames.
    pub(super) fn begin(&mut self, op: OpId, frames: u32) {
        self.ops.insert(
            op,
            OpState {
                left: frames,
                status: RmaStatus::Ok,
            },
        );
    }

    /// Registers one frame of `op` to `peer` (a get's: with where its data
    /// goes); returns the frame's request id.
    pub(super) fn wait_for(&mut self, peer: u32, op: OpId, dst: RawBuf) -> u64 {
        self.next_req += 1;
        let req = self.next_req;
        self.wait.insert(req, Wait { peer, op, dst });
        req
    }

    /// Where the data of `peer`'s answer `id` of `len` bytes may be read
    /// straight to: the waiting get's destination, if the answer fills it.
    #[inline]
    pub(super) fn answer_dst(&self, id: u64, peer: Option<u32>, len: usize) -> Option<RawBuf> {
        let w = self.wait.get(&id)?;
        (Some(w.peer) == peer && w.dst.len() == len).then_some(w.dst)
    }

    /// The answer to one of our frames. `into` is where a get's data went
    /// already (read straight into the destination) and how much of it.
    /// An operation whose last answer this is completes into `done`.
    pub(super) fn on_answer(
        &mut self,
        peer: u32,
        h: FrameRepr,
        payload: &[u8],
        into: Option<(RawBuf, usize)>,
        done: &mut Done,
    ) {
        let Some(w) = self.wait.get(&h.id).copied().filter(|w| w.peer == peer) else {
            log::warn!("tcp: {:?} from {peer} for unknown request {}", h.kind, h.id);
            return;
        };
        self.wait.remove(&h.id);
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
        let Some(st) = self.ops.get_mut(&w.op) else {
            return;
        };
        st.left = st.left.saturating_sub(1);
        if st.status == RmaStatus::Ok {
            st.status = status;
        }
        if st.left == 0 {
            let status = st.status;
            self.ops.remove(&w.op);
            done.push((
                w.op,
                match status {
                    RmaStatus::Ok => Ok(()),
                    s => Err(OpError::Refused(s)),
                },
            ));
        }
    }

    /// Completes `peer`'s unanswered operations with its failure, into
    /// `done`.
    pub(super) fn fail_peer(&mut self, peer: u32, done: &mut Done) {
        let ops: Vec<OpId> = self
            .wait
            .values()
            .filter(|w| w.peer == peer)
            .map(|w| w.op)
            .collect();
        self.wait.retain(|_, w| w.peer != peer);
        for op in ops {
            if self.ops.remove(&op).is_some() {
                done.push((op, Err(OpError::PeerFailed { peer })));
            }
        }
    }

    /// Forgets operation `op`: answers to it are ignored.
    pub(super) fn cancel(&mut self, op: OpId) {
        self.wait.retain(|_, w| w.op != op);
        self.ops.remove(&op);
    }
}

/// The target side's answer to a PUT or GET: the frame to send, its data,
/// and the region to pin while the data waits (a large get's).
pub(super) struct Answer<'a> {
    pub(super) reply: FrameRepr,
    pub(super) data: &'a [u8],
    pub(super) pin: Option<u32>,
}

/// A PUT or GET from `peer`: checked against our registered regions
/// (unknown region or a range outside it is refused: the peer never
/// writes or reads where it was not invited), a put applied; returns the
/// answer to post (none for another kind of frame).
pub(super) fn answer<'a>(
    peer: u32,
    h: FrameRepr,
    payload: &[u8],
    regions: &'a mut Regions,
) -> Option<Answer<'a>> {
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
        _ => return None,
    };
    let reply = FrameRepr {
        kind: reply_kind,
        tag: 0,
        error: !ok,
        len: data.len() as u32,
        id: h.id,
    };
    // A large answer waits, if the socket does not take it at once, as a
    // reference into the region, pinned until it is written or abandoned
    // (with a window of gets in flight the socket is full, and nearly
    // every answer used to be copied whole into fresh memory).
    let pin = match parsed {
        Ok(r) if ok && reply_kind == FrameType::GetResp && r.len >= PIN_ANSWER_MIN => {
            Some(r.region)
        }
        _ => None,
    };
    Some(Answer { reply, data, pin })
}
