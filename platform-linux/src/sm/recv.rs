//! The receive side: what the progress engine calls back with (incoming
//! fragments by tag, acknowledgements, peer errors), and the reassembly
//! of large messages (single copy and pipelined chunks).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use btl_core::sm::engine::{Dispatch, PeerError};
use btl_core::sm::frag::FragView;

use super::rma::{self, Outgoing, RangeReq};
use super::send::{Chunk, Rndv};
use super::*;
use crate::cma;

/// Completion state shared between a send and the progress engine.
pub(super) type Done = Rc<RefCell<Option<bool>>>;

/// What a fragment's cookie refers to.
pub(super) enum Waiter {
    /// A blocking send waiting for this ACK.
    Flag(Done),
    /// A user callback.
    Callback(OnDone),
}

/// Everything the engine's callbacks touch (split from the engine so both
/// can be borrowed at once).
pub(super) struct State {
    pub(super) handlers: Vec<Option<Handler>>,
    pub(super) waiters: HashMap<u64, (u32, Waiter)>,
    pub(super) next_cookie: u64,
    /// Reassembly of pipelined messages, per sender: (tag, total length,
    /// bytes so far) of the message in progress.
    pub(super) partial: Vec<Option<(u8, u64, u64)>>,
    /// Receive buffer per sender, reused from message to message (it only
    /// grows), so large messages do not pay allocation and page faults each
    /// time.
    pub(super) bufs: Vec<Vec<u8>>,
    pub(super) scratch: Vec<u8>,
    pub(super) pids: Vec<u64>,
    pub(super) cma_ok: Vec<bool>,
    /// Barrier arrivals per epoch.
    pub(super) barrier_arrivals: HashMap<u64, u32>,
    /// Peers declared failed (their fragments' errors are not reported one
    /// by one).
    pub(super) peer_failed: Vec<bool>,
    /// Peer errors reported, for diagnostics (counted, logged).
    pub(super) peer_errors: u64,
    /// Problems with peers' data seen (for the log's rate limit).
    pub(super) peer_reports: u64,
    /// Registered regions, get/put requests in both directions.
    pub(super) rma: rma::Rma,
}

impl State {
    pub(super) fn deliver(&mut self, peer: u32, tag: u8, data: &[u8]) -> bool {
        match self
            .handlers
            .get_mut(usize::from(tag))
            .and_then(Option::as_mut)
        {
            Some(h) => {
                h(peer, data);
                true
            }
            None => {
                peer_log!(
                    self,
                    warn,
                    "message from local rank {peer} with tag {tag}, which has no handler"
                );
                false
            }
        }
    }

    pub(super) fn recv_rndv(&mut self, peer: u32, frag: &FragView<'_>) -> bool {
        let mut hdr = [0u8; Rndv::LEN];
        if frag.info.len as usize != Rndv::LEN || frag.copy_payload(&mut hdr).is_err() {
            peer_log!(
                self,
                error,
                "malformed single-copy header from local rank {peer}"
            );
            return false;
        }
        let Some(r) = Rndv::decode(&hdr) else {
            return false;
        };
        if r.tag > MAX_USER_TAG || r.len > MAX_MESSAGE {
            peer_log!(
                self,
                error,
                "single-copy request from local rank {peer} with tag {} and length {}",
                r.tag,
                r.len
            );
            return false;
        }
        let mut buf = std::mem::take(&mut self.bufs[peer as usize]);
        let len = r.len as usize;
        if buf.len() < len {
            buf.resize(len, 0);
        }
        let pid = self.pids[peer as usize] as u32;
        let res = cma::read_remote(pid, r.addr as usize, &mut buf[..len]);
        let ok = res.is_ok() && self.deliver(peer, r.tag, &buf[..len]);
        self.bufs[peer as usize] = buf;
        match res {
            Ok(()) => ok,
            Err(e) => {
                if self.cma_ok[peer as usize] {
                    log::warn!(
                        "single copy from local rank {peer} failed ({e}); using the pipelined copy through shared fragments"
                    );
                }
                self.cma_ok[peer as usize] = false;
                false
            }
        }
    }

    pub(super) fn recv_chunk(&mut self, peer: u32, frag: &FragView<'_>) -> bool {
        let mut hdr = [0u8; Chunk::LEN];
        let len = frag.info.len as usize;
        if len < Chunk::LEN || frag.payload.read_bytes(0, &mut hdr).is_err() {
            peer_log!(self, error, "malformed chunk header from local rank {peer}");
            return false;
        }
        let Some(c) = Chunk::decode(&hdr) else {
            return false;
        };
        let p = peer as usize;
        let data_len = (len - Chunk::LEN) as u64;
        if c.offset == 0 {
            if self.partial[p].is_some() {
                peer_log!(
                    self,
                    error,
                    "local rank {peer} started a new message before finishing the last"
                );
            }
            if c.tag > MAX_USER_TAG || c.total > MAX_MESSAGE {
                peer_log!(
                    self,
                    error,
                    "chunked message from local rank {peer}: tag {} length {}",
                    c.tag,
                    c.total
                );
                self.partial[p] = None;
                return false;
            }
            self.partial[p] = Some((c.tag, c.total, 0));
        }
        let Some((tag, total, got)) = self.partial[p] else {
            peer_log!(
                self,
                error,
                "chunk at offset {} from local rank {peer} without a start",
                c.offset
            );
            return false;
        };
        let end = got + data_len;
        if tag != c.tag || total != c.total || got != c.offset || end > total {
            peer_log!(self, error, "out-of-order chunk from local rank {peer}");
            self.partial[p] = None;
            return false;
        }
        // The buffer grows as data arrives (amortised doubling, kept for
        // the next message): a chunk header alone, which any peer can
        // write, cannot make us allocate and zero `MAX_MESSAGE` bytes.
        if (self.bufs[p].len() as u64) < end {
            self.bufs[p].resize(end as usize, 0);
        }
        let dst = &mut self.bufs[p][got as usize..end as usize];
        if frag.payload.read_bytes(Chunk::LEN as u64, dst).is_err() {
            self.partial[p] = None;
            return false;
        }
        if end < total {
            self.partial[p] = Some((tag, total, end));
            return true;
        }
        self.partial[p] = None;
        let buf = std::mem::take(&mut self.bufs[p]);
        let ok = self.deliver(peer, tag, &buf[..total as usize]);
        self.bufs[p] = buf;
        ok
    }
}

