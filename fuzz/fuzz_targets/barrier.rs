//! The barrier message parser and the barrier schedule against arbitrary
//! input.
//!
//! The message: parsing returns a value or a typed error, never panics;
//! what parses emits back exactly the bytes parsed (nothing a peer sent is
//! ignored), and every error matches the rule it names. The schedule: the
//! first 8 bytes pick a job size and a rank; every partner a rank sends to
//! in a round expects that rank in that round, and `round_of` agrees.
#![no_main]

use btl_core::barrier::{
    BarrierError, BarrierPacket, BarrierRepr, Schedule, ABANDONED_LEN, ARRIVED_LEN,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match BarrierPacket::new_checked(data) {
        Ok(p) => {
            let m = BarrierRepr::parse(&p).unwrap();
            assert_eq!(m.buffer_len(), data.len());
            assert_eq!(m.to_bytes()[..data.len()], data[..]);
            assert_eq!(BarrierRepr::parse_bytes(data), Ok(m));
            assert_ne!(m.epoch(), 0);
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            assert_eq!(BarrierRepr::parse_bytes(data), Err(e));
            match e {
                BarrierError::Length(n) => {
                    assert_eq!(n, data.len());
                    assert!(n != ARRIVED_LEN && n != ABANDONED_LEN);
                }
                BarrierError::ZeroEpoch => assert!(data[..8].iter().all(|&b| b == 0)),
                BarrierError::Rank(r) => {
                    assert_eq!(data.len(), ABANDONED_LEN);
                    assert!(r > u64::from(u32::MAX));
                }
            }
        }
    }

    // The schedule of a job of up to 2^16 ranks, seen from one of them
    // and from each partner it names.
    if data.len() < 4 {
        return;
    }
    let n = u32::from(u16::from_le_bytes([data[0], data[1]]));
    let me = u32::from(u16::from_le_bytes([data[2], data[3]]));
    let Some(s) = Schedule::new(n, me) else {
        assert!(n == 0 || me >= n);
        return;
    };
    assert_eq!(s.size(), n);
    assert!(!s.talks_to(me));
    for r in 0..s.rounds() {
        for to in s.sends(r) {
            assert!(to < n && to != me);
            assert!(s.talks_to(to));
            let peer = Schedule::new(n, to).unwrap();
            assert_eq!(peer.rounds(), s.rounds());
            assert!(peer.expects(r).any(|f| f == me), "n {n} r {r}: {me} -> {to}");
            assert_eq!(peer.round_of(me), Some(r));
        }
        for from in s.expects(r) {
            assert!(from < n && from != me);
            assert_eq!(s.round_of(from), Some(r));
            assert!(Schedule::new(n, from).unwrap().sends(r).any(|t| t == me));
        }
    }
});
