//! What can go wrong, per operation: setting a node up ([`InitError`]),
//! configuring peers and regions ([`ConfigError`]), starting a send, get,
//! put or barrier ([`SendError`]), and a get or put that did not complete
//! ([`RmaError`]).

use core::fmt;

use btl_core::tcp::endpoint::FailReason;
use btl_core::tcp::wire::MAX_USER_TAG;

use super::{MAX_REGIONS, MAX_REQUESTS};

/// [`Node::new`](super::Node::new) refused its configuration or memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum InitError {
    /// The memory given is smaller than [`Sizes::memory_size`](super::Sizes::memory_size).
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

/// [`Node::set_peer`](super::Node::set_peer) or [`Node::register`](super::Node::register) refused.
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
