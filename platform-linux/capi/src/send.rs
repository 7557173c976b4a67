//! Active messages: btl_sendi (copied now, or queued inside a callback)
//! and btl_isend (read in place until its completion event).

use std::ffi::c_void;
use std::os::raw::c_int;

use btl_linux::ops::{RawBuf, RawParts};
use btl_linux::world::MAX_USER_TAG;

use crate::codes::{BTL_DONE, BTL_ERR_STATE, BTL_ERR_TAG, BTL_ERR_WOULD_BLOCK, BTL_OK};
use crate::deferred::Deferred;
use crate::error::{entry, fail, Fail};
use crate::handle::{btl_t, handle, Busy};
use crate::iov::{iov_array, with_pieces};
use crate::types::btl_iovec_t;

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
