//! The shared-memory progress engine (the seed's
//! `mca_btl_sm_component_progress` and `btl_sm_process_pending_sends`).
//!
//! One engine per local rank. It owns, in caller-provided storage (no
//! allocation here; the Linux adapter passes `Vec`s sized once at start-up):
//!
//! - the reader handles of this rank's receive rings;
//! - a writer handle on each peer's ring `fifo_map(me)`;
//! - a descriptor per fragment of this rank's part (eager and max-size),
//!   with two process-local free lists (fragments always come home by ACK,
//!   so nothing else needs them);
//! - a bounded pending queue per peer, holding slot values (SENDs of our
//!   fragments, ACKs of theirs) that found the peer's ring full.
//!
//! # Protocol
//!
//! [`SmEngine::send`] copies the payload into a free fragment, stamps its
//! header (with the next sequence number towards that peer and the check
//! word) and pushes a SEND slot into the peer's ring, or appends it to the
//! peer's pending queue if the ring is full or the queue is not empty (so
//! per-peer order is kept). [`SmEngine::progress`] first retries pending
//! sends, then polls each receive ring and dispatches:
//!
//! - SEND: the fragment is validated ([`crate::sm::frag::read_frag`]: bounds,
//!   check word, lengths), its sequence number must be the next one from
//!   that sender, and it is handed to [`Dispatch::recv`]; then the same
//!   fragment goes back to its owner as an ACK naming us, with the status
//!   bit set if the handler refused it;
//! - ACK: it must name a rank that writes into this ring, and the
//!   fragment must be the oldest of ours in flight to that rank (ACKs come
//!   back in the order of the SENDs: each receiver handles one sender's
//!   SENDs in order and acknowledges each at once); then
//!   [`Dispatch::complete`] runs, the fragment is recycled and that peer's
//!   pending queue is retried.
//!
//! It returns the number of events, never blocks and never allocates.
//!
//! # Fragment pools, sized by use
//!
//! The layout gives each pool its room ([`crate::sm::layout`]); the engine
//! carves it by use: `free_list_num` eager fragments and one max-size one
//! at [`SmEngine::attach`], then `free_list_num` more whenever a send finds
//! a pool empty, up to its limit ([`SmEngine::set_pool_limits`], the room
//! by default). Each step first asks the platform for the memory
//! ([`Reserve`]); if it is refused the pools stay as they are, and senders
//! wait for their fragments to come back ([`SendError::NoFragment`]), as
//! they do at the limit. Free lists are LIFO, so the fragments in use are
//! the same few hot ones.
//!
//! # Fast boxes
//!
//! With fast boxes in the layout (`fbox_size` and `fbox_max` > 0), each
//! rank has a box directory and a pool of boxes in its part, and hands a
//! box to a sender once it has received `fbox_threshold` small messages
//! (ones a box would take) from it by ring, at most `fbox_max` boxes in
//! all (the hand-out protocol of [`crate::sm::fbox`]: the receiver
//! reserves and initialises the box, polls it from then on, and offers it
//! in the sender's directory word with a Release store; the sender reads
//! its word, Acquire, at its small sends until it has a box, checks the
//! offer names a fresh box of the receiver's pool, and attaches — a bad
//! offer is [`Corruption::BadOffer`], blamed on the receiver). Progress
//! polls only the boxes handed out. A box is never taken back; a failed
//! peer's box is not reused.
//!
//! [`SmEngine::send`] puts a message in its box — no fragment, no slot, no
//! ACK — when it needs no completion (`cookie` 0), fits the box's record
//! limit, the box has room, and no SEND of ours to that peer is waiting
//! for its ACK (the hand-off rule); otherwise it takes the ring as above.
//! [`SmEngine::progress`] polls the boxes before the rings and drains a
//! sender's box before dispatching a ring SEND from it, so per-peer order
//! holds across the two paths; box messages reach [`Dispatch::recv`] like
//! fragments, in place. A record that fails validation, or a reader's tail
//! our writer finds impossible, is [`PeerError::FastBox`], blamed on that
//! peer (it is the box's only other party). A rank that leaves waits for
//! its boxes to be read ([`SmEngine::fboxes_drained`]) as for its ACKs.
//!
//! # Corruption ends the conversation
//!
//! Anything else — a slot that does not decode, a SEND or ACK naming a
//! rank that cannot write into the ring it was read from, a fragment that
//! fails validation, a sequence number out of turn (a replayed, duplicated
//! or lost SEND), an ACK for a fragment not in flight to its sender or out
//! of turn (forged, duplicated or lost), a pending queue overflowing, or
//! ring counters that no honest writer leaves ([`SmEngine::audit_rings`]) —
//! can lose or misdirect messages, so the engine reports it
//! ([`Dispatch::error`]) and declares failed the peers it blames
//! ([`Dispatch::failed`]), exactly as the adapter fails a dead peer
//! ([`SmEngine::fail_peer`]). Shared memory cannot say who wrote a value,
//! so blame follows ownership ([`PeerError::blamed`]):
//!
//! - what is read from one of our rings is the ring's writers' (the peers
//!   `p` with `fifo_map(p) == ring`: exactly one when `num_fifos` is at
//!   least the number of local ranks, every peer with the seed's default
//!   of 1). A value that names a writer of that ring (a SEND's owner, an
//!   ACK's sender) is that writer's; one that names nobody, or inconsistent
//!   counters or a stalled slot, is every writer's (each may have lost a
//!   message there);
//! - a fragment, its header and its sequence number are its owner's.
//!
//! A process that scribbles on the segment therefore gets innocent peers
//! declared failed: the conversation ends either way, but never silently
//! and never after a timeout.
//!
//! # Bounds
//!
//! A pending queue holds at most one entry per fragment that can be
//! involved with that peer: ours (all could be queued to one peer) and the
//! peer's (each may need an ACK), so its capacity is
//! [`SmEngine::pending_capacity`] = 2 × fragments per rank. Only a peer that
//! sends the same fragment twice can overflow it (a peer error).
//!
//! # Failure
//!
//! [`SmEngine::fail_peer`] (called by the adapter when its liveness check
//! finds a peer dead, and by the engine itself on corruption) completes
//! every fragment in flight to that peer with an error, recycles them, drops
//! its pending queue and ignores its slots from then on.
//!
//! `unsafe` here: the in-place initialisation of this rank's part before
//! it is published ([`init_part`]), and of fragments and boxes of our part
//! before they are first handed out (carving, box hand-out).
#![allow(unsafe_code)]

use core::fmt;

use crate::shm::{Region, SegmentTable, ShmOffset};
use crate::sm::fbox::{self, Corruption, Fbox, FboxWriter};
use crate::sm::fifo::{fifo_map, Consumer, Fifo, RingFault};
use crate::sm::frag::{
    read_frag, FragHeader, FragInfo, FragType, FragView, Slot, SlotError, STATUS_BIT,
};
use crate::sm::layout::SegmentLayout;
use crate::sm::params::{SmParams, MAX_FBOX_MAX};
use crate::sync::{AtomicU64, Ordering};

mod desc;
mod errors;
mod geometry;
mod peer;
mod reserve;
mod stats;

use desc::DescState;
pub use desc::FragDesc;
pub use errors::{Blame, PeerError, SendError, SetupError};
use geometry::PartGeometry;
pub use peer::{PeerSlot, PeerState};
pub use reserve::{Backed, Reserve};
use stats::Stats;

/// Most local ranks one engine can address (size of its segment table).
pub const MAX_LOCAL_RANKS: usize = 1024;
/// Slots read from one ring per [`SmEngine::progress`] call at most, so one
/// busy sender cannot starve the other rings.
pub const POLL_BATCH: usize = 64;

const NONE: u32 = u32::MAX;
/// A held-back ACK's place in a pending queue ([`Received::Held`]); slot
/// values never have bit 63 set.
const HELD: u64 = u64::MAX;

