//! The control area at the start of a node's shared segment: who created
//! it, the parameters its layout was computed from, and one record per
//! local rank (pid, start time, state). Everything here is read by other
//! processes and validated by them; see [`crate::sm::layout`] for where it sits.
//!
//! Byte offsets of the first three fields are fixed (the Linux adapter
//! reads them with plain file reads to recognise stale segments): bytes
//! 0..8 magic, 8..16 creator pid, 16..24 creator start time, in native
//! byte order (little endian on every Linux target btl supports).
//!
//! `unsafe` here: only the `ShmSafe` impls of the two `repr(C)` atomics
//! structs.
#![allow(unsafe_code)]

use core::fmt;

use crate::shm::{Region, ResolveError, ShmSafe};
use crate::sm::layout::{CONTROL_HEADER, CONTROL_RECORD};
use crate::sm::params::SmParams;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// "BTLSEG01", little endian.
pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"BTLSEG01");
/// Layout version of the control area.
pub const CONTROL_VERSION: u32 = 1;

/// Segment state: the creator is still writing the header.
pub const SEG_CREATING: u32 = 0;
/// Segment state: the header is complete; ranks may attach.
pub const SEG_READY: u32 = 1;

/// Rank state: not yet attached.
pub const RANK_ABSENT: u32 = 0;
/// Rank state: the rank's part (rings, fragments) is initialised; peers may
/// write to it.
pub const RANK_READY: u32 = 1;
/// Rank state: the rank finished and detached cleanly.
pub const RANK_DONE: u32 = 2;

/// The segment's header, at offset 0.
#[repr(C)]
#[derive(Debug)]
pub struct ControlHeader {
    /// [`SEGMENT_MAGIC`] once the creator has written the header.
    pub magic: AtomicU64,
    /// The creator's pid.
    pub creator_pid: AtomicU64,
    /// The creator's start time (clock ticks since boot), so a recycled pid
    /// is not mistaken for it.
    pub creator_start: AtomicU64,
    /// [`CONTROL_VERSION`].
    pub version: AtomicU32,
    /// [`SEG_CREATING`] or [`SEG_READY`].
    pub state: AtomicU32,
    /// Number of local ranks.
    pub nprocs: AtomicU32,
    /// Ranks that finished attaching (the last one unlinks the file).
    pub attached: AtomicU32,
    /// `fifo_size` the layout was computed with.
    pub fifo_size: AtomicU32,
    /// `num_fifos` (power of two).
    pub num_fifos: AtomicU32,
    /// `fifo_lazy_free`.
    pub lazy_free: AtomicU32,
    /// `eager_limit` (payload bytes of an eager fragment).
    pub eager_limit: AtomicU32,
    /// `max_send_size` (payload bytes of a max-size fragment).
    pub max_send_size: AtomicU32,
    /// `free_list_num` (max-size fragments per rank).
    pub free_list_num: AtomicU32,
    /// `free_list_inc`.
    pub free_list_inc: AtomicU32,
    /// `max_procs` after `calc_sm_max_procs`.
    pub max_procs: AtomicU32,
    /// Total segment size in bytes.
    pub total_bytes: AtomicU64,
}

/// One rank's record, at `CONTROL_HEADER + rank * CONTROL_RECORD`.
#[repr(C)]
#[derive(Debug)]
pub struct RankRecord {
    /// The rank's pid.
    pub pid: AtomicU64,
    /// The rank's start time (clock ticks since boot).
    pub start: AtomicU64,
    /// [`RANK_ABSENT`], [`RANK_READY`] or [`RANK_DONE`].
    pub state: AtomicU32,
    /// Reserved.
    pub flags: AtomicU32,
    /// Address (in the rank's own address space) of a probe word, for the
    /// peers' single-copy permission check.
    pub probe_addr: AtomicU64,
    /// The value at `probe_addr`.
    pub probe_value: AtomicU64,
}

// SAFETY: repr(C) integer atomics: no pointers, no Drop, any bit pattern
// valid, all mutation atomic.
unsafe impl ShmSafe for ControlHeader {}
// SAFETY: as above.
unsafe impl ShmSafe for RankRecord {}

