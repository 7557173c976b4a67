//! FIFO operation sequences checked against a simple model.
//!
//! The input picks a ring geometry and a sequence of operations: pushes by
//! one of several writers (interleaved as the input says), pops, explicit
//! lazy-free releases, and handing the ring to a new consumer (which must
//! resume where the old one stopped). The model is a queue plus the three
//! counters of the protocol (`head`, `tail`, `freed`): a push succeeds iff
//! `head - freed < size`, a pop returns the oldest value, and the reader
//! publishes `freed = tail` every `lazy_free` reads. Every answer of the
//! real ring must equal the model's, including "full" and "empty".
#![no_main]

use std::collections::VecDeque;

use arbitrary::Arbitrary;
use btl_core::sm::fifo::{Fifo, PushError, FREE};
use btl_core::shm::Region;
use btl_core::sync::{CachePadded, CACHE_LINE};
use libfuzzer_sys::fuzz_target;

const WRITERS: usize = 4;

#[derive(Arbitrary, Debug)]
enum Op {
    /// Writer `w % WRITERS` pushes `value` (bit 63 cleared unless `raw`, so
    /// that FREE itself is tried now and then).
    Push {
        w: u8,
        value: u64,
        raw: bool,
    },
    Pop,
    Release,
    /// Drop the consumer and claim the ring again.
    Reclaim,
    /// A fresh producer for writer `w` (its cached `freed` starts at 0).
    NewProducer {
        w: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    size_log2: u8,
    lazy: u8,
    ops: Vec<Op>,
}

struct Model {
    size: u64,
    lazy: u64,
    head: u64,
    tail: u64,
    freed: u64,
    queue: VecDeque<u64>,
}

impl Model {
    fn push(&mut self, value: u64) -> Result<(), PushError> {
        if value == FREE {
            return Err(PushError::InvalidValue(value));
        }
        if self.head - self.freed >= self.size {
            return Err(PushError::Full(value));
        }
        self.head += 1;
        self.queue.push_back(value);
        Ok(())
    }

    fn pop(&mut self) -> Option<u64> {
        let v = self.queue.pop_front()?;
        self.tail += 1;
        if self.tail - self.freed >= self.lazy {
            self.freed = self.tail;
        }
        Some(v)
    }
}

fuzz_target!(|input: Input| {
    let size = 1u32 << (input.size_log2 % 7 + 1); // 2 ..= 128 slots
    let lazy = u32::from(input.lazy) % (size / 2) + 1; // 1 ..= size / 2
    let bytes = Fifo::memory_size(size).unwrap();
    let mut mem: Vec<CachePadded<[u8; CACHE_LINE]>> = (0..bytes.div_ceil(CACHE_LINE))
        .map(|_| CachePadded([0; CACHE_LINE]))
        .collect();
    let len = mem.len() * CACHE_LINE;
    // SAFETY: CachePadded<[u8; CACHE_LINE]> is CACHE_LINE bytes with no
    // padding; `mem` is exclusively borrowed by the slice for its lifetime.
    let buf = unsafe { std::slice::from_raw_parts_mut(mem.as_mut_ptr().cast::<u8>(), len) };
    let region = Region::from_mut_slice(buf);
    // SAFETY: fresh memory that nothing else accesses.
    let fifo = unsafe { Fifo::init(&region, 0, size, lazy) }.unwrap();
    assert_eq!((fifo.size(), fifo.lazy_free()), (size, lazy));

    let mut producers: Vec<_> = (0..WRITERS).map(|_| fifo.producer()).collect();
    let mut consumer = Some(fifo.claim_consumer().unwrap());
    let mut model = Model {
        size: u64::from(size),
        lazy: u64::from(lazy),
        head: 0,
        tail: 0,
        freed: 0,
        queue: VecDeque::new(),
    };

    for op in input.ops.iter().take(4096) {
        let c = consumer.as_mut().unwrap();
        match *op {
            Op::Push { w, value, raw } => {
                let value = if raw { value } else { value & !(1 << 63) };
                let got = producers[usize::from(w) % WRITERS].push(value);
                assert_eq!(got, model.push(value), "push {value:#x}");
            }
            Op::Pop => assert_eq!(c.pop(), model.pop()),
            Op::Release => {
                c.release_consumed();
                model.freed = model.tail;
            }
            Op::Reclaim => {
                // The ring has one consumer at a time.
                assert!(fifo.claim_consumer().is_err());
                drop(consumer.take());
                consumer = Some(fifo.claim_consumer().unwrap());
            }
            Op::NewProducer { w } => producers[usize::from(w) % WRITERS] = fifo.producer(),
        }
        let c = consumer.as_ref().unwrap();
        assert_eq!(c.position(), model.tail);
        assert!(!c.reservation_pending(), "no push was left half done");
        assert_eq!(fifo.occupancy_hint(), model.head - model.freed);
    }
    // Drain: exactly the model's values, in order.
    let c = consumer.as_mut().unwrap();
    while let Some(v) = model.pop() {
        assert_eq!(c.pop(), Some(v));
    }
    assert_eq!(c.pop(), None);
});
