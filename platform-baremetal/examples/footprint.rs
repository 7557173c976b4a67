//! The footprint of a bare-metal node.
//!
//! - On the host (`cargo run -p btl-baremetal --example footprint`): prints
//!   the static RAM a node needs for N peers, from the code's own size
//!   constants (`Sizes::memory_size`) and `size_of`.
//! - Built for a bare-metal target (`cargo build -p btl-baremetal --example
//!   footprint --release --no-default-features --target
//!   thumbv7em-none-eabihf`): a minimal firmware image — a node on a device
//!   whose packets the optimiser cannot predict, polled forever — whose
//!   `size` is the code size of the adapter, btl-core's TCP machinery and
//!   smoltcp (TCP over IPv4 on Ethernet).
#![cfg_attr(target_os = "none", no_std, no_main)]

use btl_baremetal::smoltcp;
use btl_baremetal::{Config, Node, Sizes};

/// Sockets and peers of the measured configuration.
const SOCKETS: usize = 6;
const PEERS: usize = 4;

fn config() -> Config {
    let mut c = Config::new(b"job", 1, PEERS as u32, 7000);
    c.sizes = Sizes::SMALL;
    c
}

#[cfg(not(target_os = "none"))]
fn main() {
    use smoltcp::iface::SocketStorage;
    let node = core::mem::size_of::<Node<'static, SOCKETS, PEERS>>();
    let storage = core::mem::size_of::<SocketStorage<'static>>();
    let iface = core::mem::size_of::<smoltcp::iface::Interface>();
    let s = Sizes::SMALL;
    println!("Sizes::SMALL = {s:?}");
    println!(
        "per socket: {} B buffers + {storage} B SocketStorage; per peer: {} B buffers",
        s.rx + s.tx + s.read_ahead,
        s.message + s.queue
    );
    println!(
        "Node<{SOCKETS}, {PEERS}> value: {node} B (of which the smoltcp Interface: {iface} B)"
    );
    println!("peers  sockets  buffers(B)  Node value(B)  total static RAM(B)");
    // One connection per peer plus 2 listening sockets.
    macro_rules! row {
        ($peers:literal, $sockets:literal) => {{
            let bufs = s.memory_size($sockets, $peers);
            let value = core::mem::size_of::<Node<'static, $sockets, $peers>>();
            println!(
                "{:>5}  {:>7}  {bufs:>10}  {value:>13}  {:>19}",
                $peers,
                $sockets,
                bufs + $sockets * storage + value
            );
        }};
    }
    row!(2, 4);
    row!(4, 6);
    row!(8, 10);
    row!(16, 18);
    row!(32, 34);
    let _ = config();
}

#[cfg(target_os = "none")]
mod firmware {
    use core::hint::black_box;

    use super::*;
    use smoltcp::iface::{Interface, SocketStorage};
    use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};
    use smoltcp::time::Instant;
    use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, Ipv4Address};

    /// A NIC the optimiser cannot see through.
    struct Nic([u8; 1514]);

    struct Rx<'a>(&'a [u8]);
    struct Tx<'a>(&'a mut [u8]);

    impl phy::RxToken for Rx<'_> {
        fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
            f(black_box(self.0))
        }
    }

    impl phy::TxToken for Tx<'_> {
        fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
            let n = len.min(self.0.len());
            let r = f(&mut self.0[..n]);
            black_box(&self.0[..n]);
            r
        }
    }

    impl Device for Nic {
        type RxToken<'a> = Rx<'a>;
        type TxToken<'a> = Tx<'a>;
        fn receive(&mut self, _: Instant) -> Option<(Rx<'_>, Tx<'_>)> {
            if black_box(false) {
                let (a, b) = self.0.split_at_mut(757);
                Some((Rx(a), Tx(b)))
            } else {
                None
            }
        }
        fn transmit(&mut self, _: Instant) -> Option<Tx<'_>> {
            black_box(true).then(|| Tx(&mut self.0[..]))
        }
        fn capabilities(&self) -> DeviceCapabilities {
            let mut caps = DeviceCapabilities::default();
            caps.medium = Medium::Ethernet;
            caps.max_transmission_unit = 1514;
            caps
        }
    }

    pub(crate) fn run() -> ! {
        let mut nic = Nic([0; 1514]);
        let hw = HardwareAddress::Ethernet(EthernetAddress([2, 0, 0, 0, 0, 2]));
        let mut iface = Interface::new(
            smoltcp::iface::Config::new(hw),
            &mut nic,
            Instant::from_millis(0),
        );
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(Ipv4Address::new(10, 0, 0, 2).into(), 24));
        });
        let mut storage = [SocketStorage::EMPTY; SOCKETS];
        let mut memory = [0u8; Sizes::SMALL.memory_size(SOCKETS, PEERS)];
        let Ok(mut node) =
            Node::<'_, SOCKETS, PEERS>::new(config(), iface, &mut storage, &mut memory)
        else {
            loop {}
        };
        let _ = node.set_peer(0, Ipv4Address::new(10, 0, 0, 1), 7000);
        let mut now = 0u64;
        loop {
            now += 1;
            if black_box(now % 1000 == 0) {
                let _ = node.send(0, 1, black_box(b"ping"));
            }
            node.poll(now, &mut nic, &mut |ev| {
                black_box(&ev);
            });
        }
    }

    #[panic_handler]
    fn panic(_: &core::panic::PanicInfo) -> ! {
        loop {}
    }
}

/// The firmware's entry point (no runtime crate: the linker's default
/// layout is enough to measure the code).
#[cfg(target_os = "none")]
#[allow(unsafe_code)] // `no_mangle`: the symbol the linker starts from.
#[no_mangle]
pub extern "C" fn _start() -> ! {
    firmware::run()
}
