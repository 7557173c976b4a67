//! The job API: one object per process that reaches every rank of the job,
//! over shared memory inside a node and over TCP between nodes — with
//! non-blocking operations, completions, and one progress call.
//!
//! [`World::init`] (or [`Builder`]) asks the wire-up source
//! ([`crate::wireup`]) who we are, publishes our node name, and after a
//! fence knows which ranks share our node. Those are reached over shared
//! memory ([`Sm`], which ranks in node-local numbering — the world
//! translates); every other rank over TCP ([`Tcp`]). TCP is started only
//! when the job spans several nodes, or when forced with [`Choice::Tcp`].
//!
//! # Operations and completions
//!
//! Posting never waits for a peer: [`World::isend`] (copying; the bytes may
//! be reused at once), [`World::isendv`] (several slices, one message),
//! [`World::isend_owned`] (zero copy: the buffer travels with the request),
//! `isend_raw` (zero copy over caller memory, for the C ABI),
//! [`World::iput`] / [`World::iget`] (between our registered memory and a
//! peer's; the target's refusal is the completion's status). Each returns
//! a [`Request`]; [`Request::COMPLETE`] when it finished at once.
//!
//! [`World::poll`] runs one progress pass of every transport and hands
//! out [`Event`]s: messages in place (the bytes borrow the shared-memory
//! fragment or the TCP read buffer, valid during the callback only; a
//! message larger than one fragment — `max_send_size` over shared memory —
//! is reassembled into a receive buffer first), completions, peer
//! failures. Replies
//! go through the [`Outbox`] the callback gets, posted when it returns —
//! no interior mutability needed. Per-tag handlers ([`World::on`]) are
//! served on the same path. Each completion is reported exactly once: by
//! `poll` as [`Event::Done`], or by [`World::test`] / [`World::wait`],
//! whichever sees it first.
//!
//! # Blocking calls, one wait loop
//!
//! `send`, `put`, `get`, `barrier`, `flush`, `wait` and [`World::drive`]
//! wait in one loop ([`crate::progress`]) that drives every transport (and
//! messages to ourselves) on every round, so requests that arrive on one
//! transport while we wait for another are served: no cycle of ranks
//! blocked on different transports can deadlock. Messages that arrive
//! during a blocking call and have no handler are kept (copied) for the
//! next `poll`. Every wait honours `BTL_TIMEOUT` and ends, naming the peer,
//! when a peer it depends on fails.
//!
//! # Threads
//!
//! A `World` is `Send` (it may move to another thread) but not `Sync`: one
//! thread at a time calls it. Handlers run on the thread that calls
//! `poll` or a blocking call.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use btl_core::barrier::BarrierRepr;
use btl_core::rma::RmaStatus;

use crate::idmap::IdMap;
use crate::ops::{OpError, PostError, TEvent};
use crate::progress::{Idle, Waiter, CLOCK_EVERY};
use crate::regions::Regions;
use crate::sm::{Sm, SmError};
use crate::tcp::{Tcp, TcpError};
use crate::wireup::{self, DynWireup, Identity, WireupError};

mod init;
mod ops;

pub use btl_core::rma::RegionKey;
pub use init::{Builder, Opened, ENV_TRANSPORT};

/// Largest user tag of the job API (the table is [`btl_core::tags`]).
pub const MAX_USER_TAG: u8 = btl_core::tags::MAX_USER_TAG;
/// Empty passes after which (and every as many after that) [`World::poll`]
/// hands consumed ring slots back (as the wait loop does when it stops
/// spinning).
const RELEASE_AFTER_IDLE: u32 = 64;
/// Most passes in a row that end after the small-message lane
/// ([`World::lane`]) having handed out messages, before a full pass.
const LANE_STREAK: u32 = 8;
/// How many more times a spinning wait on a TCP-only world tries an empty
/// socket's `recv` in each pass ([`crate::tcp::Tcp::set_recv_spin`]): the
/// pass's own
/// work then delays a message that arrives during it in one case of nine,
/// where it delayed every one by half a pass. Eight `recv`s are a few
/// microseconds here, so the wait's spinning phase (`progress::SPIN`
/// passes) lasts that much longer before it yields.
const RECV_SPIN: u32 = 8;

/// How [`World::lane`] left a pass.
enum Lane {
    /// It is over: this many messages were handed out.
    Done(usize),
    /// The full pass runs; this many messages were handed out already.
    Pass(usize),
}

/// Wire-up key of a rank's node name.
pub const NODE_KEY: &str = "node";

