//! The non-blocking job API, used as a program would, with ranks started
//! by `btl run` (or, for the cross-transport cycle, by hand through a
//! rendezvous with chosen node names): request/reply inside a handler,
//! overlap of posted sends with computation, vectored sends, messages
//! handed out in place, registration of user memory with keys exchanged
//! (stale and forged keys refused), and get/put cycles across both
//! transports that must not deadlock.
//!
//! The ranks are this test binary itself, re-run with `BTL_TEST_ROLE`
//! (`scenario:transport`); the `role` test then does the rank's work.

use std::process::Output;
use std::time::{Duration, Instant};

mod common;
use common::in_role;

use btl_linux::world::{
    Builder, Choice, Event, Flow, Outbox, PayloadLocation, RegionKey, Request, World, WorldError,
};

const TAG_REQ: u8 = 1;
const TAG_REP: u8 = 2;
const TAG_DATA: u8 = 3;
const TAG_KEY: u8 = 4;

type R<T> = Result<T, String>;

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

/// Posts with `post` until it is taken, progressing while the world says
/// [`WorldError::WouldBlock`]; fails after 60 s.
fn post_retrying<T>(
    w: &mut World<'_>,
    mut post: impl FnMut(&mut World<'_>) -> Result<T, WorldError>,
) -> R<T> {
    let t0 = Instant::now();
    loop {
        match post(w) {
            Ok(r) => return Ok(r),
            Err(WorldError::WouldBlock { .. }) => {
                w.progress();
            }
            Err(err) => return Err(e(err)),
        }
        if t0.elapsed() > Duration::from_secs(60) {
            return Err("posting did not finish".into());
        }
    }
}

/// Drives the world until `on`, handed the sender and bytes of every
/// message on `tag` (and nothing else), says it has all it waits for.
fn drive_messages(
    w: &mut World<'_>,
    what: &'static str,
    peer: Option<u32>,
    tag: u8,
    mut on: impl FnMut(u32, &[u8]) -> bool,
) -> R<()> {
    w.drive(what, peer, |_, ev| match ev {
        Event::Message { from, tag: t, data } if t == tag && on(from, data) => Flow::Done,
        _ => Flow::Continue,
    })
    .map_err(e)
}

/// Receives `n` messages on `TAG_DATA` from rank 0, message `i` expected
/// to be `expect(i)`, then joins the barrier.
fn receive_in_order(
    w: &mut World<'_>,
    what: &'static str,
    n: u64,
    expect: impl Fn(u64) -> Vec<u8>,
) -> R<String> {
    let (mut got, mut bad) = (0u64, Vec::new());
    drive_messages(w, what, Some(0), TAG_DATA, |_, data| {
        if data != expect(got).as_slice() {
            bad.push(got);
        }
        got += 1;
        got == n
    })?;
    if !bad.is_empty() {
        return Err(format!("messages {bad:?} differ or are out of order"));
    }
    w.barrier().map_err(e)?;
    Ok(format!("{n} messages intact, in order"))
}

/// Bytes of message `i` from `src`, `len` long.
fn pattern(src: u32, i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u64 ^ i.wrapping_mul(0x9e37) ^ u64::from(src) << 5) as u8)
        .collect()
}

/// Request/reply in a handler: every rank answers requests with the bytes
/// reversed, through the handler's outbox; rank 0 asks everybody.
fn reqreply(w: &mut World<'_>) -> R<String> {
    let me = w.rank();
    w.on(TAG_REQ, move |out: &mut Outbox, from, data| {
        let mut r = data.to_vec();
        r.reverse();
        r.extend_from_slice(&me.to_le_bytes());
        out.send(from, TAG_REP, &r);
    })
    .map_err(e)?;
    w.barrier().map_err(e)?;
    if me == 0 {
        let n = w.size();
        for p in 1..n {
            w.isend(p, TAG_REQ, &pattern(0, u64::from(p), 100 + p as usize))
                .map_err(e)?;
        }
        let mut answers = 0;
        let mut bad = Vec::new();
        drive_messages(w, "the replies", None, TAG_REP, |from, data| {
            let mut want = pattern(0, u64::from(from), 100 + from as usize);
            want.reverse();
            want.extend_from_slice(&from.to_le_bytes());
            if data != want.as_slice() {
                bad.push(from);
            }
            answers += 1;
            answers == n - 1
        })?;
        if !bad.is_empty() {
            return Err(format!("wrong replies from {bad:?}"));
        }
    }
    w.barrier().map_err(e)?;
    Ok("request/reply ok".into())
}

