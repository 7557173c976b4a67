//! The bare-metal TCP node: btl's TCP transport over a smoltcp
//! [`Interface`] and [`SocketSet`], in caller-provided memory, driven by one
//! [`Node::poll`].
//!
//! The protocol is btl-core's (`btl_core::tcp`): the same handshake,
//! frames, RMA sub-header, internal tags (barrier, chunked messages),
//! endpoint state machine (lazy connect, lower-rank-wins tie-break, FIN
//! versus failure, handshake timeout) and incremental decoder as the Linux
//! kernel-TCP transport, so the two talk to each other as equals. This
//! module only moves bytes between smoltcp sockets and those state
//! machines:
//!
//! - **Sockets** are a fixed pool of `S` smoltcp TCP sockets, each with its
//!   own receive/transmit buffers and decoder read-ahead buffer. smoltcp has
//!   no listen backlog (a listening socket takes one connection), so
//!   [`Config::listen_sockets`] of them are kept listening on the node's
//!   port at all times, re-armed after every accept: that many peers may
//!   connect at the same moment without being reset.
//! - **Peers** (`P` at most, ranks `0..size`) each have an endpoint, an
//!   address ([`Node::set_peer`]: static configuration, or whatever wire-up
//!   the firmware has), a queue of outgoing frame bytes (frames wait there
//!   until the connection is up; a send is all or nothing, a full queue is
//!   [`SendError::QueueFull`]) and a message buffer where incoming frames
//!   and chunked messages are assembled before they are handed over.
//! - **Events** come out of [`Node::poll`] through a callback, borrowing
//!   the node's buffers: messages, get/put completions, failed peers. The
//!   callback cannot call back into the node.
//! - **Timeouts**: the handshake timeout (the core's), smoltcp's keep-alive
//!   and its socket timeout ([`Config::timeout_ms`]: a peer that stops
//!   answering is reset and reported failed), Nagle off unless
//!   [`Config::use_nagle`].
//!
//! Nothing here allocates; peer bytes are untrusted (the core validates
//! every field; a frame too large for the message buffer fails the peer
//! before its payload is read).
//!
//! The parts, one module each: `config` (what a node is told), `error`
//! (what can go wrong), `pool` (the socket pool: listening, connecting,
//! accepting, closing), `peer` (per-peer state and queues, the barrier,
//! endpoint actions), `recv` (bytes to frames to events), `rma` (get and
//! put, served and requested).

use core::fmt;

use btl_core::tcp::decoder::{Decoder, MIN_BUFFER};
use btl_core::tcp::endpoint::{ConnId, Endpoint, FailReason};
use btl_core::tcp::wire::{CHUNK_HEADER_LEN, FRAME_HEADER_LEN, HANDSHAKE_LEN, RMA_HEADER_LEN};
use smoltcp::iface::{Interface, SocketSet, SocketStorage};
use smoltcp::phy::Device;
use smoltcp::socket::tcp;
use smoltcp::time::{Duration, Instant};

use crate::ring::Ring;

mod config;
mod error;
mod peer;
mod pool;
mod recv;
mod rma;

pub use config::{Config, Sizes};
pub use error::{ConfigError, InitError, RmaError, SendError};
pub use rma::{RegionKey, MAX_REGIONS, MAX_REQUESTS};

use peer::Peer;
use pool::{Role, Slot, EPHEMERAL_FIRST};
use rma::Request;

/// Something that happened, reported by [`Node::poll`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Event<'b> {
    /// A message (exactly once, in order per sender).
    Message {
        /// The sender.
        from: u32,
        /// Its tag.
        tag: u8,
        /// Its bytes (valid during the callback).
        data: &'b [u8],
    },
    /// A put completed.
    PutDone {
        /// What [`Node::put`] returned.
        request: u64,
        /// The target.
        peer: u32,
        /// Outcome.
        result: Result<(), RmaError>,
    },
    /// A get completed.
    GetDone {
        /// What [`Node::get`] returned.
        request: u64,
        /// The target.
        peer: u32,
        /// The bytes read (valid during the callback).
        result: Result<&'b [u8], RmaError>,
    },
    /// A peer failed (reported once).
    PeerFailed {
        /// The peer.
        peer: u32,
        /// Why.
        reason: FailReason,
    },
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Stats {
    /// Connections accepted and kept (the peer connected to us).
    pub accepted: u32,
    /// Our connections that became the peer's connection.
    pub connected: u32,
    /// Incoming connections dropped for bad input or a timeout.
    pub rejected: u32,
    /// Simultaneous-connect losers and duplicates dropped.
    pub tie_breaks: u32,
    /// Messages delivered.
    pub messages: u64,
}

