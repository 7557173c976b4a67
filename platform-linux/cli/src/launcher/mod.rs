//! `btl run`: the single-machine launcher.
//!
//! [`launch`] starts `nprocs` copies of a program as the ranks of one job on
//! this machine and supervises them until they have all ended:
//!
//! - **Job and session.** A fresh job id ([`new_job_id`]) and a private
//!   session directory `$TMPDIR/btl-<uid>/<job>` (`/tmp` without `TMPDIR`),
//!   mode 0700 like its parent, which is removed with everything in it when
//!   the launch ends, whatever the outcome. (The job's shared memory is a
//!   memfd with no name in any file system: there is nothing else to
//!   remove, whatever happened to the ranks.)
//! - **Environment.** Each rank gets the launcher's environment, then
//!   [`LaunchSpec::extra_env`], then the job variables of [`btl_linux::job`]
//!   (`BTL_JOB`, `BTL_RANK`, `BTL_SIZE`, `BTL_LOCAL_RANK` = rank,
//!   `BTL_LOCAL_SIZE` = size, `BTL_SESSION_DIR`, `BTL_NODE`), which
//!   `extra_env` cannot override.
//! - **Binding.** With [`LaunchSpec::bind_cores`], rank `r` runs on the
//!   `r % n`-th of the `n` CPUs the launcher may run on (its affinity mask,
//!   i.e. the online CPUs it was given). The launcher pins itself to that CPU
//!   just while it starts the rank, so the rank inherits the binding from
//!   birth without any code in the child (setting it between `fork` and
//!   `exec` would need `unsafe`), and the CPU is also exported as
//!   `BTL_BIND_CPU`; [`apply_binding_from_env`] re-applies it, which `btl`
//!   processes do at start (useful when another launcher only sets the
//!   variable). Without binding, `BTL_BIND_CPU` is removed from the ranks'
//!   environment.
//! - **Input and output.** Each rank's stdout and stderr are pipes; one
//!   thread per pipe copies every line, prefixed with `[<rank>] `, to the
//!   launcher's stdout or stderr respectively (one write per line, so lines
//!   of different ranks never mix; a last line without a newline is still
//!   printed, with one; a line longer than 64 KiB is cut into several).
//!   Rank 0 reads the launcher's stdin when that is not a terminal; every
//!   other rank (and rank 0 when stdin is a terminal) reads `/dev/null`.
//! - **Supervision.** Each rank runs in its own process group (as Open MPI's
//!   launcher does), so signals reach a rank and everything it started. The
//!   launcher polls the ranks every [`POLL_INTERVAL`]. The first rank that
//!   exits with a non-zero status or is killed by a signal fails the job
//!   (of several found in one poll, one killed by a signal before one that
//!   exited with an error, which is most likely its peer reacting to it):
//!   the launcher prints one line on stderr (`btl run: rank 3 (pid 1234) was
//!   killed by signal 9 (SIGKILL); stopping the other 7 ranks`), sends
//!   SIGTERM to the other ranks, SIGKILL after [`KILL_GRACE`] to those still
//!   running, and reaps them all. The job's status is that rank's exit
//!   status (128 + the signal number for a signal), 0 when every rank
//!   succeeds. With [`LaunchSpec::timeout`], a job still running after it is
//!   stopped the same way and its status is [`TIMEOUT_STATUS`] (124). When
//!   a rank ends, any process still left in its process group is killed.
//! - **Signals to the launcher.** While [`launch`] runs, SIGINT, SIGTERM and
//!   SIGHUP do not kill the launcher: they are caught (a handler that only
//!   records the signal number; this module's one `unsafe` part installs it)
//!   and forwarded to every running rank, which are then stopped as above
//!   (status 128 + the signal). A second such signal sends SIGKILL at once.
//!   The ranks being in their own process groups, Ctrl-C at a terminal
//!   reaches only the launcher, which forwards it once. A signal the
//!   launcher was started with ignored (`nohup`, a background job) stays
//!   ignored. The previous dispositions are restored when [`launch`]
//!   returns; ranks start with the default ones.
//!
//! Limitations: a launcher killed by SIGKILL can neither stop its ranks nor
//! remove the session directory; Ctrl-Z stops only the launcher (the ranks
//! run on); a process that a rank moves out of its process group (`setsid`)
//! is not stopped, and if it keeps the rank's output open the launcher waits
//! at most [`KILL_GRACE`] for that output before returning without it.
//! [`launch`] installs process-wide signal handlers, so only one launch may
//! run at a time in a process.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fmt;
use std::io::{self, IsTerminal, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex, TryLockError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use btl_linux::wireup::kv::KvServer;

use btl_linux::job::{
    self, ENV_BIND_CPU, ENV_JOB, ENV_LOCAL_RANK, ENV_LOCAL_SIZE, ENV_NODE, ENV_RANK,
    ENV_SESSION_DIR, ENV_SIZE,
};

mod binding;
mod session;
mod signals;
mod status;
mod supervise;

use binding::*;
pub use binding::{apply_binding_from_env, BindError};
use rustix::thread::CpuSet;
use session::*;
use status::*;
use supervise::*;

/// Largest number of ranks [`launch`] starts.
pub const MAX_NPROCS: u32 = 1024;

/// How long ranks get between SIGTERM and SIGKILL when the job is stopped.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// How often the launcher checks its ranks.
pub const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// The job's exit status when [`LaunchSpec::timeout`] expires (as
/// `timeout(1)`).
pub const TIMEOUT_STATUS: i32 = 124;

/// Longest output line copied in one piece; longer lines are cut.
const MAX_LINE: u64 = 64 * 1024;

/// What to launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    /// Number of ranks, `1..=MAX_NPROCS`.
    pub nprocs: u32,
    /// The program every rank runs (looked up in `PATH` unless it contains a
    /// `/`).
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Whether to bind rank `r` to the `r % n`-th CPU the launcher may use.
    pub bind_cores: bool,
    /// Variables added to every rank's environment (the job variables take
    /// precedence).
    pub extra_env: Vec<(OsString, OsString)>,
    /// Stop the job after this long (status [`TIMEOUT_STATUS`]).
    pub timeout: Option<Duration>,
    /// Prefix every output line with `[<rank>] ` (`btl run` does; `btl
    /// bench` turns it off so its table and `--json`/`--format osu` lines
    /// are printed exactly).
    pub tag_output: bool,
    /// Hosts and their slots (`--host h1:2,h2:2`): ranks fill the slots in
    /// order. Empty: every rank on this machine.
    pub hosts: Vec<(String, u32)>,
    /// The program that starts a rank on a host, as ssh does: `AGENT HOST
    /// COMMAND` (`--agent`, default `ssh`).
    pub agent: Option<OsString>,
    /// The address of this machine the ranks reach the launcher's wire-up
    /// service on (`--wireup-addr`; default 127.0.0.1, required with
    /// `hosts`).
    pub wireup_addr: Option<std::net::IpAddr>,
}

