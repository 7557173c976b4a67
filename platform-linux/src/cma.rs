//! Single copy between processes: Cross Memory Attach.
//!
//! rustix has no `process_vm_readv` / `process_vm_writev`, so this module
//! wraps the two `libc` calls, one thin safe wrapper each, and builds
//! [`read_remote`] / [`write_remote`] on them: empty buffers are a no-op,
//! transfers are split into iovecs of at most [`MAX_IOV_LEN`] bytes, partial
//! transfers continue where the kernel stopped, `EINTR` is retried, and every
//! failure is a typed [`CmaError`].
//!
//! The kernel lets process A access process B's memory only if A may
//! `ptrace` B (`PTRACE_MODE_ATTACH_REALCREDS`): same uid and B dumpable, or
//! `CAP_SYS_PTRACE`; and, under the Yama LSM, `ptrace_scope` permits it
//! (scope 1 requires B to have named A, or anyone, with `PR_SET_PTRACER`:
//! see [`allow_ptrace_from_any`]). Containers often forbid it with seccomp.
//! When the kernel refuses, the BTL falls back to copies through shared
//! memory; [`deny_cma_for_testing`] makes the kernel refuse for real, so the
//! fallback can be tested.
//!
//! The kernel checks the remote range only against the peer's mappings: the
//! caller checks remote addresses against the regions the peer registered.
//!
//! **Alignment.** The kernel's copy runs at 2.9 GB/s instead of 13 on this
//! machine (Zen 4, Linux 6.18: `rep movsb` in `copy_to_user`, the weakness
//! glibc's `memcpy` has too) when the destination lies 1–15 bytes after the
//! source modulo a page. Where the caller chose neither address (a get or
//! a put between two user buffers), a transfer of at least [`BOUNCE_MIN`]
//! bytes at such a gap goes through a bounce buffer as aligned as the
//! remote side modulo 64: the kernel then copies at full speed and
//! [`btl_core::shm::copy_bytes`] copies the rest in user space (measured,
//! 4 MiB at a gap of 8: 7.0–7.6 GB/s against 2.9 direct).
//!
//! # Safety
//!
//! The `unsafe` code is the two system calls and the bounce buffer's
//! copies (two distinct slices, so never overlapping). The calls' contract: the local
//! iovec describes memory valid for writes (`readv`) or reads (`writev`) for
//! its whole length during the call — it is built from a Rust slice borrowed
//! for the call — and the remote iovec is only an address range in another
//! address space, which the kernel validates (an invalid range is `EFAULT`,
//! never undefined behaviour in this process).
//!
//! [`read_remote`] and [`write_remote`] themselves are `unsafe fn`: the
//! kernel copies behind the compiler's back, and with *our own* pid (or a
//! process sharing our memory) the "remote" range is memory of ours that a
//! Rust reference may be using — a peer that could make us name our own pid
//! and an address of its choosing could make us copy (or overwrite) any of
//! our memory. Their contract: the pid is another process, or the range is
//! memory nothing else uses during the call. The shared-memory transport
//! calls them only with pids that start-up identified as other processes
//! (the wire-up's pid, cross-checked with the control record and the
//! kernel; our own refused) and with local buffers of its own (a receive
//! buffer, or our registered region lent for the operation).
#![allow(unsafe_code)]

use std::io;

use log::debug;
use rustix::io::Errno;

/// Largest iovec handed to one system call (1 GiB). The kernel caps one
/// transfer at a little under 2 GiB (`MAX_RW_COUNT`); larger requests are
/// split.
pub const MAX_IOV_LEN: usize = 1 << 30;

