//! The shared-memory transport on Linux: segment rendezvous, the core's
//! progress engine, active messages of any size, and liveness.
//!
//! # Start-up (the seed's `create_rndv_file` / `create_and_attach`)
//!
//! 1. Local rank 0 removes stale segment files of dead jobs, computes the
//!    layout from the verified parameters, creates the backing file
//!    `btl-<uid>-<job>-<node>` (mode 0600, pages reserved, free space
//!    checked) in `/dev/shm` (or the session directory), and publishes the
//!    control header.
//! 2. Every other rank opens the file (waiting, with a timeout), and takes
//!    the layout parameters from the header, so all ranks agree.
//! 3. Every rank initialises its own part (rings, fragments), records its
//!    pid and start time, and marks itself ready.
//! 4. Every rank waits until all are ready — failing fast, naming the rank,
//!    if one dies meanwhile, or naming the missing ranks on timeout — then
//!    attaches writers to its peers' rings.
//! 5. The last rank to attach unlinks the file: from then on nothing is left
//!    in `/dev/shm` even if every rank is killed with SIGKILL.
//!
//! # Messages
//!
//! User tags are `0..=`[`MAX_USER_TAG`]. A message up to the fragment limit
//! goes in one fragment (an eager one up to `eager_limit`). Larger ones take
//! one of two protocols, on internal tags:
//!
//! - **single copy** (`use_cma=1` and the kernel allows it for that peer,
//!   messages of at least `min_rdma_pipeline_size` bytes): one fragment
//!   carries the message's address and length; the receiver reads it from the
//!   sender's memory with `process_vm_readv` and acknowledges; `send` returns
//!   once the receiver has the data;
//! - **pipelined copy** (otherwise): the message is cut into max-size
//!   fragments, each copied in by the sender and out by the receiver into the
//!   reassembly buffer; `send` returns once the last chunk is in a fragment.
//!
//! If the kernel refuses single copy (EPERM: ptrace restrictions,
//! containers), the start-up probe says so once and that peer uses the
//! pipelined copy; a refusal later (the receiver's read fails) makes the
//! sender resend the message pipelined.
//!
//! # Liveness
//!
//! Every blocking wait polls, then yields, then sleeps briefly when idle (so
//! an oversubscribed job keeps moving), and checks every
//! [`LIVENESS_INTERVAL`] that the peers it waits for are alive (pid and start
//! time from the control area). A dead peer is declared failed: its
//! in-flight fragments complete with an error, sends to it fail with
//! [`SmError::PeerFailed`], and nothing waits on it again.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::rc::Rc;
use std::time::{Duration, Instant};

use btl_core::params::{ParamError, Params as _};
use btl_core::shm::Region;
use btl_core::sm::control::{Control, ControlError, RANK_DONE, RANK_READY};
use btl_core::sm::engine::{
    self, Dispatch, FragDesc, PeerError, PeerSlot, PeerState, SendError, SetupError, SmEngine,
};
use btl_core::sm::fifo::Consumer;
use btl_core::sm::frag::FragView;
use btl_core::sm::layout::{
    calc_sm_max_procs, segment_layout, SegmentLayout, SizeError, PART_ALIGN,
};
use btl_core::sm::params::SmParams;
use btl_core::sync::{AtomicU64, Ordering};

use crate::cma;
use crate::job::JobEnv;
use crate::segment::{self, Segment, SegmentError};

mod rma;
use rma::{Outgoing, RangeReq};
pub use rma::{RegionKey, RmaStatus};

/// Largest tag available to users; the tags above are the transport's own.
pub const MAX_USER_TAG: u8 = 239;
const TAG_RNDV: u8 = 255;
const TAG_CHUNK: u8 = 254;
const TAG_BARRIER: u8 = 253;

/// How often a blocking wait checks that its peers are alive.
pub const LIVENESS_INTERVAL: Duration = Duration::from_millis(100);
/// Default for how long start-up waits for the other local ranks
/// (`BTL_ATTACH_TIMEOUT`, seconds).
pub const DEFAULT_ATTACH_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest message (1 GiB) the receiving side accepts (a hostile or buggy
/// peer announcing more is refused instead of exhausting memory).
pub const MAX_MESSAGE: u64 = 1 << 30;

type Engine = SmEngine<
    'static,
    Vec<PeerSlot<'static>>,
    Vec<Option<Consumer<'static>>>,
    Vec<FragDesc>,
    Vec<u64>,
>;
type Handler = Box<dyn FnMut(u32, &[u8])>;
type OnDone = Box<dyn FnOnce(Result<(), SmError>)>;

/// Errors of the shared-memory transport.
#[derive(Debug)]
pub enum SmError {
    /// A parameter is malformed or inconsistent.
    Param(ParamError),
    /// The segment layout does not fit (too many ranks, sizes overflow).
    Size(SizeError),
    /// Creating, opening or unlinking the backing file failed.
    Segment(SegmentError),
    /// The segment's control area is missing or corrupted.
    Control(ControlError),
    /// The core engine could not attach to the segment.
    Setup(SetupError),
    /// Start-up waited too long for these local ranks.
    AttachTimeout {
        /// How long it waited.
        waited: Duration,
        /// Local ranks that never became ready.
        missing: Vec<u32>,
    },
    /// A local rank died during start-up.
    PeerDiedAtStart {
        /// Its local rank.
        rank: u32,
        /// Its pid.
        pid: u64,
    },
    /// The job environment does not allow a shared-memory transport.
    Unsupported(&'static str),
    /// The peer has failed (died, or corrupted its ring).
    PeerFailed {
        /// Its local rank.
        peer: u32,
    },
    /// No such local peer (or it is this rank).
    InvalidPeer {
        /// The rank given.
        peer: u32,
    },
    /// The tag is reserved for the transport.
    ReservedTag {
        /// The tag given.
        tag: u8,
    },
    /// The peer reported an error handling the message (no handler for the
    /// tag, or its copy failed).
    RemoteError {
        /// The peer.
        peer: u32,
    },
    /// A get or put was refused or failed at the target.
    Rma {
        /// The target.
        peer: u32,
        /// Why.
        status: RmaStatus,
    },
    /// A blocking operation did not complete in time.
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        waited: Duration,
    },
}

impl fmt::Display for SmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Param(e) => write!(f, "sm parameters: {e}"),
            Self::Size(e) => write!(f, "sm segment size: {e}"),
            Self::Segment(e) => write!(f, "sm segment: {e}"),
            Self::Control(e) => write!(f, "sm segment: {e}"),
            Self::Setup(e) => write!(f, "sm attach: {e}"),
            Self::AttachTimeout { waited, missing } => write!(
                f,
                "sm start-up: local ranks {missing:?} did not attach within {:.1} s \
                 (BTL_ATTACH_TIMEOUT)",
                waited.as_secs_f64()
            ),
            Self::PeerDiedAtStart { rank, pid } => {
                write!(f, "sm start-up: local rank {rank} (pid {pid}) died")
            }
            Self::Unsupported(why) => write!(f, "sm unavailable: {why}"),
            Self::PeerFailed { peer } => write!(f, "local peer {peer} has failed"),
            Self::InvalidPeer { peer } => write!(f, "no local peer {peer}"),
            Self::ReservedTag { tag } => {
                write!(
                    f,
                    "tag {tag} is reserved (user tags are 0..={MAX_USER_TAG})"
                )
            }
            Self::RemoteError { peer } => {
                write!(f, "local peer {peer} could not handle the message")
            }
            Self::Rma { peer, status } => write!(f, "get/put at local rank {peer}: {status}"),
            Self::Timeout { what, waited } => {
                write!(
                    f,
                    "timed out after {:.1} s waiting for {what}",
                    waited.as_secs_f64()
                )
            }
        }
    }
}

