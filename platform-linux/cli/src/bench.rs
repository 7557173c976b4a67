//! `btl bench`: OSU-style ping-pong latency and windowed bandwidth between
//! two ranks.
//!
//! - latency: half the round trip of a ping-pong, averaged over many
//!   (`--iterations`, by default 20,000 round trips up to 4 KiB down to 100
//!   at 4 MiB), after a tenth as many untimed (at least 2);
//! - bandwidth: `--window` messages (64) in flight, then a one-byte
//!   acknowledgement from the receiver, repeated; bytes moved over time
//!   (MB/s = 10^6 bytes/s), after untimed warm-up windows (a tenth as
//!   many, at least 1: connections, page faults of the receive buffers and
//!   the kernel's socket buffers have grown before the clock starts).
//!
//! Outside a job, `btl bench` launches itself as 2 ranks pinned to
//! different cores (through [`crate::launcher`]) and prints rank 0's
//! results unprefixed; with several transports (`--transport sm,tcp`) it
//! launches one such job per transport, one after the other. Rank 0 also
//! writes its rows to the file named by [`ENV_ROWS`], which is how the
//! launching process collects them for `--plot` ([`crate::plot`]).
//! Inside a job (another launcher started the ranks) one transport is
//! measured per run, and rank 0 draws the plot.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::launcher::{launch, LaunchSpec};
use crate::plot::{self, Series};
use crate::transport::{BoxError, Transport};
use btl_core::workload::{TAG_ACK, TAG_DATA};
use btl_linux::world::{Choice, Event, Flow, Outbox, World};

/// Sizes measured by default (bytes).
pub const DEFAULT_SIZES: [usize; 7] = [8, 64, 1024, 4096, 65536, 1_048_576, 4_194_304];
/// Messages in flight in the bandwidth test, by default.
pub const WINDOW: u64 = 64;
/// Largest `--window`: the transports' default bound on messages waiting
/// in user space for one peer (`queue_messages`).
pub const MAX_WINDOW: u64 = 16384;
/// Largest `--iterations`.
pub const MAX_ITERATIONS: u64 = 100_000_000;
/// Where rank 0 writes its rows (one `transport size latency_us
/// bandwidth_MBps` line each, tab-separated, full precision) besides
/// printing them: set by `btl bench` for the ranks it launches.
pub const ENV_ROWS: &str = "BTL_BENCH_ROWS";

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A table for people.
    Human,
    /// One JSON object per size.
    Json,
    /// `size=8 latency_us=0.315 bandwidth_MBps=120.5`, what the anchor
    /// harness reads (three decimals, as its MPI ping-pong prints: at
    /// 0.1 µs two would round by up to 5 %).
    Osu,
}

/// A page, for `--buffer-offset`.
const PAGE: usize = 4096;

/// Options of `btl bench`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BenchOpts {
    /// Transports to measure, one after the other: `auto`, `sm` or `tcp`
    /// (a hosted transport such as btl-baremetal's names itself here).
    pub transports: Vec<String>,
    /// Message sizes.
    pub sizes: Vec<usize>,
    /// Output format.
    pub format: Format,
    /// Fewer iterations (for tests and smoke runs).
    pub quick: bool,
    /// Timed round trips of the latency test and timed messages of the
    /// bandwidth test (rounded up to whole windows), for every size;
    /// `None`: by size (see [`iterations`]).
    pub iterations: Option<u64>,
    /// Messages in flight in the bandwidth test.
    pub window: u64,
    /// Where in a page the message buffers start (bytes, below 4096);
    /// `None`: wherever the allocator puts them.
    pub buffer_offset: Option<usize>,
    /// Draw latency and bandwidth against size into this SVG file.
    pub plot: Option<PathBuf>,
    /// The anchor harness's raw results to draw beside ours.
    pub compare: Option<PathBuf>,
    /// Only these rows of the comparison file (empty: all).
    pub compare_ids: Vec<String>,
}

impl Default for BenchOpts {
    fn default() -> Self {
        Self {
            transports: vec!["auto".into()],
            sizes: DEFAULT_SIZES.to_vec(),
            format: Format::Human,
            quick: false,
            iterations: None,
            window: WINDOW,
            buffer_offset: None,
            plot: None,
            compare: None,
            compare_ids: Vec::new(),
        }
    }
}

