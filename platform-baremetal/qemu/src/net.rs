//! The network device: QEMU's virtio-net on the `virt` board's
//! virtio-mmio transport, driven by `virtio-drivers`' raw driver
//! ([`VirtIONetRaw`], no allocator) and wrapped as a smoltcp [`Device`].
//!
//! - DMA memory (the two virtqueues) comes from a fixed page pool
//!   ([`DmaPool`], never freed: the driver lives as long as the image);
//!   physical addresses are virtual ones (no MMU).
//! - `QUEUE` receive buffers are posted at start; a received frame is lent
//!   to smoltcp in place and re-posted at the next call. `QUEUE` transmit
//!   buffers are filled by smoltcp in place (after the virtio-net header)
//!   and reclaimed when the device has sent them.
//!
//! # Safety
//!
//! The buffers given to the device live in static memory owned by
//! [`VirtioNet`] alone; a buffer is touched by the driver side only
//! between its completion and its next submission (tracked per
//! descriptor token), as `VirtIONetRaw`'s `*_begin`/`*_complete` contract
//! requires.
#![allow(unsafe_code)]

use btl_baremetal::core::sync::{AtomicUsize, Ordering};
use core::ptr::NonNull;

use btl_baremetal::smoltcp;
use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use virtio_drivers::device::net::VirtIONetRaw;
use virtio_drivers::transport::mmio::{MmioTransport, VirtIOHeader};
use virtio_drivers::transport::{DeviceType, Transport};
use virtio_drivers::{BufferDirection, Hal, PhysAddr, PAGE_SIZE};

use crate::cell::{Once, Pages};

/// Descriptors per virtqueue, and buffers each way.
pub const QUEUE: usize = 64;
/// One buffer: the virtio-net header (12 bytes) and an Ethernet frame of
/// 1514 bytes, rounded up.
const BUF: usize = 1536;
/// Largest Ethernet frame (without FCS) on the link.
const MTU: usize = 1514;
/// virtio-mmio slots of `virt`: 8 of 4 KiB from `0x1000_1000`, slot `i`
/// on interrupt `1 + i`.
const MMIO_BASE: usize = 0x1000_1000;
const MMIO_SLOTS: usize = 8;
const MMIO_SIZE: usize = 0x1000;

/// Pages of DMA memory (the virtqueues need 2–3 each).
const DMA_PAGES: usize = 16;
static DMA: Once<Pages<{ DMA_PAGES * PAGE_SIZE }>> = Once::new(Pages([0; DMA_PAGES * PAGE_SIZE]));
static DMA_BASE: AtomicUsize = AtomicUsize::new(0);
static DMA_NEXT: AtomicUsize = AtomicUsize::new(0);

static RX: Once<[[u8; BUF]; QUEUE]> = Once::new([[0; BUF]; QUEUE]);
static TX: Once<[[u8; BUF]; QUEUE]> = Once::new([[0; BUF]; QUEUE]);

/// The DMA page pool (a bump allocator over static pages).
#[derive(Debug)]
pub struct DmaPool;

// SAFETY: `dma_alloc` hands out disjoint, zeroed, page-aligned ranges of
// one static page array taken once (never handed to anything else), and
// physical addresses equal virtual ones on this board without an MMU.
unsafe impl Hal for DmaPool {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        let base = DMA_BASE.load(Ordering::Acquire);
        let bytes = pages.saturating_mul(PAGE_SIZE);
        let at = DMA_NEXT.fetch_add(bytes, Ordering::AcqRel);
        if base == 0 || at.saturating_add(bytes) > DMA_PAGES * PAGE_SIZE {
            log::error!("virtio: DMA pool exhausted ({DMA_PAGES} pages)");
            // A null physical address: the driver reports a DMA error.
            return (0, NonNull::dangling());
        }
        let addr = base + at;
        // The pages are zero: fresh `.bss`, never handed out before.
        (
            addr as PhysAddr,
            NonNull::new(addr as *mut u8).unwrap_or(NonNull::dangling()),
        )
    }

    unsafe fn dma_dealloc(_paddr: PhysAddr, _vaddr: NonNull<u8>, _pages: usize) -> i32 {
        // Never freed (the queues live forever); nothing to do.
        0
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, _size: usize) -> NonNull<u8> {
        NonNull::new(paddr as usize as *mut u8).unwrap_or(NonNull::dangling())
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        buffer.cast::<u8>().as_ptr() as usize as PhysAddr
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {}
}

