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

use std::fmt;
use std::time::{Duration, Instant};

use btl_core::sm::control::{Control, ControlError, RANK_DONE};
use btl_core::sm::engine::{FragDesc, PeerSlot, SetupError, SmEngine};
use btl_core::sm::fifo::Consumer;
use btl_core::sm::layout::SizeError;
use btl_core::sm::params::{ParamError, SmParams};
use btl_core::sync::{AtomicU64, Ordering};

use crate::segment::{Segment, SegmentError};

/// Largest tag available to users; the tags above are the transport's own
/// (the table is [`btl_core::tags`]).
pub use btl_core::tags::MAX_USER_TAG;
use btl_core::tags::{BARRIER as TAG_BARRIER, CHUNK as TAG_CHUNK, SM_RNDV as TAG_RNDV};

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

mod attach;
mod liveness;
mod recv;
mod rma;
mod send;

use recv::State;
pub use rma::{RegionKey, RmaStatus};
use send::BulkRates;

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

fn env_secs(var: &str, default: Duration) -> Result<Duration, SmError> {
    crate::job::env_secs_opt(var, default).ok_or(SmError::Unsupported(
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
