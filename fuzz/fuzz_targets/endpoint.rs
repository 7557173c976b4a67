//! Endpoint state-machine event sequences.
//!
//! The harness plays the Linux adapter for one peer's [`Endpoint`]: it owns
//! the sockets (outgoing ones opened when the endpoint asks to connect,
//! incoming ones accepted at any time, each with its stream decoder and,
//! for incoming ones, an [`Incoming`] guard), and the input drives events
//! on them — connect results, bytes (well-formed handshakes and FINs, or
//! raw bytes), EOF, socket and protocol errors, timers, local closes, sends
//! — including the simultaneous-connect interleavings. After every event it
//! checks what the module documentation promises:
//!
//! - every state change is one the documented lifecycle allows, and
//!   `Failed` is final;
//! - actions and decisions name only sockets the adapter holds (or the one
//!   the event was about), and `SendNow`/`FlushQueue` name the established
//!   connection;
//! - `connection()` is set exactly when connected, `deadline()` exactly
//!   while connecting;
//! - a connection is established only after a handshake naming our job and
//!   the endpoint's peer.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use btl_core::tcp::decoder::{Decoder, Event, MIN_BUFFER};
use btl_core::tcp::endpoint::{
    Action, ConnId, Endpoint, EndpointState, Incoming, IncomingDecision, IncomingState,
    SendDecision,
};
use btl_core::tcp::wire::{job_hash, FrameRepr, HandshakeRepr};
use libfuzzer_sys::fuzz_target;

const NPROCS: u32 = 4;
const TIMEOUT_MS: u64 = 1000;
const MAX_FRAME: u32 = 1 << 16;

