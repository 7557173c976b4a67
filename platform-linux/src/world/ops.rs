//! The job API's operations: sends, one-sided get and put, registration,
//! requests, and the blocking conveniences built on them.
//!
//! # Safety
//!
//! Zero-copy operations hand transports [`RawBuf`]s naming memory the job
//! API keeps valid until the operation completes: registered regions
//! (borrowed for `'m`, pinned while in use), owned buffers kept in the
//! request, caller slices of a blocking call that waits for completion (or
//! cancels the operation before returning), or — `isend_raw`,
//! `register_raw` — caller memory under the caller's `unsafe` promise.
#![allow(unsafe_code)]

use btl_core::barrier::{BarrierRepr, Schedule};
use btl_core::rma::RmaStatus;

use super::*;
use crate::ops::{Posted, RawBuf, RawParts};
use crate::regions::DeregisterError;

/// Messages up to this size are copied by the blocking sends (one copy
/// into a fragment or the socket is cheaper than tracking a request);
/// larger ones travel without a copy.
const COPY_LIMIT: usize = 32 << 10;

impl<'m> World<'m> {
    #[cold]
    #[inline(never)]
    fn post_error(&self, peer: u32, e: PostError) -> WorldError {
        match e {
            PostError::InvalidPeer => WorldError::InvalidPeer { peer },
            PostError::ReservedTag => WorldError::ReservedTag { tag: u8::MAX },
            PostError::PeerFailed => WorldError::PeerFailed {
                peer,
                why: self
                    .hub
                    .failed
                    .iter()
                    .find(|(p, _)| *p == peer)
                    .map(|(_, w)| w.clone())
                    .unwrap_or_else(|| "it failed or left the job".into()),
            },
            PostError::WouldBlock => WorldError::WouldBlock { peer },
            PostError::TooLarge { max } => WorldError::TooLarge { max },
            PostError::BadLocal(status) => WorldError::BadLocal { status },
        }
    }

    fn check_tag(tag: u8) -> Result<(), WorldError> {
        if tag > MAX_USER_TAG {
            Err(WorldError::ReservedTag { tag })
        } else {
            Ok(())
        }
    }

    /// Sends `data` to rank `peer` with `tag`, copying: `data` may be
    /// reused when this returns, and the send never waits for the
    /// receiver. Messages to one peer arrive in the order sent. Refused
    /// with [`WorldError::WouldBlock`] when the peer's queue is full (call
    /// [`Self::poll`] and retry, or use the blocking [`Self::send`]).
    pub fn isend(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<Request, WorldError> {
        self.isendv(peer, tag, &[data])
    }

    /// [`Self::isend`] of the concatenation of `parts`: one message.
    #[inline]
    pub fn isendv(&mut self, peer: u32, tag: u8, parts: &[&[u8]]) -> Result<Request, WorldError> {
        if self.try_send_boxed(peer, tag, parts) {
            return Ok(Request::COMPLETE);
        }
        Self::check_tag(tag)?;
        let r = match self.route_of(peer)? {
            Route::Me => {
                self.hub.to_self.push_back((tag, parts.concat()));
                Ok(())
            }
            Route::Sm(l) => match self.sm.as_mut() {
                Some(sm) => sm.isend(l, tag, parts),
                None => Err(PostError::InvalidPeer),
            },
            Route::Tcp => match self.tcp.as_mut() {
                Some(t) => t.isend(peer, tag, parts),
                None => Err(PostError::InvalidPeer),
            },
            Route::Unreachable => Err(PostError::InvalidPeer),
        };
        r.map(|()| Request::COMPLETE).map_err(|e| match e {
            PostError::ReservedTag => WorldError::ReservedTag { tag },
            e => self.post_error(peer, e),
        })
    }

    /// The fast path of [`Self::isendv`] (and of the C ABI's `btl_sendi`):
    /// a small message to a peer of this node straight into its
    /// shared-memory fast box. True when sent (as `isendv` would have, completed);
    /// false when nothing happened — another transport, a reserved tag, no
    /// box or no room, messages queued before it — and `isendv` must
    /// decide. Inline: the caller's pieces' count is known there.
    #[inline(always)]
    pub fn try_send_boxed(&mut self, peer: u32, tag: u8, parts: &[&[u8]]) -> bool {
        match (self.route.get(peer as usize), self.sm.as_mut()) {
            (Some(&Route::Sm(l)), Some(sm)) if tag <= MAX_USER_TAG => {
                sm.try_send_boxed(l, tag, parts)
            }
            _ => false,
        }
    }

    /// Sends `buf` without copying it: the transports read it while it
    /// travels (single copy by the receiver, writes straight from it); the
    /// request owns it until it completes.
    pub fn isend_owned<B: AsRef<[u8]> + Send + 'static>(
        &mut self,
        peer: u32,
        tag: u8,
        buf: B,
    ) -> Result<Request, WorldError> {
        let keep: Box<dyn AsRef<[u8]> + Send> = Box::new(buf);
        let raw = RawBuf::new((*keep).as_ref());
        // SAFETY: `keep` owns the bytes (boxed, so `raw` stays valid when
        // the box moves) and is stored in the request until it completes;
        // if the post completes or fails at once it is dropped after.
        let req = unsafe { self.post_send(peer, tag, RawParts::one(raw)) }?;
        if let Some(r) = self.hub.reqs.get_mut(&req.0) {
            r._keep = Some(keep);
        }
        Ok(req)
    }

