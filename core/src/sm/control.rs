//! The control area at the start of a node's shared segment: who created
//! it, the parameters its layout was computed from, and one record per
//! local rank (pid, start time, state). Everything here is read by other
//! processes and validated by them; see [`crate::sm::layout`] for where it sits.
//!
//! Byte offsets of the first three fields are fixed, so that a tool can
//! tell whose a segment is without knowing the rest of the layout: bytes
//! 0..8 magic, 8..16 creator pid, 16..24 creator start time, in native
//! byte order (little endian on every Linux target btl supports).
//!
//! A rank publishes its record once ([`RankRecord::publish`]: identity
//! fields, then the state with a release store) and peers read it with
//! [`RankRecord::read`] (acquire, then the fields): a record seen ready is
//! seen whole. Afterwards the only changes are the state turning to
//! [`RANK_DONE`] when the rank leaves, and verdicts: a rank that declares a
//! peer failed for corrupting shared memory says so in the peer's record
//! ([`RankRecord::accuse`]), so that the peer ends the conversation too
//! rather than wait for answers that will never come. Every value here may
//! have been written by anyone who maps the segment: states are magic
//! words (a scribbled state is not mistaken for a valid one), and a verdict
//! is validated before it is believed.
//!
//! `unsafe` here: only the `ShmSafe` impls of the two `repr(C)` atomics
//! structs.
#![allow(unsafe_code)]

use core::fmt;

use crate::shm::{Region, ResolveError, ShmSafe};
use crate::sm::fbox::Fbox;
use crate::sm::layout::{CONTROL_HEADER, CONTROL_RECORD};
use crate::sm::params::SmParams;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// "BTLSEG01", little endian.
pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"BTLSEG01");
/// Layout version of the control area and the parts (4: each part has a
/// region table after its rings).
pub const CONTROL_VERSION: u32 = 4;

/// Segment state: the creator is still writing the header.
pub const SEG_CREATING: u32 = 0;
/// Segment state: the header is complete; ranks may attach.
pub const SEG_READY: u32 = 1;

/// Rank state: not yet attached.
pub const RANK_ABSENT: u32 = 0;
/// Rank state: the rank's part (rings, fragments) is initialised; peers may
/// write to it ("REDY").
pub const RANK_READY: u32 = u32::from_le_bytes(*b"REDY");
/// Rank state: the rank finished and detached cleanly ("DONE").
pub const RANK_DONE: u32 = u32::from_le_bytes(*b"DONE");

/// The shared-memory structure a corruption was found in (what a verdict
/// names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u16)]
pub enum Structure {
    /// A slot value of a ring.
    RingSlot = 1,
    /// A ring's header or counters.
    RingHeader = 2,
    /// A fragment header.
    FragmentHeader = 3,
    /// The sequence of a sender's fragments (replayed, duplicated, lost).
    FragmentSequence = 4,
    /// Acknowledgements (forged, out of turn, for nothing in flight).
    Acknowledgement = 5,
    /// A rank's control record.
    ControlRecord = 6,
    /// A transport message inside a valid fragment (malformed header of a
    /// large message, a one-sided request, a barrier).
    MessageProtocol = 7,
    /// A fast box: a record header, or the reader's tail as its writer
    /// sees it.
    FastBox = 8,
}

impl Structure {
    /// Its name in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Self::RingSlot => "ring slot",
            Self::RingHeader => "ring header",
            Self::FragmentHeader => "fragment header",
            Self::FragmentSequence => "fragment sequence",
            Self::Acknowledgement => "acknowledgement",
            Self::ControlRecord => "control record",
            Self::MessageProtocol => "message protocol",
            Self::FastBox => "fast box",
        }
    }

    /// From its code in a verdict.
    pub const fn from_code(code: u16) -> Option<Self> {
        Some(match code {
            1 => Self::RingSlot,
            2 => Self::RingHeader,
            3 => Self::FragmentHeader,
            4 => Self::FragmentSequence,
            5 => Self::Acknowledgement,
            6 => Self::ControlRecord,
            7 => Self::MessageProtocol,
            8 => Self::FastBox,
            _ => return None,
        })
    }
}

impl fmt::Display for Structure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Top 16 bits of a verdict word.
const VERDICT_MAGIC: u64 = 0xacc5;