/// Overlap: rank 0 posts 64 zero-copy sends (and a vectored one), computes
/// while they complete, then checks every request completed; rank 1 checks
/// every message.
fn overlap(w: &mut World<'_>) -> R<String> {
    const N: u64 = 64;
    let size = |i: u64| if i % 2 == 0 { 256 << 10 } else { 3000 };
    w.barrier().map_err(e)?;
    match w.rank() {
        0 => {
            let mut reqs: Vec<Request> = Vec::new();
            for i in 0..N {
                reqs.push(
                    w.isend_owned(1, TAG_DATA, pattern(0, i, size(i)))
                        .map_err(e)?,
                );
            }
            // One message in three pieces.
            let (a, b, c) = (b"vec".as_slice(), [7u8; 5000], b"tored".as_slice());
            w.isendv(1, TAG_REQ, &[a, &b, c]).map_err(e)?;
            // Compute, progressing now and then.
            let t0 = Instant::now();
            let mut x = 0x1234_5678_u64;
            let mut done = vec![false; reqs.len()];
            let mut rounds = 0u64;
            while done.iter().any(|d| !d) {
                for _ in 0..10_000 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                }
                w.progress();
                for (i, r) in reqs.iter().enumerate() {
                    if !done[i] {
                        if let Some(res) = w.test(*r).map_err(e)? {
                            res.map_err(|err| format!("send {i}: {err}"))?;
                            done[i] = true;
                        }
                    }
                }
                rounds += 1;
                if t0.elapsed() > Duration::from_secs(60) {
                    return Err("the posted sends did not complete".into());
                }
            }
            std::hint::black_box(x);
            w.flush().map_err(e)?;
            w.barrier().map_err(e)?;
            Ok(format!("64 sends overlapped with {rounds} compute rounds"))
        }
        1 => {
            let (mut got, mut vectored, mut bad) = (0u64, false, Vec::new());
            w.drive("the 64 sends", Some(0), |_, ev| {
                match ev {
                    Event::Message {
                        tag: TAG_DATA,
                        data,
                        ..
                    } => {
                        if data != pattern(0, got, size(got)).as_slice() {
                            bad.push(got);
                        }
                        got += 1;
                    }
                    Event::Message {
                        tag: TAG_REQ, data, ..
                    } => {
                        let mut want = b"vec".to_vec();
                        want.extend_from_slice(&[7u8; 5000]);
                        want.extend_from_slice(b"tored");
                        vectored = data == want.as_slice();
                    }
                    _ => {}
                }
                if got == N && vectored {
                    Flow::Done
                } else {
                    Flow::Continue
                }
            })
            .map_err(e)?;
            if !bad.is_empty() {
                return Err(format!("messages {bad:?} differ"));
            }
            w.barrier().map_err(e)?;
            Ok("64 messages and the vectored one intact".into())
        }
        _ => Ok("idle".into()),
    }
}

/// Small raw sends behind others: rank 1 stays away while rank 0 posts
/// 4000 messages of one fragment each from memory it keeps (`isend_raw`);
/// those that cannot leave at once wait in the queue as that memory (their
/// requests complete when they leave, not when posted), and all arrive
/// intact and in order. (Over TCP the kernel's buffers may take them all
/// at once.) Every fourth message is tiny (1 to 240 bytes: over TCP a
/// frame that fits one gathered send, copied when it must wait), between
/// larger ones that wait as the caller's memory.
fn rawqueue(w: &mut World<'_>, tcp: bool) -> R<String> {
    const N: u64 = 4000;
    let size = |i: u64| {
        if i % 4 == 0 {
            1 + (i as usize * 7) % 240
        } else {
            100 + (i as usize * 37) % 3000
        }
    };
    w.barrier().map_err(e)?;
    match w.rank() {
        0 => {
            let msgs: Vec<Vec<u8>> = (0..N).map(|i| pattern(0, i, size(i))).collect();
            let mut reqs = Vec::new();
            for m in &msgs {
                // SAFETY: `msgs` outlives every request and is not
                // written meanwhile (all complete before it drops).
                reqs.push(post_retrying(w, |w| unsafe {
                    w.isend_raw(1, TAG_DATA, &[m])
                })?);
            }
            let queued = reqs.iter().filter(|r| **r != Request::COMPLETE).count();
            if queued == 0 && !tcp {
                return Err("no send waited in the queue: the test did not test it".into());
            }
            for (i, r) in reqs.iter().enumerate() {
                w.wait(*r).map_err(|err| format!("send {i}: {err}"))?;
            }
            w.barrier().map_err(e)?;
            Ok(format!("{N} small raw sends, {queued} of them queued"))
        }
        1 => {
            std::thread::sleep(Duration::from_millis(500));
            receive_in_order(w, "the small raw sends", N, |i| pattern(0, i, size(i)))
        }
        _ => {
            w.barrier().map_err(e)?;
            Ok("idle".into())
        }
    }
}

/// Vectored sends in a flood: rank 0 sends 3000 messages in three pieces
/// each (a short prefix, a middle of 0 to 20000 bytes, a 3-byte suffix:
/// frames that fit one gathered send and frames written straight from
/// their pieces) while rank 1 stays away at first, so the socket fills:
/// some leave whole, some in part (the rest copied), some wait in the
/// queue. All arrive intact and in order.
fn vecflood(w: &mut World<'_>) -> R<String> {
    const N: u64 = 3000;
    let mid = |i: u64| (i as usize * 7919) % 20001 * usize::from(i % 3 != 0) + (i as usize % 200);
    let whole = |i: u64| {
        let mut m = pattern(0, i, (i % 5) as usize);
        m.extend_from_slice(&pattern(1, i, mid(i)));
        m.extend_from_slice(b"end");
        m
    };
    w.barrier().map_err(e)?;
    match w.rank() {
        0 => {
            for i in 0..N {
                let (a, b) = (pattern(0, i, (i % 5) as usize), pattern(1, i, mid(i)));
                post_retrying(w, |w| w.isendv(1, TAG_DATA, &[&a, &b, b"end"]))?;
            }
            w.flush().map_err(e)?;
            w.barrier().map_err(e)?;
            Ok(format!("{N} vectored sends"))
        }
        1 => {
            std::thread::sleep(Duration::from_millis(300));
            receive_in_order(w, "the vectored sends", N, whole)
        }
        _ => {
            w.barrier().map_err(e)?;
            Ok("idle".into())
        }
    }
}

