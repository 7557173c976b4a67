//! Shared-memory segments: sealed, anonymous memory files.
//!
//! A segment is a `memfd` (`memfd_create`, named `btl-<uid>-<job>-<node>`
//! for diagnostics only: it has no path), created by one process
//! ([`Segment::create`]) and handed to its peers as a file descriptor
//! ([`Offer`] / [`fetch`]). Why not a file in `/dev/shm`, as before: any
//! process of the user could `ftruncate` such a file while it is mapped,
//! and every rank touching a page past the new end would die of `SIGBUS`.
//! A memfd is sealed with `F_SEAL_SHRINK` (it can never get smaller, so no
//! mapped page can vanish) and `F_SEAL_SEAL` (nobody can add seals, such
//! as `F_SEAL_WRITE`, later). It is deliberately *not* sealed against
//! growing: a segment that grows as it is used (fragment pools sized by
//! use, fast boxes per peer) extends the file and reserves the new range
//! with `fallocate`, and growing never hurts an existing mapping.
//!
//! The guarantees of the old files, kept:
//!
//! - **never SIGBUS, and no surprise out-of-memory**: a page is reserved
//!   with `fallocate` before it is first used — the control area when the
//!   segment is created ([`Segment::create_lazy`]), each rank's rings and
//!   box directory before it initialises them ([`Segment::reserve`]),
//!   fragments and fast boxes when the engine first needs them
//!   ([`Reserver`], btl-core's `Reserve` seam) — and the memory available
//!   to us (`MemAvailable`, and the cgroup v2 limit when there is one) is
//!   checked first: what the job needs at least (every rank's first
//!   pieces) when the segment is created ([`SegmentError::NoSpace`] says
//!   how much is needed and available), each later piece before it is
//!   reserved (refused: the engine does without it). So a part costs what
//!   its rank used, not what it might use. A memfd lives in the kernel's
//!   internal tmpfs, so the size of `/dev/shm` (a container's 64 MiB, for
//!   instance) does not limit it; the memory cgroup does;
//! - **nothing left behind after `kill -9`**: a memfd has no name in any
//!   file system; the kernel frees it when the last process holding it (an
//!   fd or a mapping) is gone. Nothing is ever stale, so nothing needs
//!   cleaning, not even after a crash during start-up;
//! - **only our user**: the rendezvous checks the peer's credentials on
//!   both ends (uid; and the creator's pid, when the wire-up told it).
//!
//! # The rendezvous
//!
//! The creator listens on an abstract Unix socket named after the segment
//! ([`Offer::new`]; abstract: no file, gone with its process) and, while
//! its peers attach, hands the memfd to each process of its uid that
//! connects ([`Offer::serve`], `SCM_RIGHTS`). A peer connects
//! ([`fetch`]), retrying until the creator listens, checks who answers
//! (`SO_PEERCRED`), receives the descriptor and maps it
//! ([`Segment::from_fd`], which checks the seals). Ranks sharing a segment
//! must therefore share a network namespace (abstract sockets live there)
//! and a pid namespace (for liveness and single copy anyway).
//!
//! Liveness helpers live here too: [`process_start_time`],
//! [`process_alive`].
//!
//! # Safety
//!
//! The only `unsafe` code is the hand-over of a live mapping to btl-core:
//! [`Segment::region`] builds a [`Region`] with [`Region::from_raw_parts`],
//! and `Segment` is declared `Send` (not `Sync`: the regions it makes copy
//! bytes, which must stay in one thread). The invariants:
//! - the mapping is created once, is never remapped or resized by this
//!   process, and is unmapped only when the [`Segment`] is dropped, so a
//!   `Region<'_>` borrowed from `&self` never outlives it;
//! - this module never creates Rust references into the mapping; all access
//!   goes through btl-core's [`Region`] (atomics of `ShmSafe` types and byte
//!   copies) or the raw pointer of [`Segment::as_ptr`];
//! - the file's size is set before it is mapped, and the file cannot shrink
//!   (`F_SEAL_SHRINK`, checked by [`Segment::from_fd`] on segments it did not
//!   create), so every access inside the mapping is inside the file (a
//!   page nobody reserved yet — a peer scribbling where btl does not look
//!   — is allocated on first touch, never a SIGBUS: the kernel's internal
//!   tmpfs has no size limit).
#![allow(unsafe_code)]

use std::fmt;
use std::fs;
use std::io;
use std::mem::ManuallyDrop;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use btl_core::shm::Region;
use log::{debug, warn};
use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{FallocateFlags, MemfdFlags, SealFlags};
use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

/// Longest segment name accepted by [`segment_name`], in bytes (the
/// kernel keeps 249 bytes of a memfd's name).
pub const MAX_NAME_LEN: usize = 200;

