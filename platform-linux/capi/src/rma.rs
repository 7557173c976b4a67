//! One-sided operations: btl_iput and btl_iget between registered
//! regions, checked against the keys and posted (or queued inside a
//! callback).

use std::ffi::c_void;
use std::os::raw::c_int;

use btl_linux::world::RegionKey;

use crate::codes::{BTL_ERR_ARG, BTL_ERR_KEY, BTL_ERR_RANGE, BTL_ERR_STATE, BTL_OK};
use crate::deferred::Deferred;
use crate::error::{entry, fail, need, Fail};
use crate::handle::{btl_t, handle, Busy};
use crate::types::btl_key_t;

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
        let local_addr = local_addr as usize;
        // SAFETY: `rma` asks what btl_iput's contract gives: `h` a handle,
        // `local`/`remote` readable keys, the local memory left alone
        // until completion.
        unsafe { rma(h, true, local, local_addr, remote, remote_addr, len, ctx) }
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
        let local_addr = local_addr as usize;
        // SAFETY: `rma` asks what btl_iget's contract gives: `h` a handle,
        // `local`/`remote` readable keys, the local memory left alone
        // until completion.
        unsafe { rma(h, false, local, local_addr, remote, remote_addr, len, ctx) }
    })
}
