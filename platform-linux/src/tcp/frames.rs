//! Framing I/O: posting frames (one `writev` at once, the rest queued —
//! copied, or the caller's memory until written), writing queued frames as
//! sockets drain, reading and decoding (read-ahead buffer, direct reads of
//! large payloads, the busy-polling fast path), delivering messages in
//! place and reassembling chunked ones.
//!
//! # Safety
//!
//! After `recv` into a `Vec`'s spare capacity, the length is set to cover
//! exactly the bytes the kernel wrote; caller memory named by a
//! [`RawBuf`] is read (queued frames) or written (a get's answer) under
//! that type's contract.
#![allow(unsafe_code)]

use std::io::{self, IoSlice};
use std::os::fd::AsFd;

use btl_core::barrier::BarrierRepr;
use btl_core::tcp::decoder::Event;
use btl_core::tcp::endpoint::{ConnId, SendDecision};
use btl_core::tcp::wire::{
    FrameRepr, FrameType, HandshakeRepr, CHUNK_HEADER_LEN as CHUNK_HEADER, FRAME_HEADER_LEN,
    TAG_BARRIER, TAG_CHUNK,
};
use rustix::event::epoll;
use rustix::io::Errno;
use rustix::net::RecvFlags;

use super::*;
use crate::ops::{PostError, Posted, RawParts};

/// Longest header kept inline in a frame (frame header + RMA sub-header or
/// chunk header).
const HEAD_MAX: usize = 64;

/// The body of a queued frame.
#[derive(Debug)]
pub(super) enum Body {
    /// Bytes we own.
    Owned(Vec<u8>),
    /// Caller memory (`RawBuf`'s contract: valid until the operation
    /// completes or is cancelled).
    Raw(RawBuf),
}

/// One frame (or raw protocol bytes) waiting to be written.
#[derive(Debug)]
pub(super) struct OutBuf {
    head: [u8; HEAD_MAX],
    head_len: usize,
    body: Body,
    /// Completed when the last byte is written.
    op: Option<OpId>,
    /// Counted in the peer's queue bounds.
    counted: bool,
    /// The registered region `body` reads (an answer to a peer's get
    /// written straight from it), pinned until the frame leaves the queues.
    pin: Option<u32>,
}

/// Every write to a socket: `MSG_NOSIGNAL`, so a peer that closed its end
/// makes the write fail with `EPIPE` (the peer is failed) instead of
/// raising `SIGPIPE`, whose default action kills the process. A Rust
/// program ignores `SIGPIPE` from its start, a C program linking `libbtl`
/// (an Open MPI rank through rtcp) does not.
const SEND_FLAGS: rustix::net::SendFlags = rustix::net::SendFlags::NOSIGNAL;

/// The flags of a write held for combining: `MSG_MORE` as well, so the
/// kernel appends the frame to the socket's last unsent segment instead of
/// sending a segment of its own (see `write_combine` in `tcp/mod.rs`).
fn send_flags(more: bool) -> rustix::net::SendFlags {
    if more {
        SEND_FLAGS | rustix::net::SendFlags::MORE
    } else {
        SEND_FLAGS
    }
}

/// Frames up to this many bytes (header included) are gathered in one
/// buffer and written with one `send(2)`.
pub(super) const SMALL_FRAME: usize = 256;

/// A queued frame of at least this many bytes (a large get answer, a
/// zero-copy message, the rest of a copied one) is written in pieces of
/// [`WRITE_PIECE`], one `sendmsg(2)` each, the rest left for the following
/// passes; smaller frames go in one call. Not a post's first write
/// (`write_now`): what the socket does not take there is copied, and a
/// piece would make that copy of megabytes the rule.
///
/// Why: on loopback the sending core is what limits a stream — it copies
/// the data and, while its socket is locked, also processes the receiver's
/// acknowledgements (they wait in the socket's backlog for it). One
/// `sendmsg` of a 4 MiB answer holds the lock throughout. Open MPI's ob1
/// over rtcp with a window of 64 gets (`mpi_pingpong 4194304`, four
/// interleaved rounds, 2026-12-05): 5.97–7.54 GB/s against 5.15–5.34 with
/// whole writes (Open MPI's tcp 5.44–5.70). Not below 2 MiB: pieces of a
/// 1 MiB answer made ob1's 1 MiB ping-pong 20–40 % slower; and pieces
/// under 512 KiB made a raw stream slower (128 KiB: 3.3 GB/s against 6).
/// README, "TCP on Linux".
const PIECE_FRAME_MIN: usize = 2 << 20;

/// The size of one write of a frame of at least [`PIECE_FRAME_MIN`] bytes.
const WRITE_PIECE: usize = 512 << 10;

/// How much of the `left` bytes of a large frame to offer in one write: a
/// piece, or all of them when less than half a piece would remain (no
/// tiny last write).
fn piece_of(left: usize) -> usize {
    if left.saturating_sub(WRITE_PIECE) < WRITE_PIECE / 2 {
        left
    } else {
        WRITE_PIECE
    }
}

/// The most pieces (the frame header counted) a frame is written from
/// straight, with one `sendmsg(2)`, when the socket takes it at once; a
/// frame in more pieces is gathered into one buffer first.
const WRITE_IOV: usize = 8;

/// The concatenation of `parts` (`len` bytes in all) without its first
/// `skip` bytes.
fn concat_from(parts: &[&[u8]], mut skip: usize, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len.saturating_sub(skip));
    for p in parts {
        if skip >= p.len() {
            skip -= p.len();
        } else {
            out.extend_from_slice(&p[skip..]);
            skip = 0;
        }
    }
    out
}

impl OutBuf {
    /// Raw protocol bytes (handshake, FIN), not counted.
    pub(super) fn control(bytes: Vec<u8>) -> Self {
        Self {
            head: [0; HEAD_MAX],
            head_len: 0,
            body: Body::Owned(bytes),
            op: None,
            counted: false,
            pin: None,
        }
    }

    fn frame(head: &[&[u8]], body: Body, op: Option<OpId>) -> Self {
        let mut h = [0u8; HEAD_MAX];
        let mut n = 0;
        for p in head {
            h[n..n + p.len()].copy_from_slice(p);
            n += p.len();
        }
        Self {
            head: h,
            head_len: n,
            body,
            op,
            counted: true,
            pin: None,
        }
    }

    fn body_len(&self) -> usize {
        match &self.body {
            Body::Owned(v) => v.len(),
            Body::Raw(r) => r.len(),
        }
    }

    /// Total bytes.
    pub(super) fn len(&self) -> usize {
        self.head_len + self.body_len()
    }