    /// Sends the concatenation of `parts` without copying large messages:
    /// the transports read the memory while the message travels.
    ///
    /// # Safety
    ///
    /// The memory of `parts` must stay valid and unchanged until the
    /// request completes (reported by `poll`, `test` or `wait`).
    pub unsafe fn isend_raw(
        &mut self,
        peer: u32,
        tag: u8,
        parts: &[&[u8]],
    ) -> Result<Request, WorldError> {
        // SAFETY: the caller's promise.
        unsafe { self.post_send(peer, tag, RawParts::new(parts)) }
    }

    /// # Safety
    ///
    /// As [`Self::isend_raw`].
    unsafe fn post_send(
        &mut self,
        peer: u32,
        tag: u8,
        parts: RawParts,
    ) -> Result<Request, WorldError> {
        Self::check_tag(tag)?;
        let route = self.route_of(peer)?;
        let op = self.hub.new_req(None, route);
        let r = match route {
            Route::Me => {
                let mut slices = Vec::new();
                // SAFETY: the caller's promise; copied now.
                unsafe { parts.slices(&mut slices) };
                self.hub.to_self.push_back((tag, slices.concat()));
                Ok(Posted::Done)
            }
            Route::Sm(l) => match self.sm.as_mut() {
                // SAFETY: the caller's promise, passed on.
                Some(sm) => unsafe { sm.isend_raw(l, tag, parts, op) },
                None => Err(PostError::InvalidPeer),
            },
            Route::Tcp => match self.tcp.as_mut() {
                // SAFETY: the caller's promise, passed on.
                Some(t) => unsafe { t.isend_raw(peer, tag, parts, op) },
                None => Err(PostError::InvalidPeer),
            },
            Route::Unreachable => Err(PostError::InvalidPeer),
        };
        self.posted(op, peer, r)
    }

    /// Turns a transport's answer to a post into a request.
    fn posted(
        &mut self,
        op: u64,
        peer: u32,
        r: Result<Posted, PostError>,
    ) -> Result<Request, WorldError> {
        match r {
            Ok(Posted::Pending) => Ok(Request(op)),
            Ok(Posted::Done) => {
                if let Some(req) = self.hub.reqs.remove(&op) {
                    if let Some(id) = req.pin {
                        self.regions.unpin(id);
                    }
                }
                Ok(Request::COMPLETE)
            }
            Err(e) => {
                if let Some(req) = self.hub.reqs.remove(&op) {
                    if let Some(id) = req.pin {
                        self.regions.unpin(id);
                    }
                }
                Err(self.post_error(peer, e))
            }
        }
    }

