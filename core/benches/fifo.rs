//! FIFO benchmark: two threads of one process exchanging through btl-core's
//! real `Fifo` over a plain memory region.
//!
//! - ping-pong: one value bounces between two rings (A→B, B→A); the figure is
//!   the one-way latency (half the round trip), beside a bare cache-line
//!   ping-pong measured in the same run (the floor any shared-memory ring
//!   pays: two cache-line transfers per round trip);
//! - streaming: one (or two) writer threads push as fast as they can, one
//!   reader pops; the figure is messages per second.
//!
//! Threads are pinned to cores 0 and 1 when the machine allows it (say so
//! otherwise). Run: `cargo bench -p btl-core --bench fifo [-- --quick | --short]`.
//! Speed is measured here, never asserted in tests.

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use btl_core::sm::fifo::Fifo;
use common::{
    cacheline_pingpong, fifo_pingpong, median, pin, push_spin, start, Memory, FIFO_SIZE, LAZY_FREE,
};

/// Messages per second from `writers` threads to one reader.
fn streaming(writers: u64, per_writer: u64) -> f64 {
    let mem = Memory::new(Fifo::memory_size(FIFO_SIZE).unwrap());
    let region = mem.region();
    // SAFETY: fresh memory.
    let fifo = unsafe { Fifo::init(&region, 0, FIFO_SIZE, LAZY_FREE) }.unwrap();
    let total = writers * per_writer;
    let mut elapsed = Duration::ZERO;
    std::thread::scope(|s| {
        for w in 0..writers {
            let mut p = fifo.producer();
            s.spawn(move || {
                pin(1); // 2 cores here: the writers share core 1
                for i in 0..per_writer {
                    push_spin(&mut p, (w << 40) | i);
                }
            });
        }
        pin(0);
        let mut c = fifo.claim_consumer().unwrap();
        let mut next = vec![0u64; writers as usize];
        let start = Instant::now();
        let mut got = 0;
        while got < total {
            if let Some(v) = c.pop() {
                let w = (v >> 40) as usize;
                assert_eq!(v & ((1 << 40) - 1), next[w]);
                next[w] += 1;
                got += 1;
            } else {
                std::hint::spin_loop();
            }
        }
        elapsed = start.elapsed();
        black_box(&next);
    });
    total as f64 / elapsed.as_secs_f64()
}

fn main() {
    let (iters, msgs, reps) = start(&format!(
        "btl-core FIFO benchmark: fifo_size {FIFO_SIZE}, lazy_free {LAZY_FREE}"
    ));
    // Interleave the rows so drift on a shared machine hits both alike.
    let mut line = Vec::new();
    let mut fifo = Vec::new();
    let mut one = Vec::new();
    let mut two = Vec::new();
    for _ in 0..reps {
        line.push(cacheline_pingpong(iters));
        fifo.push(fifo_pingpong(iters));
        one.push(streaming(1, msgs));
        two.push(streaming(2, msgs / 2));
    }
    let (line, fifo) = (median(line), median(fifo));
    println!("{:<40} {:>12}", "measure", "value");
    println!("{:<40} {:>9.1} ns", "cache-line ping-pong, one way", line);
    println!(
        "{:<40} {:>9.1} ns  ({:.2}x the cache line)",
        "FIFO ping-pong, one way",
        fifo,
        fifo / line
    );
    println!(
        "{:<40} {:>9.2} M/s",
        "FIFO streaming, 1 writer -> 1 reader",
        median(one) / 1e6
    );
    println!(
        "{:<40} {:>9.2} M/s",
        "FIFO streaming, 2 writers -> 1 reader",
        median(two) / 1e6
    );
}
