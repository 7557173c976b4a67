//! The receive side: what the progress engine calls back with (incoming
//! fragments by tag, acknowledgements, peer errors), turned into the
//! transport's events; the reassembly of large messages (single copy and
//! pipelined chunks); the target side of one-sided operations.
//!
//! Callbacks run inside the engine's progress and may not send: work that
//! sends (RMA replies, serving a get) is queued in [`State::work`] and done
//! by `Sm::progress` right after.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use btl_core::barrier::{BarrierError, BarrierRepr, ABANDONED_LEN, ARRIVED_LEN};
use btl_core::rma::RmaStatus;
use btl_core::shm::Region;
use btl_core::sm::engine::{deliver_boxed, Dispatch, PeerError, Received};
use btl_core::sm::fbox::{self, Corruption};
use btl_core::sm::frag::FragView;
use btl_core::sm::wire::{
    ChunkPacket, ChunkRepr, GetDataPacket, GetDataRepr, GetMode, GetReqRepr, LandingAdPacket,
    LandingAdRepr, PutCmaRepr, PutDataRepr, RangeReqPacket, ReplyPacket, ReplyRepr, RndvPacket,
    RndvRepr, RndvSplitPacket, RndvSplitRepr, WireError, CHUNK_HEADER_LEN, GET_DATA_HEADER_LEN,
    GET_REQ_SPLIT_LEN, LANDING_AD_LEN, RANGE_REQ_LEN, REPLY_LEN, RNDV_LEN, RNDV_SPLIT_LEN,
};

use super::bulk::Bulk;
use super::landing::{skew, Landing, PartWait, ALIGN_SLACK, LANDING_CAP};
use super::rma::{self, RmaWait, Work};
use super::{
    MAX_MESSAGE, MAX_USER_TAG, TAG_BARRIER, TAG_CHUNK, TAG_LANDING, TAG_RNDV, TAG_RNDV_SPLIT,
};
use crate::cma;
use crate::idmap::IdMap;
use crate::ops::{OpError, OpId, RawBuf, Sink, TEvent};
use crate::regions::Regions;

/// Problems caused by peers' data logged one by one; after these, only
/// every power of two is (a process corrupting the segment must not flood
/// the log or slow the victim down with it).
const PEER_LOG_FIRST: u64 = 16;

/// Logs a problem caused by a peer's data (see [`PEER_LOG_FIRST`]), counting
/// it in `State::peer_reports`.
macro_rules! peer_log {
    ($state:expr, $lvl:ident, $($arg:tt)+) => {{
        $state.peer_reports += 1;
        let n = $state.peer_reports;
        if n <= PEER_LOG_FIRST || n.is_power_of_two() {
            log::$lvl!($($arg)+);
            if n == PEER_LOG_FIRST {
                log::warn!("further problems with peers' data are logged at powers of two only");
            }
        }
    }};
}

/// Records a malformed transport message from `peer` (a protocol
/// violation inside a valid fragment): logged like the other problems with
/// peers' data, and the peer declared failed after the pass.
macro_rules! violation {
    ($state:expr, $peer:expr, $($arg:tt)+) => {{
        let what = format!($($arg)+);
        peer_log!($state, error, "local rank {}: {what}", $peer);
        $state.violations.push(($peer, what));
    }};
}

/// Who a local rank is, as start-up established it (see the module docs of
/// [`super`]): the transport's identities, never read from the control
/// record again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PeerId {
    /// Its pid: the wire-up's (or the record's, without one), checked.
    pub(super) pid: u32,
    /// Its start time, from the kernel.
    pub(super) start: u64,
    /// What its record said for the single-copy probe (the record must keep
    /// saying it).
    pub(super) probe_addr: u64,
    pub(super) probe_value: u64,
}

/// An incoming fragmented put being applied.
#[derive(Debug)]
pub(super) struct PutIn {
    pub(super) received: u64,
    pub(super) failed: bool,
}

