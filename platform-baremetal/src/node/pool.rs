//! The socket pool: `S` smoltcp TCP sockets, each in one [`Role`] at a
//! time. smoltcp has no listen backlog (a listening socket takes one
//! connection), so [`Config::listen_sockets`](super::Config::listen_sockets)
//! of them are kept listening on the node's port, re-armed after every
//! accept; the others connect out to peers. A socket's life: free →
//! listening or connecting → carrying a connection (an incoming one first
//! waits for the peer's handshake) → closing → free, with timeouts on the
//! handshake and on closing.

use btl_core::tcp::decoder::Decoder;
use btl_core::tcp::endpoint::{
    Action, ConnId, EndpointState, Incoming, IncomingDecision, RejectReason,
};
use btl_core::tcp::wire::{FrameRepr, HandshakeRepr};
use btl_core::{debug, warn};
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;

use super::{Event, Node};

/// First local port of outgoing connections (the IANA dynamic range).
pub(super) const EPHEMERAL_FIRST: u16 = 49152;

/// What a socket of the pool is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// Socket closed, reusable.
    Free,
    /// Listening on the node's port.
    Listening,
    /// Our connect to this peer is in flight.
    Connecting(u32),
    /// Accepted, waiting for the handshake.
    Incoming(Incoming),
    /// Carries (or carried) this peer's stream.
    Conn(u32),
    /// Closed or aborted; freed once smoltcp has sent what it must.
    Closing,
}

/// One socket of the pool, with its decoder and what it is receiving.
pub(super) struct Slot<'a> {
    pub(super) handle: SocketHandle,
    pub(super) id: ConnId,
    pub(super) gen: u32,
    pub(super) role: Role,
    pub(super) dec: Decoder<&'a mut [u8]>,
    /// The frame being received on this socket and its payload bytes so far.
    pub(super) cur: Option<FrameRepr>,
    pub(super) fill: usize,
    /// Write a FIN frame and close once the peer's queue is written.
    pub(super) fin_pending: bool,
    /// When a closing socket is aborted at the latest.
    pub(super) release_at: u64,
    /// The slot became `Closing` during this poll (wait for smoltcp to
    /// send its RST or FIN before reusing the socket).
    pub(super) fresh_close: bool,
}

impl<'a, const S: usize, const P: usize> Node<'a, S, P> {
    fn new_id(&mut self, i: usize) -> ConnId {
        let s = &mut self.slots[i];
        s.gen = s.gen.wrapping_add(1) & 0x00ff_ffff;
        s.id = ConnId((s.gen << 8) | i as u32);
        s.id
    }

    pub(super) fn slot_of(&self, conn: ConnId) -> Option<usize> {
        let i = (conn.0 & 0xff) as usize;
        let s = self.slots.get(i)?;
        (s.id == conn && !matches!(s.role, Role::Free | Role::Closing)).then_some(i)
    }

    /// Drops slot `i`'s connection: a FIN after what is written
    /// (`graceful`), or a reset.
    pub(super) fn release(&mut self, i: usize, graceful: bool) {
        let s = &mut self.slots[i];
        let sock = self.sockets.get_mut::<tcp::Socket>(s.handle);
        if graceful {
            sock.close();
        } else {
            sock.abort();
        }
        let id = s.id;
        s.role = Role::Closing;
        s.cur = None;
        s.fill = 0;
        s.fin_pending = false;
        s.fresh_close = true;
        s.release_at = self.now.saturating_add(self.cfg.handshake_timeout_ms);
        for p in self.peers.iter_mut() {
            if p.out_conn == Some(id) {
                p.out_conn = None;
            }
        }
    }

    pub(super) fn arm_listeners(&mut self) {
        let mut listening = self
            .slots
            .iter()
            .filter(|s| s.role == Role::Listening)
            .count();
        for i in 0..self.slots.len() {
            if listening >= self.cfg.listen_sockets {
                break;
            }
            if self.slots[i].role != Role::Free {
                continue;
            }
            let sock = self.sockets.get_mut::<tcp::Socket>(self.slots[i].handle);
            if sock.listen(self.cfg.port).is_ok() {
                self.slots[i].role = Role::Listening;
                listening += 1;
            }
        }
    }

    fn port_in_use(&self, port: u16) -> bool {
        port == self.cfg.port
            || self.slots.iter().any(|s| {
                self.sockets
                    .get::<tcp::Socket>(s.handle)
                    .local_endpoint()
                    .is_some_and(|e| e.port == port)
            })
    }

    pub(super) fn start_connects(&mut self) {
        for peer in 0..self.cfg.size {
            let p = &self.peers[peer as usize];
            if !p.want_connect || p.failed.is_some() {
                continue;
            }
            let Some(remote) = p.addr else { continue };
            if p.ep.state() != EndpointState::Connecting {
                self.peers[peer as usize].want_connect = false;
                continue;
            }
            // Keep the listeners: take a free socket only.
            let Some(i) = self.slots.iter().position(|s| s.role == Role::Free) else {
                continue;
            };
            let mut port = self.next_port;
            for _ in 0..1024 {
                port = if port == u16::MAX {
                    EPHEMERAL_FIRST
                } else {
                    port + 1
                };
                if !self.port_in_use(port) {
                    break;
                }
            }
            self.next_port = port;
            let handle = self.slots[i].handle;
            let sock = self.sockets.get_mut::<tcp::Socket>(handle);
            match sock.connect(self.iface.context(), remote, port) {
                Ok(()) => {
                    self.new_id(i);
                    self.slots[i].role = Role::Connecting(peer);
                    self.peers[peer as usize].want_connect = false;
                    debug!("btl-baremetal: connecting to {} at {}", peer, remote);
                }
                Err(_) => {
                    self.peers[peer as usize].want_connect = false;
                    let now = self.now;
                    let a = self.peers[peer as usize]
                        .ep
                        .on_connect_failed(ConnId(u32::MAX), now);
                    self.apply(peer, a);
                }
            }
        }
    }