    /// Bytes of ours it holds (caller memory it reads is the caller's):
    /// what the queue bounds count.
    pub(super) fn held(&self) -> u64 {
        match &self.body {
            Body::Owned(v) => (self.head_len + v.len()) as u64,
            Body::Raw(_) => self.head_len as u64,
        }
    }

    /// The operation it completes.
    pub(super) fn op(&self) -> Option<OpId> {
        self.op
    }

    fn body(&self) -> &[u8] {
        match &self.body {
            Body::Owned(v) => v,
            // SAFETY: RawBuf's contract: the memory stays valid and
            // unchanged until the operation completes or is cancelled, and
            // a cancelled frame is made owned or dropped first.
            Body::Raw(r) => unsafe { r.as_slice() },
        }
    }

    /// Copies caller memory into the frame (so the caller may go);
    /// returns how many more bytes the frame now holds.
    pub(super) fn make_owned(&mut self) -> u64 {
        let before = self.held();
        if let Body::Raw(_) = self.body {
            self.body = Body::Owned(self.body().to_vec());
        }
        self.op = None;
        self.held() - before
    }

    /// The slices from byte `off` on.
    fn slices(&self, off: usize) -> [&[u8]; 2] {
        if off < self.head_len {
            [&self.head[off..self.head_len], self.body()]
        } else {
            [&self.body()[off - self.head_len..], &[]]
        }
    }
}

impl Tcp {
    /// Checks a post to `peer`: a peer we may talk to, queue room for
    /// `len` more bytes.
    fn admit(&self, peer: u32, len: u64) -> Result<(), PostError> {
        if peer >= self.n || peer == self.me {
            return Err(PostError::InvalidPeer);
        }
        let p = &self.peers[peer as usize];
        if p.failed.is_some() {
            return Err(PostError::PeerFailed);
        }
        if self.limits.admits(p.queued_bytes, p.queued_frames, len) {
            Ok(())
        } else {
            Err(PostError::WouldBlock)
        }
    }

