//! Interop with Linux, for real: inside a network namespace this test
//! creates, a smoltcp node (btl-baremetal, hosted on a TAP device at
//! 10.78.0.2) and a btl-linux process on kernel TCP (bound to the TAP's
//! host side, 10.78.0.1) form a 2-rank job and exchange messages both ways
//! — the Linux side connecting first, the smoltcp side connecting first,
//! and both at once (with either side as the lower rank) — then run
//! `btl stress` (btl-linux's own `stress` command on the Linux side, its
//! logic over the smoltcp node on the other). Skipped, saying why, where
//! namespaces or TAP devices cannot be made; the namespace (and with it
//! the TAP device) is removed on every path.
//!
//! The two ranks are this test binary run again inside the namespace
//! (`ip netns exec`), with `BTL_BM_ROLE` saying which. With `--bench`
//! (`cargo test --release -p btl-baremetal --test tap_interop -- --bench`)
//! it runs `btl bench` between the smoltcp node and Linux, and between
//! two Linux processes in the same namespace, instead of the tests.

#[path = "../examples/hosted/mod.rs"]
mod hosted;
// The tests' one helper for missing prerequisites.
#[path = "../../platform-linux/tests/common/prereq.rs"]
mod prereq;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use btl_cli::transport::{BoxError, Transport};
use btl_linux::job::JobEnv;
use btl_linux::world::{Event, Flow};

const TAP: &str = "btltap0";
const LINUX_IP: &str = "10.78.0.1";
const BM_IP: &str = "10.78.0.2/24";
/// Both sides' frames stay within the smoltcp node's message buffer.
const MAX_FRAME: &str = "131072";
const TAG: u8 = 5;
const K: u64 = 200;

fn main() {
    match std::env::var("BTL_BM_ROLE").ok().as_deref() {
        Some(role) => std::process::exit(child(role)),
        None => {
            let bench = std::env::args().any(|a| a == "--bench");
            parent(bench)
        }
    }
}

// ---- the parent: namespace, scenarios, assertions ----------------------

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        ip(&["netns", "del", &self.0]);
    }
}

fn parent(bench: bool) {
    let ns = format!("btlbm{}", std::process::id());
    if !ip(&["netns", "add", &ns]) {
        prereq::missing("tap_interop: cannot create a network namespace here (`ip netns add` failed: needs root / CAP_SYS_ADMIN and iproute2)");
        return;
    }
    let guard = Netns(ns.clone());
    if !ip(&["-n", &ns, "tuntap", "add", "dev", TAP, "mode", "tap"]) {
        prereq::missing(
            "tap_interop: cannot create a TAP device (`ip tuntap add` failed: needs /dev/net/tun)",
        );
        return;
    }
    for args in [
        vec!["-n", &ns, "link", "set", "lo", "up"],
        vec!["-n", &ns, "addr", "add", "10.78.0.1/24", "dev", TAP],
        vec!["-n", &ns, "link", "set", TAP, "up"],
    ] {
        assert!(ip(&args), "ip {args:?}");
    }
    if bench {
        run_bench(&ns);
    } else {
        run_tests(&ns);
    }
    drop(guard);
    assert!(
        !ip(&["netns", "exec", &ns, "true"]),
        "namespace {ns} left behind"
    );
}

/// Starts both ranks of one scenario in the namespace and waits for them
/// (at most 180 s). `roles[r]` is rank r's role.
fn scenario(ns: &str, name: &str, roles: [&str; 2], extra: &[(&str, String)]) -> [Output; 2] {
    scenario_cut(ns, name, roles, extra, None).0
}