/// Messages are handed out in place: the payload lies in the TCP read
/// buffer or the shared segment (a fragment of the mapping), not in a fresh
/// allocation — for every size up to the largest single-fragment message
/// over shared memory. Messages larger than that (chunks, single copy) are
/// reassembled into a receive buffer and must arrive intact.
fn inplace(w: &mut World<'_>, tcp: bool) -> R<String> {
    let peer = 1 - w.rank();
    let limits = w.limits(peer).ok_or("no limits for the peer")?;
    let max_send = usize::try_from(limits.max_send).map_err(e)?;
    let eager = usize::try_from(limits.eager).map_err(e)?;
    // In place: every size a single fragment (sm) or the read-ahead buffer
    // (tcp) holds; then larger ones, reassembled.
    let small: Vec<usize> = if tcp {
        vec![64, 4096, 16 << 10]
    } else {
        vec![1, 64, eager, eager + 1, 16 << 10, max_send - 1, max_send]
    };
    let large: Vec<usize> = if tcp {
        vec![100 << 10, 256 << 10]
    } else {
        vec![max_send + 1, 3 * max_send + 17, 256 << 10]
    };
    let sizes: Vec<usize> = small.iter().chain(&large).copied().collect();
    w.barrier().map_err(e)?;
    if w.rank() == 0 {
        // Rank 1 says when it listens (messages that arrive during a
        // blocking call with nobody listening are kept as copies).
        w.drive("rank 1 to listen", Some(1), |_, ev| match ev {
            Event::Message { tag: TAG_REQ, .. } => Flow::Done,
            _ => Flow::Continue,
        })
        .map_err(e)?;
        for (i, &s) in sizes.iter().enumerate() {
            w.send(1, TAG_DATA, &pattern(0, i as u64, s)).map_err(e)?;
        }
    } else if w.rank() == 1 {
        w.isend(0, TAG_REQ, b"go").map_err(e)?;
        // (address, length, intact) of each message, checked while the
        // borrow lasts (the callback).
        let mut seen: Vec<(usize, usize, bool)> = Vec::new();
        while seen.len() < sizes.len() {
            w.poll(|_, ev| {
                if let Event::Message {
                    tag: TAG_DATA,
                    data,
                    ..
                } = ev
                {
                    let i = seen.len();
                    let intact = sizes
                        .get(i)
                        .is_some_and(|&s| data == pattern(0, i as u64, s).as_slice());
                    seen.push((data.as_ptr() as usize, data.len(), intact));
                }
            });
        }
        for (i, &(ptr, len, intact)) in seen.iter().enumerate() {
            if len != sizes[i] || !intact {
                return Err(format!(
                    "message {i} ({} bytes) arrived as {len} bytes{}",
                    sizes[i],
                    if intact { "" } else { ", damaged" }
                ));
            }
            let at = w.payload_location(ptr as *const u8, len);
            let want = match (i < small.len(), tcp) {
                (true, true) => Some(PayloadLocation::TcpReadBuffer),
                (true, false) => Some(PayloadLocation::SharedMemory),
                // Over TCP a large payload is read straight into a
                // connection buffer (also "in place"); over shared memory
                // it is reassembled into the per-sender receive buffer.
                (false, true) => None,
                (false, false) => Some(PayloadLocation::Elsewhere),
            };
            if want.is_some_and(|want| at != want) {
                return Err(format!("a {len}-byte message was handed out from {at:?}"));
            }
        }
    }
    w.barrier().map_err(e)?;
    Ok(format!(
        "messages up to {} bytes handed out in place, {} larger ones intact",
        small.iter().max().unwrap_or(&0),
        large.len()
    ))
}

/// Sends our key to every peer (as bytes) and gathers theirs.
fn exchange_keys(w: &mut World<'_>, key: RegionKey) -> R<Vec<Option<RegionKey>>> {
    let (me, n) = (w.rank(), w.size());
    let mut keys: Vec<Option<RegionKey>> = vec![None; n as usize];
    keys[me as usize] = Some(key);
    for p in (0..n).filter(|&p| p != me) {
        w.isend(p, TAG_KEY, &key.to_bytes()).map_err(e)?;
    }
    if keys.iter().any(Option::is_none) {
        drive_messages(w, "the keys", None, TAG_KEY, |from, data| {
            keys[from as usize] = RegionKey::from_bytes(data);
            keys.iter().all(Option::is_some)
        })?;
    }
    Ok(keys)
}

/// Registration of user memory: keys exchanged as bytes, puts and gets
/// into every peer's memory, then a stale key and a forged one refused.
fn regions<'m>(w: &mut World<'m>, mem: &'m mut [u8]) -> R<String> {
    let (me, n) = (w.rank(), w.size());
    let slot = mem.len() / n as usize;
    // Borrowed by the world for its life ('m): the caller declared the
    // memory before the world.
    let key = w.register(mem);
    let keys = exchange_keys(w, key)?;
    // A second region of ours as the local side of iput/iget.
    let local = w.register_owned(pattern(me, 7, slot).into_boxed_slice());
    let mut reqs = Vec::new();
    for p in 0..n {
        let k = keys[p as usize].ok_or("missing key")?;
        reqs.push(
            w.iput(&local, 0, &k, u64::from(me) * slot as u64, slot as u64)
                .map_err(e)?,
        );
    }
    for r in reqs {
        w.wait(r).map_err(e)?;
    }
    w.barrier().map_err(e)?;
    let mine = w.region(&key).ok_or("our region is gone")?.to_vec();
    for p in 0..n {
        let at = p as usize * slot;
        if mine[at..at + slot] != pattern(p, 7, slot)[..] {
            return Err(format!("rank {p}'s put into our memory is wrong"));
        }
    }
    // Read back what we put, into the local region, and check it.
    let scratch = w.register_owned(vec![0u8; slot].into_boxed_slice());
    for p in 0..n {
        let k = keys[p as usize].ok_or("missing key")?;
        let r = w
            .iget(&scratch, 0, &k, u64::from(me) * slot as u64, slot as u64)
            .map_err(e)?;
        w.wait(r).map_err(e)?;
        if w.region(&scratch).ok_or("scratch gone")? != pattern(me, 7, slot).as_slice() {
            return Err(format!("get from rank {p} returned the wrong bytes"));
        }
    }
    // A get posted right after a put to the same range, neither waited
    // for, reads what the put wrote (over shared memory the get then asks
    // the target, behind the put, instead of reading at once). Each rank
    // writes its own slot of the next rank's region.
    w.barrier().map_err(e)?;
    let next = (me + 1) % n;
    let k = keys[next as usize].ok_or("missing key")?;
    let fresh = w.register_owned(pattern(me, 11, slot).into_boxed_slice());
    w.region_mut(&scratch).ok_or("scratch gone")?.fill(0);
    let at = u64::from(me) * slot as u64;
    let put = w.iput(&fresh, 0, &k, at, slot as u64).map_err(e)?;
    let get = w.iget(&scratch, 0, &k, at, slot as u64).map_err(e)?;
    w.wait(put).map_err(e)?;
    w.wait(get).map_err(e)?;
    if w.region(&scratch).ok_or("scratch gone")? != pattern(me, 11, slot).as_slice() {
        return Err(format!(
            "a get posted after a put to rank {next} did not read what the put wrote"
        ));
    }
    w.deregister(&fresh).map_err(e)?;
    // A region in use cannot go; one that is idle can.
    w.barrier().map_err(e)?;
    w.deregister(&key).map_err(e)?;
    w.barrier().map_err(e)?;
    let next = (me + 1) % n;
    let k = keys[next as usize].ok_or("missing key")?;
    let forged = RegionKey {
        id: k.id + 1000,
        ..k
    };
    for (what, k) in [("stale", k), ("forged", forged)] {
        let r = w.iget(&scratch, 0, &k, 0, 8).map_err(e)?;
        match w.wait(r) {
            Err(WorldError::Refused { .. }) => {}
            other => return Err(format!("a get with a {what} key: {other:?}")),
        }
    }
    if RegionKey::from_bytes(&[1, 2, 3]).is_some() {
        return Err("a malformed key decoded".into());
    }
    w.barrier().map_err(e)?;
    Ok("registered memory, keys, stale and forged keys refused".into())
}

