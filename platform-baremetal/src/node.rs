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

use core::fmt;

use btl_core::tcp::decoder::{Decoder, Event as DecEvent, MIN_BUFFER};
use btl_core::tcp::endpoint::{
    Action, ConnId, Endpoint, EndpointState, FailReason, Incoming, IncomingDecision, RejectReason,
    SendDecision, DEFAULT_HANDSHAKE_TIMEOUT_MS,
};
use btl_core::tcp::wire::{
    job_hash, FrameRepr, FrameType, RmaPacket, RmaRepr, WireError, CHUNK_HEADER_LEN,
    FRAME_HEADER_LEN, HANDSHAKE_LEN, MAX_USER_TAG, RMA_HEADER_LEN, TAG_BARRIER, TAG_CHUNK,
};
use smoltcp::iface::{Interface, SocketHandle, SocketSet, SocketStorage};
use smoltcp::phy::Device;
use smoltcp::socket::tcp;
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{IpAddress, IpEndpoint};

use crate::ring::Ring;

/// Regions a node can register ([`Node::register`]).
pub const MAX_REGIONS: usize = 8;
/// Get/put requests a node can have outstanding at once.
pub const MAX_REQUESTS: usize = 16;
/// First local port of outgoing connections (the IANA dynamic range).
const EPHEMERAL_FIRST: u16 = 49152;

/// Buffer sizes, in bytes. See [`Sizes::memory_size`] for the total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Sizes {
    /// Receive buffer of each socket (the TCP window it advertises, up to
    /// 64 KiB without window scaling).
    pub rx: usize,
    /// Transmit buffer of each socket (at least 64).
    pub tx: usize,
    /// Decoder read-ahead buffer of each socket (the seed's
    /// `endpoint_cache`; at least 64).
    pub read_ahead: usize,
    /// Message buffer of each peer: the largest frame payload and the
    /// largest (chunked) message this node accepts from it.
    pub message: usize,
    /// Outgoing queue of each peer: the largest message this node can send
    /// (headers included); at least `max_frame + 16`, to hold a get reply.
    pub queue: usize,
}

impl Sizes {
    /// A small profile for microcontrollers: 4 KiB socket buffers, 1 KiB
    /// read-ahead, 4 KiB messages, 8 KiB queues.
    pub const SMALL: Sizes = Sizes {
        rx: 4096,
        tx: 4096,
        read_ahead: 1024,
        message: 4096,
        queue: 8192,
    };

    /// Bytes of memory [`Node::new`] needs for `sockets` sockets and
    /// `peers` peers (besides the `Node` value itself and smoltcp's
    /// `SocketStorage` array).
    pub const fn memory_size(&self, sockets: usize, peers: usize) -> usize {
        sockets * (self.rx + self.tx + self.read_ahead) + peers * (self.message + self.queue)
    }
}

/// How a node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Config {
    /// The job's hash ([`job_hash`] of the job id every rank was given).
    pub job: u64,
    /// This node's rank.
    pub rank: u32,
    /// Ranks in the job.
    pub size: u32,
    /// The port this node listens on.
    pub port: u16,
    /// Sockets kept listening (peers that can connect at the same moment).
    pub listen_sockets: usize,
    /// A connect or handshake taking longer fails the peer.
    pub handshake_timeout_ms: u64,
    /// smoltcp keep-alive interval (probes an idle connection).
    pub keep_alive_ms: Option<u64>,
    /// smoltcp socket timeout: a connection whose peer sends nothing for
    /// this long while data or a keep-alive is outstanding is reset, and
    /// the peer reported failed.
    pub timeout_ms: Option<u64>,
    /// Nagle's algorithm (off by default, as the seed's `use_nagle`).
    pub use_nagle: bool,
    /// smoltcp's delayed-ACK time (`None`: acknowledge at once).
    pub ack_delay_ms: Option<u64>,
    /// Largest frame payload this node sends and accepts (capped by
    /// [`Sizes::message`]); every rank of the job should use the same.
    pub max_frame: u32,
    /// Buffer sizes.
    pub sizes: Sizes,
}

