//! Deterministic host tests: smoltcp stacks joined in memory by a hub that
//! loses, corrupts, duplicates and reorders packets from a seeded
//! generator, driven by a simulated millisecond clock. Every run of a test
//! is the same run.

use std::cell::RefCell;

use std::rc::Rc;

use btl_baremetal::core::tcp::endpoint::FailReason;
use btl_baremetal::core::workload::check::Rng;
use btl_baremetal::smoltcp;
use btl_baremetal::{Config, Event, Node, SendError, Sizes};
use smoltcp::iface::{Interface, SocketSet, SocketStorage};
use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};

use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr, Ipv4Address};

/// True with probability `per_mille`/1000.
fn chance(rng: &mut Rng, per_mille: u64) -> bool {
    rng.next() % 1000 < per_mille
}

/// Fault rates, per mille of packets.
#[derive(Clone, Copy)]
struct Faults {
    loss: u64,
    corrupt: u64,
    dup: u64,
    reorder: u64,
}

const CLEAN: Faults = Faults {
    loss: 0,
    corrupt: 0,
    dup: 0,
    reorder: 0,
};

#[derive(Default)]
struct Counts {
    sent: u64,
    lost: u64,
    corrupted: u64,
    duplicated: u64,
    reordered: u64,
}

/// An IP hub: port `i` owns 10.0.0.(i+1); packets are routed by their
/// IPv4 destination, 1 ms later (plus up to 5 ms when reordered).
struct Hub {
    queues: Vec<Vec<(u64, u64, Vec<u8>)>>,
    /// Ports whose node vanished: what they send and receive is dropped.
    dead: Vec<bool>,
    now: u64,
    seq: u64,
    rng: Rng,
    faults: Faults,
    counts: Counts,
}

impl Hub {
    fn new(ports: usize, seed: u64, faults: Faults) -> Rc<RefCell<Hub>> {
        Rc::new(RefCell::new(Hub {
            queues: (0..ports).map(|_| Vec::new()).collect(),
            dead: vec![false; ports],
            now: 0,
            seq: 0,
            rng: Rng::from_state(seed | 1),
            faults,
            counts: Counts::default(),
        }))
    }

    fn send(&mut self, from: usize, mut pkt: Vec<u8>) {
        if self.dead[from] || pkt.len() < 20 {
            return;
        }
        let to = usize::from(pkt[19]).wrapping_sub(1);
        if to >= self.queues.len() || self.dead[to] {
            return;
        }
        self.counts.sent += 1;
        let f = self.faults;
        if chance(&mut self.rng, f.loss) {
            self.counts.lost += 1;
            return;
        }
        if chance(&mut self.rng, f.corrupt) {
            self.counts.corrupted += 1;
            let at = (self.rng.next() % pkt.len() as u64) as usize;
            pkt[at] ^= 1 << (self.rng.next() % 8);
        }
        let copies = if chance(&mut self.rng, f.dup) {
            self.counts.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut at = self.now + 1;
            if chance(&mut self.rng, f.reorder) {
                self.counts.reordered += 1;
                at += 1 + self.rng.next() % 5;
            }
            self.seq += 1;
            self.queues[to].push((at, self.seq, pkt.clone()));
        }
    }

    fn take(&mut self, port: usize) -> Option<Vec<u8>> {
        let now = self.now;
        let q = &mut self.queues[port];
        let k = q
            .iter()
            .enumerate()
            .filter(|(_, p)| p.0 <= now)
            .min_by_key(|(_, p)| (p.0, p.1))
            .map(|(k, _)| k)?;
        let pkt = q.remove(k).2;
        if self.dead[port] {
            return None;
        }
        Some(pkt)
    }
}

struct Port {
    hub: Rc<RefCell<Hub>>,
    port: usize,
}

