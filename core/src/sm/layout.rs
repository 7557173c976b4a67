//! Shared-segment sizing with overflow detection: how many processes the
//! segment is sized for ([`calc_sm_max_procs`]) and where everything sits
//! in it ([`segment_layout`]).
//!
//! One segment per node holds everything the `sm` transport shares:
//!
//! ```text
//! offset 0            control header: CONTROL_HEADER bytes, then one
//!                     CACHE_LINE record per rank (pid, state, part offset);
//!                     padded to PART_ALIGN
//! control_bytes       part of rank 0
//! + part_bytes        part of rank 1
//! ...                 ... one equally sized part per rank, max_procs parts
//! ```
//!
//! A rank's part holds, in this order:
//!
//! 1. its receive rings: [`fifo_map_num`]`(num_fifos, max_procs)` of them,
//!    each [`Fifo::memory_size`]`(fifo_size)` bytes rounded up to
//!    [`CACHE_LINE`];
//! 2. its **region table** ([`REGTAB_BYTES`]): the regions it registered
//!    for one-sided operations, which peers read by single copy without
//!    asking ([`SegmentLayout::regtab_offset`]; the protocol is in
//!    [`crate::sm::regtab`]);
//! 3. with fast boxes (`fbox_size` and `fbox_max` both non-zero): its
//!    **box directory**, one 64-bit word per rank (`max_procs` of them,
//!    rounded up to a cache line): word `s` is 0 until this rank hands
//!    sender `s` a box, then the box's [`ShmOffset`](crate::shm::ShmOffset)
//!    ([`SegmentLayout::fbox_dir_offset`]);
//! 4. its **box pool**: `fbox_max` boxes of [`Fbox::memory_size`]`(fbox_size)`
//!    bytes, handed out one by one to the senders that send it small
//!    messages ([`SegmentLayout::fbox_pool_offset`]; the protocol is in
//!    [`crate::sm::fbox`]);
//! 5. its **eager pool**: `eager_frags` fragments of `FRAG_HEADER +
//!    eager_limit` bytes rounded up to [`CACHE_LINE`];
//! 6. its **max-size pool**: `max_frags` fragments of `FRAG_HEADER +
//!    max_send_size` bytes rounded up to [`CACHE_LINE`];
//!
//! and is padded to [`PART_ALIGN`] (a page), so every part starts on a page
//! and every ring, box and fragment on a cache line. `FRAG_HEADER` is the
//! size of [`FragHeader`].
//!
//! # Sizing: nothing grows with N × N
//!
//! A part's size depends on `max_procs` only through its box directory
//! (8 bytes per rank); the region table and the pools are per rank,
//! whatever the number of peers:
//!
//! - `eager_frags` = `free_list_max` if set (>= 0; at least
//!   `free_list_num`), else [`EAGER_WINDOW_BUDGET`] shared among the
//!   `max_procs - 1` peers, at least [`EAGER_POOL_FACTOR`] × `free_list_num`
//!   and at most [`EAGER_POOL_MAX_FACTOR`] × `free_list_num` (by default
//!   128 for 2 or 3 ranks on the node, 85 for 4, 36 for 8, 32 from 9 on:
//!   `max_procs` is the node's rank count unless set): small
//!   messages travel by fast box, and the eager fragments carry the rest
//!   up to `eager_limit` (1–4 KiB messages, rendezvous headers, control
//!   messages). A few peers get a bandwidth window's worth each (a 4 KiB
//!   stream of 64 messages in flight ran at two thirds of the speed with
//!   32 fragments); many peers share a fixed number, so the pool does not
//!   grow with N;
//! - `max_frags` = `free_list_num + free_list_inc`, at most
//!   `free_list_max` when that is set (72 by default): the seed's free list
//!   after one growth step, the depth of the pipelined copy of large
//!   messages (measured: 8 fragments of 32 KiB give a third of the
//!   bandwidth of 72 at 1–4 MiB when single copy is not available).
//!
//! That is the part's **room**, address space only: the engine carves its
//! pools by use ([`crate::sm::engine`]: `free_list_num` fragments of each
//! at start, as many more each time a pool runs dry, up to the room), and
//! hands out boxes one at a time, and the platform reserves memory for
//! each piece just before it is first used (on Linux, `fallocate` of the
//! range; see `btl_linux::segment`). What a rank's part costs in memory is
//! therefore what it used: its rings and directory, plus the fragments it
//! had in flight at most and the boxes it handed out.
//!
//! All arithmetic is checked in `usize`: a segment that would
//! exceed `isize::MAX` bytes (on 32-bit targets, 2 GiB) is
//! [`SizeError::Overflow`] (the seed's `OMPI_ERR_VALUE_OUT_OF_BOUNDS`), never
//! a wrapped size.

