//! What the engine keeps per peer: its state ([`PeerState`]) and its slot
//! ([`PeerSlot`]: ring writer, pending queue, fragments in flight, sequence
//! numbers, fast boxes), in caller-provided storage.

use crate::sm::fbox::{Corruption, FboxReader, FboxWriter};
use crate::sm::fifo::Producer;
use crate::sync::AtomicU64;

use super::NONE;

/// What the engine knows of a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PeerState {
    /// This rank itself (no ring to write).
    Me,
    /// Connected: its ring is attached.
    Connected,
    /// Declared failed: nothing is sent to it or accepted from it.
    Failed,
}

/// Per-peer state, in caller-provided storage (one per local rank).
#[derive(Debug)]
pub struct PeerSlot<'a> {
    pub(super) producer: Option<Producer<'a>>,
    pub(super) pending_head: u32,
    pub(super) pending_len: u32,
    pub(super) in_flight: u32,
    /// Our fragments in flight to this peer, oldest first (linked through
    /// `FragDesc::next`): the order its ACKs must come back in.
    pub(super) oldest: u32,
    pub(super) newest: u32,
    /// Sequence number of our next SEND to this peer.
    pub(super) send_seq: u32,
    /// Sequence number expected on this peer's next SEND.
    pub(super) recv_seq: u32,
    pub(super) state: PeerState,
    /// Our fast box in this peer's part (we write it), once it offered one.
    pub(super) fbox_out: Option<FboxWriter<'a>>,
    /// This peer's fast box in our part (we read it), once we handed it one.
    pub(super) fbox_in: Option<FboxReader<'a>>,
    /// Our word in this peer's box directory (where it offers us a box),
    /// read until we have attached a box.
    pub(super) fbox_offer: Option<&'a AtomicU64>,
    /// Small messages (ones a box would take) received from this peer by
    /// ring while it has no box of ours.
    pub(super) small_in: u32,
    /// A box offer of this peer's that we found bad (failed at the next
    /// progress pass, which has the dispatcher).
    pub(super) offer_fault: Option<Corruption>,
    /// The ACK of this peer's SEND that the receiver holds back
    /// ([`Received::Held`](super::Received::Held)), without its status.
    pub(super) held_ack: Option<u64>,
}

impl PeerSlot<'_> {
    /// An empty slot, filled by [`SmEngine::attach`](super::SmEngine::attach).
    pub const fn new() -> Self {
        Self {
            producer: None,
            pending_head: 0,
            pending_len: 0,
            in_flight: 0,
            oldest: NONE,
            newest: NONE,
            send_seq: 0,
            recv_seq: 0,
            state: PeerState::Failed,
            fbox_out: None,
            fbox_in: None,
            fbox_offer: None,
            small_in: 0,
            offer_fault: None,
            held_ack: None,
        }
    }
}

impl Default for PeerSlot<'_> {
    fn default() -> Self {
        Self::new()
    }
}
