//! `btl stress`: every rank sends M messages of mixed sizes (0 B up to
//! `--max-size`) to every other rank; each is checked on arrival — its
//! content regenerated from (sender, receiver, sequence) and compared, its
//! FNV-1a checksum verified, arrival exactly once and in per-sender order.
//! The run passes (exit 0) only if every message arrived intact.
//!
//! Sizes are drawn from a seeded generator: about half up to 64 B, a third
//! up to the eager limit, the rest up to 64 KiB, and one in twenty up to
//! `--max-size` (so fragments, the pipelined protocol and, with
//! `BTL_SM_USE_CMA=1`, single copy are all exercised).
//!
//! A rank that fails ends the run of every other rank with an error naming
//! it — unless `--keep-going` is given: then each survivor reports the
//! failure at once, stops sending to the failed rank and no longer expects
//! its messages, finishes the message phase with the other survivors,
//! flushes, and exits 1 naming the failed rank(s). The one-sided phase is
//! skipped once a rank has failed (its barriers need every rank). This is
//! the behaviour of the bare-metal node's `stress` run, so a job mixing
//! both can show that the survivors go on talking.

use std::ffi::OsString;
use std::io::Write;
use std::time::Instant;

use crate::launcher::{launch, LaunchSpec};
use crate::transport::{BoxError, Transport};
use btl_core::workload::{check, TAG_KEY, TAG_STRESS};
use btl_linux::cma;
use btl_linux::sm::{RegionKey, SmError};
use btl_linux::world::{Choice, Event, Flow, World, WorldError};

/// File descriptors this process has open (sockets, the epoll instance,
/// segments, ...), from `/proc/self/fd`; `None` where it cannot be read.
/// Connections open lazily, so a rank that talks to few peers holds few.
fn open_fds() -> Option<usize> {
    // The directory's own descriptor, open while it is read, is not counted.
    Some(
        std::fs::read_dir("/proc/self/fd")
            .ok()?
            .count()
            .saturating_sub(1),
    )
}

/// Options of `btl stress`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StressOpts {
    /// Ranks to launch when run outside a job.
    pub nprocs: u32,
    /// Messages each rank sends to each other rank.
    pub messages: u64,
    /// Largest message, bytes.
    pub max_size: usize,
    /// Seed of the size and content generator.
    pub seed: u64,
    /// Make the kernel refuse single copy into and out of this process (for
    /// the fallback test): drops CAP_SYS_PTRACE and marks it non-dumpable.
    pub deny_cma: bool,
    /// Transport: `sm` (shared memory) or `tcp`.
    pub transport: String,
    /// Go on with the surviving ranks when one fails (see the module docs).
    pub keep_going: bool,
}

impl Default for StressOpts {
    fn default() -> Self {
        Self {
            nprocs: 4,
            messages: 1000,
            max_size: 1 << 20,
            seed: 1,
            deny_cma: false,
            transport: "auto".into(),
            keep_going: false,
        }
    }
}

/// Usage of `btl stress`.
pub const USAGE: &str =
    "usage: btl stress [-n N] [--transport auto|sm|tcp] [--messages M] [--max-size BYTES] [--seed S] [--deny-cma] [--keep-going]";