/// Parses `--host`'s value: `HOST[:SLOTS],...` (a host without `:SLOTS`
/// has one slot).
pub fn parse_hosts(s: &str) -> Result<Vec<(String, u32)>, String> {
    let mut v = Vec::new();
    for item in s.split(',') {
        let (h, n) = match item.rsplit_once(':') {
            Some((h, n)) => (
                h,
                n.parse::<u32>().ok().filter(|&n| n > 0).ok_or_else(|| {
                    format!("{item:?}: the slot count must be an integer above 0")
                })?,
            ),
            None => (item, 1),
        };
        let ok = !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !ok {
            return Err(format!("{item:?}: a host name is [A-Za-z0-9._-]+"));
        }
        v.push((h.to_owned(), n));
    }
    Ok(v)
}

/// `s` quoted for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

impl LaunchSpec {
    /// `nprocs` ranks of `program` without arguments, binding, extra
    /// environment or timeout.
    pub fn new(nprocs: u32, program: impl Into<OsString>) -> Self {
        LaunchSpec {
            nprocs,
            program: program.into(),
            args: Vec::new(),
            bind_cores: false,
            extra_env: Vec::new(),
            timeout: None,
            tag_output: true,
            hosts: Vec::new(),
            agent: None,
            wireup_addr: None,
        }
    }
}

