//! Running ranks: their processes and output, and the supervision loop
//! that stops the job when a rank fails, on a timeout or a signal.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::status::{count_ranks, describe_signal, describe_status, notice};
use super::{
    signals, LaunchError, LaunchReport, KILL_GRACE, MAX_LINE, POLL_INTERVAL, TIMEOUT_STATUS,
};
use rustix::process::{Pid, Signal};

/// One started rank.
#[derive(Debug)]
pub(super) struct RankProc {
    pub(super) rank: u32,
    pub(super) pid: u32,
    pub(super) child: Child,
    pub(super) status: Option<ExitStatus>,
}

impl RankProc {
    pub(super) fn running(&self) -> bool {
        self.status.is_none()
    }

    /// Sends `sig` to the rank's process group (the rank and what it
    /// started), or to the rank alone if that fails while it is not reaped;
    /// `Ok` if some process received it.
    ///
    /// Once the rank is reaped its process id may be reused, but not while
    /// its process group has members; so after reaping, only the group is
    /// signalled, and only right away (see [`supervise`]).
    pub(super) fn signal(&self, sig: Signal) -> io::Result<()> {
        let pid = i32::try_from(self.pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        match rustix::process::kill_process_group(pid, sig) {
            Ok(()) => Ok(()),
            Err(_) if self.running() => Ok(rustix::process::kill_process(pid, sig)?),
            Err(e) => Err(e.into()),
        }
    }
}

/// The started ranks; on drop, any rank not reaped yet is killed and reaped.
#[derive(Debug, Default)]
pub(super) struct Ranks {
    pub(super) procs: Vec<RankProc>,
}

impl Ranks {
    pub(super) fn running_count(&self) -> usize {
        self.procs.iter().filter(|p| p.running()).count()
    }

    /// Sends `sig` to every rank still running.
    pub(super) fn signal_running(&self, sig: Signal) {
        for p in self.procs.iter().filter(|p| p.running()) {
            if let Err(e) = p.signal(sig) {
                log::debug!("cannot signal rank {} (pid {}): {e}", p.rank, p.pid);
            }
        }
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for p in self.procs.iter_mut().filter(|p| p.status.is_none()) {
            let _ = p.signal(Signal::KILL);
            match p.child.wait() {
                Ok(status) => p.status = Some(status),
                Err(e) => log::warn!("cannot reap rank {} (pid {}): {e}", p.rank, p.pid),
            }
        }
    }
}

/// Raises the soft open-file limit to `needed` if it is lower (up to the
/// hard limit): each rank costs the launcher two pipe descriptors.
pub(super) fn ensure_fd_limit(needed: u64) {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    let Some(current) = limit.current else {
        return;
    };
    if current >= needed {
        return;
    }
    let target = limit.maximum.map_or(needed, |max| max.min(needed));
    limit.current = Some(target);
    match setrlimit(Resource::Nofile, limit) {
        Ok(()) => log::debug!("raised the open-file limit from {current} to {target}"),
        Err(e) => log::warn!("cannot raise the open-file limit from {current} to {target}: {e}"),
    }
}

/// Copies `src` line by line to the launcher's stdout (or stderr), each line
/// prefixed with `[<rank>] ` if `tag`; keeps draining `src` if the
/// destination fails.
pub(super) fn copy_lines(rank: u32, src: impl Read, to_stderr: bool, tag: bool) {
    let mut reader = BufReader::with_capacity(64 * 1024, src);
    let prefix = if tag {
        format!("[{rank}] ")
    } else {
        String::new()
    };
    let mut line = Vec::with_capacity(256);
    let mut broken = false;
    loop {
        line.clear();
        line.extend_from_slice(prefix.as_bytes());
        match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                log::debug!("cannot read the output of rank {rank}: {e}");
                break;
            }
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        if broken {
            continue;
        }
        let written = if to_stderr {
            io::stderr().lock().write_all(&line)
        } else {
            let mut out = io::stdout().lock();
            out.write_all(&line).and_then(|()| out.flush())
        };
        broken = written.is_err();
    }
}

/// Why the launcher is stopping the job.
#[derive(Debug, Clone, Copy)]
pub(super) enum Stop {
    /// A rank failed; the job status.
    RankFailed(i32),
    /// The timeout expired.
    Timeout,
    /// The launcher received this signal.
    Signal(i32),
}

/// Waits (at most [`KILL_GRACE`]) for the output threads to copy what the
/// ranks wrote last.
pub(super) fn wait_for_output(done: &mpsc::Receiver<()>, readers: Vec<JoinHandle<()>>) {
    let deadline = Instant::now() + KILL_GRACE;
    let mut finished = 0;
    while finished < readers.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        match done.recv_timeout(left) {
            Ok(()) => finished += 1,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                log::warn!(
                    "the output of {} is still open after every rank ended (a process outside \
                     the ranks' process groups holds it); not waiting for it",
                    count_ranks(readers.len() - finished)
                );
                return;
            }
        }
    }
    for r in readers {
        let _ = r.join();
    }
}

