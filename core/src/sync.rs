//! The one source of atomics and cells for the whole core.
//!
//! Under `cfg(loom)` everything comes from `loom`, so the loom models in
//! `loom-tests/` check the real code; otherwise atomics come from
//! `portable-atomic`, so targets without native 64-bit atomics (or without
//! compare-and-swap, with the `critical-section` feature) still build.
//!
//! Cross-process use of the shared-memory structures requires *lock-free*
//! 64-bit atomics ([`SHARED_MEMORY_ATOMICS`]): portable-atomic's fallback
//! for targets without them is a lock table private to one address space,
//! which is fine for threads but meaningless between processes. Adapters
//! that map memory shared between processes check this constant.
//!
//! Direct use of `core::sync::atomic` elsewhere in the crate is banned by
//! `clippy.toml` (`disallowed-types`).
#![allow(clippy::disallowed_types)]

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
#[cfg(not(loom))]
pub use portable_atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize};

pub use core::sync::atomic::Ordering;

/// True when 64-bit atomics are lock-free on this target, the condition for
/// sharing the core's structures between processes.
#[cfg(not(loom))]
pub const SHARED_MEMORY_ATOMICS: bool = portable_atomic::AtomicU64::is_always_lock_free();
/// True when 64-bit atomics are lock-free on this target (always, under loom).
#[cfg(loom)]
pub const SHARED_MEMORY_ATOMICS: bool = true;

/// Hint for a spin-wait loop: a CPU pause normally; under loom a yield, so
/// the model checker explores the other threads instead of spinning.
#[inline]
pub fn spin_loop() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}

/// `UnsafeCell` with closure-based access (`with` / `with_mut`), so that loom
/// can track every access; the std build compiles to raw pointer access.
pub mod cell {
    #[cfg(loom)]
    pub use loom::cell::UnsafeCell;

    /// `core::cell::UnsafeCell` with loom's `with`/`with_mut` interface.
    #[cfg(not(loom))]
    #[derive(Debug, Default)]
    #[repr(transparent)]
    pub struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

    #[cfg(not(loom))]
    impl<T> UnsafeCell<T> {
        /// Wraps `data`.
        pub const fn new(data: T) -> Self {
            Self(core::cell::UnsafeCell::new(data))
        }
        /// Gives `f` a const pointer to the contents.
        #[inline]
        pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }
        /// Gives `f` a mutable pointer to the contents.
        #[inline]
        pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

/// Size of the unit of false sharing on this architecture.
///
/// 128 bytes on x86_64 (the spatial prefetcher pulls cache lines in pairs,
/// Intel optimization manual §3.7.3) and on aarch64 (big cores such as
/// Apple M-series and Neoverse use 128-byte lines); 64 bytes elsewhere, as
/// crossbeam's `CachePadded` reasons.
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "powerpc64"
))]
pub const CACHE_LINE: usize = 128;
/// Size of the unit of false sharing on this architecture.
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "powerpc64"
)))]
pub const CACHE_LINE: usize = 64;

/// Pads and aligns `T` to [`CACHE_LINE`] so that two of them never share a
/// cache line (head and tail of a ring, for instance).
#[cfg_attr(
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "powerpc64"
    ),
    repr(C, align(128))
)]
#[cfg_attr(
    not(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "powerpc64"
    )),
    repr(C, align(64))
)]
#[derive(Debug, Default)]
pub struct CachePadded<T>(pub T);

impl<T> core::ops::Deref for CachePadded<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_matches_cache_line() {
        assert_eq!(core::mem::align_of::<CachePadded<AtomicU64>>(), CACHE_LINE);
        assert_eq!(core::mem::size_of::<CachePadded<AtomicU64>>(), CACHE_LINE);
    }
}
