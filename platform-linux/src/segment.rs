//! Backing files of shared-memory segments.
//!
//! A segment is a file in `/dev/shm` (or, when `/dev/shm` is unusable, the
//! job's session directory) named `btl-<uid>-<job>-<node>`, mode `0600`,
//! created by one process ([`Segment::create`]) and mapped shared by its
//! peers ([`Segment::open`]). Its pages are reserved with `fallocate` when it
//! is created: on tmpfs a file sized only with `ftruncate` is sparse, and a
//! process touching a page the file system can no longer provide is killed
//! by `SIGBUS` long after the creation "succeeded".
//!
//! Nothing here unlinks a segment behind the protocol's back: dropping a
//! [`Segment`] unmaps it, and [`Segment::unlink`] removes its name when the
//! protocol says every peer has attached. Segments of crashed jobs are found
//! and removed by [`remove_stale`], which reads the creator's identity from
//! the segment header (bytes 8..16: pid, bytes 16..24: start time in clock
//! ticks since boot, both little-endian `u64`; see [`HEADER_LEN`]).
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
//! - the file's pages are reserved before it is mapped, and peers are
//!   processes of the same user that never truncate a segment.
#![allow(unsafe_code)]

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Once;
use std::time::{Duration, Instant, SystemTime};

use btl_core::shm::Region;
use log::{debug, warn};
use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{Access, FallocateFlags, Mode, OFlags};
use rustix::io::Errno;

/// Directory preferred for segments (a tmpfs on every Linux distribution).
pub const SHM_DIR: &str = "/dev/shm";

/// Longest segment file name accepted by [`segment_file_name`], in bytes.
pub const MAX_NAME_LEN: usize = 200;

/// Length of the creator-identity part of the segment header read by
/// [`remove_stale`]: magic (bytes 0..8), creator pid (8..16), creator start
/// time (16..24).
pub const HEADER_LEN: usize = 24;

/// Age after which a segment whose creator is unknown (no header yet, or a
/// header naming pid 0) is considered abandoned by [`remove_stale`].
pub const STALE_AGE: Duration = Duration::from_secs(60);

const MIB: f64 = 1024.0 * 1024.0;

