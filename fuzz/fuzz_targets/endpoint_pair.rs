//! Two endpoints of one job talking over a simulated network: the
//! simultaneous-connect race, with every interleaving the input picks.
//!
//! Ranks `lo < hi` each hold the other's [`Endpoint`]; the harness is the
//! network and both adapters. The input decides which side asks to send,
//! when each side's connect completes, which in-flight handshake is
//! delivered next, and when a socket's close reaches the other end. Then
//! everything still in flight is delivered (no timer fires, no socket
//! fails), and:
//!
//! - if both endpoints are connected, they are connected to the two ends
//!   of the same connection (the documented tie-break: the lower rank's
//!   connection is the one kept);
//! - if either side asked to send, neither failed and both are connected
//!   (the race always resolves);
//! - along the way, each side's state changes are ones the lifecycle allows.
#![no_main]

use std::collections::{BTreeMap, VecDeque};

use arbitrary::Arbitrary;
use btl_core::tcp::endpoint::{
    Action, ConnId, Endpoint, EndpointState, Incoming, IncomingDecision, SendDecision,
};
use btl_core::tcp::wire::{job_hash, HandshakeRepr};
use libfuzzer_sys::fuzz_target;

const TIMEOUT_MS: u64 = 10_000;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Ev {
    /// Side `hi` (else `lo`) asks to send.
    Send { hi: bool },
    /// That side's pending connect completes.
    Connect { hi: bool },
    /// Deliver the oldest message in flight to that side.
    Deliver { hi: bool },
}

/// What travels on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Msg {
    Handshake(HandshakeRepr),
    /// The other end closed its socket.
    Eof,
}

#[derive(Debug, Clone, Copy)]
struct Sock {
    /// The other end (on the other side).
    peer: ConnId,
    /// Accepted here and not yet handed to the endpoint.
    incoming: Option<Incoming>,
}

struct Side {
    ep: Endpoint,
    /// A connect in flight (asked by the endpoint).
    connecting: bool,
    socks: BTreeMap<ConnId, Sock>,
    /// Messages in flight to this side, in order, with the socket (of this
    /// side) they arrive on.
    inbox: VecDeque<(ConnId, Msg)>,
    sent: bool,
}

struct Net {
    sides: [Side; 2],
    next_id: u32,
}

fn allowed(from: EndpointState, to: EndpointState) -> bool {
    use EndpointState::*;
    from == to
        || matches!(
            (from, to),
            (Closed, Connecting)
                | (Connecting, ConnectAck)
                | (ConnectAck, Connecting)
                | (ConnectAck | Closed | Connecting, Connected)
                | (Closed | Connecting | ConnectAck | Connected, Failed(_))
        )
}

impl Net {
    fn id(&mut self) -> ConnId {
        self.next_id += 1;
        ConnId(self.next_id)
    }

    /// Side `s` drops socket `c`: the other end sees EOF.
    fn close(&mut self, s: usize, c: ConnId) {
        if let Some(sock) = self.sides[s].socks.remove(&c) {
            self.sides[1 - s].inbox.push_back((sock.peer, Msg::Eof));
        }
    }

    fn send_on(&mut self, s: usize, c: ConnId, m: Msg) {
        if let Some(sock) = self.sides[s].socks.get(&c) {
            let peer = sock.peer;
            self.sides[1 - s].inbox.push_back((peer, m));
        }
    }

    fn apply(&mut self, s: usize, a: Action) {
        match a {
            Action::None | Action::FlushQueue { .. } => {}
            Action::SendHandshake { conn, repr } => self.send_on(s, conn, Msg::Handshake(repr)),
            Action::SendFin { .. } => panic!("no close was asked"),
            Action::Connect => panic!("side {s} retried a connect without failures or timers"),
            Action::Close { conn } => self.close(s, conn),
            Action::Fail { close, reason } => {
                panic!(
                    "side {s} failed ({reason}) without timers or socket errors; close {close:?}"
                )
            }
        }
    }

