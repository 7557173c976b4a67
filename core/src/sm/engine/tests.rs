//! Engine tests: several engines in one process over one in-memory
//! segment, driven step by step.

use super::recorder::Rec;
use super::*;
use crate::sm::control::Structure;
use crate::sm::fifo::Producer;
use crate::sm::frag::field as frag_field;
use crate::sm::frag::FragError;
use crate::sm::layout::segment_layout;
use crate::sm::params::SmParams;
use crate::sync::{CachePadded, CACHE_LINE};
use core::ptr::NonNull;
use std::vec;
use std::vec::Vec;

type Eng<'a> = SmEngine<'a, Vec<PeerSlot<'a>>, Vec<Option<Consumer<'a>>>, Vec<FragDesc>, Vec<u64>>;

fn small_params(fifo_size: u32) -> SmParams {
    let mut p = SmParams::small_for_tests(fifo_size);
    // Pools of a fixed room (8 eager fragments, 6 max-size ones) whatever
    // the number of ranks: the default rule (layout tests) shares eager
    // fragments among the peers.
    p.free_list_max = 8;
    // The ring protocol on its own; `box_params` adds fast boxes.
    p.fbox_size = 0;
    p
}

#[derive(Clone, Copy)]
struct JobShape {
    layout: SegmentLayout,
    params: SmParams,
    nprocs: u32,
}

struct Job {
    mem: Vec<CachePadded<[u8; CACHE_LINE]>>,
    shape: JobShape,
}

impl Job {
    fn with_params(nprocs: u32, params: SmParams) -> Self {
        let layout = segment_layout(&params, nprocs).unwrap();
        let lines = layout.total_bytes.div_ceil(CACHE_LINE);
        let mut mem = Vec::with_capacity(lines);
        mem.resize_with(lines, || CachePadded([0u8; CACHE_LINE]));
        Self {
            mem,
            shape: JobShape {
                layout,
                params,
                nprocs,
            },
        }
    }

    fn region(&mut self) -> Region<'_> {
        // CachePadded<[u8; N]> is N bytes with alignment N: contiguous.
        let len = self.mem.len() * CACHE_LINE;
        // SAFETY: the buffer is exclusively borrowed for the region's
        // lifetime and only accessed through it.
        let bytes =
            unsafe { core::slice::from_raw_parts_mut(self.mem.as_mut_ptr().cast::<u8>(), len) };
        Region::from_mut_slice(bytes)
    }
}

fn engines<'a>(region: &Region<'a>, job: &JobShape) -> Vec<Eng<'a>> {
    for r in 0..job.nprocs {
        // SAFETY: single-threaded test; nothing else touches the parts.
        unsafe { init_part(region, &job.layout, &job.params, r) }.unwrap();
    }
    let mut e: Vec<Eng<'a>> = (0..job.nprocs)
        .map(|me| {
            Eng::attach_collected(region, &job.layout, &job.params, me, job.nprocs, Backed).unwrap()
        })
        .collect();
    if job.layout.fbox_pool > 0 && job.params.fbox_threshold == 1 {
        open_boxes(&mut e);
    }
    e
}

/// Has every rank send one small message by ring to every other, so that
/// (with `fbox_threshold` 1) each receiver hands each sender a box, which
/// the sender attaches at its next small send.
fn open_boxes(e: &mut [Eng<'_>]) {
    let n = e.len() as u32;
    let mut sink = Rec::default();
    for s in 0..n {
        for r in (0..n).filter(|&r| r != s) {
            e[s as usize].send(r, 0, &[b"hi"], 0).unwrap();
            e[r as usize].progress(&mut sink);
            e[s as usize].progress(&mut sink);
        }
    }
    assert!(sink.errors.is_empty() && sink.failed.is_empty());
    assert_eq!(sink.got.len(), (n * (n - 1)) as usize);
}

/// Runs `f` on the engines of a job of `nprocs` ranks over one in-memory
/// segment (dropped, engines first, when `f` returns).
fn with_job(nprocs: u32, fifo_size: u32, f: impl for<'a> FnOnce(&mut [Eng<'a>], &Region<'a>)) {
    with_job_params(nprocs, small_params(fifo_size), f)
}

fn with_job_params(
    nprocs: u32,
    params: SmParams,
    f: impl for<'a> FnOnce(&mut [Eng<'a>], &Region<'a>),
) {
    let mut job = Job::with_params(nprocs, params);
    let shape = job.shape;
    let region = job.region();
    let mut e = engines(&region, &shape);
    f(&mut e, &region);
}

/// A stranger's writer handle on ring `ring` of rank `rank`.
fn intruder<'a>(region: &Region<'a>, layout: &SegmentLayout, rank: u32, ring: u32) -> Producer<'a> {
    let part_at = layout.part_offset(rank).unwrap();
    let part = region.subregion(part_at as u64, layout.part_bytes).unwrap();
    let at = (layout.ring_offset(rank, ring).unwrap() - part_at) as u64;
    Fifo::attach(&part, at).unwrap().producer()
}

/// Byte offset in rank `rank`'s part of its first eager fragment.
fn first_eager(layout: &SegmentLayout, rank: u32) -> u64 {
    (layout.eager_frag_offset(rank, 0).unwrap() - layout.part_offset(rank).unwrap()) as u64
}

/// The raw slot value of a SEND of `owner`'s fragment at `offset`, or of an
/// ACK by `owner` for the receiver's fragment at `offset`.
fn slot(kind: FragType, owner: u32, offset: u64) -> u64 {
    Slot::new(kind, ShmOffset::new(owner as u16, offset).unwrap(), false)
        .unwrap()
        .encode()
}

/// One ring per writer (`num_fifos` 4), so blame falls on one peer.
fn private_rings(fifo_size: u32) -> SmParams {
    let mut p = small_params(fifo_size);
    p.num_fifos = 4;
    p
}

/// `small_params` with 256-byte fast boxes (payloads up to 56 bytes),
/// handed out at the first small message (`engines` opens them all).
fn box_params(fifo_size: u32) -> SmParams {
    let mut p = small_params(fifo_size);
    p.fbox_size = 256;
    p.fbox_threshold = 1;
    p
}

/// Offset in the segment of the box `sender` writes in `receiver`'s part,
/// as `receiver`'s box directory offers it.
fn box_at(region: &Region<'_>, layout: &SegmentLayout, receiver: u32, sender: u32) -> u64 {
    let mut word = [0u8; 8];
    let dir = layout.fbox_dir_offset(receiver, sender).unwrap() as u64;
    region.read_bytes(dir, &mut word).unwrap();
    let offer = ShmOffset::from_raw(u64::from_ne_bytes(word)).unwrap();
    assert_eq!(u32::from(offer.owner()), receiver, "a box was handed out");
    layout.part_offset(receiver).unwrap() as u64 + offer.offset()
}

/// Offset of the data of the box `sender` writes in `receiver`'s part.
fn box_data_at(region: &Region<'_>, layout: &SegmentLayout, receiver: u32, sender: u32) -> u64 {
    box_at(region, layout, receiver, sender) + Fbox::DATA_OFFSET as u64
}

/// The corruption for which `r` saw `peer` failed by its fast box, when
/// that is the only failure `r` saw.
fn only_box_failure(r: &Rec, peer: u32) -> Option<fbox::Corruption> {
    match &r.failed[..] {
        [(p, PeerError::FastBox { peer: q, error })] if *p == peer && *q == peer => Some(*error),
        _ => None,
    }
}

