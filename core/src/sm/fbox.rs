//! Fast boxes: per sender→receiver byte rings for small messages, with no
//! ring operation and no acknowledgement per message (Open MPI vader's
//! "fast box" idea, re-designed for btl's checked-offset, hostile-peer
//! model).
//!
//! A box lives in the **receiver's** part of the segment and has exactly
//! one writer (the sender, [`FboxWriter`]) and one reader (the receiver,
//! [`FboxReader`]). The writer copies a message straight into the box and
//! publishes it; the reader hands the payload out in place and releases the
//! space. Nothing else travels: no FIFO slot, no fragment, no ACK. A small
//! message costs the reader one cache-line transfer (the record's header
//! shares its line with the payload), against three for the fragment path
//! (the slot, the fragment, and the ACK back to the sender).
//!
//! # Layout
//!
//! ```text
//! offset 0                CachePadded<Meta>        magic, version, size, sender, writer claim
//! offset CACHE_LINE       CachePadded<ReaderLine>  tail (written by the reader only)
//! offset 2 * CACHE_LINE   data: size / 8 words     records (written by the writer only)
//! ```
//!
//! Everything is an [`AtomicU64`]/[`AtomicU32`] from [`crate::sync`],
//! initialised in place ([`Fbox::init`]), so the box is [`ShmSafe`]
//! memory: the writer copies payload bytes with relaxed word stores, and no
//! value any process writes is ever undefined behaviour to read. The box
//! is `size` bytes of data ([`Fbox::check_size`]: a power of two from
//! [`MIN_SIZE`] to [`MAX_SIZE`]); [`Fbox::memory_size`] adds the two
//! header lines. Only the header lines and the first data word are written
//! at initialisation: the data pages are touched as messages go.
//!
//! A **record** is an 8-byte header word followed by the payload padded to
//! 8 bytes, never split across the end of the box:
//!
//! ```text
//!  63 ........ 40  39..36  35..32  31 ....... 16  15 ........ 0
//! [ seq (24 bits) ][ rsvd ][ kind ][ tag (16)     ][ len (16)    ]
//! ```
//!
//! kind `1` is a message (`tag` ≤ [`MAX_TAG`], `len` payload bytes); kind
//! `2` a wrap record (`len` and `tag` zero): the rest of the box is padding
//! and the next record is at its start. `seq` counts the box's records
//! (wrap records included) modulo 2^24. An all-zero word is the
//! **terminator**: nothing there yet. Reserved bits are zero.
//!
//! # Protocol
//!
//! Positions are monotonically increasing 64-bit byte counts (they never
//! wrap in practice), taken modulo `size` to index the data. The writer
//! keeps `head` privately; the reader keeps its `tail` privately and
//! publishes it in its line. The writer may use `[head, tail + size - 8)`:
//! it always leaves one word free, so that the word at `head` is a
//! terminator.
//!
//! - **Write** ([`FboxWriter::try_send_vectored`]): if the record does not
//!   fit before the end of the box, first a wrap record (after storing a
//!   terminator at the box's start). Then: store a terminator at the word
//!   after the record (relaxed), store the payload words (relaxed), then the
//!   header with a **Release** store, which pairs with the reader's Acquire
//!   load of the header and publishes the payload and the new terminator.
//! - **Read** ([`FboxReader::poll`]): Acquire-load the word at `tail`. A
//!   terminator: nothing new. Otherwise validate it and hand out the record
//!   in place; when the [`Record`] is dropped the reader advances `tail` and
//!   publishes it with a **Release** store, which pairs with the writer's
//!   Acquire load of `tail` and orders the reader's reads of the payload
//!   before the writer reuses its space.
//! - **Caching**: the writer caches `tail` and reloads it only when the box
//!   looks full. The reader needs no index of the writer's at all: the
//!   header word at its position *is* the publication ("head is in-band",
//!   as in vader), which is why a small message costs one cache line.
//!
//! Because every record is followed by a terminator stored before the
//! record is published, the reader never looks at stale bytes from the
//! previous lap (or at an old payload that happens to look like a header):
//! under an honest writer, every non-zero word it reads at its position is
//! the next record. The sequence number then checks exactly that.
//!
//! # Validation: what a peer can write, and what is checked
//!
//! The reader trusts nothing the writer's side of the box holds, and the
//! writer trusts nothing of the reader's line. Geometry (size, sender) is
//! read once, at [`Fbox::init`] / [`FboxWriter::attach`], and kept in the
//! handle, so a peer rewriting the meta line later changes nothing.
//!
//! - Each record header ([`FboxReader::poll`]): reserved bits zero, kind a
//!   message or a wrap, tag at most [`MAX_TAG`], sequence number the next
//!   expected one, length at most [`Fbox::max_payload`], the record inside
//!   the box (it may not cross the end), a wrap record with zero length and
//!   tag and not at the box's start (that would skip a whole box).
//! - The reader's tail as the writer sees it: 8-byte aligned, never behind
//!   the value seen before, never beyond the writer's own head (the writer's
//!   private copy, not anything in shared memory).
//! - Since the reader never reads a writer index, there is no "head moved
//!   backwards" or "head more than a box ahead of the tail" to check: the
//!   in-band header takes the head's place, and the sequence number catches
//!   a record from the past or the future, the length and position checks a
//!   record reaching outside the box.
//!
//! Every failure is a typed [`Corruption`], never a panic, and it is
//! **final**: once a handle has found its box corrupt it returns the same
//! error from then on (issue 12: detected corruption ends the conversation;
//! the adapter fails that peer). The reader never hands out bytes outside
//! the box's data area, whatever the writer wrote.
//!
//! Payload bytes are data, not structure: another process that scribbles
//! on a payload the reader holds can change the bytes under it (outside
//! what Rust's memory model covers, as [`crate::shm`] says of every plain
//! copy), so a consumer that makes memory-safety decisions on payload bytes
//! should copy them first ([`Payload::copy_to`]).
//!
//! # One writer, one reader
//!
//! [`Fbox::init`] (the receiver, in place, before publishing the box)
//! returns the one [`FboxReader`]; [`FboxWriter::attach`] claims the box's
//! one writer with a compare-and-swap on the meta line, and the claim is
//! never released: a box has one writer for its whole life (the writer's
//! head is private, so no second writer could resume it). The in-place
//! view of a payload ([`Payload::as_bytes`]) relies on this: the one writer
//! never writes the words of a record the reader still holds, because the
//! reader publishes a tail past them only when the [`Record`] is dropped.
//!
//! # Order with the ring: the hand-off rule
//!
//! When a box is full (or a message too large for it) the adapter sends by
//! the FIFO and fragments instead, and order per peer must survive across
//! the two paths. btl's rule, enforced on both sides:
//!
//! 1. **Sender**: once a message to peer P went by the ring, nothing goes
//!    by P's box until every ring message to P is acknowledged. The writer
//!    enforces it: [`FboxWriter::try_send_vectored`] takes the number of
//!    ring messages to P not yet acknowledged (the engine's
//!    `in_flight_to(P)` plus what the adapter still queues for P) and
//!    refuses with [`SendError::RingBusy`] unless it is zero.
//! 2. **Receiver**: before it dispatches a ring SEND from P, it drains P's
//!    box ([`FboxReader::drain`]).
//!
//! Why this keeps order. Box → ring: the records written before a ring
//! message m were published (Release) before m's slot was pushed (Release,
//! program order); the receiver's Acquire load of m's slot makes them
//! visible, so the drain delivers all of them before m. No record written
//! after m can be in the box during the drain: rule 1 forbids box writes
//! while m is unacknowledged, and m's ACK is pushed only after m was
//! handled. Ring → box: a box message written after m is written after m's
//! ACK came back, i.e. after m was handled. Ring → ring is the FIFO's own
//! per-writer order (and the engine's pending queue's).
//!
//! The alternative — a per-peer sequence number in both box records and
//! fragments, with the receiver merging the two streams — would let the box
//! be used again sooner, but needs a new field in every fragment, a merge
//! in the receiver's hot path, and sequence comparisons across paths that a
//! hostile peer could desynchronise. The rule above needs no new field and
//! no state at the receiver; its cost is that after a box-full event the
//! ring carries P's messages until its ACKs are back (microseconds), which
//! is the fragment path's speed, not a stall. The box's own sequence
//! number stays internal to the box.
//!
//! [`FboxReader::drain`] is bounded: an honest box holds at most `size / 8`
//! records, and while the drain runs the honest writer adds none (rule 1),
//! so a drain that finds more ([`Corruption::DrainOverrun`]) has found a
//! writer breaking the rule, not a reason to loop for ever.
//!
//! # Sizing
//!
//! - Box size: [`DEFAULT_SIZE`] (4 KiB, as vader's `fbox_size`), any power
//!   of two in [`MIN_SIZE`]..=[`MAX_SIZE`] (64 B–64 KiB). 4 KiB holds 255
//!   8-byte messages before the reader must catch up, and keeps boxes cheap
//!   enough to give one to every peer a rank actually talks to on a
//!   128-core node (bounded by the count below).
//! - Largest record: a quarter of the box ([`Fbox::max_payload`]: 1016
//!   payload bytes at 4 KiB), vader's rule: a full-size record never needs
//!   more than half the box even with a wrap, so the box still takes small
//!   messages while a large one waits, and messages above that go by
//!   fragments, whose single copy the box could not beat anyway.
//! - Parameters (registered in [`crate::sm::params`]): `fbox_size` (0
//!   disables the boxes; its verify rule calls [`Fbox::check_size`]),
//!   `fbox_threshold` and `fbox_max` (vader's names and defaults: a box
//!   after 16 small messages from a sender, at most 32 boxes per receiver).
//!
//! # Hand-out: boxes only for peers actually talked to
//!
//! The structure is self-contained (meta, tail and data in one block at
//! any [`Fbox::ALIGN`]-aligned offset of the receiver's part), so it lives
//! in memory the receiver hands out on demand. The protocol
//! (`crate::sm::engine`), receiver-driven so that a receiver's memory is
//! bounded by its own `fbox_max`, whatever its senders do:
//!
//! 1. Each rank's part has a **box pool** (`fbox_max` boxes of
//!    [`Fbox::memory_size`] bytes; only address space until used) and a
//!    **box directory**: one 64-bit word per local rank, 0 meaning "no
//!    box" ([`crate::sm::layout`]).
//! 2. The receiver counts the small ring messages each sender sends it;
//!    after `fbox_threshold` of them, while its pool has boxes left, it
//!    reserves the next box's memory, initialises it for that sender
//!    ([`Fbox::init`] with `sender`; the magic is stored last, with
//!    Release), starts polling it, and stores the box's
//!    [`crate::shm::ShmOffset`] in the sender's directory word with a
//!    Release store.
//! 3. A sender without a box reads its word in the receiver's directory
//!    (one Acquire load of a read-mostly line, at each small send while it
//!    has no box). Once non-zero it checks the offset names the receiver
//!    and the start of a box of its pool, then attaches
//!    ([`FboxWriter::attach`]: magic, version, size, `sender` equal to
//!    itself, writer not yet claimed, tail still 0). A word or box that
//!    fails these checks is [`Corruption::BadOffer`] of that peer. The word
//!    is not read again once it was non-zero.
//! 4. From its first box message on, the hand-off rule above applies; the
//!    box is never taken back while both ranks live, and a failed peer's
//!    box is not reused.
//!
//! Another process can write a directory word too (shared memory cannot
//! say who wrote a value): a forged offer that passes the checks can only
//! name a box initialised for this sender in the receiver's pool, which
//! the receiver may not poll — messages lost, as with any scribbled ring
//! slot; the checks make every other forgery a detected, reported
//! failure.
#![allow(unsafe_code)]

