//! A hostile local process attacks a running job's shared memory.
//!
//! How it gets in, as any process of the same user could: the segment is a
//! memfd that the ranks hold open, so `/proc/<rank>/fd/<n>` (readable by any
//! process that may ptrace-read the rank: same uid, dumpable) reopens it.
//! The attacker (this test process) finds it there, maps it, reads the
//! layout from the control header as a rank does, waits until both ranks
//! (`btl stress`, started through a rendezvous with default timeouts) are
//! exchanging messages, then for a while
//!
//! - writes random values into the ranks' ring slots (random words, and
//!   plausible SEND/ACK slots naming real fragments), ring headers (the
//!   head / freed / tail counters and the geometry), fragment headers,
//!   control records (pid, start time, state, probe, verdict), fast
//!   boxes (the word at the reader's position — the next record's header
//!   or the terminator —, the reader's tail, the meta line), or the
//!   region tables (the sequence, id, address and length words of the
//!   published one-sided regions); or
//! - tries to truncate the segment (shrinking is refused by the seal) and
//!   grows it (allowed, harmless).
//!
//! Each rank must end on its own within [`DEADLINE`] — never killed by a
//! signal, never a panic — either with exit status 0 and every message
//! intact (`all intact`), or with an error line that names the other rank
//! and the shared-memory structure found corrupted (`local peer 1 (pid N)
//! failed: corrupted shared memory: ring slot: ...`, or, for the rank that
//! was declared failed, `... failed: it declared us failed: corrupted shared
//! memory: ring slot ...`). Truncation must change nothing: both ranks end
//! intact; so must scribbles on the region tables (a get that finds a bad
//! entry asks the target instead of reading).
#![allow(unsafe_code)]

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use btl_core::shm::{Region, ShmOffset};
use btl_core::sm::control::{Control, RANK_READY};
use btl_core::sm::fbox::Fbox;
use btl_core::sm::frag::{FragType, Slot, FRAG_HEADER_SIZE};
use btl_core::sm::layout::{segment_layout, SegmentLayout, CONTROL_HEADER, CONTROL_RECORD};
use btl_core::sm::params::SmParams;
use btl_core::sm::regtab;
use btl_core::sync::CACHE_LINE;

mod common;

const BTL: &str = env!("CARGO_BIN_EXE_btl");
/// Messages each victim sends: enough to be still at it when the attack
/// starts and ends, bounded so that a victim that keeps serving ends on its
/// own.
const MESSAGES: &str = "12000";
/// How long the attack lasts.
const ATTACK: Duration = Duration::from_millis(1500);
/// Bound for every rank to end after the attack: a hang-catching bound (a
/// rank that caught the corruption ends within a second; one that was not
/// touched finishes its messages).
const DEADLINE: Duration = Duration::from_secs(30);

/// Every structure a victim may name (`btl_core::sm::control::Structure`).
const STRUCTURES: [&str; 8] = [
    "ring slot",
    "ring header",
    "fragment header",
    "fragment sequence",
    "acknowledgement",
    "control record",
    "message protocol",
    "fast box",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attack {
    /// Random and plausible values in the ring slots.
    RingSlots,
    /// Random counters and geometry words of the rings' headers.
    RingHeaders,
    /// Random fields in the fragment headers.
    FragHeaders,
    /// Random fields in the ranks' control records.
    ControlRecords,
    /// Random words in the fast boxes' headers and the reader's tail.
    FastBoxes,
    /// Random and plausible words in the ranks' region tables.
    RegionTables,
    /// Shrinking the segment (refused), then growing it.
    Truncate,
}

impl Attack {
    /// The structures a victim may report for this attack: what the attack
    /// writes, and what a lost or misdirected value there shows up as.
    fn expected(self) -> &'static [&'static str] {
        match self {
            Attack::RingSlots => &[
                "ring slot",
                "fragment sequence",
                "acknowledgement",
                "fragment header",
                "message protocol",
            ],
            Attack::RingHeaders => &[
                "ring header",
                "ring slot",
                "fragment sequence",
                "acknowledgement",
                "message protocol",
            ],
            Attack::FragHeaders => &["fragment header"],
            Attack::ControlRecords => &["control record"],
            // A plausible tail lets the writer overwrite unread records:
            // the reader then finds a record out of sequence, after
            // perhaps a payload it cannot tell from a malformed message.
            Attack::FastBoxes => &["fast box", "message protocol"],
            // Nothing: a get that finds a bad entry asks the target.
            Attack::RegionTables | Attack::Truncate => &[],
        }
    }
}

