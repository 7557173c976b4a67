//! `btl-core`: the `#![no_std]`, allocation-free core of btl, a byte-transfer
//! layer for HPC.
//!
//! The layers, bottom up (each module states its own contract):
//!
//! - [`sync`]: the one source of atomics and cells (loom under `cfg(loom)`,
//!   `portable-atomic` otherwise) and cache-line padding;
//! - [`shm`]: regions of shared memory, the [`shm::ShmOffset`] newtype that
//!   shared memory holds instead of pointers, and checked resolution of
//!   offsets into references;
//! - [`fifo`]: the lock-free many-writer / one-reader ring of 64-bit slots
//!   (the seed's `sm_fifo_t`), initialised in place inside a region;
//! - [`frag`]: fragment headers and the slot encoding (offset + type bits +
//!   status bit);
//! - [`params`]: the `sm` component's parameters with the seed's names,
//!   defaults, help texts and validation rules;
//! - [`sizing`]: shared-segment sizing with overflow detection;
//! - [`tcp`]: the TCP protocol as sans-IO state machines;
//! - [`wireup`]: the wire-up trait and the key/value service's protocol
//!   with a sans-IO client.
//!
//! Nothing here allocates; capacities are const generics or caller-provided
//! memory. Every value read from shared memory is treated as untrusted: a
//! corrupted offset, length or tag is a typed error, never undefined
//! behaviour and never a panic.
#![no_std]
#![deny(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(test)]
extern crate std;

#[macro_use]
mod fmt;

pub mod control;
pub mod engine;
pub mod fifo;
pub mod frag;
pub mod params;
pub mod shm;
pub mod sizing;
pub mod sync;
pub mod tcp;
pub mod wireup;
