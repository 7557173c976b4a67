//! The job API: one object per process that reaches every rank of the job,
//! over shared memory inside a node and over TCP between nodes.
//!
//! [`World::init`] asks the wire-up source ([`crate::wireup`]) who we are,
//! publishes our node name, and after a fence knows which ranks share our
//! node. Those are reached over shared memory ([`Sm`], which ranks in
//! node-local numbering — the world translates); every other rank over TCP
//! ([`Tcp`]). Shared memory is preferred where both could work (it is the
//! component with the higher exclusivity, as in Open MPI). TCP is started
//! only when the job spans several nodes (a second fence publishes the
//! listen addresses), or when forced with [`Choice::Tcp`] (`--transport
//! tcp`), which sends even to same-node ranks over TCP.
//!
//! One [`World::progress`] drives both transports; one handler registry
//! serves messages from either (handlers get global ranks); a message to
//! ourselves is delivered by the next `progress`. Order is kept per peer
//! (each peer is reached by exactly one transport). get/put address
//! regions of any rank; the region table is one, lent to the transport
//! doing the work. The failure of a peer is reported for that peer (and
//! ends the waits of [`World::wait`]); the other peers are served on.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::job::JobEnv;
use crate::sm::{Sm, SmError};
use crate::tcp::{Tcp, TcpError};
use crate::wireup::{self, DynWireup, Identity, WireupError};
use btl_core::rma::{RegionKey, RmaStatus};

/// Largest user tag of the job API (tag 239 carries its barrier over
/// shared memory).
pub const MAX_USER_TAG: u8 = 238;
const TAG_BARRIER: u8 = 239;
/// Wire-up key of a rank's node name.
pub const NODE_KEY: &str = "node";

/// Whether this process is a rank of a job (some wire-up source is set,
/// see [`crate::wireup`]): `Ok(false)` when none is, an error when the
/// environment names one wrongly.
pub fn in_job() -> Result<bool, WireupError> {
    match wireup::Source::from_env() {
        Ok(_) => Ok(true),
        Err(WireupError::NoSource) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Our rank as the environment tells it (for error messages before or
/// without wire-up): `BTL_RANK`, `PMIX_RANK` or `SLURM_PROCID`, else `?`.
pub fn rank_hint() -> String {
    [
        "BTL_RANK",
        "PMIX_RANK",
        "OMPI_COMM_WORLD_RANK",
        "SLURM_PROCID",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok())
    .unwrap_or_else(|| "?".into())
}

/// Which transports to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Shared memory inside a node, TCP between nodes.
    Auto,
    /// Shared memory only (every rank must be on this node).
    Sm,
    /// TCP only, even between ranks of one node.
    Tcp,
}

impl Choice {
    /// From `--transport`'s value (`auto`, `sm` or `tcp`).
    pub fn parse(s: &str) -> Option<Choice> {
        match s {
            "auto" => Some(Choice::Auto),
            "sm" => Some(Choice::Sm),
            "tcp" => Some(Choice::Tcp),
            _ => None,
        }
    }
}

/// How a peer is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Me,
    /// Shared memory, with its node-local rank.
    Sm(u32),
    Tcp,
}

/// The job API's errors.
#[derive(Debug)]
pub enum WorldError {
    /// Wire-up failed.
    Wireup(WireupError),
    /// Shared memory failed.
    Sm(SmError),
    /// TCP failed.
    Tcp(TcpError),
    /// `--transport sm` in a job across nodes.
    NotOneNode {
        /// Nodes of the job.
        nodes: usize,
    },
    /// A peer's wire-up record is missing or malformed.
    BadRecord {
        /// The peer.
        rank: u32,
        /// The record.
        key: &'static str,
    },
    /// The tag is reserved (user tags are `0..=MAX_USER_TAG`).
    ReservedTag {
        /// The tag.
        tag: u8,
    },
    /// There is no such rank.
    InvalidPeer {
        /// The rank.
        peer: u32,
    },
    /// A peer failed (died, or its connection broke).
    PeerFailed {
        /// The peer.
        peer: u32,
        /// Why, as its transport saw it.
        why: String,
    },
    /// A wait took longer than `BTL_TIMEOUT`.
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        waited: Duration,
    },
}

