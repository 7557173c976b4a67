//! A rank killed with SIGKILL mid-transfer: the survivor — launched here
//! without `btl run`, so no launcher stops it — reports that peer failed
//! and exits non-zero within seconds, over either transport.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BTL: &str = env!("CARGO_BIN_EXE_btl");

fn spawn_rank(job: &str, dir: &str, rank: u32, transport: &str) -> Child {
    Command::new(BTL)
        .args([
            "stress",
            "--transport",
            transport,
            "--messages",
            "100000000",
            "--max-size",
            "4000",
        ])
        .env("BTL_JOB", job)
        .env("BTL_RANK", rank.to_string())
        .env("BTL_SIZE", "2")
        .env("BTL_LOCAL_RANK", rank.to_string())
        .env("BTL_LOCAL_SIZE", "2")
        .env("BTL_SESSION_DIR", dir)
        .env("BTL_NODE", "node")
        .env("BTL_TIMEOUT", "60")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
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
    let status = loop {
        if let Some(s) = r0.try_wait().unwrap() {
            break s;
        }
        // A hang-catching bound only.
        if killed.elapsed() > Duration::from_secs(60) {
            let _ = r0.kill();
            panic!("{transport}: the survivor hung after its peer died");
        }
        std::thread::sleep(Duration::from_millis(20));
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