/// What a rank published in its record ([`RankRecord::publish`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RankInfo {
    /// Its pid.
    pub pid: u64,
    /// Its start time (clock ticks since boot).
    pub start: u64,
    /// Address (in its own address space) of its single-copy probe word.
    pub probe_addr: u64,
    /// The value at `probe_addr`.
    pub probe_value: u64,
}

/// A verdict found in our record ([`RankRecord::take_verdict`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Verdict {
    /// Rank `accuser` declared us failed: it found `structure` corrupted.
    Accused {
        /// The rank that wrote it.
        accuser: u32,
        /// What it found corrupted.
        structure: Structure,
    },
    /// The verdict word holds something no rank writes (it was scribbled
    /// on); it has been cleared.
    Garbage {
        /// The value found.
        raw: u64,
    },
}

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
    /// `fbox_size` (0: no fast boxes). Since version 2; in version 1 this
    /// word counted the ranks that had attached when segments were files.
    pub fbox_size: AtomicU32,
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
    /// `fbox_max` (the size of each rank's box pool). Since version 3.
    pub fbox_max: AtomicU32,
    /// `free_list_max` (-1 stored as `u32::MAX`). Since version 3.
    pub free_list_max: AtomicU32,
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
    /// 0, or a verdict against this rank written by a peer that declared it
    /// failed ([`Self::accuse`]).
    pub verdict: AtomicU64,
}

impl RankRecord {
    /// Publishes this rank's identity, then marks it ready (owner side,
    /// once its part is initialised). Release: pairs with the acquire in
    /// [`Self::read`], so a reader that sees the rank ready sees every
    /// field.
    pub fn publish(&self, info: &RankInfo) {
        let r = Ordering::Relaxed;
        self.pid.store(info.pid, r);
        self.start.store(info.start, r);
        self.probe_addr.store(info.probe_addr, r);
        self.probe_value.store(info.probe_value, r);
        self.verdict.store(0, r);
        self.state.store(RANK_READY, Ordering::Release);
    }

    /// The rank's state (acquire: pairs with the release of
    /// [`Self::publish`] and of the state's later change to [`RANK_DONE`]).
    pub fn state(&self) -> u32 {
        self.state.load(Ordering::Acquire)
    }

    /// What the rank published, once it is ready (or done): `None` before.
    pub fn read(&self) -> Option<RankInfo> {
        if !matches!(self.state(), RANK_READY | RANK_DONE) {
            return None;
        }
        let r = Ordering::Relaxed;
        Some(RankInfo {
            pid: self.pid.load(r),
            start: self.start.load(r),
            probe_addr: self.probe_addr.load(r),
            probe_value: self.probe_value.load(r),
        })
    }

    /// Marks the rank as having left cleanly (owner side, last).
    pub fn leave(&self) {
        // Release: pairs with the acquire of `state`.
        self.state.store(RANK_DONE, Ordering::Release);
    }

