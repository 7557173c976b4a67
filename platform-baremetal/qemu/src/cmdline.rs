//! The node's configuration: the kernel command line (QEMU's `-append`,
//! from the device tree's `/chosen/bootargs`), space-separated
//! `key=value` words. Untrusted: every value is checked, and an unknown
//! key, a missing one or a bad value is an error naming it.
//!
//! ```text
//! job=ID rank=R size=N ip=A.B.C.D/PREFIX [port=7000]
//! peer=R@A.B.C.D:PORT ...          (every other rank)
//! [max_frame=131072] [timeout=60] [log=info]
//! [run=stress] [messages=200] [max_size=262144] [seed=1]
//! [run=bench] [sizes=8,65536] [quick=1]
//! ```

use core::net::Ipv4Addr;

use crate::{MAX_MESSAGE, PEERS};

/// What the node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Run {
    /// The other side of `btl stress`.
    Stress,
    /// The other side of `btl bench` (as rank 1 of 2).
    Bench,
}

/// The parsed command line.
#[derive(Clone, Debug)]
pub struct Args<'a> {
    /// The job id (what the Linux ranks have in `BTL_JOB`).
    pub job: &'a str,
    /// Our rank.
    pub rank: u32,
    /// Ranks in the job.
    pub size: u32,
    /// Our address.
    pub ip: Ipv4Addr,
    /// Its prefix length.
    pub prefix: u8,
    /// The port we listen on.
    pub port: u16,
    /// Where every other rank listens (index: rank).
    pub peers: [Option<(Ipv4Addr, u16)>; PEERS],
    /// Largest frame payload (`BTL_TCP_MAX_FRAME` of the Linux ranks).
    pub max_frame: u32,
    /// Seconds any wait may take.
    pub timeout_s: u64,
    /// Console log level.
    pub log: log::LevelFilter,
    /// The workload.
    pub run: Run,
    /// `btl stress --messages`.
    pub messages: u64,
    /// `btl stress --max-size`.
    pub max_size: usize,
    /// `btl stress --seed`.
    pub seed: u64,
    /// `btl bench --sizes`.
    pub sizes: heapless::Vec<usize, 16>,
    /// `btl bench --quick`.
    pub quick: bool,
}

/// A command line the node cannot run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArgError<'a> {
    /// A word that is not `key=value`.
    #[error("{0:?} is not key=value")]
    NotKeyValue(&'a str),
    /// A key this node does not know.
    #[error("unknown key {0:?}")]
    UnknownKey(&'a str),
    /// A required key is missing.
    #[error("{0}= is missing")]
    Missing(&'static str),
    /// A value that does not parse or is out of range.
    #[error("{key}={value}: accepts {accepts}")]
    Bad {
        /// The key.
        key: &'a str,
        /// The value.
        value: &'a str,
        /// What is accepted.
        accepts: &'static str,
    },
    /// No address for a rank.
    #[error("no peer={0}@ADDRESS:PORT for rank {0}")]
    NoPeer(u32),
    /// `rank` is not below `size`.
    #[error("rank={rank} is not below size={size}")]
    RankOutside {
        /// The rank given.
        rank: u32,
        /// The job size given.
        size: u32,
    },
}

fn num<'a>(
    key: &'a str,
    value: &'a str,
    min: u64,
    max: u64,
    accepts: &'static str,
) -> Result<u64, ArgError<'a>> {
    value
        .parse::<u64>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or(ArgError::Bad {
            key,
            value,
            accepts,
        })
}

fn endpoint(s: &str) -> Option<(Ipv4Addr, u16)> {
    let (ip, port) = s.split_once(':')?;
    let port = port.parse::<u16>().ok().filter(|&p| p != 0)?;
    let ip = ip.parse::<Ipv4Addr>().ok()?;
    (!ip.is_unspecified() && !ip.is_broadcast()).then_some((ip, port))
}

