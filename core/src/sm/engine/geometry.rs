//! Where our part's fragments sit ([`PartGeometry`]), for the offset →
//! descriptor lookup on the path of every ACK.

/// Geometry of our own part, for the offset → descriptor lookup.
#[derive(Clone, Copy, Debug)]
pub(super) struct PartGeometry {
    pub(super) eager_start: u64,
    pub(super) eager_bytes: u64,
    pub(super) eager_count: u32,
    pub(super) max_start: u64,
    pub(super) max_bytes: u64,
    pub(super) max_count: u32,
}

impl PartGeometry {
    /// The descriptor index of the fragment at `offset`, if `offset` is the
    /// start of one of our fragments. On the path of every ACK, so one
    /// 32-bit division (parts are far below 4 GiB) and a multiply to check,
    /// rather than two 64-bit divisions.
    pub(super) fn index_of(&self, offset: u64) -> Option<u32> {
        let lookup = |start: u64, bytes: u64, count: u32| -> Option<u32> {
            let rel = offset.checked_sub(start)?;
            if bytes == 0 || rel >= bytes.saturating_mul(u64::from(count)) {
                return None;
            }
            let i = match (u32::try_from(rel), u32::try_from(bytes)) {
                (Ok(rel), Ok(bytes)) => rel / bytes,
                _ => u32::try_from(rel / bytes).ok()?,
            };
            (u64::from(i) * bytes == rel).then_some(i)
        };
        lookup(self.eager_start, self.eager_bytes, self.eager_count).or_else(|| {
            lookup(self.max_start, self.max_bytes, self.max_count).map(|i| i + self.eager_count)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::PartGeometry;

    #[test]
    fn fragment_index_lookup_accepts_only_fragment_starts() {
        let g = PartGeometry {
            eager_start: 1024,
            eager_bytes: 256,
            eager_count: 4,
            max_start: 2048,
            max_bytes: 1024,
            max_count: 2,
        };
        assert_eq!(g.index_of(1024), Some(0));
        assert_eq!(g.index_of(1024 + 3 * 256), Some(3));
        assert_eq!(g.index_of(2048), Some(4));
        assert_eq!(g.index_of(3072), Some(5));
        for bad in [0, 1023, 1025, 1024 + 255, 4096, 2048 + 8, u64::MAX, 1 << 40] {
            assert_eq!(g.index_of(bad), None, "{bad}");
        }
    }
}