use core::fmt;
use core::mem::{offset_of, size_of};

use crate::shm::{Region, ResolveError, ShmSafe};
use crate::sync::{AtomicU32, AtomicU64, CachePadded, Ordering, CACHE_LINE};

/// Smallest box (data bytes).
pub const MIN_SIZE: u32 = 64;
/// Largest box (data bytes).
pub const MAX_SIZE: u32 = 64 * 1024;
/// Default box size (data bytes), vader's `fbox_size`.
pub const DEFAULT_SIZE: u32 = 4096;
/// Records (and so their headers and payloads) are aligned to this.
pub const RECORD_ALIGN: u32 = 8;
/// Bytes of a record header.
pub const RECORD_HEADER: u32 = 8;
/// Largest tag a record may carry (tags are 8-bit; the header's field has
/// 16 bits, as vader's, and larger values are refused).
pub const MAX_TAG: u32 = u8::MAX as u32;
/// Sequence numbers of records count modulo `SEQ_MASK + 1` (24 bits).
pub const SEQ_MASK: u32 = (1 << 24) - 1;

/// "BTLB" — marks an initialised box.
const MAGIC: u32 = 0x4254_4c42;
/// Layout version of the box.
const VERSION: u32 = 1;

const LEN_MASK: u64 = 0xffff;
const TAG_SHIFT: u32 = 16;
const TAG_MASK: u64 = 0xffff;
const KIND_SHIFT: u32 = 32;
const KIND_MASK: u64 = 0xf;
const RESERVED_MASK: u64 = 0xf << 36;
const SEQ_SHIFT: u32 = 40;
const KIND_MSG: u64 = 1;
const KIND_WRAP: u64 = 2;
/// The terminator: no record here yet.
const EMPTY: u64 = 0;

// The in-place payload view reads the data words as bytes: that needs the
// shim's AtomicU64 to be a plain 8-byte integer in memory (portable-atomic
// guarantees u64's size and bit validity; loom's atomics are not, and the
// view does not exist under loom).
#[cfg(not(loom))]
const _: () = assert!(size_of::<AtomicU64>() == 8);

/// Written at initialisation, read once by each handle; afterwards only the
/// writer claim changes (once).
#[repr(C)]
struct Meta {
    magic: AtomicU32,
    version: AtomicU32,
    size: AtomicU32,
    sender: AtomicU32,
    writer: AtomicU32,
    /// Claimed by [`Fbox::claim_reader`] (not by [`Fbox::init`], whose
    /// reader is exclusive by its contract).
    reader: AtomicU32,
}

/// The reader's line: how far it has consumed.
#[repr(C)]
struct ReaderLine {
    tail: AtomicU64,
}

/// The box's header in shared memory; the data words follow it.
#[repr(C)]
struct FboxHeader {
    meta: CachePadded<Meta>,
    reader: CachePadded<ReaderLine>,
}

// SAFETY: repr(C) aggregates of integer atomics and padding: no pointers, no
// Drop, every bit pattern valid, all mutation atomic.
unsafe impl ShmSafe for Meta {}
// SAFETY: as above.
unsafe impl ShmSafe for ReaderLine {}
// SAFETY: as above (CachePadded adds only padding).
unsafe impl ShmSafe for FboxHeader {}

/// A box could not be initialised or attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum FboxError {
    /// The size is not a power of two in [`MIN_SIZE`]..=[`MAX_SIZE`].
    #[error("fast box size {size} is not a power of two between {MIN_SIZE} and {MAX_SIZE}")]
    InvalidSize {
        /// The size found or asked for.
        size: u32,
    },
    /// The box's memory is not inside the region or not aligned.
    #[error("fast box memory: {0}")]
    Resolve(ResolveError),
    /// No initialised box at this offset.
    #[error("no initialised fast box here (magic {found:#010x})")]
    BadMagic {
        /// The magic found.
        found: u32,
    },
    /// The box was laid out by an incompatible version.
    #[error("fast box layout version {found}, expected {VERSION}")]
    BadVersion {
        /// The version found.
        found: u32,
    },
    /// The box was initialised for another sender.
    #[error("fast box is for sender {found}, not for sender {expected}")]
    WrongSender {
        /// The sender attaching.
        expected: u32,
        /// The sender the box names.
        found: u32,
    },
    /// The box already has its writer (a box has one for its whole life).
    #[error("the fast box already has its writer")]
    WriterClaimed,
    /// The box's reader was claimed already.
    #[error("the fast box already has its reader")]
    ReaderClaimed,
    /// The reader's tail is not at the start: the box was used already.
    #[error("fast box was used already (reader at byte {tail})")]
    NotFresh {
        /// The tail found.
        tail: u64,
    },
}

wrap_from!(FboxError { Resolve(ResolveError) });

/// A box was found corrupt. Final: the handle that found it returns it from
/// then on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Corruption {
    /// A record header has reserved bits set.
    #[error("fast box record at byte {pos}: header {word:#018x} has reserved bits set")]
    ReservedBits {
        /// Byte offset of the record in the box's data.
        pos: u32,
        /// The header word.
        word: u64,
    },
    /// A record header has an unknown kind.
    #[error("fast box record at byte {pos}: unknown kind {kind}")]
    BadKind {
        /// Byte offset of the record.
        pos: u32,
        /// The kind found.
        kind: u8,
    },
    /// A message's tag exceeds [`MAX_TAG`].
    #[error("fast box record at byte {pos}: tag {tag} exceeds {MAX_TAG}")]
    BadTag {
        /// Byte offset of the record.
        pos: u32,
        /// The tag found.
        tag: u32,
    },
    /// A record's sequence number is not the next one.
    #[error("fast box record at byte {pos}: sequence number {found}, expected {expected}")]
    Sequence {
        /// Byte offset of the record.
        pos: u32,
        /// The sequence number expected.
        expected: u32,
        /// The one found.
        found: u32,
    },
    /// A message is longer than a box record may be.
    #[error("fast box record at byte {pos}: length {len} exceeds the box's limit {max}")]
    TooLong {
        /// Byte offset of the record.
        pos: u32,
        /// The length found.
        len: u32,
        /// The largest payload of this box.
        max: u32,
    },
    /// A message would reach past the end of the box.
    #[error(
        "fast box record at byte {pos}: length {len} reaches past the end of the {size}-byte box"
    )]
    CrossesEnd {
        /// Byte offset of the record.
        pos: u32,
        /// The length found.
        len: u32,
        /// The box's size.
        size: u32,
    },
    /// A wrap record with non-zero length or tag, or at the box's start.
    #[error("fast box record at byte {pos}: invalid wrap record {word:#018x}")]
    BadWrap {
        /// Byte offset of the record.
        pos: u32,
        /// The header word.
        word: u64,
    },
    /// A drain found more records than the box can hold: the writer kept
    /// writing while it had to send by the ring (the hand-off rule).
    #[error("fast box still had records after draining {records}: its writer used it while ring messages were unacknowledged")]
    DrainOverrun {
        /// Records drained before giving up.
        records: u32,
    },
    /// The reader's tail is not 8-byte aligned.
    #[error("fast box reader's tail {tail} is not 8-byte aligned")]
    TailMisaligned {
        /// The tail found.
        tail: u64,
    },
    /// The reader's tail went backwards.
    #[error("fast box reader's tail went back from {previous} to {tail}")]
    TailBackwards {
        /// The tail found.
        tail: u64,
        /// The tail seen before.
        previous: u64,
    },
    /// The reader's tail is beyond what the writer has written.
    #[error("fast box reader's tail {tail} is beyond the writer's head {head}")]
    TailBeyondHead {
        /// The tail found.
        tail: u64,
        /// The writer's head.
        head: u64,
    },
    /// The receiver's box directory offers a box that is not one: the word
    /// names another rank or no box of the receiver's pool, or the box it
    /// names cannot be attached (not initialised for us, claimed already,
    /// used already).
    #[error("box directory word {word:#018x} does not offer a fresh box of the receiver's pool")]
    BadOffer {
        /// The directory word.
        word: u64,
    },
}

/// A message did not go into the box; nothing was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SendError {
    /// Not enough room until the reader catches up: send by the ring.
    #[error("fast box full")]
    Full,
    /// Longer than a box record may be: send by the ring.
    #[error("payload of {len} bytes exceeds the fast box limit of {max}")]
    TooLarge {
        /// Payload bytes given.
        len: usize,
        /// The largest payload of this box.
        max: u32,
    },
    /// Ring messages to this peer are not all acknowledged yet (the
    /// hand-off rule): send by the ring.
    #[error("{in_flight} ring messages to this peer are unacknowledged; the fast box must wait")]
    RingBusy {
        /// Ring messages in flight, as the caller said.
        in_flight: u32,
    },
    /// The box was found corrupt (now or before): fail the peer.
    #[error(transparent)]
    Corrupt(Corruption),
}

/// Geometry and initialisation of boxes (no instances: the handles are
/// [`FboxReader`] and [`FboxWriter`]).
#[derive(Debug)]
pub struct Fbox {
    _private: (),
}

impl Fbox {
    /// Alignment a box's offset must have (segments are page aligned).
    pub const ALIGN: usize = CACHE_LINE;
    /// Byte offset of the reader's tail (an [`AtomicU64`]) from the box's
    /// start.
    pub const TAIL_OFFSET: usize = offset_of!(FboxHeader, reader);
    /// Byte offset of the data words from the box's start.
    pub const DATA_OFFSET: usize = size_of::<FboxHeader>();
    /// Bytes of memory one data word takes (8, except under loom).
    pub const WORD_BYTES: usize = size_of::<AtomicU64>();

