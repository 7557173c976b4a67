//! A test's missing prerequisite (network namespaces, a TAP device,
//! `mpirun`, the PMIx library or header, a C compiler, CMA between
//! siblings, IPv6 loopback): the test says so and returns — or, when `CI`
//! is set (as `.ci/run` sets it), fails, so that CI cannot pass a check it
//! never ran because the machine lost what the check needs.
//! `scripts/setup.sh` installs what can be installed.
//!
//! Shared by every test crate (`mod common` here; the other crates include
//! this file with `#[path]`).

/// Reports that `what` is missing: a failure under `CI`, else a line
/// starting `SKIPPED:` on stderr. The caller returns afterwards.
pub fn missing(what: &str) {
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!(
            "prerequisite missing: {what} — CI is set, so this test fails instead of skipping \
             (scripts/setup.sh installs what can be installed)"
        );
    }
    eprintln!("SKIPPED: {what}");
}
