//! What `btl bench` and `btl stress` need from a transport, so that they
//! run unchanged over shared memory ([`crate::sm::Sm`]) and TCP
//! ([`crate::tcp::Tcp`]).

use std::error::Error;

use crate::job::JobEnv;
use crate::sm::{RegionKey, RmaStatus, Sm, SmError};
use crate::tcp::Tcp;
use crate::tcp::TcpError;

/// Errors of either transport.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// A message handler: sender rank and bytes.
pub type Handler = Box<dyn FnMut(u32, &[u8])>;

/// The operations the tools use.
pub trait Transport {
    /// `"sm"` or `"tcp"`.
    fn name(&self) -> &'static str;
    /// One line for people: what moves the bytes.
    fn describe(&self) -> String;
    /// This rank.
    fn rank(&self) -> u32;
    /// Number of ranks.
    fn size(&self) -> u32;
    /// Registers a handler for a user tag.
    fn on(&mut self, tag: u8, handler: Handler) -> Result<(), BoxError>;
    /// Sends a message.
    fn send(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), BoxError>;
    /// Progresses until `done()`; the failure of any peer ends the wait
    /// with an error (so a tool never waits on a dead rank).
    fn wait(
        &mut self,
        what: &'static str,
        peer: Option<u32>,
        done: &mut dyn FnMut() -> bool,
    ) -> Result<(), BoxError>;
    /// Waits for every rank.
    fn barrier(&mut self) -> Result<(), BoxError>;
    /// Waits until everything sent has left (and, for shared memory, been
    /// acknowledged).
    fn flush(&mut self) -> Result<(), BoxError>;
    /// One non-blocking progress pass.
    fn progress(&mut self) -> usize;
    /// A failed peer, if any.
    fn failed(&self) -> Option<u32>;
    /// Details for the stress summary line.
    fn summary(&self) -> String;
    /// Registers a region peers may get from and put into.
    fn register(&mut self, len: usize) -> RegionKey;
    /// The contents of one of our regions.
    fn region(&self, key: &RegionKey) -> Option<Vec<u8>>;
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

/// Opens the transport `name` (`sm` or `tcp`) for `job`, with parameters
/// from the environment (TCP's address: [`crate::tcp::choose_binds`]).
pub fn open(name: &str, job: &JobEnv) -> Result<Box<dyn Transport>, BoxError> {
    match name {
        "sm" => Ok(Box::new(Sm::init(job, crate::sm::params_from_env()?)?)),
        "tcp" => {
            let params = crate::tcp::params_from_env()?;
            let binds = crate::tcp::choose_binds(&params)?;
            Ok(Box::new(Tcp::init(job, params, &binds)?))
        }
        other => Err(format!("unknown transport {other:?} (accepts sm or tcp)").into()),
    }
}

/// Splits a get/put result: a refusal by the target (`Ok(Err(status))`)
/// from a transport failure (`Err`).
fn refusal<E: Error + Send + Sync + 'static>(
    r: Result<(), E>,
    refused: impl FnOnce(&E) -> Option<RmaStatus>,
) -> Result<Result<(), RmaStatus>, BoxError> {
    match r {
        Ok(()) => Ok(Ok(())),
        Err(e) => match refused(&e) {
            Some(status) => Ok(Err(status)),
            None => Err(e.into()),
        },
    }
}