/// How a launched job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchReport {
    /// The job's exit status: 0 when every rank succeeded, else the first
    /// failing rank's exit status (128 + the signal number if a signal
    /// killed it), [`TIMEOUT_STATUS`] after a timeout, or 128 + the signal
    /// number when a signal to the launcher stopped the job.
    pub status: i32,
    /// The first rank that failed and how (`"exited with status 3"`, `"was
    /// killed by signal 9 (SIGKILL)"`); `None` if no rank failed on its own.
    pub failed_rank: Option<(u32, String)>,
}

/// Why a job could not be launched or supervised. When it is returned, every
/// rank already started has been killed and reaped and the session
/// directory removed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The [`LaunchSpec`] is unusable.
    #[error("invalid launch: {reason}")]
    InvalidSpec {
        /// What is wrong with it.
        reason: String,
    },
    /// The session directory (or its parent) could not be prepared.
    #[error("cannot {action} session directory {}: {source}", .path.display())]
    SessionDir {
        /// The directory.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The cause.
        source: io::Error,
    },
    /// A rank could not be started.
    #[error(
        "cannot start `{}` (rank {rank}): {}",
        Path::new(.program).display(),
        SpawnCause::new(.program, .source)
    )]
    Spawn {
        /// The rank.
        rank: u32,
        /// The program.
        program: OsString,
        /// The cause.
        source: io::Error,
    },
    /// A rank could not be bound to its CPU.
    #[error("cannot bind rank {rank} to CPU {cpu}: {source}")]
    Binding {
        /// The rank.
        rank: u32,
        /// The CPU.
        cpu: usize,
        /// The cause.
        source: io::Error,
    },
    /// Waiting for a rank failed.
    #[error("cannot wait for rank {rank} (pid {pid}): {source}")]
    Wait {
        /// The rank.
        rank: u32,
        /// Its process id.
        pid: u32,
        /// The cause.
        source: io::Error,
    },
    /// Another system call of the launcher failed.
    #[error("cannot {action}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The cause.
        source: io::Error,
    },
}

/// The cause of a [`LaunchError::Spawn`], with a hint when a bare program
/// name was not found in `PATH`.
struct SpawnCause<'a> {
    program: &'a OsString,
    source: &'a io::Error,
}

impl<'a> SpawnCause<'a> {
    fn new(program: &'a OsString, source: &'a io::Error) -> Self {
        Self { program, source }
    }
}

impl fmt::Display for SpawnCause<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self { program, source } = *self;
        let name = Path::new(program).display();
        if source.kind() == io::ErrorKind::NotFound && !name.to_string().contains('/') {
            write!(f, "program not found in PATH ({source})")
        } else {
            write!(f, "{source}")
        }
    }
}

/// A new job id, unique per launch on this machine: `<pid>x<nanoseconds
/// since the epoch in base 36>`, characters `[0-9a-z]` only.
pub fn new_job_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}x{}", std::process::id(), base36(nanos))
}

fn base36(mut v: u128) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        // `v % 36 < 36`: always a valid index.
        out.push(DIGITS[(v % 36) as usize]);
        v /= 36;
        if v == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// Held while a launch runs: one launch at a time per process (the signal
/// handlers are process-wide).
static LAUNCHING: Mutex<()> = Mutex::new(());

