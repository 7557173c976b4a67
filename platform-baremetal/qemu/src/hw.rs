//! The machine: QEMU's riscv64 `virt` board in supervisor mode under
//! OpenSBI, at fixed addresses (QEMU `hw/riscv/virt.c`).
//!
//! - boot: `_start` sets up the stack, zeroes `.bss`, enables the FPU,
//!   installs a trap vector (any trap is fatal: this image runs with
//!   interrupts masked and only uses them to wake `wfi`), and calls
//!   `main(hart, dtb)`;
//! - [`uart_write`]: the 16550 UART at `0x1000_0000` (QEMU's `-nographic`
//!   console);
//! - [`ticks`]: the `time` CSR (a constant-rate counter since reset,
//!   `timebase-frequency` ticks a second: 10 MHz on `virt`);
//! - [`Wakeup`]: sleeping in `wfi` until the virtio device's interrupt (the
//!   PLIC at `0x0c00_0000`, supervisor context of hart 0) or the SBI
//!   timer;
//! - [`exit`]: QEMU's `sifive_test` device at `0x10_0000` ends the
//!   emulator with a status.
//!
//! # Safety
//!
//! Every access here is a volatile access to a device register at the
//! address the board defines, or a CSR/`ecall`/`wfi` instruction; this
//! image runs alone on one hart with physical addressing (`satp` = 0).
#![allow(unsafe_code)]

use core::arch::{asm, global_asm};
use core::ptr::{read_volatile, write_volatile};

global_asm!(
    r#"
    .section .text.entry, "ax"
    .globl _start
_start:
    csrw sie, zero
    la sp, __stack_top
    mv s0, a0
    mv s1, a1
    la t0, __bss_start
    la t1, __bss_end
1:
    bgeu t0, t1, 2f
    sd zero, 0(t0)
    addi t0, t0, 8
    j 1b
2:
    li t0, 0x2000
    csrs sstatus, t0
    la t0, trap_entry
    csrw stvec, t0
    mv a0, s0
    mv a1, s1
    call start_rust
3:
    wfi
    j 3b

    .balign 4
trap_entry:
    la sp, __stack_top
    csrr a0, scause
    csrr a1, sepc
    csrr a2, stval
    call trap
4:
    wfi
    j 4b
"#
);

/// The Rust entry point `_start` calls.
#[no_mangle]
extern "C" fn start_rust(hart: usize, dtb: usize) -> ! {
    crate::main(hart, dtb)
}

/// The only trap handler: a trap is a bug (interrupts are masked), so it
/// is reported and the emulator stopped with status 3.
#[no_mangle]
extern "C" fn trap(cause: usize, pc: usize, value: usize) -> ! {
    crate::console::print_fmt(format_args!(
        "\nbtl-qemu-node: fatal trap: scause={cause:#x} sepc={pc:#x} stval={value:#x}\n"
    ));
    exit(3)
}

const UART: usize = 0x1000_0000;
const UART_LSR: usize = UART + 5;
const LSR_THRE: u8 = 1 << 5;

/// Writes `bytes` to the UART (busy-waiting for room in its holding
/// register).
pub fn uart_write(bytes: &[u8]) {
    for &b in bytes {
        // SAFETY: the 16550's line status and transmit holding registers
        // on `virt` (see the module's safety note).
        unsafe {
            while read_volatile(UART_LSR as *const u8) & LSR_THRE == 0 {}
            write_volatile(UART as *mut u8, b);
        }
    }
}

/// The `time` CSR: ticks since the machine's reset.
pub fn ticks() -> u64 {
    let t: u64;
    // SAFETY: reading the `time` CSR has no side effect (OpenSBI enables
    // it for supervisor mode).
    unsafe { asm!("rdtime {0}", out(reg) t, options(nomem, nostack)) };
    t
}

/// One SBI call (`ecall` to OpenSBI): extension `eid`, function `fid`.
fn sbi(eid: usize, fid: usize, arg0: usize, arg1: usize, arg2: usize) -> isize {
    let err: isize;
    // SAFETY: an SBI call per the SBI specification; OpenSBI touches none
    // of our memory for the calls made here (timer, reset).
    unsafe {
        asm!("ecall",
            inlateout("a0") arg0 => err, inlateout("a1") arg1 => _,
            in("a2") arg2, in("a6") fid, in("a7") eid,
            options(nostack));
    }
    err
}