/// Usage of `btl bench`.
pub const USAGE: &str = "\
usage: btl bench [--transport auto|sm|tcp[,...]] [--sizes 8,64,...]
                 [--iterations N] [--window W] [--buffer-offset B] [--quick]
                 [--json | --format human|json|osu]
                 [--plot FILE.svg [--compare results_raw.tsv [--compare-ids ID,...]]]
  --transport T,...   transports to measure, one job each (default auto)
  --sizes S,...       message sizes in bytes (default 8,64,1024,4096,65536,1048576,4194304)
  --iterations N      timed round trips (latency) and messages (bandwidth)
                      per size, 1 to 100000000 (default: by size, 20000 to 100)
  --window W          messages in flight in the bandwidth test, 1 to 16384 (default 64)
  --buffer-offset B   start the message buffers B bytes into a page, 0 to 4095
                      (default: where the allocator puts them); shows how a
                      transport copes with a misaligned user buffer
  --quick             a twentieth of the default iterations (smoke runs;
                      --iterations, if given, wins)
  --plot FILE.svg     draw latency (log-log) and bandwidth against size
  --compare FILE      add the peers' curves from ../shared/anchors' results_raw.tsv
  --compare-ids L     only these rows of that file (e.g. ompi_tcp,ucp_tcp)";

