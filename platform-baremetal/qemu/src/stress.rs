//! The node's side of `btl stress`: the same steps as btl-linux's
//! `stress::run_on` (platform-linux/src/stress.rs), so that the Linux
//! ranks running `btl stress` see this node as one more rank.
//!
//! 1. barrier; M messages of mixed sizes (0 B to `max_size`, chunked
//!    above `max_frame`) to every peer, while every peer's messages are
//!    checked on arrival (content regenerated and compared, FNV-1a
//!    checksum, exactly once, per-sender order); flush; barrier;
//! 2. one-sided phase: a region of one slot per rank, its key sent to
//!    every peer; a pattern put into our slot of every peer's region;
//!    barrier; every peer's pattern checked in ours; barrier; our slot got
//!    back from every peer and compared; a get and a put past the end of
//!    every peer's region must be refused; barrier; our region unchanged
//!    by the refused puts; flush; barrier.
//!
//! The messages' content is btl-core's `check` module, which btl-linux's
//! `btl stress` uses too (sizes and bytes are regenerated from (seed,
//! sender, receiver, sequence) on both sides).
//!
//! A peer that fails is reported at once; the node goes on with the
//! others (its messages are no longer expected, failed peers are not
//! waited for at barriers) and the run ends with an error naming it. A
//! peer that closes its connections before the end has left the job: the
//! run stops there.

use btl_baremetal::core::workload::check::{build, check, fill, is_filled};

use crate::job::{Job, JobError, TAG_KEY, TAG_STRESS};
use crate::{clock_ms, println, PEERS};

/// A console line when this many messages came from a rank (the QEMU test
/// waits for it before killing a rank mid-run).
const PROGRESS: u64 = 10;

/// Checks every peer's messages as they arrive.
#[derive(Debug)]
pub struct Checker {
    seed: u64,
    /// Our rank.
    pub me: u32,
    /// Ranks in the job.
    pub size: u32,
    max: usize,
    /// Next sequence number expected from each rank.
    pub next: [u64; PEERS],
    /// Messages queued to each rank.
    pub sent: [u64; PEERS],
    /// Bytes received.
    pub bytes: u64,
    /// Problems found.
    pub errors: u64,
}

impl Checker {
    /// Checks for rank `me` of `size` of messages up to `max` bytes.
    pub fn new(seed: u64, me: u32, size: u32, max: usize) -> Self {
        Self {
            seed,
            me,
            size,
            max,
            next: [0; PEERS],
            sent: [0; PEERS],
            bytes: 0,
            errors: 0,
        }
    }

    fn error(&mut self, args: core::fmt::Arguments<'_>) {
        self.errors += 1;
        if self.errors <= 10 {
            println!("btl-qemu-node: rank {}: error: {}", self.me, args);
        }
    }

    /// One message from `src`.
    pub fn check(&mut self, src: u32, data: &[u8]) {
        let Some(seq) = self.next.get(src as usize).copied() else {
            self.error(format_args!("message from unknown rank {src}"));
            return;
        };
        self.next[src as usize] += 1;
        self.bytes += data.len() as u64;
        if seq + 1 == PROGRESS {
            println!("btl-qemu-node: {PROGRESS} messages from rank {src}");
        }
        if let Err(m) = check(data, self.seed, src, self.me, seq, self.max) {
            self.error(format_args!("from rank {src}: message {seq} {m}"));
        }
    }
}

/// `btl stress`'s options, from the command line.
#[derive(Clone, Copy, Debug)]
pub struct Opts {
    /// Messages to every peer.
    pub messages: u64,
    /// Largest message.
    pub max_size: usize,
    /// Generator seed.
    pub seed: u64,
}

/// Static buffers of a run.
#[derive(Debug)]
pub struct Buffers {
    /// One outgoing message (or one region slot's pattern).
    pub send: &'static mut [u8],
    /// Our region (`size` slots of up to [`crate::MAX_MESSAGE`]).
    pub region: &'static mut [u8],
}

/// What went wrong, for the summary.
#[derive(Debug, Default)]
struct Tally {
    errors: u64,
    stopped: Option<JobError>,
}

impl Tally {
    fn error(&mut self, me: u32, args: core::fmt::Arguments<'_>) {
        self.errors += 1;
        if self.errors <= 10 {
            println!("btl-qemu-node: rank {me}: error: {args}");
        }
    }
}

/// The peers (not us) that have not failed.
fn live(job: &Job, size: u32, me: u32) -> heapless::Vec<u32, PEERS> {
    (0..size)
        .filter(|&p| p != me && job.st.failed[p as usize].is_none())
        .collect()
}