/// Four ranks, nodes a, b, a, b: each gets from (and puts into) the next in
/// the cycle 0 → 1 (TCP) → 3 (shared memory) → 2 (TCP) → 0 (shared
/// memory), all at the same time, many rounds. A rank waiting on one
/// transport must serve requests on the other, or the cycle deadlocks.
fn cycle(w: &mut World<'_>) -> R<String> {
    let me = w.rank();
    let next = [1u32, 3, 0, 2][me as usize];
    let len = 256 << 10;
    let key = w.register_owned(pattern(me, 9, len).into_boxed_slice());
    let keys = exchange_keys(w, key)?;
    let k = keys[next as usize].ok_or("missing key")?;
    let mut buf = vec![0u8; len];
    for round in 0..40u32 {
        w.barrier().map_err(e)?;
        // Everybody blocks in a get to the next one at once.
        w.get(&k, 0, &mut buf)
            .map_err(e)?
            .map_err(|s| format!("round {round}: get refused: {s}"))?;
        if buf != pattern(next, 9, len) {
            return Err(format!("round {round}: get returned the wrong bytes"));
        }
        w.put(&k, 0, &buf)
            .map_err(e)?
            .map_err(|s| format!("round {round}: put refused: {s}"))?;
    }
    w.barrier().map_err(e)?;
    Ok(format!(
        "40 rounds of get/put in a cycle across both transports ({})",
        w.summary()
    ))
}

/// Open MPI's get protocol (ob1's RGET) in a poll callback: the target
/// lends a region, the requester gets it and then says "done" with a small
/// message, and the target deregisters the region in the callback that
/// hands it that message — which must succeed: ob1 frees its registration
/// there and never retries. Sizes from one fragment to a large get, over
/// fragments (`frag`: single copy off) or as each transport chooses.
fn findone(w: &mut World<'_>) -> R<String> {
    let (me, n) = (w.rank(), w.size());
    if n != 2 {
        return Err(format!("findone runs on 2 ranks, not {n}"));
    }
    let peer = 1 - me;
    // (4 MiB + 3: an answer that TCP writes in pieces, with an odd tail.)
    let sizes = [
        64usize,
        1000,
        4096,
        8000,
        9000,
        65536,
        300_000,
        1 << 20,
        (4 << 20) + 3,
    ];
    let mut rounds = 0;
    for (i, &len) in sizes.iter().enumerate() {
        for r in 0..8u64 {
            let salt = i as u64 * 100 + r;
            if me == 0 {
                let key = w.register_owned(pattern(me, salt, len).into_boxed_slice());
                w.isend(peer, TAG_KEY, &key.to_bytes()).map_err(e)?;
                let mut outcome = None;
                let until = Instant::now() + Duration::from_secs(30);
                while outcome.is_none() {
                    if Instant::now() > until {
                        return Err(format!("{len} B: no \"done\" from the requester"));
                    }
                    w.poll_with(|cx, ev| {
                        if let Event::Message { tag: TAG_DATA, .. } = ev {
                            outcome = Some(cx.deregister(&key).map(|_| ()));
                        }
                    });
                    // A target that is busy elsewhere between passes (an
                    // MPI rank in ob1, or descheduled): the pass that sends
                    // the last of the data is often the last before "done".
                    std::thread::sleep(Duration::from_micros(300));
                }
                if let Some(Err(err)) = outcome {
                    return Err(format!(
                        "{len} B, round {r}: deregistering after the requester's \"done\": {err}"
                    ));
                }
            } else {
                let mut key = None;
                drive_messages(w, "the region's key", None, TAG_KEY, |_, data| {
                    key = RegionKey::from_bytes(data);
                    true
                })?;
                let k = key.ok_or("a malformed key")?;
                let local = w.register_owned(vec![0u8; len].into_boxed_slice());
                let q = w.iget(&local, 0, &k, 0, len as u64).map_err(e)?;
                w.wait(q).map_err(e)?;
                if w.region(&local).ok_or("local region gone")?
                    != pattern(peer, salt, len).as_slice()
                {
                    return Err(format!(
                        "{len} B, round {r}: the get returned the wrong bytes"
                    ));
                }
                w.isend(peer, TAG_DATA, b"done").map_err(e)?;
                w.deregister(&local).map_err(e)?;
            }
            rounds += 1;
        }
    }
    w.barrier().map_err(e)?;
    Ok(format!(
        "{rounds} gets, each region deregistered on the requester's \"done\""
    ))
}