/// Parses `btl bench` arguments (after the subcommand name). Every error
/// names the option and says what it accepts.
pub fn parse_args(args: &[OsString]) -> Result<BenchOpts, String> {
    let mut o = BenchOpts::default();
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    let count = |name: &str, v: &str, max: u64| {
        v.trim()
            .parse::<u64>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| format!("{name} {v:?}: accepts an integer from 1 to {max}"))
    };
    let path = |name: &str, v: String| {
        if v.is_empty() {
            Err(format!("{name} needs a file name"))
        } else {
            Ok(PathBuf::from(v))
        }
    };
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--transport" => {
                let v = value("--transport")?;
                let mut ts: Vec<String> = Vec::new();
                for t in v.split(',') {
                    let t = t.trim();
                    if Choice::parse(t).is_none() {
                        return Err(format!(
                            "--transport {v}: {t:?} is not a transport (accepts auto, sm or \
                             tcp, or several separated by commas)"
                        ));
                    }
                    if ts.iter().any(|x| x == t) {
                        return Err(format!("--transport {v}: {t} is given twice"));
                    }
                    ts.push(t.to_owned());
                }
                o.transports = ts;
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
            "--iterations" => {
                o.iterations = Some(count(
                    "--iterations",
                    &value("--iterations")?,
                    MAX_ITERATIONS,
                )?)
            }
            "--window" => o.window = count("--window", &value("--window")?, MAX_WINDOW)?,
            "--buffer-offset" => {
                let v = value("--buffer-offset")?;
                o.buffer_offset = Some(
                    v.trim()
                        .parse::<usize>()
                        .ok()
                        .filter(|&b| b < PAGE)
                        .ok_or_else(|| {
                            format!("--buffer-offset {v:?}: accepts an integer from 0 to 4095")
                        })?,
                );
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
            "--plot" => o.plot = Some(path("--plot", value("--plot")?)?),
            "--compare" => o.compare = Some(path("--compare", value("--compare")?)?),
            "--compare-ids" => {
                let v = value("--compare-ids")?;
                o.compare_ids = v.split(',').map(|s| s.trim().to_owned()).collect();
                if o.compare_ids.iter().any(String::is_empty) {
                    return Err(format!(
                        "--compare-ids {v:?}: accepts row ids of the comparison file \
                         separated by commas"
                    ));
                }
            }
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    if o.compare.is_some() && o.plot.is_none() {
        return Err(
            "--compare draws the peers' curves in the plot: it needs --plot FILE.svg".into(),
        );
    }
    if !o.compare_ids.is_empty() && o.compare.is_none() {
        return Err("--compare-ids selects rows of the --compare file: it needs --compare".into());
    }
    if o.format == Format::Osu && o.transports.len() > 1 {
        return Err(
            "--format osu prints one transport's lines (what the anchor harness reads): give \
             one --transport"
                .into(),
        );
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
                "{{\"transport\":\"{transport}\",\"size\":{},\"latency_us\":{:.3},\"bandwidth_MBps\":{:.1}}}",
                self.size, self.latency_us, self.bandwidth_mbps
            ),
            Format::Osu => format!(
                "size={} latency_us={:.3} bandwidth_MBps={:.1}",
                self.size, self.latency_us, self.bandwidth_mbps
            ),
            Format::Human => format!(
                "{:>10} {:>14.3} {:>16.1}",
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

/// (timed ping-pong round trips, timed bandwidth windows) at `size`: the
/// defaults by size (the windows counted for the default window of 64;
/// with another window the same number of messages), `--quick`'s fraction
/// of them, or `--iterations`.
pub fn iterations(size: usize, opts: &BenchOpts) -> (u64, u64) {
    let windows = |messages: u64| messages.div_ceil(opts.window).max(1);
    if let Some(n) = opts.iterations {
        return (n, windows(n));
    }
    let (lat, bw) = match size {
        0..=4096 => (20_000, 400),
        4097..=65_536 => (4_000, 100),
        65_537..=1_048_576 => (400, 20),
        _ => (100, 6),
    };
    let (lat, bw) = if opts.quick {
        ((lat / 20).max(4), (bw / 10).max(2))
    } else {
        (lat, bw)
    };
    (lat, windows(bw * WINDOW))
}

/// Runs the benchmark inside a job of exactly two ranks; rank 0 prints,
/// writes its rows to [`ENV_ROWS`]'s file if set, and draws `--plot`.
/// Returns the rows (rank 0) or nothing (rank 1).
pub fn run(opts: &BenchOpts, out: &mut impl Write) -> Result<Vec<Row>, BoxError> {
    let [transport] = &opts.transports[..] else {
        return Err(
            "in a job, btl bench measures one transport per run (outside a job it \
                    launches one job per transport of --transport)"
                .into(),
        );
    };
    let choice = Choice::parse(transport).ok_or("--transport: accepts auto, sm or tcp")?;
    let mut world = World::init(choice)?;
    if world.size() != 2 {
        return Err("btl bench runs on exactly 2 ranks".into());
    }
    // Rank 0 draws, so only its host needs the comparison file; a bad one
    // is reported before anything is measured.
    let peers = match &opts.compare {
        Some(f) if world.rank() == 0 => plot::read_compare(f, &opts.compare_ids)?,
        _ => Vec::new(),
    };
    let rows = run_on(&mut world, opts, out)?;
    if world.rank() == 0 {
        let name = world.transport_name();
        if let Some(f) = std::env::var_os(ENV_ROWS) {
            write_rows(Path::new(&f), name, &rows)?;
        }
        if let Some(svg) = &opts.plot {
            let mut series = vec![Series::from_rows(name, &rows)];
            series.extend(peers);
            plot::write_svg(svg, &series, &plot_title(&series))?;
        }
    }
    Ok(rows)
}

/// Appends `rows` of `transport` to `path` ([`ENV_ROWS`]'s format).
fn write_rows(path: &Path, transport: &str, rows: &[Row]) -> Result<(), BoxError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{ENV_ROWS}={}: {e}", path.display()))?;
    let mut text = String::new();
    for r in rows {
        text.push_str(&format!(
            "{transport}\t{}\t{:?}\t{:?}\n",
            r.size, r.latency_us, r.bandwidth_mbps
        ));
    }
    f.write_all(text.as_bytes())
        .map_err(|e| format!("{ENV_ROWS}={}: {e}", path.display()).into())
}

/// Reads what [`write_rows`] wrote: one [`Series`] per transport, in order.
fn read_rows(path: &Path) -> Result<Vec<Series>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out: Vec<(String, Vec<Row>)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let bad = || {
            format!(
                "{}:{}: not a row of btl bench: {line:?}",
                path.display(),
                i + 1
            )
        };
        let f: Vec<&str> = line.split('\t').collect();
        let [t, size, lat, bw] = f[..] else {
            return Err(bad());
        };
        let row = Row {
            size: size.parse().map_err(|_| bad())?,
            latency_us: lat.parse().map_err(|_| bad())?,
            bandwidth_mbps: bw.parse().map_err(|_| bad())?,
        };
        match out.iter_mut().find(|(n, _)| n == t) {
            Some((_, rows)) => rows.push(row),
            None => out.push((t.to_owned(), vec![row])),
        }
    }
    Ok(out
        .iter()
        .map(|(t, rows)| Series::from_rows(t, rows))
        .collect())
}