struct Rx(Vec<u8>);
struct Tx {
    hub: Rc<RefCell<Hub>>,
    port: usize,
}

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for Tx {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = vec![0u8; len];
        let r = f(&mut buf);
        self.hub.borrow_mut().send(self.port, buf);
        r
    }
}

impl Device for Port {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx;

    fn receive(&mut self, _: Instant) -> Option<(Rx, Tx)> {
        let pkt = self.hub.borrow_mut().take(self.port)?;
        Some((
            Rx(pkt),
            Tx {
                hub: self.hub.clone(),
                port: self.port,
            },
        ))
    }

    fn transmit(&mut self, _: Instant) -> Option<Tx> {
        Some(Tx {
            hub: self.hub.clone(),
            port: self.port,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ip;
        caps.max_transmission_unit = 1500;
        caps
    }
}

fn ip(port: usize) -> Ipv4Address {
    Ipv4Address::new(10, 0, 0, port as u8 + 1)
}

fn iface(dev: &mut Port, seed: u64) -> Interface {
    let mut c = smoltcp::iface::Config::new(HardwareAddress::Ip);
    c.random_seed = seed;
    let mut iface = Interface::new(c, dev, Instant::from_millis(0));
    iface.update_ip_addrs(|a| {
        a.push(IpCidr::new(IpAddress::Ipv4(ip(dev.port)), 24))
            .unwrap();
    });
    iface
}

const PORT: u16 = 7000;
const SOCKS: usize = 10;
const PEERS: usize = 8;

type TestNode = Node<'static, SOCKS, PEERS>;

/// Rank `rank` of `size` on hub port `rank`, every other rank's address
/// configured statically.
fn node(
    hub: &Rc<RefCell<Hub>>,
    rank: u32,
    size: u32,
    tune: impl FnOnce(&mut Config),
) -> (TestNode, Port) {
    let mut dev = Port {
        hub: hub.clone(),
        port: rank as usize,
    };
    let mut cfg = Config::new(b"sim-job", rank, size, PORT);
    cfg.sizes = Sizes {
        rx: 16 * 1024,
        tx: 16 * 1024,
        read_ahead: 2048,
        message: 40 * 1024,
        queue: 80 * 1024,
    };
    cfg.max_frame = 16 * 1024;
    cfg.listen_sockets = 3;
    tune(&mut cfg);
    let iface = iface(&mut dev, 0x1234 + u64::from(rank));
    let storage: &'static mut [SocketStorage<'static>] =
        Box::leak(Box::new([SocketStorage::EMPTY; SOCKS]));
    let memory: &'static mut [u8] =
        Box::leak(vec![0u8; TestNode::memory_size(&cfg)].into_boxed_slice());
    let mut n = TestNode::new(cfg, iface, storage, memory).unwrap();
    for r in 0..size {
        if r != rank {
            n.set_peer(r, ip(r as usize), PORT).unwrap();
        }
    }
    (n, dev)
}

/// Length of message `seq` from `src`: half tiny, a third up to an MTU,
/// some up to a frame, one in a hundred chunked (above max_frame).
fn msg_len(src: u32, seq: u64) -> usize {
    let mut r =
        Rng::from_state((u64::from(src) << 40 ^ seq).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let cap = match r.next() % 100 {
        0..=49 => 64,
        50..=89 => 1500,
        90..=98 => 16 * 1024,
        _ => 36 * 1024,
    };
    (r.next() % (cap + 1)) as usize
}

fn msg(src: u32, seq: u64) -> Vec<u8> {
    let len = msg_len(src, seq);
    let mut r = Rng::from_state(
        (u64::from(src) << 48 ^ seq ^ 0x5eed).wrapping_mul(0xbf58_476d_1ce4_e5b9) | 1,
    );
    (0..len).map(|_| r.next() as u8).collect()
}

#[derive(Default)]
struct Inbox {
    next: Vec<u64>,
    errors: Vec<String>,
    failed: Failures,
    other: Vec<String>,
}

impl Inbox {
    fn new(n: usize) -> Self {
        Self {
            next: vec![0; n],
            ..Self::default()
        }
    }

    fn on(&mut self, now: u64, ev: Event<'_>) {
        match ev {
            Event::Message { from, tag, data } => {
                let seq = self.next[from as usize];
                self.next[from as usize] += 1;
                if tag != (seq % 240) as u8 || data != msg(from, seq).as_slice() {
                    self.errors.push(format!(
                        "from {from}: message {seq} wrong (tag {tag}, {} bytes, expected {})",
                        data.len(),
                        msg_len(from, seq)
                    ));
                }
            }
            Event::PeerFailed { peer, reason } => self.failed.push((peer, reason, now)),
            other => self.other.push(format!("{other:?}")),
        }
    }
}

fn step(
    hub: &Rc<RefCell<Hub>>,
    nodes: &mut [(TestNode, Port)],
    inboxes: &mut [Inbox],
    alive: &[bool],
) {
    let now = hub.borrow().now;
    for (k, (n, dev)) in nodes.iter_mut().enumerate() {
        if alive[k] {
            let inbox = &mut inboxes[k];
            n.poll(now, dev, &mut |ev| inbox.on(now, ev));
        }
    }
    hub.borrow_mut().now += 1;
}

#[test]
fn ten_thousand_messages_each_way_through_a_lossy_corrupting_reordering_link() {
    const M: u64 = 10_000;
    let hub = Hub::new(
        2,
        42,
        Faults {
            loss: 20,
            corrupt: 10,
            dup: 10,
            reorder: 50,
        },
    );
    let mut nodes = vec![node(&hub, 0, 2, |_| {}), node(&hub, 1, 2, |_| {})];
    let mut inboxes = vec![Inbox::new(2), Inbox::new(2)];
    let mut sent = [0u64; 2];
    let mut full = 0u64;
    let alive = [true, true];
    let mut steps = 0u64;
    while inboxes.iter().any(|i| i.next.iter().sum::<u64>() < M) {
        for (k, (n, _)) in nodes.iter_mut().enumerate() {
            let me = k as u32;
            // Both send from the first step: a simultaneous connect.
            while sent[k] < M {
                let seq = sent[k];
                match n.send(1 - me, (seq % 240) as u8, &msg(me, seq)) {
                    Ok(()) => sent[k] += 1,
                    Err(SendError::QueueFull { .. }) => {
                        full += 1;
                        break;
                    }
                    Err(e) => panic!("rank {me}: send {seq}: {e}"),
                }
            }
        }
        step(&hub, &mut nodes, &mut inboxes, &alive);
        steps += 1;
        assert!(
            steps < 600_000,
            "no progress: {:?}",
            inboxes.iter().map(|i| i.next.clone()).collect::<Vec<_>>()
        );
    }
    // Drain: nothing more (no duplicate) arrives.
    for _ in 0..2000 {
        step(&hub, &mut nodes, &mut inboxes, &alive);
    }
    let c = &hub.borrow().counts;
    eprintln!(
        "{} simulated ms, {} packets: {} lost, {} corrupted, {} duplicated, {} reordered; {} sends met a full queue",
        steps, c.sent, c.lost, c.corrupted, c.duplicated, c.reordered, full
    );
    assert!(c.lost > 100 && c.corrupted > 50 && c.duplicated > 50 && c.reordered > 200);
    for (k, inbox) in inboxes.iter().enumerate() {
        assert!(
            inbox.errors.is_empty(),
            "rank {k}: {:?}",
            &inbox.errors[..inbox.errors.len().min(5)]
        );
        assert_eq!(inbox.next[1 - k], M, "rank {k}");
        assert!(inbox.failed.is_empty(), "rank {k}: {:?}", inbox.failed);
        assert!(inbox.other.is_empty(), "rank {k}: {:?}", inbox.other);
    }
    // The simultaneous connect ended on rank 0's connection (lower rank
    // wins), accepted by rank 1.
    let (s0, s1) = (nodes[0].0.stats(), nodes[1].0.stats());
    assert_eq!((s0.connected, s0.accepted), (1, 0), "{s0:?}");
    assert_eq!((s1.connected, s1.accepted), (0, 1), "{s1:?}");
    assert_eq!(s0.messages + s1.messages, 2 * M);
}

/// Runs `steps` simulated ms.
fn run(
    hub: &Rc<RefCell<Hub>>,
    nodes: &mut [(TestNode, Port)],
    inboxes: &mut [Inbox],
    alive: &[bool],
    steps: u64,
) {
    for _ in 0..steps {
        step(hub, nodes, inboxes, alive);
    }
}

/// Two nodes with a 3 s socket timeout and 1 s keep-alive exchange a
/// message each way; then rank 1 vanishes (not polled, its packets gone).
/// Failures seen: (peer, reason, simulated ms).
type Failures = Vec<(u32, FailReason, u64)>;

fn vanish(send_after: bool) -> (u64, Failures, Result<(), SendError>) {
    let tune = |c: &mut Config| {
        c.timeout_ms = Some(3000);
        c.keep_alive_ms = Some(1000);
    };
    let hub = Hub::new(2, 7, CLEAN);
    let mut nodes = vec![node(&hub, 0, 2, tune), node(&hub, 1, 2, tune)];
    let mut inboxes = vec![Inbox::new(2), Inbox::new(2)];
    nodes[0].0.send(1, 0, &msg(0, 0)).unwrap();
    nodes[1].0.send(0, 0, &msg(1, 0)).unwrap();
    // Idle for longer than the timeout: keep-alive keeps a live
    // connection up.
    run(&hub, &mut nodes, &mut inboxes, &[true, true], 5000);
    assert_eq!((inboxes[0].next[1], inboxes[1].next[0]), (1, 1));
    assert!(inboxes[0].failed.is_empty() && inboxes[1].failed.is_empty());
    let t0 = hub.borrow().now;
    hub.borrow_mut().dead[1] = true;
    if send_after {
        nodes[0].0.send(1, 1, &msg(0, 1)).unwrap();
    }
    run(&hub, &mut nodes, &mut inboxes, &[true, false], 6000);
    let after = nodes[0].0.send(1, 2, b"x");
    (t0, inboxes[0].failed.clone(), after)
}

/// [`vanish`], checking that node 0 failed rank 1 once, for a socket
/// error, 2 to 3 s after it vanished (3 s after the last packet heard,
/// which was at most one keep-alive interval, 1 s, before the vanishing);
/// returns what a send to it then gave.
fn vanished_peer_fails(send_after: bool) -> Result<(), SendError> {
    let (t0, failed, after) = vanish(send_after);
    assert_eq!(failed.len(), 1, "{failed:?}");
    let (peer, reason, at) = failed[0];
    assert_eq!((peer, reason), (1, FailReason::SocketError));
    assert!(
        at >= t0 + 2000 && at <= t0 + 3050,
        "failed at {at}, vanished at {t0}"
    );
    after
}

#[test]
fn a_vanished_idle_peer_fails_after_the_timeout() {
    // Keep-alive probes go unanswered.
    let after = vanished_peer_fails(false);
    assert!(
        matches!(after, Err(SendError::PeerFailed { peer: 1, .. })),
        "{after:?}"
    );
}

#[test]
fn a_vanished_peer_with_data_in_flight_fails_after_the_timeout() {
    let after = vanished_peer_fails(true);
    assert!(
        matches!(after, Err(SendError::PeerFailed { .. })),
        "{after:?}"
    );
}

#[test]
fn a_peer_that_never_answers_fails_after_the_handshake_timeout() {
    let hub = Hub::new(2, 9, CLEAN);
    let tune = |c: &mut Config| c.handshake_timeout_ms = 2000;
    let mut nodes = vec![node(&hub, 0, 2, tune), node(&hub, 1, 2, tune)];
    hub.borrow_mut().dead[1] = true;
    let mut inboxes = vec![Inbox::new(2), Inbox::new(2)];
    nodes[0].0.send(1, 3, b"anyone?").unwrap();
    run(&hub, &mut nodes, &mut inboxes, &[true, false], 3000);
    let failed = &inboxes[0].failed;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!((failed[0].0, failed[0].1), (1, FailReason::ConnectTimeout));
    assert!((2000..2100).contains(&failed[0].2), "{failed:?}");
}

#[test]
fn simultaneous_incoming_connections_are_all_accepted() {
    // Ranks 1, 2 and 3 connect to rank 0 in the same millisecond; rank 0
    // keeps 3 sockets listening (smoltcp has no backlog).
    let hub = Hub::new(4, 11, CLEAN);
    let mut nodes: Vec<_> = (0..4).map(|r| node(&hub, r, 4, |_| {})).collect();
    let mut inboxes: Vec<_> = (0..4).map(|_| Inbox::new(4)).collect();
    for r in 1..4u32 {
        nodes[r as usize].0.send(0, 0, &msg(r, 0)).unwrap();
    }
    run(&hub, &mut nodes, &mut inboxes, &[true; 4], 300);
    assert_eq!(&inboxes[0].next[1..], &[1, 1, 1]);
    assert_eq!(nodes[0].0.stats().accepted, 3);
    for i in &inboxes {
        assert!(i.failed.is_empty() && i.errors.is_empty());
    }
    // And back, on the same connections.
    for r in 1..4u32 {
        nodes[0].0.send(r, 0, &msg(0, 0)).unwrap();
    }
    run(&hub, &mut nodes, &mut inboxes, &[true; 4], 100);
    for inbox in &inboxes[1..] {
        assert_eq!(inbox.next[0], 1);
    }
    assert_eq!(nodes[0].0.stats().connected, 0);
}

/// Eight nodes (dissemination: three rounds of one message each) through
/// three barriers over a lossy network: none leaves a barrier before every
/// node entered it, every node leaves it, and each connects only to the
/// five partners of its rounds (+-1, +-2, 4), not to all seven others.
#[test]
fn dissemination_barrier_of_eight_nodes() {
    let n = 8u32;
    let hub = Hub::new(
        n as usize,
        11,
        Faults {
            loss: 5,
            corrupt: 2,
            dup: 2,
            reorder: 10,
        },
    );
    let mut nodes: Vec<_> = (0..n).map(|r| node(&hub, r, n, |_| {})).collect();
    let mut t = 0u64;
    for epoch in 1..=3u64 {
        // Nodes enter one after another, polling between: the last one
        // enters long after the first.
        for i in 0..n as usize {
            assert_eq!(nodes[i].0.barrier_start().unwrap(), epoch);
            for _ in 0..50 {
                for (node, dev) in nodes.iter_mut() {
                    node.poll(t, dev, &mut |_| {});
                }
                t += 1;
                hub.borrow_mut().now = t;
            }
            if i + 1 < n as usize {
                for (node, _) in &nodes {
                    assert!(
                        !node.barrier_done(epoch),
                        "epoch {epoch}: done before node {} entered",
                        i + 1
                    );
                }
            }
        }
        while !nodes.iter().all(|(node, _)| node.barrier_done(epoch)) {
            for (node, dev) in nodes.iter_mut() {
                node.poll(t, dev, &mut |_| {});
            }
            t += 1;
            hub.borrow_mut().now = t;
            assert!(t < 200_000, "epoch {epoch} never completed");
        }
    }
    for (node, _) in &nodes {
        let s = node.stats();
        assert!(s.accepted + s.connected <= 5, "{s:?}");
    }
}

#[test]
fn get_put_and_barrier_between_two_nodes() {
    let hub = Hub::new(
        2,
        5,
        Faults {
            loss: 10,
            corrupt: 5,
            dup: 5,
            reorder: 20,
        },
    );
    let mut nodes = vec![node(&hub, 0, 2, |_| {}), node(&hub, 1, 2, |_| {})];
    let region: &'static mut [u8] = Box::leak(vec![0u8; 10_000].into_boxed_slice());
    let key = nodes[1].0.register(region).unwrap();
    assert_eq!((key.rank, key.id, key.len), (1, 0, 10_000));
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    let done: Rc<RefCell<Vec<String>>> = Rc::default();
    let put = nodes[0].0.put(&key, 1000, &data).unwrap();
    let bad_put = nodes[0].0.put(&key, 9_999, &[1, 2]).unwrap();
    let e0 = nodes[0].0.barrier_start().unwrap();
    let e1 = nodes[1].0.barrier_start().unwrap();
    assert_eq!((e0, e1), (1, 1));
    let mut t = 0;
    let poll_all = |nodes: &mut Vec<(TestNode, Port)>, t: &mut u64| {
        for (n, dev) in nodes.iter_mut() {
            let d = done.clone();
            n.poll(*t, dev, &mut |ev| {
                d.borrow_mut().push(match ev {
                    Event::GetDone {
                        request, result, ..
                    } => {
                        format!("get {request} {:?}", result.map(|b| b.to_vec()))
                    }
                    other => format!("{other:?}"),
                })
            });
        }
        *t += 1;
        hub.borrow_mut().now = *t;
    };
    while !(nodes[0].0.barrier_done(1) && nodes[1].0.barrier_done(1)) || done.borrow().len() < 2 {
        poll_all(&mut nodes, &mut t);
        assert!(t < 20_000);
    }
    assert_eq!(
        *done.borrow(),
        vec![
            format!("PutDone {{ request: {put}, peer: 1, result: Ok(()) }}"),
            format!("PutDone {{ request: {bad_put}, peer: 1, result: Err(Refused) }}"),
        ]
    );
    assert_eq!(&nodes[1].0.region(0).unwrap()[1000..6000], &data[..]);
    assert_eq!(
        nodes[1].0.region(0).unwrap()[9_999],
        0,
        "refused put wrote nothing"
    );
    done.borrow_mut().clear();
    let get = nodes[0].0.get(&key, 1000, 5000).unwrap();
    let bad_get = nodes[0].0.get(&key, 10_000, 1).unwrap();
    while done.borrow().len() < 2 {
        poll_all(&mut nodes, &mut t);
        assert!(t < 40_000);
    }
    assert_eq!(done.borrow()[0], format!("get {get} Ok({data:?})"));
    assert_eq!(done.borrow()[1], format!("get {bad_get} Err(Refused)"));
}

/// A peer that closes cleanly (FIN frame, then TCP's FIN) is seen as
/// having closed, not failed; the side that closed is not "closed by the
/// peer"; a later send reconnects and clears it.
#[test]
fn a_clean_close_is_told_apart_from_a_failure() {
    let hub = Hub::new(2, 11, CLEAN);
    let mut nodes = vec![node(&hub, 0, 2, |_| {}), node(&hub, 1, 2, |_| {})];
    let mut inboxes = vec![Inbox::new(2), Inbox::new(2)];
    nodes[0].0.send(1, 0, &msg(0, 0)).unwrap();
    run(&hub, &mut nodes, &mut inboxes, &[true, true], 500);
    assert_eq!(inboxes[1].next[0], 1);
    assert!(!nodes[0].0.peer_closed(1) && !nodes[1].0.peer_closed(0));
    nodes[1].0.close();
    run(&hub, &mut nodes, &mut inboxes, &[true, true], 500);
    assert!(nodes[0].0.peer_closed(1), "rank 0 sees rank 1 gone");
    assert!(!nodes[1].0.peer_closed(0), "rank 1 closed, rank 0 did not");
    assert!(inboxes[0].failed.is_empty() && inboxes[1].failed.is_empty());
    nodes[0].0.send(1, 0, &msg(0, 1)).unwrap();
    run(&hub, &mut nodes, &mut inboxes, &[true, true], 500);
    assert_eq!(inboxes[1].next[0], 2);
    assert!(!nodes[0].0.peer_closed(1), "connected again");
}

#[test]
fn a_stranger_speaking_garbage_is_dropped_and_the_node_goes_on() {
    // Port 1 is a bare smoltcp socket that connects and sends an HTTP
    // request; rank 0 drops it, counts it, and still talks to rank 2.
    let hub = Hub::new(3, 13, CLEAN);
    let mut n0 = node(&hub, 0, 3, |_| {});
    let mut n2 = node(&hub, 2, 3, |_| {});
    let mut dev = Port {
        hub: hub.clone(),
        port: 1,
    };
    let mut ifc = iface(&mut dev, 99);
    let mut storage = [SocketStorage::EMPTY; 1];
    let mut set = SocketSet::new(&mut storage[..]);
    let sock = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0u8; 4096]),
        tcp::SocketBuffer::new(vec![0u8; 4096]),
    );
    let h = set.add(sock);
    set.get_mut::<tcp::Socket>(h)
        .connect(ifc.context(), (ip(0), PORT), 40000)
        .unwrap();
    let mut inbox0 = Inbox::new(3);
    let mut inbox2 = Inbox::new(3);
    let mut wrote = false;
    for t in 0..500u64 {
        hub.borrow_mut().now = t;
        ifc.poll(Instant::from_millis(t as i64), &mut dev, &mut set);
        let s = set.get_mut::<tcp::Socket>(h);
        if s.can_send() && !wrote {
            s.send_slice(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            wrote = true;
        }
        n0.0.poll(t, &mut n0.1, &mut |ev| inbox0.on(t, ev));
        n2.0.poll(t, &mut n2.1, &mut |ev| inbox2.on(t, ev));
        if t == 100 {
            n2.0.send(0, 0, &msg(2, 0)).unwrap();
        }
    }
    assert!(wrote);
    assert_eq!(n0.0.stats().rejected, 1);
    assert!(
        !set.get::<tcp::Socket>(h).is_active(),
        "the stranger was reset"
    );
    assert_eq!(inbox0.next[2], 1);
    assert!(inbox0.errors.is_empty() && inbox0.failed.is_empty());
}