    /// Sends the concatenation of `parts` to `peer` with `tag`, copying:
    /// what the socket does not take at once waits (copied) in user space.
    /// Messages larger than `max_frame` travel as a chain of frames on the
    /// internal chunk tag.
    pub fn isend(&mut self, peer: u32, tag: u8, parts: &[&[u8]]) -> Result<(), PostError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        PostError::check_message(tag, len as u64, MAX_MESSAGE)?;
        self.admit(peer, len as u64)?;
        let max = self.cfg.max_frame as usize;
        if len <= max {
            let repr = FrameRepr::send(tag, len as u32);
            return self.post(peer, repr, parts, None).map(|_| ());
        }
        let data = parts.concat();
        self.post_chunked(peer, tag, &data, |chunk| Body::Owned(chunk.to_vec()), None)
            .map(|_| ())
    }

    /// Sends `parts` to `peer` with `tag` without copying: what the socket
    /// does not take at once is written later straight from `parts`; the
    /// send completes with [`TEvent::Done`] for `op` then (or at once,
    /// [`Posted::Done`]).
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
        // Caller memory: only the message count is bounded (a message in
        // several pieces is gathered into a copy, bounded by `isend`).
        self.admit(peer, 0)?;
        let max = self.cfg.max_frame as usize;
        match parts.contiguous() {
            Some(buf) if FRAME_HEADER_LEN + buf.len() <= SMALL_FRAME => {
                // A small message leaves now, or waits as a copy: done at
                // once either way (as `isend`; nothing to complete later).
                // SAFETY: the caller's promise; read before returning.
                let data = unsafe { buf.as_slice() };
                self.isend(peer, tag, &[data]).map(|()| Posted::Done)
            }
            Some(buf) if buf.len() > max => {
                // SAFETY: the caller's promise.
                let data = unsafe { buf.as_slice() };
                self.post_chunked(
                    peer,
                    tag,
                    data,
                    |chunk| Body::Raw(RawBuf::new(chunk)),
                    Some(op),
                )
            }
            Some(buf) => {
                let repr = FrameRepr::send(tag, buf.len() as u32);
                self.post_raw(peer, repr, &[], buf, Some(op))
            }
            None => {
                let in_place = FRAME_HEADER_LEN + parts.len() > SMALL_FRAME && parts.len() <= max;
                match parts.head_and_body(HEAD_MAX - FRAME_HEADER_LEN) {
                    Some((head, body)) if in_place => {
                        // A header and a payload (Open MPI's descriptors):
                        // the header copied into the frame's head, the
                        // payload written straight from the caller's
                        // memory, as Open MPI's tcp BTL writes in place.
                        let repr = FrameRepr::send(tag, parts.len() as u32);
                        // SAFETY: the caller's promise; the head is copied
                        // before returning.
                        let h = unsafe { head.as_slice() };
                        self.post_raw(peer, repr, h, body, Some(op))
                    }
                    // SAFETY: the caller's promise (read before returning).
                    _ => unsafe { self.isend_gathered(peer, tag, &parts) },
                }
            }
        }
    }

    /// [`Self::isend_raw`] of a message in pieces that do not go in place:
    /// gathered into one copy, done at once.
    ///
    /// # Safety
    ///
    /// As [`Self::isend_raw`] (the memory is read before returning).
    unsafe fn isend_gathered(
        &mut self,
        peer: u32,
        tag: u8,
        parts: &RawParts,
    ) -> Result<Posted, PostError> {
        let mut slices = Vec::new();
        // SAFETY: the caller's promise; used before returning.
        unsafe { parts.slices(&mut slices) };
        self.isend(peer, tag, &slices).map(|()| Posted::Done)
    }

    /// A message larger than a frame: the first frame starts with the chunk
    /// header (tag, total), the others carry data only.
    fn post_chunked(
        &mut self,
        peer: u32,
        tag: u8,
        data: &[u8],
        body: impl Fn(&[u8]) -> Body,
        op: Option<OpId>,
    ) -> Result<Posted, PostError> {
        let max = self.cfg.max_frame as usize;
        let mut first = [0u8; CHUNK_HEADER];
        first[0] = tag;
        first[8..16].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let step = max - CHUNK_HEADER;
        let mut posted = Posted::Done;
        let mut off = 0usize;
        while off < data.len() {
            let (head_len, take) = if off == 0 {
                (CHUNK_HEADER, step.min(data.len()))
            } else {
                (0, max.min(data.len() - off))
            };
            let last = off + take == data.len();
            let repr = FrameRepr::send(TAG_CHUNK, (head_len + take) as u32);
            let hdr = repr.to_bytes();
            let buf = OutBuf::frame(
                &[&hdr, &first[..head_len]],
                body(&data[off..off + take]),
                if last { op } else { None },
            );
            posted = self.post_buf(peer, buf)?;
            off += take;
        }
        Ok(posted)
    }

    /// Posts one frame whose payload is the concatenation of `parts`
    /// (copied if it must wait).
    pub(super) fn post(
        &mut self,
        peer: u32,
        repr: FrameRepr,
        parts: &[&[u8]],
        op: Option<OpId>,
    ) -> Result<Posted, PostError> {
        let hdr = repr.to_bytes();
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if parts.len() < WRITE_IOV || hdr.len() + len <= SMALL_FRAME {
            // The common case: try the socket first, copy only what is left
            // (memory is taken only for that).
            if let Some(written) = self.write_now(peer, &hdr, parts, len)? {
                if written == hdr.len() + len {
                    return Ok(Posted::Done);
                }
                let mut rest = OutBuf::frame(&[], Body::Owned(Vec::new()), op);
                let skip = if written < hdr.len() {
                    rest.head[..hdr.len() - written].copy_from_slice(&hdr[written..]);
                    rest.head_len = hdr.len() - written;
                    0
                } else {
                    written - hdr.len()
                };
                rest.body = Body::Owned(concat_from(parts, skip, len));
                return self.queue_on_conn(peer, rest);
            }
        }
        let body = concat_from(parts, 0, len);
        self.post_buf(peer, OutBuf::frame(&[&hdr], Body::Owned(body), op))
    }

    /// Posts the answer `repr` to a peer's get whose data is `data`, a
    /// range of registered region `region` that the caller pinned: written
    /// straight from the region (what the socket does not take waits as a
    /// reference, not a copy), the pin ended when the frame leaves the
    /// queues. On an error nothing was queued and the pin is the caller's.
    pub(super) fn post_pinned_answer(
        &mut self,
        peer: u32,
        repr: FrameRepr,
        data: RawBuf,
        region: u32,
    ) -> Result<Posted, PostError> {
        let hdr = repr.to_bytes();
        let mut buf = OutBuf::frame(&[&hdr], Body::Raw(data), None);
        buf.pin = Some(region);
        self.post_buf(peer, buf)
    }

    /// Ends the pins of frames that left the queues. Before any message is
    /// handed out (every `read_conn` step) and at the end of a pass: a
    /// peer's word that it has our answer (Open MPI's FIN, which lets the
    /// region go) comes after the answer's last byte, so its region is
    /// unpinned by then.
    #[inline]
    pub(super) fn apply_unpins(&mut self, regions: &mut Regions) {
        if !self.unpins.is_empty() {
            regions.unpin_queued(&mut self.unpins);
        }
    }

    /// Posts one frame: `head` bytes after the frame header, then `data`
    /// from caller memory (written straight from it).
    pub(super) fn post_raw(
        &mut self,
        peer: u32,
        repr: FrameRepr,
        head: &[u8],
        data: RawBuf,
        op: Option<OpId>,
    ) -> Result<Posted, PostError> {
        let hdr = repr.to_bytes();
        self.post_buf(peer, OutBuf::frame(&[&hdr, head], Body::Raw(data), op))
    }

    /// The endpoint's decision on a send to `peer`. The clock is read only
    /// for a closed endpoint, the one state whose decision uses it (the
    /// connect starts its handshake deadline): a clock read costs about as
    /// much as a small message's own work, and this is on every send.
    fn send_decision(&mut self, peer: u32) -> SendDecision {
        // A post: the transport is in use (the answer is awaited).
        self.io_moves = self.io_moves.wrapping_add(1);
        let closed = self.peers[peer as usize].ep.state() == EndpointState::Closed;
        let now = if closed { self.now_ms() } else { 0 };
        self.peers[peer as usize].ep.on_send_request(now)
    }

    /// The connection to write on now, if `peer` is connected and nothing
    /// is queued ahead; otherwise starts connecting or queues per the
    /// endpoint's decision (`None`).
    fn ready_conn(&mut self, peer: u32) -> Result<Option<ConnId>, PostError> {
        match self.send_decision(peer) {
            SendDecision::SendNow { conn } => Ok(self
                .conns
                .get(&conn.0)
                .filter(|c| c.out.is_empty() && !c.connecting)
                .map(|_| conn)),
            SendDecision::Queue => Ok(None),
            SendDecision::QueueAndConnect => {
                if let Err(e) = self.start_connect(peer) {
                    log::warn!("tcp: connecting to rank {peer}: {e}");
                }
                Ok(None)
            }
            SendDecision::Refuse(_) => Err(PostError::PeerFailed),
        }
    }

    /// Writes `hdr` and the concatenation of `parts` (`len` bytes; fewer
    /// than [`WRITE_IOV`] parts unless the frame fits [`SMALL_FRAME`]) to
    /// `peer` now if it is connected with nothing queued: `Some(bytes
    /// written)` (possibly partial), `None` if it must be queued.
    fn write_now(
        &mut self,
        peer: u32,
        hdr: &[u8],
        parts: &[&[u8]],
        len: usize,
    ) -> Result<Option<usize>, PostError> {
        let Some(conn) = self.ready_conn(peer)? else {
            return Ok(None);
        };
        let Some(c) = self.conns.get_mut(&conn.0) else {
            return Ok(None);
        };
        let total = hdr.len() + len;
        // A post of this pass wrote already: written corked, for combining.
        let more = c.holds(total, self.epoch, self.cfg.combine);
        let mut written = 0usize;
        let small = total <= SMALL_FRAME;
        if small {
            // One contiguous send(2) rather than sendmsg(2) with several
            // pieces: less work per call in the kernel (no msghdr or iovec
            // to import) and in user space. Gathered in a buffer kept for
            // this (not zeroed per message, warm in the cache).
            let buf = &mut self.small_out[..];
            buf[..hdr.len()].copy_from_slice(hdr);
            let mut at = hdr.len();
            for p in parts {
                buf[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
        } else if parts.len() >= WRITE_IOV {
            return Ok(None);
        }
        // This pass wrote to the connection: later posts of the pass are
        // held for combining.
        c.wrote_in = self.epoch;
        let flags = send_flags(more);
        while written < total {
            let r = if small {
                // rustix's send (the errno itself, no libc wrapper), with
                // MSG_NOSIGNAL as every write here.
                rustix::net::send(&c.sock, &self.small_out[written..total], flags)
                    .map_err(io::Error::from)
            } else {
                // Straight from the pieces (no copy): one sendmsg(2) of
                // what is left of the header and the parts.
                let mut iov = [IoSlice::new(&[]); WRITE_IOV];
                let mut n = 0;
                let mut skip = written;
                for p in std::iter::once(hdr).chain(parts.iter().copied()) {
                    if skip >= p.len() {
                        skip -= p.len();
                        continue;
                    }
                    iov[n] = IoSlice::new(&p[skip..]);
                    skip = 0;
                    n += 1;
                }
                c.sock
                    .send_vectored_with_flags(&iov[..n], flags.bits() as libc::c_int)
            };
            match r {
                Ok(n) => {
                    self.io_moves = self.io_moves.wrapping_add(1);
                    written += n;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // What the socket did not take is queued by the caller.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.io_error = Some(e.to_string());
                    self.conn_broken(conn, false);
                    return Err(PostError::PeerFailed);
                }
            }
            if small {
                // A short write of a small frame: the socket is full, the
                // caller queues the rest.
                break;
            }
        }
        if more && written > 0 {
            self.corked(conn, written);
        } else if written == total {
            // Written without MSG_MORE: the kernel sent whatever this
            // connection had corked along with it.
            c.held = 0;
        }
        Ok(Some(written))
    }

    /// Queues `buf` for `peer`: on its connection if it has one, else in
    /// its queue until the connection is up. Tries to write at once.
    fn post_buf(&mut self, peer: u32, buf: OutBuf) -> Result<Posted, PostError> {
        match self.send_decision(peer) {
            SendDecision::SendNow { .. } => self.queue_on_conn(peer, buf),
            SendDecision::Queue => Ok(self.queue_for_peer(peer, buf)),
            SendDecision::QueueAndConnect => {
                let posted = self.queue_for_peer(peer, buf);
                if let Err(e) = self.start_connect(peer) {
                    log::warn!("tcp: connecting to rank {peer}: {e}");
                }
                Ok(posted)
            }
            SendDecision::Refuse(_) => Err(PostError::PeerFailed),
        }
    }

    fn count(&mut self, peer: u32, buf: &OutBuf) {
        if buf.counted {
            let p = &mut self.peers[peer as usize];
            p.queued_bytes += buf.held();
            p.queued_frames += 1;
        }
    }

    pub(super) fn uncount_pub(&mut self, peer: Option<u32>, buf: &OutBuf) {
        self.uncount(peer, buf);
    }

    /// A frame leaves the queues (written, abandoned or cancelled): out of
    /// the peer's queue bounds, and the region it read from unpinned (at
    /// the next [`Self::apply_unpins`]).
    fn uncount(&mut self, peer: Option<u32>, buf: &OutBuf) {
        if let Some(id) = buf.pin {
            self.unpins.push(id);
        }
        if let (true, Some(p)) = (
            buf.counted,
            peer.and_then(|p| self.peers.get_mut(p as usize)),
        ) {
            p.queued_bytes = p.queued_bytes.saturating_sub(buf.held());
            p.queued_frames = p.queued_frames.saturating_sub(1);
        }
    }

    fn queue_for_peer(&mut self, peer: u32, buf: OutBuf) -> Posted {
        let posted = if buf.op.is_some() {
            Posted::Pending
        } else {
            Posted::Done
        };
        self.count(peer, &buf);
        self.peers[peer as usize].queue.push_back(buf);
        posted
    }

    fn queue_on_conn(&mut self, peer: u32, buf: OutBuf) -> Result<Posted, PostError> {
        let SendDecision::SendNow { conn } = self.send_decision(peer) else {
            return Ok(self.queue_for_peer(peer, buf));
        };
        let op = buf.op;
        self.count(peer, &buf);
        let len = buf.len();
        let epoch = self.epoch;
        let mut more = false;
        if let Some(c) = self.conns.get_mut(&conn.0) {
            c.out.push_back(buf);
            more = c.holds(len, epoch, self.cfg.combine);
            c.wrote_in = epoch;
        }
        self.write_conn(conn, more);
        // Written already (its completion is queued) or still waiting.
        Ok(match op {
            Some(op) if self.done.last().is_some_and(|d| d.0 == op) => {
                self.done.pop();
                Posted::Done
            }
            Some(_) => Posted::Pending,
            None => Posted::Done,
        })
    }

    /// Appends protocol bytes (handshake, FIN) to a connection's output
    /// and tries to write.
    pub(super) fn queue_bytes(&mut self, conn: ConnId, bytes: Vec<u8>) {
        if let Some(c) = self.conns.get_mut(&conn.0) {
            c.out.push_back(OutBuf::control(bytes));
        }
        self.flush_conn(conn);
    }

    /// Moves a peer's waiting frames onto its (now established)
    /// connection.
    pub(super) fn flush_queue_to(&mut self, peer: u32, conn: ConnId) {
        let q = std::mem::take(&mut self.peers[peer as usize].queue);
        if let Some(c) = self.conns.get_mut(&conn.0) {
            c.out.extend(q);
        } else {
            self.peers[peer as usize].queue = q;
        }
        self.flush_conn(conn);
    }

    /// `bytes` more were written to `conn` with `MSG_MORE`: the next
    /// pass pushes them (`write_held`).
    fn corked(&mut self, conn: ConnId, bytes: usize) {
        if let Some(c) = self.conns.get_mut(&conn.0) {
            if c.held == 0 {
                self.held.push(conn);
            }
            c.held += bytes;
        }
    }

    /// Sends what was corked for combining (at the start of a pass): the
    /// rest of a connection's output written without `MSG_MORE`, or, with
    /// nothing left in user space, `TCP_NODELAY` set again, which makes the
    /// kernel send the corked segment at once.
    #[cold]
    pub(super) fn write_held(&mut self) {
        let held = std::mem::take(&mut self.held);
        for &conn in &held {
            let Some(c) = self.conns.get_mut(&conn.0) else {
                continue;
            };
            if !c.out.is_empty() {
                self.flush_conn(conn);
            } else if c.held > 0 {
                c.held = 0;
                if let Err(e) = c.sock.set_nodelay(true) {
                    // The kernel still sends it (the next write without
                    // MSG_MORE, an ACK, or its own timer): a log, not a
                    // failure.
                    log::warn!("tcp: pushing combined frames to {}: {e}", c.addr);
                }
            }
        }
        // The vector back, empty, for the next burst (no allocation).
        self.held = held;
        self.held.clear();
    }

    /// Writes as much of a connection's output as the socket takes (one
    /// piece when a large frame is queued: [`PIECE_FRAME_MIN`]), arming
    /// EPOLLOUT for the rest. Frames fully written complete their
    /// operations.
    pub(super) fn flush_conn(&mut self, conn: ConnId) {
        self.write_conn(conn, false);
    }

    /// [`Self::flush_conn`], with `MSG_MORE` when `more` (a write held for
    /// combining: the next pass pushes it).
    fn write_conn(&mut self, conn: ConnId, more: bool) {
        let Some(c) = self.conns.get_mut(&conn.0) else {
            return;
        };
        if c.connecting {
            return;
        }
        let peer = c.peer;
        let flags = send_flags(more).bits() as libc::c_int;
        let mut wrote = 0usize;
        let mut failed = false;
        let mut io_error = None;
        let mut finished: Vec<OutBuf> = Vec::new();
        while !c.out.is_empty() {
            let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(16);
            // With a large frame among them, one piece (see
            // `PIECE_FRAME_MIN`) and back to the pass.
            let (left, large) =
                c.out
                    .iter()
                    .take(32)
                    .enumerate()
                    .fold((0usize, false), |(left, large), (i, b)| {
                        let off = if i == 0 { c.out_off } else { 0 };
                        (left + b.len() - off, large || b.len() >= PIECE_FRAME_MIN)
                    });
            // What this write offers: one piece, or everything gathered.
            let offered = if large { piece_of(left) } else { left };
            let mut cap = offered;
            'gather: for (i, b) in c.out.iter().take(32).enumerate() {
                let off = if i == 0 { c.out_off } else { 0 };
                for s in b.slices(off) {
                    if cap == 0 {
                        break 'gather;
                    }
                    if !s.is_empty() {
                        let s = &s[..s.len().min(cap)];
                        cap -= s.len();
                        slices.push(IoSlice::new(s));
                    }
                }
            }
            if slices.is_empty() {
                // Only empty buffers: they are done.
                while let Some(b) = c.out.pop_front() {
                    finished.push(b);
                }
                c.out_off = 0;
                break;
            }
            match c.sock.send_vectored_with_flags(&slices, flags) {
                Ok(mut n) => {
                    self.io_moves = self.io_moves.wrapping_add(1);
                    wrote += n;
                    // A piece written (or less: the socket is full): the
                    // passes go on with the rest.
                    let stop = large || n < offered;
                    while let Some(f) = c.out.front() {
                        let left = f.len() - c.out_off;
                        if n >= left {
                            n -= left;
                            c.out_off = 0;
                            if let Some(b) = c.out.pop_front() {
                                finished.push(b);
                            }
                        } else {
                            c.out_off += n;
                            break;
                        }
                    }
                    if stop {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    failed = true;
                    io_error = Some(e.to_string());
                    break;
                }
            }
        }
        let want = !c.out.is_empty();
        if want != c.write_armed && !failed {
            c.write_armed = want;
            // An unwatched connection gets its flags when it is watched
            // again (`rewatch`); meanwhile every pass writes it.
            if !self.unwatched.contains(&conn) {
                let _ = epoll::modify(
                    &self.epoll,
                    c.sock.as_fd(),
                    epoll::EventData::new_u64(u64::from(conn.0)),
                    watch_flags(want),
                );
            }
        }
        let close = c.out.is_empty() && c.close_after_write;
        if !more && wrote > 0 {
            // Written without MSG_MORE: whatever was corked went with it.
            c.held = 0;
        }
        let corked = if more { wrote } else { 0 };
        for b in finished {
            self.uncount(peer, &b);
            if let Some(op) = b.op {
                self.done.push((op, Ok(())));
            }
        }
        if failed {
            self.io_error = io_error;
            self.conn_broken(conn, false);
        } else if close {
            self.drop_conn(conn);
        } else if corked > 0 {
            self.corked(conn, corked);
        }
    }

    /// Completes the operations of frames that will never be written.
    pub(super) fn abandon(&mut self, peer: Option<u32>, bufs: impl IntoIterator<Item = OutBuf>) {
        for b in bufs {
            self.uncount(peer, &b);
            if let (Some(op), Some(p)) = (b.op, peer) {
                self.done.push((op, Err(OpError::PeerFailed { peer: p })));
            }
        }
    }

    /// The busy-polling fast path: with at most [`DIRECT_POLL_MAX`]
    /// established connections, a non-blocking pass reads each of them
    /// directly (one `recv` that usually says "nothing", instead of
    /// `epoll_wait` and then `recv`: one system call less per message).
    /// Connections with queued output are written on too. Every
    /// [`DIRECT_POLL_EVERY`]-th pass goes through epoll as usual, for
    /// accepts, connects, writability of the others and hang-ups. `None` when the fast
    /// path does not apply.
    pub(super) fn poll_direct(&mut self, pass: &mut Pass<'_, '_>) -> Option<usize> {
        let mut ids = std::mem::take(&mut self.direct);
        if self.direct_stale {
            self.direct_stale = false;
            self.rewatch();
            ids.clear();
            for (&id, c) in &self.conns {
                if c.connecting || c.incoming.is_some() || c.peer.is_none() {
                    continue;
                }
                ids.push(ConnId(id));
                if ids.len() > DIRECT_POLL_MAX {
                    break;
                }
            }
        }
        let usable = !ids.is_empty() && ids.len() <= DIRECT_POLL_MAX;
        if usable && self.unwatched.len() < ids.len() {
            for &id in &ids {
                self.unwatch(id);
            }
        }
        // One connection, and a blocking wait that asked for it: its
        // socket is read in a tight loop (see `recv_spin`).
        let spin = if ids.len() == 1 { self.recv_spin } else { 0 };
        let mut n = 0;
        if usable {
            for &id in &ids {
                n += self.read_conn_spin(id, pass, spin);
                // Output waiting for room (a large frame, a get's answer)
                // goes on at once rather than at the next epoll pass: the
                // socket drains while we poll, and a pass every
                // DIRECT_POLL_EVERY would leave it idle meanwhile.
                if self.conns.get(&id.0).is_some_and(|c| !c.out.is_empty()) {
                    self.flush_conn(id);
                }
            }
        }
        self.direct = ids;
        usable.then_some(n)
    }

    /// Takes `id`, a connection the direct passes read, out of the epoll
    /// set (see [`Tcp::unwatched`]); not while it waits to be writable or
    /// is connecting. A failed removal leaves it watched.
    fn unwatch(&mut self, id: ConnId) {
        let Some(c) = self.conns.get(&id.0) else {
            return;
        };
        if c.write_armed || c.connecting || self.unwatched.contains(&id) {
            return;
        }
        if epoll::delete(&self.epoll, c.sock.as_fd()).is_ok() {
            self.unwatched.push(id);
        }
    }

    /// Puts the unwatched connections back into the epoll set, with the
    /// flags each needs now (before a blocking wait, and when the
    /// connections change). A socket already readable is reported by the
    /// next wait (epoll looks at it when it is added). If the kernel
    /// refuses, no wait could be woken by it: that connection fails.
    pub(super) fn rewatch(&mut self) {
        while let Some(id) = self.unwatched.pop() {
            let Some(c) = self.conns.get(&id.0) else {
                continue;
            };
            let added = epoll::add(
                &self.epoll,
                c.sock.as_fd(),
                epoll::EventData::new_u64(u64::from(id.0)),
                watch_flags(c.write_armed),
            );
            match added {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => {
                    self.io_error = Some(format!(
                        "the connection could not be watched again (epoll_ctl: {e})"
                    ));
                    self.conn_broken(id, false);
                }
            }
        }
    }

    /// Reads what the socket has (bounded), decoding every complete item.
    pub(super) fn read_conn(&mut self, conn: ConnId, pass: &mut Pass<'_, '_>) -> usize {
        self.read_conn_spin(conn, pass, 0)
    }

    /// [`Self::read_conn`], trying the first `recv` up to `spin` more times
    /// while the socket has nothing (and nothing of ours waits to be
    /// written on it).
    fn read_conn_spin(&mut self, conn: ConnId, pass: &mut Pass<'_, '_>, mut spin: u32) -> usize {
        let mut events = 0;
        for _ in 0..16 {
            self.apply_unpins(pass.regions);
            let Some(c) = self.conns.get_mut(&conn.0) else {
                return events;
            };
            // A large payload in progress: read it straight into its
            // destination (no read-ahead copy, one syscall per big piece).
            let room = c.dec.direct_payload_room();
            match sync_lowat(c, room, self.cfg.recv_lowat) {
                Ok(false) => {}
                Ok(true) if readable(&c.sock) => {}
                Ok(true) => return events,
                Err(e) => {
                    self.lowat_failed(conn, e);
                    return events;
                }
            }
            let room = room as usize;
            let direct = room >= 4096 && c.cur.is_some();
            let r = if direct {
                let room = room.min(4 << 20);
                let r = match &mut c.into {
                    Some((dst, at)) => {
                        let Some(part) = dst.sub(*at, room.min(dst.len() - *at)) else {
                            // More payload than the destination: the frame
                            // handler refuses it; read through the buffer.
                            break;
                        };
                        // SAFETY: a get's local memory, valid and ours
                        // until the get completes (RawBuf's contract).
                        let d = unsafe { part.as_mut_slice() };
                        match io::Read::read(&mut &c.sock, d) {
                            Ok(n) => {
                                *at += n;
                                Ok(n)
                            }
                            Err(e) => Err(e),
                        }
                    }
                    None => {
                        c.payload.reserve(room);
                        let len = c.payload.len();
                        let spare = &mut c.payload.spare_capacity_mut()[..room];
                        match c.sock.recv(spare) {
                            Ok(n) => {
                                // SAFETY: recv initialised the first `n`
                                // bytes of the spare capacity (n <= room <=
                                // spare length).
                                unsafe { c.payload.set_len(len + n) };
                                Ok(n)
                            }
                            Err(e) => Err(e),
                        }
                    }
                };
                // A socket's errors are errnos: one match below serves
                // both kinds of read.
                r.map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))
            } else {
                if !c.out.is_empty() {
                    spin = 0;
                }
                let spare = c.dec.spare();
                // rustix's recv: the error is the errno itself, so the
                // "nothing yet" of a busy-polled socket costs no decoding.
                let mut r =
                    rustix::net::recv(&c.sock, &mut *spare, RecvFlags::empty()).map(|(n, _)| n);
                while spin > 0 && r == Err(Errno::AGAIN) {
                    spin -= 1;
                    r = rustix::net::recv(&c.sock, &mut *spare, RecvFlags::empty()).map(|(n, _)| n);
                }
                spin = 0;
                r
            };
            match r {
                Ok(0) => {
                    self.conn_broken(conn, true);
                    return events;
                }
                Ok(n) => {
                    self.io_moves = self.io_moves.wrapping_add(1);
                    if direct {
                        c.dec.payload_read_directly(n as u32);
                        events += self.decode(conn, pass);
                        continue;
                    }
                    c.dec.filled(n);
                    let full = n == c.dec.capacity();
                    // Small messages first, without the general decoder
                    // (which a frame boundary with nothing left after them
                    // does not need: it would find no event).
                    events += Self::whole_messages(c, self.cfg.max_frame, pass);
                    if c.dec.buffered() > 0 {
                        events += self.decode(conn, pass);
                    }
                    if !full {
                        // Drained what the socket had (probably): stop here,
                        // epoll says when there is more.
                        return events;
                    }
                }
                Err(Errno::AGAIN) => return events,
                Err(Errno::INTR) => continue,
                Err(e) => {
                    self.io_error = Some(io::Error::from(e).to_string());
                    self.conn_broken(conn, false);
                    return events;
                }
            }
        }
        // Sixteen reads in a row: the mark follows the last of them.
        if let Some(c) = self.conns.get_mut(&conn.0) {
            if let Err(e) = sync_lowat(c, c.dec.direct_payload_room(), self.cfg.recv_lowat) {
                self.lowat_failed(conn, e);
            }
        }
        events
    }

    /// A connection whose `SO_RCVLOWAT` could not be set fails, with the
    /// reason (its mark could be left above what is to come).
    #[cold]
    fn lowat_failed(&mut self, conn: ConnId, e: io::Error) {
        self.io_error = Some(format!(
            "the socket's receive low-water mark could not be set (SO_RCVLOWAT): {e}"
        ));
        self.conn_broken(conn, false);
    }

    /// The small-message fast path: every whole user message at the front
    /// of `c`'s read-ahead buffer goes out in place, one step each (what
    /// the Header, Payload and FrameEnd events of [`Self::decode`] would
    /// do, with one header parse and no per-event state). Leaves the
    /// stream at a frame boundary or where it was; returns the messages.
    fn whole_messages(c: &mut Conn, max_frame: u32, pass: &mut Pass<'_, '_>) -> usize {
        let Some(from) = c
            .peer
            .filter(|_| c.incoming.is_none() && c.payload.is_empty())
        else {
            return 0;
        };
        let mut n = 0;
        while let Some((h, data)) = c.dec.next_whole_frame(max_frame, |h| {
            h.kind == FrameType::Send && h.tag <= MAX_USER_TAG && h.len > 0
        }) {
            (pass.sink)(
                pass.regions,
                TEvent::Message {
                    from,
                    tag: h.tag,
                    data,
                },
            );
            n += 1;
        }
        n
    }

    /// Drains the decoder of `conn`.
    fn decode(&mut self, conn: ConnId, pass: &mut Pass<'_, '_>) -> usize {
        enum Todo {
            Nothing,
            Handshake(HandshakeRepr, bool, Option<u32>),
            Frame(u32, FrameRepr, Vec<u8>),
            Error(btl_core::tcp::wire::WireError, Option<u32>),
        }
        let mut events = 0;
        let max_frame = self.cfg.max_frame;
        loop {
            let todo = {
                let Some(c) = self.conns.get_mut(&conn.0) else {
                    return events;
                };
                let peer = c.peer.filter(|_| c.incoming.is_none());
                events += Self::whole_messages(c, max_frame, pass);
                match c.dec.next_event(max_frame) {
                    None => return events,
                    Some(Err(e)) => Todo::Error(e, peer),
                    Some(Ok(Event::Payload(bytes))) => {
                        match (&mut c.into, c.cur, peer) {
                            (Some((dst, at)), _, _) => {
                                if let Some(part) = dst.sub(*at, bytes.len()) {
                                    // SAFETY: a get's local memory (see
                                    // read_conn).
                                    unsafe { part.as_mut_slice() }.copy_from_slice(bytes);
                                    *at += bytes.len();
                                } else {
                                    *at = usize::MAX;
                                }
                            }
                            (None, Some(h), Some(p))
                                if h.kind == FrameType::Send
                                    && h.tag <= MAX_USER_TAG
                                    && c.payload.is_empty()
                                    && bytes.len() == h.len as usize =>
                            {
                                // The whole message is in the read-ahead
                                // buffer: hand it out in place.
                                c.delivered = true;
                                (pass.sink)(
                                    pass.regions,
                                    TEvent::Message {
                                        from: p,
                                        tag: h.tag,
                                        data: bytes,
                                    },
                                );
                            }
                            _ => c.payload.extend_from_slice(bytes),
                        }
                        Todo::Nothing
                    }
                    Some(Ok(Event::Header(h))) => {
                        c.cur = Some(h);
                        c.payload.clear();
                        c.delivered = false;
                        c.into = None;
                        if h.kind == FrameType::GetResp && !h.error {
                            if let Some(dst) = self.rma.answer_dst(h.id, peer, h.len as usize) {
                                c.into = Some((dst, 0));
                            }
                        }
                        if c.into.is_none() {
                            // `len` is at most max_frame (checked by the
                            // decoder); memory grows as the data arrives,
                            // so a header alone cannot make us allocate
                            // max_frame.
                            c.payload.reserve((h.len as usize).min(1 << 20));
                        }
                        Todo::Nothing
                    }
                    Some(Ok(Event::Handshake(r))) => {
                        Todo::Handshake(r, c.incoming.is_some(), c.peer)
                    }
                    Some(Ok(Event::FrameEnd)) => {
                        if c.lowat_on.take().is_some() {
                            c.big_read_end = Some(Instant::now());
                        }
                        match (c.cur.take(), peer) {
                            (Some(_), Some(_)) if c.delivered => {
                                c.delivered = false;
                                Todo::Nothing
                            }
                            (Some(h), Some(p)) => Todo::Frame(p, h, std::mem::take(&mut c.payload)),
                            _ => Todo::Nothing,
                        }
                    }
                }
            };
            events += 1;
            match todo {
                Todo::Nothing => {}
                Todo::Error(e, Some(peer)) => {
                    log::warn!("tcp: bad frame from peer {peer}: {e}");
                    let a = self.peers[peer as usize].ep.on_protocol_error(conn, e);
                    self.apply(peer, a);
                    self.drop_conn(conn);
                    return events;
                }
                Todo::Error(e, None) => {
                    self.reject(conn, &e);
                    return events;
                }
                Todo::Handshake(repr, true, _) => self.on_incoming_handshake(conn, repr),
                Todo::Handshake(repr, false, Some(peer)) => {
                    let a = self.peers[peer as usize].ep.on_handshake(conn, repr);
                    self.apply(peer, a);
                }
                Todo::Handshake(_, false, None) => {}
                Todo::Frame(peer, h, payload) => {
                    let into = self.conns.get_mut(&conn.0).and_then(|c| c.into.take());
                    self.on_frame(conn, peer, h, &payload, into, pass);
                    // Give the buffer back for reuse.
                    if let Some(c) = self.conns.get_mut(&conn.0) {
                        if c.cur.is_none() && c.payload.capacity() == 0 {
                            let mut payload = payload;
                            payload.clear();
                            c.payload = payload;
                        }
                    }
                }
            }
        }
    }

    fn on_frame(
        &mut self,
        conn: ConnId,
        peer: u32,
        h: FrameRepr,
        payload: &[u8],
        into: Option<(RawBuf, usize)>,
        pass: &mut Pass<'_, '_>,
    ) {
        match h.kind {
            FrameType::Send if h.tag == TAG_CHUNK => self.on_chunk(peer, payload, pass),
            FrameType::Send if h.tag == TAG_BARRIER => match BarrierRepr::parse_bytes(payload) {
                Ok(msg) => (pass.sink)(pass.regions, TEvent::Barrier { from: peer, msg }),
                Err(e) => log::warn!("tcp: from {peer}: {e}; dropped"),
            },
            FrameType::Send if h.tag <= MAX_USER_TAG => (pass.sink)(
                pass.regions,
                TEvent::Message {
                    from: peer,
                    tag: h.tag,
                    data: payload,
                },
            ),
            FrameType::Send => log::warn!("tcp: rank {peer} used reserved tag {}", h.tag),
            FrameType::Fin => {
                let a = self.peers[peer as usize].ep.on_fin(conn);
                self.apply(peer, a);
            }
            FrameType::Put | FrameType::Get => self.serve_rma(peer, h, payload, pass.regions),
            FrameType::GetResp | FrameType::PutAck => {
                self.rma.on_answer(peer, h, payload, into, &mut self.done)
            }
        }
    }

    /// A chunk of a large message arrived.
    fn on_chunk(&mut self, peer: u32, payload: &[u8], pass: &mut Pass<'_, '_>) {
        let p = &mut self.peers[peer as usize];
        let mut entry = match p.partial.take() {
            Some(e) => e,
            None => {
                let Some(h) = payload.get(..CHUNK_HEADER) else {
                    log::warn!("tcp: short chunk header from {peer}");
                    return;
                };
                let tag = h[0];
                let total = u64::from_le_bytes(h[8..16].try_into().unwrap_or_default());
                if tag > MAX_USER_TAG || total > MAX_MESSAGE {
                    log::warn!(
                        "tcp: chunked message from {peer} with tag {tag}, length {total}: refused"
                    );
                    return;
                }
                // Memory grows as chunks arrive: the announced total alone
                // (any peer can write it) reserves at most 1 MiB.
                let v = Vec::with_capacity((total as usize).min(1 << 20));
                let entry = (tag, total, v);
                let rest = &payload[CHUNK_HEADER..];
                return self.chunk_data(peer, entry, rest, pass);
            }
        };
        if entry.2.len() as u64 + payload.len() as u64 > entry.1 {
            log::warn!("tcp: chunk from {peer} overruns its message; dropped");
            return;
        }
        entry.2.extend_from_slice(payload);
        self.chunk_done(peer, entry, pass);
    }

    fn chunk_data(
        &mut self,
        peer: u32,
        mut entry: (u8, u64, Vec<u8>),
        data: &[u8],
        pass: &mut Pass<'_, '_>,
    ) {
        if entry.2.len() as u64 + data.len() as u64 > entry.1 {
            log::warn!("tcp: chunk from {peer} longer than its message");
            return;
        }
        entry.2.extend_from_slice(data);
        self.chunk_done(peer, entry, pass);
    }

    fn chunk_done(&mut self, peer: u32, entry: (u8, u64, Vec<u8>), pass: &mut Pass<'_, '_>) {
        if entry.2.len() as u64 == entry.1 {
            (pass.sink)(
                pass.regions,
                TEvent::Message {
                    from: peer,
                    tag: entry.0,
                    data: &entry.2,
                },
            );
        } else {
            self.peers[peer as usize].partial = Some(entry);
        }
    }

    /// Sends barrier message `msg` to `peer` (the TCP barrier's frame,
    /// which the bare-metal node speaks too). Never refused for queue
    /// bounds.
    pub fn send_barrier(&mut self, peer: u32, msg: BarrierRepr) -> Result<(), PostError> {
        if peer >= self.n || peer == self.me {
            return Err(PostError::InvalidPeer);
        }
        if self.peers[peer as usize].failed.is_some() {
            return Err(PostError::PeerFailed);
        }
        self.post(
            peer,
            FrameRepr::send(TAG_BARRIER, msg.buffer_len() as u32),
            &[&msg.to_bytes()[..msg.buffer_len()]],
            None,
        )
        .map(|_| ())
    }
}

