//! Who is in the job and how they are reached: rank, size, reachability
//! and the message sizes per peer.

use std::os::raw::c_int;

use crate::codes::{BTL_ERR_UNREACHABLE, BTL_OK};
use crate::error::{entry, need};
use crate::handle::{btl_t, handle};
use crate::types::btl_limits_t;

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