/// Whether this process is a rank of a job (some wire-up source is set,
/// see [`crate::wireup`]): `Ok(false)` when none is, an error when the
/// environment names one wrongly.
pub fn in_job() -> Result<bool, WireupError> {
    match wireup::Source::from_env() {
        Ok(_) => Ok(true),
        Err(WireupError::NoSource) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Our rank as the environment tells it (for error messages before or
/// without wire-up): `BTL_RANK`, `PMIX_RANK` or `SLURM_PROCID`, else `?`.
pub fn rank_hint() -> String {
    [
        "BTL_RANK",
        "PMIX_RANK",
        "OMPI_COMM_WORLD_RANK",
        "SLURM_PROCID",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok())
    .unwrap_or_else(|| "?".into())
}

/// Which transports to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Shared memory inside a node, TCP between nodes.
    Auto,
    /// Shared memory only (every rank must be on this node).
    Sm,
    /// TCP only, even between ranks of one node.
    Tcp,
    /// Shared memory to the ranks of our node; the other ranks are
    /// unreachable through this world ([`World::reachable`]; posts to them
    /// are refused with [`WorldError::Unreachable`]) — for a component
    /// that serves only node-local peers beside another that serves the
    /// rest.
    SmLocal,
}

impl Choice {
    /// From `--transport`'s value (`auto`, `sm` or `tcp`).
    pub fn parse(s: &str) -> Option<Choice> {
        match s {
            "auto" => Some(Choice::Auto),
            "sm" => Some(Choice::Sm),
            "tcp" => Some(Choice::Tcp),
            "sm-local" => Some(Choice::SmLocal),
            _ => None,
        }
    }

    /// The name [`Self::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Choice::Auto => "auto",
            Choice::Sm => "sm",
            Choice::Tcp => "tcp",
            Choice::SmLocal => "sm-local",
        }
    }
}

/// How a peer is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Me,
    /// Shared memory, with its node-local rank.
    Sm(u32),
    Tcp,
    /// Not through this world ([`Choice::SmLocal`]: a rank of another
    /// node).
    Unreachable,
}

/// The job API's errors.
#[derive(Debug, thiserror::Error)]
pub enum WorldError {
    /// Wire-up failed.
    #[error("{0}")]
    Wireup(#[source] WireupError),
    /// Shared memory failed to start.
    #[error("{0}")]
    Sm(#[source] SmError),
    /// TCP failed to start.
    #[error("{0}")]
    Tcp(#[source] TcpError),
    /// `--transport sm` in a job across nodes.
    #[error("--transport sm needs every rank on one node, but the job spans {nodes} nodes")]
    NotOneNode {
        /// Nodes of the job.
        nodes: usize,
    },
    /// A peer's wire-up record is missing or malformed.
    #[error("rank {rank}'s wire-up record {key:?} is missing or malformed")]
    BadRecord {
        /// The peer.
        rank: u32,
        /// The record.
        key: &'static str,
    },
    /// The tag is reserved (user tags are `0..=MAX_USER_TAG`).
    #[error("tag {tag} is reserved (user tags are 0..={MAX_USER_TAG})")]
    ReservedTag {
        /// The tag.
        tag: u8,
    },
    /// There is no such rank.
    #[error("there is no rank {peer}")]
    InvalidPeer {
        /// The rank.
        peer: u32,
    },
    /// The rank is not reached by this world ([`Choice::SmLocal`] and a
    /// rank of another node).
    #[error(
        "rank {peer} is on another node: not reachable over shared memory (transport sm-local)"
    )]
    Unreachable {
        /// The rank.
        peer: u32,
    },
    /// A peer failed (died, its connection broke, or it corrupted the
    /// protocol).
    #[error("rank {peer} failed: {why}")]
    PeerFailed {
        /// The peer.
        peer: u32,
        /// Why, as its transport saw it.
        why: String,
    },
    /// A wait took longer than `BTL_TIMEOUT`.
    #[error(
        "timed out after {:.1} s waiting for {what} (BTL_TIMEOUT)",
        .waited.as_secs_f64()
    )]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        waited: Duration,
    },
    /// The peer's send queue is full: progress (`poll`) and retry.
    #[error("the send queue to rank {peer} is full (the peer does not drain it)")]
    WouldBlock {
        /// The peer.
        peer: u32,
    },
    /// The message is larger than the transports carry.
    #[error("message larger than the {max}-byte limit")]
    TooLarge {
        /// The limit in bytes.
        max: u64,
    },
    /// The target refused a get or put (unknown region, range outside it)
    /// or could not copy.
    #[error("get/put refused: {status}")]
    Refused {
        /// Why.
        status: RmaStatus,
    },
    /// The receiver could not handle the message.
    #[error("rank {peer} could not handle the message")]
    Remote {
        /// The peer.
        peer: u32,
    },
    /// The local side of a get or put is not inside a region registered
    /// with this world (or the key is not ours).
    #[error("local side of a get/put: {status}")]
    BadLocal {
        /// Why.
        status: RmaStatus,
    },
    /// The region is still used by operations of ours.
    #[error("region still used by {ops} operation(s) in flight")]
    RegionBusy {
        /// How many.
        ops: u32,
    },
    /// The request is unknown (never posted, or its completion was already
    /// reported).
    #[error("unknown request {request} (never posted, or already completed and reported)")]
    UnknownRequest {
        /// The request.
        request: u64,
    },
    /// A parameter given in code is unknown or malformed.
    #[error("parameter {name}: {message}")]
    Param {
        /// The parameter, as `component.name`.
        name: String,
        /// What is wrong and what it accepts.
        message: String,
    },
    /// An argument is invalid (null pointer, zero length where one is
    /// needed, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
}

from_err!(WorldError: Wireup(WireupError), Sm(SmError), Tcp(TcpError));

/// A non-blocking operation. [`Request::COMPLETE`] is an operation that
/// finished when it was posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Request(u64);

impl Request {
    /// An operation that completed when posted (nothing to wait for).
    pub const COMPLETE: Request = Request(0);

