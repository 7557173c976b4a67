//! The TCP transport on Linux: kernel sockets (socket2), epoll-driven
//! progress (rustix), and btl-core's sans-IO protocol (`btl_core::tcp`:
//! wire formats, the incremental decoder, the endpoint state machine).
//!
//! - Every rank listens on one port per address family (IPv4 in
//!   `[port_min_v4, port_min_v4 + port_range_v4)`, IPv6 likewise with
//!   `IPV6_V6ONLY`; ports in use are skipped; no `SO_REUSEADDR`),
//!   non-blocking, and publishes its addresses through the job's wire-up
//!   ([`crate::wireup`]); a peer is reached on the first family both have.
//! - Connections open lazily on the first send to a peer; frames sent
//!   meanwhile wait in that peer's queue (owned here; the core decides when
//!   they may flow). A simultaneous connect keeps the connection started by
//!   the lower rank; no queued frame is lost.
//! - Header and payload go out in one `writev`; a read fills the decoder's
//!   read-ahead buffer (`endpoint_cache`), from which several frames may
//!   come. `TCP_NODELAY` unless `use_nagle`; `sndbuf`/`rcvbuf` applied.
//! - Untrusted input: an accepted connection must identify itself (magic,
//!   version, job, a known rank) within the handshake timeout or it is
//!   dropped — logged once, the job goes on; a frame header announcing more
//!   than `max_frame` bytes is refused before anything is allocated.
//! - A peer whose connection breaks without a FIN is failed: its queued
//!   frames are dropped and sends to it return [`TcpError::PeerFailed`]; a
//!   FIN is a clean close.
//!
//! # Safety
//!
//! One `unsafe` block: after `recv` into a `Vec`'s spare capacity, the
//! length is set to cover exactly the bytes the kernel wrote.
#![allow(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, IoSlice};

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use btl_core::params::Params as _;
use btl_core::tcp::addr::{write_addr_record, AddrRecord};
use btl_core::tcp::decoder::{Decoder, Event};
use btl_core::tcp::endpoint::{
    Action, ConnId, Endpoint, EndpointState, Incoming, IncomingDecision, RejectReason, SendDecision,
};
use btl_core::tcp::params::TcpParams;
use btl_core::tcp::wire::{
    job_hash, FrameRepr, FrameType, HandshakeRepr, RmaPacket, RmaRepr, RMA_HEADER_LEN,
};
use rustix::event::epoll;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::sm::{RegionKey, RmaStatus};
use crate::wireup::{Identity, WireupError};

/// Largest user tag (as for shared memory).
pub const MAX_USER_TAG: u8 = btl_core::tcp::wire::MAX_USER_TAG;
const LISTENER: u64 = u64::MAX;
/// Most established connections for which a non-blocking progress pass
/// reads the sockets directly instead of asking epoll first.
const DIRECT_POLL_MAX: usize = 4;
/// A large frame's writer busy-polls this many times for the socket to
/// take more before it blocks in `epoll_wait`.
const WRITE_SPINS: u32 = 2000;
/// With direct polling, every this many passes go through epoll.
const DIRECT_POLL_EVERY: u32 = 16;

/// Wire-up key of a rank's listen addresses (comma-separated socket
/// addresses, one per address family).
pub const ADDR_KEY: &str = "tcp-addr";

type Handler = Box<dyn FnMut(u32, &[u8])>;

/// Errors of the TCP transport.
#[derive(Debug)]
pub enum TcpError {
    /// A parameter is malformed.
    Param(String),
    /// A socket operation failed.
    Io {
        /// What was being done.
        what: &'static str,
        /// Why.
        source: io::Error,
    },
    /// No port free in the configured range.
    NoPort {
        /// First port tried.
        min: u16,
        /// Ports tried.
        range: u16,
    },
    /// Address exchange failed.
    Wireup(WireupError),
    /// A peer published an address that does not parse.
    BadAddress {
        /// The peer.
        peer: u32,
    },
    /// No such peer (or it is this rank).
    InvalidPeer {
        /// The rank given.
        peer: u32,
    },
    /// The tag is reserved.
    ReservedTag {
        /// The tag.
        tag: u8,
    },
    /// The message is larger than the largest frame.
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: u32,
    },
    /// The peer failed (connection lost without a clean close, handshake
    /// timeout, refused identity).
    PeerFailed {
        /// The peer.
        peer: u32,
        /// Why.
        why: String,
    },
    /// A get or put was refused by the target (outside its regions).
    Rma {
        /// The target.
        peer: u32,
        /// Why.
        status: RmaStatus,
    },
    /// A blocking call timed out.
    Timeout {
        /// What was waited for.
        what: &'static str,
    },
}

impl fmt::Display for TcpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Param(e) => write!(f, "tcp parameters: {e}"),
            Self::Io { what, source } => write!(f, "tcp: cannot {what}: {source}"),
            Self::NoPort { min, range } => {
                write!(
                    f,
                    "tcp: no free port in [{min}, {})",
                    u32::from(*min) + u32::from(*range)
                )
            }
            Self::Wireup(e) => write!(f, "tcp wire-up: {e}"),
            Self::BadAddress { peer } => {
                write!(f, "tcp: rank {peer} published a malformed address")
            }
            Self::InvalidPeer { peer } => write!(f, "tcp: no peer {peer}"),
            Self::ReservedTag { tag } => {
                write!(
                    f,
                    "tag {tag} is reserved (user tags are 0..={MAX_USER_TAG})"
                )
            }
            Self::TooLarge { len, max } => {
                write!(f, "tcp: message of {len} bytes exceeds max_frame ({max})")
            }
            Self::PeerFailed { peer, why } => write!(f, "tcp: peer {peer} failed: {why}"),
            Self::Rma { peer, status } => write!(f, "tcp: get/put at rank {peer}: {status}"),
            Self::Timeout { what } => write!(f, "tcp: timed out waiting for {what}"),
        }
    }
}

