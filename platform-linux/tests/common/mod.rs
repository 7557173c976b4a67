//! Helpers shared by the multi-process tests: finding a launcher's ranks
//! through /proc, and the network-namespace hosts (`cluster`).
#![allow(dead_code)]

pub mod cluster;

use std::fs;

/// Children of `pid` (from /proc).
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(s) = fs::read_to_string(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
    }
    out
}

/// The value of `var` in the environment of process `pid`.
pub fn environ_var(pid: u32, var: &str) -> Option<String> {
    let env = fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&format!("{var}=")).map(str::to_owned)
    })
}