    /// True for [`Request::COMPLETE`].
    pub fn is_complete(&self) -> bool {
        self.0 == 0
    }

    /// The request's number (0 for [`Request::COMPLETE`]).
    pub fn id(&self) -> u64 {
        self.0
    }

    /// The request numbered `id` (the C ABI's handle).
    pub fn from_id(id: u64) -> Self {
        Self(id)
    }
}

/// What a progress pass hands out.
#[derive(Debug)]
pub enum Event<'a> {
    /// A message for a tag without a registered handler.
    Message {
        /// The sender's rank.
        from: u32,
        /// Its tag.
        tag: u8,
        /// Its bytes, valid during the callback: in place in the
        /// shared-memory fragment or the TCP read buffer (see
        /// [`World::payload_location`]); a message larger than one
        /// fragment, or one kept from a blocking call, is a buffer of ours.
        data: &'a [u8],
    },
    /// A request completed.
    Done {
        /// The request.
        req: Request,
        /// Its outcome (the target's refusal of a get or put, a peer's
        /// failure).
        result: Result<(), WorldError>,
    },
    /// A peer was declared failed (reported once).
    PeerFailed {
        /// The peer.
        peer: u32,
        /// Why.
        why: &'a str,
    },
}

/// Where a payload lies ([`World::payload_location`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadLocation {
    /// In the shared segment (a fragment).
    SharedMemory,
    /// In a TCP connection's read buffer.
    TcpReadBuffer,
    /// Anywhere else (a reassembly or staging copy).
    Elsewhere,
}

/// Message sizes of the transport reaching a peer ([`World::limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Messages up to this many bytes go in one eager fragment / frame
    /// (the transport's `eager_limit` parameter).
    pub eager: u64,
    /// Largest message sent as one fragment (`max_send_size`); larger
    /// ones travel by rendezvous, pipelining or chunks.
    pub max_send: u64,
    /// Largest message the transport carries at all.
    pub max_message: u64,
}

/// Whether [`World::drive`] goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep waiting.
    Continue,
    /// Done: return.
    Done,
}

/// Messages to post when the callback (or handler) that wrote them
/// returns: replies without borrowing the world. Each is copied; they are
/// posted in order.
#[derive(Debug, Default)]
pub struct Outbox {
    buf: Vec<u8>,
    items: VecDeque<(u32, u8, usize, usize)>,
}

impl Outbox {
    /// Queues a message to `peer` with `tag`.
    pub fn send(&mut self, peer: u32, tag: u8, data: &[u8]) {
        self.sendv(peer, tag, &[data]);
    }

    /// Queues the concatenation of `parts` as one message.
    pub fn sendv(&mut self, peer: u32, tag: u8, parts: &[&[u8]]) {
        let at = self.buf.len();
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        self.items.push_back((peer, tag, at, self.buf.len() - at));
    }

    /// True if nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Hands every queued message to `f` (peer, tag, bytes), in order, and
    /// empties the outbox (for transports other than the job API's that
    /// serve the same consumers).
    pub fn drain(&mut self, mut f: impl FnMut(u32, u8, &[u8])) {
        while let Some((peer, tag, at, len)) = self.items.pop_front() {
            f(peer, tag, &self.buf[at..at + len]);
        }
        self.buf.clear();
    }
}

/// A message handler: the outbox for replies, the sender's rank, the bytes
/// (in place, valid during the call).
pub type Handler<'m> = Box<dyn FnMut(&mut Outbox, u32, &[u8]) + Send + 'm>;

/// What a [`World::poll_with`] callback may do besides reading its event:
/// queue replies (the [`Outbox`], posted when the callback returns) and
/// register or deregister memory at once (the region table is lent back
/// to the callback between the transports' uses of it).
pub struct PollCx<'p> {
    /// Replies, posted in order when the callback returns.
    pub outbox: &'p mut Outbox,
    regions: &'p mut Regions,
    me: u32,
}

impl fmt::Debug for PollCx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollCx")
            .field("outbox", &self.outbox)
            .finish_non_exhaustive()
    }
}

/// An event consumer: returns whether it took the event (an event it does
/// not take is kept, as if nobody were listening).
///
/// The blocking calls hand one in as a trait object; [`World::poll_with`]
/// hands its closure in as a type parameter, so that the whole delivery
/// (the transport's event, the hub, the consumer) compiles into one
/// function on the path every message takes.
type User<'u> = &'u mut dyn FnMut(&mut PollCx<'_>, Event<'_>) -> bool;

/// What [`User`] is, as a bound.
trait Consumer: FnMut(&mut PollCx<'_>, Event<'_>) -> bool {}
impl<F: FnMut(&mut PollCx<'_>, Event<'_>) -> bool + ?Sized> Consumer for F {}

/// Calls the consumer with the outbox and the region table.
#[inline(always)]
fn call<U: Consumer + ?Sized>(
    u: &mut U,
    outbox: &mut Outbox,
    regions: &mut Regions,
    me: u32,
    ev: Event<'_>,
) -> bool {
    u(
        &mut PollCx {
            outbox,
            regions,
            me,
        },
        ev,
    )
}