impl std::error::Error for TcpError {}

fn io_err(what: &'static str) -> impl Fn(io::Error) -> TcpError {
    move |source| TcpError::Io { what, source }
}

/// What the transport needs from the verified parameters.
#[derive(Clone, Copy, Debug)]
struct Config {
    port_min: u16,
    port_range: u16,
    port_min6: u16,
    port_range6: u16,
    nodelay: bool,
    sndbuf: usize,
    rcvbuf: usize,
    cache: usize,
    max_frame: u32,
    handshake_ms: u64,
}

impl Config {
    fn from(p: &TcpParams) -> Self {
        use btl_core::tcp::params::IpFamily;
        let (v4, v6) = (p.listen_ports(IpFamily::V4), p.listen_ports(IpFamily::V6));
        let span = |r: &std::ops::RangeInclusive<u16>| {
            r.end().saturating_sub(*r.start()).saturating_add(1)
        };
        let (port_min, port_range) = (*v4.start(), span(&v4));
        let (port_min6, port_range6) = (*v6.start(), span(&v6));
        Self {
            port_min,
            port_range,
            port_min6,
            port_range6,
            nodelay: !p.use_nagle,
            sndbuf: usize::try_from(p.sndbuf).unwrap_or(0),
            rcvbuf: usize::try_from(p.rcvbuf).unwrap_or(0),
            cache: usize::try_from(p.endpoint_cache)
                .unwrap_or(30 * 1024)
                .max(64),
            max_frame: p.max_frame(),
            handshake_ms: u64::from(p.handshake_timeout),
        }
    }
}

/// Reads the `tcp` parameters from the environment (`BTL_TCP_*`,
/// `OMPI_MCA_btl_tcp_*`) over the defaults, and verifies them.
pub fn params_from_env() -> Result<TcpParams, TcpError> {
    let mut p = TcpParams::default();
    for (k, v) in std::env::vars_os() {
        let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else {
            continue;
        };
        p.set_from_env_var(k, v)
            .map_err(|e| TcpError::Param(e.to_string()))?;
    }
    p.verify().map_err(|e| TcpError::Param(e.to_string()))?;
    Ok(p)
}

/// The addresses to listen on and connect from, one per address family
/// (IPv4 first): `BTL_BIND` if set (one address); else, when
/// `if_include` is given, the IPv4 and (global) IPv6 address of the first
/// interface that interface selection (`btl_core::tcp::ifsel`) picks from
/// the machine's interfaces; else, for a job on one machine, loopback
/// (127.0.0.1 and ::1) — such a job never leaves the machine unless told
/// which interface to use; for a job across machines (`multi_node`), the
/// first interface the selection picks with the default exclusions
/// (`127.0.0.1/8,sppp`). `disable_family` drops a family.
pub fn choose_binds(params: &TcpParams, multi_node: bool) -> Result<Vec<IpAddr>, TcpError> {
    use btl_core::tcp::ifsel::{select, Instance, Interface};
    use btl_core::tcp::params::IpFamily;
    use std::net::{Ipv4Addr, Ipv6Addr};
    if let Ok(b) = std::env::var("BTL_BIND") {
        let ip: IpAddr = b.trim().parse().map_err(|_| {
            TcpError::Param(format!(
                "BTL_BIND={b:?}: accepts an IP address such as 127.0.0.1"
            ))
        })?;
        return Ok(vec![ip]);
    }
    let ifs = crate::ifaddrs::interfaces().map_err(io_err("list the network interfaces"))?;
    let enabled = |ip: &IpAddr| params.family_enabled(IpFamily::of(ip));
    let mut binds = Vec::new();
    if params.if_include().is_empty() && !multi_node {
        let v6_lo = ifs
            .iter()
            .any(|i| i.addr == IpAddr::V6(Ipv6Addr::LOCALHOST));
        binds.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
        if v6_lo {
            binds.push(IpAddr::V6(Ipv6Addr::LOCALHOST));
        }
    } else {
        let list: Vec<Interface<'_>> = ifs
            .iter()
            .map(|i| Interface {
                name: &i.name,
                index: i.index,
                addr: i.addr,
                prefix_len: i.prefix_len,
                up: i.up,
                loopback: i.loopback,
            })
            .collect();
        let empty = Instance {
            if_name: "",
            index: 0,
            addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            addr_v4: None,
            addr_v6: None,
            link: 0,
            bandwidth: 0,
            latency: 0,
        };
        let mut out = vec![empty; list.len().max(1) * params.links.max(1) as usize];
        let n = select(&list, params, &mut out, |w| {
            log::warn!("tcp interface selection: {w}")
        })
        .map_err(|e| TcpError::Param(e.to_string()))?;
        let first = out[..n]
            .first()
            .ok_or(TcpError::Param("tcp: no interface selected".into()))?;
        log::debug!("tcp: using interface {} ({})", first.if_name, first.addr);
        binds.extend(first.addr_v4.map(IpAddr::V4));
        // A link-local IPv6 address needs a scope to be reached: skip it.
        binds.extend(
            first
                .addr_v6
                .filter(|a| (a.segments()[0] & 0xffc0) != 0xfe80)
                .map(IpAddr::V6),
        );
    }
    binds.retain(enabled);
    if binds.is_empty() {
        return Err(TcpError::Param(
            "tcp: no address left to listen on (disable_family removed them all)".into(),
        ));
    }
    Ok(binds)
}