    fn step(&mut self, ev: Ev) {
        let s = match ev {
            Ev::Send { hi } | Ev::Connect { hi } | Ev::Deliver { hi } => usize::from(hi),
        };
        let before = self.sides[s].ep.state();
        match ev {
            Ev::Send { .. } => {
                self.sides[s].sent = true;
                match self.sides[s].ep.on_send_request(0) {
                    SendDecision::QueueAndConnect => self.sides[s].connecting = true,
                    SendDecision::Refuse(r) => panic!("side {s} refused a send: {r}"),
                    SendDecision::SendNow { .. } | SendDecision::Queue => {}
                }
            }
            Ev::Connect { .. } => {
                if !std::mem::take(&mut self.sides[s].connecting) {
                    return;
                }
                let (ours, theirs) = (self.id(), self.id());
                self.sides[s].socks.insert(
                    ours,
                    Sock {
                        peer: theirs,
                        incoming: None,
                    },
                );
                self.sides[1 - s].socks.insert(
                    theirs,
                    Sock {
                        peer: ours,
                        incoming: Some(Incoming::new(0, TIMEOUT_MS)),
                    },
                );
                let a = self.sides[s].ep.on_connected(ours, 0);
                self.apply(s, a);
            }
            Ev::Deliver { .. } => {
                let Some((c, m)) = self.sides[s].inbox.pop_front() else {
                    return;
                };
                let Some(sock) = self.sides[s].socks.get(&c).copied() else {
                    return; // closed here meanwhile
                };
                match (m, sock.incoming) {
                    (Msg::Eof, Some(_)) => {
                        self.sides[s].socks.remove(&c);
                    }
                    (Msg::Eof, None) => {
                        let a = self.sides[s].ep.on_eof(c, false);
                        self.apply(s, a);
                        self.sides[s].socks.remove(&c);
                    }
                    (Msg::Handshake(h), Some(mut inc)) => {
                        let me = self.sides[s].ep.me();
                        let job = self.sides[s].ep.handshake().job;
                        let rank = inc.on_handshake(h, job, me, 2).expect("a valid handshake");
                        assert_eq!(rank, self.sides[s].ep.peer());
                        if let Some(sock) = self.sides[s].socks.get_mut(&c) {
                            sock.incoming = None;
                        }
                        match self.sides[s].ep.on_incoming(c, h) {
                            IncomingDecision::Accept {
                                conn,
                                reply,
                                close_ours,
                            } => {
                                assert_eq!(conn, c);
                                self.send_on(s, c, Msg::Handshake(reply));
                                if let Some(o) = close_ours {
                                    self.close(s, o);
                                }
                            }
                            IncomingDecision::Refuse { conn, .. } => self.close(s, conn),
                        }
                    }
                    (Msg::Handshake(h), None) => {
                        let a = self.sides[s].ep.on_handshake(c, h);
                        self.apply(s, a);
                    }
                }
            }
        }
        let after = self.sides[s].ep.state();
        assert!(
            allowed(before, after),
            "side {s}: {before:?} -> {after:?} on {ev:?}"
        );
    }
}

fuzz_target!(|events: Vec<Ev>| {
    let job = job_hash(b"pair");
    let side = |me, peer| Side {
        ep: Endpoint::new(me, peer, job, TIMEOUT_MS),
        connecting: false,
        socks: BTreeMap::new(),
        inbox: VecDeque::new(),
        sent: false,
    };
    let mut net = Net {
        sides: [side(0, 1), side(1, 0)],
        next_id: 0,
    };
    for &ev in events.iter().take(256) {
        net.step(ev);
    }
    // Quiesce: complete every connect, deliver everything.
    for _ in 0..1000 {
        let mut busy = false;
        for hi in [false, true] {
            let s = usize::from(hi);
            if net.sides[s].connecting {
                net.step(Ev::Connect { hi });
                busy = true;
            }
            if !net.sides[s].inbox.is_empty() {
                net.step(Ev::Deliver { hi });
                busy = true;
            }
        }
        if !busy {
            break;
        }
    }
    let [a, b] = &net.sides;
    assert!(
        !net.sides
            .iter()
            .any(|s| s.connecting || !s.inbox.is_empty()),
        "never quiet"
    );
    if a.sent || b.sent {
        assert_eq!(
            (a.ep.state(), b.ep.state()),
            (EndpointState::Connected, EndpointState::Connected),
            "the race did not resolve"
        );
    }
    if let (Some(ca), Some(cb)) = (a.ep.connection(), b.ep.connection()) {
        assert_eq!(a.socks[&ca].peer, cb, "connected to different connections");
        assert_eq!(b.socks[&cb].peer, ca);
    }
});
