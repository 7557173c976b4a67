//! How a rank ended, in words (`was killed by signal 9 (SIGKILL)`), and
//! the launcher's notices.

use std::io::{self, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

/// The name of signal `sig` (`"SIGKILL"`), if it is a standard one.
pub(super) fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGURG => "SIGURG",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGWINCH => "SIGWINCH",
        libc::SIGIO => "SIGIO",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}

/// `signal 9 (SIGKILL)`.
pub(super) fn describe_signal(sig: i32) -> String {
    match signal_name(sig) {
        Some(name) => format!("signal {sig} ({name})"),
        None => format!("signal {sig}"),
    }
}

/// How a process ended, and the job status that stands for it.
pub(super) fn describe_status(status: ExitStatus) -> (String, i32) {
    if let Some(code) = status.code() {
        (format!("exited with status {code}"), code)
    } else if let Some(sig) = status.signal() {
        let core = if status.core_dumped() {
            " (core dumped)"
        } else {
            ""
        };
        (
            format!("was killed by {}{core}", describe_signal(sig)),
            128 + sig,
        )
    } else {
        (
            format!("ended with wait status {:#x}", status.into_raw()),
            1,
        )
    }
}

/// `1 rank` / `3 ranks`.
pub(super) fn count_ranks(n: usize) -> String {
    if n == 1 {
        "1 rank".to_owned()
    } else {
        format!("{n} ranks")
    }
}

/// Prints one `btl run:` line on stderr (nowhere else to report a failure
/// to write it).
pub(super) fn notice(msg: &str) {
    let _ = writeln!(io::stderr().lock(), "btl run: {msg}");
}
