//! btl's C ABI (`btl.h`, `libbtl.so`, `libbtl.a`): the job API of
//! `btl_linux::world` for C, C++, Fortran and MPI libraries.
//!
//! Two ways to join a job: [`btl_init`] (the environment's wire-up: `btl
//! run`, `mpirun`/PMIx, a rendezvous) or the two phases of an external
//! runtime ([`btl_open`] → publish [`btl_address`]'s blob → the runtime's
//! fence → [`btl_connect`] with a callback fetching peers' blobs), as Open
//! MPI's modex needs. Sends, one-sided get/put and registration of the
//! caller's memory; one progress call handing events to a callback, with
//! messages in place.
//!
//! # Reentrancy
//!
//! The event callback may post (`btl_sendi`, `btl_isend`, `btl_iput`,
//! `btl_iget`: queued, posted in order when the callback returns, their
//! completions reported as events even if they complete at once) and
//! register or deregister memory (at once). Blocking or handle-wide calls
//! (`btl_progress`, `btl_barrier`, `btl_connect`, `btl_finalize`) are
//! refused there with `BTL_ERR_STATE`.
//!
//! # Safety
//!
//! Every function is `unsafe extern "C"`: it reads and writes memory a C
//! caller hands it. Each checks what it can (NULL, zero lengths, handle
//! liveness, ranks, tags, keys) and documents what it cannot.
#![allow(non_camel_case_types)]
#![allow(unsafe_code)]

use std::cell::{Cell, OnceCell, RefCell, UnsafeCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_void, CStr, CString};
use std::fmt::Display;
use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError};

use btl_core::rma::RmaStatus;
use btl_linux::ops::{RawBuf, RawParts};
use btl_linux::wireup::Identity;
use btl_linux::world::{
    Builder, Event, Limits, Opened, PollCx, RegionKey, Request, World, WorldError, MAX_USER_TAG,
};

mod params;
mod wireup;

// ---------------------------------------------------------------- codes

/// Success.
pub const BTL_OK: c_int = 0;
/// Success, and the operation is complete: no BTL_EVENT_DONE follows.
pub const BTL_DONE: c_int = 1;
/// An argument is invalid: a NULL pointer, a zero length, a bad count.
pub const BTL_ERR_ARG: c_int = -1;
/// A parameter is unknown or its value malformed (btl_last_error names it
/// and says what it accepts).
pub const BTL_ERR_PARAM: c_int = -2;
/// Wire-up failed (no source, a timeout naming the missing ranks, a
/// malformed peer record, the fetch callback failed).
pub const BTL_ERR_WIREUP: c_int = -3;
/// A transport failed to start (shared-memory segment, TCP listen).
pub const BTL_ERR_TRANSPORT: c_int = -4;
/// There is no such rank.
pub const BTL_ERR_RANK: c_int = -5;
/// The tag is reserved: user tags are 0..=BTL_MAX_TAG.
pub const BTL_ERR_TAG: c_int = -6;
/// The rank exists but this handle does not reach it (transport
/// `sm-local` and a rank of another node).
pub const BTL_ERR_UNREACHABLE: c_int = -7;
/// The peer failed (died, its connection broke).
pub const BTL_ERR_PEER_FAILED: c_int = -8;
/// The peer's send queue is full: progress and retry.
pub const BTL_ERR_WOULD_BLOCK: c_int = -9;
/// The message is larger than the transport carries.
pub const BTL_ERR_TOO_LARGE: c_int = -10;
/// The target refused a get or put (unknown region, range outside it,
/// copy failed).
pub const BTL_ERR_REFUSED: c_int = -11;
/// A key is malformed, not ours where ours is needed, or names no
/// registered region.
pub const BTL_ERR_KEY: c_int = -12;
/// An address range is outside the key's region.
pub const BTL_ERR_RANGE: c_int = -13;
/// The region is used by operations in flight.
pub const BTL_ERR_BUSY: c_int = -14;
/// A blocking call waited longer than BTL_TIMEOUT.
pub const BTL_ERR_TIMEOUT: c_int = -15;
/// Not allowed now: before btl_connect, inside an event callback, after a
/// failed btl_connect.
pub const BTL_ERR_STATE: c_int = -16;
/// The handle was finalized.
pub const BTL_ERR_FINALIZED: c_int = -17;
/// The receiver could not handle the message.
pub const BTL_ERR_REMOTE: c_int = -18;
/// An internal error (a caught Rust panic): finalize the handle.
pub const BTL_ERR_INTERNAL: c_int = -19;

/// Largest user tag (Open MPI's ob1 uses 0x40..0x5f, MCA_BTL_TAG_USR is
/// 0x80: both fit; 0xf0..0xff are btl's own).
pub const BTL_MAX_TAG: u8 = 239;
const _: () = assert!(BTL_MAX_TAG == MAX_USER_TAG);
/// Bytes of a packed key (btl_key_pack).
pub const BTL_KEY_BYTES: usize = 24;
/// Most bytes an address blob (btl_address) has: the capacity the fetch
/// callback is given.
pub const BTL_ADDRESS_MAX: usize = 65536;
const _: () = assert!(BTL_ADDRESS_MAX == wireup::MAX_ADDRESS);

/// A message arrived (`rank`, `tag`, `data`, `len`).
pub const BTL_EVENT_MESSAGE: c_int = 1;
/// A posted operation completed (`context`, `rank`, `status`, `text`).
pub const BTL_EVENT_DONE: c_int = 2;
/// A peer failed (`rank`, `text`): reported once per peer.
pub const BTL_EVENT_PEER_FAILED: c_int = 3;

/// Parameter type: signed integer.
pub const BTL_PARAM_INT: c_int = 0;
/// Parameter type: unsigned integer.
pub const BTL_PARAM_UINT: c_int = 1;
/// Parameter type: a size in bytes.
pub const BTL_PARAM_SIZE: c_int = 2;
/// Parameter type: boolean (0/1; also true/false/yes/no as text).
pub const BTL_PARAM_BOOL: c_int = 3;
/// Parameter type: string.
pub const BTL_PARAM_STRING: c_int = 4;

// ---------------------------------------------------------------- types

/// One piece of a message: `len` bytes at `base` (`base` may be NULL only
/// when `len` is 0).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct btl_iovec_t {
    /// First byte.
    pub base: *const c_void,
    /// Number of bytes.
    pub len: usize,
}

/// A registered region, as its owner and its peers see it. Plain data:
/// copy it freely; send it to peers packed (btl_key_pack). Peers' keys are
/// validated by their owner on every use, so a stale or forged key is
/// refused, never obeyed.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct btl_key_t {
    /// The rank owning the region.
    pub rank: u32,
    /// The region's id at its owner (never reused).
    pub id: u32,
    /// Its length in bytes.
    pub len: u64,
    /// Its first byte's address in the owner's address space: remote
    /// addresses given to btl_iput/btl_iget are offsets from it.
    pub base: u64,
}

/// Who this process is, for btl_open.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct btl_identity_t {
    /// The job's name, 1 to 64 characters of [A-Za-z0-9._-]; the same at
    /// every rank. Handles of one process that both use shared memory need
    /// different job names.
    pub job: *const c_char,
    /// This rank, below `size`.
    pub rank: u32,
    /// Number of ranks, at least 1.
    pub size: u32,
    /// This node's name, as `job`: ranks with the same node name share
    /// memory.
    pub node: *const c_char,
}

/// Message sizes of the transport that reaches a peer (btl_limits).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct btl_limits_t {
    /// Messages up to this size go eagerly, in one fragment or frame.
    pub eager: u64,
    /// Largest message sent as one fragment; larger ones are pipelined or
    /// read by the receiver (single copy).
    pub max_send: u64,
    /// Largest message at all.
    pub max_message: u64,
}

