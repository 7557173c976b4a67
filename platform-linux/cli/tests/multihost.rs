//! Several "hosts" on one machine, made by the test itself: a bridge in the
//! root namespace (the launcher's side) and one network namespace per host
//! joined to it by a veth pair, with private addresses; each rank runs in
//! its host's namespace and, through `scripts/netns-agent.sh`, in its own
//! UTS namespace named after the host — so ranks of one host share memory
//! and ranks of different hosts talk TCP. Everything is removed afterwards.
//! Skipped, saying why, where namespaces cannot be made (or, for the
//! mpirun run, where Open MPI is missing).

use std::process::{Command, Output};

mod common;
use common::cluster::{agent, assert_stress_across, Cluster};
use common::BTL;

/// [`assert_stress_across`], printing the ranks' lines.
fn check(o: &Output, ranks: usize, line: &str) {
    println!("{}", assert_stress_across(o, ranks, line));
}

/// The options of `btl stress` in the jobs across two and three hosts.
const STRESS: [&str; 4] = ["--messages", "300", "--max-size", "300000"];

#[test]
fn stress_across_hosts_under_btl_run() {
    let Some(c) = Cluster::new(1, 2) else { return };
    let o = c
        .btl_stress(120, 2, 2, &agent())
        .args(STRESS)
        .output()
        .unwrap();
    // Every rank: its host-mate over shared memory, the other host's two
    // ranks over TCP.
    check(
        &o,
        4,
        "on 2 node(s): shared memory to 1 rank(s), TCP to 2 rank(s)",
    );
    drop(c);
}

#[test]
fn stress_across_three_hosts_under_mpirun() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        common::prereq::missing(
            "mpirun not found (scripts/setup.sh installs Debian's openmpi-bin)",
        );
        return;
    }
    let Some(c) = Cluster::new(2, 3) else { return };
    let mut mpirun = Command::new("mpirun");
    mpirun
        .args(["--host", &c.host_list(2), "-n", "6"])
        .args(["--mca", "plm_rsh_agent", &agent()])
        .args(["--mca", "oob_tcp_if_include", &c.cidr])
        .args([
            "-x",
            "BTL_TCP_IF_INCLUDE",
            "-x",
            "BTL_NETNS_HOSTS",
            BTL,
            "stress",
        ])
        .args(STRESS)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let o = c.job_env(&mut mpirun).output().unwrap();
    // Wire-up through PMIx: each rank finds its host-mate by node name and
    // the four others' addresses by PMIx_Get.
    check(
        &o,
        6,
        "on 3 node(s): shared memory to 1 rank(s), TCP to 4 rank(s)",
    );
    drop(c);
}

/// Jobs across hosts used to deadlock in the one-sided phase: a rank
/// blocked in a get/put over TCP stopped serving shared memory, and one
/// blocked over shared memory stopped serving TCP. `btl stress` (messages,
/// then put/get with every peer) across 4 hosts × 2 ranks, 20 times, then
/// across 8 hosts × 2 ranks once: every run intact, none hanging
/// (`BTL_TIMEOUT=40`, and the launcher's own timeout).
#[test]
fn stress_across_four_hosts_twenty_times_and_eight_hosts_once() {
    let Some(c) = Cluster::new(3, 8) else { return };
    let run = |hosts: usize| {
        c.btl_stress(120, hosts, 2, &agent())
            .args(["--messages", "60", "--max-size", "200000"])
            .env("BTL_TIMEOUT", "40")
            .output()
            .unwrap()
    };
    for i in 0..20 {
        let o = run(4);
        println!("4 hosts, run {i}:");
        check(
            &o,
            8,
            "on 4 node(s): shared memory to 1 rank(s), TCP to 6 rank(s)",
        );
    }
    let o = run(8);
    check(
        &o,
        16,
        "on 8 node(s): shared memory to 1 rank(s), TCP to 14 rank(s)",
    );
    drop(c);
}
