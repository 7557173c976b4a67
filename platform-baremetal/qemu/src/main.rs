//! A bare-metal btl compute node for QEMU's riscv64 `virt` machine: no
//! kernel, no allocator, one hart. It boots from OpenSBI, reads its
//! configuration from the kernel command line, brings up the virtio-net
//! device (`virtio-drivers`) under smoltcp, and joins a btl job as one
//! rank through btl-baremetal's [`Node`](btl_baremetal::Node), speaking
//! the TCP protocol of the Linux ranks; it runs the other side of `btl
//! stress` or `btl bench`, prints its summary on the UART and ends the
//! emulator with its status (0: all intact).
//!
//! Modules: `hw` (boot, UART, timer, interrupts, exit), `fdt` (the device
//! tree), `cmdline` (the configuration), `console` (println and `log`),
//! `cell` (static buffers), `net` (virtio-net as a smoltcp device), `job`
//! (the node's blocking steps), `stress` and `bench` (the workloads).
//! See the README's "A bare-metal node in QEMU" and
//! `scripts/qemu-node.sh`.
#![no_std]
#![no_main]
#![deny(unsafe_code)]

mod bench;
mod cell;
mod cmdline;
mod console;
mod fdt;
mod hw;
mod job;
mod net;
mod stress;

use btl_baremetal::core::sync::{AtomicU64, Ordering};

use btl_baremetal::smoltcp;
use btl_baremetal::{Config, Sizes};
use smoltcp::iface::{Interface, SocketStorage};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, Ipv4Address, Ipv4Cidr};

use cell::Once;
use cmdline::Run;
use job::{BtlNode, Job, State};

/// Sockets of the node (4 kept listening).
pub const SOCKETS: usize = 8;
/// Ranks a job may have.
pub const PEERS: usize = 4;
/// The largest message the node sends or accepts (chunked into frames of
/// `max_frame`, 64 KiB by default).
pub const MAX_MESSAGE: usize = 256 * 1024;
/// Buffers of the node: 128 KiB receive windows (window scaling), 64 KiB
/// transmit buffers, 16 KiB read-ahead; per peer a message buffer of
/// [`MAX_MESSAGE`] and a queue that holds one such message in frames.
const SIZES: Sizes = Sizes {
    rx: 128 * 1024,
    tx: 64 * 1024,
    read_ahead: 16 * 1024,
    message: MAX_MESSAGE,
    queue: MAX_MESSAGE + 64 * 1024 + 1024,
};
const NODE_MEMORY: usize = SIZES.memory_size(SOCKETS, PEERS);