/// The seals every segment carries: it never shrinks, and nobody adds seals.
pub const SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::SEAL);

const MIB: f64 = 1024.0 * 1024.0;

/// "BTLSEGFD": the rendezvous message, then the segment's length.
const OFFER_MAGIC: [u8; 8] = *b"BTLSEGFD";
const OFFER_LEN: usize = 16;

/// Errors of segment naming, creation, attachment.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SegmentError {
    /// A job or node identifier cannot be part of a segment name.
    #[error(
        "invalid {field} identifier {value:?} for a segment name: {reason} \
         (allowed: 1 or more of A-Z a-z 0-9 . _ -)"
    )]
    InvalidName {
        /// Which identifier (`"job"` or `"node"`).
        field: &'static str,
        /// The rejected value.
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The name would be longer than [`MAX_NAME_LEN`] bytes.
    #[error("segment name would be {len} bytes long, more than the {max} allowed")]
    NameTooLong {
        /// Length of the name that would have been built, in bytes.
        len: usize,
        /// The limit ([`MAX_NAME_LEN`]).
        max: usize,
    },
    /// A segment of zero bytes was requested.
    #[error("shared segment {name} of zero bytes requested")]
    ZeroLength {
        /// The segment's name.
        name: String,
    },
    /// Less memory is available than the segment needs.
    #[error(
        "not enough memory for shared segment {name}: it needs {needed} bytes ({:.1} MiB) \
         but only {available} bytes ({:.1} MiB) are free (MemAvailable, or the memory \
         cgroup's limit); free some memory or shrink the segment (fewer processes or \
         smaller FIFOs/fragments)",
        *.needed as f64 / MIB,
        *.available as f64 / MIB,
    )]
    NoSpace {
        /// The segment's name.
        name: String,
        /// Bytes the segment needs.
        needed: u64,
        /// Bytes available (`MemAvailable`, or the cgroup's limit minus its
        /// use, whichever is less; what `fallocate` found, if it failed).
        available: u64,
    },
    /// Another process already offers a segment of this name (another job
    /// with the same job and node names, on this machine).
    #[error(
        "shared segment {name} is already offered by another process (another job with \
         the same job and node names on this machine)"
    )]
    Exists {
        /// The segment's name.
        name: String,
    },
    /// [`fetch`] gave up waiting for the creator's offer.
    #[error(
        "timed out after {:.1} s waiting for local rank 0 to offer shared segment {name} \
         (did it start, with the same job and node names, in the same network \
         namespace?)",
        .waited.as_secs_f64()
    )]
    Timeout {
        /// The segment's name.
        name: String,
        /// How long it waited.
        waited: Duration,
    },
    /// The descriptor or its offer does not come from this user (or from the
    /// process expected).
    #[error("shared segment {name}: {what}")]
    NotOurs {
        /// The segment's name.
        name: String,
        /// What does not match.
        what: String,
    },
    /// A segment received from a peer is not sealed against shrinking, or
    /// smaller than needed.
    #[error("shared segment {name} is unsafe to map: {what}")]
    Unsafe {
        /// The segment's name.
        name: String,
        /// What is wrong.
        what: String,
    },
    /// A system call failed.
    #[error("{op} of shared segment {name}: {source}")]
    Io {
        /// What was being done (`"memfd_create"`, `"fallocate"`, `"mmap"`, ...).
        op: &'static str,
        /// The segment's name.
        name: String,
        /// The error (with its errno).
        source: io::Error,
    },
}

impl SegmentError {
    fn io(op: &'static str, name: &str, source: impl Into<io::Error>) -> Self {
        Self::Io {
            op,
            name: name.to_owned(),
            source: source.into(),
        }
    }
}

