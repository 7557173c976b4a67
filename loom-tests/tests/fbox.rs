//! loom models of the fast box: btl-core's real `Fbox`, `FboxWriter` and
//! `FboxReader` (and, for the hand-off to the ring, its real `Fifo`), with
//! their atomics swapped for loom's by the core's `sync` shim. A 64-byte box
//! holds three 8-byte messages, so wrap records, a full box and the switch
//! to the ring happen within a handful of messages.
#![cfg(loom)]

use btl_core::shm::Region;
use btl_core::sm::fbox::{Fbox, FboxReader, FboxWriter, SendError};
use btl_core::sm::fifo::{Consumer, Fifo, Producer, PushError};
use btl_loom_tests::RingMemory;
use loom::sync::Arc;
use loom::thread;

const BOX: u32 = 64;
const SENDER: u32 = 1;

/// The bytes of message `id`: `len` bytes derived from it.
fn content(id: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (id * 37 + i * 11 + 1) as u8).collect()
}

/// A box at offset 0 of `region`: its reader and its writer.
fn open(region: &Region<'static>) -> (FboxReader<'static>, FboxWriter<'static>) {
    // SAFETY: called once per model execution, before any thread is
    // spawned, on memory nothing else accesses.
    let reader = unsafe { Fbox::init(region, 0, BOX, SENDER) }.expect("init");
    let writer = FboxWriter::attach(region, 0, SENDER).expect("attach");
    (reader, writer)
}

/// Tries to send message `id` up to `tries` times, yielding while the box
/// is full. Every loop in these models is bounded: loom explores stale
/// reads, so an unbounded wait is an infinite execution to it.
fn send_tries(w: &mut FboxWriter<'_>, id: usize, msg: &[u8], tries: usize) -> bool {
    for _ in 0..tries {
        match w.try_send(id as u8, msg, 0) {
            Ok(()) => return true,
            Err(SendError::Full) => thread::yield_now(),
            Err(e) => panic!("send failed: {e}"),
        }
    }
    false
}

/// Takes the next message and checks it is message `*next`, intact.
fn take_checked(reader: &mut FboxReader<'_>, sizes: &[usize], next: &mut usize) -> bool {
    let Some(rec) = reader.poll().expect("box corrupt") else {
        return false;
    };
    let id = *next;
    assert!(id < sizes.len(), "a message nobody sent");
    assert_eq!(usize::from(rec.tag()), id, "out of order");
    let mut got = vec![0u8; rec.payload().len()];
    rec.payload().copy_to(&mut got).unwrap();
    assert_eq!(got, content(id, sizes[id]), "message {id} not intact");
    *next += 1;
    true
}

/// The writer sends messages of `sizes` bytes (giving up, in order, when
/// the box stays full) while the reader takes them concurrently; after the
/// join the reader takes the rest. Every message sent arrives exactly once,
/// in order, intact; nothing else arrives.
fn wrap_model(sizes: &'static [usize]) {
    let mem = Arc::new(RingMemory::with_bytes(Fbox::memory_size(BOX).unwrap()));
    // SAFETY: `mem` outlives the region (the model joins its threads
    // first); the region stays in this thread, and the box's handles,
    // which cross threads, copy through atomics only.
    let region = unsafe { mem.region() };
    let (mut reader, mut w) = open(&region);
    let writer = {
        let mem = mem.clone();
        thread::spawn(move || {
            let _keep = &mem;
            let mut sent = 0;
            for (id, &len) in sizes.iter().enumerate() {
                if !send_tries(&mut w, id, &content(id, len), 2) {
                    break;
                }
                sent += 1;
            }
            sent
        })
    };
    let mut next = 0;
    for _ in 0..sizes.len() + 1 {
        if !take_checked(&mut reader, sizes, &mut next) {
            thread::yield_now();
        }
    }
    let sent = writer.join().unwrap();
    while take_checked(&mut reader, sizes, &mut next) {}
    assert_eq!(next, sent, "a message was lost");
    assert_eq!(reader.failure(), None);
}

#[test]
fn wrap_around_tiny_box() {
    // Records of 8, 16, 16, 16 bytes fill positions 0..56 of the box; the
    // last one (16 bytes at 56) needs a wrap record and the first two
    // released.
    loom::model(|| wrap_model(&[0, 8, 8, 8, 1]));
}

