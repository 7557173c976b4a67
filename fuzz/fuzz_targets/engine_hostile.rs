//! The shared-memory progress engine against a hostile local peer.
//!
//! Three ranks share one in-memory segment: ranks 0 and 1 run real engines
//! and exchange messages; rank 2 is hostile. The input interleaves honest
//! sends and progress calls with what a hostile process that mapped the
//! segment can do: scribble arbitrary bytes anywhere in any part (rings,
//! ring counters, fragment headers and payloads), push arbitrary values
//! into the victims' rings, forge fragments of its own and send them.
//!
//! Always: no panic, no out-of-bounds access (the fuzzer's AddressSanitizer
//! watches), every completion names a cookie that was sent and arrives at
//! most once, outstanding fragments never exceed the fragments a rank has,
//! every delivered payload fits a fragment, every reported error declares
//! someone failed, and nothing is delivered from a peer after the engine
//! declared it failed. Without hostile actions (the honest baseline of the
//! same input): no error is reported, nobody fails, and every message
//! arrives intact, in order, and completes successfully.
#![no_main]

use std::collections::{HashSet, VecDeque};

use arbitrary::Arbitrary;
use btl_core::sm::engine::{
    init_part, Blame, Dispatch, FragDesc, PeerError, PeerSlot, PeerState, Received, SmEngine,
};
use btl_core::sm::fifo::{fifo_map, Consumer, Fifo};
use btl_core::sm::frag::{header_check, FragType, FragView, Slot};
use btl_core::sm::params::SmParams;
use btl_core::shm::{Region, ShmOffset};
use btl_core::sm::layout::{segment_layout, SegmentLayout};
use btl_core::sync::{CachePadded, CACHE_LINE};
use libfuzzer_sys::fuzz_target;

type Eng<'a> = SmEngine<'a, Vec<PeerSlot<'a>>, Vec<Option<Consumer<'a>>>, Vec<FragDesc>, Vec<u64>>;

const NPROCS: u32 = 3;
const HOSTILE: u32 = 2;

