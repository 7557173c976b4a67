//! `btl bench` end to end: several transports in one run, the plot with
//! the anchor harness's curves beside ours, and its argument errors.

use std::path::PathBuf;
use std::process::{Command, Output};

mod common;
use common::BTL;

/// A raw results file as `../shared/anchors/run_anchors.sh` writes it.
const RAW: &str = "id\tmetric\tsize\trep\tvalue\tregime\tprobe_pre_ns\tprobe_post_ns\n\
    ompi_tcp\tlat\t8\t1\t5.71\tB\t61.2\t62.0\n\
    ompi_tcp\tlat\t65536\t1\t40.0\tB\t61.2\t62.0\n\
    ompi_tcp\tbw\t65536\t1\t2653\tB\t61.2\t62.0\n\
    ucp_tcp\tlat\t8\t1\t4.22\tC\t240\t243\n\
    ucp_tcp\tlat\t65536\t1\t43.3\tC\t240\t243\n\
    ucp_tcp\tbw\t65536\t1\t2574\tC\t240\t243\n";

/// A directory of this test's own, removed at the end.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("btl-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bench(args: &[&str]) -> Output {
    Command::new(BTL)
        .arg("bench")
        .args(args)
        .env_remove("BTL_RANK")
        .output()
        .expect("run btl bench")
}

#[test]
fn two_transports_plotted_beside_the_peers() {
    let dir = Dir::new("plot");
    let raw = dir.0.join("results_raw.tsv");
    std::fs::write(&raw, RAW).unwrap();
    let svg = dir.0.join("bench.svg");
    let o = bench(&[
        "--transport",
        "sm,tcp",
        "--sizes",
        "8,65536",
        "--iterations",
        "40",
        "--window",
        "8",
        "--json",
        "--plot",
        svg.to_str().unwrap(),
        "--compare",
        raw.to_str().unwrap(),
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    // Both transports ran, each size once.
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    for (line, (t, size)) in
        lines
            .iter()
            .zip([("sm", 8), ("sm", 65536), ("tcp", 8), ("tcp", 65536)])
    {
        let want = format!("{{\"transport\":\"{t}\",\"size\":{size},\"latency_us\":");
        assert!(line.starts_with(&want), "{line}");
    }
    assert!(err.contains("plotted 4 series into"), "{err}");
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    // Each series named in both panels' legends.
    for name in ["btl sm", "btl tcp", "ompi_tcp", "ucp_tcp"] {
        let n = svg.lines().filter(|l| l.trim() == name).count();
        assert_eq!(n, 2, "{name} in the legends\n{svg}");
    }
    // Ours drawn 3 wide: in each panel a line through the 2 sizes and a
    // legend sample, per transport.
    let ours: Vec<&str> = svg
        .split("<polyline")
        .skip(1)
        .filter(|p| p.contains("stroke-width=\"3\""))
        .collect();
    assert_eq!(ours.len(), 2 * 2 * 2, "{svg}");
    // No temporary file left beside the plot.
    let left: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
}

#[test]
fn bad_arguments_are_refused_before_running() {
    let dir = Dir::new("args");
    let raw = dir.0.join("bad.tsv");
    std::fs::write(&raw, format!("{RAW}ucp_tcp\tlat\t64\t1\tfast\tB\t1\t2\n")).unwrap();
    let svg = dir.0.join("p.svg");
    let o = bench(&[
        "--plot",
        svg.to_str().unwrap(),
        "--compare",
        raw.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let want = format!("--compare {}:8: value \"fast\"", raw.display());
    assert!(err.contains(&want), "{err}");
    assert!(o.stdout.is_empty(), "nothing measured");
    assert!(!svg.exists());

    let o = bench(&["--window", "0"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--window \"0\": accepts an integer from 1 to 16384"),
        "{err}"
    );

    let o = bench(&["--iterations", "many"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--iterations \"many\""), "{err}");

    let o = Command::new(BTL).args(["help", "bench"]).output().unwrap();
    let usage = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    common::assert_contains_all(
        &usage,
        &[
            "--iterations N",
            "--window W",
            "--plot FILE.svg",
            "--compare",
        ],
    );

    let nowhere = dir.0.join("no/such/dir/p.svg");
    let o = bench(&["--plot", nowhere.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("no directory"), "{err}");
}

#[test]
fn plot_inside_a_job() {
    // Another launcher started the ranks: rank 0 measures and draws.
    let dir = Dir::new("job");
    let svg = dir.0.join("job.svg");
    let o = Command::new(BTL)
        .args(["run", "--timeout", "120", "-n", "2", "--", BTL, "bench"])
        .args([
            "--transport",
            "tcp",
            "--sizes",
            "8,1024",
            "--iterations",
            "20",
        ])
        .args(["--json", "--plot", svg.to_str().unwrap()])
        .env_remove("BTL_RANK")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        out.lines().filter(|l| l.starts_with("[0] {")).count(),
        2,
        "{out}"
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(
        svg.lines().filter(|l| l.trim() == "btl tcp").count(),
        2,
        "{svg}"
    );

    // Several transports need btl bench's own launcher.
    let o = Command::new(BTL)
        .args(["run", "--timeout", "60", "-n", "2", "--", BTL, "bench"])
        .args(["--transport", "sm,tcp", "--sizes", "8"])
        .env_remove("BTL_RANK")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("one transport per run"), "{err}");
}
