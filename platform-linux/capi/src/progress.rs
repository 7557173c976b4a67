//! Progress: one non-blocking pass handing events to the C callback,
//! and the barrier.

use std::ffi::c_void;
use std::os::raw::c_int;

use crate::codes::BTL_OK;
use crate::error::entry;
use crate::handle::{btl_t, handle, Busy, BusyGuard, EventSink};
use crate::types::btl_event_fn;

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
        let sink = cb.map(|cb| EventSink { cb, ctx });
        let mut n = {
            // SAFETY: `busy` is `Callback`: reentrant calls never take a
            // reference into `state` while the poll runs (they queue, or
            // use the PollCx lent to the callback).
            let w = unsafe { h.world_unchecked() }?;
            let n = match sink {
                Some(to) => w.poll_with(|cx, ev| h.deliver(Some(cx), to, ev)),
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
        if let Some(to) = sink {
            if !h.side.borrow().ready.is_empty() {
                n += h.deliver_ready(to)?;
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
