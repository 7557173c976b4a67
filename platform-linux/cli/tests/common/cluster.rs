//! Several "hosts" on one machine, made by a test itself: a bridge in the
//! root namespace (the launcher's side) and one network namespace per host
//! joined to it by a veth pair (`eth0` in the host), with private
//! addresses; each rank runs in its host's namespace and, through
//! `scripts/netns-agent.sh`, in its own UTS namespace named after the host
//! — so ranks of one host share memory and ranks of different hosts talk
//! TCP. Everything is removed on drop.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn agent() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/netns-agent.sh");
    p.canonicalize().unwrap().to_string_lossy().into_owned()
}

pub fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// The kernel's neighbour (ARP) table limits. The table is one for every
/// network namespace of the machine: `n` namespace hosts talking all to all
/// need about `n * n` entries, and past `gc_thresh3` (1024 by default: 32
/// hosts) the kernel drops new entries ("neighbor table overflow") and the
/// packets waiting on them, so connects between hosts go unanswered for
/// many seconds. Real hosts each have their own kernel; hosts simulated on
/// one machine need the limits raised. Raised by [`Cluster::new`] (never
/// lowered) and put back when the last cluster drops.
const NEIGH: [&str; 3] = [
    "/proc/sys/net/ipv4/neigh/default/gc_thresh1",
    "/proc/sys/net/ipv4/neigh/default/gc_thresh2",
    "/proc/sys/net/ipv4/neigh/default/gc_thresh3",
];

/// Where the limits found before any cluster raised them are kept, for
/// the last cluster to drop (clusters of parallel tests share the limits).
const NEIGH_SAVED: &str = "/tmp/btl-tests-neigh-limits";

/// Raises the neighbour table limits for `n` hosts (the first raise saves
/// the machine's values in [`NEIGH_SAVED`]).
fn raise_neigh_limits(n: usize) {
    let need = (4 * (n + 1) * (n + 1)).max(1024);
    let cur: Vec<Option<usize>> = NEIGH
        .iter()
        .map(|f| std::fs::read_to_string(f).ok()?.trim().parse().ok())
        .collect();
    if !Path::new(NEIGH_SAVED).exists() && cur.iter().all(Option::is_some) {
        let saved: Vec<String> = cur.iter().flatten().map(|v| v.to_string()).collect();
        let _ = std::fs::write(NEIGH_SAVED, saved.join(" "));
    }
    for (i, (f, cur)) in NEIGH.iter().zip(cur).enumerate() {
        let want = need << i;
        if cur.is_some_and(|c| c < want) {
            let _ = std::fs::write(f, want.to_string());
        }
    }
}

/// Puts back the limits saved by the first raise.
fn restore_neigh_limits() {
    let Ok(saved) = std::fs::read_to_string(NEIGH_SAVED) else {
        return;
    };
    for (f, v) in NEIGH.iter().zip(saved.split_whitespace()) {
        let _ = std::fs::write(f, v);
    }
    let _ = std::fs::remove_file(NEIGH_SAVED);
}

/// A bridge and `n` host namespaces on `10.X.Y.0/24`; removed on drop.
pub struct Cluster {
    /// The bridge in the root namespace.
    pub bridge: String,
    /// The hosts' namespaces (and UTS names).
    pub hosts: Vec<String>,
    dir: PathBuf,
    /// The root namespace's address on the bridge.
    pub head: String,
    /// The hosts' network.
    pub cidr: String,
}