#[test]
fn small_messages_take_the_box_without_fragment_or_ack() {
    with_job_params(2, box_params(16), |e, _| {
        let (mut r0, mut r1) = (Rec::default(), Rec::default());
        for i in 0..10u8 {
            e[0].send(1, i, &[&[i; 3], b"xy"], 0).unwrap();
        }
        assert_eq!(e[0].fbox_sent(), 10);
        assert_eq!((e[0].outstanding(), e[0].in_flight_to(1)), (0, 0));
        assert!(!e[0].fboxes_drained());
        assert_eq!(e[1].progress(&mut r1), 10);
        let want: Vec<_> = (0..10u8)
            .map(|i| (0, i, [i, i, i, b'x', b'y'].to_vec()))
            .collect();
        assert_eq!(r1.got, want);
        assert_eq!(e[1].fbox_received(), 10);
        // Nothing comes back: no ACK for a box message.
        assert_eq!(e[0].progress(&mut r0), 0);
        assert!(r0.done.is_empty() && r0.errors.is_empty() && r1.errors.is_empty());
        assert!(e[0].fboxes_drained());
        // A message that needs its completion (cookie), or too large for a
        // record, goes by the ring.
        e[0].send(1, 1, &[b"c"], 7).unwrap();
        e[0].send(1, 2, &[&[5; 57]], 0).unwrap();
        assert_eq!((e[0].fbox_sent(), e[0].outstanding()), (10, 2));
        e[1].progress(&mut r1);
        e[0].progress(&mut r0);
        assert_eq!(r0.done, vec![(1, 7, true), (1, 0, true)]);
    });
}

#[test]
fn order_holds_across_box_and_ring() {
    order_across_box_and_ring(false);
}

#[test]
fn order_holds_with_sweeps_between_passes() {
    // The small-message lane (sweep_boxes) between full passes, as the
    // job API runs it: same order.
    order_across_box_and_ring(true);
}

/// Small ring, small boxes: the box fills, the ring takes over until its
/// ACKs are back, and small and large messages alternate; `sweep`: the
/// receivers sweep their boxes before each pass, and skip the pass every
/// other round when the sweep left it nothing.
fn order_across_box_and_ring(sweep: bool) {
    with_job_params(3, box_params(4), |e, _| {
        let mut recs: Vec<Rec> = (0..3).map(|_| Rec::default()).collect();
        let per_pair = 400u32;
        let mut next = [[0u32; 3]; 3];
        let mut rounds = 0;
        let mut swept = 0;
        let size = |seq: u32| -> usize {
            match seq % 5 {
                0 => 4,
                1 => 56,
                2 => 200,
                3 => 8,
                _ => 60,
            }
        };
        loop {
            rounds += 1;
            assert!(rounds < 100_000, "no progress");
            for s in 0..3usize {
                for d in (0..3usize).filter(|&d| d != s) {
                    for _ in 0..8 {
                        let seq = next[s][d];
                        if seq == per_pair {
                            break;
                        }
                        let mut msg = vec![seq as u8; size(seq)];
                        msg[..4].copy_from_slice(&seq.to_le_bytes());
                        match e[s].send(d as u32, 3, &[&msg], 0) {
                            Ok(()) => next[s][d] += 1,
                            Err(SendError::NoFragment | SendError::Backlog { .. }) => break,
                            Err(err) => panic!("{err}"),
                        }
                    }
                }
            }
            for (r, rec) in recs.iter_mut().enumerate() {
                if sweep {
                    let got = &mut rec.got;
                    let s = e[r].sweep_boxes(|p, t, d| got.push((p, t, d.to_vec())));
                    swept += s.delivered;
                    if !s.rest && s.delivered > 0 && rounds % 2 == 0 {
                        continue;
                    }
                }
                e[r].progress(rec);
            }
            let got: usize = recs.iter().map(|r| r.got.len()).sum();
            if got == 6 * per_pair as usize {
                break;
            }
        }
        for (r, rec) in recs.iter().enumerate() {
            assert!(rec.errors.is_empty(), "{:?}", rec.errors);
            for s in (0..3u32).filter(|&s| s as usize != r) {
                let seqs: Vec<u32> = rec
                    .got
                    .iter()
                    .filter(|g| g.0 == s)
                    .map(|(_, _, b)| {
                        let seq = u32::from_le_bytes(b[..4].try_into().unwrap());
                        assert_eq!(b.len(), size(seq));
                        assert!(b[4..].iter().all(|&x| x == seq as u8));
                        seq
                    })
                    .collect();
                assert_eq!(seqs, (0..per_pair).collect::<Vec<_>>(), "{s} -> {r}");
            }
        }
        for x in e.iter_mut() {
            // Both paths were taken.
            assert!(x.fbox_sent() > 0 && x.fbox_sent() < 2 * u64::from(per_pair));
        }
        assert_eq!(sweep, swept > 0, "{swept} messages swept");
    });
}

#[test]
fn the_sweep_hands_out_user_messages_and_leaves_the_rest_to_the_pass() {
    with_job_params(3, box_params(16), |e, region| {
        let layout = segment_layout(&box_params(16), 3).unwrap();
        let (mut r0, mut r1) = (Rec::default(), Rec::default());
        let mut swept = Vec::new();
        // Nothing waiting: nothing handed out, nothing left.
        let s = e[1].sweep_boxes(|p, t, d| swept.push((p, t, d.to_vec())));
        assert_eq!(s, Sweep::default());
        // Two user messages, a protocol message, a user message.
        e[0].send(1, 1, &[b"a"], 0).unwrap();
        e[0].send(1, 2, &[b"b", b"c"], 0).unwrap();
        e[0].send(1, crate::tags::BARRIER, &[&[0; 8]], 0).unwrap();
        e[0].send(1, 3, &[b"d"], 0).unwrap();
        assert_eq!(e[0].fbox_sent(), 4);
        let s = e[1].sweep_boxes(|p, t, d| swept.push((p, t, d.to_vec())));
        assert_eq!((s.delivered, s.rest), (2, true));
        assert_eq!(swept, vec![(0, 1, b"a".to_vec()), (0, 2, b"bc".to_vec())]);
        // The pass takes the protocol message where the sweep stopped.
        assert_eq!(e[1].progress(&mut r1), 2);
        assert_eq!(
            r1.got,
            vec![(0, crate::tags::BARRIER, vec![0; 8]), (0, 3, b"d".to_vec())]
        );
        assert_eq!(e[1].fbox_received(), 4);
        // A corrupt record: the sweep hands out what precedes it and
        // leaves the failure to the pass, which fails its writer only.
        e[0].send(1, 4, &[b"ok"], 0).unwrap();
        e[2].send(1, 5, &[b"ok"], 0).unwrap();
        e[0].send(1, 4, &[b"bad"], 0).unwrap();
        // Records of 16 bytes: four above, then "ok"; "bad" is the sixth.
        let at = box_data_at(region, &layout, 1, 0) + 80;
        let mut word = [0u8; 8];
        region.read_bytes(at, &mut word).unwrap();
        let word = u64::from_ne_bytes(word) | 1 << 37;
        region.write_bytes(at, &word.to_ne_bytes()).unwrap();
        swept.clear();
        let s = e[1].sweep_boxes(|p, t, d| swept.push((p, t, d.to_vec())));
        assert!(s.rest);
        assert!(swept.contains(&(0, 4, b"ok".to_vec())));
        assert!(swept.contains(&(2, 5, b"ok".to_vec())));
        assert_eq!(s.delivered, 2);
        assert_eq!(e[1].peer_state(0), Some(PeerState::Connected));
        e[1].progress(&mut r1);
        assert!(matches!(
            only_box_failure(&r1, 0),
            Some(fbox::Corruption::ReservedBits { .. })
        ));
        assert_eq!(e[1].peer_state(2), Some(PeerState::Connected));
        // The failed peer's box is not swept again.
        swept.clear();
        e[2].send(1, 6, &[b"on"], 0).unwrap();
        let s = e[1].sweep_boxes(|p, t, d| swept.push((p, t, d.to_vec())));
        assert_eq!((s.delivered, swept), (1, vec![(2, 6, b"on".to_vec())]));
        e[0].progress(&mut r0);
    });
}

