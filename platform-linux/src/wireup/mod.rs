//! Wire-up on Linux: where a rank learns who it is (job, rank, size, node)
//! and how it exchanges small records with its peers (the core's
//! [`Wireup`] trait).
//!
//! # Sources, and how one is picked
//!
//! | `BTL_WIREUP` | source |
//! |---|---|
//! | `kv://HOST:PORT` | the key/value service of a launcher (`btl run` sets this) |
//! | `tcp://HOST:PORT` | a user-given rendezvous: rank 0 runs the key/value service on `HOST:PORT` (one of its own addresses), every rank connects to it — as `torch.distributed` does with `MASTER_ADDR` |
//! | `pmix` | PMIx, as `mpirun`/`prterun` and `srun --mpi=pmix` provide it ([`pmix`]) |
//! | `dir` | records in the job's session directory (`BTL_SESSION_DIR`), for ranks sharing a file system |
//! | unset | PMIx when the environment has `PMIX_RANK`; else `dir` when `BTL_RANK` and `BTL_SESSION_DIR` are set; else an error saying what to do |
//!
//! With `kv://`, `tcp://` and `dir`, the rank and size come from
//! `BTL_RANK`/`BTL_SIZE`, or else Slurm's `SLURM_PROCID`/`SLURM_NTASKS`;
//! the job identifier from `BTL_JOB`, else `SLURM_JOB_ID`.`SLURM_STEP_ID`,
//! else one derived from the rendezvous address; the node from `BTL_NODE`,
//! else the host name. With PMIx all four come from PMIx.
//!
//! Every wait is bounded by `BTL_WIREUP_TIMEOUT` (seconds, default 60); a
//! rank that gives up names the ranks it waited for.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use btl_core::wireup::{valid_key, Wireup, MAX_VALUE};

mod dir;
pub mod kv;
pub mod pmix;

pub use dir::SessionWireup;

/// The variable choosing the wire-up source.
pub const ENV_WIREUP: &str = "BTL_WIREUP";
/// Timeout of wire-up waits, in seconds.
pub const ENV_WIREUP_TIMEOUT: &str = "BTL_WIREUP_TIMEOUT";
/// Default of [`ENV_WIREUP_TIMEOUT`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Wire-up failed.
#[derive(Debug, thiserror::Error)]
pub enum WireupError {
    /// A key is not 1–64 characters of `[A-Za-z0-9._-]`.
    #[error("wire-up key {key:?} is not [A-Za-z0-9._-]{{1,64}}")]
    BadKey {
        /// The key.
        key: String,
    },
    /// An environment variable is malformed.
    #[error("{var}={value:?} is invalid; it accepts {accepts}")]
    Config {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it accepts.
        accepts: String,
    },
    /// No wire-up source could be found.
    #[error(
        "no wire-up source: run under `btl run`, under a PMIx launcher (mpirun, prterun, \
         srun --mpi=pmix), or set {ENV_WIREUP}=tcp://HOST:PORT with BTL_RANK and BTL_SIZE \
         (or Slurm's SLURM_PROCID and SLURM_NTASKS)"
    )]
    NoSource,
    /// Writing our record failed.
    #[error("cannot publish wire-up record {}: {source}", .path.display())]
    Publish {
        /// The record's file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Reading a record failed (other than "not there yet").
    #[error("cannot read wire-up record {}: {source}", .path.display())]
    Read {
        /// The record's file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A record is larger than the limit ([`MAX_VALUE`], or the caller's
    /// buffer).
    #[error("rank {rank}'s wire-up record {key:?} is larger than {MAX_VALUE} bytes")]
    TooLarge {
        /// Whose record.
        rank: u32,
        /// Which.
        key: String,
    },
    /// These ranks did not reach the fence (or publish `key`) in time.
    #[error(
        "wire-up: gave up waiting for {what} after {:.1} s; {}",
        .waited.as_secs_f64(),
        MissingRanks::new(.missing, *.count)
    )]
    Timeout {
        /// What was waited for.
        what: String,
        /// The ranks waited for (possibly only the first of them).
        missing: Vec<u32>,
        /// How many ranks were missing in all.
        count: u32,
        /// How long it waited.
        waited: Duration,
    },
    /// The key/value service cannot be reached or its connection failed.
    #[error("wire-up service at {addr}: cannot {what}: {source}")]
    Service {
        /// The service's address.
        addr: SocketAddr,
        /// What was being done.
        what: &'static str,
        /// Why.
        source: io::Error,
    },
    /// The key/value service (or a client) broke the protocol.
    #[error("wire-up service at {addr} broke the protocol: {error}")]
    Protocol {
        /// The other side.
        addr: SocketAddr,
        /// How.
        error: btl_core::wireup::kv::KvError,
    },
    /// The key/value service refused a request.
    #[error("wire-up service at {addr} refused ({code}): {message}")]
    Refused {
        /// The service's address.
        addr: SocketAddr,
        /// Why.
        code: btl_core::wireup::kv::RefuseCode,
        /// The service's explanation.
        message: String,
    },
    /// PMIx is unavailable or failed.
    #[error("PMIx: {0}")]
    Pmix(String),
    /// An external runtime's exchange (the C ABI's `btl_open` /
    /// `btl_connect`) failed or handed back malformed records.
    #[error("the runtime's address exchange: {0}")]
    External(String),
}