/// The number just before `label` in a summary line.
fn counter(summary: &str, label: &str) -> R<u64> {
    let at = summary
        .find(label)
        .ok_or_else(|| format!("no {label:?} in {summary}"))?;
    summary[..at]
        .rsplit(' ')
        .next()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| format!("no count before {label:?} in {summary}"))
}

/// More ranks than this (unbound) process may run on: btl then splits no
/// copy between two processes.
fn oversubscribed(n: u32) -> bool {
    std::thread::available_parallelism().map_or(1, |c| c.get()) < n as usize
}

const SPLIT_GETS: &str = " get(s) split with the target";
const SPLIT_WRITTEN: &str = " B written into peers' split gets";

/// Large gets over shared memory, which single copy splits with the
/// target (`split`: it writes the second half into our memory while we
/// read the first) unless `cma_split_min` is 0 (`nosplit`): odd offsets
/// and lengths, one below the threshold, a window of gets at once, and a
/// target that answers only after the split's deadline (it must then
/// write nothing, and the get still completes with the right bytes).
fn split(w: &mut World<'_>, on: bool) -> R<String> {
    let (me, n) = (w.rank(), w.size());
    // Nothing is split on an oversubscribed node.
    let on = on && !oversubscribed(n);
    if !w.describe().contains("single copy (CMA)") {
        return Err(format!("single copy is not available: {}", w.describe()));
    }
    let len = (4 << 20) + 8192;
    let key = w.register_owned(pattern(me, 11, len).into_boxed_slice());
    let keys = exchange_keys(w, key)?;
    let next = (me + 1) % n;
    let k = keys[next as usize].ok_or("missing key")?;
    let want = pattern(next, 11, len);
    let scratch = w.register_owned(vec![0u8; len].into_boxed_slice());
    // (remote offset, length, local offset)
    let one_by_one = [
        (0, 128 << 10, 0),
        (3, (1 << 20) + 1, 5),
        (4097, (4 << 20) + 13, 77),
        (1, 100 << 10, 9),
    ];
    for (roff, l, loff) in one_by_one {
        let r = w
            .iget(&scratch, loff as u64, &k, roff as u64, l as u64)
            .map_err(e)?;
        w.wait(r).map_err(e)?;
        let got = &w.region(&scratch).ok_or("scratch gone")?[loff..loff + l];
        if got != &want[roff..roff + l] {
            let bad = got.iter().zip(&want[roff..]).position(|(a, b)| a != b);
            return Err(format!(
                "get of {l} B at {roff} from rank {next}: wrong bytes from {bad:?}"
            ));
        }
    }
    // A window: eight gets of 512 KiB in flight at once.
    let piece = 512 << 10;
    let mut reqs = Vec::new();
    for i in 0..8u64 {
        let off = i * piece as u64 + i;
        reqs.push(w.iget(&scratch, off, &k, off, piece as u64).map_err(e)?);
    }
    for r in reqs {
        w.wait(r).map_err(e)?;
    }
    let got = w.region(&scratch).ok_or("scratch gone")?;
    for i in 0..8usize {
        let off = i * piece + i;
        if got[off..off + piece] != want[off..off + piece] {
            return Err(format!("windowed get {i} from rank {next}: wrong bytes"));
        }
    }
    w.barrier().map_err(e)?;
    let summary = w.summary();
    let (splits, written) = (
        counter(&summary, SPLIT_GETS)?,
        counter(&summary, SPLIT_WRITTEN)?,
    );
    // Three of the four one by one (not the one below the threshold) and
    // the eight of the window.
    if on && (splits != 11 || written == 0) {
        return Err(format!(
            "expected 11 split gets and bytes written: {summary}"
        ));
    }
    if !on && (splits != 0 || written != 0) {
        return Err(format!("cma_split_min=0 but gets were split: {summary}"));
    }
    // A late target: rank 0 answers rank 1's get only after the deadline.
    let k0 = keys[0].ok_or("missing key")?;
    let l = 1 << 20;
    // Rank 0 sleeps without progressing; rank 1 posts once rank 0 surely
    // sleeps, so rank 0 takes the request up a second after its post (ten
    // times the deadline).
    if me == 0 {
        w.barrier().map_err(e)?;
        std::thread::sleep(Duration::from_millis(1500));
    } else if me == 1 {
        w.barrier().map_err(e)?;
        std::thread::sleep(Duration::from_millis(500));
        let r = w.iget(&scratch, 0, &k0, 64, l as u64).map_err(e)?;
        w.wait(r).map_err(e)?;
        if w.region(&scratch).ok_or("scratch gone")?[..l] != pattern(0, 11, len)[64..64 + l] {
            return Err("the late target's get returned the wrong bytes".into());
        }
    } else {
        w.barrier().map_err(e)?;
    }
    w.barrier().map_err(e)?;
    let late = w.summary();
    if me == 0 && counter(&late, SPLIT_WRITTEN)? != written {
        return Err(format!(
            "the late target wrote after the deadline: {written} B before, {late}"
        ));
    }
    if me == 1 && counter(&late, SPLIT_GETS)? != splits + u64::from(on) {
        return Err(format!(
            "the late get did not complete as a split one: {late}"
        ));
    }
    w.barrier().map_err(e)?;
    Ok(format!("large gets, split={on}: {late}"))
}

const SPLIT_IN: &str = " message(s) received split with the sender";
const SPLIT_ALONE: &str = " split but read alone after waiting";
const SPLIT_OUT: &str = " sent split";