#[test]
fn a_corrupt_box_record_fails_its_writer() {
    with_job_params(3, box_params(16), |e, region| {
        let layout = segment_layout(&box_params(16), 3).unwrap();
        let (mut r0, mut r1) = (Rec::default(), Rec::default());
        e[1].send(0, 1, &[b"ok"], 0).unwrap();
        e[2].send(0, 1, &[b"ok"], 0).unwrap();
        // Rank 1's next record, scribbled on: reserved bits in the header.
        e[1].send(0, 1, &[b"bad"], 0).unwrap();
        let at = box_data_at(region, &layout, 0, 1) + 16;
        let mut word = [0u8; 8];
        region.read_bytes(at, &mut word).unwrap();
        let word = u64::from_ne_bytes(word) | 1 << 37;
        region.write_bytes(at, &word.to_ne_bytes()).unwrap();
        e[0].progress(&mut r0);
        assert_eq!(r0.got, vec![(1, 1, b"ok".to_vec()), (2, 1, b"ok".to_vec())]);
        assert!(matches!(
            only_box_failure(&r0, 1),
            Some(fbox::Corruption::ReservedBits { .. })
        ));
        assert_eq!(r0.failed[0].1.structure(), Structure::FastBox);
        assert_eq!(e[0].peer_state(1), Some(PeerState::Failed));
        assert_eq!(e[0].peer_state(2), Some(PeerState::Connected));
        // Rank 2 goes on.
        e[2].send(0, 1, &[b"on"], 0).unwrap();
        e[0].progress(&mut r0);
        assert_eq!(r0.got.last(), Some(&(2, 1, b"on".to_vec())));
        assert!(r1.failed.is_empty());
        e[1].progress(&mut r1);
    });
}

#[test]
fn an_impossible_reader_tail_fails_the_reader() {
    with_job_params(2, box_params(16), |e, region| {
        let layout = segment_layout(&box_params(16), 2).unwrap();
        let mut r0 = Rec::default();
        e[0].send(1, 1, &[b"x"], 0).unwrap();
        // Rank 1's tail of our box, beyond anything we wrote.
        let tail_at = box_at(region, &layout, 1, 0) + Fbox::TAIL_OFFSET as u64;
        region.write_bytes(tail_at, &4096u64.to_ne_bytes()).unwrap();
        assert!(!e[0].fboxes_drained());
        e[0].progress(&mut r0);
        assert!(matches!(
            only_box_failure(&r0, 1),
            Some(fbox::Corruption::TailBeyondHead { .. })
        ));
        assert_eq!(
            e[0].send(1, 1, &[b"y"], 0),
            Err(SendError::PeerFailed { peer: 1 })
        );
        assert!(
            e[0].fboxes_drained(),
            "a failed peer's box is not waited for"
        );
    });
}

#[test]
fn the_boxed_fast_path_sends_what_send_would_and_declines_the_rest() {
    with_job_params(2, box_params(16), |e, region| {
        let layout = segment_layout(&box_params(16), 2).unwrap();
        let (mut r0, mut r1) = (Rec::default(), Rec::default());
        // The offered box is attached by the checked path's first send:
        // until then the fast path declines.
        assert!(!e[0].try_send_boxed(1, 1, &[b"ab", b"cde"]));
        e[0].send(1, 0, &[b"attach"], 0).unwrap();
        assert!(e[0].try_send_boxed(1, 1, &[b"ab", b"cde"]));
        assert!(e[0].try_send_boxed(1, 2, &[b"f"]));
        assert_eq!((e[0].fbox_sent(), e[0].outstanding()), (3, 0));
        // Declined, nothing sent: a reserved tag, too large for a record
        // (56 bytes here), a rank that does not exist, ourselves.
        assert!(!e[0].try_send_boxed(1, 250, &[b"x"]));
        assert!(!e[0].try_send_boxed(1, 1, &[&[1; 50], &[2; 7]]));
        assert!(!e[0].try_send_boxed(5, 1, &[b"x"]));
        assert!(!e[0].try_send_boxed(0, 1, &[b"x"]));
        assert_eq!((e[0].fbox_sent(), e[0].outstanding()), (3, 0));
        // Behind a ring message not yet acknowledged it declines too (the
        // hand-off rule), and `send` puts the message on the ring: order
        // holds.
        e[0].send(1, 3, &[b"ring"], 7).unwrap();
        assert!(!e[0].try_send_boxed(1, 4, &[b"late"]));
        e[0].send(1, 4, &[b"late"], 0).unwrap();
        e[1].progress(&mut r1);
        let got: Vec<_> = r1
            .got
            .iter()
            .map(|(p, t, d)| (*p, *t, d.as_slice()))
            .collect();
        assert_eq!(
            got,
            [
                (0, 0, &b"attach"[..]),
                (0, 1, b"abcde"),
                (0, 2, b"f"),
                (0, 3, b"ring"),
                (0, 4, b"late")
            ]
        );
        e[0].progress(&mut r0);
        assert!(r0.failed.is_empty() && r1.failed.is_empty());
        // A reader's tail beyond anything written: the fast path declines
        // once the writer looks at it, and `send` reports the peer failed,
        // once.
        let tail_at = box_at(region, &layout, 1, 0) + Fbox::TAIL_OFFSET as u64;
        region.write_bytes(tail_at, &4096u64.to_ne_bytes()).unwrap();
        let mut sent = 0;
        while e[0].try_send_boxed(1, 5, &[&[9; 40]]) {
            sent += 1;
            assert!(sent < 100, "the box never looked at the tail");
        }
        assert_eq!(
            e[0].send(1, 5, &[b"y"], 0),
            Err(SendError::PeerFailed { peer: 1 })
        );
        e[0].progress(&mut r0);
        assert!(matches!(
            only_box_failure(&r0, 1),
            Some(fbox::Corruption::TailBeyondHead { .. })
        ));
        assert!(!e[0].try_send_boxed(1, 5, &[b"z"]));
    });
}

#[test]
fn send_recv_ack_roundtrip() {
    with_job(2, 16, |e, _| {
        let (mut r0, mut r1) = (Rec::default(), Rec::default());
        e[0].send(1, 7, &[b"hello ", b"world"], 42).unwrap();
        assert_eq!(e[0].outstanding(), 1);
        assert_eq!(e[1].progress(&mut r1), 1);
        assert_eq!(r1.got, vec![(0, 7, b"hello world".to_vec())]);
        assert_eq!(e[0].progress(&mut r0), 1);
        assert_eq!(r0.done, vec![(1, 42, true)]);
        assert_eq!(e[0].outstanding(), 0);
        // Max-size fragment (above the eager limit) and an empty one.
        let big = vec![0xab; 256];
        e[1].send(0, 1, &[&big], 1).unwrap();
        e[1].send(0, 2, &[], 2).unwrap();
        assert!(matches!(
            e[1].send(0, 3, &[&[0; 257]], 3),
            Err(SendError::TooLarge { .. })
        ));
        e[0].progress(&mut r0);
        e[1].progress(&mut r1);
        assert_eq!(r0.got, vec![(1, 1, big), (1, 2, vec![])]);
        assert_eq!(r1.done, vec![(0, 1, true), (0, 2, true)]);
        assert!(r0.errors.is_empty() && r1.errors.is_empty());
    });
}

#[test]
fn invalid_peers_are_refused() {
    with_job(2, 16, |e, _| {
        assert_eq!(
            e[0].send(0, 1, &[], 0),
            Err(SendError::InvalidPeer { peer: 0 })
        );
        assert_eq!(
            e[0].send(5, 1, &[], 0),
            Err(SendError::InvalidPeer { peer: 5 })
        );
    });
}

#[test]
fn refused_handler_acks_with_error() {
    with_job(2, 16, |e, _| {
        let (mut r0, mut r1) = (
            Rec::default(),
            Rec {
                refuse_tag: Some(9),
                ..Rec::default()
            },
        );
        e[0].send(1, 9, &[b"x"], 5).unwrap();
        e[1].progress(&mut r1);
        e[0].progress(&mut r0);
        assert_eq!(r0.done, vec![(1, 5, false)]);
    });
}