/// xorshift64*: reproducible from the seed printed by the test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn spawn_rank(job: &str, port: u16, rank: u32) -> Child {
    common::spawn_piped(
        Command::new(BTL)
            .args(["stress", "--messages", MESSAGES, "--max-size", "100000"])
            .env("BTL_WIREUP", format!("tcp://127.0.0.1:{port}"))
            .env("BTL_JOB", job)
            .env("BTL_RANK", rank.to_string())
            .env("BTL_SIZE", "2")
            .env("BTL_NODE", "node")
            .env_remove("BTL_SESSION_DIR")
            .env_remove("BTL_TIMEOUT")
            .env_remove("BTL_ATTACH_TIMEOUT"),
    )
}

/// The segment, reopened through a rank's `/proc/<pid>/fd` and mapped.
struct Mapping {
    file: std::fs::File,
    map: memmap2::MmapRaw,
}

impl Mapping {
    fn region(&self) -> Region<'_> {
        let base = NonNull::new(self.map.as_mut_ptr()).unwrap();
        // SAFETY: the mapping is live while `self` is borrowed, and this
        // process accesses it only through the Region (atomics and byte
        // copies), from this thread.
        unsafe { Region::from_raw_parts(base, self.map.len()) }
    }
}

/// Waits for `pid` to hold the memfd of `job` and reopens it.
fn steal_segment(pid: u32, job: &str) -> Mapping {
    steal_segment_of(pid, job, "node")
}