/// Parses `btl stress` arguments (after the subcommand name).
pub fn parse_args(args: &[OsString]) -> Result<StressOpts, String> {
    let mut o = StressOpts::default();
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let num = |name: &str, v: String, max: u64| {
            v.trim()
                .parse::<u64>()
                .ok()
                .filter(|&n| n <= max)
                .ok_or_else(|| format!("{name} {v:?}: accepts an integer from 0 to {max}"))
        };
        match a.as_str() {
            "-n" => {
                let n = num("-n", value("-n")?, 1024)?;
                if n == 0 {
                    return Err("-n 0: accepts an integer from 1 to 1024".into());
                }
                o.nprocs = n as u32;
            }
            "--messages" => o.messages = num("--messages", value("--messages")?, 100_000_000)?,
            "--max-size" => o.max_size = num("--max-size", value("--max-size")?, 1 << 30)? as usize,
            "--seed" => o.seed = num("--seed", value("--seed")?, u64::MAX)?,
            "--deny-cma" => o.deny_cma = true,
            "--keep-going" => o.keep_going = true,
            "--transport" => {
                let t = value("--transport")?;
                if Choice::parse(&t).is_none() {
                    return Err(format!("--transport {t}: accepts auto, sm or tcp"));
                }
                o.transport = t;
            }
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(o)
}

/// Message `seq` from `src` to `dst` (its content: [`btl_core::workload::check`]).
fn build(seed: u64, src: u32, dst: u32, seq: u64, max: usize) -> Vec<u8> {
    let mut m = vec![0u8; check::message_len(seed, src, dst, seq, max)];
    check::build(&mut m, seed, src, dst, seq, max);
    m
}

/// Per-receiver checking state.
#[derive(Debug, Default)]
struct Checker {
    next: Vec<u64>,
    bytes: u64,
    errors: Vec<String>,
}

impl Checker {
    fn check(&mut self, seed: u64, me: u32, max: usize, src: u32, data: &[u8]) {
        let Some(seq) = self.next.get(src as usize).copied() else {
            self.errors.push(format!("message from unknown rank {src}"));
            return;
        };
        self.next[src as usize] += 1;
        self.bytes += data.len() as u64;
        if let Err(m) = check::check(data, seed, src, me, seq, max) {
            self.errors
                .push(format!("from rank {src}: message {seq} {m}"));
        }
    }
}

/// Takes a peer's region key (the one-sided phase's handshake).
fn take_key(keys: &mut [Option<RegionKey>], from: u32, data: &[u8]) {
    if let (Some(k), Some(slot)) = (RegionKey::from_bytes(data), keys.get_mut(from as usize)) {
        *slot = Some(k);
    }
}

/// Whether `e` (an operation's error) or the transport says that `p`
/// failed: an operation can meet the failure before the transport's list
/// of failed peers has it.
fn failure_of(sm: &dyn Transport, e: &BoxError, p: u32) -> bool {
    sm.failed(p)
        || matches!(e.downcast_ref::<WorldError>(),
            Some(WorldError::PeerFailed { peer, .. }) if *peer == p)
}

/// Result of one rank's run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StressReport {
    /// Messages received and checked.
    pub received: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Problems found (empty = all intact).
    pub errors: Vec<String>,
}

/// The one-sided phase: every rank registers a region of one slot per rank,
/// puts a pattern into its own slot of every peer's region, checks after a
/// barrier that its region holds each peer's pattern, gets its slot back
/// from every peer, and checks that a get or put past a region's end is
/// refused (and, by the final content check, wrote nothing).
fn rma_phase(
    sm: &mut dyn Transport,
    opts: &StressOpts,
    keys: &mut [Option<RegionKey>],
) -> Result<Vec<String>, BoxError> {
    let (me, n) = (sm.rank(), sm.size());
    let slot = opts.max_size.clamp(64, 1 << 20);
    let key = sm.register(n as usize * slot);
    let peers: Vec<u32> = (0..n).filter(|&p| p != me).collect();
    for &p in &peers {
        sm.send(p, TAG_KEY, &key.to_bytes())?;
    }
    if !peers.iter().all(|&p| keys[p as usize].is_some()) {
        sm.drive("the peers' region keys", None, &mut |_, ev| {
            if let Event::Message {
                from,
                tag: TAG_KEY,
                data,
            } = ev
            {
                take_key(keys, from, data);
            }
            if peers.iter().all(|&p| keys[p as usize].is_some()) {
                Flow::Done
            } else {
                Flow::Continue
            }
        })?;
    }
    let pattern = |src: u32, dst: u32| {
        let mut v = vec![0u8; slot];
        check::fill(&mut v, opts.seed ^ 0xa11, src, dst, u64::MAX);
        v
    };
    let mut errors = Vec::new();
    for &p in &peers {
        let k = keys[p as usize].unwrap_or(key);
        if let Err(status) = sm.put(&k, u64::from(me) * slot as u64, &pattern(me, p))? {
            errors.push(format!("put into rank {p}'s region refused: {status}"));
        }
    }
    sm.barrier()?;
    let region = sm.region(&key).unwrap_or_default();
    for &p in &peers {
        let at = p as usize * slot;
        if region.get(at..at + slot) != Some(&pattern(p, me)[..]) {
            errors.push(format!("the put of rank {p} into our region is wrong"));
        }
    }
    sm.barrier()?;
    let mut back = vec![0u8; slot];
    for &p in &peers {
        let k = keys[p as usize].unwrap_or(key);
        if let Err(status) = sm.get(&k, u64::from(me) * slot as u64, &mut back)? {
            errors.push(format!("get from rank {p} refused: {status}"));
        } else if back != pattern(me, p) {
            errors.push(format!("get from rank {p} returned the wrong bytes"));
        }
        // The target refuses ranges outside its region: nothing is read
        // or written there.
        match sm.get(&k, k.len, &mut [0u8; 1])? {
            Err(_) => {}
            Ok(()) => errors.push(format!("a get past the end of rank {p}'s region succeeded")),
        }
        match sm.put(&k, k.len - 1, &[0xee; 2])? {
            Err(_) => {}
            Ok(()) => errors.push(format!("a put past the end of rank {p}'s region succeeded")),
        }
    }
    // The refused puts changed nothing in our region.
    sm.barrier()?;
    if sm.region(&key) != Some(region) {
        errors.push("a refused put changed our region".to_string());
    }
    Ok(errors)
}