fn check_component(field: &'static str, value: &str) -> Result<(), SegmentError> {
    let reason = if value.is_empty() {
        Some("it is empty")
    } else if value.contains('/') {
        Some("it contains '/'")
    } else if value.contains('\0') {
        Some("it contains a NUL byte")
    } else if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        Some("it contains a character outside A-Z a-z 0-9 . _ -")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(SegmentError::InvalidName {
            field,
            value: value.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// `segment_name(uid, job, node)` — `btl-<uid>-<job>-<node>`, the name of
/// the job's segment on a node (of the memfd, as `/proc/<pid>/fd` shows
/// it, and of its rendezvous socket).
///
/// `job` and `node` come from the environment, so they are checked: each
/// must be non-empty and made only of `A-Z a-z 0-9 . _ -` (which excludes
/// `/`, NUL and spaces), and the whole name must be at most
/// [`MAX_NAME_LEN`] bytes.
pub fn segment_name(uid: u32, job: &str, node: &str) -> Result<String, SegmentError> {
    check_component("job", job)?;
    check_component("node", node)?;
    let name = format!("btl-{uid}-{job}-{node}");
    if name.len() > MAX_NAME_LEN {
        return Err(SegmentError::NameTooLong {
            len: name.len(),
            max: MAX_NAME_LEN,
        });
    }
    Ok(name)
}

/// `fallocate` of `[offset, offset + len)` (retried on EINTR); ENOSPC and
/// ENOMEM are [`SegmentError::NoSpace`].
fn fallocate(fd: &OwnedFd, name: &str, offset: u64, len: u64) -> Result<(), SegmentError> {
    if len == 0 {
        return Ok(());
    }
    loop {
        match rustix::fs::fallocate(fd, FallocateFlags::KEEP_SIZE, offset, len) {
            Ok(()) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(Errno::NOSPC) | Err(Errno::NOMEM) => {
                return Err(SegmentError::NoSpace {
                    name: name.to_owned(),
                    needed: len,
                    available: available_memory().unwrap_or(0),
                })
            }
            Err(e) => return Err(SegmentError::io("fallocate", name, e)),
        }
    }
}

/// [`Segment::reserve`] on a descriptor of a segment of `size` bytes.
fn reserve_range(
    fd: &OwnedFd,
    name: &str,
    size: usize,
    offset: u64,
    len: u64,
) -> Result<(), SegmentError> {
    if offset.checked_add(len).is_none_or(|end| end > size as u64) {
        return Err(SegmentError::io("fallocate", name, Errno::INVAL));
    }
    if let Some(available) = available_memory().filter(|&a| a < len) {
        return Err(SegmentError::NoSpace {
            name: name.to_owned(),
            needed: len,
            available,
        });
    }
    fallocate(fd, name, offset, len)
}

/// Reserves parts of a segment for the shared-memory engine as it first
/// uses them ([`Segment::reserver`]). A refusal is logged once (the engine
/// then keeps its pools as they are and senders keep the rings).
#[derive(Debug)]
pub struct Reserver {
    fd: OwnedFd,
    name: String,
    len: usize,
    refused: bool,
}

impl btl_core::sm::engine::Reserve for Reserver {
    fn reserve(&mut self, offset: u64, len: u64) -> bool {
        match reserve_range(&self.fd, &self.name, self.len, offset, len) {
            Ok(()) => true,
            Err(e) => {
                if !self.refused {
                    self.refused = true;
                    log::warn!(
                        "shared memory: {e}; this rank's fragment pools and fast boxes stay as \
                         they are (messages wait for fragments to come back)"
                    );
                }
                false
            }
        }
    }
}

/// Bytes of memory a new segment may take: `MemAvailable` of
/// `/proc/meminfo`, or, when this process is in a cgroup v2 with a memory
/// limit, that limit minus the cgroup's current use if less. `None` if
/// neither can be read.
pub fn available_memory() -> Option<u64> {
    let meminfo = fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_ascii_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    });
    let cgroup = fs::read_to_string("/proc/self/cgroup").ok().and_then(|c| {
        let path = c.lines().find_map(|l| l.strip_prefix("0::"))?;
        let dir = format!("/sys/fs/cgroup{}", path.trim_end());
        let max: u64 = fs::read_to_string(format!("{dir}/memory.max"))
            .ok()?
            .trim()
            .parse()
            .ok()?; // "max": no limit
        let current: u64 = fs::read_to_string(format!("{dir}/memory.current"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        Some(max.saturating_sub(current))
    });
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A shared, read-write mapping of a segment, and its descriptor.
///
/// Dropping it unmaps the segment and closes the descriptor; the memory is
/// freed when no process holds either any more.
#[derive(Debug)]
pub struct Segment {
    map: MmapRaw,
    base: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
    name: String,
}

// SAFETY: `base` is the start of the mapping owned by `map` (MmapRaw is Send
// and Sync), which moves with the value. Not Sync: `region(&self)` makes
// regions, whose byte copies must stay in one thread (btl_core::shm's
// concurrency model), so `&Segment` must not be shared between threads.
unsafe impl Send for Segment {}

impl Segment {
    /// `Segment::create(name, len)` — creates a segment of `len` bytes and
    /// maps it.
    ///
    /// Checks that `len` bytes of memory are available
    /// ([`available_memory`]), creates the memfd
    /// (`MFD_CLOEXEC | MFD_ALLOW_SEALING`), sets its size (`ftruncate`),
    /// reserves every page with `fallocate` (`ENOSPC`/`ENOMEM` are
    /// [`SegmentError::NoSpace`]), seals it ([`SEALS`]) and maps it shared.
    /// The transport itself uses [`Segment::create_lazy`].
    pub fn create(name: &str, len: usize) -> Result<Segment, SegmentError> {
        Self::create_reserving(name, len, len as u64, len as u64)
    }

    /// `Segment::create_lazy(name, len, upfront, needed)` — creates a
    /// segment of `len` bytes of which only the first `upfront` are
    /// reserved now; the rest is reserved piece by piece as it is first
    /// used ([`Segment::reserve`], [`Reserver`]). `needed` is what the job
    /// needs at least (every rank's first pieces): less memory available
    /// than that is [`SegmentError::NoSpace`] now rather than at a rank's
    /// first reservation.
    pub fn create_lazy(
        name: &str,
        len: usize,
        upfront: u64,
        needed: u64,
    ) -> Result<Segment, SegmentError> {
        Self::create_reserving(name, len, upfront.min(len as u64), needed)
    }

    fn create_reserving(
        name: &str,
        len: usize,
        upfront: u64,
        needed: u64,
    ) -> Result<Segment, SegmentError> {
        if len == 0 {
            return Err(SegmentError::ZeroLength {
                name: name.to_owned(),
            });
        }
        if let Some(available) = available_memory().filter(|&a| a < needed) {
            return Err(SegmentError::NoSpace {
                name: name.to_owned(),
                needed,
                available,
            });
        }
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(|e| SegmentError::io("memfd_create", name, e))?;
        rustix::fs::ftruncate(&fd, len as u64)
            .map_err(|e| SegmentError::io("ftruncate", name, e))?;
        fallocate(&fd, name, 0, upfront)?;
        rustix::fs::fcntl_add_seals(&fd, SEALS)
            .map_err(|e| SegmentError::io("F_ADD_SEALS", name, e))?;
        let segment = Self::map(fd, name, len)?;
        debug!("created shared segment {name} ({len} bytes, sealed against shrinking)");
        Ok(segment)
    }

    /// Reserves memory for the bytes `[offset, offset + len)` of the
    /// segment (whole pages; pages reserved already cost nothing), after
    /// checking that much memory is available: from then on no write there
    /// can fail for want of memory. [`SegmentError::NoSpace`] otherwise.
    pub fn reserve(&self, offset: u64, len: u64) -> Result<(), SegmentError> {
        reserve_range(&self.fd, &self.name, self.len, offset, len)
    }

    /// Bytes of the segment backed by memory now (`st_blocks` of the
    /// memfd: what every process's reservations and writes took), if
    /// `fstat` answers.
    pub fn reserved_bytes(&self) -> Option<u64> {
        let st = rustix::fs::fstat(&self.fd).ok()?;
        u64::try_from(st.st_blocks).ok()?.checked_mul(512)
    }

    /// A handle that reserves parts of this segment for btl-core's engine
    /// ([`btl_core::sm::engine::Reserve`]), holding its own duplicate of
    /// the descriptor.
    pub fn reserver(&self) -> Result<Reserver, SegmentError> {
        let fd = self.fd.try_clone().map_err(|e| {
            SegmentError::io(
                "dup",
                &self.name,
                Errno::from_io_error(&e).unwrap_or(Errno::IO),
            )
        })?;
        Ok(Reserver {
            fd,
            name: self.name.clone(),
            len: self.len,
            refused: false,
        })
    }

    /// `Segment::from_fd(fd, name, min_len)` — maps a segment another
    /// process created and handed over (see [`fetch`]), whole.
    ///
    /// The descriptor must be a regular file of our effective uid, sealed
    /// at least with `F_SEAL_SHRINK` (a file that can shrink could kill us
    /// with `SIGBUS`), of at least `min_len` bytes (and one).
    pub fn from_fd(fd: OwnedFd, name: &str, min_len: usize) -> Result<Segment, SegmentError> {
        let st = rustix::fs::fstat(&fd).map_err(|e| SegmentError::io("fstat", name, e))?;
        let uid = rustix::process::geteuid().as_raw();
        let regular =
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile;
        if !regular || st.st_uid != uid {
            return Err(SegmentError::NotOurs {
                name: name.to_owned(),
                what: format!(
                    "the descriptor received is {} owned by uid {}, not a file of ours (uid {uid})",
                    if regular {
                        "a file"
                    } else {
                        "not a regular file,"
                    },
                    st.st_uid
                ),
            });
        }
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(|e| SegmentError::Unsafe {
            name: name.to_owned(),
            what: format!("its seals cannot be read ({e}): not a sealable memory file"),
        })?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(SegmentError::Unsafe {
                name: name.to_owned(),
                what: format!("it is not sealed against shrinking (seals {seals:?})"),
            });
        }
        let size = u64::try_from(st.st_size).unwrap_or(0);
        let want = min_len.max(1) as u64;
        if size < want {
            return Err(SegmentError::Unsafe {
                name: name.to_owned(),
                what: format!("it has {size} bytes, fewer than the {want} needed"),
            });
        }
        let len = usize::try_from(size).map_err(|_| SegmentError::Unsafe {
            name: name.to_owned(),
            what: "it is larger than the address space".into(),
        })?;
        let segment = Self::map(fd, name, len)?;
        debug!("attached shared segment {name} ({len} bytes)");
        Ok(segment)
    }

    fn map(fd: OwnedFd, name: &str, len: usize) -> Result<Segment, SegmentError> {
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&fd)
            .map_err(|e| SegmentError::io("mmap", name, e))?;
        let base = NonNull::new(map.as_mut_ptr()).ok_or_else(|| {
            SegmentError::io("mmap", name, io::Error::other("mapping at address 0"))
        })?;
        Ok(Segment {
            map,
            base,
            len,
            fd,
            name: name.to_owned(),
        })
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: segments have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segment's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The segment's descriptor (to offer it to peers).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The mapping as a btl-core [`Region`], valid while `self` is borrowed.
    pub fn region(&self) -> Region<'_> {
        // SAFETY: `base..base + len` is our live shared read-write mapping
        // (created in `map`, unmapped only by dropping `self`), every page
        // of it reserved and the file sealed against shrinking, and the
        // returned Region borrows `self`, so it cannot outlive it. `len` was
        // accepted by mmap, so it is at most isize::MAX. This module creates
        // no Rust references into the mapping; every access goes through the
        // Region (ShmSafe atomics and byte copies) or raw pointers. The
        // Region stays in this thread (it is not Send) and `Segment` is not
        // Sync, so no other thread copies bytes through another region of
        // ours.
        unsafe { Region::from_raw_parts(self.base, self.len) }
    }

    /// Base address of the mapping. Dereferencing it is the caller's
    /// business: only atomics and byte copies, only within [`Segment::len`],
    /// only while `self` lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }
}

/// A family of types built over a mapped segment: `Of<'r>` is what is
/// built from the segment's `Region<'r>` (an engine, the control area).
///
/// # Safety
///
/// `Of<'r>` holds no borrow but of the region it was built from (and
/// `'static` data), and no method of it taking `&mut self` stores a value
/// of lifetime `'r` that it did not get from that region. Then
/// [`Attached::get`], which hands out `&'s mut Of<'s>` for a borrow `'s`
/// of the owner, lets nothing outlive the mapping.
pub unsafe trait View {
    /// The type, for a region of lifetime `'r`.
    type Of<'r>;
}

/// A mapped segment and what is built over it, owned together: the views
/// are dropped before the mapping whatever the order of any fields, and
/// they are handed out only for a borrow of the owner — the mapping's
/// lifetime is this value's, in the types.
///
/// ```
/// use btl_core::shm::Region;
/// use btl_linux::segment::{Attached, Segment, View};
///
/// /// A view that is just the region.
/// struct Whole;
/// // SAFETY: a `Region` holds nothing but the borrow of the mapping, and
/// // has no `&mut self` methods.
/// unsafe impl View for Whole {
///     type Of<'r> = Region<'r>;
/// }
///
/// let seg = Segment::create("btl-doc-attached", 4096)?;
/// let mut a = Attached::<Whole>::new(seg, |region, _| Ok::<_, std::io::Error>(region))?;
/// a.get().write_bytes(0, b"views")?;
/// let mut back = [0u8; 5];
/// a.view().read_bytes(0, &mut back)?;
/// assert_eq!(&back, b"views");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A view cannot outlive its owner (the region is the borrow of `a`):
///
/// ```compile_fail
/// # use btl_core::shm::Region;
/// # use btl_linux::segment::{Attached, Segment, View};
/// # struct Whole;
/// # unsafe impl View for Whole { type Of<'r> = Region<'r>; }
/// let seg = Segment::create("btl-doc-attached", 4096).unwrap();
/// let a = Attached::<Whole>::new(seg, |region, _| Ok::<_, ()>(region)).unwrap();
/// let region: Region<'_> = *a.view();
/// drop(a); // unmaps the segment
/// region.write_bytes(0, b"dangling").unwrap();
/// ```
///
/// nor can the builder keep the region for itself:
///
/// ```compile_fail
/// # use btl_core::shm::Region;
/// # use btl_linux::segment::{Attached, Segment, View};
/// # struct Whole;
/// # unsafe impl View for Whole { type Of<'r> = Region<'r>; }
/// let seg = Segment::create("btl-doc-attached", 4096).unwrap();
/// let mut kept: Option<Region<'static>> = None;
/// let a = Attached::<Whole>::new(seg, |region, _| {
///     kept = Some(region);
///     Ok::<_, ()>(region)
/// });
/// ```
pub struct Attached<V: View> {
    // Dropped by hand in `drop`, before `segment` (dropped after it, as
    // every field is).
    view: ManuallyDrop<V::Of<'static>>,
    segment: Segment,
}

impl<V: View> fmt::Debug for Attached<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attached")
            .field("segment", &self.segment)
            .finish_non_exhaustive()
    }
}