use crate::params::{ParamError, ParamKey};
use crate::sm::fbox::Fbox;
use crate::sm::fifo::{fifo_map_num, Fifo};
use crate::sm::frag::FragHeader;
use crate::sm::params::{
    ParamId, SmParams, COMPONENT, MAX_FBOX_MAX, MAX_FIFO_SIZE, MIN_EAGER_LIMIT,
};
use crate::sync::CACHE_LINE;

/// Eager fragments per `free_list_num` when `free_list_max` is -1, at
/// least (module docs).
pub const EAGER_POOL_FACTOR: u32 = 4;

/// Eager fragments per `free_list_num` when `free_list_max` is -1, at most
/// (module docs).
pub const EAGER_POOL_MAX_FACTOR: u32 = 16;

/// Eager fragments a rank's peers share when `free_list_max` is -1 (module
/// docs): four bandwidth windows of 64 messages.
pub const EAGER_WINDOW_BUDGET: u32 = 256;

/// Alignment (and granularity) of each rank's part: a page.
pub const PART_ALIGN: usize = 4096;

/// Bytes of the fixed control header at offset 0 of the segment: 256 on
/// every target (the header is 96 bytes, 144 with loom's atomics; 256 is a
/// multiple of every `CACHE_LINE`, so the rank records after it stay
/// line-aligned).
pub const CONTROL_HEADER: usize = 256;

/// Bytes of the per-rank control record (pid, state, part offset).
pub const CONTROL_RECORD: usize = CACHE_LINE;

/// Bytes of a fragment header.
pub const FRAG_HEADER: usize = core::mem::size_of::<FragHeader>();

/// Bytes of each part's region table ([`crate::sm::regtab::TABLE_BYTES`],
/// a multiple of every `CACHE_LINE`).
pub const REGTAB_BYTES: usize = crate::sm::regtab::TABLE_BYTES;
const _: () = assert!(REGTAB_BYTES % CACHE_LINE == 0);

/// Why a segment could not be sized or an offset computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SizeError {
    /// The size of `what` would exceed `isize::MAX` bytes.
    #[error("shared segment too large: the size of the {what} exceeds the address space")]
    Overflow {
        /// The quantity that overflowed ("segment", "eager fragments", ...).
        what: &'static str,
    },
    /// An index is out of range.
    #[error("{what} {index} out of range (there are {limit})")]
    IndexOutOfRange {
        /// What is indexed ("rank", "ring", ...).
        what: &'static str,
        /// The index given.
        index: u32,
        /// The number of valid indices.
        limit: u32,
    },
    /// The parameters were not verified
    /// ([`Params::verify`](crate::params::Params::verify)) or
    /// `max_procs` is 0.
    #[error("sm parameters not verified: {what}")]
    InvalidParams {
        /// The rule that does not hold.
        what: &'static str,
    },
}

/// The sizes and offsets of one node's shared segment (see the module
/// documentation for the layout). All byte quantities fit in `isize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentLayout {
    /// Number of parts (ranks the segment is sized for).
    pub max_procs: u32,
    /// Receive rings per part.
    pub rings_per_rank: u32,
    /// Stride of the rings: the ring's memory size rounded up to a cache line.
    pub ring_bytes: usize,
    /// Data bytes of each fast box (0: no boxes).
    pub fbox_size: u32,
    /// Bytes of the box directory (`max_procs` words, cache-line rounded;
    /// 0 without boxes).
    pub fbox_dir_bytes: usize,
    /// Boxes in each part's pool: `fbox_max`, or 0 without boxes.
    pub fbox_pool: u32,
    /// Stride of the fast boxes ([`Fbox::memory_size`]; 0 without boxes).
    pub fbox_bytes: usize,
    /// Eager fragments per part (the eager pool's room).
    pub eager_frags: u32,
    /// Stride of the eager fragments (header + eager limit, cache-line
    /// rounded).
    pub eager_frag_bytes: usize,
    /// Max-size fragments per part (the max-size pool's room).
    pub max_frags: u32,
    /// Stride of the max-size fragments (header + max send size, cache-line
    /// rounded).
    pub max_frag_bytes: usize,
    /// Bytes before the first part: [`control_segment_size`] rounded up to
    /// [`PART_ALIGN`].
    pub control_bytes: usize,
    /// Bytes of each part (a multiple of [`PART_ALIGN`]).
    pub part_bytes: usize,
    /// Bytes of the whole segment: `control_bytes + max_procs * part_bytes`.
    pub total_bytes: usize,
}

const fn overflow(what: &'static str) -> SizeError {
    SizeError::Overflow { what }
}

/// `a * b`, or `Overflow { what }`.
fn mul(a: usize, b: u32, what: &'static str) -> Result<usize, SizeError> {
    usize::try_from(b)
        .ok()
        .and_then(|b| a.checked_mul(b))
        .ok_or(overflow(what))
}