impl Cluster {
    /// `None` (after saying why) where namespaces cannot be made.
    pub fn new(tag: u32, n: usize) -> Option<Cluster> {
        let id = std::process::id();
        let x = 150 + id % 50;
        let probe = format!("btlp{tag}{}", id % 100_000);
        if !ip(&["netns", "add", &probe]) {
            super::prereq::missing(
                "cannot create network namespaces here (`ip netns add` failed: needs root / \
                 CAP_SYS_ADMIN and iproute2)",
            );
            return None;
        }
        ip(&["netns", "del", &probe]);
        let dir = std::env::temp_dir().join(format!("btl-multihost-{id}-{tag}"));
        std::fs::create_dir_all(&dir).unwrap();
        raise_neigh_limits(n);
        let mut c = Cluster {
            bridge: format!("btlbr{tag}{}", id % 10_000),
            hosts: Vec::new(),
            dir,
            head: format!("10.{x}.{tag}.254"),
            cidr: format!("10.{x}.{tag}.0/24"),
        };
        let br = c.bridge.clone();
        assert!(ip(&["link", "add", &br, "type", "bridge"]), "bridge");
        let head_cidr = format!("{}/24", c.head);
        assert!(ip(&["addr", "add", &head_cidr, "dev", &br]));
        assert!(ip(&["link", "set", &br, "up"]));
        let mut hosts_file = format!("127.0.0.1 localhost\n{} head\n", c.head);
        for i in 1..=n {
            let h = format!("bh{tag}x{i}n{}", id % 100_000);
            assert!(ip(&["netns", "add", &h]), "namespace {h}");
            c.hosts.push(h.clone());
            let v = format!("bv{tag}{i}{}", id % 100_000);
            let addr = c.addr(i);
            let addr_cidr = format!("{addr}/24");
            for args in [
                vec![
                    "link", "add", &v, "type", "veth", "peer", "name", "eth0", "netns", &h,
                ],
                vec!["link", "set", &v, "master", &br, "up"],
                vec!["-n", &h, "addr", "add", &addr_cidr, "dev", "eth0"],
                vec!["-n", &h, "link", "set", "eth0", "up"],
                vec!["-n", &h, "link", "set", "lo", "up"],
            ] {
                assert!(ip(&args), "ip {args:?}");
            }
            hosts_file += &format!("{addr} {h}\n");
        }
        std::fs::write(c.dir.join("hosts"), hosts_file).unwrap();
        Some(c)
    }

    /// Host `i`'s address (1-based).
    pub fn addr(&self, i: usize) -> String {
        let base = self.cidr.trim_end_matches(".0/24");
        format!("{base}.{i}")
    }

    pub fn hosts_file(&self) -> String {
        self.dir.join("hosts").to_string_lossy().into_owned()
    }

    /// `h1:2,h2:2`.
    pub fn host_list(&self, slots: u32) -> String {
        self.first_hosts(self.hosts.len(), slots)
    }

    /// The first `hosts` hosts with `slots` each, as [`Self::host_list`].
    fn first_hosts(&self, hosts: usize, slots: u32) -> String {
        self.hosts[..hosts]
            .iter()
            .map(|h| format!("{h}:{slots}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Puts a launcher's command `c` in the job environment of this
    /// cluster: TCP on the cluster's network, the agent's hosts file, and
    /// none of the test runner's `BTL_RANK` and `BTL_WIREUP`.
    pub fn job_env<'c>(&self, c: &'c mut Command) -> &'c mut Command {
        c.env("BTL_TCP_IF_INCLUDE", &self.cidr)
            .env("BTL_NETNS_HOSTS", self.hosts_file())
            .env_remove("BTL_RANK")
            .env_remove("BTL_WIREUP")
    }

    /// `btl run --timeout SECS` of `btl stress` (its options to be added)
    /// on the first `hosts` hosts with `slots` ranks each, reached through
    /// `agent`, in the cluster's job environment ([`Self::job_env`]).
    pub fn btl_stress(&self, timeout: u32, hosts: usize, slots: u32, agent: &str) -> Command {
        let n = hosts * slots as usize;
        let mut c = Command::new(super::BTL);
        c.args([
            "run",
            "--timeout",
            &timeout.to_string(),
            "-n",
            &n.to_string(),
        ])
        .args(["--host", &self.first_hosts(hosts, slots)])
        .args(["--agent", agent, "--wireup-addr", &self.head])
        .args(["--", super::BTL, "stress"]);
        self.job_env(&mut c);
        c
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for h in &self.hosts {
            ip(&["netns", "del", h]);
        }
        ip(&["link", "del", &self.bridge]);
        let _ = std::fs::remove_dir_all(&self.dir);
        // Tests run in parallel: another cluster may still need the
        // raised limits, so they go back only when no other is left.
        if !other_clusters(&self.bridge) {
            restore_neigh_limits();
        }
    }
}

/// Asserts that stress job `o` of `ranks` ranks across a cluster passed:
/// status 0, and `all intact` and `line` (how a rank reached the others)
/// once per rank; returns its stdout.
pub fn assert_stress_across(o: &Output, ranks: usize, line: &str) -> String {
    let (out, err) = super::assert_success(o, "the job");
    assert_eq!(out.matches("all intact").count(), ranks, "{out}\n{err}");
    assert_eq!(out.matches(line).count(), ranks, "{out}\n{err}");
    out
}

/// Whether a bridge of another cluster exists (`btlbr*` but `mine`).
fn other_clusters(mine: &str) -> bool {
    Command::new("ip")
        .args(["-o", "link", "show", "type", "bridge"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split(": ").nth(1))
                .any(|name| name.starts_with("btlbr") && name != mine)
        })
        .unwrap_or(false)
}