impl Transport for Sm {
    fn name(&self) -> &'static str {
        "sm"
    }
    fn describe(&self) -> String {
        let how = if !self.params().use_cma {
            "pipelined copy through shared fragments (use_cma=0)"
        } else if (0..self.size()).any(|p| p != self.rank() && self.single_copy_to(p)) {
            "single copy (CMA) or pipelined copy, chosen by measurement, above min_rdma_pipeline_size"
        } else {
            "single copy refused by the kernel: pipelined copy"
        };
        format!("transport sm, {} local ranks, {how}", self.size())
    }
    fn rank(&self) -> u32 {
        Sm::rank(self)
    }
    fn size(&self) -> u32 {
        Sm::size(self)
    }
    fn on(&mut self, tag: u8, handler: Handler) -> Result<(), BoxError> {
        Ok(Sm::on(self, tag, handler)?)
    }
    fn send(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), BoxError> {
        Ok(Sm::send(self, peer, tag, data)?)
    }
    fn wait(
        &mut self,
        what: &'static str,
        peer: Option<u32>,
        done: &mut dyn FnMut() -> bool,
    ) -> Result<(), BoxError> {
        self.wait_until(what, peer, |sm| done() || !sm.failed_peers().is_empty())?;
        match self.failed_peers().first() {
            Some(&peer) => Err(crate::sm::SmError::PeerFailed { peer }.into()),
            None => Ok(()),
        }
    }
    fn barrier(&mut self) -> Result<(), BoxError> {
        Ok(Sm::barrier(self)?)
    }
    fn flush(&mut self) -> Result<(), BoxError> {
        Ok(Sm::flush(self)?)
    }
    fn progress(&mut self) -> usize {
        Sm::progress(self)
    }
    fn failed(&self) -> Option<u32> {
        self.failed_peers().first().copied()
    }
    fn summary(&self) -> String {
        let cma = (0..self.size())
            .filter(|&p| p != self.rank() && self.single_copy_to(p))
            .count();
        format!(
            "over shared memory (single copy to {cma} of them, {} sends queued behind a full ring)",
            self.queued_total()
        )
    }
    fn register(&mut self, len: usize) -> RegionKey {
        Sm::register(self, len)
    }
    fn region(&self, key: &RegionKey) -> Option<Vec<u8>> {
        Sm::region(self, key).map(<[u8]>::to_vec)
    }
    fn put(
        &mut self,
        key: &RegionKey,
        offset: u64,
        src: &[u8],
    ) -> Result<Result<(), RmaStatus>, BoxError> {
        refusal(Sm::put(self, key, offset, src), |e| match e {
            SmError::Rma { status, .. } => Some(*status),
            _ => None,
        })
    }
    fn get(
        &mut self,
        key: &RegionKey,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<Result<(), RmaStatus>, BoxError> {
        refusal(Sm::get(self, key, offset, dst), |e| match e {
            SmError::Rma { status, .. } => Some(*status),
            _ => None,
        })
    }
}

impl Transport for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn describe(&self) -> String {
        format!(
            "transport tcp, {} ranks, listening on {}",
            self.size(),
            self.local_addrs()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
    fn rank(&self) -> u32 {
        Tcp::rank(self)
    }
    fn size(&self) -> u32 {
        Tcp::size(self)
    }
    fn on(&mut self, tag: u8, handler: Handler) -> Result<(), BoxError> {
        Ok(Tcp::on(self, tag, handler)?)
    }
    fn send(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), BoxError> {
        Ok(Tcp::send(self, peer, tag, data)?)
    }
    fn wait(
        &mut self,
        what: &'static str,
        peer: Option<u32>,
        done: &mut dyn FnMut() -> bool,
    ) -> Result<(), BoxError> {
        self.wait_until(what, peer, |t| done() || !t.failed_peers().is_empty())?;
        match self.failed_peers().into_iter().next() {
            Some((peer, why)) => Err(crate::tcp::TcpError::PeerFailed { peer, why }.into()),
            None => Ok(()),
        }
    }
    fn barrier(&mut self) -> Result<(), BoxError> {
        Ok(Tcp::barrier(self)?)
    }
    fn flush(&mut self) -> Result<(), BoxError> {
        Ok(Tcp::flush(self)?)
    }
    fn progress(&mut self) -> usize {
        Tcp::progress(self)
    }
    fn failed(&self) -> Option<u32> {
        self.failed_peers().first().map(|(p, _)| *p)
    }
    fn summary(&self) -> String {
        format!(
            "over TCP ({} connection(s) from strangers dropped)",
            self.rejected_connections()
        )
    }
    fn register(&mut self, len: usize) -> RegionKey {
        Tcp::register(self, len)
    }
    fn region(&self, key: &RegionKey) -> Option<Vec<u8>> {
        Tcp::region(self, key).map(<[u8]>::to_vec)
    }
    fn put(
        &mut self,
        key: &RegionKey,
        offset: u64,
        src: &[u8],
    ) -> Result<Result<(), RmaStatus>, BoxError> {
        refusal(Tcp::put(self, key, offset, src), |e| match e {
            TcpError::Rma { status, .. } => Some(*status),
            _ => None,
        })
    }
    fn get(
        &mut self,
        key: &RegionKey,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<Result<(), RmaStatus>, BoxError> {
        refusal(Tcp::get(self, key, offset, dst), |e| match e {
            TcpError::Rma { status, .. } => Some(*status),
            _ => None,
        })
    }
}