impl Config {
    /// A node of rank `rank` in a job of `size` ranks whose id is `job_id`
    /// (hashed as every rank does), listening on `port`, with
    /// [`Sizes::SMALL`], 2 listening sockets, the core's default handshake
    /// timeout (10 s), keep-alive every 2 s, a 10 s socket timeout, no
    /// Nagle and no delayed ACK.
    pub const fn new(job_id: &[u8], rank: u32, size: u32, port: u16) -> Self {
        Self {
            job: job_hash(job_id),
            rank,
            size,
            port,
            listen_sockets: 2,
            handshake_timeout_ms: DEFAULT_HANDSHAKE_TIMEOUT_MS,
            keep_alive_ms: Some(2_000),
            timeout_ms: Some(10_000),
            use_nagle: false,
            ack_delay_ms: None,
            max_frame: Sizes::SMALL.message as u32,
            sizes: Sizes::SMALL,
        }
    }

    /// Takes `use_nagle`, `handshake_timeout` and `max_frame` from the
    /// `tcp` component's verified parameters (the read-ahead buffer size,
    /// `endpoint_cache`, is a memory decision: set [`Sizes::read_ahead`]).
    pub fn apply_params(&mut self, params: &btl_core::tcp::params::TcpParams) {
        self.use_nagle = params.use_nagle;
        self.handshake_timeout_ms = u64::from(params.handshake_timeout);
        self.max_frame = params.max_frame();
    }

    fn max_frame(&self) -> u32 {
        let m = u32::try_from(self.sizes.message).unwrap_or(u32::MAX);
        self.max_frame.min(m)
    }
}

/// [`Node::new`] refused its configuration or memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum InitError {
    /// The memory given is smaller than [`Sizes::memory_size`].
    Memory {
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// Fewer `SocketStorage` entries than `S` sockets.
    SocketStorage {
        /// Entries needed.
        needed: usize,
        /// Entries given.
        got: usize,
    },
    /// The job has more ranks than `P`, or rank is not below size.
    Ranks {
        /// This rank.
        rank: u32,
        /// Ranks in the job.
        size: u32,
        /// Peers the node can hold (`P`).
        capacity: usize,
    },
    /// A buffer is too small: `what` needs at least `min` bytes.
    Buffer {
        /// Which buffer.
        what: &'static str,
        /// Its size.
        len: usize,
        /// The minimum.
        min: usize,
    },
    /// `listen_sockets` is 0 or leaves no socket for outgoing connections.
    ListenSockets {
        /// Listening sockets asked for.
        listen: usize,
        /// Sockets in the pool (`S`).
        sockets: usize,
    },
    /// Port 0 cannot be listened on.
    Port,
}

impl fmt::Display for InitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Memory { needed, got } => {
                write!(f, "node memory: {got} bytes given, {needed} needed")
            }
            Self::SocketStorage { needed, got } => {
                write!(f, "{got} socket storage entries given, {needed} needed")
            }
            Self::Ranks {
                rank,
                size,
                capacity,
            } => write!(
                f,
                "rank {rank} of {size}: the node holds at most {capacity} ranks"
            ),
            Self::Buffer { what, len, min } => {
                write!(f, "{what} buffer of {len} bytes, at least {min} needed")
            }
            Self::ListenSockets { listen, sockets } => write!(
                f,
                "{listen} listening sockets out of {sockets}: needs at least 1 and one left to connect with"
            ),
            Self::Port => write!(f, "cannot listen on port 0"),
        }
    }
}

impl core::error::Error for InitError {}

/// A send, get, put or barrier could not be started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SendError {
    /// No such peer (or it is this node).
    InvalidPeer {
        /// The rank given.
        peer: u32,
    },
    /// Tags above [`MAX_USER_TAG`] are the transport's.
    ReservedTag {
        /// The tag given.
        tag: u8,
    },
    /// Larger than the peer's queue (or a frame) can ever hold.
    TooLarge {
        /// Bytes asked for.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The peer's queue has no room now: poll, then try again.
    QueueFull {
        /// The peer.
        peer: u32,
    },
    /// Too many get/put requests outstanding ([`MAX_REQUESTS`]).
    TooManyRequests,
    /// The peer failed.
    PeerFailed {
        /// The peer.
        peer: u32,
        /// Why.
        reason: FailReason,
    },
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::InvalidPeer { peer } => write!(f, "no peer {peer}"),
            Self::ReservedTag { tag } => {
                write!(
                    f,
                    "tag {tag} is reserved (user tags are 0..={MAX_USER_TAG})"
                )
            }
            Self::TooLarge { len, max } => write!(f, "{len} bytes exceed the limit of {max}"),
            Self::QueueFull { peer } => write!(f, "the queue to peer {peer} is full"),
            Self::TooManyRequests => write!(f, "{MAX_REQUESTS} get/put requests outstanding"),
            Self::PeerFailed { peer, reason } => write!(f, "peer {peer} failed: {reason}"),
        }
    }
}