/// Launches the job `spec` describes on this machine and supervises it until
/// every rank has ended; see the module documentation for what it does and
/// prints. Returns how the job ended; an error means the job could not be
/// started or supervised (every rank started is then killed and reaped).
/// The session directory is removed in every case.
pub fn launch(spec: &LaunchSpec) -> Result<LaunchReport, LaunchError> {
    check(spec).map_err(|reason| LaunchError::InvalidSpec { reason })?;
    let _launching = match LAUNCHING.try_lock() {
        Ok(guard) => guard,
        // A launch that panicked left nothing behind that matters here.
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => {
            return Err(LaunchError::InvalidSpec {
                reason: "another launch is running in this process".to_owned(),
            })
        }
    };
    // Installed first: from here on a Ctrl-C is recorded, not fatal, so the
    // clean-up below always runs.
    let _signals = signals::Catch::install().map_err(|source| LaunchError::Io {
        action: "install the launcher's signal handlers",
        source,
    })?;

    let uid = rustix::process::getuid().as_raw();
    let job = new_job_id();
    let node = job::local_node_name();
    let session = SessionDir::create(&tmp_base(), uid, &job)?;
    log::debug!(
        "job {job} on {node}: {} of {} in {}",
        count_ranks(spec.nprocs as usize),
        Path::new(&spec.program).display(),
        session.path.display()
    );
    let result = run_job(spec, &job, &node, &session.path);
    drop(session);
    result
}

/// Why `spec` cannot be launched, if it cannot: a rank count out of range,
/// no program, too few host slots, remote ranks without a wire-up address.
fn check(spec: &LaunchSpec) -> Result<(), String> {
    if spec.nprocs == 0 || spec.nprocs > MAX_NPROCS {
        return Err(format!(
            "{} ranks requested; between 1 and {MAX_NPROCS} are accepted",
            spec.nprocs
        ));
    }
    if spec.program.is_empty() {
        return Err("the program name is empty".to_owned());
    }
    let slots: u64 = spec.hosts.iter().map(|(_, n)| u64::from(*n)).sum();
    if !spec.hosts.is_empty() {
        if slots < u64::from(spec.nprocs) {
            return Err(format!(
                "{} ranks requested but the hosts have {slots} slots",
                spec.nprocs
            ));
        }
        if spec.wireup_addr.is_none() {
            return Err(
                "ranks on other hosts need --wireup-addr: an address of this machine \
                 they can reach (the launcher's wire-up service listens there)"
                    .to_owned(),
            );
        }
    }
    Ok(())
}