/// Runs the stress test inside a job; prints a one-line summary per rank.
pub fn run(opts: &StressOpts, out: &mut impl Write) -> Result<StressReport, BoxError> {
    if opts.deny_cma {
        cma::drop_ptrace_capability()
            .and_then(|()| cma::deny_cma_for_testing())
            .map_err(|_| SmError::Unsupported("--deny-cma: could not drop CAP_SYS_PTRACE"))?;
    }
    let started = Instant::now();
    let choice = Choice::parse(&opts.transport).ok_or("--transport: accepts auto, sm or tcp")?;
    let mut world = World::init(choice)?;
    // With BTL_LOG=info: how long the wire-up and the transports' start took
    // (docs/many-hosts.md splits a job's start with it).
    log::info!(
        "rank {}: joined the job after {:.3} s",
        world.rank(),
        started.elapsed().as_secs_f64()
    );
    run_on(&mut world, opts, started, out)
}

/// Runs the stress test as one rank over an open transport (any
/// [`Transport`]: btl-baremetal's hosted smoltcp node runs it this way);
/// `started` is when the rank started, for the summary line.
pub fn run_on(
    sm: &mut dyn Transport,
    opts: &StressOpts,
    started: Instant,
    out: &mut impl Write,
) -> Result<StressReport, BoxError> {
    let me = sm.rank();
    let n = sm.size();
    let mut c = Checker {
        next: vec![0; n as usize],
        ..Checker::default()
    };
    // Keys of the one-sided phase may arrive while we still receive the
    // stress messages.
    let mut keys = vec![None::<RegionKey>; n as usize];
    let (seed, max) = (opts.seed, opts.max_size);
    let expected = opts.messages * u64::from(n - 1);
    let on_event = |c: &mut Checker, keys: &mut [Option<RegionKey>], ev: Event<'_>| match ev {
        Event::Message {
            from,
            tag: TAG_STRESS,
            data,
        } => c.check(seed, me, max, from, data),
        Event::Message {
            from,
            tag: TAG_KEY,
            data,
        } => take_key(keys, from, data),
        Event::Message { from, tag, .. } => c.errors.push(format!(
            "unexpected message with tag {tag} from rank {from}"
        )),
        _ => {}
    };
    let peers: Vec<u32> = (0..n).filter(|&p| p != me).collect();
    // Ranks reported failed (only with --keep-going; without it the first
    // failure ends the run through `?`).
    let mut failed: Vec<u32> = Vec::new();
    let mut note_failure = |failed: &mut Vec<u32>, p: u32, e: &BoxError| {
        if !failed.contains(&p) {
            failed.push(p);
            let _ = writeln!(out, "rank {me}: going on without rank {p} ({e})");
        }
    };
    match sm.barrier() {
        Ok(()) => {}
        // A rank that failed before the start: the others start without it.
        Err(e) if opts.keep_going && peers.iter().any(|&p| failure_of(sm, &e, p)) => {
            for &p in &peers {
                if failure_of(sm, &e, p) {
                    note_failure(&mut failed, p, &e.to_string().into());
                }
            }
        }
        Err(e) => return Err(e),
    }
    // With BTL_LOG=info: the moment the message phase starts (a test kills
    // a rank only once every rank is past start-up).
    log::info!(
        "rank {me}: message phase after {:.3} s: {} messages to each of {} peer(s)",
        started.elapsed().as_secs_f64(),
        opts.messages,
        peers.len() - failed.len()
    );
    for seq in 0..opts.messages {
        for &dst in &peers {
            if failed.contains(&dst) {
                continue;
            }
            let msg = build(opts.seed, me, dst, seq, opts.max_size);
            match sm.send(dst, TAG_STRESS, &msg) {
                Ok(()) => {}
                Err(e) if opts.keep_going && failure_of(sm, &e, dst) => {
                    note_failure(&mut failed, dst, &e)
                }
                Err(e) => return Err(e),
            }
        }
        // Keep receiving while sending, so nobody's rings fill for long.
        sm.poll(&mut |_, ev| {
            on_event(&mut c, &mut keys, ev);
            Flow::Continue
        });
    }
    if opts.keep_going {
        // One wait per peer: a failure ends only the wait for that peer.
        for &p in &peers {
            let want = opts.messages;
            if failed.contains(&p) || c.next[p as usize] >= want {
                continue;
            }
            let r = sm.drive("every message from a peer", Some(p), &mut |_, ev| {
                on_event(&mut c, &mut keys, ev);
                if c.next[p as usize] >= want {
                    Flow::Done
                } else {
                    Flow::Continue
                }
            });
            match r {
                Ok(()) => {}
                Err(e) if failure_of(sm, &e, p) => note_failure(&mut failed, p, &e),
                Err(e) => return Err(e),
            }
        }
        // A failure noticed while waiting for someone else.
        for &p in &peers {
            if sm.failed(p) {
                note_failure(
                    &mut failed,
                    p,
                    &"reported while waiting for another rank".into(),
                );
            }
        }
    } else if c.next.iter().sum::<u64>() < expected {
        sm.drive("every message from every peer", None, &mut |_, ev| {
            on_event(&mut c, &mut keys, ev);
            if c.next.iter().sum::<u64>() >= expected {
                Flow::Done
            } else {
                Flow::Continue
            }
        })?;
    }
    sm.flush()?;
    let rma_errors = if failed.is_empty() {
        sm.barrier()?;
        let e = rma_phase(sm, opts, &mut keys)?;
        sm.flush()?;
        sm.barrier()?;
        e
    } else {
        failed.sort_unstable();
        let mut e: Vec<String> = failed
            .iter()
            .map(|p| format!("rank {p} failed during the run"))
            .collect();
        e.push("one-sided phase skipped: a rank failed".into());
        e
    };
    let received: u64 = c.next.iter().sum();
    let mut errors = c.errors.clone();
    errors.extend(rma_errors);
    // With failed ranks (--keep-going) only the survivors' messages count.
    let expected_now = expected - opts.messages * failed.len() as u64;
    let received_live: u64 = peers
        .iter()
        .filter(|p| !failed.contains(p))
        .map(|&p| c.next[p as usize])
        .sum();
    if received_live != expected_now {
        errors.push(format!(
            "received {received_live} messages from the live ranks, expected {expected_now}"
        ));
    }
    let _ = writeln!(
        out,
        "rank {me}: {received} messages ({} bytes) from {} peers {}, get/put with each {}, {} fds open, {:.2} s: {}",
        c.bytes,
        n - 1,
        sm.summary(),
        if failed.is_empty() { "checked" } else { "skipped" },
        open_fds().map_or_else(|| "?".to_string(), |f| f.to_string()),
        started.elapsed().as_secs_f64(),
        if errors.is_empty() {
            "all intact".to_string()
        } else {
            format!("{} ERRORS", errors.len())
        }
    );
    for e in errors.iter().take(10) {
        let _ = writeln!(out, "rank {me}: error: {e}");
    }
    Ok(StressReport {
        received,
        bytes: c.bytes,
        errors,
    })
}

