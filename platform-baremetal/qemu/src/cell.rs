//! Static memory handed out once: the node's buffers live in `.bss` (or
//! `.data`), sized at build time, and each is borrowed mutably for the
//! rest of the program by whoever takes it first. No allocator.
//!
//! # Safety
//!
//! [`Once::take`] returns the `&'static mut` of its value at most once (an
//! atomic flag), so no two mutable references to it ever exist.
#![allow(unsafe_code)]

use btl_baremetal::core::sync::{AtomicBool, Ordering};
use core::cell::UnsafeCell;

/// A value in static memory that can be taken (borrowed mutably for
/// `'static`) once.
pub struct Once<T> {
    taken: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reachable only through `take`, which hands it out
// at most once; `T: Send` lets that one owner be on any hart.
unsafe impl<T: Send> Sync for Once<T> {}

impl<T> Once<T> {
    /// A cell holding `value` (in `.bss` when it is all zeros).
    pub const fn new(value: T) -> Self {
        Self {
            taken: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// The value, the first time; `None` after.
    // A `&mut` out of `&self` is the point (as `static_cell` does): the
    // flag makes it the only one.
    #[allow(clippy::mut_from_ref)]
    pub fn take(&'static self) -> Option<&'static mut T> {
        if self.taken.swap(true, Ordering::AcqRel) {
            return None;
        }
        // SAFETY: the flag was clear: this is the only reference ever
        // made to the value (see the module's safety note).
        Some(unsafe { &mut *self.value.get() })
    }
}

impl<T> core::fmt::Debug for Once<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Once")
            .field("taken", &self.taken.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Page-aligned bytes (DMA memory).
#[repr(C, align(4096))]
#[derive(Debug)]
pub struct Pages<const N: usize>(pub [u8; N]);
