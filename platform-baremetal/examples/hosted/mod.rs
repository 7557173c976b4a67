//! The bare-metal node hosted on Linux, for people and tests: a [`Node`] on
//! a TAP device (smoltcp's `TunTapInterface`), its identity and peers from
//! the job's wire-up (whatever source btl-linux's `wireup::open` finds: the
//! launcher's service, a rendezvous, the session directory), driven as
//! btl-linux's job API drives it: publish the node name, fence, publish
//! `tcp-addr`, fence, read the others',
//! wrapped as a `btl_cli::transport::Transport` so that `btl stress` and
//! `btl bench` run unchanged on it. Shared by the `tap_node` example and
//! the interop test (`#[path]`).
#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use btl_baremetal::smoltcp;
use btl_baremetal::{Config, Event, Node, RmaError, SendError, Sizes};
use btl_cli::transport::{BoxError, Consumer, Transport};
use btl_linux::sm::{RegionKey, RmaStatus};
use btl_linux::wireup::get_vec;
use btl_linux::world::{Flow, Outbox};
use smoltcp::iface::{Interface, SocketStorage};
use smoltcp::phy::{Medium, TunTapInterface};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, Ipv4Cidr};

/// Sockets of the hosted node.
pub const SOCKETS: usize = 8;
/// Ranks a hosted node's job may have.
pub const PEERS: usize = 4;

/// The hosted node.
pub type HostedNode = Node<'static, SOCKETS, PEERS>;

/// Buffer sizes of the hosted node: 256 KiB socket buffers (window
/// scaling), messages up to 1 MiB.
pub const HOSTED_SIZES: Sizes = Sizes {
    rx: 256 * 1024,
    tx: 256 * 1024,
    read_ahead: 32 * 1024,
    message: (1 << 20) + 64 * 1024,
    queue: (2 << 20) + 64 * 1024,
};

/// A bare-metal node on a TAP device, as a `Transport`.
pub struct TapNode {
    node: HostedNode,
    dev: TunTapInterface,
    start: Instant,
    /// Messages that arrived while nobody listened (blocking calls), for
    /// the next `poll`/`drive`.
    stash: VecDeque<(u32, u8, Vec<u8>)>,
    outbox: Outbox,
    rma: HashMap<u64, Result<Vec<u8>, RmaError>>,
    timeout: Duration,
    tap: String,
    addr: String,
}

fn leak<T>(v: Vec<T>) -> &'static mut [T] {
    Box::leak(v.into_boxed_slice())
}

