//! `btl bench`: OSU-style ping-pong latency and windowed bandwidth between
//! two ranks.
//!
//! - latency: half the round trip of a ping-pong, averaged over many;
//! - bandwidth: 64 messages in flight, then a one-byte acknowledgement from
//!   the receiver, repeated; bytes moved over time (MB/s = 10^6 bytes/s).
//!
//! Outside a job, `btl bench` launches itself as 2 ranks pinned to
//! different cores (through [`crate::cli::launcher`]) and prints rank 0's
//! results unprefixed.

use std::ffi::OsString;
use std::io::Write;
use std::time::Instant;

use crate::cli::launcher::{launch, LaunchSpec};
use crate::cli::transport::{BoxError, Transport};
use crate::world::{Choice, Event, Flow, Outbox, World};

/// Sizes measured by default (bytes).
pub const DEFAULT_SIZES: [usize; 7] = [8, 64, 1024, 4096, 65536, 1_048_576, 4_194_304];
/// Messages in flight in the bandwidth test.
pub const WINDOW: u64 = 64;

const TAG_DATA: u8 = 1;
const TAG_ACK: u8 = 2;

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A table for people.
    Human,
    /// One JSON object per size.
    Json,
    /// `size=8 latency_us=0.31 bandwidth_MBps=120.5`, what the anchor
    /// harness reads.
    Osu,
}

/// Options of `btl bench`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BenchOpts {
    /// Transport to measure: `sm` or `tcp`.
    pub transport: String,
    /// Message sizes.
    pub sizes: Vec<usize>,
    /// Output format.
    pub format: Format,
    /// Fewer iterations (for tests and smoke runs).
    pub quick: bool,
}

impl Default for BenchOpts {
    fn default() -> Self {
        Self {
            transport: "auto".into(),
            sizes: DEFAULT_SIZES.to_vec(),
            format: Format::Human,
            quick: false,
        }
    }
}

/// Usage of `btl bench`.
pub const USAGE: &str = "usage: btl bench [--transport auto|sm|tcp] [--sizes 8,64,...] [--json | --format human|json|osu] [--quick]";

/// Parses `btl bench` arguments (after the subcommand name).
pub fn parse_args(args: &[OsString]) -> Result<BenchOpts, String> {
    let mut o = BenchOpts::default();
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--transport" => {
                let t = value("--transport")?;
                if Choice::parse(&t).is_none() {
                    return Err(format!("--transport {t}: accepts auto, sm or tcp"));
                }
                o.transport = t;
            }
            "--sizes" => {
                let v = value("--sizes")?;
                o.sizes = v
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse::<usize>()
                            .ok()
                            .filter(|&n| n <= 1 << 30)
                            .ok_or_else(|| {
                                format!("--sizes: {s:?} is not a size in bytes (0 to 1073741824)")
                            })
                    })
                    .collect::<Result<_, _>>()?;
                if o.sizes.is_empty() {
                    return Err("--sizes needs at least one size".into());
                }
            }
            "--json" => o.format = Format::Json,
            "--format" => {
                o.format = match value("--format")?.as_str() {
                    "human" => Format::Human,
                    "json" => Format::Json,
                    "osu" => Format::Osu,
                    f => return Err(format!("--format {f}: accepts human, json or osu")),
                }
            }
            "--quick" => o.quick = true,
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(o)
}

/// One measured size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// Message size in bytes.
    pub size: usize,
    /// Half round trip, microseconds.
    pub latency_us: f64,
    /// Windowed bandwidth, 10^6 bytes per second.
    pub bandwidth_mbps: f64,
}

impl Row {
    /// The row in `format` (no header; see [`print_header`]).
    pub fn render(&self, transport: &str, format: Format) -> String {
        match format {
            Format::Json => format!(
                "{{\"transport\":\"{transport}\",\"size\":{},\"latency_us\":{:.2},\"bandwidth_MBps\":{:.1}}}",
                self.size, self.latency_us, self.bandwidth_mbps
            ),
            Format::Osu => format!(
                "size={} latency_us={:.2} bandwidth_MBps={:.1}",
                self.size, self.latency_us, self.bandwidth_mbps
            ),
            Format::Human => format!(
                "{:>10} {:>14.2} {:>16.1}",
                self.size, self.latency_us, self.bandwidth_mbps
            ),
        }
    }
}

/// The human table's header.
pub fn print_header(out: &mut impl Write, t: &dyn Transport) -> std::io::Result<()> {
    writeln!(out, "btl bench: {}", t.describe())?;
    writeln!(
        out,
        "{:>10} {:>14} {:>16}",
        "size", "latency_us", "bandwidth_MBps"
    )
}

fn iterations(size: usize, quick: bool) -> (u64, u64) {
    // (ping-pong iterations, bandwidth windows)
    let (lat, bw) = match size {
        0..=4096 => (20_000, 400),
        4097..=65_536 => (4_000, 100),
        65_537..=1_048_576 => (400, 20),
        _ => (100, 6),
    };
    if quick {
        ((lat / 20).max(4), (bw / 10).max(2))
    } else {
        (lat, bw)
    }
}

/// Runs the benchmark inside a job of exactly two local ranks; rank 0
/// prints. Returns the rows (rank 0) or nothing (rank 1).
pub fn run(opts: &BenchOpts, out: &mut impl Write) -> Result<Vec<Row>, BoxError> {
    let choice = Choice::parse(&opts.transport).ok_or("--transport: accepts auto, sm or tcp")?;
    let mut world = World::init(choice)?;
    if world.size() != 2 {
        return Err("btl bench runs on exactly 2 ranks".into());
    }
    run_on(&mut world, opts, out)
}

