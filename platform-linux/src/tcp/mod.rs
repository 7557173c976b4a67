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
//! - Nothing blocks: a post writes what the socket takes at once (header
//!   and payload in one `writev`) and queues the rest — copied for small
//!   remainders and copy-semantics sends, or, for `isend_raw`/`iput`, the
//!   caller's memory itself, written as the socket drains and completed
//!   with [`TEvent::Done`]. What waits in user space for one peer is
//!   bounded ([`QueueLimits`]): beyond, posts are refused with
//!   [`crate::ops::PostError::WouldBlock`] (backpressure), so a peer that stops reading
//!   cannot make us grow without bound.
//! - A read fills the decoder's read-ahead buffer (`endpoint_cache`), from
//!   which several frames may come; a message whose payload is in that
//!   buffer is handed out in place; a large payload is read straight into
//!   its destination (the reassembly buffer, or a get's local memory).
//!   `TCP_NODELAY` unless `use_nagle`; `sndbuf`/`rcvbuf` applied.
//! - Dead links: keep-alive probes and `TCP_USER_TIMEOUT` (the
//!   `keepalive_*` and `user_timeout` parameters) make the kernel report a
//!   peer that stopped answering at the network level (no FIN, no RST) —
//!   the connection errors and the peer is failed.
//! - Untrusted input: an accepted connection must identify itself (magic,
//!   version, job, a known rank) within the handshake timeout or it is
//!   dropped — logged once, the job goes on; a frame header announcing more
//!   than `max_frame` bytes is refused before anything is allocated.
//! - A peer whose connection breaks without a FIN is failed: its queued
//!   frames are dropped, its operations complete with an error, posts to it
//!   are refused with [`crate::ops::PostError::PeerFailed`], and the failure is
//!   reported once as [`TEvent::PeerFailed`]; a FIN is a clean close.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use btl_core::tcp::addr::{write_addr_record, AddrRecord};
use btl_core::tcp::decoder::Decoder;
use btl_core::tcp::endpoint::{ConnId, Endpoint, EndpointState, Incoming};
use btl_core::tcp::params::TcpParams;
use btl_core::tcp::wire::{job_hash, FrameRepr, FrameType, RmaRepr, RMA_HEADER_LEN};
use rustix::event::epoll;
use socket2::Socket;

use crate::idmap::IdMap;
use crate::ops::{OpError, OpId, PostError, Posted, QueueLimits, RawBuf, Sink, TEvent};
use crate::regions::Regions;
use crate::wireup::{Identity, WireupError};

mod config;
mod conn;
mod frames;
mod rma;

use config::Config;
pub use config::{choose_binds, params_from_env, params_from_env_unverified};
use conn::listen_in_range;
use frames::OutBuf;
use rma::Rma;

/// Largest user tag (as for shared memory).
pub const MAX_USER_TAG: u8 = btl_core::tcp::wire::MAX_USER_TAG;
const LISTENER: u64 = u64::MAX;
/// Most established connections for which a non-blocking progress pass
/// reads the sockets directly instead of asking epoll first.
const DIRECT_POLL_MAX: usize = 4;
/// Write combining (`write_combine`, default 64 KiB): a post to a
/// connection that a post of the same progress pass wrote to already is
/// written corked (`MSG_MORE`: the kernel appends it to the socket's last
/// unsent segment instead of sending a segment of its own), and the next
/// pass pushes what is corked (`TCP_NODELAY` set again), or a write
/// without `MSG_MORE` does, at the latest once `write_combine` bytes are
/// corked. The first message of a burst leaves at once, so a ping-pong (a
/// pass between every two sends) never waits; a window of small sends
/// costs the receiver one wake-up and the stack one segment per batch
/// instead of per message (on loopback here a `sendmsg` of a 4 KiB frame
/// was about 90 % kernel time, most of it per segment: its trip through
/// the stack, the wake-up).
///
/// Decided: corked in the kernel, not held in user space. Frames held in
/// user space until the next pass (the earlier design, one `sendmsg` per
/// batch) never left when the sender stopped calling progress: under
/// Open MPI 5, mpi4py's `test_util_sync` hung, a rank spinning on its own
/// window (an MPI call that progresses nothing) while its last `isend`s
/// waited in user space, and MPI's progress rule wants a started send
/// to complete without further calls by the sender. The kernel sends a
/// corked segment by itself: with the next ACK, or after its zero-window
/// probe timer (at least 200 ms) when nothing is in flight. So a sender
/// that stops calling progress delays a burst's tail by at most that, and
/// never holds it (`write_combine` 0 turns combining off; with
/// `use_nagle` the kernel combines and nothing is corked).
///
/// Frames up to this many bytes are corked for combining; larger ones
/// (which fill segments by themselves) write at once, pushing whatever is
/// corked before them.
const COMBINE_FRAME: usize = 32 * 1024;
/// With direct polling, every this many passes go through epoll.
const DIRECT_POLL_EVERY: u32 = 16;
/// Non-blocking passes without any I/O (nothing read or written, nothing
/// posted, no get/put awaited) after which the transport counts as quiet.
const QUIET_AFTER: u32 = 64;
/// A quiet transport looks at its sockets (through epoll) on every this
/// many non-blocking passes; the others return at once.
const QUIET_EVERY: u32 = 16;
// The pass a quiet transport makes goes through epoll (every socket).
const _: () = assert!(QUIET_EVERY % DIRECT_POLL_EVERY == 0);

/// Wire-up key of a rank's listen addresses (comma-separated socket
/// addresses, one per address family).
pub const ADDR_KEY: &str = "tcp-addr";
/// Largest message the receiving side reassembles (1 GiB).
pub const MAX_MESSAGE: u64 = 1 << 30;