/// Starts and supervises the ranks (the part of [`launch`] between setting
/// up and cleaning up the session).
fn run_job(
    spec: &LaunchSpec,
    job: &str,
    node: &str,
    session: &Path,
) -> Result<LaunchReport, LaunchError> {
    ensure_fd_limit(u64::from(spec.nprocs) * 2 + 64);
    let bind_cpus = if spec.bind_cores {
        let set = rustix::thread::sched_getaffinity(None).map_err(|e| LaunchError::Io {
            action: "read the launcher's CPU affinity",
            source: e.into(),
        })?;
        let cpus = cpus_of(&set);
        if cpus.is_empty() {
            return Err(LaunchError::Io {
                action: "bind ranks to cores",
                source: io::Error::other("the launcher's CPU affinity mask is empty"),
            });
        }
        Some((set, cpus))
    } else {
        None
    };

    // The job's wire-up service, alive until every rank is reaped.
    let bind = std::net::SocketAddr::new(
        spec.wireup_addr
            .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
        0,
    );
    // `BTL_WIREUP=dir` in the launcher's environment: records in the
    // session directory instead (no service).
    let use_dir = std::env::var(btl_linux::wireup::ENV_WIREUP).is_ok_and(|v| v == "dir");
    let service = if use_dir {
        None
    } else {
        Some(
            KvServer::start(bind, job, spec.nprocs).map_err(|source| LaunchError::Io {
                action: "start the wire-up service",
                source,
            })?,
        )
    };
    let wireup = match &service {
        Some(s) => format!("kv://{}", s.addr()),
        None => "dir".to_owned(),
    };
    // Rank -> host (None: here).
    let placement: Vec<Option<&str>> = if spec.hosts.is_empty() {
        vec![None; spec.nprocs as usize]
    } else {
        spec.hosts
            .iter()
            .flat_map(|(h, n)| std::iter::repeat_n(Some(h.as_str()), *n as usize))
            .take(spec.nprocs as usize)
            .collect()
    };
    let local_of = |rank: u32| {
        let host = placement[rank as usize];
        let before = placement[..rank as usize]
            .iter()
            .filter(|h| **h == host)
            .count();
        let all = placement.iter().filter(|h| **h == host).count();
        (before as u32, all as u32)
    };

    let mut ranks = Ranks::default();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut readers: Vec<JoinHandle<()>> = Vec::new();
    let stdin_for_rank0 = !io::stdin().is_terminal();
    let mut todo_spawn = Vec::with_capacity(spec.nprocs as usize);
    for rank in 0..spec.nprocs {
        let (local_rank, local_size) = local_of(rank);
        let mut cmd = match placement[rank as usize] {
            None => {
                let mut cmd = Command::new(&spec.program);
                cmd.args(&spec.args)
                    .envs(spec.extra_env.iter().map(|(k, v)| (k, v)))
                    .env(ENV_JOB, job)
                    .env(ENV_RANK, rank.to_string())
                    .env(ENV_SIZE, spec.nprocs.to_string())
                    .env(ENV_LOCAL_RANK, local_rank.to_string())
                    .env(ENV_LOCAL_SIZE, local_size.to_string())
                    .env(ENV_SESSION_DIR, session)
                    .env(ENV_NODE, node)
                    .env(btl_linux::wireup::ENV_WIREUP, &wireup);
                cmd
            }
            Some(host) => {
                let mut cmd =
                    Command::new(spec.agent.clone().unwrap_or_else(|| OsString::from("ssh")));
                cmd.arg(host).arg(remote_command(
                    spec,
                    &[
                        (ENV_JOB, job.to_owned()),
                        (ENV_RANK, rank.to_string()),
                        (ENV_SIZE, spec.nprocs.to_string()),
                        (ENV_LOCAL_RANK, local_rank.to_string()),
                        (ENV_LOCAL_SIZE, local_size.to_string()),
                        (ENV_NODE, job::sanitize_name(host)),
                        (btl_linux::wireup::ENV_WIREUP, wireup.clone()),
                    ],
                ));
                cmd
            }
        };
        cmd.stdin(if rank == 0 && stdin_for_rank0 {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
        let here = placement[rank as usize].is_none();
        let cpu = match (&bind_cpus, here) {
            (Some((_, cpus)), true) => {
                let cpu = cpus[rank as usize % cpus.len()];
                cmd.env(ENV_BIND_CPU, cpu.to_string());
                Some(cpu)
            }
            _ => {
                cmd.env_remove(ENV_BIND_CPU);
                None
            }
        };
        todo_spawn.push(ToSpawn {
            rank,
            host: placement[rank as usize],
            cmd,
            cpu,
        });
    }
    let children = spawn_all(
        todo_spawn,
        &spec.program,
        bind_cpus.as_ref().map(|(set, _)| *set),
    );
    // Every child started is supervised (and so killed on an error) before
    // the first error is returned.
    let mut first_error = None;
    for (rank, spawned) in children {
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                first_error.get_or_insert(e);
                continue;
            }
        };
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        ranks.procs.push(RankProc {
            rank,
            pid: child.id(),
            child,
            status: None,
        });
        for (pipe, to_stderr) in [
            (stdout.map(|p| Box::new(p) as Box<dyn Read + Send>), false),
            (stderr.map(|p| Box::new(p) as Box<dyn Read + Send>), true),
        ] {
            let Some(pipe) = pipe else { continue };
            let done = done_tx.clone();
            let tag = spec.tag_output;
            let handle = thread::Builder::new()
                .name(format!("btl-run-{rank}"))
                .stack_size(64 * 1024)
                .spawn(move || {
                    copy_lines(rank, pipe, to_stderr, tag);
                    let _ = done.send(());
                })
                .map_err(|source| LaunchError::Io {
                    action: "start an output thread",
                    source,
                })?;
            readers.push(handle);
        }
    }
    drop(done_tx);
    if let Some(e) = first_error {
        drop(ranks);
        wait_for_output(&done_rx, readers);
        return Err(e);
    }

    let report = supervise(&mut ranks, spec.timeout)?;
    drop(ranks);
    drop(service);
    wait_for_output(&done_rx, readers);
    Ok(report)
}

