//! Differential target for the TCP stream decoder: the same bytes fed
//! whole and cut at arbitrary points (taken from the input) through a small
//! read-ahead buffer must give the same events — handshake, headers, the
//! same payload bytes per frame, frame ends — and the same error, and never
//! a panic; and so must the cut stream decoded with whole frames taken in
//! one step (`Decoder::next_whole_frame`, the adapters' small-message fast
//! path) wherever the cut bytes' bits say so. The input: byte 0 picks
//! handshake-or-not and the buffer size, bytes 1..9 the cut positions (and
//! the whole-frame pattern), the rest is the stream.
#![no_main]

use btl_core::tcp::decoder::{decode_all_with, Event, MIN_BUFFER};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, PartialEq)]
enum Owned {
    Handshake(u64, u32),
    Header(u8, u8, bool, u32, u64),
    Payload(Vec<u8>),
    End,
}

/// Decodes `stream`; a whole frame is taken in one step when bit `i % 64`
/// of `pattern` is set, `i` counting the offers.
fn run(
    stream: &[u8],
    cuts: &[usize],
    buf_len: usize,
    hs: bool,
    pattern: u64,
) -> (Vec<Owned>, Result<(), String>) {
    let mut out: Vec<Owned> = Vec::new();
    let mut buf = vec![0u8; buf_len];
    let mut offer = 0u32;
    let r = decode_all_with(
        stream,
        cuts,
        &mut buf,
        1 << 20,
        hs,
        &mut |_| {
            offer = offer.wrapping_add(1);
            pattern >> (offer % 64) & 1 == 1
        },
        &mut |e: &Event<'_>| match e {
            Event::Handshake(h) => out.push(Owned::Handshake(h.job, h.rank)),
            Event::Header(f) => out.push(Owned::Header(f.kind as u8, f.tag, f.error, f.len, f.id)),
            // Chunking of payloads depends on the cuts: merge them.
            Event::Payload(p) => match out.last_mut() {
                Some(Owned::Payload(v)) => v.extend_from_slice(p),
                _ => out.push(Owned::Payload(p.to_vec())),
            },
            Event::FrameEnd => out.push(Owned::End),
        },
    );
    (out, r.map_err(|e| e.to_string()))
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Some((cut_bytes, stream)) = rest.split_first_chunk::<8>() else {
        return;
    };
    let hs = mode & 1 == 1;
    let buf_len = MIN_BUFFER + usize::from(mode >> 1) * 4;
    let mut cuts: Vec<usize> = cut_bytes
        .iter()
        .map(|&c| usize::from(c) * stream.len() / 256)
        .collect();
    cuts.sort_unstable();
    let whole = run(stream, &[], 64 * 1024, hs, 0);
    let pieces = run(stream, &cuts, buf_len, hs, 0);
    assert_eq!(whole, pieces, "cuts {cuts:?}, buffer {buf_len}");
    let pattern = u64::from_le_bytes(*cut_bytes);
    let fast = run(stream, &cuts, buf_len, hs, pattern);
    assert_eq!(whole, fast, "cuts {cuts:?}, buffer {buf_len}, whole frames {pattern:#x}");
});