impl std::error::Error for SmError {}

macro_rules! from_err {
    ($($v:ident($t:ty)),*) => {$(
        impl From<$t> for SmError {
            fn from(e: $t) -> Self {
                Self::$v(e)
            }
        }
    )*};
}
from_err!(
    Param(ParamError),
    Size(SizeError),
    Segment(SegmentError),
    Control(ControlError),
    Setup(SetupError)
);

/// Header of a single-copy rendezvous fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rndv {
    tag: u8,
    addr: u64,
    len: u64,
}

impl Rndv {
    const LEN: usize = 17;
    fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0; Self::LEN];
        b[0] = self.tag;
        b[1..9].copy_from_slice(&self.addr.to_le_bytes());
        b[9..17].copy_from_slice(&self.len.to_le_bytes());
        b
    }
    fn decode(b: &[u8]) -> Option<Self> {
        let b: &[u8; Self::LEN] = b.try_into().ok()?;
        Some(Self {
            tag: b[0],
            addr: u64::from_le_bytes(b[1..9].try_into().ok()?),
            len: u64::from_le_bytes(b[9..17].try_into().ok()?),
        })
    }
}

/// Header of a pipelined chunk: the message's total length, the user tag,
/// and this chunk's offset. Chunks of one message arrive in order (per-peer
/// order), so the offset is a check, not a reordering key. Padded to 32
/// bytes so that, after the 32-byte fragment header, the data starts on a
/// cache line of the (cache-line aligned) fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chunk {
    tag: u8,
    total: u64,
    offset: u64,
}

impl Chunk {
    const LEN: usize = 32;
    fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0; Self::LEN];
        b[0] = self.tag;
        b[1..9].copy_from_slice(&self.total.to_le_bytes());
        b[9..17].copy_from_slice(&self.offset.to_le_bytes());
        b
    }
    fn decode(b: &[u8]) -> Option<Self> {
        let h = b.get(..Self::LEN)?;
        Some(Self {
            tag: h[0],
            total: u64::from_le_bytes(h[1..9].try_into().ok()?),
            offset: u64::from_le_bytes(h[9..17].try_into().ok()?),
        })
    }
}

/// How a large message travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bulk {
    /// `process_vm_readv` by the receiver.
    SingleCopy,
    /// Through shared fragments.
    Pipelined,
    /// Through shared fragments, timed alone to refresh its measurement.
    ProbePipelined,
}

/// How long a bulk-rate measurement stays fresh.
const BULK_REFRESH: Duration = Duration::from_secs(1);

/// Measured bulk rates to one peer (bytes per second, smoothed), for the
/// choice between single copy and the pipelined copy. Which is faster
/// depends on where the two processes run (shared cache or not) and that
/// changes under a hypervisor or a migrating scheduler: so it is measured
/// while running. Single-copy transfers are synchronous and timed as they
/// go; the pipelined copy is timed by draining before and after one message
/// once per [`BULK_REFRESH`]. The slower mechanism is retried once per
/// refresh period, so a change of placement is followed within about a
/// second.
#[derive(Clone, Copy, Debug, Default)]
struct BulkRates {
    single: f64,
    pipelined: f64,
    single_at: Option<Instant>,
    pipelined_at: Option<Instant>,
    /// Samples taken of each; the first of each is a warm-up (page faults
    /// of fresh buffers) and is not counted.
    single_n: u32,
    pipelined_n: u32,
}

impl BulkRates {
    fn choose(&self, now: Instant) -> Bulk {
        let stale = |t: Option<Instant>| t.is_none_or(|t| now.duration_since(t) > BULK_REFRESH);
        if self.single_n < 2 {
            Bulk::SingleCopy
        } else if self.pipelined_n < 2 {
            Bulk::ProbePipelined
        } else if stale(self.single_at) {
            Bulk::SingleCopy
        } else if stale(self.pipelined_at) {
            Bulk::ProbePipelined
        } else if self.pipelined > self.single {
            Bulk::Pipelined
        } else {
            Bulk::SingleCopy
        }
    }

    fn record(&mut self, how: Bulk, bytes: usize, took: Duration) {
        let rate = bytes as f64 / took.as_secs_f64().max(1e-9);
        let (avg, at, n) = match how {
            Bulk::SingleCopy => (&mut self.single, &mut self.single_at, &mut self.single_n),
            Bulk::Pipelined | Bulk::ProbePipelined => (
                &mut self.pipelined,
                &mut self.pipelined_at,
                &mut self.pipelined_n,
            ),
        };
        *n = n.saturating_add(1);
        *avg = match *n {
            1 => 0.0,
            2 => rate,
            _ => 0.5 * *avg + 0.5 * rate,
        };
        *at = Some(Instant::now());
        log::debug!(
            "bulk rates: single copy {:.2} GB/s, pipelined {:.2} GB/s (after {how:?} of {bytes} bytes in {took:?})",
            self.single / 1e9,
            self.pipelined / 1e9
        );
    }
}

/// Problems caused by peers' data logged one by one; after these, only
/// every power of two is (a process corrupting the segment must not flood
/// the log or slow the victim down with it).
const PEER_LOG_FIRST: u64 = 16;

/// Logs a problem caused by a peer's data (see [`PEER_LOG_FIRST`]), counting
/// it in `State::peer_reports`.
macro_rules! peer_log {
    ($state:expr, $lvl:ident, $($arg:tt)+) => {{
        $state.peer_reports += 1;
        let n = $state.peer_reports;
        if n <= PEER_LOG_FIRST || n.is_power_of_two() {
            log::$lvl!($($arg)+);
            if n == PEER_LOG_FIRST {
                log::warn!("further problems with peers' data are logged at powers of two only");
            }
        }
    }};
}

/// Completion state shared between a send and the progress engine.
type Done = Rc<RefCell<Option<bool>>>;

/// What a fragment's cookie refers to.
enum Waiter {
    /// A blocking send waiting for this ACK.
    Flag(Done),
    /// A user callback.
    Callback(OnDone),
}

/// Everything the engine's callbacks touch (split from the engine so both
/// can be borrowed at once).
struct State {
    handlers: Vec<Option<Handler>>,
    waiters: HashMap<u64, (u32, Waiter)>,
    next_cookie: u64,
    /// Reassembly of pipelined messages, per sender: (tag, total length,
    /// bytes so far) of the message in progress.
    partial: Vec<Option<(u8, u64, u64)>>,
    /// Receive buffer per sender, reused from message to message (it only
    /// grows), so large messages do not pay allocation and page faults each
    /// time.
    bufs: Vec<Vec<u8>>,
    scratch: Vec<u8>,
    pids: Vec<u64>,
    cma_ok: Vec<bool>,
    /// Barrier arrivals per epoch.
    barrier_arrivals: HashMap<u64, u32>,
    /// Peers declared failed (their fragments' errors are not reported one
    /// by one).
    peer_failed: Vec<bool>,
    /// Peer errors reported, for diagnostics (counted, logged).
    peer_errors: u64,
    /// Problems with peers' data seen (for the log's rate limit).
    peer_reports: u64,
    /// Registered regions, get/put requests in both directions.
    rma: rma::Rma,
}