#[test]
#[allow(clippy::needless_range_loop)]
fn flood_through_a_small_ring_keeps_order() {
    // Ring of 4 slots; 3 ranks all flooding rank 0 and each other.
    with_job(3, 4, |e, _| {
        let mut recs: Vec<Rec> = (0..3).map(|_| Rec::default()).collect();
        let per_pair = 200u32;
        let mut next_send = [[0u32; 3]; 3];
        let mut total_done = 0;
        let want = 3 * 2 * per_pair as usize;
        let mut rounds = 0;
        while total_done < want {
            rounds += 1;
            assert!(rounds < 100_000, "no progress");
            for s in 0..3usize {
                for d in 0..3usize {
                    if s == d || next_send[s][d] == per_pair {
                        continue;
                    }
                    // Bursts of up to 6, so the 4-slot rings overflow.
                    for _ in 0..6 {
                        let seq = next_send[s][d];
                        if seq == per_pair {
                            break;
                        }
                        let payload = seq.to_le_bytes();
                        match e[s].send(d as u32, d as u8, &[&payload], u64::from(seq)) {
                            Ok(()) => next_send[s][d] += 1,
                            Err(SendError::NoFragment | SendError::Backlog { .. }) => break,
                            Err(err) => panic!("{err}"),
                        }
                    }
                }
            }
            for (r, rec) in recs.iter_mut().enumerate() {
                e[r].progress(rec);
            }
            total_done = recs.iter().map(|r| r.done.len()).sum();
        }
        for (r, rec) in recs.iter().enumerate() {
            assert!(rec.errors.is_empty(), "{:?}", rec.errors);
            for s in 0..3u32 {
                let seqs: Vec<u32> = rec
                    .got
                    .iter()
                    .filter(|(p, _, _)| *p == s)
                    .map(|(_, tag, b)| {
                        assert_eq!(*tag as usize, r);
                        u32::from_le_bytes(b[..4].try_into().unwrap())
                    })
                    .collect();
                if s as usize == r {
                    assert!(seqs.is_empty());
                } else {
                    assert_eq!(
                        seqs,
                        (0..per_pair).collect::<Vec<_>>(),
                        "{s} -> {r} out of order"
                    );
                }
            }
            assert!(rec.done.iter().all(|&(_, _, ok)| ok));
        }
        assert!(e.iter().all(|x| x.outstanding() == 0 && x.pending() == 0));
        assert!(
            e.iter().any(|x| x.queued_total() > 0),
            "the flood never queued"
        );
    });
}

#[test]
fn fragments_run_out_then_come_back() {
    with_job(2, 64, |e, _| {
        let mut n = 0;
        while e[0].send(1, 0, &[b"x"], n).is_ok() {
            n += 1;
        }
        // Eager (4 × 2) and max-size (2 + 4) fragments all in flight: the
        // pools grew by use to their room.
        assert_eq!(n, 14);
        assert_eq!(e[0].send(1, 0, &[b"x"], 99), Err(SendError::NoFragment));
        let (mut r0, mut r1) = (Rec::default(), Rec::default());
        e[1].progress(&mut r1);
        e[0].progress(&mut r0);
        assert_eq!(r0.done.len(), 14);
        e[0].send(1, 0, &[b"x"], 99).unwrap();
    });
}

#[test]
fn failed_peer_completes_in_flight_with_error() {
    with_job(3, 16, |e, _| {
        let mut r0 = Rec::default();
        e[0].send(1, 0, &[b"a"], 1).unwrap();
        e[0].send(1, 0, &[b"b"], 2).unwrap();
        e[0].send(2, 0, &[b"c"], 3).unwrap();
        assert_eq!(e[0].fail_peer(1, &mut r0), 2);
        assert_eq!(r0.done, vec![(1, 1, false), (1, 2, false)]);
        assert_eq!(e[0].outstanding(), 1);
        assert_eq!(
            e[0].send(1, 0, &[b"d"], 4),
            Err(SendError::PeerFailed { peer: 1 })
        );
        assert_eq!(e[0].fail_peer(1, &mut r0), 0);
        // Rank 1's late SEND to 0 is ignored.
        e[1].send(0, 0, &[b"late"], 7).unwrap();
        e[0].progress(&mut r0);
        assert!(r0.got.is_empty());
    });
}

#[test]
fn garbage_in_a_shared_ring_fails_every_writer() {
    // The seed's default, one ring per receiver: a value that names nobody
    // may have replaced anyone's slot, so every writer is failed.
    with_job(3, 16, |e, region| {
        let layout = segment_layout(&small_params(16), 3).unwrap();
        let (mut r0, mut r1) = (Rec::default(), Rec::default());
        e[0].send(1, 1, &[b"ours"], 6).unwrap();
        let mut evil = intruder(region, &layout, 0, 0);
        evil.push(1 << 63).unwrap();
        e[1].send(0, 1, &[b"behind the garbage"], 5).unwrap();
        e[0].progress(&mut r0);
        assert!(
            matches!(r0.errors[..], [PeerError::BadSlot { ring: 0, .. }]),
            "{:?}",
            r0.errors
        );
        let failed: Vec<u32> = r0.failed.iter().map(|f| f.0).collect();
        assert_eq!(failed, [1, 2]);
        // Our fragment in flight to rank 1 completed with an error.
        assert_eq!(r0.done, vec![(1, 6, false)]);
        assert_eq!(e[0].peer_state(1), Some(PeerState::Failed));
        assert_eq!(
            e[0].send(2, 1, &[], 0),
            Err(SendError::PeerFailed { peer: 2 })
        );
        // Rank 1's SEND behind the garbage is ignored: no new error.
        assert!(r0.got.is_empty());
        e[0].progress(&mut r0);
        assert_eq!(r0.errors.len(), 1);
        // Rank 1 itself still works with rank 2.
        e[1].send(2, 1, &[b"x"], 7).unwrap();
        e[1].progress(&mut r1);
        assert!(r1.errors.is_empty());
    });
}

#[test]
fn garbage_in_a_private_ring_fails_only_its_writer() {
    with_job_params(3, private_rings(16), |e, region| {
        let layout = segment_layout(&private_rings(16), 3).unwrap();
        let (mut r0, mut r2) = (Rec::default(), Rec::default());
        // Rank 1 writes into rank 0's ring 1: garbage there is rank 1's.
        let mut evil = intruder(region, &layout, 0, 1);
        evil.push(slot(FragType::Put, 1, 64) | 2).unwrap();
        e[0].progress(&mut r0);
        assert_eq!(r0.failed.len(), 1, "{:?}", r0.failed);
        assert_eq!(r0.failed[0].0, 1);
        assert_eq!(r0.failed[0].1.structure(), Structure::RingSlot);
        // Rank 2 goes on.
        e[2].send(0, 3, &[b"still"], 1).unwrap();
        e[0].progress(&mut r0);
        assert_eq!(r0.got, vec![(2, 3, b"still".to_vec())]);
        e[2].progress(&mut r2);
        assert_eq!(r2.done, vec![(0, 1, true)]);
    });
}

#[test]
fn slots_naming_a_rank_that_cannot_write_here_fail_the_ring_writers() {
    with_job_params(3, private_rings(16), |e, region| {
        let layout = segment_layout(&private_rings(16), 3).unwrap();
        // In rank 0's ring 1 (rank 1's): a SEND claiming rank 2's fragment,
        // an ACK claiming to be rank 2's, a rank outside the job, rank 0.
        for forged in [
            slot(FragType::Send, 2, first_eager(&layout, 2)),
            slot(FragType::Ack, 2, first_eager(&layout, 0)),
            slot(FragType::Send, 7, 64),
            slot(FragType::Ack, 0, first_eager(&layout, 0)),
        ] {
            let mut r0 = Rec::default();
            intruder(region, &layout, 0, 1).push(forged).unwrap();
            e[0].progress(&mut r0);
            assert!(
                matches!(r0.errors[..], [PeerError::BadSender { ring: 1, .. }]),
                "{forged:#x}: {:?}",
                r0.errors
            );
        }
        assert_eq!(e[0].peer_state(1), Some(PeerState::Failed));
        assert_eq!(e[0].peer_state(2), Some(PeerState::Connected));
    });
}