/// `btl bench: sm, tcp (vs ompi_tcp, ucp_tcp)`.
fn plot_title(series: &[Series]) -> String {
    let names = |ours: bool| {
        series
            .iter()
            .filter(|s| s.ours == ours)
            .map(|s| s.name.strip_prefix("btl ").unwrap_or(&s.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let peers = names(false);
    if peers.is_empty() {
        format!("btl bench: {}", names(true))
    } else {
        format!("btl bench: {} (beside {peers})", names(true))
    }
}

/// After a barrier, runs `step` `warm + n` times; returns the seconds the
/// last `n` took (the clock starts when the last warm-up step has ended).
fn timed(
    sm: &mut dyn Transport,
    warm: u64,
    n: u64,
    mut step: impl FnMut(&mut dyn Transport) -> Result<(), BoxError>,
) -> Result<f64, BoxError> {
    sm.barrier()?;
    let mut t0 = Instant::now();
    for i in 0..warm + n {
        if i == warm {
            t0 = Instant::now();
        }
        step(sm)?;
    }
    Ok(t0.elapsed().as_secs_f64())
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
    let window = opts.window;
    let mut rows = Vec::new();
    for &size in &opts.sizes {
        let store = vec![0xa5u8; size + PAGE];
        let skip = opts
            .buffer_offset
            .map_or(0, |b| (b + PAGE - store.as_ptr() as usize % PAGE) % PAGE);
        let buf = &store[skip..skip + size];
        let (iters, windows) = iterations(size, opts);
        let warm = (iters / 10).max(2);
        let warm_windows = (windows / 10).max(1);

        // Latency: `warm` round trips, then `iters` timed.
        let secs = timed(sm, warm, iters, |sm| {
            if me == 0 {
                sm.send(peer, TAG_DATA, buf)?;
                sm.drive("the pong", Some(peer), &mut one(TAG_DATA))
            } else {
                sm.drive("the ping", Some(peer), &mut one(TAG_DATA))?;
                sm.send(peer, TAG_DATA, buf)
            }
        })?;
        let latency_us = secs * 1e6 / iters as f64 / 2.0;

        // Bandwidth: `warm_windows` windows, then `windows` timed (the
        // clock starts when the last warm-up window is acknowledged).
        let secs = timed(sm, warm_windows, windows, |sm| {
            if me == 0 {
                // The window's messages in flight together (a blocking send
                // each would wait for every large one before the next).
                sm.send_window(peer, TAG_DATA, buf, window)?;
                sm.drive(
                    "the window's acknowledgement",
                    Some(peer),
                    &mut one(TAG_ACK),
                )
            } else {
                let mut got = 0;
                sm.drive("a window of messages", Some(peer), &mut |_, ev| {
                    if let Event::Message { tag: TAG_DATA, .. } = ev {
                        got += 1;
                    }
                    if got >= window {
                        Flow::Done
                    } else {
                        Flow::Continue
                    }
                })?;
                sm.send(peer, TAG_ACK, &[1])
            }
        })?;
        let bandwidth_mbps = (size as f64 * (window * windows) as f64) / secs / 1e6;
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
/// launches itself as the ranks of a new job on this machine, once per
/// transport. Returns the exit status.
pub fn cmd(args: &[OsString]) -> i32 {
    crate::subcommand::run("bench", USAGE, args, parse_args, launch_all, |opts, out| {
        run(opts, out).map(|_| 0)
    })
}

/// The arguments of the ranks measuring `transport`: everything but the
/// plot, which the launching process draws.
fn rank_args(opts: &BenchOpts, transport: &str) -> Vec<OsString> {
    let mut a: Vec<String> = vec!["bench".into(), "--transport".into(), transport.into()];
    let sizes: Vec<String> = opts.sizes.iter().map(usize::to_string).collect();
    a.extend(["--sizes".into(), sizes.join(",")]);
    a.extend(["--window".into(), opts.window.to_string()]);
    if let Some(n) = opts.iterations {
        a.extend(["--iterations".into(), n.to_string()]);
    }
    if let Some(b) = opts.buffer_offset {
        a.extend(["--buffer-offset".into(), b.to_string()]);
    }
    if opts.quick {
        a.push("--quick".into());
    }
    let format = match opts.format {
        Format::Human => "human",
        Format::Json => "json",
        Format::Osu => "osu",
    };
    a.extend(["--format".into(), format.into()]);
    a.into_iter().map(OsString::from).collect()
}

/// A file for the ranks' rows, private to this process; removed on drop.
struct RowsFile(PathBuf);

impl RowsFile {
    fn create() -> Result<Self, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = std::env::temp_dir();
        for i in 0..100u32 {
            let p = dir.join(format!("btl-bench-{}-{i}.rows", std::process::id()));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&p)
            {
                Ok(_) => return Ok(RowsFile(p)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(format!("cannot create {}: {e}", p.display())),
            }
        }
        Err(format!("cannot create a rows file in {}", dir.display()))
    }
}

impl Drop for RowsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Outside a job: one 2-rank job per transport, then the plot. Returns the
/// first failing job's status, or 0.
fn launch_all(opts: &BenchOpts) -> Result<i32, String> {
    // Bad plot arguments fail before anything runs.
    let peers = match &opts.compare {
        Some(f) => plot::read_compare(f, &opts.compare_ids).map_err(|e| e.to_string())?,
        None => Vec::new(),
    };
    if let Some(svg) = &opts.plot {
        let dir = svg.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(d) = dir.filter(|d| !d.is_dir()) {
            return Err(format!(
                "--plot {}: no directory {}",
                svg.display(),
                d.display()
            ));
        }
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my own executable: {e}"))?;
    let rows = RowsFile::create()?;
    for t in &opts.transports {
        let mut spec = LaunchSpec::new(2, exe.clone());
        spec.args = rank_args(opts, t);
        spec.bind_cores = true;
        spec.tag_output = false;
        spec.extra_env
            .push((ENV_ROWS.into(), rows.0.clone().into_os_string()));
        let report = launch(&spec).map_err(|e| e.to_string())?;
        if report.status != 0 {
            return Ok(report.status);
        }
    }
    if let Some(svg) = &opts.plot {
        let mut series = read_rows(&rows.0)?;
        if series.is_empty() {
            return Err("the ranks reported no measurement to plot".into());
        }
        series.extend(peers);
        plot::write_svg(svg, &series, &plot_title(&series))?;
        eprintln!(
            "btl bench: plotted {} series into {}",
            series.len(),
            svg.display()
        );
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::os;

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
            parse_args(&os(&["--transport", "tcp"])).unwrap().transports,
            ["tcp"]
        );
        assert_eq!(
            parse_args(&os(&["--transport", "sm,tcp"]))
                .unwrap()
                .transports,
            ["sm", "tcp"]
        );
        assert!(parse_args(&os(&["--transport", "udp"])).is_err());
        assert!(parse_args(&os(&["--sizes"])).is_err());
        assert!(parse_args(&os(&["--bogus"])).is_err());
    }

    #[test]
    fn bad_values_name_their_option() {
        let err = |v: &[&str]| parse_args(&os(v)).unwrap_err();
        for (args, want) in [
            (
                &["--iterations", "0"][..],
                "--iterations \"0\": accepts an integer from 1",
            ),
            (&["--iterations", "x"], "--iterations \"x\""),
            (&["--iterations", "100000001"], "--iterations"),
            (&["--iterations"], "--iterations needs a value"),
            (
                &["--window", "0"],
                "--window \"0\": accepts an integer from 1 to 16384",
            ),
            (&["--window", "16385"], "--window \"16385\""),
            (&["--window", "-3"], "--window \"-3\""),
            (
                &["--buffer-offset", "4096"],
                "--buffer-offset \"4096\": accepts an integer from 0 to 4095",
            ),
            (&["--buffer-offset", "-1"], "--buffer-offset \"-1\""),
            (&["--buffer-offset"], "--buffer-offset needs a value"),
            (&["--transport", "sm,udp"], "\"udp\" is not a transport"),
            (&["--transport", "sm,sm"], "sm is given twice"),
            (&["--transport", "sm,"], "\"\" is not a transport"),
            (&["--plot", ""], "--plot needs a file name"),
            (&["--compare", "x.tsv"], "--compare draws the peers' curves"),
            (
                &["--plot", "a.svg", "--compare-ids", "a"],
                "--compare-ids selects",
            ),
            (
                &["--plot", "a.svg", "--compare", "x", "--compare-ids", "a,,b"],
                "--compare-ids \"a,,b\"",
            ),
            (
                &["--transport", "sm,tcp", "--format", "osu"],
                "--format osu",
            ),
        ] {
            let e = err(args);
            assert!(e.contains(want), "{args:?}: {e}");
        }
        let o = parse_args(&os(&["--iterations", "50", "--window", "8"])).unwrap();
        assert_eq!((o.iterations, o.window), (Some(50), 8));
        // 50 messages in windows of 8: 7 windows.
        assert_eq!(iterations(4 << 20, &o), (50, 7));
        let d = BenchOpts::default();
        assert_eq!(iterations(8, &d), (20_000, 400));
        assert_eq!(iterations(4 << 20, &d), (100, 6));
        // Another window moves as many messages by default.
        let w = BenchOpts {
            window: 16,
            ..BenchOpts::default()
        };
        assert_eq!(iterations(8, &w), (20_000, 1600));
    }

    #[test]
    fn ranks_get_everything_but_the_plot() {
        let o = parse_args(&os(&[
            "--transport",
            "sm,tcp",
            "--sizes",
            "8,64",
            "--iterations",
            "9",
            "--window",
            "4",
            "--buffer-offset",
            "4088",
            "--quick",
            "--json",
            "--plot",
            "p.svg",
        ]))
        .unwrap();
        let a: Vec<String> = rank_args(&o, "tcp")
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            a.join(" "),
            "bench --transport tcp --sizes 8,64 --window 4 --iterations 9 --buffer-offset 4088 \
             --quick --format json"
        );
        let back = parse_args(&rank_args(&o, "tcp")[1..]).unwrap();
        assert_eq!(
            (back.transports, back.sizes, back.iterations, back.window),
            (vec!["tcp".to_string()], vec![8, 64], Some(9), 4)
        );
        assert_eq!(
            (back.quick, back.format, back.plot, back.buffer_offset),
            (true, Format::Json, None, Some(4088))
        );
        assert_eq!(
            parse_args(&os(&["--buffer-offset", "0"]))
                .unwrap()
                .buffer_offset,
            Some(0)
        );
    }

    #[test]
    fn rows_file_round_trips() {
        let f = RowsFile::create().unwrap();
        let rows = [
            Row {
                size: 8,
                latency_us: 1.0 / 3.0,
                bandwidth_mbps: 12.5,
            },
            Row {
                size: 64,
                latency_us: 2.0,
                bandwidth_mbps: 99.0,
            },
        ];
        write_rows(&f.0, "sm", &rows).unwrap();
        write_rows(&f.0, "tcp", &rows[..1]).unwrap();
        let s = read_rows(&f.0).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0], Series::from_rows("sm", &rows));
        assert_eq!(s[1].latency, vec![(8, 1.0 / 3.0)]);
        std::fs::write(&f.0, "sm\t8\tx\t1\n").unwrap();
        assert!(read_rows(&f.0).unwrap_err().contains(":1: not a row"));
        let p = f.0.clone();
        drop(f);
        assert!(!p.exists());
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
            r#"{"transport":"sm","size":8,"latency_us":0.315,"bandwidth_MBps":120.5}"#
        );
        assert_eq!(
            r.render("sm", Format::Osu),
            "size=8 latency_us=0.315 bandwidth_MBps=120.5"
        );
    }
}
