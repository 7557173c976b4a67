//! Helpers shared by the multi-process tests: finding a launcher's ranks
//! through /proc, the network-namespace hosts (`cluster`), and missing
//! prerequisites (`prereq`: a skip, or a failure when `CI` is set).
#![allow(dead_code)]

pub mod cluster;
/// Shared with the library's own tests and the bare-metal ones.
#[path = "../../../tests/common/prereq.rs"]
pub mod prereq;

use std::fs;
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// Children of `pid` (from /proc).
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(s) = fs::read_to_string(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
    }
    out
}

/// The value of `var` in the environment of process `pid`.
pub fn environ_var(pid: u32, var: &str) -> Option<String> {
    let env = fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&format!("{var}=")).map(str::to_owned)
    })
}

/// Waits for child `c` to end until `bound` after `since`, polling every
/// 20 ms; `None` if it is still running then (the caller kills it and says
/// what hung — this is a hang-catching bound, not a timing check).
pub fn wait_until(c: &mut Child, since: Instant, bound: Duration) -> Option<ExitStatus> {
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return Some(s);
        }
        if since.elapsed() > bound {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `n` ranks of this test binary's `role` test as a job whose wire-up
/// is a rendezvous (rank 0 serves it on loopback), without a launcher, so
/// that each rank ends on its own: rank `r` gets the job variables and
/// `env(r)`. Waits at most `limit`, panicking if a rank hangs.
pub fn run_rendezvous(
    n: u32,
    job: &str,
    env: impl Fn(u32) -> Vec<(&'static str, String)>,
    limit: Duration,
) -> Vec<Output> {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..n)
        .map(|r| {
            Command::new(&exe)
                .args(["--exact", "role", "--nocapture", "--test-threads", "1"])
                .env("BTL_WIREUP", format!("tcp://127.0.0.1:{port}"))
                .env("BTL_RANK", r.to_string())
                .env("BTL_SIZE", n.to_string())
                .env("BTL_JOB", job)
                .env_remove("BTL_SESSION_DIR")
                .envs(env(r))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut outs = Vec::new();
    let start = Instant::now();
    for (r, mut c) in children.into_iter().enumerate() {
        if wait_until(&mut c, start, limit).is_none() {
            let _ = c.kill();
            panic!("rank {r} hung");
        }
        outs.push(c.wait_with_output().unwrap());
    }
    outs
}
