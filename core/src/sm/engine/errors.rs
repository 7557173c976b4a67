//! The engine's errors: what a peer wrote wrong ([`PeerError`]) and whom it
//! is blamed on ([`Blame`]), setting up ([`SetupError`]) and sending
//! ([`SendError`]).

use crate::shm::ResolveError;
use crate::sm::control::Structure;
use crate::sm::fbox::{Corruption, FboxError};
use crate::sm::fifo::{FifoError, RingFault};
use crate::sm::frag::{FragError, SlotError};
use crate::sm::layout::SizeError;

/// Something a peer wrote into our rings or its fragments was invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PeerError {
    /// A slot value read from our ring could not be decoded.
    #[error("ring {ring}: {error}")]
    BadSlot {
        /// Our ring it was read from.
        ring: u32,
        /// Why.
        error: SlotError,
    },
    /// A SEND (its owner) or an ACK (its sender) named a rank that cannot
    /// write into the ring it was read from.
    #[error("ring {ring}: a slot names rank {owner}, who cannot write here")]
    BadSender {
        /// Our ring.
        ring: u32,
        /// The rank the slot named.
        owner: u32,
    },
    /// A SEND's fragment failed validation.
    #[error("fragment from rank {peer}: {error}")]
    BadFragment {
        /// The sender.
        peer: u32,
        /// Why.
        error: FragError,
    },
    /// A SEND's sequence number was not the next one from its sender: a
    /// replayed, duplicated or lost SEND.
    #[error(
        "fragment from rank {peer} has sequence number {found}, expected {expected} \
                 (a SEND replayed, duplicated or lost)"
    )]
    BadSequence {
        /// The sender.
        peer: u32,
        /// The number expected.
        expected: u32,
        /// The number found.
        found: u32,
    },
    /// An ACK named a fragment that is not ours or not a fragment start.
    #[error("ACK from rank {peer} for offset {offset:#x}, which is not one of our fragments")]
    UnknownAck {
        /// The rank that sent it.
        peer: u32,
        /// The offset (in our part) it named.
        offset: u64,
    },
    /// An ACK for a fragment that was not in flight (duplicate or forged).
    #[error("ACK from rank {peer} for our fragment at {offset:#x}, which was not in flight")]
    UnexpectedAck {
        /// The rank that sent it.
        peer: u32,
        /// The offset (in our part) it named.
        offset: u64,
    },
    /// An ACK from one rank for a fragment in flight to another (forged).
    #[error(
        "ACK from rank {peer} for our fragment at {offset:#x}, which was sent to rank \
                 {sent_to}"
    )]
    ForgedAck {
        /// The rank the ACK names as its sender.
        peer: u32,
        /// The offset (in our part) it named.
        offset: u64,
        /// The rank the fragment was sent to.
        sent_to: u32,
    },
    /// An ACK out of turn: an older fragment in flight to the same rank was
    /// not acknowledged yet (an ACK was lost, or this one forged).
    #[error(
        "ACK from rank {peer} for our fragment at {offset:#x} out of turn (an older \
                 one was not acknowledged)"
    )]
    AckOutOfOrder {
        /// The rank that sent it.
        peer: u32,
        /// The offset (in our part) it named.
        offset: u64,
    },
    /// A peer's pending queue overflowed: it sent a fragment twice.
    #[error("pending queue to rank {peer} overflowed (duplicate fragments)")]
    PendingOverflow {
        /// The peer.
        peer: u32,
    },
    /// One of our rings' shared state is inconsistent
    /// ([`SmEngine::audit_rings`](super::SmEngine::audit_rings)).
    #[error("ring {ring}: {fault}")]
    Ring {
        /// Our ring.
        ring: u32,
        /// What is wrong with it.
        fault: RingFault,
    },
    /// A fast box shared with this peer is corrupt: a record header in its
    /// box in our part (it writes them), or the tail of our box in its
    /// part (it writes that).
    #[error("fast box shared with rank {peer}: {error}")]
    FastBox {
        /// The peer.
        peer: u32,
        /// What is wrong.
        error: Corruption,
    },
}

