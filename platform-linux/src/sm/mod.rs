//! The shared-memory transport on Linux: segment rendezvous, the core's
//! progress engine, active messages of any size, and liveness.
//!
//! # Start-up (the seed's `create_rndv_file` / `create_and_attach`)
//!
//! 1. Local rank 0 computes the layout from the verified parameters,
//!    creates the segment (a sealed memfd, every page reserved, memory
//!    checked first: [`crate::segment`]), offers it on the segment's
//!    rendezvous socket and publishes the control header.
//! 2. Every other rank fetches the segment from rank 0 (waiting, with a
//!    timeout; checking it is rank 0 — the wire-up's pid — of our uid, and
//!    that the segment is sealed against shrinking), and takes the layout
//!    parameters from the header, so all ranks agree.
//! 3. Every rank initialises its own part (rings, fragments), publishes its
//!    record (pid, start time, single-copy probe) and marks itself ready.
//! 4. Every rank waits until all are ready — failing fast, naming the rank,
//!    if one dies meanwhile, or naming the missing ranks on timeout —
//!    identifies them (below), then attaches writers to its peers' rings.
//!    Rank 0 stops offering the segment. Nothing of it has a name in any
//!    file system: it is gone when the last rank is, even after SIGKILL.
//!
//! # Who the peers are
//!
//! The control records can be written by any process that maps the
//! segment, so they are not where a peer's identity comes from. With the
//! job API ([`Sm::init_with_pids`]) every rank publishes its own pid through
//! the job's wire-up (the launcher's service, PMIx, the session directory);
//! each peer's record must name that pid, the kernel must give that process
//! the start time the record names, and our own pid is refused for a peer.
//! From then on the transport uses these identities — the pid and start
//! time for liveness, the pid for single copy — never the record's fields
//! again; a record that changes afterwards is a corruption (below). On its
//! own ([`Sm::init`]) the transport has only the records: single copy is
//! then off, the rest as above.
//!
//! # Messages (never blocking)
//!
//! User tags are `0..=`[`MAX_USER_TAG`]. A message up to the fragment limit
//! goes in one fragment (an eager one up to `eager_limit`) at once, or, if
//! no fragment is free or the peer's ring is full, waits copied in the
//! peer's queue (bounded: [`QueueLimits`]; beyond, the post is refused
//! with [`crate::ops::PostError::WouldBlock`]). Larger ones take one of two protocols,
//! on internal tags:
//!
//! - **single copy** (`use_cma=1` and the kernel allows it for that peer,
//!   messages of at least `min_rdma_pipeline_size` bytes): one fragment
//!   carries the message's address and length; the receiver reads it from
//!   the sender's memory with `process_vm_readv` and acknowledges, which
//!   completes the send;
//! - **pipelined copy** (otherwise): the message is cut into max-size
//!   fragments, each copied in by the sender as fragments free up and out
//!   by the receiver into the reassembly buffer; the send completes once
//!   the last chunk is in a fragment.
//!
//! Which of the two is faster is measured while running (`send.rs`). If the
//! kernel refuses single copy (EPERM: ptrace restrictions, containers), the
//! start-up probe says so once and that peer uses the pipelined copy; a
//! refusal later (the receiver's read fails) makes the sender resend that
//! message pipelined, still in order.
//!
//! Everything that completes later is reported by [`Sm::progress`] as
//! [`TEvent::Done`]; messages and barrier arrivals as events of the same
//! pass. Waiting is the job API's ([`crate::world`]).
//!
//! # Liveness and corruption
//!
//! The owner calls [`Sm::check_peers_every`] while it waits; a dead peer is
//! declared failed: its in-flight fragments and queued work complete with
//! an error, posts to it are refused with [`crate::ops::PostError::PeerFailed`], and
//! the failure is reported once.
//!
//! A peer whose shared-memory structures fail validation in a way that can
//! lose or misdirect messages is declared failed the same way, at once:
//! what the engine finds (bad slots, fragment headers, sequence numbers,
//! ACKs, ring counters: [`btl_core::sm::engine`], which also says whom it
//! blames), a malformed transport message inside a valid fragment (`recv`),
//! and a control record that changed after start-up (`liveness`). The
//! reason names the structure (`local peer 1 failed: corrupted shared
//! memory: fragment header: ...`). The failed peer is told: a verdict in
//! its control record ([`btl_core::sm::control::RankRecord::accuse`]) makes
//! it declare us failed in turn within a liveness interval, rather than wait
//! for answers that will never come.
#![allow(unsafe_code)]

