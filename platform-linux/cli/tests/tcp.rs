//! The TCP transport end to end, through the `btl` binary over loopback.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;
use common::{btl_run, children, environ_var, spawn_piped, BTL};

/// `btl run --timeout 120 -n N -- btl ARGS...` with extra environment.
fn run_env(n: u32, env: &[(&str, &str)], args: &[&str]) -> Output {
    btl_run(120, n)
        .arg(BTL)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run btl")
}

/// [`run_env`] of `btl stress --transport tcp OPTS` (OPTS split at white
/// space).
fn stress(n: u32, env: &[(&str, &str)], opts: &str) -> Output {
    let args: Vec<&str> = ["stress", "--transport", "tcp"]
        .into_iter()
        .chain(opts.split_whitespace())
        .collect();
    run_env(n, env, &args)
}

/// [`stress`] that must pass ([`assert_intact`]); its stdout.
fn intact(n: u32, env: &[(&str, &str)], opts: &str) -> String {
    assert_intact(&stress(n, env, opts), n)
}

/// Asserts a stress run of `n` ranks passed ([`common::assert_intact`]),
/// each rank over TCP to all the others.
fn assert_intact(o: &Output, n: u32) -> String {
    let out = common::assert_intact(o, n);
    let tcp = format!("TCP to {} rank(s)", n - 1);
    assert_eq!(out.matches(&tcp).count(), n as usize, "{out}");
    out
}

#[test]
fn large_messages_travel_as_chains_of_frames() {
    // max_frame at its minimum (max_send_size): 1 MiB messages are chunked.
    intact(
        2,
        &[("BTL_TCP_MAX_FRAME", "131072")],
        "--messages 100 --max-size 1048576",
    );
}

#[test]
fn stress_over_tcp_2_and_4_ranks() {
    for (n, m) in [(2, 300), (4, 100)] {
        intact(n, &[], &format!("--messages {m} --max-size 1048576"));
    }
}

#[test]
fn frames_of_several_mib_travel_in_pieces_intact() {
    // Frames of 2 MiB and more are written in pieces (`PIECE_FRAME_MIN`),
    // each pass one: 2 ranks (one connection, read directly) and 4 (three
    // each), messages up to 8 MiB.
    for n in [2, 4] {
        intact(n, &[], "--messages 200 --max-size 8388608");
    }
}

#[test]
fn large_payloads_read_under_a_low_water_mark_arrive_intact() {
    // recv_lowat: payloads of 2 MiB and more, and streams of smaller ones,
    // are read only once that many bytes wait. At its smallest, at the
    // default, above what a fixed 256 KiB receive buffer holds (the kernel
    // caps the mark, and reports a closing window as readable), at the
    // default with a 4 MiB receive buffer (an open window: a mark left
    // above a payload's last bytes would stall the ping-pong), and off.
    // Stress (random sizes up to 4 MiB, get/put) and a ping-pong of 3 MB
    // and 4 MiB + 3 (each message the last thing on the wire until it is
    // read) complete, nothing lost or corrupted.
    for (lowat, rcvbuf) in [
        ("4096", "0"),
        ("131072", "0"),
        ("16M", "262144"),
        ("131072", "4194304"),
        ("0", "0"),
    ] {
        let env = [("BTL_TCP_RECV_LOWAT", lowat), ("BTL_TCP_RCVBUF", rcvbuf)];
        intact(2, &env, "--messages 150 --max-size 4194307");
        let bench = [
            "bench",
            "--transport",
            "tcp",
            "--sizes",
            "3000000,4194307",
            "--iterations",
            "20",
        ];
        let o = run_env(2, &env, &bench);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "recv_lowat {lowat}, rcvbuf {rcvbuf}: {:?}\n{out}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        for size in ["3000000", "4194307"] {
            assert!(
                out.lines()
                    .any(|l| l.split_whitespace().nth(1) == Some(size)),
                "recv_lowat {lowat}, rcvbuf {rcvbuf}: no {size} line\n{out}"
            );
        }
    }
}

#[test]
fn bench_over_tcp_prints_tcp_lines() {
    let o = Command::new(BTL)
        .args([
            "bench",
            "--transport",
            "tcp",
            "--quick",
            "--sizes",
            "8,200000",
            "--json",
        ])
        .env_remove("BTL_RANK")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].starts_with(r#"{"transport":"tcp","size":8,"latency_us":"#),
        "{out}"
    );
}

/// Established TCP connections whose local port is `port` (from
/// /proc/net/tcp: IPv4, this network namespace).
fn established_to(port: u16) -> usize {
    let table = fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3
                && f[3] == "01"
                && f[1]
                    .rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
                    == Some(port)
        })
        .count()
}

/// A 24-byte handshake.
fn handshake(magic: &[u8; 4], version: u16, job: u64, rank: u32) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(magic);
    v.extend_from_slice(&version.to_le_bytes());
    v.extend_from_slice(&0u16.to_le_bytes());
    v.extend_from_slice(&job.to_le_bytes());
    v.extend_from_slice(&rank.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v
}