/// Everything the engine's callbacks touch (split from the engine so both
/// can be borrowed at once).
#[derive(Debug)]
pub(super) struct State {
    /// Reassembly of pipelined messages, per sender: (tag, total length,
    /// bytes so far) of the message in progress.
    pub(super) partial: Vec<Option<(u8, u64, u64)>>,
    /// Receive buffer per sender, reused from message to message (it only
    /// grows), so large messages do not pay allocation and page faults each
    /// time.
    pub(super) bufs: Vec<Vec<u8>>,
    /// Every local rank's identity (ours included).
    pub(super) peers: Vec<PeerId>,
    pub(super) cma_ok: Vec<bool>,
    /// Peers declared failed (their fragments' errors are not reported one
    /// by one).
    pub(super) peer_failed: Vec<bool>,
    /// Peer errors reported, for diagnostics (counted, logged).
    pub(super) peer_errors: u64,
    /// Problems with peers' data seen (for the log's rate limit).
    pub(super) peer_reports: u64,
    /// Peers the engine declared failed for corruption during the pass, to
    /// be retired and reported by `Sm::progress`.
    pub(super) blamed: Vec<(u32, PeerError)>,
    /// Malformed transport messages found during the pass: (peer, what).
    pub(super) violations: Vec<(u32, String)>,
    /// Completions to report at the end of the pass.
    pub(super) done: Vec<(OpId, Result<(), OpError>)>,
    /// Acknowledgements of single-copy rendezvous: (peer, cookie, ok).
    pub(super) acks: Vec<(u32, u64, bool)>,
    /// Sends the callbacks could not do themselves.
    pub(super) work: Vec<Work>,
    /// Incoming pipelined puts, by (peer, request).
    pub(super) puts_in: HashMap<(u32, u64), PutIn>,
    /// Our gets and puts waiting for their answer, by request.
    pub(super) waiting: IdMap<u64, RmaWait>,
    /// Gets timed this pass (peer, how, bytes, time), for the per-peer
    /// bulk rates the choice between single copy and fragments follows.
    pub(super) bulk_samples: Vec<(u32, Bulk, usize, Duration)>,
    /// When the last of our large gets from each peer completed (see
    /// `recv_reply` for how it times the next).
    pub(super) last_get_done: Vec<Option<Instant>>,
    /// One-sided transfers this rank moved by single copy (gets it read,
    /// puts it read into its region as their target).
    pub(super) rma_single_copies: u64,
    /// Our gets read by single copy straight from the target's memory as
    /// its region table publishes it, without asking (of
    /// `rma_single_copies`; see `Sm::iget`).
    pub(super) direct_gets: u64,
    /// Our pid, read once: every single copy checks that its target is
    /// not ourselves, and `std::process::id()` is a system call (glibc
    /// does not cache it), which was one per get under Open MPI.
    pub(super) own_pid: u32,
    /// Per peer: whether we write the parts of its split gets (until the
    /// kernel refuses one).
    pub(super) split_write_ok: Vec<bool>,
    /// Our gets completed by a split single copy (of `rma_single_copies`).
    pub(super) split_gets: u64,
    /// Bytes we wrote into peers' memory for their split gets.
    pub(super) split_written: u64,
    /// `cma_split_min`, or 0 (nothing is split) on an oversubscribed
    /// node.
    pub(super) split_min: usize,
    /// Per sender: our landing buffer for its split rendezvous, once
    /// mapped (see [`super::landing`]).
    pub(super) landings: Vec<Option<Landing>>,
    /// Per sender: whether we tried to map one (a failure is not retried).
    pub(super) landing_tried: Vec<bool>,
    /// Per receiver: its landing buffer for our split rendezvous, once it
    /// told us and our test write there succeeded.
    pub(super) landing_to: Vec<Option<LandingAdRepr>>,
    /// Per sender: its split rendezvous being received, waiting for the
    /// sender's part (its ACK held back in the engine; see
    /// [`super::landing`]), and when the wait began.
    pub(super) splits: Vec<Option<(RndvSplitRepr, PartWait)>>,
    /// How many of `splits` are there.
    pub(super) splits_pending: usize,
    /// Messages received by split rendezvous: (the sender's part came in
    /// time, we read it ourselves).
    pub(super) split_in: (u64, u64),
    /// Messages we sent split whose part we wrote.
    pub(super) split_out: u64,
}

impl State {
    /// Records a large get's time for the bulk rates: from its post or the
    /// completion of our previous large get from this peer, whichever is
    /// later, to now. Both mechanisms are timed alike, the request's round
    /// trip included. Gets complete in order (the peer answers and serves
    /// its queue in order; single copies are read as the answers come), so
    /// in a window of gets (ob1 posts one per message) this is each one's
    /// share of the stream, where the time from its post is mostly waiting
    /// behind the others (it read 0.1 GB/s for a 9 GB/s stream).
    pub(super) fn time_get(&mut self, peer: u32, how: Bulk, bytes: usize, posted: Instant) {
        let now = Instant::now();
        let last = &mut self.last_get_done[peer as usize];
        let from = last.map_or(posted, |l| l.max(posted));
        *last = Some(now);
        self.bulk_samples.push((peer, how, bytes, now - from));
    }

    pub(super) fn new(nprocs: u32, peers: Vec<PeerId>, cma_ok: Vec<bool>) -> Self {
        Self {
            partial: (0..nprocs).map(|_| None).collect(),
            bufs: (0..nprocs).map(|_| Vec::new()).collect(),
            peers,
            cma_ok,
            peer_failed: vec![false; nprocs as usize],
            peer_errors: 0,
            peer_reports: 0,
            blamed: Vec::new(),
            violations: Vec::new(),
            done: Vec::new(),
            direct_gets: 0,
            own_pid: std::process::id(),
            acks: Vec::new(),
            work: Vec::new(),
            puts_in: HashMap::new(),
            waiting: IdMap::default(),
            bulk_samples: Vec::new(),
            last_get_done: vec![None; nprocs as usize],
            rma_single_copies: 0,
            split_write_ok: vec![true; nprocs as usize],
            split_gets: 0,
            split_written: 0,
            split_min: 0,
            landings: (0..nprocs).map(|_| None).collect(),
            landing_tried: vec![false; nprocs as usize],
            landing_to: vec![None; nprocs as usize],
            splits: vec![None; nprocs as usize],
            splits_pending: 0,
            split_in: (0, 0),
            split_out: 0,
        }
    }

    /// A single-copy read for one of our gets failed: logged, and `peer`
    /// gets fragments from now on.
    fn single_get_failed(&mut self, peer: u32, e: &cma::CmaError) {
        log::warn!("single-copy get from local rank {peer} failed: {e}; using fragments");
        self.cma_ok[peer as usize] = false;
    }

    /// Waits (sleeping) until no target can still be writing into the
    /// destination of one of our split gets that `which` selects (see
    /// `Sm::cancel`): `what` says why, in the debug log.
    pub(super) fn await_split_writers(&self, which: impl Fn(&RmaWait) -> bool, what: &str) {
        if let Some(until) = self.split_release(which) {
            log::debug!("{what}: waiting until its split get's target can no longer write");
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
        }
    }

    /// The latest time until which a target may still be writing into the
    /// destination of one of our split gets that `which` selects and whose
    /// last answer has not come (see `rma::SPLIT_GRACE`), if any is later
    /// than now: such a get's memory is given back only then.
    fn split_release(&self, which: impl Fn(&RmaWait) -> bool) -> Option<Instant> {
        let now = Instant::now();
        self.waiting
            .values()
            .filter(|w| which(w))
            .filter_map(|w| match w.kind {
                rma::WaitKind::GetSplit { release, .. } => Some(release),
                _ => None,
            })
            .max()
            .filter(|&r| r > now)
    }
}

