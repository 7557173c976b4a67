//! Fast boxes end to end, through real processes: `btl stress` over 2, 4,
//! 8 and 16 ranks with the box path in use (every rank says how many
//! messages it sent by fast box), and per-peer order across box and ring
//! when small and large messages alternate between two ranks in both
//! directions (the ranks are this test binary, re-run with
//! `BTL_TEST_ROLE`, as in `world_api.rs`); and the shared memory they
//! hold, bounded per rank.

use btl_linux::world::{Builder, Choice, Event, Flow, World};

mod common;
use common::{btl_run, in_role, text, BTL};

const TAG_SEQ: u8 = 5;

/// The count in `... N messages sent by fast box)` of a stress summary.
fn boxed(line: &str) -> Option<u64> {
    let end = line.find(" messages sent by fast box")?;
    line[..end].rsplit(' ').next()?.parse().ok()
}

#[test]
fn stress_2_4_8_and_16_ranks_through_fast_boxes() {
    if in_role() {
        return;
    }
    for n in [2u32, 4, 8, 16] {
        // `--timeout 240` is the hang bound (16 ranks on a loaded 2-core
        // machine take seconds).
        let o = btl_run(240, n)
            .arg(BTL)
            .args(["stress", "--messages", "150", "--max-size", "65536"])
            .env_remove("BTL_SM_FBOX_SIZE")
            .output()
            .expect("run btl");
        let (out, err) = text(&o);
        assert!(o.status.success(), "n={n}: {:?}\n{out}\n{err}", o.status);
        let lines: Vec<&str> = out.lines().filter(|l| l.ends_with("all intact")).collect();
        assert_eq!(lines.len(), n as usize, "n={n}:\n{out}\n{err}");
        for l in lines {
            let k = boxed(l).unwrap_or_else(|| panic!("n={n}: no fast-box count in {l}"));
            assert!(k > 0, "n={n}: a rank sent nothing by fast box: {l}");
        }
    }
}

/// `poll_pause` (spin-wait hints after a pass that found nothing) at both
/// ends of its range: none, and the longest (1024 hints, microseconds per
/// empty pass), every message intact; one beyond it refused, naming the
/// variable.
#[test]
fn stress_with_poll_pause_at_both_ends_and_beyond() {
    if in_role() {
        return;
    }
    for pause in ["0", "1024"] {
        let o = btl_run(240, 4)
            .arg(BTL)
            .args(["stress", "--messages", "150", "--max-size", "65536"])
            .env_remove("BTL_SM_FBOX_SIZE")
            .env("BTL_SM_POLL_PAUSE", pause)
            .output()
            .expect("run btl");
        let (out, err) = text(&o);
        assert!(
            o.status.success(),
            "pause={pause}: {:?}\n{out}\n{err}",
            o.status
        );
        let intact = out.lines().filter(|l| l.ends_with("all intact")).count();
        assert_eq!(intact, 4, "pause={pause}:\n{out}\n{err}");
    }
    let o = btl_run(60, 2)
        .arg(BTL)
        .args(["stress", "--messages", "10"])
        .env("BTL_SM_POLL_PAUSE", "1025")
        .output()
        .expect("run btl");
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}\n{err}");
    assert!(err.contains("BTL_SM_POLL_PAUSE"), "{out}\n{err}");
}

/// The number before `what` in a stress summary line.
fn count_before(line: &str, what: &str) -> Option<u64> {
    let end = line.find(what)?;
    line[..end].trim_end().rsplit(' ').next()?.parse().ok()
}

/// Issue 13's bounded shared memory, as outcomes: under `btl stress`
/// (every rank to every other, mixed sizes up to 64 KiB) the memory the
/// node's segment holds grows at most linearly with the ranks — at most
/// a constant per rank, whatever N — each rank's pools stay within their
/// limits (eager fragments: 256 shared by the peers, between 32 and 128;
/// with single copy to every peer, at most 128 KiB of max-size fragments,
/// 2 of 64 KiB; without it they grow by use to the room, 72), and no rank
/// hands out more than `fbox_max` boxes.
#[test]
fn shared_memory_grows_linearly_with_the_ranks() {
    if in_role() {
        return;
    }
    // Rings (32 KiB), directory, 32 eager fragments of 4 KiB (shared by
    // the peers: 36 at 8 ranks, 85 at 4), 2 max-size ones of 64 KiB and 32
    // boxes: 0.6 MiB (0.8 MiB at 4 ranks); without single copy up to 72
    // max-size fragments: 5.1 MiB (5.3). The control area once.
    const KIB: u64 = 1024;
    for (n, cma, fbox_max, eager_frags, max_frags, per_rank) in [
        (4u32, "1", "32", 85u64, 2u64, 860 * KIB),
        (16, "1", "32", 32, 2, 640 * KIB),
        (8, "1", "2", 36, 2, 640 * KIB),
        (4, "0", "32", 85, 72, 5430 * KIB),
    ] {
        let o = btl_run(240, n)
            .arg(BTL)
            .args(["stress", "--messages", "40", "--max-size", "65536"])
            .env_remove("BTL_SM_FBOX_SIZE")
            .env("BTL_SM_USE_CMA", cma)
            .env("BTL_SM_FBOX_MAX", fbox_max)
            .output()
            .expect("run btl");
        let (out, err) = text(&o);
        let ctx = format!("n={n} use_cma={cma} fbox_max={fbox_max}");
        assert!(o.status.success(), "{ctx}: {:?}\n{out}\n{err}", o.status);
        let lines: Vec<&str> = out.lines().filter(|l| l.ends_with("all intact")).collect();
        assert_eq!(lines.len(), n as usize, "{ctx}:\n{out}\n{err}");
        let fbox_max: u64 = fbox_max.parse().unwrap();
        let mut reserved = 0;
        for l in lines {
            let get =
                |what| count_before(l, what).unwrap_or_else(|| panic!("{ctx}: no {what} in {l}"));
            reserved = reserved.max(get("KiB reserved") * 1024);
            assert!(get("box(es) handed out") <= fbox_max, "{ctx}: {l}");
            assert!(get("eager +") <= eager_frags, "{ctx}: {l}");
            assert!(get("max-size,") <= max_frags, "{ctx}: {l}");
        }
        assert!(reserved > 0, "{ctx}: nothing reserved?\n{out}");
        assert!(
            reserved <= u64::from(n) * per_rank + 64 * KIB,
            "{ctx}: the segment holds {reserved} bytes, more than {n} × {per_rank}\n{out}"
        );
    }
}