impl PeerError {
    /// The structure of the segment the problem was found in.
    pub fn structure(&self) -> Structure {
        match self {
            Self::BadSlot { .. } | Self::BadSender { .. } => Structure::RingSlot,
            Self::BadFragment { .. } => Structure::FragmentHeader,
            Self::BadSequence { .. } | Self::PendingOverflow { .. } => Structure::FragmentSequence,
            Self::UnknownAck { .. }
            | Self::UnexpectedAck { .. }
            | Self::ForgedAck { .. }
            | Self::AckOutOfOrder { .. } => Structure::Acknowledgement,
            Self::Ring { .. } => Structure::RingHeader,
            Self::FastBox { .. } => Structure::FastBox,
        }
    }

    /// Whom the problem is blamed on (see the module docs): one peer, or
    /// every writer of one of our rings.
    pub fn blamed(&self) -> Blame {
        match *self {
            Self::BadSlot { ring, .. } | Self::BadSender { ring, .. } | Self::Ring { ring, .. } => {
                Blame::Writers { ring }
            }
            Self::BadFragment { peer, .. }
            | Self::BadSequence { peer, .. }
            | Self::UnknownAck { peer, .. }
            | Self::UnexpectedAck { peer, .. }
            | Self::ForgedAck { peer, .. }
            | Self::AckOutOfOrder { peer, .. }
            | Self::PendingOverflow { peer }
            | Self::FastBox { peer, .. } => Blame::Peer { peer },
        }
    }
}

/// Whom a [`PeerError`] is blamed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Blame {
    /// This peer.
    Peer {
        /// The peer.
        peer: u32,
    },
    /// Every peer that writes into this ring of ours.
    Writers {
        /// Our ring.
        ring: u32,
    },
}

/// Setting up the engine failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SetupError {
    /// The layout could not be computed or indexed.
    #[error("segment layout: {0}")]
    Size(SizeError),
    /// A ring could not be initialised or attached.
    #[error("ring {ring} of rank {rank}: {error}")]
    Fifo {
        /// Whose ring.
        rank: u32,
        /// Which of its rings.
        ring: u32,
        /// Why.
        error: FifoError,
    },
    /// A fast box could not be initialised or attached.
    #[error("fast box from rank {sender} in the part of rank {receiver}: {error}")]
    Fbox {
        /// Whose part the box is in (the receiver).
        receiver: u32,
        /// The box's sender.
        sender: u32,
        /// Why.
        error: FboxError,
    },
    /// A part or fragment is outside the segment.
    #[error("segment: {0}")]
    Resolve(ResolveError),
    /// The memory for the first fragments could not be reserved
    /// ([`Reserve`](super::Reserve)).
    #[error("no memory for the first {bytes} bytes of fragments of our part of the segment")]
    OutOfMemory {
        /// Bytes asked for.
        bytes: u64,
    },
    /// `me`, `nprocs` or the storage sizes do not fit the layout.
    #[error("engine set-up: {what}")]
    Mismatch {
        /// What does not fit.
        what: &'static str,
    },
}

wrap_from!(SetupError { Size(SizeError), Resolve(ResolveError) });

/// A send could not be started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SendError {
    /// No such peer (or it is this rank).
    #[error("no local peer {peer}")]
    InvalidPeer {
        /// The peer asked for.
        peer: u32,
    },
    /// The peer was declared failed.
    #[error("local peer {peer} has failed")]
    PeerFailed {
        /// The peer.
        peer: u32,
    },
    /// The payload is larger than a max-size fragment.
    #[error("payload of {len} bytes exceeds the fragment limit of {max}")]
    TooLarge {
        /// Payload length.
        len: usize,
        /// Largest payload of one fragment.
        max: u32,
    },
    /// Every fragment is in flight: call `progress` and retry.
    #[error("no free fragment (all in flight)")]
    NoFragment,
    /// The peer's pending queue is full (it stopped reading): progress,
    /// check its liveness, retry.
    #[error("pending queue to local peer {peer} is full")]
    Backlog {
        /// The peer.
        peer: u32,
    },
}
