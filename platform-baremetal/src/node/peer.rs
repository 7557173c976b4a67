//! Per-peer state: the endpoint state machine, the peer's address, its
//! outgoing queue (frames wait there until the connection is up, then
//! flow into the connection's socket), its message buffer (where frames
//! and chunked messages are assembled), and its failure — plus what is
//! done for all peers at once: the barrier, a clean close, the endpoint's
//! actions carried out on sockets and queues.

use btl_core::barrier::{BarrierRepr, Schedule, ARRIVED_LEN};
use btl_core::tcp::endpoint::{
    Action, CloseCause, ConnId, Endpoint, EndpointState, FailReason, SendDecision,
};
use btl_core::tcp::wire::{
    FrameRepr, CHUNK_HEADER_LEN, FRAME_HEADER_LEN, MAX_USER_TAG, TAG_BARRIER, TAG_CHUNK,
};
use btl_core::{debug, warn};
use smoltcp::socket::tcp;
use smoltcp::wire::{IpAddress, IpEndpoint};

use super::pool::Role;
use super::rma::Reply;
use super::{ConfigError, Node, SendError};
use crate::ring::Ring;

/// A chunked message being assembled in the peer's message buffer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Chunk {
    pub(super) tag: u8,
    pub(super) total: usize,
    pub(super) have: usize,
}

/// One peer (rank) of the job.
pub(super) struct Peer<'a> {
    pub(super) ep: Endpoint,
    pub(super) addr: Option<IpEndpoint>,
    pub(super) out: Ring<'a>,
    /// The connection `out` flows to.
    pub(super) out_conn: Option<ConnId>,
    pub(super) msg: &'a mut [u8],
    pub(super) chunk: Option<Chunk>,
    pub(super) want_connect: bool,
    pub(super) failed: Option<FailReason>,
    pub(super) reported: bool,
    /// An RMA answer waiting for room in `out` (reading from the peer
    /// pauses meanwhile).
    pub(super) reply: Option<Reply>,
}

impl<'a, const S: usize, const P: usize> Node<'a, S, P> {
    /// Where rank `peer` listens (static configuration or wire-up). May
    /// be set before or after the first send to it (the connect waits for
    /// it until the handshake timeout).
    pub fn set_peer(
        &mut self,
        peer: u32,
        addr: impl Into<IpAddress>,
        port: u16,
    ) -> Result<(), ConfigError> {
        if peer == self.cfg.rank || peer >= self.cfg.size {
            return Err(ConfigError::InvalidPeer { peer });
        }
        let addr = addr.into();
        if port == 0 || addr.is_unspecified() {
            return Err(ConfigError::BadAddress);
        }
        self.peers[peer as usize].addr = Some(IpEndpoint::new(addr, port));
        Ok(())
    }

    /// The state of the endpoint of `peer`.
    pub fn peer_state(&self, peer: u32) -> Option<EndpointState> {
        self.peers.get(peer as usize).map(|p| p.ep.state())
    }

    /// Whether `peer` closed its connection cleanly (a FIN frame) and has
    /// none open now: it has left, unless it connects again later.
    pub fn peer_closed(&self, peer: u32) -> bool {
        self.peers.get(peer as usize).is_some_and(|p| {
            p.ep.state() == EndpointState::Closed && p.ep.last_close() == Some(CloseCause::Peer)
        })
    }

    /// The first failed peer, if any.
    pub fn failed_peer(&self) -> Option<(u32, FailReason)> {
        self.peers
            .iter()
            .enumerate()
            .find_map(|(r, p)| p.failed.map(|f| (r as u32, f)))
    }

    pub(super) fn check_peer(&self, peer: u32) -> Result<(), SendError> {
        if peer == self.cfg.rank || peer >= self.cfg.size {
            return Err(SendError::InvalidPeer { peer });
        }
        if let Some(reason) = self.peers[peer as usize].failed {
            return Err(SendError::PeerFailed { peer, reason });
        }
        Ok(())
    }

    /// Queues one frame (header + parts) to `peer`; room was checked.
    pub(super) fn queue_frame(
        &mut self,
        peer: u32,
        repr: FrameRepr,
        parts: &[&[u8]],
    ) -> Result<(), SendError> {
        let p = &mut self.peers[peer as usize];
        match p.ep.on_send_request(self.now) {
            SendDecision::SendNow { conn } => {
                p.out_conn = Some(conn);
            }
            SendDecision::Queue => {}
            SendDecision::QueueAndConnect => p.want_connect = true,
            SendDecision::Refuse(reason) => return Err(SendError::PeerFailed { peer, reason }),
        }
        let hdr = repr.to_bytes();
        let mut all: heapless::Vec<&[u8], 4> = heapless::Vec::new();
        let _ = all.push(&hdr);
        for part in parts {
            let _ = all.push(part);
        }
        if !p.out.push(&all) {
            // Cannot happen: callers check the room first.
            return Err(SendError::QueueFull { peer });
        }
        self.flush_peer(peer);
        Ok(())
    }