/// The engine's callbacks for one pass: the state plus what the pass lends
/// (the region table, the event sink).
pub(super) struct Ctx<'a, 's> {
    pub(super) st: &'a mut State,
    pub(super) regions: &'a mut Regions,
    pub(super) sink: &'a mut Sink<'s>,
}

impl State {
    /// Reads `dst.len()` bytes at `addr` in `peer`'s memory into `dst`
    /// (single copy).
    pub(super) fn cma_read(
        &self,
        peer: u32,
        addr: u64,
        dst: &mut [u8],
    ) -> Result<(), cma::CmaError> {
        let pid = self.peers[peer as usize].pid;
        if pid == self.own_pid {
            // Start-up refuses our own pid for a peer; never read ourselves
            // at an address a peer chose.
            return Err(cma::CmaError::Refused {
                pid,
                errno: libc::EPERM,
            });
        }
        // SAFETY: `pid` is another process, identified at start-up (the
        // wire-up's pid, cross-checked with the control record and the
        // kernel; checked again just above); `dst` is memory of ours (a
        // receive buffer, or our registered region lent for the operation).
        unsafe { cma::read_remote(pid, addr as usize, dst) }
    }
}

impl Ctx<'_, '_> {
    fn deliver(&mut self, from: u32, tag: u8, data: &[u8]) {
        (self.sink)(self.regions, TEvent::Message { from, tag, data });
    }

    fn recv_rndv(&mut self, peer: u32, frag: &FragView<'_>) -> bool {
        let Some(r) = self.parse_message::<RNDV_LEN, _>(peer, frag, "single-copy header", |b| {
            RndvRepr::parse(&RndvPacket::new_checked(b)?, MAX_MESSAGE)
        }) else {
            return false;
        };
        let mut buf = std::mem::take(&mut self.st.bufs[peer as usize]);
        let len = r.len as usize;
        if buf.len() < len + ALIGN_SLACK {
            buf.resize(len + ALIGN_SLACK, 0);
        }
        // As aligned modulo 64 as the sender's bytes (see `skew`: the
        // kernel's copy is 4.5× slower at some relative alignments).
        let k = crate::cma::aligned_offset(buf.as_ptr() as usize, r.addr as usize);
        let res = self.st.cma_read(peer, r.addr, &mut buf[k..k + len]);
        if res.is_ok() {
            self.deliver(peer, r.tag, &buf[k..k + len]);
        }
        self.st.bufs[peer as usize] = buf;
        match res {
            Ok(()) => {
                if self.st.split_min != 0 && len >= self.st.split_min && len <= LANDING_CAP {
                    self.offer_landing(peer, len);
                }
                true
            }
            Err(e) => {
                if self.st.cma_ok[peer as usize] {
                    log::warn!(
                        "single copy from local rank {peer} failed ({e}); using the pipelined copy through shared fragments"
                    );
                }
                self.st.cma_ok[peer as usize] = false;
                false
            }
        }
    }

    /// Maps a landing buffer for `peer` (once) and queues telling it. Its
    /// first `len` bytes (the message that made us map it) are touched
    /// now, so the first split messages do not pay the page faults (they
    /// are timed for the choice between single copy and fragments).
    #[cold]
    fn offer_landing(&mut self, peer: u32, len: usize) {
        let p = peer as usize;
        if self.st.landing_tried[p] {
            return;
        }
        self.st.landing_tried[p] = true;
        match Landing::new() {
            Ok(mut l) => {
                l.data(0, len.saturating_add(ALIGN_SLACK)).fill(0);
                self.st.work.push(Work::Landing { peer, ad: l.ad() });
                self.st.landings[p] = Some(l);
            }
            Err(e) => log::warn!(
                "no landing buffer for local rank {peer} ({e}): its large messages are read by \
                 us alone"
            ),
        }
    }

    /// A receiver's landing buffer for our split rendezvous: usable once a
    /// write of the flag's value (0) there succeeds.
    fn recv_landing(&mut self, peer: u32, frag: &FragView<'_>) -> bool {
        let Some(ad) = self.parse_message::<LANDING_AD_LEN, _>(peer, frag, "landing buffer", |b| {
            LandingAdRepr::parse(&LandingAdPacket::new_checked(b)?)
        }) else {
            return false;
        };
        let pid = self.st.peers[peer as usize].pid;
        let ok = pid != self.st.own_pid
            && usize::try_from(ad.addr).is_ok_and(|a| {
                // SAFETY: `pid` is another process (checked), the peer
                // start-up identified, which told us this address of its
                // landing buffer's flag for exactly such writes; 0 is what
                // it holds until our first split message.
                unsafe { cma::write_remote(pid, a, &0u64.to_le_bytes()) }
                    .map_err(|e| log::debug!("local rank {peer}'s landing buffer: {e}"))
                    .is_ok()
            });
        if ok {
            self.st.landing_to[peer as usize] = Some(ad);
        }
        true
    }

