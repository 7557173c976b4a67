//! What the benchmarks share: memory for a plain region, pinning, the
//! FIFO and cache-line ping-pongs (the rows every benchmark compares
//! against), and the median.
// Each benchmark uses its own subset.
#![allow(dead_code)]

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use btl_core::shm::Region;
use btl_core::sm::fifo::{Fifo, PushError};
use btl_core::sync::{AtomicU64, CachePadded, Ordering};

/// Seed defaults (`fifo_size`, `fifo_lazy_free`).
pub const FIFO_SIZE: u32 = 4096;
pub const LAZY_FREE: u32 = 120;

pub struct Memory {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Memory {
    pub fn new(bytes: usize) -> Self {
        let layout = Layout::from_size_align(bytes, 4096).expect("layout");
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).expect("alloc");
        Self { ptr, layout }
    }
    pub fn region(&self) -> Region<'_> {
        // SAFETY: the allocation lives as long as `self`, and is only
        // accessed through btl-core's atomics (and, in the engine
        // benchmark, through engines whose protocol orders their copies).
        unsafe { Region::from_raw_parts(self.ptr, self.layout.size()) }
    }
    /// The memory as an address another thread may make its own region of
    /// (`Region` is not `Send`).
    pub fn shared(&self) -> Shared {
        Shared(self.ptr, self.layout.size())
    }
}

/// [`Memory`] for another thread: see [`Shared::region`].
#[derive(Clone, Copy)]
pub struct Shared(NonNull<u8>, usize);

// SAFETY: only an address and a length; each thread makes its own region
// under `Region::from_raw_parts`' contract.
unsafe impl Send for Shared {}

impl Shared {
    /// A region over the memory, for the calling thread.
    ///
    /// # Safety
    ///
    /// `Region::from_raw_parts`' contract: the [`Memory`] outlives the
    /// region, and byte copies through regions of different threads are
    /// ordered (one engine per thread, whose protocol orders them).
    pub unsafe fn region<'a>(self) -> Region<'a> {
        // SAFETY: the caller's.
        unsafe { Region::from_raw_parts(self.0, self.1) }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

pub fn pin(cpu: usize) -> bool {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).is_ok()
}

pub fn push_spin(p: &mut btl_core::sm::fifo::Producer<'_>, v: u64) {
    let mut v = v;
    loop {
        match p.push(v) {
            Ok(()) => return,
            Err(PushError::Full(back)) => {
                v = back;
                std::hint::spin_loop();
            }
            Err(e) => panic!("push: {e}"),
        }
    }
}

/// Half round trip through two FIFOs, in nanoseconds.
pub fn fifo_pingpong(iters: u64) -> f64 {
    let ring = Fifo::memory_size(FIFO_SIZE).unwrap() as u64;
    let mem = Memory::new(2 * ring as usize);
    let region = mem.region();
    // SAFETY: fresh memory, nothing else accesses it yet.
    let ab = unsafe { Fifo::init(&region, 0, FIFO_SIZE, LAZY_FREE) }.unwrap();
    // SAFETY: as above, the second half.
    let ba = unsafe { Fifo::init(&region, ring, FIFO_SIZE, LAZY_FREE) }.unwrap();
    let mut elapsed = Duration::ZERO;
    std::thread::scope(|s| {
        let mut to_a = ba.producer();
        let mut from_a = ab.claim_consumer().unwrap();
        s.spawn(move || {
            pin(1);
            for _ in 0..iters {
                let v = loop {
                    if let Some(v) = from_a.pop() {
                        break v;
                    }
                    std::hint::spin_loop();
                };
                push_spin(&mut to_a, v + 1);
            }
        });
        pin(0);
        let mut to_b = ab.producer();
        let mut from_b = ba.claim_consumer().unwrap();
        let start = Instant::now();
        for i in 0..iters {
            push_spin(&mut to_b, i);
            let v = loop {
                if let Some(v) = from_b.pop() {
                    break v;
                }
                std::hint::spin_loop();
            };
            assert_eq!(v, i + 1);
        }
        elapsed = start.elapsed();
    });
    elapsed.as_nanos() as f64 / iters as f64 / 2.0
}

/// Half round trip of a bare cache line flipped between two threads, in ns.
pub fn cacheline_pingpong(iters: u64) -> f64 {
    let line = CachePadded(AtomicU64::new(0));
    let mut elapsed = Duration::ZERO;
    std::thread::scope(|s| {
        let line = &line;
        s.spawn(move || {
            pin(1);
            for i in 0..iters {
                while line.load(Ordering::Acquire) != 2 * i + 1 {
                    std::hint::spin_loop();
                }
                line.store(2 * i + 2, Ordering::Release);
            }
        });
        pin(0);
        let start = Instant::now();
        for i in 0..iters {
            line.store(2 * i + 1, Ordering::Release);
            while line.load(Ordering::Acquire) != 2 * i + 2 {
                std::hint::spin_loop();
            }
        }
        elapsed = start.elapsed();
    });
    elapsed.as_nanos() as f64 / iters as f64 / 2.0
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// How much each row runs, from the command line: `--quick`, `--short` (a
/// few thousand messages per row, for running the threads under miri or a
/// sanitizer, not for the figures), or the full run. `cargo bench` passes
/// `--bench`; anything else is ignored. Returns (ping-pong round trips,
/// streamed messages, runs per row).
pub fn run_lengths() -> (u64, u64, usize) {
    let quick = std::env::args().any(|a| a == "--quick");
    let short = std::env::args().any(|a| a == "--short");
    if short && cfg!(miri) {
        (20, 200, 1)
    } else if short {
        (2_000, 20_000, 1)
    } else if quick {
        (20_000, 200_000, 3)
    } else {
        (200_000, 5_000_000, 5)
    }
}

/// Pins the calling (main) thread to core 0 and says how the threads run.
pub fn pin_main() -> &'static str {
    if pin(0) {
        "pinned to cores 0 and 1"
    } else {
        "NOT pinned (sched_setaffinity refused)"
    }
}

/// The start of a benchmark's `main`: reads the run lengths, pins the main
/// thread and prints the header line (`title`, the runs per row, the
/// pinning). Returns [`run_lengths`]'s figures.
pub fn start(title: &str) -> (u64, u64, usize) {
    let (iters, msgs, reps) = run_lengths();
    let pinning = pin_main();
    println!("{title}, {reps} runs each, median; threads {pinning}");
    (iters, msgs, reps)
}