/// Large messages over shared memory, which single copy splits with the
/// sender once the receiver has mapped a landing buffer for it
/// (`splitsend`, with `cma_measure` 0 so single copy carries them all;
/// `nosplitsend` with `cma_split_min` 0 too; `measuredsend` with the
/// defaults, where split and pipelined messages mix as measured): every
/// rank sends the next odd-sized large messages, blocking and posted
/// together, and checks every byte of what it receives, in order.
fn splitsend(w: &mut World<'_>, on: bool, measured: bool) -> R<String> {
    let (me, n) = (w.rank(), w.size());
    // Nothing is split on an oversubscribed node.
    let on = on && !oversubscribed(n);
    if !w.describe().contains("single copy (CMA)") {
        return Err(format!("single copy is not available: {}", w.describe()));
    }
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    // Measured: sizes below `cma_split_min` too, where single copy and
    // the pipelined copy alternate as measured.
    let sizes = if measured {
        [70_000, (100 << 10) + 3, 127 << 10, 300 << 10, (1 << 20) + 1]
    } else {
        [
            300 << 10,
            (1 << 20) + 1,
            (4 << 20) + 13,
            200 << 10,
            (2 << 20) + 4095,
        ]
    };
    let rounds = if measured { 40u64 } else { 4 };
    // Blocking sends, then a window posted together.
    let mut expect = Vec::new();
    for r in 0..rounds {
        for (i, &l) in sizes.iter().enumerate() {
            expect.push((r * 10 + i as u64, l));
        }
    }
    let mut got = 0usize;
    let mut bad = Vec::new();
    let mut check = |from: u32, data: &[u8], got: &mut usize| {
        if let Some(&(seq, l)) = expect.get(*got) {
            if from != prev || data.len() != l || data != pattern(prev, seq, l).as_slice() {
                bad.push(format!(
                    "message {} from {from}: {} bytes",
                    *got,
                    data.len()
                ));
            }
        }
        *got += 1;
    };
    w.barrier().map_err(e)?;
    for r in 0..rounds {
        let msgs: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &l)| pattern(me, r * 10 + i as u64, l))
            .collect();
        if r % 2 == 0 {
            // From buffers at every alignment modulo 64 (where a split
            // message lands in the receiver's landing buffer follows it).
            for (i, m) in msgs.iter().enumerate() {
                let skip = (r as usize * 5 + i * 13 + 1) % 64;
                let mut b = vec![0u8; skip + m.len()];
                b[skip..].copy_from_slice(m);
                w.send(next, TAG_DATA, &b[skip..]).map_err(e)?;
            }
        } else {
            let reqs = msgs
                .into_iter()
                .map(|m| w.isend_owned(next, TAG_DATA, m))
                .collect::<Result<Vec<_>, _>>()
                .map_err(e)?;
            for q in reqs {
                w.wait(q).map_err(e)?;
            }
        }
        let want = (r as usize + 1) * sizes.len();
        drive_messages(w, "large messages", None, TAG_DATA, |from, data| {
            check(from, data, &mut got);
            got >= want
        })?;
    }
    if !bad.is_empty() {
        return Err(format!("wrong messages: {bad:?}"));
    }
    w.flush().map_err(e)?;
    w.barrier().map_err(e)?;
    let summary = w.summary();
    let (split_in, alone, out) = (
        counter(&summary, SPLIT_IN)?,
        counter(&summary, SPLIT_ALONE)?,
        counter(&summary, SPLIT_OUT)?,
    );
    // The first large message from a sender maps the landing buffer;
    // after it, each of them goes split (all at least 128 KiB).
    if measured {
        // Below `cma_split_min` both mechanisms are measured: single copy
        // first, then the pipelined copy, timed.
        let (single, pipelined, timed) = (
            counter(&summary, " large message(s) sent by single copy")?,
            counter(&summary, " pipelined,")?,
            counter(&summary, " pipelined to time it")?,
        );
        if single < 3 || pipelined < 1 || timed < 1 || timed > pipelined {
            return Err(format!(
                "both mechanisms should have been measured: {summary}"
            ));
        }
        return Ok(format!("large messages, measured: {summary}"));
    }
    if on && (split_in + alone < 10 || out < 10) {
        return Err(format!("too few split messages: {summary}"));
    }
    if !on && (split_in + alone != 0 || out != 0) {
        return Err(format!(
            "cma_split_min=0 but messages were split: {summary}"
        ));
    }
    Ok(format!("large messages, split={on}: {summary}"))
}

/// Sockets this process holds (connections, listeners, the wire-up's).
fn sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|f| std::fs::read_link(f.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy().starts_with("socket:"))
                .count()
        })
        .unwrap_or(0)
}