const SBI_TIME: usize = 0x5449_4D45;
const SBI_SRST: usize = 0x5352_5354;
const SIE_STIE: usize = 1 << 5;
const SIE_SEIE: usize = 1 << 9;
const PLIC: usize = 0x0c00_0000;
/// Hart 0's supervisor context.
const PLIC_CONTEXT: usize = 1;

/// Waking `wfi` on the network device's interrupt or a deadline.
#[derive(Debug)]
pub struct Wakeup(());

impl Wakeup {
    /// Routes interrupt `irq` (the virtio-mmio slot's, 1..=8 on `virt`)
    /// to hart 0's supervisor context, and lets it and the timer wake
    /// `wfi` (they never trap: `sstatus.SIE` stays clear).
    pub fn new(irq: u32) -> Wakeup {
        let irq_us = irq as usize;
        // SAFETY: PLIC registers of `virt` (priority of the source,
        // enable bits and threshold of our context), and `sie`.
        unsafe {
            write_volatile((PLIC + 4 * irq_us) as *mut u32, 1);
            let enable = (PLIC + 0x2000 + 0x80 * PLIC_CONTEXT + 4 * (irq_us / 32)) as *mut u32;
            write_volatile(enable, read_volatile(enable) | 1 << (irq % 32));
            write_volatile((PLIC + 0x20_0000 + 0x1000 * PLIC_CONTEXT) as *mut u32, 0);
            asm!("csrs sie, {0}", in(reg) SIE_STIE | SIE_SEIE, options(nomem, nostack));
        }
        Wakeup(())
    }

    /// Clears the PLIC's pending interrupt (after the device acknowledged
    /// it), so that the next `wfi` waits for a new one.
    pub fn clear(&self) {
        let claim = (PLIC + 0x20_0004 + 0x1000 * PLIC_CONTEXT) as *mut u32;
        // SAFETY: the claim/complete register of our PLIC context.
        unsafe {
            loop {
                let id = read_volatile(claim);
                if id == 0 {
                    break;
                }
                write_volatile(claim, id);
            }
        }
    }

    /// Sleeps until an interrupt is pending or `deadline` (in [`ticks`])
    /// passes.
    pub fn sleep_until(&self, deadline: u64) {
        // Deadlines in the past still arm the timer: it fires at once.
        sbi(SBI_TIME, 0, deadline as usize, 0, 0);
        // SAFETY: `wfi` only waits; it returns at once if an enabled
        // interrupt is pending.
        unsafe { asm!("wfi", options(nomem, nostack)) };
        // Disarm (clears the timer's pending bit).
        sbi(SBI_TIME, 0, usize::MAX, 0, 0);
    }
}

const TEST_DEVICE: usize = 0x10_0000;
const FINISHER_FAIL: u32 = 0x3333;
const FINISHER_PASS: u32 = 0x5555;

/// Ends the emulator: status 0 on success, else `status` (1..=0xffff).
pub fn exit(status: u16) -> ! {
    let word = if status == 0 {
        FINISHER_PASS
    } else {
        (u32::from(status) << 16) | FINISHER_FAIL
    };
    // SAFETY: the `sifive_test` finisher register of `virt`.
    unsafe { write_volatile(TEST_DEVICE as *mut u32, word) };
    // Should the finisher be out of reach: SBI system reset (shutdown,
    // with "system failure" as the reason for a non-zero status).
    sbi(SBI_SRST, 0, 0, usize::from(status != 0), 0);
    loop {
        // SAFETY: waiting forever, interrupts masked.
        unsafe { asm!("wfi", options(nomem, nostack)) };
    }
}

/// The device tree OpenSBI passed (`a1` at entry), as bytes: its header's
/// `totalsize` bounds the slice (at most 1 MiB, else `None`).
pub fn device_tree(addr: usize) -> Option<&'static [u8]> {
    if addr == 0 || addr % 8 != 0 {
        return None;
    }
    // SAFETY: OpenSBI hands over a flattened device tree at `addr` in RAM
    // that nothing writes to; the first 8 bytes are its magic and size.
    let head = unsafe { core::slice::from_raw_parts(addr as *const u8, 8) };
    if head[..4] != [0xd0, 0x0d, 0xfe, 0xed] {
        return None;
    }
    let size = u32::from_be_bytes([head[4], head[5], head[6], head[7]]) as usize;
    if !(8..=1 << 20).contains(&size) {
        return None;
    }
    // SAFETY: as above, `size` bytes as the header says (bounded).
    Some(unsafe { core::slice::from_raw_parts(addr as *const u8, size) })
}