impl<V: View> Attached<V> {
    /// Builds the views over `segment` with `build`, which gets the
    /// segment's region (for a lifetime it cannot name, so it can only
    /// return what it builds from it) and the segment itself (for its
    /// descriptor, its length); then owns both. On error, the segment is
    /// dropped (unmapped).
    pub fn new<E>(
        segment: Segment,
        build: impl for<'r, 's> FnOnce(Region<'r>, &'s Segment) -> Result<V::Of<'r>, E>,
    ) -> Result<Self, E> {
        // SAFETY: the mapping of `segment` lives as long as `segment`, which
        // this value owns and drops only after the view (`drop`); `build` is
        // generic over the region's lifetime, so what it returns borrows
        // nothing but the region (and its own `'static` data), and `V`'s
        // contract keeps it so; the region stays in this thread (not Send).
        let region: Region<'static> = unsafe { Region::from_raw_parts(segment.base, segment.len) };
        let view = build(region, &segment)?;
        Ok(Self {
            view: ManuallyDrop::new(view),
            segment,
        })
    }

    /// The views, for as long as `self` is borrowed.
    pub fn get(&mut self) -> &mut V::Of<'_> {
        let p: *mut V::Of<'static> = &mut *self.view;
        // SAFETY: `Of<'static>` and `Of<'_>` are the same type but for the
        // lifetime; the views are valid while the mapping is, which outlives
        // this borrow of `self`; and `V`'s contract guarantees that nothing
        // stored through the `&mut` can outlive the mapping.
        unsafe { &mut *p.cast::<V::Of<'_>>() }
    }

