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

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use btl_core::rma::RmaStatus;
use btl_core::tcp::addr::{write_addr_record, AddrRecord};
use btl_core::tcp::decoder::Decoder;
use btl_core::tcp::endpoint::{ConnId, Endpoint, EndpointState, Incoming};
use btl_core::tcp::params::TcpParams;
use btl_core::tcp::wire::{job_hash, FrameRepr};
use rustix::event::epoll;
use socket2::Socket;

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
mod config;
mod conn;
mod frames;
mod rma;

use config::Config;
pub use config::{choose_binds, params_from_env};
use conn::listen_in_range;

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

impl Tcp {
    /// Starts the job's TCP transport: listens on `binds` (loopback for a
    /// single machine, the selected interface's addresses otherwise). The
    /// caller publishes [`Self::published_addrs`] through the job's
    /// wire-up and hands every peer's record to [`Self::set_peer_addrs`];
    /// connections open lazily on the first send.
    pub fn listen(job: &Identity, params: TcpParams, binds: &[IpAddr]) -> Result<Tcp, TcpError> {
        let cfg = Config::from(&params);
        let timeout = crate::job::env_secs_opt("BTL_TIMEOUT", Duration::from_secs(300))
            .ok_or_else(|| {
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
