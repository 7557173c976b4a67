//! What a rank knows about its job: the `BTL_*` environment a launcher sets
//! (`btl run`, or any launcher that sets them), validated into a [`JobEnv`], and the `btl`
//! processes' stderr logger ([`init_logging`]).
//!
//! A process is "in a job" when `BTL_RANK` is set; then every other variable
//! of the job must be set too and make sense, and [`JobEnv::from_env`] says
//! precisely which one does not.

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use btl_core::params::{ParamError, Params};

/// Identifier of the job, unique per launch (`[A-Za-z0-9._-]{1,64}`).
pub const ENV_JOB: &str = "BTL_JOB";
/// The process's rank in the job, `0..BTL_SIZE`.
pub const ENV_RANK: &str = "BTL_RANK";
/// Number of processes in the job.
pub const ENV_SIZE: &str = "BTL_SIZE";
/// The process's rank among the processes of its node, `0..BTL_LOCAL_SIZE`.
pub const ENV_LOCAL_RANK: &str = "BTL_LOCAL_RANK";
/// Number of processes of the job on this node (at most `BTL_SIZE`).
pub const ENV_LOCAL_SIZE: &str = "BTL_LOCAL_SIZE";
/// The job's private session directory on this node (an absolute path).
pub const ENV_SESSION_DIR: &str = "BTL_SESSION_DIR";
/// Name of this node (`[A-Za-z0-9._-]{1,64}`).
pub const ENV_NODE: &str = "BTL_NODE";
/// The CPU the launcher bound this rank to (set only with `--bind-to core`);
/// see the launcher's `apply_binding_from_env`.
pub const ENV_BIND_CPU: &str = "BTL_BIND_CPU";
/// Log level of `btl` processes: `off`, `error`, `warn` (default), `info`,
/// `debug` or `trace`; see [`init_logging`].
pub const ENV_LOG: &str = "BTL_LOG";

/// Every variable [`JobEnv::from_env`] reads, in the order it checks them.
pub const JOB_VARS: [&str; 7] = [
    ENV_JOB,
    ENV_RANK,
    ENV_SIZE,
    ENV_LOCAL_RANK,
    ENV_LOCAL_SIZE,
    ENV_SESSION_DIR,
    ENV_NODE,
];

/// Longest accepted job identifier or node name, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// What a name (job identifier, node name) accepts, for error messages.
pub(crate) const ACCEPTS_NAME: &str = "1 to 64 characters from A-Z, a-z, 0-9, '.', '_' and '-'";

/// The job a process belongs to, as its launcher described it in the
/// environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEnv {
    /// Job identifier (`BTL_JOB`), unique per launch.
    pub job: String,
    /// Rank in the job (`BTL_RANK`), `< size`.
    pub rank: u32,
    /// Number of processes in the job (`BTL_SIZE`), `>= 1`.
    pub size: u32,
    /// Rank among the job's processes on this node (`BTL_LOCAL_RANK`),
    /// `< local_size`.
    pub local_rank: u32,
    /// Number of the job's processes on this node (`BTL_LOCAL_SIZE`),
    /// `<= size`.
    pub local_size: u32,
    /// The job's private directory on this node (`BTL_SESSION_DIR`),
    /// absolute.
    pub session_dir: PathBuf,
    /// Name of this node (`BTL_NODE`).
    pub node: String,
}

/// Why the job environment is unusable. Every variant names the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobEnvError {
    /// `BTL_RANK` is set (so this is a job) but another job variable is not.
    #[error(
        "{var} is not set, but {ENV_RANK} is: a btl job sets all of {}",
        JOB_VARS.join(", ")
    )]
    Missing {
        /// The missing variable.
        var: &'static str,
    },
    /// A variable's value is not valid UTF-8.
    #[error("{var} is not valid UTF-8")]
    NotUnicode {
        /// The variable.
        var: &'static str,
    },
    /// A variable's value is malformed or inconsistent with the others.
    #[error("{var}={value:?} is invalid; it accepts {accepts}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it accepts.
        accepts: String,
    },
}

/// Whether `s` matches `[A-Za-z0-9._-]{1,64}`.
pub fn is_valid_name(s: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// `s` as a valid name: every character outside `[A-Za-z0-9._-]`
/// replaced by `_`; a name longer than 64 characters keeps its first 47
/// and gets `-` and 16 hex digits of a hash of the whole (so long names
/// stay distinct); `localhost` if `s` is empty.
pub fn sanitize_name(s: &str) -> String {
    let name: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        return "localhost".to_owned();
    }
    if name.len() <= MAX_NAME_LEN {
        return name;
    }
    let hash = s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{}-{hash:016x}", &name[..MAX_NAME_LEN - 17])
}