/// What a receiver made of a SEND ([`Dispatch::recv`]): what its ACK
/// says, or that the ACK waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Received {
    /// Taken: the ACK carries no error.
    Accepted,
    /// Refused (no handler for the tag, the handler failed): the ACK
    /// carries the error status.
    Refused,
    /// Taken, but the receive goes on after the call (the fragment names
    /// memory the receiver still reads from): the ACK is held back, with
    /// every value after it to the same peer, until
    /// [`SmEngine::release_held`]. One per peer at a time; a second one
    /// while the first is held is refused.
    Held,
}

impl From<bool> for Received {
    /// `true` is [`Received::Accepted`], `false` [`Received::Refused`].
    #[inline(always)]
    fn from(ok: bool) -> Self {
        if ok {
            Self::Accepted
        } else {
            Self::Refused
        }
    }
}

/// What the engine calls back from [`SmEngine::progress`].
pub trait Dispatch {
    /// A SEND from `peer` with `tag` arrived; `frag.payload` holds exactly
    /// `frag.info.len` validated bytes. The answer decides the ACK
    /// ([`Received`]): none, with the error status, or held back.
    ///
    /// Messages from a peer's fast box come the same way (through
    /// [`Self::boxed`]'s provided method), in order with
    /// its ring messages, with `frag.header` `None` and the payload in
    /// place in the box (valid during the call); they have no ACK, so the
    /// answer is dropped: report what is refused another way, and do not
    /// hold a boxed message.
    fn recv(&mut self, peer: u32, tag: u8, frag: &FragView<'_>) -> Received;
    /// A message from `peer`'s fast box, in place in the box (`payload`,
    /// valid during the call; `part` is our part of the segment, which
    /// holds the box). The provided method hands it to [`Self::recv`] as a
    /// [`FragView`] without a header ([`deliver_boxed`]); an adapter may
    /// take the messages it hands on unchanged straight from `payload` (a
    /// layer less on the small-message path) and pass the others to
    /// [`deliver_boxed`]. An error is the box's corruption (the peer is
    /// failed).
    #[inline(always)]
    fn boxed(
        &mut self,
        part: &Region<'_>,
        peer: u32,
        tag: u8,
        payload: fbox::Payload<'_>,
    ) -> Result<(), Corruption>
    where
        Self: Sized,
    {
        deliver_boxed(part, peer, tag, payload, self)
    }
    /// A fragment we sent to `peer` with `cookie` came back; `ok` is false if
    /// the receiver reported an error or the peer failed.
    fn complete(&mut self, peer: u32, cookie: u64, ok: bool);
    /// A peer wrote something invalid (for counting and logging); the
    /// engine declares the peers it blames failed ([`Self::failed`]) and
    /// goes on with the others.
    fn error(&mut self, error: PeerError);
    /// The engine declares `peer` failed because of `why`, a corruption it
    /// blames on that peer (see the module docs): right after this call the
    /// fragments in flight to it complete with an error ([`Self::complete`]);
    /// nothing more is sent to it or accepted from it.
    fn failed(&mut self, peer: u32, why: PeerError);
}

/// What [`SmEngine::sweep_boxes`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    /// User messages handed out.
    pub delivered: usize,
    /// Whether a full [`SmEngine::progress`] pass has anything to do (in
    /// the boxes, the rings, the queues).
    pub rest: bool,
}

/// Initialises rank `me`'s part of the segment: its receive rings, all
/// FREE, and its box directory, empty (the part's head,
/// [`SegmentLayout::head_bytes`], which the platform reserves first).
///
/// # Safety
///
/// No other process or thread may access `me`'s part while this runs: it
/// is called before `me` marks itself ready in the control area, and peers
/// touch a part only after seeing that mark.
pub unsafe fn init_part(
    segment: &Region<'_>,
    layout: &SegmentLayout,
    params: &SmParams,
    me: u32,
) -> Result<(), SetupError> {
    let part_at = layout.part_offset(me)?;
    let part = segment.subregion(part_at as u64, layout.part_bytes)?;
    u16::try_from(me).map_err(|_| SetupError::Mismatch { what: "rank" })?;
    for ring in 0..layout.rings_per_rank {
        let at = (layout.ring_offset(me, ring)? - part_at) as u64;
        // SAFETY: exclusive access to our part (this function's contract).
        unsafe { Fifo::init(&part, at, params.fifo_size, params.fifo_lazy_free) }.map_err(
            |error| SetupError::Fifo {
                rank: me,
                ring,
                error,
            },
        )?;
    }
    // The box directory: every word 0, "no box".
    for sender in 0..layout.max_procs {
        let Ok(at) = layout.fbox_dir_offset(me, sender) else {
            break;
        };
        // SAFETY: as above.
        unsafe { part.write_in_place((at - part_at) as u64, AtomicU64::new(0))? };
    }
    // Boxes and fragments are initialised when the engine first uses them
    // (`SmEngine::attach`, `grow`, `hand_out_box`).
    Ok(())
}

/// The shared-memory engine of one local rank. `P`, `C`, `D`, `Q` are the
/// caller's storage (`Vec`s on Linux, arrays elsewhere), sized with
/// [`SmEngine::storage_sizes`].
///
/// The storage bounds (`P: AsMut<[PeerSlot]>`, ..., `R: Reserve`) are
/// stated once, on the `impl` that uses them.
pub struct SmEngine<'a, P, C, D, Q, R = Backed> {
    me: u32,
    nprocs: u32,
    num_fifos: u32,
    fifo_size: u32,
    /// Our rank in the owner field, and the ACK type: an ACK's slot value
    /// but for the offset and the status bit.
    ack_bits: u64,
    table: SegmentTable<'a, MAX_LOCAL_RANKS>,
    my_part: Region<'a>,
    geometry: PartGeometry,
    eager_capacity: u32,
    max_capacity: u32,
    peers: P,
    consumers: C,
    descs: D,
    pending: Q,
    pending_cap: u32,
    free_eager: u32,
    free_max: u32,
    outstanding: u32,
    pending_total: u32,
    /// Counters for the adapter's statistics.
    stats: Stats,
    /// Peers whose box a send found corrupt (failed at the next
    /// progress, which has the dispatcher).
    fbox_faults: u32,
    /// The layout (for peers' parts and our pools).
    layout: SegmentLayout,
    /// Offset of our part in the segment (for [`Reserve`]).
    part_at: u64,
    /// The platform's memory seam.
    reserve: R,
    /// Fragments of each pool carved so far (descriptors `0..eager_carved`
    /// and `eager_count..eager_count + max_carved`), and how far each may
    /// grow ([`Self::set_pool_limits`]).
    eager_carved: u32,
    max_carved: u32,
    eager_limit: u32,
    max_limit: u32,
    /// Fragments a pool grows by when it runs dry.
    grow_step: u32,
    /// A reservation failed: the pools stay as they are.
    pools_stuck: bool,
    /// Boxes of our pool handed out, and the senders they went to (the
    /// only boxes progress polls).
    boxes_out: u32,
    box_senders: [u16; MAX_FBOX_MAX as usize],
    /// Small messages by ring before a sender gets a box.
    fbox_threshold: u32,
    /// A box could not be reserved or initialised: no more are handed out.
    boxes_stuck: bool,
    /// Largest payload a box takes (0: no boxes).
    fbox_payload: u32,
}

impl<P, C, D, Q, R> fmt::Debug for SmEngine<'_, P, C, D, Q, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmEngine")
            .field("me", &self.me)
            .field("nprocs", &self.nprocs)
            .field("outstanding", &self.outstanding)
            .field("pending", &self.pending_total)
            .finish()
    }
}

/// Lengths the storage slices passed to [`SmEngine::attach`] must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StorageSizes {
    /// `PeerSlot`s: one per local rank.
    pub peers: usize,
    /// Consumers: one per receive ring.
    pub consumers: usize,
    /// Descriptors: one per fragment of a part.
    pub descs: usize,
    /// Pending slots: `peers × pending capacity`.
    pub pending: usize,
}

