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
use std::fmt;

pub(super) const TAG_GET_REQ: u8 = 252;
pub(super) const TAG_RMA_REPLY: u8 = 251;
pub(super) const TAG_PUT_DATA: u8 = 250;
pub(super) const TAG_GET_DATA: u8 = 249;
pub(super) const TAG_PUT_CMA: u8 = 248;

/// What a peer needs to address a registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegionKey {
    /// Local rank owning the region.
    pub rank: u32,
    /// Its id at the owner.
    pub id: u32,
    /// Its length in bytes.
    pub len: u64,
}

impl RegionKey {
    /// Encoded length.
    pub const LEN: usize = 16;

    /// 16 bytes to send to peers.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0; Self::LEN];
        b[0..4].copy_from_slice(&self.rank.to_le_bytes());
        b[4..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes [`Self::to_bytes`]; `None` if the length is wrong.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        let b: &[u8; Self::LEN] = b.try_into().ok()?;
        Some(Self {
            rank: u32::from_le_bytes(b[0..4].try_into().ok()?),
            id: u32::from_le_bytes(b[4..8].try_into().ok()?),
            len: u64::from_le_bytes(b[8..16].try_into().ok()?),
        })
    }
}

/// Outcome of a get or put at the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmaStatus {
    /// Done.
    Ok,
    /// The target has no region with that id.
    UnknownRegion,
    /// The range is not inside the region.
    OutOfBounds,
    /// The target could not copy (single copy failed, malformed request).
    CopyFailed,
}

impl RmaStatus {
    fn code(self) -> u32 {
        match self {
            Self::Ok => 0,
            Self::UnknownRegion => 1,
            Self::OutOfBounds => 2,
            Self::CopyFailed => 3,
        }
    }
    fn from_code(c: u32) -> Self {
        match c {
            0 => Self::Ok,
            1 => Self::UnknownRegion,
            2 => Self::OutOfBounds,
            _ => Self::CopyFailed,
        }
    }
}

impl fmt::Display for RmaStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ok => "done",
            Self::UnknownRegion => "no such region at the target",
            Self::OutOfBounds => "range outside the target's region",
            Self::CopyFailed => "the target could not copy the data",
        })
    }
}

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
struct PutIn {
    received: u64,
    failed: bool,
}

/// The RMA side of the transport's callback state.
#[derive(Debug, Default)]
pub(super) struct Rma {
    pub regions: HashMap<u32, Box<[u8]>>,
    pub next_region: u32,
    pub next_req: u64,
    pub outbox: VecDeque<Outgoing>,
    pub waiting: HashMap<u64, Wait>,
    puts_in: HashMap<(u32, u64), PutIn>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_roundtrip() {
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
    fn targets_refuse_what_was_not_registered() {
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