    /// Sends `data` to `peer` with a user `tag`: queued whole (in several
    /// frames if it is larger than `max_frame`) or not at all. The
    /// connection opens on the first send; bytes leave on the next
    /// [`Self::poll`].
    pub fn send(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), SendError> {
        if tag > MAX_USER_TAG {
            return Err(SendError::ReservedTag { tag });
        }
        self.check_peer(peer)?;
        let f = self.max_frame as usize;
        let max = self.max_message();
        if data.len() > max {
            return Err(SendError::TooLarge {
                len: data.len(),
                max,
            });
        }
        if data.len() <= f {
            if self.peers[peer as usize].out.free() < FRAME_HEADER_LEN + data.len() {
                return Err(SendError::QueueFull { peer });
            }
            return self.queue_frame(peer, FrameRepr::send(tag, data.len() as u32), &[data]);
        }
        // Chunks on the internal tag, as btl-linux sends them.
        let first = f - CHUNK_HEADER_LEN;
        let frames = 1 + (data.len() - first).div_ceil(f);
        let need = frames * FRAME_HEADER_LEN + CHUNK_HEADER_LEN + data.len();
        if self.peers[peer as usize].out.free() < need {
            return Err(SendError::QueueFull { peer });
        }
        let mut head = [0u8; CHUNK_HEADER_LEN];
        head[0] = tag;
        head[8..16].copy_from_slice(&(data.len() as u64).to_le_bytes());
        self.queue_frame(
            peer,
            FrameRepr::send(TAG_CHUNK, f as u32),
            &[&head, &data[..first]],
        )?;
        for chunk in data[first..].chunks(f) {
            self.queue_frame(
                peer,
                FrameRepr::send(TAG_CHUNK, chunk.len() as u32),
                &[chunk],
            )?;
        }
        Ok(())
    }

    /// Enters the next barrier: tells the live peers of its first round
    /// (every peer up to [`btl_core::barrier::DIRECT_MAX`] ranks, one by
    /// dissemination above; the later rounds go out from [`Self::poll`]).
    /// Returns its epoch, for [`Self::barrier_done`].
    pub fn barrier_start(&mut self) -> Result<u64, SendError> {
        let Some(s) = self.barrier_schedule() else {
            return Ok(self.barrier_epoch);
        };
        for r in s.sends(0) {
            let p = &self.peers[r as usize];
            if p.failed.is_none() && p.out.free() < FRAME_HEADER_LEN + ARRIVED_LEN {
                return Err(SendError::QueueFull { peer: r });
            }
        }
        self.barrier_epoch += 1;
        self.barrier_sent = 0;
        self.barrier_send_round(s, 0)?;
        Ok(self.barrier_epoch)
    }

    /// Whether the barrier `epoch` is complete: every round's message
    /// arrived, or its sender failed (failed ranks are not waited for).
    pub fn barrier_done(&self, epoch: u64) -> bool {
        let Some(s) = self.barrier_schedule() else {
            return true;
        };
        epoch < self.barrier_epoch
            || (epoch == self.barrier_epoch
                && self.barrier_sent >= s.rounds()
                && self.barrier_round_done(s, epoch, s.rounds() - 1))
    }

    /// Our barrier schedule (all ranks take part).
    fn barrier_schedule(&self) -> Option<Schedule> {
        Schedule::new(self.cfg.size, self.cfg.rank)
    }

    /// Counts a barrier arrival from `peer`.
    pub(super) fn barrier_arrived(&mut self, peer: u32, epoch: u64) {
        let Some(s) = self.barrier_schedule() else {
            return;
        };
        let Some(round) = s.round_of(peer) else {
            warn!(
                "btl-baremetal: barrier message from {}, who has no round with us",
                peer
            );
            return;
        };
        let slot = &mut self.barrier[(epoch % 4) as usize];
        if slot.0 != epoch {
            *slot = (epoch, 0, 0);
        }
        slot.1 += 1;
        slot.2 |= 1u64 << (round % 64);
        self.barrier_advance();
    }

    /// Whether `round` of barrier `epoch` has what it waits for.
    fn barrier_round_done(&self, s: Schedule, epoch: u64, round: u32) -> bool {
        let (e, count, rounds) = self.barrier[(epoch % 4) as usize];
        match s {
            Schedule::Direct { .. } => {
                let failed = self.peers.iter().filter(|p| p.failed.is_some()).count() as u32;
                (if e == epoch { count } else { 0 }) + failed >= s.size() - 1
            }
            Schedule::Dissemination { .. } => s.expects(round).all(|p| {
                (e == epoch && (rounds >> (round % 64)) & 1 == 1)
                    || self.peers[p as usize].failed.is_some()
            }),
        }
    }

    /// Sends the next rounds of the current barrier whose turn has come.
    pub(super) fn barrier_advance(&mut self) {
        let Some(s) = self.barrier_schedule() else {
            return;
        };
        let epoch = self.barrier_epoch;
        while epoch > 0
            && self.barrier_sent < s.rounds()
            && self.barrier_round_done(s, epoch, self.barrier_sent - 1)
        {
            // A full queue: the next poll tries again.
            if self.barrier_send_round(s, self.barrier_sent).is_err() {
                break;
            }
        }
    }