impl core::error::Error for SendError {}

/// [`Node::set_peer`] or [`Node::register`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ConfigError {
    /// No such peer (or it is this node).
    InvalidPeer {
        /// The rank given.
        peer: u32,
    },
    /// Port 0 or an unspecified address.
    BadAddress,
    /// [`MAX_REGIONS`] regions are registered already.
    TooManyRegions,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::InvalidPeer { peer } => write!(f, "no peer {peer}"),
            Self::BadAddress => write!(f, "unspecified address or port 0"),
            Self::TooManyRegions => write!(f, "{MAX_REGIONS} regions registered already"),
        }
    }
}

impl core::error::Error for ConfigError {}

/// Why a get or put did not complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RmaError {
    /// The target refused: no such region, or the range is outside it.
    Refused,
    /// The target answered a get with another length than asked.
    BadLength,
    /// The target failed before answering.
    PeerFailed,
}

impl fmt::Display for RmaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Refused => "refused by the target (outside its registered regions)",
            Self::BadLength => "answered with the wrong length",
            Self::PeerFailed => "the target failed",
        })
    }
}

impl core::error::Error for RmaError {}

/// A registered region's key: send it to peers so they may get and put.
/// The same fields as btl-linux's `RegionKey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RegionKey {
    /// The owner.
    pub rank: u32,
    /// The owner's region id.
    pub id: u32,
    /// Length in bytes.
    pub len: u64,
}

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
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

struct Slot<'a> {
    handle: SocketHandle,
    id: ConnId,
    gen: u32,
    role: Role,
    dec: Decoder<&'a mut [u8]>,
    /// The frame being received on this socket and its payload bytes so far.
    cur: Option<FrameRepr>,
    fill: usize,
    /// Write a FIN frame and close once the peer's queue is written.
    fin_pending: bool,
    /// When a closing socket is aborted at the latest.
    release_at: u64,
    /// The slot became `Closing` during this poll (wait for smoltcp to
    /// send its RST or FIN before reusing the socket).
    fresh_close: bool,
}

#[derive(Clone, Copy, Debug)]
struct Chunk {
    tag: u8,
    total: usize,
    have: usize,
}

#[derive(Clone, Copy, Debug)]
struct Reply {
    kind: FrameType,
    id: u64,
    ok: bool,
    region: usize,
    offset: usize,
    len: usize,
}

struct Peer<'a> {
    ep: Endpoint,
    addr: Option<IpEndpoint>,
    out: Ring<'a>,
    /// The connection `out` flows to.
    out_conn: Option<ConnId>,
    msg: &'a mut [u8],
    chunk: Option<Chunk>,
    want_connect: bool,
    failed: Option<FailReason>,
    reported: bool,
    /// An RMA answer waiting for room in `out` (reading from the peer
    /// pauses meanwhile).
    reply: Option<Reply>,
}

#[derive(Clone, Copy, Debug)]
struct Request {
    id: u64,
    peer: u32,
    kind: FrameType,
    len: u64,
    failed: bool,
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
    barrier: [(u64, u32); 4],
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
            barrier: [(0, 0); 4],
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

    /// The first failed peer, if any.
    pub fn failed_peer(&self) -> Option<(u32, FailReason)> {
        self.peers
            .iter()
            .enumerate()
            .find_map(|(r, p)| p.failed.map(|f| (r as u32, f)))
    }