/// A rank's process, ready to start.
struct ToSpawn<'a> {
    rank: u32,
    /// Its host (`None`: here).
    host: Option<&'a str>,
    cmd: Command,
    /// The CPU to bind it to.
    cpu: Option<usize>,
}

/// Most processes started at once: agents (ssh, a namespace's `ip netns
/// exec`) cost the launcher a fork and exec each, and a start on every
/// host at once does not wait for the hosts before it in the list.
const SPAWNERS: usize = 16;

/// Starts every process, [`SPAWNERS`] at a time, taking the hosts in
/// turn (the first rank of every host, then the second, ...), so a rank's
/// start does not wait for the ranks of the hosts listed before its own.
/// Returns each rank's child (or the error that kept it from starting), in
/// rank order. `restore` is the launcher's CPU set, when ranks are bound.
fn spawn_all(
    todo: Vec<ToSpawn<'_>>,
    program: &OsString,
    restore: Option<CpuSet>,
) -> Vec<(u32, Result<Child, LaunchError>)> {
    let mut keyed: Vec<(usize, ToSpawn<'_>)> = Vec::with_capacity(todo.len());
    let mut seen: Vec<(Option<&str>, usize)> = Vec::new();
    for t in todo {
        let nth = match seen.iter_mut().find(|(h, _)| *h == t.host) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                seen.push((t.host, 0));
                0
            }
        };
        keyed.push((nth, t));
    }
    // Stable: within a turn, hosts in the order of the list.
    keyed.sort_by_key(|(nth, _)| *nth);
    let queue: Mutex<VecDeque<ToSpawn<'_>>> =
        Mutex::new(keyed.into_iter().map(|(_, t)| t).collect());
    let work = || {
        let mut done = Vec::new();
        loop {
            let next = match queue.lock() {
                Ok(mut q) => q.pop_front(),
                Err(poisoned) => poisoned.into_inner().pop_front(),
            };
            let Some(mut t) = next else { break };
            done.push((t.rank, spawn_one(&mut t, program, restore)));
        }
        done
    };
    let helpers = SPAWNERS.saturating_sub(1).min(queue_len(&queue));
    let mut out: Vec<(u32, Result<Child, LaunchError>)> = thread::scope(|s| {
        // A helper thread that cannot be made leaves its share to the
        // others; this thread works too, so at least one does.
        let handles: Vec<_> = (0..helpers)
            .filter_map(|_| {
                thread::Builder::new()
                    .name("btl-run-spawn".into())
                    .stack_size(64 * 1024)
                    .spawn_scoped(s, work)
                    .ok()
            })
            .collect();
        let mut all = work();
        for h in handles {
            all.extend(h.join().unwrap_or_default());
        }
        all
    });
    out.sort_unstable_by_key(|(r, _)| *r);
    out
}

fn queue_len<T>(q: &Mutex<VecDeque<T>>) -> usize {
    q.lock().map_or(0, |q| q.len())
}

/// Starts one rank's process, bound to its CPU (from this thread, whose
/// affinity the child inherits) if it has one.
fn spawn_one(
    t: &mut ToSpawn<'_>,
    program: &OsString,
    restore: Option<CpuSet>,
) -> Result<Child, LaunchError> {
    let rank = t.rank;
    let _restore = match (t.cpu, restore) {
        (Some(cpu), Some(set)) => {
            let r = AffinityRestore(set);
            bind_current_thread(cpu).map_err(|source| LaunchError::Binding {
                rank,
                cpu,
                source,
            })?;
            Some(r)
        }
        _ => None,
    };
    t.cmd.spawn().map_err(|source| LaunchError::Spawn {
        rank,
        program: program.clone(),
        source,
    })
}