/// The missing ranks of a [`WireupError::Timeout`], as its message says
/// them.
struct MissingRanks<'a> {
    missing: &'a [u32],
    count: u32,
}

impl<'a> MissingRanks<'a> {
    fn new(missing: &'a [u32], count: u32) -> Self {
        Self { missing, count }
    }
}

impl fmt::Display for MissingRanks<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self { missing, count } = *self;
        if missing.is_empty() {
            write!(f, "{count} rank(s) missing")
        } else if count as usize > missing.len() {
            write!(f, "{count} ranks missing, among them {missing:?}")
        } else {
            write!(f, "waited for ranks {missing:?}")
        }
    }
}

/// Who this process is in its job, as its wire-up source says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The job's identifier (`[A-Za-z0-9._-]{1,64}`).
    pub job: String,
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub size: u32,
    /// This node's name (`[A-Za-z0-9._-]{1,64}`): ranks with the same node
    /// name share memory.
    pub node: String,
}

/// A wire-up source of this platform.
pub type DynWireup = Box<dyn Wireup<Error = WireupError> + Send>;

/// Reads `rank`'s value of `key` into a new vector (`None` if never
/// published).
pub fn get_vec(
    w: &mut dyn Wireup<Error = WireupError>,
    rank: u32,
    key: &str,
) -> Result<Option<Vec<u8>>, WireupError> {
    let mut buf = vec![0u8; MAX_VALUE];
    let n = w.get(rank, key, &mut buf)?;
    Ok(n.map(|n| {
        buf.truncate(n);
        buf
    }))
}

pub(crate) fn check_key(key: &str) -> Result<(), WireupError> {
    if valid_key(key) {
        Ok(())
    } else {
        Err(WireupError::BadKey { key: key.into() })
    }
}

/// The [`Wireup::rank`] and [`Wireup::size`] of a source that keeps them
/// in fields `rank` and `size`, written inside its `impl Wireup`:
///
/// ```
/// use btl_linux::wireup::{Wireup, WireupError};
///
/// struct Fixed {
///     rank: u32,
///     size: u32,
/// }
///
/// impl Wireup for Fixed {
///     type Error = WireupError;
///     btl_linux::wireup_rank_size!();
///
///     fn put(&mut self, _: &str, _: &[u8]) -> Result<(), WireupError> {
///         Ok(())
///     }
///
///     fn fence(&mut self) -> Result<(), WireupError> {
///         Ok(())
///     }
///
///     fn get(&mut self, _: u32, _: &str, _: &mut [u8]) -> Result<Option<usize>, WireupError> {
///         Ok(None)
///     }
/// }
///
/// let w = Fixed { rank: 1, size: 4 };
/// assert_eq!((w.rank(), w.size()), (1, 4));
/// ```
#[macro_export]
macro_rules! wireup_rank_size {
    () => {
        fn rank(&self) -> u32 {
            self.rank
        }

        fn size(&self) -> u32 {
            self.size
        }
    };
}

/// What every source checks before publishing: the key, and the value's
/// size ([`MAX_VALUE`]).
pub fn check_put(rank: u32, key: &str, value: &[u8]) -> Result<(), WireupError> {
    check_key(key)?;
    if value.len() > MAX_VALUE {
        return Err(WireupError::TooLarge {
            rank,
            key: key.into(),
        });
    }
    Ok(())
}

/// Copies rank `rank`'s value of `key` (if any) into `out`, as
/// [`Wireup::get`] answers: a value longer than `out` is an error.
pub fn copy_value(
    rank: u32,
    key: &str,
    value: Option<&[u8]>,
    out: &mut [u8],
) -> Result<Option<usize>, WireupError> {
    match value {
        None => Ok(None),
        Some(v) if v.len() > out.len() => Err(WireupError::TooLarge {
            rank,
            key: key.into(),
        }),
        Some(v) => {
            out[..v.len()].copy_from_slice(v);
            Ok(Some(v.len()))
        }
    }
}