    /// Registers memory the caller owns: peers may get from and put into
    /// it through the returned key (send it to them), and our own `iput`
    /// / `iget` use it as their local side. It stays borrowed by the world
    /// (for `'m`); [`Self::region`] / [`Self::region_mut`] reach it.
    pub fn register(&mut self, mem: &'m mut [u8]) -> RegionKey {
        let len = mem.len() as u64;
        // SAFETY: `mem` is borrowed mutably for 'm, which outlives the
        // world: nothing else touches it until the world is gone or the
        // region is removed.
        let id = unsafe { self.regions.insert(RawBuf::new_mut(mem)) };
        self.publish_regions();
        self.key(id, len)
    }

    /// Registers a buffer the world keeps (returned by [`Self::deregister`]).
    pub fn register_owned(&mut self, buf: Box<[u8]>) -> RegionKey {
        let len = buf.len() as u64;
        let id = self.regions.insert_owned(buf);
        self.publish_regions();
        self.key(id, len)
    }

    /// Registers `len` bytes at `ptr`.
    ///
    /// # Safety
    ///
    /// The memory must be valid for reads and writes, and not used by the
    /// caller while operations (ours or peers') may touch it, until it is
    /// deregistered and the world is done with it.
    pub unsafe fn register_raw(
        &mut self,
        ptr: *mut u8,
        len: usize,
    ) -> Result<RegionKey, WorldError> {
        // SAFETY: the caller's promise.
        let key = unsafe { register_raw(&mut self.regions, self.id.rank, ptr, len) };
        self.publish_regions();
        key
    }

    /// Publishes the regions just added, or withdraws those just removed,
    /// in the shared-memory transport's region table (peers on the node
    /// read them without asking): at once, so that a key sent next finds
    /// its region published, and a deregistration returns only once peers
    /// no longer find it. (Inside an event callback, through [`PollCx`],
    /// the table follows when the pass goes on.)
    fn publish_regions(&mut self) {
        if let Some(sm) = &mut self.sm {
            sm.apply_unpins(&mut self.regions);
        }
    }

    fn key(&self, id: u32, len: u64) -> RegionKey {
        RegionKey {
            rank: self.id.rank,
            id,
            len,
        }
    }

    /// Removes one of our regions: later requests naming it are refused.
    /// Refused while operations of ours use it or a peer's get is answered
    /// from it (progress and retry); hands back an owned buffer.
    pub fn deregister(&mut self, key: &RegionKey) -> Result<Option<Box<[u8]>>, WorldError> {
        let r = deregister(&mut self.regions, self.id.rank, key);
        self.publish_regions();
        r
    }

    /// The contents of one of our regions.
    pub fn region(&self, key: &RegionKey) -> Option<&[u8]> {
        (key.rank == self.id.rank).then_some(())?;
        self.regions.get(key.id)
    }

    /// The contents of one of our regions, writable.
    pub fn region_mut(&mut self, key: &RegionKey) -> Option<&mut [u8]> {
        (key.rank == self.id.rank).then_some(())?;
        self.regions.get_mut(key.id)
    }

    /// The local side of a one-sided operation: a range of our region.
    fn local_range(&self, key: &RegionKey, off: u64, len: u64) -> Result<RawBuf, WorldError> {
        if key.rank != self.id.rank || key.len != self.regions.len_of(key.id).unwrap_or(0) as u64 {
            return Err(WorldError::BadLocal {
                status: RmaStatus::UnknownRegion,
            });
        }
        self.regions
            .range(key.id, off, len)
            .map_err(|status| WorldError::BadLocal { status })
    }

    /// Writes `len` bytes at `local_off` of our region `local` to
    /// `remote_off` of the region `remote` (of any rank). The target's
    /// refusal (unknown region, range outside it) is the request's status.
    pub fn iput(
        &mut self,
        local: &RegionKey,
        local_off: u64,
        remote: &RegionKey,
        remote_off: u64,
        len: u64,
    ) -> Result<Request, WorldError> {
        self.post_local_rma(true, local, local_off, remote, remote_off, len)
    }