/// Why a cross-memory-attach transfer failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmaError {
    /// `EPERM` / `EACCES`: the kernel refused access to the peer (ptrace
    /// access rules: Yama `ptrace_scope`, a non-dumpable peer, a container's
    /// seccomp policy, no `CAP_SYS_PTRACE`).
    #[error(
        "the kernel refused cross-memory attach to pid {pid} ({}): ptrace access \
         rules forbid it — check /proc/sys/kernel/yama/ptrace_scope (1 needs \
         PR_SET_PTRACER from the peer, 2 needs CAP_SYS_PTRACE, 3 forbids it), a \
         container's seccomp profile or missing CAP_SYS_PTRACE, or a non-dumpable peer",
        io::Error::from_raw_os_error(*.errno)
    )]
    Refused {
        /// The peer.
        pid: u32,
        /// The errno (`EPERM` or `EACCES`).
        errno: i32,
    },
    /// `ESRCH`: no process with this pid (the peer exited).
    #[error("cross-memory attach: process {pid} does not exist (exited?)")]
    PeerGone {
        /// The peer.
        pid: u32,
    },
    /// `EFAULT`, or the kernel transferred nothing: the remote range is not
    /// mapped in the peer (or not accessible as asked).
    #[error(
        "cross-memory attach: {len} bytes at {addr:#x} are not mapped (or not \
         accessible) in process {pid}"
    )]
    BadAddress {
        /// The peer.
        pid: u32,
        /// Start of the part of the remote range that was not transferred.
        addr: usize,
        /// Length of that part.
        len: usize,
    },
    /// `ENOSYS`: the kernel has no cross memory attach (or a seccomp filter
    /// pretends so).
    #[error(
        "cross-memory attach is not supported: process_vm_readv/process_vm_writev \
         return ENOSYS (old kernel, CONFIG_CROSS_MEMORY_ATTACH off, or seccomp)"
    )]
    Unsupported,
    /// Any other errno.
    #[error(
        "cross-memory attach with process {pid} failed: {}",
        io::Error::from_raw_os_error(*.errno)
    )]
    Other {
        /// The peer.
        pid: u32,
        /// The errno.
        errno: i32,
    },
}

impl CmaError {
    fn from_errno(pid: u32, addr: usize, len: usize, errno: i32) -> Self {
        match errno {
            libc::EPERM | libc::EACCES => Self::Refused { pid, errno },
            libc::ESRCH => Self::PeerGone { pid },
            libc::EFAULT => Self::BadAddress { pid, addr, len },
            libc::ENOSYS => Self::Unsupported,
            _ => Self::Other { pid, errno },
        }
    }
}

fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The iovec of `len` bytes at `remote_addr` in another process: only an
/// address range there, which the kernel validates (EFAULT); never
/// dereferenced here.
fn remote_iovec(remote_addr: usize, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: remote_addr as *mut libc::c_void,
        iov_len: len,
    }
}

/// `readv_once(pid, local, remote_addr)` — one `process_vm_readv` call with
/// one iovec on each side: copies up to `local.len()` bytes from
/// `remote_addr` in process `pid` into `local`. Returns the number of bytes
/// copied (possibly fewer than asked), or the errno.
///
/// # References
///  - [process_vm_readv(2)](https://man7.org/linux/man-pages/man2/process_vm_readv.2.html)
fn readv_once(pid: libc::pid_t, local: &mut [u8], remote_addr: usize) -> Result<usize, i32> {
    let local_iov = libc::iovec {
        iov_base: local.as_mut_ptr().cast(),
        iov_len: local.len(),
    };
    let remote_iov = remote_iovec(remote_addr, local.len());
    // SAFETY: `local_iov` covers exactly `local`, exclusively borrowed and
    // valid for writes for the whole call; the remote iovec is an address in
    // process `pid`, validated by the kernel (EFAULT), never dereferenced
    // here. Both iovec arrays have length 1 and live across the call.
    let n = unsafe { libc::process_vm_readv(pid, &local_iov, 1, &remote_iov, 1, 0) };
    usize::try_from(n).map_err(|_| last_errno())
}

/// Smallest transfer that goes through the bounce buffer at a slow gap
/// (see the module documentation): below it, the system call dominates.
pub const BOUNCE_MIN: usize = 8 << 10;
/// The bounce buffer's size (the most moved per system call through it).
const BOUNCE: usize = 256 << 10;