const _: () = assert!(core::mem::size_of::<ControlHeader>() <= CONTROL_HEADER);
const _: () = assert!(core::mem::size_of::<RankRecord>() <= CONTROL_RECORD);

/// The control area of a mapped segment.
#[derive(Clone, Copy, Debug)]
pub struct Control<'a> {
    region: Region<'a>,
    header: &'a ControlHeader,
}

/// The control area is missing or inconsistent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ControlError {
    /// The area is not inside the segment.
    Resolve(ResolveError),
    /// The creator has not finished writing the header (yet).
    NotReady,
    /// Written by an incompatible version.
    BadVersion {
        /// Version found.
        found: u32,
    },
    /// A field has an impossible value.
    Corrupted {
        /// Which field.
        what: &'static str,
    },
    /// A rank index beyond the job's size.
    NoSuchRank {
        /// The rank asked for.
        rank: u32,
        /// Number of ranks.
        nprocs: u32,
    },
}

impl From<ResolveError> for ControlError {
    fn from(e: ResolveError) -> Self {
        Self::Resolve(e)
    }
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Resolve(e) => write!(f, "segment control area: {e}"),
            Self::NotReady => write!(f, "segment header not written yet"),
            Self::BadVersion { found } => write!(
                f,
                "segment written by control version {found}, this build speaks {CONTROL_VERSION}"
            ),
            Self::Corrupted { what } => write!(f, "segment header corrupted: bad {what}"),
            Self::NoSuchRank { rank, nprocs } => {
                write!(f, "rank {rank} is not in this segment ({nprocs} ranks)")
            }
        }
    }
}

impl core::error::Error for ControlError {}

impl<'a> Control<'a> {
    /// The control area at the start of `segment` (no validation beyond
    /// bounds: see [`Self::read_params`]).
    pub fn new(segment: Region<'a>) -> Result<Self, ControlError> {
        let header = segment.resolve::<ControlHeader>(0)?;
        Ok(Self {
            region: segment,
            header,
        })
    }