use std::fmt;
use std::time::{Duration, Instant};

use btl_core::params::{ParamError, Params as _};
use btl_core::sm::control::{Control, ControlError, Structure};
use btl_core::sm::engine::{FragDesc, PeerSlot, SetupError, SmEngine};
use btl_core::sm::fifo::Consumer;
use btl_core::sm::layout::SizeError;
use btl_core::sm::params::SmParams;
use btl_core::sync::AtomicU64;

use crate::ops::{QueueLimits, RawBuf, Sink, TEvent};
use crate::regions::Regions;
use crate::segment::{Attached, SegmentError, View};

/// Largest tag available to users; the tags above are the transport's own
/// (the table is [`btl_core::tags`]).
pub use btl_core::tags::MAX_USER_TAG;
use btl_core::tags::{
    BARRIER as TAG_BARRIER, CHUNK as TAG_CHUNK, SM_LANDING as TAG_LANDING, SM_RNDV as TAG_RNDV,
    SM_RNDV_SPLIT as TAG_RNDV_SPLIT,
};

/// How often a blocking wait checks that its peers are alive.
pub const LIVENESS_INTERVAL: Duration = Duration::from_millis(100);
/// Default for how long start-up waits for the other local ranks
/// (`BTL_ATTACH_TIMEOUT`, seconds).
pub const DEFAULT_ATTACH_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest message (1 GiB) the receiving side accepts (a hostile or buggy
/// peer announcing more is refused instead of exhausting memory).
pub const MAX_MESSAGE: u64 = 1 << 30;

type Engine<'r> = SmEngine<
    'r,
    Vec<PeerSlot<'r>>,
    Vec<Option<Consumer<'r>>>,
    Vec<FragDesc>,
    Vec<u64>,
    crate::segment::Reserver,
>;

/// What is built over the segment: the engine and the control area, owned
/// with the mapping by [`Attached`].
struct Shm<'r> {
    engine: Engine<'r>,
    control: Control<'r>,
    /// Every local rank's region table (ours at our local rank).
    regtabs: Vec<btl_core::sm::regtab::RegionTable<'r>>,
}

/// The [`View`] family of [`Shm`].
struct ShmView;

// SAFETY: `Shm<'r>` borrows only the segment's region (the engine's rings,
// fragments and table; the control area; the region tables); none of the `&mut self` methods
// of `SmEngine` or `Control` stores a value of lifetime `'r` that it takes
// as an argument (they take payload slices, dispatchers and numbers).
unsafe impl View for ShmView {
    type Of<'r> = Shm<'r>;
}