std::thread_local! {
    /// This thread's bounce buffer, allocated on its first use
    /// ([`BOUNCE`] plus 64 bytes, to align it with any remote address).
    static BOUNCE_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether the kernel's copy from `src` to `dst` meets the slow gap: the
/// destination 1–15 bytes after the source modulo a page.
fn slow_gap(dst: usize, src: usize) -> bool {
    (1..16).contains(&btl_core::shm::page_gap(dst, src))
}

/// Alignment [`aligned_offset`] keeps.
pub const ALIGN: usize = 64;

/// The offset into a buffer at `base` whose address is as aligned modulo
/// [`ALIGN`] as `addr`: a copy between the two then avoids the slow gaps.
pub fn aligned_offset(base: usize, addr: usize) -> usize {
    addr.wrapping_sub(base) % ALIGN
}

/// Copies `src` into `dst` (equal lengths) with [`btl_core::shm::copy_bytes`],
/// which keeps glibc's `memcpy` off its own slow gaps.
fn copy_slices(dst: &mut [u8], src: &[u8]) {
    let len = dst.len().min(src.len());
    // SAFETY: `dst` is borrowed exclusively and `src` shared, so the two
    // ranges do not overlap; both are valid for `len` bytes.
    unsafe { btl_core::shm::copy_bytes(src.as_ptr(), dst.as_mut_ptr(), len) }
}

/// Runs `f` on a part of this thread's bounce buffer: the slice starts as
/// aligned modulo 64 as `remote_addr` and is `len` bytes (at most
/// [`BOUNCE`]) long.
fn with_bounce<T>(remote_addr: usize, len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    BOUNCE_BUF.with_borrow_mut(|b| {
        if b.len() < BOUNCE + ALIGN {
            b.resize(BOUNCE + ALIGN, 0);
        }
        let k = aligned_offset(b.as_ptr() as usize, remote_addr);
        f(&mut b[k..k + len.min(BOUNCE)])
    })
}

/// [`readv_once`], through the bounce buffer at a slow gap.
fn readv_chunk(pid: libc::pid_t, local: &mut [u8], remote_addr: usize) -> Result<usize, i32> {
    if local.len() < BOUNCE_MIN || !slow_gap(local.as_ptr() as usize, remote_addr) {
        return readv_once(pid, local, remote_addr);
    }
    with_bounce(remote_addr, local.len(), |b| {
        let n = readv_once(pid, b, remote_addr)?;
        copy_slices(&mut local[..n], &b[..n]);
        Ok(n)
    })
}

/// [`writev_once`], through the bounce buffer at a slow gap.
fn writev_chunk(pid: libc::pid_t, local: &[u8], remote_addr: usize) -> Result<usize, i32> {
    if local.len() < BOUNCE_MIN || !slow_gap(remote_addr, local.as_ptr() as usize) {
        return writev_once(pid, local, remote_addr);
    }
    with_bounce(remote_addr, local.len(), |b| {
        let n = b.len();
        copy_slices(b, &local[..n]);
        writev_once(pid, b, remote_addr)
    })
}

/// `writev_once(pid, local, remote_addr)` — one `process_vm_writev` call with
/// one iovec on each side: copies up to `local.len()` bytes from `local` to
/// `remote_addr` in process `pid`. Returns the number of bytes copied
/// (possibly fewer than asked), or the errno.
///
/// # References
///  - [process_vm_writev(2)](https://man7.org/linux/man-pages/man2/process_vm_writev.2.html)
fn writev_once(pid: libc::pid_t, local: &[u8], remote_addr: usize) -> Result<usize, i32> {
    let local_iov = libc::iovec {
        // The kernel only reads through the local iovec of a writev.
        iov_base: local.as_ptr().cast_mut().cast(),
        iov_len: local.len(),
    };
    let remote_iov = remote_iovec(remote_addr, local.len());
    // SAFETY: `local_iov` covers exactly `local`, borrowed and valid for
    // reads for the whole call (process_vm_writev only reads local memory);
    // the remote iovec is an address in process `pid`, validated by the
    // kernel (EFAULT). Both iovec arrays have length 1 and live across the
    // call.
    let n = unsafe { libc::process_vm_writev(pid, &local_iov, 1, &remote_iov, 1, 0) };
    usize::try_from(n).map_err(|_| last_errno())
}

/// Drives a transfer of `len` bytes at `remote_addr`: `op(done, chunk)`
/// moves bytes `done..done + chunk` (chunk at most [`MAX_IOV_LEN`]) and
/// returns how many it moved, or an errno.
fn transfer(
    pid: u32,
    remote_addr: usize,
    len: usize,
    mut op: impl FnMut(usize, usize) -> Result<usize, i32>,
) -> Result<(), CmaError> {
    if len == 0 {
        return Ok(());
    }
    if remote_addr.checked_add(len).is_none() {
        return Err(CmaError::BadAddress {
            pid,
            addr: remote_addr,
            len,
        });
    }
    let mut done = 0;
    while done < len {
        let chunk = (len - done).min(MAX_IOV_LEN);
        match op(done, chunk) {
            Ok(0) => {
                return Err(CmaError::BadAddress {
                    pid,
                    addr: remote_addr + done,
                    len: len - done,
                })
            }
            Ok(n) => done += n.min(chunk),
            Err(libc::EINTR) => {}
            Err(errno) => {
                return Err(CmaError::from_errno(
                    pid,
                    remote_addr + done,
                    len - done,
                    errno,
                ))
            }
        }
    }
    Ok(())
}

/// `read_remote(pid, remote_addr, dst)` — copies `dst.len()` bytes at
/// `remote_addr` in process `pid` into `dst` (`process_vm_readv`).
///
/// Loops until everything is copied: partial transfers continue where they
/// stopped (a transfer of 0 bytes is [`CmaError::BadAddress`]), `EINTR` is
/// retried, and buffers are split into iovecs of at most [`MAX_IOV_LEN`].
/// An empty `dst` is `Ok` without a system call. On error, `dst` may be
/// partly written.
///
/// The kernel only checks that the range is mapped in the peer: the peer
/// checks it against the regions it registered.
///
/// # Safety
///
/// `pid` must be another process, not sharing our memory — or else
/// `remote_addr..remote_addr + dst.len()` must be memory of ours that does
/// not overlap `dst` and that nothing writes during the call (the kernel
/// reads it outside Rust's knowledge). A process's own pid together with an
/// address a peer chose never satisfies this.
///
/// # References
///  - [process_vm_readv(2)](https://man7.org/linux/man-pages/man2/process_vm_readv.2.html)
pub unsafe fn read_remote(pid: u32, remote_addr: usize, dst: &mut [u8]) -> Result<(), CmaError> {
    if dst.is_empty() {
        return Ok(());
    }
    let Ok(raw) = libc::pid_t::try_from(pid) else {
        return Err(CmaError::PeerGone { pid });
    };
    transfer(pid, remote_addr, dst.len(), |done, chunk| {
        readv_chunk(raw, &mut dst[done..done + chunk], remote_addr + done)
    })
}

/// `write_remote(pid, remote_addr, src)` — copies `src` to `remote_addr` in
/// process `pid` (`process_vm_writev`).
///
/// Same looping, splitting and error rules as [`read_remote`]; on error the
/// remote range may be partly written.
///
/// # Safety
///
/// `pid` must be another process, not sharing our memory, that expects
/// this write into its range — or else `remote_addr..remote_addr +
/// src.len()` must be memory of ours, valid for writes, that does not
/// overlap `src`, that no Rust reference points into and that nothing else
/// reads or writes during the call (the kernel writes it outside Rust's
/// knowledge).
///
/// # References
///  - [process_vm_writev(2)](https://man7.org/linux/man-pages/man2/process_vm_writev.2.html)
pub unsafe fn write_remote(pid: u32, remote_addr: usize, src: &[u8]) -> Result<(), CmaError> {
    if src.is_empty() {
        return Ok(());
    }
    let Ok(raw) = libc::pid_t::try_from(pid) else {
        return Err(CmaError::PeerGone { pid });
    };
    transfer(pid, remote_addr, src.len(), |done, chunk| {
        writev_chunk(raw, &src[done..done + chunk], remote_addr + done)
    })
}

/// `allow_ptrace_from_any()` — `prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)`:
/// under Yama `ptrace_scope=1`, lets any process of our uid (our sibling
/// ranks) attach to us, hence read our memory with CMA, as Open MPI's vader
/// does. Without Yama the call fails with `EINVAL`, which is fine: the
/// restriction does not exist. Never fails loudly (logs with `debug!`).
///
/// # References
///  - [prctl(2)](https://man7.org/linux/man-pages/man2/prctl.2.html), `PR_SET_PTRACER`
///  - [Yama](https://www.kernel.org/doc/html/latest/admin-guide/LSM/Yama.html)
pub fn allow_ptrace_from_any() {
    match rustix::process::set_ptracer(rustix::process::PTracer::Any) {
        Ok(()) => debug!("PR_SET_PTRACER_ANY set: processes of our uid may read our memory"),
        Err(Errno::INVAL) => debug!("PR_SET_PTRACER not available (no Yama LSM): not needed"),
        Err(e) => debug!("PR_SET_PTRACER_ANY failed ({e}); peers may be refused CMA"),
    }
}

/// `drop_ptrace_capability()` — removes `CAP_SYS_PTRACE` from the calling
/// thread's effective, permitted and inheritable capability sets (`capget`
/// then `capset`; the kernel then drops it from the ambient set as well).
///
/// A process holding `CAP_SYS_PTRACE` (root, usually) bypasses the
/// "dumpable" and same-uid ptrace checks when it *reads* another process,
/// and the commoncap rule refuses a reader whose permitted set lacks a
/// capability the target holds. So the refusal test drops it on both sides.
///
/// Capabilities are per thread in Linux: this affects the calling thread
/// and the threads and processes it creates afterwards, not threads that
/// already exist. The kernel checks the reader's *calling thread* and the
/// target *task named by the pid* (a peer may name any of our thread ids).
/// Dropping is irreversible for this thread, but a root process that
/// `execve`s regains its capabilities (the bounding set is not touched).
/// Without the capability this is a no-op.
///
/// # References
///  - [capabilities(7)](https://man7.org/linux/man-pages/man7/capabilities.7.html)
///  - [capset(2)](https://man7.org/linux/man-pages/man2/capset.2.html)
pub fn drop_ptrace_capability() -> io::Result<()> {
    use rustix::thread::{capabilities, set_capabilities, CapabilitySet};
    let cap = CapabilitySet::SYS_PTRACE;
    let mut sets = capabilities(None)?;
    if !(sets.effective | sets.permitted | sets.inheritable).intersects(cap) {
        return Ok(());
    }
    sets.effective.remove(cap);
    sets.permitted.remove(cap);
    sets.inheritable.remove(cap);
    set_capabilities(None, sets)?;
    debug!("dropped CAP_SYS_PTRACE from this thread");
    Ok(())
}

/// `deny_cma_for_testing()` — makes the kernel refuse, for real, CMA from
/// other processes into this one: for tests of the fallback path only.
///
/// It does two things:
/// - `prctl(PR_SET_DUMPABLE, 0)`: the whole process (its memory map)
///   becomes non-dumpable, and the kernel's ptrace access check refuses
///   non-dumpable targets to every caller without `CAP_SYS_PTRACE`, even of
///   the same uid. `execve` resets it.
/// - [`drop_ptrace_capability`] on the calling thread.
///
/// The refusal happens only if the *reader* lacks `CAP_SYS_PTRACE` too (a
/// root reader bypasses the dumpable check): the reading process must call
/// [`drop_ptrace_capability`] on the thread that reads. Readers should name
/// the thread that called this function (its tid) if other threads of this
/// process were created before the call and still hold the capability.
///
/// # References
///  - [prctl(2)](https://man7.org/linux/man-pages/man2/prctl.2.html), `PR_SET_DUMPABLE`
///  - [ptrace(2)](https://man7.org/linux/man-pages/man2/ptrace.2.html), "Ptrace access mode checking"
pub fn deny_cma_for_testing() -> io::Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    drop_ptrace_capability()?;
    debug!("this process is now non-dumpable: other processes are refused CMA into it");
    Ok(())
}

