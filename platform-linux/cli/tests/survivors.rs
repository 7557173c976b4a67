//! The failure of one peer is reported for that peer, and the others go
//! on: three ranks of the job API (started by this test through a
//! rendezvous address, so no launcher stops the job), rank 2 vanishes
//! without a goodbye after the first barrier, ranks 0 and 1 keep
//! exchanging messages, see rank 2 reported failed, and a send to it is an
//! error naming it. Over shared memory and over TCP.
//!
//! The ranks are this test binary itself, re-run with `BTL_TEST_ROLE` set
//! (the `role` test does the rank's work then, and nothing otherwise).

use std::time::Duration;

mod common;

use btl_linux::world::{Choice, Event, Flow, World, WorldError};

const ROUNDS: u64 = 2000;

fn rank_main(choice: Choice) -> Result<String, String> {
    let mut w = World::init(choice).map_err(|e| e.to_string())?;
    let me = w.rank();
    let mut got = 0u64;
    // Counts one message of tag 1, then stops.
    let mut one = |_: &mut _, ev: Event<'_>| match ev {
        Event::Message { tag: 1, .. } => {
            got += 1;
            Flow::Done
        }
        _ => Flow::Continue,
    };
    w.barrier().map_err(|e| e.to_string())?;
    if me == 2 {
        // Vanish: no clean close, no goodbye.
        std::process::exit(0);
    }
    let peer = 1 - me;
    for i in 0..ROUNDS {
        if me == 0 {
            w.send(peer, 1, &i.to_le_bytes())
                .map_err(|e| e.to_string())?;
        }
        w.drive("the ping-pong", Some(peer), &mut one)
            .map_err(|e| format!("round {i}: {e}"))?;
        if me == 1 {
            w.send(peer, 1, &i.to_le_bytes())
                .map_err(|e| e.to_string())?;
        }
    }
    // Rank 2's failure is noticed (liveness over shared memory, EOF
    // without FIN over TCP).
    let why = match w.wait_until("rank 2's failure", Some(2), |_| false) {
        Err(WorldError::PeerFailed { peer: 2, why }) => why,
        other => {
            return Err(format!(
                "waiting for rank 2 to be reported failed: {other:?}"
            ))
        }
    };
    match w.send(2, 1, b"anyone?") {
        Err(WorldError::PeerFailed { peer: 2, .. }) => {}
        other => return Err(format!("send to the failed rank 2: {other:?}")),
    }
    // And the two of us still talk.
    w.send(peer, 1, b"still here").map_err(|e| e.to_string())?;
    w.drive("the last message", Some(peer), &mut one)
        .map_err(|e| e.to_string())?;
    if got != ROUNDS + 1 {
        return Err(format!("{got} messages, expected {}", ROUNDS + 1));
    }
    Ok(format!(
        "SURVIVOR rank {me}: {ROUNDS} round trips with rank {peer}, rank 2 failed ({why}), still talking"
    ))
}

/// A rank of a barrier that rank `ABANDON_N - 1` never enters (it
/// vanishes after start-up): ours must end with that rank's failure — told
/// by whoever waited for it directly — well before `BTL_TIMEOUT`.
fn abandon_main(choice: Choice) -> Result<String, String> {
    let mut w = World::init(choice).map_err(|e| e.to_string())?;
    let me = w.rank();
    let gone = w.size() - 1;
    if me == gone {
        // Once the others are through start-up (which needs every rank).
        std::thread::sleep(Duration::from_millis(500));
        std::process::exit(0);
    }
    let t = std::time::Instant::now();
    let r = match w.barrier() {
        Err(WorldError::PeerFailed { peer, why }) if peer == gone => Ok(format!(
            "ABANDONED rank {me}: rank {gone} failed ({why}) after {:.1} s",
            t.elapsed().as_secs_f64()
        )),
        other => Err(format!("barrier without rank {gone}: {other:?}")),
    };
    // Not gone at once: a rank still waiting for our message of a round
    // would see us fail before the news of rank `gone` reaches it.
    std::thread::sleep(Duration::from_millis(500));
    r
}

/// Ranks in the abandoned barrier: above the direct schedule's four.
const ABANDON_N: u32 = 6;

#[test]
fn role() {
    let Ok(role) = std::env::var("BTL_TEST_ROLE") else {
        return;
    };
    if let Some(t) = role.strip_prefix("abandon:") {
        match abandon_main(Choice::parse(t).expect("a transport choice")) {
            Ok(line) => println!("{line}"),
            Err(e) => panic!("rank failed: {e}"),
        }
        return;
    }
    let choice = Choice::parse(&role).expect("role is a transport choice");
    match rank_main(choice) {
        Ok(line) => println!("{line}"),
        Err(e) => panic!("rank failed: {e}"),
    }
}

fn run(choice: &str) {
    let job = format!("surv{}{choice}", std::process::id());
    let outs = common::run_rendezvous(
        3,
        &job,
        |_| {
            vec![
                ("BTL_TEST_ROLE", choice.to_string()),
                ("BTL_TIMEOUT", "60".to_string()),
            ]
        },
        Duration::from_secs(120),
    );
    common::assert_ranks_say(&outs[..2], |r| [format!("SURVIVOR rank {r}:")]);
}

#[test]
fn survivors_go_on_over_shared_memory() {
    if std::env::var_os("BTL_TEST_ROLE").is_none() {
        run("sm");
    }
}

#[test]
fn survivors_go_on_over_tcp() {
    if std::env::var_os("BTL_TEST_ROLE").is_none() {
        run("tcp");
    }
}

/// Every rank of a dissemination barrier that one rank never enters ends
/// with that rank's failure, not a timeout (shared memory: its liveness
/// check sees the death of a rank it never heard from).
#[test]
fn a_barrier_without_a_rank_ends_at_every_rank() {
    if std::env::var_os("BTL_TEST_ROLE").is_some() {
        return;
    }
    let job = format!("aban{}", std::process::id());
    let t = std::time::Instant::now();
    let outs = common::run_rendezvous(
        ABANDON_N,
        &job,
        |_| {
            vec![
                ("BTL_TEST_ROLE", "abandon:sm".to_string()),
                ("BTL_TIMEOUT", "60".to_string()),
            ]
        },
        Duration::from_secs(120),
    );
    common::assert_ranks_say(&outs[..ABANDON_N as usize - 1], |r| {
        [format!("ABANDONED rank {r}:")]
    });
    assert!(t.elapsed() < Duration::from_secs(40), "{:?}", t.elapsed());
}