    /// A split rendezvous: we read the part before `at` into our landing
    /// buffer for `peer` while it writes the rest there, then deliver the
    /// message from it (see [`super::landing`]).
    fn recv_rndv_split(&mut self, peer: u32, frag: &FragView<'_>) -> Received {
        let cap = LANDING_CAP as u64;
        let Some(r) =
            self.parse_message::<RNDV_SPLIT_LEN, _>(peer, frag, "split rendezvous", |b| {
                RndvSplitRepr::parse(&RndvSplitPacket::new_checked(b)?, cap)
            })
        else {
            return Received::Refused;
        };
        let p = peer as usize;
        if frag.header.is_none() {
            // A rendezvous ends with its ACK: one in a fast box has none.
            violation!(self.st, peer, "split rendezvous {r:?} in a fast box");
            return Received::Refused;
        }
        if self.st.splits[p].is_some() {
            violation!(
                self.st,
                peer,
                "split rendezvous {r:?} while its last one is still being received"
            );
            return Received::Refused;
        }
        let fits = r.rndv.len.saturating_add(skew(r.rndv.addr) as u64) <= cap;
        if !fits || self.st.landings[p].is_none() {
            violation!(
                self.st,
                peer,
                "split rendezvous {r:?} beyond our landing buffer (mapped: {})",
                self.st.landings[p].is_some()
            );
            return Received::Refused;
        }
        let Some(mut land) = self.st.landings[p].take() else {
            return Received::Refused;
        };
        let (len, at, k) = (r.rndv.len as usize, r.at as usize, skew(r.rndv.addr));
        let data = land.data(k, len);
        let ours = self.st.cma_read(peer, r.rndv.addr, &mut data[..at]);
        // The sender writes its part right after posting this: usually in
        // by now; if not, the receive goes on in later passes
        // (`end_splits`), the ACK held back until it ends.
        let wait = PartWait::new(r.seq, Instant::now());
        let arrived = wait.arrived(&land);
        self.st.landings[p] = Some(land);
        if let Err(e) = ours {
            self.split_read_failed(peer, &e);
            return Received::Refused;
        }
        if arrived {
            return self.end_split(peer, r, true).into();
        }
        self.st.splits[p] = Some((r, wait));
        self.st.splits_pending += 1;
        Received::Held
    }

    /// Ends the split receives whose sender's part came in or is late
    /// (then reading the rest ourselves): delivered, and the peer's ACK
    /// to release (peer, the receive's outcome) added to `released`. A
    /// receive from a peer that failed meanwhile is dropped.
    pub(super) fn end_splits(&mut self, released: &mut Vec<(u32, bool)>) {
        let now = Instant::now();
        for p in 0..self.st.splits.len() {
            let Some((r, wait)) = self.st.splits[p] else {
                continue;
            };
            let failed = self.st.peer_failed[p];
            let arrived = self.st.landings[p]
                .as_ref()
                .is_some_and(|l| wait.arrived(l));
            if !(failed || arrived || wait.late(now)) {
                continue;
            }
            self.st.splits[p] = None;
            self.st.splits_pending -= 1;
            if !failed {
                let peer = p as u32;
                if !arrived {
                    log::debug!("local rank {peer}'s part of a split message did not come in time");
                }
                released.push((peer, self.end_split(peer, r, arrived)));
            }
        }
    }

    /// Ends the split receive of `r` from `peer` whose own part is in the
    /// landing buffer: reads the sender's part ourselves unless `in_time`,
    /// then delivers the message. False when a read failed (single copy
    /// from `peer` is off then).
    fn end_split(&mut self, peer: u32, r: RndvSplitRepr, in_time: bool) -> bool {
        let p = peer as usize;
        let Some(mut land) = self.st.landings[p].take() else {
            return false;
        };
        let (len, at, k) = (r.rndv.len as usize, r.at as usize, skew(r.rndv.addr));
        let mut res = Ok(());
        if !in_time {
            let data = land.data(k, len);
            res = self
                .st
                .cma_read(peer, r.rndv.addr.wrapping_add(r.at), &mut data[at..]);
        }
        let res = res.map(|()| {
            self.deliver(peer, r.rndv.tag, land.data(k, len));
        });
        self.st.landings[p] = Some(land);
        match res {
            Ok(()) => {
                if in_time {
                    self.st.split_in.0 += 1;
                } else {
                    self.st.split_in.1 += 1;
                }
                true
            }
            Err(e) => {
                self.split_read_failed(peer, &e);
                false
            }
        }
    }

    /// A single copy for a split receive from `peer` failed: logged, and
    /// `peer` sends by the pipelined copy from now on.
    fn split_read_failed(&mut self, peer: u32, e: &cma::CmaError) {
        log::warn!(
            "single copy from local rank {peer} failed ({e}); using the pipelined copy through \
             shared fragments"
        );
        self.st.cma_ok[peer as usize] = false;
    }

    fn recv_chunk(&mut self, peer: u32, frag: &FragView<'_>) -> bool {
        let p = peer as usize;
        let c = header::<CHUNK_HEADER_LEN>(frag)
            .and_then(|h| ChunkRepr::parse(&ChunkPacket::new_unchecked(&h[..]), MAX_MESSAGE));
        let Some(c) = self.parsed(peer, "chunk header", c) else {
            self.st.partial[p] = None;
            return false;
        };
        let data_len = u64::from(frag.info.len) - CHUNK_HEADER_LEN as u64;
        if c.offset == 0 {
            if self.st.partial[p].is_some() {
                // Not a violation: a sender that cancels a message it was
                // streaming sends no more of it (`Sm::cancel`), and its
                // next message starts here.
                log::debug!(
                    "local rank {peer} started a new chunked message before the last one ended \
                     (cancelled?); the partial one is dropped"
                );
            }
            self.st.partial[p] = Some((c.tag, c.total, 0));
        }
        let Some((tag, total, got)) = self.st.partial[p] else {
            violation!(
                self.st,
                peer,
                "chunk at offset {} without a start",
                c.offset
            );
            return false;
        };
        let end = got + data_len;
        if tag != c.tag || total != c.total || got != c.offset || end > total {
            violation!(self.st, peer, "chunk out of order");
            self.st.partial[p] = None;
            return false;
        }
        // The buffer grows as data arrives (amortised doubling, kept for
        // the next message): a chunk header alone, which any peer can
        // write, cannot make us allocate and zero `MAX_MESSAGE` bytes.
        if (self.st.bufs[p].len() as u64) < end {
            self.st.bufs[p].resize(end as usize, 0);
        }
        let dst = &mut self.st.bufs[p][got as usize..end as usize];
        if frag
            .payload
            .read_bytes(CHUNK_HEADER_LEN as u64, dst)
            .is_err()
        {
            violation!(self.st, peer, "chunk shorter than its header says");
            self.st.partial[p] = None;
            return false;
        }
        if end < total {
            self.st.partial[p] = Some((tag, total, end));
            return true;
        }
        self.st.partial[p] = None;
        let buf = std::mem::take(&mut self.st.bufs[p]);
        self.deliver(peer, tag, &buf[..total as usize]);
        self.st.bufs[p] = buf;
        true
    }

