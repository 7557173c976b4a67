//! The incremental stream decoder: socket bytes in, handshake / frame
//! events out, through a caller-provided read-ahead buffer (the seed's
//! `endpoint_cache`).
//!
//! # Contract
//!
//! The adapter reads socket bytes straight into [`Decoder::spare`] (the
//! free tail of the buffer, compacted on demand), reports how many with
//! [`Decoder::filled`], then drains [`Decoder::next_event`] until it returns
//! `None`. One read can therefore yield many frames: every complete item in
//! the buffer comes out of one `filled` call.
//!
//! A stream is, optionally, one handshake ([`Decoder::expecting_handshake`]),
//! then frames. Each frame gives [`Event::Header`], zero or more
//! [`Event::Payload`] chunks whose concatenation is the payload (a payload
//! larger than the buffer streams through it; chunks borrow the buffer and
//! are valid until the next call), then [`Event::FrameEnd`] (also for an
//! empty payload). The decoder accepts any split of the stream: one byte at
//! a time, many frames per read, a header split across reads.
//!
//! Guarantees the adapter may rely on:
//!
//! - a frame header announcing more than `max_frame` payload bytes is
//!   refused as soon as its 16 bytes are in, before any payload is read;
//! - for PUT and GET frames the first `Payload` chunk holds at least the
//!   whole RMA sub-header ([`RMA_HEADER_LEN`] bytes), already validated
//!   ([`RmaRepr::parse`] and [`RmaRepr::check_frame`]);
//! - after `next_event` returned `None`, fewer than [`RMA_HEADER_LEN`]
//!   bytes remain buffered, so `spare` is never empty (the buffer holds at
//!   least [`MIN_BUFFER`] bytes);
//! - any error poisons the decoder: every later `next_event` returns the
//!   same error (the adapter drops the connection). Nothing a peer sends
//!   can make the decoder panic.
//!
//! No I/O and no allocation happen here.

use core::fmt;

use super::wire::{
    FrameHeader, FrameRepr, FrameType, HandshakePacket, HandshakeRepr, RmaPacket, RmaRepr,
    WireError, FRAME_HEADER_LEN, HANDSHAKE_LEN, RMA_HEADER_LEN,
};

/// Smallest read-ahead buffer a [`Decoder`] accepts.
pub const MIN_BUFFER: usize = 64;
/// The default read-ahead buffer size (the seed's `endpoint_cache`).
pub const DEFAULT_BUFFER: usize = 30 * 1024;

/// The buffer given to a [`Decoder`] is shorter than [`MIN_BUFFER`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[error("decoder buffer of {len} bytes is smaller than the minimum {min}")]
pub struct BufferTooSmall {
    /// Length of the buffer given.
    pub len: usize,
    /// The minimum, [`MIN_BUFFER`].
    pub min: usize,
}

/// One decoded item of the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Event<'a> {
    /// The peer's handshake (first item, when expected). `job` and `rank`
    /// are not validated yet.
    Handshake(HandshakeRepr),
    /// A frame starts.
    Header(FrameRepr),
    /// Payload bytes of the current frame (one chunk of it).
    Payload(&'a [u8]),
    /// The current frame is complete.
    FrameEnd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Handshake,
    Header,
    Payload {
        frame: FrameRepr,
        remaining: u32,
        rma_pending: bool,
    },
    End,
}

impl Stage {
    /// Where a frame whose RMA sub-header (if any) is delivered stands
    /// with `remaining` payload bytes still to come: at its end when none.
    fn rest_of(frame: FrameRepr, remaining: u32) -> Self {
        if remaining == 0 {
            Stage::End
        } else {
            Stage::Payload {
                frame,
                remaining,
                rma_pending: false,
            }
        }
    }
}

/// The incremental decoder of one connection's byte stream.
///
/// The read-ahead buffer `B` is any byte storage: `&mut [u8]` (static
/// storage on bare metal) or an owned `Box<[u8]>` / `Vec<u8>` (hosted).
pub struct Decoder<B> {
    buf: B,
    /// First unconsumed byte. Invariant: `start <= end <= buf.len()`.
    start: usize,
    /// End of the received bytes.
    end: usize,
    stage: Stage,
    poison: Option<WireError>,
}

impl<B: AsRef<[u8]>> fmt::Debug for Decoder<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decoder")
            .field("capacity", &self.buf.as_ref().len())
            .field("start", &self.start)
            .field("end", &self.end)
            .field("stage", &self.stage)
            .field("poison", &self.poison)
            .finish()
    }
}