    /// Whether `size` is a box size: a power of two in
    /// [`MIN_SIZE`]..=[`MAX_SIZE`].
    pub const fn check_size(size: u32) -> Result<(), FboxError> {
        if size < MIN_SIZE || size > MAX_SIZE || !size.is_power_of_two() {
            return Err(FboxError::InvalidSize { size });
        }
        Ok(())
    }

    /// Bytes of memory a box of `size` data bytes occupies (header lines +
    /// data, a multiple of [`Self::ALIGN`]); `None` if `size` is not a box
    /// size.
    pub const fn memory_size(size: u32) -> Option<usize> {
        if Self::check_size(size).is_err() {
            return None;
        }
        // size <= 64 KiB: no overflow.
        let bytes = Self::DATA_OFFSET + (size as usize / 8) * Self::WORD_BYTES;
        Some(bytes.next_multiple_of(Self::ALIGN))
    }

    /// Largest payload a box of `size` takes: a record is at most a quarter
    /// of the box.
    pub const fn max_payload(size: u32) -> u32 {
        (size / 4).saturating_sub(RECORD_HEADER)
    }

    /// Bytes a record with `len` payload bytes occupies in a box
    /// (saturating at `u32::MAX` for lengths no box takes).
    pub const fn record_size(len: u32) -> u32 {
        match len.checked_next_multiple_of(RECORD_ALIGN) {
            Some(padded) => padded.saturating_add(RECORD_HEADER),
            None => u32::MAX,
        }
    }

    /// Initialises a box of `size` data bytes for `sender` at `offset` in
    /// `region` (the receiver's part) and returns its one reader.
    ///
    /// # Safety
    ///
    /// Nothing else may access `[offset, offset + memory_size(size))` while
    /// this runs (a box is initialised before its offset is published), and
    /// while the returned reader lives no other reader of this box may
    /// exist (in particular none from [`Fbox::claim_reader`]) and the memory may be written only through its [`FboxWriter`]
    /// (within this address space; other processes are the protocol's
    /// business).
    pub unsafe fn init<'a>(
        region: &Region<'a>,
        offset: u64,
        size: u32,
        sender: u32,
    ) -> Result<FboxReader<'a>, FboxError> {
        let bytes = Self::memory_size(size).ok_or(FboxError::InvalidSize { size })?;
        // Check the whole box fits before writing anything.
        region.subregion(offset, bytes)?;
        let u32_ = |v: u32| AtomicU32::new(v);
        let header = FboxHeader {
            meta: CachePadded(Meta {
                magic: u32_(0),
                version: u32_(VERSION),
                size: u32_(size),
                sender: u32_(sender),
                writer: u32_(0),
                reader: u32_(0),
            }),
            reader: CachePadded(ReaderLine {
                tail: AtomicU64::new(0),
            }),
        };
        // SAFETY: exclusive access to the box's bytes (caller's contract).
        let header = unsafe { region.write_in_place(offset, header)? };
        let data_at = offset + Self::DATA_OFFSET as u64;
        // The first word is the terminator at position 0. Under loom every
        // word must be a loom object, so all are initialised; otherwise the
        // rest stay untouched: the reader only ever reads words the writer
        // stored first (module docs), so their old bytes never matter.
        let init_words = if cfg!(loom) { size as u64 / 8 } else { 1 };
        for i in 0..init_words {
            // SAFETY: as above; `i < size / 8`, inside the checked range.
            unsafe {
                region
                    .write_in_place(data_at + i * Self::WORD_BYTES as u64, AtomicU64::new(EMPTY))?
            };
        }
        let data: &'a [AtomicU64] = region.resolve_slice(data_at, size as usize / 8)?;
        // Release: pairs with the Acquire load of the magic in `attach`, so a
        // writer that sees the magic sees the initialised meta, tail and
        // terminator.
        header.meta.magic.store(MAGIC, Ordering::Release);
        Ok(FboxReader {
            mem: BoxMem { header, data, size },
            sender,
            tail: 0,
            seq: 0,
            failed: None,
        })
    }
}

impl Fbox {
    /// Claims the one reader of the box at `offset` of `region`, which
    /// this process initialised earlier ([`Fbox::init`], whose reader it
    /// dropped unused) for `size` and `sender`: a receiver initialises its
    /// boxes before it publishes its part, and takes their readers once its
    /// engine is built. Checks that the box still says what it was
    /// initialised with and that nothing was consumed yet, and claims the
    /// reader with a compare-and-swap on the meta line (once for the box's
    /// life, as the writer). The reader starts at the box's beginning.
    pub fn claim_reader<'a>(
        region: &Region<'a>,
        offset: u64,
        size: u32,
        sender: u32,
    ) -> Result<FboxReader<'a>, FboxError> {
        let mem = claim_fresh(
            region,
            offset,
            sender,
            |m| &m.reader,
            FboxError::ReaderClaimed,
        )?;
        if mem.size != size {
            return Err(FboxError::InvalidSize { size: mem.size });
        }
        Ok(FboxReader {
            mem,
            sender,
            tail: 0,
            seq: 0,
            failed: None,
        })
    }
}

/// The box's shared memory, and the only code that touches it: every load
/// and store of the box goes through these few methods.
#[derive(Clone, Copy)]
struct BoxMem<'a> {
    header: &'a FboxHeader,
    /// `size / 8` words.
    data: &'a [AtomicU64],
    size: u32,
}

impl<'a> BoxMem<'a> {
    /// The word at byte position `pos` (taken modulo the box size).
    #[inline]
    fn word(&self, pos: u64) -> Option<&'a AtomicU64> {
        let i = ((pos & u64::from(self.size - 1)) >> 3) as usize;
        debug_assert!(i < self.data.len());
        // `data.len() == size / 8`, so this is always Some.
        self.data.get(i)
    }

    #[inline]
    fn load(&self, pos: u64, order: Ordering) -> u64 {
        self.word(pos).map_or(EMPTY, |w| w.load(order))
    }

    #[inline]
    fn store(&self, pos: u64, value: u64, order: Ordering) {
        if let Some(w) = self.word(pos) {
            w.store(value, order);
        }
    }

    #[inline]
    fn tail(&self) -> &'a AtomicU64 {
        &self.header.reader.tail
    }

    /// Stores the concatenation of `parts` into `out` (its words, in
    /// order; `out` holds exactly the payload rounded up to words), the
    /// last word padded with zeros. Relaxed: published by the header's
    /// Release store.
    ///
    /// Each word is assembled in a register from 8-byte loads of the
    /// pieces (shifted together where a piece ends inside a word) and
    /// stored once. (An earlier version gathered small payloads on the
    /// stack first: its 8-byte loads of bytes just stored in overlapping
    /// pieces missed the store-to-load forwarding, which `perf` showed as
    /// the one hot spot of a send, and the stack copy cost more
    /// instructions than it saved: 1048 against 1038 per C ping-pong round
    /// trip in `scripts/capi-bench.sh --callgrind`, 8 B messages 5 % slower
    /// in `btl bench` bandwidth.)
    #[inline(always)]
    fn write_words(out: &[AtomicU64], parts: &[&[u8]]) {
        let mut slots = out.iter();
        // Bytes in order in memory: `v` holds byte i at bits 8i.
        macro_rules! put {
            ($v:expr) => {
                if let Some(w) = slots.next() {
                    w.store(($v).to_le(), Ordering::Relaxed);
                }
            };
        }
        // `fill` bytes (0..8) not yet stored, in the low bytes of `acc`.
        let (mut acc, mut fill) = (0u64, 0u32);
        for &part in parts {
            let mut p = part;
            while let Some((c, rest)) = p.split_first_chunk::<8>() {
                let v = u64::from_le_bytes(*c);
                if fill == 0 {
                    put!(v);
                } else {
                    put!(acc | v << (8 * fill));
                    acc = v >> (64 - 8 * fill);
                }
                p = rest;
            }
            if p.is_empty() {
                continue;
            }
            let v = le_bytes_below_8(p);
            acc |= v << (8 * fill);
            let n = fill + p.len() as u32;
            if n >= 8 {
                put!(acc);
                // `fill` > 0 here (a remainder is below 8 bytes): the bytes
                // of `v` that did not fit, zero when none is left.
                acc = v >> (8 * (8 - fill));
                fill = n - 8;
            } else {
                fill = n;
            }
        }
        if fill > 0 {
            put!(acc);
        }
    }

    /// The payload of `len` bytes starting at data byte `at` (8-aligned,
    /// inside the box: checked by the caller).
    #[inline]
    fn payload(&self, at: u64, len: u32) -> Option<Payload<'a>> {
        let first = (at >> 3) as usize;
        let words = (len as usize).div_ceil(8);
        let words = self.data.get(first..first.checked_add(words)?)?;
        Some(Payload {
            words,
            len: len as usize,
        })
    }
}

/// Reads the geometry a peer initialised, once.
fn attach_mem<'a>(region: &Region<'a>, offset: u64) -> Result<(BoxMem<'a>, u32), FboxError> {
    let header: &'a FboxHeader = region.resolve(offset)?;
    // Acquire: pairs with the Release store of the magic in `Fbox::init`.
    let magic = header.meta.magic.load(Ordering::Acquire);
    if magic != MAGIC {
        return Err(FboxError::BadMagic { found: magic });
    }
    let version = header.meta.version.load(Ordering::Relaxed);
    if version != VERSION {
        return Err(FboxError::BadVersion { found: version });
    }
    let size = header.meta.size.load(Ordering::Relaxed);
    Fbox::check_size(size)?;
    let data_at = offset
        .checked_add(Fbox::DATA_OFFSET as u64)
        .ok_or(FboxError::InvalidSize { size })?;
    let data: &'a [AtomicU64] = region.resolve_slice(data_at, size as usize / 8)?;
    let sender = header.meta.sender.load(Ordering::Relaxed);
    Ok((BoxMem { header, data, size }, sender))
}

/// Attaches to the box at `offset` for `sender`, checks it is fresh and
/// claims one of its two sides (the claim word `side` picks; `claimed` if
/// taken): what [`FboxWriter::attach`] and [`Fbox::claim_reader`] share.
fn claim_fresh<'a>(
    region: &Region<'a>,
    offset: u64,
    sender: u32,
    side: fn(&Meta) -> &AtomicU32,
    claimed: FboxError,
) -> Result<BoxMem<'a>, FboxError> {
    let (mem, found) = attach_mem(region, offset)?;
    if found != sender {
        return Err(FboxError::WrongSender {
            expected: sender,
            found,
        });
    }
    // Acquire: pairs with the Release of the magic (already acquired in
    // `attach_mem`) — the claim only has to be exclusive.
    if side(&mem.header.meta)
        .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return Err(claimed);
    }
    // Acquire: pairs with the reader's Release stores of its tail.
    let tail = mem.tail().load(Ordering::Acquire);
    if tail != 0 {
        return Err(FboxError::NotFresh { tail });
    }
    Ok(mem)
}