    fn check_peer(&self, peer: u32) -> Result<(), SendError> {
        if peer == self.cfg.rank || peer >= self.cfg.size {
            return Err(SendError::InvalidPeer { peer });
        }
        if let Some(reason) = self.peers[peer as usize].failed {
            return Err(SendError::PeerFailed { peer, reason });
        }
        Ok(())
    }

    /// Queues one frame (header + parts) to `peer`; room was checked.
    fn queue_frame(
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

    /// Makes `region` available to peers' get and put; send them the key.
    pub fn register(&mut self, region: &'a mut [u8]) -> Result<RegionKey, ConfigError> {
        let id = self.regions.len() as u32;
        let len = region.len() as u64;
        self.regions
            .push(region)
            .map_err(|_| ConfigError::TooManyRegions)?;
        Ok(RegionKey {
            rank: self.cfg.rank,
            id,
            len,
        })
    }

    /// The contents of one of our regions.
    pub fn region(&self, id: u32) -> Option<&[u8]> {
        self.regions.get(id as usize).map(|r| &r[..])
    }

    fn rma_request(
        &mut self,
        key: &RegionKey,
        kind: FrameType,
        offset: u64,
        len: u64,
        data: &[u8],
    ) -> Result<u64, SendError> {
        let peer = key.rank;
        self.check_peer(peer)?;
        if self.requests.is_full() {
            return Err(SendError::TooManyRequests);
        }
        let payload = RMA_HEADER_LEN + data.len();
        if payload > self.max_frame as usize || len > u64::from(self.max_frame) {
            return Err(SendError::TooLarge {
                len: payload.max(len as usize),
                max: self.max_frame as usize,
            });
        }
        if self.peers[peer as usize].out.free() < FRAME_HEADER_LEN + payload {
            return Err(SendError::QueueFull { peer });
        }
        self.next_request += 1;
        let id = self.next_request;
        let rma = RmaRepr {
            region: key.id,
            offset,
            len,
        }
        .to_bytes();
        let repr = FrameRepr {
            kind,
            tag: 0,
            error: false,
            len: payload as u32,
            id,
        };
        self.queue_frame(peer, repr, &[&rma, data])?;
        let _ = self.requests.push(Request {
            id,
            peer,
            kind,
            len,
            failed: false,
        });
        Ok(id)
    }

    /// Writes `data` at `offset` of the peer's region `key` (one frame: at
    /// most `max_frame - 24` bytes). Completes with [`Event::PutDone`].
    pub fn put(&mut self, key: &RegionKey, offset: u64, data: &[u8]) -> Result<u64, SendError> {
        self.rma_request(key, FrameType::Put, offset, data.len() as u64, data)
    }

    /// Reads `len` bytes (at most `max_frame`) at `offset` of the peer's
    /// region `key`. Completes with [`Event::GetDone`].
    pub fn get(&mut self, key: &RegionKey, offset: u64, len: u32) -> Result<u64, SendError> {
        self.rma_request(key, FrameType::Get, offset, u64::from(len), &[])
    }

    /// Enters the next barrier: tells every live peer. Returns its epoch,
    /// for [`Self::barrier_done`].
    pub fn barrier_start(&mut self) -> Result<u64, SendError> {
        let me = self.cfg.rank;
        for (r, p) in self.peers.iter().enumerate() {
            if r as u32 != me && p.failed.is_none() && p.out.free() < FRAME_HEADER_LEN + 8 {
                return Err(SendError::QueueFull { peer: r as u32 });
            }
        }
        let epoch = self.barrier_epoch + 1;
        for peer in 0..self.cfg.size {
            if peer != me && self.peers[peer as usize].failed.is_none() {
                self.queue_frame(
                    peer,
                    FrameRepr::send(TAG_BARRIER, 8),
                    &[&epoch.to_le_bytes()],
                )?;
            }
        }
        self.barrier_epoch = epoch;
        Ok(epoch)
    }

    /// Whether every other rank entered barrier `epoch` (failed ranks are
    /// not waited for).
    pub fn barrier_done(&self, epoch: u64) -> bool {
        let arrived = self
            .barrier
            .iter()
            .find(|(e, _)| *e == epoch)
            .map_or(0, |&(_, n)| n);
        let failed = self.peers.iter().filter(|p| p.failed.is_some()).count() as u32;
        arrived + failed >= self.cfg.size - 1
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
        for peer in 0..self.cfg.size {
            self.flush_peer(peer);
        }
        n += self.report(on_event);
        // Send what was written now rather than at the next poll.
        self.iface.poll(ts, device, &mut self.sockets);
        n
    }

    // ---- sockets -------------------------------------------------------

    fn new_id(&mut self, i: usize) -> ConnId {
        let s = &mut self.slots[i];
        s.gen = s.gen.wrapping_add(1) & 0x00ff_ffff;
        s.id = ConnId((s.gen << 8) | i as u32);
        s.id
    }

    fn slot_of(&self, conn: ConnId) -> Option<usize> {
        let i = (conn.0 & 0xff) as usize;
        let s = self.slots.get(i)?;
        (s.id == conn && !matches!(s.role, Role::Free | Role::Closing)).then_some(i)
    }

    /// Drops slot `i`'s connection: a FIN after what is written
    /// (`graceful`), or a reset.
    fn release(&mut self, i: usize, graceful: bool) {
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

    fn arm_listeners(&mut self) {
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

    fn start_connects(&mut self) {
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
                    let a = self.peers[peer as usize]
                        .ep
                        .on_connect_failed(ConnId(u32::MAX));
                    self.apply(peer, a);
                }
            }
        }
    }

