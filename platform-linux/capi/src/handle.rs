//! The handle (`btl_t`): its state (opened, connected, gone), liveness
//! checks against stale pointers, reentrancy guard, cached peer facts, the
//! send fast path, the queue of callbacks' posts and event delivery.

use std::cell::{Cell, OnceCell, RefCell, UnsafeCell};
use std::ffi::{c_void, CString};
use std::os::raw::c_int;
use std::sync::{Arc, Mutex};

use btl_linux::world::{Event, Limits, Opened, PollCx, Request, World, WorldError};

use crate::codes::{
    BTL_DONE, BTL_ERR_ARG, BTL_ERR_FINALIZED, BTL_ERR_PEER_FAILED, BTL_ERR_RANK, BTL_ERR_STATE,
    BTL_ERR_UNREACHABLE, BTL_ERR_WOULD_BLOCK, BTL_EVENT_DONE, BTL_EVENT_MESSAGE,
    BTL_EVENT_PEER_FAILED, BTL_OK,
};
use crate::deferred::{Deferred, Ready, Side, DEFERRED_BYTES};
use crate::error::{code_of, fail, need, Fail};
use crate::iov::slice;
use crate::types::{btl_event_t, btl_iovec_t};
use crate::wireup;

const LIVE: u64 = 0x6274_6c5f_6c69_7665;
pub(crate) const DEAD: u64 = 0x6274_6c5f_6465_6164;

pub(crate) enum State {
    Opened(Box<Opened>),
    Ready(Box<World<'static>>),
    Gone,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Busy {
    No,
    /// Inside btl_progress (the event callback may run).
    Callback,
    /// Inside btl_connect (the fetch callback may run).
    Connecting,
}

#[derive(Clone, Copy)]
pub(crate) struct Peer {
    reachable: bool,
    pub(crate) limits: Limits,
}

/// A handle: one process's membership in a job. Opaque.
pub struct btl_t {
    pub(crate) magic: Cell<u64>,
    pub(crate) rank: u32,
    pub(crate) size: u32,
    /// The world; touched only while `busy` is `No` (or by btl_progress
    /// itself between callbacks).
    pub(crate) state: UnsafeCell<State>,
    pub(crate) side: RefCell<Side>,
    pub(crate) busy: Cell<Busy>,
    /// The running event callback's context (register/deregister from it).
    cx: Cell<*mut c_void>,
    peers: OnceCell<Vec<Peer>>,
    /// Our address blob (btl_open).
    pub(crate) blob: Vec<u8>,
    pub(crate) wire: Option<Arc<Mutex<wireup::Shared>>>,
}

impl std::fmt::Debug for btl_t {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("btl_t")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Where btl_progress's events go: the caller's callback and its context.
#[derive(Clone, Copy)]
pub(crate) struct EventSink {
    pub(crate) cb: unsafe extern "C" fn(*mut c_void, *const btl_event_t),
    pub(crate) ctx: *mut c_void,
}

/// Finalized handles' memory, kept so that a stale pointer is told apart
/// (BTL_ERR_FINALIZED) rather than read after free.
pub(crate) static GRAVE: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Sets `busy` back when dropped (also on a caught panic).
pub(crate) struct BusyGuard<'a>(pub(crate) &'a btl_t);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.busy.set(Busy::No);
        self.0.cx.set(std::ptr::null_mut());
    }
}

/// The handle behind `h`.
///
/// # Safety
///
/// `h` is NULL, or a pointer btl_init / btl_open returned (finalized or
/// not).
#[inline(always)]
pub(crate) unsafe fn handle<'a>(h: *const btl_t) -> Result<&'a btl_t, Fail> {
    need(h, "the handle")?;
    // SAFETY: not NULL, aligned; the caller's promise that it came from
    // btl_init/btl_open, whose memory is never freed (GRAVE).
    let h = unsafe { &*h };
    match h.magic.get() {
        LIVE => Ok(h),
        DEAD => Err(fail(BTL_ERR_FINALIZED, "the handle was finalized")),
        _ => Err(fail(BTL_ERR_ARG, "not a btl handle")),
    }
}

impl btl_t {
    pub(crate) fn new(rank: u32, size: u32, state: State) -> Self {
        Self {
            magic: Cell::new(LIVE),
            rank,
            size,
            state: UnsafeCell::new(state),
            side: RefCell::new(Side::default()),
            busy: Cell::new(Busy::No),
            cx: Cell::new(std::ptr::null_mut()),
            peers: OnceCell::new(),
            blob: Vec::new(),
            wire: None,
        }
    }

    pub(crate) fn set_peers(&self, w: &World<'_>) {
        let peers = (0..w.size())
            .map(|r| Peer {
                reachable: w.reachable(r),
                limits: w.limits(r).unwrap_or(Limits {
                    eager: 0,
                    max_send: 0,
                    max_message: 0,
                }),
            })
            .collect();
        let _ = self.peers.set(peers);
    }