impl State {
    fn deliver(&mut self, peer: u32, tag: u8, data: &[u8]) -> bool {
        match self
            .handlers
            .get_mut(usize::from(tag))
            .and_then(Option::as_mut)
        {
            Some(h) => {
                h(peer, data);
                true
            }
            None => {
                peer_log!(
                    self,
                    warn,
                    "message from local rank {peer} with tag {tag}, which has no handler"
                );
                false
            }
        }
    }

    fn recv_rndv(&mut self, peer: u32, frag: &FragView<'_>) -> bool {
        let mut hdr = [0u8; Rndv::LEN];
        if frag.info.len as usize != Rndv::LEN || frag.copy_payload(&mut hdr).is_err() {
            peer_log!(
                self,
                error,
                "malformed single-copy header from local rank {peer}"
            );
            return false;
        }
        let Some(r) = Rndv::decode(&hdr) else {
            return false;
        };
        if r.tag > MAX_USER_TAG || r.len > MAX_MESSAGE {
            peer_log!(
                self,
                error,
                "single-copy request from local rank {peer} with tag {} and length {}",
                r.tag,
                r.len
            );
            return false;
        }
        let mut buf = std::mem::take(&mut self.bufs[peer as usize]);
        let len = r.len as usize;
        if buf.len() < len {
            buf.resize(len, 0);
        }
        let pid = self.pids[peer as usize] as u32;
        let res = cma::read_remote(pid, r.addr as usize, &mut buf[..len]);
        let ok = res.is_ok() && self.deliver(peer, r.tag, &buf[..len]);
        self.bufs[peer as usize] = buf;
        match res {
            Ok(()) => ok,
            Err(e) => {
                if self.cma_ok[peer as usize] {
                    log::warn!(
                        "single copy from local rank {peer} failed ({e}); using the pipelined copy through shared fragments"
                    );
                }
                self.cma_ok[peer as usize] = false;
                false
            }
        }
    }

    fn recv_chunk(&mut self, peer: u32, frag: &FragView<'_>) -> bool {
        let mut hdr = [0u8; Chunk::LEN];
        let len = frag.info.len as usize;
        if len < Chunk::LEN || frag.payload.read_bytes(0, &mut hdr).is_err() {
            peer_log!(self, error, "malformed chunk header from local rank {peer}");
            return false;
        }
        let Some(c) = Chunk::decode(&hdr) else {
            return false;
        };
        let p = peer as usize;
        let data_len = (len - Chunk::LEN) as u64;
        if c.offset == 0 {
            if self.partial[p].is_some() {
                peer_log!(
                    self,
                    error,
                    "local rank {peer} started a new message before finishing the last"
                );
            }
            if c.tag > MAX_USER_TAG || c.total > MAX_MESSAGE {
                peer_log!(
                    self,
                    error,
                    "chunked message from local rank {peer}: tag {} length {}",
                    c.tag,
                    c.total
                );
                self.partial[p] = None;
                return false;
            }
            self.partial[p] = Some((c.tag, c.total, 0));
        }
        let Some((tag, total, got)) = self.partial[p] else {
            peer_log!(
                self,
                error,
                "chunk at offset {} from local rank {peer} without a start",
                c.offset
            );
            return false;
        };
        let end = got + data_len;
        if tag != c.tag || total != c.total || got != c.offset || end > total {
            peer_log!(self, error, "out-of-order chunk from local rank {peer}");
            self.partial[p] = None;
            return false;
        }
        // The buffer grows as data arrives (amortised doubling, kept for
        // the next message): a chunk header alone, which any peer can
        // write, cannot make us allocate and zero `MAX_MESSAGE` bytes.
        if (self.bufs[p].len() as u64) < end {
            self.bufs[p].resize(end as usize, 0);
        }
        let dst = &mut self.bufs[p][got as usize..end as usize];
        if frag.payload.read_bytes(Chunk::LEN as u64, dst).is_err() {
            self.partial[p] = None;
            return false;
        }
        if end < total {
            self.partial[p] = Some((tag, total, end));
            return true;
        }
        self.partial[p] = None;
        let buf = std::mem::take(&mut self.bufs[p]);
        let ok = self.deliver(peer, tag, &buf[..total as usize]);
        self.bufs[p] = buf;
        ok
    }
}

impl State {
    /// A put by single copy: validate, then read the requester's memory
    /// straight into the region.
    fn recv_put_cma(&mut self, peer: u32, frag: &FragView<'_>) -> bool {
        let mut b = [0u8; RangeReq::LEN];
        if frag.info.len as usize != RangeReq::LEN || frag.copy_payload(&mut b).is_err() {
            return false;
        }
        let Some(put) = RangeReq::decode(&b) else {
            return false;
        };
        let pid = self.pids[peer as usize] as u32;
        let status = match self.rma.range_mut(put.id, put.offset, put.len) {
            Ok(dst) => match cma::read_remote(pid, put.addr as usize, dst) {
                Ok(()) => RmaStatus::Ok,
                Err(e) => {
                    log::warn!("single-copy put from local rank {peer} failed: {e}");
                    RmaStatus::CopyFailed
                }
            },
            Err(status) => {
                log::warn!("local rank {peer} put into region {}: {status}", put.id);
                status
            }
        };
        self.rma.outbox.push_back(Outgoing::Reply {
            peer,
            req: put.req,
            status,
        });
        true
    }
}

impl Dispatch for State {
    fn recv(&mut self, peer: u32, tag: u8, frag: &FragView<'_>) -> bool {
        match tag {
            TAG_RNDV => self.recv_rndv(peer, frag),
            TAG_CHUNK => self.recv_chunk(peer, frag),
            rma::TAG_GET_REQ => {
                let mut b = [0u8; RangeReq::LEN];
                frag.info.len as usize == RangeReq::LEN
                    && frag.copy_payload(&mut b).is_ok()
                    && self.rma.on_get_req(peer, &b)
            }
            rma::TAG_PUT_DATA => {
                let mut h = [0u8; rma::PutChunk::LEN];
                let len = u64::from(frag.info.len);
                if len < h.len() as u64 || frag.payload.read_bytes(0, &mut h).is_err() {
                    return false;
                }
                let data_len = len - h.len() as u64;
                self.rma.on_put_data(peer, &h, data_len, |dst| {
                    frag.payload
                        .read_bytes(rma::PutChunk::LEN as u64, dst)
                        .is_ok()
                })
            }
            rma::TAG_PUT_CMA => self.recv_put_cma(peer, frag),
            rma::TAG_RMA_REPLY => {
                let mut b = [0u8; 12];
                frag.info.len == 12
                    && frag.copy_payload(&mut b).is_ok()
                    && self.rma.on_reply(peer, &b)
            }
            rma::TAG_GET_DATA => {
                let mut h = [0u8; 16];
                let len = u64::from(frag.info.len);
                if len < 16 || frag.payload.read_bytes(0, &mut h).is_err() {
                    return false;
                }
                self.rma.on_get_data(peer, &h, len - 16, |dst| {
                    frag.payload.read_bytes(16, dst).is_ok()
                })
            }
            TAG_BARRIER => {
                let mut b = [0u8; 8];
                if frag.info.len != 8 || frag.copy_payload(&mut b).is_err() {
                    return false;
                }
                let epoch = u64::from_le_bytes(b);
                *self.barrier_arrivals.entry(epoch).or_insert(0) += 1;
                true
            }
            t if t <= MAX_USER_TAG => {
                let len = frag.info.len as usize;
                let mut scratch = std::mem::take(&mut self.scratch);
                let ok = frag.copy_payload(&mut scratch[..len]).is_ok()
                    && self.deliver(peer, t, &scratch[..len]);
                self.scratch = scratch;
                ok
            }
            t => {
                peer_log!(self, error, "local rank {peer} used reserved tag {t}");
                false
            }
        }
    }