static MEMORY: Once<[u8; NODE_MEMORY]> = Once::new([0; NODE_MEMORY]);
static STORAGE: Once<[SocketStorage<'static>; SOCKETS]> =
    Once::new([SocketStorage::EMPTY; SOCKETS]);
static SEND: Once<[u8; MAX_MESSAGE]> = Once::new([0; MAX_MESSAGE]);
static GET: Once<[u8; MAX_MESSAGE]> = Once::new([0; MAX_MESSAGE]);
static REGION: Once<[u8; PEERS * MAX_MESSAGE]> = Once::new([0; PEERS * MAX_MESSAGE]);

/// Timer ticks per millisecond (`timebase-frequency` / 1000).
static TICKS_PER_MS: AtomicU64 = AtomicU64::new(10_000);

/// Timer ticks per millisecond.
pub fn ticks_per_ms() -> u64 {
    TICKS_PER_MS.load(Ordering::Relaxed).max(1)
}

/// Milliseconds since the machine's reset.
pub fn clock_ms() -> u64 {
    hw::ticks() / ticks_per_ms()
}

/// Stops with a message on the console and status `status`.
fn fail(status: u16, args: core::fmt::Arguments<'_>) -> ! {
    println!("btl-qemu-node: {args}");
    println!("btl-qemu-node: exit status {status}");
    hw::exit(status)
}

/// Entered from `_start` (hw.rs) with OpenSBI's hart id and device tree.
pub fn main(hart: usize, dtb: usize) -> ! {
    println!("btl-qemu-node: booting on hart {hart}");
    let Some(dt) = hw::device_tree(dtb) else {
        fail(2, format_args!("no device tree at {dtb:#x}"))
    };
    if let Some(hz) = fdt::property(dt, &["cpus"], "timebase-frequency").and_then(fdt::number) {
        if hz >= 1000 {
            TICKS_PER_MS.store(hz / 1000, Ordering::Relaxed);
        }
    }
    let line = fdt::property(dt, &["chosen"], "bootargs")
        .and_then(fdt::string)
        .unwrap_or("");
    let args = match cmdline::parse(line) {
        Ok(a) => a,
        Err(e) => fail(2, format_args!("command line {line:?}: {e}")),
    };
    console::init_log(args.log);
    let mut dev = match net::VirtioNet::open() {
        Ok(d) => d,
        Err(e) => fail(2, format_args!("{e}")),
    };
    let mac = dev.mac();
    let mut ic = smoltcp::iface::Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
    ic.random_seed = hw::ticks() ^ u64::from(args.rank) << 32;
    let mut iface = Interface::new(ic, &mut dev, smoltcp::time::Instant::from_millis(0));
    let o = args.ip.octets();
    let ip = Ipv4Address::new(o[0], o[1], o[2], o[3]);
    iface.update_ip_addrs(|a| {
        let _ = a.push(IpCidr::Ipv4(Ipv4Cidr::new(ip, args.prefix)));
    });
    let mut cfg = Config::new(args.job.as_bytes(), args.rank, args.size, args.port);
    cfg.sizes = SIZES;
    cfg.max_frame = args.max_frame;
    cfg.listen_sockets = 4;
    let (Some(memory), Some(storage)) = (MEMORY.take(), STORAGE.take()) else {
        fail(3, format_args!("static memory taken twice"))
    };
    let mut node: BtlNode = match BtlNode::new(cfg, iface, storage, memory) {
        Ok(n) => n,
        Err(e) => fail(2, format_args!("node: {e}")),
    };
    for (r, peer) in args.peers.iter().enumerate().take(args.size as usize) {
        if let (Some((addr, port)), true) = (peer, r as u32 != args.rank) {
            let a = addr.octets();
            if let Err(e) = node.set_peer(r as u32, Ipv4Address::new(a[0], a[1], a[2], a[3]), *port)
            {
                fail(2, format_args!("peer {r}: {e}"));
            }
        }
    }
    let (Some(send), Some(get), Some(region)) = (SEND.take(), GET.take(), REGION.take()) else {
        fail(3, format_args!("static memory taken twice"))
    };
    let st = State {
        checker: None,
        keys: [None; PEERS],
        rma: None,
        get_buf: get,
        data: 0,
        acks: 0,
        failed: [None; PEERS],
        first_message_ms: None,
    };
    let mut job = Job::new(node, dev, st, args.timeout_s * 1000);
    println!(
        "btl-qemu-node: rank {} of {} (job {}) ready at {}/{} port {} (virtio-net {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}, irq {}), {} ms after reset; node memory {} B",
        args.rank,
        args.size,
        args.job,
        args.ip,
        args.prefix,
        args.port,
        mac[0], mac[1], mac[2], mac[3], mac[4], mac[5],
        job.dev.irq(),
        clock_ms(),
        NODE_MEMORY,
    );
    let ok = match args.run {
        Run::Stress => {
            let opts = stress::Opts {
                messages: args.messages,
                max_size: args.max_size,
                seed: args.seed,
            };
            stress::run(&mut job, &opts, stress::Buffers { send, region })
        }
        Run::Bench => match bench::run(&mut job, &args.sizes, args.quick, send) {
            Ok(()) => true,
            Err(e) => {
                println!("btl-qemu-node: bench: {e}");
                false
            }
        },
    };
    job.close();
    let s = job.node.stats();
    println!(
        "btl-qemu-node: rank {}: accepted={} connected={} rejected={} frames rx={} tx={}",
        args.rank, s.accepted, s.connected, s.rejected, job.dev.rx_frames, job.dev.tx_frames
    );
    let status = u16::from(!ok);
    println!("btl-qemu-node: exit status {status}");
    hw::exit(status)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    fail(4, format_args!("panic: {info}"))
}