/// Errors of the TCP transport's start-up and configuration.
#[derive(Debug, thiserror::Error)]
pub enum TcpError {
    /// A parameter is malformed.
    #[error("tcp parameters: {0}")]
    Param(String),
    /// A socket operation failed.
    #[error("tcp: cannot {what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Why.
        source: io::Error,
    },
    /// No port free in the configured range.
    #[error("tcp: no free port in [{min}, {})", u32::from(*.min) + u32::from(*.range))]
    NoPort {
        /// First port tried.
        min: u16,
        /// Ports tried.
        range: u16,
    },
    /// Address exchange failed.
    #[error("tcp wire-up: {0}")]
    Wireup(WireupError),
    /// A peer published an address that does not parse.
    #[error("tcp: rank {peer} published a malformed address")]
    BadAddress {
        /// The peer.
        peer: u32,
    },
}

fn io_err(what: &'static str) -> impl Fn(io::Error) -> TcpError {
    move |source| TcpError::Io { what, source }
}

/// The connections by id (ids are ours: see [`IdMap`]).
type ConnMap = IdMap<u32, Conn>;

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
    /// What to write, in order, and how much of the first is written.
    out: VecDeque<OutBuf>,
    out_off: usize,
    write_armed: bool,
    /// The frame being received.
    cur: Option<FrameRepr>,
    /// Its payload so far (unless delivered in place or read into `into`).
    payload: Vec<u8>,
    /// The current frame's payload goes straight here (a get's answer),
    /// with the bytes written so far.
    into: Option<(RawBuf, usize)>,
    /// The current frame was delivered in place already.
    delivered: bool,
    /// Where the read-ahead buffer is (the decoder owns it; a boxed slice
    /// does not move).
    rbuf: std::ops::Range<usize>,
    /// Drop once `out` is written.
    close_after_write: bool,
    /// The pass ([`Tcp::epoch`]) in which a post last wrote to this
    /// connection: a later post of the same pass is corked for combining.
    wrote_in: u64,
    /// Bytes written corked (`MSG_MORE`) since the last push (pushed by
    /// the next pass, or by a write without `MSG_MORE`; at most
    /// `write_combine`).
    held: usize,
    /// The socket's `SO_RCVLOWAT` as we last set it (1: the kernel's
    /// default; see `recv_lowat`).
    lowat: u32,
    /// Whether the large payload being read is gated by `lowat` (decided
    /// when it is first seen; `None` between such payloads; see
    /// `sync_lowat`).
    lowat_on: Option<bool>,
    /// When the last payload that [`Conn::lowat_on`] decided on ended.
    big_read_end: Option<Instant>,
    /// Peer address, for logs.
    addr: String,
}

impl Conn {
    /// Write combining (`write_combine` = `combine` bytes): whether a frame
    /// of `len` bytes posted in pass `epoch` is written corked, behind an
    /// earlier post of the same pass, rather than sent at once (not when
    /// the socket is full anyway, nor beyond the bound).
    fn holds(&self, len: usize, epoch: u64, combine: usize) -> bool {
        self.wrote_in == epoch
            && len <= COMBINE_FRAME
            && self.held + len <= combine
            && !self.write_armed
    }
}

struct Peer {
    ep: Endpoint,
    /// Frames waiting for a connection.
    queue: VecDeque<OutBuf>,
    /// Bytes and frames of ours waiting in user space for this peer (its
    /// queue plus its connection's output).
    queued_bytes: u64,
    queued_frames: u32,
    /// Where to connect, and our address (same family) to connect from.
    addr: Option<(SocketAddr, IpAddr)>,
    failed: Option<String>,
    /// A chunked message being reassembled: (tag, total, bytes so far).
    partial: Option<(u8, u64, Vec<u8>)>,
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
    conns: ConnMap,
    next_conn: u32,
    peers: Vec<Peer>,
    start: Instant,
    events: Vec<epoll::Event>,
    /// The established connections a non-blocking pass reads directly
    /// (`poll_direct`), rebuilt only when `direct_stale`: a connection was
    /// added, dropped, finished connecting or its handshake.
    direct: Vec<ConnId>,
    /// `direct` is out of date (see there).
    direct_stale: bool,
    /// The connections the direct passes read, taken out of the epoll set
    /// while they do ([`Self::unwatch`]): a socket in an epoll set
    /// costs every segment that reaches it a wake-up callback in the
    /// kernel (the raw loopback ping-pong, 8 B: ~0.1 µs more with its
    /// socket in an epoll set nobody waits on). Every blocking wait puts
    /// them back first ([`Self::rewatch`]); a non-blocking pass through
    /// epoll reads them directly.
    unwatched: Vec<ConnId>,
    /// Where a small frame is gathered for its one send(2) (`write_now`).
    small_out: Box<[u8; frames::SMALL_FRAME]>,
    /// Connections dropped for bad input (for tests and diagnostics).
    rejected: u64,
    /// Progress passes (timers run every 64).
    passes: u32,
    /// Passes begun (every one, quiet or not): what a connection's
    /// `wrote_in` is compared with.
    epoch: u64,
    /// Connections with frames corked for combining, pushed at the start
    /// of the next pass.
    held: Vec<ConnId>,
    /// How many more times a pass that reads its one connection directly
    /// tries `recv` while the socket is empty ([`Self::set_recv_spin`]).
    recv_spin: u32,
    /// Reads and writes that moved bytes, and posts (wrapping): what
    /// [`Self::quiet_skip`] compares with `io_seen`.
    io_moves: u64,
    /// `io_moves` as the last non-blocking pass saw it.
    io_seen: u64,
    /// Non-blocking passes in a row that saw no I/O.
    quiet: u32,
    limits: QueueLimits,
    /// Our one-sided operations in flight (get/put frames waiting for
    /// their answer, and each operation's state).
    rma: Rma,
    /// Completions to report at the end of the pass.
    done: rma::Done,
    /// Regions of answers that left the queues, to unpin
    /// ([`Self::apply_unpins`]).
    unpins: Vec<u32>,
    /// Failures to report at the end of the pass.
    to_report: Vec<(u32, String)>,
    /// The last socket error, for the failure it causes.
    io_error: Option<String>,
}