/// Large reads in large pieces (`recv_lowat` = `mark` bytes, 0: off; at
/// least 4096, see `Config::from`): sets `c`'s `SO_RCVLOWAT` to `mark`
/// while more than `mark` bytes (`room`, the decoder's
/// `direct_payload_room`) of the payload being read straight into place
/// are still to come, and back to 1 otherwise. Returns whether the
/// connection is to be read only when `poll` says `mark` bytes wait
/// ([`readable`]; epoll waits for them too).
///
/// Why: on loopback the sending core limits a stream, and it also
/// handles the acknowledgements that the receiver's reads send. Read as
/// they trickled in (often one 64 KiB segment per `recv`), payloads cost
/// the sender a third more kernel time than with the mark and three times
/// the acknowledgements on TCP's fast path, and ob1 over rtcp about a
/// fifth of its windowed 1 MiB bandwidth.
///
/// Which payloads: those of frames of [`PIECE_FRAME_MIN`] bytes or more,
/// and smaller ones that begin within [`STREAM_GAP`] of the end of the
/// last payload of more than `mark` bytes on the connection (a stream: a
/// window of get answers, whose first is read as it arrives). A lone
/// one — a ping-pong's — is read as it arrives: there the poll before each
/// read and the two `setsockopt` calls would cost more than they save (a
/// 1 MiB ping-pong took 5 % longer, a 256 KiB one 30 %).
///
/// Liveness: the mark is raised only while more than `mark` bytes of the
/// frame are still to come, so they arrive unless the peer stops mid-frame
/// (then its FIN, RST or the dead-link timeouts make the socket readable
/// regardless of the mark); the kernel also reports a socket readable
/// below the mark when its receive window is closing, and caps the mark at
/// half a fixed `rcvbuf`. `read_conn_spin` calls this before every read
/// and before it returns, so the mark is never left above what is to come.
fn sync_lowat(c: &mut Conn, room: u32, mark: u32) -> io::Result<bool> {
    let want = match &c.cur {
        Some(f) if mark > 0 && room > mark => {
            let (len, last) = (f.len as usize, c.big_read_end);
            let on = *c.lowat_on.get_or_insert_with(|| {
                len >= PIECE_FRAME_MIN || last.is_some_and(|t| t.elapsed() < STREAM_GAP)
            });
            if on {
                mark
            } else {
                1
            }
        }
        _ => 1,
    };
    if want != c.lowat {
        set_recv_lowat(&c.sock, want)?;
        c.lowat = want;
    }
    Ok(want > 1)
}

