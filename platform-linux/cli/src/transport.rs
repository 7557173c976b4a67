//! What `btl bench` and `btl stress` need from a transport: the shape of
//! the job API ([`btl_linux::world::World`] — shared memory inside a node, TCP
//! between nodes — implements it), so the tools run unchanged on one node
//! or many, and on btl-baremetal's hosted smoltcp node.

use std::error::Error;

use btl_core::rma::{RegionKey, RmaStatus};
use btl_linux::world::{Event, Flow, Outbox, World};

/// Errors of either transport.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// An event consumer (see [`World::drive`]).
pub type Consumer<'a> = dyn FnMut(&mut Outbox, Event<'_>) -> Flow + 'a;

/// The operations the tools use.
pub trait Transport {
    /// `"sm"`, `"tcp"` or `"sm+tcp"`.
    fn name(&self) -> &'static str;
    /// One line for people: what moves the bytes.
    fn describe(&self) -> String;
    /// This rank.
    fn rank(&self) -> u32;
    /// Number of ranks.
    fn size(&self) -> u32;
    /// Sends a message; returns when `data` may be reused.
    fn send(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), BoxError>;
    /// Sends `data` `count` times, as many in flight together as the
    /// transport allows (a bandwidth window); returns when `data` may be
    /// reused. By default one after the other.
    fn send_window(&mut self, peer: u32, tag: u8, data: &[u8], count: u64) -> Result<(), BoxError> {
        for _ in 0..count {
            self.send(peer, tag, data)?;
        }
        Ok(())
    }
    /// One non-blocking progress pass; events go to `f` (its
    /// [`Flow`] is ignored).
    fn poll(&mut self, f: &mut Consumer<'_>) -> usize;
    /// Progresses, handing events to `f`, until it returns [`Flow::Done`];
    /// the failure of `peer` (any peer with `None`) ends the wait with an
    /// error, so a tool never waits on a dead rank.
    fn drive(
        &mut self,
        what: &'static str,
        peer: Option<u32>,
        f: &mut Consumer<'_>,
    ) -> Result<(), BoxError>;
    /// Waits for every rank.
    fn barrier(&mut self) -> Result<(), BoxError>;
    /// Waits until everything sent has left (and, for shared memory, been
    /// acknowledged).
    fn flush(&mut self) -> Result<(), BoxError>;
    /// Whether `peer` has been reported failed.
    fn failed(&self, peer: u32) -> bool;
    /// Details for the stress summary line.
    fn summary(&self) -> String;
    /// Registers a zeroed region of `len` bytes peers may get from and
    /// put into.
    fn register(&mut self, len: usize) -> RegionKey;
    /// The contents of one of our regions.
    fn region(&mut self, key: &RegionKey) -> Option<Vec<u8>>;
    /// Writes into a peer's region: `Ok(Err(status))` if the target refused.
    fn put(
        &mut self,
        key: &RegionKey,
        offset: u64,
        src: &[u8],
    ) -> Result<Result<(), RmaStatus>, BoxError>;
    /// Reads from a peer's region: `Ok(Err(status))` if the target refused.
    fn get(
        &mut self,
        key: &RegionKey,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<Result<(), RmaStatus>, BoxError>;
}

impl Transport for World<'_> {
    fn name(&self) -> &'static str {
        World::transport_name(self)
    }
    fn describe(&self) -> String {
        World::describe(self)
    }
    fn rank(&self) -> u32 {
        World::rank(self)
    }
    fn size(&self) -> u32 {
        World::size(self)
    }
    fn send(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), BoxError> {
        Ok(World::send(self, peer, tag, data)?)
    }
    fn send_window(&mut self, peer: u32, tag: u8, data: &[u8], count: u64) -> Result<(), BoxError> {
        Ok(World::send_window(self, peer, tag, data, count)?)
    }
    fn poll(&mut self, f: &mut Consumer<'_>) -> usize {
        World::poll(self, |o, e| {
            f(o, e);
        })
    }
    fn drive(
        &mut self,
        what: &'static str,
        peer: Option<u32>,
        f: &mut Consumer<'_>,
    ) -> Result<(), BoxError> {
        Ok(World::drive(self, what, peer, f)?)
    }
    fn barrier(&mut self) -> Result<(), BoxError> {
        Ok(World::barrier(self)?)
    }
    fn flush(&mut self) -> Result<(), BoxError> {
        Ok(World::flush(self)?)
    }
    fn failed(&self, peer: u32) -> bool {
        self.failed_peers().iter().any(|(p, _)| *p == peer)
    }
    fn summary(&self) -> String {
        World::summary(self)
    }
    fn register(&mut self, len: usize) -> RegionKey {
        World::register_owned(self, vec![0u8; len].into_boxed_slice())
    }
    fn region(&mut self, key: &RegionKey) -> Option<Vec<u8>> {
        World::region(self, key).map(<[u8]>::to_vec)
    }
    fn put(
        &mut self,
        key: &RegionKey,
        offset: u64,
        src: &[u8],
    ) -> Result<Result<(), RmaStatus>, BoxError> {
        Ok(World::put(self, key, offset, src)?)
    }
    fn get(
        &mut self,
        key: &RegionKey,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<Result<(), RmaStatus>, BoxError> {
        Ok(World::get(self, key, offset, dst)?)
    }
}