#[test]
fn a_header_changed_in_flight_fails_its_owner() {
    with_job(2, 16, |e, region| {
        let layout = segment_layout(&small_params(16), 2).unwrap();
        let (mut r0, mut r1) = (Rec::default(), Rec::default());
        e[1].send(0, 3, &[b"ok"], 11).unwrap();
        // A stranger makes the message longer while it is in flight.
        let frag = layout.eager_frag_offset(1, 0).unwrap() + frag_field::LEN;
        region
            .write_bytes(frag as u64, &40u32.to_le_bytes())
            .unwrap();
        e[0].progress(&mut r0);
        assert!(
            matches!(
                r0.errors[..],
                [PeerError::BadFragment {
                    peer: 1,
                    error: FragError::BadCheck { .. }
                }]
            ),
            "{:?}",
            r0.errors
        );
        assert_eq!(r0.failed.iter().map(|f| f.0).collect::<Vec<_>>(), [1]);
        assert!(r0.got.is_empty());
        // No ACK comes back: rank 1 learns of it by other means (the
        // adapter), and its fragment stays in flight until it fails rank 0.
        e[1].progress(&mut r1);
        assert!(r1.done.is_empty());
        assert_eq!(e[1].fail_peer(0, &mut r1), 1);
        assert_eq!(r1.done, vec![(0, 11, false)]);
    });
}

#[test]
fn replayed_and_duplicated_sends_fail_their_sender() {
    // A SEND of a fragment delivered before (its header intact, but an old
    // sequence number), or the same SEND twice: refused, sender failed.
    for duplicate_now in [false, true] {
        with_job(2, 16, |e, region| {
            let layout = segment_layout(&small_params(16), 2).unwrap();
            let (mut r0, mut r1) = (Rec::default(), Rec::default());
            e[1].send(0, 3, &[b"once"], 1).unwrap();
            let mut evil = intruder(region, &layout, 0, 0);
            let replay = slot(FragType::Send, 1, first_eager(&layout, 1));
            if duplicate_now {
                evil.push(replay).unwrap();
            } else {
                e[0].progress(&mut r0);
                e[1].progress(&mut r1);
                assert_eq!(r1.done, vec![(0, 1, true)]);
                evil.push(replay).unwrap();
            }
            e[0].progress(&mut r0);
            assert_eq!(r0.got, vec![(1, 3, b"once".to_vec())], "delivered once");
            assert!(
                matches!(
                    r0.errors[..],
                    [PeerError::BadSequence {
                        peer: 1,
                        expected: 1,
                        found: 0
                    }]
                ),
                "{:?}",
                r0.errors
            );
            assert_eq!(e[0].peer_state(1), Some(PeerState::Failed));
        });
    }
}

#[test]
fn acks_count_only_from_the_peer_a_fragment_was_sent_to() {
    with_job_params(3, private_rings(16), |e, region| {
        let layout = segment_layout(&private_rings(16), 3).unwrap();
        let (mut r0, mut r1) = (Rec::default(), Rec::default());
        e[0].send(1, 3, &[b"to one"], 42).unwrap();
        let frag = first_eager(&layout, 0);
        // Rank 2 (its own ring of rank 0) acknowledges rank 1's fragment.
        let ring2 = fifo_map(2, 4);
        intruder(region, &layout, 0, ring2)
            .push(slot(FragType::Ack, 2, frag))
            .unwrap();
        e[0].progress(&mut r0);
        assert_eq!(
            r0.errors,
            vec![PeerError::ForgedAck {
                peer: 2,
                offset: frag,
                sent_to: 1
            }]
        );
        assert_eq!(r0.failed.iter().map(|f| f.0).collect::<Vec<_>>(), [2]);
        assert!(r0.done.is_empty(), "the forged ACK completed nothing");
        assert_eq!(e[0].outstanding(), 1);
        // Rank 1's real ACK completes it.
        e[1].progress(&mut r1);
        e[0].progress(&mut r0);
        assert_eq!(r0.done, vec![(1, 42, true)]);
        assert_eq!(e[0].peer_state(1), Some(PeerState::Connected));
    });
}

#[test]
fn acks_out_of_turn_not_in_flight_or_unknown_fail_their_sender() {
    let layout = segment_layout(&small_params(16), 2).unwrap();
    let eager =
        |i: u32| (layout.eager_frag_offset(0, i).unwrap() - layout.part_offset(0).unwrap()) as u64;
    // Fragments are taken LIFO from the free list: the second send takes
    // the one the first did not; find both by sending.
    for (case, forged) in [
        ("out of turn", None),
        ("not in flight", Some(eager(3))),
        ("not a fragment", Some(eager(0) + 8)),
    ] {
        with_job(2, 16, |e, region| {
            let mut r0 = Rec::default();
            e[0].send(1, 3, &[b"a"], 1).unwrap();
            e[0].send(1, 3, &[b"b"], 2).unwrap();
            let second = e[0].descs[e[0].peers[1].newest as usize].offset;
            let offset = forged.unwrap_or(second);
            intruder(region, &layout, 0, 0)
                .push(slot(FragType::Ack, 1, offset))
                .unwrap();
            e[0].progress(&mut r0);
            let want = match case {
                "out of turn" => PeerError::AckOutOfOrder { peer: 1, offset },
                "not in flight" => PeerError::UnexpectedAck { peer: 1, offset },
                _ => PeerError::UnknownAck { peer: 1, offset },
            };
            assert_eq!(r0.errors, vec![want], "{case}");
            assert_eq!(r0.failed.len(), 1, "{case}");
            // Both fragments completed with an error with the failure.
            assert_eq!(r0.done, vec![(1, 1, false), (1, 2, false)], "{case}");
            assert_eq!(e[0].outstanding(), 0);
        });
    }
}

#[test]
fn acks_come_back_in_send_order() {
    with_job(2, 64, |e, _| {
        let (mut r0, mut r1) = (Rec::default(), Rec::default());
        for i in 0..10u64 {
            e[0].send(1, 1, &[&[i as u8; 3]], i).unwrap();
        }
        e[1].progress(&mut r1);
        e[0].progress(&mut r0);
        assert!(r0.errors.is_empty() && r1.errors.is_empty());
        let cookies: Vec<u64> = r0.done.iter().map(|d| d.1).collect();
        assert_eq!(cookies, (0..10).collect::<Vec<_>>());
    });
}

#[test]
fn inconsistent_ring_counters_fail_the_ring_writers() {
    let layout = segment_layout(&small_params(16), 2).unwrap();
    let ring_at = layout.ring_offset(0, 0).unwrap() as u64;
    // head is the writers' line, freed the reader's (first word of each).
    for (what, at, value) in [
        ("freed", ring_at + CACHE_LINE as u64, 5u64),
        ("head far ahead", ring_at, 1000),
        ("head behind", ring_at, u64::MAX),
    ] {
        with_job(2, 16, |e, region| {
            let mut r0 = Rec::default();
            e[0].audit_rings(10, &mut r0);
            assert!(r0.errors.is_empty(), "{what}: clean ring");
            region.write_bytes(at, &value.to_le_bytes()).unwrap();
            e[0].audit_rings(10, &mut r0);
            assert!(
                matches!(r0.errors[..], [PeerError::Ring { ring: 0, .. }]),
                "{what}: {:?}",
                r0.errors
            );
            assert_eq!(r0.failed.iter().map(|f| f.0).collect::<Vec<_>>(), [1]);
            // Nobody left to blame: the next audit is quiet.
            e[0].audit_rings(10, &mut r0);
            assert_eq!(r0.errors.len(), 1, "{what}");
        });
    }
}

#[test]
fn a_ring_header_changed_after_attach_is_a_fault() {
    with_job(2, 16, |e, region| {
        let layout = segment_layout(&small_params(16), 2).unwrap();
        let meta_at = layout.ring_offset(0, 0).unwrap() + 2 * CACHE_LINE;
        let mut r0 = Rec::default();
        // The size word (magic, version, size, lazy_free).
        region
            .write_bytes(meta_at as u64 + 8, &8u32.to_le_bytes())
            .unwrap();
        e[0].audit_rings(10, &mut r0);
        assert!(
            matches!(
                r0.errors[..],
                [PeerError::Ring {
                    fault: RingFault::Header,
                    ..
                }]
            ),
            "{:?}",
            r0.errors
        );
    });
}

