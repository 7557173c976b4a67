//! A job across two network-namespace hosts whose network fails, and one
//! whose receiver stops for a while: memory stays bounded (the per-peer
//! send queues are bounded; a full queue makes the sender wait) and a dead
//! link is detected (keep-alive, `TCP_USER_TIMEOUT`, `BTL_TIMEOUT`) — no
//! rank grows until the OOM killer fires, none hangs.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

mod common;
use common::cluster::{agent, ip, Cluster};
use common::{children, environ_var, spawn_piped, BTL};

/// Peak resident memory (`VmHWM`) of `pid` in KiB, if it still runs.
fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Every descendant of `pid`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut all = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for c in children(p) {
            all.push(c);
            todo.push(c);
        }
    }
    all
}

/// The process of rank `rank` among `root` and its descendants.
fn rank_pid(root: u32, rank: u32) -> Option<u32> {
    std::iter::once(root).chain(descendants(root)).find(|&p| {
        environ_var(p, "BTL_RANK").as_deref() == Some(&rank.to_string())
            && std::fs::read_link(format!("/proc/{p}/exe"))
                .is_ok_and(|e| e.to_string_lossy().contains("btl"))
    })
}

/// Cuts host `h` off the network: nftables in its namespace drops
/// everything through its interface, both directions (a switch failure).
fn cut(h: &str) {
    let nft = |args: &[&str]| {
        let ok = Command::new("ip")
            .args(["netns", "exec", h, "nft"])
            .args(args)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "nft {args:?} in {h} failed (scripts/setup.sh installs nftables)"
        );
    };
    nft(&["add", "table", "inet", "cut"]);
    nft(&["add chain inet cut in { type filter hook input priority 0; iifname \"eth0\" drop; }"]);
    nft(&["add chain inet cut out { type filter hook output priority 0; oifname \"eth0\" drop; }"]);
}

fn have_nft() -> bool {
    let ok = Command::new("nft").arg("--version").output().is_ok();
    if !ok {
        common::prereq::missing("nft not found (scripts/setup.sh installs nftables)");
    }
    ok
}

/// Short dead-link detection, so the test ends quickly.
const DETECT: [(&str, &str); 4] = [
    ("BTL_TCP_KEEPALIVE_TIME", "2"),
    ("BTL_TCP_KEEPALIVE_INTVL", "1"),
    ("BTL_TCP_KEEPALIVE_PROBES", "3"),
    ("BTL_TCP_USER_TIMEOUT", "4000"),
];