/// What btl_progress hands the callback. Every pointer in it is valid only
/// during the callback.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct btl_event_t {
    /// BTL_EVENT_MESSAGE, BTL_EVENT_DONE or BTL_EVENT_PEER_FAILED.
    pub kind: c_int,
    /// Message: the sender; done: the peer of the operation; peer failed:
    /// the peer.
    pub rank: u32,
    /// Message: its tag.
    pub tag: u8,
    /// Done: BTL_OK or the operation's error (BTL_ERR_REFUSED, ...).
    pub status: c_int,
    /// Message: its bytes, in place (in the shared-memory fragment, which
    /// goes back to the sender only when the callback returns, or the TCP
    /// read buffer; a message larger than one fragment, or one kept from
    /// btl_barrier or a NULL-callback btl_progress, is a buffer of btl's):
    /// valid until the callback returns, read-only. Copy what you keep.
    pub data: *const c_void,
    /// Message: its length.
    pub len: usize,
    /// Done: the context given when the operation was posted.
    pub context: *mut c_void,
    /// Peer failed: why; done with an error: the message; otherwise NULL.
    /// NUL-terminated, valid during the callback only.
    pub text: *const c_char,
}

/// The event callback of btl_progress: `ctx` is btl_progress's `ctx`.
pub type btl_event_fn = Option<unsafe extern "C" fn(ctx: *mut c_void, ev: *const btl_event_t)>;

/// The fetch callback of btl_connect: copies rank `rank`'s address blob
/// (what that rank's btl_address gave) into `buf` (room for `cap` =
/// BTL_ADDRESS_MAX bytes), sets `*len` to its length and returns 0;
/// anything else is a failure. Called for every other rank, once each,
/// during btl_connect only.
pub type btl_fetch_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        rank: u32,
        buf: *mut c_void,
        cap: usize,
        len: *mut usize,
    ) -> c_int,
>;

/// One parameter's definition (btl_param_info). Strings are
/// NUL-terminated and live as long as the process.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct btl_param_info_t {
    /// The component (`sm`, `tcp`).
    pub component: *const c_char,
    /// The parameter's name (`fifo_size`).
    pub name: *const c_char,
    /// BTL_PARAM_INT, _UINT, _SIZE, _BOOL or _STRING.
    pub kind: c_int,
    /// The default, as text.
    pub default_value: *const c_char,
    /// Smallest accepted number (0 for a string).
    pub min: i64,
    /// Largest accepted number; for a string, its longest length.
    pub max: i64,
    /// When not NULL: the only accepted numbers (`nvalues` of them).
    pub values: *const i64,
    /// Number of `values`.
    pub nvalues: usize,
    /// When 1: every number in [min, max] but `except`.
    pub has_except: c_int,
    /// See `has_except`.
    pub except: i64,
    /// What it accepts, for people ("a power of two >= 16").
    pub accepts: *const c_char,
    /// One-line help text.
    pub help: *const c_char,
    /// Open MPI info level (1 = basic user .. 9 = developer).
    pub level: u32,
    /// Its environment variable (`BTL_SM_FIFO_SIZE`).
    pub env_name: *const c_char,
    /// Open MPI's environment variable (`OMPI_MCA_btl_sm_fifo_size`).
    pub ompi_env_name: *const c_char,
}

/// Parameters for btl_init / btl_open (btl_config_new). Opaque.
#[derive(Debug, Default)]
pub struct btl_config_t {
    set: Vec<(String, String, String)>,
}

// ---------------------------------------------------------------- errors

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// A failure: its code and its message.
struct Fail {
    code: c_int,
    msg: String,
}

/// A failure with its message. Cold and out of line: the calls' fast
/// paths stay small enough to inline (a successful call formats nothing).
#[cold]
#[inline(never)]
fn fail(code: c_int, msg: impl Display) -> Fail {
    Fail {
        code,
        msg: msg.to_string(),
    }
}

/// The code of a job-API error.
fn code_of(e: &WorldError) -> c_int {
    match e {
        WorldError::Wireup(_) | WorldError::BadRecord { .. } => BTL_ERR_WIREUP,
        WorldError::Sm(_) | WorldError::Tcp(_) | WorldError::NotOneNode { .. } => BTL_ERR_TRANSPORT,
        WorldError::ReservedTag { .. } => BTL_ERR_TAG,
        WorldError::InvalidPeer { .. } => BTL_ERR_RANK,
        WorldError::Unreachable { .. } => BTL_ERR_UNREACHABLE,
        WorldError::PeerFailed { .. } => BTL_ERR_PEER_FAILED,
        WorldError::Timeout { .. } => BTL_ERR_TIMEOUT,
        WorldError::WouldBlock { .. } => BTL_ERR_WOULD_BLOCK,
        WorldError::TooLarge { .. } => BTL_ERR_TOO_LARGE,
        WorldError::Refused { .. } => BTL_ERR_REFUSED,
        WorldError::Remote { .. } => BTL_ERR_REMOTE,
        WorldError::BadLocal {
            status: RmaStatus::OutOfBounds,
        } => BTL_ERR_RANGE,
        WorldError::BadLocal { .. } => BTL_ERR_KEY,
        WorldError::RegionBusy { .. } => BTL_ERR_BUSY,
        WorldError::UnknownRequest { .. } => BTL_ERR_INTERNAL,
        WorldError::Param { .. } => BTL_ERR_PARAM,
        WorldError::InvalidArgument(_) => BTL_ERR_ARG,
    }
}

impl From<WorldError> for Fail {
    #[cold]
    #[inline(never)]
    fn from(e: WorldError) -> Self {
        fail(code_of(&e), e)
    }
}

fn set_last(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

/// Runs `f` for the C function `name`: a failure's message is kept for
/// btl_last_error, a panic is caught and becomes BTL_ERR_INTERNAL.
#[inline(always)]
fn entry(name: &'static str, f: impl FnOnce() -> Result<c_int, Fail>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => failed(name, e),
        Err(p) => panicked(name, p),
    }
}

/// [`entry`]'s failure: keeps the message, returns the code.
#[cold]
#[inline(never)]
fn failed(name: &'static str, e: Fail) -> c_int {
    set_last(format!("{name}: {}", e.msg));
    e.code
}

/// [`entry`]'s caught panic: keeps its message, returns BTL_ERR_INTERNAL.
#[cold]
#[inline(never)]
fn panicked(name: &'static str, p: Box<dyn std::any::Any + Send>) -> c_int {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown".into());
    set_last(format!("{name}: internal error (caught a panic: {what})"));
    BTL_ERR_INTERNAL
}

#[inline(always)]
fn need<T>(p: *const T, what: &'static str) -> Result<(), Fail> {
    if p.is_null() || !p.is_aligned() {
        Err(bad_pointer(p.is_null(), what))
    } else {
        Ok(())
    }
}

/// [`need`]'s refusal.
#[cold]
#[inline(never)]
fn bad_pointer(null: bool, what: &'static str) -> Fail {
    if null {
        fail(BTL_ERR_ARG, format!("{what} is NULL"))
    } else {
        fail(BTL_ERR_ARG, format!("{what} is misaligned"))
    }
}

/// A C string argument as UTF-8.
///
/// # Safety
///
/// `p`, when not NULL, points to a NUL-terminated string.
unsafe fn text<'a>(p: *const c_char, what: &'static str) -> Result<&'a str, Fail> {
    need(p, what)?;
    // SAFETY: not NULL; the caller's promise of a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| fail(BTL_ERR_ARG, format!("{what} is not UTF-8")))
}

// ---------------------------------------------------------------- handle

const LIVE: u64 = 0x6274_6c5f_6c69_7665;
const DEAD: u64 = 0x6274_6c5f_6465_6164;
/// Bytes the callbacks may queue in copied sends before btl_sendi says
/// would-block.
const DEFERRED_BYTES: usize = 8 << 20;