/// `a + b`, or `Overflow { what }`.
fn add(a: usize, b: usize, what: &'static str) -> Result<usize, SizeError> {
    a.checked_add(b).ok_or(overflow(what))
}

/// `v` rounded up to a multiple of `align` (a power of two), or
/// `Overflow { what }`.
fn round_up(v: usize, align: usize, what: &'static str) -> Result<usize, SizeError> {
    debug_assert!(align.is_power_of_two());
    v.checked_add(align - 1)
        .map(|v| v & !(align - 1))
        .ok_or(overflow(what))
}

/// Fails unless `v <= isize::MAX`.
fn fits_isize(v: usize, what: &'static str) -> Result<usize, SizeError> {
    if isize::try_from(v).is_ok() {
        Ok(v)
    } else {
        Err(overflow(what))
    }
}

/// Offset of element `i` of an array of `size`-byte elements at `start`;
/// past the address space is an error.
fn element(start: usize, size: usize, i: usize) -> Result<usize, SizeError> {
    size.checked_mul(i)
        .and_then(|o| o.checked_add(start))
        .ok_or(overflow("segment"))
}

fn check_index(what: &'static str, index: u32, limit: u32) -> Result<usize, SizeError> {
    if index < limit {
        usize::try_from(index).map_err(|_| overflow(what))
    } else {
        Err(SizeError::IndexOutOfRange { what, index, limit })
    }
}

/// Size of the control header for `max_procs` ranks: [`CONTROL_HEADER`] plus
/// one [`CONTROL_RECORD`] per rank, rounded up to [`CACHE_LINE`].
pub fn control_segment_size(max_procs: u32) -> Result<usize, SizeError> {
    const WHAT: &str = "control header";
    let records = mul(CONTROL_RECORD, max_procs, WHAT)?;
    let size = round_up(add(CONTROL_HEADER, records, WHAT)?, CACHE_LINE, WHAT)?;
    fits_isize(size, WHAT)
}

/// Bytes of one fragment carrying up to `limit` bytes: header plus `limit`,
/// rounded up to a cache line.
fn frag_bytes(limit: u32, what: &'static str) -> Result<usize, SizeError> {
    let limit = usize::try_from(limit).map_err(|_| overflow(what))?;
    round_up(add(FRAG_HEADER, limit, what)?, CACHE_LINE, what)
}

/// The number of processes the shared segment is sized for, given the
/// number of processes on this node (`n_local`, counting the caller): the
/// seed's `calc_sm_max_procs`. With `max_procs` < 0 it is `n_local +
/// sm_extra_procs` if `sm_extra_procs` >= 0, else `2 * n_local`; otherwise
/// `max_procs`, which must then be >= `n_local`.
pub fn calc_sm_max_procs(params: &SmParams, n_local: u32) -> Result<u32, ParamError> {
    let overflow = |id: ParamId| ParamError::Overflow {
        component: COMPONENT,
        name: id.def().name,
        what: "the number of processes",
    };
    if n_local == 0 {
        return Err(ParamError::Argument {
            reason: "the number of local processes must be >= 1 (it counts the calling process)",
        });
    }
    let max_procs = params.max_procs;
    if max_procs < 0 {
        let extra = params.sm_extra_procs;
        if extra >= 0 {
            n_local
                .checked_add(extra.unsigned_abs())
                .ok_or(overflow(ParamId::SmExtraProcs))
        } else {
            n_local.checked_mul(2).ok_or(overflow(ParamId::MaxProcs))
        }
    } else {
        let max_procs = max_procs.unsigned_abs();
        if max_procs < n_local {
            let def = ParamId::MaxProcs.def();
            return Err(ParamError::TooSmall {
                component: COMPONENT,
                name: def.name,
                value: i64::from(max_procs),
                needed: u64::from(n_local),
                what: "processes on this node",
                accepts: def.accepts,
            });
        }
        Ok(max_procs)
    }
}