    /// The views, shared, for as long as `self` is borrowed.
    pub fn view(&self) -> &V::Of<'_> {
        let p: *const V::Of<'static> = &*self.view;
        // SAFETY: as in `get`, shared.
        unsafe { &*p.cast::<V::Of<'_>>() }
    }

    /// The segment.
    pub fn segment(&self) -> &Segment {
        &self.segment
    }
}

impl<V: View> Drop for Attached<V> {
    fn drop(&mut self) {
        // SAFETY: dropped once, here; `segment` (the mapping) is dropped
        // after this returns, so the views never see it unmapped.
        unsafe { ManuallyDrop::drop(&mut self.view) }
    }
}

/// The abstract socket address of segment `name`'s rendezvous (a name in
/// the network namespace's abstract socket space: no file).
fn rendezvous_addr(name: &str) -> Result<SocketAddrUnix, SegmentError> {
    // Abstract names hold at most 107 bytes: long names keep a prefix and a
    // hash of the whole.
    let id = if name.len() <= 100 {
        name.to_owned()
    } else {
        let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("{}-{hash:016x}", &name[..80])
    };
    SocketAddrUnix::new_abstract_name(id.as_bytes())
        .map_err(|e| SegmentError::io("name the rendezvous socket", name, e))
}

/// The creator's side of the rendezvous: a listening abstract socket that
/// hands the segment's descriptor to every process of our uid that
/// connects. Dropping it closes the socket (and frees its name).
#[derive(Debug)]
pub struct Offer {
    listener: OwnedFd,
    name: String,
    uid: u32,
}

