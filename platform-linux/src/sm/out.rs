//! A peer's queue of outgoing work ([`PeerOut`]) and its items ([`Out`]):
//! copied fragments, fragments read from the poster's memory, streams of
//! fragments ([`Stream`]: pipelined messages, put and get data) and
//! single-copy rendezvous. The send path ([`super::send`]) fills it and
//! drains it as fragments free up; the one-sided operations
//! ([`super::rma`]) stream their data through it.

use std::collections::VecDeque;
use std::time::Instant;

use super::bulk::Probe;
use crate::ops::{OpId, RawBuf, RawParts};

/// What a stream's fragments carry.
#[derive(Clone, Copy, Debug)]
pub(super) enum StreamKind {
    /// A user message in pipelined chunks.
    Message {
        /// Its tag.
        tag: u8,
    },
    /// A put's data.
    PutData {
        /// Our request.
        req: u64,
        /// The target's region.
        id: u32,
        /// Where in it.
        offset: u64,
    },
    /// A get's data we serve (from our region).
    GetData {
        /// The requester's request.
        req: u64,
    },
}

/// Memory a stream reads, in fragments.
#[derive(Debug)]
pub(super) struct Stream {
    pub(super) kind: StreamKind,
    pub(super) parts: RawParts,
    /// A staged copy `parts` points into (copy semantics), kept alive here
    /// until the stream is done.
    pub(super) _owned: Option<Vec<u8>>,
    pub(super) sent: usize,
    pub(super) op: Option<OpId>,
    pub(super) probe: Probe,
    /// Our region this stream reads (unpinned when done).
    pub(super) pinned: Option<u32>,
}

/// Outgoing work for one peer, in order.
#[derive(Debug)]
pub(super) enum Out {
    /// One fragment's worth, copied.
    Copy { tag: u8, data: Vec<u8> },
    /// One fragment's worth read from the poster's memory when it leaves
    /// ([`Sm::isend_raw`] of a small message behind others): no staging
    /// copy, completes `op`.
    Raw { tag: u8, parts: RawParts, op: OpId },
    /// Fragment after fragment.
    Stream(Stream),
    /// A single-copy rendezvous: the receiver reads `buf` from our memory.
    /// It stays at the head of the queue until acknowledged, also when its
    /// operation was cancelled after it was posted (`cancelled`): the
    /// receiver may still be reading it and, for a split message, using its
    /// landing buffer, which the next split message would write into. Its
    /// completion is reported all the same (the caller that cancelled it
    /// drops it), so an owner of the memory knows when it is free.
    Rndv {
        tag: u8,
        buf: RawBuf,
        owned: Option<Vec<u8>>,
        op: Option<OpId>,
        cookie: u64,
        pushed: Option<Instant>,
        /// Cancelled after it was posted: `buf` (the caller's memory) is no
        /// longer ours to read, so a refusal is not resent.
        cancelled: bool,
    },
}

impl Out {
    /// Bytes of ours it holds (copies; caller memory it reads is the
    /// caller's, bounded by its own means): what the queue bounds count.
    pub(super) fn len(&self) -> u64 {
        match self {
            Out::Copy { data, .. } => data.len() as u64,
            Out::Raw { .. } => 0,
            Out::Stream(s) => s._owned.as_ref().map_or(0, |o| o.len() as u64),
            Out::Rndv { owned, .. } => owned.as_ref().map_or(0, |o| o.len() as u64),
        }
    }
}

/// A peer's queue of outgoing work.
#[derive(Debug, Default)]
pub(super) struct PeerOut {
    pub(super) q: VecDeque<Out>,
    pub(super) bytes: u64,
}