    pub(super) fn timers(&mut self) {
        let now = self.now;
        for peer in 0..self.cfg.size {
            let ep = &mut self.peers[peer as usize].ep;
            if ep.deadline().is_some_and(|d| now >= d) {
                let a = ep.on_timer(now);
                self.apply(peer, a);
            }
        }
        for i in 0..self.slots.len() {
            if let Role::Incoming(mut inc) = self.slots[i].role {
                if inc.on_timer(now) {
                    warn!("btl-baremetal: dropped a connection: no handshake within the timeout");
                    self.stats.rejected += 1;
                    self.release(i, false);
                } else {
                    self.slots[i].role = Role::Incoming(inc);
                }
            }
        }
    }

    /// One socket: state changes, then its bytes.
    pub(super) fn service(&mut self, i: usize, on_event: &mut dyn FnMut(Event<'_>)) -> usize {
        let handle = self.slots[i].handle;
        let state = self.sockets.get::<tcp::Socket>(handle).state();
        match self.slots[i].role {
            Role::Free => 0,
            Role::Closing => {
                if self.slots[i].fresh_close {
                    self.slots[i].fresh_close = false;
                    return 0;
                }
                let sock = self.sockets.get_mut::<tcp::Socket>(handle);
                if matches!(state, tcp::State::Closed | tcp::State::TimeWait)
                    || self.now >= self.slots[i].release_at
                {
                    if state != tcp::State::Closed {
                        sock.abort();
                        self.slots[i].fresh_close = true;
                        return 0;
                    }
                    self.slots[i].role = Role::Free;
                }
                0
            }
            Role::Listening => match state {
                tcp::State::Listen | tcp::State::SynReceived => 0,
                tcp::State::Closed => {
                    self.slots[i].role = Role::Free;
                    0
                }
                _ => {
                    self.new_id(i);
                    let inc = Incoming::new(self.now, self.cfg.handshake_timeout_ms);
                    let s = &mut self.slots[i];
                    s.role = Role::Incoming(inc);
                    s.dec.reset(true);
                    s.cur = None;
                    s.fill = 0;
                    1 + self.read(i, on_event)
                }
            },
            Role::Connecting(peer) => match state {
                tcp::State::SynSent => 0,
                tcp::State::Closed | tcp::State::TimeWait => {
                    let conn = self.slots[i].id;
                    debug!("btl-baremetal: connect to {} failed", peer);
                    self.release(i, false);
                    let now = self.now;
                    let a = self.peers[peer as usize].ep.on_connect_failed(conn, now);
                    self.apply(peer, a);
                    1
                }
                _ => {
                    let conn = self.slots[i].id;
                    let a = self.peers[peer as usize].ep.on_connected(conn, self.now);
                    if let Action::SendHandshake { .. } = a {
                        let s = &mut self.slots[i];
                        s.role = Role::Conn(peer);
                        s.dec.reset(true);
                        s.cur = None;
                        s.fill = 0;
                    }
                    self.apply(peer, a);
                    1 + self.read(i, on_event)
                }
            },
            Role::Incoming(_) | Role::Conn(_) => self.read(i, on_event),
        }
    }

    pub(super) fn incoming_handshake(&mut self, i: usize, repr: HandshakeRepr) {
        let Role::Incoming(mut inc) = self.slots[i].role else {
            return;
        };
        let conn = self.slots[i].id;
        let peer = match inc.on_handshake(repr, self.cfg.job, self.cfg.rank, self.cfg.size) {
            Ok(p) => p,
            Err(reason) => {
                warn!("btl-baremetal: dropped a connection: {}", reason);
                self.stats.rejected += 1;
                self.release(i, false);
                return;
            }
        };
        match self.peers[peer as usize].ep.on_incoming(conn, repr) {
            IncomingDecision::Accept {
                conn,
                reply,
                close_ours,
            } => {
                if let Some(o) = close_ours.and_then(|o| self.slot_of(o)) {
                    self.stats.tie_breaks += 1;
                    self.release(o, true);
                }
                // A connect of ours still in flight lost too.
                for j in 0..self.slots.len() {
                    if self.slots[j].role == Role::Connecting(peer) {
                        self.release(j, false);
                    }
                }
                self.slots[i].role = Role::Conn(peer);
                let sock = self.sockets.get_mut::<tcp::Socket>(self.slots[i].handle);
                // A fresh socket: its transmit buffer (>= 64) takes it all.
                let _ = sock.send_slice(&reply.to_bytes());
                self.stats.accepted += 1;
                let p = &mut self.peers[peer as usize];
                p.out_conn = Some(conn);
                p.want_connect = false;
                debug!("btl-baremetal: accepted rank {}", peer);
            }
            IncomingDecision::Refuse { reason, .. } => {
                if matches!(
                    reason,
                    RejectReason::TieBreak { .. } | RejectReason::AlreadyConnected
                ) {
                    debug!(
                        "btl-baremetal: second connection from {} dropped: {}",
                        peer, reason
                    );
                    self.stats.tie_breaks += 1;
                    self.release(i, true);
                } else {
                    warn!(
                        "btl-baremetal: dropped a connection claiming rank {}: {}",
                        peer, reason
                    );
                    self.stats.rejected += 1;
                    self.release(i, false);
                }
            }
        }
    }
}