impl Offer {
    /// Listens for the peers of segment `name` (non-blocking).
    /// [`SegmentError::Exists`] if another process listens under that name.
    pub fn new(name: &str) -> Result<Offer, SegmentError> {
        let addr = rendezvous_addr(name)?;
        let listener = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .map_err(|e| SegmentError::io("socket", name, e))?;
        match rustix::net::bind(&listener, &addr) {
            Ok(()) => {}
            Err(Errno::ADDRINUSE) => {
                return Err(SegmentError::Exists {
                    name: name.to_owned(),
                })
            }
            Err(e) => return Err(SegmentError::io("bind the rendezvous socket", name, e)),
        }
        rustix::net::listen(&listener, 64).map_err(|e| SegmentError::io("listen", name, e))?;
        Ok(Offer {
            listener,
            name: name.to_owned(),
            uid: rustix::process::geteuid().as_raw(),
        })
    }

    /// Hands `segment`'s descriptor to every process waiting to connect;
    /// never blocks. Connections of another uid are refused (logged).
    /// Returns how many got it.
    pub fn serve(&self, segment: &Segment) -> usize {
        let mut served = 0;
        loop {
            let conn = match rustix::net::accept_with(
                &self.listener,
                SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            ) {
                Ok(c) => c,
                Err(Errno::INTR) | Err(Errno::CONNABORTED) => continue,
                Err(Errno::AGAIN) => return served,
                Err(e) => {
                    debug!("rendezvous of {}: accept: {e}", self.name);
                    return served;
                }
            };
            let cred_pid = match rustix::net::sockopt::socket_peercred(&conn) {
                Ok(cred) if cred.uid.as_raw() == self.uid => cred.pid.as_raw_nonzero(),
                Ok(cred) => {
                    warn!(
                        "shared segment {}: refused to hand it to pid {} of uid {}",
                        self.name,
                        cred.pid.as_raw_nonzero(),
                        cred.uid.as_raw()
                    );
                    continue;
                }
                Err(e) => {
                    warn!("shared segment {}: SO_PEERCRED of a peer: {e}", self.name);
                    continue;
                }
            };
            let mut msg = [0u8; OFFER_LEN];
            msg[..8].copy_from_slice(&OFFER_MAGIC);
            msg[8..].copy_from_slice(&(segment.len() as u64).to_le_bytes());
            let fds = [segment.fd()];
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            control.push(SendAncillaryMessage::ScmRights(&fds));
            match rustix::net::sendmsg(
                &conn,
                &[io::IoSlice::new(&msg)],
                &mut control,
                SendFlags::NOSIGNAL,
            ) {
                Ok(_) => served += 1,
                // The peer asks again when it sees the connection closed.
                Err(e) => warn!(
                    "shared segment {}: could not hand it to pid {}: sendmsg: {e}",
                    self.name, cred_pid
                ),
            }
        }
    }
}