impl<B: AsRef<[u8]> + AsMut<[u8]>> Decoder<B> {
    /// A decoder whose stream starts with frames (the handshake was
    /// validated some other way).
    pub fn new(buf: B) -> Result<Self, BufferTooSmall> {
        Self::with_stage(buf, Stage::Header)
    }

    /// A decoder whose stream starts with the peer's handshake.
    pub fn expecting_handshake(buf: B) -> Result<Self, BufferTooSmall> {
        Self::with_stage(buf, Stage::Handshake)
    }

    fn with_stage(buf: B, stage: Stage) -> Result<Self, BufferTooSmall> {
        if buf.as_ref().len() < MIN_BUFFER {
            return Err(BufferTooSmall {
                len: buf.as_ref().len(),
                min: MIN_BUFFER,
            });
        }
        Ok(Self {
            buf,
            start: 0,
            end: 0,
            stage,
            poison: None,
        })
    }

    /// Forgets everything of the previous stream (buffered bytes, the item
    /// in progress, a poisoning error) and starts a new one over the same
    /// buffer: with the peer's handshake when `expect_handshake`, else with
    /// frames. For adapters that reuse static buffers across connections.
    pub fn reset(&mut self, expect_handshake: bool) {
        self.start = 0;
        self.end = 0;
        self.poison = None;
        self.stage = if expect_handshake {
            Stage::Handshake
        } else {
            Stage::Header
        };
    }