/// The bare-metal TCP node: `S` sockets, at most `P` ranks in the job.
pub struct Node<'a, const S: usize, const P: usize> {
    cfg: Config,
    max_frame: u32,
    iface: Interface,
    sockets: SocketSet<'a>,
    slots: heapless::Vec<Slot<'a>, S>,
    peers: heapless::Vec<Peer<'a>, P>,
    regions: heapless::Vec<&'a mut [u8], MAX_REGIONS>,
    requests: heapless::Vec<Request, MAX_REQUESTS>,
    next_request: u64,
    next_port: u16,
    barrier_epoch: u64,
    /// Rounds of the current barrier whose messages we sent.
    barrier_sent: u32,
    /// Per epoch (mod 4): (epoch, arrivals counted, rounds arrived as bits).
    barrier: [(u64, u32, u64); 4],
    now: u64,
    stats: Stats,
}

impl<const S: usize, const P: usize> fmt::Debug for Node<'_, S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("rank", &self.cfg.rank)
            .field("size", &self.cfg.size)
            .field("port", &self.cfg.port)
            .field("stats", &self.stats)
            .finish()
    }
}

fn take<'a>(mem: &mut &'a mut [u8], n: usize) -> &'a mut [u8] {
    let all = core::mem::take(mem);
    let (head, tail) = all.split_at_mut(n);
    *mem = tail;
    head
}

fn ms(d: u64) -> Duration {
    Duration::from_millis(d)
}

impl<'a, const S: usize, const P: usize> Node<'a, S, P> {
    /// Bytes of `memory` [`Self::new`] needs for `config`.
    pub const fn memory_size(config: &Config) -> usize {
        config.sizes.memory_size(S, P)
    }