/// Computes the layout of a segment for `max_procs` ranks (the result of
/// [`calc_sm_max_procs`]) from verified parameters.
pub fn segment_layout(params: &SmParams, max_procs: u32) -> Result<SegmentLayout, SizeError> {
    let invalid = |what| Err(SizeError::InvalidParams { what });
    if max_procs == 0 {
        return invalid("max_procs must be >= 1");
    }
    if !params.fifo_size.is_power_of_two() || !(2..=MAX_FIFO_SIZE).contains(&params.fifo_size) {
        return invalid("fifo_size must be a power of two between 2 and 2^30");
    }
    let num_fifos = match u32::try_from(params.num_fifos) {
        Ok(n) if n.is_power_of_two() => n,
        _ => return invalid("num_fifos must be a power of two >= 1"),
    };
    if params.eager_limit < MIN_EAGER_LIMIT {
        return invalid("eager_limit must be >= MIN_EAGER_LIMIT");
    }
    if params.max_send_size < params.eager_limit {
        return invalid("max_send_size must be >= eager_limit");
    }
    let Ok(free_list_num) = u32::try_from(params.free_list_num) else {
        return invalid("free_list_num must be >= 0");
    };
    let free_list_inc = match u32::try_from(params.free_list_inc) {
        Ok(n) if n >= 1 => n,
        _ => return invalid("free_list_inc must be >= 1"),
    };

    // Rings.
    let rings_per_rank = fifo_map_num(num_fifos, max_procs);
    let ring_bytes = Fifo::memory_size(params.fifo_size).ok_or(overflow("ring"))?;
    let ring_bytes = round_up(ring_bytes, CACHE_LINE, "ring")?;
    let rings = mul(ring_bytes, rings_per_rank, "rings")?;

    // Fast boxes: a directory word per rank and a pool of fbox_max boxes.
    let (fbox_size, fbox_pool, fbox_bytes, fbox_dir_bytes) =
        match (params.fbox_size, params.fbox_max) {
            (0, _) | (_, 0) => (0, 0, 0, 0),
            (size, max) => match Fbox::memory_size(size) {
                Some(bytes) => {
                    if max > MAX_FBOX_MAX {
                        return invalid("fbox_max must be at most MAX_FBOX_MAX");
                    }
                    let dir = round_up(
                        mul(8, max_procs, "box directory")?,
                        CACHE_LINE,
                        "box directory",
                    )?;
                    (size, max, bytes, dir)
                }
                None => {
                    return invalid("fbox_size must be 0 or a power of two between 64 and 65536")
                }
            },
        };
    let fboxes = add(
        mul(fbox_bytes, fbox_pool, "fast boxes")?,
        fbox_dir_bytes,
        "fast boxes",
    )?;

    // The eager pool (module docs).
    let eager_frags = match u32::try_from(params.free_list_max) {
        Ok(cap) => cap.max(free_list_num),
        Err(_) => {
            let floor = free_list_num.saturating_mul(EAGER_POOL_FACTOR);
            let ceiling = free_list_num.saturating_mul(EAGER_POOL_MAX_FACTOR);
            (EAGER_WINDOW_BUDGET / (max_procs - 1).max(1)).clamp(floor, ceiling.max(floor))
        }
    }
    .max(1);
    let eager_frag_bytes = frag_bytes(params.eager_limit, "eager fragment")?;
    let eager = mul(eager_frag_bytes, eager_frags, "eager fragments")?;

    // The max-size pool: the seed's free list starts with free_list_num and
    // grows by free_list_inc up to free_list_max (-1: no limit) inside its
    // memory pool; the room here is that first growth step, capped by
    // free_list_max (module docs).
    let grown = free_list_num.saturating_add(free_list_inc);
    let max_frags = match u32::try_from(params.free_list_max) {
        Ok(cap) => grown.min(cap.max(free_list_num)),
        Err(_) => grown,
    }
    .max(1);
    let max_frag_bytes = frag_bytes(params.max_send_size, "max-size fragment")?;
    let max = mul(max_frag_bytes, max_frags, "max-size fragments")?;

    let head = add(rings, REGTAB_BYTES, "part")?;
    let part = add(add(add(head, fboxes, "part")?, eager, "part")?, max, "part")?;
    let part_bytes = fits_isize(round_up(part, PART_ALIGN, "part")?, "part")?;

    let control = control_segment_size(max_procs)?;
    let control_bytes = round_up(control, PART_ALIGN, "control header")?;

    let parts = mul(part_bytes, max_procs, "segment")?;
    let total_bytes = fits_isize(add(control_bytes, parts, "segment")?, "segment")?;

    Ok(SegmentLayout {
        max_procs,
        rings_per_rank,
        ring_bytes,
        fbox_size,
        fbox_dir_bytes,
        fbox_pool,
        fbox_bytes,
        eager_frags,
        eager_frag_bytes,
        max_frags,
        max_frag_bytes,
        control_bytes,
        part_bytes,
        total_bytes,
    })
}

impl SegmentLayout {
    /// Offset of `rank`'s part.
    pub fn part_offset(&self, rank: u32) -> Result<usize, SizeError> {
        let rank = check_index("rank", rank, self.max_procs)?;
        element(self.control_bytes, self.part_bytes, rank)
    }

    /// Offset of receive ring `ring` of `rank`.
    pub fn ring_offset(&self, rank: u32, ring: u32) -> Result<usize, SizeError> {
        let part = self.part_offset(rank)?;
        let ring = check_index("ring", ring, self.rings_per_rank)?;
        element(part, self.ring_bytes, ring)
    }

    /// Offset of `rank`'s region table ([`REGTAB_BYTES`], just after its
    /// rings).
    pub fn regtab_offset(&self, rank: u32) -> Result<usize, SizeError> {
        let part = self.part_offset(rank)?;
        let rings = usize::try_from(self.rings_per_rank).map_err(|_| overflow("segment"))?;
        element(part, self.ring_bytes, rings)
    }