#[derive(Arbitrary, Debug)]
enum Bytes {
    /// A well-formed handshake from `rank` (of our job unless `other_job`).
    Handshake { rank: u8, other_job: bool },
    /// A FIN frame.
    Fin,
    /// A SEND frame header and payload.
    Send { len: u8 },
    /// Anything.
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Ev {
    Send,
    Close,
    Timer {
        dt: u16,
    },
    /// The pending outgoing connect completes (or fails).
    ConnectDone {
        ok: bool,
    },
    /// A peer connects to us.
    Accept,
    /// Bytes arrive on socket `s` (an index into the sockets held).
    Bytes {
        s: u8,
        bytes: Bytes,
    },
    Eof {
        s: u8,
    },
    SocketError {
        s: u8,
    },
    /// An event for a socket id the endpoint never saw.
    Stale {
        id: u8,
        kind: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    me: u8,
    peer: u8,
    events: Vec<Ev>,
}

struct Sock {
    incoming: Option<Incoming>,
    dec: Decoder<Vec<u8>>,
}

struct Adapter {
    ep: Endpoint,
    job: u64,
    now: u64,
    next_id: u32,
    /// An outgoing connect in progress (the endpoint asked for it).
    connecting: Option<ConnId>,
    socks: BTreeMap<ConnId, Sock>,
    /// Ever-seen ids, to make stale ones.
    issued: u32,
}

fn allowed(from: EndpointState, to: EndpointState) -> bool {
    use EndpointState::*;
    if from == to {
        return true;
    }
    match (from, to) {
        (Failed(_), _) => false,
        (_, Failed(_)) => true,
        (Closed, Connecting) => true,
        (Connecting, ConnectAck) => true,
        // Our attempt closed by a lower-ranked peer: wait for its connection.
        (ConnectAck, Connecting) => true,
        (ConnectAck, Connected) => true,
        (Closed | Connecting, Connected) => true,
        (Connected, Closed) => true,
        // A local close while connecting drops the attempt.
        (Connecting | ConnectAck, Closed) => true,
        _ => false,
    }
}

impl Adapter {
    fn new_id(&mut self) -> ConnId {
        let id = ConnId(self.next_id);
        self.next_id += 1;
        self.issued = self.next_id;
        id
    }

    fn sock_at(&self, s: u8) -> Option<ConnId> {
        if self.socks.is_empty() {
            return None;
        }
        self.socks
            .keys()
            .nth(usize::from(s) % self.socks.len())
            .copied()
    }

    /// A conn named by the endpoint must be held by us (or be `arg`).
    fn check_named(&self, conn: ConnId, arg: Option<ConnId>) {
        assert!(
            Some(conn) == arg || self.socks.contains_key(&conn),
            "endpoint named {conn:?}, which the adapter does not hold (event on {arg:?})"
        );
    }

    fn apply(&mut self, a: Action, arg: Option<ConnId>) {
        match a {
            Action::None => {}
            Action::SendHandshake { conn, repr } => {
                self.check_named(conn, arg);
                assert_eq!(repr, self.ep.handshake());
                assert_eq!(self.ep.state(), EndpointState::ConnectAck);
            }
            Action::FlushQueue { conn } => {
                self.check_named(conn, arg);
                assert_eq!(self.ep.connection(), Some(conn));
            }
            Action::SendFin { conn } => {
                self.check_named(conn, arg);
                assert_eq!(self.ep.state(), EndpointState::Closed);
            }
            Action::Close { conn } => {
                self.check_named(conn, arg);
                assert_ne!(
                    self.ep.connection(),
                    Some(conn),
                    "closing the live connection"
                );
                self.socks.remove(&conn);
            }
            Action::Connect => {
                // A retry: only while setting up, with a new deadline.
                assert_eq!(self.ep.state(), EndpointState::Connecting);
                assert!(self.ep.deadline().is_some());
                let id = self.new_id();
                self.connecting = Some(id);
            }
            Action::Fail { close, reason } => {
                assert_eq!(self.ep.state(), EndpointState::Failed(reason));
                if let Some(conn) = close {
                    self.check_named(conn, arg);
                    self.socks.remove(&conn);
                }
            }
        }
    }

    fn handle_bytes(&mut self, conn: ConnId, bytes: &[u8]) {
        let mut rest = bytes;
        loop {
            let Some(sock) = self.socks.get_mut(&conn) else {
                return;
            };
            let spare = sock.dec.spare();
            let n = spare.len().min(rest.len());
            spare[..n].copy_from_slice(&rest[..n]);
            sock.dec.filled(n);
            rest = &rest[n..];
            // Drain the events the decoder has.
            loop {
                let Some(sock) = self.socks.get_mut(&conn) else {
                    return;
                };
                let incoming = sock.incoming.is_some();
                let ev = match sock.dec.next_event(MAX_FRAME) {
                    None => break,
                    Some(Err(e)) => Err(e),
                    Some(Ok(Event::Handshake(h))) => Ok(Some(Ok(h))),
                    Some(Ok(Event::Header(f))) => Ok(Some(Err(f))),
                    Some(Ok(_)) => Ok(None),
                };
                match ev {
                    Err(e) => {
                        if incoming {
                            self.socks.remove(&conn);
                        } else {
                            let a = self.ep.on_protocol_error(conn, e);
                            self.apply(a, Some(conn));
                            self.socks.remove(&conn);
                        }
                        return;
                    }
                    Ok(Some(Ok(h))) if incoming => self.incoming_handshake(conn, h),
                    Ok(Some(Ok(h))) => {
                        let was = self.ep.state();
                        let a = self.ep.on_handshake(conn, h);
                        if was != EndpointState::Connected
                            && self.ep.state() == EndpointState::Connected
                        {
                            assert_eq!((h.job, h.rank), (self.job, self.ep.peer()));
                        }
                        self.apply(a, Some(conn));
                    }
                    Ok(Some(Err(f))) if f == FrameRepr::fin() && !incoming => {
                        let a = self.ep.on_fin(conn);
                        self.apply(a, Some(conn));
                    }
                    Ok(_) => {}
                }
            }
            if rest.is_empty() {
                return;
            }
        }
    }

    fn incoming_handshake(&mut self, conn: ConnId, h: HandshakeRepr) {
        let me = self.ep.me();
        let Some(sock) = self.socks.get_mut(&conn) else {
            return;
        };
        let Some(inc) = sock.incoming.as_mut() else {
            return;
        };
        if inc.state() != IncomingState::Waiting {
            return;
        }
        let verdict = inc.on_handshake(h, self.job, me, NPROCS);
        match verdict {
            Ok(rank) => {
                assert!(rank < NPROCS && rank != me && h.job == self.job);
                assert_eq!(inc.state(), IncomingState::Identified(rank));
            }
            Err(reason) => assert_eq!(inc.state(), IncomingState::Rejected(reason)),
        }
        match verdict {
            Ok(rank) if rank == self.ep.peer() => {
                // Hand over to the endpoint; as a plain connection now.
                sock.incoming = None;
                match self.ep.on_incoming(conn, h) {
                    IncomingDecision::Accept {
                        conn: c,
                        reply,
                        close_ours,
                    } => {
                        assert_eq!(c, conn);
                        assert_eq!(reply, self.ep.handshake());
                        assert_eq!(self.ep.state(), EndpointState::Connected);
                        assert_eq!(self.ep.connection(), Some(conn));
                        if let Some(ours) = close_ours {
                            assert_ne!(ours, conn);
                            self.check_named(ours, None);
                            self.socks.remove(&ours);
                        }
                    }
                    IncomingDecision::Refuse { conn: c, reason } => {
                        assert_eq!(c, conn);
                        assert!(!reason.to_string().is_empty());
                        self.socks.remove(&conn);
                    }
                }
            }
            // Another peer's connection (its endpoint is not modelled), or
            // refused: the adapter drops it.
            _ => {
                self.socks.remove(&conn);
            }
        }
    }

    fn event(&mut self, ev: &Ev) {
        match *ev {
            Ev::Send => match self.ep.on_send_request(self.now) {
                SendDecision::SendNow { conn } => {
                    self.check_named(conn, None);
                    assert_eq!(self.ep.connection(), Some(conn));
                }
                SendDecision::Queue => {}
                SendDecision::QueueAndConnect => {
                    assert_eq!(self.ep.state(), EndpointState::Connecting);
                    let id = self.new_id();
                    self.connecting = Some(id);
                }
                SendDecision::Refuse(r) => assert_eq!(self.ep.state(), EndpointState::Failed(r)),
            },
            Ev::Close => {
                let a = self.ep.close();
                self.apply(a, None);
            }
            Ev::Timer { dt } => {
                self.now += u64::from(dt);
                let a = self.ep.on_timer(self.now);
                self.apply(a, None);
                let now = self.now;
                let expired: Vec<ConnId> = self
                    .socks
                    .iter_mut()
                    .filter_map(|(id, s)| {
                        let inc = s.incoming.as_mut()?;
                        let waiting = inc.state() == IncomingState::Waiting;
                        let exp = inc.on_timer(now);
                        if waiting {
                            assert_eq!(exp, now >= inc.deadline());
                        }
                        exp.then_some(*id)
                    })
                    .collect();
                for id in expired {
                    self.socks.remove(&id);
                }
            }
            Ev::ConnectDone { ok } => {
                let Some(id) = self.connecting.take() else {
                    return;
                };
                let a = if ok {
                    let dec = Decoder::expecting_handshake(vec![0; MIN_BUFFER]).unwrap();
                    self.socks.insert(
                        id,
                        Sock {
                            incoming: None,
                            dec,
                        },
                    );
                    self.ep.on_connected(id, self.now)
                } else {
                    self.ep.on_connect_failed(id, self.now)
                };
                self.apply(a, Some(id));
            }
            Ev::Accept => {
                let id = self.new_id();
                let dec = Decoder::expecting_handshake(vec![0; MIN_BUFFER]).unwrap();
                let inc = Incoming::new(self.now, TIMEOUT_MS);
                self.socks.insert(
                    id,
                    Sock {
                        incoming: Some(inc),
                        dec,
                    },
                );
            }
            Ev::Bytes { s, ref bytes } => {
                let Some(conn) = self.sock_at(s) else {
                    return;
                };
                let raw: Vec<u8> = match *bytes {
                    Bytes::Handshake { rank, other_job } => HandshakeRepr {
                        job: if other_job { self.job ^ 1 } else { self.job },
                        rank: u32::from(rank) % (NPROCS + 1),
                    }
                    .to_bytes()
                    .to_vec(),
                    Bytes::Fin => FrameRepr::fin().to_bytes().to_vec(),
                    Bytes::Send { len } => {
                        let mut v = FrameRepr::send(1, u32::from(len)).to_bytes().to_vec();
                        v.resize(v.len() + usize::from(len), 0xab);
                        v
                    }
                    Bytes::Raw(ref r) => r.clone(),
                };
                self.handle_bytes(conn, &raw);
            }
            Ev::Eof { s } => {
                let Some(conn) = self.sock_at(s) else {
                    return;
                };
                let sock = &self.socks[&conn];
                if sock.incoming.is_some() {
                    self.socks.remove(&conn);
                    return;
                }
                let partial = sock.dec.has_partial();
                let a = self.ep.on_eof(conn, partial);
                self.apply(a, Some(conn));
                self.socks.remove(&conn);
            }
            Ev::SocketError { s } => {
                let Some(conn) = self.sock_at(s) else {
                    return;
                };
                if self.socks[&conn].incoming.is_some() {
                    self.socks.remove(&conn);
                    return;
                }
                let a = self.ep.on_error(conn);
                self.apply(a, Some(conn));
                self.socks.remove(&conn);
            }
            Ev::Stale { id, kind } => {
                let conn = ConnId(self.issued + 1000 + u32::from(id));
                // (Connect results are not stale events: the endpoint learns
                // its socket's id from `on_connected`.)
                let a = match kind % 4 {
                    0 => self.ep.on_fin(conn),
                    1 => self.ep.on_eof(conn, kind & 8 != 0),
                    2 => self.ep.on_error(conn),
                    _ => self.ep.on_handshake(conn, self.ep.handshake()),
                };
                // Nothing changes for a socket the endpoint never saw.
                match a {
                    Action::None => {}
                    Action::Close { conn: c } => assert_eq!(c, conn),
                    other => panic!("{other:?} for a socket the endpoint never saw"),
                }
            }
        }
    }

    fn check_state(&self) {
        let st = self.ep.state();
        assert_eq!(
            self.ep.connection().is_some(),
            st == EndpointState::Connected,
            "{st:?}"
        );
        if let Some(c) = self.ep.connection() {
            assert!(self.socks.contains_key(&c), "established {c:?} not held");
        }
        assert_eq!(
            self.ep.deadline().is_some(),
            matches!(st, EndpointState::Connecting | EndpointState::ConnectAck)
        );
    }
}

fuzz_target!(|input: Input| {
    let me = u32::from(input.me) % NPROCS;
    let peer = u32::from(input.peer) % NPROCS;
    if me == peer {
        return;
    }
    let job = job_hash(b"fuzz-job");
    let mut a = Adapter {
        // Odd `me`: connects are retried for a while (the Linux adapter's
        // default), even: a failed connect fails the peer at once.
        ep: Endpoint::new(me, peer, job, TIMEOUT_MS)
            .with_connect_retry(u64::from(me % 2) * 3 * TIMEOUT_MS),
        job,
        now: 0,
        next_id: 0,
        connecting: None,
        socks: BTreeMap::new(),
        issued: 0,
    };
    for ev in input.events.iter().take(512) {
        let before = a.ep.state();
        a.event(ev);
        let after = a.ep.state();
        assert!(allowed(before, after), "{before:?} -> {after:?} on {ev:?}");
        a.check_state();
    }
});
