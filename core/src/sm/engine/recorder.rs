//! A [`Dispatch`] that records everything the engine reports: the
//! engine's unit tests use it as is, the `engine_hostile` fuzz target
//! (which includes this file by `#[path]`) wraps it in its own checks.
//! It names nothing but its parent's `Dispatch`, `FragView` and
//! `PeerError`, and `std`, so that it compiles in both crates.

use super::{Dispatch, FragView, PeerError, Received};

/// Records everything the engine reports.
#[derive(Default)]
pub(super) struct Rec {
    /// Messages delivered: sender, tag, payload.
    pub(super) got: std::vec::Vec<(u32, u8, std::vec::Vec<u8>)>,
    /// Completions: peer, cookie, success.
    pub(super) done: std::vec::Vec<(u32, u64, bool)>,
    /// Errors reported.
    pub(super) errors: std::vec::Vec<PeerError>,
    /// Peers declared failed, and why.
    pub(super) failed: std::vec::Vec<(u32, PeerError)>,
    /// A tag whose messages the handler refuses (the ACK carries the
    /// error status).
    pub(super) refuse_tag: Option<u8>,
    /// A tag whose messages the handler takes but holds the ACK of
    /// ([`Received::Held`]).
    pub(super) hold_tag: Option<u8>,
}

impl Dispatch for Rec {
    fn recv(&mut self, peer: u32, tag: u8, frag: &FragView<'_>) -> Received {
        if Some(tag) == self.refuse_tag {
            return Received::Refused;
        }
        let mut buf = std::vec![0; frag.info.len as usize];
        frag.copy_payload(&mut buf).unwrap();
        self.got.push((peer, tag, buf));
        if Some(tag) == self.hold_tag {
            Received::Held
        } else {
            Received::Accepted
        }
    }
    fn complete(&mut self, peer: u32, cookie: u64, ok: bool) {
        self.done.push((peer, cookie, ok));
    }
    fn error(&mut self, error: PeerError) {
        self.errors.push(error);
    }
    fn failed(&mut self, peer: u32, why: PeerError) {
        self.failed.push((peer, why));
    }
}