/// One socket: a connection in any state.
struct Conn {
    sock: Socket,
    /// The peer, once known (our connect, or an identified incoming).
    peer: Option<u32>,
    /// An accepted connection that has not identified itself yet.
    incoming: Option<Incoming>,
    /// Our connect is in progress (waiting for writability).
    connecting: bool,
    dec: Decoder<Box<[u8]>>,
    /// Bytes to write, in order, and how much of the first is written.
    out: VecDeque<Vec<u8>>,
    out_off: usize,
    write_armed: bool,
    /// The frame being received: header and payload so far.
    cur: Option<FrameRepr>,
    payload: Vec<u8>,
    /// Drop once `out` is written.
    close_after_write: bool,
    /// A large frame is being written straight from the sender's buffer:
    /// nothing else may be written on this connection meanwhile.
    writing_in_place: bool,
    /// Peer address, for logs.
    addr: String,
}

struct Peer {
    ep: Endpoint,
    /// Frames waiting for a connection.
    queue: VecDeque<Vec<u8>>,
    /// Where to connect, and our address (same family) to connect from.
    addr: Option<(SocketAddr, IpAddr)>,
    failed: Option<String>,
}

/// The TCP transport of one process.
pub struct Tcp {
    me: u32,
    n: u32,
    job: u64,
    cfg: Config,
    epoll: OwnedFd,
    listeners: Vec<Socket>,
    locals: Vec<SocketAddr>,
    conns: HashMap<u32, Conn>,
    next_conn: u32,
    peers: Vec<Peer>,
    handlers: Vec<Option<Handler>>,
    start: Instant,
    events: Vec<epoll::Event>,
    /// Connections polled directly this pass (see `progress_timeout`).
    direct: Vec<ConnId>,
    timeout: Duration,
    /// Connections dropped for bad input (for tests and diagnostics).
    rejected: u64,
    barrier_epoch: u64,
    /// Peers that announced each barrier epoch.
    barrier_arrivals: HashMap<u64, Vec<u32>>,
    /// Progress passes (timers run every 64).
    passes: u32,
    /// Registered regions peers may get from and put into.
    regions: HashMap<u32, Box<[u8]>>,
    next_region: u32,
    next_req: u64,
    /// Our get/put requests waiting for their answer: status and, for a
    /// get, the data.
    rma_wait: HashMap<u64, (u32, Option<RmaStatus>, Vec<u8>)>,
    /// Messages being reassembled, per sender: (tag, total, bytes so far).
    partial: HashMap<u32, (u8, u64, Vec<u8>)>,
}

impl fmt::Debug for Tcp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tcp")
            .field("me", &self.me)
            .field("n", &self.n)
            .field("locals", &self.locals)
            .finish()
    }
}

// The internal tags and the chunk header are the protocol's (btl-core), so
// that every adapter speaks them alike: chunks of one message follow each
// other on the connection (one connection per peer, in order).
use btl_core::tcp::wire::{CHUNK_HEADER_LEN as CHUNK_HEADER, TAG_BARRIER, TAG_CHUNK};
/// Largest message the receiving side reassembles (1 GiB).
pub const MAX_MESSAGE: u64 = 1 << 30;

/// Binds a non-blocking IPv4 listener on `ip` within the port range,
/// skipping ports in use (no `SO_REUSEADDR`).
fn listen_in_range(ip: IpAddr, cfg: &Config) -> Result<Socket, TcpError> {
    let (port_min, port_range) = if ip.is_ipv4() {
        (cfg.port_min, cfg.port_range)
    } else {
        (cfg.port_min6, cfg.port_range6)
    };
    for i in 0..u32::from(port_range) {
        let port = u32::from(port_min) + i;
        let Ok(port) = u16::try_from(port) else { break };
        let domain = if ip.is_ipv4() {
            Domain::IPV4
        } else {
            Domain::IPV6
        };
        let sock = Socket::new(domain, Type::STREAM.cloexec(), Some(Protocol::TCP))
            .map_err(io_err("create a listening socket"))?;
        if ip.is_ipv6() {
            sock.set_only_v6(true).map_err(io_err("set IPV6_V6ONLY"))?;
        }
        match sock.bind(&SockAddr::from(SocketAddr::new(ip, port))) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
            Err(e) => {
                return Err(TcpError::Io {
                    what: "bind the listening socket",
                    source: e,
                })
            }
        }
        sock.listen(1024).map_err(io_err("listen"))?;
        sock.set_nonblocking(true)
            .map_err(io_err("make the listener non-blocking"))?;
        return Ok(sock);
    }
    Err(TcpError::NoPort {
        min: port_min,
        range: port_range,
    })
}

fn tune(sock: &Socket, cfg: &Config) -> io::Result<()> {
    sock.set_nonblocking(true)?;
    sock.set_nodelay(cfg.nodelay)?;
    if cfg.sndbuf > 0 {
        sock.set_send_buffer_size(cfg.sndbuf)?;
    }
    if cfg.rcvbuf > 0 {
        sock.set_recv_buffer_size(cfg.rcvbuf)?;
    }
    Ok(())
}

fn frame_bytes(repr: &FrameRepr, payload: &[&[u8]]) -> Vec<u8> {
    let len: usize = payload.iter().map(|p| p.len()).sum();
    let mut v = Vec::with_capacity(16 + len);
    v.extend_from_slice(&repr.to_bytes());
    for p in payload {
        v.extend_from_slice(p);
    }
    v
}