/// Barrier with the live peers; a peer failing meanwhile is dropped from
/// it (btl-baremetal counts failed peers as arrived).
fn barrier(job: &mut Job, size: u32, me: u32) -> Result<(), JobError> {
    let peers = live(job, size, me);
    job.barrier(&peers)
}

/// Waits until `ok(peer)` for every live peer (failed ones drop out).
fn wait_each(
    job: &mut Job,
    what: &'static str,
    size: u32,
    me: u32,
    ok: impl Fn(&crate::job::State, u32) -> bool,
) -> Result<(), JobError> {
    loop {
        let peers = live(job, size, me);
        let r = job.wait(what, &peers, |_, st| {
            peers
                .iter()
                .all(|&p| st.failed[p as usize].is_some() || ok(st, p))
        });
        match r {
            Err(JobError::PeerFailed { .. }) => continue,
            other => return other,
        }
    }
}

/// Runs the node's side of `btl stress`; prints its summary line. Whether
/// everything arrived intact and every peer stayed.
pub fn run(job: &mut Job, o: &Opts, bufs: Buffers) -> bool {
    let me = job.node.rank();
    let size = job.node.size();
    let start = clock_ms();
    job.st.checker = Some(crate::stress::Checker::new(o.seed, me, size, o.max_size));
    let mut tally = Tally::default();
    if let Err(e) = phases(job, o, bufs, &mut tally) {
        tally.stopped = Some(e);
    }
    let c = job.st.checker.as_ref();
    let received: u64 = c.map_or(0, |c| c.next.iter().sum());
    let bytes = c.map_or(0, |c| c.bytes);
    let check_errors = c.map_or(0, |c| c.errors);
    let failed: heapless::Vec<u32, PEERS> = (0..size)
        .filter(|&p| job.st.failed[p as usize].is_some())
        .collect();
    let expected = o.messages * u64::from(size - 1);
    for p in (0..size).filter(|&p| p != me) {
        let got = c.map_or(0, |c| c.next[p as usize]);
        let sent = c.map_or(0, |c| c.sent[p as usize]);
        let m = o.messages;
        match job.st.failed[p as usize] {
            Some(reason) => {
                tally.errors += 1;
                println!(
                    "btl-qemu-node: rank {me}: from rank {p}: {got} of {m} messages, to it: {sent} of {m}, then it failed: {reason}"
                );
            }
            None => println!(
                "btl-qemu-node: rank {me}: from rank {p}: {got} of {m} messages, to it: {sent} of {m}"
            ),
        }
    }
    if failed.is_empty() && tally.stopped.is_none() && received != expected {
        tally.error(
            me,
            format_args!("received {received} messages, expected {expected}"),
        );
    }
    let errors = tally.errors + check_errors + u64::from(tally.stopped.is_some());
    let secs = clock_ms().saturating_sub(start);
    if let Some(e) = tally.stopped {
        println!("btl-qemu-node: rank {me}: stopped: {e}");
    }
    let verdict_ok = errors == 0;
    let verdict = if verdict_ok { "all intact" } else { "ERRORS" };
    let (s_int, s_frac) = (secs / 1000, (secs % 1000) / 10);
    let line = format_args!(
        "btl-qemu-node: rank {me}: {received} messages ({bytes} bytes) from {} peers over smoltcp on virtio-net, get/put with each checked, {s_int}.{s_frac:02} s",
        size - 1
    );
    match job.st.first_message_ms {
        Some(ms) => println!("{line} (first message {ms} ms after reset): {verdict}"),
        None => println!("{line} (no message): {verdict}"),
    }
    if !verdict_ok {
        println!("btl-qemu-node: rank {me}: {errors} ERRORS");
    }
    verdict_ok
}

