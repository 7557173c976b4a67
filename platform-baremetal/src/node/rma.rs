//! One-sided get/put: the regions this node lends to peers (checked and
//! served here, answers parked until the peer's queue has room), and the
//! requests it has outstanding at peers (matched with their answers, or
//! failed with their peer).

use btl_core::tcp::endpoint::SendDecision;
use btl_core::tcp::wire::{
    FrameRepr, FrameType, RmaPacket, RmaRepr, FRAME_HEADER_LEN, RMA_HEADER_LEN,
};
use btl_core::warn;

use super::{ConfigError, Event, Node, RmaError, SendError};

/// Regions a node can register ([`Node::register`]).
pub const MAX_REGIONS: usize = 8;
/// Get/put requests a node can have outstanding at once.
pub const MAX_REQUESTS: usize = 16;

/// A registered region's key: send it to peers so they may get and put
/// (the one key type of every adapter, [`RegionKey::to_bytes`] on the wire).
pub use btl_core::rma::RegionKey;

/// An RMA answer to a peer, parked until its queue has room.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reply {
    kind: FrameType,
    id: u64,
    ok: bool,
    region: usize,
    offset: usize,
    len: usize,
}

/// A get or put of ours, waiting for the target's answer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Request {
    id: u64,
    pub(super) peer: u32,
    kind: FrameType,
    len: u64,
    pub(super) failed: bool,
}

impl<'a, const S: usize, const P: usize> Node<'a, S, P> {
    /// Makes `region` available to peers' get and put; send them the key.
    pub fn register(&mut self, region: &'a mut [u8]) -> Result<RegionKey, ConfigError> {
        let id = self.regions.len() as u32;
        let len = region.len() as u64;
        self.regions
            .push(region)
            .map_err(|_| ConfigError::TooManyRegions)?;
        Ok(RegionKey {
            rank: self.cfg.rank,
            id,
            len,
        })
    }

    /// The contents of one of our regions.
    pub fn region(&self, id: u32) -> Option<&[u8]> {
        self.regions.get(id as usize).map(|r| &r[..])
    }

    fn rma_request(
        &mut self,
        key: &RegionKey,
        kind: FrameType,
        offset: u64,
        len: u64,
        data: &[u8],
    ) -> Result<u64, SendError> {
        let peer = key.rank;
        self.check_peer(peer)?;
        if self.requests.is_full() {
            return Err(SendError::TooManyRequests);
        }
        let payload = RMA_HEADER_LEN + data.len();
        if payload > self.max_frame as usize || len > u64::from(self.max_frame) {
            return Err(SendError::TooLarge {
                len: payload.max(len as usize),
                max: self.max_frame as usize,
            });
        }
        if self.peers[peer as usize].out.free() < FRAME_HEADER_LEN + payload {
            return Err(SendError::QueueFull { peer });
        }
        self.next_request += 1;
        let id = self.next_request;
        let rma = RmaRepr {
            region: key.id,
            offset,
            len,
        }
        .to_bytes();
        let repr = FrameRepr {
            kind,
            tag: 0,
            error: false,
            len: payload as u32,
            id,
        };
        self.queue_frame(peer, repr, &[&rma, data])?;
        let _ = self.requests.push(Request {
            id,
            peer,
            kind,
            len,
            failed: false,
        });
        Ok(id)
    }

    /// Writes `data` at `offset` of the peer's region `key` (one frame: at
    /// most `max_frame - 24` bytes). Completes with [`Event::PutDone`].
    pub fn put(&mut self, key: &RegionKey, offset: u64, data: &[u8]) -> Result<u64, SendError> {
        self.rma_request(key, FrameType::Put, offset, data.len() as u64, data)
    }

    /// Reads `len` bytes (at most `max_frame`) at `offset` of the peer's
    /// region `key`. Completes with [`Event::GetDone`].
    pub fn get(&mut self, key: &RegionKey, offset: u64, len: u32) -> Result<u64, SendError> {
        self.rma_request(key, FrameType::Get, offset, u64::from(len), &[])
    }