impl JobEnv {
    /// Reads the job from the process environment: `Ok(None)` when
    /// `BTL_RANK` is unset (not in a job), an error naming the variable when
    /// any job variable is missing, not UTF-8 or invalid.
    pub fn from_env() -> Result<Option<JobEnv>, JobEnvError> {
        let mut values: Vec<(&'static str, String)> = Vec::with_capacity(JOB_VARS.len());
        for var in JOB_VARS {
            if let Some(v) = std::env::var_os(var) {
                let v = v
                    .into_string()
                    .map_err(|_| JobEnvError::NotUnicode { var })?;
                values.push((var, v));
            }
        }
        JobEnv::from_vars(|name| {
            values
                .iter()
                .find(|(var, _)| *var == name)
                .map(|(_, v)| v.clone())
        })
    }

    /// Reads the job from `get` (a variable name to its value), as
    /// [`JobEnv::from_env`] does from the environment; for tests and for
    /// callers that hold the environment elsewhere.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<JobEnv>, JobEnvError> {
        let Some(rank_text) = get(ENV_RANK) else {
            return Ok(None);
        };
        let require = |var: &'static str| get(var).ok_or(JobEnvError::Missing { var });
        let invalid = |var: &'static str, value: &str, accepts: String| JobEnvError::Invalid {
            var,
            value: value.to_owned(),
            accepts,
        };
        let number = |var: &'static str, value: &str, accepts: &str| {
            parse_u32(value).ok_or_else(|| invalid(var, value, accepts.to_owned()))
        };
        let name = |var: &'static str, value: String| {
            if is_valid_name(&value) {
                Ok(value)
            } else {
                Err(invalid(var, &value, ACCEPTS_NAME.to_owned()))
            }
        };

        let job = name(ENV_JOB, require(ENV_JOB)?)?;
        let size_text = require(ENV_SIZE)?;
        let size = number(ENV_SIZE, &size_text, "an integer between 1 and 4294967295")?;
        if size == 0 {
            return Err(invalid(
                ENV_SIZE,
                &size_text,
                "an integer between 1 and 4294967295".to_owned(),
            ));
        }
        let rank_accepts = format!("an integer between 0 and {} ({ENV_SIZE} - 1)", size - 1);
        let rank = number(ENV_RANK, &rank_text, &rank_accepts)?;
        if rank >= size {
            return Err(invalid(ENV_RANK, &rank_text, rank_accepts));
        }
        let local_size_text = require(ENV_LOCAL_SIZE)?;
        let local_size_accepts = format!("an integer between 1 and {size} ({ENV_SIZE})");
        let local_size = number(ENV_LOCAL_SIZE, &local_size_text, &local_size_accepts)?;
        if local_size == 0 || local_size > size {
            return Err(invalid(
                ENV_LOCAL_SIZE,
                &local_size_text,
                local_size_accepts,
            ));
        }
        let local_rank_text = require(ENV_LOCAL_RANK)?;
        let local_rank_accepts = format!(
            "an integer between 0 and {} ({ENV_LOCAL_SIZE} - 1)",
            local_size - 1
        );
        let local_rank = number(ENV_LOCAL_RANK, &local_rank_text, &local_rank_accepts)?;
        if local_rank >= local_size {
            return Err(invalid(
                ENV_LOCAL_RANK,
                &local_rank_text,
                local_rank_accepts,
            ));
        }
        let session_text = require(ENV_SESSION_DIR)?;
        let session_dir = PathBuf::from(&session_text);
        if !session_dir.is_absolute() {
            return Err(invalid(
                ENV_SESSION_DIR,
                &session_text,
                "an absolute path".to_owned(),
            ));
        }
        let node = name(ENV_NODE, require(ENV_NODE)?)?;
        Ok(Some(JobEnv {
            job,
            rank,
            size,
            local_rank,
            local_size,
            session_dir,
            node,
        }))
    }
}