    /// Offset of the word of `sender` in `receiver`'s box directory (see
    /// the module docs); an error without boxes.
    pub fn fbox_dir_offset(&self, receiver: u32, sender: u32) -> Result<usize, SizeError> {
        if self.fbox_pool == 0 {
            return Err(SizeError::IndexOutOfRange {
                what: "box directory (there are no fast boxes)",
                index: sender,
                limit: 0,
            });
        }
        let start = self.fbox_start(receiver)?;
        let s = check_index("sender", sender, self.max_procs)?;
        element(start, 8, s)
    }

    /// Offset of box `k` of `rank`'s box pool; an error without boxes.
    pub fn fbox_pool_offset(&self, rank: u32, k: u32) -> Result<usize, SizeError> {
        let start = self
            .fbox_start(rank)?
            .checked_add(self.fbox_dir_bytes)
            .ok_or(overflow("segment"))?;
        let k = check_index("fast box", k, self.fbox_pool)?;
        element(start, self.fbox_bytes, k)
    }

    /// Which box of `rank`'s pool starts at `offset` (an offset in the
    /// segment), if one does: the check a sender makes of a directory word.
    pub fn fbox_pool_index(&self, rank: u32, offset: u64) -> Option<u32> {
        let start = self.fbox_pool_offset(rank, 0).ok()? as u64;
        let rel = offset.checked_sub(start)?;
        let stride = self.fbox_bytes as u64;
        if stride == 0 || rel % stride != 0 {
            return None;
        }
        u32::try_from(rel / stride)
            .ok()
            .filter(|&k| k < self.fbox_pool)
    }

    /// Bytes at the start of each part that are used from the start and
    /// reserved with it: the rings, the region table and the box directory.
    pub fn head_bytes(&self) -> Result<usize, SizeError> {
        let rings = mul(self.ring_bytes, self.rings_per_rank, "rings")?;
        add(
            add(rings, REGTAB_BYTES, "part")?,
            self.fbox_dir_bytes,
            "part",
        )
    }

    /// Offset of eager fragment `i` of `rank`.
    pub fn eager_frag_offset(&self, rank: u32, i: u32) -> Result<usize, SizeError> {
        let start = self.eager_start(rank)?;
        let i = check_index("eager fragment", i, self.eager_frags)?;
        element(start, self.eager_frag_bytes, i)
    }

    /// Offset of max-size fragment `i` of `rank`.
    pub fn max_frag_offset(&self, rank: u32, i: u32) -> Result<usize, SizeError> {
        let eager_start = self.eager_start(rank)?;
        let eager = usize::try_from(self.eager_frags).map_err(|_| overflow("segment"))?;
        let start = element(eager_start, self.eager_frag_bytes, eager)?;
        let i = check_index("max-size fragment", i, self.max_frags)?;
        element(start, self.max_frag_bytes, i)
    }

    /// Offset of `rank`'s box directory (just after its region table; its
    /// box pool follows it).
    fn fbox_start(&self, rank: u32) -> Result<usize, SizeError> {
        self.regtab_offset(rank)?
            .checked_add(REGTAB_BYTES)
            .ok_or(overflow("segment"))
    }

