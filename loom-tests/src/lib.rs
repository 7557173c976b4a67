//! Helpers for the loom models in `tests/`: a cache-line aligned buffer that
//! several loom threads share, holding a ring (or a fast box) initialised in
//! place by btl-core's real [`btl_core::sm::fifo::Fifo`] (or
//! [`btl_core::sm::fbox::Fbox`]) code, and the memory of a whole segment for
//! the engine and control-area models.
//!
//! Run the models with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p btl-loom-tests --release`.
//! Without `--cfg loom` the models are compiled out. [`check`] is the
//! check that every `#[test]` there calls `loom::model` (`cargo test -p
//! btl-loom-tests --lib`, run by the test command's `loom` step).
#![cfg_attr(not(loom), allow(dead_code))]
// The buffer is raw memory shared by the model's threads.
#![allow(unsafe_code)]

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

pub mod check;

use btl_core::shm::Region;
use btl_core::sm::fifo::Fifo;

/// Raw memory for one ring, freed on drop. Share it between model threads
/// with an `Arc`; it must outlive every [`Region`] made from it.
#[derive(Debug)]
pub struct RingMemory(Memory);

impl RingMemory {
    /// Memory for a ring of `slots` slots.
    pub fn new(slots: u32) -> Self {
        Self::with_bytes(Fifo::memory_size(slots).expect("ring size"))
    }

    /// `bytes` bytes of zeroed, cache-line aligned memory (for structures
    /// other than one ring: a fast box, or a box and its rings).
    pub fn with_bytes(bytes: usize) -> Self {
        assert!(bytes > 0, "empty memory");
        Self(Memory::new(bytes, Fifo::ALIGN))
    }

    /// A region over the memory, for the calling thread (structures are
    /// initialised through it; their handles, which hold only atomics, go
    /// to the model's threads).
    ///
    /// # Safety
    ///
    /// `Region::from_raw_parts`' contract: the caller keeps `self` (its
    /// `Arc`) alive while the region is used (every model joins its threads
    /// before dropping it), and byte copies through regions of different
    /// threads are ordered.
    pub unsafe fn region(&self) -> Region<'static> {
        // SAFETY: the caller's.
        unsafe { self.0.region() }
    }

    /// Initialises a ring in the memory and returns it (its handles, not a
    /// region, go to the model's threads: only atomics cross them).
    ///
    /// The caller keeps `self` (its `Arc`) alive while the ring is used;
    /// every model joins its threads before dropping it.
    pub fn init(&self, slots: u32, lazy_free: u32) -> Fifo<'static> {
        // SAFETY: the allocation is live until `self` drops (the models hold
        // an Arc in every thread and join them first); this region copies no
        // bytes and does not leave this function.
        let region: Region<'static> = unsafe { self.0.region() };
        // SAFETY: called once per model execution, before any thread is
        // spawned, so nothing else accesses the memory.
        unsafe { Fifo::init(&region, 0, slots, lazy_free) }.expect("fifo init")
    }
}

/// Raw memory for a whole segment (zeroed, page aligned), freed on drop;
/// shared between model threads with an `Arc`. Each thread makes its own
/// [`Region`] over it ([`SegmentMemory::region`]): regions are not `Send`.
#[derive(Debug)]
pub struct SegmentMemory(Memory);

impl SegmentMemory {
    /// `bytes` zeroed bytes.
    pub fn new(bytes: usize) -> Self {
        Self(Memory::new(bytes, 4096))
    }

    /// A region over the memory, for the calling thread.
    ///
    /// # Safety
    ///
    /// `Region::from_raw_parts`' contract: `self` outlives the region (the
    /// models hold an `Arc` in every thread and join them first), and byte
    /// copies through regions of different threads are ordered (the models
    /// run one engine per thread, whose protocol orders them, and nothing
    /// else copies bytes).
    pub unsafe fn region(&self) -> Region<'_> {
        // SAFETY: the caller's.
        unsafe { self.0.region() }
    }
}

/// A zeroed allocation, freed on drop.
#[derive(Debug)]
struct Memory {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: only an allocation's address and layout; access goes through the
// regions made from it, under `Region::from_raw_parts`' contract.
unsafe impl Send for Memory {}
// SAFETY: as above.
unsafe impl Sync for Memory {}

impl Memory {
    fn new(bytes: usize, align: usize) -> Self {
        let layout = Layout::from_size_align(bytes.max(1), align).expect("layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).expect("allocation");
        Self { ptr, layout }
    }

    /// # Safety
    ///
    /// `Region::from_raw_parts`' contract, with `'a` no longer than `self`.
    unsafe fn region<'a>(&self) -> Region<'a> {
        // SAFETY: the caller's.
        unsafe { Region::from_raw_parts(self.ptr, self.layout.size()) }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