    /// Tells the rank of this record that `accuser` declared it failed for
    /// corrupting `structure`. Only one verdict waits at a time: returns
    /// false if another is there (the accuser tries again later; the rank
    /// clears each verdict it takes).
    pub fn accuse(&self, accuser: u32, structure: Structure) -> bool {
        let word = (VERDICT_MAGIC << 48) | ((structure as u64) << 32) | u64::from(accuser);
        self.verdict
            .compare_exchange(0, word, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Takes the verdict waiting in this (our own) record, if any, and
    /// clears it. `me` and `nprocs` validate it: a word naming no peer of
    /// ours, or no known structure, is [`Verdict::Garbage`].
    pub fn take_verdict(&self, me: u32, nprocs: u32) -> Option<Verdict> {
        let raw = self.verdict.load(Ordering::Relaxed);
        if raw == 0 {
            return None;
        }
        // Only clear what we read: a new verdict written meanwhile stays.
        let _ = self
            .verdict
            .compare_exchange(raw, 0, Ordering::Relaxed, Ordering::Relaxed);
        let accuser = raw as u32;
        let structure = Structure::from_code((raw >> 32) as u16);
        match structure {
            Some(structure) if raw >> 48 == VERDICT_MAGIC && accuser < nprocs && accuser != me => {
                Some(Verdict::Accused { accuser, structure })
            }
            _ => Some(Verdict::Garbage { raw }),
        }
    }
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
    /// Records reachable with [`Self::record`]: the header's `nprocs` until
    /// [`Self::fix_nprocs`] snapshots the value validated at start-up (so a
    /// scribbled header cannot hide or invent records afterwards).
    nprocs: Option<u32>,
}

/// The control area is missing or inconsistent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ControlError {
    /// The area is not inside the segment.
    #[error("segment control area: {0}")]
    Resolve(ResolveError),
    /// The creator has not finished writing the header (yet).
    #[error("segment header not written yet")]
    NotReady,
    /// Written by an incompatible version.
    #[error("segment written by control version {found}, this build speaks {CONTROL_VERSION}")]
    BadVersion {
        /// Version found.
        found: u32,
    },
    /// A field has an impossible value.
    #[error("segment header corrupted: bad {what}")]
    Corrupted {
        /// Which field.
        what: &'static str,
    },
    /// A rank index beyond the job's size.
    #[error("rank {rank} is not in this segment ({nprocs} ranks)")]
    NoSuchRank {
        /// The rank asked for.
        rank: u32,
        /// Number of ranks.
        nprocs: u32,
    },
}

wrap_from!(ControlError { Resolve(ResolveError) });

impl<'a> Control<'a> {
    /// The control area at the start of `segment` (no validation beyond
    /// bounds: see [`Self::read_params`]).
    pub fn new(segment: Region<'a>) -> Result<Self, ControlError> {
        let header = segment.resolve::<ControlHeader>(0)?;
        Ok(Self {
            region: segment,
            header,
            nprocs: None,
        })
    }

    /// From now on, [`Self::record`] serves exactly `nprocs` records,
    /// whatever the header says (call once the header is validated).
    pub fn fix_nprocs(&mut self, nprocs: u32) {
        self.nprocs = Some(nprocs);
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
        h.fbox_size.store(params.fbox_size, r);
        h.fifo_size.store(params.fifo_size, r);
        h.num_fifos.store(params.num_fifos as u32, r);
        h.lazy_free.store(params.fifo_lazy_free, r);
        h.eager_limit.store(params.eager_limit, r);
        h.max_send_size.store(params.max_send_size, r);
        h.free_list_num.store(params.free_list_num as u32, r);
        h.free_list_inc.store(params.free_list_inc as u32, r);
        h.max_procs.store(max_procs, r);
        h.fbox_max.store(params.fbox_max, r);
        h.free_list_max.store(params.free_list_max as u32, r);
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
        p.free_list_max = h.free_list_max.load(r) as i32;
        if p.free_list_max < -1 {
            return Err(ControlError::Corrupted {
                what: "free_list_max",
            });
        }
        p.fbox_max = h.fbox_max.load(r);
        if p.fbox_max > crate::sm::params::MAX_FBOX_MAX {
            return Err(ControlError::Corrupted { what: "fbox_max" });
        }
        p.fbox_size = h.fbox_size.load(r);
        if p.fbox_size != 0 && Fbox::check_size(p.fbox_size).is_err() {
            return Err(ControlError::Corrupted { what: "fbox_size" });
        }
        let nprocs = h.nprocs.load(r);
        let max_procs = h.max_procs.load(r);
        if nprocs == 0 || max_procs < nprocs {
            return Err(ControlError::Corrupted { what: "nprocs" });
        }
        Ok((p, nprocs, max_procs))
    }

    /// Rank `rank`'s record.
    pub fn record(&self, rank: u32) -> Result<&'a RankRecord, ControlError> {
        let nprocs = self
            .nprocs
            .unwrap_or_else(|| self.header.nprocs.load(Ordering::Relaxed));
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

