//! Wire-up sources without `btl run`: a user-given rendezvous
//! (`BTL_WIREUP=tcp://HOST:PORT`, rank 0 serves) with ranks from Slurm's
//! variables, a rank that never comes, and PMIx when it is unavailable.

use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

const BTL: &str = env!("CARGO_BIN_EXE_btl");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `btl` rank with a clean job environment plus `env`.
fn rank(env: &[(&str, String)], args: &[&str]) -> Child {
    let mut c = Command::new(BTL);
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, _) in std::env::vars() {
        if k.starts_with("BTL_") || k.starts_with("SLURM_") || k.starts_with("PMIX_") {
            c.env_remove(k);
        }
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

/// The stderr of one rank of `btl stress --messages 1` with `env`, which
/// must fail.
fn fails(env: &[(&str, String)]) -> String {
    let o = rank(env, &["stress", "--messages", "1"])
        .wait_with_output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{err}");
    err
}

/// Waits for every child, killing them all after `limit`.
fn wait_all(children: Vec<Child>, limit: Duration) -> Vec<Output> {
    let deadline = Instant::now() + limit;
    let mut children: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    loop {
        let running = children
            .iter_mut()
            .flatten()
            .any(|c| c.try_wait().unwrap().is_none());
        if !running {
            break;
        }
        if Instant::now() > deadline {
            for c in children.iter_mut().flatten() {
                let _ = c.kill();
            }
            panic!("ranks still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    children
        .iter_mut()
        .map(|c| c.take().unwrap().wait_with_output().unwrap())
        .collect()
}

#[test]
fn rendezvous_with_slurm_ranks() {
    let addr = format!("tcp://127.0.0.1:{}", free_port());
    let children = (0..3)
        .map(|r| {
            rank(
                &[
                    ("BTL_WIREUP", addr.clone()),
                    ("SLURM_PROCID", r.to_string()),
                    ("SLURM_NTASKS", "3".into()),
                    ("SLURM_JOB_ID", format!("t{}", std::process::id())),
                ],
                &["stress", "--messages", "200", "--max-size", "100000"],
            )
        })
        .collect();
    let outs = wait_all(children, Duration::from_secs(120));
    common::assert_ranks_say(&outs, |_| {
        [
            "all intact",
            "on 1 node(s): shared memory to 2 rank(s), TCP to 0 rank(s)",
        ]
    });
}

#[test]
fn rendezvous_names_the_rank_that_never_came() {
    let addr = format!("tcp://127.0.0.1:{}", free_port());
    // Ranks 0 and 2 of 3; rank 1 never starts.
    let children = [0, 2]
        .iter()
        .map(|r| {
            rank(
                &[
                    ("BTL_WIREUP", addr.clone()),
                    ("BTL_RANK", r.to_string()),
                    ("BTL_SIZE", "3".into()),
                    ("BTL_WIREUP_TIMEOUT", "1".into()),
                ],
                &["stress", "--messages", "1"],
            )
        })
        .collect();
    for o in wait_all(children, Duration::from_secs(60)) {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{err}");
        assert!(err.contains("waited for ranks [1]"), "{err}");
    }
}

#[test]
fn pmix_unavailable_is_explained() {
    // A library that does not exist: the error names it and the way out.
    let err = fails(&[
        ("BTL_WIREUP", "pmix".into()),
        ("BTL_PMIX_LIBRARY", "/nonexistent/libpmix.so.2".into()),
    ]);
    assert!(
        err.contains("cannot be loaded") && err.contains("BTL_PMIX_LIBRARY"),
        "{err}"
    );
    // The real library outside a PMIx launcher: PMIx_Init fails, clearly.
    if !std::path::Path::new("/usr/lib/x86_64-linux-gnu/libpmix.so.2").exists() {
        common::prereq::missing(
            "libpmix.so.2 (scripts/setup.sh installs Debian's openmpi-bin, which brings it)",
        );
    } else {
        let err = fails(&[("BTL_WIREUP", "pmix".into())]);
        assert!(err.contains("PMIx_Init failed"), "{err}");
    }
}

#[test]
fn bad_wireup_settings_are_named() {
    for (var, val, want) in [
        (
            "BTL_WIREUP",
            "http://x:1",
            "BTL_WIREUP=\"http://x:1\" is invalid",
        ),
        (
            "BTL_WIREUP",
            "tcp://no-such-host.invalid:1",
            "resolvable host",
        ),
    ] {
        let err = fails(&[
            (var, val.into()),
            ("BTL_RANK", "0".into()),
            ("BTL_SIZE", "1".into()),
        ]);
        assert!(err.contains(want), "{err}");
    }
}
