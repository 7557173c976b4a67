//! btl's C ABI (`btl.h`, `libbtl.so`, `libbtl.a`): the job API of
//! `btl_linux::world` for C, C++, Fortran and MPI libraries.
//!
//! Two ways to join a job: [`btl_init`] (the environment's wire-up: `btl
//! run`, `mpirun`/PMIx, a rendezvous) or the two phases of an external
//! runtime ([`btl_open`] → publish [`btl_address`]'s blob → the runtime's
//! fence → [`btl_connect`] with a callback fetching peers' blobs), as Open
//! MPI's modex needs. Sends, one-sided get/put and registration of the
//! caller's memory; one progress call handing events to a callback, with
//! messages in place.
//!
//! # Reentrancy
//!
//! The event callback may post (`btl_sendi`, `btl_isend`, `btl_iput`,
//! `btl_iget`: queued, posted in order when the callback returns, their
//! completions reported as events even if they complete at once) and
//! register or deregister memory (at once). Blocking or handle-wide calls
//! (`btl_progress`, `btl_barrier`, `btl_connect`, `btl_finalize`) are
//! refused there with `BTL_ERR_STATE`.
//!
//! # Safety
//!
//! Every function is `unsafe extern "C"`: it reads and writes memory a C
//! caller hands it. Each checks what it can (NULL, zero lengths, handle
//! liveness, ranks, tags, keys) and documents what it cannot.
#![allow(non_camel_case_types)]
#![allow(unsafe_code)]

// btl.h lists items in the order cbindgen reads them, module by module in
// declaration order; the blank lines keep rustfmt from sorting these, so
// the order is the header's (a new module goes where its items should).
mod codes;

mod types;

mod error;

mod deferred;

mod handle;

mod iov;

mod config;

mod join;

mod who;

mod send;

mod progress;

mod memory;

mod rma;

mod params;

mod wireup;

pub use codes::*;
pub use config::{
    btl_config_free, btl_config_new, btl_config_number, btl_config_set, btl_config_t,
};
pub use error::{btl_last_error, btl_strerror};
pub use handle::btl_t;
pub use join::{btl_address, btl_connect, btl_finalize, btl_init, btl_open};
pub use memory::{btl_deregister, btl_key_pack, btl_key_unpack, btl_register};
pub use params::{btl_param_count, btl_param_info};
pub use progress::{btl_barrier, btl_progress};
pub use rma::{btl_iget, btl_iput};
pub use send::{btl_isend, btl_sendi};
pub use types::*;
pub use who::{btl_limits, btl_rank, btl_reachable, btl_size};