impl TapNode {
    /// Opens TAP device `tap` (which must exist, e.g. `ip tuntap add mode
    /// tap`), gives the node address `cidr` (e.g. 10.78.0.2/24) and
    /// `port`, publishes `tcp-addr` and reads every rank's. `BTL_TCP_*`
    /// parameters apply (`use_nagle`, `handshake_timeout`, `max_frame`).
    pub fn open(tap: &str, cidr: Ipv4Cidr, port: u16) -> Result<TapNode, BoxError> {
        let (job, mut wireup) = btl_linux::wireup::open()?;
        let mut dev = TunTapInterface::new(tap, Medium::Ethernet)
            .map_err(|e| format!("cannot open TAP device {tap}: {e}"))?;
        let mac = EthernetAddress([0x02, 0x62, 0x74, 0x6c, 0, job.rank as u8]);
        let mut c = smoltcp::iface::Config::new(HardwareAddress::Ethernet(mac));
        c.random_seed = std::process::id() as u64 ^ 0x6274_6c00;
        let mut iface = Interface::new(c, &mut dev, smoltcp::time::Instant::from_millis(0));
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::Ipv4(cidr));
        });
        let params = btl_linux::tcp::params_from_env()?;
        let mut cfg = Config::new(job.job.as_bytes(), job.rank, job.size, port);
        cfg.sizes = HOSTED_SIZES;
        cfg.apply_params(&params);
        cfg.listen_sockets = PEERS;
        let storage = leak((0..SOCKETS).map(|_| SocketStorage::EMPTY).collect());
        let memory = leak(vec![0u8; HostedNode::memory_size(&cfg)]);
        let mut node = HostedNode::new(cfg, iface, storage, memory)?;
        let addr = format!("{}:{port}", cidr.address());
        // The job API's two rounds: where everybody is, then (as the node
        // is on its own node) the TCP addresses.
        wireup.put(btl_linux::world::NODE_KEY, job.node.as_bytes())?;
        wireup.fence()?;
        wireup.put(btl_linux::tcp::ADDR_KEY, addr.as_bytes())?;
        wireup.fence()?;
        for r in (0..job.size).filter(|&r| r != job.rank) {
            let v = get_vec(wireup.as_mut(), r, btl_linux::tcp::ADDR_KEY)?
                .ok_or_else(|| format!("rank {r} published no address"))?;
            let text = String::from_utf8_lossy(&v);
            let sa = text
                .trim()
                .split(',')
                .filter_map(|a| a.parse::<std::net::SocketAddr>().ok())
                .find(|a| a.is_ipv4())
                .ok_or_else(|| format!("rank {r} published no IPv4 address: {text:?}"))?;
            let std::net::IpAddr::V4(v4) = sa.ip() else {
                continue;
            };
            node.set_peer(r, IpAddress::Ipv4(v4), sa.port())?;
        }
        let timeout = std::env::var("BTL_TIMEOUT")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(Duration::from_secs(300), Duration::from_secs);
        Ok(TapNode {
            node,
            dev,
            start: Instant::now(),
            stash: VecDeque::new(),
            outbox: Outbox::default(),
            rma: HashMap::new(),
            timeout,
            tap: tap.to_string(),
            addr,
        })
    }

    /// The node (counters, state).
    pub fn node(&self) -> &HostedNode {
        &self.node
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// One pass: smoltcp and the state machines; messages to `user` while
    /// it takes them (it is done once it returned [`Flow::Done`], which
    /// `done` records), else kept; then the replies it queued.
    fn poll_once(&mut self, mut user: Option<&mut Consumer<'_>>, done: &mut bool) -> usize {
        let mut n = 0;
        if let Some(u) = user.as_mut() {
            while !*done {
                let Some((from, tag, data)) = self.stash.pop_front() else {
                    break;
                };
                n += 1;
                let ev = btl_linux::world::Event::Message {
                    from,
                    tag,
                    data: &data,
                };
                *done = u(&mut self.outbox, ev) == Flow::Done;
            }
        }
        let now = self.now_ms();
        let stash = &mut self.stash;
        let outbox = &mut self.outbox;
        let rma = &mut self.rma;
        n += self.node.poll(now, &mut self.dev, &mut |ev| match ev {
            Event::Message { from, tag, data } => match user.as_mut() {
                Some(u) if !*done => {
                    let ev = btl_linux::world::Event::Message { from, tag, data };
                    *done = u(outbox, ev) == Flow::Done;
                }
                _ => stash.push_back((from, tag, data.to_vec())),
            },
            Event::PutDone {
                request, result, ..
            } => {
                rma.insert(request, result.map(|()| Vec::new()));
            }
            Event::GetDone {
                request, result, ..
            } => {
                rma.insert(request, result.map(<[u8]>::to_vec));
            }
            Event::PeerFailed { peer, reason } => log::warn!("peer {peer} failed: {reason}"),
        });
        let mut replies = Vec::new();
        self.outbox
            .drain(|p, t, d| replies.push((p, t, d.to_vec())));
        for (p, t, d) in replies {
            if let Err(e) = self.retry(|node| node.send(p, t, &d)) {
                log::warn!("reply to rank {p} dropped: {e}");
            }
        }
        n
    }

    /// Polls until `done(self)`: busy at first, then sleeping on the TAP
    /// descriptor (at most 1 ms, or until smoltcp's next timer).
    fn wait_for(
        &mut self,
        what: &str,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> Result<(), BoxError> {
        self.wait_loop(what, None, &mut |t, _| done(t))
    }

    /// The one wait loop: polls (messages to `user` while it takes them,
    /// else kept) until `done(self, user_finished)`, busy at first, then
    /// sleeping on the TAP descriptor (at most 1 ms, or until smoltcp's
    /// next timer); a failed peer or `BTL_TIMEOUT` ends it with an error.
    fn wait_loop(
        &mut self,
        what: &str,
        mut user: Option<&mut Consumer<'_>>,
        done: &mut dyn FnMut(&mut Self, bool) -> bool,
    ) -> Result<(), BoxError> {
        let start = Instant::now();
        let mut idle = 0u32;
        let mut finished = false;
        loop {
            if done(self, finished) {
                return Ok(());
            }
            if let Some((peer, reason)) = self.node.failed_peer() {
                return Err(format!("peer {peer} failed: {reason}").into());
            }
            if self.poll_once(user.as_deref_mut(), &mut finished) > 0 {
                idle = 0;
                continue;
            }
            idle += 1;
            if idle > 2000 {
                let now = self.now_ms();
                let delay = self.node.poll_delay(now).unwrap_or(1).min(1);
                let _ = smoltcp::phy::wait(
                    self.dev.as_raw_fd(),
                    Some(smoltcp::time::Duration::from_millis(delay)),
                );
            }
            if idle % 256 == 0 && start.elapsed() > self.timeout {
                return Err(format!("timed out waiting for {what}").into());
            }
        }
    }

    /// Retries `f` while the queue is full, progressing meanwhile.
    fn retry<T>(
        &mut self,
        mut f: impl FnMut(&mut HostedNode) -> Result<T, SendError>,
    ) -> Result<T, BoxError> {
        let mut out = None;
        let mut err = None;
        self.wait_for("room in a peer's queue", |t| match f(&mut t.node) {
            Ok(v) => {
                out = Some(v);
                true
            }
            Err(SendError::QueueFull { .. }) => false,
            Err(e) => {
                err = Some(e);
                true
            }
        })?;
        match (out, err) {
            (Some(v), _) => Ok(v),
            (None, Some(e)) => Err(e.into()),
            (None, None) => Err("no result".into()),
        }
    }

    fn rma_wait(&mut self, request: u64) -> Result<Result<Vec<u8>, RmaError>, BoxError> {
        self.wait_for("a get/put answer", |t| t.rma.contains_key(&request))?;
        self.rma
            .remove(&request)
            .ok_or_else(|| "get/put answer lost".into())
    }
}

fn status(e: RmaError) -> Result<RmaStatus, BoxError> {
    match e {
        RmaError::Refused => Ok(RmaStatus::OutOfBounds),
        other => Err(format!("get/put failed: {other}").into()),
    }
}

impl Transport for TapNode {
    fn name(&self) -> &'static str {
        "smoltcp"
    }
    fn describe(&self) -> String {
        format!(
            "transport smoltcp (btl-baremetal), {} ranks, on TAP {} as {}",
            self.node.size(),
            self.tap,
            self.addr
        )
    }
    fn rank(&self) -> u32 {
        self.node.rank()
    }
    fn size(&self) -> u32 {
        self.node.size()
    }
    fn send(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), BoxError> {
        self.retry(|n| n.send(peer, tag, data))
    }
    fn poll(&mut self, f: &mut Consumer<'_>) -> usize {
        self.poll_once(Some(f), &mut false)
    }
    fn drive(
        &mut self,
        what: &'static str,
        _peer: Option<u32>,
        f: &mut Consumer<'_>,
    ) -> Result<(), BoxError> {
        self.wait_loop(what, Some(f), &mut |_, finished| finished)
    }
    fn barrier(&mut self) -> Result<(), BoxError> {
        let epoch = self.retry(|n| n.barrier_start())?;
        self.wait_for("the other ranks at a barrier", |t| {
            t.node.barrier_done(epoch)
        })
    }
    fn flush(&mut self) -> Result<(), BoxError> {
        self.wait_for("queued frames to be acknowledged", |t| t.node.is_flushed())
    }
    fn failed(&self, peer: u32) -> bool {
        matches!(
            self.node.peer_state(peer),
            Some(btl_baremetal::core::tcp::endpoint::EndpointState::Failed(_))
        )
    }
    fn summary(&self) -> String {
        let s = self.node.stats();
        format!(
            "over smoltcp on {} (accepted={} connected={} tie_breaks={} rejected={})",
            self.tap, s.accepted, s.connected, s.tie_breaks, s.rejected
        )
    }
    fn register(&mut self, len: usize) -> RegionKey {
        let region = leak(vec![0u8; len]);
        match self.node.register(region) {
            Ok(k) => RegionKey {
                rank: k.rank,
                id: k.id,
                len: k.len,
            },
            // Out of regions: a key no peer can use (refused as unknown).
            Err(_) => RegionKey {
                rank: self.node.rank(),
                id: u32::MAX,
                len: 0,
            },
        }
    }
    fn region(&mut self, key: &RegionKey) -> Option<Vec<u8>> {
        (key.rank == self.node.rank())
            .then(|| self.node.region(key.id).map(<[u8]>::to_vec))
            .flatten()
    }
    fn put(
        &mut self,
        key: &RegionKey,
        offset: u64,
        src: &[u8],
    ) -> Result<Result<(), RmaStatus>, BoxError> {
        let k = btl_baremetal::RegionKey {
            rank: key.rank,
            id: key.id,
            len: key.len,
        };
        let step = self.node.max_frame() as usize - btl_baremetal::core::tcp::wire::RMA_HEADER_LEN;
        let mut done = 0;
        loop {
            let end = (done + step).min(src.len());
            let req = self.retry(|n| n.put(&k, offset + done as u64, &src[done..end]))?;
            if let Err(e) = self.rma_wait(req)? {
                return Ok(Err(status(e)?));
            }
            done = end;
            if done >= src.len() {
                return Ok(Ok(()));
            }
        }
    }
    fn get(
        &mut self,
        key: &RegionKey,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<Result<(), RmaStatus>, BoxError> {
        let k = btl_baremetal::RegionKey {
            rank: key.rank,
            id: key.id,
            len: key.len,
        };
        let step = self.node.max_frame() as usize;
        let mut done = 0;
        loop {
            let end = (done + step).min(dst.len());
            let len = (end - done) as u32;
            let req = self.retry(|n| n.get(&k, offset + done as u64, len))?;
            match self.rma_wait(req)? {
                Ok(data) => dst[done..end].copy_from_slice(&data),
                Err(e) => return Ok(Err(status(e)?)),
            }
            done = end;
            if done >= dst.len() {
                return Ok(Ok(()));
            }
        }
    }
}

impl Drop for TapNode {
    fn drop(&mut self) {
        // A clean close: FIN frames, written and acknowledged (bounded).
        self.node.close();
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline && !self.node.is_flushed() {
            self.poll_once(None, &mut false);
        }
        for _ in 0..100 {
            self.poll_once(None, &mut false);
        }
    }
}
