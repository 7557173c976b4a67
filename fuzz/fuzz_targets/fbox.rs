//! The fast box against a hostile writer.
//!
//! One real `FboxWriter` and `FboxReader` share a box in memory. The input
//! interleaves honest sends (vectored, split where the input says), polls
//! and drains with what a hostile process that mapped the box can do:
//! store any word in the data area (raw, or a plausible record header),
//! move the reader's published tail anywhere or by a little, and write
//! arbitrary bytes anywhere in the box's memory (meta and tail lines
//! included).
//!
//! Always: no panic, no out-of-bounds access (the fuzzer's AddressSanitizer
//! watches), every payload handed out lies inside the box's data area and
//! is at most the box's largest payload, and a handle that reported the box
//! corrupt reports the same error from then on. Until the first hostile
//! action, and in the honest baseline of the same input (the hostile
//! actions left out): every answer is the protocol model's (accepted or
//! full, each message intact and in order, empty when the model is), and
//! at the end the reader gets every message sent, in order.
#![no_main]

use std::collections::VecDeque;

use arbitrary::Arbitrary;
use btl_core::shm::Region;
use btl_core::sm::fbox::{Corruption, Fbox, FboxReader, FboxWriter, SendError, RECORD_HEADER};
use btl_core::sync::{AtomicU64, CachePadded, Ordering, CACHE_LINE};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    /// Honest: a message of `len % (max + 1)` bytes, in two parts split at
    /// `split % (len + 1)`.
    Send { tag: u8, len: u16, split: u16 },
    /// Honest: take up to `n % 8 + 1` messages.
    Poll { n: u8 },
    /// Honest: take everything there is.
    Drain,
    /// Hostile: store `value` in data word `index`.
    Word { index: u16, value: u64 },
    /// Hostile: a plausible record header in data word `index`.
    Header {
        index: u16,
        len: u16,
        tag: u16,
        kind: u8,
        seq: u32,
    },
    /// Hostile: store `value` as the reader's tail.
    Tail { value: u64 },
    /// Hostile: move the reader's tail by `delta` bytes.
    TailBy { delta: i16 },
    /// Hostile: write `bytes` at `offset` (modulo the box's memory).
    Bytes { offset: u16, bytes: Vec<u8> },
}

impl Op {
    fn hostile(&self) -> bool {
        !matches!(self, Op::Send { .. } | Op::Poll { .. } | Op::Drain)
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    size_log2: u8,
    ops: Vec<Op>,
}

/// The bytes of message `id`.
fn content(id: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (id.wrapping_mul(131).wrapping_add(i as u64 * 7 + 3)) as u8)
        .collect()
}

/// The protocol's model while the writer is honest: positions, the
/// messages in the box and where each starts.
struct Model {
    size: u64,
    head: u64,
    tail: u64,
    queue: VecDeque<(u8, Vec<u8>, u64)>,
}

impl Model {
    fn fits(&self, len: usize) -> bool {
        let rec = u64::from(Fbox::record_size(len as u32));
        let pos = self.head % self.size;
        let pad = if pos + rec > self.size {
            self.size - pos
        } else {
            0
        };
        self.head + pad + rec + 8 - self.tail <= self.size
    }
    fn push(&mut self, tag: u8, msg: Vec<u8>) {
        let rec = u64::from(Fbox::record_size(msg.len() as u32));
        let pos = self.head % self.size;
        if pos + rec > self.size {
            self.head += self.size - pos;
        }
        self.queue.push_back((tag, msg, self.head));
        self.head += rec;
    }
}

struct Run<'a> {
    reader: FboxReader<'a>,
    writer: FboxWriter<'a>,
    region: Region<'a>,
    /// The data area's addresses.
    data: std::ops::Range<usize>,
    max: u32,
    model: Model,
    /// Still checked against the model (no hostile action yet).
    honest: bool,
    next_id: u64,
    reader_err: Option<Corruption>,
    writer_err: Option<Corruption>,
}