#[derive(Arbitrary, Debug)]
enum Op {
    Send {
        from: bool,
        tag: u8,
        len: u16,
    },
    Progress {
        who: bool,
    },
    Release {
        who: bool,
    },
    /// From now on, `who`'s handler holds the ACK of a SEND with `tag`
    /// (one at a time; `None`: none).
    Hold {
        who: bool,
        tag: Option<u8>,
    },
    /// `who` releases the ACK it holds for the other honest rank.
    ReleaseHeld {
        who: bool,
        ok: bool,
    },
    /// Write `bytes` at `off` (modulo the part) in rank `part % 3`'s part.
    Scribble {
        part: u8,
        off: u32,
        bytes: Vec<u8>,
    },
    /// Push `value` into the victim's ring for the hostile rank.
    PushRaw {
        victim: bool,
        value: u64,
    },
    /// Forge fragment `frag` of the hostile part's eager fragments with
    /// these header fields (with a valid check word if `consistent`, as a
    /// forger who knows the format would), then push a slot of `kind`
    /// naming it (or the same offset in the victim's part when `theirs`;
    /// an ACK names the hostile rank as its sender).
    Forge {
        victim: bool,
        frag: u8,
        owner: u32,
        capacity: u32,
        tag: u32,
        len: u32,
        seq: u32,
        consistent: bool,
        kind: u8,
        error: bool,
        theirs: bool,
    },
    FailPeer {
        who: bool,
        peer: u8,
    },
    /// The engine's audit of its rings (a stalled slot counts after
    /// `stall % 4` audits; 0: never).
    Audit {
        who: bool,
        stall: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    fifo_log2: u8,
    fifos: u8,
    ops: Vec<Op>,
}

#[path = "../../core/src/sm/engine/recorder.rs"]
mod recorder;

/// The engine tests' recorder, with this target's checks on top.
#[derive(Default)]
struct Rec {
    log: recorder::Rec,
    failed: HashSet<u32>,
    max_payload: u32,
    /// An ACK held back (`Received::Held`) and not yet released.
    holding: bool,
}

impl Dispatch for Rec {
    fn recv(&mut self, peer: u32, tag: u8, frag: &FragView<'_>) -> Received {
        assert!(
            !self.failed.contains(&peer),
            "delivered from rank {peer} after it was declared failed"
        );
        assert!(frag.info.len <= self.max_payload);
        assert_eq!(frag.payload.len(), frag.info.len as usize);
        match self.log.recv(peer, tag, frag) {
            Received::Held if self.holding || frag.header.is_none() => Received::Accepted,
            Received::Held => {
                self.holding = true;
                Received::Held
            }
            r => r,
        }
    }
    fn complete(&mut self, peer: u32, cookie: u64, ok: bool) {
        self.log.complete(peer, cookie, ok);
    }
    fn error(&mut self, error: PeerError) {
        assert!(!error.to_string().is_empty());
        self.log.error(error);
    }
    fn failed(&mut self, peer: u32, why: PeerError) {
        assert!(
            self.log.errors.contains(&why),
            "failed for an unreported error"
        );
        assert!(self.failed.insert(peer), "rank {peer} declared failed twice");
    }
}

/// What was sent and what came back.
#[derive(Default)]
struct Books {
    /// Sent and not yet delivered, per direction (0 → 1, 1 → 0).
    expect: [VecDeque<(u8, Vec<u8>)>; 2],
    cookies: HashSet<u64>,
    completed: HashSet<u64>,
}

impl Books {
    fn check(&mut self, recs: &mut [Rec], engines: &mut [Eng<'_>], tainted: bool, descs: usize) {
        for (who, rec) in recs.iter_mut().enumerate() {
            let peer = 1 - who as u32;
            for (p, cookie, ok) in rec.log.done.drain(..) {
                assert!(
                    self.cookies.contains(&cookie),
                    "completion of unknown cookie {cookie}"
                );
                assert!(
                    self.completed.insert(cookie),
                    "cookie {cookie} completed twice"
                );
                if !tainted {
                    assert!(ok && p == peer);
                }
            }
            for (p, tag, data) in rec.log.got.drain(..) {
                if tainted {
                    continue;
                }
                assert_eq!(p, peer);
                let (etag, edata) = self.expect[1 - who]
                    .pop_front()
                    .expect("unexpected message");
                assert_eq!((tag, &data), (etag, &edata));
            }
            if !tainted {
                assert!(rec.log.errors.is_empty(), "{:?}", rec.log.errors);
                assert!(rec.failed.is_empty(), "{:?}", rec.failed);
            }
            // Every error blames someone, who is failed now (or was before).
            for e in &rec.log.errors {
                match e.blamed() {
                    Blame::Peer { peer } => assert!(
                        engines[who].peer_state(peer) != Some(PeerState::Connected),
                        "{e}: rank {peer} still connected"
                    ),
                    Blame::Writers { ring } => {
                        for p in (0..NPROCS).filter(|&p| p != who as u32) {
                            if fifo_map(p, engines[who].num_fifos()) == ring {
                                assert!(
                                    engines[who].peer_state(p) != Some(PeerState::Connected),
                                    "{e}: writer {p} still connected"
                                );
                            }
                        }
                    }
                }
            }
            rec.log.errors.clear();
            assert!(engines[who].outstanding() as usize <= descs);
        }
    }
}

fn payload(seq: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seq as u8).wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

fn params(fifo_log2: u8, fifos: u8) -> SmParams {
    let mut p = SmParams::small_for_tests(1 << (fifo_log2 % 5 + 1)); // rings of 2 ..= 32
    p.num_fifos = 1 << (fifos % 3); // 1, 2, 4
    // Boxes handed out early, and not to everyone: the hand-out, the
    // offer and both paths get exercised.
    p.fbox_threshold = 2;
    p.fbox_max = 2;
    p
}

fuzz_target!(|input: Input| {
    let params = params(input.fifo_log2, input.fifos);
    let layout = segment_layout(&params, NPROCS).unwrap();
    let lines = layout.total_bytes.div_ceil(CACHE_LINE);
    let mut mem: Vec<CachePadded<[u8; CACHE_LINE]>> =
        (0..lines).map(|_| CachePadded([0; CACHE_LINE])).collect();
    let len = lines * CACHE_LINE;
    // SAFETY: CachePadded<[u8; CACHE_LINE]> is CACHE_LINE bytes without
    // padding; `mem` stays exclusively borrowed by the region.
    let bytes = unsafe { std::slice::from_raw_parts_mut(mem.as_mut_ptr().cast::<u8>(), len) };
    let region = Region::from_mut_slice(bytes);
    run(&region, &layout, &params, &input.ops);
});

fn run<'a>(region: &Region<'a>, layout: &SegmentLayout, params: &SmParams, ops: &[Op]) {
    for r in 0..NPROCS {
        // SAFETY: single-threaded; nothing touches the parts yet.
        unsafe { init_part(region, layout, params, r) }.unwrap();
    }
    let mut engines: Vec<Eng<'a>> = (0..2)
        .map(|me| {
            Eng::attach_collected(
                region,
                layout,
                params,
                me,
                NPROCS,
                btl_core::sm::engine::Backed,
            )
            .unwrap()
        })
        .collect();
    let mut recs: Vec<Rec> = (0..2)
        .map(|_| Rec {
            max_payload: params.max_send_size,
            ..Rec::default()
        })
        .collect();
    let num_fifos = params.num_fifos as u32;
    // The hostile rank's writers on the victims' rings for it.
    let hostile_ring = |victim: u32| -> Fifo<'a> {
        let part = region
            .subregion(
                layout.part_offset(victim).unwrap() as u64,
                layout.part_bytes,
            )
            .unwrap();
        let at = layout
            .ring_offset(victim, fifo_map(HOSTILE, num_fifos))
            .unwrap()
            - layout.part_offset(victim).unwrap();
        Fifo::attach(&part, at as u64).unwrap()
    };
    let mut hostile_producers = [hostile_ring(0).producer(), hostile_ring(1).producer()];