#[test]
fn full_box_writes_nothing_while_reader_releases() {
    loom::model(|| {
        // Three 16-byte records fill the box up to byte 48. Message 3 fits
        // once message 0 is released; message 4 (an 8-byte record at the
        // start of the next lap) once message 1 is.
        const SIZES: &[usize] = &[8, 8, 8, 8, 0];
        let mem = Arc::new(RingMemory::with_bytes(Fbox::memory_size(BOX).unwrap()));
        // SAFETY: `mem` outlives the region (the model joins its threads
        // first); the region stays in this thread, and the box's handles,
        // which cross threads, copy through atomics only.
        let region = unsafe { mem.region() };
        let (mut reader, mut w) = open(&region);
        for id in 0..3 {
            w.try_send(id as u8, &content(id, 8), 0).unwrap();
        }
        let reader_thread = {
            let mem = mem.clone();
            thread::spawn(move || {
                let _keep = &mem;
                let mut next = 0;
                take_checked(&mut reader, SIZES, &mut next);
                take_checked(&mut reader, SIZES, &mut next);
                (reader, next)
            })
        };
        // Each is accepted or refused as full with nothing written; a
        // refused one is not followed by a later one (order).
        let mut sent = 3;
        while sent < SIZES.len() && send_tries(&mut w, sent, &content(sent, SIZES[sent]), 2) {
            sent += 1;
        }
        let (mut reader, mut next) = reader_thread.join().unwrap();
        assert_eq!(next, 2, "messages 0 and 1 were there to take");
        while take_checked(&mut reader, SIZES, &mut next) {}
        assert_eq!(next, sent);
        // Drained now: the rest goes in.
        while sent < SIZES.len() {
            w.try_send(sent as u8, &content(sent, SIZES[sent]), 0)
                .unwrap();
            sent += 1;
        }
        while take_checked(&mut reader, SIZES, &mut next) {}
        assert_eq!(next, SIZES.len());
    });
}

/// The sender's side of the hand-off model: the box, the receiver's ring
/// and the ACK ring back.
struct Tx {
    fbox: FboxWriter<'static>,
    ring: Producer<'static>,
    acks: Consumer<'static>,
    in_flight: u32,
}

impl Tx {
    /// Sends message `id` by the box if the hand-off rule allows it and it
    /// fits, else by the ring; false if the ring was full too.
    fn send(&mut self, id: usize, msg: &[u8]) -> bool {
        while self.acks.pop().is_some() {
            self.in_flight -= 1;
        }
        match self.fbox.try_send(id as u8, msg, self.in_flight) {
            Ok(()) => return true,
            Err(SendError::Full | SendError::RingBusy { .. }) => {}
            Err(e) => panic!("{e}"),
        }
        match self.ring.push(id as u64) {
            Ok(()) => {
                self.in_flight += 1;
                true
            }
            Err(PushError::Full(_)) => false,
            Err(e) => panic!("{e}"),
        }
    }
}

/// The receiver's side: the box's reader, the ring, the ACK ring.
struct Rx {
    fbox: FboxReader<'static>,
    ring: Consumer<'static>,
    acks: Producer<'static>,
    next: usize,
}

impl Rx {
    /// One progress step: a ring message after draining the box (the
    /// hand-off rule), else one box message. False if there was nothing.
    fn step(&mut self, sizes: &[usize]) -> bool {
        if let Some(id) = self.ring.pop() {
            while take_checked(&mut self.fbox, sizes, &mut self.next) {}
            assert_eq!(id as usize, self.next, "ring message out of order");
            self.next += 1;
            // The ACK ring has a slot per message: never full.
            self.acks.push(id).expect("ack ring full");
            return true;
        }
        take_checked(&mut self.fbox, sizes, &mut self.next)
    }
}

/// Messages of `sizes` bytes from a sender that uses the box while it can
/// and the ring otherwise (the hand-off rule), to a receiver that drains
/// the box before each ring message. In every interleaving every message
/// sent arrives exactly once and in order, whichever path it took.
fn handoff_model(sizes: &'static [usize]) {
    let b = Fbox::memory_size(BOX).unwrap() as u64;
    let f = Fifo::memory_size(2).unwrap() as u64;
    let a = Fifo::memory_size(4).unwrap() as u64;
    let mem = Arc::new(RingMemory::with_bytes((b + f + a) as usize));
    // SAFETY: `mem` outlives the region (the model joins its threads
    // first); the region stays in this thread, and the box's handles,
    // which cross threads, copy through atomics only.
    let region = unsafe { mem.region() };
    let (reader, writer) = open(&region);
    // SAFETY: as in `open`; the three structures are disjoint.
    let (ring, acks) = unsafe {
        (
            Fifo::init(&region, b, 2, 1).expect("ring"),
            Fifo::init(&region, b + f, 4, 1).expect("ack ring"),
        )
    };
    let mut tx = Tx {
        fbox: writer,
        ring: ring.producer(),
        acks: acks.claim_consumer().unwrap(),
        in_flight: 0,
    };
    let mut rx = Rx {
        fbox: reader,
        ring: ring.claim_consumer().unwrap(),
        acks: acks.producer(),
        next: 0,
    };
    let sender = {
        let mem = mem.clone();
        thread::spawn(move || {
            let _keep = &mem;
            let mut sent = 0;
            'messages: for (id, &len) in sizes.iter().enumerate() {
                let msg = content(id, len);
                for _ in 0..2 {
                    if tx.send(id, &msg) {
                        sent += 1;
                        continue 'messages;
                    }
                    thread::yield_now();
                }
                break;
            }
            sent
        })
    };
    for _ in 0..sizes.len() {
        if !rx.step(sizes) {
            thread::yield_now();
        }
    }
    let sent = sender.join().unwrap();
    while rx.step(sizes) {}
    assert_eq!(rx.next, sent, "a message was lost");
}

#[test]
fn handoff_to_ring_keeps_order() {
    // Three 8-byte messages fill the box; the fourth goes by the ring
    // unless the receiver made room, and the next ones by the box only
    // once the ring message's ACK is back.
    loom::model(|| handoff_model(&[8, 8, 8, 8, 0, 0]));
}
