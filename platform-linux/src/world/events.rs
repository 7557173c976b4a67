//! What a progress pass hands out and what its callbacks get: the events
//! ([`Event`]), the replies a callback or handler queues ([`Outbox`],
//! posted when it returns), a callback's context ([`PollCx`]: the outbox
//! and the region table, lent back between the transports' uses of it),
//! message handlers, and the consumer bound the pass is generic over.
//!
//! # Safety
//!
//! [`PollCx::register_raw`] passes its caller's promise on to the region
//! table ([`Regions::insert_raw`]).
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::fmt;

use btl_core::rma::{RegionKey, RmaStatus};

use super::{Request, WorldError};
use crate::regions::{DeregisterError, Regions};

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
        /// [`World::payload_location`](super::World::payload_location)); a message larger than one
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

/// Whether [`World::drive`](super::World::drive) goes on.
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

    /// The oldest queued message (peer, tag, bytes), left queued.
    pub(super) fn front(&self) -> Option<(u32, u8, &[u8])> {
        let &(peer, tag, at, len) = self.items.front()?;
        Some((peer, tag, &self.buf[at..at + len]))
    }

    /// Drops the oldest queued message (the bytes go once none is left).
    pub(super) fn pop_front(&mut self) {
        self.items.pop_front();
        if self.items.is_empty() {
            self.buf.clear();
        }
    }

    /// Queues the messages of `newer` after ours, in order.
    pub(super) fn append(&mut self, newer: Outbox) {
        for (peer, tag, at, len) in newer.items {
            self.sendv(peer, tag, &[&newer.buf[at..at + len]]);
        }
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

/// What a [`World::poll_with`](super::World::poll_with) callback may do besides reading its event:
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
/// The blocking calls hand one in as a trait object; [`World::poll_with`](super::World::poll_with)
/// hands its closure in as a type parameter, so that the whole delivery
/// (the transport's event, the hub, the consumer) compiles into one
/// function on the path every message takes.
pub(super) type User<'u> = &'u mut dyn FnMut(&mut PollCx<'_>, Event<'_>) -> bool;

/// What [`User`] is, as a bound.
pub(super) trait Consumer: FnMut(&mut PollCx<'_>, Event<'_>) -> bool {}
impl<F: FnMut(&mut PollCx<'_>, Event<'_>) -> bool + ?Sized> Consumer for F {}

/// Calls the consumer with the outbox and the region table.
#[inline(always)]
pub(super) fn call<U: Consumer + ?Sized>(
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

impl PollCx<'_> {
    /// [`World::register_raw`](super::World::register_raw) from inside a callback.
    ///
    /// # Safety
    ///
    /// As [`World::register_raw`](super::World::register_raw).
    pub unsafe fn register_raw(
        &mut self,
        ptr: *mut u8,
        len: usize,
    ) -> Result<RegionKey, WorldError> {
        // SAFETY: the caller's promise.
        unsafe { register_raw(self.regions, self.me, ptr, len) }
    }

    /// [`World::deregister`](super::World::deregister) from inside a callback.
    pub fn deregister(&mut self, key: &RegionKey) -> Result<Option<Box<[u8]>>, WorldError> {
        deregister(self.regions, self.me, key)
    }
}

/// Registers `len` bytes at `ptr` in `regions` as a region of rank `me`.
///
/// # Safety
///
/// As [`World::register_raw`](super::World::register_raw).
pub(super) unsafe fn register_raw(
    regions: &mut Regions,
    me: u32,
    ptr: *mut u8,
    len: usize,
) -> Result<RegionKey, WorldError> {
    // SAFETY: the caller's promise.
    unsafe { regions.insert_raw(me, ptr, len) }.ok_or(WorldError::InvalidArgument(
        "null pointer with a non-zero length",
    ))
}

/// Removes rank `me`'s region `key` from `regions`.
pub(super) fn deregister(
    regions: &mut Regions,
    me: u32,
    key: &RegionKey,
) -> Result<Option<Box<[u8]>>, WorldError> {
    regions.remove_key(me, key).map_err(|e| match e {
        DeregisterError::Unknown => WorldError::BadLocal {
            status: RmaStatus::UnknownRegion,
        },
        DeregisterError::Busy { ops } => WorldError::RegionBusy { ops },
    })
}