/// `btl stress ARGS`: inside a job (BTL_RANK set) runs as one rank; outside,
/// launches itself as the ranks of a new job on this machine. Returns the
/// exit status.
pub fn cmd(args: &[OsString]) -> i32 {
    let launch_all = |opts: &StressOpts| {
        let exe =
            std::env::current_exe().map_err(|e| format!("cannot find my own executable: {e}"))?;
        let mut spec = LaunchSpec::new(opts.nprocs, exe);
        spec.args = std::iter::once(OsString::from("stress"))
            .chain(args.iter().cloned())
            .collect();
        spec.bind_cores = false;
        spec.tag_output = true;
        launch(&spec)
            .map(|report| report.status)
            .map_err(|e| e.to_string())
    };
    crate::subcommand::run(
        "stress",
        USAGE,
        args,
        parse_args,
        launch_all,
        |opts, out| run(opts, out).map(|r| i32::from(!r.errors.is_empty())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::os;
    use btl_core::workload::check::{message_len, HEADER};

    #[test]
    fn messages_check_against_themselves() {
        let mut c = Checker {
            next: vec![0; 3],
            ..Checker::default()
        };
        for seq in 0..200 {
            let m = build(9, 1, 2, seq, 100_000);
            assert_eq!(m.len(), message_len(9, 1, 2, seq, 100_000));
            c.check(9, 2, 100_000, 1, &m);
        }
        assert!(c.errors.is_empty(), "{:?}", c.errors);
        assert_eq!(c.next[1], 200);
    }

    #[test]
    fn corruption_loss_and_reorder_are_caught() {
        let mut c = Checker {
            next: vec![0; 2],
            ..Checker::default()
        };
        // Find a message with a header and flip a body byte.
        let seq = (0..)
            .find(|&s| message_len(3, 0, 1, s, 10_000) > HEADER + 1)
            .unwrap();
        for s in 0..seq {
            c.check(3, 1, 10_000, 0, &build(3, 0, 1, s, 10_000));
        }
        let mut m = build(3, 0, 1, seq, 10_000);
        m[HEADER] ^= 1;
        c.check(3, 1, 10_000, 0, &m);
        assert!(c.errors.last().unwrap().contains("checksum"));
        // Skip one: the next arrives with the wrong sequence.
        let skip = (seq + 2..)
            .find(|&s| message_len(3, 0, 1, s, 10_000) > HEADER)
            .unwrap();
        c.check(3, 1, 10_000, 0, &build(3, 0, 1, skip, 10_000));
        assert!(c.errors.len() >= 2);
    }

    #[test]
    fn sizes_cover_the_range() {
        let lens: Vec<usize> = (0..2000)
            .map(|s| message_len(1, 0, 1, s, 1 << 20))
            .collect();
        assert!(lens.contains(&0) || lens.iter().any(|&l| l < 8));
        assert!(lens.iter().any(|&l| l > 65_536));
        assert!(lens.iter().all(|&l| l <= 1 << 20));
    }

    #[test]
    fn args() {
        let o = parse_args(&os(&["-n", "8", "--messages", "5", "--max-size", "1024"])).unwrap();
        assert!(!o.keep_going);
        assert!(parse_args(&os(&["--keep-going"])).unwrap().keep_going);
        assert_eq!((o.nprocs, o.messages, o.max_size), (8, 5, 1024));
        assert!(parse_args(&os(&["-n", "0"])).is_err());
        assert!(parse_args(&os(&["--max-size", "lots"])).is_err());
    }
}