    /// The free tail of the buffer, to read socket bytes into. Moves the
    /// unconsumed bytes to the front first, so after a drain it is never
    /// empty.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.start > 0 {
            self.buf.as_mut().copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.buf.as_mut()[self.end..]
    }

    /// Records that `n` bytes were written at the start of [`Self::spare`].
    /// An `n` beyond the spare room is a caller bug: it is clamped (and
    /// debug builds panic).
    pub fn filled(&mut self, n: usize) {
        let room = self.buf.as_ref().len() - self.end;
        debug_assert!(n <= room, "filled({n}) with only {room} spare bytes");
        self.end += n.min(room);
    }

    /// The next event, `None` when more bytes are needed. `max_frame` is
    /// the largest payload a frame header may announce.
    pub fn next_event(&mut self, max_frame: u32) -> Option<Result<Event<'_>, WireError>> {
        if let Some(e) = self.poison {
            return Some(Err(e));
        }
        let avail = self.end - self.start;
        match self.stage {
            Stage::Handshake => {
                if avail < HANDSHAKE_LEN {
                    return None;
                }
                let bytes = &self.buf.as_ref()[self.start..self.start + HANDSHAKE_LEN];
                match HandshakeRepr::parse(&HandshakePacket::new_unchecked(bytes)) {
                    Ok(repr) => {
                        self.start += HANDSHAKE_LEN;
                        self.stage = Stage::Header;
                        Some(Ok(Event::Handshake(repr)))
                    }
                    Err(e) => self.fail(e),
                }
            }
            Stage::Header => {
                if avail < FRAME_HEADER_LEN {
                    return None;
                }
                let bytes = &self.buf.as_ref()[self.start..self.start + FRAME_HEADER_LEN];
                match FrameRepr::parse(&FrameHeader::new_unchecked(bytes), max_frame) {
                    Ok(frame) => {
                        self.start += FRAME_HEADER_LEN;
                        self.stage = if frame.len == 0 {
                            Stage::End
                        } else {
                            Stage::Payload {
                                frame,
                                remaining: frame.len,
                                rma_pending: matches!(frame.kind, FrameType::Put | FrameType::Get),
                            }
                        };
                        Some(Ok(Event::Header(frame)))
                    }
                    Err(e) => self.fail(e),
                }
            }
            Stage::Payload {
                frame,
                remaining,
                rma_pending,
            } => {
                if rma_pending {
                    if avail < RMA_HEADER_LEN {
                        return None;
                    }
                    let bytes = &self.buf.as_ref()[self.start..self.start + RMA_HEADER_LEN];
                    let checked = RmaRepr::parse(&RmaPacket::new_unchecked(bytes))
                        .and_then(|rma| rma.check_frame(&frame));
                    if let Err(e) = checked {
                        return self.fail(e);
                    }
                }
                let n = avail.min(remaining as usize);
                if n == 0 {
                    return None;
                }
                let from = self.start;
                self.start += n;
                // n <= remaining, so this cannot underflow or truncate.
                let remaining = remaining - n as u32;
                self.stage = Stage::rest_of(frame, remaining);
                Some(Ok(Event::Payload(&self.buf.as_ref()[from..from + n])))
            }
            Stage::End => {
                self.stage = Stage::Header;
                Some(Ok(Event::FrameEnd))
            }
        }
    }

    /// A whole frame in one step: when the stream is at a frame boundary,
    /// the buffer holds the frame's header and all of its payload, the
    /// frame is not an RMA frame (PUT/GET, whose payload opens with a
    /// sub-header) and `accept` takes its header, returns the header and
    /// the payload (in the buffer) and moves past the frame, as the
    /// `Header`, `Payload` and `FrameEnd` events would. Otherwise `None`
    /// and nothing is consumed: [`Self::next_event`] goes on from the same
    /// place (and reports a header that does not parse).
    ///
    /// The adapter's fast path for small messages: one header parse and no
    /// event state per frame.
    pub fn next_whole_frame(
        &mut self,
        max_frame: u32,
        accept: impl FnOnce(&FrameRepr) -> bool,
    ) -> Option<(FrameRepr, &[u8])> {
        if !matches!(self.stage, Stage::Header) || self.poison.is_some() {
            return None;
        }
        let avail = self.end - self.start;
        if avail < FRAME_HEADER_LEN {
            return None;
        }
        let bytes = &self.buf.as_ref()[self.start..self.start + FRAME_HEADER_LEN];
        let frame = FrameRepr::parse(&FrameHeader::new_unchecked(bytes), max_frame).ok()?;
        // `len` is at most max_frame (u32): no overflow.
        let total = FRAME_HEADER_LEN + frame.len as usize;
        if avail < total || matches!(frame.kind, FrameType::Put | FrameType::Get) || !accept(&frame)
        {
            return None;
        }
        let from = self.start + FRAME_HEADER_LEN;
        self.start += total;
        Some((frame, &self.buf.as_ref()[from..self.start]))
    }

    fn fail<'s>(&mut self, e: WireError) -> Option<Result<Event<'s>, WireError>> {
        self.poison = Some(e);
        Some(Err(e))
    }

    /// Whether bytes of an unfinished item are buffered, or a frame's
    /// payload is still expected: EOF now is a truncation
    /// ([`WireError::UnexpectedEof`]), not a clean end of stream.
    pub fn has_partial(&self) -> bool {
        self.end > self.start || matches!(self.stage, Stage::Payload { .. })
    }

    /// Payload bytes of the current frame the adapter may read straight
    /// from the socket into its own destination, skipping the read-ahead
    /// buffer (one copy less for large frames): nonzero only while a
    /// payload is in progress, nothing is buffered, and the RMA sub-header
    /// (PUT/GET) has been delivered. Report what was read with
    /// [`Self::payload_read_directly`].
    pub fn direct_payload_room(&self) -> u32 {
        match self.stage {
            Stage::Payload {
                remaining,
                rma_pending: false,
                ..
            } if self.start == self.end && self.poison.is_none() => remaining,
            _ => 0,
        }
    }

    /// Records that `n` payload bytes (at most [`Self::direct_payload_room`];
    /// more is clamped) were read directly by the adapter: they are part of
    /// the current frame and produce no `Payload` event; `FrameEnd` follows
    /// when the payload is complete.
    pub fn payload_read_directly(&mut self, n: u32) {
        let room = self.direct_payload_room();
        debug_assert!(n <= room, "payload_read_directly({n}) with room {room}");
        let n = n.min(room);
        if let Stage::Payload {
            frame, remaining, ..
        } = self.stage
        {
            let remaining = remaining - n;
            self.stage = Stage::rest_of(frame, remaining);
        }
    }

    /// The error that poisoned the decoder, if any.
    pub fn error(&self) -> Option<WireError> {
        self.poison
    }

    /// Whether the peer's handshake is still expected.
    pub fn awaiting_handshake(&self) -> bool {
        self.stage == Stage::Handshake
    }

    /// Received bytes not yet turned into events.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Size of the read-ahead buffer.
    pub fn capacity(&self) -> usize {
        self.buf.as_ref().len()
    }
}