impl<'a, P, C, D, Q, R> SmEngine<'a, P, C, D, Q, R>
where
    P: AsMut<[PeerSlot<'a>]>,
    C: AsMut<[Option<Consumer<'a>>]>,
    D: AsMut<[FragDesc]>,
    Q: AsMut<[u64]>,
    R: Reserve,
{
    /// Storage lengths for `nprocs` ranks on `layout`.
    pub fn storage_sizes(layout: &SegmentLayout, nprocs: u32) -> Option<StorageSizes> {
        let descs = layout.eager_frags.checked_add(layout.max_frags)? as usize;
        let per_peer = Self::pending_capacity(layout)? as usize;
        Some(StorageSizes {
            peers: nprocs as usize,
            consumers: layout.rings_per_rank as usize,
            descs,
            pending: per_peer.checked_mul(nprocs as usize)?,
        })
    }

    /// [`Self::attach`] with storage of the lengths [`Self::storage_sizes`]
    /// names, collected from fresh entries: for storage types that can be
    /// built from an iterator, such as `Vec`.
    pub fn attach_collected(
        segment: &Region<'a>,
        layout: &SegmentLayout,
        params: &SmParams,
        me: u32,
        nprocs: u32,
        reserve: R,
    ) -> Result<Self, SetupError>
    where
        P: FromIterator<PeerSlot<'a>>,
        C: FromIterator<Option<Consumer<'a>>>,
        D: FromIterator<FragDesc>,
        Q: FromIterator<u64>,
    {
        let sizes = Self::storage_sizes(layout, nprocs).ok_or(SetupError::Mismatch {
            what: "storage size overflows",
        })?;
        Self::attach(
            segment,
            layout,
            params,
            me,
            nprocs,
            (0..sizes.peers).map(|_| PeerSlot::new()).collect(),
            (0..sizes.consumers).map(|_| None).collect(),
            (0..sizes.descs).map(|_| FragDesc::new()).collect(),
            (0..sizes.pending).map(|_| 0).collect(),
            reserve,
        )
    }

    /// Capacity of one peer's pending queue (see the module docs).
    pub fn pending_capacity(layout: &SegmentLayout) -> Option<u32> {
        layout
            .eager_frags
            .checked_add(layout.max_frags)?
            .checked_mul(2)
    }

    /// Builds the engine of rank `me` once every rank's part is initialised
    /// ([`init_part`]) and marked ready: claims our rings, attaches a writer
    /// to ring `fifo_map(me)` of every peer, lays out our descriptors and
    /// carves the first fragments (`free_list_num` eager ones and one
    /// max-size one), reserved through `reserve`
    /// ([`SetupError::OutOfMemory`] if it refuses). Pools grow by
    /// `free_list_num` fragments when they run dry.
    #[allow(clippy::too_many_arguments)]
    pub fn attach(
        segment: &Region<'a>,
        layout: &SegmentLayout,
        params: &SmParams,
        me: u32,
        nprocs: u32,
        mut peers: P,
        mut consumers: C,
        mut descs: D,
        mut pending: Q,
        reserve: R,
    ) -> Result<Self, SetupError> {
        let sizes = Self::storage_sizes(layout, nprocs).ok_or(SetupError::Mismatch {
            what: "storage size overflows",
        })?;
        if nprocs == 0 || me >= nprocs || nprocs > layout.max_procs {
            return Err(SetupError::Mismatch {
                what: "rank or job size outside the layout",
            });
        }
        if nprocs as usize > MAX_LOCAL_RANKS {
            return Err(SetupError::Mismatch {
                what: "more local ranks than MAX_LOCAL_RANKS",
            });
        }
        if peers.as_mut().len() != sizes.peers
            || consumers.as_mut().len() != sizes.consumers
            || descs.as_mut().len() != sizes.descs
            || pending.as_mut().len() != sizes.pending
        {
            return Err(SetupError::Mismatch {
                what: "storage lengths differ from storage_sizes()",
            });
        }
        let num_fifos = u32::try_from(params.num_fifos)
            .ok()
            .filter(|n| n.is_power_of_two())
            .ok_or(SetupError::Mismatch { what: "num_fifos" })?;

        let mut table = SegmentTable::new();
        for rank in 0..nprocs {
            let at = layout.part_offset(rank)?;
            let part = segment.subregion(at as u64, layout.part_bytes)?;
            table.insert(rank as u16, part)?;
        }
        let my_part = *table.region(me as u16)?;
        let part_at = layout.part_offset(me)? as u64;

        // Our rings.
        for (ring, slot) in consumers.as_mut().iter_mut().enumerate() {
            let ring = ring as u32;
            let at = layout.ring_offset(me, ring)? as u64 - part_at;
            let fifo = Fifo::attach(&my_part, at).map_err(|error| SetupError::Fifo {
                rank: me,
                ring,
                error,
            })?;
            *slot = Some(fifo.claim_consumer().map_err(|error| SetupError::Fifo {
                rank: me,
                ring,
                error,
            })?);
        }
        // A writer on each peer's ring for us.
        let my_ring = fifo_map(me, num_fifos);
        for (rank, slot) in peers.as_mut().iter_mut().enumerate() {
            let rank = rank as u32;
            *slot = PeerSlot::new();
            if rank == me {
                slot.state = PeerState::Me;
                continue;
            }
            let part = table.region(rank as u16)?;
            let at = (layout.ring_offset(rank, my_ring)? - layout.part_offset(rank)?) as u64;
            let fifo = Fifo::attach(part, at).map_err(|error| SetupError::Fifo {
                rank,
                ring: my_ring,
                error,
            })?;
            slot.producer = Some(fifo.producer());
            if layout.fbox_pool > 0 {
                // Our word in its box directory: where it offers us a box.
                let at = (layout.fbox_dir_offset(rank, me)? - layout.part_offset(rank)?) as u64;
                slot.fbox_offer = Some(part.resolve::<AtomicU64>(at)?);
            }
            slot.state = PeerState::Connected;
        }
        // Our fragments: eager ones first, then max-size ones.
        let geometry = PartGeometry {
            eager_start: layout
                .eager_frag_offset(me, 0)
                .map_or(0, |o| o as u64 - part_at),
            eager_bytes: layout.eager_frag_bytes as u64,
            eager_count: layout.eager_frags,
            max_start: layout
                .max_frag_offset(me, 0)
                .map_or(0, |o| o as u64 - part_at),
            max_bytes: layout.max_frag_bytes as u64,
            max_count: layout.max_frags,
        };
        for (i, d) in descs.as_mut().iter_mut().enumerate() {
            let i = i as u32;
            let (offset, capacity) = if i < layout.eager_frags {
                let o = geometry.eager_start + u64::from(i) * geometry.eager_bytes;
                (o, params.eager_limit)
            } else {
                let j = i - layout.eager_frags;
                let o = geometry.max_start + u64::from(j) * geometry.max_bytes;
                (o, params.max_send_size)
            };
            *d = FragDesc {
                offset,
                capacity,
                next: NONE,
                state: DescState::Free,
                peer: 0,
                cookie: 0,
            };
        }
        let first = u32::try_from(params.free_list_num).unwrap_or(0).max(1);
        let fbox_payload = if layout.fbox_pool > 0 {
            Fbox::max_payload(layout.fbox_size)
        } else {
            0
        };
        let ack_bits = ShmOffset::new(me as u16, 0)
            .map_err(|_| SetupError::Mismatch { what: "rank" })?
            .raw()
            | FragType::Ack as u64;
        Self {
            me,
            nprocs,
            num_fifos,
            fifo_size: params.fifo_size,
            ack_bits,
            table,
            my_part,
            geometry,
            eager_capacity: params.eager_limit,
            max_capacity: params.max_send_size,
            peers,
            consumers,
            descs,
            pending,
            pending_cap: sizes.pending as u32 / nprocs,
            free_eager: NONE,
            free_max: NONE,
            outstanding: 0,
            pending_total: 0,
            stats: Stats::new(),
            fbox_faults: 0,
            layout: *layout,
            part_at,
            reserve,
            eager_carved: 0,
            max_carved: 0,
            eager_limit: layout.eager_frags,
            max_limit: layout.max_frags,
            grow_step: first,
            pools_stuck: false,
            boxes_out: 0,
            box_senders: [0; MAX_FBOX_MAX as usize],
            fbox_threshold: params.fbox_threshold.max(1),
            boxes_stuck: false,
            fbox_payload,
        }
        .with_first_fragments(first)
    }

    /// Carves the first fragments (`attach`): `n` eager ones, one
    /// max-size one (the max-size pool grows only for messages that need
    /// it: they are the big ones, 64 KiB each by default).
    fn with_first_fragments(mut self, n: u32) -> Result<Self, SetupError> {
        for eager in [true, false] {
            let room = if eager {
                self.geometry.eager_count
            } else {
                self.geometry.max_count
            };
            let n = if eager { n } else { 1 };
            if !self.carve(eager, n.min(room)) {
                let bytes = if eager {
                    self.geometry.eager_bytes
                } else {
                    self.geometry.max_bytes
                };
                return Err(SetupError::OutOfMemory {
                    bytes: bytes * u64::from(n.min(room)),
                });
            }
        }
        Ok(self)
    }

    /// Limits how far each pool may grow (by use, up to the layout's room;
    /// never below what is carved already). The Linux adapter keeps the
    /// max-size pool at its first fragments when single copy carries large
    /// messages to every peer (see `btl_linux::sm`).
    pub fn set_pool_limits(&mut self, eager: u32, max: u32) {
        self.eager_limit = eager.clamp(self.eager_carved, self.geometry.eager_count);
        self.max_limit = max.clamp(self.max_carved, self.geometry.max_count);
    }

    /// Lets both pools grow to the layout's room again (after
    /// [`Self::set_pool_limits`]).
    pub fn lift_pool_limits(&mut self) {
        self.eager_limit = self.geometry.eager_count;
        self.max_limit = self.geometry.max_count;
    }

    /// Fragments carved so far: (eager, max-size).
    pub fn pool_sizes(&self) -> (u32, u32) {
        (self.eager_carved, self.max_carved)
    }

    /// Boxes of our pool handed out to senders.
    pub fn boxes_handed_out(&self) -> u32 {
        self.boxes_out
    }

    /// True once we attached a box in `peer`'s part (it offered one).
    pub fn has_box_to(&mut self, peer: u32) -> bool {
        self.peers
            .as_mut()
            .get(peer as usize)
            .is_some_and(|p| p.fbox_out.is_some())
    }

    /// Adds the next `n` fragments of a pool (eager or max-size) to its
    /// free list, after reserving their memory and initialising their
    /// headers. False if the memory could not be reserved (nothing is
    /// added then).
    fn carve(&mut self, eager: bool, n: u32) -> bool {
        let (carved, start, bytes, base) = if eager {
            let g = &self.geometry;
            (self.eager_carved, g.eager_start, g.eager_bytes, 0)
        } else {
            let g = &self.geometry;
            (self.max_carved, g.max_start, g.max_bytes, g.eager_count)
        };
        if n == 0 {
            return true;
        }
        let from = start + u64::from(carved) * bytes;
        let len = u64::from(n) * bytes;
        if !self.reserve.reserve(self.part_at + from, len) {
            return false;
        }
        let owner = self.me as u16;
        for i in (carved..carved + n).rev() {
            let idx = base + i;
            let Some(d) = self.descs.as_mut().get(idx as usize).copied() else {
                return false;
            };
            // SAFETY: the fragment was never handed out (it is past the
            // carved end of its pool), so nothing in this process accesses
            // it, and no honest peer touches a fragment of ours before we
            // send it.
            if unsafe { FragHeader::init(&self.my_part, d.offset, owner, d.capacity) }.is_err() {
                return false;
            }
            let head = if eager {
                &mut self.free_eager
            } else {
                &mut self.free_max
            };
            let d = &mut self.descs.as_mut()[idx as usize];
            d.next = *head;
            *head = idx;
        }
        if eager {
            self.eager_carved += n;
        } else {
            self.max_carved += n;
        }
        true
    }

    /// Grows a dry pool by one step, if it may; true if it grew.
    fn grow(&mut self, eager: bool) -> bool {
        let (carved, limit) = if eager {
            (self.eager_carved, self.eager_limit)
        } else {
            (self.max_carved, self.max_limit)
        };
        if self.pools_stuck || carved >= limit {
            return false;
        }
        let n = self.grow_step.min(limit - carved);
        if self.carve(eager, n) {
            true
        } else {
            self.pools_stuck = true;
            false
        }
    }

    /// This rank.
    pub fn me(&self) -> u32 {
        self.me
    }

    /// Number of local ranks.
    pub fn nprocs(&self) -> u32 {
        self.nprocs
    }

    /// `num_fifos`: sender `s` writes into ring `fifo_map(s, num_fifos)` of
    /// each receiver.
    pub fn num_fifos(&self) -> u32 {
        self.num_fifos
    }

    /// Largest payload of an eager fragment.
    pub fn eager_payload(&self) -> u32 {
        self.eager_capacity
    }

    /// Largest payload of one fragment.
    pub fn max_payload(&self) -> u32 {
        self.max_capacity
    }

    /// Fragments of ours waiting for an ACK (in rings or pending).
    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    /// Slot values waiting in pending queues.
    pub fn pending(&self) -> u32 {
        self.pending_total
    }

    /// Slot values that ever had to wait in a pending queue (a full ring or
    /// an earlier pending value to the same peer).
    pub fn queued_total(&self) -> u64 {
        self.stats.queued_total()
    }

    /// Ring slots stepped over so far because a writer that failed left
    /// them reserved and unwritten ([`Self::audit_rings`]).
    pub fn slots_skipped(&self) -> u64 {
        self.stats.slots_skipped()
    }

    /// Messages sent through fast boxes (no fragment, no ACK).
    pub fn fbox_sent(&self) -> u64 {
        self.stats.fbox_sent()
    }

    /// Messages received through fast boxes.
    pub fn fbox_received(&self) -> u64 {
        self.stats.fbox_received()
    }

    /// True when every fast box we write to a connected peer has been read
    /// to its end (a rank that leaves waits for this as for its ACKs). A
    /// box found corrupt here fails its peer at the next progress pass.
    pub fn fboxes_drained(&mut self) -> bool {
        let mut all = true;
        for p in self.peers.as_mut().iter_mut() {
            if p.state != PeerState::Connected {
                continue;
            }
            match p.fbox_out.as_mut().map(FboxWriter::drained) {
                None | Some(Ok(true)) => {}
                Some(Ok(false)) => all = false,
                Some(Err(_)) => {
                    self.fbox_faults += 1;
                    all = false;
                }
            }
        }
        all
    }

    /// The seed's flow-control test: more than half a ring's worth of our
    /// fragments is outstanding, so progress before sending more.
    pub fn congested(&self) -> bool {
        self.outstanding.saturating_mul(2) > self.fifo_size
    }

    /// A peer's state (`None` for an index out of range).
    pub fn peer_state(&mut self, peer: u32) -> Option<PeerState> {
        self.peers.as_mut().get(peer as usize).map(|p| p.state)
    }

    /// Fragments of ours in flight to `peer`.
    pub fn in_flight_to(&mut self, peer: u32) -> u32 {
        self.peers
            .as_mut()
            .get(peer as usize)
            .map_or(0, |p| p.in_flight)
    }

    /// True if one of our rings has a slot reserved by a writer but not yet
    /// published (a writer that dies inside its push leaves this state).
    pub fn reservation_stalled(&mut self) -> bool {
        self.consumers
            .as_mut()
            .iter()
            .flatten()
            .any(Consumer::reservation_pending)
    }

    /// The fast path of a small user message: the concatenation of
    /// `parts` into `peer`'s fast box, when the peer is connected, has
    /// handed us a box with room, and has no ring message of ours in
    /// flight. True when the box took it (as [`Self::send`] with cookie 0
    /// would have); false when nothing was sent, for any reason: then
    /// [`Self::send`] decides (and reports what went wrong — a corrupt box
    /// the writer noticed stays noticed).
    ///
    /// Inline into the caller (the box write included), so that a caller
    /// that knows its pieces' count (the C ABI's `btl_sendi`: one or two)
    /// gets the write compiled for it.
    #[inline(always)]
    pub fn try_send_boxed(&mut self, peer: u32, tag: u8, parts: &[&[u8]]) -> bool {
        let Some(p) = self.peers.as_mut().get_mut(peer as usize) else {
            return false;
        };
        if p.state != PeerState::Connected || !crate::tags::is_user(tag) {
            return false;
        }
        let Some(w) = p.fbox_out.as_mut() else {
            return false;
        };
        if w.send_inline(tag, parts, p.in_flight).is_ok() {
            self.stats.box_sent();
            true
        } else {
            false
        }
    }

    /// Sends the concatenation of `parts` (one fragment: at most
    /// [`Self::max_payload`] bytes) to `peer` with `tag`. `cookie` comes back
    /// in [`Dispatch::complete`] when the peer has handled it.
    ///
    /// The path of most small messages (a box handed out already, the peer
    /// connected) is inline; everything else is `send_general`.
    #[inline]
    pub fn send(
        &mut self,
        peer: u32,
        tag: u8,
        parts: &[&[u8]],
        cookie: u64,
    ) -> Result<(), SendError> {
        let boxed = self
            .peers
            .as_mut()
            .get(peer as usize)
            .is_some_and(|p| p.state == PeerState::Connected && p.fbox_out.is_some());
        if cookie == 0 && boxed {
            // Not taken: the general path checks again (a message too large
            // for a fragment is refused as such), without a second try.
            return match self.try_box(peer, tag, parts) {
                Some(r) => r,
                None => self.send_general(peer, tag, parts, cookie, false),
            };
        }
        self.send_general(peer, tag, parts, cookie, true)
    }

    /// The message into `peer`'s fast box, if we have one: `Some` with the
    /// outcome when the box took it or was found corrupt, `None` when it
    /// must go by the ring (full, too large, ring messages in flight).
    #[inline]
    fn try_box(&mut self, peer: u32, tag: u8, parts: &[&[u8]]) -> Option<Result<(), SendError>> {
        let p = self.peers.as_mut().get_mut(peer as usize)?;
        let sent = p
            .fbox_out
            .as_mut()?
            .try_send_vectored(tag, parts, p.in_flight);
        match sent {
            Ok(()) => {
                self.stats.box_sent();
                Some(Ok(()))
            }
            Err(fbox::SendError::Corrupt(_)) => {
                // The peer is failed by the next progress pass (it has the
                // dispatcher).
                self.fbox_faults += 1;
                Some(Err(SendError::PeerFailed { peer }))
            }
            Err(
                fbox::SendError::Full
                | fbox::SendError::TooLarge { .. }
                | fbox::SendError::RingBusy { .. },
            ) => None,
        }
    }

    /// [`Self::send`] with every check; `try_box` false when the box was
    /// tried already.
    #[inline(never)]
    fn send_general(
        &mut self,
        peer: u32,
        tag: u8,
        parts: &[&[u8]],
        cookie: u64,
        try_box: bool,
    ) -> Result<(), SendError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let (max_capacity, pending_cap) = (self.max_capacity, self.pending_cap);
        let pslot = self
            .peers
            .as_mut()
            .get_mut(peer as usize)
            .ok_or(SendError::InvalidPeer { peer })?;
        match pslot.state {
            PeerState::Me => return Err(SendError::InvalidPeer { peer }),
            PeerState::Failed => return Err(SendError::PeerFailed { peer }),
            PeerState::Connected => {}
        }
        if len > max_capacity as usize {
            return Err(SendError::TooLarge {
                len,
                max: max_capacity,
            });
        }
        // The fast box first: a message that needs no ACK (cookie 0), small
        // enough, with nothing of ours to this peer in flight by the ring
        // (the hand-off rule, `fbox` module docs).
        if cookie == 0 && try_box {
            if pslot.fbox_out.is_none() && len <= self.fbox_payload as usize {
                // Has the peer offered us a box? One Acquire load of a
                // read-mostly word, only while we have none.
                let word = pslot.fbox_offer.map_or(0, |w| w.load(Ordering::Acquire));
                if word != 0 {
                    pslot.fbox_offer = None;
                    match offered_box(&self.layout, &self.table, self.me, peer, word) {
                        Ok(w) => pslot.fbox_out = Some(w),
                        Err(e) => {
                            pslot.offer_fault = Some(e);
                            self.fbox_faults += 1;
                            return Err(SendError::PeerFailed { peer });
                        }
                    }
                }
            }
            if let Some(r) = self.try_box(peer, tag, parts) {
                return r;
            }
        }
        let pslot = &mut self.peers.as_mut()[peer as usize];
        // Our own queue to this peer must have room for the SEND.
        if pslot.pending_len >= pending_cap {
            return Err(SendError::Backlog { peer });
        }
        let seq = pslot.send_seq;
        let idx = self.alloc(len).ok_or(SendError::NoFragment)?;
        let desc = self.descs.as_mut()[idx as usize];
        let payload_at = desc.offset + crate::sm::frag::FRAG_HEADER_SIZE as u64;
        let mut pos = payload_at;
        for part in parts {
            // In bounds: len <= capacity, checked by `alloc`; a failure here
            // would mean our own part is broken, reported as NoFragment.
            if self.my_part.write_bytes(pos, part).is_err() {
                self.free(idx);
                return Err(SendError::NoFragment);
            }
            pos += part.len() as u64;
        }
        let Ok(header) = self.my_part.resolve::<FragHeader>(desc.offset) else {
            self.free(idx);
            return Err(SendError::NoFragment);
        };
        // Every field, owner and capacity too: a header scribbled on by
        // another process is whole again from its next send on.
        header.stamp(self.me as u16, desc.capacity, tag, len as u32, seq);
        // `me < MAX_LOCAL_RANKS` and offsets inside a part: always encodable.
        let Ok(frag) = ShmOffset::new(self.me as u16, desc.offset) else {
            self.free(idx);
            return Err(SendError::NoFragment);
        };
        let value = Slot {
            kind: FragType::Send,
            error: false,
            frag,
        }
        .encode();
        // The queue had room (checked above), so this cannot fail; were it
        // to, give the fragment back rather than leak it.
        if self.push_or_queue(peer, value).is_err() {
            self.free(idx);
            return Err(SendError::Backlog { peer });
        }
        let d = &mut self.descs.as_mut()[idx as usize];
        d.state = DescState::InFlight;
        d.peer = peer;
        d.cookie = cookie;
        d.next = NONE;
        self.outstanding += 1;
        let p = &mut self.peers.as_mut()[peer as usize];
        p.send_seq = seq.wrapping_add(1);
        p.in_flight += 1;
        let newest = core::mem::replace(&mut p.newest, idx);
        if newest == NONE {
            p.oldest = idx;
        } else {
            self.descs.as_mut()[newest as usize].next = idx;
        }
        Ok(())
    }

    /// Pops a free fragment big enough for `len` payload bytes (eager if it
    /// fits, else max-size).
    fn alloc(&mut self, len: usize) -> Option<u32> {
        let use_eager = len <= self.eager_capacity as usize;
        if use_eager && self.free_eager == NONE {
            self.grow(true);
        }
        if self.free_max == NONE && !(use_eager && self.free_eager != NONE) {
            self.grow(false);
        }
        let head = if use_eager && self.free_eager != NONE {
            &mut self.free_eager
        } else if self.free_max != NONE {
            &mut self.free_max
        } else {
            return None;
        };
        let idx = *head;
        let d = self.descs.as_mut().get(idx as usize)?;
        if (d.capacity as usize) < len {
            return None;
        }
        *head = d.next;
        Some(idx)
    }

    fn free(&mut self, idx: u32) {
        let eager_count = self.geometry.eager_count;
        let head = if idx < eager_count {
            &mut self.free_eager
        } else {
            &mut self.free_max
        };
        if let Some(d) = self.descs.as_mut().get_mut(idx as usize) {
            d.state = DescState::Free;
            d.next = *head;
            *head = idx;
        }
    }

    /// Pushes `value` to `peer`'s ring, or queues it behind earlier pending
    /// values. Err only if the queue is full.
    fn push_or_queue(&mut self, peer: u32, value: u64) -> Result<(), PeerError> {
        let p = &mut self.peers.as_mut()[peer as usize];
        if p.pending_len == 0 {
            if let Some(producer) = p.producer.as_mut() {
                // Slot values are never FREE (bit 63 clear), so the only
                // refusal is a full ring.
                if producer.push(value).is_ok() {
                    return Ok(());
                }
            }
        }
        self.enqueue(peer, value)
    }

    /// Appends `value` to `peer`'s pending queue.
    fn enqueue(&mut self, peer: u32, value: u64) -> Result<(), PeerError> {
        let cap = self.pending_cap;
        let p = &mut self.peers.as_mut()[peer as usize];
        if p.pending_len >= cap {
            return Err(PeerError::PendingOverflow { peer });
        }
        let at = (peer * cap + (p.pending_head + p.pending_len) % cap) as usize;
        p.pending_len += 1;
        self.pending.as_mut()[at] = value;
        self.pending_total += 1;
        self.stats.queued();
        Ok(())
    }

    /// Holds back the ACK `ack` to `peer` ([`Received::Held`]): a
    /// placeholder in its pending queue keeps every later value behind it,
    /// so ACKs still leave in the order of the peer's SENDs. A second one
    /// while one is held is refused at once (behind the first).
    fn hold_ack(&mut self, peer: u32, ack: u64) -> Result<(), PeerError> {
        if self.peers.as_mut()[peer as usize].held_ack.is_some() {
            return self.push_or_queue(peer, ack | STATUS_BIT);
        }
        self.enqueue(peer, HELD)?;
        self.peers.as_mut()[peer as usize].held_ack = Some(ack);
        Ok(())
    }

    /// Lets the ACK held back for `peer` ([`Received::Held`]) go, with the
    /// error status unless `ok`, and the values queued behind it. False
    /// when none is held (never was, or the peer failed meanwhile).
    pub fn release_held(&mut self, peer: u32, ok: bool) -> bool {
        let cap = self.pending_cap;
        let Some(p) = self.peers.as_mut().get_mut(peer as usize) else {
            return false;
        };
        let Some(ack) = p.held_ack.take() else {
            return false;
        };
        let (head, len) = (p.pending_head, p.pending_len);
        let base = (peer * cap) as usize;
        let queue = &mut self.pending.as_mut()[base..base + cap as usize];
        if let Some(at) = (0..len)
            .map(|i| ((head + i) % cap) as usize)
            .find(|&at| queue[at] == HELD)
        {
            queue[at] = ack | if ok { 0 } else { STATUS_BIT };
        }
        self.flush_pending(peer);
        true
    }

    /// Retries `peer`'s pending values in order until its ring is full.
    /// Returns how many went out.
    fn flush_pending(&mut self, peer: u32) -> usize {
        let cap = self.pending_cap;
        let base = (peer * cap) as usize;
        let p = &mut self.peers.as_mut()[peer as usize];
        let Some(producer) = p.producer.as_mut() else {
            return 0;
        };
        let queue = &mut self.pending.as_mut()[base..base + cap as usize];
        let mut sent = 0;
        while p.pending_len > 0 {
            let value = queue[p.pending_head as usize];
            if value == HELD || producer.push(value).is_err() {
                break;
            }
            p.pending_head = (p.pending_head + 1) % cap;
            p.pending_len -= 1;
            sent += 1;
        }
        self.pending_total -= sent as u32;
        sent
    }

    /// The small-message lane: hands the user messages waiting in our fast
    /// boxes to `f` (sender, tag, payload in place, valid during the call),
    /// in order, up to [`POLL_BATCH`] per box, without the rest of a
    /// [`Self::progress`] pass (rings, queued sends, faults: no
    /// [`Dispatch`]). [`Sweep::rest`] says whether a full pass has
    /// anything to do: a record with a protocol tag (left in its box,
    /// unread), a box found corrupt (the pass fails its peer), a full
    /// batch, a box a send found corrupt, a ring slot waiting, values
    /// queued for full rings. One load per box and per ring when idle.
    ///
    /// A box's records are older than every ring SEND of its sender not
    /// yet dispatched (the hand-off rule, [`crate::sm::fbox`]), so a sweep
    /// before, between or instead of passes keeps every peer's order.
    #[cfg(not(loom))]
    pub fn sweep_boxes(&mut self, mut f: impl FnMut(u32, u8, &[u8])) -> Sweep {
        let mut sweep = Sweep {
            delivered: 0,
            rest: self.fbox_faults > 0 || self.pending_total > 0,
        };
        for i in 0..self.boxes_out as usize {
            let Some(&sender) = self.box_senders.get(i) else {
                break;
            };
            let peer = u32::from(sender);
            let Some(p) = self.peers.as_mut().get_mut(peer as usize) else {
                continue;
            };
            let Some(reader) = p
                .fbox_in
                .as_mut()
                .filter(|_| p.state == PeerState::Connected)
            else {
                continue;
            };
            let mut n = 0;
            loop {
                if n == POLL_BATCH {
                    sweep.rest = true;
                    break;
                }
                match reader.poll() {
                    Ok(None) => break,
                    Ok(Some(rec)) if crate::tags::is_user(rec.tag()) => {
                        f(peer, rec.tag(), rec.payload().as_bytes());
                        drop(rec);
                        n += 1;
                    }
                    Ok(Some(rec)) => {
                        // Not consumed: the full pass dispatches it.
                        core::mem::forget(rec);
                        sweep.rest = true;
                        break;
                    }
                    Err(_) => {
                        // The reader keeps its failure: the full pass's
                        // poll finds it again and fails the peer.
                        sweep.rest = true;
                        break;
                    }
                }
            }
            self.stats.boxes_received(n as u64);
            sweep.delivered += n;
        }
        if !sweep.rest {
            sweep.rest = self
                .consumers
                .as_mut()
                .iter()
                .any(|c| c.as_ref().is_some_and(|c| !c.is_empty()));
        }
        sweep
    }

    /// One pass of the progress engine (see the module docs). Returns the
    /// number of events (slots handled and pending values sent).
    pub fn progress<H: Dispatch>(&mut self, d: &mut H) -> usize {
        let mut events = 0;
        if self.fbox_faults > 0 {
            self.fail_fbox_faults(d);
        }
        if self.pending_total > 0 {
            for peer in 0..self.nprocs {
                if self.peers.as_mut()[peer as usize].pending_len > 0 {
                    events += self.flush_pending(peer);
                }
            }
        }
        // The fast boxes, before the rings: every record in a box is older
        // than every ring SEND of its sender not yet dispatched (the
        // hand-off rule), and `on_send` drains the box before a ring SEND.
        for i in 0..self.boxes_out as usize {
            let peer = u32::from(self.box_senders[i]);
            events += self.poll_fbox(peer, d);
        }
        let rings = self.consumers.as_mut().len();
        for ring in 0..rings {
            // The idle pass: one load per ring, no call.
            if self.consumers.as_mut()[ring]
                .as_ref()
                .is_some_and(|c| !c.is_empty())
            {
                events += self.poll_ring(ring, d);
            }
        }
        events
    }

    /// Dispatches up to [`POLL_BATCH`] slots of ring `ring`; returns how
    /// many.
    #[inline(never)]
    fn poll_ring<H: Dispatch>(&mut self, ring: usize, d: &mut H) -> usize {
        let mut events = 0;
        for _ in 0..POLL_BATCH {
            let Some(value) = self.consumers.as_mut()[ring]
                .as_mut()
                .and_then(Consumer::pop)
            else {
                break;
            };
            events += 1;
            self.dispatch(ring as u32, value, d);
        }
        events
    }

    /// Returns every consumed slot of our rings to the writers now (call
    /// when idle: see `Consumer::release_consumed`).
    pub fn release_consumed(&mut self) {
        for c in self.consumers.as_mut().iter_mut().flatten() {
            c.release_consumed();
        }
    }

    fn dispatch<H: Dispatch>(&mut self, ring: u32, value: u64, d: &mut H) {
        let slot = match Slot::decode(value) {
            Ok(s) => s,
            Err(error) => return self.corrupted(PeerError::BadSlot { ring, error }, d),
        };
        // The rank the slot names (a SEND's owner, an ACK's sender) must be
        // one that writes into this ring.
        let from = u32::from(slot.frag.owner());
        if from >= self.nprocs || from == self.me || fifo_map(from, self.num_fifos) != ring {
            return self.corrupted(PeerError::BadSender { ring, owner: from }, d);
        }
        if self.peers.as_mut()[from as usize].state != PeerState::Connected {
            // Late slots of a peer declared failed (or gone): ignored.
            return;
        }
        match slot.kind {
            FragType::Send => self.on_send(from, slot, d),
            FragType::Ack => self.on_ack(from, slot, d),
            // decode() refuses PUT/GET.
            FragType::Put | FragType::Get => self.corrupted(
                PeerError::BadSlot {
                    ring,
                    error: SlotError::UnsupportedType {
                        kind: slot.kind,
                        raw: value,
                    },
                },
                d,
            ),
        }
    }

    /// Delivers up to [`POLL_BATCH`] messages from `peer`'s fast box;
    /// returns how many. A corrupt box fails the peer.
    #[inline]
    fn poll_fbox<H: Dispatch>(&mut self, peer: u32, d: &mut H) -> usize {
        let p = &self.peers.as_mut()[peer as usize];
        match &p.fbox_in {
            // The idle pass: one load of the box's next header, no call.
            Some(reader) if p.state == PeerState::Connected && !reader.idle() => {
                self.poll_fbox_records(peer, d)
            }
            _ => 0,
        }
    }

    /// [`Self::poll_fbox`] once the box holds something (or failed).
    #[inline(never)]
    fn poll_fbox_records<H: Dispatch>(&mut self, peer: u32, d: &mut H) -> usize {
        let part = self.my_part;
        let mut n = 0;
        let p = &mut self.peers.as_mut()[peer as usize];
        let Some(reader) = p
            .fbox_in
            .as_mut()
            .filter(|_| p.state == PeerState::Connected)
        else {
            return 0;
        };
        let error = loop {
            // After a record, one load says whether another follows (the
            // usual answer in a ping-pong is no: no second full poll).
            if n == POLL_BATCH || (n > 0 && reader.idle()) {
                break None;
            }
            match reader.poll() {
                Ok(None) => break None,
                Ok(Some(rec)) => {
                    let delivered = d.boxed(&part, peer, rec.tag(), rec.payload());
                    drop(rec);
                    if let Err(e) = delivered {
                        break Some(e);
                    }
                    n += 1;
                }
                Err(e) => break Some(e),
            }
        };
        self.stats.boxes_received(n as u64);
        if let Some(error) = error {
            self.corrupted(PeerError::FastBox { peer, error }, d);
        }
        n
    }

    /// Delivers every message in `peer`'s fast box (before one of its ring
    /// SENDs: the hand-off rule). False if the box was corrupt (the peer
    /// is then failed).
    fn drain_fbox<H: Dispatch>(&mut self, peer: u32, d: &mut H) -> bool {
        let part = self.my_part;
        let Some(reader) = self.peers.as_mut()[peer as usize].fbox_in.as_mut() else {
            return true;
        };
        let mut bad = None;
        let drained = reader.drain(|tag, payload| {
            if bad.is_none() {
                bad = d.boxed(&part, peer, tag, payload).err();
            }
        });
        let error = match (drained, bad) {
            (Ok(n), None) => {
                self.stats.boxes_received(u64::from(n));
                return true;
            }
            (_, Some(e)) | (Err(e), None) => e,
        };
        self.corrupted(PeerError::FastBox { peer, error }, d);
        false
    }

    /// Fails the peers whose box a send found corrupt.
    fn fail_fbox_faults<H: Dispatch>(&mut self, d: &mut H) {
        self.fbox_faults = 0;
        for peer in 0..self.nprocs {
            let p = &self.peers.as_mut()[peer as usize];
            let fault = p
                .fbox_out
                .as_ref()
                .and_then(FboxWriter::failure)
                .or(p.offer_fault);
            if let (Some(error), PeerState::Connected) = (fault, p.state) {
                self.corrupted(PeerError::FastBox { peer, error }, d);
            }
        }
    }

    fn on_send<H: Dispatch>(&mut self, owner: u32, slot: Slot, d: &mut H) {
        if !self.drain_fbox(owner, d) {
            return;
        }
        let view = match read_frag(&self.table, slot.frag, self.max_capacity) {
            Ok(view) => view,
            Err(error) => {
                return self.corrupted(PeerError::BadFragment { peer: owner, error }, d);
            }
        };
        let p = &mut self.peers.as_mut()[owner as usize];
        if view.info.seq != p.recv_seq {
            let expected = p.recv_seq;
            return self.corrupted(
                PeerError::BadSequence {
                    peer: owner,
                    expected,
                    found: view.info.seq,
                },
                d,
            );
        }
        p.recv_seq = p.recv_seq.wrapping_add(1);
        let small = view.info.len <= self.fbox_payload && p.fbox_in.is_none();
        let verdict = d.recv(owner, view.info.tag, &view);
        // The same fragment back, naming us: `Slot::into_ack`, with the
        // owner bits computed once.
        let ack = slot.frag.offset() | self.ack_bits;
        let sent = match verdict {
            Received::Accepted => self.push_or_queue(owner, ack),
            Received::Refused => self.push_or_queue(owner, ack | STATUS_BIT),
            Received::Held => self.hold_ack(owner, ack),
        };
        if let Err(e) = sent {
            return self.corrupted(e, d);
        }
        // A box for a peer that keeps sending small messages by ring.
        if small && self.boxes_out < self.layout.fbox_pool && !self.boxes_stuck {
            let p = &mut self.peers.as_mut()[owner as usize];
            p.small_in += 1;
            if p.small_in >= self.fbox_threshold {
                self.hand_out_box(owner);
            }
        }
    }

    /// Hands the next box of our pool to `sender`: reserves and
    /// initialises it for `sender`, starts polling it, and offers it in
    /// `sender`'s word of our box directory (the `fbox` module's hand-out
    /// protocol). Without memory for it, no more boxes are handed out.
    fn hand_out_box(&mut self, sender: u32) {
        let k = self.boxes_out;
        let layout = self.layout;
        let (Ok(at), Ok(dir)) = (
            layout.fbox_pool_offset(self.me, k),
            layout.fbox_dir_offset(self.me, sender),
        ) else {
            self.boxes_stuck = true;
            return;
        };
        if !self.reserve.reserve(at as u64, layout.fbox_bytes as u64) {
            self.boxes_stuck = true;
            return;
        }
        let local = at as u64 - self.part_at;
        let dir = dir as u64 - self.part_at;
        // SAFETY: box `k` of our pool was never handed out (`boxes_out` only
        // grows), so no reader of it exists in this process, and no honest
        // peer touches it before the offer below is published.
        let reader = unsafe { Fbox::init(&self.my_part, local, layout.fbox_size, sender) };
        let (Ok(reader), Ok(word), Ok(slot)) = (
            reader,
            ShmOffset::new(self.me as u16, local),
            self.my_part.resolve::<AtomicU64>(dir),
        ) else {
            self.boxes_stuck = true;
            return;
        };
        self.peers.as_mut()[sender as usize].fbox_in = Some(reader);
        self.box_senders[k as usize] = sender as u16;
        self.boxes_out += 1;
        // Release: pairs with the sender's Acquire load of its word, so a
        // sender that sees the offer sees the initialised box.
        slot.store(word.raw(), Ordering::Release);
    }

    fn on_ack<H: Dispatch>(&mut self, peer: u32, slot: Slot, d: &mut H) {
        let offset = slot.frag.offset();
        let Some(idx) = self.geometry.index_of(offset) else {
            return self.corrupted(PeerError::UnknownAck { peer, offset }, d);
        };
        let desc = self.descs.as_mut()[idx as usize];
        if desc.state != DescState::InFlight {
            return self.corrupted(PeerError::UnexpectedAck { peer, offset }, d);
        }
        if desc.peer != peer {
            let sent_to = desc.peer;
            return self.corrupted(
                PeerError::ForgedAck {
                    peer,
                    offset,
                    sent_to,
                },
                d,
            );
        }
        let p = &mut self.peers.as_mut()[peer as usize];
        if p.oldest != idx {
            return self.corrupted(PeerError::AckOutOfOrder { peer, offset }, d);
        }
        p.oldest = desc.next;
        if p.oldest == NONE {
            p.newest = NONE;
        }
        p.in_flight = p.in_flight.saturating_sub(1);
        // The callbacks cannot reach the engine: this stays true meanwhile.
        let pending = p.pending_len > 0;
        self.free(idx);
        self.outstanding -= 1;
        d.complete(peer, desc.cookie, !slot.error);
        if pending {
            self.flush_pending(peer);
        }
    }

    /// Reports `error` and declares failed the peers it is blamed on.
    fn corrupted<H: Dispatch>(&mut self, error: PeerError, d: &mut H) {
        d.error(error);
        match error.blamed() {
            Blame::Peer { peer } => self.fail_blamed(peer, error, d),
            Blame::Writers { ring } => {
                for peer in 0..self.nprocs {
                    if peer != self.me && fifo_map(peer, self.num_fifos) == ring {
                        self.fail_blamed(peer, error, d);
                    }
                }
            }
        }
    }

    fn fail_blamed<H: Dispatch>(&mut self, peer: u32, why: PeerError, d: &mut H) {
        if self.peer_state(peer) == Some(PeerState::Connected) {
            d.failed(peer, why);
            self.fail_peer(peer, d);
        }
    }

    /// Checks the shared state of our rings ([`Consumer::audit`]) and
    /// declares the writers of a faulty one failed (see the module docs).
    /// Call it now and then, off the fast path (the Linux adapter does with
    /// its liveness checks); `stall_audits`: audits in a row a reserved
    /// slot may stay unwritten before it is a fault (0: never).
    pub fn audit_rings<H: Dispatch>(&mut self, stall_audits: u32, d: &mut H) {
        for ring in 0..self.consumers.as_mut().len() {
            let fault = self.consumers.as_mut()[ring]
                .as_mut()
                .map(|c| c.audit(stall_audits));
            if let Some(Err(fault)) = fault {
                let ring = ring as u32;
                let (me, nprocs, nfifos) = (self.me, self.nprocs, self.num_fifos);
                let peers = self.peers.as_mut();
                let writer_in = |state: PeerState| {
                    (0..nprocs).any(|p| {
                        p != me && fifo_map(p, nfifos) == ring && peers[p as usize].state == state
                    })
                };
                let (writers_left, writer_failed) = (
                    writer_in(PeerState::Connected),
                    writer_in(PeerState::Failed),
                );
                // A reservation left unwritten while a writer of the ring has
                // failed is that writer's (killed inside its push): step over
                // it rather than blame the ring's other writers.
                if matches!(fault, RingFault::Stalled { .. }) && writer_failed {
                    let skipped = self.consumers.as_mut()[ring as usize]
                        .as_mut()
                        .is_some_and(Consumer::skip_stalled);
                    self.stats.skipped(u64::from(skipped));
                    continue;
                }
                // A ring nobody may write to any more is nobody's concern.
                if writers_left {
                    self.corrupted(PeerError::Ring { ring, fault }, d);
                }
            }
        }
    }

    /// Declares `peer` failed: completes every fragment in flight to it with
    /// an error (and recycles it), drops its pending queue, and ignores it
    /// from now on. Returns the number of fragments completed.
    pub fn fail_peer<H: Dispatch>(&mut self, peer: u32, d: &mut H) -> usize {
        let Some(p) = self.peers.as_mut().get_mut(peer as usize) else {
            return 0;
        };
        if p.state != PeerState::Connected {
            return 0;
        }
        p.state = PeerState::Failed;
        p.held_ack = None;
        p.producer = None;
        p.fbox_out = None;
        p.fbox_in = None;
        self.pending_total -= p.pending_len;
        p.pending_len = 0;
        p.pending_head = 0;
        p.in_flight = 0;
        let mut idx = core::mem::replace(&mut p.oldest, NONE);
        p.newest = NONE;
        let mut completed = 0;
        while idx != NONE {
            let desc = self.descs.as_mut()[idx as usize];
            self.free(idx);
            self.outstanding -= 1;
            d.complete(peer, desc.cookie, false);
            completed += 1;
            idx = desc.next;
        }
        completed
    }
}

/// Attaches the box `receiver` offers `me` in the directory word `word`:
/// the word must name a box of `receiver`'s own pool, and the box must be
/// initialised for `me` and fresh ([`FboxWriter::attach`]); anything else
/// is [`Corruption::BadOffer`].
fn offered_box<'a>(
    layout: &SegmentLayout,
    table: &SegmentTable<'a, MAX_LOCAL_RANKS>,
    me: u32,
    receiver: u32,
    word: u64,
) -> Result<FboxWriter<'a>, Corruption> {
    let bad = Corruption::BadOffer { word };
    let offer = ShmOffset::from_raw(word).map_err(|_| bad)?;
    if u32::from(offer.owner()) != receiver {
        return Err(bad);
    }
    let part_at = layout.part_offset(receiver).map_err(|_| bad)? as u64;
    let at = part_at.checked_add(offer.offset()).ok_or(bad)?;
    layout.fbox_pool_index(receiver, at).ok_or(bad)?;
    let part = table.region(receiver as u16).map_err(|_| bad)?;
    FboxWriter::attach(part, offer.offset(), me).map_err(|_| bad)
}