    #[inline]
    pub(crate) fn not_busy(&self) -> Result<(), Fail> {
        match self.busy.get() {
            Busy::No => Ok(()),
            Busy::Callback => Err(fail(BTL_ERR_STATE, "not allowed inside an event callback")),
            Busy::Connecting => Err(fail(BTL_ERR_STATE, "not allowed during btl_connect")),
        }
    }

    /// The world, outside callbacks.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    pub(crate) fn world(&self) -> Result<&mut World<'static>, Fail> {
        self.not_busy()?;
        // SAFETY: one thread at a time calls a handle (btl.h); `busy` is
        // `No`, so no other call of ours holds a reference into `state`.
        unsafe { self.world_unchecked() }
    }

    /// The world, whoever runs.
    ///
    /// # Safety
    ///
    /// No other reference into `state` may be live.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    pub(crate) unsafe fn world_unchecked(&self) -> Result<&mut World<'static>, Fail> {
        // SAFETY: the caller's promise.
        match unsafe { &mut *self.state.get() } {
            State::Ready(w) => Ok(w),
            State::Opened(_) => Err(fail(
                BTL_ERR_STATE,
                "the handle is not connected yet (btl_connect)",
            )),
            State::Gone => Err(fail(
                BTL_ERR_STATE,
                "the handle failed to connect: finalize it",
            )),
        }
    }

    /// btl_sendi's fast path: one or two pieces (Open MPI's header and
    /// payload) into the peer's shared-memory fast box, outside callbacks
    /// and with no send deferred before it ([`World::try_send_boxed`]).
    /// True when sent; false when nothing happened, for any reason (a bad
    /// argument included), and the checked path must decide and report.
    /// The fast path checks what it relies on: no NULL base with bytes,
    /// lengths a slice can have. Callgrind, rank 0 of `ppmin 8` over Open
    /// MPI's ob1 and rsm: 464 -> 336 instructions per `btl_sendi`, the box
    /// write included (README, "What rsm's 8 B gap is made of").
    ///
    /// # Safety
    ///
    /// As btl_sendi: `iov` points to `iovcnt` pieces of readable memory
    /// (the fast path takes one or two).
    #[inline(always)]
    pub(crate) unsafe fn sendi_boxed(
        &self,
        rank: u32,
        tag: u8,
        iov: *const btl_iovec_t,
        iovcnt: usize,
    ) -> bool {
        if self.busy.get() != Busy::No
            || !(1..=2).contains(&iovcnt)
            || iov.is_null()
            || !iov.is_aligned()
        {
            return false;
        }
        // SAFETY: not NULL, aligned; the caller's promise of `iovcnt`
        // elements.
        let v = unsafe { std::slice::from_raw_parts(iov, iovcnt) };
        let bad = |p: &btl_iovec_t| (p.base.is_null() && p.len != 0) || p.len > isize::MAX as usize;
        let deferred = |s: std::cell::Ref<'_, Side>| !s.deferred.is_empty();
        if v.iter().any(bad) || self.side.try_borrow().map_or(true, deferred) {
            return false;
        }
        // SAFETY: `busy` is `No`: no call of ours holds a reference into
        // `state` (one thread at a time calls a handle, btl.h).
        let State::Ready(w) = (unsafe { &mut *self.state.get() }) else {
            return false;
        };
        // SAFETY: checked above (no NULL base with bytes, lengths within
        // isize::MAX); the caller's promise that the pieces are readable.
        let piece = |p: &btl_iovec_t| unsafe { slice(p.base.cast(), p.len) };
        // One arm per count: the box write inlines into each, compiled for
        // that many pieces.
        match v {
            [a, b] => w.try_send_boxed(rank, tag, &[piece(a), piece(b)]),
            [a] => w.try_send_boxed(rank, tag, &[piece(a)]),
            _ => false,
        }
    }

    /// The peer's cached facts, after checking it exists and is reached.
    #[inline(always)]
    pub(crate) fn peer(&self, rank: u32) -> Result<&Peer, Fail> {
        match self.peers.get().map(|p| p.get(rank as usize)) {
            Some(Some(p)) if p.reachable => Ok(p),
            _ => Err(self.bad_peer(rank)),
        }
    }

    /// Why [`Self::peer`] refused `rank`.
    #[cold]
    #[inline(never)]
    fn bad_peer(&self, rank: u32) -> Fail {
        match self.peers.get().map(|p| p.get(rank as usize)) {
            None => fail(
                BTL_ERR_STATE,
                "the handle is not connected yet (btl_connect)",
            ),
            Some(None) => fail(
                BTL_ERR_RANK,
                format!("there is no rank {rank} (size {})", self.size),
            ),
            Some(Some(_)) => fail(
                BTL_ERR_UNREACHABLE,
                format!(
                    "rank {rank} is not reached by this handle (another node; transport sm-local)"
                ),
            ),
        }
    }

    /// Whether posts must be queued rather than done now: inside a
    /// callback, or behind earlier queued ones (order per peer).
    pub(crate) fn must_defer(&self) -> bool {
        self.busy.get() == Busy::Callback || !self.side.borrow().deferred.is_empty()
    }

    /// btl_sendi inside an event callback: the copy is queued, posted when
    /// the callback returns.
    #[cold]
    pub(crate) fn defer_copy(&self, rank: u32, tag: u8, slices: &[&[u8]]) -> Result<c_int, Fail> {
        let len: usize = slices.iter().map(|p| p.len()).sum();
        let mut s = self.side.borrow_mut();
        if s.deferred_bytes + len > DEFERRED_BYTES {
            return Err(fail(
                BTL_ERR_WOULD_BLOCK,
                "callbacks queued more than 8 MiB of copied sends",
            ));
        }
        s.deferred_bytes += len;
        s.deferred.push_back(Deferred::Copy {
            peer: rank,
            tag,
            data: slices.concat(),
        });
        Ok(BTL_DONE)
    }

    /// Records a posted request (or its immediate outcome, for a deferred
    /// post that has nobody to return it to).
    pub(crate) fn track(
        &self,
        r: Result<Request, WorldError>,
        ctx: usize,
        peer: u32,
        deferred: bool,
    ) -> Result<c_int, Fail> {
        let mut s = self.side.borrow_mut();
        match r {
            Ok(req) if req.is_complete() => {
                if deferred {
                    s.ready.push_back(Ready {
                        ctx,
                        peer,
                        status: BTL_OK,
                        text: None,
                    });
                }
                Ok(BTL_DONE)
            }
            Ok(req) => {
                s.pending.insert(req.id(), (ctx, peer));
                Ok(BTL_OK)
            }
            Err(e) if deferred => {
                s.ready.push_back(Ready {
                    ctx,
                    peer,
                    status: code_of(&e),
                    text: CString::new(e.to_string().replace('\0', " ")).ok(),
                });
                Ok(BTL_OK)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// btl_progress's completions of queued posts (out of its fast path);
    /// their callbacks may queue more (bounded rounds; the rest wait for
    /// the next call). Returns the events and posts handled.
    #[cold]
    #[inline(never)]
    pub(crate) fn deliver_ready(&self, to: EventSink) -> Result<usize, Fail> {
        let mut n = 0;
        for _ in 0..4 {
            if self.side.borrow().ready.is_empty() {
                break;
            }
            let ready: Vec<Ready> = self.side.borrow_mut().ready.drain(..).collect();
            for r in ready {
                n += 1;
                let e = btl_event_t {
                    kind: BTL_EVENT_DONE,
                    rank: r.peer,
                    tag: 0,
                    status: r.status,
                    data: std::ptr::null(),
                    len: 0,
                    context: r.ctx as *mut c_void,
                    text: r.text.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                };
                // SAFETY: the caller's callback; no reference into
                // `state` is live here (a reentrant register may take one).
                unsafe { (to.cb)(to.ctx, &e) };
            }
            // SAFETY: the callbacks above have returned.
            let w = unsafe { self.world_unchecked() }?;
            n += self.drain(w);
        }
        Ok(n)
    }

    /// Posts what callbacks queued, in order; stops at a full queue.
    #[inline(never)]
    pub(crate) fn drain(&self, w: &mut World<'static>) -> usize {
        let mut n = 0;
        loop {
            let Some(op) = self.side.borrow_mut().deferred.pop_front() else {
                break;
            };
            let (r, ctx, peer) = match &op {
                Deferred::Copy { peer, tag, data } => match w.isend(*peer, *tag, data) {
                    Err(WorldError::WouldBlock { .. }) => {
                        self.side.borrow_mut().deferred.push_front(op);
                        break;
                    }
                    r => {
                        if let Err(e) = r {
                            log::warn!("a send queued by a callback to rank {peer} failed: {e}");
                        }
                        let mut s = self.side.borrow_mut();
                        s.deferred_bytes = s.deferred_bytes.saturating_sub(data.len());
                        n += 1;
                        continue;
                    }
                },
                Deferred::Send {
                    peer,
                    tag,
                    parts,
                    ctx,
                } => {
                    // SAFETY: the caller of btl_isend promised the memory
                    // stays valid until the completion event.
                    let r = unsafe { parts.with_slices(|s| w.isend_raw(*peer, *tag, s)) };
                    (r, *ctx, *peer)
                }
                Deferred::Rma {
                    put,
                    local,
                    local_off,
                    remote,
                    remote_off,
                    len,
                    ctx,
                } => {
                    let r = if *put {
                        w.iput(local, *local_off, remote, *remote_off, *len)
                    } else {
                        w.iget(local, *local_off, remote, *remote_off, *len)
                    };
                    (r, *ctx, remote.rank)
                }
            };
            if matches!(r, Err(WorldError::WouldBlock { .. })) {
                self.side.borrow_mut().deferred.push_front(op);
                break;
            }
            n += 1;
            let _ = self.track(r, ctx, peer, true);
        }
        n
    }

    /// Hands one event to the C callback. A message (the event every
    /// latency rests on) inline; the others out of line.
    #[inline(always)]
    pub(crate) fn deliver(&self, cx: Option<&mut PollCx<'_>>, to: EventSink, ev: Event<'_>) {
        if let Event::Message { from, tag, data } = ev {
            self.call_back(cx, to, &message_event(from, tag, data));
        } else {
            self.deliver_other(cx, to, ev);
        }
    }

    /// [`Self::deliver`] of a completion or a failure.
    #[inline(never)]
    fn deliver_other(&self, cx: Option<&mut PollCx<'_>>, to: EventSink, ev: Event<'_>) {
        let mut owned = None;
        let e = match ev {
            Event::Message { from, tag, data } => message_event(from, tag, data),
            Event::Done { req, result } => {
                let (uctx, peer) = self
                    .side
                    .borrow_mut()
                    .pending
                    .remove(&req.id())
                    .unwrap_or((0, u32::MAX));
                let status = match &result {
                    Ok(()) => BTL_OK,
                    Err(e) => {
                        owned = CString::new(e.to_string().replace('\0', " ")).ok();
                        code_of(e)
                    }
                };
                btl_event_t {
                    kind: BTL_EVENT_DONE,
                    rank: peer,
                    tag: 0,
                    status,
                    data: std::ptr::null(),
                    len: 0,
                    context: uctx as *mut c_void,
                    text: owned.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                }
            }
            Event::PeerFailed { peer, why } => {
                owned = CString::new(why.replace('\0', " ")).ok();
                btl_event_t {
                    kind: BTL_EVENT_PEER_FAILED,
                    rank: peer,
                    tag: 0,
                    status: BTL_ERR_PEER_FAILED,
                    data: std::ptr::null(),
                    len: 0,
                    context: std::ptr::null_mut(),
                    text: owned.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                }
            }
        };
        self.call_back(cx, to, &e);
    }

    /// Calls the C callback with `e`, lending it `cx` (the poll's region
    /// access) for its duration.
    #[inline(always)]
    fn call_back(&self, cx: Option<&mut PollCx<'_>>, to: EventSink, e: &btl_event_t) {
        self.cx.set(cx.map_or(std::ptr::null_mut(), |c| {
            (c as *mut PollCx<'_>).cast::<c_void>()
        }));
        // SAFETY: the caller's callback, with its own context; `e` and
        // what it points to live until it returns.
        unsafe { (to.cb)(to.ctx, e) };
        self.cx.set(std::ptr::null_mut());
    }

    /// Runs `f` with the callback's region access if a poll callback runs
    /// now, else with the world.
    pub(crate) fn with_regions<T>(
        &self,
        f: impl FnOnce(Result<&mut PollCx<'_>, &mut World<'static>>) -> Result<T, WorldError>,
    ) -> Result<T, Fail> {
        match self.busy.get() {
            Busy::Connecting => Err(fail(BTL_ERR_STATE, "not allowed during btl_connect")),
            Busy::Callback => {
                let cx = self.cx.get();
                if cx.is_null() {
                    // Between callbacks of btl_progress's completion
                    // delivery: the world is not borrowed then.
                    // SAFETY: btl_progress holds no reference into `state`
                    // while it delivers completions (see btl_progress).
                    let w = unsafe { self.world_unchecked() }?;
                    Ok(f(Err(w))?)
                } else {
                    // SAFETY: `cx` is the running callback's PollCx
                    // (set by `deliver` for the callback's duration); the
                    // poll that lent it does not use it until the callback
                    // returns.
                    let cx = unsafe { &mut *cx.cast::<PollCx<'_>>() };
                    Ok(f(Ok(cx))?)
                }
            }
            Busy::No => Ok(f(Err(self.world()?))?),
        }
    }
}

/// The C event of a message.
#[inline(always)]
fn message_event(from: u32, tag: u8, data: &[u8]) -> btl_event_t {
    btl_event_t {
        kind: BTL_EVENT_MESSAGE,
        rank: from,
        tag,
        status: BTL_OK,
        data: data.as_ptr().cast(),
        len: data.len(),
        context: std::ptr::null_mut(),
        text: std::ptr::null(),
    }
}