/// Parses the command line.
pub fn parse(line: &str) -> Result<Args<'_>, ArgError<'_>> {
    let mut job = None;
    let (mut rank, mut size, mut ip) = (None, None, None);
    let mut a = Args {
        job: "",
        rank: 0,
        size: 0,
        ip: Ipv4Addr::UNSPECIFIED,
        prefix: 24,
        port: 7000,
        peers: [None; PEERS],
        max_frame: 131072,
        timeout_s: 60,
        log: log::LevelFilter::Info,
        run: Run::Stress,
        messages: 200,
        max_size: MAX_MESSAGE,
        seed: 1,
        sizes: heapless::Vec::new(),
        quick: false,
    };
    let _ = a.sizes.extend_from_slice(&[8, 65536]);
    for word in line.split_ascii_whitespace() {
        let (key, value) = word.split_once('=').ok_or(ArgError::NotKeyValue(word))?;
        let bad = |accepts| ArgError::Bad {
            key,
            value,
            accepts,
        };
        match key {
            "job" => {
                let ok = !value.is_empty()
                    && value.len() <= 64
                    && value
                        .bytes()
                        .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c));
                if !ok {
                    return Err(bad("1 to 64 letters, digits, '.', '_' or '-'"));
                }
                job = Some(value);
            }
            "rank" => {
                rank =
                    Some(num(key, value, 0, PEERS as u64 - 1, "a rank below the job size")? as u32)
            }
            "size" => size = Some(num(key, value, 2, PEERS as u64, "2 to 4 ranks")? as u32),
            "ip" => {
                let (addr, prefix) = value.split_once('/').ok_or(bad("A.B.C.D/PREFIX"))?;
                let addr = addr
                    .parse::<Ipv4Addr>()
                    .map_err(|_| bad("A.B.C.D/PREFIX"))?;
                let prefix = num(
                    key,
                    prefix,
                    1,
                    32,
                    "A.B.C.D/PREFIX with a prefix of 1 to 32",
                )?;
                if addr.is_unspecified() || addr.is_broadcast() || addr.is_multicast() {
                    return Err(bad("a unicast A.B.C.D/PREFIX"));
                }
                ip = Some(addr);
                a.prefix = prefix as u8;
            }
            "port" => a.port = num(key, value, 1, 65535, "a port from 1 to 65535")? as u16,
            "peer" => {
                let accepts = "RANK@A.B.C.D:PORT";
                let (r, ep) = value.split_once('@').ok_or(bad(accepts))?;
                let r = num(key, r, 0, PEERS as u64 - 1, accepts)? as usize;
                a.peers[r] = Some(endpoint(ep).ok_or(bad(accepts))?);
            }
            "max_frame" => {
                a.max_frame = num(
                    key,
                    value,
                    1024,
                    MAX_MESSAGE as u64,
                    "1024 to the node's message size (262144)",
                )? as u32
            }
            "timeout" => a.timeout_s = num(key, value, 1, 3600, "1 to 3600 seconds")?,
            "log" => {
                a.log = match value {
                    "error" => log::LevelFilter::Error,
                    "warn" => log::LevelFilter::Warn,
                    "info" => log::LevelFilter::Info,
                    "debug" => log::LevelFilter::Debug,
                    _ => return Err(bad("error, warn, info or debug")),
                }
            }
            "run" => {
                a.run = match value {
                    "stress" => Run::Stress,
                    "bench" => Run::Bench,
                    _ => return Err(bad("stress or bench")),
                }
            }
            "messages" => a.messages = num(key, value, 0, 100_000_000, "0 to 100000000")?,
            "max_size" => {
                a.max_size = num(
                    key,
                    value,
                    0,
                    MAX_MESSAGE as u64,
                    "0 to the node's largest message (262144)",
                )? as usize
            }
            "seed" => a.seed = num(key, value, 0, u64::MAX, "an unsigned 64-bit integer")?,
            "sizes" => {
                a.sizes.clear();
                for s in value.split(',') {
                    let n = num(
                        key,
                        s,
                        0,
                        MAX_MESSAGE as u64,
                        "sizes from 0 to 262144, comma-separated (at most 16)",
                    )?;
                    a.sizes
                        .push(n as usize)
                        .map_err(|_| bad("at most 16 sizes"))?;
                }
            }
            "quick" => a.quick = num(key, value, 0, 1, "0 or 1")? == 1,
            _ => return Err(ArgError::UnknownKey(key)),
        }
    }
    a.job = job.ok_or(ArgError::Missing("job"))?;
    a.rank = rank.ok_or(ArgError::Missing("rank"))?;
    a.size = size.ok_or(ArgError::Missing("size"))?;
    a.ip = ip.ok_or(ArgError::Missing("ip"))?;
    if a.rank >= a.size {
        return Err(ArgError::RankOutside {
            rank: a.rank,
            size: a.size,
        });
    }
    for r in (0..a.size).filter(|&r| r != a.rank) {
        if a.peers[r as usize].is_none() {
            return Err(ArgError::NoPeer(r));
        }
    }
    if a.run == Run::Bench && a.size != 2 {
        return Err(ArgError::Bad {
            key: "run",
            value: "bench",
            accepts: "stress, or bench in a job of 2 ranks",
        });
    }
    Ok(a)
}
