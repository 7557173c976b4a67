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
//! - [`workload`]: the tags and checked message content of `btl stress`
//!   and `btl bench`, shared by the Linux command and bare-metal nodes;
//! - [`barrier`]: the barrier's schedule and message, run by every
//!   adapter;
//! - [`tags`]: every tag value in one table (the user range and each
//!   transport's internal tags); [`rma`]: the one-sided types every adapter
//!   uses ([`rma::RegionKey`], [`rma::RmaStatus`]);
//! - [`params`]: the parameter registry every component shares
//!   (definitions, one parser, one error type, the environment mapping, one
//!   verify driver, Open MPI's base BTL parameters);
//! - [`sm`]: shared memory inside a node — the ring, fragments, the
//!   control area, the segment layout, the `sm` parameters and the
//!   progress engine;
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
#[macro_use]
mod macros;
#[macro_use]
mod wire_view;

pub mod barrier;
pub mod params;
pub mod rma;
pub mod shm;
pub mod sm;
pub mod sync;
pub mod tags;
pub mod tcp;
pub mod wireup;
pub mod workload;