enum State {
    Opened(Box<Opened>),
    Ready(Box<World<'static>>),
    Gone,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Busy {
    No,
    /// Inside btl_progress (the event callback may run).
    Callback,
    /// Inside btl_connect (the fetch callback may run).
    Connecting,
}

/// An operation posted from inside a callback, posted when it returns.
enum Deferred {
    Copy {
        peer: u32,
        tag: u8,
        data: Vec<u8>,
    },
    Send {
        peer: u32,
        tag: u8,
        parts: RawParts,
        ctx: usize,
    },
    Rma {
        put: bool,
        local: RegionKey,
        local_off: u64,
        remote: RegionKey,
        remote_off: u64,
        len: u64,
        ctx: usize,
    },
}

/// A completion known outside the world (a deferred post that completed
/// at once or failed).
struct Ready {
    ctx: usize,
    peer: u32,
    status: c_int,
    text: Option<CString>,
}

#[derive(Default)]
struct Side {
    deferred: VecDeque<Deferred>,
    deferred_bytes: usize,
    ready: VecDeque<Ready>,
    /// Requests in flight: their context and peer.
    pending: HashMap<u64, (usize, u32)>,
}

#[derive(Clone, Copy)]
struct Peer {
    reachable: bool,
    limits: Limits,
}

/// A handle: one process's membership in a job. Opaque.
pub struct btl_t {
    magic: Cell<u64>,
    rank: u32,
    size: u32,
    /// The world; touched only while `busy` is `No` (or by btl_progress
    /// itself between callbacks).
    state: UnsafeCell<State>,
    side: RefCell<Side>,
    busy: Cell<Busy>,
    /// The running event callback's context (register/deregister from it).
    cx: Cell<*mut c_void>,
    peers: OnceCell<Vec<Peer>>,
    /// Our address blob (btl_open).
    blob: Vec<u8>,
    wire: Option<Arc<Mutex<wireup::Shared>>>,
}

impl std::fmt::Debug for btl_t {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("btl_t")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Finalized handles' memory, kept so that a stale pointer is told apart
/// (BTL_ERR_FINALIZED) rather than read after free.
static GRAVE: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Sets `busy` back when dropped (also on a caught panic).
struct BusyGuard<'a>(&'a btl_t);

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
unsafe fn handle<'a>(h: *const btl_t) -> Result<&'a btl_t, Fail> {
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
    fn new(rank: u32, size: u32, state: State) -> Self {
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

    fn set_peers(&self, w: &World<'_>) {
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
    fn not_busy(&self) -> Result<(), Fail> {
        match self.busy.get() {
            Busy::No => Ok(()),
            Busy::Callback => Err(fail(BTL_ERR_STATE, "not allowed inside an event callback")),
            Busy::Connecting => Err(fail(BTL_ERR_STATE, "not allowed during btl_connect")),
        }
    }

    /// The world, outside callbacks.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    fn world(&self) -> Result<&mut World<'static>, Fail> {
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
    unsafe fn world_unchecked(&self) -> Result<&mut World<'static>, Fail> {
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
    unsafe fn sendi_boxed(
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
    fn peer(&self, rank: u32) -> Result<&Peer, Fail> {
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
    fn must_defer(&self) -> bool {
        self.busy.get() == Busy::Callback || !self.side.borrow().deferred.is_empty()
    }

    /// btl_sendi inside an event callback: the copy is queued, posted when
    /// the callback returns.
    #[cold]
    fn defer_copy(&self, rank: u32, tag: u8, slices: &[&[u8]]) -> Result<c_int, Fail> {
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
    fn track(
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
    fn deliver_ready(
        &self,
        cb: unsafe extern "C" fn(*mut c_void, *const btl_event_t),
        ctx: *mut c_void,
    ) -> Result<usize, Fail> {
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
                unsafe { cb(ctx, &e) };
            }
            // SAFETY: the callbacks above have returned.
            let w = unsafe { self.world_unchecked() }?;
            n += self.drain(w);
        }
        Ok(n)
    }

    /// Posts what callbacks queued, in order; stops at a full queue.
    #[inline(never)]
    fn drain(&self, w: &mut World<'static>) -> usize {
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
    fn deliver(
        &self,
        cx: Option<&mut PollCx<'_>>,
        cb: unsafe extern "C" fn(*mut c_void, *const btl_event_t),
        ctx: *mut c_void,
        ev: Event<'_>,
    ) {
        if let Event::Message { from, tag, data } = ev {
            self.call_back(cx, cb, ctx, &message_event(from, tag, data));
        } else {
            self.deliver_other(cx, cb, ctx, ev);
        }
    }

    /// [`Self::deliver`] of a completion or a failure.
    #[inline(never)]
    fn deliver_other(
        &self,
        cx: Option<&mut PollCx<'_>>,
        cb: unsafe extern "C" fn(*mut c_void, *const btl_event_t),
        ctx: *mut c_void,
        ev: Event<'_>,
    ) {
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
        self.call_back(cx, cb, ctx, &e);
    }

    /// Calls the C callback with `e`, lending it `cx` (the poll's region
    /// access) for its duration.
    #[inline(always)]
    fn call_back(
        &self,
        cx: Option<&mut PollCx<'_>>,
        cb: unsafe extern "C" fn(*mut c_void, *const btl_event_t),
        ctx: *mut c_void,
        e: &btl_event_t,
    ) {
        self.cx.set(cx.map_or(std::ptr::null_mut(), |c| {
            (c as *mut PollCx<'_>).cast::<c_void>()
        }));
        // SAFETY: the caller's callback, with its own context; `e` and
        // what it points to live until it returns.
        unsafe { cb(ctx, e) };
        self.cx.set(std::ptr::null_mut());
    }

    /// Runs `f` with the callback's region access if a poll callback runs
    /// now, else with the world.
    fn with_regions<T>(
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

/// `len` bytes at `p` (an empty slice for `len` 0, whatever `p`).
///
/// # Safety
///
/// With `len > 0`, `p` must point to `len` readable bytes that stay valid
/// and unchanged for the slice's use.
unsafe fn slice<'a>(p: *const u8, len: usize) -> &'a [u8] {
    if len == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(p, len) }
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

/// Checks an iovec array (count, NULL bases with bytes, total length) and
/// lends it.
///
/// # Safety
///
/// `iov`, when not NULL, points to `iovcnt` elements that live for `'a`.
#[inline(always)]
unsafe fn iov_array<'a>(iov: *const btl_iovec_t, iovcnt: usize) -> Result<&'a [btl_iovec_t], Fail> {
    if iovcnt == 0 {
        return Ok(&[]);
    }
    need(iov, "iov")?;
    if iovcnt > 1024 {
        return Err(fail(BTL_ERR_ARG, format!("iovcnt {iovcnt} is above 1024")));
    }
    // SAFETY: not NULL; the caller's promise of `iovcnt` elements.
    let v = unsafe { std::slice::from_raw_parts(iov, iovcnt) };
    // One branch-free pass; the cold one names the first bad piece. A
    // saturated sum is above isize::MAX exactly when some prefix's is.
    let (mut total, mut null) = (0usize, false);
    for p in v {
        null |= p.base.is_null() & (p.len != 0);
        total = total.saturating_add(p.len);
    }
    if null || total > isize::MAX as usize {
        return Err(bad_iov(v));
    }
    Ok(v)
}

/// Why [`iov_array`] refused `v`: its first piece with a NULL base and
/// bytes, or the piece where the total length passes isize::MAX.
#[cold]
#[inline(never)]
fn bad_iov(v: &[btl_iovec_t]) -> Fail {
    let mut total = 0usize;
    for (i, p) in v.iter().enumerate() {
        if p.base.is_null() && p.len > 0 {
            return fail(
                BTL_ERR_ARG,
                format!("iov[{i}].base is NULL with len {}", p.len),
            );
        }
        match total.checked_add(p.len) {
            Some(t) if t <= isize::MAX as usize => total = t,
            _ => return fail(BTL_ERR_TOO_LARGE, "the pieces' total length overflows"),
        }
    }
    // iov_array calls this only for an array that fails above.
    fail(
        BTL_ERR_INTERNAL,
        "an iovec array was refused without a bad piece",
    )
}

/// How many pieces [`with_pieces`] lends without allocating.
const FEW: usize = 4;

/// Lends checked pieces ([`iov_array`]'s) to `f` as slices, without
/// allocating for up to [`FEW`] and without a loop for one or two (a
/// payload, a header and a payload): the send fast path builds nothing it
/// does not pass on.
///
/// # Safety
///
/// Every piece of `v` is `len` readable bytes at `base` for `'a` (NULL
/// bases have no bytes: [`iov_array`] checked).
#[inline(always)]
unsafe fn with_pieces<'a, T>(v: &[btl_iovec_t], f: impl FnOnce(&[&'a [u8]]) -> T) -> T {
    // SAFETY: the caller's promise of readable pieces.
    let piece = |p: &btl_iovec_t| unsafe { slice(p.base.cast(), p.len) };
    match v {
        [] => f(&[]),
        [a] => f(&[piece(a)]),
        [a, b] => f(&[piece(a), piece(b)]),
        _ if v.len() <= FEW => {
            let mut a: [&[u8]; FEW] = [&[]; FEW];
            for (d, p) in a.iter_mut().zip(v) {
                *d = piece(p);
            }
            f(&a[..v.len()])
        }
        _ => f(&v.iter().map(piece).collect::<Vec<_>>()),
    }
}

#[inline(always)]
fn check_tag(tag: u8) -> Result<(), Fail> {
    if tag > MAX_USER_TAG {
        Err(fail(
            BTL_ERR_TAG,
            format!("tag {tag} is reserved (user tags are 0..={MAX_USER_TAG})"),
        ))
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------- errors API

/// The name and meaning of a return code ("BTL_ERR_RANK: there is no such
/// rank"); "unknown btl return code" for others. The string is static.
#[no_mangle]
pub extern "C" fn btl_strerror(code: c_int) -> *const c_char {
    let s: &'static CStr = match code {
        BTL_OK => c"BTL_OK: success",
        BTL_DONE => c"BTL_DONE: success, the operation is complete",
        BTL_ERR_ARG => c"BTL_ERR_ARG: invalid argument (NULL pointer, zero length, bad count)",
        BTL_ERR_PARAM => c"BTL_ERR_PARAM: unknown parameter or malformed value",
        BTL_ERR_WIREUP => c"BTL_ERR_WIREUP: wire-up failed",
        BTL_ERR_TRANSPORT => c"BTL_ERR_TRANSPORT: a transport failed to start",
        BTL_ERR_RANK => c"BTL_ERR_RANK: there is no such rank",
        BTL_ERR_TAG => c"BTL_ERR_TAG: reserved tag (user tags are 0..=239)",
        BTL_ERR_UNREACHABLE => c"BTL_ERR_UNREACHABLE: the rank is not reached by this handle",
        BTL_ERR_PEER_FAILED => c"BTL_ERR_PEER_FAILED: the peer failed",
        BTL_ERR_WOULD_BLOCK => {
            c"BTL_ERR_WOULD_BLOCK: the peer's send queue is full; progress and retry"
        }
        BTL_ERR_TOO_LARGE => c"BTL_ERR_TOO_LARGE: message larger than the transport carries",
        BTL_ERR_REFUSED => c"BTL_ERR_REFUSED: the target refused the get or put",
        BTL_ERR_KEY => c"BTL_ERR_KEY: malformed, foreign or unknown key",
        BTL_ERR_RANGE => c"BTL_ERR_RANGE: address range outside the key's region",
        BTL_ERR_BUSY => c"BTL_ERR_BUSY: the region is used by operations in flight",
        BTL_ERR_TIMEOUT => c"BTL_ERR_TIMEOUT: timed out (BTL_TIMEOUT)",
        BTL_ERR_STATE => c"BTL_ERR_STATE: not allowed in the handle's current state",
        BTL_ERR_FINALIZED => c"BTL_ERR_FINALIZED: the handle was finalized",
        BTL_ERR_REMOTE => c"BTL_ERR_REMOTE: the receiver could not handle the message",
        BTL_ERR_INTERNAL => c"BTL_ERR_INTERNAL: internal error (finalize the handle)",
        _ => c"unknown btl return code",
    };
    s.as_ptr()
}

/// The calling thread's last failure, with its context ("btl_isend: there
/// is no rank 7 (size 4)"); "" if none. Valid until the thread's next
/// failing btl call.
#[no_mangle]
pub extern "C" fn btl_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

// ---------------------------------------------------------------- config

/// A new, empty parameter set in `*out` (free with btl_config_free).
///
/// # Safety
///
/// `out` is NULL or points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn btl_config_new(out: *mut *mut btl_config_t) -> c_int {
    entry("btl_config_new", || {
        need(out, "out")?;
        let c = Box::into_raw(Box::new(btl_config_t::default()));
        // SAFETY: checked, the caller's writable pointer.
        unsafe { out.write(c) };
        Ok(BTL_OK)
    })
}

/// Sets parameter `name` of `component` to `value` (text, as the
/// environment's `BTL_<COMPONENT>_<NAME>`): components `sm`, `tcp` (every
/// parameter btl_param_info lists) and `btl` (`timeout`: seconds any
/// blocking call may wait, as BTL_TIMEOUT; `transport`: `auto` — shared
/// memory inside a node, TCP between nodes —, `sm` — every rank on this
/// node —, `tcp` — TCP to every rank, over loopback inside a node —, or
/// `sm-local` — shared memory to the ranks of this node, the others
/// unreachable —, as BTL_TRANSPORT; `nodes`: how many nodes the job
/// spans, when the runtime knows it before the address exchange — with 1,
/// btl_open listens on loopback unless tcp `if_include` or BTL_BIND say
/// otherwise). Validated now, with the
/// environment's errors (BTL_ERR_PARAM naming the parameter and what it
/// accepts); rules between parameters are checked by btl_init/btl_open.
/// Values set here win over the environment. The strings are copied.
///
/// # Safety
///
/// `cfg` comes from btl_config_new; the strings are NULL or
/// NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn btl_config_set(
    cfg: *mut btl_config_t,
    component: *const c_char,
    name: *const c_char,
    value: *const c_char,
) -> c_int {
    entry("btl_config_set", || {
        need(cfg, "cfg")?;
        // SAFETY: the caller's strings.
        let (c, n, v) = unsafe {
            (
                text(component, "component")?,
                text(name, "name")?,
                text(value, "value")?,
            )
        };
        Builder::new().set(c, n, v)?;
        // SAFETY: checked; the caller's config, not shared with another
        // thread during the call.
        unsafe { &mut *cfg }
            .set
            .push((c.into(), n.into(), v.into()));
        Ok(BTL_OK)
    })
}

/// The value numeric parameter `name` of `component` (`sm` or `tcp`)
/// will have in a handle made from `cfg` (NULL: no settings) now, in
/// `*out`: `cfg`'s setting, else the environment's, else the default,
/// after the component's rules between parameters (booleans as 0/1).
/// BTL_ERR_PARAM naming the parameter when one is unknown, malformed or
/// in conflict with another (the error btl_open would give), or for a
/// text parameter — so a runtime can take a module's attributes (Open
/// MPI's eager limit, exclusivity, ...) from btl's own values.
///
/// # Safety
///
/// `cfg` is NULL or from btl_config_new; the strings are NUL-terminated;
/// `out` writable.
#[no_mangle]
pub unsafe extern "C" fn btl_config_number(
    cfg: *const btl_config_t,
    component: *const c_char,
    name: *const c_char,
    out: *mut i64,
) -> c_int {
    entry("btl_config_number", || {
        // SAFETY: the caller's strings.
        let (c, n) = unsafe { (text(component, "component")?, text(name, "name")?) };
        need(out, "out")?;
        // SAFETY: the caller's config.
        let v = unsafe { builder(cfg) }?.number(c, n)?;
        // SAFETY: checked.
        unsafe { out.write(v) };
        Ok(BTL_OK)
    })
}

/// Frees a parameter set (NULL: nothing). Handles made from it are not
/// affected.
///
/// # Safety
///
/// `cfg` is NULL or comes from btl_config_new and was not freed.
#[no_mangle]
pub unsafe extern "C" fn btl_config_free(cfg: *mut btl_config_t) {
    entry("btl_config_free", || {
        if !cfg.is_null() {
            // SAFETY: the caller's promise: from btl_config_new, once.
            drop(unsafe { Box::from_raw(cfg) });
        }
        Ok(BTL_OK)
    });
}

/// A builder with the parameters of `cfg` (NULL: none).
///
/// # Safety
///
/// `cfg` is NULL or from btl_config_new.
unsafe fn builder(cfg: *const btl_config_t) -> Result<Builder, Fail> {
    let mut b = Builder::new();
    if !cfg.is_null() {
        need(cfg, "cfg")?;
        // SAFETY: checked; the caller's config.
        for (c, n, v) in &unsafe { &*cfg }.set {
            b = b.set(c, n, v)?;
        }
    }
    Ok(b)
}

// ---------------------------------------------------------------- joining

fn publish(h: btl_t, out: *mut *mut btl_t) -> Result<c_int, Fail> {
    let p = Box::into_raw(Box::new(h));
    // SAFETY: `out` was checked by the caller of `publish`.
    unsafe { out.write(p) };
    Ok(BTL_OK)
}

/// Joins the job through the environment's wire-up source (`btl run`;
/// mpirun/prterun/srun with PMIx; BTL_WIREUP=tcp://HOST:PORT with
/// BTL_RANK/BTL_SIZE) with the parameters of `cfg` (NULL: environment
/// only) and the transport of `btl.transport` / BTL_TRANSPORT (default
/// auto). Collective: every rank calls it. On success `*out` is the handle
/// (finalize it with btl_finalize). Only one handle per process may use
/// the environment's source at a time; more handles use btl_open.
///
/// # Safety
///
/// `cfg` is NULL or from btl_config_new; `out` points to writable storage
/// for a pointer.
#[no_mangle]
pub unsafe extern "C" fn btl_init(cfg: *const btl_config_t, out: *mut *mut btl_t) -> c_int {
    entry("btl_init", || {
        need(out, "out")?;
        btl_linux::job::init_logging();
        // SAFETY: the caller's config.
        let w: World<'static> = unsafe { builder(cfg) }?.init()?;
        let h = btl_t::new(w.rank(), w.size(), State::Ready(Box::new(w)));
        // SAFETY: the state was just made, nothing borrows it.
        if let Ok(w) = unsafe { h.world_unchecked() } {
            h.set_peers(w);
        }
        publish(h, out)
    })
}

/// The first phase of joining through an external runtime (Open MPI's
/// modex): with identity `id` and the parameters of `cfg`, starts
/// listening (unless the transport is `sm`/`sm-local`) and prepares this
/// rank's address blob (btl_address). Then the runtime publishes the
/// blob, fences, and btl_connect reads the peers' blobs. Not collective
/// by itself. Several handles may be open in one process (each its own
/// blob; those using shared memory with different job names).
///
/// # Safety
///
/// `cfg` is NULL or from btl_config_new; `id` points to an identity whose
/// strings are NUL-terminated; `out` points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn btl_open(
    cfg: *const btl_config_t,
    id: *const btl_identity_t,
    out: *mut *mut btl_t,
) -> c_int {
    entry("btl_open", || {
        need(out, "out")?;
        need(id, "id")?;
        // SAFETY: checked; the caller's identity.
        let id = unsafe { &*id };
        // SAFETY: the identity's strings, as promised.
        let (job, node) = unsafe { (text(id.job, "id->job")?, text(id.node, "id->node")?) };
        for (what, v) in [("id->job", job), ("id->node", node)] {
            if !btl_linux::job::is_valid_name(v) {
                return Err(fail(
                    BTL_ERR_ARG,
                    format!("{what} {v:?} is not 1 to 64 characters of [A-Za-z0-9._-]"),
                ));
            }
        }
        if id.size == 0 || id.rank >= id.size {
            return Err(fail(
                BTL_ERR_ARG,
                format!("id->rank {} is not below id->size {}", id.rank, id.size),
            ));
        }
        btl_linux::job::init_logging();
        let identity = Identity {
            job: job.into(),
            rank: id.rank,
            size: id.size,
            node: node.into(),
        };
        let (w, shared) = wireup::External::new(id.rank, id.size);
        // SAFETY: the caller's config.
        let opened = unsafe { builder(cfg) }?
            .wireup(identity, Box::new(w))
            .open()?;
        let blob = shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .encode();
        let mut h = btl_t::new(id.rank, id.size, State::Opened(Box::new(opened)));
        h.blob = blob;
        h.wire = Some(shared);
        publish(h, out)
    })
}

/// This rank's address blob for the runtime to publish (after btl_open):
/// `*blob` points to `*len` bytes (at most BTL_ADDRESS_MAX) owned by the
/// handle, valid until btl_finalize.
///
/// # Safety
///
/// `h` from btl_open; `blob` and `len` point to writable storage.
#[no_mangle]
pub unsafe extern "C" fn btl_address(
    h: *const btl_t,
    blob: *mut *const c_void,
    len: *mut usize,
) -> c_int {
    entry("btl_address", || {
        // SAFETY: the caller's handle.
        let h = unsafe { handle(h) }?;
        need(blob, "blob")?;
        need(len, "len")?;
        if h.wire.is_none() {
            return Err(fail(
                BTL_ERR_STATE,
                "the handle was made by btl_init (its wire-up is the environment's)",
            ));
        }
        // SAFETY: checked, the caller's writable pointers.
        unsafe {
            blob.write(h.blob.as_ptr().cast());
            len.write(h.blob.len());
        }
        Ok(BTL_OK)
    })
}

/// The second phase (after the runtime's fence): reads every other rank's
/// blob through `fetch` (called during this call only) and starts the
/// transports; the ranks of this node that use shared memory meet in the
/// segment, so they call btl_connect at about the same time (bounded by
/// BTL_ATTACH_TIMEOUT). On failure the handle can only be finalized.
///
/// # Safety
///
/// `h` from btl_open; `fetch` obeys btl_fetch_fn's contract.
#[no_mangle]
pub unsafe extern "C" fn btl_connect(
    h: *mut btl_t,
    fetch: btl_fetch_fn,
    ctx: *mut c_void,
) -> c_int {
    entry("btl_connect", || {
        // SAFETY: the caller's handle.
        let h = unsafe { handle(h) }?;
        h.not_busy()?;
        let fetch = fetch.ok_or_else(|| fail(BTL_ERR_ARG, "fetch is NULL"))?;
        let Some(shared) = &h.wire else {
            return Err(fail(BTL_ERR_STATE, "the handle was made by btl_init"));
        };
        // SAFETY: not busy: nothing else holds a reference into `state`.
        let st = unsafe { &mut *h.state.get() };
        let State::Opened(_) = st else {
            return Err(fail(
                BTL_ERR_STATE,
                "the handle is already connected (or failed to)",
            ));
        };
        let State::Opened(opened) = std::mem::replace(st, State::Gone) else {
            unreachable!("checked above");
        };
        shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .set_fetch(Some((fetch, ctx as usize)));
        h.busy.set(Busy::Connecting);
        let guard = BusyGuard(h);
        let r = opened.connect();
        drop(guard);
        shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .set_fetch(None);
        let w = r?;
        h.set_peers(&w);
        // SAFETY: as above.
        unsafe { *h.state.get() = State::Ready(Box::new(w)) };
        Ok(BTL_OK)
    })
}

/// Finishes with a handle: posts what callbacks queued, waits (bounded by
/// BTL_TIMEOUT) until every message sent has left and every operation of
/// ours is answered, closes the transports and sets `*h` to NULL. Memory
/// registered with it is no longer used. Returns BTL_OK, or the error of
/// that wait (the handle is finalized all the same). A copy of the
/// pointer used later gets BTL_ERR_FINALIZED. Pending completions are not
/// reported: wait for them (or call btl_barrier) first.
///
/// # Safety
///
/// `h` points to a handle pointer from btl_init/btl_open (or NULL).
#[no_mangle]
pub unsafe extern "C" fn btl_finalize(h: *mut *mut btl_t) -> c_int {
    entry("btl_finalize", || {
        need(h, "h")?;
        // SAFETY: checked, the caller's pointer to its handle pointer.
        let p = unsafe { h.read() };
        // SAFETY: the caller's handle.
        let hd = unsafe { handle(p) }?;
        hd.not_busy()?;
        let mut result = Ok(BTL_OK);
        // SAFETY: not busy: nothing else holds a reference into `state`.
        let st = std::mem::replace(unsafe { &mut *hd.state.get() }, State::Gone);
        if let State::Ready(mut w) = st {
            hd.drain(&mut w);
            if let Err(e) = w.flush() {
                result = Err(Fail::from(e));
            }
            drop(w);
        }
        *hd.side.borrow_mut() = Side::default();
        hd.magic.set(DEAD);
        GRAVE
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(p as usize);
        // SAFETY: checked above.
        unsafe { h.write(std::ptr::null_mut()) };
        result
    })
}

// ---------------------------------------------------------------- who

/// This rank in `*rank`.
///
/// # Safety
///
/// `h` a handle; `rank` writable.
#[no_mangle]
pub unsafe extern "C" fn btl_rank(h: *const btl_t, rank: *mut u32) -> c_int {
    entry("btl_rank", || {
        // SAFETY: the caller's handle.
        let h = unsafe { handle(h) }?;
        need(rank, "rank")?;
        // SAFETY: checked.
        unsafe { rank.write(h.rank) };
        Ok(BTL_OK)
    })
}

/// The number of ranks in `*size`.
///
/// # Safety
///
/// `h` a handle; `size` writable.
#[no_mangle]
pub unsafe extern "C" fn btl_size(h: *const btl_t, size: *mut u32) -> c_int {
    entry("btl_size", || {
        // SAFETY: the caller's handle.
        let h = unsafe { handle(h) }?;
        need(size, "size")?;
        // SAFETY: checked.
        unsafe { size.write(h.size) };
        Ok(BTL_OK)
    })
}

/// 1 if this handle reaches rank `rank` (ourselves included), 0 if not
/// (transport sm-local and another node), BTL_ERR_RANK if there is no such
/// rank, BTL_ERR_STATE before btl_connect. A reachable peer may fail
/// later (BTL_EVENT_PEER_FAILED).
///
/// # Safety
///
/// `h` a handle.
#[no_mangle]
pub unsafe extern "C" fn btl_reachable(h: *const btl_t, rank: u32) -> c_int {
    entry("btl_reachable", || {
        // SAFETY: the caller's handle.
        let h = unsafe { handle(h) }?;
        match h.peer(rank) {
            Ok(_) => Ok(1),
            Err(e) if e.code == BTL_ERR_UNREACHABLE => Ok(0),
            Err(e) => Err(e),
        }
    })
}

/// The message sizes of the transport reaching `rank` in `*out`: `eager`
/// (the largest message btl_sendi should be used for, Open MPI's
/// btl_eager_limit), `max_send` (btl_max_send_size) and `max_message`.
///
/// # Safety
///
/// `h` a handle; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn btl_limits(h: *const btl_t, rank: u32, out: *mut btl_limits_t) -> c_int {
    entry("btl_limits", || {
        // SAFETY: the caller's handle.
        let h = unsafe { handle(h) }?;
        need(out, "out")?;
        let l = h.peer(rank)?.limits;
        // SAFETY: checked.
        unsafe {
            out.write(btl_limits_t {
                eager: l.eager,
                max_send: l.max_send,
                max_message: l.max_message,
            })
        };
        Ok(BTL_OK)
    })
}

// ---------------------------------------------------------------- sends

/// Sends the concatenation of `iov[0..iovcnt]` (0 pieces: an empty
/// message) to `rank` with `tag`, copying it now: returns BTL_DONE (the
/// memory may be reused at once; no event follows) or
/// BTL_ERR_WOULD_BLOCK when the peer's queue is full (progress and retry,
/// or send another way) — Open MPI's sendi. Messages to one peer arrive in
/// the order posted. Inside an event callback the copy is queued and sent
/// when the callback returns.
///
/// # Safety
///
/// `h` a handle; `iov` points to `iovcnt` pieces, each `len` readable
/// bytes.
#[no_mangle]
pub unsafe extern "C" fn btl_sendi(
    h: *mut btl_t,
    rank: u32,
    tag: u8,
    iov: *const btl_iovec_t,
    iovcnt: usize,
) -> c_int {
    entry("btl_sendi", || {
        // SAFETY: the caller's handle.
        let h = unsafe { handle(h) }?;
        // SAFETY: the caller's iovec and readable pieces.
        if unsafe { h.sendi_boxed(rank, tag, iov, iovcnt) } {
            return Ok(BTL_DONE);
        }
        check_tag(tag)?;
        // SAFETY: the caller's iovec.
        let v = unsafe { iov_array(iov, iovcnt) }?;
        h.peer(rank)?;
        match h.busy.get() {
            Busy::No => {}
            Busy::Connecting => return Err(fail(BTL_ERR_STATE, "not allowed during btl_connect")),
            // SAFETY: the caller's readable pieces.
            Busy::Callback => return unsafe { with_pieces(v, |p| h.defer_copy(rank, tag, p)) },
        }
        if !h.side.borrow().deferred.is_empty() {
            return Err(fail(
                BTL_ERR_WOULD_BLOCK,
                format!("earlier sends to rank {rank} wait to be posted (progress first)"),
            ));
        }
        // SAFETY: `busy` is `No`: no call of ours holds a reference into
        // `state` (one thread at a time calls a handle, btl.h).
        let w = unsafe { h.world_unchecked() }?;
        // SAFETY: the caller's readable pieces.
        unsafe { with_pieces(v, |p| w.isendv(rank, tag, p)) }?;
        Ok(BTL_DONE)
    })
}

/// Sends the concatenation of `iov[0..iovcnt]` to `rank` with `tag`
/// without copying large messages: the memory is read while the message
/// travels (single copy by the receiver over shared memory, writes
/// straight from it over TCP). Returns BTL_DONE when it completed at once
/// (the message was copied or written: over shared memory a small one
/// that could leave at once, over TCP one of at most 240 bytes, one the
/// socket took whole at once, or one in pieces other than a header of at
/// most 48 bytes and a payload; the memory may be reused, no event
/// follows), or BTL_OK (any
/// other, read when it leaves): a BTL_EVENT_DONE carrying `ctx` follows,
/// and until then the memory must stay valid and unchanged. Never waits for
/// the receiver; BTL_ERR_WOULD_BLOCK when the peer's queue is full.
/// Inside a callback it is queued (BTL_OK, an event follows).
///
/// # Safety
///
/// `h` a handle; `iov` points to `iovcnt` pieces of readable memory that
/// stays valid until completion (the iov array itself may be reused when
/// this returns).
#[no_mangle]
pub unsafe extern "C" fn btl_isend(
    h: *mut btl_t,
    rank: u32,
    tag: u8,
    iov: *const btl_iovec_t,
    iovcnt: usize,
    ctx: *mut c_void,
) -> c_int {
    entry("btl_isend", || {
        // SAFETY: the caller's handle.
        let h = unsafe { handle(h) }?;
        check_tag(tag)?;
        // SAFETY: the caller's iovec.
        let v = unsafe { iov_array(iov, iovcnt) }?;
        h.peer(rank)?;
        if h.busy.get() == Busy::Connecting {
            return Err(fail(BTL_ERR_STATE, "not allowed during btl_connect"));
        }
        if h.must_defer() {
            // No allocation for a header and a payload (Open MPI's
            // descriptors): ob1 posts its pipeline's next fragment from
            // the completion callback of the last.
            let parts = RawParts::from_bufs(
                v.iter()
                    .filter_map(|p| RawBuf::from_raw(p.base as *mut u8, p.len)),
            );
            h.side.borrow_mut().deferred.push_back(Deferred::Send {
                peer: rank,
                tag,
                parts,
                ctx: ctx as usize,
            });
            return Ok(BTL_OK);
        }
        let w = h.world()?;
        // SAFETY: the caller's promise: the pieces are readable and stay
        // valid until the completion event.
        let r = unsafe { with_pieces(v, |p| w.isend_raw(rank, tag, p)) };
        h.track(r, ctx as usize, rank, false)
    })
}

// ---------------------------------------------------------------- progress

/// One progress pass over every transport, never blocking: each event
/// goes to `cb(ctx, &event)` (messages in place, completions with their
/// context, peer failures); operations the callbacks posted are posted
/// when they return. With `cb` NULL, events are kept for a later call
/// with a callback. Returns the number of events and operations handled
/// (>= 0), or an error. A pass that found nothing on a handle with
/// shared-memory peers ends with spin-wait hints (the sm parameter
/// poll_pause, 2 by default, ~20 ns here: the spin-wait idiom, which made
/// small messages faster); BTL_SM_POLL_PAUSE=0 returns at once.
///
/// # Safety
///
/// `h` a handle; `cb` obeys btl_event_fn's contract.
#[no_mangle]
pub unsafe extern "C" fn btl_progress(h: *mut btl_t, cb: btl_event_fn, ctx: *mut c_void) -> c_int {
    entry("btl_progress", || {
        // SAFETY: the caller's handle.
        let h = unsafe { handle(h) }?;
        h.not_busy()?;
        h.busy.set(Busy::Callback);
        let _guard = BusyGuard(h);
        let mut n = {
            // SAFETY: `busy` is `Callback`: reentrant calls never take a
            // reference into `state` while the poll runs (they queue, or
            // use the PollCx lent to the callback).
            let w = unsafe { h.world_unchecked() }?;
            let n = match cb {
                Some(cb) => w.poll_with(|cx, ev| h.deliver(Some(cx), cb, ctx, ev)),
                None => w.progress(),
            };
            // Most passes queued nothing and kept nothing back: one look
            // at both queues, no call.
            let quiet = {
                let side = h.side.borrow();
                side.deferred.is_empty() && side.ready.is_empty()
            };
            if quiet {
                return Ok(n.min(i32::MAX as usize) as c_int);
            }
            if h.side.borrow().deferred.is_empty() {
                n
            } else {
                n + h.drain(w)
            }
        };
        if let Some(cb) = cb {
            if !h.side.borrow().ready.is_empty() {
                n += h.deliver_ready(cb, ctx)?;
            }
        }
        Ok(n.min(i32::MAX as usize) as c_int)
    })
}

/// Waits until every rank this handle reaches has called btl_barrier as
/// often (with transport sm-local: the ranks of this node). Progresses
/// everything meanwhile; messages that arrive are kept for the next
/// btl_progress. Ends with BTL_ERR_PEER_FAILED naming a rank that failed
/// before arriving, BTL_ERR_TIMEOUT after BTL_TIMEOUT.
///
/// # Safety
///
/// `h` a handle.
#[no_mangle]
pub unsafe extern "C" fn btl_barrier(h: *mut btl_t) -> c_int {
    entry("btl_barrier", || {
        // SAFETY: the caller's handle.
        let h = unsafe { handle(h) }?;
        let w = h.world()?;
        h.drain(w);
        w.barrier()?;
        Ok(BTL_OK)
    })
}

// ---------------------------------------------------------------- memory

/// Registers `len` bytes at `base` (the caller's memory): peers may get
/// from and put into it through `*key` (send them btl_key_pack's bytes),
/// and btl_iput/btl_iget use it as their local side. The memory must stay
/// valid until btl_deregister succeeds or the handle is finalized, and is
/// not to be touched by the caller while operations on it run. Allowed
/// inside an event callback.
///
/// # Safety
///
/// `h` a handle; `base` points to `len` readable and writable bytes;
/// `key` writable.
#[no_mangle]
pub unsafe extern "C" fn btl_register(
    h: *mut btl_t,
    base: *mut c_void,
    len: usize,
    key: *mut btl_key_t,
) -> c_int {
    entry("btl_register", || {
        // SAFETY: the caller's handle.
        let h = unsafe { handle(h) }?;
        need(base.cast_const().cast::<u8>(), "base")?;
        need(key, "key")?;
        if len == 0 {
            return Err(fail(BTL_ERR_ARG, "len is 0 (nothing to register)"));
        }
        if len > isize::MAX as usize || (base as usize).checked_add(len).is_none() {
            return Err(fail(BTL_ERR_ARG, "base + len overflows"));
        }
        let k = h.with_regions(|r| match r {
            // SAFETY: the caller's promise on the memory.
            Ok(cx) => unsafe { cx.register_raw(base.cast(), len) },
            // SAFETY: as above.
            Err(w) => unsafe { w.register_raw(base.cast(), len) },
        })?;
        // SAFETY: checked.
        unsafe {
            key.write(btl_key_t {
                rank: k.rank,
                id: k.id,
                len: k.len,
                base: base as u64,
            })
        };
        Ok(BTL_OK)
    })
}

/// Removes one of our regions: later requests naming it (ours or peers')
/// are refused. BTL_ERR_BUSY while operations of ours use it, or while a
/// peer's get is answered from it (over shared memory, and over TCP for
/// answers of 32 KiB or more: progress and retry); BTL_ERR_KEY
/// for a key that is not ours or names no region. Allowed inside an event
/// callback.
///
/// # Safety
///
/// `h` a handle; `key` readable.
#[no_mangle]
pub unsafe extern "C" fn btl_deregister(h: *mut btl_t, key: *const btl_key_t) -> c_int {
    entry("btl_deregister", || {
        // SAFETY: the caller's handle.
        let h = unsafe { handle(h) }?;
        need(key, "key")?;
        // SAFETY: checked.
        let k = unsafe { key.read() };
        if k.rank != h.rank {
            return Err(fail(
                BTL_ERR_KEY,
                format!("the key is rank {}'s, not ours ({})", k.rank, h.rank),
            ));
        }
        let rk = RegionKey {
            rank: k.rank,
            id: k.id,
            len: k.len,
        };
        h.with_regions(|r| match r {
            Ok(cx) => cx.deregister(&rk),
            Err(w) => w.deregister(&rk),
        })?;
        Ok(BTL_OK)
    })
}

/// Packs `*key` into BTL_KEY_BYTES bytes at `out` (little endian), to
/// send to peers.
///
/// # Safety
///
/// `key` readable; `out` points to BTL_KEY_BYTES writable bytes.
#[no_mangle]
pub unsafe extern "C" fn btl_key_pack(key: *const btl_key_t, out: *mut u8) -> c_int {
    entry("btl_key_pack", || {
        need(key, "key")?;
        need(out, "out")?;
        // SAFETY: checked.
        let k = unsafe { key.read() };
        let mut b = [0u8; BTL_KEY_BYTES];
        b[..RegionKey::LEN].copy_from_slice(
            &RegionKey {
                rank: k.rank,
                id: k.id,
                len: k.len,
            }
            .to_bytes(),
        );
        b[RegionKey::LEN..].copy_from_slice(&k.base.to_le_bytes());
        // SAFETY: the caller's BTL_KEY_BYTES writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), out, BTL_KEY_BYTES) };
        Ok(BTL_OK)
    })
}

/// Unpacks btl_key_pack's bytes (`len` must be BTL_KEY_BYTES) into
/// `*key`. The key is only decoded here: its owner validates it on use.
///
/// # Safety
///
/// `bytes` points to `len` readable bytes; `key` writable.
#[no_mangle]
pub unsafe extern "C" fn btl_key_unpack(
    bytes: *const c_void,
    len: usize,
    key: *mut btl_key_t,
) -> c_int {
    entry("btl_key_unpack", || {
        need(bytes.cast::<u8>(), "bytes")?;
        need(key, "key")?;
        if len != BTL_KEY_BYTES {
            return Err(fail(
                BTL_ERR_KEY,
                format!("a packed key is {BTL_KEY_BYTES} bytes, not {len}"),
            ));
        }
        // SAFETY: checked: `len` readable bytes.
        let b = unsafe { slice(bytes.cast(), len) };
        let rk = RegionKey::from_bytes(&b[..RegionKey::LEN])
            .ok_or_else(|| fail(BTL_ERR_KEY, "malformed key"))?;
        let mut base = [0u8; 8];
        base.copy_from_slice(&b[RegionKey::LEN..]);
        // SAFETY: checked.
        unsafe {
            key.write(btl_key_t {
                rank: rk.rank,
                id: rk.id,
                len: rk.len,
                base: u64::from_le_bytes(base),
            })
        };
        Ok(BTL_OK)
    })
}

// ---------------------------------------------------------------- one-sided

/// Checks and posts a put or get.
///
/// # Safety
///
/// Pointers as btl_iput's.
#[allow(clippy::too_many_arguments)]
unsafe fn rma(
    h: *mut btl_t,
    put: bool,
    local: *const btl_key_t,
    local_addr: usize,
    remote: *const btl_key_t,
    remote_addr: u64,
    len: usize,
    ctx: *mut c_void,
) -> Result<c_int, Fail> {
    // SAFETY: the caller's handle.
    let h = unsafe { handle(h) }?;
    need(local, "local")?;
    need(remote, "remote")?;
    if len == 0 {
        return Err(fail(BTL_ERR_ARG, "len is 0"));
    }
    // SAFETY: checked.
    let (l, r) = unsafe { (local.read(), remote.read()) };
    if l.rank != h.rank {
        return Err(fail(
            BTL_ERR_KEY,
            format!("the local key is rank {}'s, not ours ({})", l.rank, h.rank),
        ));
    }
    let len64 = len as u64;
    let local_off = (local_addr as u64)
        .checked_sub(l.base)
        .filter(|o| o.checked_add(len64).is_some_and(|end| end <= l.len))
        .ok_or_else(|| {
            fail(
                BTL_ERR_RANGE,
                format!(
                    "local {len} bytes at {local_addr:#x} are outside the region [{:#x}, +{})",
                    l.base, l.len
                ),
            )
        })?;
    let remote_off = remote_addr.checked_sub(r.base).ok_or_else(|| {
        fail(
            BTL_ERR_RANGE,
            format!(
                "remote address {remote_addr:#x} is below the region's base {:#x}",
                r.base
            ),
        )
    })?;
    h.peer(r.rank)?;
    if h.busy.get() == Busy::Connecting {
        return Err(fail(BTL_ERR_STATE, "not allowed during btl_connect"));
    }
    let lk = RegionKey {
        rank: l.rank,
        id: l.id,
        len: l.len,
    };
    let rk = RegionKey {
        rank: r.rank,
        id: r.id,
        len: r.len,
    };
    if h.must_defer() {
        h.side.borrow_mut().deferred.push_back(Deferred::Rma {
            put,
            local: lk,
            local_off,
            remote: rk,
            remote_off,
            len: len64,
            ctx: ctx as usize,
        });
        return Ok(BTL_OK);
    }
    let w = h.world()?;
    let req = if put {
        w.iput(&lk, local_off, &rk, remote_off, len64)
    } else {
        w.iget(&lk, local_off, &rk, remote_off, len64)
    };
    h.track(req, ctx as usize, r.rank, false)
}

/// Writes `len` bytes at `local_addr` — inside our region `*local` — to
/// address `remote_addr` of the region `*remote` (any rank's; the offset
/// is `remote_addr - remote->base`). Returns BTL_OK (a BTL_EVENT_DONE with
/// `ctx` follows: BTL_OK, or BTL_ERR_REFUSED when the target refused the
/// range or region, BTL_ERR_PEER_FAILED) or BTL_DONE (completed at once:
/// a put to ourselves is refused, if at all, by the event). Local ranges
/// outside the region are BTL_ERR_RANGE at once.
///
/// # Safety
///
/// `h` a handle; `local`, `remote` readable keys; the local memory stays
/// untouched by the caller until completion.
#[no_mangle]
pub unsafe extern "C" fn btl_iput(
    h: *mut btl_t,
    local: *const btl_key_t,
    local_addr: *const c_void,
    remote: *const btl_key_t,
    remote_addr: u64,
    len: usize,
    ctx: *mut c_void,
) -> c_int {
    entry("btl_iput", || {
        // SAFETY: the caller's arguments.
        unsafe {
            rma(
                h,
                true,
                local,
                local_addr as usize,
                remote,
                remote_addr,
                len,
                ctx,
            )
        }
    })
}

/// Reads `len` bytes at address `remote_addr` of the region `*remote`
/// into `local_addr`, inside our region `*local`. Completion as btl_iput;
/// BTL_DONE also when a rank of this node published the region and the
/// bytes were read at once by single copy (no event follows).
///
/// # Safety
///
/// As btl_iput; the local memory is written until completion.
#[no_mangle]
pub unsafe extern "C" fn btl_iget(
    h: *mut btl_t,
    local: *const btl_key_t,
    local_addr: *mut c_void,
    remote: *const btl_key_t,
    remote_addr: u64,
    len: usize,
    ctx: *mut c_void,
) -> c_int {
    entry("btl_iget", || {
        // SAFETY: the caller's arguments.
        unsafe {
            rma(
                h,
                false,
                local,
                local_addr as usize,
                remote,
                remote_addr,
                len,
                ctx,
            )
        }
    })
}

// ---------------------------------------------------------------- parameters

/// The number of parameters of `component` (`sm` or `tcp`) in `*count`.
///
/// # Safety
///
/// `component` NUL-terminated; `count` writable.
#[no_mangle]
pub unsafe extern "C" fn btl_param_count(component: *const c_char, count: *mut usize) -> c_int {
    entry("btl_param_count", || {
        // SAFETY: the caller's string.
        let c = unsafe { text(component, "component") }?;
        need(count, "count")?;
        let defs = params::component(c).ok_or_else(|| {
            fail(
                BTL_ERR_PARAM,
                format!("unknown component {c:?} (sm or tcp)"),
            )
        })?;
        // SAFETY: checked.
        unsafe { count.write(defs.len()) };
        Ok(BTL_OK)
    })
}

/// The definition of parameter `index` (0 .. count-1, registration
/// order) of `component` in `*out`: name, type, default, accepted values,
/// help, Open MPI info level, environment names — btl's own registry, for
/// an Open MPI component to register each as an MCA variable.
///
/// # Safety
///
/// `component` NUL-terminated; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn btl_param_info(
    component: *const c_char,
    index: usize,
    out: *mut btl_param_info_t,
) -> c_int {
    entry("btl_param_info", || {
        // SAFETY: the caller's string.
        let c = unsafe { text(component, "component") }?;
        need(out, "out")?;
        let defs = params::component(c).ok_or_else(|| {
            fail(
                BTL_ERR_PARAM,
                format!("unknown component {c:?} (sm or tcp)"),
            )
        })?;
        let s = defs.get(index).ok_or_else(|| {
            fail(
                BTL_ERR_ARG,
                format!(
                    "component {c} has {} parameters, not {}",
                    defs.len(),
                    index + 1
                ),
            )
        })?;
        // SAFETY: checked, writable.
        let o = unsafe { &mut *out };
        params::fill(s, o);
        Ok(BTL_OK)
    })
}