/// The wire-up timeout from [`ENV_WIREUP_TIMEOUT`].
pub fn timeout_from_env() -> Result<Duration, WireupError> {
    crate::job::env_secs_opt(ENV_WIREUP_TIMEOUT, DEFAULT_TIMEOUT).ok_or_else(|| {
        WireupError::Config {
            var: ENV_WIREUP_TIMEOUT,
            value: std::env::var(ENV_WIREUP_TIMEOUT).unwrap_or_default(),
            accepts: "a positive number of seconds".into(),
        }
    })
}

/// Which source [`open`] uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A key/value service run by someone else (a launcher).
    Kv(String),
    /// A user-given rendezvous: rank 0 serves, every rank connects.
    Rendezvous(String),
    /// PMIx.
    Pmix,
    /// The session directory.
    Dir,
}

impl Source {
    /// The source the environment asks for (see the module docs).
    pub fn from_env() -> Result<Source, WireupError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        match var(ENV_WIREUP) {
            Some(v) => Self::parse(&v),
            None if var("PMIX_RANK").is_some() => Ok(Source::Pmix),
            None if var(crate::job::ENV_RANK).is_some()
                && var(crate::job::ENV_SESSION_DIR).is_some() =>
            {
                Ok(Source::Dir)
            }
            None => Err(WireupError::NoSource),
        }
    }

    /// Parses a `BTL_WIREUP` value.
    pub fn parse(v: &str) -> Result<Source, WireupError> {
        let bad = || WireupError::Config {
            var: ENV_WIREUP,
            value: v.into(),
            accepts: "kv://HOST:PORT, tcp://HOST:PORT, pmix or dir".into(),
        };
        if let Some(a) = v.strip_prefix("kv://") {
            (!a.is_empty())
                .then(|| Source::Kv(a.into()))
                .ok_or_else(bad)
        } else if let Some(a) = v.strip_prefix("tcp://") {
            (!a.is_empty())
                .then(|| Source::Rendezvous(a.into()))
                .ok_or_else(bad)
        } else {
            match v {
                "pmix" => Ok(Source::Pmix),
                "dir" => Ok(Source::Dir),
                _ => Err(bad()),
            }
        }
    }
}

/// Rank, size, job and node from `BTL_*` (or Slurm's) variables, for the
/// sources that do not provide them.
pub fn identity_from_env(rendezvous: Option<&str>) -> Result<Identity, WireupError> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let num = |name: &'static str, accepts: &str| -> Result<Option<u32>, WireupError> {
        match var(name) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse::<u32>()
                .map(Some)
                .map_err(|_| WireupError::Config {
                    var: name,
                    value: v,
                    accepts: accepts.into(),
                }),
        }
    };
    let (rank, size, rank_var, size_var) = match (
        num(crate::job::ENV_RANK, "an integer")?,
        num(crate::job::ENV_SIZE, "an integer above 0")?,
    ) {
        (Some(r), Some(s)) => (r, s, crate::job::ENV_RANK, crate::job::ENV_SIZE),
        _ => match (
            num("SLURM_PROCID", "an integer")?,
            num("SLURM_NTASKS", "an integer above 0")?,
        ) {
            (Some(r), Some(s)) => (r, s, "SLURM_PROCID", "SLURM_NTASKS"),
            _ => return Err(WireupError::NoSource),
        },
    };
    check_rank(rank, size, rank_var, size_var)?;
    // A job identifier or node name from `name`, if set; refused unless it
    // is a valid name.
    let valid_name = |name: &'static str| -> Result<Option<String>, WireupError> {
        match var(name) {
            Some(v) if crate::job::is_valid_name(&v) => Ok(Some(v)),
            Some(v) => Err(WireupError::Config {
                var: name,
                value: v,
                accepts: crate::job::ACCEPTS_NAME.into(),
            }),
            None => Ok(None),
        }
    };
    let job = match valid_name(crate::job::ENV_JOB)? {
        Some(j) => j,
        None => match (var("SLURM_JOB_ID"), var("SLURM_STEP_ID")) {
            (Some(j), s) => {
                crate::job::sanitize_name(&format!("slurm-{j}.{}", s.unwrap_or_else(|| "0".into())))
            }
            (None, _) => {
                crate::job::sanitize_name(&format!("rdv-{}", rendezvous.unwrap_or("local")))
            }
        },
    };
    let node = valid_name(crate::job::ENV_NODE)?.unwrap_or_else(crate::job::local_node_name);
    Ok(Identity {
        job,
        rank,
        size,
        node,
    })
}