/// Whether `sock` reports readable now (`poll`, no wait; its low-water
/// mark counts). An error of `poll` itself says yes: the read that
/// follows reports the socket's state.
fn readable(sock: &Socket) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        sock,
        rustix::event::PollFlags::IN,
    )];
    let now = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    !matches!(rustix::event::poll(&mut fds, Some(&now)), Ok(0))
}

/// How soon after the end of the last large payload a new one must begin
/// for [`sync_lowat`] to count it as part of a stream. Measured from the
/// one frame's end to the next one's header, in ob1's window of 1 MiB get
/// answers 85 % of the gaps were below 20 µs and 92 % below 50; in its
/// ping-pong (a transfer the other way and two small messages between)
/// they were 30–50 µs at 180 KB, 50–100 at 256 KiB, 100 and more at
/// 1 MiB. A lone payload taken for a stream costs little when it is
/// small: only what exceeds the mark is gated.
const STREAM_GAP: Duration = Duration::from_micros(30);

/// `setsockopt(SO_RCVLOWAT)` (neither rustix nor socket2 has it).
fn set_recv_lowat(sock: &Socket, bytes: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the descriptor is `sock`'s, open while it is borrowed; the
    // option value is a c_int on this stack and `len` is its size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&v as *const libc::c_int).cast(),
            len,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// What epoll watches on an established connection: input, and output
/// while frames wait for room.
fn watch_flags(out: bool) -> epoll::EventFlags {
    if out {
        epoll::EventFlags::IN | epoll::EventFlags::OUT
    } else {
        epoll::EventFlags::IN
    }
}

#[cfg(test)]
mod tests {
    use super::concat_from;

    #[test]
    fn concat_from_skips_across_pieces() {
        let parts: [&[u8]; 3] = [b"abc", b"", b"defgh"];
        let all = b"abcdefgh";
        for skip in 0..=all.len() + 2 {
            let want = &all[skip.min(all.len())..];
            assert_eq!(concat_from(&parts, skip, all.len()), want, "skip {skip}");
        }
        assert!(concat_from(&[], 0, 0).is_empty());
    }
}
