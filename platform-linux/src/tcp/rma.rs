//! One-sided get and put over TCP: PUT/GET frames naming a registered
//! region, checked by the target, answered with a status (and the data).

use std::collections::HashMap;

use btl_core::rma::{RegionKey, RmaStatus};
use btl_core::tcp::wire::{FrameRepr, FrameType, RmaPacket, RmaRepr, RMA_HEADER_LEN};

use super::*;

impl Tcp {
    /// A PUT or GET from `peer`: checked against our registered regions
    /// (unknown region or a range outside it is refused: the peer never
    /// writes or reads where it was not invited), then applied and answered.
    pub(super) fn serve_rma(&mut self, peer: u32, h: FrameRepr, payload: &[u8]) {
        // The decoder validated the sub-header and, for PUT, that its length
        // matches the data.
        let parsed = payload
            .get(..RMA_HEADER_LEN)
            .ok_or(())
            .and_then(|b| RmaRepr::parse(&RmaPacket::new_unchecked(b)).map_err(|_| ()));
        let range = parsed.ok().and_then(|r| {
            let region = self.regions.get_mut(&r.region)?;
            let end = r.offset.checked_add(r.len)?;
            (end <= region.len() as u64).then_some((r, region))
        });
        let (reply_kind, ok, data): (FrameType, bool, Vec<u8>) = match (h.kind, range) {
            (FrameType::Put, Some((r, region))) => {
                region[r.offset as usize..(r.offset + r.len) as usize]
                    .copy_from_slice(&payload[RMA_HEADER_LEN..]);
                (FrameType::PutAck, true, Vec::new())
            }
            (FrameType::Get, Some((r, region))) => (
                FrameType::GetResp,
                true,
                region[r.offset as usize..(r.offset + r.len) as usize].to_vec(),
            ),
            (kind, None) => {
                log::warn!("tcp: refused a {kind:?} from {peer} outside our registered regions");
                let k = if kind == FrameType::Put {
                    FrameType::PutAck
                } else {
                    FrameType::GetResp
                };
                (k, false, Vec::new())
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
        if let Err(e) = self.send_repr(peer, reply, &data) {
            log::warn!("tcp: cannot answer {peer}'s request: {e}");
        }
    }

    /// Registers a zeroed region of `len` bytes peers may get from and put
    /// into; send its key to them (as for shared memory).
    pub fn register(&mut self, len: usize) -> RegionKey {
        let id = self.next_region;
        self.next_region += 1;
        self.regions.insert(id, vec![0u8; len].into_boxed_slice());
        RegionKey {
            rank: self.me,
            id,
            len: len as u64,
        }
    }

    /// The table of our registered regions (the job API lends one table
    /// to both transports).
    pub(crate) fn regions_mut(&mut self) -> &mut HashMap<u32, Box<[u8]>> {
        &mut self.regions
    }

    /// The contents of one of our regions.
    pub fn region(&self, key: &RegionKey) -> Option<&[u8]> {
        (key.rank == self.me).then_some(())?;
        self.regions.get(&key.id).map(|r| &r[..])
    }

    /// Sends one RMA request frame and waits for its answer.
    pub(super) fn rma_request(
        &mut self,
        peer: u32,
        kind: FrameType,
        rma: RmaRepr,
        data: &[u8],
    ) -> Result<Vec<u8>, TcpError> {
        self.next_req += 1;
        let id = self.next_req;
        self.rma_wait.insert(id, (peer, None, Vec::new()));
        let mut body = Vec::with_capacity(RMA_HEADER_LEN + data.len());
        body.extend_from_slice(&rma.to_bytes());
        body.extend_from_slice(data);
        let repr = FrameRepr {
            kind,
            tag: 0,
            error: false,
            len: body.len() as u32,
            id,
        };
        let sent = self.send_repr(peer, repr, &body).and_then(|()| {
            self.wait_until("a get/put answer", Some(peer), |t| {
                t.rma_wait.get(&id).is_some_and(|w| w.1.is_some())
            })
        });
        let (_, status, data) = self
            .rma_wait
            .remove(&id)
            .unwrap_or((peer, None, Vec::new()));
        sent?;
        match status {
            Some(RmaStatus::Ok) => Ok(data),
            Some(status) => Err(TcpError::Rma { peer, status }),
            None => Err(TcpError::PeerFailed {
                peer,
                why: "no answer to a get/put".into(),
            }),
        }
    }

    /// Writes `src` at `offset` of the peer's region `key`; returns once the
    /// peer applied it. A range outside the region is refused by the peer.
    pub fn put(&mut self, key: &RegionKey, offset: u64, src: &[u8]) -> Result<(), TcpError> {
        let step = (self.cfg.max_frame as usize - RMA_HEADER_LEN).max(1);
        let mut done = 0usize;
        loop {
            let end = (done + step).min(src.len());
            let rma = RmaRepr {
                region: key.id,
                offset: offset + done as u64,
                len: (end - done) as u64,
            };
            self.rma_request(key.rank, FrameType::Put, rma, &src[done..end])?;
            done = end;
            if done >= src.len() {
                return Ok(());
            }
        }
    }

    /// Reads `dst.len()` bytes at `offset` of the peer's region `key`.
    pub fn get(&mut self, key: &RegionKey, offset: u64, dst: &mut [u8]) -> Result<(), TcpError> {
        let step = self.cfg.max_frame as usize;
        let mut done = 0usize;
        loop {
            let end = (done + step).min(dst.len());
            let rma = RmaRepr {
                region: key.id,
                offset: offset + done as u64,
                len: (end - done) as u64,
            };
            let data = self.rma_request(key.rank, FrameType::Get, rma, &[])?;
            if data.len() != end - done {
                return Err(TcpError::PeerFailed {
                    peer: key.rank,
                    why: "answered a get with the wrong length".into(),
                });
            }
            dst[done..end].copy_from_slice(&data);
            done = end;
            if done >= dst.len() {
                return Ok(());
            }
        }
    }
}