/// Decodes `stream` as if it arrived in pieces cut at the positions in
/// `cuts` (increasing; out-of-order or out-of-range positions are clamped),
/// through a decoder over `buf`, calling `on_event` for every event.
///
/// Each piece is copied into [`Decoder::spare`] (in several steps if it is
/// larger) and the events are drained after each copy, as an adapter does
/// after each `read`. Returns the first error, or
/// [`WireError::UnexpectedEof`] if the stream ends inside an item. Meant
/// for tests and fuzz targets (chunked decode must equal one-shot decode).
///
/// # Panics
///
/// If `buf` is shorter than [`MIN_BUFFER`] (a caller bug, not an input
/// error).
pub fn decode_all(
    stream: &[u8],
    cuts: &[usize],
    buf: &mut [u8],
    max_frame: u32,
    expect_handshake: bool,
    on_event: &mut dyn FnMut(&Event<'_>),
) -> Result<(), WireError> {
    decode_all_with(
        stream,
        cuts,
        buf,
        max_frame,
        expect_handshake,
        &mut |_| false,
        on_event,
    )
}

/// [`decode_all`], trying [`Decoder::next_whole_frame`] (with `whole` as
/// its `accept`) before every event, as an adapter's fast path does; a
/// frame taken whole is reported as its `Header`, `Payload` (when not
/// empty) and `FrameEnd` events, so the events must equal
/// [`decode_all`]'s.
///
/// # Panics
///
/// If `buf` is shorter than [`MIN_BUFFER`] (a caller bug, not an input
/// error).
pub fn decode_all_with(
    stream: &[u8],
    cuts: &[usize],
    buf: &mut [u8],
    max_frame: u32,
    expect_handshake: bool,
    whole: &mut dyn FnMut(&FrameRepr) -> bool,
    on_event: &mut dyn FnMut(&Event<'_>),
) -> Result<(), WireError> {
    let decoder = if expect_handshake {
        Decoder::expecting_handshake(buf)
    } else {
        Decoder::new(buf)
    };
    let mut decoder = match decoder {
        Ok(d) => d,
        Err(e) => panic!("decode_all: {e}"),
    };
    let mut pos = 0;
    for &cut in cuts.iter().chain(core::iter::once(&stream.len())) {
        let cut = cut.clamp(pos, stream.len());
        let mut piece = &stream[pos..cut];
        pos = cut;
        while !piece.is_empty() {
            let spare = decoder.spare();
            let n = spare.len().min(piece.len());
            // Never 0: after a drain, fewer than MIN_BUFFER bytes remain.
            debug_assert!(n > 0);
            spare[..n].copy_from_slice(&piece[..n]);
            decoder.filled(n);
            piece = &piece[n..];
            loop {
                if let Some((h, p)) = decoder.next_whole_frame(max_frame, &mut *whole) {
                    on_event(&Event::Header(h));
                    if !p.is_empty() {
                        on_event(&Event::Payload(p));
                    }
                    on_event(&Event::FrameEnd);
                    continue;
                }
                match decoder.next_event(max_frame) {
                    Some(event) => on_event(&event?),
                    None => break,
                }
            }
        }
    }
    if decoder.has_partial() {
        Err(WireError::UnexpectedEof)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod direct_tests {
    use super::*;
    use crate::tcp::wire::FrameRepr;

    #[test]
    fn reset_starts_a_new_stream_over_the_same_buffer() {
        let mut buf = [0u8; 64];
        let mut d = Decoder::expecting_handshake(&mut buf[..]).unwrap();
        // A poisoned decoder with bytes buffered...
        d.spare()[..24].copy_from_slice(&[0xee; 24]);
        d.filled(24);
        assert!(matches!(
            d.next_event(100),
            Some(Err(WireError::BadMagic { .. }))
        ));
        d.reset(false);
        assert_eq!((d.buffered(), d.error(), d.has_partial()), (0, None, false));
        assert!(!d.awaiting_handshake());
        d.spare()[..16].copy_from_slice(&FrameRepr::send(9, 0).to_bytes());
        d.filled(16);
        assert!(matches!(d.next_event(100), Some(Ok(Event::Header(h))) if h.tag == 9));
        assert_eq!(d.next_event(100), Some(Ok(Event::FrameEnd)));
        // ...and back to expecting a handshake.
        d.reset(true);
        assert!(d.awaiting_handshake());
        let hs = HandshakeRepr { job: 5, rank: 1 }.to_bytes();
        d.spare()[..24].copy_from_slice(&hs);
        d.filled(24);
        assert_eq!(
            d.next_event(100),
            Some(Ok(Event::Handshake(HandshakeRepr { job: 5, rank: 1 })))
        );
    }

    #[test]
    fn direct_payload_reads_skip_the_buffer() {
        let mut buf = [0u8; 64];
        let mut d = Decoder::new(&mut buf[..]).unwrap();
        let hdr = FrameRepr::send(3, 100).to_bytes();
        d.spare()[..16].copy_from_slice(&hdr);
        d.filled(16);
        assert!(matches!(d.next_event(1000), Some(Ok(Event::Header(_)))));
        assert!(d.next_event(1000).is_none());
        assert_eq!(d.direct_payload_room(), 100);
        d.payload_read_directly(60);
        assert_eq!(d.direct_payload_room(), 40);
        // The rest arrives through the buffer, with the next header.
        let mut tail = [7u8; 40].to_vec();
        tail.extend_from_slice(&FrameRepr::send(4, 0).to_bytes());
        d.spare()[..56].copy_from_slice(&tail);
        d.filled(56);
        assert_eq!(d.direct_payload_room(), 0);
        assert!(matches!(d.next_event(1000), Some(Ok(Event::Payload(p))) if p.len() == 40));
        assert_eq!(d.next_event(1000), Some(Ok(Event::FrameEnd)));
        assert!(matches!(d.next_event(1000), Some(Ok(Event::Header(h))) if h.tag == 4));
        assert_eq!(d.next_event(1000), Some(Ok(Event::FrameEnd)));
        // Clamped, never past the frame.
        let mut buf2 = [0u8; 64];
        let mut d2 = Decoder::new(&mut buf2[..]).unwrap();
        d2.spare()[..16].copy_from_slice(&FrameRepr::send(1, 10).to_bytes());
        d2.filled(16);
        let _ = d2.next_event(1000);
        assert_eq!(d2.direct_payload_room(), 10);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// A decoded event with its payload owned, consecutive payload chunks
    /// merged.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Owned {
        Handshake(HandshakeRepr),
        Header(FrameRepr),
        Payload(Vec<u8>),
        End,
    }

    fn push(out: &mut Vec<Owned>, e: &Event<'_>) {
        match *e {
            Event::Handshake(r) => out.push(Owned::Handshake(r)),
            Event::Header(r) => out.push(Owned::Header(r)),
            Event::Payload(p) => {
                assert!(!p.is_empty(), "empty payload chunk");
                if let Some(Owned::Payload(v)) = out.last_mut() {
                    v.extend_from_slice(p);
                } else {
                    out.push(Owned::Payload(p.to_vec()));
                }
            }
            Event::FrameEnd => out.push(Owned::End),
        }
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    const HS: HandshakeRepr = HandshakeRepr {
        job: 0xfeed_f00d,
        rank: 3,
    };

    /// Cut points in a stream of `len` bytes, ascending, drawn from a
    /// generator seeded `seed`: each one `1..span` bytes after the one
    /// before, `span` being `long` one time in `long_one_in` and `short`
    /// otherwise.
    fn random_cuts(len: usize, seed: u64, long_one_in: u64, long: u64, short: u64) -> Vec<usize> {
        let mut rng = Rng(seed);
        let mut cuts = Vec::new();
        let mut at = 0;
        loop {
            let span = if rng.below(long_one_in) == 0 {
                long
            } else {
                short
            };
            at += 1 + rng.below(span) as usize;
            if at >= len {
                return cuts;
            }
            cuts.push(at);
        }
    }

    /// A handshake and `frames` random frames (sizes `0..max_size`), plus
    /// the events they must decode to.
    fn stream(seed: u64, frames: usize, max_size: u64) -> (Vec<u8>, Vec<Owned>) {
        let mut rng = Rng(seed);
        let mut bytes = HS.to_bytes().to_vec();
        let mut events = vec![Owned::Handshake(HS)];
        for i in 0..frames {
            let size = rng.below(max_size) as u32;
            let mut payload: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
            let (kind, id) = match rng.below(8) {
                0 => (FrameType::Put, i as u64 + 1),
                1 => (FrameType::Get, i as u64 + 1),
                2 => (FrameType::GetResp, i as u64 + 1),
                3 => (FrameType::PutAck, i as u64 + 1),
                _ => (FrameType::Send, 0),
            };
            match kind {
                FrameType::Put | FrameType::Get => {
                    let data = if kind == FrameType::Get { 0 } else { size };
                    let rma = RmaRepr {
                        region: i as u32,
                        offset: rng.below(1 << 20),
                        len: if kind == FrameType::Get {
                            u64::from(size)
                        } else {
                            u64::from(data)
                        },
                    };
                    payload.truncate(data as usize);
                    let mut p = rma.to_bytes().to_vec();
                    p.extend_from_slice(&payload);
                    payload = p;
                }
                FrameType::PutAck => payload.clear(),
                _ => {}
            }
            let frame = FrameRepr {
                kind,
                tag: rng.next() as u8,
                error: kind == FrameType::PutAck && rng.below(2) == 0,
                len: payload.len() as u32,
                id,
            };
            bytes.extend_from_slice(&frame.to_bytes());
            bytes.extend_from_slice(&payload);
            events.push(Owned::Header(frame));
            if !payload.is_empty() {
                events.push(Owned::Payload(payload));
            }
            events.push(Owned::End);
        }
        bytes.extend_from_slice(&FrameRepr::fin().to_bytes());
        events.push(Owned::Header(FrameRepr::fin()));
        events.push(Owned::End);
        (bytes, events)
    }

    fn decode(stream: &[u8], cuts: &[usize], buf_len: usize) -> Result<Vec<Owned>, WireError> {
        let mut buf = vec![0u8; buf_len];
        let mut out = Vec::new();
        let mut first_chunk_of_rma = false;
        decode_all(stream, cuts, &mut buf, 1 << 20, true, &mut |e| {
            if first_chunk_of_rma {
                if let Event::Payload(p) = e {
                    assert!(p.len() >= RMA_HEADER_LEN, "split RMA sub-header");
                }
            }
            first_chunk_of_rma = matches!(
                e,
                Event::Header(FrameRepr {
                    kind: FrameType::Put | FrameType::Get,
                    ..
                })
            );
            push(&mut out, e);
        })?;
        Ok(out)
    }

    #[test]
    fn any_split_gives_the_same_events() {
        let (frames, max_size) = if cfg!(miri) { (6, 200) } else { (50, 3000) };
        let (bytes, expected) = stream(0x9e37_79b9_7f4a_7c15, frames, max_size);
        let one_by_one: Vec<usize> = (1..bytes.len()).collect();
        let random = random_cuts(bytes.len(), 12345, 4, 5000, 40);
        for buf_len in [MIN_BUFFER, DEFAULT_BUFFER] {
            for cuts in [&[][..], &one_by_one[..], &random[..]] {
                assert_eq!(
                    decode(&bytes, cuts, buf_len).as_ref(),
                    Ok(&expected),
                    "buffer {buf_len}, {} cuts",
                    cuts.len()
                );
            }
        }
    }

    /// [`decode`] through [`decode_all_with`], a frame's header taken
    /// whole when `rng` says so: counts the frames taken whole.
    fn decode_whole(stream: &[u8], cuts: &[usize], buf_len: usize, seed: u64) -> Vec<Owned> {
        let mut buf = vec![0u8; buf_len];
        let mut rng = Rng(seed);
        let (mut out, mut whole) = (Vec::new(), 0);
        decode_all_with(
            stream,
            cuts,
            &mut buf,
            1 << 20,
            true,
            &mut |h| {
                assert!(!matches!(h.kind, FrameType::Put | FrameType::Get));
                let take = rng.below(4) != 0;
                whole += usize::from(take);
                take
            },
            &mut |e| push(&mut out, e),
        )
        .unwrap();
        assert!(whole > 0, "no frame was taken whole");
        out
    }

    #[test]
    fn whole_frames_mixed_with_events_give_the_same_events() {
        let (frames, max_size) = if cfg!(miri) { (6, 200) } else { (60, 3000) };
        let (bytes, expected) = stream(0x2545_f491_4f6c_dd1d, frames, max_size);
        let random = random_cuts(bytes.len(), 777, 3, 6000, 30);
        for buf_len in [MIN_BUFFER, DEFAULT_BUFFER] {
            for (i, cuts) in [&[][..], &random[..]].into_iter().enumerate() {
                assert_eq!(
                    decode_whole(&bytes, cuts, buf_len, 99 + i as u64),
                    expected,
                    "buffer {buf_len}, {} cuts",
                    cuts.len()
                );
            }
        }
    }

    #[test]
    fn whole_frame_leaves_partial_and_bad_frames_to_events() {
        let mut buf = [0u8; 256];
        let mut d = Decoder::new(&mut buf).unwrap();
        let mut wire = FrameRepr::send(5, 10).to_bytes().to_vec();
        wire.extend_from_slice(&[1; 6]);
        d.spare()[..wire.len()].copy_from_slice(&wire);
        d.filled(wire.len());
        // Four payload bytes missing: nothing taken, nothing consumed.
        assert!(d.next_whole_frame(100, |_| true).is_none());
        assert_eq!(d.buffered(), 22);
        d.spare()[..4].copy_from_slice(&[2; 4]);
        d.filled(4);
        // Refused by `accept`: still nothing consumed.
        assert!(d.next_whole_frame(100, |h| h.tag != 5).is_none());
        let (h, p) = d.next_whole_frame(100, |_| true).unwrap();
        assert_eq!(
            (h, p),
            (FrameRepr::send(5, 10), &[1, 1, 1, 1, 1, 1, 2, 2, 2, 2][..])
        );
        assert_eq!(d.buffered(), 0);
        // A header announcing more than max_frame: left to next_event,
        // which reports it.
        d.spare()[..16].copy_from_slice(&FrameRepr::send(1, 500).to_bytes());
        d.filled(16);
        assert!(d.next_whole_frame(100, |_| true).is_none());
        assert!(matches!(d.next_event(100), Some(Err(_))));
        assert!(d.next_whole_frame(1000, |_| true).is_none(), "poisoned");
    }

    #[test]
    fn many_frames_from_one_read() {
        let mut buf = [0u8; 256];
        let mut d = Decoder::new(&mut buf).unwrap();
        let mut wire = Vec::new();
        for i in 0..10u8 {
            wire.extend_from_slice(&FrameRepr::send(i, 3).to_bytes());
            wire.extend_from_slice(&[i; 3]);
        }
        d.spare()[..wire.len()].copy_from_slice(&wire);
        d.filled(wire.len());
        let mut out = Vec::new();
        while let Some(e) = d.next_event(100) {
            push(&mut out, &e.unwrap());
        }
        assert_eq!(out.len(), 30);
        assert_eq!(out[27], Owned::Header(FrameRepr::send(9, 3)));
        assert_eq!(out[28], Owned::Payload(vec![9; 3]));
        assert!(!d.has_partial());
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn payload_larger_than_the_buffer_streams_through() {
        let mut buf = [0u8; MIN_BUFFER];
        let mut d = Decoder::new(&mut buf).unwrap();
        let payload: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let mut wire = FrameRepr::send(1, 1000).to_bytes().to_vec();
        wire.extend_from_slice(&payload);
        let mut got = Vec::new();
        let mut rest = &wire[..];
        let mut ended = false;
        while !rest.is_empty() {
            let spare = d.spare();
            assert!(spare.len() > RMA_HEADER_LEN);
            let n = spare.len().min(rest.len());
            spare[..n].copy_from_slice(&rest[..n]);
            d.filled(n);
            rest = &rest[n..];
            while let Some(e) = d.next_event(1000) {
                match e.unwrap() {
                    Event::Payload(p) => got.extend_from_slice(p),
                    Event::FrameEnd => ended = true,
                    Event::Header(_) => {}
                    Event::Handshake(_) => unreachable!(),
                }
            }
            assert_eq!(d.has_partial(), !rest.is_empty());
        }
        assert!(ended);
        assert_eq!(got, payload);
    }

    #[test]
    fn oversize_header_refused_at_sixteen_bytes() {
        let mut buf = [0u8; MIN_BUFFER];
        let mut d = Decoder::new(&mut buf).unwrap();
        let mut header = FrameRepr::send(0, 0).to_bytes();
        header[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        for &b in &header[..15] {
            d.spare()[0] = b;
            d.filled(1);
            assert!(d.next_event(DEFAULT_BUFFER as u32).is_none());
            assert!(d.has_partial());
        }
        d.spare()[0] = header[15];
        d.filled(1);
        let err = WireError::FrameTooLarge {
            len: u32::MAX,
            max: DEFAULT_BUFFER as u32,
        };
        assert_eq!(d.next_event(DEFAULT_BUFFER as u32), Some(Err(err)));
        // Poisoned: the same error forever, whatever comes next.
        assert_eq!(d.next_event(u32::MAX), Some(Err(err)));
        d.spare()[..16].copy_from_slice(&FrameRepr::send(0, 0).to_bytes());
        d.filled(16);
        assert_eq!(d.next_event(u32::MAX), Some(Err(err)));
        assert_eq!(d.error(), Some(err));
    }

    #[test]
    fn handshake_then_frames() {
        let mut buf = [0u8; MIN_BUFFER];
        let mut d = Decoder::expecting_handshake(&mut buf).unwrap();
        assert!(d.awaiting_handshake());
        assert!(!d.has_partial());
        let hs = HS.to_bytes();
        d.spare()[..10].copy_from_slice(&hs[..10]);
        d.filled(10);
        assert!(d.next_event(0).is_none());
        assert!(d.has_partial());
        d.spare()[..14].copy_from_slice(&hs[10..]);
        d.filled(14);
        assert_eq!(d.next_event(0), Some(Ok(Event::Handshake(HS))));
        assert!(d.next_event(0).is_none());
        assert!(!d.awaiting_handshake());
        assert!(!d.has_partial());
        // A second handshake is not a frame.
        d.spare()[..24].copy_from_slice(&hs);
        d.filled(24);
        assert_eq!(
            d.next_event(0),
            Some(Err(WireError::BadType { found: b'B' }))
        );
    }

    #[test]
    fn bad_rma_subheader_is_an_error() {
        let frame = FrameRepr {
            kind: FrameType::Put,
            tag: 0,
            error: false,
            len: 30,
            id: 1,
        };
        let rma = RmaRepr {
            region: 0,
            offset: 0,
            len: 5, // carries 6
        };
        let mut wire = frame.to_bytes().to_vec();
        wire.extend_from_slice(&rma.to_bytes());
        wire.extend_from_slice(&[0; 6]);
        let mut buf = [0u8; MIN_BUFFER];
        let r = decode_all(&wire, &[20, 30], &mut buf, 100, false, &mut |_| {});
        assert_eq!(
            r,
            Err(WireError::RmaLengthMismatch {
                announced: 5,
                carried: 6
            })
        );
    }

    #[test]
    fn eof_inside_an_item() {
        let (bytes, _) = stream(7, 3, 100);
        let mut buf = [0u8; MIN_BUFFER];
        for cut in [1, 23, 24 + 5, bytes.len() - 1] {
            assert_eq!(
                decode_all(&bytes[..cut], &[], &mut buf, 1000, true, &mut |_| {}),
                Err(WireError::UnexpectedEof),
                "cut at {cut}"
            );
        }
        assert_eq!(
            decode_all(&bytes[..24], &[], &mut buf, 1000, true, &mut |_| {}),
            Ok(())
        );
        // A frame header whose payload has not started is partial too.
        let wire = FrameRepr::send(0, 4).to_bytes();
        let mut d = Decoder::new(&mut buf).unwrap();
        d.spare()[..16].copy_from_slice(&wire);
        d.filled(16);
        assert!(matches!(d.next_event(10), Some(Ok(Event::Header(_)))));
        assert!(d.next_event(10).is_none());
        assert!(d.has_partial());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut buf = [0u8; MIN_BUFFER];
        assert!(matches!(
            decode_all(
                b"SSH-2.0-OpenSSH_9.6\r\n....",
                &[3],
                &mut buf,
                100,
                true,
                &mut |_| {}
            ),
            Err(WireError::BadMagic { .. })
        ));
        let mut rng = Rng(99);
        for _ in 0..if cfg!(miri) { 20 } else { 2000 } {
            let len = rng.below(200) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            // Make some of them look plausible for a while.
            if len > 40 && rng.below(2) == 0 {
                bytes[..24].copy_from_slice(&HS.to_bytes());
                bytes[24] = 1 + rng.below(6) as u8;
                bytes[26] = 0;
                bytes[27] = 0;
            }
            let cuts: Vec<usize> = (0..rng.below(6)).map(|_| rng.below(200) as usize).collect();
            let mut buf = [0u8; MIN_BUFFER];
            let _ = decode_all(
                &bytes,
                &cuts,
                &mut buf,
                rng.below(300) as u32,
                true,
                &mut |_| {},
            );
            let _ = decode_all(&bytes, &cuts, &mut buf, u32::MAX, false, &mut |_| {});
        }
    }

    #[test]
    fn buffer_minimum() {
        let mut small = [0u8; MIN_BUFFER - 1];
        assert_eq!(
            Decoder::new(&mut small).err(),
            Some(BufferTooSmall {
                len: 63,
                min: MIN_BUFFER
            })
        );
        let mut ok = [0u8; MIN_BUFFER];
        let d = Decoder::expecting_handshake(&mut ok).unwrap();
        assert_eq!(d.capacity(), MIN_BUFFER);
    }
}
