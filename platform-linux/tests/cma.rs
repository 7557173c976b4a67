//! Cross Memory Attach: copies within this process through the system calls,
//! typed errors, and a real kernel refusal between two re-executed children
//! (with a positive control).
//!
//! The two-process tests re-execute this test binary as children running
//! only `cma_child_helper`, with `BTL_CMA_TEST_ROLE` saying what to do. The
//! children drop `CAP_SYS_PTRACE`; the test-runner process never changes its
//! own capabilities or dumpable flag (other tests run in it).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use btl_linux::cma::{
    allow_ptrace_from_any, deny_cma_for_testing, drop_ptrace_capability, probe_self, read_remote,
    write_remote, CmaError,
};

const ROLE: &str = "BTL_CMA_TEST_ROLE";
const TARGET_MARK: &str = "BTL-CMA-TARGET";
const READER_MARK: &str = "BTL-CMA-READER";
const PATTERN_LEN: usize = 64 * 1024 + 13;
const TIMEOUT: Duration = Duration::from_secs(20);

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn me() -> u32 {
    std::process::id()
}

#[test]
fn reads_and_writes_own_memory() {
    probe_self().unwrap();

    let src = pattern(3 * 1024 * 1024 + 7, 5);
    let mut dst = vec![0u8; src.len()];
    // SAFETY: (as in every call of this test) our own pid, but the remote
    // ranges are our own buffers that nothing else touches during the calls
    // and that do not overlap the local ones.
    unsafe { read_remote(me(), src.as_ptr() as usize, &mut dst) }.unwrap();
    assert!(dst == src, "read_remote copied wrong bytes");

    let src2 = pattern(src.len(), 99);
    let mut target = vec![0u8; src2.len()];
    let addr = target.as_mut_ptr() as usize;
    // SAFETY: see above; no reference into `target` is used during the call.
    unsafe { write_remote(me(), addr, &src2) }.unwrap();
    assert!(target == src2, "write_remote copied wrong bytes");

    // Small and unaligned ranges, and an empty buffer without a syscall.
    let mut small = [0u8; 5];
    // SAFETY: see above.
    unsafe { read_remote(me(), src.as_ptr() as usize + 1001, &mut small) }.unwrap();
    assert_eq!(small, src[1001..1006]);
    // SAFETY: empty ranges: nothing is copied.
    unsafe { read_remote(me(), 8, &mut []) }.unwrap();
    // SAFETY: as above.
    unsafe { write_remote(me(), 8, &[]) }.unwrap();
}

#[test]
fn bad_address_is_typed() {
    let mut buf = [0u8; 16];
    assert_eq!(
        // SAFETY: (as in every call of this test) address 8 is never
        // mapped: the kernel refuses (EFAULT) before copying anything.
        unsafe { read_remote(me(), 8, &mut buf) },
        Err(CmaError::BadAddress {
            pid: me(),
            addr: 8,
            len: 16
        })
    );
    assert!(matches!(
        // SAFETY: see above.
        unsafe { write_remote(me(), 8, &buf) },
        Err(CmaError::BadAddress { addr: 8, .. })
    ));
    // SAFETY: see above.
    let err = unsafe { read_remote(me(), 8, &mut buf) }.unwrap_err();
    assert!(err.to_string().contains("0x8"), "{err}");
}

#[test]
fn exited_peer_is_gone() {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let mut buf = [0u8; 8];
    let src = [1u8; 8];
    assert_eq!(
        // SAFETY: another process (gone: the kernel finds no such pid).
        unsafe { read_remote(pid, src.as_ptr() as usize, &mut buf) },
        Err(CmaError::PeerGone { pid })
    );
    assert_eq!(
        // SAFETY: as above.
        unsafe { write_remote(pid, buf.as_mut_ptr() as usize, &src) },
        Err(CmaError::PeerGone { pid })
    );
}

// ---------------------------------------------------------------------------
// Children.

/// Entry point of the re-executed children; a no-op in a normal test run.
#[test]
fn cma_child_helper() {
    match std::env::var(ROLE).as_deref() {
        Ok("target") => target(false),
        Ok("target-deny") => target(true),
        Ok("reader") => reader(),
        _ => {}
    }
}

/// Holds a pattern, says where it is, and waits until stdin closes.
fn target(deny: bool) {
    drop_ptrace_capability().expect("drop CAP_SYS_PTRACE in the target");
    // Under Yama ptrace_scope=1 a sibling may read us only with this; the
    // refusal we test must come from `deny`, not from Yama.
    allow_ptrace_from_any();
    if deny {
        deny_cma_for_testing().expect("deny_cma_for_testing");
    }
    let buf = std::hint::black_box(pattern(PATTERN_LEN, 42));
    // libtest may run this on a thread other than the main one, and
    // capabilities are per thread: the reader names this thread (its tid),
    // whose credentials the kernel then checks.
    let tid = rustix::thread::gettid().as_raw_nonzero().get();
    let mut out = std::io::stdout();
    writeln!(
        out,
        "\n{TARGET_MARK} pid={} tid={tid} addr={} len={}",
        me(),
        buf.as_ptr() as usize,
        buf.len()
    )
    .unwrap();
    out.flush().unwrap();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    std::hint::black_box(&buf);
}

