//! One-sided get and put between registered regions, over the shared-memory
//! transport's messages (internal tags 248–252).
//!
//! A region is memory the transport owns ([`super::Sm::register`]); its
//! [`RegionKey`] (rank, id, length) is what a peer needs to address it and
//! can be sent in any message. The target validates every request against
//! its own table of regions — unknown id, or a range outside the region, is
//! refused with a status — so a peer never reads or writes where it was not
//! invited.
//!
//! - get: the requester sends (request, region, offset, length, its
//!   destination address); the target writes the data straight into the
//!   requester with `process_vm_writev` when single copy works between them,
//!   otherwise sends it back in fragments; then a reply with the status.
//! - put: with single copy, the requester sends its source address and the
//!   target reads it with `process_vm_readv`; otherwise the data goes in
//!   fragments, each checked and copied into the region on arrival; then a
//!   reply with the status.
//!
//! `get`/`put` block until the reply (with liveness checks and the
//! transport's timeout).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use super::{Sm, SmError};
use crate::cma;
use crate::sm::rma;

pub use btl_core::rma::{RegionKey, RmaStatus};
pub(super) use btl_core::tags::{
    SM_GET_DATA as TAG_GET_DATA, SM_GET_REQ as TAG_GET_REQ, SM_PUT_CMA as TAG_PUT_CMA,
    SM_PUT_DATA as TAG_PUT_DATA, SM_RMA_REPLY as TAG_RMA_REPLY,
};

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A request naming a range of a region plus an address in the requester
/// (GET_REQ: destination; PUT_CMA: source). 36 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RangeReq {
    pub req: u64,
    pub id: u32,
    pub offset: u64,
    pub len: u64,
    pub addr: u64,
}

impl RangeReq {
    pub const LEN: usize = 36;
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0; Self::LEN];
        b[0..8].copy_from_slice(&self.req.to_le_bytes());
        b[8..12].copy_from_slice(&self.id.to_le_bytes());
        b[12..20].copy_from_slice(&self.offset.to_le_bytes());
        b[20..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..36].copy_from_slice(&self.addr.to_le_bytes());
        b
    }
    pub fn decode(b: &[u8]) -> Option<Self> {
        (b.len() == Self::LEN).then_some(())?;
        Some(Self {
            req: u64_at(b, 0)?,
            id: u32_at(b, 8)?,
            offset: u64_at(b, 12)?,
            len: u64_at(b, 20)?,
            addr: u64_at(b, 28)?,
        })
    }
}

/// Header of a PUT_DATA chunk (then the data). 36 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PutChunk {
    pub req: u64,
    pub id: u32,
    pub offset: u64,
    pub total: u64,
    pub chunk_off: u64,
}

impl PutChunk {
    pub const LEN: usize = 36;
    pub fn encode(&self) -> [u8; Self::LEN] {
        RangeReq {
            req: self.req,
            id: self.id,
            offset: self.offset,
            len: self.total,
            addr: self.chunk_off,
        }
        .encode()
    }
    pub fn decode(b: &[u8]) -> Option<Self> {
        let r = RangeReq::decode(b.get(..Self::LEN)?)?;
        Some(Self {
            req: r.req,
            id: r.id,
            offset: r.offset,
            total: r.len,
            chunk_off: r.addr,
        })
    }
}

/// Reply: request and status. 12 bytes.
pub(super) fn encode_reply(req: u64, status: RmaStatus) -> [u8; 12] {
    let mut b = [0; 12];
    b[0..8].copy_from_slice(&req.to_le_bytes());
    b[8..12].copy_from_slice(&status.code().to_le_bytes());
    b
}

pub(super) fn decode_reply(b: &[u8]) -> Option<(u64, RmaStatus)> {
    (b.len() == 12).then_some(())?;
    Some((u64_at(b, 0)?, RmaStatus::from_code(u32_at(b, 8)?)))
}

/// Header of a GET_DATA chunk: request and offset within it. 16 bytes.
pub(super) fn encode_get_data(req: u64, off: u64) -> [u8; 16] {
    let mut b = [0; 16];
    b[0..8].copy_from_slice(&req.to_le_bytes());
    b[8..16].copy_from_slice(&off.to_le_bytes());
    b
}

/// Work the progress engine's callbacks leave for `Sm::progress` (which may
/// send; the callbacks may not).
#[derive(Debug)]
pub(super) enum Outgoing {
    /// Send a status reply.
    Reply {
        peer: u32,
        req: u64,
        status: RmaStatus,
    },
    /// Serve a validated get: copy `len` bytes of region `id` from `offset`
    /// to the requester.
    Serve { peer: u32, get: RangeReq },
}