/// The state of a request.
struct Req {
    /// Its outcome, once known.
    result: Option<Result<(), OpError>>,
    /// Our region it uses (unpinned at completion).
    pin: Option<u32>,
    /// A buffer it owns (zero-copy send of an owned buffer).
    _keep: Option<Box<dyn AsRef<[u8]> + Send>>,
    /// Cancelled while a transport still reads its memory: kept (with
    /// `_keep`) until that completion, which nobody is told of.
    abandoned: bool,
    /// Where it went (for cancelling).
    route: Route,
}

/// Everything the transports' events touch: handlers, requests, barrier
/// arrivals, failures, messages kept for later.
struct Hub<'m> {
    me: u32,
    /// Global ranks of our node, by local rank.
    local: Vec<u32>,
    handlers: Vec<Option<Handler<'m>>>,
    outbox: Outbox,
    /// Messages that arrived with nobody listening (blocking calls).
    stash: VecDeque<(u32, u8, Vec<u8>)>,
    /// Messages to ourselves, delivered by the next pass.
    to_self: VecDeque<(u8, Vec<u8>)>,
    reqs: IdMap<u64, Req>,
    /// Requests completed with nobody listening, in order.
    completed: VecDeque<u64>,
    next_req: u64,
    /// Peers (global) that announced each barrier epoch.
    barrier_in: HashMap<u64, HashSet<u32>>,
    /// Barrier epochs a peer gave up: (the rank that failed, who said so).
    barrier_abandoned: HashMap<u64, (u32, u32)>,
    /// Peers (global) declared failed, with why.
    failed: Vec<(u32, String)>,
}

impl Hub<'_> {
    fn global(&self, sm: bool, peer: u32) -> u32 {
        if sm {
            self.local.get(peer as usize).copied().unwrap_or(u32::MAX)
        } else {
            peer
        }
    }

    fn new_req(&mut self, pin: Option<u32>, route: Route) -> u64 {
        self.next_req += 1;
        let id = self.next_req;
        self.reqs.insert(
            id,
            Req {
                result: None,
                pin,
                _keep: None,
                abandoned: false,
                route,
            },
        );
        id
    }

    /// Delivers a message: to its handler, else to the consumer, else
    /// kept.
    #[inline(always)]
    fn message<U: Consumer + ?Sized>(
        &mut self,
        from: u32,
        tag: u8,
        data: &[u8],
        regions: &mut Regions,
        user: &mut Option<&mut U>,
    ) {
        if let Some(h) = self
            .handlers
            .get_mut(usize::from(tag))
            .and_then(Option::as_mut)
        {
            h(&mut self.outbox, from, data);
            return;
        }
        if let Some(u) = user.as_mut() {
            let ev = Event::Message { from, tag, data };
            if call(u, &mut self.outbox, regions, self.me, ev) {
                return;
            }
        }
        self.stash.push_back((from, tag, data.to_vec()));
    }

    fn done<U: Consumer + ?Sized>(
        &mut self,
        op: u64,
        result: Result<(), OpError>,
        regions: &mut Regions,
        user: &mut Option<&mut U>,
    ) {
        let Some(r) = self.reqs.get_mut(&op) else {
            // Cancelled: nobody waits for it.
            return;
        };
        if let Some(id) = r.pin.take() {
            // At once: the completion's consumer may deregister it.
            regions.unpin(id);
        }
        if r.abandoned {
            self.reqs.remove(&op);
            return;
        }
        if let Some(u) = user.as_mut() {
            let ev = Event::Done {
                req: Request(op),
                result: result.clone().map_err(|e| op_error(e, &self.failed)),
            };
            if call(u, &mut self.outbox, regions, self.me, ev) {
                self.reqs.remove(&op);
                return;
            }
        }
        if let Some(r) = self.reqs.get_mut(&op) {
            r.result = Some(result);
            r._keep = None;
        }
        self.completed.push_back(op);
    }

    #[inline(always)]
    fn on_event<U: Consumer + ?Sized>(
        &mut self,
        sm: bool,
        regions: &mut Regions,
        ev: TEvent<'_>,
        user: &mut Option<&mut U>,
    ) {
        match ev {
            TEvent::Message { from, tag, data } => {
                let g = self.global(sm, from);
                self.message(g, tag, data, regions, user);
            }
            TEvent::Done { op, result } => {
                let result = result.map_err(|e| match e {
                    OpError::PeerFailed { peer } => OpError::PeerFailed {
                        peer: self.global(sm, peer),
                    },
                    e => e,
                });
                self.done(op, result, regions, user);
            }
            TEvent::Barrier { from, msg } => {
                let g = self.global(sm, from);
                match msg {
                    BarrierRepr::Arrived { epoch } => {
                        self.barrier_in.entry(epoch).or_default().insert(g);
                    }
                    BarrierRepr::Abandoned { epoch, failed } => {
                        self.barrier_abandoned.entry(epoch).or_insert((failed, g));
                    }
                }
            }
            TEvent::PeerFailed { peer, why } => {
                let g = self.global(sm, peer);
                if !self.failed.iter().any(|(p, _)| *p == g) {
                    self.failed.push((g, why.to_string()));
                }
                if let Some(u) = user.as_mut() {
                    let ev = Event::PeerFailed { peer: g, why };
                    call(u, &mut self.outbox, regions, self.me, ev);
                }
            }
        }
    }

    /// Whether [`Self::replay`] has anything to hand out.
    #[inline]
    fn has_replay(&self) -> bool {
        !(self.stash.is_empty() && self.completed.is_empty())
    }

    /// Hands what was kept during blocking calls to a consumer that is
    /// listening now.
    #[inline(never)]
    fn replay<U: Consumer + ?Sized>(
        &mut self,
        regions: &mut Regions,
        user: &mut Option<&mut U>,
    ) -> usize {
        let Some(u) = user.as_mut() else {
            return 0;
        };
        let mut n = 0;
        while let Some((from, tag, data)) = self.stash.pop_front() {
            n += 1;
            let ev = Event::Message {
                from,
                tag,
                data: &data,
            };
            if !call(u, &mut self.outbox, regions, self.me, ev) {
                self.stash.push_front((from, tag, data));
                return n;
            }
        }
        while let Some(op) = self.completed.pop_front() {
            let Some(result) = self.reqs.get(&op).and_then(|r| r.result.clone()) else {
                continue;
            };
            n += 1;
            let ev = Event::Done {
                req: Request(op),
                result: result.map_err(|e| op_error(e, &self.failed)),
            };
            if call(u, &mut self.outbox, regions, self.me, ev) {
                self.reqs.remove(&op);
            } else {
                self.completed.push_front(op);
                return n;
            }
        }
        n
    }
}

