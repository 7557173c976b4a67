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

/// The `btl` binary under test.
pub const BTL: &str = env!("CARGO_BIN_EXE_btl");

/// `btl run --timeout SECS -n N --`, the program and its arguments to be
/// added, with the test runner's `BTL_RANK` removed (outside any job).
pub fn btl_run(timeout: u32, n: u32) -> Command {
    let mut c = Command::new(BTL);
    c.args(["run", "--timeout", &timeout.to_string()])
        .args(["-n", &n.to_string(), "--"])
        .env_remove("BTL_RANK");
    c
}

/// Starts `c` with its stdout and stderr piped, for the test to read
/// (`wait_with_output`).
pub fn spawn_piped(c: &mut Command) -> Child {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Whether this process is a rank: this test binary re-run with
/// `BTL_TEST_ROLE`, where the tests that start jobs do nothing.
pub fn in_role() -> bool {
    std::env::var_os("BTL_TEST_ROLE").is_some()
}

/// The body of the `role` test: nothing outside a role ([`in_role`]); in
/// one, `play`s it and prints `OK ROLE: LINE` for the job's check, or
/// panics with the rank's error.
pub fn play_role(play: impl FnOnce(&str) -> Result<String, String>) {
    let Ok(role) = std::env::var("BTL_TEST_ROLE") else {
        return;
    };
    match play(&role) {
        Ok(line) => println!("OK {role}: {line}"),
        Err(err) => panic!("rank failed in {role}: {err}"),
    }
}

/// `btl run -n N --timeout 120` of this test binary's `role` test, each
/// rank in `role` (`BTL_TEST_ROLE`) with `BTL_TIMEOUT=60`; not started.
pub fn role_job(n: u32, role: &str) -> Command {
    let mut c = Command::new(BTL);
    c.args(["run", "-n", &n.to_string(), "--timeout", "120", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "role", "--nocapture", "--test-threads", "1"])
        .env("BTL_TEST_ROLE", role)
        .env("BTL_TIMEOUT", "60");
    c
}

/// The stdout and stderr of `o`, as text.
pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Asserts that `o` (of `what`) exited 0, showing its status and output
/// if not; returns its stdout and stderr.
pub fn assert_success(o: &Output, what: &str) -> (String, String) {
    let (out, err) = text(o);
    assert!(
        o.status.success(),
        "{what}: status {:?}\nstdout:\n{out}\nstderr:\n{err}",
        o.status
    );
    (out, err)
}

/// Asserts that `text` holds each of `needles` (naming the one missing).
pub fn assert_contains_all(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "no {needle:?} in\n{text}");
    }
}

/// Asserts that stress run `o` of `n` ranks passed: status 0 and one line
/// ending `all intact` per rank; returns its stdout.
pub fn assert_intact(o: &Output, n: u32) -> String {
    let (out, err) = assert_success(o, "btl stress");
    let intact = out.lines().filter(|l| l.ends_with("all intact")).count();
    assert_eq!(intact, n as usize, "stdout:\n{out}\nstderr:\n{err}");
    out
}

/// Asserts that every rank's output (`outs[r]` of rank `r`) ended with
/// status 0 and that its stdout holds each of `says(r)`.
pub fn assert_ranks_say<S: AsRef<str>, I: IntoIterator<Item = S>>(
    outs: &[Output],
    says: impl Fn(usize) -> I,
) {
    for (r, o) in outs.iter().enumerate() {
        let (out, err) = assert_success(o, &format!("rank {r}"));
        for s in says(r) {
            let s = s.as_ref();
            assert!(out.contains(s), "rank {r}: no {s:?} in\n{out}\n{err}");
        }
    }
}

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
            spawn_piped(
                Command::new(&exe)
                    .args(["--exact", "role", "--nocapture", "--test-threads", "1"])
                    .env("BTL_WIREUP", format!("tcp://127.0.0.1:{port}"))
                    .env("BTL_RANK", r.to_string())
                    .env("BTL_SIZE", n.to_string())
                    .env("BTL_JOB", job)
                    .env_remove("BTL_SESSION_DIR")
                    .envs(env(r)),
            )
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
