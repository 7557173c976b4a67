//! `btl-linux`: the std adapter of btl for Linux HPC processes.
//!
//! What this crate will hold (see the project README for what works today):
//! shared segments mapped with memmap2 in `/dev/shm` (named by uid, job and
//! node, mode 0600, unlinked once every local rank attached), single-copy
//! transfers with `process_vm_readv`/`process_vm_writev`, kernel TCP with
//! socket2 and rustix epoll, wire-up, and the `btl` command (launcher,
//! `info`, `bench`, `stress`).
//!
//! Today it re-exports the core so that applications depend on one crate,
//! and checks the one platform property the shared-memory structures need.
#![deny(unsafe_code)]

pub use btl_core as core;

/// True when this build can share btl-core's rings between processes: the
/// shared-memory structures need lock-free 64-bit atomics (see
/// [`btl_core::sync::SHARED_MEMORY_ATOMICS`]).
pub const fn shared_memory_supported() -> bool {
    btl_core::sync::SHARED_MEMORY_ATOMICS
}

#[cfg(test)]
mod tests {
    #[test]
    fn linux_targets_have_lock_free_64_bit_atomics() {
        // Every Linux target btl supports (x86_64, aarch64, ppc64le) has them;
        // a build where this fails cannot run the shared-memory transport.
        assert!(super::shared_memory_supported());
    }
}