    /// A put by single copy: validate, then read the requester's memory
    /// straight into the region.
    fn recv_put_cma(&mut self, peer: u32, frag: &FragView<'_>) -> bool {
        let Some(put) =
            self.parse_message::<RANGE_REQ_LEN, _>(peer, frag, "single-copy put", |b| {
                PutCmaRepr::parse(&RangeReqPacket::new_checked(b)?)
            })
        else {
            return false;
        };
        let status = match self.regions.range_mut(put.id, put.offset, put.len) {
            Ok(dst) => match self.st.cma_read(peer, put.src, dst) {
                Ok(()) => {
                    self.st.rma_single_copies += 1;
                    RmaStatus::Ok
                }
                Err(e) => {
                    log::warn!("single-copy put from local rank {peer} failed: {e}");
                    RmaStatus::CopyFailed
                }
            },
            Err(status) => {
                log::warn!("local rank {peer} put into region {}: {status}", put.id);
                status
            }
        };
        self.st.work.push(Work::Reply {
            peer,
            req: put.req,
            status,
            addr: 0,
        });
        true
    }

    /// A get request: validated against our regions; answered with the
    /// address (single copy: the requester reads it) or served in
    /// fragments.
    fn recv_get_req(&mut self, peer: u32, frag: &FragView<'_>) -> bool {
        let Some(get) =
            self.parse_message::<GET_REQ_SPLIT_LEN, _>(peer, frag, "get request", |b| {
                GetReqRepr::parse(&RangeReqPacket::new_checked(b)?)
            })
        else {
            return false;
        };
        match (self.regions.range(get.id, get.offset, get.len), get.mode) {
            (Ok(_), GetMode::Split(tail)) => self.st.work.push(Work::Split { peer, get, tail }),
            (Ok(src), GetMode::SingleCopy) => self.st.work.push(Work::Reply {
                peer,
                req: get.req,
                status: RmaStatus::Ok,
                addr: src.addr(),
            }),
            (Ok(_), GetMode::Fragments) => self.st.work.push(Work::Serve { peer, get }),
            (Err(status), _) => {
                log::warn!(
                    "local rank {peer} asked to get {}+{} of region {}: {status}",
                    get.offset,
                    get.len,
                    get.id
                );
                self.st.work.push(Work::Reply {
                    peer,
                    req: get.req,
                    status,
                    addr: 0,
                });
            }
        }
        true
    }

    /// A PUT_DATA chunk (header + data) arrived from `peer`.
    fn recv_put_data(&mut self, peer: u32, frag: &FragView<'_>) -> bool {
        let c = header::<RANGE_REQ_LEN>(frag)
            .and_then(|h| PutDataRepr::parse(&RangeReqPacket::new_unchecked(&h[..])));
        let Some(c) = self.parsed(peer, "put data", c) else {
            return false;
        };
        let data_len = u64::from(frag.info.len) - RANGE_REQ_LEN as u64;
        let key = (peer, c.req);
        let entry = self.st.puts_in.entry(key).or_insert(PutIn {
            received: 0,
            failed: false,
        });
        if entry.failed {
            return true;
        }
        let end = c.chunk_off.checked_add(data_len);
        let status = if end.is_none_or(|e| e > c.total) {
            Err(RmaStatus::OutOfBounds)
        } else {
            self.regions.range(c.id, c.offset, c.total).map(|_| ())
        };
        let status = status.and_then(|()| {
            let dst = self
                .regions
                .range_mut(c.id, c.offset + c.chunk_off, data_len)?;
            frag.payload
                .read_bytes(RANGE_REQ_LEN as u64, dst)
                .map_err(|_| RmaStatus::CopyFailed)
        });
        let received = self.st.puts_in.get_mut(&key).map(|e| {
            e.received += data_len;
            e.received
        });
        match status {
            Err(status) => {
                log::warn!("local rank {peer} put into region {}: {status}", c.id);
                if let Some(e) = self.st.puts_in.get_mut(&key) {
                    e.failed = true;
                }
                self.st.work.push(Work::Reply {
                    peer,
                    req: c.req,
                    status,
                    addr: 0,
                });
            }
            Ok(()) if received == Some(c.total) => {
                self.st.puts_in.remove(&key);
                self.st.work.push(Work::Reply {
                    peer,
                    req: c.req,
                    status: RmaStatus::Ok,
                    addr: 0,
                });
            }
            Ok(()) => {}
        }
        true
    }

