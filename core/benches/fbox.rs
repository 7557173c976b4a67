//! Fast-box benchmark: two threads of one process exchanging through
//! btl-core's real `FboxWriter`/`FboxReader` over a plain memory region,
//! beside the FIFO and a bare cache line measured in the same run (the
//! structure's floor, before any engine or adapter is involved).
//!
//! - ping-pong: one message bounces between two boxes (A→B, B→A), read in
//!   place; the figure is the one-way latency (half the round trip), at
//!   8 B and at 256 B, beside the FIFO ping-pong (a bare 64-bit value
//!   through two rings, no fragment), the same 8 B message through two
//!   real progress engines (what the transport does today: fragment, slot,
//!   handler, ACK, recycling) and the cache-line ping-pong (one line
//!   flipped between the two threads: the floor);
//! - streaming: one writer sends 8-byte messages as fast as the box takes
//!   them, one reader takes them; messages per second.
//!
//! Threads are pinned to cores 0 and 1 when the machine allows it (say so
//! otherwise). Run: `cargo bench -p btl-core --bench fbox [-- --quick |
//! --short]`. Speed is measured here, never asserted in tests.

mod common;

use std::time::{Duration, Instant};

use btl_core::sm::engine::{
    init_part, Dispatch, FragDesc, PeerError, PeerSlot, Received, SmEngine,
};
use btl_core::sm::fbox::{Fbox, FboxReader, FboxWriter, SendError, DEFAULT_SIZE};
use btl_core::sm::frag::FragView;
use btl_core::sm::layout::segment_layout;
use btl_core::sm::params::SmParams;
use btl_core::sync::CACHE_LINE;
use common::{cacheline_pingpong, fifo_pingpong, median, pin, start, Memory};

const SENDER: u32 = 0;

fn send_spin(w: &mut FboxWriter<'_>, msg: &[u8]) {
    loop {
        match w.try_send(1, msg, 0) {
            Ok(()) => return,
            Err(SendError::Full) => std::hint::spin_loop(),
            Err(e) => panic!("send: {e}"),
        }
    }
}

/// Waits for the next message and returns its first byte (read in place).
fn recv_spin(r: &mut FboxReader<'_>) -> u8 {
    loop {
        if let Some(rec) = r.poll().expect("box corrupt") {
            return rec.payload().as_bytes().first().copied().unwrap_or(0);
        }
        std::hint::spin_loop();
    }
}

/// Half round trip of a `len`-byte message through two boxes, in ns.
fn fbox_pingpong(iters: u64, len: usize) -> f64 {
    let one = Fbox::memory_size(DEFAULT_SIZE).unwrap() as u64;
    let mem = Memory::new(2 * one as usize);
    let region = mem.region();
    // SAFETY: fresh memory, nothing else accesses it yet; the two boxes
    // are disjoint.
    let (mut ab_r, mut ba_r) = unsafe {
        (
            Fbox::init(&region, 0, DEFAULT_SIZE, SENDER).unwrap(),
            Fbox::init(&region, one, DEFAULT_SIZE, SENDER).unwrap(),
        )
    };
    let mut ab_w = FboxWriter::attach(&region, 0, SENDER).unwrap();
    let mut ba_w = FboxWriter::attach(&region, one, SENDER).unwrap();
    let mut elapsed = Duration::ZERO;
    std::thread::scope(|s| {
        s.spawn(move || {
            pin(1);
            let mut msg = vec![0u8; len];
            for _ in 0..iters {
                let v = recv_spin(&mut ab_r);
                if let Some(b) = msg.first_mut() {
                    *b = v.wrapping_add(1);
                }
                send_spin(&mut ba_w, &msg);
            }
        });
        pin(0);
        let mut msg = vec![0u8; len];
        let start = Instant::now();
        for i in 0..iters {
            if let Some(b) = msg.first_mut() {
                *b = i as u8;
            }
            send_spin(&mut ab_w, &msg);
            let v = recv_spin(&mut ba_r);
            if len > 0 {
                assert_eq!(v, (i as u8).wrapping_add(1));
            }
        }
        elapsed = start.elapsed();
    });
    elapsed.as_nanos() as f64 / iters as f64 / 2.0
}

/// Counts the messages an engine delivered, keeping the first byte of the
/// last one.
#[derive(Default)]
struct Seen {
    messages: u64,
    first: u8,
}

impl Dispatch for Seen {
    fn recv(&mut self, _peer: u32, _tag: u8, frag: &FragView<'_>) -> Received {
        let mut b = [0u8; 1];
        if frag.payload.read_bytes(0, &mut b).is_ok() {
            self.first = b[0];
        }
        self.messages += 1;
        Received::Accepted
    }
    fn complete(&mut self, _peer: u32, _cookie: u64, ok: bool) {
        assert!(ok, "a send failed");
    }
    fn error(&mut self, error: PeerError) {
        panic!("{error}");
    }
    fn failed(&mut self, peer: u32, why: PeerError) {
        panic!("rank {peer} declared failed: {why}");
    }
}