#[test]
fn configuration_is_checked() {
    let hub = Hub::new(1, 1, CLEAN);
    let mut dev = Port { hub, port: 0 };
    let mk = |cfg: Config, dev: &mut Port| {
        let storage: &'static mut [SocketStorage<'static>] =
            Box::leak(Box::new([SocketStorage::EMPTY; SOCKS]));
        let mem: &'static mut [u8] = Box::leak(vec![0u8; 1 << 20].into_boxed_slice());
        TestNode::new(cfg, iface(dev, 1), storage, mem).map(|_| ())
    };
    let ok = Config::new(b"j", 0, 2, 1);
    assert_eq!(mk(ok, &mut dev), Ok(()));
    assert!(mk(Config { rank: 2, ..ok }, &mut dev).is_err());
    assert!(mk(
        Config {
            size: PEERS as u32 + 1,
            ..ok
        },
        &mut dev
    )
    .is_err());
    assert!(mk(Config { port: 0, ..ok }, &mut dev).is_err());
    assert!(mk(
        Config {
            listen_sockets: SOCKS,
            ..ok
        },
        &mut dev
    )
    .is_err());
    let mut small_queue = ok;
    small_queue.sizes.queue = 100;
    assert!(mk(small_queue, &mut dev).is_err());
    let mut huge = ok;
    huge.sizes.rx = 1 << 20;
    assert!(matches!(
        mk(huge, &mut dev),
        Err(btl_baremetal::InitError::Memory { .. })
    ));
}