    let mut tainted = false;
    let mut seq = 0u64;
    let mut books = Books::default();
    let descs = Eng::storage_sizes(layout, NPROCS).unwrap().descs;

    for op in ops.iter().take(1024) {
        match op {
            Op::Send { from, tag, len } => {
                let from = usize::from(*from);
                let len = usize::from(*len) % (params.max_send_size as usize + 8);
                seq += 1;
                let data = payload(seq, len);
                if engines[from]
                    .send(1 - from as u32, *tag, &[&data], seq)
                    .is_ok()
                {
                    books.cookies.insert(seq);
                    books.expect[from].push_back((*tag, data));
                } else {
                    assert!(
                        len > params.max_send_size as usize
                            || engines[from].outstanding() > 0
                            || tainted
                    );
                }
            }
            Op::Progress { who } => {
                let w = usize::from(*who);
                engines[w].progress(&mut recs[w]);
            }
            Op::Release { who } => engines[usize::from(*who)].release_consumed(),
            Op::Hold { who, tag } => recs[usize::from(*who)].log.hold_tag = *tag,
            Op::ReleaseHeld { who, ok } => {
                let w = usize::from(*who);
                recs[w].holding = false;
                // A refused one completes with an error, as a message the
                // handler refuses does.
                tainted |= engines[w].release_held(1 - w as u32, *ok) && !ok;
            }
            Op::Scribble { part, off, bytes } => {
                let part = u32::from(*part) % NPROCS;
                let base = layout.part_offset(part).unwrap();
                let off = *off as usize % layout.part_bytes;
                let n = bytes.len().min(layout.part_bytes - off).min(64);
                region
                    .write_bytes((base + off) as u64, &bytes[..n])
                    .unwrap();
                tainted = true;
            }
            Op::PushRaw { victim, value } => {
                let _ = hostile_producers[usize::from(*victim)].push(*value);
                tainted = true;
            }
            Op::Forge {
                victim,
                frag,
                owner,
                capacity,
                tag,
                len,
                seq,
                consistent,
                kind,
                error,
                theirs,
            } => {
                let victim = u32::from(*victim);
                let owner_rank = if *theirs { victim } else { HOSTILE };
                let i = u32::from(*frag) % layout.eager_frags.max(1);
                let Ok(at) = layout.eager_frag_offset(owner_rank, i) else {
                    continue;
                };
                let check = if *consistent {
                    header_check(*owner, *capacity, *tag, *len, *seq, 0)
                } else {
                    seq.rotate_left(7) ^ 0x5a5a_5a5a
                };
                let mut h = [0u8; 28];
                for (k, v) in [*owner, *capacity, *tag, *len, *seq, 0, check]
                    .into_iter()
                    .enumerate()
                {
                    h[4 * k..4 * k + 4].copy_from_slice(&v.to_le_bytes());
                }
                if !*theirs {
                    region.write_bytes(at as u64, &h).unwrap();
                }
                let rel = at - layout.part_offset(owner_rank).unwrap();
                let kind = if kind & 1 == 0 {
                    FragType::Send
                } else {
                    FragType::Ack
                };
                // A SEND names the fragment's owner; an ACK its sender.
                let slot_owner = if kind == FragType::Ack { HOSTILE } else { owner_rank };
                let frag = ShmOffset::new(slot_owner as u16, rel as u64).unwrap();
                let value = Slot::new(kind, frag, *error).unwrap().encode();
                let _ = hostile_producers[victim as usize].push(value);
                tainted = true;
            }
            Op::Audit { who, stall } => {
                let w = usize::from(*who);
                engines[w].audit_rings(u32::from(*stall % 4), &mut recs[w]);
            }
            Op::FailPeer { who, peer } => {
                let w = usize::from(*who);
                let peer = u32::from(*peer) % NPROCS;
                engines[w].fail_peer(peer, &mut recs[w]);
                tainted |= peer != HOSTILE;
            }
        }
        books.check(&mut recs, &mut engines, tainted, descs);
    }

    // Quiesce: everything honest arrives and completes (a held ACK is
    // released, as the adapter always does).
    for rec in &mut recs {
        rec.log.hold_tag = None;
    }
    for _ in 0..4096 {
        let mut events = 0;
        for w in 0..2 {
            recs[w].holding = false;
            engines[w].release_held(1 - w as u32, true);
            events += engines[w].progress(&mut recs[w]);
            engines[w].release_consumed();
        }
        books.check(&mut recs, &mut engines, tainted, descs);
        if events == 0
            && engines
                .iter()
                .all(|e| e.outstanding() == 0 && e.pending() == 0)
        {
            break;
        }
    }
    if !tainted {
        assert!(books.expect.iter().all(VecDeque::is_empty), "messages lost");
        assert_eq!(books.completed, books.cookies, "sends never completed");
        assert!(engines.iter().all(|e| e.outstanding() == 0));
    }
}