impl Tcp {
    /// Starts the job's TCP transport: listens on `binds` (loopback for a
    /// single machine, the selected interface's addresses otherwise). The
    /// caller publishes [`Self::published_addrs`] through the job's
    /// wire-up and hands every peer's record to [`Self::set_peer_addrs`];
    /// connections open lazily on the first send.
    pub fn listen(job: &Identity, params: TcpParams, binds: &[IpAddr]) -> Result<Tcp, TcpError> {
        let cfg = Config::from(&params);
        let timeout =
            crate::sm::env_secs_opt("BTL_TIMEOUT", Duration::from_secs(300)).ok_or_else(|| {
                TcpError::Param("BTL_TIMEOUT: accepts a positive number of seconds".into())
            })?;
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| TcpError::Io {
            what: "create an epoll instance",
            source: e.into(),
        })?;
        let mut listeners = Vec::new();
        let mut locals = Vec::new();
        for (i, &bind) in binds.iter().enumerate() {
            let listener = listen_in_range(bind, &cfg)?;
            let local = listener
                .local_addr()
                .ok()
                .and_then(|a| a.as_socket())
                .ok_or(TcpError::Io {
                    what: "read the listening address",
                    source: io::Error::other("not an inet address"),
                })?;
            epoll::add(
                &epoll,
                listener.as_fd(),
                epoll::EventData::new_u64(LISTENER - i as u64),
                epoll::EventFlags::IN,
            )
            .map_err(|e| TcpError::Io {
                what: "register the listener",
                source: e.into(),
            })?;
            listeners.push(listener);
            locals.push(local);
        }
        if locals.is_empty() {
            return Err(TcpError::Param("tcp: no address to listen on".into()));
        }
        let jh = job_hash(job.job.as_bytes());
        let peers = (0..job.size)
            .map(|r| Peer {
                ep: Endpoint::new(job.rank, r, jh, cfg.handshake_ms),
                queue: VecDeque::new(),
                addr: None,
                failed: None,
            })
            .collect();
        Ok(Tcp {
            me: job.rank,
            n: job.size,
            job: jh,
            cfg,
            epoll,
            listeners,
            locals,
            conns: HashMap::new(),
            next_conn: 0,
            peers,
            handlers: (0..256).map(|_| None).collect(),
            start: Instant::now(),
            events: Vec::with_capacity(64),
            direct: Vec::with_capacity(DIRECT_POLL_MAX + 1),
            timeout,
            rejected: 0,
            barrier_epoch: 0,
            barrier_arrivals: HashMap::new(),
            partial: HashMap::new(),
            passes: 0,
            regions: HashMap::new(),
            next_region: 0,
            next_req: 0,
            rma_wait: HashMap::new(),
        })
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.me
    }

    /// Number of ranks.
    pub fn size(&self) -> u32 {
        self.n
    }

    /// The addresses this rank listens on (one per address family).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.locals
    }

    /// The wire-up record of our addresses ([`ADDR_KEY`]'s value).
    pub fn published_addrs(&self) -> String {
        let mut published = String::new();
        // Writing to a String cannot fail.
        let _ = write_addr_record(&mut published, self.locals.iter().copied());
        published
    }

    /// Takes `peer`'s wire-up record (its [`ADDR_KEY`] value): we will
    /// reach it on the first address family (IPv4 first) both of us listen
    /// on. A record that does not parse is an error naming the peer.
    pub fn set_peer_addrs(&mut self, peer: u32, record: &[u8]) -> Result<(), TcpError> {
        // The whole record is refused if any entry is malformed.
        let theirs: Vec<SocketAddr> = match AddrRecord::parse(record) {
            Ok(r) => r.iter().collect(),
            Err(e) => {
                log::error!("tcp: rank {peer}'s address record: {e}");
                return Err(TcpError::BadAddress { peer });
            }
        };
        let Some(p) = self.peers.get_mut(peer as usize) else {
            return Err(TcpError::BadAddress { peer });
        };
        if theirs.is_empty() {
            return Err(TcpError::BadAddress { peer });
        }
        let pick = self.locals.iter().find_map(|l| {
            theirs
                .iter()
                .find(|t| t.is_ipv4() == l.is_ipv4())
                .map(|t| (*t, l.ip()))
        });
        if pick.is_none() && peer != self.me {
            log::warn!(
                "tcp: rank {peer} listens on {theirs:?}: no address family in common with ours"
            );
        }
        p.addr = pick;
        Ok(())
    }

    /// Connections dropped because the other side sent something invalid
    /// (bad handshake, unknown identity, oversized frame, timeout).
    pub fn rejected_connections(&self) -> u64 {
        self.rejected
    }

    /// Peers that failed so far, with the reason.
    pub fn failed_peers(&self) -> Vec<(u32, String)> {
        self.peers
            .iter()
            .enumerate()
            .filter_map(|(r, p)| p.failed.clone().map(|w| (r as u32, w)))
            .collect()
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Registers `handler` for `tag` (as for shared memory).
    pub fn on(
        &mut self,
        tag: u8,
        handler: impl FnMut(u32, &[u8]) + 'static,
    ) -> Result<(), TcpError> {
        if tag > MAX_USER_TAG {
            return Err(TcpError::ReservedTag { tag });
        }
        self.handlers[usize::from(tag)] = Some(Box::new(handler));
        Ok(())
    }

    fn add_conn(
        &mut self,
        sock: Socket,
        peer: Option<u32>,
        incoming: Option<Incoming>,
        connecting: bool,
        addr: String,
    ) -> Result<ConnId, TcpError> {
        let id = self.next_conn;
        self.next_conn = self.next_conn.wrapping_add(1);
        let flags = if connecting {
            epoll::EventFlags::OUT
        } else {
            epoll::EventFlags::IN
        };
        epoll::add(
            &self.epoll,
            sock.as_fd(),
            epoll::EventData::new_u64(u64::from(id)),
            flags,
        )
        .map_err(|e| TcpError::Io {
            what: "register a connection",
            source: e.into(),
        })?;
        let dec = if incoming.is_some() || connecting {
            Decoder::expecting_handshake(vec![0u8; self.cfg.cache].into_boxed_slice())
        } else {
            Decoder::new(vec![0u8; self.cfg.cache].into_boxed_slice())
        }
        .map_err(|e| TcpError::Param(e.to_string()))?;
        self.conns.insert(
            id,
            Conn {
                sock,
                peer,
                incoming,
                connecting,
                dec,
                out: VecDeque::new(),
                out_off: 0,
                write_armed: connecting,
                cur: None,
                payload: Vec::new(),
                close_after_write: false,
                writing_in_place: false,
                addr,
            },
        );
        Ok(ConnId(id))
    }

    fn drop_conn(&mut self, id: ConnId) {
        if let Some(c) = self.conns.remove(&id.0) {
            let _ = epoll::delete(&self.epoll, c.sock.as_fd());
        }
    }

    fn start_connect(&mut self, peer: u32) -> Result<(), TcpError> {
        let Some((addr, from)) = self.peers[peer as usize].addr else {
            return Err(TcpError::BadAddress { peer });
        };
        let domain = if addr.is_ipv4() {
            Domain::IPV4
        } else {
            Domain::IPV6
        };
        let sock = Socket::new(domain, Type::STREAM.cloexec(), Some(Protocol::TCP))
            .map_err(io_err("create a socket"))?;
        tune(&sock, &self.cfg).map_err(io_err("configure a socket"))?;
        // Outgoing connections leave from the address we listen on (the
        // selected interface).
        let _ = sock.bind(&SockAddr::from(SocketAddr::new(from, 0)));
        match sock.connect(&SockAddr::from(addr)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => {
                let a = self.peers[peer as usize]
                    .ep
                    .on_connect_failed(ConnId(u32::MAX));
                self.apply(peer, a);
                return Err(TcpError::Io {
                    what: "connect",
                    source: e,
                });
            }
        }
        self.add_conn(sock, Some(peer), None, true, addr.to_string())?;
        Ok(())
    }

    /// Carries out an endpoint action for `peer`.
    fn apply(&mut self, peer: u32, action: Action) {
        match action {
            Action::None => {}
            Action::SendHandshake { conn, repr } => {
                self.queue_bytes(conn, repr.to_bytes().to_vec());
            }
            Action::FlushQueue { conn } => {
                let q = std::mem::take(&mut self.peers[peer as usize].queue);
                for f in q {
                    self.queue_bytes(conn, f);
                }
            }
            Action::SendFin { conn } => {
                self.queue_bytes(conn, FrameRepr::fin().to_bytes().to_vec());
                if let Some(c) = self.conns.get_mut(&conn.0) {
                    c.close_after_write = true;
                }
            }
            Action::Close { conn } => {
                let pending = self.conns.get(&conn.0).is_some_and(|c| !c.out.is_empty());
                if pending {
                    if let Some(c) = self.conns.get_mut(&conn.0) {
                        c.close_after_write = true;
                    }
                } else {
                    self.drop_conn(conn);
                }
            }
            Action::Fail { close, reason } => {
                if let Some(c) = close {
                    self.drop_conn(c);
                }
                let p = &mut self.peers[peer as usize];
                if !p.queue.is_empty() {
                    log::warn!(
                        "tcp: dropping {} queued frames to failed peer {peer}",
                        p.queue.len()
                    );
                }
                p.queue.clear();
                // (The endpoint state machine logged the failure.)
                p.failed = Some(reason.to_string());
            }
        }
    }

    /// Appends bytes to a connection's output and tries to write.
    fn queue_bytes(&mut self, conn: ConnId, bytes: Vec<u8>) {
        if let Some(c) = self.conns.get_mut(&conn.0) {
            c.out.push_back(bytes);
        }
        self.flush_conn(conn);
    }

    /// Writes as much of a connection's output as the socket takes, arming
    /// EPOLLOUT for the rest.
    fn flush_conn(&mut self, conn: ConnId) {
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
}

impl Tcp {
    /// A connection broke (error or EOF): tell its endpoint, or just drop
    /// it if it never identified itself.
    fn conn_broken(&mut self, conn: ConnId, eof_clean_possible: bool) {
        let Some(c) = self.conns.get(&conn.0) else {
            return;
        };
        let has_partial = c.dec.has_partial() || c.cur.is_some();
        match c.peer {
            Some(peer) if c.incoming.is_none() => {
                let a = if eof_clean_possible {
                    self.peers[peer as usize].ep.on_eof(conn, has_partial)
                } else {
                    self.peers[peer as usize].ep.on_error(conn)
                };
                self.drop_conn(conn);
                let a = match a {
                    Action::Close { conn: c2 } if c2 == conn => Action::None,
                    Action::Fail {
                        close: Some(c2),
                        reason,
                    } if c2 == conn => Action::Fail {
                        close: None,
                        reason,
                    },
                    other => other,
                };
                self.apply(peer, a);
            }
            _ => self.drop_conn(conn),
        }
    }

    fn reject(&mut self, conn: ConnId, why: &dyn fmt::Display) {
        let addr = self
            .conns
            .get(&conn.0)
            .map(|c| c.addr.clone())
            .unwrap_or_default();
        log::warn!("tcp: dropped connection from {addr}: {why}");
        self.rejected += 1;
        self.drop_conn(conn);
    }

    fn accept_all(&mut self, listener: usize) -> usize {
        let mut n = 0;
        loop {
            let Some(l) = self.listeners.get(listener) else {
                return n;
            };
            match l.accept() {
                Ok((sock, addr)) => {
                    n += 1;
                    let addr = addr.as_socket().map(|a| a.to_string()).unwrap_or_default();
                    if let Err(e) = tune(&sock, &self.cfg) {
                        log::warn!("tcp: cannot configure a connection from {addr}: {e}");
                        continue;
                    }
                    let inc = Incoming::new(self.now_ms(), self.cfg.handshake_ms);
                    if let Err(e) = self.add_conn(sock, None, Some(inc), false, addr) {
                        log::warn!("{e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::warn!("tcp: accept failed: {e}");
                    break;
                }
            }
        }
        n
    }

    /// The busy-polling fast path: with at most [`DIRECT_POLL_MAX`]
    /// established connections, a non-blocking pass reads each of them
    /// directly (one `recv` that usually says "nothing", instead of
    /// `epoll_wait` and then `recv`: one system call less per message).
    /// Every [`DIRECT_POLL_EVERY`]-th pass goes through epoll as usual, for
    /// accepts, connects, writability and hang-ups. `None` when the fast
    /// path does not apply.
    fn poll_direct(&mut self) -> Option<usize> {
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
    fn read_conn(&mut self, conn: ConnId) -> usize {
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
    fn decode(&mut self, conn: ConnId) -> usize {
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

    fn on_incoming_handshake(&mut self, conn: ConnId, repr: HandshakeRepr) {
        let (me, n, job) = (self.me, self.n, self.job);
        let verdict = {
            let Some(c) = self.conns.get_mut(&conn.0) else {
                return;
            };
            let Some(inc) = c.incoming.as_mut() else {
                return;
            };
            let v = inc.on_handshake(repr, job, me, n);
            if let Ok(peer) = v {
                c.peer = Some(peer);
                c.incoming = None;
            }
            v
        };
        let peer = match verdict {
            Err(reason) => return self.reject(conn, &reason),
            Ok(peer) => peer,
        };
        match self.peers[peer as usize].ep.on_incoming(conn, repr) {
            IncomingDecision::Accept {
                conn,
                reply,
                close_ours,
            } => {
                if let Some(o) = close_ours {
                    self.drop_conn(o);
                }
                self.queue_bytes(conn, reply.to_bytes().to_vec());
                self.apply(peer, Action::FlushQueue { conn });
            }
            IncomingDecision::Refuse { conn, reason } => {
                if matches!(
                    reason,
                    RejectReason::TieBreak { .. } | RejectReason::AlreadyConnected
                ) {
                    // The normal end of a simultaneous connect: the
                    // connection started by the lower rank wins and the
                    // other one is dropped quietly. (A stranger repeating a
                    // valid identity looks the same, and is dropped too.)
                    log::debug!("tcp: second connection from {peer} dropped: {reason}");
                    self.drop_conn(conn);
                } else {
                    self.reject(conn, &format_args!("it claims to be rank {peer}: {reason}"));
                }
            }
        }
    }

    fn on_frame(&mut self, conn: ConnId, peer: u32, h: FrameRepr, payload: &[u8]) {
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

    /// A PUT or GET from `peer`: checked against our registered regions
    /// (unknown region or a range outside it is refused: the peer never
    /// writes or reads where it was not invited), then applied and answered.
    fn serve_rma(&mut self, peer: u32, h: FrameRepr, payload: &[u8]) {
        // The decoder validated the sub-header and, for PUT, that its length
        // matches the data.
        let parsed = payload
            .get(..RMA_HEADER_LEN)
            .ok_or(())
            .and_then(|b| RmaRepr::parse(&RmaPacket::new_unchecked(b)).map_err(|_| ()));
        let range = parsed.ok().and_then(|r| {
            let region = self.regions.get_mut(&r.region)?;
            let end = r.offset.checked_add(r.len)?;
            (end <= region.len() as u64).then_some((r, region))
        });
        let (reply_kind, ok, data): (FrameType, bool, Vec<u8>) = match (h.kind, range) {
            (FrameType::Put, Some((r, region))) => {
                region[r.offset as usize..(r.offset + r.len) as usize]
                    .copy_from_slice(&payload[RMA_HEADER_LEN..]);
                (FrameType::PutAck, true, Vec::new())
            }
            (FrameType::Get, Some((r, region))) => (
                FrameType::GetResp,
                true,
                region[r.offset as usize..(r.offset + r.len) as usize].to_vec(),
            ),
            (kind, None) => {
                log::warn!("tcp: refused a {kind:?} from {peer} outside our registered regions");
                let k = if kind == FrameType::Put {
                    FrameType::PutAck
                } else {
                    FrameType::GetResp
                };
                (k, false, Vec::new())
            }
            _ => return,
        };
        let reply = FrameRepr {
            kind: reply_kind,
            tag: 0,
            error: !ok,
            len: data.len() as u32,
            id: h.id,
        };
        if let Err(e) = self.send_repr(peer, reply, &data) {
            log::warn!("tcp: cannot answer {peer}'s request: {e}");
        }
    }

    /// Registers a zeroed region of `len` bytes peers may get from and put
    /// into; send its key to them (as for shared memory).
    pub fn register(&mut self, len: usize) -> RegionKey {
        let id = self.next_region;
        self.next_region += 1;
        self.regions.insert(id, vec![0u8; len].into_boxed_slice());
        RegionKey {
            rank: self.me,
            id,
            len: len as u64,
        }
    }

    /// The table of our registered regions (the job API lends one table
    /// to both transports).
    pub(crate) fn regions_mut(&mut self) -> &mut HashMap<u32, Box<[u8]>> {
        &mut self.regions
    }

    /// The contents of one of our regions.
    pub fn region(&self, key: &RegionKey) -> Option<&[u8]> {
        (key.rank == self.me).then_some(())?;
        self.regions.get(&key.id).map(|r| &r[..])
    }

    /// Sends one RMA request frame and waits for its answer.
    fn rma_request(
        &mut self,
        peer: u32,
        kind: FrameType,
        rma: RmaRepr,
        data: &[u8],
    ) -> Result<Vec<u8>, TcpError> {
        self.next_req += 1;
        let id = self.next_req;
        self.rma_wait.insert(id, (peer, None, Vec::new()));
        let mut body = Vec::with_capacity(RMA_HEADER_LEN + data.len());
        body.extend_from_slice(&rma.to_bytes());
        body.extend_from_slice(data);
        let repr = FrameRepr {
            kind,
            tag: 0,
            error: false,
            len: body.len() as u32,
            id,
        };
        let sent = self.send_repr(peer, repr, &body).and_then(|()| {
            self.wait_until("a get/put answer", Some(peer), |t| {
                t.rma_wait.get(&id).is_some_and(|w| w.1.is_some())
            })
        });
        let (_, status, data) = self
            .rma_wait
            .remove(&id)
            .unwrap_or((peer, None, Vec::new()));
        sent?;
        match status {
            Some(RmaStatus::Ok) => Ok(data),
            Some(status) => Err(TcpError::Rma { peer, status }),
            None => Err(TcpError::PeerFailed {
                peer,
                why: "no answer to a get/put".into(),
            }),
        }
    }

    /// Writes `src` at `offset` of the peer's region `key`; returns once the
    /// peer applied it. A range outside the region is refused by the peer.
    pub fn put(&mut self, key: &RegionKey, offset: u64, src: &[u8]) -> Result<(), TcpError> {
        let step = (self.cfg.max_frame as usize - RMA_HEADER_LEN).max(1);
        let mut done = 0usize;
        loop {
            let end = (done + step).min(src.len());
            let rma = RmaRepr {
                region: key.id,
                offset: offset + done as u64,
                len: (end - done) as u64,
            };
            self.rma_request(key.rank, FrameType::Put, rma, &src[done..end])?;
            done = end;
            if done >= src.len() {
                return Ok(());
            }
        }
    }

    /// Reads `dst.len()` bytes at `offset` of the peer's region `key`.
    pub fn get(&mut self, key: &RegionKey, offset: u64, dst: &mut [u8]) -> Result<(), TcpError> {
        let step = self.cfg.max_frame as usize;
        let mut done = 0usize;
        loop {
            let end = (done + step).min(dst.len());
            let rma = RmaRepr {
                region: key.id,
                offset: offset + done as u64,
                len: (end - done) as u64,
            };
            let data = self.rma_request(key.rank, FrameType::Get, rma, &[])?;
            if data.len() != end - done {
                return Err(TcpError::PeerFailed {
                    peer: key.rank,
                    why: "answered a get with the wrong length".into(),
                });
            }
            dst[done..end].copy_from_slice(&data);
            done = end;
            if done >= dst.len() {
                return Ok(());
            }
        }
    }

    fn timers(&mut self) {
        let now = self.now_ms();
        let expired: Vec<u32> = self
            .conns
            .iter_mut()
            .filter_map(|(&id, c)| {
                let inc = c.incoming.as_mut()?;
                inc.on_timer(now).then_some(id)
            })
            .collect();
        for id in expired {
            self.reject(ConnId(id), &"no handshake within the handshake timeout");
        }
        for peer in 0..self.n {
            let ep = &mut self.peers[peer as usize].ep;
            if ep.deadline().is_some_and(|d| now >= d) {
                let a = ep.on_timer(now);
                self.apply(peer, a);
            }
        }
    }

    /// One pass of progress: waits up to `timeout` for socket events
    /// (zero: just poll), handles them, checks timers. Returns the number
    /// of events handled.
    pub fn progress_timeout(&mut self, timeout: Duration) -> usize {
        if timeout.is_zero() && self.passes % DIRECT_POLL_EVERY != 0 {
            if let Some(n) = self.poll_direct() {
                self.passes = self.passes.wrapping_add(1);
                if self.passes % 64 == 0 {
                    self.timers();
                }
                return n;
            }
        }
        // (Progress can nest — a large write progresses while it waits —
        // so the event list may have been taken by an outer call.)
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        events.reserve(64);
        let ts = rustix::time::Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        let _ = epoll::wait(
            &self.epoll,
            rustix::buffer::spare_capacity(&mut events),
            Some(&ts),
        );
        let mut n = 0;
        for ev in &events {
            let (flags, data) = (ev.flags, ev.data);
            let token = data.u64();
            let nl = self.listeners.len() as u64;
            if token > LISTENER - nl {
                n += self.accept_all((LISTENER - token) as usize);
                continue;
            }
            let conn = ConnId(token as u32);
            n += 1;
            if flags.contains(epoll::EventFlags::OUT) {
                self.on_writable(conn);
            }
            if flags
                .intersects(epoll::EventFlags::IN | epoll::EventFlags::HUP | epoll::EventFlags::ERR)
            {
                n += self.read_conn(conn);
            }
        }
        self.events = events;
        // Timers are millisecond-scale: look at the clock (a vDSO call that
        // costs as much as a small message) only every 64 passes, or after a
        // blocking wait.
        self.passes = self.passes.wrapping_add(1);
        if self.passes % 64 == 0 || !timeout.is_zero() {
            self.timers();
        }
        n
    }

    /// One non-blocking pass of progress.
    pub fn progress(&mut self) -> usize {
        self.progress_timeout(Duration::ZERO)
    }

    fn on_writable(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn.0) else {
            return;
        };
        if c.connecting {
            c.connecting = false;
            let peer = c.peer.unwrap_or(0);
            let err = c.sock.take_error().ok().flatten();
            if let Some(e) = err {
                log::debug!("tcp: connect to {peer} failed: {e}");
                let a = self.peers[peer as usize].ep.on_connect_failed(conn);
                self.drop_conn(conn);
                self.apply(peer, a);
                return;
            }
            let now = self.now_ms();
            let a = self.peers[peer as usize].ep.on_connected(conn, now);
            self.apply(peer, a);
        }
        self.flush_conn(conn);
    }
}

impl Tcp {
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
    fn on_chunk(&mut self, peer: u32, payload: &[u8]) {
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

    fn send_frame(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), TcpError> {
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
    fn send_repr(&mut self, peer: u32, repr: FrameRepr, data: &[u8]) -> Result<(), TcpError> {
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
    fn write_frame(&mut self, conn: ConnId, repr: &FrameRepr, data: &[u8]) -> Result<(), TcpError> {
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

    /// Progresses until `done(self)`, busy-polling for a while (the
    /// latency-sensitive case), then blocking in `epoll_wait` for up to a
    /// millisecond at a time. `peer`'s failure ends the wait.
    pub fn wait_until(
        &mut self,
        what: &'static str,
        peer: Option<u32>,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> Result<(), TcpError> {
        let start = Instant::now();
        let mut idle = 0u32;
        loop {
            if done(self) {
                return Ok(());
            }
            if let Some(p) = peer {
                if let Some(why) = self.peers.get(p as usize).and_then(|x| x.failed.clone()) {
                    return Err(TcpError::PeerFailed { peer: p, why });
                }
            }
            let t = if idle < 2000 {
                Duration::ZERO
            } else {
                Duration::from_millis(1)
            };
            if self.progress_timeout(t) > 0 {
                idle = 0;
            } else {
                idle = idle.saturating_add(1);
                if idle % 256 == 0 && start.elapsed() > self.timeout {
                    return Err(TcpError::Timeout { what });
                }
            }
        }
    }

    /// Waits until every other rank has called `barrier` as often.
    pub fn barrier(&mut self) -> Result<(), TcpError> {
        self.barrier_epoch += 1;
        let epoch = self.barrier_epoch;
        let me = self.me;
        for peer in (0..self.n).filter(|&p| p != me) {
            self.send_frame(peer, TAG_BARRIER, &epoch.to_le_bytes())?;
        }
        // Every other rank arrived, or failed (a barrier of the survivors).
        self.wait_until("the other ranks at a barrier", None, |t| {
            (0..t.n)
                .filter(|&p| p != me)
                .all(|p| t.barrier_arrived(epoch, p) || t.peers[p as usize].failed.is_some())
        })?;
        self.barrier_arrivals.remove(&epoch);
        Ok(())
    }

    /// Sends `peer` our arrival at barrier `epoch` (the TCP barrier's
    /// frame, which the bare-metal node speaks too).
    pub(crate) fn send_barrier(&mut self, peer: u32, epoch: u64) -> Result<(), TcpError> {
        self.send_frame(peer, TAG_BARRIER, &epoch.to_le_bytes())
    }

    /// Whether `peer` has announced barrier `epoch`.
    pub(crate) fn barrier_arrived(&self, epoch: u64, peer: u32) -> bool {
        self.barrier_arrivals
            .get(&epoch)
            .is_some_and(|v| v.contains(&peer))
    }

    /// Forgets barrier `epoch`'s announcements.
    pub(crate) fn barrier_forget(&mut self, epoch: u64) {
        self.barrier_arrivals.remove(&epoch);
    }

    /// Progresses until every queued byte is written.
    pub fn flush(&mut self) -> Result<(), TcpError> {
        self.wait_until("queued frames to be written", None, |t| {
            t.peers
                .iter()
                .all(|p| p.queue.is_empty() || p.failed.is_some())
                && t.conns.values().all(|c| c.out.is_empty())
        })
    }
}

impl Drop for Tcp {
    fn drop(&mut self) {
        // Clean close: FIN on every established connection, written before
        // the sockets go.
        for peer in 0..self.n {
            if self.peers[peer as usize].ep.state() == EndpointState::Connected {
                let a = self.peers[peer as usize].ep.close();
                self.apply(peer, a);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.conns.values().any(|c| !c.out.is_empty()) && Instant::now() < deadline {
            self.progress_timeout(Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn listener_skips_ports_in_use() {
        let cfg = Config::from(&TcpParams::default());
        let a = listen_in_range(IpAddr::V4(Ipv4Addr::LOCALHOST), &cfg).unwrap();
        let pa = a.local_addr().unwrap().as_socket().unwrap().port();
        let cfg2 = Config {
            port_min: pa,
            port_range: 50,
            ..cfg
        };
        let b = listen_in_range(IpAddr::V4(Ipv4Addr::LOCALHOST), &cfg2).unwrap();
        let pb = b.local_addr().unwrap().as_socket().unwrap().port();
        assert!(pb > pa && pb < pa + 50);
        let cfg3 = Config {
            port_min: pa,
            port_range: 1,
            ..cfg
        };
        assert!(matches!(
            listen_in_range(IpAddr::V4(Ipv4Addr::LOCALHOST), &cfg3),
            Err(TcpError::NoPort { .. })
        ));
    }
}
