//! Framing I/O: writing frames (one `writev`, queued remainders, large
//! frames straight from the caller's buffer), reading and decoding them
//! (read-ahead buffer, direct reads of large payloads, the busy-polling
//! fast path), delivering messages and reassembling chunked ones.
//!
//! # Safety
//!
//! One `unsafe` block: after `recv` into a `Vec`'s spare capacity, the
//! length is set to cover exactly the bytes the kernel wrote.
#![allow(unsafe_code)]

use std::io::{self, IoSlice};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use btl_core::rma::RmaStatus;
use btl_core::tcp::decoder::Event;
use btl_core::tcp::endpoint::{ConnId, SendDecision};
use btl_core::tcp::wire::{FrameRepr, FrameType, HandshakeRepr};
use rustix::event::epoll;

use super::*;

pub(super) fn frame_bytes(repr: &FrameRepr, payload: &[&[u8]]) -> Vec<u8> {
    let len: usize = payload.iter().map(|p| p.len()).sum();
    let mut v = Vec::with_capacity(16 + len);
    v.extend_from_slice(&repr.to_bytes());
    for p in payload {
        v.extend_from_slice(p);
    }
    v
}

impl Tcp {
    /// Appends bytes to a connection's output and tries to write.
    pub(super) fn queue_bytes(&mut self, conn: ConnId, bytes: Vec<u8>) {
        if let Some(c) = self.conns.get_mut(&conn.0) {
            c.out.push_back(bytes);
        }
        self.flush_conn(conn);
    }