impl fmt::Display for WorldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Wireup(e) => write!(f, "{e}"),
            Self::Sm(e) => write!(f, "{e}"),
            Self::Tcp(e) => write!(f, "{e}"),
            Self::NotOneNode { nodes } => write!(
                f,
                "--transport sm needs every rank on one node, but the job spans {nodes} nodes"
            ),
            Self::BadRecord { rank, key } => {
                write!(
                    f,
                    "rank {rank}'s wire-up record {key:?} is missing or malformed"
                )
            }
            Self::ReservedTag { tag } => {
                write!(
                    f,
                    "tag {tag} is reserved (user tags are 0..={MAX_USER_TAG})"
                )
            }
            Self::InvalidPeer { peer } => write!(f, "there is no rank {peer}"),
            Self::PeerFailed { peer, why } => write!(f, "rank {peer} failed: {why}"),
            Self::Timeout { what, waited } => write!(
                f,
                "timed out after {:.1} s waiting for {what} (BTL_TIMEOUT)",
                waited.as_secs_f64()
            ),
        }
    }
}

impl std::error::Error for WorldError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Wireup(e) => Some(e),
            Self::Sm(e) => Some(e),
            Self::Tcp(e) => Some(e),
            _ => None,
        }
    }
}

impl From<WireupError> for WorldError {
    fn from(e: WireupError) -> Self {
        Self::Wireup(e)
    }
}
impl From<SmError> for WorldError {
    fn from(e: SmError) -> Self {
        Self::Sm(e)
    }
}
impl From<TcpError> for WorldError {
    fn from(e: TcpError) -> Self {
        match e {
            TcpError::PeerFailed { peer, why } => Self::PeerFailed { peer, why },
            e => Self::Tcp(e),
        }
    }
}

/// A message handler: sender rank and bytes.
pub type Handler = Box<dyn FnMut(u32, &[u8])>;

type Shared = Rc<RefCell<Handler>>;

/// One side of a get or put.
enum Rma<'a> {
    Put(&'a [u8]),
    Get(&'a mut [u8]),
}

impl Rma<'_> {
    fn len(&self) -> usize {
        match self {
            Rma::Put(b) => b.len(),
            Rma::Get(b) => b.len(),
        }
    }
}
type RegionTable = HashMap<u32, Box<[u8]>>;

/// One process's view of its job: every rank, over the right transport.
pub struct World {
    id: Identity,
    /// Kept for the job's life: with a user-given rendezvous, rank 0's
    /// holds the service the others may still be reading from.
    _wireup: DynWireup,
    nodes: usize,
    /// Global ranks of our node, by local rank.
    local: Vec<u32>,
    route: Vec<Route>,
    sm: Option<Sm>,
    tcp: Option<Tcp>,
    handlers: Vec<Option<Shared>>,
    to_self: VecDeque<(u8, Vec<u8>)>,
    barrier_epoch: u64,
    /// Peers (global ranks) that announced each barrier epoch over shared
    /// memory.
    barrier_in: Rc<RefCell<HashMap<u64, HashSet<u32>>>>,
    /// Regions, when neither transport holds the table.
    own_regions: RegionTable,
    next_region: u32,
    timeout: Duration,
    last_liveness: Instant,
    choice: Choice,
}

impl fmt::Debug for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("World")
            .field("id", &self.id)
            .field("nodes", &self.nodes)
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

fn node_of(w: &mut DynWireup, rank: u32) -> Result<String, WorldError> {
    wireup::get_vec(w.as_mut(), rank, NODE_KEY)?
        .and_then(|v| String::from_utf8(v).ok())
        .filter(|n| crate::job::is_valid_name(n))
        .ok_or(WorldError::BadRecord {
            rank,
            key: NODE_KEY,
        })
}

