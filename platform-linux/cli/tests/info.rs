//! `btl info`, end to end through the `btl` binary.

use std::process::{Command, Output};

mod common;
use common::BTL;

/// The 28 parameters of the `sm` component, in table order.
const SM_PARAMS: [&str; 28] = [
    "use_knem",
    "knem_dma_min",
    "knem_max_simultaneous",
    "use_cma",
    "cma_split_min",
    "cma_measure",
    "free_list_num",
    "free_list_max",
    "free_list_inc",
    "max_procs",
    "fifo_size",
    "num_fifos",
    "fifo_lazy_free",
    "sm_extra_procs",
    "fbox_size",
    "fbox_threshold",
    "fbox_max",
    "poll_pause",
    "exclusivity",
    "flags",
    "rndv_eager_limit",
    "eager_limit",
    "max_send_size",
    "rdma_pipeline_send_length",
    "rdma_pipeline_frag_size",
    "min_rdma_pipeline_size",
    "latency",
    "bandwidth",
];

/// Runs `btl info ARGS` with only `env` among the btl variables.
fn info(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BTL);
    cmd.arg("info").args(args);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("BTL_") || k.starts_with("OMPI_MCA_") {
            cmd.env_remove(&*k);
        }
    }
    cmd.envs(env.iter().copied())
        .output()
        .expect("run btl info")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Checks one `--json` line has exactly the documented shape; returns
/// (name, value, source).
fn parse_line(line: &str) -> (String, String, String) {
    let rest = line
        .strip_prefix("{\"component\":\"sm\",\"name\":\"")
        .unwrap_or_else(|| panic!("{line}"));
    let (name, rest) = rest.split_once("\",\"value\":").unwrap();
    let (value, rest) = rest.split_once(",\"default\":").unwrap();
    let (default, rest) = rest.split_once(",\"source\":\"").unwrap();
    let (source, rest) = rest.split_once("\",\"env\":\"").unwrap();
    let (env, rest) = rest.split_once("\",\"level\":").unwrap();
    let (level, rest) = rest.split_once(",\"help\":\"").unwrap();
    let help = rest.strip_suffix("\"}").unwrap_or_else(|| panic!("{line}"));
    for number in [value, default] {
        assert!(number.parse::<i64>().is_ok(), "{line}");
    }
    assert!(
        matches!(source, "default" | "environment" | "code"),
        "{line}"
    );
    assert_eq!(env, format!("BTL_SM_{}", name.to_ascii_uppercase()));
    assert!((1..=9).contains(&level.parse::<u8>().unwrap()), "{line}");
    assert!(!help.is_empty());
    // Inside the help string every quote is escaped and nothing is raw
    // control text.
    let unescaped = help.replace("\\\\", "").replace("\\\"", "");
    assert!(!unescaped.contains('"'), "{line}");
    assert!(!help.chars().any(char::is_control), "{line}");
    (name.to_owned(), value.to_owned(), source.to_owned())
}

#[test]
fn json_lists_every_sm_parameter() {
    let out = info(&["--json"], &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let rows: Vec<_> = stdout
        .lines()
        .filter(|l| l.starts_with("{\"component\":\"sm\""))
        .map(parse_line)
        .collect();
    let names: Vec<&str> = rows.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(names, SM_PARAMS);
    // The tcp component follows: every seed parameter plus btl's own, the
    // text ones as JSON strings.
    let tcp: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("{\"component\":\"tcp\""))
        .collect();
    assert_eq!(tcp.len(), 36, "{stdout}");
    for own in [
        "write_combine",
        "recv_lowat",
        "keepalive_time",
        "user_timeout",
        "queue_bytes",
        "queue_messages",
    ] {
        assert!(stdout.contains(&format!("\"name\":\"{own}\"")), "{own}");
    }
    assert!(stdout.contains(
        "{\"component\":\"tcp\",\"name\":\"if_exclude\",\"value\":\"127.0.0.1/8,sppp\",\
         \"default\":\"127.0.0.1/8,sppp\",\"source\":\"default\",\"env\":\"BTL_TCP_IF_EXCLUDE\""
    ));
    assert!(stdout.contains("\"name\":\"port_min_v4\",\"value\":1024,"));
    let fifo = rows.iter().find(|(n, _, _)| n == "fifo_size").unwrap();
    assert_eq!((fifo.1.as_str(), fifo.2.as_str()), ("4096", "default"));
    assert!(stdout.contains(
        "{\"component\":\"sm\",\"name\":\"fifo_size\",\"value\":4096,\"default\":4096,\
         \"source\":\"default\",\"env\":\"BTL_SM_FIFO_SIZE\",\"level\":4,\"help\":\""
    ));
}

