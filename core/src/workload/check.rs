//! Checked message content: what `btl stress` sends, regenerated and
//! compared at the receiver — shared by the Linux tool and bare-metal
//! nodes (which take part in the same stress jobs), so that both produce
//! and check identical bytes.
//!
//! Message `seq` from `src` to `dst` (under a job-wide `seed`) has a
//! length drawn from a mix of sizes up to `max` ([`message_len`]); from
//! [`HEADER`] bytes on it starts with a header — sender (u32), sequence
//! (u64), body length (u32), FNV-1a checksum of the body (u32), all little
//! endian — followed by the body; a shorter message is a prefix of the
//! content stream. [`check`] says how a received message differs.

use core::fmt;

/// Length of a message's header.
pub const HEADER: usize = 20;

/// xorshift64* seeded through splitmix64: small, seeded, good enough to
/// vary sizes and content (and the core's tests' pseudo-random choices).
#[derive(Clone, Copy, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (through splitmix64).
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed, never zero.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self((z ^ (z >> 31)) | 1)
    }

    /// A generator whose xorshift state is `state` as it is (a zero state
    /// becomes 1: xorshift never leaves zero).
    pub fn from_state(state: u64) -> Self {
        Self(if state == 0 { 1 } else { state })
    }

    /// The next pseudo-random value.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn message_rng(seed: u64, src: u32, dst: u32, seq: u64) -> Rng {
    Rng::new(seed ^ (u64::from(src) << 48) ^ (u64::from(dst) << 32) ^ seq.wrapping_mul(0x1000_0001))
}

/// Length of message `seq` from `src` to `dst`: half up to 64 bytes, a
/// third up to 4 KiB, a tenth up to 64 KiB, the rest up to `max`.
pub fn message_len(seed: u64, src: u32, dst: u32, seq: u64, max: usize) -> usize {
    let mut r = message_rng(seed, src, dst, seq);
    let pick = r.next() % 100;
    let cap = match pick {
        0..=49 => 64,
        50..=82 => 4096,
        83..=94 => 65_536,
        _ => max,
    }
    .min(max);
    (r.next() % (cap as u64 + 1)) as usize
}

/// 32-bit FNV-1a.
pub fn fnv1a(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in data {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// Fills `body` with the content stream of (`seed`, `src`, `dst`, `seq`).
pub fn fill(body: &mut [u8], seed: u64, src: u32, dst: u32, seq: u64) {
    let mut r = message_rng(seed ^ 0x5eed, src, dst, seq);
    for chunk in body.chunks_mut(8) {
        let v = r.next().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// Whether `body` is what [`fill`] writes.
pub fn is_filled(body: &[u8], seed: u64, src: u32, dst: u32, seq: u64) -> bool {
    let mut r = message_rng(seed ^ 0x5eed, src, dst, seq);
    body.chunks(8).all(|chunk| {
        let v = r.next().to_le_bytes();
        chunk == &v[..chunk.len()]
    })
}

/// Writes message `seq` from `src` to `dst` into `buf` (cut to its length
/// if shorter); returns the length written.
pub fn build(buf: &mut [u8], seed: u64, src: u32, dst: u32, seq: u64, max: usize) -> usize {
    let len = message_len(seed, src, dst, seq, max).min(buf.len());
    let m = &mut buf[..len];
    if len >= HEADER {
        let (h, body) = m.split_at_mut(HEADER);
        fill(body, seed, src, dst, seq);
        h[0..4].copy_from_slice(&src.to_le_bytes());
        h[4..12].copy_from_slice(&seq.to_le_bytes());
        h[12..16].copy_from_slice(&(body.len() as u32).to_le_bytes());
        h[16..20].copy_from_slice(&fnv1a(body).to_le_bytes());
    } else {
        fill(m, seed, src, dst, seq);
    }
    len
}

/// How a received message differs from the one expected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Mismatch {
    /// Its header carries another sequence number: a message was lost,
    /// duplicated or reordered.
    Sequence {
        /// The sequence in the header.
        got: u64,
    },
    /// Its body fails its checksum.
    Checksum,
    /// Its length or bytes differ.
    Content {
        /// Its length.
        len: usize,
        /// The expected length.
        want: usize,
    },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sequence { got } => {
                write!(f, "got sequence {got} (lost, duplicated or reordered)")
            }
            Self::Checksum => f.write_str("fails its checksum"),
            Self::Content { len, want } => {
                write!(
                    f,
                    "differs from what was sent ({len} bytes, expected {want})"
                )
            }
        }
    }
}

/// Checks `data` as message `seq` from `src` to `dst`.
pub fn check(
    data: &[u8],
    seed: u64,
    src: u32,
    dst: u32,
    seq: u64,
    max: usize,
) -> Result<(), Mismatch> {
    let want = message_len(seed, src, dst, seq, max);
    if data.len() >= HEADER {
        let mut s = [0u8; 8];
        s.copy_from_slice(&data[4..12]);
        let got = u64::from_le_bytes(s);
        if got != seq {
            return Err(Mismatch::Sequence { got });
        }
        let mut c = [0u8; 4];
        c.copy_from_slice(&data[16..20]);
        if fnv1a(&data[HEADER..]) != u32::from_le_bytes(c) {
            return Err(Mismatch::Checksum);
        }
    }
    let same = data.len() == want
        && if want >= HEADER {
            data[0..4] == src.to_le_bytes()
                && data[12..16] == ((want - HEADER) as u32).to_le_bytes()
                && is_filled(&data[HEADER..], seed, src, dst, seq)
        } else {
            is_filled(data, seed, src, dst, seq)
        };
    if same {
        Ok(())
    } else {
        Err(Mismatch::Content {
            len: data.len(),
            want,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_messages_check_and_damage_is_named() {
        // Interpreted by miri, a smaller run (the same paths, shorter bodies).
        const MAX: usize = if cfg!(miri) { 700 } else { 70_000 };
        const ROUNDS: u64 = if cfg!(miri) { 40 } else { 200 };
        let mut buf = [0u8; MAX];
        let mut seen_header = false;
        for seq in 0..ROUNDS {
            let n = build(&mut buf, 7, 1, 2, seq, MAX);
            assert_eq!(n, message_len(7, 1, 2, seq, MAX));
            assert_eq!(check(&buf[..n], 7, 1, 2, seq, MAX), Ok(()));
            if n > HEADER + 1 {
                seen_header = true;
                assert!(matches!(
                    check(&buf[..n], 7, 1, 2, seq + 1, MAX),
                    Err(Mismatch::Sequence { got }) if got == seq
                ));
                buf[HEADER] ^= 1;
                assert_eq!(check(&buf[..n], 7, 1, 2, seq, MAX), Err(Mismatch::Checksum));
            }
        }
        assert!(seen_header);
        let n = build(&mut buf, 7, 1, 2, 3, MAX);
        assert!(check(&buf[..n], 7, 3, 2, 3, MAX).is_err());
    }
}