impl World {
    /// Joins the job through the wire-up source the environment names
    /// (see [`crate::wireup`]).
    pub fn init(choice: Choice) -> Result<World, WorldError> {
        let (id, w) = wireup::open()?;
        Self::with_wireup(id, w, choice)
    }

    /// Joins the job through `w`.
    pub fn with_wireup(
        id: Identity,
        mut w: DynWireup,
        choice: Choice,
    ) -> Result<World, WorldError> {
        let timeout = crate::job::env_secs_opt("BTL_TIMEOUT", Duration::from_secs(300)).ok_or(
            WorldError::Sm(SmError::Unsupported(
                "BTL_TIMEOUT must be a positive number of seconds",
            )),
        )?;
        // Round 1: where everybody is.
        w.put(NODE_KEY, id.node.as_bytes())?;
        w.fence()?;
        let mut node_names = Vec::with_capacity(id.size as usize);
        for r in 0..id.size {
            node_names.push(if r == id.rank {
                id.node.clone()
            } else {
                node_of(&mut w, r)?
            });
        }
        let mut distinct: Vec<&String> = node_names.iter().collect();
        distinct.sort();
        distinct.dedup();
        let nodes = distinct.len();
        if choice == Choice::Sm && nodes > 1 {
            return Err(WorldError::NotOneNode { nodes });
        }
        let local: Vec<u32> = if choice == Choice::Tcp {
            vec![id.rank]
        } else {
            (0..id.size)
                .filter(|&r| node_names[r as usize] == id.node)
                .collect()
        };
        let route: Vec<Route> = (0..id.size)
            .map(|r| {
                if r == id.rank {
                    Route::Me
                } else if let Some(l) = local.iter().position(|&x| x == r) {
                    Route::Sm(l as u32)
                } else {
                    Route::Tcp
                }
            })
            .collect();

        // Round 2 (only when some peer is reached over TCP): addresses.
        let mut tcp = None;
        if route.contains(&Route::Tcp) {
            let params = crate::tcp::params_from_env()?;
            let binds = crate::tcp::choose_binds(&params, nodes > 1)?;
            let mut t = Tcp::listen(&id, params, &binds)?;
            w.put(crate::tcp::ADDR_KEY, t.published_addrs().as_bytes())?;
            w.fence()?;
            for r in (0..id.size).filter(|&r| route[r as usize] == Route::Tcp) {
                let rec = wireup::get_vec(w.as_mut(), r, crate::tcp::ADDR_KEY)?.ok_or(
                    WorldError::BadRecord {
                        rank: r,
                        key: crate::tcp::ADDR_KEY,
                    },
                )?;
                t.set_peer_addrs(r, &rec)?;
            }
            tcp = Some(t);
        }

        // Shared memory among the ranks of this node.
        let sm = if local.len() > 1 {
            let me_local = local.iter().position(|&x| x == id.rank).unwrap_or(0) as u32;
            let session_dir = std::env::var_os(crate::job::ENV_SESSION_DIR)
                .map(PathBuf::from)
                .unwrap_or_else(std::env::temp_dir);
            let job = JobEnv {
                job: id.job.clone(),
                rank: id.rank,
                size: id.size,
                local_rank: me_local,
                local_size: local.len() as u32,
                session_dir,
                node: id.node.clone(),
            };
            Some(Sm::init(&job, crate::sm::params_from_env()?)?)
        } else {
            None
        };

        let mut world = World {
            id,
            _wireup: w,
            nodes,
            local,
            route,
            sm,
            tcp,
            handlers: (0..256).map(|_| None).collect(),
            to_self: VecDeque::new(),
            barrier_epoch: 0,
            barrier_in: Rc::new(RefCell::new(HashMap::new())),
            own_regions: HashMap::new(),
            next_region: 0,
            timeout,
            last_liveness: Instant::now(),
            choice,
        };
        // Barrier arrivals over shared memory (over TCP, the TCP
        // transport's own barrier frame carries them).
        if let Some(sm) = &mut world.sm {
            let (arrivals, local) = (world.barrier_in.clone(), world.local.clone());
            sm.on(TAG_BARRIER, move |src, data: &[u8]| {
                match (<[u8; 8]>::try_from(data), local.get(src as usize)) {
                    (Ok(e), Some(&g)) => {
                        arrivals
                            .borrow_mut()
                            .entry(u64::from_le_bytes(e))
                            .or_default()
                            .insert(g);
                    }
                    _ => log::warn!("malformed barrier message over shared memory"),
                }
            })?;
        }
        Ok(world)
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.id.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> u32 {
        self.id.size
    }

    /// Who we are (job, rank, size, node).
    pub fn identity(&self) -> &Identity {
        &self.id
    }

    /// Number of nodes the job spans.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The ranks that share our node (reached over shared memory, unless
    /// TCP was forced).
    pub fn local_ranks(&self) -> &[u32] {
        &self.local
    }

    /// The shared-memory transport, if any peer uses it.
    pub fn sm(&self) -> Option<&Sm> {
        self.sm.as_ref()
    }

    /// The TCP transport, if any peer uses it.
    pub fn tcp(&self) -> Option<&Tcp> {
        self.tcp.as_ref()
    }

    fn install(&mut self, tag: u8, handler: Handler) -> Result<(), WorldError> {
        let h: Shared = Rc::new(RefCell::new(handler));
        if let Some(sm) = &mut self.sm {
            let (h, local) = (h.clone(), self.local.clone());
            sm.on(tag, move |l, data| {
                let g = local.get(l as usize).copied().unwrap_or(u32::MAX);
                (h.borrow_mut())(g, data)
            })?;
        }
        if let Some(tcp) = &mut self.tcp {
            let h = h.clone();
            tcp.on(tag, move |g, data| (h.borrow_mut())(g, data))?;
        }
        self.handlers[usize::from(tag)] = Some(h);
        Ok(())
    }

    /// Registers `handler` for `tag` (replacing any earlier one). It runs
    /// inside [`Self::progress`] with the sender's rank and the message.
    pub fn on(&mut self, tag: u8, handler: Handler) -> Result<(), WorldError> {
        if tag > MAX_USER_TAG {
            return Err(WorldError::ReservedTag { tag });
        }
        self.install(tag, handler)
    }

    fn route_of(&self, peer: u32) -> Result<Route, WorldError> {
        self.route
            .get(peer as usize)
            .copied()
            .ok_or(WorldError::InvalidPeer { peer })
    }

    fn send_any(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), WorldError> {
        match self.route_of(peer)? {
            Route::Me => {
                self.to_self.push_back((tag, data.to_vec()));
                Ok(())
            }
            Route::Sm(l) => match self.sm.as_mut() {
                Some(sm) => sm.send(l, tag, data).map_err(|e| self.sm_error(e)),
                None => Err(WorldError::InvalidPeer { peer }),
            },
            Route::Tcp => match self.tcp.as_mut() {
                Some(t) => Ok(t.send(peer, tag, data)?),
                None => Err(WorldError::InvalidPeer { peer }),
            },
        }
    }

    /// Shared memory names peers by local rank: translate.
    fn sm_error(&self, e: SmError) -> WorldError {
        match e {
            SmError::PeerFailed { peer } => WorldError::PeerFailed {
                peer: self.global(peer),
                why: "the process died or left (shared memory)".into(),
            },
            e => WorldError::Sm(e),
        }
    }

    fn global(&self, local: u32) -> u32 {
        self.local.get(local as usize).copied().unwrap_or(u32::MAX)
    }

    /// Sends `data` to rank `peer` with `tag`; returns when `data` may be
    /// reused. Messages to one peer arrive in the order sent.
    pub fn send(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), WorldError> {
        if tag > MAX_USER_TAG {
            return Err(WorldError::ReservedTag { tag });
        }
        self.send_any(peer, tag, data)
    }

    /// Lends the region table to TCP for `f` when both transports run.
    fn with_tcp<R>(&mut self, f: impl FnOnce(&mut Tcp) -> R) -> Option<R> {
        let tcp = self.tcp.as_mut()?;
        match self.sm.as_mut() {
            Some(sm) => {
                std::mem::swap(sm.regions_mut(), tcp.regions_mut());
                let r = f(tcp);
                std::mem::swap(sm.regions_mut(), tcp.regions_mut());
                Some(r)
            }
            None => Some(f(tcp)),
        }
    }

    /// One non-blocking pass over both transports and our own messages;
    /// returns the number of events.
    pub fn progress(&mut self) -> usize {
        let mut n = 0;
        if let Some(sm) = &mut self.sm {
            n += sm.progress();
        }
        n += self.with_tcp(|t| t.progress()).unwrap_or(0);
        while let Some((tag, data)) = self.to_self.pop_front() {
            if let Some(h) = &self.handlers[usize::from(tag)] {
                (h.borrow_mut())(self.id.rank, &data);
            } else {
                log::warn!("message to ourselves with tag {tag} and no handler: dropped");
            }
            n += 1;
        }
        n
    }

    /// Peers that failed so far, with the reason.
    pub fn failed_peers(&self) -> Vec<(u32, String)> {
        let mut v = Vec::new();
        if let Some(sm) = &self.sm {
            for &l in sm.failed_peers() {
                v.push((
                    self.global(l),
                    "the process died (shared memory)".to_string(),
                ));
            }
        }
        if let Some(t) = &self.tcp {
            v.extend(t.failed_peers());
        }
        v
    }

    /// Progresses until `done()`, idling politely (spin, yield, then short
    /// sleeps or `epoll_wait`), checking shared-memory peers' liveness
    /// every 100 ms. Ends with [`WorldError::PeerFailed`] when `peer` fails
    /// — or, with `peer` `None`, when any peer fails (a wait whose
    /// condition depends on one peer should name it, so that another
    /// peer's failure does not end it) — and with [`WorldError::Timeout`]
    /// after `BTL_TIMEOUT`.
    pub fn wait(
        &mut self,
        what: &'static str,
        peer: Option<u32>,
        done: &mut dyn FnMut() -> bool,
    ) -> Result<(), WorldError> {
        self.wait_with(
            what,
            &mut |_, p| peer.is_none_or(|want| want == p),
            &mut |_| done(),
        )
    }

    /// [`Self::wait`] with conditions that may look at the world: the wait
    /// ends with an error when a failed peer `p` has `fatal(world, p)`.
    fn wait_with(
        &mut self,
        what: &'static str,
        fatal: &mut dyn FnMut(&World, u32) -> bool,
        done: &mut dyn FnMut(&mut World) -> bool,
    ) -> Result<(), WorldError> {
        let start = Instant::now();
        let mut idle = 0u32;
        let mut rounds = 0u32;
        loop {
            if done(self) {
                return Ok(());
            }
            rounds = rounds.wrapping_add(1);
            if rounds % 256 == 0 {
                let now = Instant::now();
                if let Some(sm) = &mut self.sm {
                    if now.duration_since(self.last_liveness) >= crate::sm::LIVENESS_INTERVAL {
                        self.last_liveness = now;
                        sm.check_peers();
                    }
                }
                let failed = self.failed_peers();
                if let Some((p, why)) = failed.into_iter().find(|(p, _)| fatal(self, *p)) {
                    return Err(WorldError::PeerFailed { peer: p, why });
                }
                if now.duration_since(start) > self.timeout {
                    return Err(WorldError::Timeout {
                        what,
                        waited: now.duration_since(start),
                    });
                }
            }
            if self.progress() > 0 {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            match (&mut self.sm, idle >= 2000) {
                (Some(sm), _) => sm.idle(idle),
                (None, false) => std::hint::spin_loop(),
                (None, true) => {
                    // TCP only: block in epoll for a while.
                    self.with_tcp(|t| t.progress_timeout(Duration::from_millis(1)));
                }
            }
        }
    }

    /// Waits until every rank has called `barrier` as often: each rank
    /// announces its arrival at epoch `k` to every other (over shared
    /// memory on the job API's barrier tag, over TCP with the TCP
    /// transport's barrier frame, which a bare-metal node speaks too) and
    /// waits for the `n - 1` announcements of the others.
    pub fn barrier(&mut self) -> Result<(), WorldError> {
        self.barrier_epoch += 1;
        let epoch = self.barrier_epoch;
        let me = self.id.rank;
        for p in (0..self.id.size).filter(|&p| p != me) {
            match self.route_of(p)? {
                Route::Tcp => match self.tcp.as_mut() {
                    Some(t) => t.send_barrier(p, epoch)?,
                    None => return Err(WorldError::InvalidPeer { peer: p }),
                },
                _ => self.send_any(p, TAG_BARRIER, &epoch.to_le_bytes())?,
            }
        }
        let arrived = |w: &World, p: u32| {
            w.barrier_in
                .borrow()
                .get(&epoch)
                .is_some_and(|s| s.contains(&p))
                || w.tcp.as_ref().is_some_and(|t| t.barrier_arrived(epoch, p))
        };
        // A peer that fails after announcing its arrival does not stop the
        // barrier; one that fails before does (the error names it).
        self.wait_with(
            "the other ranks at a barrier",
            &mut |w, p| !arrived(w, p),
            &mut |w| (0..w.id.size).filter(|&p| p != me).all(|p| arrived(w, p)),
        )?;
        self.barrier_in.borrow_mut().remove(&epoch);
        if let Some(t) = self.tcp.as_mut() {
            t.barrier_forget(epoch);
        }
        Ok(())
    }

    /// Waits until everything sent has left (and, over shared memory, been
    /// acknowledged).
    pub fn flush(&mut self) -> Result<(), WorldError> {
        if let Some(sm) = &mut self.sm {
            sm.flush().map_err(WorldError::Sm)?;
        }
        if let Some(r) = self.with_tcp(|t| t.flush()) {
            r?;
        }
        Ok(())
    }

    fn table(&mut self) -> &mut RegionTable {
        match (&mut self.sm, &mut self.tcp) {
            (Some(sm), _) => sm.regions_mut(),
            (None, Some(t)) => t.regions_mut(),
            (None, None) => &mut self.own_regions,
        }
    }

    /// Registers a zeroed region of `len` bytes that every rank may get
    /// from and put into (through the returned key, sent to them).
    pub fn register(&mut self, len: usize) -> RegionKey {
        let id = self.next_region;
        self.next_region += 1;
        self.table().insert(id, vec![0u8; len].into_boxed_slice());
        RegionKey {
            rank: self.id.rank,
            id,
            len: len as u64,
        }
    }

    /// The contents of one of our regions.
    pub fn region(&mut self, key: &RegionKey) -> Option<Vec<u8>> {
        if key.rank != self.id.rank {
            return None;
        }
        self.table().get(&key.id).map(|r| r.to_vec())
    }

    fn local_range(
        &mut self,
        key: &RegionKey,
        offset: u64,
        len: usize,
    ) -> Result<&mut [u8], RmaStatus> {
        let region = self
            .table()
            .get_mut(&key.id)
            .ok_or(RmaStatus::UnknownRegion)?;
        let end = offset
            .checked_add(len as u64)
            .filter(|&e| e <= region.len() as u64)
            .ok_or(RmaStatus::OutOfBounds)?;
        Ok(&mut region[offset as usize..end as usize])
    }

    /// Writes `src` at `offset` of the region `key` (of any rank):
    /// `Ok(Err(status))` when the target refused it.
    pub fn put(
        &mut self,
        key: &RegionKey,
        offset: u64,
        src: &[u8],
    ) -> Result<Result<(), RmaStatus>, WorldError> {
        self.rma(key, offset, Rma::Put(src))
    }

    /// Reads `dst.len()` bytes at `offset` of the region `key` (of any
    /// rank): `Ok(Err(status))` when the target refused it.
    pub fn get(
        &mut self,
        key: &RegionKey,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<Result<(), RmaStatus>, WorldError> {
        self.rma(key, offset, Rma::Get(dst))
    }

    /// A get or put, by the route to the region's owner; a refusal by the
    /// target is `Ok(Err(status))`, anything else an error.
    fn rma(
        &mut self,
        key: &RegionKey,
        offset: u64,
        op: Rma<'_>,
    ) -> Result<Result<(), RmaStatus>, WorldError> {
        let missing = WorldError::InvalidPeer { peer: key.rank };
        match self.route_of(key.rank)? {
            Route::Me => Ok(self.local_range(key, offset, op.len()).map(|r| match op {
                Rma::Put(src) => r.copy_from_slice(src),
                Rma::Get(dst) => dst.copy_from_slice(r),
            })),
            Route::Sm(l) => {
                let k = RegionKey { rank: l, ..*key };
                let sm = self.sm.as_mut().ok_or(missing)?;
                let r = match op {
                    Rma::Put(src) => sm.put(&k, offset, src),
                    Rma::Get(dst) => sm.get(&k, offset, dst),
                };
                match r {
                    Ok(()) => Ok(Ok(())),
                    Err(SmError::Rma { status, .. }) => Ok(Err(status)),
                    Err(e) => Err(self.sm_error(e)),
                }
            }
            Route::Tcp => match self.with_tcp(|t| match op {
                Rma::Put(src) => t.put(key, offset, src),
                Rma::Get(dst) => t.get(key, offset, dst),
            }) {
                Some(Ok(())) => Ok(Ok(())),
                Some(Err(TcpError::Rma { status, .. })) => Ok(Err(status)),
                Some(Err(e)) => Err(e.into()),
                None => Err(missing),
            },
        }
    }

    /// One line for people: what moves the bytes.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(sm) = &self.sm {
            let how = if !sm.params().use_cma {
                "pipelined copy (use_cma=0)"
            } else if (0..sm.size()).any(|p| p != sm.rank() && sm.single_copy_to(p)) {
                "single copy (CMA) or pipelined, chosen by measurement"
            } else {
                "single copy refused by the kernel: pipelined copy"
            };
            parts.push(format!(
                "sm to {} local rank(s), {how}",
                self.local.len() - 1
            ));
        }
        if let Some(t) = &self.tcp {
            let remote = self.route.iter().filter(|r| **r == Route::Tcp).count();
            parts.push(format!(
                "tcp to {remote} rank(s), listening on {}",
                t.published_addrs()
            ));
        }
        if parts.is_empty() {
            parts.push("no peers".into());
        }
        format!(
            "{} ranks on {} node(s); {}",
            self.id.size,
            self.nodes,
            parts.join("; ")
        )
    }

    /// `"sm"`, `"tcp"` or `"sm+tcp"`: what carries this rank's traffic.
    pub fn transport_name(&self) -> &'static str {
        match (self.sm.is_some(), self.tcp.is_some(), self.choice) {
            (_, _, Choice::Tcp) | (false, true, _) => "tcp",
            (true, true, _) => "sm+tcp",
            _ => "sm",
        }
    }

    /// One line for the stress summary: nodes, peers per transport,
    /// counters.
    pub fn summary(&self) -> String {
        let sm_peers = self.local.len().saturating_sub(1);
        let tcp_peers = self.route.iter().filter(|r| **r == Route::Tcp).count();
        let mut s = format!(
            "on {} node(s): shared memory to {sm_peers} rank(s), TCP to {tcp_peers} rank(s)",
            self.nodes
        );
        if let Some(sm) = &self.sm {
            let cma = (0..sm.size())
                .filter(|&p| p != sm.rank() && sm.single_copy_to(p))
                .count();
            s += &format!(
                " (sm: single copy to {cma}, {} sends queued behind a full ring)",
                sm.queued_total()
            );
        }
        if let Some(t) = &self.tcp {
            s += &format!(
                " (tcp: {} connection(s) from strangers dropped)",
                t.rejected_connections()
            );
        }
        s
    }
}