    /// A PUT or GET from `peer`, checked against our regions, applied, and
    /// answered (or the answer parked until the queue has room).
    pub(super) fn serve_rma(&mut self, peer: u32, h: FrameRepr, base: usize, len: usize) {
        let pi = peer as usize;
        let payload = self.payload(peer, base, len);
        // The decoder validated the sub-header (and a PUT's length).
        let rma = payload
            .get(..RMA_HEADER_LEN)
            .and_then(|b| RmaRepr::parse(&RmaPacket::new_unchecked(b)).ok());
        let queue_cap = self.peers[pi].out.capacity();
        let target = rma.and_then(|r| {
            let region = self.regions.get(r.region as usize)?;
            let end = r.offset.checked_add(r.len)?;
            let fits = h.kind == FrameType::Put || (r.len as usize) + FRAME_HEADER_LEN <= queue_cap;
            (end <= region.len() as u64 && fits).then_some(r)
        });
        let mut reply = Reply {
            kind: if h.kind == FrameType::Put {
                FrameType::PutAck
            } else {
                FrameType::GetResp
            },
            id: h.id,
            ok: target.is_some(),
            region: 0,
            offset: 0,
            len: 0,
        };
        match target {
            Some(r) => {
                let (off, n) = (r.offset as usize, r.len as usize);
                if h.kind == FrameType::Put {
                    let src = &self.peers[pi].msg[base + RMA_HEADER_LEN..base + len];
                    self.regions[r.region as usize][off..off + n].copy_from_slice(src);
                } else {
                    reply.region = r.region as usize;
                    reply.offset = off;
                    reply.len = n;
                }
            }
            None => {
                warn!(
                    "btl-baremetal: refused a {} from {} outside our regions",
                    h.kind as u8, peer
                )
            }
        }
        self.peers[pi].reply = Some(reply);
        self.send_reply(peer);
    }

    /// Queues `peer`'s parked RMA answer if there is room.
    pub(super) fn send_reply(&mut self, peer: u32) {
        let pi = peer as usize;
        let Some(r) = self.peers[pi].reply else {
            return;
        };
        if self.peers[pi].out.free() < FRAME_HEADER_LEN + r.len {
            return;
        }
        self.peers[pi].reply = None;
        let repr = FrameRepr {
            kind: r.kind,
            tag: 0,
            error: !r.ok,
            len: r.len as u32,
            id: r.id,
        };
        let data: &[u8] = match self.regions.get(r.region) {
            Some(region) if r.len > 0 => &region[r.offset..r.offset + r.len],
            _ => &[],
        };
        // The frame bypasses `queue_frame`: borrowing the region and the
        // queue at once.
        let p = &mut self.peers[pi];
        match p.ep.on_send_request(self.now) {
            SendDecision::Refuse(_) => return,
            SendDecision::SendNow { conn } => p.out_conn = Some(conn),
            SendDecision::Queue => {}
            SendDecision::QueueAndConnect => p.want_connect = true,
        }
        let hdr = repr.to_bytes();
        let _ = p.out.push(&[&hdr, data]);
    }

    /// The answer (`h`, payload `msg[base..base + len]`) of `peer` to one
    /// of our requests.
    pub(super) fn on_rma_answer(
        &mut self,
        peer: u32,
        h: FrameRepr,
        base: usize,
        len: usize,
        on_event: &mut dyn FnMut(Event<'_>),
    ) {
        let Some(k) = self
            .requests
            .iter()
            .position(|r| r.id == h.id && r.peer == peer && !r.failed)
        else {
            warn!(
                "btl-baremetal: answer from {} to unknown request {}",
                peer, h.id
            );
            return;
        };
        let req = self.requests.swap_remove(k);
        let data = self.payload(peer, base, len);
        match (req.kind, h.kind) {
            (FrameType::Put, FrameType::PutAck) => on_event(Event::PutDone {
                request: req.id,
                peer,
                result: if h.error {
                    Err(RmaError::Refused)
                } else {
                    Ok(())
                },
            }),
            (FrameType::Get, FrameType::GetResp) => on_event(Event::GetDone {
                request: req.id,
                peer,
                result: if h.error {
                    Err(RmaError::Refused)
                } else if data.len() as u64 != req.len {
                    Err(RmaError::BadLength)
                } else {
                    Ok(data)
                },
            }),
            _ => {
                warn!(
                    "btl-baremetal: {} answered request {} with the wrong frame type",
                    peer, h.id
                );
                let result = Err(RmaError::BadLength);
                if req.kind == FrameType::Put {
                    on_event(Event::PutDone {
                        request: req.id,
                        peer,
                        result,
                    });
                } else {
                    on_event(Event::GetDone {
                        request: req.id,
                        peer,
                        result: Err(RmaError::BadLength),
                    });
                }
            }
        }
    }

    /// Reports the requests that failed with their target.
    pub(super) fn report_failed_requests(&mut self, on_event: &mut dyn FnMut(Event<'_>)) -> usize {
        let mut n = 0;
        while let Some(k) = self.requests.iter().position(|r| r.failed) {
            let req = self.requests.swap_remove(k);
            n += 1;
            if req.kind == FrameType::Put {
                on_event(Event::PutDone {
                    request: req.id,
                    peer: req.peer,
                    result: Err(RmaError::PeerFailed),
                });
            } else {
                on_event(Event::GetDone {
                    request: req.id,
                    peer: req.peer,
                    result: Err(RmaError::PeerFailed),
                });
            }
        }
        n
    }
}
