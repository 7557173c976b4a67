//! `btl-baremetal`: the `#![no_std]`, allocation-free adapter of btl for
//! unikernel and bare-metal compute nodes.
//!
//! What this crate will hold: the core's network traits over a smoltcp
//! `Interface` + `SocketSet` with caller-provided static storage, driven by
//! one `poll(now)`, speaking the same TCP wire protocol as `btl-linux`.
//! Today it only builds the core for bare-metal targets
//! (`thumbv7em-none-eabihf` in the test command) and re-exports it.
#![no_std]
#![deny(unsafe_code)]

pub use btl_core as core;