/// Errors of the shared-memory transport.
#[derive(Debug, thiserror::Error)]
pub enum SmError {
    /// A parameter is malformed or inconsistent.
    #[error("sm parameters: {0}")]
    Param(ParamError),
    /// The segment layout does not fit (too many ranks, sizes overflow).
    #[error("sm segment size: {0}")]
    Size(SizeError),
    /// Creating, fetching or mapping the segment failed.
    #[error("sm segment: {0}")]
    Segment(SegmentError),
    /// The segment's control area is missing or corrupted.
    #[error("sm segment: {0}")]
    Control(ControlError),
    /// The core engine could not attach to the segment.
    #[error("sm attach: {0}")]
    Setup(SetupError),
    /// Start-up waited too long for these local ranks.
    #[error(
        "sm start-up: local ranks {missing:?} did not attach within {:.1} s \
         (BTL_ATTACH_TIMEOUT)",
        .waited.as_secs_f64()
    )]
    AttachTimeout {
        /// How long it waited.
        waited: Duration,
        /// Local ranks that never became ready.
        missing: Vec<u32>,
    },
    /// A local rank's identity does not check out (wire-up, control record
    /// and kernel disagree, or it claims our own pid).
    #[error("sm start-up: local rank {rank} is not who it says: {what}")]
    Identity {
        /// Its local rank.
        rank: u32,
        /// What disagrees.
        what: String,
    },
    /// A local rank died during start-up.
    #[error("sm start-up: local rank {rank} (pid {pid}) died")]
    PeerDiedAtStart {
        /// Its local rank.
        rank: u32,
        /// Its pid.
        pid: u64,
    },
    /// The job environment does not allow a shared-memory transport.
    #[error("sm unavailable: {0}")]
    Unsupported(&'static str),
}

from_err!(
    SmError:
    Param(ParamError),
    Size(SizeError),
    Segment(SegmentError),
    Control(ControlError),
    Setup(SetupError)
);

mod attach;
mod bulk;
mod landing;
mod liveness;
mod out;
mod recv;
mod rma;
mod send;

pub use btl_core::rma::{RegionKey, RmaStatus};
use bulk::BulkRates;
use out::PeerOut;
use recv::{Ctx, State};

/// Bound of what waits copied in user space for one local peer when its
/// ring is full or no fragment is free: 8 MiB or 16384 messages (as TCP's
/// default `queue_bytes` / `queue_messages`).
pub const DEFAULT_QUEUE_LIMITS: QueueLimits = QueueLimits {
    bytes: 8 << 20,
    messages: 16384,
};

/// The shared-memory transport of one process (one per job per node).
pub struct Sm {
    /// The segment, and the engine and control area over it.
    shm: Attached<ShmView>,
    state: State,
    _probe: Box<AtomicU64>,
    params: SmParams,
    me: u32,
    nprocs: u32,
    oversubscribed: bool,
    failed: Vec<u32>,
    departed: Vec<u32>,
    /// Failures not reported yet.
    to_report: Vec<(u32, String)>,
    /// Peers declared failed for corruption that our verdict has not
    /// reached yet: (peer, structure, liveness checks tried).
    accusations: Vec<(u32, Structure, u32)>,
    last_liveness: Instant,
    /// Timeout of the flush when dropped (`BTL_TIMEOUT`, at most 5 s).
    timeout: Duration,
    /// Measured bulk rates per peer, per size class ([`Sm::rate_class`]).
    rates: Vec<[BulkRates; bulk::RATE_CLASSES]>,
    /// Outgoing work per peer that could not leave at once.
    out: Vec<PeerOut>,
    /// Peers with a non-empty queue.
    busy_peers: u32,
    limits: QueueLimits,
    /// Regions to unpin at the next progress pass (streams that read them
    /// finished).
    unpins: Vec<u32>,
    /// The pieces of the fragment being sent by `pump` (kept to reuse its
    /// allocation).
    pump_pieces: Vec<RawBuf>,
    /// Large messages (from `min_rdma_pipeline_size`) queued so far:
    /// (by single copy, plain or split; by the pipelined copy; of those,
    /// timed for the bulk rates).
    large_sent: (u64, u64, u64),
    next_cookie: u64,
    next_req: u64,
    /// Per receiver: the sequence number of our last split rendezvous.
    split_seq: Vec<u64>,
}