/// Wall-clock nanoseconds (one clock for every rank of this machine).
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Barriers of every rank, one rank late for each: rank 0 gathers when each
/// rank entered and left each barrier and checks that nobody left before
/// the last one entered. Over TCP it also checks that the barriers opened
/// about `2 log2 n` connections per rank, not `n - 1` (the dissemination
/// schedule; nothing else is sent but the reports to rank 0).
fn barriers(w: &mut World<'_>, tcp: bool) -> R<String> {
    const ROUNDS: u64 = 6;
    const TAG_TIMES: u8 = 6;
    let me = w.rank();
    let n = w.size();
    let mut times = Vec::new();
    for k in 0..ROUNDS {
        if u64::from(me) == (k * 7 + 3) % u64::from(n) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let entered = now_ns();
        w.barrier().map_err(|x| format!("barrier {k}: {x}"))?;
        times.push((entered, now_ns()));
    }
    let socks = sockets() as u64;
    let mut report: Vec<u8> = socks.to_le_bytes().to_vec();
    for (a, b) in &times {
        report.extend_from_slice(&a.to_le_bytes());
        report.extend_from_slice(&b.to_le_bytes());
    }
    if me != 0 {
        w.send(0, TAG_TIMES, &report).map_err(e)?;
        w.flush().map_err(e)?;
        // Stay until rank 0 has everything.
        w.barrier().map_err(e)?;
        return Ok(format!("{socks} sockets"));
    }
    let mut all = vec![report];
    all.resize(n as usize, Vec::new());
    let mut got = 1;
    drive_messages(w, "the reports", None, TAG_TIMES, |from, data| {
        all[from as usize] = data.to_vec();
        got += 1;
        got == n
    })?;
    w.barrier().map_err(e)?;
    let at = |r: &[u8], i: usize| u64::from_le_bytes(r[i * 8..i * 8 + 8].try_into().unwrap());
    let mut most = 0;
    for (r, rep) in all.iter().enumerate() {
        if rep.len() != 8 + 16 * ROUNDS as usize {
            return Err(format!("rank {r}: report of {} bytes", rep.len()));
        }
        // Rank 0 holds a connection from everyone for the reports.
        if r != 0 {
            most = most.max(at(rep, 0));
        }
    }
    for k in 0..ROUNDS as usize {
        let last_in = all.iter().map(|rep| at(rep, 1 + 2 * k)).max().unwrap();
        for (r, rep) in all.iter().enumerate() {
            let out = at(rep, 2 + 2 * k);
            if out < last_in {
                return Err(format!(
                    "barrier {k}: rank {r} left {} us before the last rank entered",
                    (last_in - out) / 1000
                ));
            }
        }
    }
    // Dissemination: partners i +- 2^j, at most 2 ceil(log2 n); plus the
    // report's connection to rank 0, the listener and the wire-up's.
    let rounds = u64::from(u32::BITS - (n - 1).leading_zeros());
    let bound = 2 * rounds + 4;
    if tcp && n > 8 && most > bound {
        return Err(format!(
            "a rank holds {most} sockets after barriers alone (want at most {bound})"
        ));
    }
    Ok(format!(
        "{ROUNDS} barriers of {n}, at most {most} sockets a rank but rank 0"
    ))
}

/// A large message whose wait gave up (the receiver was busy for longer
/// than rank 0's 1 s timeout) stays ahead of what rank 0 sends next, its
/// memory kept: rank 1 gets it whole, then the next one (with
/// `cma_measure` 0, so single copy carries both, split once rank 1 has a
/// landing buffer).
fn cancelsend(w: &mut World<'_>) -> R<String> {
    let len = (1 << 20) + 1;
    // A first message with both ranks receiving, so that rank 1 maps its
    // landing buffer and the next ones can be split.
    if w.rank() == 0 {
        w.send(1, TAG_DATA, &pattern(0, 0, len)).map_err(e)?;
        w.barrier().map_err(e)?;
    } else {
        receive_in_order(w, "the first message", 1, |i| pattern(0, i, len))?;
    }
    if w.rank() == 1 {
        // Busy, no progress: rank 0's wait times out and cancels.
        std::thread::sleep(Duration::from_secs(3));
        return receive_in_order(w, "the cancelled and the next message", 2, |i| {
            pattern(0, i + 1, len)
        });
    }
    let q = w.isend_owned(1, TAG_DATA, pattern(0, 1, len)).map_err(e)?;
    if w.wait(q).is_ok() {
        return Err("the wait did not time out while rank 1 slept".into());
    }
    let q = w.isend_owned(1, TAG_DATA, pattern(0, 2, len)).map_err(e)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        w.progress();
        if let Some(r) = w.test(q).map_err(e)? {
            r.map_err(e)?;
            w.barrier().map_err(e)?;
            return Ok("a cancelled message stayed ahead of the next".into());
        }
        if Instant::now() > deadline {
            return Err("the message after the cancelled one did not complete in 60 s".into());
        }
    }
}

/// A rank: `BTL_TEST_ROLE` is `scenario:transport` (reported as such, so
/// the job's check finds `OK scenario:`).
#[test]
fn role() {
    common::play_role(|role| {
        let (scenario, transport) = role.split_once(':').expect("scenario:transport");
        let choice = Choice::parse(transport).expect("a transport choice");
        // Declared before the world, so it outlives it.
        let mut mem = vec![0u8; 4 * 8192];
        let mut b = Builder::new().transports(choice);
        if scenario == "split" || scenario == "nosplit" {
            // Every get above one eager fragment by single copy (none of
            // them large enough for the measured choice of mechanism).
            b = b.set("sm", "min_rdma_pipeline_size", "64M").map_err(e)?;
        }
        if scenario == "findone-frag" {
            b = b.set("sm", "use_cma", "0").map_err(e)?;
        }
        if scenario == "splitsend" || scenario == "nosplitsend" || scenario == "cancelsend" {
            b = b.set("sm", "cma_measure", "0").map_err(e)?;
        }
        if scenario == "cancelsend" && std::env::var("BTL_RANK").as_deref() == Ok("0") {
            b = b.set("btl", "timeout", "1").map_err(e)?;
        }
        if scenario == "nosplit" || scenario == "nosplitsend" {
            b = b.set("sm", "cma_split_min", "0").map_err(e)?;
        }
        let mut w = b.init().map_err(e)?;
        match scenario {
            "reqreply" => reqreply(&mut w),
            "overlap" => overlap(&mut w),
            "rawqueue" => rawqueue(&mut w, transport == "tcp"),
            "vecflood" => vecflood(&mut w),
            "inplace" => inplace(&mut w, transport == "tcp"),
            "regions" => {
                let n = w.size() as usize;
                regions(&mut w, &mut mem[..n * 8192])
            }
            "cycle" => cycle(&mut w),
            "barriers" => barriers(&mut w, transport == "tcp"),
            "findone" | "findone-frag" => findone(&mut w),
            "split" => split(&mut w, true),
            "nosplit" => split(&mut w, false),
            "splitsend" => splitsend(&mut w, true, false),
            "nosplitsend" => splitsend(&mut w, false, false),
            "measuredsend" => splitsend(&mut w, true, true),
            "cancelsend" => cancelsend(&mut w),
            other => Err(format!("unknown scenario {other}")),
        }
    });
}

