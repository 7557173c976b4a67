//! The platform's seam for memory ([`Reserve`]) and the memory that needs
//! no reservation ([`Backed`]).

/// The platform's seam for memory: the engine asks for each piece of its
/// part just before it first uses it (a pool's next fragments, a box it
/// hands out), so that a part costs what it uses (see
/// [`crate::sm::layout`]).
pub trait Reserve {
    /// Makes the bytes `[offset, offset + len)` of the segment (offsets
    /// from the segment's start) backed by memory, or returns false if the
    /// memory is not there. The engine then does without: a pool stays as
    /// large as it is (senders wait for fragments to come back), a sender
    /// keeps the rings. Only [`SmEngine::attach`](super::SmEngine::attach) fails when the first
    /// fragments cannot be reserved.
    fn reserve(&mut self, offset: u64, len: u64) -> bool;
}

/// Memory that is backed already (a buffer, a segment reserved whole): every
/// reservation succeeds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Backed;

impl Reserve for Backed {
    fn reserve(&mut self, _offset: u64, _len: u64) -> bool {
        true
    }
}

impl<R: Reserve + ?Sized> Reserve for &mut R {
    fn reserve(&mut self, offset: u64, len: u64) -> bool {
        (**self).reserve(offset, len)
    }
}