// SAFETY: the only non-`Send` content is `RawBuf` addresses of caller memory
// kept under its contract (in queued frames and get destinations); the
// transport is moved as a whole and never shared between threads.
#[allow(unsafe_code)]
unsafe impl Send for Tcp {}

impl fmt::Debug for Tcp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tcp")
            .field("me", &self.me)
            .field("n", &self.n)
            .field("locals", &self.locals)
            .finish()
    }
}

/// What a progress pass lends the read path.
pub(crate) struct Pass<'a, 's> {
    regions: &'a mut Regions,
    sink: &'a mut Sink<'s>,
}

impl Tcp {
    /// Starts the job's TCP transport: listens on `binds` (loopback for a
    /// single machine, the selected interface's addresses otherwise). The
    /// caller publishes [`Self::published_addrs`] through the job's
    /// wire-up and hands every peer's record to [`Self::set_peer_addrs`];
    /// connections open lazily on the first send.
    pub fn listen(job: &Identity, params: TcpParams, binds: &[IpAddr]) -> Result<Tcp, TcpError> {
        let cfg = Config::from(&params);
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
                queued_bytes: 0,
                queued_frames: 0,
                addr: None,
                failed: None,
                partial: None,
            })
            .collect();
        Ok(Tcp {
            me: job.rank,
            n: job.size,
            job: jh,
            limits: cfg.limits,
            cfg,
            epoll,
            listeners,
            locals,
            conns: ConnMap::default(),
            next_conn: 0,
            peers,
            start: Instant::now(),
            events: Vec::with_capacity(64),
            direct: Vec::with_capacity(DIRECT_POLL_MAX + 1),
            direct_stale: true,
            unwatched: Vec::with_capacity(DIRECT_POLL_MAX),
            small_out: Box::new([0; frames::SMALL_FRAME]),
            rejected: 0,
            passes: 0,
            epoch: 0,
            held: Vec::new(),
            recv_spin: 0,
            io_moves: 0,
            io_seen: 0,
            quiet: 0,
            rma: Rma::default(),
            unpins: Vec::new(),
            done: Vec::new(),
            to_report: Vec::new(),
            io_error: None,
        })
    }

    /// Retries a refused or unanswered connect to a peer for up to
    /// `window` from the first attempt (see
    /// [`btl_core::tcp::endpoint::Endpoint::with_connect_retry`]); without
    /// it a failed connect fails the peer at once.
    pub fn set_connect_retry(&mut self, window: Duration) {
        let ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        for p in &mut self.peers {
            p.ep.set_connect_retry(ms);
        }
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

    /// Sets the bounds of what may wait in user space for one peer.
    pub fn set_queue_limits(&mut self, limits: QueueLimits) {
        self.limits = limits;
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

    /// Bytes and frames waiting in user space, over all peers.
    pub fn queued(&self) -> (u64, u64) {
        self.peers.iter().fold((0, 0), |(b, f), p| {
            (b + p.queued_bytes, f + u64::from(p.queued_frames))
        })
    }

    /// True when nothing of ours waits: every queued byte is written and
    /// every get/put answered.
    pub fn is_flushed(&self) -> bool {
        self.peers
            .iter()
            .all(|p| p.failed.is_some() || p.queued_frames == 0)
            && self.conns.values().all(|c| c.out.is_empty())
            && self.rma.nothing_waits()
    }

    /// Whether the address range `data` lies in one of our connections' read buffers (the
    /// read-ahead buffer, or the buffer a large payload was read into
    /// directly): how messages are handed out in place.
    pub fn holds(&self, data: &std::ops::Range<usize>) -> bool {
        let (a, b) = (data.start, data.end);
        self.conns.values().any(|c| {
            let p = c.payload.as_ptr() as usize;
            (c.rbuf.start <= a && b <= c.rbuf.end)
                || (c.payload.capacity() > 0 && p <= a && b <= p + c.payload.capacity())
        })
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// One pass of progress: waits up to `timeout` for socket events
    /// (zero: just poll), handles them, checks timers. Events go to `sink`:
    /// messages, completions of operations posted earlier, barrier
    /// arrivals, failures. Returns the number of events handled.
    pub fn progress_timeout(
        &mut self,
        regions: &mut Regions,
        sink: &mut Sink<'_>,
        timeout: Duration,
    ) -> usize {
        let mut pass = Pass { regions, sink };
        let n = self.poll_sockets(&mut pass, timeout);
        self.apply_unpins(pass.regions);
        n + self.report(pass.regions, pass.sink)
    }

    /// Lets the next non-blocking passes try an empty socket's `recv` up to
    /// `n` more times in a tight loop when they read one connection
    /// directly (0: once, the default). For a blocking wait on a TCP-only
    /// world, which calls it while it spins: a message is seen one system
    /// call after it arrived, as by a bare `recv` loop, where between two
    /// `recv`s of whole passes lay the rest of the pass (about 390
    /// instructions of `btl bench`'s wait, cold after each system call).
    pub fn set_recv_spin(&mut self, n: u32) {
        self.recv_spin = n;
    }

    /// One non-blocking pass of progress.
    pub fn progress(&mut self, regions: &mut Regions, sink: &mut Sink<'_>) -> usize {
        self.progress_timeout(regions, sink, Duration::ZERO)
    }

    fn poll_sockets(&mut self, pass: &mut Pass<'_, '_>, timeout: Duration) -> usize {
        self.epoch = self.epoch.wrapping_add(1);
        if !self.held.is_empty() {
            self.write_held();
        }
        if timeout.is_zero() && self.quiet_skip() {
            return 0;
        }
        if timeout.is_zero() && self.passes % DIRECT_POLL_EVERY != 0 {
            if let Some(n) = self.poll_direct(pass) {
                self.passes = self.passes.wrapping_add(1);
                if self.passes % 64 == 0 {
                    self.timers();
                }
                return n;
            }
        }
        if !timeout.is_zero() {
            // A blocking wait must be woken by every connection.
            self.rewatch();
        }
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
                n += self.read_conn(conn, pass);
            }
        }
        self.events = events;
        // Not in the epoll set: read (and write) them here as the direct
        // passes do (a copy: a read may drop a connection).
        let mut unwatched = [ConnId(0); DIRECT_POLL_MAX];
        let k = self.unwatched.len().min(DIRECT_POLL_MAX);
        unwatched[..k].copy_from_slice(&self.unwatched[..k]);
        for &id in &unwatched[..k] {
            n += self.read_conn(id, pass);
            if self.conns.get(&id.0).is_some_and(|c| !c.out.is_empty()) {
                self.flush_conn(id);
            }
        }
        // Timers are millisecond-scale: look at the clock (a vDSO call that
        // costs as much as a small message) only every 64 passes, or after a
        // blocking wait.
        self.passes = self.passes.wrapping_add(1);
        if self.passes % 64 == 0 || !timeout.is_zero() {
            self.timers();
        }
        n
    }

    /// Whether this non-blocking pass leaves the sockets alone: true on
    /// all but every [`QUIET_EVERY`]-th pass once [`QUIET_AFTER`] passes
    /// in a row saw no I/O and nothing of ours is in flight
    /// ([`Self::at_rest`]). A pass that reads or writes a byte, and every
    /// post, ends the quiet at once.
    ///
    /// Why: a busy-polled socket costs a system call per pass (`recv`, or
    /// `epoll_wait` with more than [`DIRECT_POLL_MAX`] connections), about
    /// 0.3 µs here, and a program that polls TCP and shared memory together
    /// (btl's own job across hosts, Open MPI with `self,rsm,rtcp`) pays it
    /// on every pass while only shared memory talks: between two ranks of
    /// a host whose job reaches another host, 8 B took 1.02 µs instead of
    /// 0.32 (`scripts/ompi-mixbench.sh`). Open MPI's own tcp BTL is polled
    /// through libevent, which `opal_progress` likewise calls less often
    /// while nobody waits on it. The cost: a message reaching a quiet
    /// transport waits up to `QUIET_EVERY - 1` cheap passes more; a
    /// ping-pong or a stream never gets quiet (a post or a byte every few
    /// passes), nor does a rank with a frame half read or half written.
    #[inline]
    fn quiet_skip(&mut self) -> bool {
        if self.io_moves != self.io_seen || !self.rma.nothing_waits() {
            self.io_seen = self.io_moves;
            self.quiet = 0;
            return false;
        }
        if self.quiet < QUIET_AFTER {
            self.quiet += 1;
            // Nothing may be in flight when the quiet starts; nothing new
            // starts without I/O (a read, or a post), which ends it.
            if self.quiet == QUIET_AFTER && !self.at_rest() {
                self.quiet = 0;
            }
            return false;
        }
        if self.passes % QUIET_EVERY == 0 {
            // This one looks (through epoll: `passes` is a multiple of
            // DIRECT_POLL_EVERY), and counts itself.
            return false;
        }
        self.passes = self.passes.wrapping_add(1);
        if self.passes % 64 == 0 {
            self.timers();
        }
        true
    }

    /// True when nothing of ours is in flight: no connection being set up
    /// or closed, no frame partly read (buffered bytes, a frame whose
    /// payload is still coming) or waiting to be written, no get/put or
    /// completion pending. Looks at every connection: called once per
    /// quiet period.
    #[cold]
    fn at_rest(&self) -> bool {
        self.rma.is_idle()
            && self.done.is_empty()
            && self.to_report.is_empty()
            && self.peers.iter().all(|p| p.queue.is_empty())
            && self.conns.values().all(|c| {
                !c.connecting
                    && c.incoming.is_none()
                    && !c.close_after_write
                    && c.out.is_empty()
                    && c.cur.is_none()
                    && c.dec.buffered() == 0
            })
    }

    /// Hands the pass's failures and completions to `sink`.
    fn report(&mut self, regions: &mut Regions, sink: &mut Sink<'_>) -> usize {
        let mut n = 0;
        if !self.to_report.is_empty() {
            for (peer, why) in std::mem::take(&mut self.to_report) {
                n += 1;
                sink(regions, TEvent::PeerFailed { peer, why: &why });
            }
        }
        if !self.done.is_empty() {
            for (op, result) in std::mem::take(&mut self.done) {
                n += 1;
                sink(regions, TEvent::Done { op, result });
            }
        }
        n
    }

    /// Forgets operation `op` (a blocking call gave up on it): queued
    /// frames reading its memory are dropped unwritten where that keeps
    /// the stream intact, answers to it are ignored, and no completion is
    /// reported. A frame already partly on the wire is finished from a copy.
    pub fn cancel(&mut self, op: OpId) {
        let mut removed: Vec<(Option<u32>, OutBuf)> = Vec::new();
        let mut grown: Vec<(u32, u64)> = Vec::new();
        for c in self.conns.values_mut() {
            let partial_first = c.out_off > 0;
            let old = std::mem::take(&mut c.out);
            for (i, mut b) in old.into_iter().enumerate() {
                if b.op() != Some(op) {
                    c.out.push_back(b);
                } else if i == 0 && partial_first {
                    let more = b.make_owned();
                    grown.extend(c.peer.map(|p| (p, more)));
                    c.out.push_back(b);
                } else {
                    removed.push((c.peer, b));
                }
            }
        }
        for (r, p) in self.peers.iter_mut().enumerate() {
            let old = std::mem::take(&mut p.queue);
            for b in old {
                if b.op() == Some(op) {
                    removed.push((Some(r as u32), b));
                } else {
                    p.queue.push_back(b);
                }
            }
        }
        for (peer, more) in grown {
            if let Some(p) = self.peers.get_mut(peer as usize) {
                p.queued_bytes += more;
            }
        }
        for (peer, b) in removed {
            // Not written: no completion, just the queue accounting.
            self.uncount_pub(peer, &b);
        }
        self.rma.cancel(op);
        self.done.retain(|(o, _)| *o != op);
    }

    /// Posts a put (`src` of ours to the peer) or a get (the peer's into
    /// `mem`), as frames of at most `max_frame` bytes, each answered.
    ///
    /// # Safety
    ///
    /// As [`Self::iput`] / [`Self::iget`].
    #[allow(unsafe_code)] // caller memory, under RawBuf's contract
    unsafe fn rma_post(
        &mut self,
        put: bool,
        peer: u32,
        id: u32,
        offset: u64,
        mem: RawBuf,
        op: OpId,
    ) -> Result<Posted, PostError> {
        if peer >= self.n || peer == self.me {
            return Err(PostError::InvalidPeer);
        }
        if self.peers[peer as usize].failed.is_some() {
            return Err(PostError::PeerFailed);
        }
        if mem.len() as u64 > MAX_MESSAGE {
            return Err(PostError::TooLarge { max: MAX_MESSAGE });
        }
        // The data is caller memory: only the frame count is bounded.
        let p = &self.peers[peer as usize];
        if !self.limits.admits(p.queued_bytes, p.queued_frames, 0) {
            return Err(PostError::WouldBlock);
        }
        let step = if put {
            (self.cfg.max_frame as usize - RMA_HEADER_LEN).max(1)
        } else {
            self.cfg.max_frame as usize
        };
        let frames = mem.len().div_ceil(step).max(1);
        self.rma.begin(op, frames as u32);
        let mut off = 0usize;
        for _ in 0..frames {
            let take = step.min(mem.len() - off);
            let part = mem.sub(off, take).unwrap_or_else(RawBuf::empty);
            let rma = RmaRepr {
                region: id,
                offset: offset + off as u64,
                len: take as u64,
            };
            let dst = if put { RawBuf::empty() } else { part };
            let req = self.rma.wait_for(peer, op, dst);
            let repr = FrameRepr {
                kind: if put { FrameType::Put } else { FrameType::Get },
                tag: 0,
                error: false,
                len: (RMA_HEADER_LEN + if put { take } else { 0 }) as u32,
                id: req,
            };
            let posted = if put {
                self.post_raw(peer, repr, &rma.to_bytes(), part, None)
            } else {
                self.post(peer, repr, &[&rma.to_bytes()], None)
            };
            if let Err(e) = posted {
                // Frames already posted are answered and ignored.
                self.cancel(op);
                return Err(e);
            }
            off += take;
        }
        Ok(Posted::Pending)
    }

    /// Writes `src` at `offset` of `peer`'s region `id`; completes with
    /// [`TEvent::Done`] for `op` once the target applied it (its refusal is
    /// the completion's status).
    ///
    /// # Safety
    ///
    /// `src` must stay valid and unchanged until the operation completes
    /// or is cancelled.
    #[allow(unsafe_code)] // caller memory, under RawBuf's contract
    pub unsafe fn iput(
        &mut self,
        peer: u32,
        id: u32,
        offset: u64,
        src: RawBuf,
        op: OpId,
    ) -> Result<Posted, PostError> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.rma_post(true, peer, id, offset, src, op) }
    }

    /// Reads `dst.len()` bytes at `offset` of `peer`'s region `id` into
    /// `dst`; completes with [`TEvent::Done`] for `op` (the target's refusal
    /// is the completion's status).
    ///
    /// # Safety
    ///
    /// `dst` must stay valid for writes, and unused otherwise, until the
    /// operation completes or is cancelled.
    #[allow(unsafe_code)] // caller memory, under RawBuf's contract
    pub unsafe fn iget(
        &mut self,
        peer: u32,
        id: u32,
        offset: u64,
        dst: RawBuf,
        op: OpId,
    ) -> Result<Posted, PostError> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.rma_post(false, peer, id, offset, dst, op) }
    }

    /// A PUT or GET from `peer`: checked and applied ([`rma::answer`]),
    /// then answered.
    fn serve_rma(&mut self, peer: u32, h: FrameRepr, payload: &[u8], regions: &mut Regions) {
        let Some(rma::Answer { reply, data, pin }) = rma::answer(peer, h, payload, regions) else {
            return;
        };
        // Answers are never refused for queue bounds: they are bounded by
        // the peer's own requests.
        let posted = match pin {
            // A large answer waits, if the socket does not take it at once,
            // as a reference into the region, pinned until it is written or
            // abandoned.
            Some(region) => {
                let src = RawBuf::new(data);
                regions.pin(region);
                self.post_pinned_answer(peer, reply, src, region)
                    .inspect_err(|_| regions.unpin(region))
            }
            None => self.post(peer, reply, &[data], None),
        };
        if let Err(e) = posted {
            log::warn!("tcp: cannot answer {peer}'s request: {e}");
        }
    }
}