/// The sender's handle on a peer's box. `Send`; one per box, for the box's
/// whole life.
pub struct FboxWriter<'a> {
    mem: BoxMem<'a>,
    /// Next byte position to write (private: never read back from shared
    /// memory).
    head: u64,
    /// The reader's tail as last loaded (validated).
    cached_tail: u64,
    /// Sequence number of the next record.
    seq: u32,
    failed: Option<Corruption>,
}

impl fmt::Debug for FboxWriter<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FboxWriter")
            .field("size", &self.mem.size)
            .field("head", &self.head)
            .field("cached_tail", &self.cached_tail)
            .field("failed", &self.failed)
            .finish()
    }
}

impl<'a> FboxWriter<'a> {
    /// Attaches to the box at `offset` of `region` (the receiver's part) as
    /// its writer, `sender` being our own local rank: validates the magic,
    /// version, size and sender the receiver wrote, that the box is fresh,
    /// and claims its one writer.
    pub fn attach(region: &Region<'a>, offset: u64, sender: u32) -> Result<Self, FboxError> {
        let mem = claim_fresh(
            region,
            offset,
            sender,
            |m| &m.writer,
            FboxError::WriterClaimed,
        )?;
        Ok(Self {
            mem,
            head: 0,
            cached_tail: 0,
            seq: 0,
            failed: None,
        })
    }

    /// The box's size in data bytes.
    pub fn size(&self) -> u32 {
        self.mem.size
    }

    /// Largest payload this box takes.
    pub fn max_payload(&self) -> u32 {
        Fbox::max_payload(self.mem.size)
    }

    /// Bytes written over the box's life (the writer's head).
    pub fn position(&self) -> u64 {
        self.head
    }

    /// The corruption this writer found, if any (final).
    pub fn failure(&self) -> Option<Corruption> {
        self.failed
    }

    /// Sends one message: see [`Self::try_send_vectored`].
    #[inline]
    pub fn try_send(
        &mut self,
        tag: u8,
        payload: &[u8],
        ring_in_flight: u32,
    ) -> Result<(), SendError> {
        self.try_send_vectored(tag, &[payload], ring_in_flight)
    }

    /// Sends one message made of the concatenation of `parts` (a header
    /// and a payload, say) with `tag`, copied straight into the box.
    ///
    /// `ring_in_flight` is the number of messages to this peer sent by the
    /// ring and not yet acknowledged (including those still queued to go
    /// by the ring); the box is used only when it is zero (the hand-off
    /// rule, module docs). Never blocks; on any error nothing was written
    /// and the message should go by the ring (or, on
    /// [`SendError::Corrupt`], the peer be failed).
    pub fn try_send_vectored(
        &mut self,
        tag: u8,
        parts: &[&[u8]],
        ring_in_flight: u32,
    ) -> Result<(), SendError> {
        self.send_inline(tag, parts, ring_in_flight)
    }

    /// [`Self::try_send_vectored`], inline into the caller: where the
    /// number of pieces is known there (a header and a payload), the write
    /// is compiled for that many.
    #[inline(always)]
    pub fn send_inline(
        &mut self,
        tag: u8,
        parts: &[&[u8]],
        ring_in_flight: u32,
    ) -> Result<(), SendError> {
        if let Some(c) = self.failed {
            return Err(SendError::Corrupt(c));
        }
        let max = self.max_payload();
        let len = parts
            .iter()
            .try_fold(0usize, |acc, p| acc.checked_add(p.len()))
            .unwrap_or(usize::MAX);
        let len32 = match u32::try_from(len) {
            Ok(l) if l <= max => l,
            _ => return Err(SendError::TooLarge { len, max }),
        };
        if ring_in_flight != 0 {
            return Err(SendError::RingBusy {
                in_flight: ring_in_flight,
            });
        }
        let size = u64::from(self.mem.size);
        let rec = u64::from(Fbox::record_size(len32));
        if (self.head & (size - 1)) + rec > size {
            // Not before the box's end: a wrap record first.
            self.wrap(rec)?;
        } else if self.head + rec + 8 - self.cached_tail > size {
            // The record and the word after it for the terminator.
            let tail = self.load_tail()?;
            if self.head + rec + 8 - tail > size {
                return Err(SendError::Full);
            }
        }
        // The record's words, found once: [pos, pos + rec) lies inside the
        // box (checked above), `data` is `size / 8` words.
        let first = ((self.head & (size - 1)) >> 3) as usize;
        let data = self.mem.data;
        let words = (rec >> 3) as usize;
        // Terminator first (free space: counted above), at the box's start
        // when the record ends the box.
        if let Some(w) = data.get(first + words).or_else(|| data.first()) {
            w.store(EMPTY, Ordering::Relaxed);
        }
        if let Some((header, body)) = data.get(first..first + words).and_then(<[_]>::split_first) {
            BoxMem::write_words(body, parts);
            // Release: pairs with the reader's Acquire load of the header
            // in `poll`, publishing the payload and the terminator stored
            // above.
            header.store(msg_word(tag, len32, self.seq), Ordering::Release);
        }
        self.seq = (self.seq + 1) & SEQ_MASK;
        self.head += rec;
        Ok(())
    }

    /// Writes a wrap record at `head` (the rest of the box is padding)
    /// when a record of `rec` bytes does not fit before the box's end,
    /// having checked that the padding, the record and its terminator fit.
    #[cold]
    #[inline(never)]
    fn wrap(&mut self, rec: u64) -> Result<(), SendError> {
        let size = u64::from(self.mem.size);
        let pos = self.head & (size - 1);
        let pad = size - pos;
        // The padding, the record, and the word after it for the
        // terminator.
        let need = pad + rec + 8;
        if self.head + need - self.cached_tail > size {
            let tail = self.load_tail()?;
            if self.head + need - tail > size {
                return Err(SendError::Full);
            }
        }
        // The wrap record's terminator is the first word of the box.
        self.mem.store(0, EMPTY, Ordering::Relaxed);
        // Release: pairs with the reader's Acquire load of this header
        // (publishes the terminator at position 0).
        self.mem.store(pos, wrap_word(self.seq), Ordering::Release);
        self.seq = (self.seq + 1) & SEQ_MASK;
        self.head += pad;
        Ok(())
    }

    /// True when the reader has consumed everything written so far (the
    /// box is empty): reloads and validates the reader's tail. A sender
    /// that leaves waits for this, as it waits for its fragments' ACKs.
    pub fn drained(&mut self) -> Result<bool, Corruption> {
        if let Some(c) = self.failed {
            return Err(c);
        }
        if self.cached_tail == self.head {
            return Ok(true);
        }
        match self.load_tail() {
            Ok(tail) => Ok(tail == self.head),
            Err(SendError::Corrupt(c)) => Err(c),
            // load_tail fails only with Corrupt.
            Err(_) => Ok(false),
        }
    }

    /// Reloads the reader's tail and validates it; a bad one fails the
    /// writer for good.
    #[cold]
    fn load_tail(&mut self) -> Result<u64, SendError> {
        // Acquire: pairs with the reader's Release store of its tail, so
        // the reader's reads of the records below it are done before we
        // overwrite them.
        let tail = self.mem.tail().load(Ordering::Acquire);
        let bad = if tail % 8 != 0 {
            Some(Corruption::TailMisaligned { tail })
        } else if tail < self.cached_tail {
            Some(Corruption::TailBackwards {
                tail,
                previous: self.cached_tail,
            })
        } else if tail > self.head {
            Some(Corruption::TailBeyondHead {
                tail,
                head: self.head,
            })
        } else {
            None
        };
        if let Some(c) = bad {
            self.failed = Some(c);
            return Err(SendError::Corrupt(c));
        }
        self.cached_tail = tail;
        Ok(tail)
    }
}

/// The bytes of `b` (fewer than 8) as a little-endian number: byte i at
/// bits 8i, the bytes above zero. At most three loads.
#[inline(always)]
fn le_bytes_below_8(b: &[u8]) -> u64 {
    let (mut v, mut i) = (0u64, 0usize);
    if let Some(x) = b.get(..4).filter(|_| b.len() & 4 != 0) {
        v = u64::from(u32::from_le_bytes([x[0], x[1], x[2], x[3]]));
        i = 4;
    }
    if b.len() & 2 != 0 {
        if let Some(x) = b.get(i..i + 2) {
            v |= u64::from(u16::from_le_bytes([x[0], x[1]])) << (8 * i);
            i += 2;
        }
    }
    if b.len() & 1 != 0 {
        if let Some(&x) = b.get(i) {
            v |= u64::from(x) << (8 * i);
        }
    }
    v
}

fn msg_word(tag: u8, len: u32, seq: u32) -> u64 {
    (u64::from(seq & SEQ_MASK) << SEQ_SHIFT)
        | (KIND_MSG << KIND_SHIFT)
        | (u64::from(tag) << TAG_SHIFT)
        | (u64::from(len) & LEN_MASK)
}

fn wrap_word(seq: u32) -> u64 {
    (u64::from(seq & SEQ_MASK) << SEQ_SHIFT) | (KIND_WRAP << KIND_SHIFT)
}

/// A header word that passed validation.
enum Decoded {
    Msg { tag: u8, len: u32 },
    Wrap,
}

/// Validates the header `word` found at data byte `pos` when `expected` is
/// the next sequence number, in a box of `size` bytes.
fn decode(word: u64, pos: u32, expected: u32, size: u32) -> Result<Decoded, Corruption> {
    if word & RESERVED_MASK != 0 {
        return Err(Corruption::ReservedBits { pos, word });
    }
    let kind = (word >> KIND_SHIFT) & KIND_MASK;
    let seq = (word >> SEQ_SHIFT) as u32;
    let len = (word & LEN_MASK) as u32;
    let tag = ((word >> TAG_SHIFT) & TAG_MASK) as u32;
    match kind {
        KIND_MSG => {
            if tag > MAX_TAG {
                return Err(Corruption::BadTag { pos, tag });
            }
            if seq != expected {
                return Err(Corruption::Sequence {
                    pos,
                    expected,
                    found: seq,
                });
            }
            let max = Fbox::max_payload(size);
            if len > max {
                return Err(Corruption::TooLong { pos, len, max });
            }
            if pos + Fbox::record_size(len) > size {
                return Err(Corruption::CrossesEnd { pos, len, size });
            }
            Ok(Decoded::Msg {
                tag: tag as u8,
                len,
            })
        }
        KIND_WRAP => {
            if len != 0 || tag != 0 || pos == 0 {
                return Err(Corruption::BadWrap { pos, word });
            }
            if seq != expected {
                return Err(Corruption::Sequence {
                    pos,
                    expected,
                    found: seq,
                });
            }
            Ok(Decoded::Wrap)
        }
        k => Err(Corruption::BadKind { pos, kind: k as u8 }),
    }
}