fn job_hash(job: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in job.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[test]
fn hostile_clients_are_dropped_and_the_job_completes() {
    let launcher = spawn_piped(
        btl_run(120, 2)
            .args([BTL, "stress", "--transport", "tcp"])
            // Long enough (about 3.5 s here) to outlive the unfinished
            // handshake's 1 s timeout below: with 300000 messages the job
            // ended after about a second, sometimes before that timeout
            // fired, and the connection closed unreported.
            .args(["--messages", "1000000", "--max-size", "200"])
            .env("BTL_TCP_HANDSHAKE_TIMEOUT", "1000")
            // Records in the session directory, where this test reads the
            // ranks' addresses.
            .env("BTL_WIREUP", "dir"),
    );
    // Find rank 0, its session directory and its published address.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (job, (addr, addr1)) = loop {
        assert!(Instant::now() < deadline, "ranks did not start");
        let found = children(launcher.id())
            .into_iter()
            .find_map(|p| (environ_var(p, "BTL_RANK")? == "0").then_some(p));
        if let Some(p) = found {
            let dir = environ_var(p, "BTL_SESSION_DIR").unwrap();
            let a0 = fs::read_to_string(format!("{dir}/wireup/tcp-addr.0"));
            let a1 = fs::read_to_string(format!("{dir}/wireup/tcp-addr.1"));
            if let (Ok(a0), Ok(a1)) = (a0, a1) {
                // Each record lists one address per family; take the first
                // (IPv4).
                let first = |a: &str| a.trim().split(',').next().unwrap_or("").to_string();
                break (environ_var(p, "BTL_JOB").unwrap(), (first(&a0), first(&a1)));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // A connection to rank 1 that passes for rank 0 (valid handshake) and
    // announces a 4 GiB frame. The lower rank's connection wins a tie, so
    // the real rank 0 connects to rank 1's port; once it has, the impostor
    // is refused at its handshake, dropped, and the job goes on.
    let port1: u16 = addr1.rsplit(':').next().unwrap().parse().unwrap();
    let t0 = Instant::now();
    while established_to(port1) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "rank 0 never connected to rank 1"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut big = TcpStream::connect(&addr1).unwrap();
    let _ = big.write_all(&handshake(b"BTLT", 1, job_hash(&job), 0));
    let mut hdr = vec![1u8, 7, 0, 0];
    hdr.extend_from_slice(&u32::MAX.to_le_bytes());
    hdr.extend_from_slice(&0u64.to_le_bytes());
    let _ = big.write_all(&hdr);
    big.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut sink = Vec::new();
    let _ = big.read_to_end(&mut sink);

    let hostile: Vec<(&str, Vec<u8>)> = vec![
        (
            "random bytes",
            (0..200u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect(),
        ),
        ("wrong magic", handshake(b"NOPE", 1, job_hash(&job), 1)),
        ("wrong version", handshake(b"BTLT", 99, job_hash(&job), 1)),
        (
            "unknown identity",
            handshake(b"BTLT", 1, job_hash(&job), 77),
        ),
        (
            "wrong job",
            handshake(b"BTLT", 1, job_hash("another-job"), 1),
        ),
    ];
    for (what, bytes) in &hostile {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(bytes);
        // The rank drops us: EOF or reset, not a hang.
        let mut buf = [0u8; 64];
        let r = s.read(&mut buf);
        assert!(
            matches!(r, Ok(0) | Err(_)),
            "{what}: connection not dropped: {r:?}"
        );
    }
    // A handshake that never finishes: dropped after the timeout (1 s).
    let mut slow = TcpStream::connect(&addr).unwrap();
    slow.write_all(&handshake(b"BTLT", 1, job_hash(&job), 1)[..10])
        .unwrap();
    // Our read's own timeout (60 s, far beyond the handshake timeout) only
    // catches a hang: the outcome is who ended the wait — the server's
    // close (EOF or reset), not our timeout.
    slow.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let r = slow.read(&mut [0u8; 8]);
    assert!(
        match &r {
            Ok(0) => true,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            Ok(_) => false,
        },
        "the unfinished handshake was not dropped: {r:?}"
    );
    let o = launcher.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_intact(&o, 2);
    // Each hostile connection is reported once (random bytes, wrong magic,
    // wrong version, unknown identity, wrong job, unfinished handshake);
    // the impostor repeating rank 0's valid identity is dropped quietly,
    // like the second connection of a simultaneous connect.
    assert!(err.matches("dropped connection").count() >= 6, "{err}");
    for what in ["magic", "version", "job", "rank 77", "handshake timeout"] {
        assert!(
            err.to_lowercase().contains(what),
            "no report of {what}:\n{err}"
        );
    }
}

#[test]
fn stress_over_ipv6_loopback_when_ipv4_is_disabled() {
    let has_v6 = fs::read_to_string("/proc/net/if_inet6")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("00000000000000000000000000000001"))
        })
        .unwrap_or(false);
    if !has_v6 {
        common::prereq::missing("this machine has no ::1 (IPv6 disabled)");
        return;
    }
    intact(
        2,
        &[("BTL_TCP_DISABLE_FAMILY", "4")],
        "--messages 100 --max-size 300000",
    );
    // And both families when neither is disabled: the published records
    // carry two addresses; peers pick IPv4.
    intact(2, &[], "--messages 20");
}