type Raw = VirtIONetRaw<DmaPool, MmioTransport<'static>, QUEUE>;

/// Why the network device could not be started.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// No virtio-net device on any virtio-mmio slot.
    #[error(
        "no virtio-net device on the virtio-mmio slots (QEMU: -device virtio-net-device,netdev=...)"
    )]
    NoDevice,
    /// The driver refused the device or failed to set it up.
    #[error("virtio-net: {0}")]
    Driver(virtio_drivers::Error),
    /// Static buffers taken twice (started twice).
    #[error("the network device was started twice")]
    Taken,
}

/// The virtio-net device as a smoltcp device.
pub struct VirtioNet {
    raw: Raw,
    rx: &'static mut [[u8; BUF]; QUEUE],
    /// Receive buffer of each descriptor token.
    rx_of: [u8; QUEUE],
    /// The receive buffer lent to smoltcp last, to post again.
    repost: Option<usize>,
    tx: Tx,
    irq: u32,
    /// Frames received and sent.
    pub rx_frames: u64,
    /// Frames sent.
    pub tx_frames: u64,
}

impl core::fmt::Debug for VirtioNet {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VirtioNet")
            .field("irq", &self.irq)
            .field("rx_frames", &self.rx_frames)
            .field("tx_frames", &self.tx_frames)
            .finish_non_exhaustive()
    }
}

struct Tx {
    bufs: &'static mut [[u8; BUF]; QUEUE],
    /// Length submitted of each buffer; `None`: free.
    busy: [Option<usize>; QUEUE],
    /// Transmit buffer of each descriptor token.
    of: [u8; QUEUE],
}

impl VirtioNet {
    /// Finds the virtio-net device on the virtio-mmio slots, sets it up
    /// and posts every receive buffer.
    pub fn open() -> Result<VirtioNet, NetError> {
        let dma = DMA.take().ok_or(NetError::Taken)?;
        DMA_BASE.store(dma.0.as_mut_ptr() as usize, Ordering::Release);
        let (rx, tx) = match (RX.take(), TX.take()) {
            (Some(rx), Some(tx)) => (rx, tx),
            _ => return Err(NetError::Taken),
        };
        for slot in 0..MMIO_SLOTS {
            let addr = MMIO_BASE + slot * MMIO_SIZE;
            let Some(header) = NonNull::new(addr as *mut VirtIOHeader) else {
                continue;
            };
            // SAFETY: a virtio-mmio register window of `virt` (4 KiB,
            // header and config space), used by this transport alone.
            let transport = match unsafe { MmioTransport::new(header, MMIO_SIZE) } {
                Ok(t) => t,
                Err(_) => continue, // empty slot or another kind of device
            };
            if transport.device_type() != DeviceType::Network {
                continue;
            }
            let raw = Raw::new(transport).map_err(NetError::Driver)?;
            let mut dev = VirtioNet {
                raw,
                rx,
                rx_of: [0; QUEUE],
                repost: None,
                tx: Tx {
                    bufs: tx,
                    busy: [None; QUEUE],
                    of: [0; QUEUE],
                },
                irq: 1 + slot as u32,
                rx_frames: 0,
                tx_frames: 0,
            };
            for i in 0..QUEUE {
                dev.post(i)?;
            }
            return Ok(dev);
        }
        Err(NetError::NoDevice)
    }