/// The shell command that starts a rank on another host: into the
/// launcher's working directory (if it exists there), then `env` with the
/// job's variables, the spec's extra variables and every `BTL_*` variable
/// of the launcher's environment (the job's own take precedence), then the
/// program with its arguments. Every word is quoted.
fn remote_command(spec: &LaunchSpec, job_vars: &[(&str, String)]) -> String {
    let mut words: Vec<String> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        words.push(format!(
            "cd {} 2>/dev/null;",
            shell_quote(&cwd.to_string_lossy())
        ));
    }
    words.push("exec env".into());
    let mut vars: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("BTL_"))
        .collect();
    vars.extend(spec.extra_env.iter().map(|(k, v)| {
        (
            k.to_string_lossy().into_owned(),
            v.to_string_lossy().into_owned(),
        )
    }));
    vars.extend(job_vars.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    // The last value of a variable wins, as with `env`; drop the others and
    // the binding variable (it names a CPU of this machine).
    let mut seen = std::collections::HashSet::new();
    let mut keep: Vec<(String, String)> = vars
        .into_iter()
        .rev()
        .filter(|(k, _)| k != ENV_BIND_CPU && k != ENV_SESSION_DIR && seen.insert(k.clone()))
        .collect();
    keep.reverse();
    for (k, v) in keep {
        words.push(shell_quote(&format!("{k}={v}")));
    }
    words.push(shell_quote(&spec.program.to_string_lossy()));
    words.extend(spec.args.iter().map(|a| shell_quote(&a.to_string_lossy())));
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    #[test]
    fn a_signal_is_named_before_an_exit_found_in_the_same_poll() {
        let ok = ExitStatus::from_raw(0);
        let exit1 = ExitStatus::from_raw(1 << 8);
        let exit3 = ExitStatus::from_raw(3 << 8);
        let killed = ExitStatus::from_raw(9);
        let first = super::supervise::names_first;
        assert!(!first(&ok, None));
        assert!(first(&exit1, None) && first(&killed, None));
        // Rank order otherwise: the first failure found stays.
        assert!(!first(&exit3, Some(&exit1)));
        assert!(!first(&ExitStatus::from_raw(15), Some(&killed)));
        // A signal replaces an exit found earlier in the same poll.
        assert!(first(&killed, Some(&exit1)));
        assert!(!first(&exit1, Some(&killed)));
    }

    #[test]
    fn job_ids_are_alphanumeric_and_unique() {
        let a = new_job_id();
        thread::sleep(Duration::from_millis(1));
        let b = new_job_id();
        assert_ne!(a, b);
        for id in [&a, &b] {
            assert!(id.bytes().all(|c| c.is_ascii_alphanumeric()), "{id}");
            assert!(job::is_valid_name(id));
            assert!(id.starts_with(&format!("{}x", std::process::id())));
        }
        assert_eq!(base36(0), "0");
        assert_eq!(base36(35), "z");
        assert_eq!(base36(36), "10");
    }

    #[test]
    fn node_names() {
        assert_eq!(job::sanitize_name("node-01.cluster"), "node-01.cluster");
        assert_eq!(job::sanitize_name("my host/é"), "my_host__");
        assert_eq!(job::sanitize_name(""), "localhost");
        assert_eq!(job::sanitize_name(&"a".repeat(100)).len(), 64);
        assert!(job::is_valid_name(&job::local_node_name()));
    }

    #[test]
    fn statuses() {
        assert_eq!(
            describe_status(ExitStatus::from_raw(2 << 8)),
            ("exited with status 2".to_owned(), 2)
        );
        assert_eq!(
            describe_status(ExitStatus::from_raw(9)),
            ("was killed by signal 9 (SIGKILL)".to_owned(), 137)
        );
        assert_eq!(describe_signal(15), "signal 15 (SIGTERM)");
        assert_eq!(describe_signal(40), "signal 40");
    }

    #[test]
    fn session_dir_is_private_and_removed() {
        let base = std::env::temp_dir().join(format!("btl-launcher-test-{}", new_job_id()));
        fs::create_dir_all(&base).unwrap();
        let uid = rustix::process::getuid().as_raw();
        let path = {
            let dir = SessionDir::create(&base, uid, "job1").unwrap();
            let meta = fs::metadata(&dir.path).unwrap();
            assert_eq!(meta.mode() & 0o777, 0o700);
            let parent = fs::metadata(dir.path.parent().unwrap()).unwrap();
            assert_eq!(parent.mode() & 0o777, 0o700);
            fs::write(dir.path.join("f"), b"x").unwrap();
            fs::create_dir(dir.path.join("d")).unwrap();
            assert!(
                SessionDir::create(&base, uid, "job1").is_err(),
                "exists already"
            );
            dir.path.clone()
        };
        assert!(!path.exists());
        // A parent owned by someone else is refused.
        let other = uid.wrapping_add(1);
        fs::create_dir(base.join(format!("btl-{other}"))).unwrap();
        assert!(SessionDir::create(&base, other, "job2").is_err());
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn invalid_specs() {
        for n in [0, MAX_NPROCS + 1] {
            assert!(matches!(
                launch(&LaunchSpec::new(n, "true")),
                Err(LaunchError::InvalidSpec { .. })
            ));
        }
        assert!(matches!(
            launch(&LaunchSpec::new(1, "")),
            Err(LaunchError::InvalidSpec { .. })
        ));
        // Hosts: not enough slots; no address for the wire-up service.
        let mut spec = LaunchSpec::new(3, "true");
        spec.hosts = vec![("a".into(), 1), ("b".into(), 1)];
        spec.wireup_addr = Some(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        match launch(&spec) {
            Err(LaunchError::InvalidSpec { reason }) => {
                assert!(reason.contains("2 slots"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        spec.nprocs = 2;
        spec.wireup_addr = None;
        match launch(&spec) {
            Err(LaunchError::InvalidSpec { reason }) => {
                assert!(reason.contains("--wireup-addr"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn host_lists() {
        assert_eq!(
            parse_hosts("h1:2,h2,node-3.x:16").unwrap(),
            vec![
                ("h1".to_string(), 2),
                ("h2".to_string(), 1),
                ("node-3.x".to_string(), 16)
            ]
        );
        for bad in ["", "h1:0", "h1:x", ":2", "a b:1", "h1,,h2"] {
            assert!(parse_hosts(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn remote_commands_are_quoted() {
        let mut spec = LaunchSpec::new(1, "/opt/my prog");
        spec.args = vec!["it's".into(), "$HOME".into()];
        spec.extra_env = vec![("X".into(), "a b".into())];
        let cmd = remote_command(&spec, &[("BTL_RANK", "0".into())]);
        assert!(cmd.contains("exec env "), "{cmd}");
        assert!(cmd.contains("'X=a b'"), "{cmd}");
        assert!(cmd.contains("'BTL_RANK=0'"), "{cmd}");
        assert!(cmd.ends_with("'/opt/my prog' 'it'\\''s' '$HOME'"), "{cmd}");
        // Through a real shell, the words come back intact.
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "printf '%s|' {}",
                &cmd[cmd.find("'/opt").unwrap()..]
            ))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "/opt/my prog|it's|$HOME|"
        );
    }

    #[test]
    fn spawn_messages_hint_at_path_for_bare_names_only() {
        let spawn = |program: &str, kind| LaunchError::Spawn {
            rank: 2,
            program: program.into(),
            source: io::Error::new(kind, "boom"),
        };
        assert_eq!(
            spawn("a.out", io::ErrorKind::NotFound).to_string(),
            "cannot start `a.out` (rank 2): program not found in PATH (boom)"
        );
        assert_eq!(
            spawn("./a.out", io::ErrorKind::NotFound).to_string(),
            "cannot start `./a.out` (rank 2): boom"
        );
        assert_eq!(
            spawn("a.out", io::ErrorKind::PermissionDenied).to_string(),
            "cannot start `a.out` (rank 2): boom"
        );
        assert!(std::error::Error::source(&spawn("a.out", io::ErrorKind::NotFound)).is_some());
    }
}
