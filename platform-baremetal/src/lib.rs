//! `btl-baremetal`: btl's TCP transport for unikernel and bare-metal
//! compute nodes — `#![no_std]`, no allocator, no threads — over the
//! [smoltcp](https://docs.rs/smoltcp) TCP/IP stack, speaking exactly the
//! protocol of `btl-linux`'s kernel-TCP transport (both run btl-core's
//! sans-IO machinery: `btl_core::tcp`), so bare-metal and Linux nodes of one
//! job talk to each other as equals.
//!
//! - [`node`]: the [`Node`]: a pool of smoltcp sockets and per-peer state
//!   in caller-provided memory ([`Sizes::memory_size`] bytes, const-generic
//!   socket and peer counts), driven by one [`Node::poll`] that runs
//!   smoltcp's interface and every state machine and reports [`Event`]s.
//! - `ring` (private): the byte queue of frames waiting for a connection.
//!
//! ```no_run
//! use btl_baremetal::{Config, Event, Node};
//! use smoltcp::iface::{Interface, SocketStorage};
//! # fn device() -> smoltcp::phy::Loopback { smoltcp::phy::Loopback::new(smoltcp::phy::Medium::Ip) }
//! # fn now_ms() -> u64 { 0 }
//! let mut dev = device();
//! let iface = Interface::new(
//!     smoltcp::iface::Config::new(smoltcp::wire::HardwareAddress::Ip),
//!     &mut dev,
//!     smoltcp::time::Instant::from_millis(0),
//! );
//! let cfg = Config::new(b"job-7", 1, 2, 5000);
//! // In firmware: static storage (a `static` cell); here, the heap.
//! let mut sockets = [SocketStorage::EMPTY; 4];
//! let mut memory = vec![0u8; Node::<4, 2>::memory_size(&cfg)];
//! let mut node: Node<'_, 4, 2> = Node::new(cfg, iface, &mut sockets, &mut memory).unwrap();
//! node.set_peer(0, smoltcp::wire::Ipv4Address::new(10, 0, 0, 1), 5000).unwrap();
//! node.send(0, 7, b"hello").unwrap();
//! loop {
//!     node.poll(now_ms(), &mut dev, &mut |ev| {
//!         if let Event::Message { from, tag, data } = ev {
//!             // handle the message (no calls into `node` here)
//!             let _ = (from, tag, data);
//!         }
//!     });
//! }
//! ```
//!
//! Features: `log` (default; btl's, btl-core's and smoltcp's messages to
//! the `log` crate), `defmt` (to `defmt`, with `default-features = false`;
//! errors and events derive `defmt::Format`).
#![no_std]
#![deny(unsafe_code)]

#[cfg(test)]
extern crate std;

pub mod node;
mod ring;

pub use btl_core as core;
pub use node::{
    Config, ConfigError, Event, InitError, Node, RegionKey, RmaError, SendError, Sizes, Stats,
    MAX_REGIONS, MAX_REQUESTS,
};
pub use smoltcp;
