//! A hostile local process corrupts a running job's shared memory.
//!
//! How it gets in, as any process of the same user could: the segment file
//! (`/dev/shm/btl-<uid>-<job>-<node>`, mode 0600) exists from the moment
//! local rank 0 creates it until the last rank attaches and unlinks it. The
//! attacker (this test process) watches for it, opens and maps it while
//! rank 1 has not started yet, and keeps the mapping after the unlink. It
//! reads the layout from the control header, as a rank does, waits until
//! both ranks are exchanging messages (`btl stress`, endless), then for a
//! while writes random values into the ranks' rings (slot values, including
//! plausible SEND/ACK slots naming real fragments, or the ring counters) or
//! into their fragment headers.
//!
//! Each victim must end on its own — reporting the corruption or the
//! messages it lost with a clear error and a non-zero status — well within
//! the test's deadline: never killed by a signal, never a panic, never a
//! hang.
#![allow(unsafe_code)]

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use btl_core::shm::{Region, ShmOffset};
use btl_core::sm::control::{Control, RANK_READY};
use btl_core::sm::frag::{FragType, Slot, FRAG_HEADER_SIZE};
use btl_core::sm::layout::{segment_layout, SegmentLayout};
use btl_core::sm::params::SmParams;
use btl_core::sync::CACHE_LINE;
use btl_linux::segment::{segment_dir, segment_file_name};

const BTL: &str = env!("CARGO_BIN_EXE_btl");
/// `BTL_TIMEOUT` of the victims: how long a blocking call may wait.
const VICTIM_TIMEOUT_S: u64 = 5;
/// Messages each victim sends: enough to be still at it when the attack
/// starts and ends (about 5 s undisturbed, in a debug build), bounded so
/// that a victim that keeps serving ends on its own.
const MESSAGES: &str = "12000";
/// How long the attack lasts.
const ATTACK: Duration = Duration::from_millis(1500);
/// Deadline for the victims to end after the attack.
const DEADLINE: Duration = Duration::from_secs(45);

