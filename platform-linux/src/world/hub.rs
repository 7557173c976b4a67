//! The hub ([`Hub`]): everything the transports' events touch — the
//! message handlers, our requests ([`Requests`]), the barrier arrivals
//! ([`Barriers`]), the peers declared failed, the replies queued by
//! handlers, the messages kept while nobody listened and those to
//! ourselves. A progress pass lends it to each transport's event sink
//! together with the region table: messages go to their handler, else to
//! the consumer, else are kept; completions go to the consumer, else are
//! kept for `test` and `wait`.

use std::collections::VecDeque;

use super::barrier::Barriers;
use super::events::{call, Consumer, Event, Handler, Outbox};
use super::requests::Requests;
use super::{Request, WorldError};
use crate::ops::{OpError, PostError, TEvent};
use crate::regions::Regions;

/// Handlers, requests, barrier arrivals, failures, messages kept for
/// later.
pub(super) struct Hub<'m> {
    me: u32,
    /// Global ranks of our node, by local rank.
    local: Vec<u32>,
    handlers: Vec<Option<Handler<'m>>>,
    outbox: Outbox,
    /// Messages that arrived with nobody listening (blocking calls).
    stash: VecDeque<(u32, u8, Vec<u8>)>,
    /// Messages to ourselves, delivered by the next pass.
    to_self: VecDeque<(u8, Vec<u8>)>,
    reqs: Requests,
    barriers: Barriers,
    /// Peers (global) declared failed, with why.
    failed: Vec<(u32, String)>,
}

impl<'m> Hub<'m> {
    /// The hub of rank `me`, whose node holds the ranks `local` (global
    /// ranks by local rank).
    pub(super) fn new(me: u32, local: Vec<u32>) -> Self {
        Self {
            me,
            local,
            handlers: (0..256).map(|_| None).collect(),
            outbox: Outbox::default(),
            stash: VecDeque::new(),
            to_self: VecDeque::new(),
            reqs: Requests::default(),
            barriers: Barriers::default(),
            failed: Vec::new(),
        }
    }

    /// Global ranks of our node, by local rank.
    #[inline]
    pub(super) fn local(&self) -> &[u32] {
        &self.local
    }

    /// Sets (or, with `None`, removes) the handler of `tag`.
    pub(super) fn set_handler(&mut self, tag: u8, handler: Option<Handler<'m>>) {
        if let Some(h) = self.handlers.get_mut(usize::from(tag)) {
            *h = handler;
        }
    }

    /// Our requests.
    #[inline]
    pub(super) fn reqs(&self) -> &Requests {
        &self.reqs
    }

    /// Our requests, to post, complete or cancel.
    #[inline]
    pub(super) fn reqs_mut(&mut self) -> &mut Requests {
        &mut self.reqs
    }

    /// The barrier arrivals.
    pub(super) fn barriers(&self) -> &Barriers {
        &self.barriers
    }

    /// The barrier arrivals, to enter or end a barrier.
    pub(super) fn barriers_mut(&mut self) -> &mut Barriers {
        &mut self.barriers
    }

    /// Peers (global) declared failed so far, with why.
    pub(super) fn failed(&self) -> &[(u32, String)] {
        &self.failed
    }

    /// A transport's refusal of a post to `peer` as the job API reports
    /// it.
    #[cold]
    #[inline(never)]
    pub(super) fn post_error(&self, peer: u32, e: PostError) -> WorldError {
        match e {
            PostError::InvalidPeer => WorldError::InvalidPeer { peer },
            PostError::ReservedTag => WorldError::ReservedTag { tag: u8::MAX },
            PostError::PeerFailed => WorldError::PeerFailed {
                peer,
                why: self
                    .failed
                    .iter()
                    .find(|(p, _)| *p == peer)
                    .map(|(_, w)| w.clone())
                    .unwrap_or_else(|| "it failed or left the job".into()),
            },
            PostError::WouldBlock => WorldError::WouldBlock { peer },
            PostError::TooLarge { max } => WorldError::TooLarge { max },
            PostError::BadLocal(status) => WorldError::BadLocal { status },
        }
    }