/// The receiver's handle on a box it initialised ([`Fbox::init`]). `Send`.
pub struct FboxReader<'a> {
    mem: BoxMem<'a>,
    sender: u32,
    /// Next byte position to read (private; published on release).
    tail: u64,
    /// Sequence number of the next record.
    seq: u32,
    failed: Option<Corruption>,
}

impl fmt::Debug for FboxReader<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FboxReader")
            .field("size", &self.mem.size)
            .field("sender", &self.sender)
            .field("tail", &self.tail)
            .field("failed", &self.failed)
            .finish()
    }
}

impl<'a> FboxReader<'a> {
    /// The box's size in data bytes.
    pub fn size(&self) -> u32 {
        self.mem.size
    }

    /// The sender the box was initialised for.
    pub fn sender(&self) -> u32 {
        self.sender
    }

    /// Bytes consumed over the box's life (the reader's tail).
    pub fn position(&self) -> u64 {
        self.tail
    }

    /// The corruption this reader found, if any (final).
    pub fn failure(&self) -> Option<Corruption> {
        self.failed
    }

    /// True when [`Self::poll`] would return `Ok(None)` now: the reader
    /// did not fail and the header word at its position is empty (one
    /// load; what a poll that finds nothing costs).
    #[inline]
    pub fn idle(&self) -> bool {
        if self.failed.is_some() {
            return false;
        }
        let pos = self.tail & u64::from(self.mem.size - 1);
        // Acquire as in `poll` (a non-empty word is read again there).
        self.mem.load(pos, Ordering::Acquire) == EMPTY
    }

    /// The next message, in place, or `None` if there is none yet. The
    /// message is consumed (its space given back to the writer) when the
    /// [`Record`] is dropped. Never blocks.
    #[inline(always)]
    pub fn poll(&mut self) -> Result<Option<Record<'_, 'a>>, Corruption> {
        if let Some(c) = self.failed {
            return Err(c);
        }
        let size = self.mem.size;
        // At most two rounds: a wrap record moves to position 0, where
        // another wrap record is refused.
        loop {
            let pos = (self.tail & u64::from(size - 1)) as u32;
            // Acquire: pairs with the writer's Release store of the header,
            // making the payload and the next terminator visible.
            let word = self.mem.load(u64::from(pos), Ordering::Acquire);
            if word == EMPTY {
                return Ok(None);
            }
            match decode(word, pos, self.seq, size) {
                Err(c) => return Err(self.fail(c)),
                Ok(Decoded::Wrap) => {
                    self.tail += u64::from(size - pos);
                    self.seq = (self.seq + 1) & SEQ_MASK;
                    // Release: pairs with the writer's Acquire load of the
                    // tail (gives the padding back).
                    self.mem.tail().store(self.tail, Ordering::Release);
                }
                Ok(Decoded::Msg { tag, len }) => {
                    let Some(payload) = self.mem.payload(u64::from(pos) + 8, len) else {
                        // Unreachable: decode checked the record is inside.
                        return Err(self.fail(Corruption::CrossesEnd { pos, len, size }));
                    };
                    return Ok(Some(Record {
                        advance: Fbox::record_size(len),
                        tag,
                        payload,
                        reader: self,
                    }));
                }
            }
        }
    }

    /// Delivers every message the box holds now to `f`, in order, and
    /// returns how many. Call it before dispatching a ring message from the
    /// box's sender (the hand-off rule, module docs). Bounded: more records
    /// than the box can hold is [`Corruption::DrainOverrun`].
    pub fn drain(&mut self, mut f: impl FnMut(u8, Payload<'_>)) -> Result<u32, Corruption> {
        let limit = self.mem.size / 8;
        let mut n = 0;
        loop {
            let Some(rec) = self.poll()? else {
                return Ok(n);
            };
            if n == limit {
                // Leave the record where it is (not consumed) and fail.
                core::mem::forget(rec);
                break;
            }
            f(rec.tag(), rec.payload());
            drop(rec);
            n += 1;
        }
        Err(self.fail(Corruption::DrainOverrun { records: n }))
    }

    #[cold]
    fn fail(&mut self, c: Corruption) -> Corruption {
        self.failed = Some(c);
        c
    }

    #[inline]
    fn consume(&mut self, advance: u32) {
        self.tail += u64::from(advance);
        self.seq = (self.seq + 1) & SEQ_MASK;
        // Release: pairs with the writer's Acquire load of the tail in
        // `load_tail`, ordering our reads of the record before its reuse.
        self.mem.tail().store(self.tail, Ordering::Release);
    }
}

/// A message in the box, held in place; consumed when dropped.
pub struct Record<'r, 'a> {
    reader: &'r mut FboxReader<'a>,
    tag: u8,
    payload: Payload<'a>,
    advance: u32,
}

impl fmt::Debug for Record<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Record")
            .field("tag", &self.tag)
            .field("len", &self.payload.len)
            .field("at", &self.reader.tail)
            .finish()
    }
}

impl Record<'_, '_> {
    /// The message's tag.
    pub fn tag(&self) -> u8 {
        self.tag
    }

    /// The payload, in place (valid while the record is held).
    pub fn payload(&self) -> Payload<'_> {
        self.payload
    }

    /// Consumes the record (the same as dropping it).
    pub fn release(self) {}
}

impl Drop for Record<'_, '_> {
    // Inline: one add and one store on every message's path.
    #[inline]
    fn drop(&mut self) {
        self.reader.consume(self.advance);
    }
}

/// A message's payload, in place in the box.
#[derive(Clone, Copy)]
pub struct Payload<'p> {
    /// The words holding the payload (the last one possibly partly).
    words: &'p [AtomicU64],
    len: usize,
}

impl fmt::Debug for Payload<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Payload").field("len", &self.len).finish()
    }
}