/// A get or put of ours waiting for its reply.
#[derive(Debug, Default)]
pub(super) struct Wait {
    pub peer: u32,
    pub status: Option<RmaStatus>,
    /// Data of a get that came back in fragments.
    pub buf: Vec<u8>,
    pub got: u64,
}

/// Incoming fragmented put being applied.
#[derive(Debug)]
pub(super) struct PutIn {
    pub(super) received: u64,
    pub(super) failed: bool,
}

/// The RMA side of the transport's callback state.
#[derive(Debug, Default)]
pub(super) struct Rma {
    pub regions: HashMap<u32, Box<[u8]>>,
    pub next_region: u32,
    pub next_req: u64,
    pub outbox: VecDeque<Outgoing>,
    pub waiting: HashMap<u64, Wait>,
    pub(super) puts_in: HashMap<(u32, u64), PutIn>,
}

impl Rma {
    /// Checks `[offset, offset + len)` of region `id`.
    pub fn check(&self, id: u32, offset: u64, len: u64) -> Result<(), RmaStatus> {
        let region = self.regions.get(&id).ok_or(RmaStatus::UnknownRegion)?;
        match offset.checked_add(len) {
            Some(end) if end <= region.len() as u64 => Ok(()),
            _ => Err(RmaStatus::OutOfBounds),
        }
    }

    /// The bytes `[offset, offset + len)` of region `id`, checked.
    pub fn range_mut(&mut self, id: u32, offset: u64, len: u64) -> Result<&mut [u8], RmaStatus> {
        self.check(id, offset, len)?;
        let region = self.regions.get_mut(&id).ok_or(RmaStatus::UnknownRegion)?;
        Ok(&mut region[offset as usize..(offset + len) as usize])
    }

    /// A GET_REQ arrived from `peer`.
    pub fn on_get_req(&mut self, peer: u32, payload: &[u8]) -> bool {
        let Some(get) = RangeReq::decode(payload) else {
            log::error!("malformed get request from local rank {peer}");
            return false;
        };
        match self.check(get.id, get.offset, get.len) {
            Ok(()) => self.outbox.push_back(Outgoing::Serve { peer, get }),
            Err(status) => {
                log::warn!(
                    "local rank {peer} asked to get {}+{} of region {}: {status}",
                    get.offset,
                    get.len,
                    get.id
                );
                self.outbox.push_back(Outgoing::Reply {
                    peer,
                    req: get.req,
                    status,
                });
            }
        }
        true
    }

    /// A PUT_DATA chunk (header + data) arrived from `peer`.
    pub fn on_put_data(
        &mut self,
        peer: u32,
        header: &[u8],
        data_len: u64,
        copy: impl FnOnce(&mut [u8]) -> bool,
    ) -> bool {
        let Some(c) = PutChunk::decode(header) else {
            log::error!("malformed put from local rank {peer}");
            return false;
        };
        let key = (peer, c.req);
        let entry = self.puts_in.entry(key).or_insert(PutIn {
            received: 0,
            failed: false,
        });
        if entry.failed {
            return true;
        }
        let end = c.chunk_off.checked_add(data_len);
        let status = if end.is_none_or(|e| e > c.total) {
            Err(RmaStatus::OutOfBounds)
        } else {
            self.check(c.id, c.offset, c.total)
        };
        let status = status.and_then(|()| {
            let dst = self.range_mut(c.id, c.offset + c.chunk_off, data_len)?;
            if copy(dst) {
                Ok(())
            } else {
                Err(RmaStatus::CopyFailed)
            }
        });
        let entry = self.puts_in.get_mut(&key).map(|e| {
            e.received += data_len;
            e.received
        });
        match status {
            Err(status) => {
                log::warn!("local rank {peer} put into region {}: {status}", c.id);
                if let Some(e) = self.puts_in.get_mut(&key) {
                    e.failed = true;
                }
                self.outbox.push_back(Outgoing::Reply {
                    peer,
                    req: c.req,
                    status,
                });
            }
            Ok(()) if entry == Some(c.total) => {
                self.puts_in.remove(&key);
                self.outbox.push_back(Outgoing::Reply {
                    peer,
                    req: c.req,
                    status: RmaStatus::Ok,
                });
            }
            Ok(()) => {}
        }
        true
    }

