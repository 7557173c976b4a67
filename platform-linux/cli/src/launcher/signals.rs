//! Catching SIGINT, SIGTERM and SIGHUP while a launch runs.
//!
//! # Safety
//!
//! This is the module's only `unsafe` code: `sigaction(2)` through `libc`
//! (rustix has no safe signal-handler API). The handler, [`record`], only
//! stores the signal number into an atomic, which is async-signal-safe; the
//! supervision loop picks it up with [`take`].
#![allow(unsafe_code)]

use btl_core::sync::{AtomicU32, Ordering};
use std::io;
use std::ptr;

/// The last signal received and not yet taken (0: none). From the
/// core's atomics shim, like every atomic of the project; a lock-free
/// 32-bit store is async-signal-safe.
static PENDING: AtomicU32 = AtomicU32::new(0);

/// The signals the launcher catches and forwards.
const CAUGHT: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The signal handler: records the signal, nothing else.
extern "C" fn record(sig: libc::c_int) {
    PENDING.store(sig as u32, Ordering::Relaxed);
}

/// The signal received since the last call, if any.
pub(super) fn take() -> Option<i32> {
    match PENDING.swap(0, Ordering::Relaxed) {
        0 => None,
        sig => Some(sig as i32),
    }
}

/// The caught signals' previous dispositions, restored on drop.
pub(super) struct Catch {
    saved: Vec<(libc::c_int, libc::sigaction)>,
}

impl Catch {
    /// Catches [`CAUGHT`] with [`record`], except signals that are
    /// ignored now (they stay ignored).
    pub(super) fn install() -> io::Result<Catch> {
        PENDING.store(0, Ordering::Relaxed);
        let mut catch = Catch { saved: Vec::new() };
        for sig in CAUGHT {
            // SAFETY: `sigaction` is a plain C struct (integers, a
            // handler address, a signal set, an optional function
            // pointer); all-zero bytes is a valid value of it (SIG_DFL,
            // empty mask, no flags, no restorer).
            let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
            action.sa_sigaction = record as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            // SAFETY: `action.sa_mask` is a valid, writable `sigset_t`.
            unsafe { libc::sigemptyset(&mut action.sa_mask) };
            // SAFETY: as for `action` above.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: both pointers are valid for the call; `record` is a
            // `'static` function that only performs an atomic store,
            // which is async-signal-safe.
            if unsafe { libc::sigaction(sig, &action, &mut old) } != 0 {
                return Err(io::Error::last_os_error());
            }
            if old.sa_sigaction == libc::SIG_IGN {
                // SAFETY: `old` is the disposition the kernel just
                // returned; the pointer is valid, the old-action pointer
                // may be null.
                unsafe { libc::sigaction(sig, &old, ptr::null_mut()) };
            } else {
                catch.saved.push((sig, old));
            }
        }
        Ok(catch)
    }
}

impl Drop for Catch {
    fn drop(&mut self) {
        for (sig, old) in &self.saved {
            // SAFETY: `old` is a disposition the kernel returned for
            // `sig`; the pointer is valid, the old-action pointer may be
            // null.
            unsafe { libc::sigaction(*sig, old, ptr::null_mut()) };
        }
    }
}