/// Half round trip of an 8-byte message through two real progress engines
/// (the seed's defaults), in ns.
fn engine_pingpong(iters: u64) -> f64 {
    type Eng<'a> = SmEngine<
        'a,
        Vec<PeerSlot<'a>>,
        Vec<Option<btl_core::sm::fifo::Consumer<'a>>>,
        Vec<FragDesc>,
        Vec<u64>,
    >;
    let params = SmParams::default();
    let layout = segment_layout(&params, 2).unwrap();
    let mem = Memory::new(layout.total_bytes.next_multiple_of(CACHE_LINE));
    let region = mem.region();
    for r in 0..2 {
        // SAFETY: fresh memory; nothing touches the parts yet.
        unsafe { init_part(&region, &layout, &params, r) }.unwrap();
    }
    // Each engine in its own thread, over its own region of the memory (a
    // region is not Send), as two processes would have it.
    fn engine<'a>(
        region: &btl_core::shm::Region<'a>,
        layout: &btl_core::sm::layout::SegmentLayout,
        params: &SmParams,
        me: u32,
    ) -> Eng<'a> {
        Eng::attach_collected(region, layout, params, me, 2, btl_core::sm::engine::Backed).unwrap()
    }
    let shared = mem.shared();
    let (layout, params) = (&layout, &params);
    // Waits for the next message (progressing the ACKs too).
    fn wait(e: &mut Eng<'_>, seen: &mut Seen) -> u8 {
        let before = seen.messages;
        while seen.messages == before {
            if e.progress(seen) == 0 {
                std::hint::spin_loop();
            }
        }
        seen.first
    }
    let mut elapsed = Duration::ZERO;
    std::thread::scope(|s| {
        s.spawn(move || {
            pin(1);
            // SAFETY: `mem` outlives the scope; the engines' protocol
            // orders the two threads' copies, and nothing else copies.
            let region = unsafe { shared.region() };
            let mut b = engine(&region, layout, params, 1);
            let mut seen = Seen::default();
            let mut msg = [0u8; 8];
            for i in 0..iters {
                msg[0] = wait(&mut b, &mut seen).wrapping_add(1);
                b.send(0, 1, &[&msg], i + 1).unwrap();
            }
            // The last ACK.
            while b.outstanding() > 0 {
                b.progress(&mut seen);
            }
        });
        pin(0);
        let mut a = engine(&region, layout, params, 0);
        let mut seen = Seen::default();
        let mut msg = [0u8; 8];
        let start = Instant::now();
        for i in 0..iters {
            msg[0] = i as u8;
            a.send(1, 1, &[&msg], i + 1).unwrap();
            assert_eq!(wait(&mut a, &mut seen), (i as u8).wrapping_add(1));
        }
        elapsed = start.elapsed();
        while a.outstanding() > 0 {
            a.progress(&mut seen);
        }
    });
    elapsed.as_nanos() as f64 / iters as f64 / 2.0
}

/// 8-byte messages per second from one writer to one reader.
fn fbox_streaming(msgs: u64) -> f64 {
    let mem = Memory::new(Fbox::memory_size(DEFAULT_SIZE).unwrap());
    let region = mem.region();
    // SAFETY: fresh memory.
    let mut r = unsafe { Fbox::init(&region, 0, DEFAULT_SIZE, SENDER) }.unwrap();
    let mut w = FboxWriter::attach(&region, 0, SENDER).unwrap();
    let mut elapsed = Duration::ZERO;
    std::thread::scope(|s| {
        s.spawn(move || {
            pin(1);
            for i in 0..msgs {
                send_spin(&mut w, &i.to_le_bytes());
            }
        });
        pin(0);
        let start = Instant::now();
        let mut got = 0;
        while got < msgs {
            match r.poll().expect("box corrupt") {
                Some(rec) => {
                    let b = rec.payload().as_bytes();
                    assert_eq!(b, got.to_le_bytes());
                    got += 1;
                }
                None => std::hint::spin_loop(),
            }
        }
        elapsed = start.elapsed();
    });
    msgs as f64 / elapsed.as_secs_f64()
}

fn main() {
    let (iters, msgs, reps) = start(&format!(
        "btl-core fast-box benchmark: box {DEFAULT_SIZE} B"
    ));
    // Interleave the rows so drift on a shared machine hits all alike.
    let (mut line, mut fifo, mut engine, mut box8, mut box256, mut stream) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for _ in 0..reps {
        line.push(cacheline_pingpong(iters));
        fifo.push(fifo_pingpong(iters));
        // Under miri the engine's default-sized segment takes too long to
        // set up; its own tests cover it there.
        if !cfg!(miri) {
            engine.push(engine_pingpong(iters));
        }
        box8.push(fbox_pingpong(iters, 8));
        box256.push(fbox_pingpong(iters, 256));
        stream.push(fbox_streaming(msgs));
    }
    let line = median(line);
    println!("{:<40} {:>12}", "measure", "value");
    println!("{:<40} {:>9.1} ns", "cache-line ping-pong, one way", line);
    for (name, v) in [
        ("FIFO ping-pong (a slot value), one way", median(fifo)),
        (
            "engine ping-pong 8 B (today), one way",
            if engine.is_empty() {
                f64::NAN
            } else {
                median(engine)
            },
        ),
        ("box ping-pong 8 B, one way", median(box8)),
        ("box ping-pong 256 B, one way", median(box256)),
    ] {
        println!("{name:<40} {v:>9.1} ns  ({:.2}x the cache line)", v / line);
    }
    println!(
        "{:<40} {:>9.2} M/s",
        "box streaming 8 B, 1 writer -> 1 reader",
        median(stream) / 1e6
    );
}