    /// A status reply to one of our requests arrived.
    pub fn on_reply(&mut self, peer: u32, payload: &[u8]) -> bool {
        let Some((req, status)) = decode_reply(payload) else {
            log::error!("malformed RMA reply from local rank {peer}");
            return false;
        };
        match self.waiting.get_mut(&req) {
            Some(w) if w.peer == peer => {
                w.status = Some(status);
                // A failed put's later chunks are dropped at the target.
                self.puts_in.retain(|&(p, r), _| !(p == peer && r == req));
                true
            }
            _ => {
                log::warn!("RMA reply from local rank {peer} for unknown request {req}");
                false
            }
        }
    }

    /// Data of one of our gets arrived (header already split off).
    pub fn on_get_data(
        &mut self,
        peer: u32,
        header: &[u8],
        data_len: u64,
        copy: impl FnOnce(&mut [u8]) -> bool,
    ) -> bool {
        let (Some(req), Some(off)) = (u64_at(header, 0), u64_at(header, 8)) else {
            return false;
        };
        let Some(w) = self.waiting.get_mut(&req).filter(|w| w.peer == peer) else {
            log::warn!("get data from local rank {peer} for unknown request {req}");
            return false;
        };
        let Some(end) = off
            .checked_add(data_len)
            .filter(|&e| e <= w.buf.len() as u64)
        else {
            log::error!("get data from local rank {peer} outside the request");
            return false;
        };
        if !copy(&mut w.buf[off as usize..end as usize]) {
            return false;
        }
        w.got += data_len;
        true
    }
}

impl Sm {
    /// Carries out RMA work queued by the callbacks (replies, gets to serve).
    /// Errors towards a failed peer are logged and dropped.
    pub(super) fn serve(&mut self, work: Outgoing) {
        let (peer, result) = match work {
            Outgoing::Reply { peer, req, status } => {
                let reply = rma::encode_reply(req, status);
                (
                    peer,
                    self.send_fragment(peer, rma::TAG_RMA_REPLY, &[&reply], 0),
                )
            }
            Outgoing::Serve { peer, get } => (peer, self.serve_get(peer, get)),
        };
        if let Err(e) = result {
            log::warn!("RMA reply to local rank {peer} not sent: {e}");
        }
    }

    pub(super) fn serve_get(&mut self, peer: u32, get: RangeReq) -> Result<(), SmError> {
        let status = if get.addr != 0 {
            // Single copy straight into the requester.
            let pid = self.state.pids[peer as usize] as u32;
            let data = self.state.rma.range_mut(get.id, get.offset, get.len);
            match data.map(|d| cma::write_remote(pid, get.addr as usize, d)) {
                Ok(Ok(())) => RmaStatus::Ok,
                Ok(Err(e)) => {
                    log::warn!("single-copy get for local rank {peer} failed: {e}");
                    RmaStatus::CopyFailed
                }
                Err(status) => status,
            }
        } else {
            let chunk = self.engine.max_payload() as usize - 16;
            let mut tmp = Vec::with_capacity(chunk.min(get.len as usize));
            let mut off = 0u64;
            let mut status = RmaStatus::Ok;
            while off < get.len {
                let len = (get.len - off).min(chunk as u64);
                tmp.clear();
                match self.state.rma.range_mut(get.id, get.offset + off, len) {
                    Ok(d) => tmp.extend_from_slice(d),
                    // Deregistered meanwhile.
                    Err(s) => {
                        status = s;
                        break;
                    }
                }
                let hdr = rma::encode_get_data(get.req, off);
                self.send_fragment(peer, rma::TAG_GET_DATA, &[&hdr, &tmp], 0)?;
                off += len;
            }
            status
        };
        let reply = rma::encode_reply(get.req, status);
        self.send_fragment(peer, rma::TAG_RMA_REPLY, &[&reply], 0)
    }

    /// Registers a zeroed region of `len` bytes that peers may get from and
    /// put into; send its key to them.
    pub fn register(&mut self, len: usize) -> RegionKey {
        let rma = &mut self.state.rma;
        let id = rma.next_region;
        rma.next_region += 1;
        rma.regions.insert(id, vec![0u8; len].into_boxed_slice());
        RegionKey {
            rank: self.me,
            id,
            len: len as u64,
        }
    }

    /// The table of our registered regions (the job API lends one table
    /// to both transports).
    pub(crate) fn regions_mut(&mut self) -> &mut HashMap<u32, Box<[u8]>> {
        &mut self.state.rma.regions
    }

    /// The contents of one of our regions.
    pub fn region(&self, key: &RegionKey) -> Option<&[u8]> {
        (key.rank == self.me).then_some(())?;
        self.state.rma.regions.get(&key.id).map(|r| &r[..])
    }