    /// Reads `len` bytes at `remote_off` of the region `remote` (of any
    /// rank) into `local_off` of our region `local`. The target's refusal
    /// is the request's status.
    pub fn iget(
        &mut self,
        local: &RegionKey,
        local_off: u64,
        remote: &RegionKey,
        remote_off: u64,
        len: u64,
    ) -> Result<Request, WorldError> {
        self.post_local_rma(false, local, local_off, remote, remote_off, len)
    }

    /// `iput` (`put`) or `iget` with our registered memory as the local
    /// side.
    fn post_local_rma(
        &mut self,
        put: bool,
        local: &RegionKey,
        local_off: u64,
        remote: &RegionKey,
        remote_off: u64,
        len: u64,
    ) -> Result<Request, WorldError> {
        let mem = self.local_range(local, local_off, len)?;
        self.regions.pin(local.id);
        // SAFETY: `mem` is inside a registered region, pinned (it cannot be
        // deregistered) until the request completes.
        unsafe { self.post_rma(put, mem, Some(local.id), remote, remote_off) }
    }

    /// # Safety
    ///
    /// `mem` must stay valid (and, for a get, unused otherwise) until the
    /// request completes or is cancelled.
    unsafe fn post_rma(
        &mut self,
        put: bool,
        mem: RawBuf,
        pin: Option<u32>,
        remote: &RegionKey,
        remote_off: u64,
    ) -> Result<Request, WorldError> {
        let route = match self.route_of(remote.rank) {
            Ok(r) => r,
            Err(e) => {
                if let Some(id) = pin {
                    self.regions.unpin(id);
                }
                return Err(e);
            }
        };
        let op = self.hub.new_req(pin, route);
        let r = match route {
            Route::Me => {
                let status = match self.regions.range(remote.id, remote_off, mem.len() as u64) {
                    Ok(theirs) => {
                        // SAFETY: both ranges are ours (a region and `mem`);
                        // `copy` handles overlap.
                        unsafe {
                            if put {
                                std::ptr::copy(
                                    mem.as_slice().as_ptr(),
                                    theirs.as_mut_slice().as_mut_ptr(),
                                    mem.len(),
                                );
                            } else {
                                std::ptr::copy(
                                    theirs.as_slice().as_ptr(),
                                    mem.as_mut_slice().as_mut_ptr(),
                                    mem.len(),
                                );
                            }
                        }
                        Ok(())
                    }
                    Err(s) => Err(OpError::Refused(s)),
                };
                let mut none = None::<User<'_>>;
                self.hub.done(op, status, &mut self.regions, &mut none);
                return Ok(Request(op));
            }
            Route::Sm(l) => match self.sm.as_mut() {
                // SAFETY: the caller's promise, passed on.
                Some(sm) => unsafe {
                    if put {
                        sm.iput(l, remote.id, remote_off, mem, op)
                    } else {
                        sm.iget(l, remote.id, remote_off, mem, op)
                    }
                },
                None => Err(PostError::InvalidPeer),
            },
            Route::Tcp => match self.tcp.as_mut() {
                // SAFETY: the caller's promise, passed on.
                Some(t) => unsafe {
                    if put {
                        t.iput(remote.rank, remote.id, remote_off, mem, op)
                    } else {
                        t.iget(remote.rank, remote.id, remote_off, mem, op)
                    }
                },
                None => Err(PostError::InvalidPeer),
            },
            Route::Unreachable => Err(PostError::InvalidPeer),
        };
        self.posted(op, remote.rank, r)
    }

    /// The request's outcome if it completed (and forgets it), `None` if
    /// it has not. Progresses nothing: call [`Self::progress`] or
    /// [`Self::poll`] in between.
    pub fn test(&mut self, req: Request) -> Result<Option<Result<(), WorldError>>, WorldError> {
        if req.is_complete() {
            return Ok(Some(Ok(())));
        }
        let r = self
            .hub
            .reqs
            .get(&req.0)
            .ok_or(WorldError::UnknownRequest { request: req.0 })?;
        let Some(result) = r.result.clone() else {
            return Ok(None);
        };
        self.hub.reqs.remove(&req.0);
        self.hub.completed.retain(|&o| o != req.0);
        Ok(Some(result.map_err(|e| op_error(e, &self.hub.failed))))
    }

