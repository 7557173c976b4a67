//! TCP between nodes, as sans-IO protocol machinery shared by every network
//! adapter (the Linux kernel-TCP one and the smoltcp one): bytes in, frames
//! and actions out. Nothing here performs I/O, reads a clock (time is
//! passed in as `u64` milliseconds) or allocates.
//!
//! The layers, bottom up:
//!
//! - [`wire`]: the byte formats — the 24-byte handshake (magic `BTLT`,
//!   version, job hash, rank), the 16-byte frame header (type, tag, flags,
//!   length, request id) and the RMA sub-header of PUT/GET — as checked
//!   views and validated representations (all integers little endian);
//! - [`decoder`]: the incremental stream decoder over a caller-provided
//!   read-ahead buffer (the seed's `endpoint_cache`): any split of the byte
//!   stream gives the same events, many frames come out of one read, and an
//!   oversize or malformed header is refused before any payload is read;
//! - [`endpoint`]: the per-peer connection state machine (lazy connect,
//!   handshake, the lower-rank-wins tie-break on simultaneous connects, FIN
//!   versus failure, timeouts) and the state machine of an accepted socket
//!   that has not identified itself yet;
//! - [`params`]: the `tcp` component's parameters (a table and rules over
//!   [`crate::params`]);
//! - [`iflist`]: the syntax of the interface lists (`if_include`,
//!   `if_exclude`: name prefixes and CIDR networks), which the parameters
//!   validate with and interface selection matches with;
//! - [`ifsel`]: interface selection as pure logic over a list of
//!   interfaces;
//! - [`addr`]: the listen-address record ranks exchange through wire-up.
//!
//! An adapter owns the sockets, a [`decoder::Decoder`] per socket, an
//! [`endpoint::Endpoint`] per peer and a queue of frames per peer; it feeds
//! socket events to the state machines and carries out the actions they
//! return.

pub mod addr;
pub mod decoder;
pub mod endpoint;
pub mod iflist;
pub mod ifsel;
pub mod params;
pub mod wire;
