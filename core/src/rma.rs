//! One-sided operations' shared types, used by every adapter: the key that
//! names a registered region ([`RegionKey`]) and the target's verdict on a
//! get or put ([`RmaStatus`]).
//!
//! A key is what a peer needs to address a region and travels in ordinary
//! messages ([`RegionKey::to_bytes`]); whatever comes back from a peer is
//! validated by the owner of the region (unknown id or a range outside the
//! region is refused with a status), so a peer never reads or writes where
//! it was not invited.

use core::fmt;

/// What a peer needs to address a registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RegionKey {
    /// Rank owning the region.
    pub rank: u32,
    /// Its id at the owner.
    pub id: u32,
    /// Its length in bytes.
    pub len: u64,
}

impl RegionKey {
    /// Encoded length.
    pub const LEN: usize = 16;

    /// 16 bytes (little endian) to send to peers.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0; Self::LEN];
        b[0..4].copy_from_slice(&self.rank.to_le_bytes());
        b[4..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes [`Self::to_bytes`]; `None` if the length is wrong.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        let b: &[u8; Self::LEN] = b.try_into().ok()?;
        let mut r = [0u8; 4];
        let mut i = [0u8; 4];
        let mut l = [0u8; 8];
        r.copy_from_slice(&b[0..4]);
        i.copy_from_slice(&b[4..8]);
        l.copy_from_slice(&b[8..16]);
        Some(Self {
            rank: u32::from_le_bytes(r),
            id: u32::from_le_bytes(i),
            len: u64::from_le_bytes(l),
        })
    }
}

/// Outcome of a get or put at the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RmaStatus {
    /// Done.
    Ok,
    /// The target has no region with that id.
    UnknownRegion,
    /// The range is not inside the region.
    OutOfBounds,
    /// The target could not copy (single copy failed, malformed request).
    CopyFailed,
}

impl RmaStatus {
    /// The status's code on the wire (0 = done).
    pub fn code(self) -> u32 {
        match self {
            Self::Ok => 0,
            Self::UnknownRegion => 1,
            Self::OutOfBounds => 2,
            Self::CopyFailed => 3,
        }
    }

    /// Decodes [`Self::code`]; an unknown code is a failed copy.
    pub fn from_code(c: u32) -> Self {
        match c {
            0 => Self::Ok,
            1 => Self::UnknownRegion,
            2 => Self::OutOfBounds,
            _ => Self::CopyFailed,
        }
    }
}

impl fmt::Display for RmaStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ok => "done",
            Self::UnknownRegion => "no such region at the target",
            Self::OutOfBounds => "range outside the target's region",
            Self::CopyFailed => "the target could not copy the data",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_roundtrip_and_status_codes() {
        let k = RegionKey {
            rank: 7,
            id: 3,
            len: 1 << 40,
        };
        assert_eq!(RegionKey::from_bytes(&k.to_bytes()), Some(k));
        assert_eq!(RegionKey::from_bytes(&k.to_bytes()[..15]), None);
        for s in [
            RmaStatus::Ok,
            RmaStatus::UnknownRegion,
            RmaStatus::OutOfBounds,
            RmaStatus::CopyFailed,
        ] {
            assert_eq!(RmaStatus::from_code(s.code()), s);
        }
        assert_eq!(RmaStatus::from_code(99), RmaStatus::CopyFailed);
    }
}