    /// Waits until the request completes (driving every transport); its
    /// failure is the error. On a timeout the request is cancelled.
    pub fn wait(&mut self, req: Request) -> Result<(), WorldError> {
        if req.is_complete() {
            return Ok(());
        }
        let id = req.0;
        if !self.hub.reqs.contains_key(&id) {
            return Err(WorldError::UnknownRequest { request: id });
        }
        let waited = self.wait_loop(
            "a request to complete",
            &mut |_, _| false,
            &mut None,
            &mut |w| w.hub.reqs.get(&id).is_none_or(|r| r.result.is_some()),
        );
        if let Err(e) = waited {
            self.cancel(req);
            return Err(e);
        }
        match self.test(req)? {
            Some(r) => r,
            None => Err(WorldError::UnknownRequest { request: id }),
        }
    }

    /// Gives up on a request: its queued work is dropped and no completion
    /// is reported. Bytes already handed to a transport may still arrive.
    /// A large message the receiver may still be reading keeps its owned
    /// buffer (`isend_owned`) until the receiver is done with it.
    pub fn cancel(&mut self, req: Request) {
        let Some(mut r) = self.hub.reqs.remove(&req.0) else {
            return;
        };
        match r.route {
            Route::Sm(_) => {
                if let Some(sm) = self.sm.as_mut() {
                    if sm.cancel(req.0) {
                        r.abandoned = true;
                        self.hub.reqs.insert(req.0, r);
                        self.hub.completed.retain(|&o| o != req.0);
                        return;
                    }
                }
            }
            Route::Tcp => {
                if let Some(t) = self.tcp.as_mut() {
                    t.cancel(req.0);
                }
            }
            Route::Me | Route::Unreachable => {}
        }
        if let Some(id) = r.pin {
            self.regions.unpin(id);
        }
        self.hub.completed.retain(|&o| o != req.0);
    }

    /// Waits for a request that reads or writes caller memory of a
    /// blocking call: on any error it is cancelled before returning, so
    /// the memory is never touched by us afterwards.
    fn finish_borrowed(&mut self, req: Result<Request, WorldError>) -> Result<(), WorldError> {
        let req = req?;
        self.wait(req)
    }

    /// Posts with `post` until the peer's queue takes it (progressing
    /// everything meanwhile).
    fn retry_would_block(
        &mut self,
        peer: u32,
        mut post: impl FnMut(&mut Self) -> Result<Request, WorldError>,
    ) -> Result<Request, WorldError> {
        match post(self) {
            Err(WorldError::WouldBlock { .. }) => {}
            other => return other,
        }
        let mut result = None;
        self.wait_loop(
            "room in a peer's send queue",
            &mut |_, p| p == peer,
            &mut None,
            &mut |w| match post(w) {
                Err(WorldError::WouldBlock { .. }) => false,
                other => {
                    result = Some(other);
                    true
                }
            },
        )?;
        result.unwrap_or(Err(WorldError::WouldBlock { peer }))
    }

    /// Sends `data` to rank `peer` with `tag`; returns when `data` may be
    /// reused (large messages go without a copy: this waits until they
    /// have). Waits for room when the peer's queue is full.
    pub fn send(&mut self, peer: u32, tag: u8, data: &[u8]) -> Result<(), WorldError> {
        self.sendv(peer, tag, &[data])
    }