#[derive(Clone, Copy, Debug)]
enum Attack {
    /// Random and plausible values in the ring slots.
    RingSlots,
    /// Random head / freed / tail counters of the rings.
    RingCounters,
    /// Random fields in the fragment headers.
    FragHeaders,
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

fn spawn_rank(job: &str, dir: &Path, rank: u32) -> Child {
    Command::new(BTL)
        .args(["stress", "--messages", MESSAGES, "--max-size", "100000"])
        .env("BTL_JOB", job)
        .env("BTL_RANK", rank.to_string())
        .env("BTL_SIZE", "2")
        .env("BTL_LOCAL_RANK", rank.to_string())
        .env("BTL_LOCAL_SIZE", "2")
        .env("BTL_SESSION_DIR", dir)
        .env("BTL_NODE", "node")
        .env("BTL_TIMEOUT", VICTIM_TIMEOUT_S.to_string())
        .env("BTL_ATTACH_TIMEOUT", "30")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The segment, mapped by the attacker.
struct Mapping {
    map: memmap2::MmapRaw,
}

impl Mapping {
    fn region(&self) -> Region<'_> {
        let base = NonNull::new(self.map.as_mut_ptr()).unwrap();
        // SAFETY: the mapping is live while `self` is borrowed, and this
        // process accesses it only through the Region (atomics and byte
        // copies).
        unsafe { Region::from_raw_parts(base, self.map.len()) }
    }
}

/// Waits for the segment file of `job` and maps it.
fn open_segment(path: &Path) -> Mapping {
    let t0 = Instant::now();
    loop {
        if let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
        {
            if f.metadata().unwrap().len() > 0 {
                let map = memmap2::MmapOptions::new().map_raw(&f).unwrap();
                return Mapping { map };
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "segment {} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Writes `value` at byte `at` of the segment (8 bytes).
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
    // A real fragment of the other rank (part-relative offset).
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
                // A plausible SEND or ACK naming a real fragment.
                _ => {
                    let owner = if rng.below(2) == 0 { other } else { rank };
                    let kind = if rng.below(2) == 0 {
                        FragType::Send
                    } else {
                        FragType::Ack
                    };
                    let frag = ShmOffset::new(owner as u16, frag_rel(rng, owner)).unwrap();
                    Slot::new(kind, frag, rng.below(4) == 0).unwrap().encode()
                }
            };
            poke(region, slot, &value.to_le_bytes());
        }
        Attack::RingCounters => {
            // head (writers' line), freed or tail (reader's line).
            let at = match rng.below(3) {
                0 => ring_at,
                1 => ring_at + CACHE_LINE,
                _ => ring_at + CACHE_LINE + 8,
            };
            let value = match rng.below(3) {
                0 => rng.next(),
                _ => rng.below(1 << 20),
            };
            poke(region, at, &value.to_le_bytes());
        }
        Attack::FragHeaders => {
            let frag = layout.part_offset(rank).unwrap() + frag_rel(rng, rank) as usize;
            // owner, capacity, tag, len (u32 each), cookie (u64), flags.
            let field = rng.below(6) as usize;
            let at = frag + [0, 4, 8, 12, 16, 24][field];
            let value = match rng.below(3) {
                0 => rng.next(),
                1 => rng.below(70_000),
                _ => rng.below(256),
            };
            let bytes = value.to_le_bytes();
            let len = if field == 4 { 8 } else { 4 };
            debug_assert!(at + len <= frag + FRAG_HEADER_SIZE);
            poke(region, at, &bytes[..len]);
        }
    }
}

fn hostile(how: Attack) {
    let seed = std::process::id() as u64 * 0x9e37_79b9 + how as u64 + 1;
    eprintln!("{how:?}: seed {seed}");
    let mut rng = Rng(seed);
    let job = format!("hostile{}{how:?}", std::process::id());
    let dir = std::env::temp_dir().join(&job);
    std::fs::create_dir_all(&dir).unwrap();
    let uid = rustix::process::getuid().as_raw();
    let path = segment_dir(Some(&dir))
        .unwrap()
        .join(segment_file_name(uid, &job, "node").unwrap());

    // Rank 0 creates the segment once the job's wire-up fence has passed;
    // rank 1, the last to attach, unlinks it. To get in between, the
    // attacker — any process of the user can — writes rank 1's wire-up
    // records (its node name and its arrival at the first fence) into the
    // session directory itself, so rank 0 goes ahead before rank 1 exists.
    let records = dir.join("wireup");
    std::fs::create_dir_all(&records).unwrap();
    std::fs::write(records.join("node.1"), "node").unwrap();
    std::fs::write(records.join("fence-1.1"), "").unwrap();
    let mut victims = vec![spawn_rank(&job, &dir, 0)];
    // In before rank 1 attaches.
    let mapping = open_segment(&path);
    victims.push(spawn_rank(&job, &dir, 1));
    // Drain the victims' stderr as they write (a full pipe would block them).
    let readers: Vec<_> = victims
        .iter_mut()
        .map(|v| {
            let mut pipe = v.stderr.take().unwrap();
            std::thread::spawn(move || {
                let mut err = String::new();
                let _ = pipe.read_to_string(&mut err);
                err
            })
        })
        .collect();
    let region = mapping.region();
    let control = Control::new(region).unwrap();
    let t0 = Instant::now();
    while !control.is_ready() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "segment never ready"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let (params, _, max_procs) = control.read_params(&SmParams::default()).unwrap();
    let layout = segment_layout(&params, max_procs).unwrap();
    // Both ranks ready, then let them exchange a little.
    while (0..2).any(|r| {
        control.record(r).map_or(true, |rec| {
            rec.state.load(btl_core::sync::Ordering::Acquire) != RANK_READY
        })
    }) {
        assert!(t0.elapsed() < Duration::from_secs(30), "ranks never ready");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(300));
    for (r, v) in victims.iter_mut().enumerate() {
        assert!(
            v.try_wait().unwrap().is_none(),
            "{how:?}: rank {r} ended before the attack"
        );
    }

    let start = Instant::now();
    let mut writes = 0u64;
    while start.elapsed() < ATTACK {
        for _ in 0..64 {
            attack(&region, &layout, how, &mut rng);
            writes += 1;
        }
        std::thread::sleep(Duration::from_micros(200));
        if victims.iter_mut().all(|v| v.try_wait().unwrap().is_some()) {
            break;
        }
    }
    eprintln!("{how:?}: {writes} hostile writes");

    let ended = Instant::now();
    let mut statuses = Vec::new();
    let mut readers = readers.into_iter();
    for r in 0..victims.len() {
        let status = loop {
            let v = &mut victims[r];
            if let Some(s) = v.try_wait().unwrap() {
                break s;
            }
            if ended.elapsed() > DEADLINE {
                let stacks = stacks(v.id());
                for v in victims.iter_mut() {
                    let _ = v.kill();
                }
                let err: String = readers.next().unwrap().join().unwrap();
                panic!("{how:?}: rank {r} hung after the attack\n{err}\n{stacks}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let err = readers.next().unwrap().join().unwrap();
        statuses.push((r, status, err));
    }
    let _ = std::fs::remove_dir_all(&dir);
    for (r, status, err) in statuses {
        let tail: String = err.lines().rev().take(15).collect::<Vec<_>>().join("\n");
        eprintln!("{how:?}: rank {r} {status}; stderr ends with:\n{tail}");
        assert_eq!(
            status.signal(),
            None,
            "{how:?}: rank {r} was killed by a signal\n{err}"
        );
        assert!(
            !err.contains("panicked"),
            "{how:?}: rank {r} panicked\n{err}"
        );
        // Either it kept serving (exit 0: `btl stress` checked every
        // message intact) or it stopped with an error saying why.
        if !status.success() {
            assert!(
                err.lines().any(|l| ["error", "timed out", "failed"]
                    .iter()
                    .any(|w| l.contains(w))),
                "{how:?}: rank {r} failed without an error message\n{err}"
            );
        }
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

#[test]
fn victims_survive_random_ring_slots() {
    hostile(Attack::RingSlots);
}

#[test]
fn victims_survive_random_ring_counters() {
    hostile(Attack::RingCounters);
}

#[test]
fn victims_survive_random_fragment_headers() {
    hostile(Attack::FragHeaders);
}