/// [`scenario`]; with `cut` the TAP link is cut that long after the start
/// (nftables in the namespace drops everything through the TAP, both ways:
/// no FIN, no RST) — returns when the cut happened and when each rank
/// ended.
fn scenario_cut(
    ns: &str,
    name: &str,
    roles: [&str; 2],
    extra: &[(&str, String)],
    cut: Option<Duration>,
) -> ([Output; 2], Option<Instant>, [Option<Instant>; 2]) {
    let exe = std::env::current_exe().unwrap();
    let job = format!("bm-{name}-{}", std::process::id());
    let dir = std::env::temp_dir().join(&job);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let start = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 2500;
    let mut children: Vec<_> = roles
        .iter()
        .enumerate()
        .map(|(rank, role)| {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns])
                .arg(&exe)
                .env("BTL_BM_ROLE", role)
                .env("BTL_BM_SCENARIO", name)
                .env("BTL_BM_START_MS", start.to_string())
                .env("BTL_JOB", &job)
                .env("BTL_RANK", rank.to_string())
                .env("BTL_SIZE", "2")
                .env("BTL_LOCAL_RANK", "0")
                .env("BTL_LOCAL_SIZE", "1")
                .env("BTL_SESSION_DIR", &dir)
                .env("BTL_NODE", format!("node{rank}"))
                .env("BTL_BIND", LINUX_IP)
                .env("BTL_TCP_MAX_FRAME", MAX_FRAME)
                .env("BTL_TIMEOUT", "120")
                .env("BTL_LOG", "warn")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in extra {
                c.env(k, v);
            }
            c.spawn().unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut cut_at = None;
    let mut ended = [None, None];
    let t0 = Instant::now();
    loop {
        for (i, c) in children.iter_mut().enumerate() {
            if ended[i].is_none() && c.try_wait().ok().flatten().is_some() {
                ended[i] = Some(Instant::now());
            }
        }
        if ended.iter().all(Option::is_some) {
            break;
        }
        if let (Some(d), None) = (cut, cut_at) {
            if t0.elapsed() >= d {
                cut_link(ns);
                cut_at = Some(Instant::now());
            }
        }
        if Instant::now() > deadline {
            for c in &mut children {
                let _ = c.kill();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let mut outs = children.into_iter().map(|c| c.wait_with_output().unwrap());
    ([outs.next().unwrap(), outs.next().unwrap()], cut_at, ended)
}

/// Drops everything through the TAP device, both directions.
fn cut_link(ns: &str) {
    for rule in [
        "add table inet cut".to_string(),
        format!("add chain inet cut in {{ type filter hook input priority 0; iifname \"{TAP}\" drop; }}"),
        format!("add chain inet cut out {{ type filter hook output priority 0; oifname \"{TAP}\" drop; }}"),
    ] {
        let ok = Command::new("ip")
            .args(["netns", "exec", ns, "nft", &rule])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "nft {rule} failed (scripts/setup.sh installs nftables)");
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn check(name: &str, outs: &[Output; 2]) -> [String; 2] {
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "{name}: rank {r} failed\n{}", text(o));
    }
    [0, 1].map(|r| String::from_utf8_lossy(&outs[r].stdout).into_owned())
}

/// The smoltcp node's counters, from its `STATS accepted=A connected=C
/// tie_breaks=T` line.
fn stats(out: &str) -> (u32, u32, u32) {
    let line = out
        .lines()
        .find(|l| l.starts_with("STATS "))
        .unwrap_or_else(|| panic!("no STATS line in {out}"));
    let v: Vec<u32> = line
        .split_whitespace()
        .skip(1)
        .map(|kv| kv.split('=').nth(1).unwrap().parse().unwrap())
        .collect();
    (v[0], v[1], v[2])
}

fn run_tests(ns: &str) {
    let mut passed = 0;
    // (name, roles by rank, the smoltcp node's expected (accepted, connected)).
    for (name, roles) in [
        ("linux-first", ["bm", "linux"]),
        ("bm-first", ["bm", "linux"]),
        ("both", ["bm", "linux"]),
        ("both", ["linux", "bm"]),
    ] {
        let outs = scenario(ns, name, roles, &[]);
        let out = check(name, &outs);
        let bm = roles.iter().position(|r| *r == "bm").unwrap();
        for (r, o) in out.iter().enumerate() {
            assert!(
                o.contains(&format!("RECEIVED {K} intact")),
                "{name}: rank {r}\n{}",
                text(&outs[r])
            );
        }
        let (accepted, connected, ties) = stats(&out[bm]);
        let seen = format!("{name} (smoltcp node rank {bm}): accepted={accepted} connected={connected} tie_breaks={ties}");
        println!("{seen}");
        match name {
            // The Linux side connected: the smoltcp node accepted.
            "linux-first" => assert_eq!((accepted, connected), (1, 0), "{seen}"),
            // The smoltcp node connected; Linux accepted.
            "bm-first" => assert_eq!((accepted, connected), (0, 1), "{seen}"),
            // One connection survives; when both attempts met, the lower
            // rank's.
            _ => {
                assert_eq!(accepted + connected, 1, "{seen}");
                if ties > 0 {
                    let want = if bm == 0 { (0, 1) } else { (1, 0) };
                    assert_eq!((accepted, connected), want, "{seen}");
                }
            }
        }
        passed += 1;
    }
    // btl stress between them (get/put and the refusals included).
    let outs = scenario(ns, "stress", ["bm", "linux"], &[]);
    let out = check("stress", &outs);
    for (r, o) in out.iter().enumerate() {
        assert!(
            o.contains("all intact"),
            "stress: rank {r}\n{}",
            text(&outs[r])
        );
    }
    print!("{}{}", out[0], out[1]);
    passed += 1;
    // A partition between them: 3 s into a long stress the TAP link is
    // cut. Both sides notice the dead link (Linux: TCP_USER_TIMEOUT and
    // keep-alive; smoltcp: its socket timeout and keep-alive, from the
    // same parameters) and end with an error naming the other.
    let short: Vec<(&str, String)> = [
        ("BTL_TCP_USER_TIMEOUT", "3000"),
        ("BTL_TCP_KEEPALIVE_TIME", "2"),
        ("BTL_TCP_KEEPALIVE_INTVL", "1"),
        ("BTL_TCP_KEEPALIVE_PROBES", "3"),
        ("BTL_TIMEOUT", "60"),
    ]
    .map(|(k, v)| (k, v.to_string()))
    .into();
    let (outs, cut_at, ended) = scenario_cut(
        ns,
        "partition",
        ["bm", "linux"],
        &short,
        Some(Duration::from_secs(3)),
    );
    let cut_at = cut_at.expect("the link was cut before both ranks ended");
    for (r, want) in [(0, "peer 1 failed"), (1, "rank 0 failed")] {
        let t = text(&outs[r]);
        let at = ended[r].unwrap_or_else(|| panic!("partition: rank {r} hung\n{t}"));
        let after = at.duration_since(cut_at).as_secs_f64();
        println!("partition: rank {r} ended {after:.1} s after the cut");
        assert!(
            !outs[r].status.success(),
            "partition: rank {r} claims success\n{t}"
        );
        assert!(
            t.contains(want),
            "partition: rank {r} does not say {want:?}\n{t}"
        );
        assert!(after < 30.0, "partition: rank {r} took {after:.1} s\n{t}");
    }
    passed += 1;
    println!("tap_interop: {passed} passed, 0 failed");
}

fn run_bench(ns: &str) {
    let sizes = std::env::var("BTL_BM_SIZES").unwrap_or_else(|_| "8,1024,65536,1048576".into());
    let extra = [("BTL_BM_SIZES", sizes)];
    let outs = scenario(ns, "bench", ["bm", "linux"], &extra);
    let out = check("bench smoltcp-linux", &outs);
    println!(
        "smoltcp node (rank 0) <-> Linux kernel TCP (rank 1), over the TAP:\n{}",
        out[0]
    );
    let outs = scenario(ns, "bench", ["linux", "linux"], &extra);
    let out = check("bench linux-linux", &outs);
    println!(
        "Linux kernel TCP <-> Linux kernel TCP, same namespace:\n{}",
        out[0]
    );
}

// ---- the children: one rank each ---------------------------------------

fn child(role: &str) -> i32 {
    btl_linux::job::init_logging();
    match run_child(role) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{role}: {e}");
            1
        }
    }
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

fn run_child(role: &str) -> Result<(), BoxError> {
    JobEnv::from_env()?.ok_or("not in a job")?;
    let name = var("BTL_BM_SCENARIO");
    let os = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
    let messages = if name == "partition" {
        "3000000"
    } else {
        "300"
    };
    if role == "linux" && (name == "stress" || name == "partition") {
        let code = btl_cli::stress::cmd(&os(&[
            "--transport",
            "tcp",
            "--messages",
            messages,
            "--max-size",
            "200000",
        ]));
        return if code == 0 {
            Ok(())
        } else {
            Err(format!("btl stress exited {code}").into())
        };
    }
    let sizes = var("BTL_BM_SIZES");
    if role == "linux" && name == "bench" {
        let code = btl_cli::bench::cmd(&os(&["--transport", "tcp", "--sizes", &sizes]));
        return if code == 0 {
            Ok(())
        } else {
            Err(format!("btl bench exited {code}").into())
        };
    }
    let started = Instant::now();
    let mut t: Box<dyn Transport> = if role == "bm" {
        let cidr = BM_IP.parse().map_err(|_| "bad BM_IP")?;
        Box::new(hosted::TapNode::open(TAP, cidr, 7000)?)
    } else {
        Box::new(btl_linux::world::World::init(
            btl_linux::world::Choice::Tcp,
        )?)
    };
    let mut out = std::io::stdout().lock();
    match name.as_str() {
        "stress" | "partition" => {
            let opts = btl_cli::stress::parse_args(&os(&[
                "--messages",
                messages,
                "--max-size",
                "200000",
            ]))?;
            let r = btl_cli::stress::run_on(t.as_mut(), &opts, started, &mut out)?;
            if !r.errors.is_empty() {
                return Err(format!("{} errors", r.errors.len()).into());
            }
        }
        "bench" => {
            let mut opts = btl_cli::bench::parse_args(&os(&["--sizes", &sizes]))?;
            opts.transports = vec!["smoltcp".into()];
            btl_cli::bench::run_on(t.as_mut(), &opts, &mut out)?;
        }
        _ => exchange(t.as_mut(), role, &name, &mut out)?,
    }
    if role == "bm" {
        // The node's counters, for the parent: "... (accepted=A connected=C
        // tie_breaks=T rejected=R)".
        let s = t.summary();
        let field = |k: &str| {
            s.split(&format!("{k}="))
                .nth(1)
                .and_then(|x| x.split([' ', ')']).next())
                .unwrap_or("?")
                .to_string()
        };
        use std::io::Write;
        writeln!(
            out,
            "STATS accepted={} connected={} tie_breaks={}",
            field("accepted"),
            field("connected"),
            field("tie_breaks")
        )?;
    }
    Ok(())
}

fn msg_len(src: u32, seq: u64) -> usize {
    let x = (u64::from(src) << 40 ^ seq).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    match x % 10 {
        0..=5 => (x >> 20) as usize % 100,
        6..=8 => (x >> 20) as usize % 20_000,
        _ => (x >> 20) as usize % 300_000,
    }
}

fn msg(src: u32, seq: u64) -> Vec<u8> {
    (0..msg_len(src, seq))
        .map(|i| (i as u64 ^ seq.wrapping_mul(31) ^ u64::from(src) << 7) as u8)
        .collect()
}

/// Sends K messages (mixed sizes, some chunked) and receives K, in the
/// order the scenario says; checks every byte.
fn exchange(
    t: &mut dyn Transport,
    role: &str,
    name: &str,
    out: &mut impl std::io::Write,
) -> Result<(), BoxError> {
    let me = t.rank();
    let peer = 1 - me;
    // Messages checked so far, and what was wrong.
    let mut g: (u64, Vec<String>) = (0, Vec::new());
    let check = |g: &mut (u64, Vec<String>), ev: Event<'_>| {
        if let Event::Message {
            from,
            tag: TAG,
            data,
        } = ev
        {
            let seq = g.0;
            g.0 += 1;
            if data != msg(from, seq).as_slice() {
                g.1.push(format!("message {seq} from {from} differs"));
            }
        }
        if g.0 >= K {
            Flow::Done
        } else {
            Flow::Continue
        }
    };
    let first = match name {
        "linux-first" => role == "linux",
        "bm-first" => role == "bm",
        _ => true,
    };
    // Both at once: start at the same wall-clock millisecond.
    let start: u128 = var("BTL_BM_START_MS").parse().unwrap_or(0);
    loop {
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
        if now >= start {
            break;
        }
        t.poll(&mut |_, ev| check(&mut g, ev));
        std::thread::sleep(Duration::from_micros(200));
    }
    let send_all = |t: &mut dyn Transport, g: &mut (u64, Vec<String>)| -> Result<(), BoxError> {
        for seq in 0..K {
            t.send(peer, TAG, &msg(me, seq))?;
            t.poll(&mut |_, ev| check(g, ev));
        }
        Ok(())
    };
    if first {
        send_all(t, &mut g)?;
    }
    if g.0 < K {
        t.drive("the peer's messages", Some(peer), &mut |_, ev| {
            check(&mut g, ev)
        })?;
    }
    if !first {
        send_all(t, &mut g)?;
    }
    t.flush()?;
    t.barrier()?;
    if !g.1.is_empty() {
        return Err(format!("{:?}", &g.1[..g.1.len().min(5)]).into());
    }
    writeln!(out, "RECEIVED {} intact", g.0)?;
    Ok(())
}
