//! The TCP handshake parser, the frame header parser and the RMA
//! sub-header parser against arbitrary bytes.
//!
//! Byte 0 picks the `max_frame` limit, the rest is parsed three ways.
//! Parsing returns a value or a typed error, never panics; whatever parses
//! must satisfy every rule the parser documents (the length limit, the
//! per-type length and id rules, no offset overflow), and emitting it gives
//! back exactly the bytes parsed (so nothing a peer sent is silently
//! ignored).
#![no_main]

use btl_core::tcp::wire::{
    FrameHeader, FrameRepr, FrameType, HandshakePacket, HandshakeRepr, RmaPacket, RmaRepr,
    WireError, FRAME_HEADER_LEN, HANDSHAKE_LEN, MAGIC, RMA_HEADER_LEN, VERSION,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&m, bytes)) = data.split_first() else {
        return;
    };
    let max_frame = match m % 4 {
        0 => 0,
        1 => RMA_HEADER_LEN as u32,
        2 => 1 << 20,
        _ => u32::MAX,
    };

    // Handshake.
    match HandshakePacket::new_checked(bytes) {
        Ok(p) => match HandshakeRepr::parse(&p) {
            Ok(h) => {
                assert_eq!(p.magic(), MAGIC);
                assert_eq!(p.version(), VERSION);
                assert_eq!(h.to_bytes()[..], bytes[..HANDSHAKE_LEN]);
            }
            Err(e) => check_display(&e),
        },
        Err(e) => {
            assert!(bytes.len() < HANDSHAKE_LEN);
            check_display(&e);
        }
    }

    // Frame header.
    match FrameHeader::new_checked(bytes) {
        Ok(h) => match FrameRepr::parse(&h, max_frame) {
            Ok(f) => {
                assert!(f.len <= max_frame);
                let rma = RMA_HEADER_LEN as u32;
                match f.kind {
                    FrameType::Put => assert!(f.len >= rma),
                    FrameType::Get => assert_eq!(f.len, rma),
                    FrameType::PutAck | FrameType::Fin => assert_eq!(f.len, 0),
                    FrameType::Send | FrameType::GetResp => {}
                }
                if matches!(f.kind, FrameType::Send | FrameType::Fin) {
                    assert_eq!(f.id, 0);
                }
                assert_eq!(f.to_bytes()[..], bytes[..FRAME_HEADER_LEN]);
                assert_eq!(
                    FrameRepr::parse(&FrameHeader::new_unchecked(&f.to_bytes()[..]), max_frame),
                    Ok(f)
                );
            }
            Err(e) => check_display(&e),
        },
        Err(e) => {
            assert!(bytes.len() < FRAME_HEADER_LEN);
            check_display(&e);
        }
    }

    // RMA sub-header.
    match RmaPacket::new_checked(bytes) {
        Ok(p) => match RmaRepr::parse(&p) {
            Ok(r) => {
                assert!(r.offset.checked_add(r.len).is_some());
                assert_eq!(r.to_bytes()[..], bytes[..RMA_HEADER_LEN]);
                assert_eq!(p.data(), &bytes[RMA_HEADER_LEN..]);
                // Against an arbitrary PUT frame: a mismatch is an error.
                let frame = FrameRepr {
                    kind: FrameType::Put,
                    tag: 0,
                    error: false,
                    len: (bytes.len() as u32).max(RMA_HEADER_LEN as u32),
                    id: 1,
                };
                let carried = u64::from(frame.len) - RMA_HEADER_LEN as u64;
                assert_eq!(r.check_frame(&frame).is_ok(), r.len == carried);
            }
            Err(e) => check_display(&e),
        },
        Err(e) => {
            assert!(bytes.len() < RMA_HEADER_LEN);
            check_display(&e);
        }
    }
});

/// Every error has a message (and formatting it does not panic).
fn check_display(e: &WireError) {
    assert!(!e.to_string().is_empty());
}