    /// The header.
    pub fn header(&self) -> &'a ControlHeader {
        self.header
    }

    /// Writes the header (creator side), ending with the magic and
    /// [`SEG_READY`] (release: attachers that see it see everything else).
    pub fn publish(
        &self,
        params: &SmParams,
        nprocs: u32,
        max_procs: u32,
        total_bytes: u64,
        creator_pid: u64,
        creator_start: u64,
    ) {
        let h = self.header;
        let r = Ordering::Relaxed;
        h.creator_pid.store(creator_pid, r);
        h.creator_start.store(creator_start, r);
        h.version.store(CONTROL_VERSION, r);
        h.nprocs.store(nprocs, r);
        h.attached.store(0, r);
        h.fifo_size.store(params.fifo_size, r);
        h.num_fifos.store(params.num_fifos as u32, r);
        h.lazy_free.store(params.fifo_lazy_free, r);
        h.eager_limit.store(params.eager_limit, r);
        h.max_send_size.store(params.max_send_size, r);
        h.free_list_num.store(params.free_list_num as u32, r);
        h.free_list_inc.store(params.free_list_inc as u32, r);
        h.max_procs.store(max_procs, r);
        h.total_bytes.store(total_bytes, r);
        h.magic.store(SEGMENT_MAGIC, r);
        // Release: pairs with the Acquire load in `read_params`.
        h.state.store(SEG_READY, Ordering::Release);
    }

    /// True once the creator has published the header.
    pub fn is_ready(&self) -> bool {
        // Acquire: pairs with the Release store in `publish`.
        self.header.state.load(Ordering::Acquire) == SEG_READY
            && self.header.magic.load(Ordering::Relaxed) == SEGMENT_MAGIC
    }

    /// Reads back the layout parameters the creator published (attacher
    /// side): the parameters that shape the segment are taken from here,
    /// not from the local environment, so every rank computes the same
    /// layout. Returns the parameters, `nprocs` and `max_procs`.
    pub fn read_params(&self, base: &SmParams) -> Result<(SmParams, u32, u32), ControlError> {
        if !self.is_ready() {
            return Err(ControlError::NotReady);
        }
        let h = self.header;
        let r = Ordering::Relaxed;
        let version = h.version.load(r);
        if version != CONTROL_VERSION {
            return Err(ControlError::BadVersion { found: version });
        }
        let mut p = *base;
        p.fifo_size = h.fifo_size.load(r);
        p.num_fifos = i32::try_from(h.num_fifos.load(r))
            .map_err(|_| ControlError::Corrupted { what: "num_fifos" })?;
        p.fifo_lazy_free = h.lazy_free.load(r);
        p.eager_limit = h.eager_limit.load(r);
        p.max_send_size = h.max_send_size.load(r);
        p.free_list_num =
            i32::try_from(h.free_list_num.load(r)).map_err(|_| ControlError::Corrupted {
                what: "free_list_num",
            })?;
        p.free_list_inc =
            i32::try_from(h.free_list_inc.load(r)).map_err(|_| ControlError::Corrupted {
                what: "free_list_inc",
            })?;
        let nprocs = h.nprocs.load(r);
        let max_procs = h.max_procs.load(r);
        if nprocs == 0 || max_procs < nprocs {
            return Err(ControlError::Corrupted { what: "nprocs" });
        }
        Ok((p, nprocs, max_procs))
    }

    /// Rank `rank`'s record.
    pub fn record(&self, rank: u32) -> Result<&'a RankRecord, ControlError> {
        let nprocs = self.header.nprocs.load(Ordering::Relaxed);
        if rank >= nprocs {
            return Err(ControlError::NoSuchRank { rank, nprocs });
        }
        let at = (CONTROL_HEADER as u64)
            .checked_add(u64::from(rank) * CONTROL_RECORD as u64)
            .ok_or(ControlError::NoSuchRank { rank, nprocs })?;
        Ok(self.region.resolve::<RankRecord>(at)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;

    #[test]
    fn publish_then_read_back() {
        let mut buf = vec![0u64; 4096 / 8];
        let len = buf.len() * 8;
        // SAFETY: the buffer outlives the region and is only accessed
        // through it.
        let region = unsafe {
            Region::from_raw_parts(
                core::ptr::NonNull::new(buf.as_mut_ptr().cast()).unwrap(),
                len,
            )
        };
        let c = Control::new(region).unwrap();
        assert_eq!(
            c.read_params(&SmParams::default()).unwrap_err(),
            ControlError::NotReady
        );
        let mut p = SmParams::default();
        p.fifo_size = 64;
        p.num_fifos = 2;
        c.publish(&p, 3, 6, 1 << 20, 42, 7);
        let (q, n, m) = c.read_params(&SmParams::default()).unwrap();
        assert_eq!((q.fifo_size, q.num_fifos, n, m), (64, 2, 3, 6));
        assert!(c.record(2).is_ok());
        assert!(matches!(
            c.record(3),
            Err(ControlError::NoSuchRank { rank: 3, nprocs: 3 })
        ));
        // Fixed byte offsets read by the stale-file check.
        let bytes: &[u8] = bytemuck_bytes(&buf);
        assert_eq!(&bytes[0..8], b"BTLSEG01");
        assert_eq!(u64::from_le_bytes(bytes[8..16].try_into().unwrap()), 42);
        assert_eq!(u64::from_le_bytes(bytes[16..24].try_into().unwrap()), 7);
        // Corruption is an error, not a panic.
        c.header().nprocs.store(0, Ordering::Relaxed);
        assert!(c.read_params(&SmParams::default()).is_err());
        c.header().version.store(9, Ordering::Relaxed);
        assert!(matches!(
            c.read_params(&SmParams::default()),
            Err(ControlError::BadVersion { found: 9 })
        ));
    }

    fn bytemuck_bytes(words: &[u64]) -> &[u8] {
        // SAFETY: u64 has no padding; any u64 is 8 valid u8s; the borrow
        // covers exactly the words.
        unsafe { core::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 8) }
    }
}
