//! The job's barrier: who tells whom, in which round, and the bytes of the
//! barrier message. Both transports of btl-linux and the bare-metal node
//! run it from here, so a job mixing them agrees on every round.
//!
//! Participants are numbered `0..n` (an adapter maps them to its ranks).
//! Up to [`DIRECT_MAX`] participants every one tells every other in one
//! round ([`Schedule::Direct`]); above, the dissemination barrier (Hensgen,
//! Finkel and Manber): in round `k` participant `i` tells `i + 2^k` and
//! waits for `i - 2^k` (mod `n`), `ceil(log2 n)` rounds of one message each,
//! so a barrier of `n` ranks costs each of them `log2 n` messages and
//! connections instead of `n - 1`. Since `2^k mod n` differs for every
//! round, the sender of a message tells its round: the message carries the
//! epoch only.
//!
//! A participant that fails before its message of a round reached its
//! partner stops that partner's barrier, and only that one: in the
//! dissemination schedule the partner then tells every other participant
//! with an abandonment ([`BarrierRepr::Abandoned`], naming the failed
//! participant's rank), so no one waits for a round that cannot come.

/// Largest number of participants that use the direct (all-to-all)
/// schedule: one round of `n - 1` messages beats two or more rounds of one
/// when `n - 1` is that small, and failures stay simple (each rank sees
/// every other's arrival itself).
pub const DIRECT_MAX: u32 = 4;

/// Who tells whom in each round of a barrier of `n` participants, seen by
/// participant `me`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Everyone tells everyone, in one round (`n <=` [`DIRECT_MAX`]).
    Direct {
        /// Number of participants.
        n: u32,
        /// Our index.
        me: u32,
    },
    /// The dissemination barrier (`n >` [`DIRECT_MAX`]).
    Dissemination {
        /// Number of participants.
        n: u32,
        /// Our index.
        me: u32,
    },
}

impl Schedule {
    /// The schedule of participant `me` of `n`; `None` unless `me < n`.
    pub const fn new(n: u32, me: u32) -> Option<Self> {
        if me >= n {
            None
        } else if n <= DIRECT_MAX {
            Some(Self::Direct { n, me })
        } else {
            Some(Self::Dissemination { n, me })
        }
    }

    /// Number of participants.
    pub const fn size(self) -> u32 {
        match self {
            Self::Direct { n, .. } | Self::Dissemination { n, .. } => n,
        }
    }

    /// Number of rounds: 0 alone, 1 direct, `ceil(log2 n)` by dissemination.
    pub const fn rounds(self) -> u32 {
        match self {
            Self::Direct { n, .. } => (n > 1) as u32,
            Self::Dissemination { n, .. } => u32::BITS - (n - 1).leading_zeros(),
        }
    }

    /// Participants we tell in round `round` (none past the last round).
    pub fn sends(self, round: u32) -> Partners {
        self.partners(round, true)
    }

    /// Participants whose message we wait for in round `round`.
    pub fn expects(self, round: u32) -> Partners {
        self.partners(round, false)
    }

    /// The round a barrier message from participant `from` belongs to;
    /// `None` when `from` never sends us one (out of range, or us).
    pub fn round_of(self, from: u32) -> Option<u32> {
        match self {
            Self::Direct { n, me } => (from < n && from != me).then_some(0),
            Self::Dissemination { n, me } => {
                if from >= n || from == me {
                    return None;
                }
                // `from = me - 2^k (mod n)`, so `me - from (mod n)` is `2^k`.
                let d = (me + n - from) % n;
                d.is_power_of_two().then(|| d.trailing_zeros())
            }
        }
    }

    /// Whether `other` takes part in any round with us, either way: the
    /// peers a barrier connects us to.
    pub fn talks_to(self, other: u32) -> bool {
        (0..self.rounds())
            .any(|r| self.sends(r).any(|p| p == other) || self.expects(r).any(|p| p == other))
    }

    fn partners(self, round: u32, send: bool) -> Partners {
        if round >= self.rounds() {
            return Partners::none();
        }
        match self {
            Self::Direct { n, me } => Partners {
                next: 0,
                end: n,
                skip: me,
            },
            Self::Dissemination { n, me } => {
                let step = (1u64 << round) % u64::from(n);
                let step = step as u32;
                let p = if send {
                    ((u64::from(me) + u64::from(step)) % u64::from(n)) as u32
                } else {
                    ((u64::from(me) + u64::from(n) - u64::from(step)) % u64::from(n)) as u32
                };
                Partners {
                    next: p,
                    end: p + 1,
                    skip: u32::MAX,
                }
            }
        }
    }
}

