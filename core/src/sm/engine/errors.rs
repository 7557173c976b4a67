//! The engine's errors: what a peer wrote wrong ([`PeerError`]) and whom it
//! is blamed on ([`Blame`]), setting up ([`SetupError`]) and sending
//! ([`SendError`]).

use core::fmt;

use crate::shm::ResolveError;
use crate::sm::control::Structure;
use crate::sm::fbox::{Corruption, FboxError};
use crate::sm::fifo::{FifoError, RingFault};
use crate::sm::frag::{FragError, SlotError};
use crate::sm::layout::SizeError;

/// Something a peer wrote into our rings or its fragments was invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PeerError {
    /// A slot value read from our ring could not be decoded.
    BadSlot {
        /// Our ring it was read from.
        ring: u32,
        /// Why.
        error: SlotError,
    },
    /// A SEND (its owner) or an ACK (its sender) named a rank that cannot
    /// write into the ring it was read from.
    BadSender {
        /// Our ring.
        ring: u32,
        /// The rank the slot named.
        owner: u32,
    },
    /// A SEND's fragment failed validation.
    BadFragment {
        /// The sender.
        peer: u32,
        /// Why.
        error: FragError,
    },
    /// A SEND's sequence number was not the next one from its sender: a
    /// replayed, duplicated or lost SEND.
    BadSequence {
        /// The sender.
        peer: u32,
        /// The number expected.
        expected: u32,
        /// The number found.
        found: u32,
    },
    /// An ACK named a fragment that is not ours or not a fragment start.
    UnknownAck {
        /// The rank that sent it.
        peer: u32,
        /// The offset (in our part) it named.
        offset: u64,
    },
    /// An ACK for a fragment that was not in flight (duplicate or forged).
    UnexpectedAck {
        /// The rank that sent it.
        peer: u32,
        /// The offset (in our part) it named.
        offset: u64,
    },
    /// An ACK from one rank for a fragment in flight to another (forged).
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
    AckOutOfOrder {
        /// The rank that sent it.
        peer: u32,
        /// The offset (in our part) it named.
        offset: u64,
    },
    /// A peer's pending queue overflowed: it sent a fragment twice.
    PendingOverflow {
        /// The peer.
        peer: u32,
    },
    /// One of our rings' shared state is inconsistent
    /// ([`SmEngine::audit_rings`](super::SmEngine::audit_rings)).
    Ring {
        /// Our ring.
        ring: u32,
        /// What is wrong with it.
        fault: RingFault,
    },
    /// A fast box shared with this peer is corrupt: a record header in its
    /// box in our part (it writes them), or the tail of our box in its
    /// part (it writes that).
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

impl fmt::Display for PeerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::BadSlot { ring, error } => write!(f, "ring {ring}: {error}"),
            Self::BadSender { ring, owner } => {
                write!(
                    f,
                    "ring {ring}: a slot names rank {owner}, who cannot write here"
                )
            }
            Self::BadFragment { peer, error } => write!(f, "fragment from rank {peer}: {error}"),
            Self::BadSequence {
                peer,
                expected,
                found,
            } => write!(
                f,
                "fragment from rank {peer} has sequence number {found}, expected {expected} \
                 (a SEND replayed, duplicated or lost)"
            ),
            Self::UnknownAck { peer, offset } => write!(
                f,
                "ACK from rank {peer} for offset {offset:#x}, which is not one of our fragments"
            ),
            Self::UnexpectedAck { peer, offset } => {
                write!(
                    f,
                    "ACK from rank {peer} for our fragment at {offset:#x}, which was not in flight"
                )
            }
            Self::ForgedAck {
                peer,
                offset,
                sent_to,
            } => write!(
                f,
                "ACK from rank {peer} for our fragment at {offset:#x}, which was sent to rank \
                 {sent_to}"
            ),
            Self::AckOutOfOrder { peer, offset } => write!(
                f,
                "ACK from rank {peer} for our fragment at {offset:#x} out of turn (an older \
                 one was not acknowledged)"
            ),
            Self::PendingOverflow { peer } => {
                write!(
                    f,
                    "pending queue to rank {peer} overflowed (duplicate fragments)"
                )
            }
            Self::Ring { ring, fault } => write!(f, "ring {ring}: {fault}"),
            Self::FastBox { peer, error } => {
                write!(f, "fast box shared with rank {peer}: {error}")
            }
        }
    }
}

impl core::error::Error for PeerError {}

/// Setting up the engine failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SetupError {
    /// The layout could not be computed or indexed.
    Size(SizeError),
    /// A ring could not be initialised or attached.
    Fifo {
        /// Whose ring.
        rank: u32,
        /// Which of its rings.
        ring: u32,
        /// Why.
        error: FifoError,
    },
    /// A fast box could not be initialised or attached.
    Fbox {
        /// Whose part the box is in (the receiver).
        receiver: u32,
        /// The box's sender.
        sender: u32,
        /// Why.
        error: FboxError,
    },
    /// A part or fragment is outside the segment.
    Resolve(ResolveError),
    /// The memory for the first fragments could not be reserved
    /// ([`Reserve`](super::Reserve)).
    OutOfMemory {
        /// Bytes asked for.
        bytes: u64,
    },
    /// `me`, `nprocs` or the storage sizes do not fit the layout.
    Mismatch {
        /// What does not fit.
        what: &'static str,
    },
}

impl From<SizeError> for SetupError {
    fn from(e: SizeError) -> Self {
        Self::Size(e)
    }
}

impl From<ResolveError> for SetupError {
    fn from(e: ResolveError) -> Self {
        Self::Resolve(e)
    }
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Size(e) => write!(f, "segment layout: {e}"),
            Self::Fifo { rank, ring, error } => write!(f, "ring {ring} of rank {rank}: {error}"),
            Self::Fbox {
                receiver,
                sender,
                error,
            } => write!(
                f,
                "fast box from rank {sender} in the part of rank {receiver}: {error}"
            ),
            Self::Resolve(e) => write!(f, "segment: {e}"),
            Self::OutOfMemory { bytes } => write!(
                f,
                "no memory for the first {bytes} bytes of fragments of our part of the segment"
            ),
            Self::Mismatch { what } => write!(f, "engine set-up: {what}"),
        }
    }
}

impl core::error::Error for SetupError {}

/// A send could not be started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SendError {
    /// No such peer (or it is this rank).
    InvalidPeer {
        /// The peer asked for.
        peer: u32,
    },
    /// The peer was declared failed.
    PeerFailed {
        /// The peer.
        peer: u32,
    },
    /// The payload is larger than a max-size fragment.
    TooLarge {
        /// Payload length.
        len: usize,
        /// Largest payload of one fragment.
        max: u32,
    },
    /// Every fragment is in flight: call `progress` and retry.
    NoFragment,
    /// The peer's pending queue is full (it stopped reading): progress,
    /// check its liveness, retry.
    Backlog {
        /// The peer.
        peer: u32,
    },
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::InvalidPeer { peer } => write!(f, "no local peer {peer}"),
            Self::PeerFailed { peer } => write!(f, "local peer {peer} has failed"),
            Self::TooLarge { len, max } => {
                write!(
                    f,
                    "payload of {len} bytes exceeds the fragment limit of {max}"
                )
            }
            Self::NoFragment => write!(f, "no free fragment (all in flight)"),
            Self::Backlog { peer } => write!(f, "pending queue to local peer {peer} is full"),
        }
    }
}

impl core::error::Error for SendError {}