/// `probe_self()` — reads 8 bytes of our own memory through
/// `process_vm_readv`: detects at start a kernel without CMA
/// ([`CmaError::Unsupported`]) or a seccomp filter refusing it
/// ([`CmaError::Refused`]). Reading ourselves is never refused by ptrace
/// rules, so this does not tell whether peers may read us.
pub fn probe_self() -> Result<(), CmaError> {
    let pid = std::process::id();
    let src = std::hint::black_box(0x6274_6c2d_636d_6121_u64.to_ne_bytes());
    let mut dst = [0u8; 8];
    // SAFETY: our own pid, but the remote range is `src`, a local of ours
    // that nothing writes during the call and that does not overlap `dst`.
    unsafe { read_remote(pid, src.as_ptr() as usize, &mut dst) }?;
    if dst != src {
        // A filter faking success without copying: as unusable as a refusal.
        return Err(CmaError::Other {
            pid,
            errno: libc::EIO,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_into_iovecs_of_at_most_1_gib() {
        let len = 2 * MAX_IOV_LEN + 5;
        let mut calls = Vec::new();
        transfer(1, 0x1000, len, |done, chunk| {
            calls.push((done, chunk));
            Ok(chunk)
        })
        .unwrap();
        assert_eq!(
            calls,
            [
                (0, MAX_IOV_LEN),
                (MAX_IOV_LEN, MAX_IOV_LEN),
                (2 * MAX_IOV_LEN, 5)
            ]
        );
    }

    #[test]
    fn continues_partial_transfers_and_retries_eintr() {
        let mut script = vec![Ok(3), Err(libc::EINTR), Ok(4), Ok(3)].into_iter();
        let mut calls = Vec::new();
        transfer(1, 0x1000, 10, |done, chunk| {
            calls.push((done, chunk));
            script.next().unwrap()
        })
        .unwrap();
        assert_eq!(calls, [(0, 10), (3, 7), (3, 7), (7, 3)]);
    }

    #[test]
    fn zero_progress_and_errnos_are_typed() {
        let mut script = vec![Ok(4), Ok(0)].into_iter();
        let err = transfer(7, 0x1000, 10, |_, _| script.next().unwrap()).unwrap_err();
        assert_eq!(
            err,
            CmaError::BadAddress {
                pid: 7,
                addr: 0x1004,
                len: 6
            }
        );
        let cases = [
            (
                libc::EPERM,
                CmaError::Refused {
                    pid: 7,
                    errno: libc::EPERM,
                },
            ),
            (
                libc::EACCES,
                CmaError::Refused {
                    pid: 7,
                    errno: libc::EACCES,
                },
            ),
            (libc::ESRCH, CmaError::PeerGone { pid: 7 }),
            (libc::ENOSYS, CmaError::Unsupported),
            (
                libc::ENOMEM,
                CmaError::Other {
                    pid: 7,
                    errno: libc::ENOMEM,
                },
            ),
        ];
        for (errno, want) in cases {
            assert_eq!(transfer(7, 0x1000, 10, |_, _| Err(errno)), Err(want));
        }
        assert!(transfer(7, 0x1000, 0, |_, _| unreachable!()).is_ok());
        assert!(matches!(
            transfer(7, usize::MAX - 3, 10, |_, _| unreachable!()),
            Err(CmaError::BadAddress { .. })
        ));
        let refused = CmaError::Refused {
            pid: 7,
            errno: libc::EPERM,
        };
        assert!(refused.to_string().contains("ptrace_scope"));
    }

    #[test]
    fn probe_self_works() {
        probe_self().unwrap();
    }

    #[test]
    fn slow_gaps_go_through_the_bounce_buffer_and_arrive_whole() {
        assert!(slow_gap(0x1008, 0x1000) && slow_gap(0x2000, 0x1ff1));
        assert!(!slow_gap(0x1000, 0x1000) && !slow_gap(0x1010, 0x1000));
        assert!(!slow_gap(0x1000, 0x1008));
        let pid = std::process::id();
        let src: Vec<u8> = (0..BOUNCE * 2 + 4096 + 64)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let mut dst = vec![0u8; src.len()];
        for gap in [0usize, 1, 8, 15, 16, 40] {
            for len in [BOUNCE_MIN - 1, BOUNCE_MIN, 300_000, BOUNCE * 2 + 5] {
                // `from` and `to` with `to - from` = `gap` modulo a page.
                let from = 64 - (src.as_ptr() as usize % 64);
                let base = dst.as_ptr() as usize;
                let to = (src.as_ptr() as usize + from + gap).wrapping_sub(base) % 4096;
                assert!(to + len <= dst.len() && from + len <= src.len());
                dst.fill(0);
                let remote = src[from..].as_ptr() as usize;
                // SAFETY: our own pid, but the remote range is part of
                // `src`, which nothing writes during the call and which
                // does not overlap `dst`.
                unsafe { read_remote(pid, remote, &mut dst[to..to + len]) }.unwrap();
                assert!(
                    dst[to..to + len] == src[from..from + len],
                    "read, gap {gap}, {len} B"
                );
                assert!(dst[..to].iter().all(|&b| b == 0));
                assert!(dst[to + len..].iter().all(|&b| b == 0));
                dst.fill(0);
                let target = dst[to..].as_mut_ptr() as usize;
                // SAFETY: our own pid, but the remote range is part of
                // `dst`, valid for writes, no reference into it during the
                // call (only raw addresses), not overlapping `src`.
                unsafe { write_remote(pid, target, &src[from..from + len]) }.unwrap();
                assert!(
                    dst[to..to + len] == src[from..from + len],
                    "write, gap {gap}, {len} B"
                );
                assert!(dst[..to].iter().all(|&b| b == 0));
            }
        }
    }
}