    /// [`Self::send`] of the concatenation of `parts`.
    pub fn sendv(&mut self, peer: u32, tag: u8, parts: &[&[u8]]) -> Result<(), WorldError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len <= COPY_LIMIT {
            // Small: copied at once (no request to track).
            return self
                .retry_would_block(peer, |w| w.isendv(peer, tag, parts))
                .map(|_| ());
        }
        let req = self.retry_would_block(peer, |w| {
            // SAFETY: `parts` outlives this call, which waits for the
            // request to complete or cancels it.
            unsafe { w.post_send(peer, tag, RawParts::new(parts)) }
        });
        self.finish_borrowed(req)
    }

    /// Sends `data` to rank `peer` with `tag` `count` times, all in flight
    /// together (as a window of `MPI_Isend`s of one buffer): returns when
    /// every one completed and `data` may be reused. On an error the sends
    /// still outstanding are cancelled before it returns.
    pub fn send_window(
        &mut self,
        peer: u32,
        tag: u8,
        data: &[u8],
        count: u64,
    ) -> Result<(), WorldError> {
        let mut reqs = Vec::with_capacity(usize::try_from(count).unwrap_or(0).min(1 << 16));
        let mut result = Ok(());
        for _ in 0..count {
            let req = self.retry_would_block(peer, |w| {
                // SAFETY: `data` outlives this call, which waits for every
                // request or cancels it (below).
                unsafe { w.post_send(peer, tag, RawParts::new(&[data])) }
            });
            match req {
                Ok(r) => reqs.push(r),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let mut reqs = reqs.into_iter();
        if result.is_ok() {
            for r in reqs.by_ref() {
                // `wait` cancels its request on an error.
                if let Err(e) = self.wait(r) {
                    result = Err(e);
                    break;
                }
            }
        }
        for r in reqs {
            self.cancel(r);
        }
        result
    }

    /// Writes `src` at `offset` of the region `key` (of any rank):
    /// `Ok(Err(status))` when the target refused it.
    pub fn put(
        &mut self,
        key: &RegionKey,
        offset: u64,
        src: &[u8],
    ) -> Result<Result<(), RmaStatus>, WorldError> {
        let mem = RawBuf::new(src);
        let req = self.retry_would_block(key.rank, |w| {
            // SAFETY: `src` outlives this call, which waits for the request
            // or cancels it.
            unsafe { w.post_rma(true, mem, None, key, offset) }
        });
        refusal(self.finish_borrowed(req))
    }

    /// Reads `dst.len()` bytes at `offset` of the region `key` (of any
    /// rank): `Ok(Err(status))` when the target refused it.
    pub fn get(
        &mut self,
        key: &RegionKey,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<Result<(), RmaStatus>, WorldError> {
        let mem = RawBuf::new_mut(dst);
        let req = self.retry_would_block(key.rank, |w| {
            // SAFETY: `dst` is borrowed mutably for this call, which waits
            // for the request or cancels it.
            unsafe { w.post_rma(false, mem, None, key, offset) }
        });
        refusal(self.finish_borrowed(req))
    }

    /// Waits until every rank has called `barrier` as often. The ranks
    /// tell each other by the schedule of [`btl_core::barrier`] (over
    /// shared memory and TCP alike, on the barrier tag; the bare-metal node
    /// speaks the TCP one): up to four ranks each tells every other, above
    /// in `ceil(log2 n)` rounds of one message each (dissemination), so a
    /// barrier opens about `log2 n` connections per rank, not `n - 1`.
    ///
    /// A peer that fails after its message of a round reached us does not
    /// stop the barrier; one that fails before does, with an error naming
    /// it — and (dissemination) every other rank is told, so theirs end
    /// with the same error instead of a timeout. With
    /// [`Choice::SmLocal`] it is a barrier of the ranks of our node (the
    /// ranks this world reaches).
    pub fn barrier(&mut self) -> Result<(), WorldError> {
        self.barrier_epoch += 1;
        let epoch = self.barrier_epoch;
        let me = self.id.rank;
        let members: Vec<u32> = (0..self.id.size)
            .filter(|&p| p == me || self.reachable(p))
            .collect();
        let mine = members.iter().position(|&p| p == me).unwrap_or(0);
        // `mine < members.len()`: we are a member.
        let Some(s) = Schedule::new(members.len() as u32, mine as u32) else {
            return Ok(());
        };
        let result = self.barrier_rounds(epoch, &members, s);
        let told = self.hub.barrier_abandoned.remove(&epoch).is_some();
        self.hub.barrier_in.remove(&epoch);
        if let (Err(WorldError::PeerFailed { peer, .. }), Schedule::Dissemination { .. }, false) =
            (&result, s, told)
        {
            let msg = BarrierRepr::Abandoned {
                epoch,
                failed: *peer,
            };
            for &p in members.iter().filter(|&&p| p != me && p != *peer) {
                // Best effort: a rank we cannot tell ends by its own
                // liveness checks or BTL_TIMEOUT.
                let _ = self.send_barrier(p, msg);
            }
        }
        result
    }

    fn barrier_rounds(
        &mut self,
        epoch: u64,
        members: &[u32],
        s: Schedule,
    ) -> Result<(), WorldError> {
        let arrived =
            |w: &World<'_>, p: u32| w.hub.barrier_in.get(&epoch).is_some_and(|s| s.contains(&p));
        for round in 0..s.rounds() {
            for i in s.sends(round) {
                self.send_barrier(members[i as usize], BarrierRepr::Arrived { epoch })?;
            }
            let expect: Vec<u32> = s.expects(round).map(|i| members[i as usize]).collect();
            self.wait_loop(
                "the other ranks at a barrier",
                &mut |w, p| expect.contains(&p) && !arrived(w, p),
                &mut None,
                &mut |w| {
                    w.hub.barrier_abandoned.contains_key(&epoch)
                        || expect.iter().all(|&p| arrived(w, p))
                },
            )?;
            if let Some(&(peer, by)) = self.hub.barrier_abandoned.get(&epoch) {
                return Err(WorldError::PeerFailed {
                    peer,
                    why: format!("rank {by} saw it fail before it reached barrier {epoch}"),
                });
            }
        }
        Ok(())
    }

    /// Sends barrier message `msg` to `p` by its route.
    fn send_barrier(&mut self, p: u32, msg: BarrierRepr) -> Result<(), WorldError> {
        let r = match self.route_of(p)? {
            Route::Tcp => match self.tcp.as_mut() {
                Some(t) => t.send_barrier(p, msg),
                None => Err(PostError::InvalidPeer),
            },
            Route::Sm(l) => match self.sm.as_mut() {
                Some(sm) => sm.send_barrier(l, msg),
                None => Err(PostError::InvalidPeer),
            },
            Route::Me | Route::Unreachable => Ok(()),
        };
        r.map_err(|e| self.post_error(p, e))
    }

    /// Waits until everything sent has left (and, over shared memory, been
    /// acknowledged), and every operation of ours is answered.
    pub fn flush(&mut self) -> Result<(), WorldError> {
        self.wait_loop(
            "our messages to leave",
            &mut |_, _| false,
            &mut None,
            &mut |w| {
                w.hub.outbox.is_empty()
                    && w.sm.as_mut().is_none_or(|s| s.is_flushed())
                    && w.tcp.as_ref().is_none_or(|t| t.is_flushed())
            },
        )
    }

    /// One line for people: what moves the bytes.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(sm) = &self.sm {
            let how = if !sm.params().use_cma {
                "pipelined copy (use_cma=0)"
            } else if (0..sm.size()).any(|p| p != sm.rank() && sm.single_copy_to(p)) {
                "single copy (CMA) or pipelined, chosen by measurement"
            } else {
                "single copy refused by the kernel: pipelined copy"
            };
            parts.push(format!(
                "sm to {} local rank(s), {how}",
                self.hub.local.len() - 1
            ));
        }
        if let Some(t) = &self.tcp {
            let remote = self.route.iter().filter(|r| **r == Route::Tcp).count();
            parts.push(format!(
                "tcp to {remote} rank(s), listening on {}",
                t.published_addrs()
            ));
        }
        if parts.is_empty() {
            parts.push("no peers".into());
        }
        format!(
            "{} ranks on {} node(s); {}",
            self.id.size,
            self.nodes,
            parts.join("; ")
        )
    }

    /// `"sm"`, `"tcp"` or `"sm+tcp"`: what carries this rank's traffic.
    pub fn transport_name(&self) -> &'static str {
        match (self.sm.is_some(), self.tcp.is_some(), self.choice) {
            (_, _, Choice::Tcp) | (false, true, _) => "tcp",
            (true, true, _) => "sm+tcp",
            _ => "sm",
        }
    }

    /// One line for the stress summary: nodes, peers per transport,
    /// counters.
    pub fn summary(&self) -> String {
        let sm_peers = self.hub.local.len().saturating_sub(1);
        let tcp_peers = self.route.iter().filter(|r| **r == Route::Tcp).count();
        let mut s = format!(
            "on {} node(s): shared memory to {sm_peers} rank(s), TCP to {tcp_peers} rank(s)",
            self.nodes
        );
        if let Some(sm) = &self.sm {
            let cma = (0..sm.size())
                .filter(|&p| p != sm.rank() && sm.single_copy_to(p))
                .count();
            let (eager, max) = sm.pool_sizes();
            let (split, written) = sm.split_copies();
            let (msg_in, msg_alone, msg_out) = sm.split_messages();
            let (large_single, large_pipelined, large_timed) = sm.large_messages();
            s += &format!(
                " (sm: single copy to {cma}, {large_single} large message(s) sent by single \
                 copy, {large_pipelined} pipelined, {large_timed} pipelined to time it, {} \
                 one-sided transfer(s) by single copy ({} get(s) without asking), {split} \
                 get(s) split with the target, {written} B written into peers' split gets, \
                 {msg_in} message(s) received split with the sender, {msg_alone} split but read \
                 alone after waiting, {msg_out} sent split, {} \
                 sends queued behind a full ring, {} messages sent by fast box, {} box(es) \
                 handed out, fragments carved {eager} eager + {max} max-size, segment {} KiB \
                 reserved)",
                sm.rma_single_copies(),
                sm.direct_gets(),
                sm.queued_total(),
                sm.fbox_sent(),
                sm.boxes_handed_out(),
                sm.reserved_bytes().map_or(0, |b| b / 1024)
            );
        }
        if let Some(t) = &self.tcp {
            s += &format!(
                " (tcp: {} connection(s) from strangers dropped)",
                t.rejected_connections()
            );
        }
        s
    }
}