#[test]
fn environment_values_are_shown_with_their_source() {
    let out = info(&["--json"], &[("BTL_SM_FIFO_SIZE", "8192")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let fifo = stdout
        .lines()
        .map(parse_line)
        .find(|(n, _, _)| n == "fifo_size")
        .unwrap();
    assert_eq!((fifo.1.as_str(), fifo.2.as_str()), ("8192", "environment"));

    let out = info(&[], &[("OMPI_MCA_btl_sm_fifo_size", "8192")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(
            "  btl_sm_fifo_size = 8192 (default: 4096, source: environment, env: \
             BTL_SM_FIFO_SIZE)\n"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("      Number of slots in each receive ring"));
}

#[test]
fn a_malformed_value_is_an_error_naming_the_variable() {
    let out = info(&["--json"], &[("BTL_SM_FIFO_SIZE", "abc")]);
    let stderr = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
    assert!(stderr.contains("BTL_SM_FIFO_SIZE"), "{stderr}");
    assert!(
        stderr.contains("it accepts an integer between 2 and 2^30"),
        "{stderr}"
    );
}

#[test]
fn fast_box_sizes_are_checked() {
    for bad in ["100", "32", "131072", "-1"] {
        let out = info(&["--json"], &[("BTL_SM_FBOX_SIZE", bad)]);
        let stderr = text(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{bad}");
        assert!(stderr.contains("BTL_SM_FBOX_SIZE"), "{bad}: {stderr}");
        assert!(
            stderr.contains("0 (no fast boxes) or a power of two between 64 and 65536"),
            "{bad}: {stderr}"
        );
    }
    for (good, value) in [("4k", "4096"), ("0", "0"), ("64", "64"), ("65536", "65536")] {
        let out = info(&["--json"], &[("BTL_SM_FBOX_SIZE", good)]);
        assert_eq!(out.status.code(), Some(0), "{good}: {}", text(&out.stderr));
        let line = text(&out.stdout)
            .lines()
            .find(|l| l.contains("\"fbox_size\""))
            .map(parse_line)
            .unwrap();
        assert_eq!((line.1.as_str(), line.2.as_str()), (value, "environment"));
    }
}

#[test]
fn an_unknown_parameter_is_an_error_naming_it() {
    let out = info(&[], &[("BTL_SM_NO_SUCH", "1")]);
    let stderr = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr.contains("BTL_SM_NO_SUCH"), "{stderr}");
}

#[test]
fn every_bad_variable_is_reported() {
    let out = info(
        &[],
        &[
            ("BTL_SM_NO_SUCH", "1"),
            ("BTL_SM_FIFO_SIZE", "abc"),
            ("OMPI_MCA_btl_sm_use_cma", "maybe"),
        ],
    );
    let stderr = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    common::assert_contains_all(
        &stderr,
        &[
            "3 invalid parameter settings",
            "BTL_SM_NO_SUCH",
            "BTL_SM_FIFO_SIZE",
            "OMPI_MCA_btl_sm_use_cma",
        ],
    );
}

#[test]
fn tcp_include_and_exclude_together_is_an_error_naming_both() {
    let out = info(
        &[],
        &[("BTL_TCP_IF_INCLUDE", "eth0"), ("BTL_TCP_IF_EXCLUDE", "lo")],
    );
    assert_ne!(out.status.code(), Some(0));
    let err = text(&out.stderr);
    assert!(
        err.contains("BTL_TCP_IF_INCLUDE") && err.contains("BTL_TCP_IF_EXCLUDE"),
        "{err}"
    );
}
