//! Hash maps keyed by ids we hand out ourselves (connection ids, request
//! and operation ids: counters, never chosen by a peer), so the table
//! needs no flood-resistant hash: a multiplicative one, a few cycles
//! where SipHash took tens on every message's path (the job API's
//! request table took about 10 % of a small `btl bench` window's
//! instructions, the connection table about 1.5 % of the 8 B ping-pong's
//! profile). A table a peer chooses the keys of keeps std's `HashMap`.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A [`HashMap`] keyed by our own ids (see the module docs).
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing of an id: the odd multiplier spreads the id over the
/// high bits, and `finish` rotates the middle of the product into the
/// low bits (the table's bucket), so ids that share their low bits
/// (multiples of 16, say) still land apart.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IdHasher(u64);

const K: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // The product's well-mixed middle bits become the bucket bits.
        self.0.rotate_left(26)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(K);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (self.0 ^ u64::from(v)).wrapping_mul(K);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(32) ^ v).wrapping_mul(K);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn consecutive_ids_stay_apart() {
        // Distinct low bits (buckets) for runs of consecutive ids and of
        // ids a power of two apart, and a table of them behaves as a map.
        let h = |v: u64| {
            let mut s = IdHasher::default();
            s.write_u64(v);
            s.finish()
        };
        for step in [1u64, 2, 3, 16, 4096, 1 << 20] {
            let buckets: HashSet<u64> = (1..=1024u64).map(|v| h(v * step) & 1023).collect();
            assert!(
                buckets.len() > 600,
                "ids {step} apart: {} distinct buckets of 1024",
                buckets.len()
            );
        }
        let mut m: IdMap<u64, u64> = IdMap::default();
        for v in 0..10_000u64 {
            m.insert(v, v * 3);
        }
        assert!((0..10_000u64).all(|v| m.get(&v) == Some(&(v * 3))));
        assert_eq!(m.remove(&77), Some(231));
        assert_eq!(m.len(), 9_999);
    }
}