/// `fetch(name, creator, timeout)` — a peer's side of the rendezvous:
/// connects to segment `name`'s creator (retrying, sleeping 1 ms growing to
/// 10 ms, until `timeout`), checks that it is a process of our uid — and,
/// if `creator` is given (its pid, from the wire-up), that process — and
/// receives the descriptor (then [`Segment::from_fd`]).
pub fn fetch(name: &str, creator: Option<u32>, timeout: Duration) -> Result<OwnedFd, SegmentError> {
    let addr = rendezvous_addr(name)?;
    let uid = rustix::process::geteuid().as_raw();
    let mut deadline = crate::wait::Deadline::new(timeout)
        .pauses(Duration::from_millis(1), Duration::from_millis(10));
    let start = Instant::now();
    let got = deadline.poll(|| {
        let sock = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| SegmentError::io("socket", name, e))?;
        match rustix::net::connect(&sock, &addr) {
            Ok(()) => receive(&sock, name, uid, creator, start, timeout),
            // Nobody listens yet (or the backlog is full): try again.
            Err(Errno::CONNREFUSED) | Err(Errno::NOENT) | Err(Errno::AGAIN) | Err(Errno::INTR) => {
                Ok(None)
            }
            Err(e) => Err(SegmentError::io(
                "connect to the rendezvous socket",
                name,
                e,
            )),
        }
    })?;
    got.ok_or_else(|| SegmentError::Timeout {
        name: name.to_owned(),
        waited: deadline.elapsed(),
    })
}

/// The offer on a connected rendezvous socket; `None` when the connection
/// was reset before any answer: the listener went away with our
/// connection still in its backlog, never accepted (the offer was
/// withdrawn, or the listening descriptor lived on for a moment in a
/// child the offerer forked, until that child's `exec` closed it) — nobody
/// served us, as when nobody listens, so [`fetch`] tries again. Also
/// `None` when an accepted connection closes unanswered while its holder
/// is still alive (the creator dropped that one connection and logged
/// why); an error only when the holder is gone.
fn receive(
    sock: &OwnedFd,
    name: &str,
    uid: u32,
    creator: Option<u32>,
    start: Instant,
    timeout: Duration,
) -> Result<Option<OwnedFd>, SegmentError> {
    let cred = rustix::net::sockopt::socket_peercred(sock)
        .map_err(|e| SegmentError::io("SO_PEERCRED", name, e))?;
    let (pid, peer_uid) = (cred.pid.as_raw_nonzero().get() as u32, cred.uid.as_raw());
    if peer_uid != uid {
        return Err(SegmentError::NotOurs {
            name: name.to_owned(),
            what: format!(
                "its rendezvous socket is held by pid {pid} of uid {peer_uid}, not ours ({uid})"
            ),
        });
    }
    if let Some(want) = creator.filter(|&c| c != pid) {
        return Err(SegmentError::NotOurs {
            name: name.to_owned(),
            what: format!(
                "its rendezvous socket is held by pid {pid}, not by local rank 0 (pid {want}, as \
                 the wire-up says)"
            ),
        });
    }
    // Who holds the socket now, to tell later whether it is still there.
    let holder_start = process_start_time(pid).unwrap_or(0);
    let left = timeout
        .saturating_sub(start.elapsed())
        .max(Duration::from_millis(10));
    rustix::net::sockopt::set_socket_timeout(sock, rustix::net::sockopt::Timeout::Recv, Some(left))
        .map_err(|e| SegmentError::io("SO_RCVTIMEO", name, e))?;
    let mut msg = [0u8; OFFER_LEN];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match rustix::net::recvmsg(
            sock,
            &mut [io::IoSliceMut::new(&mut msg)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => break r,
            Err(Errno::INTR) => continue,
            Err(Errno::CONNRESET) => return Ok(None),
            Err(Errno::AGAIN) => {
                return Err(SegmentError::Timeout {
                    name: name.to_owned(),
                    waited: start.elapsed(),
                })
            }
            Err(e) => {
                return Err(SegmentError::io(
                    "recvmsg from the rendezvous socket",
                    name,
                    e,
                ))
            }
        }
    };
    let mut fd = None;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            for f in fds {
                fd.get_or_insert(f);
            }
        }
    }
    if got.bytes == 0 && fd.is_none() {
        // Closed without an answer. While the creator lives on, it dropped
        // this one connection (its `serve` logs why): ask again. Only a
        // creator that is gone ends the wait here.
        if process_alive(pid, holder_start) {
            debug!(
                "rendezvous of {name}: pid {pid} closed our connection unanswered; asking again"
            );
            return Ok(None);
        }
        return Err(SegmentError::io(
            "receive the segment from local rank 0",
            name,
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "it closed the connection without answering (did it fail during start-up?)",
            ),
        ));
    }
    if got.bytes != OFFER_LEN || msg[..8] != OFFER_MAGIC {
        return Err(SegmentError::NotOurs {
            name: name.to_owned(),
            what: format!(
                "its rendezvous answered {} bytes that are not an offer",
                got.bytes
            ),
        });
    }
    fd.map(Some).ok_or_else(|| SegmentError::NotOurs {
        name: name.to_owned(),
        what: "its rendezvous answered without a descriptor".into(),
    })
}

