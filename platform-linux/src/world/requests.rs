//! Our requests in flight and completed ([`Requests`]): each request's
//! outcome once known, the region it pins, the buffer it owns, where it
//! went (for cancelling), and the completions kept, in order, for a
//! consumer while nobody listened. The hub records completions here;
//! `test`, `wait` and `cancel` take them out.

use std::collections::VecDeque;

use super::{Route, WorldError};
use crate::idmap::IdMap;
use crate::ops::OpError;
use crate::regions::Regions;

/// The state of a request.
struct Req {
    /// Its outcome, once known.
    result: Option<Result<(), OpError>>,
    /// Our region it uses (unpinned at completion).
    pin: Option<u32>,
    /// A buffer it owns (zero-copy send of an owned buffer).
    _keep: Option<Box<dyn AsRef<[u8]> + Send>>,
    /// Cancelled while a transport still reads its memory: kept (with
    /// `_keep`) until that completion, which nobody is told of.
    abandoned: bool,
    /// Where it went (for cancelling).
    route: Route,
}

/// The table of our requests, by number (1, 2, ...; 0 is
/// [`super::Request::COMPLETE`]).
#[derive(Default)]
pub(super) struct Requests {
    map: IdMap<u64, Req>,
    /// Requests completed with nobody listening, in order.
    completed: VecDeque<u64>,
    next: u64,
}

impl Requests {
    /// A new request going by `route`, pinning our region `pin`: its
    /// number.
    #[inline]
    pub(super) fn insert(&mut self, pin: Option<u32>, route: Route) -> u64 {
        self.next += 1;
        let id = self.next;
        self.map.insert(
            id,
            Req {
                result: None,
                pin,
                _keep: None,
                abandoned: false,
                route,
            },
        );
        id
    }

    /// Request `op` owns `buf` until it completes (dropped if it is
    /// unknown: completed at once).
    pub(super) fn keep(&mut self, op: u64, buf: Box<dyn AsRef<[u8]> + Send>) {
        if let Some(r) = self.map.get_mut(&op) {
            r._keep = Some(buf);
        }
    }

    /// Forgets request `op` (its transport finished or refused it when it
    /// was posted) and ends its pin.
    #[inline]
    pub(super) fn discard(&mut self, op: u64, regions: &mut Regions) {
        if let Some(req) = self.map.remove(&op) {
            if let Some(id) = req.pin {
                regions.unpin(id);
            }
        }
    }

    /// Whether request `op` is known (posted, its completion not reported
    /// yet).
    pub(super) fn contains(&self, op: u64) -> bool {
        self.map.contains_key(&op)
    }

    /// Whether request `op` is over: completed (its outcome kept) or
    /// unknown.
    pub(super) fn is_settled(&self, op: u64) -> bool {
        self.map.get(&op).is_none_or(|r| r.result.is_some())
    }

    /// A transport reported request `op` complete: its pin ends at once
    /// (the completion's consumer may deregister the region). False when
    /// nobody is to be told: it was cancelled (unknown here), or abandoned
    /// (forgotten now).
    #[inline]
    pub(super) fn complete(&mut self, op: u64, regions: &mut Regions) -> bool {
        let Some(r) = self.map.get_mut(&op) else {
            // Cancelled: nobody waits for it.
            return false;
        };
        if let Some(id) = r.pin.take() {
            // At once: the completion's consumer may deregister it.
            regions.unpin(id);
        }
        if r.abandoned {
            self.map.remove(&op);
            return false;
        }
        true
    }

    /// Forgets request `op`: its completion was reported.
    #[inline]
    pub(super) fn forget(&mut self, op: u64) {
        self.map.remove(&op);
    }

    /// Keeps the outcome of request `op`, completed with nobody listening,
    /// for `test`, `wait` or a later consumer (its owned buffer goes now).
    #[inline]
    pub(super) fn keep_result(&mut self, op: u64, result: Result<(), OpError>) {
        if let Some(r) = self.map.get_mut(&op) {
            r.result = Some(result);
            r._keep = None;
        }
        self.completed.push_back(op);
    }

    /// Whether completions are kept for a consumer.
    #[inline]
    pub(super) fn has_completed(&self) -> bool {
        !self.completed.is_empty()
    }

    /// The oldest completion kept for a consumer, taken from the queue
    /// (the request stays known: [`Self::forget`] it once reported, or
    /// [`Self::unpop`] it).
    pub(super) fn pop_completed(&mut self) -> Option<(u64, Result<(), OpError>)> {
        while let Some(op) = self.completed.pop_front() {
            if let Some(result) = self.map.get(&op).and_then(|r| r.result.clone()) {
                return Some((op, result));
            }
        }
        None
    }

    /// Puts completion `op` back at the head of the queue (the consumer
    /// did not take it).
    pub(super) fn unpop(&mut self, op: u64) {
        self.completed.push_front(op);
    }

    /// Request `op`'s outcome if it completed (and forgets it), `None` if
    /// it has not; unknown requests are an error.
    pub(super) fn take_result(
        &mut self,
        op: u64,
    ) -> Result<Option<Result<(), OpError>>, WorldError> {
        let r = self
            .map
            .get(&op)
            .ok_or(WorldError::UnknownRequest { request: op })?;
        let Some(result) = r.result.clone() else {
            return Ok(None);
        };
        self.map.remove(&op);
        self.completed.retain(|&o| o != op);
        Ok(Some(result))
    }

    /// Gives request `op` up, and its kept completion if any.
    /// `still_read(route)` cancels it at its transport and says whether
    /// that transport still reads its memory: the request is then kept,
    /// abandoned, until that completion, which nobody is told of;
    /// otherwise it is forgotten and its pin ends.
    pub(super) fn cancel(
        &mut self,
        op: u64,
        regions: &mut Regions,
        still_read: impl FnOnce(Route) -> bool,
    ) {
        let Some(r) = self.map.get_mut(&op) else {
            return;
        };
        if still_read(r.route) {
            r.abandoned = true;
        } else if let Some(id) = self.map.remove(&op).and_then(|r| r.pin) {
            regions.unpin(id);
        }
        self.completed.retain(|&o| o != op);
    }
}