    fn barrier_send_round(&mut self, s: Schedule, round: u32) -> Result<(), SendError> {
        let msg = BarrierRepr::Arrived {
            epoch: self.barrier_epoch,
        };
        let bytes = msg.to_bytes();
        for peer in s.sends(round) {
            if self.peers[peer as usize].failed.is_none() {
                self.queue_frame(
                    peer,
                    FrameRepr::send(TAG_BARRIER, ARRIVED_LEN as u32),
                    &[&bytes[..ARRIVED_LEN]],
                )?;
            }
        }
        self.barrier_sent = round + 1;
        Ok(())
    }

    /// Closes every connection cleanly (a FIN frame, then TCP's FIN);
    /// later sends reconnect.
    pub fn close(&mut self) {
        for peer in 0..self.cfg.size {
            let a = self.peers[peer as usize].ep.close();
            self.apply(peer, a);
        }
    }

    /// Whether everything queued was written and acknowledged by the
    /// peers' TCP (failed peers aside).
    pub fn is_flushed(&self) -> bool {
        let queues = self
            .peers
            .iter()
            .all(|p| p.failed.is_some() || (p.out.is_empty() && p.reply.is_none()));
        queues
            && self.slots.iter().all(|s| {
                !matches!(s.role, Role::Conn(_))
                    || self.sockets.get::<tcp::Socket>(s.handle).send_queue() == 0
            })
    }

    /// Writes `peer`'s queue into its connection's socket.
    pub(super) fn flush_peer(&mut self, peer: u32) {
        let pi = peer as usize;
        self.send_reply(peer);
        let Some(conn) = self.peers[pi].out_conn else {
            return;
        };
        let Some(i) = self.slot_of(conn) else {
            self.peers[pi].out_conn = None;
            return;
        };
        let handle = self.slots[i].handle;
        let sock = self.sockets.get_mut::<tcp::Socket>(handle);
        if !sock.may_send() {
            return;
        }
        let out = &mut self.peers[pi].out;
        while !out.is_empty() {
            let front = out.front();
            let n = sock.send_slice(front).unwrap_or(0);
            let all = n == front.len();
            out.consume(n);
            if !all {
                break;
            }
        }
        if out.is_empty() && self.slots[i].fin_pending {
            let fin = FrameRepr::fin().to_bytes();
            if sock.send_capacity() - sock.send_queue() >= fin.len() {
                let _ = sock.send_slice(&fin);
                sock.close();
                self.slots[i].fin_pending = false;
                self.peers[pi].out_conn = None;
            }
        }
    }

    /// Carries out an endpoint action for `peer`.
    pub(super) fn apply(&mut self, peer: u32, action: Action) {
        let pi = peer as usize;
        match action {
            Action::None => {}
            Action::SendHandshake { conn, repr } => {
                if let Some(i) = self.slot_of(conn) {
                    let sock = self.sockets.get_mut::<tcp::Socket>(self.slots[i].handle);
                    // A fresh socket: its transmit buffer (>= 64) takes it.
                    let _ = sock.send_slice(&repr.to_bytes());
                }
            }
            Action::FlushQueue { conn } => {
                self.stats.connected += 1;
                self.peers[pi].out_conn = Some(conn);
                debug!("btl-baremetal: connected to rank {}", peer);
            }
            Action::SendFin { conn } => {
                if let Some(i) = self.slot_of(conn) {
                    self.slots[i].fin_pending = true;
                }
                self.peers[pi].out_conn = Some(conn);
                self.flush_peer(peer);
            }
            Action::Close { conn } => {
                if let Some(i) = self.slot_of(conn) {
                    self.release(i, true);
                }
            }
            Action::Connect => {
                // A retry: drop the attempt still connecting, connect anew.
                for j in 0..self.slots.len() {
                    if matches!(self.slots[j].role, Role::Connecting(p) if p == peer) {
                        self.release(j, false);
                    }
                }
                self.peers[pi].want_connect = true;
            }
            Action::Fail { close, reason } => {
                if let Some(i) = close.and_then(|c| self.slot_of(c)) {
                    self.release(i, false);
                }
                for j in 0..self.slots.len() {
                    if matches!(self.slots[j].role, Role::Connecting(p) | Role::Conn(p) if p == peer)
                    {
                        self.release(j, false);
                    }
                }
                let p = &mut self.peers[pi];
                if !p.out.is_empty() {
                    warn!(
                        "btl-baremetal: dropping {} queued bytes to failed peer {}",
                        p.out.len(),
                        peer
                    );
                }
                p.out.clear();
                p.out_conn = None;
                p.reply = None;
                p.chunk = None;
                p.want_connect = false;
                p.failed = Some(reason);
                for r in self.requests.iter_mut().filter(|r| r.peer == peer) {
                    r.failed = true;
                }
            }
        }
    }
}