    /// A status reply to one of our gets or puts arrived.
    fn recv_reply(&mut self, peer: u32, frag: &FragView<'_>) -> bool {
        let Some(ReplyRepr { req, status, addr }) =
            self.parse_message::<REPLY_LEN, _>(peer, frag, "one-sided reply", |b| {
                ReplyRepr::parse(&ReplyPacket::new_checked(b)?)
            })
        else {
            return false;
        };
        match self.st.waiting.get(&req) {
            Some(w) if w.peer == peer => {}
            _ => {
                log::warn!("RMA reply from local rank {peer} for unknown request {req}");
                return false;
            }
        }
        // A failed put's later chunks are dropped at the target.
        self.st
            .puts_in
            .retain(|&(p, r), _| !(p == peer && r == req));
        let Some(w) = self.st.waiting.remove(&req) else {
            return false;
        };
        let result = match (status, w.kind) {
            (RmaStatus::Ok, rma::WaitKind::GetSingle { dst }) => {
                // The target checked the range; we read it from its memory
                // into ours.
                // SAFETY: `dst` is the local side of our get, kept valid and
                // unused by the caller until the operation completes (the
                // job API pins its region; see `RawBuf`).
                let d = unsafe { dst.as_mut_slice() };
                match self.st.cma_read(peer, addr, d) {
                    Ok(()) => {
                        self.single_get_done(peer, &w, dst.len());
                        Ok(())
                    }
                    Err(e) => {
                        self.st.single_get_failed(peer, &e);
                        self.retry_get_in_fragments(peer, req, &w, dst);
                        return true;
                    }
                }
            }
            (
                RmaStatus::Ok,
                rma::WaitKind::GetSplit {
                    dst,
                    at,
                    src: None,
                    release,
                    ..
                },
            ) => {
                // The first answer: the target writes `dst[at..]` now; we
                // read `dst[..at]` meanwhile, then wait for its second.
                let head = dst.sub(0, at).expect("at <= len (iget)");
                // SAFETY: `dst` is the local side of our get (see
                // GetSingle); the target writes only `dst[at..]`.
                let head_ok = match self.st.cma_read(peer, addr, unsafe { head.as_mut_slice() }) {
                    Ok(()) => true,
                    Err(e) => {
                        self.st.single_get_failed(peer, &e);
                        false
                    }
                };
                let mut w = w;
                w.kind = rma::WaitKind::GetSplit {
                    dst,
                    at,
                    src: Some(addr),
                    head_ok,
                    release,
                };
                self.st.waiting.insert(req, w);
                return true;
            }
            (
                RmaStatus::Ok,
                rma::WaitKind::GetSplit {
                    dst,
                    at,
                    src: Some(src),
                    head_ok,
                    ..
                },
            ) => {
                // The second answer: `addr` bytes from `at` on are written;
                // the target no longer touches `dst`.
                let from = u64::try_from(at)
                    .ok()
                    .and_then(|at| at.checked_add(addr))
                    .and_then(|f| usize::try_from(f).ok())
                    .filter(|&f| f <= dst.len());
                let Some(from) = from else {
                    violation!(
                        self.st,
                        peer,
                        "split get answered with {addr} bytes written of {}",
                        dst.len() - at
                    );
                    self.st
                        .done
                        .push((w.op, Err(OpError::Refused(RmaStatus::CopyFailed))));
                    return false;
                };
                let rest = dst.sub(from, dst.len() - from).expect("from <= len");
                let read = || {
                    // SAFETY: as the first answer's; the target is done.
                    let r = unsafe { rest.as_mut_slice() };
                    self.st.cma_read(peer, src.wrapping_add(from as u64), r)
                };
                match head_ok.then(read) {
                    Some(Ok(())) => {
                        self.st.split_gets += 1;
                        self.single_get_done(peer, &w, dst.len());
                        Ok(())
                    }
                    failed => {
                        // Our half failed (reported then) or the rest did.
                        if let Some(Err(e)) = failed {
                            self.st.single_get_failed(peer, &e);
                        }
                        self.retry_get_in_fragments(peer, req, &w, dst);
                        return true;
                    }
                }
            }
            (RmaStatus::Ok, rma::WaitKind::Get { dst, got }) if got != dst.len() as u64 => {
                log::error!(
                    "local rank {peer} answered a get of {} bytes with {got}",
                    dst.len()
                );
                Err(OpError::Refused(RmaStatus::CopyFailed))
            }
            (RmaStatus::Ok, rma::WaitKind::Get { dst, .. }) => {
                if let Some(posted) = w.timed {
                    self.st.time_get(peer, Bulk::Pipelined, dst.len(), posted);
                }
                Ok(())
            }
            (RmaStatus::Ok, _) => Ok(()),
            (RmaStatus::CopyFailed, rma::WaitKind::Put { single: true, src }) => {
                // The target could not read us: send the data in fragments.
                self.st.cma_ok[peer as usize] = false;
                self.st.work.push(Work::RetryPut {
                    peer,
                    req,
                    wait: RmaWait {
                        peer,
                        op: w.op,
                        kind: rma::WaitKind::Put { single: false, src },
                        remote: w.remote,
                        timed: None,
                    },
                });
                return true;
            }
            (status, _) => Err(OpError::Refused(status)),
        };
        self.st.done.push((w.op, result));
        true
    }

    /// One of our gets completed by single copy: counted, and timed for
    /// the bulk rates if it is a large one.
    fn single_get_done(&mut self, peer: u32, w: &RmaWait, len: usize) {
        self.st.rma_single_copies += 1;
        if let Some(posted) = w.timed {
            self.st.time_get(peer, Bulk::SingleCopy, len, posted);
        }
    }

    /// Asks again for get `req`'s data (into `dst`), in fragments, after
    /// its single copy failed.
    fn retry_get_in_fragments(&mut self, peer: u32, req: u64, w: &RmaWait, dst: RawBuf) {
        self.st.work.push(Work::RetryGet {
            peer,
            req,
            wait: RmaWait {
                peer,
                op: w.op,
                kind: rma::WaitKind::Get { dst, got: 0 },
                remote: w.remote,
                timed: None,
            },
        });
    }