#[test]
fn stress_without_fast_boxes_sends_none_by_box() {
    if in_role() {
        return;
    }
    let o = btl_run(240, 3)
        .arg(BTL)
        .args(["stress", "--messages", "100", "--max-size", "65536"])
        .env("BTL_SM_FBOX_SIZE", "0")
        .output()
        .expect("run btl");
    let (out, err) = text(&o);
    assert!(o.status.success(), "{:?}\n{out}\n{err}", o.status);
    let lines: Vec<&str> = out.lines().filter(|l| l.ends_with("all intact")).collect();
    assert_eq!(lines.len(), 3, "{out}\n{err}");
    assert!(lines.iter().all(|l| boxed(l) == Some(0)), "{out}");
}

/// Sizes cycling through the box's range (up to 1016 bytes at 4 KiB),
/// just above it, eager and max-size fragments, and the bulk protocols.
const SIZES: [usize; 10] = [8, 1016, 5000, 0, 1017, 64, 200_000, 16, 40_000, 300];

fn message(from: u32, seq: u64) -> Vec<u8> {
    let len = SIZES[(seq % SIZES.len() as u64) as usize].max(8);
    let mut m: Vec<u8> = (0..len)
        .map(|i| (seq as usize * 31 + i * 7 + from as usize) as u8)
        .collect();
    m[..8].copy_from_slice(&seq.to_le_bytes());
    m
}

/// Both ranks send `N` messages to each other, small and large in turn,
/// waiting for their acknowledgements every ten (so the box is free
/// again); each checks the other's arrive complete and in order.
fn alternate(w: &mut World<'_>) -> Result<String, String> {
    const N: u64 = 600;
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let me = w.rank();
    let peer = 1 - me;
    let mut next = 0u64;
    let mut errors: Vec<String> = Vec::new();
    let mut check = |next: &mut u64, from: u32, tag: u8, data: &[u8]| {
        if tag != TAG_SEQ || from != peer {
            errors.push(format!("tag {tag} from {from}"));
            return;
        }
        if data != message(peer, *next).as_slice() {
            let got = data
                .get(..8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap()));
            errors.push(format!(
                "expected message {}, got {got:?} ({} bytes)",
                next,
                data.len()
            ));
        }
        *next += 1;
    };
    w.barrier().map_err(|x| e(&x))?;
    for seq in 0..N {
        w.send(peer, TAG_SEQ, &message(me, seq))
            .map_err(|x| e(&x))?;
        if seq % 10 == 9 {
            w.flush().map_err(|x| e(&x))?;
        }
        w.poll(|_, ev| {
            if let Event::Message { from, tag, data } = ev {
                check(&mut next, from, tag, data);
            }
        });
    }
    if next < N {
        w.drive("every message from the peer", Some(peer), |_, ev| {
            if let Event::Message { from, tag, data } = ev {
                check(&mut next, from, tag, data);
            }
            if next >= N {
                Flow::Done
            } else {
                Flow::Continue
            }
        })
        .map_err(|x| e(&x))?;
    }
    w.flush().map_err(|x| e(&x))?;
    w.barrier().map_err(|x| e(&x))?;
    if let Some(first) = errors.first() {
        return Err(format!("{} errors, the first: {first}", errors.len()));
    }
    let sm = w.sm().ok_or("no shared-memory transport")?;
    let (sent, got) = (sm.fbox_sent(), sm.fbox_received());
    // Both paths carried messages, and what one sent by box the other got.
    if sent == 0 || sent >= N || got == 0 {
        return Err(format!("fast box sent {sent}, received {got} of {N}"));
    }
    Ok(format!(
        "{N} messages in order, {sent} sent and {got} received by fast box"
    ))
}

#[test]
fn role() {
    common::play_role(|role| {
        Builder::new()
            .transports(Choice::parse("sm").unwrap())
            .init()
            .map_err(|e| e.to_string())
            .and_then(|mut w| match role {
                "alternate" => alternate(&mut w),
                other => Err(format!("unknown role {other}")),
            })
    });
}

#[test]
fn order_holds_across_box_and_ring() {
    if in_role() {
        return;
    }
    let o = common::role_job(2, "alternate")
        .env_remove("BTL_RANK")
        .env_remove("BTL_SM_FBOX_SIZE")
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{:?}\n{out}\n{err}", o.status);
    assert_eq!(out.matches("OK alternate:").count(), 2, "{out}\n{err}");
    eprintln!(
        "{}",
        out.lines()
            .filter(|l| l.contains("OK "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
