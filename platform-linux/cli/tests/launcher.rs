//! `btl run`, end to end through the `btl` binary.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const BTL: &str = env!("CARGO_BIN_EXE_btl");

/// A bound that only catches a launcher that waits for ranks it should
/// have stopped (they sleep [`SLEEP`] seconds): never a measure of speed.
const HANG: Duration = Duration::from_secs(120);
/// What the ranks that must be stopped would otherwise sleep.
const SLEEP: &str = "300";

fn btl(args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let out = Command::new(BTL)
        .args(args)
        .env_remove("BTL_LOG")
        .output()
        .expect("run btl");
    (out, start.elapsed())
}

/// Runs `btl ARGS` expecting it to stop with exit status `code` before
/// [`HANG`] (`what` says what a slower stop means); returns stderr.
fn stops_with(args: &[&str], code: i32, what: &str) -> String {
    let (out, elapsed) = btl(args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert!(elapsed < HANG, "{what} ({elapsed:?})");
    stderr
}

/// The arguments of `btl run -n N -- sh -c SCRIPT`.
fn sh<'a>(n: &'a str, script: &'a str) -> [&'a str; 7] {
    ["run", "-n", n, "--", "sh", "-c", script]
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether process `pid` still exists (a zombie counts as gone).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

#[test]
fn three_ranks_print_prefixed_lines_and_clean_up() {
    let (out, _) = btl(&sh(
        "3",
        "echo hi $BTL_RANK; echo dir $BTL_SESSION_DIR; test -d \"$BTL_SESSION_DIR\" && echo \
         exists; echo err $BTL_RANK >&2; printf partial",
    ));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let mut dirs = Vec::new();
    for rank in 0..3 {
        let lines: Vec<&str> = stdout
            .lines()
            .filter(|l| l.starts_with(&format!("[{rank}] ")))
            .collect();
        assert!(
            lines.contains(&format!("[{rank}] hi {rank}").as_str()),
            "{stdout}"
        );
        assert!(
            lines.contains(&format!("[{rank}] exists").as_str()),
            "{stdout}"
        );
        assert!(
            lines.contains(&format!("[{rank}] partial").as_str()),
            "{stdout}"
        );
        let dir = lines
            .iter()
            .find_map(|l| l.strip_prefix(&format!("[{rank}] dir ")))
            .expect("session dir line");
        dirs.push(dir.to_owned());
        assert!(
            stderr.lines().any(|l| l == format!("[{rank}] err {rank}")),
            "{stderr}"
        );
    }
    assert_eq!(stdout.lines().count(), 12, "{stdout}");
    assert!(
        dirs.iter().all(|d| d == &dirs[0]),
        "one session dir: {dirs:?}"
    );
    let dir = Path::new(&dirs[0]);
    assert!(dir.is_absolute());
    assert!(!dir.exists(), "session dir {} left behind", dir.display());
}

#[test]
fn ranks_get_the_job_environment() {
    let (out, _) = btl(&[
        "run",
        "-n",
        "2",
        "sh",
        "-c",
        "echo $BTL_JOB $BTL_SIZE $BTL_LOCAL_RANK $BTL_LOCAL_SIZE $BTL_NODE",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    let lines: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for l in &lines {
        assert_eq!(l.len(), 6, "{stdout}");
        assert_eq!(l[1], lines[0][1], "same job id");
        assert!(l[1].bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_eq!((l[2], l[4]), ("2", "2"));
        assert_eq!(l[0], format!("[{}]", l[3]), "local rank = rank");
    }
}

#[test]
fn a_failing_rank_stops_the_job_with_its_status() {
    let (out, elapsed) = btl(&sh(
        "3",
        &format!(
            "if [ $BTL_RANK = 1 ]; then sleep 0.3; exit 3; fi; sleep {SLEEP} & echo sleeper $!; wait"
        ),
    ));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(
        elapsed < HANG,
        "the launcher waited for the sleepers ({elapsed:?})"
    );
    assert!(
        stderr.contains("btl run: rank 1 (pid ") && stderr.contains(") exited with status 3"),
        "{stderr}"
    );
    assert!(stderr.contains("stopping the other 2 ranks"), "{stderr}");
    let sleepers: Vec<u32> = stdout
        .lines()
        .filter_map(|l| {
            l.split_once(" sleeper ")
                .map(|(_, pid)| pid.parse().unwrap())
        })
        .collect();
    assert_eq!(sleepers.len(), 2, "{stdout}");
    for pid in sleepers {
        assert!(!alive(pid), "sleep {pid} survived");
    }
}

#[test]
fn a_failing_rank_of_sleepers() {
    let stderr = stops_with(
        &sh(
            "4",
            &format!("if [ $BTL_RANK = 1 ]; then exit 3; fi; sleep {SLEEP}"),
        ),
        3,
        "the launcher waited for the sleepers",
    );
    assert!(stderr.contains("rank 1 (pid "), "{stderr}");
    assert!(stderr.contains("stopping the other 3 ranks"), "{stderr}");
}

#[test]
fn a_rank_killed_by_a_signal_gives_128_plus_the_signal() {
    let stderr = stops_with(
        &sh(
            "2",
            &format!("if [ $BTL_RANK = 0 ]; then kill -9 $$; fi; sleep {SLEEP}"),
        ),
        137,
        "the launcher waited for the sleeper",
    );
    assert!(
        stderr.contains("rank 0 (pid ")
            && stderr.contains("was killed by signal 9 (SIGKILL); stopping the other rank"),
        "{stderr}"
    );
}

#[test]
fn a_missing_program_is_a_clean_error() {
    let (out, _) = btl(&["run", "-n", "2", "btl-no-such-program-xyz"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{stderr}");
    assert!(
        stderr.contains("cannot start `btl-no-such-program-xyz` (rank 0)"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn the_timeout_stops_the_job_with_124() {
    let stderr = stops_with(
        &["run", "-n", "2", "--timeout", "1", "sleep", SLEEP],
        124,
        "the timeout did not stop the job",
    );
    assert!(stderr.contains("timed out after 1s"), "{stderr}");
}

#[test]
fn bind_to_core_exports_the_cpu() {
    let (out, _) = btl(&[
        "run",
        "-n",
        "2",
        "--bind-to",
        "core",
        "sh",
        "-c",
        "echo cpu $BTL_BIND_CPU; grep Cpus_allowed_list /proc/self/status",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    for rank in 0..2 {
        let cpu = stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("[{rank}] cpu ")))
            .expect("cpu line");
        let allowed = stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("[{rank}] Cpus_allowed_list:")))
            .expect("allowed line");
        assert_eq!(allowed.trim(), cpu, "{stdout}");
    }
}

#[test]
fn bad_arguments_are_usage_errors() {
    for (args, needle) in [
        (
            &["run", "-n", "0", "true"][..],
            "option -n: invalid value \"0\"",
        ),
        (
            &["run", "-n", "x", "true"][..],
            "option -n: invalid value \"x\"",
        ),
        (&["run", "-n", "1025", "true"][..], "between 1 and 1024"),
        (&["run", "-n", "2"][..], "missing PROGRAM"),
        (&["run", "-n", "2", "--"][..], "missing PROGRAM"),
        (&["run", "true"][..], "missing -n"),
        (&["run", "-n"][..], "option -n needs a value"),
        (
            &["run", "-n", "1", "--bind-to", "socket", "true"][..],
            "core or none",
        ),
        (
            &["run", "-n", "1", "--timeout", "-1", "true"][..],
            "--timeout",
        ),
        (
            &["run", "-n", "1", "--frob", "true"][..],
            "unknown option \"--frob\"",
        ),
        (&["info", "--xml"][..], "unknown option"),
        (&["frobnicate"][..], "unknown subcommand `frobnicate`"),
        (&[][..], "missing subcommand"),
    ] {
        let (out, _) = btl(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(stderr.contains("Usage:"), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn help_and_version() {
    for args in [&["help"][..], &["--help"], &["-h"]] {
        let (out, _) = btl(args);
        assert_eq!(out.status.code(), Some(0));
        let stdout = text(&out.stdout);
        assert!(stdout.contains("btl run -n N"), "{stdout}");
        assert!(stdout.contains("btl info [--json]"), "{stdout}");
    }
    let (out, _) = btl(&["run", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("--bind-to core|none"));
    let (out, _) = btl(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stdout),
        format!("btl {}\n", env!("CARGO_PKG_VERSION"))
    );
}