/// Errors of segment naming, creation, attachment and cleanup.
#[derive(Debug)]
#[non_exhaustive]
pub enum SegmentError {
    /// Neither `/dev/shm` nor the session directory is a writable directory.
    NoDirectory {
        /// The session directory that was offered, if any.
        session_dir: Option<PathBuf>,
    },
    /// A job or node identifier cannot be part of a file name.
    InvalidName {
        /// Which identifier (`"job"` or `"node"`).
        field: &'static str,
        /// The rejected value.
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The file name would be longer than [`MAX_NAME_LEN`] bytes.
    NameTooLong {
        /// Length of the name that would have been built, in bytes.
        len: usize,
        /// The limit ([`MAX_NAME_LEN`]).
        max: usize,
    },
    /// A segment of zero bytes was requested.
    ZeroLength {
        /// The segment's file.
        path: PathBuf,
    },
    /// [`Segment::create`] found the file already there.
    Exists {
        /// The segment's file.
        path: PathBuf,
    },
    /// The file system holding the segment has less free space than needed.
    NoSpace {
        /// The segment's file.
        path: PathBuf,
        /// Bytes the segment needs.
        needed: u64,
        /// Bytes available on the file system (as `statvfs` reports them).
        free: u64,
    },
    /// [`Segment::open`] gave up waiting for the creator.
    Timeout {
        /// The segment's file.
        path: PathBuf,
        /// How long it waited.
        waited: Duration,
        /// The size it waited for, in bytes.
        min_len: usize,
        /// The file's size at the last look; `None` if it never appeared.
        found_len: Option<u64>,
    },
    /// The file is not a regular file owned by this user.
    NotOurs {
        /// The segment's file.
        path: PathBuf,
        /// Its owner's uid.
        owner: u32,
        /// Our effective uid.
        uid: u32,
        /// True if it is a regular file.
        regular: bool,
    },
    /// A system call on the file or its directory failed.
    Io {
        /// What was being done (`"create"`, `"fallocate"`, `"mmap"`, ...).
        op: &'static str,
        /// The file or directory it was done to.
        path: PathBuf,
        /// The error (with its errno).
        source: io::Error,
    },
}

impl SegmentError {
    fn io(op: &'static str, path: &Path, source: impl Into<io::Error>) -> Self {
        Self::Io {
            op,
            path: path.to_owned(),
            source: source.into(),
        }
    }
}

impl fmt::Display for SegmentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoDirectory { session_dir: None } => write!(
                f,
                "no directory for shared-memory segments: {SHM_DIR} is not a writable \
                 directory and no session directory was given"
            ),
            Self::NoDirectory {
                session_dir: Some(dir),
            } => write!(
                f,
                "no directory for shared-memory segments: neither {SHM_DIR} nor the session \
                 directory {} is a writable directory",
                dir.display()
            ),
            Self::InvalidName {
                field,
                value,
                reason,
            } => write!(
                f,
                "invalid {field} identifier {value:?} for a segment file name: {reason} \
                 (allowed: 1 or more of A-Z a-z 0-9 . _ -)"
            ),
            Self::NameTooLong { len, max } => write!(
                f,
                "segment file name would be {len} bytes long, more than the {max} allowed"
            ),
            Self::ZeroLength { path } => {
                write!(
                    f,
                    "shared segment {} of zero bytes requested",
                    path.display()
                )
            }
            Self::Exists { path } => write!(
                f,
                "shared segment {} already exists (another job with the same name, or a \
                 leftover of a crashed one)",
                path.display()
            ),
            Self::NoSpace { path, needed, free } => write!(
                f,
                "not enough space for shared segment {}: it needs {needed} bytes ({:.1} MiB) \
                 but its file system has {free} bytes ({:.1} MiB) free; free some space or \
                 shrink the segment (fewer processes or smaller FIFOs/fragments)",
                path.display(),
                *needed as f64 / MIB,
                *free as f64 / MIB,
            ),
            Self::Timeout {
                path,
                waited,
                min_len,
                found_len: None,
            } => write!(
                f,
                "timed out after {waited:?} waiting for shared segment {} ({min_len} bytes) \
                 to be created: the file never appeared (did its creator start and use the \
                 same job and node names?)",
                path.display()
            ),
            Self::Timeout {
                path,
                waited,
                min_len,
                found_len: Some(len),
            } => write!(
                f,
                "timed out after {waited:?} waiting for shared segment {} to reach {min_len} \
                 bytes: it has {len} (its creator did not finish sizing it)",
                path.display()
            ),
            Self::NotOurs {
                path,
                owner,
                uid,
                regular,
            } => {
                if *regular {
                    write!(
                        f,
                        "shared segment {} is owned by uid {owner}, not by us (uid {uid})",
                        path.display()
                    )
                } else {
                    write!(f, "shared segment {} is not a regular file", path.display())
                }
            }
            Self::Io { op, path, source } => {
                write!(f, "{op} {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for SegmentError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// True if `dir` is a directory in which we may create files.
fn usable_dir(dir: &Path) -> bool {
    dir.is_dir() && rustix::fs::access(dir, Access::WRITE_OK | Access::EXEC_OK).is_ok()
}

fn choose_dir(shm: &Path, session_dir: Option<&Path>) -> Result<PathBuf, SegmentError> {
    if usable_dir(shm) {
        return Ok(shm.to_owned());
    }
    match session_dir {
        Some(dir) if usable_dir(dir) => {
            debug!(
                "{} is not a writable directory; shared segments go to {}",
                shm.display(),
                dir.display()
            );
            Ok(dir.to_owned())
        }
        _ => Err(SegmentError::NoDirectory {
            session_dir: session_dir.map(Path::to_owned),
        }),
    }
}

/// `segment_dir(session_dir)` — the directory where segments are created.
///
/// [`SHM_DIR`] (`/dev/shm`) if it exists, is a directory and we may create
/// files in it (`access(W_OK | X_OK)`); otherwise `session_dir` under the
/// same conditions; otherwise [`SegmentError::NoDirectory`].
pub fn segment_dir(session_dir: Option<&Path>) -> Result<PathBuf, SegmentError> {
    choose_dir(Path::new(SHM_DIR), session_dir)
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

/// `segment_file_prefix(uid, job)` — `btl-<uid>-<job>-`, the common prefix
/// of every segment file of `job` (the launcher removes leftovers of its job
/// by this prefix). `job` is not validated here; see [`segment_file_name`].
pub fn segment_file_prefix(uid: u32, job: &str) -> String {
    format!("btl-{uid}-{job}-")
}

/// `segment_file_name(uid, job, node)` — `btl-<uid>-<job>-<node>`.
///
/// `job` and `node` come from the environment, so they are checked: each
/// must be non-empty and made only of `A-Z a-z 0-9 . _ -` (which excludes
/// `/`, NUL and spaces), and the whole name must be at most
/// [`MAX_NAME_LEN`] bytes.
pub fn segment_file_name(uid: u32, job: &str, node: &str) -> Result<String, SegmentError> {
    check_component("job", job)?;
    check_component("node", node)?;
    let name = format!("{}{node}", segment_file_prefix(uid, job));
    if name.len() > MAX_NAME_LEN {
        return Err(SegmentError::NameTooLong {
            len: name.len(),
            max: MAX_NAME_LEN,
        });
    }
    Ok(name)
}

/// `free_space(dir)` — bytes available to us on the file system holding
/// `dir` (`statvfs`: `f_bavail * f_frsize`).
pub fn free_space(dir: &Path) -> Result<u64, SegmentError> {
    let st = rustix::fs::statvfs(dir).map_err(|e| SegmentError::io("statvfs", dir, e))?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

static FALLOCATE_UNSUPPORTED: Once = Once::new();

/// Gives `file` its size and reserves its pages.
fn reserve(file: &File, path: &Path, dir: &Path, len: u64) -> Result<(), SegmentError> {
    loop {
        // Mode 0 (no KEEP_SIZE): allocates the range and sets the size, so
        // peers polling the size see it only once every page is reserved.
        match rustix::fs::fallocate(file, FallocateFlags::empty(), 0, len) {
            Ok(()) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(Errno::NOSPC) => {
                return Err(SegmentError::NoSpace {
                    path: path.to_owned(),
                    needed: len,
                    free: free_space(dir).unwrap_or(0),
                })
            }
            Err(Errno::OPNOTSUPP) | Err(Errno::NOSYS) => {
                FALLOCATE_UNSUPPORTED.call_once(|| {
                    warn!(
                        "the file system of {} cannot reserve space (fallocate unsupported): \
                         segments are sized with ftruncate only, and running out of space \
                         later kills the process with SIGBUS",
                        dir.display()
                    )
                });
                return loop {
                    match rustix::fs::ftruncate(file, len) {
                        Ok(()) => break Ok(()),
                        Err(Errno::INTR) => continue,
                        Err(e) => break Err(SegmentError::io("ftruncate", path, e)),
                    }
                };
            }
            Err(e) => return Err(SegmentError::io("fallocate", path, e)),
        }
    }
}

fn check_ours(file: &File, path: &Path) -> Result<(u64, u64, u64), SegmentError> {
    let meta = file
        .metadata()
        .map_err(|e| SegmentError::io("fstat", path, e))?;
    let uid = rustix::process::geteuid().as_raw();
    if !meta.is_file() || meta.uid() != uid {
        return Err(SegmentError::NotOurs {
            path: path.to_owned(),
            owner: meta.uid(),
            uid,
            regular: meta.is_file(),
        });
    }
    Ok((meta.dev(), meta.ino(), meta.len()))
}

/// A shared, read-write mapping of a segment's backing file.
///
/// Dropping it unmaps the segment; it never unlinks the file (see
/// [`Segment::unlink`]).
#[derive(Debug)]
pub struct Segment {
    map: MmapRaw,
    base: NonNull<u8>,
    len: usize,
    path: PathBuf,
    /// (device, inode) of the file we mapped, so that [`Segment::unlink`]
    /// never removes a different file that took the name since.
    id: (u64, u64),
    unlinked: bool,
}

// SAFETY: `base` is the start of the mapping owned by `map` (MmapRaw is Send
// and Sync), which moves with the value. Not Sync: `region(&self)` makes
// regions, whose byte copies must stay in one thread (btl_core::shm's
// concurrency model), so `&Segment` must not be shared between threads.
unsafe impl Send for Segment {}

impl Segment {
    /// `Segment::create(path, len)` — creates the backing file and maps it.
    ///
    /// Opens `path` with `O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC`, mode
    /// `0600` (set again with `fchmod`, whatever the umask), after checking
    /// with `statvfs` that the directory's file system has `len` bytes
    /// available. The file is then sized and its pages reserved with
    /// `fallocate` (ENOSPC is [`SegmentError::NoSpace`]; on file systems
    /// without `fallocate`, `ftruncate` only, with a warning logged once),
    /// and mapped shared.
    ///
    /// An existing file is [`SegmentError::Exists`]. If anything fails after
    /// the file was created, it is unlinked before the error is returned.
    pub fn create(path: &Path, len: usize) -> Result<Segment, SegmentError> {
        if len == 0 {
            return Err(SegmentError::ZeroLength {
                path: path.to_owned(),
            });
        }
        let dir = parent_dir(path);
        let needed = len as u64;
        let free = free_space(dir)?;
        if needed > free {
            return Err(SegmentError::NoSpace {
                path: path.to_owned(),
                needed,
                free,
            });
        }
        let flags = OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::CLOEXEC;
        let fd = loop {
            match rustix::fs::open(path, flags, Mode::RUSR | Mode::WUSR) {
                Ok(fd) => break fd,
                Err(Errno::INTR) => continue,
                Err(Errno::EXIST) => {
                    return Err(SegmentError::Exists {
                        path: path.to_owned(),
                    })
                }
                Err(e) => return Err(SegmentError::io("create", path, e)),
            }
        };
        let file = File::from(fd);
        match Self::finish_create(&file, path, dir, len) {
            Ok(segment) => {
                debug!("created shared segment {} ({len} bytes)", path.display());
                Ok(segment)
            }
            Err(err) => {
                match rustix::fs::unlink(path) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(e) => warn!(
                        "could not remove {} after a failed creation: {e}",
                        path.display()
                    ),
                }
                Err(err)
            }
        }
    }

    fn finish_create(
        file: &File,
        path: &Path,
        dir: &Path,
        len: usize,
    ) -> Result<Segment, SegmentError> {
        rustix::fs::fchmod(file, Mode::RUSR | Mode::WUSR)
            .map_err(|e| SegmentError::io("fchmod", path, e))?;
        reserve(file, path, dir, len as u64)?;
        let (dev, ino, _) = check_ours(file, path)?;
        Self::map(file, path, len, (dev, ino))
    }

    fn map(file: &File, path: &Path, len: usize, id: (u64, u64)) -> Result<Segment, SegmentError> {
        let map = MmapOptions::new()
            .len(len)
            .map_raw(file)
            .map_err(|e| SegmentError::io("mmap", path, e))?;
        let base = NonNull::new(map.as_mut_ptr()).ok_or_else(|| {
            SegmentError::io("mmap", path, io::Error::other("mapping at address 0"))
        })?;
        Ok(Segment {
            map,
            base,
            len,
            path: path.to_owned(),
            id,
            unlinked: false,
        })
    }

    /// `Segment::open(path, min_len, timeout)` — maps a segment another
    /// process creates.
    ///
    /// Polls (sleeps of 1 ms growing to 10 ms, bounded by `timeout`) until
    /// `path` exists with at least `min_len` bytes (and at least one), then
    /// maps the whole file, whatever its size. The file must be a regular
    /// file owned by our effective uid ([`SegmentError::NotOurs`]).
    /// [`SegmentError::Timeout`] names the file and what was missing.
    pub fn open(path: &Path, min_len: usize, timeout: Duration) -> Result<Segment, SegmentError> {
        let start = Instant::now();
        let want = min_len.max(1) as u64;
        let mut found_len = None;
        let mut pause = Duration::from_millis(1);
        let flags = OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        loop {
            // Reopened on every poll: if the creator failed and a new one
            // re-created the file, we must not wait on the old inode.
            match rustix::fs::open(path, flags, Mode::empty()) {
                Ok(fd) => {
                    let file = File::from(fd);
                    let (dev, ino, size) = check_ours(&file, path)?;
                    found_len = Some(size);
                    if size >= want {
                        let len = usize::try_from(size).map_err(|_| {
                            SegmentError::io(
                                "map",
                                path,
                                io::Error::new(
                                    io::ErrorKind::InvalidData,
                                    "file larger than the address space",
                                ),
                            )
                        })?;
                        let segment = Self::map(&file, path, len, (dev, ino))?;
                        debug!("attached shared segment {} ({len} bytes)", path.display());
                        return Ok(segment);
                    }
                }
                Err(Errno::NOENT) | Err(Errno::INTR) => {}
                Err(e) => return Err(SegmentError::io("open", path, e)),
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(SegmentError::Timeout {
                    path: path.to_owned(),
                    waited,
                    min_len,
                    found_len,
                });
            }
            std::thread::sleep(pause.min(timeout - waited));
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: segments have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The backing file's path (it may have been unlinked since).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True once [`Segment::unlink`] succeeded on this handle.
    pub fn is_unlinked(&self) -> bool {
        self.unlinked
    }

    /// The mapping as a btl-core [`Region`], valid while `self` is borrowed.
    pub fn region(&self) -> Region<'_> {
        // SAFETY: `base..base + len` is our live shared read-write mapping
        // (created in `map`, unmapped only by dropping `self`), and the
        // returned Region borrows `self`, so it cannot outlive it. `len` was
        // accepted by mmap, so it is at most isize::MAX. This module creates
        // no Rust references into the mapping; every access goes through the
        // Region (ShmSafe atomics and byte copies) or raw pointers.
        unsafe { Region::from_raw_parts(self.base, self.len) }
    }

    /// Base address of the mapping. Dereferencing it is the caller's
    /// business: only atomics and byte copies, only within [`Segment::len`],
    /// only while `self` lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// `unlink()` — removes the segment's name; the mapping (ours and the
    /// peers') stays valid until dropped.
    ///
    /// Idempotent: a second call does nothing, and a file already removed by
    /// someone else (ENOENT) is fine. If the name now refers to a different
    /// file (ours was removed and the name reused), that file is left alone.
    pub fn unlink(&mut self) -> Result<(), SegmentError> {
        if self.unlinked {
            return Ok(());
        }
        match fs::symlink_metadata(&self.path) {
            Ok(meta) if (meta.dev(), meta.ino()) != self.id => {
                debug!(
                    "{} now names another file; ours was already unlinked",
                    self.path.display()
                );
                self.unlinked = true;
                return Ok(());
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.unlinked = true;
                return Ok(());
            }
            Err(e) => return Err(SegmentError::io("stat", &self.path, e)),
        }
        match rustix::fs::unlink(&self.path) {
            Ok(()) | Err(Errno::NOENT) => {
                debug!("unlinked shared segment {}", self.path.display());
                self.unlinked = true;
                Ok(())
            }
            Err(e) => Err(SegmentError::io("unlink", &self.path, e)),
        }
    }
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

/// Why a segment file is stale.
enum Staleness {
    /// Shorter than the header and older than [`STALE_AGE`].
    NoHeader,
    /// Header names pid 0 and the file is older than [`STALE_AGE`].
    UnknownCreator,
    /// The creator named by the header is gone.
    DeadCreator(u64),
}

fn age(meta: &fs::Metadata, now: SystemTime) -> Duration {
    meta.modified()
        .ok()
        .and_then(|m| now.duration_since(m).ok())
        .unwrap_or(Duration::ZERO)
}

/// Inspects one candidate; `Ok(None)` if it must be kept.
fn staleness(
    path: &Path,
    uid: u32,
    now: SystemTime,
) -> io::Result<Option<(Staleness, (u64, u64))>> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let mut file = File::from(rustix::fs::open(path, flags, Mode::empty())?);
    let meta = file.metadata()?;
    if !meta.is_file() || meta.uid() != uid {
        return Ok(None);
    }
    let id = (meta.dev(), meta.ino());
    let old = age(&meta, now) > STALE_AGE;
    let mut header = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match file.read(&mut header[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if got < HEADER_LEN {
        return Ok(old.then_some((Staleness::NoHeader, id)));
    }
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&header[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let (pid, start) = (word(8), word(16));
    if pid == 0 {
        return Ok(old.then_some((Staleness::UnknownCreator, id)));
    }
    let alive = match u32::try_from(pid) {
        Err(_) => false,
        // Start time 0: the creator could not read it, or has written its
        // pid but not yet its start time. Only the pid can be checked.
        Ok(pid32) if start == 0 => pid_exists(pid32),
        Ok(pid32) => process_alive(pid32, start),
    };
    Ok((!alive).then_some((Staleness::DeadCreator(pid), id)))
}

/// `remove_stale(dir, uid)` — removes the segment files in `dir` left by
/// crashed processes, and returns their paths.
///
/// Candidates are the regular files named `btl-<uid>-*` owned by our
/// effective uid; nothing else (other uids, other names, symlinks) is
/// touched. The first [`HEADER_LEN`] bytes are read (a plain read) and a
/// file is stale if:
/// - it is shorter than the header and older than [`STALE_AGE`] (its
///   creator died before writing the header);
/// - its header names pid 0 (unknown) and it is older than [`STALE_AGE`];
/// - its header names a process that is not alive with the recorded start
///   time ([`process_alive`]; a start time of 0 means only the pid is
///   checked).
///
/// Each removal is logged with `warn!`. A candidate that cannot be read is
/// skipped (logged with `debug!`); only a failure to list `dir` is an error.
/// Pids are those of our pid namespace: processes sharing the directory
/// from another pid namespace must not share the uid and prefix.
pub fn remove_stale(dir: &Path, uid: u32) -> Result<Vec<PathBuf>, SegmentError> {
    let prefix = format!("btl-{uid}-");
    let me = rustix::process::geteuid().as_raw();
    let now = SystemTime::now();
    let mut removed = Vec::new();
    let entries = fs::read_dir(dir).map_err(|e| SegmentError::io("read directory", dir, e))?;
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                debug!("listing {}: {e}", dir.display());
                continue;
            }
        };
        let name = entry.file_name();
        if !name.to_str().is_some_and(|n| n.starts_with(&prefix)) {
            continue;
        }
        let path = entry.path();
        let (why, id) = match staleness(&path, me, now) {
            Ok(Some(found)) => found,
            Ok(None) => continue,
            Err(e) => {
                debug!(
                    "skipping {} while looking for stale segments: {e}",
                    path.display()
                );
                continue;
            }
        };
        // The name must still refer to the file we inspected.
        match fs::symlink_metadata(&path) {
            Ok(meta) if (meta.dev(), meta.ino()) == id => {}
            _ => continue,
        }
        match rustix::fs::unlink(&path) {
            Ok(()) => {}
            Err(Errno::NOENT) => continue,
            Err(e) => {
                debug!("could not remove stale segment {}: {e}", path.display());
                continue;
            }
        }
        match why {
            Staleness::DeadCreator(pid) => warn!(
                "removed stale shared segment {}: its creator (pid {pid}) is gone",
                path.display()
            ),
            Staleness::UnknownCreator => warn!(
                "removed stale shared segment {}: creator pid unknown (0) and the file is \
                 older than {}s",
                path.display(),
                STALE_AGE.as_secs()
            ),
            Staleness::NoHeader => warn!(
                "removed stale shared segment {}: creator pid unknown (no header) and the \
                 file is older than {}s",
                path.display(),
                STALE_AGE.as_secs()
            ),
        }
        removed.push(path);
    }
    Ok(removed)
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
    fn dir_choice_falls_back_to_the_session_dir() {
        let tmp = std::env::temp_dir();
        let missing = Path::new("/nonexistent-btl-dir");
        assert_eq!(choose_dir(&tmp, None).unwrap(), tmp);
        assert_eq!(choose_dir(missing, Some(&tmp)).unwrap(), tmp);
        let err = choose_dir(missing, Some(missing)).unwrap_err();
        assert!(matches!(err, SegmentError::NoDirectory { .. }));
        assert!(err.to_string().contains("/nonexistent-btl-dir"));
        assert!(matches!(
            choose_dir(missing, None),
            Err(SegmentError::NoDirectory { session_dir: None })
        ));
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