    /// Offset of the first eager fragment of `rank` (just after its boxes).
    fn eager_start(&self, rank: u32) -> Result<usize, SizeError> {
        let start = self.fbox_start(rank)?;
        let boxes = usize::try_from(self.fbox_pool).map_err(|_| overflow("segment"))?;
        self.fbox_bytes
            .checked_mul(boxes)
            .and_then(|o| o.checked_add(self.fbox_dir_bytes))
            .and_then(|o| o.checked_add(start))
            .ok_or(overflow("segment"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Params;
    use std::string::ToString;

    fn verified(f: impl FnOnce(&mut SmParams)) -> SmParams {
        let mut p = SmParams::new();
        f(&mut p);
        p.verify().unwrap();
        p
    }

    #[test]
    fn default_layout_is_consistent() {
        let p = verified(|_| {});
        let n = calc_sm_max_procs(&p, 4).unwrap();
        let l = segment_layout(&p, n).unwrap();
        assert_eq!(l.max_procs, 4);
        assert_eq!(l.rings_per_rank, 1);
        // A directory line and a pool of 32 boxes of 4352 bytes.
        assert_eq!(
            (l.fbox_dir_bytes, l.fbox_pool, l.fbox_bytes),
            (CACHE_LINE.max(32), 32, 4352)
        );
        // 256 eager fragments shared by the 3 peers (at least 4 ×
        // free_list_num, at most 16 ×).
        assert_eq!(l.eager_frags, 85);
        assert_eq!(l.max_frags, 8 + 64);
        assert!(l.ring_bytes >= Fifo::memory_size(4096).unwrap());
        assert!(l.eager_frag_bytes >= FRAG_HEADER + 4096);
        assert!(l.max_frag_bytes >= FRAG_HEADER + 32768);
        for b in [
            l.ring_bytes,
            l.eager_frag_bytes,
            l.max_frag_bytes,
            l.fbox_dir_bytes,
        ] {
            assert_eq!(b % CACHE_LINE, 0);
        }
        assert!(l.control_bytes >= control_segment_size(4).unwrap());
        assert_eq!(l.control_bytes % PART_ALIGN, 0);
        assert_eq!(l.part_bytes % PART_ALIGN, 0);
        assert_eq!(l.total_bytes, l.control_bytes + 4 * l.part_bytes);
        let used = l.ring_bytes
            + REGTAB_BYTES
            + l.fbox_dir_bytes
            + 32 * l.fbox_bytes
            + 85 * l.eager_frag_bytes
            + 72 * l.max_frag_bytes;
        assert!(used <= l.part_bytes && l.part_bytes < used + PART_ALIGN);
        assert_eq!(
            l.head_bytes().unwrap(),
            l.ring_bytes + REGTAB_BYTES + l.fbox_dir_bytes
        );
        assert_eq!(
            l.regtab_offset(1).unwrap(),
            l.part_offset(1).unwrap() + l.ring_bytes
        );
    }

    #[test]
    fn pools_follow_free_list_max() {
        let mut p = SmParams::default();
        p.free_list_max = 10;
        let l = segment_layout(&p, 2).unwrap();
        assert_eq!((l.eager_frags, l.max_frags), (10, 10));
        p.free_list_max = 4; // below free_list_num: the first fragments stay
        let l = segment_layout(&p, 2).unwrap();
        assert_eq!((l.eager_frags, l.max_frags), (8, 8));
        p.free_list_max = -1;
        // One peer: a bandwidth window's worth and more (at most 16 ×
        // free_list_num); many: 4 × free_list_num.
        let l = segment_layout(&p, 2).unwrap();
        assert_eq!((l.eager_frags, l.max_frags), (128, 72));
        let l = segment_layout(&p, 4).unwrap();
        assert_eq!((l.eager_frags, l.max_frags), (85, 72));
        let l = segment_layout(&p, 64).unwrap();
        assert_eq!((l.eager_frags, l.max_frags), (32, 72));
        p.free_list_num = 0;
        let l = segment_layout(&p, 2).unwrap();
        assert_eq!((l.eager_frags, l.max_frags), (1, 64), "never an empty pool");
    }

    #[test]
    fn offsets_are_disjoint_and_increasing() {
        let p = verified(|p| {
            p.num_fifos = 2;
            p.free_list_num = 2;
            p.free_list_inc = 1;
            p.fifo_size = 64;
            p.fbox_max = 2;
        });
        let l = segment_layout(&p, 3).unwrap();
        assert_eq!(l.rings_per_rank, 2);
        let mut end = 0;
        for rank in 0..3 {
            let part = l.part_offset(rank).unwrap();
            assert_eq!(part % PART_ALIGN, 0);
            assert!(part >= end, "parts do not overlap");
            let mut regions = std::vec::Vec::new();
            for r in 0..l.rings_per_rank {
                regions.push((l.ring_offset(rank, r).unwrap(), l.ring_bytes));
            }
            regions.push((l.regtab_offset(rank).unwrap(), REGTAB_BYTES));
            regions.push((l.fbox_dir_offset(rank, 0).unwrap(), l.fbox_dir_bytes));
            for k in 0..l.fbox_pool {
                regions.push((l.fbox_pool_offset(rank, k).unwrap(), l.fbox_bytes));
            }
            for i in 0..l.eager_frags {
                regions.push((l.eager_frag_offset(rank, i).unwrap(), l.eager_frag_bytes));
            }
            for i in 0..l.max_frags {
                regions.push((l.max_frag_offset(rank, i).unwrap(), l.max_frag_bytes));
            }
            assert_eq!(regions[0].0, part);
            for w in regions.windows(2) {
                assert_eq!(w[0].0 + w[0].1, w[1].0, "regions are contiguous");
            }
            for (off, _) in &regions {
                assert_eq!(off % CACHE_LINE, 0);
            }
            let (last, len) = regions[regions.len() - 1];
            end = part + l.part_bytes;
            assert!(last + len <= end, "regions stay in the part");
            // Directory words, one per rank, inside the directory.
            for s in 0..3 {
                let w = l.fbox_dir_offset(rank, s).unwrap();
                assert_eq!(w, l.fbox_dir_offset(rank, 0).unwrap() + 8 * s as usize);
            }
            assert!(l.fbox_dir_offset(rank, 3).is_err());
            // The pool index of a box start, and of nothing else.
            for k in 0..l.fbox_pool {
                let at = l.fbox_pool_offset(rank, k).unwrap() as u64;
                assert_eq!(l.fbox_pool_index(rank, at), Some(k));
                assert_eq!(l.fbox_pool_index(rank, at + 8), None);
                assert_eq!(l.fbox_pool_index((rank + 1) % 3, at), None);
            }
            let past = l.fbox_pool_offset(rank, 1).unwrap() + l.fbox_bytes;
            assert_eq!(l.fbox_pool_index(rank, past as u64), None);
            assert!(l.fbox_pool_offset(rank, 2).is_err());
        }
        assert_eq!(end, l.total_bytes);
    }

    #[test]
    fn indices_are_range_checked() {
        let p = verified(|_| {});
        let l = segment_layout(&p, 2).unwrap();
        assert_eq!(
            l.part_offset(2),
            Err(SizeError::IndexOutOfRange {
                what: "rank",
                index: 2,
                limit: 2
            })
        );
        assert!(matches!(
            l.ring_offset(0, 1),
            Err(SizeError::IndexOutOfRange { what: "ring", .. })
        ));
        assert!(matches!(
            l.ring_offset(5, 0),
            Err(SizeError::IndexOutOfRange { what: "rank", .. })
        ));
        assert!(l.eager_frag_offset(1, l.eager_frags).is_err());
        assert!(matches!(
            l.max_frag_offset(9, 0),
            Err(SizeError::IndexOutOfRange { what: "rank", .. })
        ));
        assert!(l.max_frag_offset(1, l.max_frags).is_err());
        assert!(l.max_frag_offset(1, l.max_frags - 1).is_ok());
    }

    #[test]
    fn nonsense_layout_fields_do_not_panic() {
        let l = SegmentLayout {
            max_procs: u32::MAX,
            rings_per_rank: u32::MAX,
            ring_bytes: usize::MAX,
            fbox_size: u32::MAX,
            fbox_dir_bytes: usize::MAX,
            fbox_pool: u32::MAX,
            fbox_bytes: usize::MAX,
            eager_frags: u32::MAX,
            eager_frag_bytes: usize::MAX,
            max_frags: u32::MAX,
            max_frag_bytes: usize::MAX,
            control_bytes: usize::MAX,
            part_bytes: usize::MAX,
            total_bytes: usize::MAX,
        };
        assert!(l.part_offset(1).is_err());
        assert!(l.ring_offset(0, 1).is_err());
        assert!(l.eager_frag_offset(0, 1).is_err());
        assert!(l.max_frag_offset(0, 1).is_err());
        assert!(l.fbox_dir_offset(0, 2).is_err());
        assert!(l.fbox_pool_offset(0, 2).is_err());
        assert_eq!(l.fbox_pool_index(0, 12345), None);
        assert!(l.head_bytes().is_err());
    }

    #[test]
    fn parts_do_not_grow_with_the_number_of_ranks() {
        let with = verified(|_| {});
        let without = verified(|p| p.fbox_size = 0);
        let none = verified(|p| p.fbox_max = 0);
        let part = |p: &SmParams, n| segment_layout(p, n).unwrap().part_bytes;
        for max_procs in [1, 2, 3, 8, 32, 128, 256, 1024] {
            let l = segment_layout(&with, max_procs).unwrap();
            assert_eq!(
                (l.fbox_pool, l.fbox_bytes),
                (32, Fbox::memory_size(4096).unwrap())
            );
            assert_eq!(
                l.fbox_dir_bytes,
                (8 * max_procs as usize).next_multiple_of(CACHE_LINE)
            );
            for p in [&without, &none] {
                let l0 = segment_layout(p, max_procs).unwrap();
                assert_eq!((l0.fbox_pool, l0.fbox_bytes, l0.fbox_dir_bytes), (0, 0, 0));
                assert!(l0.fbox_dir_offset(0, 0).is_err() && l0.fbox_pool_offset(0, 0).is_err());
            }
            // The part grows by the directory's 8 bytes per rank only (the
            // eager pool shrinks from 128 fragments for one peer to 32 for
            // nine and more, then stays).
            let base = part(&with, 1) - segment_layout(&with, 1).unwrap().fbox_dir_bytes;
            assert!(l.part_bytes <= (base + l.fbox_dir_bytes).next_multiple_of(PART_ALIGN));
            assert!(part(&without, max_procs) <= part(&without, 1));
            if max_procs >= 9 {
                assert_eq!(part(&without, max_procs), part(&without, 9));
            }
            let eager = match max_procs {
                1..=3 => 128,
                8 => 36,
                _ => 32,
            };
            assert_eq!(l.eager_frags, eager, "max_procs {max_procs}");
            assert_eq!(l.max_frags, 72);
        }
        let mut bad = without;
        bad.fbox_size = 100;
        assert!(matches!(
            segment_layout(&bad, 4),
            Err(SizeError::InvalidParams { .. })
        ));
        let mut bad = with;
        bad.fbox_max = MAX_FBOX_MAX + 1;
        assert!(matches!(
            segment_layout(&bad, 4),
            Err(SizeError::InvalidParams { .. })
        ));
    }

    #[test]
    fn huge_parameters_overflow() {
        let big = verified(|p| p.fifo_size = 1 << 30);
        assert!(matches!(
            segment_layout(&big, u32::MAX),
            Err(SizeError::Overflow { .. })
        ));
        let p = verified(|_| {});
        assert!(matches!(
            segment_layout(&p, u32::MAX),
            Err(SizeError::Overflow { .. })
        ));
        let p = verified(|p| {
            p.eager_limit = u32::MAX - 1;
            p.max_send_size = u32::MAX;
            p.free_list_num = i32::MAX;
        });
        assert!(matches!(
            segment_layout(&p, 1 << 20),
            Err(SizeError::Overflow { .. })
        ));
        // Large but possible on 64-bit, impossible on 32-bit: either a
        // consistent layout or Overflow, never a wrapped size.
        let p = verified(|p| {
            p.eager_limit = u32::MAX - 1;
            p.max_send_size = u32::MAX;
        });
        match segment_layout(&p, 16) {
            Ok(l) => {
                // 16 parts of > 4 GiB each: only a 64-bit target gets here.
                assert!(l.part_bytes as u64 > u64::from(u32::MAX));
                assert_eq!(l.total_bytes, l.control_bytes + 16 * l.part_bytes);
                assert!(isize::try_from(l.total_bytes).is_ok());
            }
            Err(e) => assert!(matches!(e, SizeError::Overflow { .. }), "{e}"),
        }
        assert!(control_segment_size(u32::MAX).is_ok() || usize::BITS <= 32);
    }

    #[test]
    fn unverified_params_are_rejected() {
        let mut p = SmParams::new();
        p.fifo_size = 100;
        assert!(matches!(
            segment_layout(&p, 4),
            Err(SizeError::InvalidParams { .. })
        ));
        let mut p = SmParams::new();
        p.num_fifos = 3;
        assert!(matches!(
            segment_layout(&p, 4),
            Err(SizeError::InvalidParams { .. })
        ));
        let mut p = SmParams::new();
        p.free_list_inc = 0;
        assert!(matches!(
            segment_layout(&p, 4),
            Err(SizeError::InvalidParams { .. })
        ));
        assert!(matches!(
            segment_layout(&SmParams::new(), 0),
            Err(SizeError::InvalidParams { .. })
        ));
    }

    #[test]
    fn limits_agree_with_fifo_and_frag() {
        // Verified parameters always pass the ring's own geometry check.
        assert_eq!(
            (crate::sm::fifo::MIN_SIZE, crate::sm::fifo::MAX_SIZE),
            (2, MAX_FIFO_SIZE)
        );
        assert_eq!(FRAG_HEADER, crate::sm::frag::FRAG_HEADER_SIZE);
        // An eager fragment at the minimum limit still carries payload.
        assert!(FRAG_HEADER < MIN_EAGER_LIMIT as usize);
    }

    #[test]
    fn control_size() {
        assert_eq!(control_segment_size(0), Ok(CONTROL_HEADER));
        assert_eq!(
            control_segment_size(3),
            Ok(CONTROL_HEADER + 3 * CONTROL_RECORD)
        );
    }

    #[test]
    fn max_procs() {
        let mut p = SmParams::new();
        assert_eq!(calc_sm_max_procs(&p, 4), Ok(4));
        p.sm_extra_procs = 2;
        assert_eq!(calc_sm_max_procs(&p, 4), Ok(6));
        p.sm_extra_procs = -1;
        assert_eq!(calc_sm_max_procs(&p, 4), Ok(8));
        assert!(matches!(
            calc_sm_max_procs(&p, u32::MAX),
            Err(ParamError::Overflow {
                name: "max_procs",
                ..
            })
        ));
        p.sm_extra_procs = i32::MAX;
        assert!(matches!(
            calc_sm_max_procs(&p, u32::MAX - 1),
            Err(ParamError::Overflow {
                name: "sm_extra_procs",
                ..
            })
        ));
        p.max_procs = 16;
        assert_eq!(calc_sm_max_procs(&p, 16), Ok(16));
        let e = calc_sm_max_procs(&p, 17).unwrap_err();
        assert_eq!(
            e,
            ParamError::TooSmall {
                component: "sm",
                name: "max_procs",
                value: 16,
                needed: 17,
                what: "processes on this node",
                accepts: ParamId::MaxProcs.def().accepts,
            }
        );
        assert!(e
            .to_string()
            .starts_with("BTL_SM_MAX_PROCS=16 is less than the 17"));
        assert_eq!(
            calc_sm_max_procs(&p, 0).unwrap_err().to_string(),
            "the number of local processes must be >= 1 (it counts the calling process)"
        );
    }
}