/// Parses a plain decimal `u32` (digits only: no sign, no spaces).
fn parse_u32(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The `log` logger of `btl` processes: one line per record on stderr.
#[derive(Debug)]
struct StderrLogger {
    /// `BTL_RANK` when the process is in a job.
    rank: OnceLock<Option<String>>,
}

static LOGGER: StderrLogger = StderrLogger {
    rank: OnceLock::new(),
};

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = record.level().as_str().to_ascii_lowercase();
        let line = match self.rank.get().and_then(Option::as_deref) {
            Some(rank) => format!("btl[rank {rank}]: {level}: {}\n", record.args()),
            None => format!("btl: {level}: {}\n", record.args()),
        };
        // One write per line so that lines of concurrent threads do not mix;
        // a log line that cannot be written has nowhere else to go.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

/// Installs the `btl` stderr logger for the `log` crate.
///
/// The level comes from `BTL_LOG` (`off`, `error`, `warn`, `info`, `debug`,
/// `trace`; default `warn`; an unknown value is reported and `warn` used).
/// Lines look like `btl: warn: ...`, or `btl[rank 3]: warn: ...` when
/// `BTL_RANK` is set. Calling it again, or after another logger was
/// installed, changes nothing.
pub fn init_logging() {
    let rank = std::env::var(ENV_RANK).ok().filter(|r| !r.is_empty());
    if LOGGER.rank.set(rank).is_err() || log::set_logger(&LOGGER).is_err() {
        return;
    }
    let setting = std::env::var(ENV_LOG).ok();
    let level = match setting.as_deref().map(str::trim) {
        None | Some("") => log::LevelFilter::Warn,
        Some(s) => s.parse().unwrap_or_else(|_| {
            log::set_max_level(log::LevelFilter::Warn);
            log::warn!(
                "{ENV_LOG}={s:?} is not a log level; it accepts off, error, warn, info, debug \
                 or trace (using warn)"
            );
            log::LevelFilter::Warn
        }),
    };
    log::set_max_level(level);
}

/// This machine's name as a job's `BTL_NODE`: the host name with every
/// character outside `[A-Za-z0-9._-]` replaced by `_`, at most 64
/// characters; `localhost` if the host name is empty.
pub fn local_node_name() -> String {
    sanitize_name(&rustix::system::uname().nodename().to_string_lossy())
}

/// Component `P`'s parameters from the environment (its `BTL_<COMP>_*` and
/// `OMPI_MCA_btl_<comp>_*` variables) over the defaults, each value
/// checked, the rules between them not yet ([`Params::verify`]). Variables
/// whose name or value is not UTF-8 are no component's and are passed over.
pub fn params_from_env_unverified<P: Params + Default>() -> Result<P, ParamError> {
    let mut p = P::default();
    for (k, v) in std::env::vars_os() {
        let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else {
            continue;
        };
        p.set_from_env_var(k, v)?;
    }
    Ok(p)
}

/// A duration in seconds from the environment variable `var` (`default`
/// when unset); `None` if it is set but not a positive number of seconds.
pub fn env_secs_opt(var: &str, default: Duration) -> Option<Duration> {
    match std::env::var(var) {
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e9)
            .map(Duration::from_secs_f64),
        Err(_) => Some(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    const GOOD: [(&str, &str); 7] = [
        (ENV_JOB, "123xabc"),
        (ENV_RANK, "2"),
        (ENV_SIZE, "4"),
        (ENV_LOCAL_RANK, "2"),
        (ENV_LOCAL_SIZE, "4"),
        (ENV_SESSION_DIR, "/tmp/btl-1000/123xabc"),
        (ENV_NODE, "node-01.cluster"),
    ];

    fn with(var: &str, value: Option<&str>) -> Result<Option<JobEnv>, JobEnvError> {
        let vars: Vec<(&str, &str)> = GOOD
            .iter()
            .filter(|(k, _)| *k != var)
            .copied()
            .chain(value.map(|v| (var, v)))
            .collect();
        JobEnv::from_vars(env(&vars))
    }

    #[test]
    fn not_in_a_job() {
        assert_eq!(JobEnv::from_vars(|_| None), Ok(None));
        assert_eq!(with(ENV_RANK, None), Ok(None));
    }

    #[test]
    fn complete_job() {
        let j = JobEnv::from_vars(env(&GOOD)).unwrap().unwrap();
        assert_eq!(
            j,
            JobEnv {
                job: "123xabc".into(),
                rank: 2,
                size: 4,
                local_rank: 2,
                local_size: 4,
                session_dir: "/tmp/btl-1000/123xabc".into(),
                node: "node-01.cluster".into(),
            }
        );
    }

    #[test]
    fn missing_variables_are_named() {
        for var in JOB_VARS.into_iter().filter(|v| *v != ENV_RANK) {
            let e = with(var, None).unwrap_err();
            assert_eq!(e, JobEnvError::Missing { var });
            assert!(e.to_string().starts_with(var), "{e}");
        }
    }

    #[test]
    fn invalid_values_are_named() {
        let cases = [
            (ENV_RANK, "4"),
            (ENV_RANK, "-1"),
            (ENV_RANK, "x"),
            (ENV_RANK, " 1"),
            (ENV_SIZE, "0"),
            (ENV_SIZE, "99999999999"),
            (ENV_LOCAL_SIZE, "5"),
            (ENV_LOCAL_SIZE, "0"),
            (ENV_LOCAL_RANK, "4"),
            (ENV_SESSION_DIR, "relative/dir"),
            (ENV_SESSION_DIR, ""),
            (ENV_JOB, ""),
            (ENV_JOB, "a/b"),
            (ENV_NODE, "node 1"),
            (ENV_NODE, &"n".repeat(65)),
        ];
        for (var, value) in cases {
            let e = with(var, Some(value)).unwrap_err();
            let JobEnvError::Invalid {
                var: v, value: got, ..
            } = &e
            else {
                panic!("{var}={value}: {e:?}");
            };
            assert_eq!((*v, got.as_str()), (var, value));
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!("{var}=")) && msg.contains("it accepts"),
                "{msg}"
            );
        }
        let e = with(ENV_RANK, Some("7")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "BTL_RANK=\"7\" is invalid; it accepts an integer between 0 and 3 (BTL_SIZE - 1)"
        );
    }

    #[test]
    fn names() {
        assert!(is_valid_name("a"));
        assert!(is_valid_name("A.b_c-9"));
        assert!(is_valid_name(&"x".repeat(64)));
        assert!(!is_valid_name(&"x".repeat(65)));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("é"));
    }
}