/// Waits for `pid` to hold the memfd of `job` on `node` and reopens it.
fn steal_segment_of(pid: u32, job: &str, node: &str) -> Mapping {
    let uid = rustix::process::geteuid().as_raw();
    let want = format!("/memfd:btl-{uid}-{job}-{node}");
    let t0 = Instant::now();
    loop {
        if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
            for fd in fds.flatten() {
                let Ok(target) = std::fs::read_link(fd.path()) else {
                    continue;
                };
                if !target.to_string_lossy().starts_with(&want) {
                    continue;
                }
                let Ok(file) = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(fd.path())
                else {
                    continue;
                };
                if file.metadata().unwrap().len() > 0 {
                    let map = memmap2::MmapOptions::new().map_raw(&file).unwrap();
                    return Mapping { file, map };
                }
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "rank 0 (pid {pid}) never held a segment named {want}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Writes `value` at byte `at` of the segment.
fn poke(region: &Region<'_>, at: usize, value: &[u8]) {
    let _ = region.write_bytes(at as u64, value);
}

fn attack(region: &Region<'_>, layout: &SegmentLayout, how: Attack, rng: &mut Rng) {
    let rank = rng.below(2) as u32;
    let ring = rng.below(u64::from(layout.rings_per_rank)) as u32;
    let ring_at = layout.ring_offset(rank, ring).unwrap();
    let slots_at = ring_at + 3 * CACHE_LINE;
    let n_slots = (layout.ring_bytes - 3 * CACHE_LINE) / 8;
    let other = 1 - rank;
    // A real fragment of `owner` (part-relative offset).
    let frag_rel = |rng: &mut Rng, owner: u32| -> u64 {
        let abs = if rng.below(2) == 0 {
            layout.eager_frag_offset(owner, rng.below(u64::from(layout.eager_frags)) as u32)
        } else {
            layout.max_frag_offset(owner, rng.below(u64::from(layout.max_frags)) as u32)
        }
        .unwrap();
        (abs - layout.part_offset(owner).unwrap()) as u64
    };
    match how {
        Attack::RingSlots => {
            let slot = slots_at + 8 * rng.below(n_slots as u64) as usize;
            let value = match rng.below(3) {
                0 => rng.next(),
                // A plausible SEND of the writer's fragment, or an ACK by the
                // writer of the owner's fragment.
                _ => {
                    let (kind, owner, frag_of) = if rng.below(2) == 0 {
                        (FragType::Send, other, other)
                    } else {
                        (FragType::Ack, other, rank)
                    };
                    let frag = ShmOffset::new(owner as u16, frag_rel(rng, frag_of)).unwrap();
                    Slot::new(kind, frag, rng.below(4) == 0).unwrap().encode()
                }
            };
            poke(region, slot, &value.to_le_bytes());
        }
        Attack::RingHeaders => {
            // head (writers' line), freed or tail (reader's line), or a
            // geometry word (magic, version, size, lazy_free).
            let (at, len) = match rng.below(4) {
                0 => (ring_at, 8),
                1 => (ring_at + CACHE_LINE, 8),
                2 => (ring_at + CACHE_LINE + 8, 8),
                _ => (ring_at + 2 * CACHE_LINE + 4 * rng.below(4) as usize, 4),
            };
            let value = match rng.below(3) {
                0 => rng.next(),
                _ => rng.below(1 << 20),
            };
            poke(region, at, &value.to_le_bytes()[..len]);
        }
        Attack::FragHeaders => {
            let frag = layout.part_offset(rank).unwrap() + frag_rel(rng, rank) as usize;
            // owner, capacity, tag, len, seq, flags, check (u32 each).
            let at = frag + 4 * rng.below(7) as usize;
            let value = match rng.below(3) {
                0 => rng.next(),
                1 => rng.below(70_000),
                _ => rng.below(256),
            };
            debug_assert!(at + 4 <= frag + FRAG_HEADER_SIZE);
            poke(region, at, &value.to_le_bytes()[..4]);
        }
        Attack::ControlRecords => {
            // pid, start, state (u32) + flags, probe address, probe value,
            // verdict.
            let rec = CONTROL_HEADER + rank as usize * CONTROL_RECORD;
            let field = [0, 8, 16, 24, 32, 40][rng.below(6) as usize];
            let value = match rng.below(3) {
                0 => rng.next(),
                1 => rng.below(1 << 22),
                _ => u64::from(RANK_READY) + rng.below(2),
            };
            poke(region, rec + field, &value.to_le_bytes());
        }
        Attack::FastBoxes => {
            // The box `other` writes in `rank`'s part, as `rank`'s box
            // directory offers it; or, before there is one (and now and
            // then after), the offer itself: a forged directory word.
            let dir = layout.fbox_dir_offset(rank, other).unwrap();
            let mut word = [0u8; 8];
            let _ = region.read_bytes(dir as u64, &mut word);
            let word = u64::from_ne_bytes(word);
            let offer = ShmOffset::from_raw(word).ok();
            let Some(offer) = offer.filter(|_| word != 0 && rng.below(4) != 0) else {
                let pool =
                    layout.fbox_pool_offset(rank, 0).unwrap() - layout.part_offset(rank).unwrap();
                let forged = match rng.below(3) {
                    0 => rng.next(),
                    1 => (u64::from(rank) << 48) | (pool as u64 + 8 * rng.below(64)),
                    _ => (u64::from(other) << 48) | pool as u64,
                };
                poke(region, dir, &forged.to_ne_bytes());
                return;
            };
            let at = layout.part_offset(rank).unwrap() + offer.offset() as usize;
            let size = u64::from(layout.fbox_size);
            match rng.below(3) {
                0 => {
                    // The word at the reader's position: never zero (a
                    // zero there would hide a published record, which the
                    // box cannot tell from "nothing yet"; no process of
                    // the job ever stores it over a published header).
                    let mut tail = [0u8; 8];
                    let _ = region.read_bytes((at + Fbox::TAIL_OFFSET) as u64, &mut tail);
                    let pos = u64::from_ne_bytes(tail) & (size - 1);
                    let value = rng.next() | 1;
                    poke(
                        region,
                        at + Fbox::DATA_OFFSET + pos as usize,
                        &value.to_ne_bytes(),
                    );
                }
                1 => {
                    let value = match rng.below(2) {
                        0 => rng.next(),
                        _ => rng.below(1 << 20),
                    };
                    poke(region, at + Fbox::TAIL_OFFSET, &value.to_ne_bytes());
                }
                _ => {
                    let field = 4 * rng.below(6) as usize;
                    poke(region, at + field, &(rng.next() as u32).to_ne_bytes());
                }
            }
        }
        Attack::RegionTables => {
            // seq, id word, address, length of a random entry.
            let entry = layout.regtab_offset(rank).unwrap()
                + regtab::ENTRY_BYTES * rng.below(regtab::ENTRIES as u64) as usize;
            let field = 8 * rng.below(4) as usize;
            let value = match rng.below(3) {
                0 => rng.next(),
                1 => rng.below(1 << 20),
                // An id word naming one of the first regions (the low 33
                // bits), with a random check above them.
                _ => (rng.next() << 33) | (1 + rng.below(8)),
            };
            poke(region, entry + field, &value.to_le_bytes());
        }
        Attack::Truncate => {}
    }
}

/// Each rank: its status, stdout and stderr.
type Outcome = (std::process::ExitStatus, String, String);

fn hostile(how: Attack) {
    let seed = std::process::id() as u64 * 0x9e37_79b9 + how as u64 + 1;
    eprintln!("{how:?}: seed {seed}");
    let mut rng = Rng(seed);
    let job = format!("hostile{}{how:?}", std::process::id());
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut victims: Vec<Child> = (0..2).map(|r| spawn_rank(&job, port, r)).collect();
    // Drain the victims' output as they write (a full pipe would block them).
    let readers: Vec<_> = victims
        .iter_mut()
        .map(|v| {
            let (mut out, mut err) = (v.stdout.take().unwrap(), v.stderr.take().unwrap());
            std::thread::spawn(move || {
                let out = std::thread::spawn(move || {
                    let mut s = String::new();
                    let _ = out.read_to_string(&mut s);
                    s
                });
                let mut e = String::new();
                let _ = err.read_to_string(&mut e);
                (out.join().unwrap(), e)
            })
        })
        .collect();
    let mapping = steal_segment(victims[0].id(), &job);
    let region = mapping.region();
    let control = Control::new(region).unwrap();
    let t0 = Instant::now();
    while !control.is_ready() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "segment never ready"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let (params, _, max_procs) = control.read_params(&SmParams::default()).unwrap();
    let layout = segment_layout(&params, max_procs).unwrap();
    // Both ranks ready, then let them exchange a little.
    while (0..2).any(|r| {
        control
            .record(r)
            .map_or(true, |rec| rec.state() != RANK_READY)
    }) {
        assert!(t0.elapsed() < Duration::from_secs(60), "ranks never ready");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(300));
    for (r, v) in victims.iter_mut().enumerate() {
        assert!(
            v.try_wait().unwrap().is_none(),
            "{how:?}: rank {r} ended before the attack"
        );
    }

    let mut writes = 0u64;
    if how == Attack::Truncate {
        let len = mapping.map.len() as u64;
        for smaller in [0, len / 2, len - 4096] {
            let r = rustix::fs::ftruncate(&mapping.file, smaller);
            assert_eq!(
                r,
                Err(rustix::io::Errno::PERM),
                "shrinking the segment to {smaller} bytes was not refused"
            );
            writes += 1;
        }
        rustix::fs::ftruncate(&mapping.file, len + (1 << 20)).expect("growing is allowed");
    } else {
        // The region tables are read in stress's one-sided phase, at its
        // end: that attack goes on until the victims are done.
        let lasts = if how == Attack::RegionTables {
            DEADLINE
        } else {
            ATTACK
        };
        let start = Instant::now();
        while start.elapsed() < lasts {
            for _ in 0..64 {
                attack(&region, &layout, how, &mut rng);
                writes += 1;
            }
            std::thread::sleep(Duration::from_micros(200));
            if victims.iter_mut().all(|v| v.try_wait().unwrap().is_some()) {
                break;
            }
        }
    }
    eprintln!("{how:?}: {writes} hostile writes");

    // Ranks that were not disturbed run all their messages: a looser bound.
    let deadline = if how == Attack::Truncate {
        Duration::from_secs(120)
    } else {
        DEADLINE
    };
    let ended = Instant::now();
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut readers = readers.into_iter();
    for r in 0..victims.len() {
        let Some(status) = common::wait_until(&mut victims[r], ended, deadline) else {
            let stacks = stacks(victims[r].id());
            for v in victims.iter_mut() {
                let _ = v.kill();
            }
            let (_, err) = readers.next().unwrap().join().unwrap();
            panic!(
                "{how:?}: rank {r} still running {deadline:?} after the attack\n{err}\n{stacks}"
            );
        };
        let (out, err) = readers.next().unwrap().join().unwrap();
        outcomes.push((status, out, err));
    }
    for (r, (status, out, err)) in outcomes.iter().enumerate() {
        let tail: String = err.lines().rev().take(12).collect::<Vec<_>>().join("\n");
        eprintln!("{how:?}: rank {r} {status}; stderr ends with:\n{tail}");
        check_outcome(how, r as u32, status, out, err);
    }
    if how == Attack::FastBoxes {
        // A non-zero word at a reader's position is always caught: some
        // rank must have named the fast box.
        assert!(
            outcomes
                .iter()
                .any(|(_, _, err)| err.contains("corrupted shared memory: fast box")),
            "{how:?}: no rank caught the corrupted fast box"
        );
    }
}

/// Exit 0 with every message intact, or an error line naming the other
/// rank and a structure this attack can corrupt.
fn check_outcome(how: Attack, r: u32, status: &std::process::ExitStatus, out: &str, err: &str) {
    assert_eq!(
        status.signal(),
        None,
        "{how:?}: rank {r} was killed by a signal\n{err}"
    );
    assert!(
        !err.contains("panicked"),
        "{how:?}: rank {r} panicked\n{err}"
    );
    if status.success() {
        assert!(
            out.lines().any(|l| l.ends_with("all intact")),
            "{how:?}: rank {r} exited 0 without `all intact`\n{out}\n{err}"
        );
        return;
    }
    assert!(
        !matches!(how, Attack::Truncate | Attack::RegionTables),
        "{how:?}: rank {r} failed although nothing this attack writes can fail it\n{err}"
    );
    let peer = format!("local peer {} (pid ", 1 - r);
    let named = err.lines().find_map(|l| {
        let rest = &l[l.find(&peer)?..];
        let cause = &rest[rest.find("corrupted shared memory: ")? + 25..];
        STRUCTURES.iter().find(|s| cause.starts_with(*s)).copied()
    });
    match named {
        Some(s) => assert!(
            how.expected().contains(&s),
            "{how:?}: rank {r} named the {s}, which this attack does not corrupt\n{err}"
        ),
        None => panic!(
            "{how:?}: rank {r} failed without an error naming rank {} and the corrupted \
             structure\n{err}",
            1 - r
        ),
    }
}

/// The victim's threads' stacks, if gdb is there (to say where it hung).
fn stacks(pid: u32) -> String {
    Command::new("gdb")
        .args([
            "-batch",
            "-ex",
            "thread apply all bt 30",
            "-p",
            &pid.to_string(),
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// One `#[test]` per entry: [`hostile`] with its attack.
macro_rules! attack_tests {
    ($($name:ident: $attack:ident;)+) => {
        $(#[test] fn $name() { hostile(Attack::$attack); })+
    };
}

attack_tests! {
    random_ring_slots_end_the_conversation: RingSlots;
    random_ring_headers_end_the_conversation: RingHeaders;
    random_fragment_headers_end_the_conversation: FragHeaders;
    random_control_records_end_the_conversation: ControlRecords;
    random_fast_box_words_end_the_conversation: FastBoxes;
    random_region_table_words_change_nothing: RegionTables;
    the_segment_cannot_be_truncated_under_the_ranks: Truncate;
}

/// The same attack on a job under `btl run`: the rank that catches the
/// corruption stops with an error naming it, and the launcher ends the job
/// at once (as when a rank dies), naming that rank.
#[test]
fn the_launcher_ends_a_corrupted_job_naming_the_rank() {
    let mut launcher = Command::new(BTL)
        .args(["run", "-n", "2", "--", BTL, "stress"])
        .args(["--messages", "100000000", "--max-size", "100000"])
        .env_remove("BTL_RANK")
        .env_remove("BTL_TIMEOUT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = launcher.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    });
    let t0 = Instant::now();
    let (rank0, job) = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "ranks did not start"
        );
        let found = common::children(launcher.id())
            .into_iter()
            .find(|&p| common::environ_var(p, "BTL_RANK").as_deref() == Some("0"));
        if let Some(p) = found {
            if let Some(job) = common::environ_var(p, "BTL_JOB") {
                break (p, job);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let node = common::environ_var(rank0, "BTL_NODE").unwrap();
    let mapping = steal_segment_of(rank0, &job, &node);
    let region = mapping.region();
    let control = Control::new(region).unwrap();
    while !control.is_ready()
        || (0..2).any(|r| {
            control
                .record(r)
                .map_or(true, |rec| rec.state() != RANK_READY)
        })
    {
        assert!(t0.elapsed() < Duration::from_secs(60), "ranks never ready");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (params, _, max_procs) = control.read_params(&SmParams::default()).unwrap();
    let layout = segment_layout(&params, max_procs).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut rng = Rng(std::process::id() as u64 | 1);
    let start = Instant::now();
    while start.elapsed() < ATTACK && launcher.try_wait().unwrap().is_none() {
        for _ in 0..64 {
            attack(&region, &layout, Attack::RingSlots, &mut rng);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let ended = Instant::now();
    let Some(status) = common::wait_until(&mut launcher, ended, DEADLINE) else {
        let _ = launcher.kill();
        panic!(
            "the launcher did not end the corrupted job\n{}",
            stderr.join().unwrap()
        );
    };
    let err = stderr.join().unwrap();
    eprintln!("{err}");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("corrupted shared memory: "), "{err}");
    // Either one rank caught it first and the launcher stopped the other
    // ("...; stopping the other rank"), or both caught it in the same
    // moment and both exited 1: the first failure is named either way.
    assert!(
        err.contains("btl run: rank ") && err.contains(") exited with status 1"),
        "{err}"
    );
}