// SAFETY: the engine and control area hold views of the mapping (owned with
// them by `shm`, not tied to a thread) and `state` raw addresses of caller
// memory under `RawBuf`'s contract. Every region over the mapping is inside
// this value (the segment is not Sync and the regions not Send), so moving
// the value as a whole to another thread moves every byte copy there too;
// nothing is shared with other threads of this process.
unsafe impl Send for Sm {}

impl fmt::Debug for Sm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sm")
            .field("me", &self.me)
            .field("nprocs", &self.nprocs)
            .field("segment", &self.shm.segment().name())
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
    let mut p = params_from_env_unverified()?;
    p.verify()?;
    Ok(p)
}

/// The `sm` parameters from the environment over the defaults, each value
/// checked, the rules between them not yet ([`SmParams::verify`]).
pub fn params_from_env_unverified() -> Result<SmParams, SmError> {
    Ok(crate::job::params_from_env_unverified()?)
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

    /// True if more local ranks run than this process has cores.
    pub fn oversubscribed(&self) -> bool {
        self.oversubscribed
    }

    /// Sets the bounds of what may wait in user space for one peer.
    pub fn set_queue_limits(&mut self, limits: QueueLimits) {
        self.limits = limits;
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

    /// Whether `peer` is usable (connected, not failed, not departed).
    pub fn peer_ok(&mut self, peer: u32) -> bool {
        self.check_peer(peer).is_ok()
    }

    /// One pass of progress: the engine (incoming fragments, answers,
    /// acknowledgements), then queued work. Events go to `sink`: messages
    /// (with the sender's local rank), completions of operations posted
    /// earlier, barrier arrivals, failures. Returns the number of events
    /// and fragments handled. Never blocks.
    pub fn progress(&mut self, regions: &mut Regions, sink: &mut Sink<'_>) -> usize {
        // The idle pass (nothing arrived, nothing queued) is what every
        // latency rests on: only the engine's poll and one look at each
        // queue run inline; the work itself is out of line.
        self.apply_unpins(regions);
        let n = self.progress_engine(regions, sink);
        if self.follow_up_pending() {
            let n = n + self.follow_up(regions, sink);
            // A get answered in full in this pass: its region is free
            // before the pass returns, not on the next one.
            self.apply_unpins(regions);
            n
        } else {
            n
        }
    }

    /// Ends the pins of get answers whose data has all left (queued by
    /// the streams that served them). Called before anything is handed
    /// out: the requester's "done" (Open MPI's FIN, on which ob1
    /// deregisters the region and never retries) can only follow the
    /// last of the data, so when it is delivered the region must already
    /// be free.
    ///
    /// Also publishes the regions added and withdraws those removed since
    /// the last call in our region table ([`btl_core::sm::regtab`]), so
    /// that peers read them by single copy without asking ([`Self::iget`]).
    #[inline]
    pub fn apply_unpins(&mut self, regions: &mut Regions) {
        if !self.unpins.is_empty() {
            regions.unpin_queued(&mut self.unpins);
        }
        if regions.has_changes() {
            self.publish_regions(regions);
        }
    }

    /// Applies the region table changes [`Self::apply_unpins`] found.
    #[cold]
    #[inline(never)]
    fn publish_regions(&mut self, regions: &mut Regions) {
        let me = self.me as usize;
        let shm = self.shm.get();
        let Some(table) = shm.regtabs.get(me) else {
            return;
        };
        for c in regions.drain_changes() {
            match c {
                crate::regions::Change::Added { id, addr, len } => {
                    if !table.publish(id, addr, len) {
                        log::debug!(
                            "region {id}: its entry of the region table is taken; peers ask \
                             for its address"
                        );
                    }
                }
                crate::regions::Change::Removed(id) => table.withdraw(id),
            }
        }
    }

    /// Region `id` of local rank `peer` as its region table says.
    fn published(&mut self, peer: u32, id: u32) -> Option<btl_core::sm::regtab::Published> {
        self.shm.get().regtabs.get(peer as usize)?.lookup(id)
    }

    /// The small-message lane ([`SmEngine::sweep_boxes`]): the user
    /// messages in our fast boxes to `f` (the sender's local rank, tag,
    /// payload in place), without the rest of a [`Self::progress`] pass;
    /// `rest` when that pass has anything to do.
    #[inline]
    pub fn sweep_boxes(&mut self, f: impl FnMut(u32, u8, &[u8])) -> btl_core::sm::engine::Sweep {
        let mut sweep = self.shm.get().engine.sweep_boxes(f);
        sweep.rest |= !self.state.bulk_samples.is_empty() || self.follow_up_pending();
        sweep
    }

    /// Whether [`Self::follow_up`] has anything to do.
    #[inline]
    fn follow_up_pending(&self) -> bool {
        let st = &self.state;
        !(st.blamed.is_empty()
            && st.violations.is_empty()
            && st.acks.is_empty()
            && st.work.is_empty()
            && st.splits_pending == 0
            && self.busy_peers == 0
            && self.to_report.is_empty()
            && st.done.is_empty())
    }

    /// What a pass does after the engine's poll: peers to fail,
    /// rendezvous answers, queued work, sends waiting behind full rings,
    /// failures and completions to report.
    #[inline(never)]
    fn follow_up(&mut self, regions: &mut Regions, sink: &mut Sink<'_>) -> usize {
        let mut n = 0;
        if !self.state.blamed.is_empty() || !self.state.violations.is_empty() {
            self.fail_blamed();
        }
        if !self.state.acks.is_empty() {
            let acks = std::mem::take(&mut self.state.acks);
            for &(peer, cookie, ok) in &acks {
                self.rndv_acked(peer, cookie, ok);
            }
            n += acks.len();
        }
        if !self.state.work.is_empty() {
            n += self.do_work(regions);
        }
        if self.state.splits_pending > 0 {
            n += self.end_splits(regions, sink);
        }
        if self.busy_peers > 0 {
            for peer in 0..self.nprocs {
                if !self.out[peer as usize].q.is_empty() {
                    n += self.pump(peer);
                }
            }
        }
        if !self.to_report.is_empty() {
            for (peer, why) in std::mem::take(&mut self.to_report) {
                n += 1;
                sink(regions, TEvent::PeerFailed { peer, why: &why });
            }
        }
        if !self.state.done.is_empty() {
            for (op, result) in std::mem::take(&mut self.state.done) {
                n += 1;
                sink(regions, TEvent::Done { op, result });
            }
        }
        n
    }

    /// Ends the split receives whose sender's part is in or late, and
    /// releases their acknowledgements (see [`landing`]). Returns how many
    /// ended.
    #[cold]
    #[inline(never)]
    fn end_splits(&mut self, regions: &mut Regions, sink: &mut Sink<'_>) -> usize {
        let mut released = Vec::new();
        Ctx {
            st: &mut self.state,
            regions,
            sink,
        }
        .end_splits(&mut released);
        let engine = &mut self.shm.get().engine;
        for &(peer, ok) in &released {
            engine.release_held(peer, ok);
        }
        released.len()
    }

    /// Lets writers blocked on a partial lazy-free batch go on (call when
    /// idle).
    pub fn release_consumed(&mut self) {
        self.shm.get().engine.release_consumed();
    }

    /// True when nothing of ours is in flight or queued: every fragment sent
    /// was acknowledged, every acknowledgement we owe has left, every fast
    /// box we wrote was read to its end, and no operation waits for an
    /// answer.
    pub fn is_flushed(&mut self) -> bool {
        let (busy, waiting) = (self.busy_peers, self.state.waiting.is_empty());
        let e = &mut self.shm.get().engine;
        e.outstanding() == 0 && e.pending() == 0 && busy == 0 && waiting && e.fboxes_drained()
    }

    /// Operations posted and not completed yet, towards `peer` (`None`:
    /// any peer).
    pub fn in_flight(&mut self, peer: Option<u32>) -> u32 {
        match peer {
            Some(p) => self.shm.get().engine.in_flight_to(p),
            None => self.shm.view().engine.outstanding(),
        }
    }

    /// Whether the address range `data` lies in the shared segment (a message handed out in
    /// place, from its fragment).
    pub fn holds(&self, data: &std::ops::Range<usize>) -> bool {
        let seg = self.shm.segment();
        let base = seg.as_ptr() as usize;
        base <= data.start && data.end <= base + seg.len()
    }

    /// Sends and acknowledgements that had to wait behind a full ring.
    pub fn queued_total(&self) -> u64 {
        self.shm.view().engine.queued_total()
    }

    /// One-sided transfers moved by single copy so far: gets this rank
    /// read from a target, puts it read into its region as the target.
    pub fn rma_single_copies(&self) -> u64 {
        self.state.rma_single_copies
    }

    /// Our gets read by single copy straight from the target's memory as
    /// its region table publishes it, without asking (of
    /// [`Self::rma_single_copies`]).
    pub fn direct_gets(&self) -> u64 {
        self.state.direct_gets
    }

    /// Split single copies so far: (our gets completed so, bytes we wrote
    /// into peers' memory for theirs).
    pub fn split_copies(&self) -> (u64, u64) {
        (self.state.split_gets, self.state.split_written)
    }

    /// Large messages (from `min_rdma_pipeline_size` on) queued so far: (by
    /// single copy, plain or split; by the pipelined copy; of those, timed
    /// to measure it).
    pub fn large_messages(&self) -> (u64, u64, u64) {
        self.large_sent
    }

    /// Split rendezvous so far: (messages received with the sender's part
    /// in time, received after reading that part ourselves, sent with our
    /// part written).
    pub fn split_messages(&self) -> (u64, u64, u64) {
        let (in_time, alone) = self.state.split_in;
        (in_time, alone, self.state.split_out)
    }

    /// Messages sent through fast boxes (no fragment, no ACK) so far.
    pub fn fbox_sent(&self) -> u64 {
        self.shm.view().engine.fbox_sent()
    }

    /// Fragments of our pools carved so far: (eager, max-size).
    pub fn pool_sizes(&self) -> (u32, u32) {
        self.shm.view().engine.pool_sizes()
    }

    /// Fast boxes of ours handed out to senders so far.
    pub fn boxes_handed_out(&self) -> u32 {
        self.shm.view().engine.boxes_handed_out()
    }

    /// Bytes of the node's segment backed by memory now (every rank's
    /// reservations so far), if the kernel says.
    pub fn reserved_bytes(&self) -> Option<u64> {
        self.shm.segment().reserved_bytes()
    }

    /// Messages received through fast boxes so far.
    pub fn fbox_received(&self) -> u64 {
        self.shm.view().engine.fbox_received()
    }

    /// Peer errors seen so far (corrupted slots or fragments), each also
    /// logged.
    pub fn peer_errors(&self) -> u64 {
        self.state.peer_errors
    }
}

impl Drop for Sm {
    fn drop(&mut self) {
        // Deliver what is still in flight to live peers (bounded), then say
        // we left cleanly so peers do not take our exit for a crash.
        // Messages arriving meanwhile are dropped: the owner is gone.
        let mut w = crate::progress::Waiter::new(
            "our fragments to be acknowledged",
            self.timeout.min(Duration::from_secs(5)),
            self.oversubscribed,
        );
        let mut regions = Regions::new();
        while !self.is_flushed() {
            let n = self.progress(&mut regions, &mut |_, _| {});
            if let Some(now) = w.pass(n) {
                self.check_peers_every(now);
                if w.expired(now).is_some() {
                    break;
                }
            }
            w.rest();
        }
        let me = self.me;
        if let Ok(rec) = self.shm.get().control.record(me) {
            rec.leave();
        }
    }
}
