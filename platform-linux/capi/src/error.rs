//! Failures at the C boundary: a code and a message kept per thread for
//! btl_last_error, the entry wrapper that catches panics, argument checks
//! (NULL, alignment, C strings), and btl_strerror / btl_last_error.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::fmt::Display;
use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use btl_core::rma::RmaStatus;
use btl_linux::world::WorldError;

use crate::codes::{
    BTL_DONE, BTL_ERR_ARG, BTL_ERR_BUSY, BTL_ERR_FINALIZED, BTL_ERR_INTERNAL, BTL_ERR_KEY,
    BTL_ERR_PARAM, BTL_ERR_PEER_FAILED, BTL_ERR_RANGE, BTL_ERR_RANK, BTL_ERR_REFUSED,
    BTL_ERR_REMOTE, BTL_ERR_STATE, BTL_ERR_TAG, BTL_ERR_TIMEOUT, BTL_ERR_TOO_LARGE,
    BTL_ERR_TRANSPORT, BTL_ERR_UNREACHABLE, BTL_ERR_WIREUP, BTL_ERR_WOULD_BLOCK, BTL_OK,
};

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// A failure: its code and its message.
pub(crate) struct Fail {
    pub(crate) code: c_int,
    msg: String,
}

/// A failure with its message. Cold and out of line: the calls' fast
/// paths stay small enough to inline (a successful call formats nothing).
#[cold]
#[inline(never)]
pub(crate) fn fail(code: c_int, msg: impl Display) -> Fail {
    Fail {
        code,
        msg: msg.to_string(),
    }
}

/// The code of a job-API error.
pub(crate) fn code_of(e: &WorldError) -> c_int {
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
pub(crate) fn entry(name: &'static str, f: impl FnOnce() -> Result<c_int, Fail>) -> c_int {
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
pub(crate) fn need<T>(p: *const T, what: &'static str) -> Result<(), Fail> {
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
pub(crate) unsafe fn text<'a>(p: *const c_char, what: &'static str) -> Result<&'a str, Fail> {
    need(p, what)?;
    // SAFETY: not NULL; the caller's promise of a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| fail(BTL_ERR_ARG, format!("{what} is not UTF-8")))
}

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