/// An operation's error as the job API reports it.
fn op_error(e: OpError, failed: &[(u32, String)]) -> WorldError {
    match e {
        OpError::PeerFailed { peer } => WorldError::PeerFailed {
            peer,
            why: failed
                .iter()
                .find(|(p, _)| *p == peer)
                .map(|(_, w)| w.clone())
                .unwrap_or_else(|| "failed".into()),
        },
        OpError::Refused(status) => WorldError::Refused { status },
        OpError::Remote => WorldError::Remote { peer: u32::MAX },
    }
}

/// One process's view of its job: every rank, over the right transport.
/// `'m` is the lifetime of memory registered with [`World::register`].
pub struct World<'m> {
    id: Identity,
    /// Kept for the job's life: with a user-given rendezvous, rank 0's
    /// holds the service the others may still be reading from.
    _wireup: DynWireup,
    nodes: usize,
    route: Vec<Route>,
    sm: Option<Sm>,
    tcp: Option<Tcp>,
    regions: Regions,
    hub: Hub<'m>,
    timeout: Duration,
    oversubscribed: bool,
    choice: Choice,
    /// The tcp component's `eager_limit` and `max_send_size`.
    tcp_sizes: (u32, u32),
    /// Consecutive passes that found nothing.
    idle_passes: u32,
    /// Passes since the clock was last looked at (liveness checks).
    passes: u32,
    /// Consecutive passes that ended after the small-message lane.
    lane_streak: u32,
    /// Spin-wait hints that end a pass that found nothing (the `sm`
    /// component's `poll_pause`; 0 without shared memory).
    poll_pause: u32,
    barrier_epoch: u64,
    _mem: PhantomData<&'m mut [u8]>,
}

impl fmt::Debug for World<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("World")
            .field("id", &self.id)
            .field("nodes", &self.nodes)
            .field("local", &self.hub.local)
            .finish_non_exhaustive()
    }
}