fn phases(job: &mut Job, o: &Opts, bufs: Buffers, t: &mut Tally) -> Result<(), JobError> {
    let me = job.node.rank();
    let size = job.node.size();
    let Buffers { send, region } = bufs;
    let peers = live(job, size, me);
    job.await_peers(&peers)?;
    barrier(job, size, me)?;
    println!(
        "btl-qemu-node: rank {me}: in the job ({size} ranks); sending {} messages to each peer",
        o.messages
    );
    for seq in 0..o.messages {
        for dst in live(job, size, me) {
            let len = build(send, o.seed, me, dst, seq, o.max_size);
            match job.send(dst, TAG_STRESS, &send[..len]) {
                Ok(()) => {
                    if let Some(c) = job.st.checker.as_mut() {
                        c.sent[dst as usize] += 1;
                    }
                }
                Err(JobError::PeerFailed { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        job.poll();
    }
    let m = o.messages;
    wait_each(job, "every message from every peer", size, me, |st, p| {
        st.checker.as_ref().is_some_and(|c| c.next[p as usize] >= m)
    })?;
    job.flush()?;
    barrier(job, size, me)?;
    println!("btl-qemu-node: rank {me}: messages done; get/put");
    rma_phase(job, o, send, region, t)?;
    job.flush()?;
    barrier(job, size, me)?;
    Ok(())
}

/// Checks that `r`, rank `p`'s answer to our `what` ("get" or "put")
/// past the end of its region, is a refusal; anything else is counted as
/// an error. False when `p` has failed (its remaining checks are skipped).
fn refused_past_end(
    t: &mut Tally,
    me: u32,
    p: u32,
    what: &str,
    r: Result<(), JobError>,
) -> Result<bool, JobError> {
    match r {
        Err(JobError::Rma(btl_baremetal::RmaError::Refused)) => {}
        Ok(()) => t.error(
            me,
            format_args!("a {what} past the end of rank {p}'s region succeeded"),
        ),
        Err(JobError::Rma(e)) => t.error(
            me,
            format_args!("{what} past the end of rank {p}'s region: {e}"),
        ),
        Err(JobError::PeerFailed { .. }) => return Ok(false),
        Err(e) => return Err(e),
    }
    Ok(true)
}

fn rma_phase(
    job: &mut Job,
    o: &Opts,
    pattern: &'static mut [u8],
    region: &'static mut [u8],
    t: &mut Tally,
) -> Result<(), JobError> {
    let me = job.node.rank();
    let size = job.node.size();
    let slot = o.max_size.clamp(64, 1 << 20);
    let region = &mut region[..size as usize * slot];
    let key = job
        .node
        .register(region)
        .map_err(|_| JobError::Rma(btl_baremetal::RmaError::Refused))?;
    for p in live(job, size, me) {
        match job.send(p, TAG_KEY, &key.to_bytes()) {
            Ok(()) | Err(JobError::PeerFailed { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    wait_each(job, "the peers' region keys", size, me, |st, p| {
        st.keys[p as usize].is_some()
    })?;
    let pat = &mut pattern[..slot];
    let seed = o.seed ^ 0xa11;
    let keys = job.st.keys;
    let key_of = |p: u32| keys[p as usize].unwrap_or(key);
    for p in live(job, size, me) {
        fill(pat, seed, me, p, u64::MAX);
        match job.put(&key_of(p), u64::from(me) * slot as u64, pat) {
            Ok(()) => {}
            Err(JobError::Rma(e)) => t.error(me, format_args!("put into rank {p}'s region: {e}")),
            Err(JobError::PeerFailed { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    barrier(job, size, me)?;
    let ours = |job: &Job, p: u32| -> bool {
        let Some(r) = job.node.region(key.id) else {
            return false;
        };
        let at = p as usize * slot;
        match r.get(at..at + slot) {
            Some(s) if p == me => s.iter().all(|&b| b == 0),
            Some(s) => is_filled(s, seed, p, me, u64::MAX),
            None => false,
        }
    };
    for p in live(job, size, me) {
        if !ours(job, p) {
            t.error(
                me,
                format_args!("the put of rank {p} into our region is wrong"),
            );
        }
    }
    barrier(job, size, me)?;
    for p in live(job, size, me) {
        let k = key_of(p);
        match job.get(&k, u64::from(me) * slot as u64, pat) {
            Ok(()) => {
                if !is_filled(pat, seed, me, p, u64::MAX) {
                    t.error(
                        me,
                        format_args!("get from rank {p} returned the wrong bytes"),
                    );
                }
            }
            Err(JobError::Rma(e)) => t.error(me, format_args!("get from rank {p}: {e}")),
            Err(JobError::PeerFailed { .. }) => continue,
            Err(e) => return Err(e),
        }
        // Past the end: refused, nothing read or written.
        let get = job.get(&k, k.len, &mut [0u8; 1]);
        if refused_past_end(t, me, p, "get", get)? {
            let put = job.put(&k, k.len - 1, &[0xee; 2]);
            refused_past_end(t, me, p, "put", put)?;
        }
    }
    barrier(job, size, me)?;
    // The refused puts changed nothing: every slot still holds its pattern.
    for p in (0..size).filter(|&p| p == me || job.st.failed[p as usize].is_none()) {
        if !ours(job, p) {
            t.error(
                me,
                format_args!("our region's slot of rank {p} changed after the refused puts"),
            );
        }
    }
    Ok(())
}
