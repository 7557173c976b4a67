//! The job API's one object, [`World`]: its routes and transports, the
//! progress pass and the one wait loop, and the operations — sends,
//! one-sided get and put, registration, requests, the barrier and the
//! blocking conveniences built on them. Its parts own the rest: the hub
//! ([`super::hub`]: handlers, requests, barrier arrivals, failures), the
//! region table ([`crate::regions`]), the events and the outbox
//! ([`super::events`]), the one-line reports ([`super::report`]).
//!
//! # Safety
//!
//! Zero-copy operations hand transports [`RawBuf`]s naming memory the job
//! API keeps valid until the operation completes: registered regions
//! (borrowed for `'m`, pinned while in use), owned buffers kept in the
//! request, caller slices of a blocking call that waits for completion (or
//! cancels the operation before returning), or — `isend_raw`,
//! `register_raw` — caller memory under the caller's `unsafe` promise.
#![allow(unsafe_code)]

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use btl_core::barrier::{BarrierRepr, Schedule};
use btl_core::rma::RmaStatus;

use super::events::{deregister, register_raw, Consumer, Event, Flow, Outbox, PollCx, User};
use super::hub::Hub;
use super::report::Report;
use super::{
    Builder, Choice, Limits, PayloadLocation, RegionKey, Request, Route, WorldError, MAX_USER_TAG,
};
use crate::ops::{OpError, PostError, Posted, QueueLimits, RawBuf, RawParts};
use crate::progress::{Idle, Waiter, CLOCK_EVERY};
use crate::regions::Regions;
use crate::sm::Sm;
use crate::tcp::Tcp;
use crate::wireup::{DynWireup, Identity};

/// Messages up to this size are copied by the blocking sends (one copy
/// into a fragment or the socket is cheaper than tracking a request);
/// larger ones travel without a copy.
const COPY_LIMIT: usize = 32 << 10;
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
    _mem: PhantomData<&'m mut [u8]>,
}

/// What a world starts with: who we are, who is reached how, the
/// transports started (by `init.rs`'s start-up).
pub(super) struct Started {
    pub(super) id: Identity,
    pub(super) wireup: DynWireup,
    pub(super) nodes: usize,
    /// Global ranks of our node, by local rank.
    pub(super) local: Vec<u32>,
    pub(super) route: Vec<Route>,
    pub(super) sm: Option<Sm>,
    pub(super) tcp: Option<Tcp>,
    pub(super) timeout: Duration,
    pub(super) oversubscribed: bool,
    pub(super) choice: Choice,
    /// The tcp component's `eager_limit` and `max_send_size`.
    pub(super) tcp_sizes: (u32, u32),
}

impl fmt::Debug for World<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("World")
            .field("id", &self.id)
            .field("nodes", &self.nodes)
            .field("local", &self.hub.local())
            .finish_non_exhaustive()
    }
}

impl<'m> World<'m> {
    /// The world made of `s`.
    pub(super) fn start(s: Started) -> Self {
        let poll_pause = s.sm.as_ref().map_or(0, |sm| sm.params().poll_pause);
        World {
            hub: Hub::new(s.id.rank, s.local),
            id: s.id,
            _wireup: s.wireup,
            nodes: s.nodes,
            route: s.route,
            regions: {
                let mut r = Regions::new();
                if s.sm.is_some() {
                    // Peers on the node read our regions by single copy as our
                    // region table publishes them (`Sm::apply_unpins`).
                    r.track_changes();
                }
                r
            },
            sm: s.sm,
            tcp: s.tcp,
            timeout: s.timeout,
            oversubscribed: s.oversubscribed,
            choice: s.choice,
            tcp_sizes: s.tcp_sizes,
            idle_passes: 0,
            passes: 0,
            lane_streak: 0,
            poll_pause,
            _mem: PhantomData,
        }
    }

