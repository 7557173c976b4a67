//! The process-local descriptor of one of our fragments ([`FragDesc`]) and
//! its state.

use super::NONE;

/// State of one of our fragments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DescState {
    Free,
    /// Pushed or pending to `peer`, waiting for its ACK.
    InFlight,
}

/// Process-local descriptor of one of our fragments (caller-provided
/// storage, one per fragment of the part).
#[derive(Clone, Copy, Debug)]
pub struct FragDesc {
    pub(super) offset: u64,
    pub(super) capacity: u32,
    /// The next fragment in the free list (free) or in the peer's in-flight
    /// list (in flight).
    pub(super) next: u32,
    pub(super) state: DescState,
    /// The peer it is (or was last) in flight to.
    pub(super) peer: u32,
    pub(super) cookie: u64,
}

impl FragDesc {
    /// An unused descriptor, filled by [`SmEngine::attach`](super::SmEngine::attach).
    pub const fn new() -> Self {
        Self {
            offset: 0,
            capacity: 0,
            next: NONE,
            state: DescState::Free,
            peer: 0,
            cookie: 0,
        }
    }
}

impl Default for FragDesc {
    fn default() -> Self {
        Self::new()
    }
}
