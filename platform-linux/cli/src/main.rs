//! The `btl` command: `btl run` (the single-machine launcher), `btl info`
//! (the parameters), `btl bench`, `btl stress`, `btl help`, `btl --version`.
//!
//! `main` matches the subcommand name and calls one `cmd_*` function per
//! subcommand, which parses its own arguments with [`Args`] and
//! returns the process's exit status. A usage error prints a message and the
//! usage on stderr and exits with status 2.

use std::ffi::OsString;
use std::io::{self, Write};
use std::process::ExitCode;
use std::time::Duration;

use btl_cli::info::{self, InfoError};
use btl_cli::launcher::{self, LaunchError, LaunchSpec, MAX_NPROCS};
use btl_linux::job;

use btl_cli::args::{Args, UsageError};

/// Exit status of a usage error.
const USAGE_STATUS: i32 = 2;

const USAGE: &str = "\
btl: a byte-transfer layer for HPC

Usage:
  btl run -n N [--bind-to core|none] [--timeout SECS]
          [--host H[:SLOTS],... --wireup-addr IP [--agent PROG]] [--] PROGRAM [ARGS...]
  btl info [--json]
  btl bench [--transport auto|sm|tcp[,...]] [--sizes 8,64,...] [--iterations N]
            [--window W] [--json | --format osu] [--plot FILE.svg [--compare RAW.tsv]]
  btl stress [-n N] [--transport auto|sm|tcp] [--messages M] [--max-size BYTES]
  btl help | --help | -h
  btl --version

Subcommands:
  run      start N ranks of PROGRAM as one job (this machine, or --host)
  info     list every parameter with its value, default and source
  bench    latency and bandwidth between 2 pinned ranks
  stress   every rank sends M checked messages to every other rank
  help     show this text

`btl run --help` describes the launcher, `btl help bench` the benchmark.
Log level: BTL_LOG=error|warn|info|debug|trace (default warn).
";

const RUN_USAGE: &str = "\
Usage: btl run -n N [--bind-to core|none] [--timeout SECS]
          [--host H[:SLOTS],... --wireup-addr IP [--agent PROG]] [--] PROGRAM [ARGS...]

Starts N ranks (1 to 1024) of PROGRAM as one job, on this machine or on the
--host hosts, and waits for them. Each rank gets BTL_JOB, BTL_RANK, BTL_SIZE,
BTL_LOCAL_RANK, BTL_LOCAL_SIZE, BTL_NODE, BTL_WIREUP (the launcher's wire-up
service) and, on this machine, BTL_SESSION_DIR; its output lines are printed
prefixed with `[RANK] `. The first rank that fails stops the job, whose exit
status is that rank's (128 + N for signal N); 0 when all succeed.

Options:
  -n, --np N           number of ranks, 1 to 1024 (required)
  --bind-to core|none  bind rank r to the (r mod ncpus)-th CPU (default: none)
  --timeout SECS       stop the job after SECS seconds (exit status 124)
  --host H[:S],...     run the ranks on these hosts, filling S slots of each in
                       order (default: every rank on this machine)
  --agent PROG         start a rank on a host with `PROG HOST COMMAND` (default
                       ssh; e.g. a script entering a network namespace)
  --wireup-addr IP     this machine's address the hosts reach the launcher's
                       wire-up service on (required with --host)
  -h, --help           show this text
";

const INFO_USAGE: &str = "\
Usage: btl info [--json]

Lists every parameter with its value, default, source and environment
variable (BTL_SM_FIFO_SIZE=8192 or OMPI_MCA_btl_sm_fifo_size=8192 set one).

Options:
  --json      one JSON object per parameter and line
  -h, --help  show this text
";

fn main() -> ExitCode {
    job::init_logging();
    let argv: Vec<OsString> = std::env::args_os().skip(1).collect();
    let (name, rest) = match argv.split_first() {
        Some((name, rest)) => (name.to_string_lossy(), rest),
        None => {
            return exit(usage_error(
                "btl",
                &UsageError::new("missing subcommand"),
                USAGE,
            ))
        }
    };
    let status = match &*name {
        "run" => cmd_run(rest),
        "info" => {
            rank_setup();
            cmd_info(rest)
        }
        "bench" => {
            rank_setup();
            btl_cli::bench::cmd(rest)
        }
        "stress" => {
            rank_setup();
            btl_cli::stress::cmd(rest)
        }
        "help" | "--help" | "-h" => cmd_help(rest),
        "--version" | "-V" | "version" => cmd_version(rest),
        other => usage_error(
            "btl",
            &UsageError::new(format!("unknown subcommand `{other}`")),
            USAGE,
        ),
    };
    exit(status)
}

fn exit(status: i32) -> ExitCode {
    ExitCode::from(u8::try_from(status).unwrap_or(1))
}

/// What a `btl` process that may be a rank does first: apply the launcher's
/// CPU binding (`BTL_BIND_CPU`). A binding that fails is reported and the
/// process runs unbound.
fn rank_setup() {
    match launcher::apply_binding_from_env() {
        Ok(Some(cpu)) => log::debug!("bound to CPU {cpu}"),
        Ok(None) => {}
        Err(e) => log::warn!("{e}; running unbound"),
    }
}

/// Prints `<cmd>: <error>` and `usage` on stderr; returns the usage status.
fn usage_error(cmd: &str, err: &UsageError, usage: &str) -> i32 {
    let _ = write!(io::stderr().lock(), "{cmd}: {err}\n\n{usage}");
    USAGE_STATUS
}

