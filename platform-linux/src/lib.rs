//! `btl-linux`: btl on Linux HPC processes.
#![deny(unsafe_code)]

pub use btl_core as core;

/// `impl From<Inner> for Outer` for each `Variant(Inner)` listed: an error
/// enum whose variants wrap the errors of the layers below it.
macro_rules! from_err {
    ($outer:ty: $($v:ident($t:ty)),* $(,)?) => {$(
        impl From<$t> for $outer {
            fn from(e: $t) -> Self {
                Self::$v(e)
            }
        }
    )*};
}

pub mod cma;
mod idmap;
pub mod ifaddrs;
pub mod job;
pub mod ops;
pub mod progress;
pub mod rawbuf;
pub mod regions;
pub mod segment;
pub mod sm;
pub mod tcp;
pub mod wait;
pub mod wireup;
pub mod world;

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
