//! Jobs across many network-namespace hosts under default settings: 32
//! hosts × 2 ranks run `btl stress` intact, the job's start stays well
//! below the handshake timeout, and a host whose agent fails ends the job
//! at once, naming the rank. The hosts are made and removed by the test
//! (`common::cluster`); skipped where namespaces cannot be made (failed
//! with `CI` set).

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

mod common;
use common::cluster::{agent, assert_stress_across, Cluster};

/// Hosts of the big job.
const HOSTS: usize = 32;

/// The bound on a 32-host job's start and one message to every peer (a
/// barrier, then the stress's first message and its one-sided round, which
/// fills a 4 MiB region per rank). The release binary takes 3.1-3.4 s on
/// this project's 2-core machine, well below the 10 s handshake timeout;
/// the unoptimised one `cargo test` builds takes 12-14 s for the same job,
/// nearly all of it the filling and checking of the regions.
const START_BOUND: Duration = if cfg!(debug_assertions) {
    Duration::from_secs(40)
} else {
    Duration::from_secs(8)
};

/// `btl run` of `btl stress ARGS` on every host with `slots` ranks each.
fn stress(c: &Cluster, agent: &str, slots: u32, args: &[&str], env: &[(&str, &str)]) -> Output {
    c.btl_stress(240, c.hosts.len(), slots, agent)
        .args(args)
        // the caller's values win over whatever this process inherited
        .env_remove("BTL_TIMEOUT")
        .env_remove("BTL_TCP_HANDSHAKE_TIMEOUT")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

#[test]
fn stress_across_32_hosts_under_defaults_and_a_bounded_start() {
    let Some(c) = Cluster::new(7, HOSTS) else {
        return;
    };
    let line = format!("on {HOSTS} node(s): shared memory to 1 rank(s), TCP to 62 rank(s)");
    // Start and one message to every peer, timed.
    let t = Instant::now();
    let o = stress(
        &c,
        &agent(),
        2,
        &["--messages", "1", "--max-size", "8"],
        &[],
    );
    let took = t.elapsed();
    assert_stress_across(&o, 2 * HOSTS, &line);
    println!("{HOSTS} hosts x 2 ranks: start and a message to every peer in {took:?}");
    assert!(took < START_BOUND, "the job took {took:?} to start");
    // The stress itself.
    let o = stress(
        &c,
        &agent(),
        2,
        &["--messages", "20", "--max-size", "65536"],
        &[],
    );
    assert_stress_across(&o, 2 * HOSTS, &line);
}

#[test]
fn a_host_whose_agent_fails_ends_the_job_at_once_naming_the_rank() {
    let Some(c) = Cluster::new(8, 6) else { return };
    // An agent that cannot reach the fourth host (as ssh exits 255).
    let dir = std::env::temp_dir().join(format!("btl-badagent-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("agent.sh");
    let dead = &c.hosts[3];
    std::fs::write(
        &bad,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = {dead} ] && {{ echo \"agent: cannot reach \
             {dead}\" >&2; exit 255; }}; done\nexec {} \"$@\"\n",
            agent()
        ),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .args(["+x", &bad.to_string_lossy()])
        .status()
        .unwrap();
    let timeout = 5;
    let t = Instant::now();
    let o = stress(
        &c,
        &bad.to_string_lossy(),
        2,
        &["--messages", "50", "--max-size", "8192"],
        &[("BTL_TIMEOUT", &timeout.to_string())],
    );
    let took = t.elapsed();
    let _ = std::fs::remove_dir_all(Path::new(&dir));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "the job succeeded without a host\n{err}"
    );
    assert!(
        took < Duration::from_secs(timeout + 5),
        "the job took {took:?} to end"
    );
    // Ranks 6 and 7 are the fourth host's.
    assert!(
        err.contains("rank 6 (pid ") || err.contains("rank 7 (pid "),
        "{err}"
    );
    assert!(err.contains(&format!("cannot reach {dead}")), "{err}");
}