impl PollCx<'_> {
    /// [`World::register_raw`] from inside a callback.
    ///
    /// # Safety
    ///
    /// As [`World::register_raw`].
    pub unsafe fn register_raw(
        &mut self,
        ptr: *mut u8,
        len: usize,
    ) -> Result<RegionKey, WorldError> {
        // SAFETY: the caller's promise.
        unsafe { register_raw(self.regions, self.me, ptr, len) }
    }

    /// [`World::deregister`] from inside a callback.
    pub fn deregister(&mut self, key: &RegionKey) -> Result<Option<Box<[u8]>>, WorldError> {
        deregister(self.regions, self.me, key)
    }
}

/// Registers `len` bytes at `ptr` in `regions` as a region of rank `me`.
///
/// # Safety
///
/// As [`World::register_raw`].
pub(super) unsafe fn register_raw(
    regions: &mut Regions,
    me: u32,
    ptr: *mut u8,
    len: usize,
) -> Result<RegionKey, WorldError> {
    let mem = RawBuf::from_raw(ptr, len).ok_or(WorldError::InvalidArgument(
        "null pointer with a non-zero length",
    ))?;
    // SAFETY: the caller's promise.
    let id = unsafe { regions.insert(mem) };
    Ok(RegionKey {
        rank: me,
        id,
        len: len as u64,
    })
}

/// Removes rank `me`'s region `key` from `regions`.
pub(super) fn deregister(
    regions: &mut Regions,
    me: u32,
    key: &RegionKey,
) -> Result<Option<Box<[u8]>>, WorldError> {
    let unknown = WorldError::BadLocal {
        status: RmaStatus::UnknownRegion,
    };
    if key.rank != me || regions.len_of(key.id).map(|l| l as u64) != Some(key.len) {
        return Err(unknown);
    }
    regions.remove(key.id).map_err(|e| match e {
        DeregisterError::Unknown => unknown,
        DeregisterError::Busy { ops } => WorldError::RegionBusy { ops },
    })
}

/// A blocking get/put's result: the target's refusal is `Ok(Err(status))`.
fn refusal(r: Result<(), WorldError>) -> Result<Result<(), RmaStatus>, WorldError> {
    match r {
        Ok(()) => Ok(Ok(())),
        Err(WorldError::Refused { status }) => Ok(Err(status)),
        Err(e) => Err(e),
    }
}