#[test]
fn a_reservation_left_unwritten_is_a_fault_after_n_audits() {
    with_job(2, 16, |e, region| {
        let layout = segment_layout(&small_params(16), 2).unwrap();
        let ring_at = layout.ring_offset(0, 0).unwrap() as u64;
        let mut r0 = Rec::default();
        // A writer reserved index 0 and died before writing it.
        region.write_bytes(ring_at, &1u64.to_le_bytes()).unwrap();
        for _ in 0..4 {
            e[0].audit_rings(5, &mut r0);
        }
        assert!(r0.errors.is_empty(), "{:?}", r0.errors);
        e[0].audit_rings(5, &mut r0);
        assert!(
            matches!(
                r0.errors[..],
                [PeerError::Ring {
                    fault: RingFault::Stalled {
                        index: 0,
                        audits: 5
                    },
                    ..
                }]
            ),
            "{:?}",
            r0.errors
        );
    });
}

#[test]
fn a_failed_writers_stalled_reservation_is_stepped_over() {
    // One ring shared by ranks 1 and 2 (the seed's default). Rank 2
    // reserved index 0 of rank 0's ring and was killed before writing it;
    // rank 1's SEND sits behind it. Once rank 2 is failed, the stall is
    // put down to it: the reader steps over the slot and rank 1 goes on.
    with_job(3, 16, |e, region| {
        let layout = segment_layout(&small_params(16), 3).unwrap();
        let ring_at = layout.ring_offset(0, 0).unwrap() as u64;
        let mut r0 = Rec::default();
        region.write_bytes(ring_at, &1u64.to_le_bytes()).unwrap();
        e[1].send(0, 1, &[b"behind the stall"], 5).unwrap();
        e[0].progress(&mut r0);
        assert!(r0.got.is_empty(), "the reader waits at the stalled slot");
        e[0].fail_peer(2, &mut r0);
        for _ in 0..5 {
            e[0].audit_rings(5, &mut r0);
        }
        assert!(r0.errors.is_empty(), "{:?}", r0.errors);
        assert!(r0.failed.is_empty(), "{:?}", r0.failed);
        assert_eq!(e[0].peer_state(1), Some(PeerState::Connected));
        assert_eq!(e[0].slots_skipped(), 1);
        e[0].progress(&mut r0);
        assert_eq!(r0.got, vec![(1, 1, b"behind the stall".to_vec())]);
        // Without a failed writer the same stall is still a fault (see
        // a_reservation_left_unwritten_is_a_fault_after_n_audits).
    });
}

/// Found by the hostile shared-memory peer test: another process that
/// overwrote the owner or capacity of a fragment header made every later
/// use of that fragment fail validation at the receiver, so the sender
/// lost every message that went through it, long after the corruption
/// stopped. The owner now writes every field again before each send.
#[test]
fn scribbled_header_of_a_free_fragment_heals_on_the_next_send() {
    with_job(2, 16, |e, region| {
        let layout = segment_layout(&small_params(16), 2).unwrap();
        let (mut r0, mut r1) = (Rec::default(), Rec::default());
        let part0_at = layout.part_offset(0).unwrap();
        let part0 = region
            .subregion(part0_at as u64, layout.part_bytes)
            .unwrap();
        // The eager fragment rank 0 takes first (free lists are LIFO).
        let frag_at = e[0].descs[e[0].free_eager as usize].offset;
        for (field, value) in [
            (frag_field::OWNER, 7u32),
            (frag_field::CAPACITY, 1 << 30),
            (frag_field::SEQ, 99),
            (frag_field::CHECK, 0),
        ] {
            // As a stranger writes it, while the fragment is free.
            part0
                .write_bytes(frag_at + field as u64, &value.to_le_bytes())
                .unwrap();
            e[0].send(1, 5, &[b"still here"], 1).unwrap();
            e[1].progress(&mut r1);
            assert!(r1.errors.is_empty(), "{:?}", r1.errors);
            assert_eq!(r1.got, vec![(0, 5, b"still here".to_vec())]);
            r1.got.clear();
            e[0].progress(&mut r0);
            assert_eq!(r0.done, vec![(1, 1, true)]);
            r0.done.clear();
        }
    });
}

/// The memory of a job, as a pointer a test may hand to other threads.
#[derive(Clone, Copy)]
struct SharedMem(NonNull<u8>, usize);

// SAFETY: (test) only an address and a length; each thread builds its own
// `Region` from it under `Region::from_raw_parts`' contract (see below).
unsafe impl Send for SharedMem {}

impl SharedMem {
    /// A region over the memory.
    ///
    /// # Safety
    ///
    /// `Region::from_raw_parts`' contract, for the buffer this was made of.
    unsafe fn region<'a>(self) -> Region<'a> {
        // SAFETY: the caller's.
        unsafe { Region::from_raw_parts(self.0, self.1) }
    }
}

impl Job {
    fn shared(&mut self) -> SharedMem {
        let len = self.mem.len() * CACHE_LINE;
        SharedMem(
            NonNull::new(self.mem.as_mut_ptr().cast::<u8>()).unwrap(),
            len,
        )
    }
}

/// Two engines, each in its own thread with its own region over one
/// buffer, exchange messages whose payloads the sender copies into a
/// fragment and the receiver copies out, fragments being recycled on each
/// ACK. Under miri (the test command's `miri` step) this checks that the
/// engine's protocol orders every payload copy with the next write of the
/// same bytes (the SEND's and the ACK's release/acquire pairs): were it not
/// so, miri would report the data race. The same program with one region
/// shared by both threads does not compile (`Region` is not `Sync`; see its
/// documentation).
#[test]
fn two_engines_in_two_threads_hand_fragments_over() {
    hand_over_in_two_threads(small_params(4));
}

/// The same with fast boxes: two messages in three need no completion and
/// take the box when the hand-off rule allows; the rest (and whatever
/// does not fit) the ring. Order holds across both, every byte arrives.
#[test]
fn two_engines_in_two_threads_hand_over_through_boxes_and_rings() {
    hand_over_in_two_threads(box_params(4));
}

fn hand_over_in_two_threads(params: SmParams) {
    const N: u32 = if cfg!(miri) { 24 } else { 5_000 };
    let boxes = params.fbox_size > 0;
    let cookie = move |i: u32| {
        if boxes && i % 3 != 0 {
            0
        } else {
            u64::from(i) + 1
        }
    };
    let mut job = Job::with_params(2, params);
    let shape = job.shape;
    let mem = job.shared();
    {
        // SAFETY: no other thread exists yet; the buffer lives until the
        // end of this test and is only accessed through regions.
        let region = unsafe { mem.region() };
        for r in 0..2 {
            // SAFETY: nothing else touches the parts yet.
            unsafe { init_part(&region, &shape.layout, &shape.params, r) }.unwrap();
        }
    }
    let payload = |i: u32| -> Vec<u8> {
        let len = if boxes && i % 3 != 0 {
            // Up to the box's record limit and one beyond.
            (i as usize * 7) % 58
        } else {
            (i as usize * 37) % (shape.params.max_send_size as usize + 1)
        };
        (0..len).map(|k| (i as usize + k) as u8).collect()
    };
    std::thread::scope(|s| {
        for me in 0..2u32 {
            s.spawn(move || {
                // SAFETY: the buffer outlives the scope; the other thread's
                // region copies bytes of a fragment only while the protocol
                // hands it over (SEND published by a release push, ACK
                // likewise), and nothing else writes the memory.
                let region = unsafe { mem.region() };
                let mut e =
                    Eng::attach_collected(&region, &shape.layout, &shape.params, me, 2, Backed)
                        .unwrap();
                let mut rec = Rec::default();
                let (mut sent, mut spins) = (0u32, 0u64);
                loop {
                    // With boxes, every 16th message waits for the ring's
                    // ACKs, so the box gets its turns (the hand-off rule).
                    let wait = boxes && sent % 16 == 0 && e.outstanding() > 0;
                    if me == 0 && sent < N && !wait {
                        let p = payload(sent);
                        match e.send(1, (sent % 200) as u8, &[&p], cookie(sent)) {
                            Ok(()) => sent += 1,
                            Err(SendError::NoFragment | SendError::Backlog { .. }) => {}
                            Err(err) => panic!("{err}"),
                        }
                    }
                    if e.progress(&mut rec) == 0 {
                        e.release_consumed();
                        std::thread::yield_now();
                    }
                    let done = if me == 0 {
                        sent == N && e.outstanding() == 0 && e.fboxes_drained()
                    } else {
                        rec.got.len() == N as usize && e.pending() == 0
                    };
                    if done {
                        break;
                    }
                    spins += 1;
                    assert!(spins < 50_000_000, "rank {me}: no progress");
                }
                assert!(rec.errors.is_empty(), "rank {me}: {:?}", rec.errors);
                if me == 0 {
                    assert!(rec.done.iter().all(|&(_, _, ok)| ok));
                    // Every message that asked for its completion got it,
                    // in order; every other went by the box or the ring.
                    let acked: Vec<u64> =
                        rec.done.iter().map(|d| d.1).filter(|&c| c != 0).collect();
                    let want: Vec<u64> = (0..N).map(cookie).filter(|&c| c != 0).collect();
                    assert!(acked == want, "completions out of order or missing");
                    assert_eq!(e.fbox_sent() + rec.done.len() as u64, u64::from(N));
                    assert_eq!(e.fbox_sent() > 0, boxes, "boxes used iff configured");
                } else {
                    assert_eq!(e.fbox_received() > 0, boxes);
                    for (i, (peer, tag, data)) in rec.got.iter().enumerate() {
                        assert_eq!((*peer, *tag), (0, (i % 200) as u8));
                        assert_eq!(*data, payload(i as u32), "message {i}");
                    }
                }
            });
        }
    });
}