    /// An operation's error as the job API reports it.
    pub(super) fn error(&self, e: OpError) -> WorldError {
        op_error(e, &self.failed)
    }

    /// Queues a message to ourselves for the next pass.
    #[inline]
    pub(super) fn send_to_self(&mut self, tag: u8, data: Vec<u8>) {
        self.to_self.push_back((tag, data));
    }

    /// Whether messages to ourselves wait for a pass.
    #[inline]
    pub(super) fn has_to_self(&self) -> bool {
        !self.to_self.is_empty()
    }

    /// Whether no reply waits in the outbox.
    #[inline]
    pub(super) fn outbox_is_empty(&self) -> bool {
        self.outbox.is_empty()
    }

    /// Takes the replies handlers and callbacks queued (the outbox is
    /// empty after).
    pub(super) fn take_outbox(&mut self) -> Outbox {
        std::mem::take(&mut self.outbox)
    }

    /// Puts `out` back as the outbox.
    pub(super) fn put_outbox(&mut self, out: Outbox) {
        self.outbox = out;
    }

    /// The global rank of a transport's `peer` (node-local over shared
    /// memory).
    #[inline]
    pub(super) fn global(&self, sm: bool, peer: u32) -> u32 {
        if sm {
            self.local.get(peer as usize).copied().unwrap_or(u32::MAX)
        } else {
            peer
        }
    }

    /// Delivers a message: to its handler, else to the consumer, else
    /// kept.
    #[inline(always)]
    pub(super) fn message<U: Consumer + ?Sized>(
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

    /// Request `op` completed with `result`: told to the consumer, else
    /// kept.
    pub(super) fn done<U: Consumer + ?Sized>(
        &mut self,
        op: u64,
        result: Result<(), OpError>,
        regions: &mut Regions,
        user: &mut Option<&mut U>,
    ) {
        if !self.reqs.complete(op, regions) {
            return;
        }
        if let Some(u) = user.as_mut() {
            let ev = Event::Done {
                req: Request(op),
                result: result.clone().map_err(|e| op_error(e, &self.failed)),
            };
            if call(u, &mut self.outbox, regions, self.me, ev) {
                self.reqs.forget(op);
                return;
            }
        }
        self.reqs.keep_result(op, result);
    }

    /// A transport's event (`sm`: from shared memory, whose ranks are
    /// node-local).
    #[inline(always)]
    pub(super) fn on_event<U: Consumer + ?Sized>(
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
                self.barriers.record(g, msg);
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

    /// Delivers our messages to ourselves; returns how many.
    #[inline(never)]
    pub(super) fn deliver_to_self<U: Consumer + ?Sized>(
        &mut self,
        regions: &mut Regions,
        user: &mut Option<&mut U>,
    ) -> usize {
        let mut n = 0;
        while let Some((tag, data)) = self.to_self.pop_front() {
            n += 1;
            let me = self.me;
            self.message(me, tag, &data, regions, user);
        }
        n
    }

    /// Whether [`Self::replay`] has anything to hand out.
    #[inline]
    pub(super) fn has_replay(&self) -> bool {
        !self.stash.is_empty() || self.reqs.has_completed()
    }

    /// Hands what was kept during blocking calls to a consumer that is
    /// listening now.
    #[inline(never)]
    pub(super) fn replay<U: Consumer + ?Sized>(
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
        while let Some((op, result)) = self.reqs.pop_completed() {
            n += 1;
            let ev = Event::Done {
                req: Request(op),
                result: result.map_err(|e| op_error(e, &self.failed)),
            };
            if call(u, &mut self.outbox, regions, self.me, ev) {
                self.reqs.forget(op);
            } else {
                self.reqs.unpop(op);
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