impl<'p> Payload<'p> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty payload.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The payload bytes in place, without a copy.
    ///
    /// Under an honest writer the bytes do not change while the record is
    /// held; a writer process that scribbles on them can make them change
    /// (module docs): copy what memory-safety decisions depend on.
    #[cfg(not(loom))]
    #[inline]
    pub fn as_bytes(&self) -> &'p [u8] {
        debug_assert!(self.len <= self.words.len() * 8);
        let len = self.len.min(self.words.len() * 8);
        // SAFETY: the pointer comes from the `&'p [AtomicU64]` covering at
        // least `len` bytes (`payload` sized it), keeping its provenance;
        // AtomicU64 has u64's size and bit validity (asserted at the top),
        // so the bytes are initialised integers. Nothing in this address
        // space writes them while `'p` lasts: `'p` is bounded by a borrow
        // of the `Record`, the box's one writer writes only below the
        // published tail + size, and the reader publishes a tail past this
        // record only when the Record is dropped (module docs: "One writer,
        // one reader"). The writer's relaxed stores of these words happen
        // before the reader's Acquire load of the header, so this read does
        // not race them.
        unsafe { core::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), len) }
    }

    /// The payload as a sub-region of `region`, the receiver's memory the
    /// box lives in (for code that reads messages through a
    /// [`Region`], in place); `None` if the box is not inside `region`.
    #[cfg(not(loom))]
    pub fn region_in(&self, region: &Region<'p>) -> Option<Region<'p>> {
        let at = (self.words.as_ptr() as usize).checked_sub(region.base_addr())?;
        region.subregion(at as u64, self.len).ok()
    }

    /// Copies the payload into `dst[..len]`; fails if `dst` is shorter.
    pub fn copy_to(&self, dst: &mut [u8]) -> Result<(), ResolveError> {
        let Some(dst) = dst.get_mut(..self.len) else {
            return Err(ResolveError::OutOfBounds {
                offset: 0,
                len: self.len as u64,
                region_len: dst.len() as u64,
            });
        };
        #[cfg(not(loom))]
        dst.copy_from_slice(self.as_bytes());
        #[cfg(loom)]
        for (chunk, word) in dst.chunks_mut(8).zip(self.words) {
            // Relaxed: ordered by the header's Acquire load in `poll`.
            let bytes = word.load(Ordering::Relaxed).to_ne_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::fifo::{Consumer, Fifo, Producer, PushError};
    use std::collections::VecDeque;
    use std::vec;
    use std::vec::Vec;

    type Line = CachePadded<[u64; CACHE_LINE / 8]>;

    /// A cache-line aligned buffer of at least `bytes` bytes.
    fn buffer(bytes: usize) -> Vec<Line> {
        let lines = bytes.div_ceil(CACHE_LINE);
        let mut v = Vec::with_capacity(lines);
        v.resize_with(lines, || CachePadded([0u64; CACHE_LINE / 8]));
        v
    }

    fn region(buf: &mut [Line]) -> Region<'_> {
        let len = core::mem::size_of_val(buf);
        // SAFETY: the buffer is exclusively borrowed for the region's
        // lifetime and only accessed through it.
        let bytes = unsafe { core::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), len) };
        Region::from_mut_slice(bytes)
    }

    /// A box of `size` bytes for sender 3 at offset 0: its reader and
    /// writer.
    fn pair<'a>(r: &Region<'a>, size: u32) -> (FboxReader<'a>, FboxWriter<'a>) {
        // SAFETY: fresh buffer, nothing else accesses it.
        let reader = unsafe { Fbox::init(r, 0, size, 3) }.unwrap();
        let writer = FboxWriter::attach(r, 0, 3).unwrap();
        (reader, writer)
    }

    /// Deterministic pseudo-random choices.
    struct Rng(crate::workload::check::Rng);
    impl Rng {
        fn new(seed: u64) -> Self {
            Self(crate::workload::check::Rng::new(seed))
        }
        fn next(&mut self) -> u64 {
            self.0.next()
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// The payload of message `id`: `len` bytes derived from the id.
    fn content(id: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (id.wrapping_mul(31).wrapping_add(i as u64 * 7)) as u8)
            .collect()
    }

    fn take(reader: &mut FboxReader<'_>) -> Option<(u8, Vec<u8>)> {
        let rec = reader.poll().expect("box corrupt")?;
        Some((rec.tag(), rec.payload().as_bytes().to_vec()))
    }

    #[test]
    fn geometry() {
        for size in [64, 128, 4096, 65536] {
            assert_eq!(Fbox::check_size(size), Ok(()));
            let m = Fbox::memory_size(size).unwrap();
            assert_eq!(m % Fbox::ALIGN, 0);
            assert_eq!(
                m,
                (2 * CACHE_LINE + size as usize).next_multiple_of(CACHE_LINE)
            );
        }
        for size in [0, 32, 63, 65, 100, 3000, 131072, u32::MAX] {
            assert_eq!(Fbox::check_size(size), Err(FboxError::InvalidSize { size }));
            assert_eq!(Fbox::memory_size(size), None);
        }
        assert_eq!(Fbox::max_payload(4096), 1016);
        assert_eq!(Fbox::max_payload(64), 8);
        assert_eq!(Fbox::record_size(0), 8);
        assert_eq!(Fbox::record_size(1), 16);
        assert_eq!(Fbox::record_size(8), 16);
        assert_eq!(Fbox::record_size(9), 24);
        assert_eq!(Fbox::record_size(u32::MAX), u32::MAX);
        assert_eq!(Fbox::max_payload(16), 0);
        assert_eq!(Fbox::TAIL_OFFSET, CACHE_LINE);
        assert_eq!(Fbox::DATA_OFFSET, 2 * CACHE_LINE);
    }

    #[test]
    fn init_and_attach_validate() {
        let mut buf = buffer(Fbox::memory_size(256).unwrap() + CACHE_LINE);
        let r = region(&mut buf);
        // Nothing initialised yet.
        assert_eq!(
            FboxWriter::attach(&r, 0, 1).unwrap_err(),
            FboxError::BadMagic { found: 0 }
        );
        // Bad geometry or placement: refused before anything is written.
        let init = |offset, size| {
            // SAFETY: fresh buffer, nothing else accesses it (and every
            // call but the last fails before writing).
            unsafe { Fbox::init(&r, offset, size, 1) }
        };
        assert!(matches!(
            init(0, 100),
            Err(FboxError::InvalidSize { size: 100 })
        ));
        assert!(matches!(
            init(0, 1024),
            Err(FboxError::Resolve(ResolveError::OutOfBounds { .. }))
        ));
        assert!(matches!(
            init(8, 64),
            Err(FboxError::Resolve(ResolveError::Misaligned { .. }))
        ));
        assert!(init(u64::MAX - 7, 64).is_err());
        let reader = init(0, 256).unwrap();
        assert_eq!((reader.size(), reader.sender()), (256, 1));
        // Another sender's box.
        assert_eq!(
            FboxWriter::attach(&r, 0, 2).unwrap_err(),
            FboxError::WrongSender {
                expected: 2,
                found: 1
            }
        );
        {
            let w = FboxWriter::attach(&r, 0, 1).unwrap();
            assert_eq!((w.size(), w.max_payload()), (256, 56));
            // One writer for the box's whole life.
            assert_eq!(
                FboxWriter::attach(&r, 0, 1).unwrap_err(),
                FboxError::WriterClaimed
            );
        }
        assert_eq!(
            FboxWriter::attach(&r, 0, 1).unwrap_err(),
            FboxError::WriterClaimed
        );
        // A meta line rewritten by a peer.
        let meta = &reader.mem.header.meta;
        meta.writer.store(0, Ordering::Relaxed);
        reader.mem.header.reader.tail.store(16, Ordering::Relaxed);
        assert_eq!(
            FboxWriter::attach(&r, 0, 1).unwrap_err(),
            FboxError::NotFresh { tail: 16 }
        );
        meta.size.store(96, Ordering::Relaxed);
        assert_eq!(
            FboxWriter::attach(&r, 0, 1).unwrap_err(),
            FboxError::InvalidSize { size: 96 }
        );
        meta.size.store(1 << 16, Ordering::Relaxed);
        assert!(matches!(
            FboxWriter::attach(&r, 0, 1).unwrap_err(),
            FboxError::Resolve(ResolveError::OutOfBounds { .. })
        ));
        meta.version.store(7, Ordering::Relaxed);
        assert_eq!(
            FboxWriter::attach(&r, 0, 1).unwrap_err(),
            FboxError::BadVersion { found: 7 }
        );
        assert!(FboxWriter::attach(&r, 64, 1).is_err());
        assert!(FboxWriter::attach(&r, 1 << 40, 1).is_err());
        // The reader keeps the geometry it was created with.
        assert_eq!(reader.size(), 256);
    }

    #[test]
    fn messages_roundtrip_in_place() {
        let mut buf = buffer(Fbox::memory_size(4096).unwrap());
        let r = region(&mut buf);
        let data_start = r.base_addr() + Fbox::DATA_OFFSET;
        let (mut reader, mut w) = pair(&r, 4096);
        assert_eq!(reader.poll().unwrap().map(|r| r.tag()), None);
        w.try_send(7, b"hello", 0).unwrap();
        w.try_send(0, b"", 0).unwrap();
        let max = content(9, w.max_payload() as usize);
        w.try_send(255, &max, 0).unwrap();
        {
            let rec = reader.poll().unwrap().unwrap();
            assert_eq!(rec.tag(), 7);
            let p = rec.payload();
            assert_eq!((p.len(), p.is_empty()), (5, false));
            assert_eq!(p.as_bytes(), b"hello");
            // In place: the bytes are the box's, right after the header.
            assert_eq!(p.as_bytes().as_ptr() as usize, data_start + 8);
            let mut out = [0u8; 8];
            p.copy_to(&mut out).unwrap();
            assert_eq!(&out[..5], b"hello");
            assert!(p.copy_to(&mut [0u8; 4]).is_err());
        }
        assert_eq!(take(&mut reader), Some((0, vec![])));
        assert_eq!(take(&mut reader), Some((255, max)));
        assert_eq!(take(&mut reader), None);
        assert_eq!(reader.position(), w.position());
        assert_eq!(reader.position(), 16 + 8 + 8 + 1016);
    }

    #[test]
    fn too_large_and_ring_busy_write_nothing() {
        let mut buf = buffer(Fbox::memory_size(256).unwrap());
        let r = region(&mut buf);
        let (mut reader, mut w) = pair(&r, 256);
        assert_eq!(
            w.try_send(1, &[0; 57], 0),
            Err(SendError::TooLarge { len: 57, max: 56 })
        );
        assert_eq!(
            w.try_send_vectored(1, &[&[0; 50], &[0; 7]], 0),
            Err(SendError::TooLarge { len: 57, max: 56 })
        );
        assert_eq!(
            w.try_send(1, b"x", 2),
            Err(SendError::RingBusy { in_flight: 2 })
        );
        assert_eq!(w.position(), 0);
        assert_eq!(take(&mut reader), None);
        w.try_send(1, b"x", 0).unwrap();
        assert_eq!(take(&mut reader), Some((1, b"x".to_vec())));
    }

    #[test]
    fn full_box_hands_back_and_recovers() {
        // 64 bytes: three 16-byte records fit (the fourth would leave no
        // word for the terminator).
        let mut buf = buffer(Fbox::memory_size(64).unwrap());
        let r = region(&mut buf);
        let (mut reader, mut w) = pair(&r, 64);
        for i in 0..3u8 {
            w.try_send(i, &[i; 8], 0).unwrap();
        }
        assert_eq!(w.try_send(3, &[3; 8], 0), Err(SendError::Full));
        // An empty message (8 bytes) still fits.
        w.try_send(9, b"", 0).unwrap();
        assert_eq!(w.try_send(9, b"", 0), Err(SendError::Full));
        let before = w.position();
        assert_eq!(w.try_send(3, &[3; 8], 0), Err(SendError::Full));
        assert_eq!(w.position(), before, "a full box writes nothing");
        assert_eq!(take(&mut reader), Some((0, vec![0; 8])));
        // 16 bytes came back: at position 56 the record needs a wrap
        // (8 bytes of padding), so it still does not fit...
        assert_eq!(w.try_send(3, &[3; 8], 0), Err(SendError::Full));
        assert_eq!(take(&mut reader), Some((1, vec![1; 8])));
        // ...until 32 are free.
        w.try_send(3, &[3; 8], 0).unwrap();
        assert_eq!(take(&mut reader), Some((2, vec![2; 8])));
        assert_eq!(take(&mut reader), Some((9, vec![])));
        assert_eq!(take(&mut reader), Some((3, vec![3; 8])));
        assert_eq!(take(&mut reader), None);
        // The wrap put the last record at the box's start.
        assert_eq!(w.position(), 64 + 16);
    }

    #[test]
    fn vectored_writes_of_any_split_equal_one_slice() {
        // Payloads short and long, split into three pieces at every few
        // bytes (pieces ending inside a word, empty pieces, whole words).
        let mut buf = buffer(Fbox::memory_size(2048).unwrap());
        let r = region(&mut buf);
        let (mut reader, mut w) = pair(&r, 2048);
        // Split points every few bytes (fewer under miri).
        let step = if cfg!(miri) { (41, 37) } else { (7, 5) };
        for n in [1, 7, 8, 9, 22, 127, 128, 129, 200, 301] {
            let msg = content(n as u64, n);
            for a in (0..=n).step_by(step.0) {
                for b in (a..=n).step_by(step.1) {
                    let parts: [&[u8]; 3] = [&msg[..a], &msg[a..b], &msg[b..]];
                    w.try_send_vectored(9, &parts, 0).unwrap();
                    assert_eq!(
                        take(&mut reader),
                        Some((9, msg.clone())),
                        "{n}: split {a} {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn vectored_writes_equal_one_slice() {
        let mut buf = buffer(Fbox::memory_size(256).unwrap());
        let r = region(&mut buf);
        let (mut reader, mut w) = pair(&r, 256);
        // Every split into three pieces, for lengths around word borders
        // (fewer under miri, where each send is slow).
        let lengths: &[usize] = if cfg!(miri) {
            &[7, 9, 17]
        } else {
            &[1, 7, 8, 9, 15, 16, 17, 23, 24, 25, 40]
        };
        for &n in lengths {
            let msg = content(n as u64, n);
            for a in 0..=msg.len() {
                for b in a..=msg.len() {
                    let parts: [&[u8]; 4] = [&msg[..a], &[], &msg[a..b], &msg[b..]];
                    w.try_send_vectored(4, &parts, 0).unwrap();
                    assert_eq!(
                        take(&mut reader),
                        Some((4, msg.clone())),
                        "{n}: split {a} {b}"
                    );
                }
            }
        }
        let msg = content(5, 21);
        // Many one-byte parts.
        let ones: Vec<&[u8]> = msg.chunks(1).collect();
        w.try_send_vectored(4, &ones, 0).unwrap();
        assert_eq!(take(&mut reader), Some((4, msg.clone())));
        w.try_send_vectored(4, &[], 0).unwrap();
        assert_eq!(take(&mut reader), Some((4, vec![])));
    }

    /// Sends and polls in a pseudo-random order against a model of the
    /// protocol (positions, wrap padding, the free word): every answer —
    /// accepted, full, empty, and each message's bytes — must be the
    /// model's.
    fn model_run(size: u32, seed: u64, ops: usize) {
        let mut buf = buffer(Fbox::memory_size(size).unwrap());
        let r = region(&mut buf);
        let (mut reader, mut w) = pair(&r, size);
        let mut rng = Rng::new(seed);
        let s = u64::from(size);
        let (mut head, mut tail) = (0u64, 0u64);
        let mut queue: VecDeque<(u8, Vec<u8>, u64)> = VecDeque::new();
        let mut id = 0u64;
        let (mut sent, mut full, mut wraps) = (0, 0, 0);
        for _ in 0..ops {
            if rng.below(2) == 0 {
                let len = rng.below(u64::from(w.max_payload()) + 1) as usize;
                let msg = content(id, len);
                let tag = (id % 256) as u8;
                let rec = u64::from(Fbox::record_size(len as u32));
                let pos = head % s;
                let pad = if pos + rec > s { s - pos } else { 0 };
                let fits = head + pad + rec + 8 - tail <= s;
                let split = rng.below(len as u64 + 1) as usize;
                let got = w.try_send_vectored(tag, &[&msg[..split], &msg[split..]], 0);
                if fits {
                    assert_eq!(got, Ok(()));
                    head += pad;
                    queue.push_back((tag, msg, head));
                    head += rec;
                    id += 1;
                    sent += 1;
                    wraps += usize::from(pad != 0);
                } else {
                    assert_eq!(got, Err(SendError::Full));
                    full += 1;
                }
                assert_eq!(w.position(), head);
            } else {
                match queue.pop_front() {
                    Some((tag, msg, at)) => {
                        assert_eq!(take(&mut reader), Some((tag, msg.clone())));
                        tail = at + u64::from(Fbox::record_size(msg.len() as u32));
                        assert_eq!(reader.position(), tail);
                    }
                    None => assert_eq!(take(&mut reader), None),
                }
            }
        }
        while let Some((tag, msg, _)) = queue.pop_front() {
            assert_eq!(take(&mut reader), Some((tag, msg)));
        }
        assert_eq!(take(&mut reader), None);
        // The run covered what it is meant to.
        assert!(
            sent > ops / 8 && full > 0 && wraps > 0,
            "{sent} {full} {wraps}"
        );
    }

    #[test]
    fn wrap_around_against_a_model() {
        let ops = if cfg!(miri) { 300 } else { 20_000 };
        for (size, seed) in [(64, 1), (128, 2), (256, 3), (1024, 4)] {
            model_run(size, seed, ops);
        }
    }

    #[test]
    fn sequence_numbers_wrap_after_2_pow_24_records() {
        // Set both sides just before the wrap of the 24-bit counter.
        let mut buf = buffer(Fbox::memory_size(64).unwrap());
        let r = region(&mut buf);
        let (mut reader, mut w) = pair(&r, 64);
        w.seq = SEQ_MASK - 1;
        reader.seq = SEQ_MASK - 1;
        for i in 0..8u8 {
            w.try_send(i, &[i], 0).unwrap();
            assert_eq!(take(&mut reader), Some((i, vec![i])));
        }
        assert!(reader.seq < 8);
    }

    /// Stores `word` at data byte `pos` of the box, as a hostile writer.
    fn scribble(reader: &FboxReader<'_>, pos: u64, word: u64) {
        reader.mem.store(pos, word, Ordering::Relaxed);
    }

    /// A fresh box with one honest message at position 0, whose header is
    /// then replaced by `word`; the error the reader reports.
    fn corrupt_first(word: u64) -> Corruption {
        let mut buf = buffer(Fbox::memory_size(256).unwrap());
        let r = region(&mut buf);
        let (mut reader, mut w) = pair(&r, 256);
        w.try_send(1, b"abc", 0).unwrap();
        scribble(&reader, 0, word);
        let err = reader.poll().unwrap_err();
        // Final: the same error again, even once the honest header is back.
        scribble(&reader, 0, msg_word(1, 3, 0));
        assert_eq!(reader.poll().unwrap_err(), err);
        assert_eq!(reader.failure(), Some(err));
        err
    }

    #[test]
    fn every_corrupt_header_field_is_detected() {
        let good = msg_word(1, 3, 0);
        assert_eq!(
            corrupt_first(good | 1 << 37),
            Corruption::ReservedBits {
                pos: 0,
                word: good | 1 << 37
            }
        );
        for kind in [0u64, 3, 9, 15] {
            let word = (good & !(KIND_MASK << KIND_SHIFT)) | kind << KIND_SHIFT;
            assert_eq!(
                corrupt_first(word),
                Corruption::BadKind {
                    pos: 0,
                    kind: kind as u8
                }
            );
        }
        assert_eq!(
            corrupt_first(good | 0x100 << TAG_SHIFT),
            Corruption::BadTag { pos: 0, tag: 0x101 }
        );
        assert_eq!(
            corrupt_first(msg_word(1, 3, 5)),
            Corruption::Sequence {
                pos: 0,
                expected: 0,
                found: 5
            }
        );
        assert_eq!(
            corrupt_first(msg_word(1, 57, 0)),
            Corruption::TooLong {
                pos: 0,
                len: 57,
                max: 56
            }
        );
        assert_eq!(
            corrupt_first(msg_word(1, 0xffff, 0)),
            Corruption::TooLong {
                pos: 0,
                len: 0xffff,
                max: 56
            }
        );
        // A wrap record at the start would skip the whole box.
        assert_eq!(
            corrupt_first(wrap_word(0)),
            Corruption::BadWrap {
                pos: 0,
                word: wrap_word(0)
            }
        );
    }

    #[test]
    fn records_reaching_outside_the_box_are_detected() {
        let mut buf = buffer(Fbox::memory_size(256).unwrap());
        let r = region(&mut buf);
        let (mut reader, mut w) = pair(&r, 256);
        // Move both sides to position 224 (32 bytes before the end).
        for _ in 0..7 {
            w.try_send(1, &[0; 24], 0).unwrap();
            take(&mut reader).unwrap();
        }
        assert_eq!(reader.position(), 224);
        w.try_send(1, &[0; 24], 0).unwrap();
        // 25 bytes: a 40-byte record from 224 would end at 264.
        scribble(&reader, 224, msg_word(1, 25, 7));
        assert_eq!(
            reader.poll().unwrap_err(),
            Corruption::CrossesEnd {
                pos: 224,
                len: 25,
                size: 256
            }
        );
    }

    #[test]
    fn corrupt_wrap_records_are_detected() {
        for (word, what) in [
            (wrap_word(1) | 8, "length"),
            (wrap_word(1) | 2 << TAG_SHIFT, "tag"),
        ] {
            let mut buf = buffer(Fbox::memory_size(64).unwrap());
            let r = region(&mut buf);
            let (mut reader, mut w) = pair(&r, 64);
            w.try_send(1, &[1; 8], 0).unwrap();
            take(&mut reader).unwrap();
            scribble(&reader, 16, word);
            assert_eq!(
                reader.poll().unwrap_err(),
                Corruption::BadWrap { pos: 16, word },
                "{what}"
            );
        }
        // A wrap with the wrong sequence number.
        let mut buf = buffer(Fbox::memory_size(64).unwrap());
        let r = region(&mut buf);
        let (mut reader, _w) = pair(&r, 64);
        scribble(&reader, 0, msg_word(0, 0, 0));
        take(&mut reader).unwrap();
        scribble(&reader, 8, wrap_word(4));
        assert_eq!(
            reader.poll().unwrap_err(),
            Corruption::Sequence {
                pos: 8,
                expected: 1,
                found: 4
            }
        );
        // An honest wrap followed by a second one at the start.
        let mut buf = buffer(Fbox::memory_size(64).unwrap());
        let r = region(&mut buf);
        let (mut reader, _w) = pair(&r, 64);
        scribble(&reader, 0, msg_word(0, 0, 0));
        take(&mut reader).unwrap();
        scribble(&reader, 8, wrap_word(1));
        scribble(&reader, 0, wrap_word(2));
        assert_eq!(
            reader.poll().unwrap_err(),
            Corruption::BadWrap {
                pos: 0,
                word: wrap_word(2)
            }
        );
    }

    /// Fills a 64-byte box, stores `tail` as the reader's published tail,
    /// and returns what the writer says when it must reload it.
    fn writer_sees_tail(tail: u64, release_first: bool) -> SendError {
        let mut buf = buffer(Fbox::memory_size(64).unwrap());
        let r = region(&mut buf);
        let (mut reader, mut w) = pair(&r, 64);
        for _ in 0..3 {
            w.try_send(1, &[0; 8], 0).unwrap();
        }
        if release_first {
            // The writer sees tail 16, then 32.
            take(&mut reader).unwrap();
            take(&mut reader).unwrap();
            w.try_send(1, &[0; 8], 0).unwrap();
            assert_eq!(w.cached_tail, 32);
        }
        reader.mem.tail().store(tail, Ordering::Relaxed);
        let err = loop {
            match w.try_send(1, &[0; 8], 0) {
                Ok(()) => continue,
                Err(e) => break e,
            }
        };
        if let SendError::Corrupt(c) = err {
            // Final, whatever the reader publishes next.
            reader.mem.tail().store(w.position(), Ordering::Relaxed);
            assert_eq!(w.try_send(1, b"", 0), Err(SendError::Corrupt(c)));
            assert_eq!(w.failure(), Some(c));
        }
        err
    }

    #[test]
    fn every_corrupt_tail_is_detected() {
        assert_eq!(
            writer_sees_tail(12, false),
            SendError::Corrupt(Corruption::TailMisaligned { tail: 12 })
        );
        assert_eq!(
            writer_sees_tail(49, false),
            SendError::Corrupt(Corruption::TailMisaligned { tail: 49 })
        );
        assert_eq!(
            writer_sees_tail(56, false),
            SendError::Corrupt(Corruption::TailBeyondHead { tail: 56, head: 48 })
        );
        assert_eq!(
            writer_sees_tail(u64::MAX - 7, false),
            SendError::Corrupt(Corruption::TailBeyondHead {
                tail: u64::MAX - 7,
                head: 48
            })
        );
        assert_eq!(
            writer_sees_tail(16, true),
            SendError::Corrupt(Corruption::TailBackwards {
                tail: 16,
                previous: 32
            })
        );
        // A tail that is wrong but plausible (ahead of what the reader
        // consumed, not beyond head) only hurts the reader: the writer goes
        // on while it stays consistent.
        assert_eq!(writer_sees_tail(48, false), SendError::Full);
    }

    #[test]
    fn corrupt_payload_words_stay_inside_the_box() {
        // Whatever a hostile writer stores, every payload handed out lies
        // inside the data area.
        let size = 128u32;
        let mut buf = buffer(Fbox::memory_size(size).unwrap());
        let r = region(&mut buf);
        let start = r.base_addr() + Fbox::DATA_OFFSET;
        let end = start + size as usize;
        let mut rng = Rng::new(99);
        for _ in 0..if cfg!(miri) { 20 } else { 2000 } {
            // SAFETY: the previous box's handles are gone; nothing else
            // accesses the buffer.
            let mut reader = unsafe { Fbox::init(&r, 0, size, 0) }.unwrap();
            for _ in 0..4 {
                let pos = rng.below(u64::from(size)) & !7;
                let word = match rng.below(3) {
                    0 => rng.next(),
                    1 => msg_word(rng.next() as u8, rng.below(200) as u32, 0),
                    _ => msg_word(0, rng.below(64) as u32, rng.below(3) as u32),
                };
                scribble(&reader, pos, word);
                for _ in 0..3 {
                    match reader.poll() {
                        Ok(Some(rec)) => {
                            let b = rec.payload().as_bytes();
                            let at = b.as_ptr() as usize;
                            assert!(at >= start + 8 && at + b.len() <= end);
                        }
                        Ok(None) | Err(_) => break,
                    }
                }
            }
        }
    }

    #[test]
    fn drain_delivers_everything_and_is_bounded() {
        let mut buf = buffer(Fbox::memory_size(256).unwrap());
        let r = region(&mut buf);
        let (mut reader, mut w) = pair(&r, 256);
        for i in 0..5u8 {
            w.try_send(i, &[i; 3], 0).unwrap();
        }
        let mut got = Vec::new();
        assert_eq!(
            reader.drain(|tag, p| got.push((tag, p.as_bytes().to_vec()))),
            Ok(5)
        );
        assert_eq!(got, (0..5u8).map(|i| (i, vec![i; 3])).collect::<Vec<_>>());
        assert_eq!(reader.drain(|_, _| panic!("empty")), Ok(0));
        // A writer that keeps writing during the drain (breaking the
        // hand-off rule) cannot keep the reader in it for ever.
        w.try_send(0, b"", 0).unwrap();
        let err = reader.drain(|_, _| {
            let _ = w.try_send(0, b"", 0);
        });
        assert_eq!(err, Err(Corruption::DrainOverrun { records: 32 }));
        assert!(reader.poll().is_err());
    }

    /// Set when the receiving thread of a test ends, also by a panic, so
    /// that the sending thread stops waiting for room and the test fails
    /// instead of hanging.
    struct Done<'f>(&'f crate::sync::AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    #[test]
    fn threads_one_writer_one_reader() {
        const N: u64 = if cfg!(miri) { 200 } else { 100_000 };
        let mut buf = buffer(Fbox::memory_size(256).unwrap());
        let r = region(&mut buf);
        let (mut reader, mut w) = pair(&r, 256);
        let done = crate::sync::AtomicBool::new(false);
        std::thread::scope(|s| {
            let done = &done;
            s.spawn(move || {
                let mut rng = Rng::new(7);
                for id in 0..N {
                    let len = rng.below(57) as usize;
                    let msg = content(id, len);
                    while let Err(e) = w.try_send(id as u8, &msg, 0) {
                        assert_eq!(e, SendError::Full);
                        if done.load(Ordering::Relaxed) {
                            return;
                        }
                        std::thread::yield_now();
                    }
                }
            });
            let _done = Done(done);
            let mut rng = Rng::new(7);
            for id in 0..N {
                let len = rng.below(57) as usize;
                let got = loop {
                    if let Some(m) = take(&mut reader) {
                        break m;
                    }
                    std::thread::yield_now();
                };
                assert_eq!(got, (id as u8, content(id, len)), "message {id}");
            }
        });
        assert_eq!(take(&mut reader), None);
    }

    /// The sending side of the hand-off: a box and a ring to the receiver,
    /// and a ring of ACKs back.
    struct Tx<'a> {
        fbox: FboxWriter<'a>,
        ring: Producer<'a>,
        acks: Consumer<'a>,
        in_flight: u32,
        next: u64,
        by_box: u64,
        by_ring: u64,
        /// Box → ring and ring → box changes.
        switches: u64,
        last_by_box: bool,
    }

    impl Tx<'_> {
        /// Takes the ACKs that came back, then, while fewer than `n`
        /// messages were sent, tries to send the next one (by the box if
        /// the rule allows and it fits, else by the ring). False if the
        /// ring was full or all `n` were sent. The ACKs are taken even
        /// after the last send: the receiver pushes one per ring message
        /// into a ring of 4, so a sender that stopped taking them would
        /// leave it stuck on a full ACK ring (a hang of the test, not of
        /// the protocol: the engine takes ACKs on every poll).
        fn step(&mut self, n: u64) -> bool {
            while self.acks.pop().is_some() {
                self.in_flight -= 1;
            }
            if self.next >= n {
                return false;
            }
            let id = self.next;
            let msg = content(id, (id % 9) as usize);
            let by_box = match self.fbox.try_send(1, &msg, self.in_flight) {
                Ok(()) => {
                    self.by_box += 1;
                    true
                }
                Err(SendError::Full | SendError::RingBusy { .. }) => {
                    match self.ring.push(id) {
                        Ok(()) => {}
                        Err(PushError::Full(_)) => return false,
                        Err(e) => panic!("{e}"),
                    }
                    self.in_flight += 1;
                    self.by_ring += 1;
                    false
                }
                Err(e) => panic!("{e}"),
            };
            if by_box != self.last_by_box && self.next > 0 {
                self.switches += 1;
            }
            self.last_by_box = by_box;
            self.next += 1;
            true
        }
    }

    /// The receiving side: the box's reader, the ring, the ACK ring.
    struct Rx<'a> {
        fbox: FboxReader<'a>,
        ring: Consumer<'a>,
        acks: Producer<'a>,
        unpushed_ack: Option<u64>,
        expected: u64,
    }

    impl Rx<'_> {
        fn check(expected: &mut u64, bytes: &[u8]) {
            let id = *expected;
            assert_eq!(
                bytes,
                content(id, (id % 9) as usize),
                "message {id} out of order"
            );
            *expected += 1;
        }

        /// One progress step: a ring message (after draining the box, the
        /// rule) or one box message. False if the ACK ring was full (the
        /// ACK is kept and pushed first next time).
        fn step(&mut self) -> bool {
            if let Some(id) = self.unpushed_ack {
                if self.acks.push(id).is_err() {
                    return false;
                }
                self.unpushed_ack = None;
            }
            if let Some(id) = self.ring.pop() {
                let expected = &mut self.expected;
                self.fbox
                    .drain(|_, p| Self::check(expected, p.as_bytes()))
                    .unwrap();
                assert_eq!(id, self.expected, "ring message out of order");
                self.expected += 1;
                if self.acks.push(id).is_err() {
                    self.unpushed_ack = Some(id);
                    return false;
                }
            } else if let Some(rec) = self.fbox.poll().unwrap() {
                Self::check(&mut self.expected, rec.payload().as_bytes());
            }
            true
        }
    }

    /// Memory for a 64-byte box and two rings of 4 slots.
    fn handoff_memory() -> (Vec<Line>, u64, u64) {
        let b = Fbox::memory_size(64).unwrap() as u64;
        let f = Fifo::memory_size(4).unwrap() as u64;
        (buffer((b + 2 * f) as usize), b, b + f)
    }

    fn handoff<'a>(r: &Region<'a>, at_ring: u64, at_acks: u64) -> (Tx<'a>, Rx<'a>) {
        // SAFETY: fresh buffer; the three structures are disjoint.
        let (reader, ring, acks) = unsafe {
            (
                Fbox::init(r, 0, 64, 3).unwrap(),
                Fifo::init(r, at_ring, 4, 1).unwrap(),
                Fifo::init(r, at_acks, 4, 1).unwrap(),
            )
        };
        let tx = Tx {
            fbox: FboxWriter::attach(r, 0, 3).unwrap(),
            ring: ring.producer(),
            acks: acks.claim_consumer().unwrap(),
            in_flight: 0,
            next: 0,
            by_box: 0,
            by_ring: 0,
            switches: 0,
            last_by_box: true,
        };
        let rx = Rx {
            fbox: reader,
            ring: ring.claim_consumer().unwrap(),
            acks: acks.producer(),
            unpushed_ack: None,
            expected: 0,
        };
        (tx, rx)
    }

    #[test]
    fn order_survives_box_ring_handoff_any_interleaving() {
        let (mut by_box, mut by_ring, mut switches) = (0, 0, 0);
        let seeds = if cfg!(miri) { 3 } else { 300 };
        for seed in 1..=seeds {
            let (mut buf, at_ring, at_acks) = handoff_memory();
            let r = region(&mut buf);
            let (mut tx, mut rx) = handoff(&r, at_ring, at_acks);
            let mut rng = Rng::new(seed);
            // The sender's share of the steps: 1/3, 1/2 or 2/3.
            let (num, den) = [(1, 3), (1, 2), (2, 3)][seed as usize % 3];
            const N: u64 = 60;
            while rx.expected < N {
                if rng.below(den) < num {
                    tx.step(N);
                } else {
                    rx.step();
                }
            }
            assert_eq!(take(&mut rx.fbox), None);
            assert_eq!(rx.ring.pop(), None);
            assert_eq!(tx.by_box + tx.by_ring, N);
            by_box += tx.by_box;
            by_ring += tx.by_ring;
            switches += tx.switches;
        }
        // Both paths and the switches between them were exercised (a few
        // per run on average).
        assert!(
            by_box > 4 * seeds && by_ring > 4 * seeds && switches > 2 * seeds,
            "{by_box} {by_ring} {switches}"
        );
    }

    #[test]
    fn order_survives_box_ring_handoff_threads() {
        const N: u64 = if cfg!(miri) { 100 } else { 50_000 };
        let (mut buf, at_ring, at_acks) = handoff_memory();
        let r = region(&mut buf);
        let (mut tx, mut rx) = handoff(&r, at_ring, at_acks);
        let done = crate::sync::AtomicBool::new(false);
        std::thread::scope(|s| {
            let done = &done;
            // The sender runs (and takes ACKs) until the receiver has
            // everything; `done` also stops it if the receiver panics.
            let t = s.spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    if !tx.step(N) {
                        std::thread::yield_now();
                    }
                }
                (tx.by_box, tx.by_ring)
            });
            let done_guard = Done(done);
            while rx.expected < N {
                if !rx.step() {
                    std::thread::yield_now();
                }
            }
            drop(done_guard);
            let (by_box, by_ring) = t.join().unwrap();
            assert_eq!(by_box + by_ring, N);
        });
        assert_eq!(take(&mut rx.fbox), None);
    }
}