/// Waits for every child (bounded), sampling their peak memory; returns
/// when each ended (`None`: killed at the deadline) and the largest
/// `VmHWM` seen of each (KiB).
fn watch(children: &mut [Child], deadline: Instant) -> (Vec<Option<Instant>>, Vec<u64>) {
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    let mut ended = vec![None; children.len()];
    let mut peak = vec![0u64; children.len()];
    while ended.iter().any(Option::is_none) {
        for (i, ch) in children.iter_mut().enumerate() {
            if ended[i].is_some() {
                continue;
            }
            peak[i] = peak[i].max(vm_hwm_kib(pids[i]).unwrap_or(0));
            if ch.try_wait().unwrap().is_some() {
                ended[i] = Some(Instant::now());
            }
        }
        if Instant::now() > deadline {
            for (i, ch) in children.iter_mut().enumerate() {
                if ended[i].is_none() {
                    let _ = ch.kill();
                    let _ = ch.wait();
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (ended, peak)
}

/// 4 ranks on hosts A (0, 1) and B (2, 3), started through a rendezvous
/// (rank 0 serves it) so that each rank ends on its own. Three seconds
/// into a long `btl stress`, B's network is cut. Every rank on A ends,
/// within the detection timeout plus a few seconds, with an error naming
/// a lost peer; no rank's peak memory reaches 512 MiB; nothing is left in
/// /dev/shm.
#[test]
fn a_partition_ends_every_rank_with_bounded_memory() {
    if !have_nft() {
        return;
    }
    let Some(c) = Cluster::new(4, 2) else { return };
    let job = format!("part{}", std::process::id());
    let rendezvous = format!("tcp://{}:{}", c.addr(1), 20000 + std::process::id() % 10000);
    let mut ranks: Vec<Child> = (0..4u32)
        .map(|r| {
            let host = &c.hosts[(r / 2) as usize];
            let mut env = format!(
                "BTL_WIREUP={rendezvous} BTL_RANK={r} BTL_SIZE=4 BTL_JOB={job} BTL_TIMEOUT=20 \
                 BTL_TCP_IF_INCLUDE={}",
                c.cidr
            );
            for (k, v) in DETECT {
                env += &format!(" {k}={v}");
            }
            spawn_piped(
                Command::new(agent())
                    .arg(host)
                    .arg(format!(
                        "exec env {env} {BTL} stress --messages 3000000 --max-size 4096"
                    ))
                    .env("BTL_NETNS_HOSTS", c.hosts_file())
                    .env_remove("BTL_RANK")
                    .env_remove("BTL_WIREUP"),
            )
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    cut(&c.hosts[1]);
    let cut_at = Instant::now();
    // Detection (4 s of unacknowledged data, or keep-alive) well within
    // BTL_TIMEOUT (20 s); the bound only catches hangs.
    let deadline = cut_at + Duration::from_secs(20 + 15);
    let (ended, peaks) = watch(&mut ranks, deadline);
    let outs: Vec<_> = ranks
        .into_iter()
        .map(|ch| ch.wait_with_output().unwrap())
        .collect();
    for (r, o) in outs.iter().enumerate() {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        let at = ended[r].unwrap_or_else(|| panic!("rank {r} hung after the cut:\n{text}"));
        println!(
            "rank {r}: ended {:.1} s after the cut, {:?}, peak {} MiB",
            at.duration_since(cut_at).as_secs_f64(),
            o.status,
            peaks[r] / 1024
        );
        println!(
            "{}",
            text.lines()
                .filter(|l| l.contains("failed"))
                .take(2)
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert!(!o.status.success(), "rank {r} claims success:\n{text}");
        assert!(peaks[r] < 512 * 1024, "rank {r} peaked at {} KiB", peaks[r]);
        if r < 2 {
            // A lost peer across the cut; or its partner on A, when that
            // partner saw the partition first, ended, and named it (a
            // race between the two detections, lost under load).
            let names_remote = |t: &str| t.contains("rank 2 failed") || t.contains("rank 3 failed");
            let partner = 1 - r;
            let partner_text = format!(
                "{}{}",
                String::from_utf8_lossy(&outs[partner].stdout),
                String::from_utf8_lossy(&outs[partner].stderr)
            );
            assert!(
                names_remote(&text)
                    || (text.contains(&format!("rank {partner} failed"))
                        && names_remote(&partner_text)),
                "rank {r} does not name a lost peer:\n{text}\nrank {partner}:\n{partner_text}"
            );
        }
    }
    let leftovers: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(&job))
        .collect();
    assert!(leftovers.is_empty(), "left in /dev/shm: {leftovers:?}");
    ip(&["netns", "exec", &c.hosts[1], "nft", "flush", "ruleset"]);
    drop(c);
}

/// A receiver that stops for ten seconds (SIGSTOP, then SIGCONT) on one
/// of two hosts: its senders wait instead of queueing without bound —
/// their peak memory stays small — and the job then completes intact.
#[test]
fn a_stopped_receiver_keeps_senders_bounded_and_loses_nothing() {
    let Some(c) = Cluster::new(5, 2) else { return };
    let mut launcher = spawn_piped(
        c.btl_stress(170, 2, 2, &agent())
            .args(["--messages", "20000", "--max-size", "8192"])
            .env("BTL_TIMEOUT", "60"),
    );
    let root = launcher.id();
    // Find the ranks (rank 3 is the one we stop).
    let t0 = Instant::now();
    let mut pids = [None; 4];
    while pids.iter().any(Option::is_none) && t0.elapsed() < Duration::from_secs(30) {
        for (r, p) in pids.iter_mut().enumerate() {
            if p.is_none() {
                *p = rank_pid(root, r as u32);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let victim = pids[3].expect("rank 3 started");
    std::thread::sleep(Duration::from_millis(500));
    let stopped = launcher.try_wait().unwrap().is_none();
    assert!(
        stopped,
        "the job ended before the receiver could be stopped"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(victim as i32).unwrap(),
        rustix::process::Signal::STOP,
    )
    .unwrap();
    let mut peak = [0u64; 4];
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        for (r, p) in pids.iter().enumerate() {
            peak[r] = peak[r].max(p.and_then(vm_hwm_kib).unwrap_or(0));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(victim as i32).unwrap(),
        rustix::process::Signal::CONT,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        for (r, p) in pids.iter().enumerate() {
            peak[r] = peak[r].max(p.and_then(vm_hwm_kib).unwrap_or(0));
        }
        if launcher.try_wait().unwrap().is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "the job hung after SIGCONT");
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = launcher.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    println!("peak memory per rank (MiB): {:?}", peak.map(|k| k / 1024));
    assert!(o.status.success(), "{:?}\n{out}\n{err}", o.status);
    assert_eq!(out.matches("all intact").count(), 4, "{out}\n{err}");
    for (r, k) in peak.iter().enumerate() {
        assert!(*k < 256 * 1024, "rank {r} peaked at {k} KiB");
    }
    drop(c);
}
