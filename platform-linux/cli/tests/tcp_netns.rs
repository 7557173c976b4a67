//! Two "hosts" made by the test itself: network namespaces joined by a veth
//! pair with private addresses, removed afterwards. Rank 0 runs in one, rank
//! 1 in the other; TCP interface selection is given the pair's network as a
//! CIDR (`BTL_TCP_IF_INCLUDE`), so the ranks must find and use the veth
//! addresses. Skipped, saying why, where namespaces cannot be created.

use std::process::Command;

mod common;
use common::BTL;

/// Runs `ip ARGS`, returning whether it succeeded.
fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Whether namespace `ns` exists (`ip netns exec NS true` succeeds); its
/// complaint about a missing namespace is the expected answer, not shown.
fn exists(ns: &str) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "true"])
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Deletes the namespaces made so far (and with them the veth pair) on
/// every path, each once.
struct Hosts {
    names: [String; 2],
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for n in self.names.iter().filter(|n| !n.is_empty()) {
            ip(&["netns", "del", n]);
        }
    }
}

#[test]
fn stress_over_tcp_between_two_namespaces_selected_by_cidr() {
    let id = std::process::id();
    let net = 10 + id % 200;
    let names = [format!("btla{id}"), format!("btlb{id}")];
    let (va, vb) = (
        format!("bva{}", id % 100_000),
        format!("bvb{}", id % 100_000),
    );
    if !ip(&["netns", "add", &names[0]]) {
        common::prereq::missing("cannot create network namespaces here (`ip netns add` failed: needs root / CAP_SYS_ADMIN and iproute2)");
        return;
    }
    let mut hosts = Hosts {
        names: [names[0].clone(), String::new()],
    };
    assert!(ip(&["netns", "add", &names[1]]), "second namespace");
    hosts.names[1] = names[1].clone();
    let a = format!("10.201.{net}.1/24");
    let b = format!("10.201.{net}.2/24");
    for args in [
        vec!["link", "add", &va, "type", "veth", "peer", "name", &vb],
        vec!["link", "set", &va, "netns", &names[0]],
        vec!["link", "set", &vb, "netns", &names[1]],
        vec!["-n", &names[0], "addr", "add", &a, "dev", &va],
        vec!["-n", &names[1], "addr", "add", &b, "dev", &vb],
        vec!["-n", &names[0], "link", "set", &va, "up"],
        vec!["-n", &names[1], "link", "set", &vb, "up"],
        vec!["-n", &names[0], "link", "set", "lo", "up"],
        vec!["-n", &names[1], "link", "set", "lo", "up"],
    ] {
        assert!(ip(&args), "ip {args:?}");
    }
    let cidr = format!("10.201.{net}.0/24");
    let script = format!(
        "if [ \"$BTL_RANK\" = 0 ]; then ns={}; else ns={}; fi; \
         exec ip netns exec $ns {BTL} stress --transport tcp --messages 200 --max-size 300000",
        names[0], names[1]
    );
    let o = common::btl_run(120, 2)
        .args(["sh", "-c", &script])
        .env("BTL_TCP_IF_INCLUDE", &cidr)
        // The launcher's wire-up service listens on loopback, out of the
        // namespaces' reach; they share the session directory instead.
        .env("BTL_WIREUP", "dir")
        .env("BTL_LOG", "debug")
        .output()
        .unwrap();
    let (out, err) = common::assert_success(&o, "btl run");
    assert_eq!(out.matches("all intact").count(), 2, "{out}\n{err}");
    assert_eq!(out.matches("TCP to 1 rank(s)").count(), 2, "{out}");
    // Each rank selected its veth address by the CIDR.
    assert!(
        err.contains(&format!("using interface {va} (10.201.{net}.1)")),
        "{err}"
    );
    assert!(
        err.contains(&format!("using interface {vb} (10.201.{net}.2)")),
        "{err}"
    );
    drop(hosts);
    for n in &names {
        assert!(!exists(n), "namespace {n} left behind");
    }
}
