//! Shared memory inside a node: everything the shared-memory transport
//! keeps in a segment that several processes map, as `#![no_std]` pieces
//! that validate every value a peer can write.
//!
//! The layers, bottom up:
//!
//! - [`fifo`]: the lock-free many-writer / one-reader ring of 64-bit slots
//!   (the seed's `sm_fifo_t`), initialised in place inside a region, and
//!   which ring a sender writes to (`FIFO_MAP`);
//! - [`frag`]: fragment headers and the slot encoding (offset + type bits +
//!   status bit);
//! - [`fbox`]: fast boxes, per sender→receiver byte rings for small
//!   messages without a ring operation or an ACK, and the rule that keeps
//!   per-peer order across a box and the ring;
//! - [`control`]: the segment's control area (creator, layout parameters,
//!   one record per rank);
//! - [`layout`]: how many processes the segment is sized for
//!   (`calc_sm_max_procs`) and where everything sits in it, with overflow
//!   detection;
//! - [`params`]: the `sm` component's parameters with the seed's names,
//!   defaults, help texts and validation rules (a table and rules over
//!   [`crate::params`]);
//! - [`regtab`]: the table where a rank publishes its registered regions,
//!   so peers read them by single copy without asking first;
//! - [`engine`]: the progress state machine (SEND → handler → ACK →
//!   completion and recycling, pending queues, flow control);
//! - [`wire`]: the byte formats of the transport's own messages
//!   (rendezvous, landing buffers, chunk headers, one-sided requests and
//!   answers), as checked views and `Repr`s.

pub mod control;
pub mod engine;
pub mod fbox;
pub mod fifo;
pub mod frag;
pub mod layout;
pub mod params;
pub mod regtab;
pub mod wire;
