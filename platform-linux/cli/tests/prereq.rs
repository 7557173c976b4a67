//! The tests' helper for missing prerequisites: a skip outside CI, a
//! failure with `CI` set (checked in child processes of this test binary,
//! so the environment of the test runner is not touched).

use std::process::Command;

mod common;

/// In a child: a test whose prerequisite is missing.
#[test]
fn role() {
    if std::env::var_os("BTL_TEST_ROLE").is_some() {
        common::prereq::missing("a unicorn (for this test of the helper)");
    }
}

fn child(ci: Option<&str>) -> std::process::Output {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "role", "--nocapture", "--test-threads", "1"])
        .env("BTL_TEST_ROLE", "1");
    match ci {
        Some(v) => c.env("CI", v),
        None => c.env_remove("CI"),
    };
    c.output().unwrap()
}

#[test]
fn a_missing_prerequisite_skips_outside_ci_and_fails_in_ci() {
    for ci in [None, Some("")] {
        let o = child(ci);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "CI={ci:?}: {err}");
        assert!(err.contains("SKIPPED: a unicorn"), "CI={ci:?}: {err}");
    }
    for ci in ["1", "true"] {
        let o = child(Some(ci));
        let text =
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success(),
            "CI={ci}: a missing prerequisite passed\n{text}"
        );
        assert!(
            text.contains("prerequisite missing: a unicorn") && text.contains("CI is set"),
            "CI={ci}: {text}"
        );
    }
}