    /// The contents of one of our regions, writable.
    pub fn region_mut(&mut self, key: &RegionKey) -> Option<&mut [u8]> {
        (key.rank == self.me).then_some(())?;
        self.state.rma.regions.get_mut(&key.id).map(|r| &mut r[..])
    }

    /// Removes one of our regions; later requests for it are refused.
    pub fn deregister(&mut self, key: &RegionKey) -> bool {
        key.rank == self.me && self.state.rma.regions.remove(&key.id).is_some()
    }

    pub(super) fn new_request(&mut self, peer: u32, buf_len: usize) -> u64 {
        let rma = &mut self.state.rma;
        rma.next_req += 1;
        let req = rma.next_req;
        rma.waiting.insert(
            req,
            rma::Wait {
                peer,
                status: None,
                buf: vec![0; buf_len],
                got: 0,
            },
        );
        req
    }

    pub(super) fn wait_reply(
        &mut self,
        peer: u32,
        req: u64,
        what: &'static str,
    ) -> Result<rma::Wait, SmError> {
        let r = self.wait_until(what, Some(peer), |sm| {
            sm.state
                .rma
                .waiting
                .get(&req)
                .is_some_and(|w| w.status.is_some())
        });
        let w = self.state.rma.waiting.remove(&req);
        r?;
        w.ok_or(SmError::Timeout {
            what,
            waited: Duration::ZERO,
        })
    }

    /// Copies `dst.len()` bytes at `offset` of the region `key` (of another
    /// local rank, or our own) into `dst`. Blocks until done.
    pub fn get(&mut self, key: &RegionKey, offset: u64, dst: &mut [u8]) -> Result<(), SmError> {
        let peer = key.rank;
        if peer == self.me {
            let src = self
                .state
                .rma
                .range_mut(key.id, offset, dst.len() as u64)
                .map_err(|status| SmError::Rma { peer, status })?;
            dst.copy_from_slice(src);
            return Ok(());
        }
        self.check_peer(peer)?;
        let mut single = self.state.cma_ok[peer as usize]
            && dst.len() as u64 >= u64::from(self.params.min_rdma_pipeline_size);
        loop {
            let req = self.new_request(peer, if single { 0 } else { dst.len() });
            let msg = RangeReq {
                req,
                id: key.id,
                offset,
                len: dst.len() as u64,
                addr: if single { dst.as_mut_ptr() as u64 } else { 0 },
            }
            .encode();
            if let Err(e) = self.send_fragment(peer, rma::TAG_GET_REQ, &[&msg], 0) {
                self.state.rma.waiting.remove(&req);
                return Err(e);
            }
            let w = self.wait_reply(peer, req, "a get's reply")?;
            match w.status {
                Some(RmaStatus::Ok) if single => return Ok(()),
                Some(RmaStatus::Ok) if w.got == dst.len() as u64 => {
                    dst.copy_from_slice(&w.buf);
                    return Ok(());
                }
                Some(RmaStatus::Ok) => {
                    return Err(SmError::Rma {
                        peer,
                        status: RmaStatus::CopyFailed,
                    })
                }
                Some(RmaStatus::CopyFailed) if single => {
                    self.state.cma_ok[peer as usize] = false;
                    single = false;
                }
                Some(status) => return Err(SmError::Rma { peer, status }),
                None => return Err(SmError::PeerFailed { peer }),
            }
        }
    }