    fn complete(&mut self, peer: u32, cookie: u64, ok: bool) {
        if cookie == 0 {
            // Fragments failed along with their peer were reported once,
            // with the peer.
            if !ok
                && !self
                    .peer_failed
                    .get(peer as usize)
                    .copied()
                    .unwrap_or(false)
            {
                peer_log!(
                    self,
                    warn,
                    "local rank {peer} reported an error handling a message"
                );
            }
            return;
        }
        match self.waiters.remove(&cookie) {
            Some((_, Waiter::Flag(done))) => *done.borrow_mut() = Some(ok),
            Some((_, Waiter::Callback(cb))) => cb(if ok {
                Ok(())
            } else {
                Err(SmError::RemoteError { peer })
            }),
            None => {}
        }
    }

    fn error(&mut self, error: PeerError) {
        self.peer_errors += 1;
        peer_log!(
            self,
            error,
            "shared memory: {error} (peer error {})",
            self.peer_errors
        );
    }
}

/// What `Sm::attach` builds around the mapping.
struct Parts {
    engine: Engine,
    control: Control<'static>,
    state: State,
    probe: Box<AtomicU64>,
    oversubscribed: bool,
}

/// The shared-memory transport of one process (one per job per node).
pub struct Sm {
    // Field order matters: `engine` and `control` borrow the mapping owned by
    // `segment`, so they are declared (and dropped) first.
    engine: Engine,
    control: Control<'static>,
    state: State,
    segment: Segment,
    _probe: Box<AtomicU64>,
    params: SmParams,
    me: u32,
    nprocs: u32,
    oversubscribed: bool,
    failed: Vec<u32>,
    departed: Vec<u32>,
    last_liveness: Instant,
    /// Timeout of blocking operations (`BTL_TIMEOUT`, seconds).
    timeout: Duration,
    barrier_epoch: u64,
    /// Inside `progress`'s RMA service (which sends, and so progresses).
    serving: bool,
    /// Measured bulk rates per peer.
    rates: Vec<BulkRates>,
}

impl fmt::Debug for Sm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sm")
            .field("me", &self.me)
            .field("nprocs", &self.nprocs)
            .field("segment", &self.segment.path())
            .finish()
    }
}

/// A duration in seconds from the environment variable `var` (`default`
/// when unset); `None` if it is set but not a positive number of seconds.
pub(crate) fn env_secs_opt(var: &str, default: Duration) -> Option<Duration> {
    match std::env::var(var) {
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e9)
            .map(Duration::from_secs_f64),
        Err(_) => Some(default),
    }
}

fn env_secs(var: &str, default: Duration) -> Result<Duration, SmError> {
    env_secs_opt(var, default).ok_or(SmError::Unsupported(
        "a timeout variable (BTL_ATTACH_TIMEOUT / BTL_TIMEOUT) must be a positive number of seconds",
    ))
}

/// Reads the `sm` parameters from the environment (`BTL_SM_*`,
/// `OMPI_MCA_btl_sm_*`) over the defaults, and verifies them.
pub fn params_from_env() -> Result<SmParams, SmError> {
    let mut p = SmParams::default();
    for (k, v) in std::env::vars_os() {
        let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else {
            continue;
        };
        p.set_from_env_var(k, v)?;
    }
    p.verify()?;
    Ok(p)
}