/// Runs the benchmark as one of two ranks over an open transport (any
/// [`Transport`]: btl-baremetal's hosted smoltcp node runs it this way).
pub fn run_on(
    sm: &mut dyn Transport,
    opts: &BenchOpts,
    out: &mut impl Write,
) -> Result<Vec<Row>, BoxError> {
    if sm.size() != 2 {
        return Err("btl bench runs on exactly 2 ranks".into());
    }
    let me = sm.rank();
    let peer = 1 - me;
    // One message of `tag` from the peer.
    let one = |tag: u8| {
        move |_: &mut Outbox, ev: Event<'_>| match ev {
            Event::Message { tag: t, .. } if t == tag => Flow::Done,
            _ => Flow::Continue,
        }
    };
    if me == 0 && opts.format == Format::Human {
        let _ = print_header(out, &*sm);
    }
    let mut rows = Vec::new();
    for &size in &opts.sizes {
        let buf = vec![0xa5u8; size];
        let (iters, windows) = iterations(size, opts.quick);
        let warm = (iters / 10).max(2);

        // Latency.
        sm.barrier()?;
        let mut t0 = Instant::now();
        for i in 0..warm + iters {
            if i == warm {
                t0 = Instant::now();
            }
            if me == 0 {
                sm.send(peer, TAG_DATA, &buf)?;
                sm.drive("the pong", Some(peer), &mut one(TAG_DATA))?;
            } else {
                sm.drive("the ping", Some(peer), &mut one(TAG_DATA))?;
                sm.send(peer, TAG_DATA, &buf)?;
            }
        }
        let latency_us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0;

        // Bandwidth.
        sm.barrier()?;
        let t0 = Instant::now();
        for _ in 0..windows {
            if me == 0 {
                for _ in 0..WINDOW {
                    sm.send(peer, TAG_DATA, &buf)?;
                }
                sm.drive(
                    "the window's acknowledgement",
                    Some(peer),
                    &mut one(TAG_ACK),
                )?;
            } else {
                let mut got = 0;
                sm.drive("a window of messages", Some(peer), &mut |_, ev| {
                    if let Event::Message { tag: TAG_DATA, .. } = ev {
                        got += 1;
                    }
                    if got >= WINDOW {
                        Flow::Done
                    } else {
                        Flow::Continue
                    }
                })?;
                sm.send(peer, TAG_ACK, &[1])?;
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        let bandwidth_mbps = (size as f64 * (WINDOW * windows) as f64) / secs / 1e6;
        let row = Row {
            size,
            latency_us,
            bandwidth_mbps,
        };
        if me == 0 {
            let _ = writeln!(out, "{}", row.render(sm.name(), opts.format));
            let _ = out.flush();
            rows.push(row);
        }
    }
    sm.barrier()?;
    sm.flush()?;
    Ok(rows)
}

/// `btl bench ARGS`: inside a job (BTL_RANK set) runs as one rank; outside,
/// launches itself as the ranks of a new job on this machine. Returns the
/// exit status.
pub fn cmd(args: &[OsString]) -> i32 {
    let opts = match parse_args(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("btl bench: {e}\n{USAGE}");
            return 2;
        }
    };
    match crate::world::in_job() {
        Err(e) => {
            eprintln!("btl bench: {e}");
            1
        }
        Ok(false) => {
            let exe = match std::env::current_exe() {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("btl bench: cannot find my own executable: {e}");
                    return 1;
                }
            };
            let mut spec = LaunchSpec::new(2, exe);
            spec.args = std::iter::once(OsString::from("bench"))
                .chain(args.iter().cloned())
                .collect();
            spec.bind_cores = true;
            spec.tag_output = false;
            match launch(&spec) {
                Ok(report) => report.status,
                Err(e) => {
                    eprintln!("btl bench: {e}");
                    1
                }
            }
        }
        Ok(true) => {
            let mut out = std::io::stdout().lock();
            match run(&opts, &mut out) {
                Ok(r) => {
                    let _ = r;
                    0
                }
                Err(e) => {
                    let rank = crate::world::rank_hint();
                    eprintln!("btl bench: rank {rank}: {e}");
                    1
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn args_parse_and_reject() {
        let o = parse_args(&os(&["--sizes", "8,4096", "--json"])).unwrap();
        assert_eq!(o.sizes, vec![8, 4096]);
        assert_eq!(o.format, Format::Json);
        assert_eq!(
            parse_args(&os(&["--format", "osu"])).unwrap().format,
            Format::Osu
        );
        assert!(parse_args(&os(&["--sizes", "8,x"]))
            .unwrap_err()
            .contains("\"x\""));
        assert_eq!(
            parse_args(&os(&["--transport", "tcp"])).unwrap().transport,
            "tcp"
        );
        assert!(parse_args(&os(&["--transport", "udp"])).is_err());
        assert!(parse_args(&os(&["--sizes"])).is_err());
        assert!(parse_args(&os(&["--bogus"])).is_err());
    }

    #[test]
    fn row_formats_are_exact() {
        let r = Row {
            size: 8,
            latency_us: 0.3149,
            bandwidth_mbps: 120.46,
        };
        assert_eq!(
            r.render("sm", Format::Json),
            r#"{"transport":"sm","size":8,"latency_us":0.31,"bandwidth_MBps":120.5}"#
        );
        assert_eq!(
            r.render("sm", Format::Osu),
            "size=8 latency_us=0.31 bandwidth_MBps=120.5"
        );
    }
}