    fn timers(&mut self) {
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
    fn service(&mut self, i: usize, on_event: &mut dyn FnMut(Event<'_>)) -> usize {
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
                    let a = self.peers[peer as usize].ep.on_connect_failed(conn);
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

    /// Whom slot `i` reads for: `Some(Some(peer))` for an identified
    /// connection, `Some(None)` for an incoming one not identified yet;
    /// `None` when the slot takes no input now (no connection, or an RMA
    /// answer to its peer waits for room: no more input meanwhile).
    fn reading_for(&self, i: usize) -> Option<Option<u32>> {
        let peer = match self.slots[i].role {
            Role::Conn(p) => Some(p),
            Role::Incoming(_) => None,
            _ => return None,
        };
        if peer.is_some_and(|p| self.peers[p as usize].reply.is_some()) {
            return None;
        }
        Some(peer)
    }

    /// Reads what slot `i`'s socket has, decoding as it goes; then notices
    /// EOF or a reset.
    fn read(&mut self, i: usize, on_event: &mut dyn FnMut(Event<'_>)) -> usize {
        let mut n = self.decode(i, on_event);
        for _ in 0..64 {
            let Some(peer) = self.reading_for(i) else {
                return n;
            };
            let s = &mut self.slots[i];
            let sock = self.sockets.get_mut::<tcp::Socket>(s.handle);
            if !sock.can_recv() {
                break;
            }
            let room = s.dec.direct_payload_room() as usize;
            let got = match (peer, s.cur) {
                (Some(p), Some(_)) if room > 0 => {
                    // Straight into the message buffer (the header was
                    // checked against its room).
                    let pr = &mut self.peers[p as usize];
                    let base = pr.chunk.map_or(0, |c| c.have) + s.fill;
                    let end = (base + room).min(pr.msg.len());
                    let got = sock.recv_slice(&mut pr.msg[base..end]).unwrap_or(0);
                    s.fill += got;
                    s.dec.payload_read_directly(got as u32);
                    got
                }
                _ => {
                    let got = sock.recv_slice(s.dec.spare()).unwrap_or(0);
                    s.dec.filled(got);
                    got
                }
            };
            if got == 0 {
                break;
            }
            n += self.decode(i, on_event);
        }
        // End of the stream?
        let Some(peer) = self.reading_for(i) else {
            return n;
        };
        let s = &self.slots[i];
        let sock = self.sockets.get::<tcp::Socket>(s.handle);
        let state = sock.state();
        let reset = state == tcp::State::Closed;
        let eof = !reset && !sock.may_recv() && sock.recv_queue() == 0;
        if !reset && !eof {
            return n;
        }
        let conn = s.id;
        let partial = s.dec.has_partial() || s.cur.is_some();
        match peer {
            None => {
                debug!("btl-baremetal: an unidentified connection closed");
                self.release(i, !reset);
            }
            Some(p) => {
                let a = if reset {
                    self.peers[p as usize].ep.on_error(conn)
                } else {
                    self.peers[p as usize].ep.on_eof(conn, partial)
                };
                self.apply(p, a);
                if self.slot_of(conn).is_some() {
                    self.release(i, !reset);
                }
            }
        }
        n + 1
    }

    /// Drains slot `i`'s decoder.
    fn decode(&mut self, i: usize, on_event: &mut dyn FnMut(Event<'_>)) -> usize {
        let mut n = 0;
        let max_frame = self.max_frame;
        loop {
            let s = &mut self.slots[i];
            let conn = s.id;
            let peer = match s.role {
                Role::Conn(p) => Some(p),
                Role::Incoming(_) => None,
                _ => return n,
            };
            if peer.is_some_and(|p| self.peers[p as usize].reply.is_some()) {
                return n;
            }
            let Some(ev) = s.dec.next_event(max_frame) else {
                return n;
            };
            n += 1;
            match (ev, peer) {
                (Err(e), Some(p)) => {
                    warn!("btl-baremetal: bad frame from {}: {}", p, e);
                    let a = self.peers[p as usize].ep.on_protocol_error(conn, e);
                    self.apply(p, a);
                    return n;
                }
                (Err(e), None) => {
                    warn!("btl-baremetal: dropped a connection: {}", e);
                    self.stats.rejected += 1;
                    self.release(i, false);
                    return n;
                }
                (Ok(DecEvent::Handshake(repr)), None) => {
                    self.incoming_handshake(i, repr);
                }
                (Ok(DecEvent::Handshake(repr)), Some(p)) => {
                    let a = self.peers[p as usize].ep.on_handshake(conn, repr);
                    self.apply(p, a);
                }
                (Ok(DecEvent::Header(h)), Some(p)) => {
                    let pr = &self.peers[p as usize];
                    let base = pr.chunk.map_or(0, |c| c.have);
                    let room = pr.msg.len() - base;
                    if h.len as usize > room {
                        let e = WireError::FrameTooLarge {
                            len: h.len,
                            max: room as u32,
                        };
                        warn!("btl-baremetal: frame from {} too large: {}", p, e);
                        let a = self.peers[p as usize].ep.on_protocol_error(conn, e);
                        self.apply(p, a);
                        return n;
                    }
                    s.cur = Some(h);
                    s.fill = 0;
                }
                (Ok(DecEvent::Payload(bytes)), Some(p)) => {
                    let pr = &mut self.peers[p as usize];
                    let at = pr.chunk.map_or(0, |c| c.have) + s.fill;
                    // In bounds: the header was checked against the room.
                    if let Some(dst) = pr.msg.get_mut(at..at + bytes.len()) {
                        dst.copy_from_slice(bytes);
                    }
                    s.fill += bytes.len();
                }
                (Ok(DecEvent::FrameEnd), Some(p)) => {
                    let h = s.cur.take();
                    let len = core::mem::take(&mut s.fill);
                    if let Some(h) = h {
                        self.on_frame(conn, p, h, len, on_event);
                    }
                }
                // Frames before the handshake: the decoder cannot produce
                // them (it expects the handshake first).
                (Ok(_), None) => {}
            }
        }
    }

    fn incoming_handshake(&mut self, i: usize, repr: btl_core::tcp::wire::HandshakeRepr) {
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

    /// A whole frame from `peer`: its payload is `msg[base..base + len]`.
    fn on_frame(
        &mut self,
        conn: ConnId,
        peer: u32,
        h: FrameRepr,
        len: usize,
        on_event: &mut dyn FnMut(Event<'_>),
    ) {
        let pi = peer as usize;
        let base = self.peers[pi].chunk.map_or(0, |c| c.have);
        match h.kind {
            FrameType::Send if h.tag == TAG_CHUNK => self.on_chunk(conn, peer, len, on_event),
            FrameType::Send if h.tag == TAG_BARRIER => {
                let p = &self.peers[pi];
                if let Ok(b) = <[u8; 8]>::try_from(&p.msg[base..base + len]) {
                    let epoch = u64::from_le_bytes(b);
                    let slot = &mut self.barrier[(epoch % 4) as usize];
                    if slot.0 != epoch {
                        *slot = (epoch, 0);
                    }
                    slot.1 += 1;
                }
            }
            FrameType::Send if h.tag <= MAX_USER_TAG => {
                self.stats.messages += 1;
                on_event(Event::Message {
                    from: peer,
                    tag: h.tag,
                    data: &self.peers[pi].msg[base..base + len],
                });
            }
            FrameType::Send => {
                warn!(
                    "btl-baremetal: message from {} with unknown internal tag {}",
                    peer, h.tag
                );
            }
            FrameType::Fin => {
                let a = self.peers[pi].ep.on_fin(conn);
                self.apply(peer, a);
            }
            FrameType::Put | FrameType::Get => self.serve_rma(peer, h, base, len),
            FrameType::GetResp | FrameType::PutAck => {
                let Some(k) = self
                    .requests
                    .iter()
                    .position(|r| r.id == h.id && r.peer == peer && !r.failed)
                else {
                    warn!(
                        "btl-baremetal: answer from {} to unknown request {}",
                        peer, h.id
                    );
                    return;
                };
                let req = self.requests.swap_remove(k);
                let data = &self.peers[pi].msg[base..base + len];
                match (req.kind, h.kind) {
                    (FrameType::Put, FrameType::PutAck) => on_event(Event::PutDone {
                        request: req.id,
                        peer,
                        result: if h.error {
                            Err(RmaError::Refused)
                        } else {
                            Ok(())
                        },
                    }),
                    (FrameType::Get, FrameType::GetResp) => on_event(Event::GetDone {
                        request: req.id,
                        peer,
                        result: if h.error {
                            Err(RmaError::Refused)
                        } else if data.len() as u64 != req.len {
                            Err(RmaError::BadLength)
                        } else {
                            Ok(data)
                        },
                    }),
                    _ => {
                        warn!(
                            "btl-baremetal: {} answered request {} with the wrong frame type",
                            peer, h.id
                        );
                        let result = Err(RmaError::BadLength);
                        if req.kind == FrameType::Put {
                            on_event(Event::PutDone {
                                request: req.id,
                                peer,
                                result,
                            });
                        } else {
                            on_event(Event::GetDone {
                                request: req.id,
                                peer,
                                result: Err(RmaError::BadLength),
                            });
                        }
                    }
                }
            }
        }
    }

    /// A chunk of a large message (`len` bytes at the assembly point).
    fn on_chunk(
        &mut self,
        conn: ConnId,
        peer: u32,
        len: usize,
        on_event: &mut dyn FnMut(Event<'_>),
    ) {
        let pi = peer as usize;
        let cap = self.peers[pi].msg.len();
        let p = &mut self.peers[pi];
        let fail = match p.chunk {
            None => {
                // The first chunk: header, then data (moved to the front).
                if len < CHUNK_HEADER_LEN {
                    Some(WireError::Truncated {
                        needed: CHUNK_HEADER_LEN,
                        got: len,
                    })
                } else {
                    let tag = p.msg[0];
                    let mut t = [0u8; 8];
                    t.copy_from_slice(&p.msg[8..16]);
                    let total = u64::from_le_bytes(t);
                    let data = len - CHUNK_HEADER_LEN;
                    if tag > MAX_USER_TAG {
                        Some(WireError::BadType { found: tag })
                    } else if total > cap as u64 || (data as u64) > total {
                        Some(WireError::FrameTooLarge {
                            len: u32::try_from(total).unwrap_or(u32::MAX),
                            max: cap as u32,
                        })
                    } else {
                        p.msg.copy_within(CHUNK_HEADER_LEN..len, 0);
                        p.chunk = Some(Chunk {
                            tag,
                            total: total as usize,
                            have: data,
                        });
                        None
                    }
                }
            }
            Some(mut c) => {
                if c.have + len > c.total {
                    Some(WireError::FrameTooLarge {
                        len: (c.have + len) as u32,
                        max: c.total as u32,
                    })
                } else {
                    c.have += len;
                    p.chunk = Some(c);
                    None
                }
            }
        };
        if let Some(e) = fail {
            warn!("btl-baremetal: bad chunked message from {}: {}", peer, e);
            let a = self.peers[pi].ep.on_protocol_error(conn, e);
            self.apply(peer, a);
            return;
        }
        let p = &mut self.peers[pi];
        if let Some(c) = p.chunk.filter(|c| c.have == c.total) {
            p.chunk = None;
            self.stats.messages += 1;
            on_event(Event::Message {
                from: peer,
                tag: c.tag,
                data: &self.peers[pi].msg[..c.total],
            });
        }
    }

    /// A PUT or GET from `peer`, checked against our regions, applied, and
    /// answered (or the answer parked until the queue has room).
    fn serve_rma(&mut self, peer: u32, h: FrameRepr, base: usize, len: usize) {
        let pi = peer as usize;
        let payload = &self.peers[pi].msg[base..base + len];
        // The decoder validated the sub-header (and a PUT's length).
        let rma = payload
            .get(..RMA_HEADER_LEN)
            .and_then(|b| RmaRepr::parse(&RmaPacket::new_unchecked(b)).ok());
        let queue_cap = self.peers[pi].out.capacity();
        let target = rma.and_then(|r| {
            let region = self.regions.get(r.region as usize)?;
            let end = r.offset.checked_add(r.len)?;
            let fits = h.kind == FrameType::Put || (r.len as usize) + FRAME_HEADER_LEN <= queue_cap;
            (end <= region.len() as u64 && fits).then_some(r)
        });
        let mut reply = Reply {
            kind: if h.kind == FrameType::Put {
                FrameType::PutAck
            } else {
                FrameType::GetResp
            },
            id: h.id,
            ok: target.is_some(),
            region: 0,
            offset: 0,
            len: 0,
        };
        match target {
            Some(r) => {
                let (off, n) = (r.offset as usize, r.len as usize);
                if h.kind == FrameType::Put {
                    let src = &self.peers[pi].msg[base + RMA_HEADER_LEN..base + len];
                    self.regions[r.region as usize][off..off + n].copy_from_slice(src);
                } else {
                    reply.region = r.region as usize;
                    reply.offset = off;
                    reply.len = n;
                }
            }
            None => {
                warn!(
                    "btl-baremetal: refused a {} from {} outside our regions",
                    h.kind as u8, peer
                )
            }
        }
        self.peers[pi].reply = Some(reply);
        self.send_reply(peer);
    }

    /// Queues `peer`'s parked RMA answer if there is room.
    fn send_reply(&mut self, peer: u32) {
        let pi = peer as usize;
        let Some(r) = self.peers[pi].reply else {
            return;
        };
        if self.peers[pi].out.free() < FRAME_HEADER_LEN + r.len {
            return;
        }
        self.peers[pi].reply = None;
        let repr = FrameRepr {
            kind: r.kind,
            tag: 0,
            error: !r.ok,
            len: r.len as u32,
            id: r.id,
        };
        let data: &[u8] = match self.regions.get(r.region) {
            Some(region) if r.len > 0 => &region[r.offset..r.offset + r.len],
            _ => &[],
        };
        // The frame bypasses `queue_frame`: borrowing the region and the
        // queue at once.
        let p = &mut self.peers[pi];
        match p.ep.on_send_request(self.now) {
            SendDecision::Refuse(_) => return,
            SendDecision::SendNow { conn } => p.out_conn = Some(conn),
            SendDecision::Queue => {}
            SendDecision::QueueAndConnect => p.want_connect = true,
        }
        let hdr = repr.to_bytes();
        let _ = p.out.push(&[&hdr, data]);
    }

    /// Writes `peer`'s queue into its connection's socket.
    fn flush_peer(&mut self, peer: u32) {
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
    fn apply(&mut self, peer: u32, action: Action) {
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
        while let Some(k) = self.requests.iter().position(|r| r.failed) {
            let req = self.requests.swap_remove(k);
            n += 1;
            if req.kind == FrameType::Put {
                on_event(Event::PutDone {
                    request: req.id,
                    peer: req.peer,
                    result: Err(RmaError::PeerFailed),
                });
            } else {
                on_event(Event::GetDone {
                    request: req.id,
                    peer: req.peer,
                    result: Err(RmaError::PeerFailed),
                });
            }
        }
        n
    }
}