/// Reserves only the first `budget` bytes asked for, counting every
/// request (the Linux adapter's `fallocate`, with a memory limit).
#[derive(Debug, Default)]
struct Budget {
    left: u64,
    asked: Vec<(u64, u64)>,
}

impl Reserve for Budget {
    fn reserve(&mut self, offset: u64, len: u64) -> bool {
        self.asked.push((offset, len));
        if len > self.left {
            return false;
        }
        self.left -= len;
        true
    }
}

type BudgetEng<'a> =
    SmEngine<'a, Vec<PeerSlot<'a>>, Vec<Option<Consumer<'a>>>, Vec<FragDesc>, Vec<u64>, Budget>;

fn budget_engine<'a>(
    region: &Region<'a>,
    job: &JobShape,
    me: u32,
    left: u64,
) -> Result<BudgetEng<'a>, SetupError> {
    BudgetEng::attach_collected(
        region,
        &job.layout,
        &job.params,
        me,
        job.nprocs,
        Budget {
            left,
            asked: Vec::new(),
        },
    )
}

/// Initialises every part of `shape` (engines are attached by the test).
fn init_parts(region: &Region<'_>, shape: &JobShape) {
    for r in 0..shape.nprocs {
        // SAFETY: single-threaded test; nothing else touches the parts.
        unsafe { init_part(region, &shape.layout, &shape.params, r) }.unwrap();
    }
}

#[test]
fn pools_grow_by_use_reserving_each_step_and_stop_at_their_limits() {
    let mut job = Job::with_params(2, small_params(64));
    let shape = job.shape;
    let region = job.region();
    init_parts(&region, &shape);
    let l = shape.layout;
    let mut e0 = budget_engine(&region, &shape, 0, u64::MAX).unwrap();
    let mut e1 = budget_engine(&region, &shape, 1, u64::MAX).unwrap();
    // free_list_num (2) eager fragments and one max-size one at start,
    // reserved as two ranges of our own part.
    assert_eq!(e0.pool_sizes(), (2, 1));
    let part = l.part_offset(0).unwrap() as u64;
    let eager0 = l.eager_frag_offset(0, 0).unwrap() as u64;
    let max0 = l.max_frag_offset(0, 0).unwrap() as u64;
    assert_eq!(
        e0.reserve.asked,
        vec![
            (eager0, 2 * l.eager_frag_bytes as u64),
            (max0, l.max_frag_bytes as u64)
        ]
    );
    assert!(eager0 >= part + l.head_bytes().unwrap() as u64);
    // Eager messages: the eager pool grows by 2 at a time to its room (8),
    // then eager messages take max-size fragments (grown likewise, to 6).
    let mut sent = 0u64;
    while e0.send(1, 0, &[b"x"], sent + 1).is_ok() {
        sent += 1;
        let (eager, max) = e0.pool_sizes();
        assert!(eager <= l.eager_frags && max <= l.max_frags);
        if sent <= u64::from(l.eager_frags) {
            // Eager messages take eager fragments while there are any.
            assert_eq!(
                (u64::from(eager), max),
                (sent.next_multiple_of(2).max(2), 1)
            );
        } else {
            // Then max-size ones, grown by 2 from 1.
            let over = sent - u64::from(l.eager_frags);
            let want = if over <= 1 {
                1
            } else {
                (1 + (over - 1).next_multiple_of(2)).min(6)
            };
            assert_eq!(u64::from(max), want);
        }
    }
    assert_eq!(e0.pool_sizes(), (l.eager_frags, l.max_frags));
    assert_eq!(sent, u64::from(l.eager_frags + l.max_frags));
    // 2 ranges at start, then 2 → 4 → 6 → 8 eager and 1 → 3 → 5 → 6.
    assert_eq!(e0.reserve.asked.len(), 2 + 3 + 3);
    let (mut r0, mut r1) = (Rec::default(), Rec::default());
    e1.progress(&mut r1);
    e0.progress(&mut r0);
    assert_eq!(
        (r1.got.len(), r0.done.len()),
        (sent as usize, sent as usize)
    );
    // A limit below the room (never below what is carved) holds.
    let mut e1 = e1;
    e1.set_pool_limits(3, 2);
    let mut n = 0;
    while e1.send(0, 0, &[b"y"], n + 1).is_ok() {
        n += 1;
    }
    assert_eq!((n, e1.pool_sizes()), (5, (3, 2)));
}

#[test]
fn without_memory_the_pools_stay_as_they_are_and_nothing_is_lost() {
    let mut job = Job::with_params(2, small_params(64));
    let shape = job.shape;
    let region = job.region();
    init_parts(&region, &shape);
    let l = shape.layout;
    // Not even the first fragments: a clear error at start.
    let first = 2 * l.eager_frag_bytes as u64;
    assert_eq!(
        budget_engine(&region, &shape, 0, first - 1).unwrap_err(),
        SetupError::OutOfMemory { bytes: first }
    );
    // The first fragments and nothing more.
    let budget = (2 * l.eager_frag_bytes + l.max_frag_bytes) as u64;
    let mut e0 = budget_engine(&region, &shape, 0, budget).unwrap();
    let mut e1 = budget_engine(&region, &shape, 1, u64::MAX).unwrap();
    let (mut r0, mut r1) = (Rec::default(), Rec::default());
    let mut next = 0u8;
    for _round in 0..5 {
        let mut n = 0;
        while e0.send(1, 1, &[&[next]], u64::from(next) + 1).is_ok() {
            next += 1;
            n += 1;
        }
        assert_eq!(n, 3, "three fragments, the pools never grew");
        assert_eq!(e0.pool_sizes(), (2, 1));
        e1.progress(&mut r1);
        e0.progress(&mut r0);
    }
    let want: Vec<_> = (0..15u8).map(|i| (0, 1, vec![i])).collect();
    assert_eq!(r1.got, want);
    assert!(r0.done.iter().all(|&(_, _, ok)| ok) && r0.done.len() == 15);
    assert!(r0.errors.is_empty() && r1.errors.is_empty());
}

/// Parameters with boxes handed out after `threshold` small messages, at
/// most `max` of them.
fn lazy_box_params(threshold: u32, max: u32) -> SmParams {
    let mut p = box_params(16);
    p.fbox_threshold = threshold;
    p.fbox_max = max;
    p
}

