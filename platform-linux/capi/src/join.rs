//! Joining and leaving a job: btl_init (the environment's wire-up), the
//! two phases of an external runtime (btl_open, btl_address, btl_connect)
//! and btl_finalize.

use std::ffi::c_void;
use std::os::raw::c_int;
use std::sync::PoisonError;

use btl_linux::wireup::Identity;
use btl_linux::world::World;

use crate::codes::{BTL_ERR_ARG, BTL_ERR_STATE, BTL_OK};
use crate::config::{btl_config_t, builder};
use crate::deferred::Side;
use crate::error::{entry, fail, need, text, Fail};
use crate::handle::{btl_t, handle, Busy, BusyGuard, State, DEAD, GRAVE};
use crate::types::{btl_fetch_fn, btl_identity_t};
use crate::wireup;

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