impl Drop for Tcp {
    fn drop(&mut self) {
        // Clean close: FIN on every established connection, written before
        // the sockets go (bounded: 2 s).
        for peer in 0..self.n {
            if self.peers[peer as usize].ep.state() == EndpointState::Connected {
                let a = self.peers[peer as usize].ep.close();
                self.apply(peer, a);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut regions = Regions::new();
        while self.conns.values().any(|c| !c.out.is_empty()) && Instant::now() < deadline {
            self.progress_timeout(&mut regions, &mut |_, _| {}, Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod quiet_tests {
    use super::*;
    use crate::ops::{RawBuf, TEvent};
    use crate::regions::DeregisterError;
    use btl_core::params::{ParamSource, Params as _};
    use std::net::Ipv4Addr;

    fn pair() -> (Tcp, Tcp) {
        pair_with(TcpParams::default())
    }

    fn pair_with(params: TcpParams) -> (Tcp, Tcp) {
        let open = |rank: u32| {
            let id = Identity {
                job: "quiet".into(),
                rank,
                size: 2,
                node: format!("n{rank}"),
            };
            Tcp::listen(&id, params.clone(), &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
                .expect("listen on loopback")
        };
        let (mut a, mut b) = (open(0), open(1));
        let (ra, rb) = (a.published_addrs(), b.published_addrs());
        for t in [&mut a, &mut b] {
            t.set_peer_addrs(0, ra.as_bytes()).unwrap();
            t.set_peer_addrs(1, rb.as_bytes()).unwrap();
        }
        (a, b)
    }

    /// Non-blocking passes of `t` until it delivers a message (at most
    /// `max`): how many it took, and the message's bytes.
    fn passes_until_message(
        t: &mut Tcp,
        regions: &mut Regions,
        max: u32,
    ) -> Option<(u32, Vec<u8>)> {
        for i in 1..=max {
            let mut got = None;
            t.progress(regions, &mut |_, ev| {
                if let TEvent::Message { data, .. } = ev {
                    got = Some(data.to_vec());
                }
            });
            if let Some(d) = got {
                return Some((i, d));
            }
        }
        None
    }

    #[test]
    fn a_quiet_transport_still_delivers_within_quiet_every_passes() {
        let (mut a, mut b) = pair();
        let mut regions = Regions::new();
        // Connect and deliver a first message (both sides progress).
        a.isend(1, 3, &[b"first"]).unwrap();
        let mut first = None;
        for _ in 0..200_000 {
            a.progress(&mut regions, &mut |_, _| {});
            if let Some(m) = passes_until_message(&mut b, &mut regions, 1) {
                first = Some(m.1);
                break;
            }
        }
        assert_eq!(first.as_deref(), Some(&b"first"[..]));
        // The direct-poll list follows the connections (rebuilt when one
        // finished connecting or its handshake): each side reads its one
        // connection without epoll.
        for t in [&mut a, &mut b] {
            for _ in 0..2 {
                t.progress(&mut regions, &mut |_, _| {});
            }
            assert!(!t.direct_stale);
            let established: Vec<u32> = t.conns.keys().copied().collect();
            assert_eq!(
                t.direct.iter().map(|c| c.0).collect::<Vec<_>>(),
                established
            );
            // ... and out of the epoll set while it does.
            assert_eq!(
                t.unwatched.iter().map(|c| c.0).collect::<Vec<_>>(),
                established
            );
        }
        // Nothing moves: both become quiet (and stay correct).
        for _ in 0..(QUIET_AFTER * 4) {
            a.progress(&mut regions, &mut |_, _| {});
            b.progress(&mut regions, &mut |_, _| {});
        }
        assert!(b.quiet >= QUIET_AFTER, "b not quiet after idle passes");
        // A message reaching the quiet side: the kernel has it at once
        // (loopback), the quiet side looks within QUIET_EVERY passes.
        for round in 0..3u8 {
            a.isend(1, 4, &[b"later", &[round]]).unwrap();
            // The sender's pass: the rounds' sends are one burst to `a`,
            // whose later messages wait for its next pass (write
            // combining).
            a.progress(&mut regions, &mut |_, _| {});
            let got = passes_until_message(&mut b, &mut regions, QUIET_EVERY + 1);
            let (n, data) = got.expect("a quiet transport delivered nothing");
            assert!(n <= QUIET_EVERY + 1, "took {n} passes");
            assert_eq!(data, [&b"later"[..], &[round]].concat());
            // Quiet again before the next round (the read ended it).
            for _ in 0..(QUIET_AFTER * 2) {
                b.progress(&mut regions, &mut |_, _| {});
            }
        }
        // A blocking pass (with a timeout) never skips.
        a.isend(1, 5, &[b"blocking"]).unwrap();
        let got = blocking_pass(&mut b, &mut regions, Duration::from_secs(5));
        assert_eq!(got.as_deref(), Some(&b"blocking"[..]));
    }

    /// One blocking pass of `t` (at most `timeout`): the last message it
    /// delivered.
    fn blocking_pass(t: &mut Tcp, regions: &mut Regions, timeout: Duration) -> Option<Vec<u8>> {
        let mut got = None;
        t.progress_timeout(
            regions,
            &mut |_, ev| {
                if let TEvent::Message { data, .. } = ev {
                    got = Some(data.to_vec());
                }
            },
            timeout,
        );
        got
    }

    /// A connection the direct passes read leaves the epoll set; a
    /// blocking pass puts it back first and is woken by it (within the
    /// pass, not at its timeout), and the direct passes take it out again.
    /// Output waiting for room on an unwatched connection is written by
    /// the passes.
    #[test]
    fn an_unwatched_connection_still_wakes_a_blocking_wait() {
        let mut regions = Regions::new();
        let (mut a, mut b) = connected(TcpParams::default(), &mut regions);
        drain(&mut b, &mut regions, 2);
        let id = *b.conns.keys().next().expect("b's connection");
        assert_eq!(b.unwatched, [ConnId(id)]);
        for round in 0..3u8 {
            // Sent while b is out of any pass: only a blocking wait can
            // see it, and it must see it at once.
            a.isend(1, 4, &[b"wake", &[round]]).unwrap();
            // (a's pass pushes what write combining corked.)
            a.progress(&mut regions, &mut |_, _| {});
            let t0 = std::time::Instant::now();
            let got = blocking_pass(&mut b, &mut regions, Duration::from_secs(10));
            assert_eq!(got, Some([&b"wake"[..], &[round]].concat()));
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "woken by the timeout"
            );
            assert!(
                b.unwatched.is_empty(),
                "a blocking pass watches every connection"
            );
            drain(&mut b, &mut regions, 2);
            assert_eq!(b.unwatched, [ConnId(id)], "direct passes unwatch it again");
        }
        // A blocking pass with nothing to read waits its timeout (the
        // connection is watched, not reported falsely ready).
        let t0 = std::time::Instant::now();
        let n = b.progress_timeout(&mut regions, &mut |_, _| {}, Duration::from_millis(50));
        assert_eq!(n, 0);
        assert!(t0.elapsed() >= Duration::from_millis(40));
        // Output on the unwatched side: a burst larger than the socket
        // takes at once is written by b's passes while a reads.
        drain(&mut b, &mut regions, 2);
        assert_eq!(b.unwatched, [ConnId(id)]);
        let big = vec![7u8; 8 << 20];
        b.isend(0, 5, &[&big]).unwrap();
        let mut got = Vec::new();
        for _ in 0..200_000 {
            b.progress(&mut regions, &mut |_, _| {});
            a.progress(&mut regions, &mut |_, ev| {
                if let TEvent::Message { data, .. } = ev {
                    got.push(data.len());
                }
            });
            if !got.is_empty() {
                break;
            }
        }
        assert_eq!(got, vec![big.len()]);
    }

    /// `a` connected to `b`, a first message delivered.
    fn connected(params: TcpParams, regions: &mut Regions) -> (Tcp, Tcp) {
        let (mut a, mut b) = pair_with(params);
        a.isend(1, 3, &[b"first"]).unwrap();
        for _ in 0..200_000 {
            a.progress(regions, &mut |_, _| {});
            if passes_until_message(&mut b, regions, 1).is_some() {
                return (a, b);
            }
        }
        panic!("no connection");
    }

    /// Messages `b` delivers in `passes` non-blocking passes (the payloads).
    fn drain(b: &mut Tcp, regions: &mut Regions, passes: u32) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        for _ in 0..passes {
            b.progress(regions, &mut |_, ev| {
                if let TEvent::Message { data, .. } = ev {
                    got.push(data.to_vec());
                }
            });
        }
        got
    }

    /// What `b` delivers until it has `want` messages (or gives up after
    /// many passes; the caller checks the count).
    fn receive(b: &mut Tcp, regions: &mut Regions, want: usize) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        for _ in 0..200_000 {
            got.extend(drain(b, regions, 1));
            if got.len() >= want {
                break;
            }
        }
        got
    }

    /// Segments `t` sent on its one connection so far (`TCP_INFO`).
    #[allow(unsafe_code)] // getsockopt into a plain C struct
    fn segments_out(t: &Tcp) -> u32 {
        use std::os::fd::AsRawFd;
        let c = t.conns.values().next().expect("a connection");
        // SAFETY: `tcp_info` is plain integers: all zeros is a valid value.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: a live socket; `info` is writable for `len` bytes and the
        // kernel writes at most that many.
        let rc = unsafe {
            libc::getsockopt(
                c.sock.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "TCP_INFO: {}", io::Error::last_os_error());
        info.tcpi_segs_out
    }

    #[test]
    fn a_burst_is_combined_and_leaves_without_another_pass() {
        let mut regions = Regions::new();
        let (mut a, mut b) = connected(TcpParams::default(), &mut regions);
        // A fresh pass; then a burst of 1 KiB messages (16 KiB in all):
        // the first leaves at once, the others are corked in the kernel,
        // nothing waits in user space.
        a.progress(&mut regions, &mut |_, _| {});
        let msg = |i: u8| vec![i; 1024];
        let segs = segments_out(&a);
        for i in 0..16u8 {
            a.isend(1, 4, &[&msg(i)]).unwrap();
        }
        assert_eq!(waiting(&a), 0, "nothing of the burst waits in user space");
        // The sender's next pass pushes the corked frames, in order.
        a.progress(&mut regions, &mut |_, _| {});
        let got = receive(&mut b, &mut regions, 16);
        assert_eq!(got, (0..16u8).map(msg).collect::<Vec<_>>());
        // Combined: fewer segments than messages (an ACK arriving during
        // the burst pushes what is corked by then, so not always two).
        let sent = segments_out(&a) - segs;
        assert!(sent <= 8, "16 messages took {sent} segments");
        // A burst whose sender never progresses again still arrives (MPI's
        // progress rule): the kernel sends the corked tail by itself.
        a.progress(&mut regions, &mut |_, _| {});
        for i in 0..16u8 {
            a.isend(1, 4, &[&msg(i)]).unwrap();
        }
        let start = Instant::now();
        let mut got = Vec::new();
        while got.len() < 16 && start.elapsed() < Duration::from_secs(5) {
            got.extend(drain(&mut b, &mut regions, 1));
        }
        assert_eq!(got, (0..16u8).map(msg).collect::<Vec<_>>());
        // More than write_combine bytes in one burst: nothing waits either.
        a.progress(&mut regions, &mut |_, _| {});
        for i in 0..100u8 {
            a.isend(1, 4, &[&msg(i)]).unwrap();
        }
        let left = waiting(&a);
        let got = receive(&mut b, &mut regions, 100 - left);
        assert_eq!(got, (0..got.len() as u8).map(msg).collect::<Vec<_>>());
    }

    /// Writes to a peer that closed its end fail it without raising
    /// `SIGPIPE` (whose default action kills a C program linking libbtl;
    /// this test process, being Rust, ignores it, so a handler counts it).
    /// The peer's FIN is in, unread; the first write draws its RST, a
    /// later one meets `EPIPE`.
    #[test]
    #[allow(unsafe_code)] // installing and restoring a signal handler
    fn a_closed_peer_fails_without_sigpipe() {
        use btl_core::sync::{AtomicUsize, Ordering};
        static PIPES: AtomicUsize = AtomicUsize::new(0);
        extern "C" fn on_pipe(_: libc::c_int) {
            PIPES.fetch_add(1, Ordering::SeqCst);
        }
        let mut regions = Regions::new();
        let (mut a, b) = connected(TcpParams::default(), &mut regions);
        a.progress(&mut regions, &mut |_, _| {});
        drop(b);
        std::thread::sleep(Duration::from_millis(20));
        let handler: extern "C" fn(libc::c_int) = on_pipe;
        // SAFETY: the handler only increments an atomic (async-signal
        // safe); the previous disposition is restored below.
        let old = unsafe { libc::signal(libc::SIGPIPE, handler as libc::sighandler_t) };
        let mut failed = false;
        for _ in 0..2000 {
            let sent = (0..2).all(|_| a.isend(1, 4, &[&[7u8; 1024]]).is_ok());
            if !sent {
                failed = true;
                break;
            }
            a.progress(&mut regions, &mut |_, _| {});
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: puts back what was there before this test.
        unsafe { libc::signal(libc::SIGPIPE, old) };
        assert!(failed, "sends to a closed peer kept succeeding");
        assert_eq!(PIPES.load(Ordering::SeqCst), 0, "a write raised SIGPIPE");
    }

    #[test]
    fn write_combine_zero_writes_every_post_at_once() {
        let mut regions = Regions::new();
        let mut params = TcpParams::default();
        params.set("write_combine", "0", ParamSource::Code).unwrap();
        let (mut a, mut b) = connected(params, &mut regions);
        a.progress(&mut regions, &mut |_, _| {});
        for i in 0..16u8 {
            a.isend(1, 4, &[&[i; 1024]]).unwrap();
        }
        assert_eq!(waiting(&a), 0);
        let got = receive(&mut b, &mut regions, 16);
        assert_eq!(got, (0..16u8).map(|i| vec![i; 1024]).collect::<Vec<_>>());
    }

    /// Progresses `t` once; true if it reported the completion of `op`
    /// (asserting it succeeded).
    fn done_once(t: &mut Tcp, regions: &mut Regions, op: OpId) -> bool {
        let mut done = false;
        t.progress(regions, &mut |_, ev| {
            if let TEvent::Done { op: o, result } = ev {
                assert_eq!(o, op);
                assert!(result.is_ok(), "{result:?}");
                done = true;
            }
        });
        done
    }

    /// Frames waiting in `t`'s connections.
    fn waiting(t: &Tcp) -> usize {
        t.conns.values().map(|c| c.out.len()).sum()
    }

    /// A get that stalls: `a` and `b` connected, `b`'s region of
    /// `dst.len()` patterned bytes (handed back with its id) gotten whole
    /// by `a` into `dst` as `op`, and `b` progressed until some of its
    /// answers wait (`a` does not read: more than the loopback socket
    /// buffers hold). The regions come first: bound in this order, the
    /// transports (whose drop may still write answers from `b`'s region)
    /// are dropped before them.
    #[allow(unsafe_code)] // iget's contract (SAFETY below)
    fn stalled_get(dst: &mut [u8], op: OpId) -> (Regions, Regions, Tcp, Tcp, u32, Vec<u8>) {
        let (mut ra, mut rb) = (Regions::new(), Regions::new());
        let (mut a, mut b) = pair();
        // Connected first, so the get's frames leave at once.
        a.isend(1, 3, &[b"hello"]).unwrap();
        for _ in 0..200_000 {
            a.progress(&mut ra, &mut |_, _| {});
            if passes_until_message(&mut b, &mut rb, 1).is_some() {
                break;
            }
        }
        let src: Vec<u8> = (0..dst.len()).map(|i| (i % 251) as u8).collect();
        let id = rb.insert_owned(src.clone().into_boxed_slice());
        // SAFETY: the callers declare `dst` before `a`, which (with its
        // get) is dropped first.
        unsafe { a.iget(1, id, 0, RawBuf::new_mut(dst), op) }.unwrap();
        for _ in 0..20_000 {
            b.progress(&mut rb, &mut |_, _| {});
            if waiting(&b) > 0 {
                break;
            }
        }
        assert!(waiting(&b) > 0, "b wrote every answer: no wait to check");
        (ra, rb, a, b, id, src)
    }

    #[test]
    fn large_get_answers_are_written_from_the_pinned_region() {
        let mut dst = vec![0u8; 16 << 20];
        let op: OpId = 7;
        let (mut ra, mut rb, mut a, mut b, id, src) = stalled_get(&mut dst, op);
        // Answers wait as references into the region: it cannot go, and
        // b holds no copy of them.
        assert!(matches!(rb.remove(id), Err(DeregisterError::Busy { .. })));
        let held: u64 = b.peers.iter().map(|p| p.queued_bytes).sum();
        assert!(
            held < 64 * 1024,
            "answers were copied: {held} bytes held in b's queues"
        );
        // Both progress: the get completes with the region's bytes, and the
        // region is free again once the last answer is written.
        let mut complete = false;
        for _ in 0..2_000_000 {
            b.progress(&mut rb, &mut |_, _| {});
            if done_once(&mut a, &mut ra, op) {
                complete = true;
                break;
            }
        }
        assert!(complete, "the get did not complete");
        drop(a);
        assert!(dst == src, "the get's bytes differ from the region's");
        b.progress(&mut rb, &mut |_, _| {});
        assert_eq!(waiting(&b), 0);
        assert!(rb.remove(id).is_ok(), "the region stayed pinned");
    }

    #[test]
    fn a_dropped_connection_unpins_its_answers() {
        let mut dst = vec![0u8; 16 << 20];
        let (_ra, mut rb, a, mut b, id, _) = stalled_get(&mut dst, 9);
        assert!(matches!(rb.remove(id), Err(DeregisterError::Busy { .. })));
        // The requester goes away: b's connection breaks, its queued
        // answers are abandoned and the region unpinned.
        drop(a);
        let mut freed = false;
        for _ in 0..200_000 {
            b.progress(&mut rb, &mut |_, _| {});
            if waiting(&b) == 0 && rb.remove(id).is_ok() {
                freed = true;
                break;
            }
        }
        assert!(freed, "the region stayed pinned after the connection broke");
    }
}