impl State {
    /// A put by single copy: validate, then read the requester's memory
    /// straight into the region.
    pub(super) fn recv_put_cma(&mut self, peer: u32, frag: &FragView<'_>) -> bool {
        let mut b = [0u8; RangeReq::LEN];
        if frag.info.len as usize != RangeReq::LEN || frag.copy_payload(&mut b).is_err() {
            return false;
        }
        let Some(put) = RangeReq::decode(&b) else {
            return false;
        };
        let pid = self.pids[peer as usize] as u32;
        let status = match self.rma.range_mut(put.id, put.offset, put.len) {
            Ok(dst) => match cma::read_remote(pid, put.addr as usize, dst) {
                Ok(()) => RmaStatus::Ok,
                Err(e) => {
                    log::warn!("single-copy put from local rank {peer} failed: {e}");
                    RmaStatus::CopyFailed
                }
            },
            Err(status) => {
                log::warn!("local rank {peer} put into region {}: {status}", put.id);
                status
            }
        };
        self.rma.outbox.push_back(Outgoing::Reply {
            peer,
            req: put.req,
            status,
        });
        true
    }
}

impl Dispatch for State {
    fn recv(&mut self, peer: u32, tag: u8, frag: &FragView<'_>) -> bool {
        match tag {
            TAG_RNDV => self.recv_rndv(peer, frag),
            TAG_CHUNK => self.recv_chunk(peer, frag),
            rma::TAG_GET_REQ => {
                let mut b = [0u8; RangeReq::LEN];
                frag.info.len as usize == RangeReq::LEN
                    && frag.copy_payload(&mut b).is_ok()
                    && self.rma.on_get_req(peer, &b)
            }
            rma::TAG_PUT_DATA => {
                let mut h = [0u8; rma::PutChunk::LEN];
                let len = u64::from(frag.info.len);
                if len < h.len() as u64 || frag.payload.read_bytes(0, &mut h).is_err() {
                    return false;
                }
                let data_len = len - h.len() as u64;
                self.rma.on_put_data(peer, &h, data_len, |dst| {
                    frag.payload
                        .read_bytes(rma::PutChunk::LEN as u64, dst)
                        .is_ok()
                })
            }
            rma::TAG_PUT_CMA => self.recv_put_cma(peer, frag),
            rma::TAG_RMA_REPLY => {
                let mut b = [0u8; 12];
                frag.info.len == 12
                    && frag.copy_payload(&mut b).is_ok()
                    && self.rma.on_reply(peer, &b)
            }
            rma::TAG_GET_DATA => {
                let mut h = [0u8; 16];
                let len = u64::from(frag.info.len);
                if len < 16 || frag.payload.read_bytes(0, &mut h).is_err() {
                    return false;
                }
                self.rma.on_get_data(peer, &h, len - 16, |dst| {
                    frag.payload.read_bytes(16, dst).is_ok()
                })
            }
            TAG_BARRIER => {
                let mut b = [0u8; 8];
                if frag.info.len != 8 || frag.copy_payload(&mut b).is_err() {
                    return false;
                }
                let epoch = u64::from_le_bytes(b);
                *self.barrier_arrivals.entry(epoch).or_insert(0) += 1;
                true
            }
            t if t <= MAX_USER_TAG => {
                let len = frag.info.len as usize;
                let mut scratch = std::mem::take(&mut self.scratch);
                let ok = frag.copy_payload(&mut scratch[..len]).is_ok()
                    && self.deliver(peer, t, &scratch[..len]);
                self.scratch = scratch;
                ok
            }
            t => {
                peer_log!(self, error, "local rank {peer} used reserved tag {t}");
                false
            }
        }
    }

    fn complete(&mut self, peer: u32, cookie: u64, ok: bool) {
        if cookie == 0 {
            // Fragments failed along with their peer were reported once,
            // with the peer.
            if !ok
                && !self
                    .peer_failed
                    .get(peer as usize)
                    .copied()
                    .unwrap_or(false)
            {
                peer_log!(
                    self,
                    warn,
                    "local rank {peer} reported an error handling a message"
                );
            }
            return;
        }
        match self.waiters.remove(&cookie) {
            Some((_, Waiter::Flag(done))) => *done.borrow_mut() = Some(ok),
            Some((_, Waiter::Callback(cb))) => cb(if ok {
                Ok(())
            } else {
                Err(SmError::RemoteError { peer })
            }),
            None => {}
        }
    }

    fn error(&mut self, error: PeerError) {
        self.peer_errors += 1;
        peer_log!(
            self,
            error,
            "shared memory: {error} (peer error {})",
            self.peer_errors
        );
    }
}
