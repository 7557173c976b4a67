//! The node in a job: btl-baremetal's [`Node`] on the virtio-net device,
//! with the blocking steps a workload is written with — poll, wait for a
//! condition (bounded by the command line's `timeout`), retry a send
//! while the peer's queue is full, barrier, get/put of any length — and
//! the events of every poll sorted into [`State`].
//!
//! Idle waits spin for a while, then sleep in `wfi` until the device's
//! interrupt or the node's next deadline (at most 50 ms), so the emulator
//! does not take a host core from the Linux ranks while it waits.

use core::fmt;

use btl_baremetal::core::tcp::endpoint::{EndpointState, FailReason};
use btl_baremetal::core::tcp::wire::RMA_HEADER_LEN;
use btl_baremetal::{Event, Node, RegionKey, RmaError, SendError};

use crate::hw::{self, Wakeup};
use crate::net::VirtioNet;
use crate::stress::Checker;
use crate::{clock_ms, PEERS, SOCKETS};

/// The node type of this image.
pub type BtlNode = Node<'static, SOCKETS, PEERS>;

/// Tags of `btl stress` and `btl bench`: the workload's own, shared with
/// the Linux command.
pub use btl_baremetal::core::workload::{TAG_ACK, TAG_DATA, TAG_KEY, TAG_STRESS};
/// Empty polls before an idle wait sleeps.
const SPIN: u32 = 200;

/// Why a step of the workload stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// A wait took longer than the command line's `timeout`.
    #[error("timed out waiting for {what}")]
    Timeout {
        /// What was waited for.
        what: &'static str,
    },
    /// A peer needed by the step failed.
    #[error("peer {peer} failed: {reason}")]
    PeerFailed {
        /// The peer.
        peer: u32,
        /// Why.
        reason: FailReason,
    },
    /// A peer needed by the step closed its connections (it left the job).
    #[error("peer {peer} closed its connection (left the job)")]
    PeerLeft {
        /// The peer.
        peer: u32,
    },
    /// The node refused the operation.
    #[error("{0}")]
    Send(SendError),
    /// A get/put was refused or failed.
    #[error("get/put: {0}")]
    Rma(RmaError),
}

/// What the polls reported.
pub struct State {
    /// `btl stress`'s receiving side (None in bench runs).
    pub checker: Option<Checker>,
    /// Region keys the peers sent.
    pub keys: [Option<RegionKey>; PEERS],
    /// The last get/put completion: request, outcome, bytes (a get's).
    pub rma: Option<(u64, Result<usize, RmaError>)>,
    /// Where a completed get's bytes go.
    pub get_buf: &'static mut [u8],
    /// `btl bench` data messages received.
    pub data: u64,
    /// `btl bench` acknowledgements received.
    pub acks: u64,
    /// Failures reported (peer, why), in order.
    pub failed: [Option<FailReason>; PEERS],
    /// When the first message arrived (ms since reset).
    pub first_message_ms: Option<u64>,
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("State")
            .field("data", &self.data)
            .field("acks", &self.acks)
            .finish_non_exhaustive()
    }
}

impl State {
    fn on_event(&mut self, ev: Event<'_>) {
        match ev {
            Event::Message { from, tag, data } => {
                if self.first_message_ms.is_none() {
                    self.first_message_ms = Some(clock_ms());
                }
                match tag {
                    TAG_STRESS => match self.checker.as_mut() {
                        Some(c) => c.check(from, data),
                        None => log::warn!("stress message from {from} outside a stress run"),
                    },
                    TAG_KEY => match (
                        RegionKey::from_bytes(data),
                        self.keys.get_mut(from as usize),
                    ) {
                        (Some(k), Some(slot)) => *slot = Some(k),
                        _ => log::warn!("bad region key from {from} ({} bytes)", data.len()),
                    },
                    TAG_DATA => self.data += 1,
                    TAG_ACK => self.acks += 1,
                    _ => log::warn!("message from {from} with tag {tag}, which nothing handles"),
                }
            }
            Event::PutDone {
                request, result, ..
            } => self.rma = Some((request, result.map(|()| 0))),
            Event::GetDone {
                request, result, ..
            } => {
                let r = result.and_then(|d| match self.get_buf.get_mut(..d.len()) {
                    Some(dst) => {
                        dst.copy_from_slice(d);
                        Ok(d.len())
                    }
                    None => Err(RmaError::BadLength),
                });
                self.rma = Some((request, r));
            }
            Event::PeerFailed { peer, reason } => {
                crate::println!("btl-qemu-node: peer {peer} failed: {reason}");
                if let Some(c) = &self.checker {
                    for r in (0..c.size).filter(|&r| r != peer && r != c.me) {
                        let (got, sent) = (c.next[r as usize], c.sent[r as usize]);
                        crate::println!(
                            "btl-qemu-node: when peer {peer} failed: {got} messages from rank {r} so far, {sent} to it"
                        );
                    }
                }
                if let Some(f) = self.failed.get_mut(peer as usize) {
                    *f = Some(reason);
                }
            }
        }
    }
}