    /// Joins the job through the wire-up source the environment names
    /// (see [`crate::wireup`]), with parameters from the environment.
    pub fn init(choice: Choice) -> Result<Self, WorldError> {
        Builder::new().transports(choice).init()
    }

    /// Sets the bounds of what may wait in user space for one peer, per
    /// transport (defaults: [`crate::sm::DEFAULT_QUEUE_LIMITS`], and the
    /// `tcp` parameters `queue_bytes` / `queue_messages`).
    pub fn set_queue_limits(&mut self, sm: Option<QueueLimits>, tcp: Option<QueueLimits>) {
        if let (Some(s), Some(l)) = (self.sm.as_mut(), sm) {
            s.set_queue_limits(l);
        }
        if let (Some(t), Some(l)) = (self.tcp.as_mut(), tcp) {
            t.set_queue_limits(l);
        }
    }

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
        self.hub.local()
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
        self.hub.set_handler(tag, Some(Box::new(handler)));
        Ok(())
    }

    /// Removes the handler of `tag`: its messages go to `poll` again.
    pub fn off(&mut self, tag: u8) {
        self.hub.set_handler(tag, None);
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
        if self.hub.has_to_self() {
            n += self.hub.deliver_to_self(&mut self.regions, user);
        }
        if self.regions.has_changes() {
            // Regions the callbacks of this pass registered or
            // deregistered: published or withdrawn before it returns (and
            // before the replies below carry their keys).
            if let Some(sm) = &mut self.sm {
                sm.apply_unpins(&mut self.regions);
            }
        }
        if !self.hub.outbox_is_empty() {
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
            && !self.hub.has_to_self()
            && self.hub.outbox_is_empty()
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

    /// Posts what handlers and callbacks left in the outbox (in order; a
    /// full queue keeps the rest for the next pass).
    fn post_outbox(&mut self) -> usize {
        let mut out = self.hub.take_outbox();
        let mut n = 0;
        while let Some((peer, tag, data)) = out.front() {
            match self.isend(peer, tag, data) {
                Err(WorldError::WouldBlock { .. }) => break,
                Err(e) => log::warn!("reply to rank {peer} with tag {tag} dropped: {e}"),
                Ok(_) => n += 1,
            }
            out.pop_front();
        }
        // Replies queued by the handlers of this very loop come after.
        out.append(self.hub.take_outbox());
        self.hub.put_outbox(out);
        n
    }

    /// Peers that failed so far, with the reason.
    pub fn failed_peers(&self) -> Vec<(u32, String)> {
        self.hub.failed().to_vec()
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
                    .failed()
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

    fn check_tag(tag: u8) -> Result<(), WorldError> {
        if tag > MAX_USER_TAG {
            Err(WorldError::ReservedTag { tag })
        } else {
            Ok(())
        }
    }

    /// Sends `data` to rank `peer` with `tag`, copying: `data` may be
    /// reused when this returns, and the send never waits for the
    /// receiver. Messages to one peer arrive in the order sent. Refused
    /// with [`WorldError::WouldBlock`] when the peer's queue is full (call
    /// [`Self::poll`] and retry, or use the blocking [`Self::send`]).
    pub fn isend(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<Request, WorldError> {
        self.isendv(peer, tag, &[data])
    }

    /// [`Self::isend`] of the concatenation of `parts`: one message.
    #[inline]
    pub fn isendv(&mut self, peer: u32, tag: u8, parts: &[&[u8]]) -> Result<Request, WorldError> {
        if self.try_send_boxed(peer, tag, parts) {
            return Ok(Request::COMPLETE);
        }
        Self::check_tag(tag)?;
        let r = match self.route_of(peer)? {
            Route::Me => {
                self.hub.send_to_self(tag, parts.concat());
                Ok(())
            }
            Route::Sm(l) => match self.sm.as_mut() {
                Some(sm) => sm.isend(l, tag, parts),
                None => Err(PostError::InvalidPeer),
            },
            Route::Tcp => match self.tcp.as_mut() {
                Some(t) => t.isend(peer, tag, parts),
                None => Err(PostError::InvalidPeer),
            },
            Route::Unreachable => Err(PostError::InvalidPeer),
        };
        r.map(|()| Request::COMPLETE).map_err(|e| match e {
            PostError::ReservedTag => WorldError::ReservedTag { tag },
            e => self.hub.post_error(peer, e),
        })
    }

    /// The fast path of [`Self::isendv`] (and of the C ABI's `btl_sendi`):
    /// a small message to a peer of this node straight into its
    /// shared-memory fast box. True when sent (as `isendv` would have, completed);
    /// false when nothing happened — another transport, a reserved tag, no
    /// box or no room, messages queued before it — and `isendv` must
    /// decide. Inline: the caller's pieces' count is known there.
    #[inline(always)]
    pub fn try_send_boxed(&mut self, peer: u32, tag: u8, parts: &[&[u8]]) -> bool {
        match (self.route.get(peer as usize), self.sm.as_mut()) {
            (Some(&Route::Sm(l)), Some(sm)) if tag <= MAX_USER_TAG => {
                sm.try_send_boxed(l, tag, parts)
            }
            _ => false,
        }
    }

    /// Sends `buf` without copying it: the transports read it while it
    /// travels (single copy by the receiver, writes straight from it); the
    /// request owns it until it completes.
    pub fn isend_owned<B: AsRef<[u8]> + Send + 'static>(
        &mut self,
        peer: u32,
        tag: u8,
        buf: B,
    ) -> Result<Request, WorldError> {
        let keep: Box<dyn AsRef<[u8]> + Send> = Box::new(buf);
        let raw = RawBuf::new((*keep).as_ref());
        // SAFETY: `keep` owns the bytes (boxed, so `raw` stays valid when
        // the box moves) and is stored in the request until it completes;
        // if the post completes or fails at once it is dropped after.
        let req = unsafe { self.post_send(peer, tag, RawParts::one(raw)) }?;
        self.hub.reqs_mut().keep(req.0, keep);
        Ok(req)
    }

    /// Sends the concatenation of `parts` without copying large messages:
    /// the transports read the memory while the message travels.
    ///
    /// # Safety
    ///
    /// The memory of `parts` must stay valid and unchanged until the
    /// request completes (reported by `poll`, `test` or `wait`).
    pub unsafe fn isend_raw(
        &mut self,
        peer: u32,
        tag: u8,
        parts: &[&[u8]],
    ) -> Result<Request, WorldError> {
        // SAFETY: the caller's promise.
        unsafe { self.post_send(peer, tag, RawParts::new(parts)) }
    }

    /// # Safety
    ///
    /// As [`Self::isend_raw`].
    unsafe fn post_send(
        &mut self,
        peer: u32,
        tag: u8,
        parts: RawParts,
    ) -> Result<Request, WorldError> {
        Self::check_tag(tag)?;
        let route = self.route_of(peer)?;
        let op = self.hub.reqs_mut().insert(None, route);
        let r = match route {
            Route::Me => {
                let mut slices = Vec::new();
                // SAFETY: the caller's promise; copied now.
                unsafe { parts.slices(&mut slices) };
                self.hub.send_to_self(tag, slices.concat());
                Ok(Posted::Done)
            }
            Route::Sm(l) => match self.sm.as_mut() {
                // SAFETY: the caller's promise, passed on.
                Some(sm) => unsafe { sm.isend_raw(l, tag, parts, op) },
                None => Err(PostError::InvalidPeer),
            },
            Route::Tcp => match self.tcp.as_mut() {
                // SAFETY: the caller's promise, passed on.
                Some(t) => unsafe { t.isend_raw(peer, tag, parts, op) },
                None => Err(PostError::InvalidPeer),
            },
            Route::Unreachable => Err(PostError::InvalidPeer),
        };
        self.posted(op, peer, r)
    }

    /// Turns a transport's answer to a post into a request.
    fn posted(
        &mut self,
        op: u64,
        peer: u32,
        r: Result<Posted, PostError>,
    ) -> Result<Request, WorldError> {
        match r {
            Ok(Posted::Pending) => Ok(Request(op)),
            Ok(Posted::Done) => {
                self.hub.reqs_mut().discard(op, &mut self.regions);
                Ok(Request::COMPLETE)
            }
            Err(e) => {
                self.hub.reqs_mut().discard(op, &mut self.regions);
                Err(self.hub.post_error(peer, e))
            }
        }
    }

    /// Registers memory the caller owns: peers may get from and put into
    /// it through the returned key (send it to them), and our own `iput`
    /// / `iget` use it as their local side. It stays borrowed by the world
    /// (for `'m`); [`Self::region`] / [`Self::region_mut`] reach it.
    pub fn register(&mut self, mem: &'m mut [u8]) -> RegionKey {
        let len = mem.len() as u64;
        // SAFETY: `mem` is borrowed mutably for 'm, which outlives the
        // world: nothing else touches it until the world is gone or the
        // region is removed.
        let id = unsafe { self.regions.insert(RawBuf::new_mut(mem)) };
        self.publish_regions();
        self.key(id, len)
    }

    /// Registers a buffer the world keeps (returned by [`Self::deregister`]).
    pub fn register_owned(&mut self, buf: Box<[u8]>) -> RegionKey {
        let len = buf.len() as u64;
        let id = self.regions.insert_owned(buf);
        self.publish_regions();
        self.key(id, len)
    }

    /// Registers `len` bytes at `ptr`.
    ///
    /// # Safety
    ///
    /// The memory must be valid for reads and writes, and not used by the
    /// caller while operations (ours or peers') may touch it, until it is
    /// deregistered and the world is done with it.
    pub unsafe fn register_raw(
        &mut self,
        ptr: *mut u8,
        len: usize,
    ) -> Result<RegionKey, WorldError> {
        // SAFETY: the caller's promise.
        let key = unsafe { register_raw(&mut self.regions, self.id.rank, ptr, len) };
        self.publish_regions();
        key
    }

    /// Publishes the regions just added, or withdraws those just removed,
    /// in the shared-memory transport's region table (peers on the node
    /// read them without asking): at once, so that a key sent next finds
    /// its region published, and a deregistration returns only once peers
    /// no longer find it. (Inside an event callback, through [`PollCx`],
    /// the table follows when the pass goes on.)
    fn publish_regions(&mut self) {
        if let Some(sm) = &mut self.sm {
            sm.apply_unpins(&mut self.regions);
        }
    }

    fn key(&self, id: u32, len: u64) -> RegionKey {
        RegionKey {
            rank: self.id.rank,
            id,
            len,
        }
    }

    /// Removes one of our regions: later requests naming it are refused.
    /// Refused while operations of ours use it or a peer's get is answered
    /// from it (progress and retry); hands back an owned buffer.
    pub fn deregister(&mut self, key: &RegionKey) -> Result<Option<Box<[u8]>>, WorldError> {
        let r = deregister(&mut self.regions, self.id.rank, key);
        self.publish_regions();
        r
    }

    /// The contents of one of our regions.
    pub fn region(&self, key: &RegionKey) -> Option<&[u8]> {
        (key.rank == self.id.rank).then_some(())?;
        self.regions.get(key.id)
    }

    /// The contents of one of our regions, writable.
    pub fn region_mut(&mut self, key: &RegionKey) -> Option<&mut [u8]> {
        (key.rank == self.id.rank).then_some(())?;
        self.regions.get_mut(key.id)
    }

    /// Writes `len` bytes at `local_off` of our region `local` to
    /// `remote_off` of the region `remote` (of any rank). The target's
    /// refusal (unknown region, range outside it) is the request's status.
    pub fn iput(
        &mut self,
        local: &RegionKey,
        local_off: u64,
        remote: &RegionKey,
        remote_off: u64,
        len: u64,
    ) -> Result<Request, WorldError> {
        self.post_local_rma(true, local, local_off, remote, remote_off, len)
    }

    /// Reads `len` bytes at `remote_off` of the region `remote` (of any
    /// rank) into `local_off` of our region `local`. The target's refusal
    /// is the request's status.
    pub fn iget(
        &mut self,
        local: &RegionKey,
        local_off: u64,
        remote: &RegionKey,
        remote_off: u64,
        len: u64,
    ) -> Result<Request, WorldError> {
        self.post_local_rma(false, local, local_off, remote, remote_off, len)
    }

    /// `iput` (`put`) or `iget` with our registered memory as the local
    /// side.
    fn post_local_rma(
        &mut self,
        put: bool,
        local: &RegionKey,
        local_off: u64,
        remote: &RegionKey,
        remote_off: u64,
        len: u64,
    ) -> Result<Request, WorldError> {
        let mem = self
            .regions
            .local_range(self.id.rank, local, local_off, len)
            .map_err(|status| WorldError::BadLocal { status })?;
        self.regions.pin(local.id);
        // SAFETY: `mem` is inside a registered region, pinned (it cannot be
        // deregistered) until the request completes.
        unsafe { self.post_rma(put, mem, Some(local.id), remote, remote_off) }
    }

    /// # Safety
    ///
    /// `mem` must stay valid (and, for a get, unused otherwise) until the
    /// request completes or is cancelled.
    unsafe fn post_rma(
        &mut self,
        put: bool,
        mem: RawBuf,
        pin: Option<u32>,
        remote: &RegionKey,
        remote_off: u64,
    ) -> Result<Request, WorldError> {
        let route = match self.route_of(remote.rank) {
            Ok(r) => r,
            Err(e) => {
                if let Some(id) = pin {
                    self.regions.unpin(id);
                }
                return Err(e);
            }
        };
        let op = self.hub.reqs_mut().insert(pin, route);
        let r = match route {
            Route::Me => {
                // SAFETY: the caller's promise; the copy is done when this
                // returns.
                let status = unsafe { self.regions.copy_local(put, mem, remote.id, remote_off) }
                    .map_err(OpError::Refused);
                let mut none = None::<User<'_>>;
                self.hub.done(op, status, &mut self.regions, &mut none);
                return Ok(Request(op));
            }
            Route::Sm(l) => match self.sm.as_mut() {
                // SAFETY: the caller's promise, passed on.
                Some(sm) => unsafe {
                    if put {
                        sm.iput(l, remote.id, remote_off, mem, op)
                    } else {
                        sm.iget(l, remote.id, remote_off, mem, op)
                    }
                },
                None => Err(PostError::InvalidPeer),
            },
            Route::Tcp => match self.tcp.as_mut() {
                // SAFETY: the caller's promise, passed on.
                Some(t) => unsafe {
                    if put {
                        t.iput(remote.rank, remote.id, remote_off, mem, op)
                    } else {
                        t.iget(remote.rank, remote.id, remote_off, mem, op)
                    }
                },
                None => Err(PostError::InvalidPeer),
            },
            Route::Unreachable => Err(PostError::InvalidPeer),
        };
        self.posted(op, remote.rank, r)
    }

    /// The request's outcome if it completed (and forgets it), `None` if
    /// it has not. Progresses nothing: call [`Self::progress`] or
    /// [`Self::poll`] in between.
    pub fn test(&mut self, req: Request) -> Result<Option<Result<(), WorldError>>, WorldError> {
        if req.is_complete() {
            return Ok(Some(Ok(())));
        }
        let r = self.hub.reqs_mut().take_result(req.0)?;
        Ok(r.map(|result| result.map_err(|e| self.hub.error(e))))
    }

    /// Waits until the request completes (driving every transport); its
    /// failure is the error. On a timeout the request is cancelled.
    pub fn wait(&mut self, req: Request) -> Result<(), WorldError> {
        if req.is_complete() {
            return Ok(());
        }
        let id = req.0;
        if !self.hub.reqs().contains(id) {
            return Err(WorldError::UnknownRequest { request: id });
        }
        let waited = self.wait_loop(
            "a request to complete",
            &mut |_, _| false,
            &mut None,
            &mut |w| w.hub.reqs().is_settled(id),
        );
        if let Err(e) = waited {
            self.cancel(req);
            return Err(e);
        }
        match self.test(req)? {
            Some(r) => r,
            None => Err(WorldError::UnknownRequest { request: id }),
        }
    }

    /// Gives up on a request: its queued work is dropped and no completion
    /// is reported. Bytes already handed to a transport may still arrive.
    /// A large message the receiver may still be reading keeps its owned
    /// buffer (`isend_owned`) until the receiver is done with it.
    pub fn cancel(&mut self, req: Request) {
        let (sm, tcp) = (&mut self.sm, &mut self.tcp);
        self.hub
            .reqs_mut()
            .cancel(req.0, &mut self.regions, |route| match route {
                Route::Sm(_) => sm.as_mut().is_some_and(|sm| sm.cancel(req.0)),
                Route::Tcp => {
                    if let Some(t) = tcp.as_mut() {
                        t.cancel(req.0);
                    }
                    false
                }
                Route::Me | Route::Unreachable => false,
            });
    }

    /// Waits for a request that reads or writes caller memory of a
    /// blocking call: on any error it is cancelled before returning, so
    /// the memory is never touched by us afterwards.
    fn finish_borrowed(&mut self, req: Result<Request, WorldError>) -> Result<(), WorldError> {
        let req = req?;
        self.wait(req)
    }

    /// Posts with `post` until the peer's queue takes it (progressing
    /// everything meanwhile).
    fn retry_would_block(
        &mut self,
        peer: u32,
        mut post: impl FnMut(&mut Self) -> Result<Request, WorldError>,
    ) -> Result<Request, WorldError> {
        match post(self) {
            Err(WorldError::WouldBlock { .. }) => {}
            other => return other,
        }
        let mut result = None;
        self.wait_loop(
            "room in a peer's send queue",
            &mut |_, p| p == peer,
            &mut None,
            &mut |w| match post(w) {
                Err(WorldError::WouldBlock { .. }) => false,
                other => {
                    result = Some(other);
                    true
                }
            },
        )?;
        result.unwrap_or(Err(WorldError::WouldBlock { peer }))
    }

    /// Sends `data` to rank `peer` with `tag`; returns when `data` may be
    /// reused (large messages go without a copy: this waits until they
    /// have). Waits for room when the peer's queue is full.
    pub fn send(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), WorldError> {
        self.sendv(peer, tag, &[data])
    }

    /// [`Self::send`] of the concatenation of `parts`.
    pub fn sendv(&mut self, peer: u32, tag: u8, parts: &[&[u8]]) -> Result<(), WorldError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len <= COPY_LIMIT {
            // Small: copied at once (no request to track).
            return self
                .retry_would_block(peer, |w| w.isendv(peer, tag, parts))
                .map(|_| ());
        }
        let req = self.retry_would_block(peer, |w| {
            // SAFETY: `parts` outlives this call, which waits for the
            // request to complete or cancels it.
            unsafe { w.post_send(peer, tag, RawParts::new(parts)) }
        });
        self.finish_borrowed(req)
    }

    /// Sends `data` to rank `peer` with `tag` `count` times, all in flight
    /// together (as a window of `MPI_Isend`s of one buffer): returns when
    /// every one completed and `data` may be reused. On an error the sends
    /// still outstanding are cancelled before it returns.
    pub fn send_window(
        &mut self,
        peer: u32,
        tag: u8,
        data: &[u8],
        count: u64,
    ) -> Result<(), WorldError> {
        let mut reqs = Vec::with_capacity(usize::try_from(count).unwrap_or(0).min(1 << 16));
        let mut result = Ok(());
        for _ in 0..count {
            let req = self.retry_would_block(peer, |w| {
                // SAFETY: `data` outlives this call, which waits for every
                // request or cancels it (below).
                unsafe { w.post_send(peer, tag, RawParts::new(&[data])) }
            });
            match req {
                Ok(r) => reqs.push(r),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let mut reqs = reqs.into_iter();
        if result.is_ok() {
            for r in reqs.by_ref() {
                // `wait` cancels its request on an error.
                if let Err(e) = self.wait(r) {
                    result = Err(e);
                    break;
                }
            }
        }
        for r in reqs {
            self.cancel(r);
        }
        result
    }

    /// Writes `src` at `offset` of the region `key` (of any rank):
    /// `Ok(Err(status))` when the target refused it.
    pub fn put(
        &mut self,
        key: &RegionKey,
        offset: u64,
        src: &[u8],
    ) -> Result<Result<(), RmaStatus>, WorldError> {
        let mem = RawBuf::new(src);
        let req = self.retry_would_block(key.rank, |w| {
            // SAFETY: `src` outlives this call, which waits for the request
            // or cancels it.
            unsafe { w.post_rma(true, mem, None, key, offset) }
        });
        refusal(self.finish_borrowed(req))
    }

    /// Reads `dst.len()` bytes at `offset` of the region `key` (of any
    /// rank): `Ok(Err(status))` when the target refused it.
    pub fn get(
        &mut self,
        key: &RegionKey,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<Result<(), RmaStatus>, WorldError> {
        let mem = RawBuf::new_mut(dst);
        let req = self.retry_would_block(key.rank, |w| {
            // SAFETY: `dst` is borrowed mutably for this call, which waits
            // for the request or cancels it.
            unsafe { w.post_rma(false, mem, None, key, offset) }
        });
        refusal(self.finish_borrowed(req))
    }

    /// Waits until every rank has called `barrier` as often. The ranks
    /// tell each other by the schedule of [`btl_core::barrier`] (over
    /// shared memory and TCP alike, on the barrier tag; the bare-metal node
    /// speaks the TCP one): up to four ranks each tells every other, above
    /// in `ceil(log2 n)` rounds of one message each (dissemination), so a
    /// barrier opens about `log2 n` connections per rank, not `n - 1`.
    ///
    /// A peer that fails after its message of a round reached us does not
    /// stop the barrier; one that fails before does, with an error naming
    /// it — and (dissemination) every other rank is told, so theirs end
    /// with the same error instead of a timeout. With
    /// [`Choice::SmLocal`] it is a barrier of the ranks of our node (the
    /// ranks this world reaches).
    pub fn barrier(&mut self) -> Result<(), WorldError> {
        let epoch = self.hub.barriers_mut().begin();
        let me = self.id.rank;
        let members: Vec<u32> = (0..self.id.size)
            .filter(|&p| p == me || self.reachable(p))
            .collect();
        let mine = members.iter().position(|&p| p == me).unwrap_or(0);
        // `mine < members.len()`: we are a member.
        let Some(s) = Schedule::new(members.len() as u32, mine as u32) else {
            return Ok(());
        };
        let result = self.barrier_rounds(epoch, &members, s);
        let told = self.hub.barriers_mut().end(epoch);
        if let (Err(WorldError::PeerFailed { peer, .. }), Schedule::Dissemination { .. }, false) =
            (&result, s, told)
        {
            let msg = BarrierRepr::Abandoned {
                epoch,
                failed: *peer,
            };
            for &p in members.iter().filter(|&&p| p != me && p != *peer) {
                // Best effort: a rank we cannot tell ends by its own
                // liveness checks or BTL_TIMEOUT.
                let _ = self.send_barrier(p, msg);
            }
        }
        result
    }

    fn barrier_rounds(
        &mut self,
        epoch: u64,
        members: &[u32],
        s: Schedule,
    ) -> Result<(), WorldError> {
        let arrived = |w: &World<'_>, p: u32| w.hub.barriers().arrived(epoch, p);
        for round in 0..s.rounds() {
            for i in s.sends(round) {
                self.send_barrier(members[i as usize], BarrierRepr::Arrived { epoch })?;
            }
            let expect: Vec<u32> = s.expects(round).map(|i| members[i as usize]).collect();
            self.wait_loop(
                "the other ranks at a barrier",
                &mut |w, p| expect.contains(&p) && !arrived(w, p),
                &mut None,
                &mut |w| {
                    w.hub.barriers().abandoned(epoch).is_some()
                        || expect.iter().all(|&p| arrived(w, p))
                },
            )?;
            if let Some((peer, by)) = self.hub.barriers().abandoned(epoch) {
                return Err(WorldError::PeerFailed {
                    peer,
                    why: format!("rank {by} saw it fail before it reached barrier {epoch}"),
                });
            }
        }
        Ok(())
    }

    /// Sends barrier message `msg` to `p` by its route.
    fn send_barrier(&mut self, p: u32, msg: BarrierRepr) -> Result<(), WorldError> {
        let r = match self.route_of(p)? {
            Route::Tcp => match self.tcp.as_mut() {
                Some(t) => t.send_barrier(p, msg),
                None => Err(PostError::InvalidPeer),
            },
            Route::Sm(l) => match self.sm.as_mut() {
                Some(sm) => sm.send_barrier(l, msg),
                None => Err(PostError::InvalidPeer),
            },
            Route::Me | Route::Unreachable => Ok(()),
        };
        r.map_err(|e| self.hub.post_error(p, e))
    }

    /// Waits until everything sent has left (and, over shared memory, been
    /// acknowledged), and every operation of ours is answered.
    pub fn flush(&mut self) -> Result<(), WorldError> {
        self.wait_loop(
            "our messages to leave",
            &mut |_, _| false,
            &mut None,
            &mut |w| {
                w.hub.outbox_is_empty()
                    && w.sm.as_mut().is_none_or(|s| s.is_flushed())
                    && w.tcp.as_ref().is_none_or(|t| t.is_flushed())
            },
        )
    }

    /// One line for people: what moves the bytes.
    pub fn describe(&self) -> String {
        self.report().describe()
    }

    /// `"sm"`, `"tcp"` or `"sm+tcp"`: what carries this rank's traffic.
    pub fn transport_name(&self) -> &'static str {
        match (self.sm.is_some(), self.tcp.is_some(), self.choice) {
            (_, _, Choice::Tcp) | (false, true, _) => "tcp",
            (true, true, _) => "sm+tcp",
            _ => "sm",
        }
    }

    /// One line for the stress summary: nodes, peers per transport,
    /// counters.
    pub fn summary(&self) -> String {
        self.report().summary()
    }

    /// The view of the world its reports read.
    fn report(&self) -> Report<'_> {
        Report {
            size: self.id.size,
            nodes: self.nodes,
            local: self.hub.local().len(),
            route: &self.route,
            sm: self.sm.as_ref(),
            tcp: self.tcp.as_ref(),
        }
    }
}

/// A blocking get/put's result: the target's refusal is `Ok(Err(status))`.
fn refusal(r: Result<(), WorldError>) -> Result<Result<(), RmaStatus>, WorldError> {
    match r {
        Ok(()) => Ok(Ok(())),
        Err(WorldError::Refused { status }) => Ok(Err(status)),
        Err(e) => Err(e),
    }
}