/// Prints `text` on stdout; status 0, or 1 if it cannot be written.
fn print(text: &str) -> i32 {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("btl: cannot write to stdout: {e}");
            1
        }
    }
}

/// `btl help`.
fn cmd_help(args: &[OsString]) -> i32 {
    match args.first().map(|a| a.to_string_lossy()).as_deref() {
        None => print(USAGE),
        Some("run") => print(RUN_USAGE),
        Some("info") => print(INFO_USAGE),
        Some("bench") => print(&format!("{}\n", btl_cli::bench::USAGE)),
        Some(other) => usage_error(
            "btl help",
            &UsageError::new(format!("unknown subcommand `{other}`")),
            USAGE,
        ),
    }
}

/// `btl --version`.
fn cmd_version(args: &[OsString]) -> i32 {
    if let Err(e) = Args::new(args).finish() {
        return usage_error("btl --version", &e, USAGE);
    }
    print(concat!("btl ", env!("CARGO_PKG_VERSION"), "\n"))
}

/// `btl info [--json]`.
fn cmd_info(args: &[OsString]) -> i32 {
    let mut a = Args::new(args);
    let mut json = false;
    while !a.is_empty() {
        if a.flag(&["-h", "--help"]) {
            return print(INFO_USAGE);
        } else if a.flag(&["--json"]) {
            json = true;
        } else {
            return usage_error("btl info", &a.unexpected(), INFO_USAGE);
        }
    }
    let mut out = io::stdout().lock();
    match info::run_info(json, &mut out) {
        Ok(()) => 0,
        Err(InfoError::Io(e)) if e.kind() == io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            drop(out);
            eprintln!("btl info: {e}");
            1
        }
    }
}

/// What `btl run`'s arguments ask for.
enum RunRequest {
    Help,
    Launch(LaunchSpec),
}

/// Parses `btl run`'s arguments.
fn parse_run(args: &[OsString]) -> Result<RunRequest, UsageError> {
    let mut a = Args::new(args);
    let mut nprocs = None;
    let mut bind_cores = false;
    let mut timeout = None;
    let mut hosts = Vec::new();
    let mut agent = None;
    let mut wireup_addr = None;
    loop {
        if a.flag(&["-h", "--help"]) {
            return Ok(RunRequest::Help);
        }
        if a.flag(&["--"]) {
            break;
        }
        let accepts_n = format!("an integer between 1 and {MAX_NPROCS}");
        if let Some(n) = a.value_with(&["-n", "--np"], &accepts_n, |s| {
            s.parse::<u32>()
                .ok()
                .filter(|n| (1..=MAX_NPROCS).contains(n))
        })? {
            nprocs = Some(n);
            continue;
        }
        if let Some(b) = a.value_with(&["--bind-to"], "core or none", |s| match s {
            "core" => Some(true),
            "none" => Some(false),
            _ => None,
        })? {
            bind_cores = b;
            continue;
        }
        if let Some(t) =
            a.value_with(&["--timeout"], "a number of seconds greater than 0", |s| {
                s.parse::<f64>()
                    .ok()
                    .filter(|t| *t > 0.0)
                    .and_then(|t| Duration::try_from_secs_f64(t).ok())
            })?
        {
            timeout = Some(t);
            continue;
        }
        if let Some(h) = a.value_with(&["--host"], "HOST[:SLOTS],... ", |s| {
            launcher::parse_hosts(s).ok()
        })? {
            hosts = h;
            continue;
        }
        if let Some(p) = a.value_with(&["--agent"], "a program", |s| {
            (!s.is_empty()).then(|| OsString::from(s))
        })? {
            agent = Some(p);
            continue;
        }
        if let Some(ip) = a.value_with(&["--wireup-addr"], "an IP address", |s| {
            s.parse::<std::net::IpAddr>().ok()
        })? {
            wireup_addr = Some(ip);
            continue;
        }
        if a.at_option() {
            return Err(a.unexpected());
        }
        break;
    }
    let nprocs = nprocs.ok_or_else(|| UsageError::new("missing -n N (the number of ranks)"))?;
    let (program, rest) = a
        .rest()
        .split_first()
        .ok_or_else(|| UsageError::new("missing PROGRAM"))?;
    Ok(RunRequest::Launch(LaunchSpec {
        nprocs,
        program: program.clone(),
        args: rest.to_vec(),
        bind_cores,
        extra_env: Vec::new(),
        timeout,
        tag_output: true,
        hosts,
        agent,
        wireup_addr,
    }))
}

/// `btl run -n N [--bind-to core|none] [--timeout SECS] [--] PROGRAM [ARGS...]`.
fn cmd_run(args: &[OsString]) -> i32 {
    let spec = match parse_run(args) {
        Ok(RunRequest::Help) => return print(RUN_USAGE),
        Ok(RunRequest::Launch(spec)) => spec,
        Err(e) => return usage_error("btl run", &e, RUN_USAGE),
    };
    match launcher::launch(&spec) {
        Ok(report) => report.status,
        Err(e) => {
            eprintln!("btl run: {e}");
            match &e {
                LaunchError::Spawn { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                    127
                }
                LaunchError::Spawn { source, .. }
                    if source.kind() == io::ErrorKind::PermissionDenied =>
                {
                    126
                }
                _ => 1,
            }
        }
    }
}