/// Reads the target's pattern without CAP_SYS_PTRACE and prints the outcome.
fn reader() {
    let var = |name: &str| -> usize {
        std::env::var(name)
            .unwrap_or_else(|_| panic!("{name} not set"))
            .parse()
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let tid = var("BTL_CMA_TEST_TID") as u32;
    let addr = var("BTL_CMA_TEST_ADDR");
    let len = var("BTL_CMA_TEST_LEN");
    drop_ptrace_capability().expect("drop CAP_SYS_PTRACE in the reader");
    let mut buf = vec![0u8; len];
    // SAFETY: `tid` is a thread of another process (the target child).
    let outcome = match unsafe { read_remote(tid, addr, &mut buf) } {
        Ok(()) if buf == pattern(len, 42) => "ok".to_owned(),
        Ok(()) => "mismatch".to_owned(),
        Err(CmaError::Refused { errno, .. }) => format!("refused errno={errno}"),
        Err(e) => format!("error {e:?}: {e}"),
    };
    println!("\n{READER_MARK} {outcome}");
}

// ---------------------------------------------------------------------------
// Parent side.

/// A child that is killed and reaped whatever happens.
struct Helper {
    child: Child,
    lines: Receiver<String>,
    stderr: Option<JoinHandle<String>>,
}

impl Helper {
    fn spawn(role: &str, env: &[(&str, String)]) -> Helper {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "cma_child_helper",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        Helper {
            child,
            lines,
            stderr: Some(stderr),
        }
    }

    /// The first stdout line containing `mark` (from the mark on).
    fn line_with(&mut self, mark: &str) -> Result<String, String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(at) = line.find(mark) {
                        return Ok(line[at..].to_owned());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!("no {mark} line within {TIMEOUT:?}"))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.finish();
                    return Err(format!(
                        "child exited ({status:?}) without a {mark} line; stderr:\n{}",
                        self.stderr_text()
                    ));
                }
            }
        }
    }

    /// Closes stdin and waits (bounded) for the exit; kills on timeout.
    fn finish(&mut self) -> Option<ExitStatus> {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return None;
                }
            }
        }
    }

    fn stderr_text(&mut self) -> String {
        self.stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        // Reaps the child on every path (panics included); no-op if done.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// Runs a target (denying CMA or not) and a reader; the reader's outcome.
fn read_sibling(deny: bool) -> String {
    let mut target = Helper::spawn(if deny { "target-deny" } else { "target" }, &[]);
    let line = target
        .line_with(TARGET_MARK)
        .unwrap_or_else(|e| panic!("target: {e}"));
    let env = [
        ("BTL_CMA_TEST_TID", field(&line, "tid").to_owned()),
        ("BTL_CMA_TEST_ADDR", field(&line, "addr").to_owned()),
        ("BTL_CMA_TEST_LEN", field(&line, "len").to_owned()),
    ];
    let mut reader = Helper::spawn("reader", &env);
    let outcome = reader.line_with(READER_MARK);
    let reader_status = reader.finish();
    let reader_err = reader.stderr_text();
    let target_status = target.finish();
    let target_err = target.stderr_text();
    let outcome = outcome.unwrap_or_else(|e| panic!("reader: {e}"));
    assert!(
        reader_status.is_some_and(|s| s.success()),
        "reader exited with {reader_status:?}; stderr:\n{reader_err}"
    );
    assert!(
        target_status.is_some_and(|s| s.success()),
        "target exited with {target_status:?}; stderr:\n{target_err}"
    );
    outcome[READER_MARK.len()..].trim().to_owned()
}

fn errno_text(outcome: &str) -> String {
    match outcome
        .strip_prefix("refused errno=")
        .and_then(|e| e.parse().ok())
    {
        Some(errno) => format!("{}", std::io::Error::from_raw_os_error(errno)),
        None => outcome.to_owned(),
    }
}

#[test]
fn sibling_read_positive_control() {
    let outcome = read_sibling(false);
    assert!(
        outcome == "ok",
        "positive control failed: a sibling process without CAP_SYS_PTRACE could not read \
         a dumpable target that allowed any ptracer: {outcome} ({}). This machine refuses \
         CMA between processes of the same user (Yama ptrace_scope, seccomp, LSM), so \
         sibling_read_refused_after_deny proves nothing here.",
        errno_text(&outcome)
    );
}

#[test]
fn sibling_read_refused_after_deny() {
    let outcome = read_sibling(true);
    let errno = outcome
        .strip_prefix("refused errno=")
        .and_then(|e| e.parse::<i32>().ok());
    assert!(
        matches!(errno, Some(libc::EPERM) | Some(libc::EACCES)),
        "expected the kernel to refuse (EPERM) reading a non-dumpable target without \
         CAP_SYS_PTRACE, got: {outcome}"
    );
}