fn check_rank(
    rank: u32,
    size: u32,
    rank_var: &'static str,
    size_var: &'static str,
) -> Result<(), WireupError> {
    if size == 0 {
        return Err(WireupError::Config {
            var: size_var,
            value: size.to_string(),
            accepts: "an integer above 0".into(),
        });
    }
    if rank >= size {
        return Err(WireupError::Config {
            var: rank_var,
            value: rank.to_string(),
            accepts: format!("an integer below {size_var} ({size})"),
        });
    }
    Ok(())
}

/// Opens the wire-up source the environment names (see the module docs).
pub fn open() -> Result<(Identity, DynWireup), WireupError> {
    let timeout = timeout_from_env()?;
    match Source::from_env()? {
        Source::Pmix => {
            let p = pmix::Pmix::init(timeout)?;
            Ok((p.identity().clone(), Box::new(p)))
        }
        Source::Dir => {
            let id = identity_from_env(None)?;
            let dir = std::env::var_os(crate::job::ENV_SESSION_DIR)
                .map(PathBuf::from)
                .ok_or(WireupError::Config {
                    var: crate::job::ENV_SESSION_DIR,
                    value: String::new(),
                    accepts: "the job's session directory (set by btl run)".into(),
                })?;
            let w = SessionWireup::new(&dir, id.rank, id.size).with_timeout(timeout);
            Ok((id, Box::new(w)))
        }
        Source::Kv(addr) => {
            let id = identity_from_env(Some(&addr))?;
            let addr = kv::resolve(&addr)?;
            let c = kv::KvWireup::connect(addr, &id, timeout)?;
            Ok((id, Box::new(c)))
        }
        Source::Rendezvous(addr) => {
            let id = identity_from_env(Some(&addr))?;
            let sa = kv::resolve(&addr)?;
            let server = if id.rank == 0 {
                Some(kv::KvServer::start(sa, &id.job, id.size).map_err(|source| {
                    WireupError::Service {
                        addr: sa,
                        what: "listen (rank 0 runs the rendezvous service)",
                        source,
                    }
                })?)
            } else {
                None
            };
            let c = kv::KvWireup::connect(sa, &id, timeout)?.serving(server);
            Ok((id, Box::new(c)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse() {
        assert_eq!(
            Source::parse("kv://127.0.0.1:5000").unwrap(),
            Source::Kv("127.0.0.1:5000".into())
        );
        assert_eq!(
            Source::parse("tcp://head:29500").unwrap(),
            Source::Rendezvous("head:29500".into())
        );
        assert_eq!(Source::parse("pmix").unwrap(), Source::Pmix);
        assert_eq!(Source::parse("dir").unwrap(), Source::Dir);
        for bad in ["", "tcp://", "http://x:1", "PMIX"] {
            let e = Source::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("BTL_WIREUP") && e.contains("tcp://HOST:PORT"),
                "{e}"
            );
        }
    }

    #[test]
    fn timeouts_name_ranks() {
        let e = WireupError::Timeout {
            what: "the fence".into(),
            missing: vec![3, 5],
            count: 2,
            waited: Duration::from_secs(2),
        };
        assert!(e.to_string().contains("waited for ranks [3, 5]"), "{e}");
        let e = WireupError::Timeout {
            what: "the fence".into(),
            missing: vec![3],
            count: 9,
            waited: Duration::from_secs(2),
        };
        assert!(
            e.to_string().contains("9 ranks missing, among them [3]"),
            "{e}"
        );
    }

    #[test]
    fn timeout_messages_exact() {
        let timeout = |missing: Vec<u32>, count| WireupError::Timeout {
            what: "the fence".into(),
            missing,
            count,
            waited: Duration::from_millis(2_000),
        };
        assert_eq!(
            timeout(vec![], 4).to_string(),
            "wire-up: gave up waiting for the fence after 2.0 s; 4 rank(s) missing"
        );
        assert_eq!(
            timeout(vec![3], 9).to_string(),
            "wire-up: gave up waiting for the fence after 2.0 s; 9 ranks missing, among them [3]"
        );
        assert_eq!(
            timeout(vec![3, 5], 2).to_string(),
            "wire-up: gave up waiting for the fence after 2.0 s; waited for ranks [3, 5]"
        );
    }
}