    /// A node on `iface` (configured by the caller: hardware and IP
    /// address, routes), with `S` sockets in `socket_storage` (at least `S`
    /// entries) and its buffers carved out of `memory` (at least
    /// [`Self::memory_size`] bytes). Peers' addresses come later
    /// ([`Self::set_peer`]).
    pub fn new(
        config: Config,
        iface: Interface,
        socket_storage: &'a mut [SocketStorage<'a>],
        memory: &'a mut [u8],
    ) -> Result<Self, InitError> {
        let sz = config.sizes;
        let needed = Self::memory_size(&config);
        if memory.len() < needed {
            return Err(InitError::Memory {
                needed,
                got: memory.len(),
            });
        }
        if socket_storage.len() < S {
            return Err(InitError::SocketStorage {
                needed: S,
                got: socket_storage.len(),
            });
        }
        if config.rank >= config.size || config.size as usize > P {
            return Err(InitError::Ranks {
                rank: config.rank,
                size: config.size,
                capacity: P,
            });
        }
        let max_frame = config.max_frame();
        for (what, len, min) in [
            ("read-ahead", sz.read_ahead, MIN_BUFFER),
            ("transmit", sz.tx, MIN_BUFFER),
            ("receive", sz.rx, MIN_BUFFER),
            ("message", sz.message, CHUNK_HEADER_LEN + RMA_HEADER_LEN),
            (
                "queue",
                sz.queue,
                FRAME_HEADER_LEN + max_frame as usize + HANDSHAKE_LEN,
            ),
        ] {
            if len < min {
                return Err(InitError::Buffer { what, len, min });
            }
        }
        if config.listen_sockets == 0 || config.listen_sockets >= S {
            return Err(InitError::ListenSockets {
                listen: config.listen_sockets,
                sockets: S,
            });
        }
        if config.port == 0 {
            return Err(InitError::Port);
        }
        let mut memory = memory;
        let mut sockets = SocketSet::new(&mut socket_storage[..S]);
        let mut slots = heapless::Vec::new();
        for _ in 0..S {
            let rx = take(&mut memory, sz.rx);
            let tx = take(&mut memory, sz.tx);
            let ra = take(&mut memory, sz.read_ahead);
            let mut sock = tcp::Socket::new(tcp::SocketBuffer::new(rx), tcp::SocketBuffer::new(tx));
            sock.set_nagle_enabled(config.use_nagle);
            sock.set_ack_delay(config.ack_delay_ms.map(ms));
            sock.set_keep_alive(config.keep_alive_ms.map(ms));
            sock.set_timeout(config.timeout_ms.map(ms));
            let handle = sockets.add(sock);
            let dec = match Decoder::new(ra) {
                Ok(d) => d,
                Err(e) => {
                    return Err(InitError::Buffer {
                        what: "read-ahead",
                        len: e.len,
                        min: e.min,
                    })
                }
            };
            let slot = Slot {
                handle,
                id: ConnId(u32::MAX),
                gen: 0,
                role: Role::Free,
                dec,
                cur: None,
                fill: 0,
                fin_pending: false,
                release_at: 0,
                fresh_close: false,
            };
            // S slots in a Vec of capacity S: never full.
            let _ = slots.push(slot);
        }
        let mut peers = heapless::Vec::new();
        for r in 0..config.size {
            let out = Ring::new(take(&mut memory, sz.queue));
            let msg = take(&mut memory, sz.message);
            let peer = Peer {
                ep: Endpoint::new(config.rank, r, config.job, config.handshake_timeout_ms),
                addr: None,
                out,
                out_conn: None,
                msg,
                chunk: None,
                want_connect: false,
                failed: None,
                reported: false,
                reply: None,
            };
            // size <= P, checked above: never full.
            let _ = peers.push(peer);
        }
        let mut node = Self {
            cfg: config,
            max_frame,
            iface,
            sockets,
            slots,
            peers,
            regions: heapless::Vec::new(),
            requests: heapless::Vec::new(),
            next_request: 0,
            next_port: EPHEMERAL_FIRST + (config.rank as u16 % 1024) * 16,
            barrier_epoch: 0,
            barrier_sent: 0,
            barrier: [(0, 0, 0); 4],
            now: 0,
            stats: Stats::default(),
        };
        node.arm_listeners();
        Ok(node)
    }

    /// This node's rank.
    pub fn rank(&self) -> u32 {
        self.cfg.rank
    }

    /// Ranks in the job.
    pub fn size(&self) -> u32 {
        self.cfg.size
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The largest frame payload this node sends and accepts.
    pub fn max_frame(&self) -> u32 {
        self.max_frame
    }

    /// The largest message [`Self::send`] takes (bounded by the queue).
    pub fn max_message(&self) -> usize {
        let q = self.cfg.sizes.queue;
        let f = self.max_frame as usize;
        // Frames of max_frame payload, each with a header; the first
        // chunk also carries the chunk header.
        let frames = q / (f + FRAME_HEADER_LEN);
        let rest = q % (f + FRAME_HEADER_LEN);
        let mut max = frames * f + rest.saturating_sub(FRAME_HEADER_LEN);
        if max > f {
            max = max.saturating_sub(CHUNK_HEADER_LEN);
        }
        max
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The smoltcp interface (to change addresses or routes).
    pub fn interface(&mut self) -> &mut Interface {
        &mut self.iface
    }

    /// How long the caller may wait (for the network device) before the
    /// next [`Self::poll`], in milliseconds; `None`: until a packet comes.
    pub fn poll_delay(&mut self, now_ms: u64) -> Option<u64> {
        let now = Instant::from_millis(now_ms as i64);
        let mut delay = self
            .iface
            .poll_delay(now, &self.sockets)
            .map(|d| d.total_millis());
        let mut at = |deadline: u64| {
            let d = deadline.saturating_sub(now_ms);
            delay = Some(delay.map_or(d, |x| x.min(d)));
        };
        for p in &self.peers {
            if let Some(d) = p.ep.deadline() {
                at(d);
            }
        }
        for s in &self.slots {
            match s.role {
                Role::Incoming(inc) => at(inc.deadline()),
                Role::Closing => at(s.release_at),
                _ => {}
            }
        }
        delay
    }

    /// Drives smoltcp and the state machines at `now_ms` (any monotonic
    /// millisecond clock): receives and sends packets on `device`, accepts
    /// and connects, decodes, reports [`Event`]s to `on_event`, checks
    /// timeouts. Returns the number of things that happened (0: idle).
    pub fn poll<D: Device + ?Sized>(
        &mut self,
        now_ms: u64,
        device: &mut D,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> usize {
        self.now = now_ms;
        let ts = Instant::from_millis(now_ms as i64);
        self.iface.poll(ts, device, &mut self.sockets);
        let mut n = 0;
        for i in 0..self.slots.len() {
            n += self.service(i, on_event);
        }
        self.timers();
        self.start_connects();
        self.arm_listeners();
        self.barrier_advance();
        for peer in 0..self.cfg.size {
            self.flush_peer(peer);
        }
        n += self.report(on_event);
        // Send what was written now rather than at the next poll.
        self.iface.poll(ts, device, &mut self.sockets);
        n
    }

    /// Reports failed peers (once) and the requests they took with them.
    fn report(&mut self, on_event: &mut dyn FnMut(Event<'_>)) -> usize {
        let mut n = 0;
        for (r, p) in self.peers.iter_mut().enumerate() {
            if let (Some(reason), false) = (p.failed, p.reported) {
                p.reported = true;
                n += 1;
                on_event(Event::PeerFailed {
                    peer: r as u32,
                    reason,
                });
            }
        }
        n + self.report_failed_requests(on_event)
    }
}