/// Whether `status`, found in a poll, is the failure to name rather than
/// `earlier` (the one chosen so far in the same poll, in rank order): a
/// failure when none was, and a rank killed by a signal before one that
/// exited with an error — a rank whose peer dies ends with status 1 (its
/// liveness check), so when both are found together the signal is the
/// cause and the exit its consequence.
pub(super) fn names_first(status: &ExitStatus, earlier: Option<&ExitStatus>) -> bool {
    !status.success() && earlier.is_none_or(|e| status.signal().is_some() && e.signal().is_none())
}

/// Polls the ranks until they have all ended, stopping the job on the first
/// failure, the timeout or a signal to the launcher.
pub(super) fn supervise(
    ranks: &mut Ranks,
    timeout: Option<Duration>,
) -> Result<LaunchReport, LaunchError> {
    let start = Instant::now();
    let mut stop: Option<(Stop, Instant)> = None;
    let mut failed_rank = None;
    let mut killed = false;
    loop {
        if let Some(sig) = signals::take() {
            let running = ranks.running_count();
            if stop.is_none() {
                notice(&format!(
                    "received {}; stopping the {}",
                    describe_signal(sig),
                    ranks_running(running)
                ));
                if let Some(s) = Signal::from_named_raw(sig) {
                    ranks.signal_running(s);
                }
                stop = Some((Stop::Signal(sig), Instant::now()));
            } else if !killed && running > 0 {
                notice(&format!(
                    "received {} again; killing the {} (SIGKILL)",
                    describe_signal(sig),
                    ranks_running(running)
                ));
                ranks.signal_running(Signal::KILL);
                killed = true;
            }
        }

        let mut first_failure = None;
        for p in ranks.procs.iter_mut().filter(|p| p.running()) {
            match p.child.try_wait() {
                Ok(Some(status)) => {
                    p.status = Some(status);
                    log::debug!("rank {} (pid {}) ended: {status}", p.rank, p.pid);
                    // Whatever the rank left in its process group goes with
                    // it (signalled right after reaping: see `signal`).
                    if p.signal(Signal::KILL).is_ok() {
                        log::info!(
                            "rank {} (pid {}) left processes behind in its process group; \
                             killed them",
                            p.rank,
                            p.pid
                        );
                    }
                    if names_first(
                        &status,
                        first_failure
                            .as_ref()
                            .map(|f: &(u32, u32, ExitStatus)| &f.2),
                    ) {
                        first_failure = Some((p.rank, p.pid, status));
                    }
                }
                Ok(None) => {}
                Err(source) => {
                    return Err(LaunchError::Wait {
                        rank: p.rank,
                        pid: p.pid,
                        source,
                    })
                }
            }
        }
        if let Some((rank, pid, status)) = first_failure {
            if stop.is_none() {
                let (how, code) = describe_status(status);
                let running = ranks.running_count();
                if running == 0 {
                    notice(&format!("rank {rank} (pid {pid}) {how}"));
                } else {
                    let others = if running == 1 {
                        "the other rank".to_owned()
                    } else {
                        format!("the other {running} ranks")
                    };
                    notice(&format!("rank {rank} (pid {pid}) {how}; stopping {others}"));
                }
                ranks.signal_running(Signal::TERM);
                stop = Some((Stop::RankFailed(code), Instant::now()));
                failed_rank = Some((rank, how));
            }
        }

        if ranks.running_count() == 0 {
            break;
        }
        if let (None, Some(limit)) = (stop, timeout) {
            if start.elapsed() >= limit {
                notice(&format!(
                    "timed out after {limit:?}; stopping the {}",
                    ranks_running(ranks.running_count())
                ));
                ranks.signal_running(Signal::TERM);
                stop = Some((Stop::Timeout, Instant::now()));
            }
        }
        if let Some((_, since)) = stop {
            if !killed && since.elapsed() >= KILL_GRACE {
                let running = ranks.running_count();
                let (verb, object) = if running == 1 {
                    ("is", "it")
                } else {
                    ("are", "them")
                };
                notice(&format!(
                    "{} {verb} still running {KILL_GRACE:?} after being told to stop; killing \
                     {object} (SIGKILL)",
                    count_ranks(running)
                ));
                ranks.signal_running(Signal::KILL);
                killed = true;
            }
        }
        thread::sleep(POLL_INTERVAL);
    }

    let status = match stop {
        None => 0,
        Some((Stop::RankFailed(code), _)) => code,
        Some((Stop::Timeout, _)) => TIMEOUT_STATUS,
        Some((Stop::Signal(sig), _)) => 128 + sig,
    };
    Ok(LaunchReport {
        status,
        failed_rank,
    })
}

/// `3 ranks still running` / `1 rank still running`.
pub(super) fn ranks_running(n: usize) -> String {
    format!("{} still running", count_ranks(n))
}