    /// Writes as much of a connection's output as the socket takes, arming
    /// EPOLLOUT for the rest.
    pub(super) fn flush_conn(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn.0) else {
            return;
        };
        if c.connecting || c.writing_in_place {
            return;
        }
        let mut failed = false;
        while let Some(front) = c.out.front() {
            let slices: Vec<IoSlice<'_>> = c
                .out
                .iter()
                .take(64)
                .enumerate()
                .map(|(i, b)| IoSlice::new(if i == 0 { &front[c.out_off..] } else { b }))
                .collect();
            match c.sock.send_vectored(&slices) {
                Ok(mut n) => {
                    while n > 0 {
                        let Some(f) = c.out.front() else { break };
                        let left = f.len() - c.out_off;
                        if n >= left {
                            n -= left;
                            c.out.pop_front();
                            c.out_off = 0;
                        } else {
                            c.out_off += n;
                            n = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        let want = !c.out.is_empty();
        if want != c.write_armed && !failed {
            c.write_armed = want;
            let flags = if want {
                epoll::EventFlags::IN | epoll::EventFlags::OUT
            } else {
                epoll::EventFlags::IN
            };
            let _ = epoll::modify(
                &self.epoll,
                c.sock.as_fd(),
                epoll::EventData::new_u64(u64::from(conn.0)),
                flags,
            );
        }
        if failed {
            self.conn_broken(conn, false);
        } else if c.out.is_empty() && c.close_after_write {
            self.drop_conn(conn);
        }
    }

    /// The busy-polling fast path: with at most [`DIRECT_POLL_MAX`]
    /// established connections, a non-blocking pass reads each of them
    /// directly (one `recv` that usually says "nothing", instead of
    /// `epoll_wait` and then `recv`: one system call less per message).
    /// Every [`DIRECT_POLL_EVERY`]-th pass goes through epoll as usual, for
    /// accepts, connects, writability and hang-ups. `None` when the fast
    /// path does not apply.
    pub(super) fn poll_direct(&mut self) -> Option<usize> {
        let mut ids = std::mem::take(&mut self.direct);
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
        let usable = !ids.is_empty() && ids.len() <= DIRECT_POLL_MAX;
        let mut n = 0;
        if usable {
            for &id in &ids {
                n += self.read_conn(id);
            }
        }
        self.direct = ids;
        usable.then_some(n)
    }

    /// Reads what the socket has (bounded), decoding every complete item.
    pub(super) fn read_conn(&mut self, conn: ConnId) -> usize {
        let mut events = 0;
        for _ in 0..16 {
            let Some(c) = self.conns.get_mut(&conn.0) else {
                return events;
            };
            // A large payload in progress: read it straight into the frame's
            // buffer (no read-ahead copy, one syscall per big piece).
            let room = c.dec.direct_payload_room() as usize;
            if room >= 4096 && c.cur.is_some() {
                let room = room.min(4 << 20);
                c.payload.reserve(room);
                let len = c.payload.len();
                let spare = &mut c.payload.spare_capacity_mut()[..room];
                match c.sock.recv(spare) {
                    Ok(0) => {
                        self.conn_broken(conn, true);
                        return events;
                    }
                    Ok(n) => {
                        // SAFETY: recv initialised the first `n` bytes of
                        // the spare capacity (n <= room <= spare length).
                        unsafe { c.payload.set_len(len + n) };
                        c.dec.payload_read_directly(n as u32);
                        events += self.decode(conn);
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return events,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        self.conn_broken(conn, false);
                        return events;
                    }
                }
            }
            let spare = c.dec.spare();
            let r = io::Read::read(&mut &c.sock, spare);
            match r {
                Ok(0) => {
                    self.conn_broken(conn, true);
                    return events;
                }
                Ok(n) => {
                    c.dec.filled(n);
                    events += self.decode(conn);
                    let full = n == self.conns.get(&conn.0).map_or(0, |c| c.dec.capacity());
                    if !full {
                        // Drained what the socket had (probably): stop here,
                        // epoll says when there is more.
                        return events;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return events,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.conn_broken(conn, false);
                    return events;
                }
            }
        }
        events
    }

    /// Drains the decoder of `conn`.
    pub(super) fn decode(&mut self, conn: ConnId) -> usize {
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
                match c.dec.next_event(max_frame) {
                    None => return events,
                    Some(Err(e)) => Todo::Error(e, c.peer.filter(|_| c.incoming.is_none())),
                    Some(Ok(Event::Payload(bytes))) => {
                        c.payload.extend_from_slice(bytes);
                        Todo::Nothing
                    }
                    Some(Ok(Event::Header(h))) => {
                        c.cur = Some(h);
                        c.payload.clear();
                        // `len` is at most max_frame (checked by the
                        // decoder); memory grows as the data arrives, so a
                        // header alone cannot make us allocate max_frame.
                        c.payload.reserve((h.len as usize).min(1 << 20));
                        Todo::Nothing
                    }
                    Some(Ok(Event::Handshake(r))) => {
                        Todo::Handshake(r, c.incoming.is_some(), c.peer)
                    }
                    Some(Ok(Event::FrameEnd)) => match (c.cur.take(), c.peer) {
                        (Some(h), Some(p)) if c.incoming.is_none() => {
                            Todo::Frame(p, h, std::mem::take(&mut c.payload))
                        }
                        _ => Todo::Nothing,
                    },
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
                    self.on_frame(conn, peer, h, &payload);
                    // Give the buffer back for reuse — unless a nested
                    // progress (a large reply written in place) already
                    // started the next frame in a new one.
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

    pub(super) fn on_frame(&mut self, conn: ConnId, peer: u32, h: FrameRepr, payload: &[u8]) {
        match h.kind {
            FrameType::Send if h.tag == TAG_CHUNK => self.on_chunk(peer, payload),
            FrameType::Send if h.tag == TAG_BARRIER => {
                if let Ok(b) = <[u8; 8]>::try_from(payload) {
                    let seen = self
                        .barrier_arrivals
                        .entry(u64::from_le_bytes(b))
                        .or_default();
                    if !seen.contains(&peer) {
                        seen.push(peer);
                    }
                }
            }
            FrameType::Send => match self
                .handlers
                .get_mut(usize::from(h.tag))
                .and_then(Option::as_mut)
            {
                Some(handler) => handler(peer, payload),
                None => log::warn!(
                    "tcp: message from {peer} with tag {}, which has no handler",
                    h.tag
                ),
            },
            FrameType::Fin => {
                let a = self.peers[peer as usize].ep.on_fin(conn);
                self.apply(peer, a);
            }
            FrameType::Put | FrameType::Get => self.serve_rma(peer, h, payload),
            FrameType::GetResp | FrameType::PutAck => match self.rma_wait.get_mut(&h.id) {
                Some((p, status, data)) if *p == peer => {
                    *status = Some(if h.error {
                        RmaStatus::OutOfBounds
                    } else {
                        RmaStatus::Ok
                    });
                    if h.kind == FrameType::GetResp {
                        data.extend_from_slice(payload);
                    }
                }
                _ => log::warn!("tcp: {:?} from {peer} for unknown request {}", h.kind, h.id),
            },
        }
    }

    /// Sends `data` to rank `peer` with `tag` (one frame, at most
    /// `max_frame` bytes). The connection opens on the first send; until it
    /// is up the frame waits in the peer's queue. Returns once the bytes are
    /// written or queued (`data` may be reused).
    pub fn send(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), TcpError> {
        if tag > MAX_USER_TAG {
            return Err(TcpError::ReservedTag { tag });
        }
        let max = self.cfg.max_frame as usize;
        if data.len() <= max {
            return self.send_frame(peer, tag, data);
        }
        if data.len() as u64 > MAX_MESSAGE {
            return Err(TcpError::TooLarge {
                len: data.len(),
                max: MAX_MESSAGE as u32,
            });
        }
        // Larger than a frame: chunks on the internal tag.
        let mut first = [0u8; CHUNK_HEADER];
        first[0] = tag;
        first[8..16].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let step = max - CHUNK_HEADER;
        let mut buf = Vec::with_capacity(max);
        buf.extend_from_slice(&first);
        buf.extend_from_slice(&data[..step]);
        self.send_frame(peer, TAG_CHUNK, &buf)?;
        for chunk in data[step..].chunks(max) {
            self.send_frame(peer, TAG_CHUNK, chunk)?;
        }
        Ok(())
    }

    /// A chunk of a large message arrived.
    pub(super) fn on_chunk(&mut self, peer: u32, payload: &[u8]) {
        let entry = match self.partial.remove(&peer) {
            Some(e) => Some(e),
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
                let mut v = Vec::with_capacity((total as usize).min(1 << 20));
                v.extend_from_slice(&payload[CHUNK_HEADER..]);
                if v.len() as u64 > total {
                    log::warn!("tcp: chunk from {peer} longer than its message");
                    return;
                }
                self.partial.insert(peer, (tag, total, v));
                None
            }
        };
        if let Some((tag, total, mut v)) = entry {
            if v.len() as u64 + payload.len() as u64 > total {
                log::warn!("tcp: chunk from {peer} overruns its message; dropped");
                return;
            }
            v.extend_from_slice(payload);
            self.partial.insert(peer, (tag, total, v));
        }
        if self
            .partial
            .get(&peer)
            .is_some_and(|(_, t, v)| v.len() as u64 == *t)
        {
            if let Some((tag, _, v)) = self.partial.remove(&peer) {
                match self
                    .handlers
                    .get_mut(usize::from(tag))
                    .and_then(Option::as_mut)
                {
                    Some(h) => h(peer, &v),
                    None => {
                        log::warn!("tcp: message from {peer} with tag {tag}, which has no handler")
                    }
                }
            }
        }
    }

    pub(super) fn send_frame(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), TcpError> {
        let len = u32::try_from(data.len())
            .ok()
            .filter(|&l| l <= self.cfg.max_frame)
            .ok_or(TcpError::TooLarge {
                len: data.len(),
                max: self.cfg.max_frame,
            })?;
        self.send_repr(peer, FrameRepr::send(tag, len), data)
    }

    /// Sends one frame (`repr.len == data.len()`, at most `max_frame`).
    pub(super) fn send_repr(
        &mut self,
        peer: u32,
        repr: FrameRepr,
        data: &[u8],
    ) -> Result<(), TcpError> {
        if peer >= self.n || peer == self.me {
            return Err(TcpError::InvalidPeer { peer });
        }
        let now = self.now_ms();
        match self.peers[peer as usize].ep.on_send_request(now) {
            SendDecision::SendNow { conn } => self.write_frame(conn, &repr, data),
            SendDecision::Queue => {
                self.peers[peer as usize]
                    .queue
                    .push_back(frame_bytes(&repr, &[data]));
                Ok(())
            }
            SendDecision::QueueAndConnect => {
                self.peers[peer as usize]
                    .queue
                    .push_back(frame_bytes(&repr, &[data]));
                self.start_connect(peer)
            }
            SendDecision::Refuse(reason) => Err(TcpError::PeerFailed {
                peer,
                why: reason.to_string(),
            }),
        }
    }

    /// Header and payload in one `writev` when nothing is queued ahead.
    /// A small remainder the socket does not take is queued (copied); a
    /// large one is written straight from `data` while progressing
    /// (reading what peers send, so two ranks sending to each other cannot
    /// deadlock) — no user-space copy of bulk data, and `send` returns when
    /// the kernel has it all.
    pub(super) fn write_frame(
        &mut self,
        conn: ConnId,
        repr: &FrameRepr,
        data: &[u8],
    ) -> Result<(), TcpError> {
        /// Remainders above this are written in place rather than queued.
        const DIRECT_MIN: usize = 64 * 1024;
        let hdr = repr.to_bytes();
        let total = hdr.len() + data.len();
        let mut written = 0usize;
        {
            let Some(c) = self.conns.get_mut(&conn.0) else {
                return Err(TcpError::Io {
                    what: "find the connection",
                    source: io::Error::other("connection vanished"),
                });
            };
            if !c.out.is_empty() || c.connecting || c.writing_in_place {
                c.out.push_back(frame_bytes(repr, &[data]));
                self.flush_conn(conn);
                return Ok(());
            }
        }
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let Some(c) = self.conns.get_mut(&conn.0) else {
                // The connection broke meanwhile (its peer is failed now).
                return Err(TcpError::Io {
                    what: "write a frame",
                    source: io::Error::other("connection lost"),
                });
            };
            let bufs: [IoSlice<'_>; 2] = if written < hdr.len() {
                [IoSlice::new(&hdr[written..]), IoSlice::new(data)]
            } else {
                [
                    IoSlice::new(&data[written - hdr.len()..]),
                    IoSlice::new(&[]),
                ]
            };
            match c.sock.send_vectored(&bufs) {
                Ok(n) => {
                    written += n;
                    if written >= total {
                        c.writing_in_place = false;
                        self.flush_conn(conn);
                        return Ok(());
                    }
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => {
                    c.writing_in_place = false;
                    self.conn_broken(conn, false);
                    return Ok(());
                }
            }
            if total - written <= DIRECT_MIN {
                let mut rest = Vec::with_capacity(total - written);
                if written < hdr.len() {
                    rest.extend_from_slice(&hdr[written..]);
                    rest.extend_from_slice(data);
                } else {
                    rest.extend_from_slice(&data[written - hdr.len()..]);
                }
                c.writing_in_place = false;
                c.out.push_front(rest);
                self.flush_conn(conn);
                return Ok(());
            }
            // Large remainder: keep the connection to ourselves (frames
            // queued meanwhile wait behind this one) and progress until the
            // socket takes more.
            c.writing_in_place = true;
            if !c.write_armed {
                // Wake up as soon as the socket takes more.
                c.write_armed = true;
                let _ = epoll::modify(
                    &self.epoll,
                    c.sock.as_fd(),
                    epoll::EventData::new_u64(u64::from(conn.0)),
                    epoll::EventFlags::IN | epoll::EventFlags::OUT,
                );
            }
            if start.elapsed() > self.timeout {
                return Err(TcpError::Timeout {
                    what: "the socket to take a large frame",
                });
            }
            // Busy-poll first (the receiver usually drains the socket in
            // microseconds; sleeping in epoll_wait and being woken costs
            // more), then block up to 200 µs at a time.
            spins = spins.saturating_add(1);
            let wait = if spins < WRITE_SPINS {
                Duration::ZERO
            } else {
                Duration::from_micros(200)
            };
            self.progress_timeout(wait);
        }
    }
}