impl Run<'_> {
    /// Checks one delivered message: always inside the box; while honest,
    /// the model's next one.
    fn got(&mut self, tag: u8, at: usize, bytes: &[u8]) {
        assert!(
            at >= self.data.start + RECORD_HEADER as usize && at + bytes.len() <= self.data.end,
            "payload outside the box"
        );
        assert!(
            bytes.len() <= self.max as usize,
            "payload longer than a record"
        );
        if self.honest {
            let (t, m, at) = self.model.queue.pop_front().expect("a message nobody sent");
            assert_eq!(
                (tag, bytes),
                (t, &m[..]),
                "message not intact or out of order"
            );
            self.model.tail = at + u64::from(Fbox::record_size(m.len() as u32));
        }
    }

    fn reader_result(&mut self, r: Result<(), Corruption>) {
        match (r, self.reader_err) {
            (Err(e), None) => {
                assert!(!self.honest, "honest box reported corrupt: {e}");
                self.reader_err = Some(e);
            }
            (Err(e), Some(before)) => assert_eq!(e, before, "corruption is final"),
            (Ok(()), Some(before)) => panic!("reader went on after {before}"),
            (Ok(()), None) => {}
        }
    }

    fn poll(&mut self) -> bool {
        // (tag, address, bytes) copied out before the record is released.
        let polled = match self.reader.poll() {
            Ok(Some(rec)) => {
                let b = rec.payload().as_bytes();
                Ok(Some((rec.tag(), b.as_ptr() as usize, b.to_vec())))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(e),
        };
        match polled {
            Ok(Some((tag, at, bytes))) => {
                self.got(tag, at, &bytes);
                self.reader_result(Ok(()));
                true
            }
            Ok(None) => {
                if self.honest {
                    assert!(self.model.queue.is_empty(), "the model has a message");
                }
                self.reader_result(Ok(()));
                false
            }
            Err(e) => {
                self.reader_result(Err(e));
                false
            }
        }
    }

    fn op(&mut self, op: &Op) {
        let data_words = (self.data.end - self.data.start) / 8;
        match *op {
            Op::Send { tag, len, split } => {
                let len = usize::from(len) % (self.max as usize + 1);
                let split = usize::from(split) % (len + 1);
                let msg = content(self.next_id, len);
                let res = self
                    .writer
                    .try_send_vectored(tag, &[&msg[..split], &msg[split..]], 0);
                match res {
                    Ok(()) => {
                        assert!(self.writer_err.is_none(), "writer went on after corruption");
                        if self.honest {
                            assert!(self.model.fits(len), "accepted but the model is full");
                            self.model.push(tag, msg);
                        }
                        self.next_id += 1;
                    }
                    Err(SendError::Full) => {
                        assert!(self.writer_err.is_none());
                        if self.honest {
                            assert!(!self.model.fits(len), "full but the model has room");
                        }
                    }
                    Err(SendError::Corrupt(c)) => {
                        assert!(!self.honest, "honest tail reported corrupt: {c}");
                        if let Some(before) = self.writer_err {
                            assert_eq!(c, before, "corruption is final");
                        }
                        self.writer_err = Some(c);
                    }
                    Err(e) => panic!("unexpected {e}"),
                }
                if self.honest {
                    assert_eq!(self.writer.position(), self.model.head);
                }
            }
            Op::Poll { n } => {
                for _ in 0..n % 8 + 1 {
                    if !self.poll() {
                        break;
                    }
                }
            }
            Op::Drain => {
                let mut got = Vec::new();
                let r = self.reader.drain(|tag, p| {
                    let b = p.as_bytes();
                    got.push((tag, b.as_ptr() as usize, b.to_vec()));
                });
                for (tag, at, bytes) in got {
                    self.got(tag, at, &bytes);
                }
                match r {
                    Ok(_) => {
                        if self.honest {
                            assert!(self.model.queue.is_empty(), "drain left a message");
                        }
                        self.reader_result(Ok(()))
                    }
                    Err(e) => self.reader_result(Err(e)),
                }
            }
            Op::Word { index, value } => {
                self.word(usize::from(index) % data_words)
                    .store(value, Ordering::Relaxed);
            }
            Op::Header {
                index,
                len,
                tag,
                kind,
                seq,
            } => {
                let word = (u64::from(seq) << 40)
                    | (u64::from(kind % 4) << 32)
                    | (u64::from(tag) << 16)
                    | u64::from(len);
                self.word(usize::from(index) % data_words)
                    .store(word, Ordering::Relaxed);
            }
            Op::Tail { value } => self.tail().store(value, Ordering::Relaxed),
            Op::TailBy { delta } => {
                let t = self.tail().load(Ordering::Relaxed);
                self.tail()
                    .store(t.wrapping_add_signed(i64::from(delta)), Ordering::Relaxed);
            }
            Op::Bytes { offset, ref bytes } => {
                let total = self.region.len();
                let at = usize::from(offset) % total;
                let n = bytes.len().min(total - at);
                self.region.write_bytes(at as u64, &bytes[..n]).unwrap();
            }
        }
    }

    fn word(&self, index: usize) -> &AtomicU64 {
        let off = Fbox::DATA_OFFSET + index * 8;
        self.region.resolve(off as u64).unwrap()
    }

    fn tail(&self) -> &AtomicU64 {
        self.region.resolve(Fbox::TAIL_OFFSET as u64).unwrap()
    }
}