#[test]
fn a_box_is_handed_out_after_the_threshold_of_small_messages() {
    with_job_params(2, lazy_box_params(3, 4), |e, region| {
        let layout = segment_layout(&lazy_box_params(3, 4), 2).unwrap();
        let (mut r0, mut r1) = (Rec::default(), Rec::default());
        let round = |e: &mut [Eng<'_>], r0: &mut Rec, r1: &mut Rec| {
            e[1].progress(r1);
            e[0].progress(r0);
        };
        // Large messages do not count; two small ones are not enough.
        e[0].send(1, 7, &[&[9u8; 200]], 0).unwrap();
        round(e, &mut r0, &mut r1);
        for i in 0..2u8 {
            e[0].send(1, 7, &[&[i]], 0).unwrap();
            round(e, &mut r0, &mut r1);
        }
        assert_eq!((e[1].boxes_handed_out(), e[0].fbox_sent()), (0, 0));
        let dir = layout.fbox_dir_offset(1, 0).unwrap() as u64;
        let mut word = [0u8; 8];
        region.read_bytes(dir, &mut word).unwrap();
        assert_eq!(u64::from_ne_bytes(word), 0, "no offer yet");
        // The third small message: rank 1 hands rank 0 the first box of
        // its pool.
        e[0].send(1, 7, &[&[2]], 0).unwrap();
        round(e, &mut r0, &mut r1);
        assert_eq!(e[1].boxes_handed_out(), 1);
        assert_eq!(
            box_at(region, &layout, 1, 0),
            layout.fbox_pool_offset(1, 0).unwrap() as u64
        );
        // From the next small send on, the box, in order with the ring.
        assert!(!e[0].has_box_to(1));
        for i in 3..10u8 {
            e[0].send(1, 7, &[&[i]], 0).unwrap();
        }
        assert!(e[0].has_box_to(1));
        assert_eq!(e[0].fbox_sent(), 7);
        e[0].send(1, 7, &[&[10u8; 200]], 0).unwrap();
        round(e, &mut r0, &mut r1);
        let lens: Vec<_> = r1.got.iter().map(|(_, _, b)| (b[0], b.len())).collect();
        let mut want = vec![(9, 200)];
        want.extend((0..10u8).map(|i| (i, 1)));
        want.push((10, 200));
        assert_eq!(lens, want);
        // Rank 1 never sent rank 0 anything: it has no box of rank 0's.
        assert_eq!(e[0].boxes_handed_out(), 0);
        assert!(r0.errors.is_empty() && r1.errors.is_empty());
    });
}

#[test]
fn a_receiver_hands_out_at_most_fbox_max_boxes() {
    with_job_params(4, lazy_box_params(1, 2), |e, _| {
        let mut rec: Vec<Rec> = (0..4).map(|_| Rec::default()).collect();
        for round in 0..6u8 {
            for s in 1..4u32 {
                e[s as usize].send(0, s as u8, &[&[round]], 0).unwrap();
            }
            for (r, x) in e.iter_mut().zip(rec.iter_mut()) {
                r.progress(x);
            }
        }
        assert_eq!(e[0].boxes_handed_out(), 2);
        let boxed: Vec<_> = (1..4).filter(|&s| e[s as usize].has_box_to(0)).collect();
        assert_eq!(boxed, vec![1, 2], "the first two senders got the two boxes");
        assert_eq!(e[3].fbox_sent(), 0);
        for s in 1..4u32 {
            let got: Vec<_> = rec[0]
                .got
                .iter()
                .filter(|(p, _, _)| *p == s)
                .map(|(_, _, b)| b[0])
                .collect();
            assert_eq!(got, (0..6u8).collect::<Vec<_>>(), "from {s}");
        }
        assert!(rec.iter().all(|r| r.errors.is_empty()));
    });
}

#[test]
fn a_forged_box_offer_fails_the_peer_it_names() {
    for forged in [
        |l: &SegmentLayout| l.fbox_pool_offset(1, 0).unwrap() as u64 + 8, // not a box start
        |l: &SegmentLayout| l.eager_frag_offset(1, 0).unwrap() as u64,    // not in the pool
        |l: &SegmentLayout| l.fbox_pool_offset(1, 1).unwrap() as u64,     // never initialised
    ] {
        with_job_params(3, lazy_box_params(100, 4), |e, region| {
            let layout = segment_layout(&lazy_box_params(100, 4), 3).unwrap();
            let part = layout.part_offset(1).unwrap() as u64;
            let word = ShmOffset::new(1, forged(&layout) - part).unwrap().raw();
            let dir = layout.fbox_dir_offset(1, 0).unwrap() as u64;
            region.write_bytes(dir, &word.to_ne_bytes()).unwrap();
            assert_eq!(
                e[0].send(1, 1, &[b"x"], 0),
                Err(SendError::PeerFailed { peer: 1 })
            );
            let mut r0 = Rec::default();
            e[0].progress(&mut r0);
            assert!(
                matches!(
                    r0.failed[..],
                    [(1, PeerError::FastBox { peer: 1, error: fbox::Corruption::BadOffer { word: w } })] if w == word
                ),
                "{:?}",
                r0.failed
            );
            assert_eq!(e[0].peer_state(2), Some(PeerState::Connected));
            e[0].send(2, 1, &[b"y"], 0).unwrap();
        });
    }
    // An offer naming another rank's part.
    with_job_params(3, lazy_box_params(100, 4), |e, region| {
        let layout = segment_layout(&lazy_box_params(100, 4), 3).unwrap();
        let at = layout.fbox_pool_offset(2, 0).unwrap() - layout.part_offset(2).unwrap();
        let word = ShmOffset::new(2, at as u64).unwrap().raw();
        let dir = layout.fbox_dir_offset(1, 0).unwrap() as u64;
        region.write_bytes(dir, &word.to_ne_bytes()).unwrap();
        assert!(e[0].send(1, 1, &[b"x"], 0).is_err());
        let mut r0 = Rec::default();
        e[0].progress(&mut r0);
        assert_eq!(r0.failed.len(), 1);
        assert_eq!(r0.failed[0].0, 1);
    });
}

/// Recorders for a sender and a receiver that holds the ACKs of `tag`.
fn holding(tag: u8) -> (Rec, Rec) {
    let r1 = Rec {
        hold_tag: Some(tag),
        ..Rec::default()
    };
    (Rec::default(), r1)
}

#[test]
fn held_acks_keep_the_acks_after_them_back_and_leave_with_their_status() {
    with_job(2, 16, |e, _| {
        let (mut r0, mut r1) = holding(5);
        e[0].send(1, 5, &[b"held"], 1).unwrap();
        e[0].send(1, 6, &[b"after"], 2).unwrap();
        e[1].progress(&mut r1);
        assert_eq!(r1.got.len(), 2);
        // Neither ACK left: the second waits behind the held one.
        e[0].progress(&mut r0);
        assert!(r0.done.is_empty());
        assert_eq!(e[0].outstanding(), 2);
        assert!(e[1].release_held(0, true));
        assert!(!e[1].release_held(0, true), "released twice");
        e[1].progress(&mut r1);
        e[0].progress(&mut r0);
        assert_eq!(r0.done, vec![(1, 1, true), (1, 2, true)]);
        // Released as refused: the ACK carries the error.
        e[0].send(1, 5, &[b"refused"], 3).unwrap();
        e[1].progress(&mut r1);
        assert!(e[1].release_held(0, false));
        e[0].progress(&mut r0);
        assert_eq!(r0.done[2..], [(1, 3, false)]);
        // A second hold while one is held is refused at once, behind it.
        e[0].send(1, 5, &[b"first"], 4).unwrap();
        e[0].send(1, 5, &[b"second"], 5).unwrap();
        e[1].progress(&mut r1);
        assert!(e[1].release_held(0, true));
        e[0].progress(&mut r0);
        assert_eq!(r0.done[3..], [(1, 4, true), (1, 5, false)]);
        assert!(r0.errors.is_empty() && r1.errors.is_empty());
        // Held, then the peer fails: nothing is left to release.
        e[0].send(1, 5, &[b"third"], 6).unwrap();
        e[1].progress(&mut r1);
        assert_eq!(e[1].fail_peer(0, &mut r1), 0);
        assert!(!e[1].release_held(0, true));
    });
}