impl<'m> World<'m> {
    /// This rank.
    pub fn rank(&self) -> u32 {
        self.id.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> u32 {
        self.id.size
    }

    /// Who we are (job, rank, size, node).
    pub fn identity(&self) -> &Identity {
        &self.id
    }

    /// Number of nodes the job spans.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The ranks that share our node (reached over shared memory, unless
    /// TCP was forced).
    pub fn local_ranks(&self) -> &[u32] {
        &self.hub.local
    }

    /// The shared-memory transport, if any peer uses it.
    pub fn sm(&self) -> Option<&Sm> {
        self.sm.as_ref()
    }

    /// The TCP transport, if any peer uses it.
    pub fn tcp(&self) -> Option<&Tcp> {
        self.tcp.as_ref()
    }

    /// Where the `len` bytes at `ptr` lie — a diagnostic for payloads
    /// handed out by events (record `data.as_ptr()` in the callback, ask
    /// afterwards): it shows that messages are handed out in place.
    pub fn payload_location(&self, ptr: *const u8, len: usize) -> PayloadLocation {
        let r = ptr as usize..ptr as usize + len;
        if self.sm.as_ref().is_some_and(|s| s.holds(&r)) {
            PayloadLocation::SharedMemory
        } else if self.tcp.as_ref().is_some_and(|t| t.holds(&r)) {
            PayloadLocation::TcpReadBuffer
        } else {
            PayloadLocation::Elsewhere
        }
    }

    /// How long blocking calls wait at most (`BTL_TIMEOUT`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    #[inline]
    fn route_of(&self, peer: u32) -> Result<Route, WorldError> {
        match self.route.get(peer as usize).copied() {
            None => Err(WorldError::InvalidPeer { peer }),
            Some(Route::Unreachable) => Err(WorldError::Unreachable { peer }),
            Some(r) => Ok(r),
        }
    }

    /// Whether this world reaches rank `peer` (ourselves included): false
    /// for a rank that does not exist and, with [`Choice::SmLocal`], for
    /// the ranks of other nodes. A reachable peer may still fail later
    /// ([`Event::PeerFailed`]).
    pub fn reachable(&self, peer: u32) -> bool {
        self.route_of(peer).is_ok()
    }

    /// The transport choice this world was started with.
    pub fn choice(&self) -> Choice {
        self.choice
    }

    /// Sizes that matter to a caller choosing between protocols for
    /// messages to `peer` (`None` when it is not reachable).
    pub fn limits(&self, peer: u32) -> Option<Limits> {
        match self.route_of(peer).ok()? {
            Route::Sm(_) => self.sm.as_ref().map(|s| Limits {
                eager: u64::from(s.params().eager_limit),
                max_send: u64::from(s.params().max_send_size),
                max_message: crate::sm::MAX_MESSAGE,
            }),
            Route::Tcp => self.tcp.as_ref().map(|_| Limits {
                eager: u64::from(self.tcp_sizes.0),
                max_send: u64::from(self.tcp_sizes.1),
                max_message: crate::tcp::MAX_MESSAGE,
            }),
            Route::Me | Route::Unreachable => Some(Limits {
                eager: u64::from(u32::MAX),
                max_send: u64::from(u32::MAX),
                max_message: crate::tcp::MAX_MESSAGE,
            }),
        }
    }

    /// Registers `handler` for `tag` (replacing any earlier one). It runs
    /// inside [`Self::poll`] or a blocking call with the outbox for
    /// replies, the sender's rank and the message.
    pub fn on(
        &mut self,
        tag: u8,
        handler: impl FnMut(&mut Outbox, u32, &[u8]) + Send + 'm,
    ) -> Result<(), WorldError> {
        if tag > MAX_USER_TAG {
            return Err(WorldError::ReservedTag { tag });
        }
        self.hub.handlers[usize::from(tag)] = Some(Box::new(handler));
        Ok(())
    }

    /// Removes the handler of `tag`: its messages go to `poll` again.
    pub fn off(&mut self, tag: u8) {
        if let Some(h) = self.hub.handlers.get_mut(usize::from(tag)) {
            *h = None;
        }
    }

    /// One progress pass over every transport and our own messages,
    /// handing each event to `f` (messages for tags without a handler,
    /// completions, failures). Returns the number of events. Never blocks.
    pub fn poll(&mut self, mut f: impl FnMut(&mut Outbox, Event<'_>)) -> usize {
        self.poll_with(|cx, e| f(cx.outbox, e))
    }

    /// [`Self::poll`] whose callback may also register and deregister
    /// memory ([`PollCx`]) while it handles an event — what a component
    /// that registers a receive buffer on a rendezvous needs.
    pub fn poll_with(&mut self, mut f: impl FnMut(&mut PollCx<'_>, Event<'_>)) -> usize {
        let mut u = |cx: &mut PollCx<'_>, e: Event<'_>| {
            f(cx, e);
            true
        };
        self.pass(&mut Some(&mut u), Duration::ZERO)
    }

    /// One progress pass with nobody listening: messages go to their
    /// handlers (or are kept for the next [`Self::poll`]), completions are
    /// kept for [`Self::test`]. Returns the number of events.
    pub fn progress(&mut self) -> usize {
        self.pass(&mut None::<User<'_>>, Duration::ZERO)
    }

    /// One pass: every transport, messages to ourselves, the outbox; the
    /// liveness check every [`CLOCK_EVERY`] passes. `block` lets a
    /// TCP-only world sleep in `epoll_wait` that long.
    ///
    /// Never inlined: profiles (scripts/capi-bench.sh) count passes by
    /// its calls.
    ///
    /// A pass that found nothing ends with `poll_pause` spin-wait hints
    /// (the `sm` component's parameter; none without shared memory), the
    /// spin-wait idiom CPU vendors document: without it, polls of an
    /// unchanged box run ahead speculatively and the core throws that work
    /// away when the peer's store lands (a memory-order machine clear), and
    /// back-to-back polls keep pulling the line the writer is filling.
    /// Which of the two it saves here is not measured (this guest has no
    /// performance counters). Two hints (~20 ns here) made the fastest 8-byte
    /// batches under Open MPI 5–10 % faster whenever the machine was quiet
    /// (README, "A pause after an empty pass"), the C ABI's ping-pong about
    /// 4 % and `btl bench` 0–3 %; eight were slower again.
    #[inline(never)]
    fn pass<U: Consumer + ?Sized>(&mut self, user: &mut Option<&mut U>, block: Duration) -> usize {
        let n = self.pass_once(user, block);
        if n == 0 {
            for _ in 0..self.poll_pause {
                btl_core::sync::spin_loop();
            }
        }
        n
    }

    /// [`Self::pass`] without the pause.
    #[inline(always)]
    fn pass_once<U: Consumer + ?Sized>(
        &mut self,
        user: &mut Option<&mut U>,
        block: Duration,
    ) -> usize {
        // The small-message lane first: a pass that finds nothing to do
        // beyond handing out fast-box messages (or nothing at all) ends
        // there.
        let mut n = match self.lane(user) {
            Lane::Done(n) => return n,
            Lane::Pass(n) => n,
        };
        // The idle pass (a poll that finds nothing) sets the latency of
        // everything built on this: each queue gets one look inline, the
        // work on it is out of line.
        if user.is_some() && self.hub.has_replay() {
            n += self.hub.replay(&mut self.regions, user);
        }
        if let Some(sm) = &mut self.sm {
            let hub = &mut self.hub;
            n += sm.progress(&mut self.regions, &mut |r, ev| {
                hub.on_event(true, r, ev, user)
            });
        }
        if let Some(tcp) = &mut self.tcp {
            let hub = &mut self.hub;
            let t = if self.sm.is_some() {
                Duration::ZERO
            } else {
                block
            };
            n += tcp.progress_timeout(
                &mut self.regions,
                &mut |r, ev| hub.on_event(false, r, ev, user),
                t,
            );
        }
        if !self.hub.to_self.is_empty() {
            n += self.deliver_to_self(user);
        }
        if self.regions.has_changes() {
            // Regions the callbacks of this pass registered or
            // deregistered: published or withdrawn before it returns (and
            // before the replies below carry their keys).
            if let Some(sm) = &mut self.sm {
                sm.apply_unpins(&mut self.regions);
            }
        }
        if !self.hub.outbox.is_empty() {
            n += self.post_outbox();
        }
        // A caller that only polls (no blocking call) must still hand
        // consumed ring slots back, or a writer waiting for a partial
        // lazy-free batch (a pipelined copy filling the ring) waits forever.
        // Once every RELEASE_AFTER_IDLE empty passes: on every one, the
        // walk over the rings was a sixth of an idle pass under Open MPI's
        // progress loop (perf), and a writer waits at most 64 passes more.
        if n == 0 {
            self.idle_passes = self.idle_passes.wrapping_add(1);
            if self.idle_passes % RELEASE_AFTER_IDLE == 0 {
                if let Some(sm) = &mut self.sm {
                    sm.release_consumed();
                }
            }
        } else {
            self.idle_passes = 0;
        }
        self.passes = self.passes.wrapping_add(1);
        if self.passes % CLOCK_EVERY == 0 {
            if let Some(sm) = &mut self.sm {
                sm.check_peers_every(std::time::Instant::now());
            }
        }
        n
    }

    /// The small-message lane: the user messages in the shared-memory fast
    /// boxes go to the consumer with no more than a box poll and a call
    /// each ([`Sm::sweep_boxes`]), where a full pass runs every transport's
    /// queues, the follow-up work and the counters around them; the sweep
    /// also says whether shared memory has anything else to do (a ring
    /// slot, queued work), so a pass that finds nothing else ends here too.
    /// The full pass is about 250 of the 1100 instructions an Open MPI rank
    /// spent per small message under a ping-pong (callgrind, `ppmin 8` over
    /// `self,rsm`), and an idle pass (the poll a receiver spins on, whose
    /// length delays every arrival) was 370 instructions of the C ABI.
    ///
    /// Order: a box's records are older than its sender's ring messages
    /// not yet dispatched (the hand-off rule), and nothing orders one
    /// sender's messages against another's or against completions. Not
    /// taken while messages kept by a blocking call wait for the consumer
    /// (`replay`), so those still come first. Fairness: at most
    /// [`LANE_STREAK`] lane passes that hand out messages in a row, never
    /// the pass that looks at the clock (liveness) or the one that hands
    /// consumed ring slots back, and an idle pass ends here only without
    /// TCP, messages to ourselves or queued replies: TCP and those wait at
    /// most that many messages longer.
    #[inline(always)]
    fn lane<U: Consumer + ?Sized>(&mut self, user: &mut Option<&mut U>) -> Lane {
        let allowed = self.lane_streak < LANE_STREAK
            && user.is_some()
            && (self.passes.wrapping_add(1)) % CLOCK_EVERY != 0
            && !self.hub.has_replay();
        let Some(sm) = self.sm.as_mut().filter(|_| allowed) else {
            self.lane_streak = 0;
            return Lane::Pass(0);
        };
        let (hub, regions) = (&mut self.hub, &mut self.regions);
        // Before any message: the requester's "done" may be among them.
        sm.apply_unpins(regions);
        let sweep = sm.sweep_boxes(|local, tag, data| {
            let from = hub.global(true, local);
            hub.message(from, tag, data, regions, user);
        });
        let n = sweep.delivered;
        if regions.has_changes() {
            // Regions a callback registered or deregistered: the region
            // table follows before the lane returns.
            sm.apply_unpins(regions);
        }
        if sweep.rest {
            self.lane_streak = 0;
            return Lane::Pass(n);
        }
        if n > 0 {
            self.lane_streak += 1;
            self.idle_passes = 0;
        } else if self.tcp.is_none()
            && self.hub.to_self.is_empty()
            && self.hub.outbox.is_empty()
            && (self.idle_passes.wrapping_add(1)) % RELEASE_AFTER_IDLE != 0
        {
            self.idle_passes = self.idle_passes.wrapping_add(1);
        } else {
            self.lane_streak = 0;
            return Lane::Pass(0);
        }
        self.passes = self.passes.wrapping_add(1);
        Lane::Done(n)
    }

    /// Delivers our messages to ourselves; returns how many.
    #[inline(never)]
    fn deliver_to_self<U: Consumer + ?Sized>(&mut self, user: &mut Option<&mut U>) -> usize {
        let mut n = 0;
        while let Some((tag, data)) = self.hub.to_self.pop_front() {
            n += 1;
            let me = self.hub.me;
            self.hub.message(me, tag, &data, &mut self.regions, user);
        }
        n
    }

    /// Posts what handlers and callbacks left in the outbox (in order; a
    /// full queue keeps the rest for the next pass).
    fn post_outbox(&mut self) -> usize {
        let mut out = std::mem::take(&mut self.hub.outbox);
        let mut n = 0;
        while let Some(&(peer, tag, at, len)) = out.items.front() {
            match self.isend(peer, tag, &out.buf[at..at + len]) {
                Err(WorldError::WouldBlock { .. }) => break,
                Err(e) => log::warn!("reply to rank {peer} with tag {tag} dropped: {e}"),
                Ok(_) => n += 1,
            }
            out.items.pop_front();
        }
        if out.items.is_empty() {
            out.buf.clear();
        }
        // Replies queued by the handlers of this very loop come after.
        let newer = std::mem::take(&mut self.hub.outbox);
        for (peer, tag, at, len) in newer.items {
            out.sendv(peer, tag, &[&newer.buf[at..at + len]]);
        }
        self.hub.outbox = out;
        n
    }

    /// Peers that failed so far, with the reason.
    pub fn failed_peers(&self) -> Vec<(u32, String)> {
        self.hub.failed.clone()
    }

    /// The one wait loop: passes until `done`, idling politely, checking
    /// liveness; ends with [`WorldError::PeerFailed`] when a failed peer
    /// `p` has `fatal(world, p)`, with [`WorldError::Timeout`] after
    /// `BTL_TIMEOUT`. Events go to `user` (if any) as in `poll`.
    fn wait_loop(
        &mut self,
        what: &'static str,
        fatal: &mut dyn FnMut(&World<'m>, u32) -> bool,
        user: &mut Option<User<'_>>,
        done: &mut dyn FnMut(&mut World<'m>) -> bool,
    ) -> Result<(), WorldError> {
        let mut w = Waiter::new(what, self.timeout, self.oversubscribed);
        loop {
            if done(self) {
                return Ok(());
            }
            let idle = w.idle();
            let block = match idle {
                Idle::Nap(_) if self.sm.is_none() => Duration::from_millis(1),
                _ => Duration::ZERO,
            };
            // Spinning on TCP alone: the pass reads its socket in a tight
            // loop (Tcp::set_recv_spin), not once per whole pass.
            let spin = idle == Idle::Spin && self.sm.is_none() && !self.oversubscribed;
            if let Some(t) = self.tcp.as_mut().filter(|_| spin) {
                t.set_recv_spin(RECV_SPIN);
            }
            let n = self.pass(user, block);
            if let Some(t) = self.tcp.as_mut().filter(|_| spin) {
                t.set_recv_spin(0);
            }
            if let Some(now) = w.pass(n) {
                if let Some(sm) = &mut self.sm {
                    sm.check_peers_every(now);
                }
                let failed = self
                    .hub
                    .failed
                    .iter()
                    .find(|(p, _)| fatal(self, *p))
                    .cloned();
                if let Some((peer, why)) = failed {
                    return Err(WorldError::PeerFailed { peer, why });
                }
                if let Some(waited) = w.expired(now) {
                    return Err(WorldError::Timeout { what, waited });
                }
            }
            if n > 0 {
                continue;
            }
            if w.just_stopped_spinning() {
                if let Some(sm) = &mut self.sm {
                    sm.release_consumed();
                }
            }
            if block.is_zero() {
                w.rest();
            }
        }
    }

    /// Progresses until `cond(world)`: messages go to handlers (or are kept
    /// for the next `poll`). Ends with [`WorldError::PeerFailed`] when
    /// `peer` fails — or, with `peer` `None`, when any peer fails — and with
    /// [`WorldError::Timeout`] after `BTL_TIMEOUT`.
    pub fn wait_until(
        &mut self,
        what: &'static str,
        peer: Option<u32>,
        mut cond: impl FnMut(&mut World<'m>) -> bool,
    ) -> Result<(), WorldError> {
        self.wait_loop(
            what,
            &mut |_, p| peer.is_none_or(|want| want == p),
            &mut None,
            &mut cond,
        )
    }

    /// Progresses, handing every event to `f` as [`Self::poll`] does,
    /// until `f` returns [`Flow::Done`]; events after that are kept for
    /// later. Ends with an error as [`Self::wait_until`] does. The state
    /// `f` updates is its own (a closure over local variables): no shared
    /// cells needed.
    pub fn drive(
        &mut self,
        what: &'static str,
        peer: Option<u32>,
        mut f: impl FnMut(&mut Outbox, Event<'_>) -> Flow,
    ) -> Result<(), WorldError> {
        // Internal to this call: the consumer sets it, the loop reads it.
        let finished = std::cell::Cell::new(false);
        let mut wrapped = |cx: &mut PollCx<'_>, e: Event<'_>| {
            if finished.get() {
                return false;
            }
            if f(cx.outbox, e) == Flow::Done {
                finished.set(true);
            }
            true
        };
        let mut u: Option<User<'_>> = Some(&mut wrapped);
        self.wait_loop(
            what,
            &mut |_, p| peer.is_none_or(|want| want == p),
            &mut u,
            &mut |_| finished.get(),
        )
    }
}
