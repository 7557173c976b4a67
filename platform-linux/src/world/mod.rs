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
//!
//! [`Sm`]: crate::sm::Sm
//! [`Tcp`]: crate::tcp::Tcp

use std::time::Duration;

use btl_core::rma::RmaStatus;

use crate::sm::SmError;
use crate::tcp::TcpError;
use crate::wireup::{self, WireupError};

mod api;
mod barrier;
mod events;
mod hub;
mod init;
mod report;
mod requests;

pub use api::World;
pub use btl_core::rma::RegionKey;
pub use events::{Event, Flow, Handler, Outbox, PollCx};
pub use init::{Builder, Opened, ENV_TRANSPORT};

/// Largest user tag of the job API (the table is [`btl_core::tags`]).
pub const MAX_USER_TAG: u8 = btl_core::tags::MAX_USER_TAG;

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