fn run_job(n: u32, scenario: &str, transport: &str) -> Output {
    let out = common::role_job(n, &format!("{scenario}:{transport}"))
        .output()
        .unwrap();
    check(&out, n, scenario);
    out
}

/// Runs each `(ranks, scenario, transport)` job in turn (from the test
/// process only: a rank re-running the test binary in a role does nothing).
fn run_jobs(jobs: &[(u32, &str, &str)]) {
    if !in_role() {
        for &(n, scenario, transport) in jobs {
            run_job(n, scenario, transport);
        }
    }
}

fn check(o: &Output, n: u32, scenario: &str) {
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{:?}\n{out}\n{err}", o.status);
    assert_eq!(
        out.matches(&format!("OK {scenario}:")).count(),
        n as usize,
        "{out}\n{err}"
    );
}

/// One `#[test]` per entry: its `(ranks, scenario, transport)` jobs, run in
/// turn by [`run_jobs`].
macro_rules! job_tests {
    ($($(#[$doc:meta])* $name:ident: [$($job:expr),+ $(,)?];)+) => {
        $($(#[$doc])* #[test] fn $name() { run_jobs(&[$($job),+]); })+
    };
}

job_tests! {
    request_reply_in_a_handler: [(4, "reqreply", "sm"), (3, "reqreply", "tcp")];
    posted_sends_overlap_with_computation: [(2, "overlap", "sm"), (2, "overlap", "tcp")];
    vectored_sends_in_a_flood_arrive_in_order: [(2, "vecflood", "sm"), (2, "vecflood", "tcp")];
    small_raw_sends_wait_in_order_as_the_callers_memory: [(2, "rawqueue", "sm"), (2, "rawqueue", "tcp")];
    messages_are_handed_out_in_place: [(2, "inplace", "sm"), (2, "inplace", "tcp")];
    registered_user_memory_and_keys: [(3, "regions", "sm"), (3, "regions", "tcp")];
    a_region_is_free_once_its_get_is_answered: [(2, "findone", "sm"), (2, "findone-frag", "sm"), (2, "findone", "tcp")];
    large_gets_are_split_with_the_target: [(2, "split", "sm"), (3, "split", "sm"), (2, "nosplit", "sm")];
    large_messages_are_split_with_the_sender: [(2, "splitsend", "sm"), (3, "splitsend", "sm"), (2, "nosplitsend", "sm")];
    /// Large messages as measured: single copy (plain and split) and the
    /// pipelined copy mix, measurement bursts included, and every byte
    /// arrives in order.
    measured_large_messages_arrive_whole_and_in_order: [(2, "measuredsend", "sm"), (4, "measuredsend", "sm")];
    /// A posted large message whose wait timed out still arrives whole,
    /// ahead of the next.
    a_cancelled_large_message_stays_ahead_of_the_next: [(2, "cancelsend", "sm")];
    /// Barriers hold everyone until the last rank enters, by the direct
    /// schedule (3 ranks) and by dissemination (9 over shared memory, 16
    /// over TCP, where it opens a few connections per rank, not n - 1).
    barriers_wait_for_the_last_rank: [(3, "barriers", "sm"), (9, "barriers", "sm"), (16, "barriers", "tcp")];
}

/// The cycle of blocking gets across transports (the cross-host get/put
/// deadlock), four ranks on two "nodes" of this machine through a
/// rendezvous with chosen node names.
#[test]
fn get_put_cycle_across_transports_completes() {
    if in_role() {
        return;
    }
    let job = format!("cyc{}", std::process::id());
    let outs = common::run_rendezvous(
        4,
        &job,
        |r| {
            let node = if r % 2 == 0 { "nodea" } else { "nodeb" };
            vec![
                ("BTL_TEST_ROLE", "cycle:auto".to_string()),
                ("BTL_NODE", node.to_string()),
                ("BTL_TIMEOUT", "60".to_string()),
            ]
        },
        Duration::from_secs(150),
    );
    // Both transports used.
    common::assert_ranks_say(&outs, |_| {
        ["OK cycle:", "shared memory to 1 rank(s), TCP to 2 rank(s)"]
    });
}

#[test]
fn builder_errors_name_the_parameter() {
    let err = |b: Result<Builder, WorldError>| match b {
        Err(WorldError::Param { name, message }) => format!("{name}: {message}"),
        other => panic!("expected a parameter error, got {other:?}"),
    };
    let m = err(Builder::new().set("sm", "fifo_size", "lots"));
    assert!(m.starts_with("sm.fifo_size:"), "{m}");
    assert!(m.contains("fifo_size"), "{m}");
    let m = err(Builder::new().set("sm", "no_such_thing", "1"));
    assert!(m.contains("no_such_thing"), "{m}");
    let m = err(Builder::new().set("tcp", "port_min_v4", "many"));
    assert!(m.starts_with("tcp.port_min_v4:"), "{m}");
    let m = err(Builder::new().set("btl", "timeout", "-3"));
    assert!(m.contains("positive number of seconds"), "{m}");
    let m = err(Builder::new().set("gpu", "x", "1"));
    assert!(m.contains("unknown component"), "{m}");
    // Good values are taken.
    assert!(Builder::new()
        .set("sm", "fifo_size", "8k")
        .and_then(|b| b.set("tcp", "if_include", "lo"))
        .and_then(|b| b.set("btl", "timeout", "2.5"))
        .is_ok());
}