/// Runs `ops` (leaving the hostile ones out if `honest_only`).
fn run(size: u32, ops: &[Op], honest_only: bool) {
    let bytes = Fbox::memory_size(size).unwrap();
    let mut mem: Vec<CachePadded<[u8; CACHE_LINE]>> = (0..bytes / CACHE_LINE)
        .map(|_| CachePadded([0; CACHE_LINE]))
        .collect();
    let len = mem.len() * CACHE_LINE;
    // SAFETY: CachePadded<[u8; CACHE_LINE]> is CACHE_LINE bytes with no
    // padding; `mem` is exclusively borrowed by the slice for its lifetime.
    let buf = unsafe { std::slice::from_raw_parts_mut(mem.as_mut_ptr().cast::<u8>(), len) };
    let region = Region::from_mut_slice(buf);
    // SAFETY: fresh memory that nothing else accesses; hostile writes go
    // through `region` only between the handles' calls, never while a
    // payload is borrowed.
    let reader = unsafe { Fbox::init(&region, 0, size, 5) }.unwrap();
    let writer = FboxWriter::attach(&region, 0, 5).unwrap();
    let start = region.base_addr() + Fbox::DATA_OFFSET;
    let mut r = Run {
        max: writer.max_payload(),
        reader,
        writer,
        region,
        data: start..start + size as usize,
        model: Model {
            size: u64::from(size),
            head: 0,
            tail: 0,
            queue: VecDeque::new(),
        },
        honest: true,
        next_id: 0,
        reader_err: None,
        writer_err: None,
    };
    for op in ops.iter().take(2048) {
        if op.hostile() {
            if honest_only {
                continue;
            }
            r.honest = false;
        }
        r.op(op);
    }
    // The rest: in the honest case exactly the model's messages.
    for _ in 0..size / 8 + 1 {
        if !r.poll() {
            break;
        }
    }
    if r.honest {
        assert!(r.model.queue.is_empty(), "messages lost");
        assert_eq!((r.reader_err, r.writer_err), (None, None));
    }
}

fuzz_target!(|input: Input| {
    // 64 B .. 4 KiB boxes.
    let size = 64u32 << (input.size_log2 % 7);
    run(size, &input.ops, false);
    run(size, &input.ops, true);
});
