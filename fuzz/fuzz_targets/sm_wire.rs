//! The shared-memory transport's message parsers (`btl_core::sm::wire`)
//! against arbitrary bytes.
//!
//! Byte 0 picks the length limit the parsers that take one are given, the
//! rest is parsed as every format. Parsing returns a value or a typed
//! error, never panics; whatever parses satisfies every rule the parser
//! documents (user tags, lengths within the limit, offsets within their
//! length, address ranges that do not wrap, reserved bytes zero, known
//! status codes and get modes, exact message lengths), and emitting it
//! gives back exactly the bytes parsed and parses again to the same value
//! (so nothing a peer wrote is silently ignored).
#![no_main]

use btl_core::sm::wire::{
    ChunkPacket, ChunkRepr, GetDataPacket, GetDataRepr, GetMode, GetReqRepr, LandingAdPacket,
    LandingAdRepr, PutCmaRepr, PutDataRepr, RangeReqPacket, ReplyPacket, ReplyRepr, RndvPacket,
    RndvRepr, RndvSplitPacket, RndvSplitRepr, WireError, CHUNK_HEADER_LEN, GET_DATA_HEADER_LEN,
    GET_REQ_SPLIT_LEN, LANDING_AD_LEN, LANDING_DATA_OFF, MAX_USER_TAG, RANGE_REQ_LEN, REPLY_LEN,
    RNDV_LEN, RNDV_SPLIT_LEN,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&m, bytes)) = data.split_first() else {
        return;
    };
    let max = match m % 4 {
        0 => 0,
        1 => 4096,
        2 => 1 << 30,
        _ => u64::MAX,
    };

    if let Some(r) = parsed(RndvPacket::new_checked(bytes), |p| RndvRepr::parse(p, max)) {
        assert_eq!(bytes.len(), RNDV_LEN);
        rndv_rules(&r, max);
        assert_eq!(r.to_bytes()[..], bytes[..]);
    }

    if let Some(r) = parsed(RndvSplitPacket::new_checked(bytes), |p| {
        RndvSplitRepr::parse(p, max)
    }) {
        assert_eq!(bytes.len(), RNDV_SPLIT_LEN);
        rndv_rules(&r.rndv, max);
        assert!(r.at <= r.rndv.len);
        assert_eq!(r.to_bytes()[..], bytes[..]);
    }

    if let Some(a) = parsed(LandingAdPacket::new_checked(bytes), LandingAdRepr::parse) {
        assert_eq!(bytes.len(), LANDING_AD_LEN);
        assert!(a.data_addr(a.cap).is_some());
        assert_eq!(a.data_addr(0), a.addr.checked_add(LANDING_DATA_OFF as u64));
        assert_eq!(a.to_bytes()[..], bytes[..]);
    }

    if let Some(c) = parsed(ChunkPacket::new_checked(bytes), |p| {
        ChunkRepr::parse(p, max)
    }) {
        assert!(c.tag <= MAX_USER_TAG && c.total <= max && c.offset <= c.total);
        assert_eq!(c.to_bytes()[..], bytes[..CHUNK_HEADER_LEN]);
        let view = ChunkPacket::new_checked(bytes).unwrap();
        assert_eq!(view.data(), &bytes[CHUNK_HEADER_LEN..]);
    }

    // A get request is a whole message: also try the two lengths it may
    // have, so that prefixes of longer inputs reach the field checks.
    for n in [bytes.len(), RANGE_REQ_LEN, GET_REQ_SPLIT_LEN] {
        let b = &bytes[..n.min(bytes.len())];
        if let Some(g) = parsed(RangeReqPacket::new_checked(b), GetReqRepr::parse) {
            assert_eq!(b.len(), g.buffer_len());
            if let GetMode::Split(t) = g.mode {
                assert!(t.at <= g.len);
                assert!(t.dst.checked_add(g.len - t.at).is_some());
            }
            let mut out = [0u8; GET_REQ_SPLIT_LEN];
            let out = &mut out[..g.buffer_len()];
            g.emit(&mut RangeReqPacket::new_unchecked(&mut *out));
            assert_eq!(&out[..], b);
            let again = GetReqRepr::parse(&RangeReqPacket::new_unchecked(&out[..]));
            assert_eq!(again, Ok(g));
        }
    }

    if let Some(p) = parsed(RangeReqPacket::new_checked(bytes), PutCmaRepr::parse) {
        assert_eq!(bytes.len(), RANGE_REQ_LEN);
        assert!(p.src.checked_add(p.len).is_some());
        assert_eq!(p.to_bytes()[..], bytes[..]);
    }

    if let Some(d) = parsed(RangeReqPacket::new_checked(bytes), PutDataRepr::parse) {
        assert_eq!(d.to_bytes()[..], bytes[..RANGE_REQ_LEN]);
    }

    if let Some(r) = parsed(ReplyPacket::new_checked(bytes), ReplyRepr::parse) {
        assert_eq!(bytes.len(), REPLY_LEN);
        assert_eq!(r.to_bytes()[..], bytes[..]);
    }

    if let Some(g) = parsed(GetDataPacket::new_checked(bytes), GetDataRepr::parse) {
        assert_eq!(g.to_bytes()[..], bytes[..GET_DATA_HEADER_LEN]);
    }
});

/// What a parsed rendezvous guarantees.
fn rndv_rules(r: &RndvRepr, max: u64) {
    assert!(r.tag <= MAX_USER_TAG && r.len <= max);
    assert!(r.addr.checked_add(r.len).is_some());
}

/// Parses a view's bytes with `parse`: the value, or `None` after checking
/// that the error says something. A view refused outright means the bytes
/// were short.
fn parsed<P, R: PartialEq + core::fmt::Debug>(
    view: Result<P, WireError>,
    parse: impl Fn(&P) -> Result<R, WireError>,
) -> Option<R> {
    let view = match view {
        Ok(v) => v,
        Err(e) => {
            assert!(matches!(e, WireError::Truncated { .. }), "{e:?}");
            check_display(&e);
            return None;
        }
    };
    match parse(&view) {
        Ok(r) => {
            // Parsing is a function of the bytes.
            assert_eq!(parse(&view).as_ref(), Ok(&r));
            Some(r)
        }
        Err(e) => {
            check_display(&e);
            None
        }
    }
}

/// Every error has a message (and formatting it does not panic).
fn check_display(e: &WireError) {
    assert!(!e.to_string().is_empty());
}