    /// Copies `src` to `offset` of the region `key` (of another local rank,
    /// or our own). Blocks until the target has applied it.
    pub fn put(&mut self, key: &RegionKey, offset: u64, src: &[u8]) -> Result<(), SmError> {
        let peer = key.rank;
        if peer == self.me {
            let dst = self
                .state
                .rma
                .range_mut(key.id, offset, src.len() as u64)
                .map_err(|status| SmError::Rma { peer, status })?;
            dst.copy_from_slice(src);
            return Ok(());
        }
        self.check_peer(peer)?;
        if self.state.cma_ok[peer as usize]
            && src.len() as u64 >= u64::from(self.params.min_rdma_pipeline_size)
        {
            let req = self.new_request(peer, 0);
            let msg = RangeReq {
                req,
                id: key.id,
                offset,
                len: src.len() as u64,
                addr: src.as_ptr() as u64,
            }
            .encode();
            if let Err(e) = self.send_fragment(peer, rma::TAG_PUT_CMA, &[&msg], 0) {
                self.state.rma.waiting.remove(&req);
                return Err(e);
            }
            match self.wait_reply(peer, req, "a put's reply")?.status {
                Some(RmaStatus::Ok) => return Ok(()),
                Some(RmaStatus::CopyFailed) => self.state.cma_ok[peer as usize] = false,
                Some(status) => return Err(SmError::Rma { peer, status }),
                None => return Err(SmError::PeerFailed { peer }),
            }
        }
        let req = self.new_request(peer, 0);
        let chunk = self.engine.max_payload() as usize - rma::PutChunk::LEN;
        let mut off = 0usize;
        loop {
            let end = (off + chunk).min(src.len());
            let hdr = rma::PutChunk {
                req,
                id: key.id,
                offset,
                total: src.len() as u64,
                chunk_off: off as u64,
            }
            .encode();
            if let Err(e) = self.send_fragment(peer, rma::TAG_PUT_DATA, &[&hdr, &src[off..end]], 0)
            {
                self.state.rma.waiting.remove(&req);
                return Err(e);
            }
            off = end;
            // Stop early if the target already refused the put.
            if off >= src.len()
                || self
                    .state
                    .rma
                    .waiting
                    .get(&req)
                    .is_some_and(|w| w.status.is_some())
            {
                break;
            }
        }
        match self.wait_reply(peer, req, "a put's reply")?.status {
            Some(RmaStatus::Ok) => Ok(()),
            Some(status) => Err(SmError::Rma { peer, status }),
            None => Err(SmError::PeerFailed { peer }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn encodings_roundtrip() {
        let k = RegionKey {
            rank: 3,
            id: 9,
            len: 1 << 40,
        };
        assert_eq!(RegionKey::from_bytes(&k.to_bytes()), Some(k));
        assert_eq!(RegionKey::from_bytes(&[0; 15]), None);
        let r = RangeReq {
            req: 1,
            id: 2,
            offset: 3,
            len: 4,
            addr: 5,
        };
        assert_eq!(RangeReq::decode(&r.encode()), Some(r));
        let p = PutChunk {
            req: 1,
            id: 2,
            offset: 3,
            total: 4,
            chunk_off: 5,
        };
        assert_eq!(PutChunk::decode(&p.encode()), Some(p));
        assert_eq!(
            decode_reply(&encode_reply(7, RmaStatus::OutOfBounds)),
            Some((7, RmaStatus::OutOfBounds))
        );
        assert_eq!(decode_reply(&[0; 11]), None);
    }

    #[test]
    pub(super) fn targets_refuse_what_was_not_registered() {
        let mut rma = Rma::default();
        rma.regions.insert(1, vec![0u8; 100].into_boxed_slice());
        assert_eq!(rma.check(1, 0, 100), Ok(()));
        assert_eq!(rma.check(1, 1, 100), Err(RmaStatus::OutOfBounds));
        assert_eq!(rma.check(1, u64::MAX, 2), Err(RmaStatus::OutOfBounds));
        assert_eq!(rma.check(2, 0, 1), Err(RmaStatus::UnknownRegion));
        // A get request for a bad range is answered with an error reply.
        let bad = RangeReq {
            req: 5,
            id: 1,
            offset: 90,
            len: 20,
            addr: 0,
        };
        assert!(rma.on_get_req(0, &bad.encode()));
        assert!(matches!(
            rma.outbox.pop_front(),
            Some(Outgoing::Reply {
                req: 5,
                status: RmaStatus::OutOfBounds,
                ..
            })
        ));
        // A put whose chunk would run past its announced total is refused
        // and nothing is written.
        let c = PutChunk {
            req: 6,
            id: 1,
            offset: 0,
            total: 10,
            chunk_off: 8,
        };
        assert!(rma.on_put_data(0, &c.encode(), 4, |d| {
            d.fill(0xff);
            true
        }));
        assert!(rma.regions[&1].iter().all(|&b| b == 0));
        assert!(matches!(
            rma.outbox.pop_front(),
            Some(Outgoing::Reply {
                req: 6,
                status: RmaStatus::OutOfBounds,
                ..
            })
        ));
        // A good two-chunk put lands and is answered once.
        for (off, len) in [(0u64, 6u64), (6, 4)] {
            let c = PutChunk {
                req: 7,
                id: 1,
                offset: 50,
                total: 10,
                chunk_off: off,
            };
            assert!(rma.on_put_data(0, &c.encode(), len, |d| {
                d.fill(7);
                true
            }));
        }
        assert!(rma.regions[&1][50..60].iter().all(|&b| b == 7));
        assert!(matches!(
            rma.outbox.pop_front(),
            Some(Outgoing::Reply {
                req: 7,
                status: RmaStatus::Ok,
                ..
            })
        ));
        assert!(rma.outbox.is_empty());
    }
}