    /// Data of one of our gets arrived.
    fn recv_get_data(&mut self, peer: u32, frag: &FragView<'_>) -> bool {
        let head = header::<GET_DATA_HEADER_LEN>(frag)
            .and_then(|h| GetDataRepr::parse(&GetDataPacket::new_unchecked(&h[..])));
        let Some(GetDataRepr { req, offset: off }) = self.parsed(peer, "get data", head) else {
            return false;
        };
        let hlen = GET_DATA_HEADER_LEN as u64;
        let data_len = u64::from(frag.info.len) - hlen;
        let Some(w) = self.st.waiting.get_mut(&req).filter(|w| w.peer == peer) else {
            log::warn!("get data from local rank {peer} for unknown request {req}");
            return false;
        };
        let rma::WaitKind::Get { dst, got } = &mut w.kind else {
            return false;
        };
        let Some(part) = usize::try_from(off)
            .ok()
            .zip(usize::try_from(data_len).ok())
            .and_then(|(o, l)| dst.sub(o, l))
        else {
            violation!(self.st, peer, "get data outside the request");
            return false;
        };
        // SAFETY: `dst` is the local side of our get (see recv_reply).
        let d = unsafe { part.as_mut_slice() };
        if frag.payload.read_bytes(hlen, d).is_err() {
            return false;
        }
        *got += data_len;
        true
    }
}

impl Dispatch for Ctx<'_, '_> {
    /// A user message goes to the sink straight from the box (no
    /// [`FragView`], no dispatch on the tag: the small-message path); the
    /// protocol's own messages go through [`Self::recv`].
    #[inline(always)]
    fn boxed(
        &mut self,
        part: &Region<'_>,
        peer: u32,
        tag: u8,
        payload: fbox::Payload<'_>,
    ) -> Result<(), Corruption> {
        if tag <= MAX_USER_TAG {
            // In place, as `recv` delivers a user message: the bytes are
            // the record's, inside the box in our part (the reader
            // validated its header and bounds), and the box's one writer
            // does not write them until the reader's tail moves past the
            // record, after this returns (`btl_core::sm::fbox`, "One
            // writer, one reader"); the event's data cannot outlive the
            // sink call. A writer breaking the protocol can only change
            // the bytes of its own message meanwhile.
            self.deliver(peer, tag, payload.as_bytes());
            Ok(())
        } else {
            deliver_boxed(part, peer, tag, payload, self)
        }
    }

    fn recv(&mut self, peer: u32, tag: u8, frag: &FragView<'_>) -> Received {
        let ok = match tag {
            TAG_RNDV => self.recv_rndv(peer, frag),
            TAG_RNDV_SPLIT => return self.recv_rndv_split(peer, frag),
            TAG_LANDING => self.recv_landing(peer, frag),
            TAG_CHUNK => self.recv_chunk(peer, frag),
            rma::TAG_GET_REQ => self.recv_get_req(peer, frag),
            rma::TAG_PUT_DATA => self.recv_put_data(peer, frag),
            rma::TAG_PUT_CMA => self.recv_put_cma(peer, frag),
            rma::TAG_RMA_REPLY => self.recv_reply(peer, frag),
            rma::TAG_GET_DATA => self.recv_get_data(peer, frag),
            TAG_BARRIER => {
                let msg = match (frag.exact::<ARRIVED_LEN>(), frag.exact::<ABANDONED_LEN>()) {
                    (Some(b), _) => BarrierRepr::parse_bytes(&b),
                    (None, Some(b)) => BarrierRepr::parse_bytes(&b),
                    (None, None) => Err(BarrierError::Length(frag.info.len as usize)),
                };
                let msg = match msg {
                    Ok(m) => m,
                    Err(e) => {
                        violation!(self.st, peer, "malformed barrier message: {e}");
                        return Received::Refused;
                    }
                };
                (self.sink)(self.regions, TEvent::Barrier { from: peer, msg });
                true
            }
            t if t <= MAX_USER_TAG => {
                // In place: the consumer reads the fragment (or the fast
                // box's record) itself.
                // SAFETY: `frag.payload` is the range `read_frag` checked
                // (inside the owner's region, after a header whose check
                // word, owner, capacity and length were validated) or, for
                // a fast-box message (`frag.header` is None), the record's
                // payload inside the box in our part (the engine validated
                // its header and bounds); it is exactly `info.len` bytes;
                // nothing of ours is derived from the bytes. Nothing writes
                // them while the borrow lives: it ends with `deliver` (the
                // event's data cannot outlive the sink call), inside
                // `Dispatch::recv`, and the engine hands the memory back
                // only after `recv` returns — the ACK of a fragment (the
                // owner does not touch a fragment between its SEND and our
                // ACK), the box's tail moved past the record (its one
                // writer writes only below the published tail + size) — and
                // no thread of ours writes a peer's fragments or our boxes.
                // A peer that breaks the protocol can only change the bytes
                // of its own message meanwhile (see `Region::borrow_bytes`,
                // `btl_core::sm::fbox` and the README's trust boundary).
                let data = unsafe { frag.payload.borrow_bytes() };
                self.deliver(peer, t, data);
                true
            }
            t => {
                violation!(self.st, peer, "message with reserved tag {t}");
                false
            }
        };
        ok.into()
    }

    fn complete(&mut self, peer: u32, cookie: u64, ok: bool) {
        if cookie == 0 {
            // Fragments failed along with their peer were reported once,
            // with the peer.
            if !ok
                && !self
                    .st
                    .peer_failed
                    .get(peer as usize)
                    .copied()
                    .unwrap_or(false)
            {
                peer_log!(
                    self.st,
                    warn,
                    "local rank {peer} reported an error handling a message"
                );
            }
            return;
        }
        self.st.acks.push((peer, cookie, ok));
    }

    fn error(&mut self, error: PeerError) {
        self.st.peer_errors += 1;
        peer_log!(
            self.st,
            error,
            "shared memory: {error} (peer error {})",
            self.st.peer_errors
        );
    }

    fn failed(&mut self, peer: u32, why: PeerError) {
        // Marked now, so that the completions that follow are taken as part
        // of the failure; retired and reported after the pass.
        if let Some(f) = self.st.peer_failed.get_mut(peer as usize) {
            *f = true;
        }
        self.st.blamed.push((peer, why));
    }
}