/// Field 22 (`starttime`) of a `/proc/<pid>/stat` line.
fn parse_start_time(stat: &str) -> Option<u64> {
    // comm (field 2) is in parentheses and may itself hold spaces and
    // parentheses: fields 3.. start after the LAST ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(22 - 3)?.parse().ok()
}

/// `process_start_time(pid)` — when `pid` started, in clock ticks since
/// boot (field 22 of `/proc/<pid>/stat`); `None` if there is no such
/// process or `/proc` cannot be read.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// True unless `kill(pid, 0)` says there is no such process.
fn pid_exists(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    !matches!(rustix::process::test_kill_process(pid), Err(Errno::SRCH))
}

/// `process_alive(pid, start_time)` — true if process `pid` exists and
/// started at `start_time` (clock ticks since boot), so a recycled pid is
/// not mistaken for the original process.
///
/// Where `/proc/<pid>/stat` cannot be read although the process exists
/// (no `/proc`), the start time cannot be compared and the process is
/// assumed to be alive.
///
/// A zombie (exited, not yet reaped by its parent) is dead: it will never
/// handle a message again.
pub fn process_alive(pid: u32, start_time: u64) -> bool {
    if pid == 0 {
        return false;
    }
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return pid_exists(pid);
    };
    if exited(&stat) {
        return false;
    }
    match parse_start_time(&stat) {
        Some(t) => t == start_time,
        None => pid_exists(pid),
    }
}

/// Whether a `/proc/<pid>/stat` line says the process has exited (state
/// `Z`, zombie, or `X`, dead).
fn exited(stat: &str) -> bool {
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_ascii_whitespace().next());
    matches!(state, Some("Z" | "X"))
}

/// The identity to write into the header of a segment we create:
/// `(pid, start time)`, the start time being 0 if `/proc` is unreadable.
pub fn current_process_identity() -> (u32, u64) {
    let pid = std::process::id();
    (pid, process_start_time(pid).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::exited;

    #[test]
    fn zombies_are_dead() {
        assert!(exited("12 (a) b)) Z 1 2 3"));
        assert!(!exited("12 (a (Z)) S 1 2 3"));
        assert!(!exited("garbage"));
    }

    use super::*;

    #[test]
    fn start_time_parsing_splits_at_the_last_paren() {
        let fields: Vec<String> = (3..=30).map(|i| i.to_string()).collect();
        let tail = fields.join(" ");
        assert_eq!(parse_start_time(&format!("42 (bash) {tail}")), Some(22));
        assert_eq!(
            parse_start_time(&format!("42 (a) b (c)) d) {tail}\n")),
            Some(22)
        );
        assert_eq!(parse_start_time("42 (x) 1 2 3"), None);
        assert_eq!(parse_start_time("no paren"), None);
    }

    #[test]
    fn own_identity_is_alive() {
        let (pid, start) = current_process_identity();
        assert!(start > 0);
        assert!(process_alive(pid, start));
        assert!(!process_alive(pid, start + 1));
        assert!(!process_alive(0, 0));
    }
}