impl Sm {
    /// Joins the job's shared-memory transport on this node (see the module
    /// docs for the start-up sequence).
    pub fn init(job: &JobEnv, mut params: SmParams) -> Result<Sm, SmError> {
        if !crate::shared_memory_supported() {
            return Err(SmError::Unsupported(
                "this target has no lock-free 64-bit atomics",
            ));
        }
        params.verify()?;
        let attach_timeout = env_secs("BTL_ATTACH_TIMEOUT", DEFAULT_ATTACH_TIMEOUT)?;
        let timeout = env_secs("BTL_TIMEOUT", Duration::from_secs(300))?;
        let me = job.local_rank;
        let nprocs = job.local_size;
        let uid = rustix::process::getuid().as_raw();
        let dir = segment::segment_dir(Some(&job.session_dir))?;
        let path: PathBuf = dir.join(segment::segment_file_name(uid, &job.job, &job.node)?);
        let (pid, start) = segment::current_process_identity();

        let (mut seg, layout) = if me == 0 {
            for stale in segment::remove_stale(&dir, uid)? {
                log::warn!("removed stale segment {}", stale.display());
            }
            let max_procs = calc_sm_max_procs(&params, nprocs)?;
            let layout = segment_layout(&params, max_procs)?;
            let seg = Segment::create(&path, layout.total_bytes)?;
            let control = Control::new(seg.region())?;
            control.publish(
                &params,
                nprocs,
                max_procs,
                layout.total_bytes as u64,
                u64::from(pid),
                start,
            );
            (seg, layout)
        } else {
            let seg = Segment::open(&path, PART_ALIGN, attach_timeout)?;
            let deadline = Instant::now() + attach_timeout;
            let control = Control::new(seg.region())?;
            while !control.is_ready() {
                if Instant::now() > deadline {
                    return Err(SmError::AttachTimeout {
                        waited: attach_timeout,
                        missing: vec![0],
                    });
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let (p, n, max_procs) = control.read_params(&params)?;
            if n != nprocs {
                return Err(SmError::Control(ControlError::Corrupted {
                    what: "nprocs (differs from BTL_LOCAL_SIZE)",
                }));
            }
            if p.fifo_size != params.fifo_size
                || p.eager_limit != params.eager_limit
                || p.max_send_size != params.max_send_size
            {
                log::warn!("local rank 0 created the segment with different sm parameters; using its values");
            }
            params = p;
            let layout = segment_layout(&params, max_procs)?;
            if seg.len() < layout.total_bytes {
                return Err(SmError::Control(ControlError::Corrupted {
                    what: "segment shorter than its layout",
                }));
            }
            (seg, layout)
        };
        match Self::attach(
            &mut seg,
            layout,
            params,
            me,
            nprocs,
            pid,
            start,
            attach_timeout,
        ) {
            Ok(parts) => Ok(Sm {
                engine: parts.engine,
                control: parts.control,
                state: parts.state,
                segment: seg,
                _probe: parts.probe,
                params,
                me,
                nprocs,
                oversubscribed: parts.oversubscribed,
                failed: Vec::new(),
                departed: Vec::new(),
                last_liveness: Instant::now(),
                timeout,
                barrier_epoch: 0,
                serving: false,
                rates: vec![BulkRates::default(); nprocs as usize],
            }),
            Err(e) => {
                // Never leave the file behind on a failed start.
                let _ = seg.unlink();
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn attach(
        seg: &mut Segment,
        layout: SegmentLayout,
        params: SmParams,
        me: u32,
        nprocs: u32,
        pid: u32,
        start: u64,
        attach_timeout: Duration,
    ) -> Result<Parts, SmError> {
        let base = NonNull::new(seg.as_ptr()).ok_or(SmError::Unsupported("null mapping"))?;
        // SAFETY: the mapping (base, len) is owned by the `Segment` that the
        // returned `Sm` holds in its last-dropped field, so it outlives every
        // reference built from this region (engine, control); moving the
        // `Segment` value does not move the mapping. All access goes through
        // btl-core's atomics and byte copies.
        let region: Region<'static> = unsafe { Region::from_raw_parts(base, seg.len()) };
        let control = Control::new(region)?;

        // Our part, then our record.
        // SAFETY: no peer touches our part before our record says READY
        // (below); this process initialises it once.
        unsafe { engine::init_part(&region, &layout, &params, me) }?;
        let probe = Box::new(AtomicU64::new(0x6274_6c5f_7072_6f62 ^ u64::from(pid)));
        let rec = control.record(me)?;
        rec.pid.store(u64::from(pid), Ordering::Relaxed);
        rec.start.store(start, Ordering::Relaxed);
        rec.probe_addr
            .store(&*probe as *const AtomicU64 as u64, Ordering::Relaxed);
        rec.probe_value
            .store(probe.load(Ordering::Relaxed), Ordering::Relaxed);
        // Release: pairs with the Acquire loads of peers waiting for READY.
        rec.state.store(RANK_READY, Ordering::Release);

        // Wait for everyone.
        let deadline = Instant::now() + attach_timeout;
        let mut pids = vec![0u64; nprocs as usize];
        loop {
            let mut missing = Vec::new();
            for r in 0..nprocs {
                let rec = control.record(r)?;
                if rec.state.load(Ordering::Acquire) >= RANK_READY {
                    let p = rec.pid.load(Ordering::Relaxed);
                    let s = rec.start.load(Ordering::Relaxed);
                    pids[r as usize] = p;
                    if r != me && !segment::process_alive(p as u32, s) {
                        return Err(SmError::PeerDiedAtStart { rank: r, pid: p });
                    }
                } else {
                    missing.push(r);
                }
            }
            if missing.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                return Err(SmError::AttachTimeout {
                    waited: attach_timeout,
                    missing,
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }

        let sizes = Engine::storage_sizes(&layout, nprocs)
            .ok_or(SmError::Unsupported("storage sizes overflow"))?;
        let engine = Engine::attach(
            &region,
            &layout,
            &params,
            me,
            nprocs,
            (0..sizes.peers).map(|_| PeerSlot::new()).collect(),
            (0..sizes.consumers).map(|_| None).collect(),
            vec![FragDesc::new(); sizes.descs],
            vec![0; sizes.pending],
        )?;

        // Single copy: permission probe against every peer.
        let mut cma_ok = vec![false; nprocs as usize];
        if params.use_cma {
            cma::allow_ptrace_from_any();
            let mut refused = Vec::new();
            for r in (0..nprocs).filter(|&r| r != me) {
                let rec = control.record(r)?;
                let addr = rec.probe_addr.load(Ordering::Relaxed) as usize;
                let want = rec.probe_value.load(Ordering::Relaxed);
                let mut got = [0u8; 8];
                match cma::read_remote(pids[r as usize] as u32, addr, &mut got) {
                    Ok(()) if u64::from_ne_bytes(got) == want => cma_ok[r as usize] = true,
                    Ok(()) => refused.push((r, "probe value mismatch".to_string())),
                    Err(e) => refused.push((r, e.to_string())),
                }
            }
            if let Some((r, why)) = refused.first() {
                log::warn!(
                    "single copy (CMA) refused for {} of {} local peers (rank {r}: {why}); \
                     using the pipelined copy through shared fragments for them",
                    refused.len(),
                    nprocs - 1
                );
            }
        }

        // The last rank to attach unlinks the file.
        let attached = control.header().attached.fetch_add(1, Ordering::AcqRel) + 1;
        if attached == nprocs {
            seg.unlink()?;
        }

        let online = rustix::thread::sched_getaffinity(None)
            .map(|s| s.count())
            .unwrap_or(1)
            .max(1);
        let state = State {
            handlers: (0..256).map(|_| None).collect(),
            waiters: HashMap::new(),
            next_cookie: 1,
            partial: (0..nprocs).map(|_| None).collect(),
            bufs: (0..nprocs).map(|_| Vec::new()).collect(),
            scratch: vec![0; params.max_send_size as usize],
            pids,
            cma_ok,
            barrier_arrivals: HashMap::new(),
            peer_failed: vec![false; nprocs as usize],
            peer_errors: 0,
            peer_reports: 0,
            rma: rma::Rma::default(),
        };
        Ok(Parts {
            engine,
            control,
            state,
            probe,
            oversubscribed: nprocs as usize > online as usize,
        })
    }
}

impl Sm {
    /// This process's local rank.
    pub fn rank(&self) -> u32 {
        self.me
    }

    /// Number of local ranks.
    pub fn size(&self) -> u32 {
        self.nprocs
    }

    /// The verified parameters in force (the segment creator's layout
    /// parameters included).
    pub fn params(&self) -> &SmParams {
        &self.params
    }

    /// True if single copy works towards `peer`.
    pub fn single_copy_to(&self, peer: u32) -> bool {
        self.state
            .cma_ok
            .get(peer as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Peers declared failed so far (died, or corrupted their ring).
    pub fn failed_peers(&self) -> &[u32] {
        &self.failed
    }

    /// Peers that left the job cleanly (their transport was dropped).
    pub fn departed_peers(&self) -> &[u32] {
        &self.departed
    }

    /// Registers `handler` for `tag` (replacing any earlier one). It runs
    /// inside [`Self::progress`] with the sender's local rank and the
    /// message; it cannot call back into the transport (queue work and do it
    /// after `progress` returns).
    pub fn on(
        &mut self,
        tag: u8,
        handler: impl FnMut(u32, &[u8]) + 'static,
    ) -> Result<(), SmError> {
        if tag > MAX_USER_TAG {
            return Err(SmError::ReservedTag { tag });
        }
        self.state.handlers[usize::from(tag)] = Some(Box::new(handler));
        Ok(())
    }

    /// One pass of the progress engine: returns the number of events.
    /// Never blocks.
    pub fn progress(&mut self) -> usize {
        let mut n = self.engine.progress(&mut self.state);
        if !self.serving && !self.state.rma.outbox.is_empty() {
            self.serving = true;
            while let Some(work) = self.state.rma.outbox.pop_front() {
                n += 1;
                self.serve(work);
            }
            self.serving = false;
        }
        n
    }

    /// Carries out RMA work queued by the callbacks (replies, gets to serve).
    /// Errors towards a failed peer are logged and dropped.
    fn serve(&mut self, work: Outgoing) {
        let (peer, result) = match work {
            Outgoing::Reply { peer, req, status } => {
                let reply = rma::encode_reply(req, status);
                (
                    peer,
                    self.send_fragment(peer, rma::TAG_RMA_REPLY, &[&reply], 0),
                )
            }
            Outgoing::Serve { peer, get } => (peer, self.serve_get(peer, get)),
        };
        if let Err(e) = result {
            log::warn!("RMA reply to local rank {peer} not sent: {e}");
        }
    }

    fn serve_get(&mut self, peer: u32, get: RangeReq) -> Result<(), SmError> {
        let status = if get.addr != 0 {
            // Single copy straight into the requester.
            let pid = self.state.pids[peer as usize] as u32;
            let data = self.state.rma.range_mut(get.id, get.offset, get.len);
            match data.map(|d| cma::write_remote(pid, get.addr as usize, d)) {
                Ok(Ok(())) => RmaStatus::Ok,
                Ok(Err(e)) => {
                    log::warn!("single-copy get for local rank {peer} failed: {e}");
                    RmaStatus::CopyFailed
                }
                Err(status) => status,
            }
        } else {
            let chunk = self.engine.max_payload() as usize - 16;
            let mut tmp = Vec::with_capacity(chunk.min(get.len as usize));
            let mut off = 0u64;
            let mut status = RmaStatus::Ok;
            while off < get.len {
                let len = (get.len - off).min(chunk as u64);
                tmp.clear();
                match self.state.rma.range_mut(get.id, get.offset + off, len) {
                    Ok(d) => tmp.extend_from_slice(d),
                    // Deregistered meanwhile.
                    Err(s) => {
                        status = s;
                        break;
                    }
                }
                let hdr = rma::encode_get_data(get.req, off);
                self.send_fragment(peer, rma::TAG_GET_DATA, &[&hdr, &tmp], 0)?;
                off += len;
            }
            status
        };
        let reply = rma::encode_reply(get.req, status);
        self.send_fragment(peer, rma::TAG_RMA_REPLY, &[&reply], 0)
    }

    fn fail(&mut self, peer: u32, why: &str) {
        if self.engine.peer_state(peer) == Some(PeerState::Connected) {
            log::error!(
                "local peer {peer} (pid {}) failed: {why}",
                self.state.pids.get(peer as usize).copied().unwrap_or(0)
            );
            if let Some(f) = self.state.peer_failed.get_mut(peer as usize) {
                *f = true;
            }
            self.engine.fail_peer(peer, &mut self.state);
            self.state.partial[peer as usize] = None;
            self.failed.push(peer);
        }
    }

    /// Checks that every connected peer is still alive (pid and start
    /// time), declaring dead ones failed. Returns the newly failed peers.
    pub fn check_peers(&mut self) -> Vec<u32> {
        self.last_liveness = Instant::now();
        let mut newly = Vec::new();
        for peer in 0..self.nprocs {
            if self.engine.peer_state(peer) != Some(PeerState::Connected) {
                continue;
            }
            let Ok(rec) = self.control.record(peer) else {
                continue;
            };
            let state = rec.state.load(Ordering::Acquire);
            let pid = rec.pid.load(Ordering::Relaxed) as u32;
            let start = rec.start.load(Ordering::Relaxed);
            if state == RANK_DONE {
                // It left cleanly; whatever of ours it had not handled is
                // lost: complete it with an error, and send nothing more.
                if self.engine.in_flight_to(peer) > 0 {
                    log::warn!("local peer {peer} left the job with messages of ours unhandled");
                }
                if let Some(f) = self.state.peer_failed.get_mut(peer as usize) {
                    *f = true;
                }
                self.engine.fail_peer(peer, &mut self.state);
                self.departed.push(peer);
            } else if !segment::process_alive(pid, start) {
                self.fail(peer, "the process died");
                newly.push(peer);
            }
        }
        newly
    }

    /// Progresses until `done(self)` is true, idling politely (spin, then
    /// yield, then short sleeps) and checking liveness every
    /// [`LIVENESS_INTERVAL`]. `peer` (if any) is the peer waited for: its
    /// failure ends the wait with [`SmError::PeerFailed`].
    pub fn wait_until(
        &mut self,
        what: &'static str,
        peer: Option<u32>,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> Result<(), SmError> {
        // Reading the clock costs as much as a shared-memory message here
        // (a vDSO call, slower under a hypervisor), so it is read only every
        // CLOCK_EVERY rounds: the timeout and the liveness interval are
        // coarse anyway.
        const CLOCK_EVERY: u32 = 256;
        let mut started: Option<Instant> = None;
        let mut idle = 0u32;
        let mut rounds = 0u32;
        loop {
            if done(self) {
                return Ok(());
            }
            if let Some(p) = peer {
                if self.engine.peer_state(p) == Some(PeerState::Failed) {
                    return Err(SmError::PeerFailed { peer: p });
                }
            }
            rounds = rounds.wrapping_add(1);
            if rounds % CLOCK_EVERY == 0 {
                let now = Instant::now();
                let t0 = *started.get_or_insert(now);
                if now.duration_since(self.last_liveness) >= LIVENESS_INTERVAL {
                    self.check_peers();
                }
                if now.duration_since(t0) > self.timeout {
                    return Err(SmError::Timeout {
                        what,
                        waited: now.duration_since(t0),
                    });
                }
            }
            if self.progress() > 0 {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            self.idle(idle);
        }
    }

    /// What to do on the `idle`-th consecutive empty poll: spin, then
    /// yield, then sleep 50 µs at a time.
    pub(crate) fn idle(&mut self, idle: u32) {
        let spin = if self.oversubscribed { 8 } else { 2000 };
        if idle == spin {
            // Let writers blocked on a partial lazy-free batch go on.
            self.engine.release_consumed();
        }
        if idle < spin {
            std::hint::spin_loop();
        } else if idle < spin + 5000 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    fn check_peer(&mut self, peer: u32) -> Result<(), SmError> {
        match self.engine.peer_state(peer) {
            Some(PeerState::Connected) => Ok(()),
            Some(PeerState::Failed) => Err(SmError::PeerFailed { peer }),
            _ => Err(SmError::InvalidPeer { peer }),
        }
    }

    /// Pushes one fragment, progressing while no fragment is free or the
    /// peer's queue is full (with liveness checks and the timeout).
    fn send_fragment(
        &mut self,
        peer: u32,
        tag: u8,
        parts: &[&[u8]],
        cookie: u64,
    ) -> Result<(), SmError> {
        if self.engine.congested() {
            self.progress();
        }
        // Fast path: a free fragment and room in the peer's queue.
        let mut first = Some(self.engine.send(peer, tag, parts, cookie));
        let mut result = Ok(());
        self.wait_until("a free fragment", Some(peer), |sm| {
            let attempt = first
                .take()
                .unwrap_or_else(|| sm.engine.send(peer, tag, parts, cookie));
            match attempt {
                Ok(()) => true,
                Err(SendError::NoFragment | SendError::Backlog { .. }) => false,
                Err(SendError::PeerFailed { peer }) => {
                    result = Err(SmError::PeerFailed { peer });
                    true
                }
                Err(SendError::InvalidPeer { peer }) => {
                    result = Err(SmError::InvalidPeer { peer });
                    true
                }
                Err(SendError::TooLarge { .. }) => {
                    result = Err(SmError::Unsupported("fragment larger than max_send_size"));
                    true
                }
            }
        })?;
        result
    }

    fn cookie(&mut self, peer: u32, w: Waiter) -> u64 {
        let c = self.state.next_cookie;
        self.state.next_cookie += 1;
        self.state.waiters.insert(c, (peer, w));
        c
    }

    /// Sends `data` to local rank `peer` with `tag`. Returns when `data` may
    /// be reused: after the copy into shared fragments, or, for a single-copy
    /// transfer, after the receiver has read it. Errors: the peer failed,
    /// the tag is reserved, or a timeout.
    pub fn send(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), SmError> {
        self.send_inner(peer, tag, data, None)
    }

    /// As [`Self::send`], and `on_done` runs (inside a later
    /// [`Self::progress`]) once the receiver has handled the message, with
    /// the error if it could not.
    pub fn send_with_completion(
        &mut self,
        peer: u32,
        tag: u8,
        data: &[u8],
        on_done: impl FnOnce(Result<(), SmError>) + 'static,
    ) -> Result<(), SmError> {
        self.send_inner(peer, tag, data, Some(Box::new(on_done)))
    }

    fn send_inner(
        &mut self,
        peer: u32,
        tag: u8,
        data: &[u8],
        on_done: Option<OnDone>,
    ) -> Result<(), SmError> {
        if tag > MAX_USER_TAG {
            return Err(SmError::ReservedTag { tag });
        }
        self.check_peer(peer)?;
        let max = self.engine.max_payload() as usize;
        if data.len() <= max {
            let cookie = match on_done {
                Some(cb) => self.cookie(peer, Waiter::Callback(cb)),
                None => 0,
            };
            return self.send_fragment(peer, tag, &[data], cookie);
        }
        let large = data.len() as u64 >= u64::from(self.params.min_rdma_pipeline_size);
        if self.state.cma_ok[peer as usize] && large {
            let now = Instant::now();
            match self.rates[peer as usize].choose(now) {
                Bulk::Pipelined => {}
                Bulk::ProbePipelined => {
                    // Measure the pipelined copy alone: drain, send, drain.
                    self.wait_until("our fragments to drain", Some(peer), |sm| {
                        sm.engine.in_flight_to(peer) == 0
                    })?;
                    let t0 = Instant::now();
                    self.send_chunked(peer, tag, data, on_done)?;
                    self.wait_until("the pipelined copy", Some(peer), |sm| {
                        sm.engine.in_flight_to(peer) == 0
                    })?;
                    self.rates[peer as usize].record(Bulk::Pipelined, data.len(), t0.elapsed());
                    return Ok(());
                }
                Bulk::SingleCopy => {
                    let done: Done = Rc::new(RefCell::new(None));
                    let cookie = self.cookie(peer, Waiter::Flag(done.clone()));
                    let hdr = Rndv {
                        tag,
                        addr: data.as_ptr() as u64,
                        len: data.len() as u64,
                    }
                    .encode();
                    self.send_fragment(peer, TAG_RNDV, &[&hdr], cookie)?;
                    let waited = self.wait_until("the receiver's single copy", Some(peer), |_| {
                        done.borrow().is_some()
                    });
                    if let Err(e) = waited {
                        self.state.waiters.remove(&cookie);
                        return Err(e);
                    }
                    if done.borrow().unwrap_or(false) {
                        self.rates[peer as usize].record(
                            Bulk::SingleCopy,
                            data.len(),
                            now.elapsed(),
                        );
                        if let Some(cb) = on_done {
                            cb(Ok(()));
                        }
                        return Ok(());
                    }
                    // The receiver could not read our memory (or had no
                    // handler): resend through fragments; a missing handler
                    // is reported there.
                    self.state.cma_ok[peer as usize] = false;
                    log::warn!("single copy to local rank {peer} failed at the receiver; resending through shared fragments");
                }
            }
        }
        self.send_chunked(peer, tag, data, on_done)
    }

    fn send_chunked(
        &mut self,
        peer: u32,
        tag: u8,
        data: &[u8],
        on_done: Option<OnDone>,
    ) -> Result<(), SmError> {
        // A multiple of 64 bytes, so every chunk of the source and of the
        // receiver's buffer keeps the same alignment (faster copies).
        let chunk = (self.engine.max_payload() as usize - Chunk::LEN) & !63;
        let total = data.len() as u64;
        let mut cb = on_done;
        let mut offset = 0usize;
        while offset < data.len() {
            let end = (offset + chunk).min(data.len());
            let hdr = Chunk {
                tag,
                total,
                offset: offset as u64,
            }
            .encode();
            let cookie = match (end == data.len(), cb.take()) {
                (true, Some(cb)) => self.cookie(peer, Waiter::Callback(cb)),
                (false, Some(c)) => {
                    cb = Some(c);
                    0
                }
                (_, None) => 0,
            };
            self.send_fragment(peer, TAG_CHUNK, &[&hdr, &data[offset..end]], cookie)?;
            offset = end;
        }
        Ok(())
    }

    /// Progresses until every fragment this process sent has been
    /// acknowledged and every acknowledgement it owes has left (or the peers
    /// concerned failed).
    pub fn flush(&mut self) -> Result<(), SmError> {
        self.wait_until("acknowledgements", None, |sm| {
            sm.engine.outstanding() == 0 && sm.engine.pending() == 0
        })
    }

    /// Waits until every live local rank has called `barrier` as many
    /// times as this one (all-to-all arrival messages on an internal tag).
    /// Failed or departed peers are not waited for.
    pub fn barrier(&mut self) -> Result<(), SmError> {
        self.barrier_epoch += 1;
        let epoch = self.barrier_epoch;
        let msg = epoch.to_le_bytes();
        let me = self.me;
        for peer in (0..self.nprocs).filter(|&p| p != me) {
            if self.engine.peer_state(peer) == Some(PeerState::Connected) {
                self.send_fragment(peer, TAG_BARRIER, &[&msg], 0)?;
            }
        }
        self.wait_until("the other local ranks at a barrier", None, |sm| {
            let live = (0..sm.nprocs)
                .filter(|&p| p != sm.me && sm.engine.peer_state(p) == Some(PeerState::Connected))
                .count() as u32;
            sm.state.barrier_arrivals.get(&epoch).copied().unwrap_or(0) >= live
        })?;
        self.state.barrier_arrivals.remove(&epoch);
        Ok(())
    }

    /// Registers a zeroed region of `len` bytes that peers may get from and
    /// put into; send its key to them.
    pub fn register(&mut self, len: usize) -> RegionKey {
        let rma = &mut self.state.rma;
        let id = rma.next_region;
        rma.next_region += 1;
        rma.regions.insert(id, vec![0u8; len].into_boxed_slice());
        RegionKey {
            rank: self.me,
            id,
            len: len as u64,
        }
    }

    /// The table of our registered regions (the job API lends one table
    /// to both transports).
    pub(crate) fn regions_mut(&mut self) -> &mut HashMap<u32, Box<[u8]>> {
        &mut self.state.rma.regions
    }

    /// The contents of one of our regions.
    pub fn region(&self, key: &RegionKey) -> Option<&[u8]> {
        (key.rank == self.me).then_some(())?;
        self.state.rma.regions.get(&key.id).map(|r| &r[..])
    }

    /// The contents of one of our regions, writable.
    pub fn region_mut(&mut self, key: &RegionKey) -> Option<&mut [u8]> {
        (key.rank == self.me).then_some(())?;
        self.state.rma.regions.get_mut(&key.id).map(|r| &mut r[..])
    }

    /// Removes one of our regions; later requests for it are refused.
    pub fn deregister(&mut self, key: &RegionKey) -> bool {
        key.rank == self.me && self.state.rma.regions.remove(&key.id).is_some()
    }

    fn new_request(&mut self, peer: u32, buf_len: usize) -> u64 {
        let rma = &mut self.state.rma;
        rma.next_req += 1;
        let req = rma.next_req;
        rma.waiting.insert(
            req,
            rma::Wait {
                peer,
                status: None,
                buf: vec![0; buf_len],
                got: 0,
            },
        );
        req
    }

    fn wait_reply(
        &mut self,
        peer: u32,
        req: u64,
        what: &'static str,
    ) -> Result<rma::Wait, SmError> {
        let r = self.wait_until(what, Some(peer), |sm| {
            sm.state
                .rma
                .waiting
                .get(&req)
                .is_some_and(|w| w.status.is_some())
        });
        let w = self.state.rma.waiting.remove(&req);
        r?;
        w.ok_or(SmError::Timeout {
            what,
            waited: Duration::ZERO,
        })
    }

    /// Copies `dst.len()` bytes at `offset` of the region `key` (of another
    /// local rank, or our own) into `dst`. Blocks until done.
    pub fn get(&mut self, key: &RegionKey, offset: u64, dst: &mut [u8]) -> Result<(), SmError> {
        let peer = key.rank;
        if peer == self.me {
            let src = self
                .state
                .rma
                .range_mut(key.id, offset, dst.len() as u64)
                .map_err(|status| SmError::Rma { peer, status })?;
            dst.copy_from_slice(src);
            return Ok(());
        }
        self.check_peer(peer)?;
        let mut single = self.state.cma_ok[peer as usize]
            && dst.len() as u64 >= u64::from(self.params.min_rdma_pipeline_size);
        loop {
            let req = self.new_request(peer, if single { 0 } else { dst.len() });
            let msg = RangeReq {
                req,
                id: key.id,
                offset,
                len: dst.len() as u64,
                addr: if single { dst.as_mut_ptr() as u64 } else { 0 },
            }
            .encode();
            if let Err(e) = self.send_fragment(peer, rma::TAG_GET_REQ, &[&msg], 0) {
                self.state.rma.waiting.remove(&req);
                return Err(e);
            }
            let w = self.wait_reply(peer, req, "a get's reply")?;
            match w.status {
                Some(RmaStatus::Ok) if single => return Ok(()),
                Some(RmaStatus::Ok) if w.got == dst.len() as u64 => {
                    dst.copy_from_slice(&w.buf);
                    return Ok(());
                }
                Some(RmaStatus::Ok) => {
                    return Err(SmError::Rma {
                        peer,
                        status: RmaStatus::CopyFailed,
                    })
                }
                Some(RmaStatus::CopyFailed) if single => {
                    self.state.cma_ok[peer as usize] = false;
                    single = false;
                }
                Some(status) => return Err(SmError::Rma { peer, status }),
                None => return Err(SmError::PeerFailed { peer }),
            }
        }
    }

    /// Copies `src` to `offset` of the region `key` (of another local rank,
    /// or our own). Blocks until the target has applied it.
    pub fn put(&mut self, key: &RegionKey, offset: u64, src: &[u8]) -> Result<(), SmError> {
        let peer = key.rank;
        if peer == self.me {
            let dst = self
                .state
                .rma
                .range_mut(key.id, offset, src.len() as u64)
                .map_err(|status| SmError::Rma { peer, status })?;
            dst.copy_from_slice(src);
            return Ok(());
        }
        self.check_peer(peer)?;
        if self.state.cma_ok[peer as usize]
            && src.len() as u64 >= u64::from(self.params.min_rdma_pipeline_size)
        {
            let req = self.new_request(peer, 0);
            let msg = RangeReq {
                req,
                id: key.id,
                offset,
                len: src.len() as u64,
                addr: src.as_ptr() as u64,
            }
            .encode();
            if let Err(e) = self.send_fragment(peer, rma::TAG_PUT_CMA, &[&msg], 0) {
                self.state.rma.waiting.remove(&req);
                return Err(e);
            }
            match self.wait_reply(peer, req, "a put's reply")?.status {
                Some(RmaStatus::Ok) => return Ok(()),
                Some(RmaStatus::CopyFailed) => self.state.cma_ok[peer as usize] = false,
                Some(status) => return Err(SmError::Rma { peer, status }),
                None => return Err(SmError::PeerFailed { peer }),
            }
        }
        let req = self.new_request(peer, 0);
        let chunk = self.engine.max_payload() as usize - rma::PutChunk::LEN;
        let mut off = 0usize;
        loop {
            let end = (off + chunk).min(src.len());
            let hdr = rma::PutChunk {
                req,
                id: key.id,
                offset,
                total: src.len() as u64,
                chunk_off: off as u64,
            }
            .encode();
            if let Err(e) = self.send_fragment(peer, rma::TAG_PUT_DATA, &[&hdr, &src[off..end]], 0)
            {
                self.state.rma.waiting.remove(&req);
                return Err(e);
            }
            off = end;
            // Stop early if the target already refused the put.
            if off >= src.len()
                || self
                    .state
                    .rma
                    .waiting
                    .get(&req)
                    .is_some_and(|w| w.status.is_some())
            {
                break;
            }
        }
        match self.wait_reply(peer, req, "a put's reply")?.status {
            Some(RmaStatus::Ok) => Ok(()),
            Some(status) => Err(SmError::Rma { peer, status }),
            None => Err(SmError::PeerFailed { peer }),
        }
    }

    /// Sends and acknowledgements that had to wait behind a full ring.
    pub fn queued_total(&self) -> u64 {
        self.engine.queued_total()
    }

    /// Peer errors seen so far (corrupted slots or fragments), each also
    /// logged.
    pub fn peer_errors(&self) -> u64 {
        self.state.peer_errors
    }
}

impl Drop for Sm {
    fn drop(&mut self) {
        // Deliver what is still in flight to live peers (bounded by the
        // timeout), then say we left cleanly so peers do not take our exit
        // for a crash.
        let saved = self.timeout;
        self.timeout = self.timeout.min(Duration::from_secs(5));
        let _ = self.flush();
        self.timeout = saved;
        if let Ok(rec) = self.control.record(self.me) {
            rec.state.store(RANK_DONE, Ordering::Release);
        }
        if !self.segment.is_unlinked() {
            let _ = self.segment.unlink();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_choice_follows_measurements() {
        let mut r = BulkRates::default();
        let t = Instant::now();
        assert_eq!(r.choose(t), Bulk::SingleCopy);
        // First samples are warm-ups: slow (page faults), not counted.
        r.record(Bulk::SingleCopy, 1 << 20, Duration::from_millis(5));
        assert_eq!(r.choose(Instant::now()), Bulk::SingleCopy);
        r.record(Bulk::SingleCopy, 1 << 20, Duration::from_micros(100));
        assert_eq!(r.choose(Instant::now()), Bulk::ProbePipelined);
        r.record(Bulk::ProbePipelined, 1 << 20, Duration::from_millis(5));
        assert_eq!(r.choose(Instant::now()), Bulk::ProbePipelined);
        r.record(Bulk::ProbePipelined, 1 << 20, Duration::from_micros(50));
        assert_eq!(r.choose(Instant::now()), Bulk::Pipelined);
        // The placement changes: the pipelined copy becomes slow.
        for _ in 0..4 {
            r.record(Bulk::Pipelined, 1 << 20, Duration::from_micros(400));
        }
        assert_eq!(r.choose(Instant::now()), Bulk::SingleCopy);
        // A stale measurement is refreshed first.
        let later = Instant::now() + 2 * BULK_REFRESH;
        assert_eq!(r.choose(later), Bulk::SingleCopy);
    }

    #[test]
    fn protocol_headers_roundtrip() {
        let r = Rndv {
            tag: 3,
            addr: 0xdead_beef,
            len: 1 << 33,
        };
        assert_eq!(Rndv::decode(&r.encode()), Some(r));
        assert_eq!(Rndv::decode(&[0; 5]), None);
        let c = Chunk {
            tag: 9,
            total: 100,
            offset: 40,
        };
        let mut b = c.encode().to_vec();
        b.extend_from_slice(b"data");
        assert_eq!(Chunk::decode(&b), Some(c));
        assert_eq!(Chunk::decode(&b[..10]), None);
    }
}
