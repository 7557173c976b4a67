//! Who is in the job and how they are reached: rank, size, reachability
//! and the message sizes per peer.

use std::os::raw::c_int;

use crate::codes::{BTL_ERR_UNREACHABLE, BTL_OK};
use crate::error::{entry, need, Fail};
use crate::handle::{btl_t, handle};
use crate::types::btl_limits_t;

/// This rank in `*rank`.
///
/// # Safety
///
/// `h` a handle; `rank` writable.
#[no_mangle]
pub unsafe extern "C" fn btl_rank(h: *const btl_t, rank: *mut u32) -> c_int {
    // SAFETY: `answer` asks for a handle and a writable `out`, which
    // btl_rank's contract gives (`h`, `rank`).
    unsafe { answer("btl_rank", h, rank, "rank", |h| Ok(h.rank)) }
}

/// The number of ranks in `*size`.
///
/// # Safety
///
/// `h` a handle; `size` writable.
#[no_mangle]
pub unsafe extern "C" fn btl_size(h: *const btl_t, size: *mut u32) -> c_int {
    // SAFETY: `answer` asks for a handle and a writable `out`, which
    // btl_size's contract gives (`h`, `size`).
    unsafe { answer("btl_size", h, size, "size", |h| Ok(h.size)) }
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
    // SAFETY: `answer` asks for a handle and a writable `out`, which
    // btl_limits's contract gives (`h`, `out`).
    unsafe {
        answer("btl_limits", h, out, "out", |h| {
            let l = h.peer(rank)?.limits;
            Ok(btl_limits_t {
                eager: l.eager,
                max_send: l.max_send,
                max_message: l.max_message,
            })
        })
    }
}

/// The C function `name` answering through `*out` (`what` in messages):
/// checks the handle, then `out`, then writes what `f` finds.
///
/// # Safety
///
/// `h` a handle; `out` writable.
unsafe fn answer<T>(
    name: &'static str,
    h: *const btl_t,
    out: *mut T,
    what: &'static str,
    f: impl FnOnce(&btl_t) -> Result<T, Fail>,
) -> c_int {
    entry(name, || {
        // SAFETY: the caller's handle.
        let h = unsafe { handle(h) }?;
        need(out, what)?;
        let v = f(h)?;
        // SAFETY: `out` is not NULL (`need`) and writable (this
        // function's contract).
        unsafe { out.write(v) };
        Ok(BTL_OK)
    })
}
