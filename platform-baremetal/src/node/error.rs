//! What can go wrong, per operation: setting a node up ([`InitError`]),
//! configuring peers and regions ([`ConfigError`]), starting a send, get,
//! put or barrier ([`SendError`]), and a get or put that did not complete
//! ([`RmaError`]).

use btl_core::tcp::endpoint::FailReason;
use btl_core::tcp::wire::MAX_USER_TAG;

use super::{MAX_REGIONS, MAX_REQUESTS};

/// [`Node::new`](super::Node::new) refused its configuration or memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum InitError {
    /// The memory given is smaller than [`Sizes::memory_size`](super::Sizes::memory_size).
    #[error("node memory: {got} bytes given, {needed} needed")]
    Memory {
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// Fewer `SocketStorage` entries than `S` sockets.
    #[error("{got} socket storage entries given, {needed} needed")]
    SocketStorage {
        /// Entries needed.
        needed: usize,
        /// Entries given.
        got: usize,
    },
    /// The job has more ranks than `P`, or rank is not below size.
    #[error("rank {rank} of {size}: the node holds at most {capacity} ranks")]
    Ranks {
        /// This rank.
        rank: u32,
        /// Ranks in the job.
        size: u32,
        /// Peers the node can hold (`P`).
        capacity: usize,
    },
    /// A buffer is too small: `what` needs at least `min` bytes.
    #[error("{what} buffer of {len} bytes, at least {min} needed")]
    Buffer {
        /// Which buffer.
        what: &'static str,
        /// Its size.
        len: usize,
        /// The minimum.
        min: usize,
    },
    /// `listen_sockets` is 0 or leaves no socket for outgoing connections.
    #[error(
        "{listen} listening sockets out of {sockets}: needs at least 1 and one left to connect with"
    )]
    ListenSockets {
        /// Listening sockets asked for.
        listen: usize,
        /// Sockets in the pool (`S`).
        sockets: usize,
    },
    /// Port 0 cannot be listened on.
    #[error("cannot listen on port 0")]
    Port,
}

/// A send, get, put or barrier could not be started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SendError {
    /// No such peer (or it is this node).
    #[error("no peer {peer}")]
    InvalidPeer {
        /// The rank given.
        peer: u32,
    },
    /// Tags above [`MAX_USER_TAG`] are the transport's.
    #[error("tag {tag} is reserved (user tags are 0..={MAX_USER_TAG})")]
    ReservedTag {
        /// The tag given.
        tag: u8,
    },
    /// Larger than the peer's queue (or a frame) can ever hold.
    #[error("{len} bytes exceed the limit of {max}")]
    TooLarge {
        /// Bytes asked for.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The peer's queue has no room now: poll, then try again.
    #[error("the queue to peer {peer} is full")]
    QueueFull {
        /// The peer.
        peer: u32,
    },
    /// Too many get/put requests outstanding ([`MAX_REQUESTS`]).
    #[error("{MAX_REQUESTS} get/put requests outstanding")]
    TooManyRequests,
    /// The peer failed.
    #[error("peer {peer} failed: {reason}")]
    PeerFailed {
        /// The peer.
        peer: u32,
        /// Why.
        reason: FailReason,
    },
}

/// [`Node::set_peer`](super::Node::set_peer) or [`Node::register`](super::Node::register) refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ConfigError {
    /// No such peer (or it is this node).
    #[error("no peer {peer}")]
    InvalidPeer {
        /// The rank given.
        peer: u32,
    },
    /// Port 0 or an unspecified address.
    #[error("unspecified address or port 0")]
    BadAddress,
    /// [`MAX_REGIONS`] regions are registered already.
    #[error("{MAX_REGIONS} regions registered already")]
    TooManyRegions,
}

/// Why a get or put did not complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RmaError {
    /// The target refused: no such region, or the range is outside it.
    #[error("refused by the target (outside its registered regions)")]
    Refused,
    /// The target answered a get with another length than asked.
    #[error("answered with the wrong length")]
    BadLength,
    /// The target failed before answering.
    #[error("the target failed")]
    PeerFailed,
}