impl Ctx<'_, '_> {
    /// The message `what` parsed from `peer`'s bytes, or a violation
    /// naming what is wrong with them.
    fn parsed<R>(&mut self, peer: u32, what: &str, r: Result<R, WireError>) -> Option<R> {
        r.map_err(|e| violation!(self.st, peer, "malformed {what}: {e}"))
            .ok()
    }

    /// `frag`'s payload, a whole message of at most `N` bytes (see
    /// [`message`]), as `parse` reads it; or, as [`Self::parsed`], a
    /// violation naming `what`.
    fn parse_message<const N: usize, R>(
        &mut self,
        peer: u32,
        frag: &FragView<'_>,
        what: &str,
        parse: impl FnOnce(&[u8]) -> Result<R, WireError>,
    ) -> Option<R> {
        let mut b = [0u8; N];
        let r = message(frag, &mut b).and_then(parse);
        self.parsed(peer, what, r)
    }
}

/// The payload of `frag`, a whole message of at most `N` bytes, copied out
/// of shared memory into `buf` (its format's parser judges the length).
fn message<'b, const N: usize>(
    frag: &FragView<'_>,
    buf: &'b mut [u8; N],
) -> Result<&'b [u8], WireError> {
    let len = frag.info.len as usize;
    let b = buf
        .get_mut(..len)
        .ok_or(WireError::BadLength { len, expected: N })?;
    frag.payload
        .read_bytes(0, b)
        .map_err(|_| WireError::Truncated {
            needed: len,
            got: frag.payload.len(),
        })?;
    Ok(b)
}

/// The first `N` bytes of `frag`'s payload: a header, with data after it.
fn header<const N: usize>(frag: &FragView<'_>) -> Result<[u8; N], WireError> {
    let mut h = [0u8; N];
    let got = frag.info.len as usize;
    if got < N || frag.payload.read_bytes(0, &mut h).is_err() {
        return Err(WireError::Truncated { needed: N, got });
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use btl_core::sm::wire::RndvRepr;
    use btl_core::sync::Ordering;

    use crate::sm::landing::SPLIT_WAIT;

    /// A state for two local ranks whose rank 1 is a pid nobody has: a
    /// single copy from it fails.
    fn state() -> State {
        let peer = PeerId {
            pid: u32::MAX - 1,
            start: 0,
            probe_addr: 0,
            probe_value: 0,
        };
        let mut st = State::new(2, vec![peer, peer], vec![true, true]);
        st.landings[1] = Some(Landing::new().unwrap());
        st
    }

    /// A pending split receive of `len` bytes from rank 1 with sequence
    /// number `seq`, begun at `since`.
    fn pending(st: &mut State, seq: u64, len: u64, since: Instant) -> RndvSplitRepr {
        let r = RndvSplitRepr {
            rndv: RndvRepr {
                tag: 4,
                addr: 0x1000,
                len,
            },
            at: len / 2,
            seq,
        };
        st.splits[1] = Some((r, PartWait::new(seq, since)));
        st.splits_pending += 1;
        r
    }

    /// Messages delivered: sender, tag, bytes.
    type Got = Vec<(u32, u8, Vec<u8>)>;

    /// `end_splits` once: the ACKs to release and the messages delivered.
    fn end(st: &mut State) -> (Vec<(u32, bool)>, Got) {
        let mut regions = Regions::new();
        let mut got = Vec::new();
        let mut sink = |_: &mut Regions, ev: TEvent<'_>| {
            if let TEvent::Message { from, tag, data } = ev {
                got.push((from, tag, data.to_vec()));
            }
        };
        let mut released = Vec::new();
        Ctx {
            st,
            regions: &mut regions,
            sink: &mut sink,
        }
        .end_splits(&mut released);
        (released, got)
    }

    #[test]
    fn a_pending_split_receive_ends_when_the_senders_part_is_in() {
        let mut st = state();
        let r = pending(&mut st, 7, 100, Instant::now());
        // Not in, not late: still pending, nothing released.
        assert_eq!(end(&mut st), (vec![], vec![]));
        assert_eq!(st.splits_pending, 1);
        // The sender's part: its bytes, then its flag.
        let land = st.landings[1].as_mut().unwrap();
        land.data(skew(r.rndv.addr), 100).fill(0x5a);
        land.flag().store(7, Ordering::Release);
        let (released, got) = end(&mut st);
        assert_eq!(released, vec![(1, true)]);
        assert_eq!(got, vec![(1, 4, vec![0x5a; 100])]);
        assert_eq!((st.splits_pending, st.splits[1].is_none()), (0, true));
        assert_eq!(st.split_in, (1, 0));
        assert_eq!(end(&mut st), (vec![], vec![]), "ended twice");
    }

    #[test]
    fn a_late_split_receive_reads_the_rest_itself_and_refuses_when_it_cannot() {
        let mut st = state();
        pending(&mut st, 3, 64, Instant::now() - SPLIT_WAIT * 2);
        // Late: the rest is read from the sender, which fails here; the
        // message is refused and single copy from the sender is off.
        let (released, got) = end(&mut st);
        assert_eq!((released, got), (vec![(1, false)], vec![]));
        assert!(!st.cma_ok[1]);
        assert_eq!(st.splits_pending, 0);
        assert!(st.landings[1].is_some(), "the landing buffer is kept");
    }

    #[test]
    fn a_split_receive_from_a_failed_peer_is_dropped() {
        let mut st = state();
        pending(&mut st, 1, 64, Instant::now());
        st.peer_failed[1] = true;
        assert_eq!(end(&mut st), (vec![], vec![]));
        assert_eq!(st.splits_pending, 0);
    }
}
