//! A rank killed with SIGKILL mid-transfer: the survivor — launched here
//! without `btl run`, so no launcher stops it — reports that peer failed
//! and exits non-zero within seconds, over either transport. With
//! `btl stress --keep-going` and three ranks, the two survivors report the
//! failure, finish their exchange with each other intact, and exit 1
//! naming the failed rank — also when the killed rank died inside a push
//! into a receive ring it shares with a survivor (the ring's reader steps
//! over the slot it left reserved once the rank is known failed).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod common;

const BTL: &str = env!("CARGO_BIN_EXE_btl");

fn spawn_rank(job: &str, dir: &str, rank: u32, transport: &str) -> Child {
    let args = ["--messages", "100000000", "--max-size", "4000"];
    command(job, dir, (rank, 2), transport, &args, Stdio::null())
        .spawn()
        .unwrap()
}

/// Rank `r.0` of `r.1` running `btl stress --transport T ARGS`, not
/// started.
fn command(
    job: &str,
    dir: &str,
    r: (u32, u32),
    transport: &str,
    args: &[&str],
    stdout: Stdio,
) -> Command {
    let mut c = Command::new(BTL);
    c.args(["stress", "--transport", transport])
        .args(args)
        .env("BTL_JOB", job)
        .env("BTL_RANK", r.0.to_string())
        .env("BTL_SIZE", r.1.to_string())
        .env("BTL_LOCAL_RANK", r.0.to_string())
        .env("BTL_LOCAL_SIZE", r.1.to_string())
        .env("BTL_SESSION_DIR", dir)
        .env("BTL_NODE", "node")
        .env("BTL_TIMEOUT", "60")
        .stdout(stdout)
        .stderr(Stdio::piped());
    c
}

fn survivor_reports_death(transport: &str) {
    let job = format!("death{}{transport}", std::process::id());
    let dir = std::env::temp_dir().join(&job);
    std::fs::create_dir_all(&dir).unwrap();
    let dir_s = dir.to_str().unwrap().to_string();
    let mut r0 = spawn_rank(&job, &dir_s, 0, transport);
    let mut r1 = spawn_rank(&job, &dir_s, 1, transport);
    // Let them exchange for a while.
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        r0.try_wait().unwrap().is_none() && r1.try_wait().unwrap().is_none(),
        "ranks ended early"
    );
    r1.kill().unwrap();
    r1.wait().unwrap();
    let killed = Instant::now();
    let Some(status) = common::wait_until(&mut r0, killed, Duration::from_secs(60)) else {
        let _ = r0.kill();
        panic!("{transport}: the survivor hung after its peer died");
    };
    let mut err = String::new();
    r0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!status.success(), "{transport}: survivor succeeded?\n{err}");
    assert!(
        err.contains("1") && err.contains("failed"),
        "{transport}:\n{err}"
    );
    // Shared memory: nothing left in /dev/shm for this job.
    let leftover = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().contains(&job));
    assert!(!leftover, "segment of {job} left in /dev/shm");
}

#[test]
fn survivor_reports_a_killed_peer_over_shared_memory() {
    survivor_reports_death("sm");
}

#[test]
fn survivor_reports_a_killed_peer_over_tcp() {
    survivor_reports_death("tcp");
}

/// Three ranks of `btl stress --keep-going`; rank 2 is killed once they
/// are exchanging. Ranks 0 and 1 must say they go on without rank 2, get
/// every message of each other intact, skip the one-sided phase and exit
/// 1 with exactly those two errors.
fn survivors_keep_going(transport: &str, messages: &str) {
    let job = format!("keep{}{transport}", std::process::id());
    let dir = std::env::temp_dir().join(&job);
    std::fs::create_dir_all(&dir).unwrap();
    let dir_s = dir.to_str().unwrap().to_string();
    let args = ["--keep-going", "--messages", messages, "--max-size", "64"];
    let mut ranks: Vec<Child> = (0..3)
        .map(|r| {
            command(&job, &dir_s, (r, 3), transport, &args, Stdio::piped())
                .env("BTL_LOG", "info")
                .spawn()
                .unwrap()
        })
        .collect();
    // Each rank's stderr, read as it comes: the kill waits until every rank
    // logged the start of its message phase (a kill during start-up tests
    // something else), then 300 ms more.
    let (tx, rx) = mpsc::channel::<u32>();
    let errs: Vec<JoinHandle<String>> = ranks
        .iter_mut()
        .enumerate()
        .map(|(r, c)| {
            let stderr = c.stderr.take().unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut all = String::new();
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if line.contains(": message phase after ") {
                        let _ = tx.send(r as u32);
                    }
                    all.push_str(&line);
                    all.push('\n');
                }
                all
            })
        })
        .collect();
    let started = Instant::now();
    let mut ready = [false; 3];
    while !ready.iter().all(|&b| b) {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(r) => ready[r as usize] = true,
            Err(_) => assert!(
                started.elapsed() < Duration::from_secs(60),
                "{transport}: ranks {ready:?} did not reach their message phase in 60 s"
            ),
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        ranks.iter_mut().all(|c| c.try_wait().unwrap().is_none()),
        "{transport}: ranks ended before the kill (raise --messages)"
    );
    ranks[2].kill().unwrap();
    ranks[2].wait().unwrap();
    let killed = Instant::now();
    let mut errs = errs.into_iter();
    for (r, c) in ranks.iter_mut().enumerate().take(2) {
        let Some(status) = common::wait_until(c, killed, Duration::from_secs(120)) else {
            let _ = c.kill();
            panic!("{transport}: survivor {r} hung after rank 2 died");
        };
        let mut out = String::new();
        c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        let err = errs.next().unwrap().join().unwrap();
        // Shown with --nocapture: how often the killed rank died inside a
        // push into a shared ring (the reader then steps over its slot).
        for l in err.lines().filter(|l| l.contains("stepped over")) {
            eprintln!("{transport}, rank {r}: {l}");
        }
        let ctx = format!("{transport}, rank {r}: {status}\nstdout:\n{out}\nstderr:\n{err}");
        assert_eq!(status.code(), Some(1), "{ctx}");
        assert!(
            out.contains(&format!("rank {r}: going on without rank 2")),
            "{ctx}"
        );
        assert!(out.contains("get/put with each skipped"), "{ctx}");
        let errors: Vec<&str> = out.lines().filter(|l| l.contains(": error: ")).collect();
        assert_eq!(
            errors,
            [
                format!("rank {r}: error: rank 2 failed during the run"),
                format!("rank {r}: error: one-sided phase skipped: a rank failed"),
            ],
            "{ctx}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn survivors_keep_going_over_shared_memory() {
    survivors_keep_going("sm", "3000000");
}

#[test]
fn survivors_keep_going_over_tcp() {
    survivors_keep_going("tcp", "400000");
}