    /// The device's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.raw.mac_address()
    }

    /// The interrupt line of the device's slot.
    pub fn irq(&self) -> u32 {
        self.irq
    }

    /// Acknowledges the device's interrupt (lowers its line).
    pub fn ack_interrupt(&mut self) {
        let _ = self.raw.ack_interrupt();
    }

    /// Whether a received frame is waiting.
    pub fn has_frame(&self) -> bool {
        self.raw.poll_receive().is_some()
    }

    fn post(&mut self, i: usize) -> Result<(), NetError> {
        // SAFETY: receive buffer `i` is not in the device's hands (never
        // posted, or completed and no longer lent to smoltcp), and is
        // touched again only after its completion (see the module note).
        let token = unsafe { self.raw.receive_begin(&mut self.rx[i]) }.map_err(NetError::Driver)?;
        match self.rx_of.get_mut(usize::from(token)) {
            Some(slot) => *slot = i as u8,
            None => return Err(NetError::Driver(virtio_drivers::Error::WrongToken)),
        }
        Ok(())
    }

    fn repost(&mut self) {
        if let Some(i) = self.repost.take() {
            if let Err(e) = self.post(i) {
                log::error!("virtio-net: cannot post receive buffer {i} again: {e}");
            }
        }
    }
}

impl Tx {
    /// Takes back the buffers the device has sent.
    fn reclaim(&mut self, raw: &mut Raw) {
        while let Some(token) = raw.poll_transmit() {
            let i = usize::from(self.of[usize::from(token) % QUEUE]);
            let len = self.busy[i].take().unwrap_or(0);
            // SAFETY: buffer `i` with the length submitted under this
            // token (the driver checks the token's descriptors).
            if let Err(e) = unsafe { raw.transmit_complete(token, &self.bufs[i][..len]) } {
                log::error!("virtio-net: transmit completion {token}: {e}");
                break;
            }
        }
    }

    fn free(&self) -> Option<usize> {
        self.busy.iter().position(Option::is_none)
    }
}

/// A received frame, lent in place.
pub struct RxToken<'a>(&'a [u8]);

/// Room for one frame to send.
pub struct TxToken<'a> {
    raw: &'a mut Raw,
    tx: &'a mut Tx,
    i: usize,
    sent: &'a mut u64,
}

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.0)
    }
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let buf = &mut self.tx.bufs[self.i];
        let hdr = self.raw.fill_buffer_header(buf).unwrap_or(0);
        let len = len.min(BUF - hdr);
        let r = f(&mut buf[hdr..hdr + len]);
        let total = hdr + len;
        // SAFETY: buffer `i` was free (not in the device's hands) and is
        // not touched again until its completion is reclaimed.
        match unsafe { self.raw.transmit_begin(&self.tx.bufs[self.i][..total]) } {
            Ok(token) => {
                self.tx.busy[self.i] = Some(total);
                self.tx.of[usize::from(token) % QUEUE] = self.i as u8;
                *self.sent += 1;
            }
            // Dropped, as a full NIC would: TCP sends it again.
            Err(e) => log::warn!("virtio-net: frame of {len} bytes not sent: {e}"),
        }
        r
    }
}

impl Device for VirtioNet {
    type RxToken<'a> = RxToken<'a>;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _now: Instant) -> Option<(RxToken<'_>, TxToken<'_>)> {
        self.repost();
        self.tx.reclaim(&mut self.raw);
        // smoltcp may answer at once: a transmit buffer first.
        let ti = self.tx.free()?;
        let token = self.raw.poll_receive()?;
        let i = usize::from(self.rx_of[usize::from(token) % QUEUE]);
        // SAFETY: buffer `i` was posted under this token; the device is
        // done with it.
        let got = unsafe { self.raw.receive_complete(token, &mut self.rx[i]) };
        self.repost = Some(i);
        let (hdr, len) = match got {
            Ok(x) => x,
            Err(e) => {
                log::warn!("virtio-net: bad receive completion: {e}");
                return None;
            }
        };
        self.rx_frames += 1;
        let frame = self.rx[i].get(hdr..hdr + len)?;
        Some((
            RxToken(frame),
            TxToken {
                raw: &mut self.raw,
                tx: &mut self.tx,
                i: ti,
                sent: &mut self.tx_frames,
            },
        ))
    }

    fn transmit(&mut self, _now: Instant) -> Option<TxToken<'_>> {
        self.repost();
        self.tx.reclaim(&mut self.raw);
        let i = self.tx.free()?;
        Some(TxToken {
            raw: &mut self.raw,
            tx: &mut self.tx,
            i,
            sent: &mut self.tx_frames,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = MTU;
        caps.max_burst_size = Some(QUEUE);
        caps
    }
}