/// The participants of one round (an iterator of indexes).
#[derive(Clone, Debug)]
pub struct Partners {
    next: u32,
    end: u32,
    skip: u32,
}

impl Partners {
    const fn none() -> Self {
        Self {
            next: 0,
            end: 0,
            skip: u32::MAX,
        }
    }
}

impl Iterator for Partners {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        while self.next < self.end {
            let p = self.next;
            self.next += 1;
            if p != self.skip {
                return Some(p);
            }
        }
        None
    }
}

/// Length of an arrival.
pub const ARRIVED_LEN: usize = 8;
/// Length of an abandonment.
pub const ABANDONED_LEN: usize = 16;

/// A barrier message is not one of the two forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum BarrierError {
    /// Neither [`ARRIVED_LEN`] nor [`ABANDONED_LEN`] bytes.
    #[error("barrier message of {0} bytes (want {ARRIVED_LEN} or {ABANDONED_LEN})")]
    Length(usize),
    /// Epoch 0 (epochs count from 1).
    #[error("barrier message for epoch 0")]
    ZeroEpoch,
    /// An abandonment whose failed rank does not fit 32 bits.
    #[error("barrier abandoned for rank {0}, beyond 32 bits")]
    Rank(u64),
}

/// Checked view of a barrier message (the payload of the
/// [`crate::tags::BARRIER`] tag on either transport): 8 bytes, the epoch
/// (u64 little endian, counted from 1 by every rank); or 16, the epoch and
/// the rank (u64 little endian, below 2^32) whose failure abandoned it.
#[derive(Clone, Copy, Debug)]
pub struct BarrierPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> BarrierPacket<T> {
    /// Wraps `buf` without checks.
    pub const fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }

    /// Wraps `buf`, checking its length and fields.
    pub fn new_checked(buf: T) -> Result<Self, BarrierError> {
        let p = Self { buf };
        p.check()?;
        Ok(p)
    }

    fn check(&self) -> Result<(), BarrierError> {
        let b = self.buf.as_ref();
        if b.len() != ARRIVED_LEN && b.len() != ABANDONED_LEN {
            return Err(BarrierError::Length(b.len()));
        }
        if self.epoch() == 0 {
            return Err(BarrierError::ZeroEpoch);
        }
        match self.failed_raw() {
            Some(r) if r > u64::from(u32::MAX) => Err(BarrierError::Rank(r)),
            _ => Ok(()),
        }
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        u64_at(self.buf.as_ref(), 0)
    }

    fn failed_raw(&self) -> Option<u64> {
        let b = self.buf.as_ref();
        (b.len() == ABANDONED_LEN).then(|| u64_at(b, 8))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> BarrierPacket<T> {
    fn set_u64(&mut self, at: usize, v: u64) {
        self.buf.as_mut()[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// A barrier message, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarrierRepr {
    /// The sender arrived at barrier `epoch` (in the round its position
    /// tells, see [`Schedule::round_of`]).
    Arrived {
        /// The barrier's epoch.
        epoch: u64,
    },
    /// The sender gave barrier `epoch` up: rank `failed` failed before its
    /// message reached it.
    Abandoned {
        /// The barrier's epoch.
        epoch: u64,
        /// The rank that failed.
        failed: u32,
    },
}

impl BarrierRepr {
    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &BarrierPacket<T>) -> Result<Self, BarrierError> {
        p.check()?;
        let epoch = p.epoch();
        Ok(match p.failed_raw() {
            None => Self::Arrived { epoch },
            Some(r) => Self::Abandoned {
                epoch,
                failed: r as u32,
            },
        })
    }

    /// Parses `bytes` (view and parse in one).
    pub fn parse_bytes(bytes: &[u8]) -> Result<Self, BarrierError> {
        Self::parse(&BarrierPacket::new_checked(bytes)?)
    }

    /// The epoch.
    pub const fn epoch(&self) -> u64 {
        match *self {
            Self::Arrived { epoch } | Self::Abandoned { epoch, .. } => epoch,
        }
    }

    /// Bytes of the message.
    pub const fn buffer_len(&self) -> usize {
        match self {
            Self::Arrived { .. } => ARRIVED_LEN,
            Self::Abandoned { .. } => ABANDONED_LEN,
        }
    }

    /// Writes the message into `p` (exactly [`Self::buffer_len`] bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut BarrierPacket<T>) {
        p.set_u64(0, self.epoch());
        if let Self::Abandoned { failed, .. } = *self {
            p.set_u64(8, u64::from(failed));
        }
    }

    /// The message as bytes (the first [`Self::buffer_len`] of them).
    pub fn to_bytes(&self) -> [u8; ABANDONED_LEN] {
        let mut b = [0u8; ABANDONED_LEN];
        self.emit(&mut BarrierPacket::new_unchecked(
            &mut b[..self.buffer_len()],
        ));
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a whole barrier of `n` in lockstep: every message sent in a
    /// round is one the receiver expects in that round, and at the end
    /// everyone has heard (transitively) from everyone.
    fn check_complete(n: u32) {
        let s: [Option<Schedule>; 64] = core::array::from_fn(|i| Schedule::new(n, i as u32));
        let rounds = s[0].unwrap().rounds();
        // knows[i] bit j: i has heard, directly or not, that j arrived.
        let mut knows = [0u64; 64];
        for (i, k) in knows.iter_mut().enumerate().take(n as usize) {
            *k = 1 << i;
        }
        for r in 0..rounds {
            let before = knows;
            for i in 0..n {
                let si = s[i as usize].unwrap();
                assert_eq!(si.rounds(), rounds);
                for to in si.sends(r) {
                    let st = s[to as usize].unwrap();
                    assert!(
                        st.expects(r).any(|f| f == i),
                        "n {n} round {r}: {i} -> {to}"
                    );
                    assert_eq!(st.round_of(i), Some(r));
                    knows[to as usize] |= before[i as usize];
                }
                // What we expect is what is sent to us.
                for from in si.expects(r) {
                    assert!(s[from as usize].unwrap().sends(r).any(|t| t == i));
                }
            }
        }
        let all = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        for (i, k) in knows.iter().enumerate().take(n as usize) {
            assert_eq!(*k, all, "n {n}: {i} misses someone");
        }
    }

    #[test]
    fn every_size_completes() {
        for n in 1..=64 {
            check_complete(n);
        }
    }

    /// The only partner of a dissemination round.
    fn one(mut p: Partners) -> Option<u32> {
        let first = p.next();
        assert_eq!(p.next(), None);
        first
    }

    #[test]
    fn rounds_and_messages() {
        assert_eq!(Schedule::new(1, 0).unwrap().rounds(), 0);
        assert_eq!(Schedule::new(4, 0).unwrap().rounds(), 1);
        assert_eq!(Schedule::new(4, 2).unwrap().sends(0).count(), 3);
        assert_eq!(Schedule::new(5, 0).unwrap().rounds(), 3);
        assert_eq!(Schedule::new(8, 0).unwrap().rounds(), 3);
        assert_eq!(Schedule::new(9, 0).unwrap().rounds(), 4);
        assert_eq!(Schedule::new(256, 7).unwrap().rounds(), 8);
        let s = Schedule::new(10, 3).unwrap();
        assert_eq!(one(s.sends(0)), Some(4));
        assert_eq!(one(s.sends(3)), Some(1));
        assert_eq!(one(s.expects(2)), Some(9));
        assert_eq!(s.sends(4).count(), 0);
        assert_eq!(s.round_of(3), None);
        assert_eq!(s.round_of(10), None);
        assert_eq!(s.round_of(0), None, "3 - 0 = 3 is no power of two");
        assert!(s.talks_to(4) && s.talks_to(2) && !s.talks_to(8));
        assert_eq!(Schedule::new(3, 3), None);
        let big = Schedule::new(u32::MAX, u32::MAX - 1).unwrap();
        assert_eq!(big.rounds(), 32);
        assert_eq!(big.sends(31).count(), 1);
    }

    #[test]
    fn messages_round_trip() {
        for m in [
            BarrierRepr::Arrived { epoch: 1 },
            BarrierRepr::Arrived { epoch: u64::MAX },
            BarrierRepr::Abandoned {
                epoch: 7,
                failed: u32::MAX,
            },
        ] {
            let b = m.to_bytes();
            assert_eq!(BarrierRepr::parse_bytes(&b[..m.buffer_len()]), Ok(m));
        }
        // The arrival is the 8-byte epoch it always was.
        assert_eq!(
            BarrierRepr::parse_bytes(&5u64.to_le_bytes()),
            Ok(BarrierRepr::Arrived { epoch: 5 })
        );
    }

    #[test]
    fn bad_messages_are_refused() {
        for len in (0..8).chain(9..16).chain(17..24) {
            assert_eq!(
                BarrierRepr::parse_bytes(&[1u8; 24][..len]),
                Err(BarrierError::Length(len))
            );
        }
        assert_eq!(
            BarrierRepr::parse_bytes(&[0u8; 8]),
            Err(BarrierError::ZeroEpoch)
        );
        let mut b = [0u8; 16];
        b[0] = 1;
        b[12] = 1;
        assert_eq!(
            BarrierRepr::parse_bytes(&b),
            Err(BarrierError::Rank(1 << 32))
        );
    }
}
