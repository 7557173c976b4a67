//! What both transports share with the job API: operation ids, caller
//! memory a transport keeps until an operation completes, the events a
//! transport reports from its progress pass, and the bounds of its queues.
//!
//! # The transport contract
//!
//! A transport never blocks and never waits for a peer. Operations are
//! *posted* (`isend`, `iput`, `iget`) and either finish at once or later;
//! a later completion is reported by the transport's progress pass as
//! [`TEvent::Done`] with the [`OpId`] the caller chose. Everything else a
//! peer causes — a message, a barrier arrival, the peer's failure — is an
//! event of the same pass. Waiting is the job API's business: one loop,
//! driving every transport ([`crate::progress`]).

use btl_core::barrier::BarrierRepr;
use btl_core::rma::RmaStatus;

/// Names an operation posted to a transport; chosen by the caller (the job
/// API uses its request ids) and echoed in [`TEvent::Done`].
pub type OpId = u64;

/// Why an operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// The peer failed (died, its connection broke, or it corrupted the
    /// protocol) before the operation completed.
    #[error("rank {peer} failed")]
    PeerFailed {
        /// The peer (the transport's numbering in a transport's event, the
        /// job's global rank from the job API).
        peer: u32,
    },
    /// The target refused a get or put (unknown region, range outside it)
    /// or could not copy.
    #[error("refused by the target: {0}")]
    Refused(RmaStatus),
    /// The peer could not handle the message (no handler, copy failed).
    #[error("the receiver could not handle the message")]
    Remote,
}

/// Where a transport hands its events: the region table (lent back, so
/// the consumer may register or deregister memory while it handles the
/// event) and the event.
pub type Sink<'s> = dyn FnMut(&mut crate::regions::Regions, TEvent<'_>) + 's;

/// An event of a transport's progress pass. Ranks are the transport's own
/// numbering (node-local for shared memory); data borrows the transport's
/// buffers and is valid during the callback only.
#[derive(Debug)]
pub enum TEvent<'a> {
    /// A message for a user tag.
    Message {
        /// The sender.
        from: u32,
        /// Its tag.
        tag: u8,
        /// Its bytes, in place (a shared-memory fragment, a TCP read
        /// buffer, or a reassembly buffer for a message that came in
        /// pieces).
        data: &'a [u8],
    },
    /// An operation posted earlier completed.
    Done {
        /// The caller's id.
        op: OpId,
        /// Its outcome.
        result: Result<(), OpError>,
    },
    /// A peer's barrier message: its arrival at a barrier, or the barrier
    /// given up for a failed rank.
    Barrier {
        /// The peer.
        from: u32,
        /// What it said.
        msg: BarrierRepr,
    },
    /// A peer was declared failed (reported once).
    PeerFailed {
        /// The peer.
        peer: u32,
        /// Why, for people.
        why: &'a str,
    },
}

/// How a post went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Posted {
    /// Done already: the bytes are copied (or sent); no event follows.
    Done,
    /// In progress: a [`TEvent::Done`] with the operation's id follows.
    Pending,
}

/// Why a transport did not accept an operation. Nothing was sent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// No such peer (or it is this rank).
    #[error("no such peer")]
    InvalidPeer,
    /// The tag is reserved for the transports.
    #[error(
        "the tag is reserved (user tags are 0..={})",
        btl_core::tags::MAX_USER_TAG
    )]
    ReservedTag,
    /// The peer has failed.
    #[error("the peer has failed")]
    PeerFailed,
    /// The peer's queue is full (see [`QueueLimits`]): progress and retry.
    #[error("the peer's send queue is full")]
    WouldBlock,
    /// Larger than the transport carries.
    #[error("larger than the {max}-byte limit")]
    TooLarge {
        /// The limit in bytes.
        max: u64,
    },
    /// The local memory of a get or put is not (inside) a registered
    /// region.
    #[error("local memory: {0}")]
    BadLocal(RmaStatus),
}

impl PostError {
    /// What every message post checks first: a user tag (not one of the
    /// transports' own) and at most `max` bytes.
    #[inline(always)]
    pub(crate) fn check_message(tag: u8, len: u64, max: u64) -> Result<(), PostError> {
        if tag > btl_core::tags::MAX_USER_TAG {
            Err(PostError::ReservedTag)
        } else if len > max {
            Err(PostError::TooLarge { max })
        } else {
            Ok(())
        }
    }
}

/// Bounds of what a transport queues for one peer in user space (messages
/// that could not leave at once: a full ring, a socket that does not
/// drain). A post beyond them is refused with [`PostError::WouldBlock`];
/// the blocking calls of the job API then progress and retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLimits {
    /// Bytes queued per peer.
    pub bytes: u64,
    /// Messages (or frames) queued per peer.
    pub messages: u32,
}

impl QueueLimits {
    /// Whether one more item of `len` bytes fits after `bytes` bytes and
    /// `messages` items already queued. An empty queue always takes one
    /// item, however large (a message larger than the byte bound must be
    /// able to leave).
    pub fn admits(&self, bytes: u64, messages: u32, len: u64) -> bool {
        messages == 0 || (messages < self.messages && bytes.saturating_add(len) <= self.bytes)
    }
}

pub use crate::rawbuf::{RawBuf, RawParts};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_limits_always_admit_one() {
        let q = QueueLimits {
            bytes: 100,
            messages: 2,
        };
        assert!(q.admits(0, 0, 1 << 30));
        assert!(q.admits(50, 1, 50));
        assert!(!q.admits(50, 1, 51));
        assert!(!q.admits(0, 2, 1));
    }
}