/// The node, its device and what it heard.
pub struct Job {
    /// The btl node.
    pub node: BtlNode,
    /// The network device.
    pub dev: VirtioNet,
    /// What the polls reported.
    pub st: State,
    wake: Wakeup,
    timeout_ms: u64,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Job {
    /// A job over `node` on `dev`; every wait is bounded by `timeout_ms`.
    pub fn new(node: BtlNode, dev: VirtioNet, st: State, timeout_ms: u64) -> Job {
        let wake = Wakeup::new(dev.irq());
        Job {
            node,
            dev,
            st,
            wake,
            timeout_ms,
        }
    }

    /// One poll of the node.
    pub fn poll(&mut self) -> usize {
        let st = &mut self.st;
        self.node
            .poll(clock_ms(), &mut self.dev, &mut |ev| st.on_event(ev))
    }

    /// Sleeps until the device interrupts or the node's next deadline
    /// (at most 50 ms).
    fn sleep(&mut self) {
        // The device's line first, then the PLIC's pending bit, then a
        // last look: a frame arriving after that raises the line again
        // and wakes `wfi`.
        self.dev.ack_interrupt();
        self.wake.clear();
        if self.dev.has_frame() {
            return;
        }
        let now = clock_ms();
        let delay = self.node.poll_delay(now).unwrap_or(50).min(50);
        if delay == 0 {
            return;
        }
        self.wake
            .sleep_until(hw::ticks() + delay * crate::ticks_per_ms());
    }

    /// Whether `peer` is gone: failed, or closed its connection to us.
    pub fn gone(&self, peer: u32) -> Option<JobError> {
        if let Some(reason) = self.st.failed.get(peer as usize).copied().flatten() {
            return Some(JobError::PeerFailed { peer, reason });
        }
        if self.node.peer_closed(peer) {
            return Some(JobError::PeerLeft { peer });
        }
        None
    }

    /// Polls until `done`; fails if a peer in `needs` is gone, or after
    /// the timeout.
    pub fn wait(
        &mut self,
        what: &'static str,
        needs: &[u32],
        mut done: impl FnMut(&BtlNode, &State) -> bool,
    ) -> Result<(), JobError> {
        let start = clock_ms();
        let mut idle = 0u32;
        loop {
            if done(&self.node, &self.st) {
                return Ok(());
            }
            if let Some(e) = needs.iter().find_map(|&p| self.gone(p)) {
                return Err(e);
            }
            if self.poll() > 0 {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if clock_ms().saturating_sub(start) > self.timeout_ms {
                return Err(JobError::Timeout { what });
            }
            if idle > SPIN {
                self.sleep();
            }
        }
    }

    /// Runs `f` until it is not refused for a full queue (polling
    /// meanwhile).
    pub fn retry<T>(
        &mut self,
        what: &'static str,
        peer: u32,
        mut f: impl FnMut(&mut BtlNode) -> Result<T, SendError>,
    ) -> Result<T, JobError> {
        let start = clock_ms();
        loop {
            match f(&mut self.node) {
                Ok(v) => return Ok(v),
                Err(SendError::QueueFull { .. } | SendError::TooManyRequests) => {}
                Err(SendError::PeerFailed { peer, reason }) => {
                    return Err(JobError::PeerFailed { peer, reason })
                }
                Err(e) => return Err(JobError::Send(e)),
            }
            if let Some(e) = self.gone(peer) {
                return Err(e);
            }
            if self.poll() == 0 && clock_ms().saturating_sub(start) > self.timeout_ms {
                return Err(JobError::Timeout { what });
            }
        }
    }

    /// Sends a message, waiting for room in the peer's queue.
    pub fn send(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), JobError> {
        self.retry("room in a peer's queue", peer, |n| n.send(peer, tag, data))
    }

    /// The job's barrier (the TCP barrier frame btl-linux's ranks send);
    /// failed peers are not waited for, a peer that left is an error.
    pub fn barrier(&mut self, peers: &[u32]) -> Result<(), JobError> {
        let epoch = self.retry(
            "room for a barrier",
            peers.first().copied().unwrap_or(0),
            |n| n.barrier_start(),
        )?;
        let live: heapless::Vec<u32, PEERS> = peers
            .iter()
            .copied()
            .filter(|&p| self.st.failed[p as usize].is_none())
            .collect();
        self.wait("the other ranks at a barrier", &live, |n, _| {
            n.barrier_done(epoch)
        })
    }

    /// Waits until every rank in `peers` has connected to this node. A
    /// node with a static configuration has no wire-up fence telling it
    /// when its peers listen: it sends nothing (and so connects to
    /// nobody) until each peer has reached it, which they do on their
    /// first barrier.
    pub fn await_peers(&mut self, peers: &[u32]) -> Result<(), JobError> {
        self.wait("every rank to connect to this node", peers, |n, _| {
            peers
                .iter()
                .all(|&p| n.peer_state(p) == Some(EndpointState::Connected))
        })
    }

    /// Waits until everything queued was written and acknowledged.
    pub fn flush(&mut self) -> Result<(), JobError> {
        self.wait("queued frames to be acknowledged", &[], |n, _| {
            n.is_flushed()
        })
    }

    fn rma_wait(&mut self, peer: u32, request: u64) -> Result<usize, JobError> {
        self.wait("a get/put answer", &[peer], |_, st| {
            st.rma.is_some_and(|(r, _)| r == request)
        })?;
        match self.st.rma.take() {
            Some((_, Ok(n))) => Ok(n),
            Some((_, Err(e))) => Err(JobError::Rma(e)),
            None => Err(JobError::Rma(RmaError::PeerFailed)),
        }
    }

    /// Writes `src` at `offset` of `key`'s region, one frame at a time.
    pub fn put(&mut self, key: &RegionKey, offset: u64, src: &[u8]) -> Result<(), JobError> {
        let step = self.node.max_frame() as usize - RMA_HEADER_LEN;
        let mut done = 0;
        loop {
            let end = (done + step).min(src.len());
            let chunk = &src[done..end];
            let at = offset + done as u64;
            let req = self.retry("room for a put", key.rank, |n| n.put(key, at, chunk))?;
            self.rma_wait(key.rank, req)?;
            done = end;
            if done >= src.len() {
                return Ok(());
            }
        }
    }

    /// Reads `dst.len()` bytes at `offset` of `key`'s region, one frame at
    /// a time.
    pub fn get(&mut self, key: &RegionKey, offset: u64, dst: &mut [u8]) -> Result<(), JobError> {
        let step = (self.node.max_frame() as usize).min(self.st.get_buf.len());
        let mut done = 0;
        loop {
            let end = (done + step).min(dst.len());
            let len = (end - done) as u32;
            let at = offset + done as u64;
            let req = self.retry("room for a get", key.rank, |n| n.get(key, at, len))?;
            let got = self.rma_wait(key.rank, req)?;
            if got != end - done {
                return Err(JobError::Rma(RmaError::BadLength));
            }
            dst[done..end].copy_from_slice(&self.st.get_buf[..got]);
            done = end;
            if done >= dst.len() {
                return Ok(());
            }
        }
    }

    /// Closes every connection cleanly and waits (at most 2 s) for the
    /// FIN frames to leave.
    pub fn close(&mut self) {
        self.node.close();
        let start = clock_ms();
        while clock_ms().saturating_sub(start) < 2000 && !self.node.is_flushed() {
            self.poll();
        }
        for _ in 0..100 {
            self.poll();
        }
    }
}
