//! Helpers for the loom models in `tests/`: a cache-line aligned buffer that
//! several loom threads share, holding a ring (or a fast box) initialised in
//! place by btl-core's real [`btl_core::sm::fifo::Fifo`] (or
//! [`btl_core::sm::fbox::Fbox`]) code.
//!
//! Run the models with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p btl-loom-tests --release`.
//! Without `--cfg loom` the models are compiled out.
#![cfg_attr(not(loom), allow(dead_code))]
// The buffer is raw memory shared by the model's threads.
#![allow(unsafe_code)]

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use btl_core::shm::Region;
use btl_core::sm::fifo::Fifo;

/// Raw memory for one ring, freed on drop. Share it between model threads
/// with an `Arc`; it must outlive every [`Region`] made from it.
#[derive(Debug)]
pub struct RingMemory {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is only accessed through btl-core's atomics (via
// Region), which are Sync; the pointer itself is just an address.
unsafe impl Send for RingMemory {}
// SAFETY: as above.
unsafe impl Sync for RingMemory {}

impl RingMemory {
    /// Memory for a ring of `slots` slots.
    pub fn new(slots: u32) -> Self {
        Self::with_bytes(Fifo::memory_size(slots).expect("ring size"))
    }

    /// `bytes` bytes of zeroed, cache-line aligned memory (for structures
    /// other than one ring: a fast box, or a box and its rings).
    pub fn with_bytes(bytes: usize) -> Self {
        assert!(bytes > 0, "empty memory");
        let layout = Layout::from_size_align(bytes, Fifo::ALIGN).expect("layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).expect("allocation");
        Self { ptr, layout }
    }

    /// A region over the memory.
    ///
    /// The caller keeps `self` (its `Arc`) alive while the region is used;
    /// every model joins its threads before dropping it.
    pub fn region(&self) -> Region<'static> {
        // SAFETY: the allocation is live until `self` drops (the models hold
        // an Arc in every thread and join them first) and is accessed only
        // through btl-core's atomics.
        unsafe { Region::from_raw_parts(self.ptr, self.layout.size()) }
    }

    /// Initialises a ring in the memory and returns it.
    pub fn init(&self, slots: u32, lazy_free: u32) -> Fifo<'static> {
        let region = self.region();
        // SAFETY: called once per model execution, before any thread is
        // spawned, so nothing else accesses the memory.
        unsafe { Fifo::init(&region, 0, slots, lazy_free) }.expect("fifo init")
    }
}

impl Drop for RingMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