/// Hands a fast-box message to `d` as a [`FragView`] without a header:
/// in place (a sub-region of our part, `part`), or, under loom (whose
/// atomics are not plain words), copied. What [`Dispatch::boxed`] does
/// unless the adapter takes the message itself.
pub fn deliver_boxed<H: Dispatch>(
    part: &Region<'_>,
    peer: u32,
    tag: u8,
    payload: fbox::Payload<'_>,
    d: &mut H,
) -> Result<(), Corruption> {
    let len = payload.len() as u32;
    let info = FragInfo {
        owner: peer,
        capacity: len,
        tag,
        len,
        seq: 0,
        flags: 0,
    };
    #[cfg(not(loom))]
    let region = payload.region_in(part);
    #[cfg(loom)]
    let mut buf = [0u8; fbox::MAX_SIZE as usize / 4];
    #[cfg(loom)]
    let region = {
        let _ = part;
        let dst = buf.get_mut(..payload.len());
        dst.and_then(|dst| {
            payload.copy_to(dst).ok()?;
            Some(Region::from_mut_slice(dst))
        })
    };
    // Unreachable: the reader's box lies in our part and its records inside
    // the box (validated); reported rather than assumed.
    let Some(payload) = region else {
        return Err(Corruption::CrossesEnd {
            pos: 0,
            len,
            size: 0,
        });
    };
    let view = FragView {
        header: None,
        info,
        payload,
    };
    // No ACK carries a refusal back: the adapter reports what it refuses.
    d.recv(peer, tag, &view);
    Ok(())
}

#[cfg(test)]
mod recorder;
#[cfg(test)]
mod tests;
