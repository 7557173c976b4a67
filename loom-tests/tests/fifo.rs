//! loom models of the shared-memory FIFO: btl-core's real `Fifo`,
//! `Producer` and `Consumer`, with its atomics swapped for loom's by the
//! core's `sync` shim. Rings of 2–4 slots make wrap-around, full rings and
//! the lazy-free boundary happen within a few operations.
#![cfg(loom)]

use btl_core::sm::fifo::{Fifo, PushError};
use btl_core::sync::cell::UnsafeCell;
use btl_loom_tests::RingMemory;
use loom::sync::Arc;
use loom::thread;

/// Tries to push `v` up to `tries` times, yielding between tries while the
/// ring is full. Returns false if the ring stayed full (the value was handed
/// back unchanged). Any other error fails the model.
///
/// Every loop in these models is bounded: loom explores stale reads of
/// relaxed/acquire loads, so an unbounded spin on "full" or "empty" is an
/// infinite execution to it, though real hardware always makes progress.
fn push_tries(p: &mut btl_core::sm::fifo::Producer<'_>, v: u64, tries: usize) -> bool {
    for _ in 0..tries {
        match p.push(v) {
            Ok(()) => return true,
            Err(PushError::Full(back)) => {
                assert_eq!(back, v, "a full ring must hand the same value back");
                thread::yield_now();
            }
            Err(e) => panic!("push failed: {e}"),
        }
    }
    false
}

/// Payload cells standing in for fragments: the writer fills the cell of a
/// message before pushing its index; the reader reads it after popping. loom
/// flags the read if the push/pop pair does not order it after the write.
struct Payloads(Vec<UnsafeCell<u64>>);

// SAFETY (test): each cell is written by exactly one writer before the push
// that publishes its index, and read by the reader after the pop; loom's
// cell tracking verifies exactly that causality.
unsafe impl Sync for Payloads {}

impl Payloads {
    fn new(n: usize) -> Self {
        Self((0..n).map(|_| UnsafeCell::new(0)).collect())
    }
    fn write(&self, i: usize, v: u64) {
        // SAFETY: only writer of cell i, before publishing (see impl Sync).
        self.0[i].with_mut(|p| unsafe { *p = v });
    }
    fn read(&self, i: usize) -> u64 {
        // SAFETY: after the pop that published cell i (see impl Sync).
        self.0[i].with(|p| unsafe { *p })
    }
}

/// `writers` threads each push `per_writer` messages into a ring of `slots`
/// slots (lazy free every `lazy_free` reads) while the reader pops
/// concurrently; after the writers are joined the reader drains the rest.
///
/// A writer whose push still finds the ring full after a few tries stops
/// (keeping its order) and reports how many it sent. Asserts: every message
/// sent arrives exactly once, in per-writer order, with the payload written
/// before its push visible to the reader; nothing else arrives.
fn mpsc_model(slots: u32, lazy_free: u32, writers: u64, per_writer: u64) {
    let mem = Arc::new(RingMemory::new(slots));
    let fifo: Fifo<'static> = mem.init(slots, lazy_free);
    let total = (writers * per_writer) as usize;
    let payloads = Arc::new(Payloads::new(total));

    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let mem = mem.clone();
            let payloads = payloads.clone();
            let mut p = fifo.producer();
            thread::spawn(move || {
                let _keep = &mem;
                let mut sent = 0u64;
                for i in 0..per_writer {
                    let id = w * per_writer + i;
                    payloads.write(id as usize, 1000 + id);
                    if !push_tries(&mut p, id, 2) {
                        break;
                    }
                    sent += 1;
                }
                sent
            })
        })
        .collect();

    let mut c = fifo.claim_consumer().expect("claim");
    let mut next = vec![0u64; writers as usize];
    let mut check = |id: u64| {
        let w = (id / per_writer) as usize;
        assert!(w < writers as usize, "unknown value {id}");
        assert_eq!(id % per_writer, next[w], "writer {w} out of order");
        next[w] += 1;
        assert_eq!(payloads.read(id as usize), 1000 + id, "payload not visible");
    };
    // Concurrent phase: a bounded number of pop attempts.
    for _ in 0..total + 2 {
        match c.pop() {
            Some(id) => check(id),
            None => thread::yield_now(),
        }
    }
    let sent: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    // Quiescent phase: everything sent and not yet read is in the ring now.
    while let Some(id) = c.pop() {
        check(id);
    }
    assert_eq!(next, sent, "a message was lost or duplicated");
    drop(c);
}

#[test]
fn two_writers_one_reader_ring_of_4() {
    loom::model(|| mpsc_model(4, 2, 2, 2));
}

#[test]
fn two_writers_full_ring_of_2() {
    // 4 messages through 2 slots: both writers meet a full ring.
    loom::model(|| mpsc_model(2, 1, 2, 2));
}

#[test]
fn one_writer_wraps_ring_of_2_many_times() {
    loom::model(|| mpsc_model(2, 1, 1, 5));
}

#[test]
fn lazy_free_boundary_ring_of_4() {
    // lazy_free = 2 on 4 slots: slots come back in batches of two, so the
    // writer must wait for the batch boundary twice.
    loom::model(|| mpsc_model(4, 2, 1, 6));
}

#[test]
fn full_ring_hands_value_back_while_reader_runs() {
    loom::model(|| {
        let mem = Arc::new(RingMemory::new(2));
        let fifo = mem.init(2, 1);
        let mut p = fifo.producer();
        p.push(1).unwrap();
        p.push(2).unwrap();
        let reader = {
            let mem = mem.clone();
            thread::spawn(move || {
                let _keep = &mem;
                let mut c = fifo.claim_consumer().unwrap();
                let mut got = Vec::new();
                for _ in 0..3 {
                    if let Some(v) = c.pop() {
                        got.push(v);
                    }
                }
                got
            })
        };
        // Either accepted, or full with the value handed back unchanged.
        let accepted = push_tries(&mut p, 3, 1);
        let mut got = reader.join().unwrap();
        let mut c = fifo.claim_consumer().unwrap();
        got.extend(std::iter::from_fn(|| c.pop()));
        if accepted {
            assert_eq!(got, vec![1, 2, 3]);
        } else {
            assert_eq!(got, vec![1, 2]);
            // The ring is drained now: the handed-back value goes in.
            assert!(push_tries(&mut p, 3, 1));
            assert_eq!(c.pop(), Some(3));
        }
    });
}