    /// Runs `f` on a control area over 4 KiB of zeroes (and the bytes).
    fn with_control(f: impl FnOnce(Control<'_>, &dyn Fn() -> std::vec::Vec<u8>)) {
        let mut buf = vec![0u64; 4096 / 8];
        let len = buf.len() * 8;
        let ptr = core::ptr::NonNull::new(buf.as_mut_ptr().cast()).unwrap();
        // SAFETY: the buffer outlives the region and is only accessed
        // through it (and, between its calls, the snapshot below).
        let region = unsafe { Region::from_raw_parts(ptr, len) };
        let bytes = || {
            let mut b = vec![0u8; len];
            region.read_bytes(0, &mut b).unwrap();
            b
        };
        f(Control::new(region).unwrap(), &bytes);
        drop(buf);
    }

    #[test]
    fn publish_then_read_back() {
        with_control(|c, bytes| publish_then_read_back_on(c, bytes));
    }

    fn publish_then_read_back_on(c: Control<'_>, bytes: &dyn Fn() -> std::vec::Vec<u8>) {
        assert_eq!(
            c.read_params(&SmParams::default()).unwrap_err(),
            ControlError::NotReady
        );
        let mut p = SmParams::default();
        p.fifo_size = 64;
        p.num_fifos = 2;
        p.fbox_size = 1024;
        c.publish(&p, 3, 6, 1 << 20, 42, 7);
        let (q, n, m) = c.read_params(&SmParams::default()).unwrap();
        assert_eq!((q.fifo_size, q.num_fifos, n, m), (64, 2, 3, 6));
        assert_eq!(q.fbox_size, 1024, "the creator's, not the default");
        // A box size no layout has is a corrupted header.
        c.header().fbox_size.store(1000, Ordering::Relaxed);
        assert_eq!(
            c.read_params(&SmParams::default()).unwrap_err(),
            ControlError::Corrupted { what: "fbox_size" }
        );
        c.header().fbox_size.store(0, Ordering::Relaxed);
        assert_eq!(c.read_params(&SmParams::default()).unwrap().0.fbox_size, 0);
        assert!(c.record(2).is_ok());
        assert!(matches!(
            c.record(3),
            Err(ControlError::NoSuchRank { rank: 3, nprocs: 3 })
        ));
        // Fixed byte offsets.
        let bytes = bytes();
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
        // Once fixed, the record count no longer follows the header.
        let mut c = c;
        c.fix_nprocs(3);
        assert!(c.record(2).is_ok());
        assert!(c.record(3).is_err());
    }

    #[test]
    fn records_publish_read_and_take_verdicts() {
        with_control(|c, _| records_on(c));
    }

    fn records_on(mut c: Control<'_>) {
        c.fix_nprocs(3);
        let rec = c.record(1).unwrap();
        assert_eq!(rec.read(), None);
        let info = RankInfo {
            pid: 42,
            start: 7,
            probe_addr: 0x1000,
            probe_value: 9,
        };
        rec.publish(&info);
        assert_eq!(rec.read(), Some(info));
        // A scribbled state is neither ready nor done.
        rec.state.store(3, Ordering::Relaxed);
        assert_eq!(rec.read(), None);
        rec.leave();
        assert_eq!(rec.read(), Some(info));

        // Verdicts: one at a time, validated, cleared when taken.
        assert_eq!(rec.take_verdict(1, 3), None);
        assert!(rec.accuse(0, Structure::RingSlot));
        assert!(!rec.accuse(2, Structure::FragmentHeader), "one waits");
        assert_eq!(
            rec.take_verdict(1, 3),
            Some(Verdict::Accused {
                accuser: 0,
                structure: Structure::RingSlot
            })
        );
        assert_eq!(rec.take_verdict(1, 3), None);
        assert!(rec.accuse(2, Structure::FragmentHeader));
        assert_eq!(
            rec.take_verdict(1, 3),
            Some(Verdict::Accused {
                accuser: 2,
                structure: Structure::FragmentHeader
            })
        );
        for raw in [
            1u64,
            0xacc5_0001_0000_0001,
            0xacc5_0009_0000_0000,
            0xacc5_0001_0000_0005,
        ] {
            rec.verdict.store(raw, Ordering::Relaxed);
            assert_eq!(
                rec.take_verdict(1, 3),
                Some(Verdict::Garbage { raw }),
                "{raw:#x}"
            );
            assert_eq!(rec.take_verdict(1, 3), None, "cleared");
        }
        for code in 1..=8 {
            assert_eq!(Structure::from_code(code).map(|s| s as u16), Some(code));
        }
        assert_eq!(Structure::from_code(0), None);
        assert_eq!(Structure::from_code(9), None);
    }
}
