//! The choice of how a large message travels ([`Bulk`]): single copy or
//! the pipelined copy, by rates measured while running ([`BulkRates`];
//! the pipelined copy is timed by bursts, [`Probe`]).

use std::time::{Duration, Instant};

/// How a large message travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Bulk {
    /// `process_vm_readv` by the receiver.
    SingleCopy,
    /// Through shared fragments.
    Pipelined,
    /// Through shared fragments, timed alone to refresh its measurement.
    ProbePipelined,
}

/// Size classes of bulk rates per peer (see [`super::Sm::rate_class`]).
pub(super) const RATE_CLASSES: usize = 5;

/// How long a bulk-rate measurement stays fresh.
pub(super) const BULK_REFRESH: Duration = Duration::from_secs(1);

/// Measured bulk rates to one peer, for the choice between single copy and
/// the pipelined copy. Which is faster depends on where the two processes
/// run (shared cache or not) and that changes under a hypervisor or a
/// migrating scheduler: so it is measured while running. Single-copy
/// transfers are synchronous and timed as they go; the pipelined copy is
/// timed by bursts from an empty pipeline ([`Probe`]) once per
/// [`BULK_REFRESH`]. The slower mechanism is retried once per refresh
/// period, so a change of placement is followed within about a second.
///
/// Each mechanism is rated by its best sample of the last refresh period
/// (its newest sample if it has none that recent), not by an average:
/// noise only ever makes a transfer slower (a preempted vCPU, a page
/// fault, the receiver busy with something else), and an average of noisy
/// samples picks the wrong mechanism (the pipelined copy at 2.5 GB/s over
/// single copy at 24).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct BulkRates {
    pub(super) single: Samples,
    pub(super) pipelined: Samples,
}

/// One mechanism's recent samples (see [`BulkRates`]).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Samples {
    /// The newest [`SAMPLES`] rates (bytes per second) and when they were
    /// taken, as a ring; `None` where not filled yet.
    recent: [Option<(f64, Instant)>; SAMPLES],
    /// Samples taken, the warm-up included: single copy's first (page
    /// faults of fresh buffers) and the pipelined copy's first
    /// 1 + [`PIPELINED_WARM_UP`] are not kept.
    n: u32,
}

/// Pipelined samples dropped after the first, as a warm-up: the first
/// pipelined messages to a peer run faster than the steady state (4 MiB
/// in 0.5–0.7 ms, then 0.9–1.4) and would choose the pipelined copy where
/// single copy is faster.
const PIPELINED_WARM_UP: u32 = 4;

/// Samples kept per mechanism.
const SAMPLES: usize = 8;

impl Samples {
    fn push(&mut self, rate: f64, at: Instant, warm_up: u32) {
        self.n = self.n.saturating_add(1);
        if self.n > warm_up {
            self.recent[self.n as usize % SAMPLES] = Some((rate, at));
        }
    }

    /// When the newest sample was taken.
    fn newest(&self) -> Option<Instant> {
        self.recent.iter().flatten().map(|&(_, t)| t).max()
    }

    /// The best rate of the last [`BULK_REFRESH`] before `now`, else the
    /// newest one.
    fn rate(&self, now: Instant) -> f64 {
        let fresh = |t: Instant| now.saturating_duration_since(t) <= BULK_REFRESH;
        let best = self
            .recent
            .iter()
            .flatten()
            .filter(|(_, t)| fresh(*t))
            .map(|&(r, _)| r)
            .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
        best.or_else(|| {
            self.recent
                .iter()
                .flatten()
                .max_by_key(|(_, t)| *t)
                .map(|&(r, _)| r)
        })
        .unwrap_or(0.0)
    }
}

impl BulkRates {
    pub(super) fn choose(&self, now: Instant) -> Bulk {
        let stale = |s: &Samples| {
            s.newest()
                .is_none_or(|t| now.saturating_duration_since(t) > BULK_REFRESH)
        };
        // A warm-up and two counted samples of each before choosing: one
        // sample decides nothing (a size class's first transfers fault in
        // fresh pages: 1.6 GB/s where the next ones reach 20).
        if self.single.n < 3 {
            Bulk::SingleCopy
        } else if self.pipelined.n < PIPELINED_WARM_UP + 3 {
            Bulk::ProbePipelined
        } else if stale(&self.single) {
            Bulk::SingleCopy
        } else if stale(&self.pipelined) {
            Bulk::ProbePipelined
        } else if self.pipelined.rate(now) > self.single.rate(now) {
            Bulk::Pipelined
        } else {
            Bulk::SingleCopy
        }
    }

    pub(super) fn record(&mut self, how: Bulk, bytes: usize, took: Duration) {
        self.record_at(how, bytes, took, Instant::now());
    }

    fn record_at(&mut self, how: Bulk, bytes: usize, took: Duration, now: Instant) {
        let rate = bytes as f64 / took.as_secs_f64().max(1e-9);
        match how {
            Bulk::SingleCopy => self.single.push(rate, now, 1),
            Bulk::Pipelined | Bulk::ProbePipelined => {
                self.pipelined.push(rate, now, 1 + PIPELINED_WARM_UP)
            }
        }
        log::debug!(
            "bulk rates: single copy {:.2} GB/s, pipelined {:.2} GB/s (after {how:?} of {bytes} bytes in {took:?})",
            self.single.rate(now) / 1e9,
            self.pipelined.rate(now) / 1e9
        );
    }
}

/// The pipelined copy's measurement (see [`BulkRates`]): a burst of up to
/// [`probe_burst`] consecutive messages to one peer, timed from an empty
/// pipeline (nothing of ours in flight to that peer) to the drain after its
/// last message. One message alone when nothing follows it (a ping-pong);
/// in a stream the burst's bytes over its time, so filling and draining
/// the pipeline is spread over several messages, as it is in the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Probe {
    /// Not measured.
    No,
    /// The burst's first message: waiting for our fragments to this peer
    /// to drain before starting.
    Drain,
    /// The burst's message number `n` (from 1), queued behind the others.
    Next(u32),
    /// At the head of the queue: the burst started at `t0`, its messages
    /// before this one carried `bytes`; this is its message number `n`.
    Since { t0: Instant, bytes: usize, n: u32 },
}

impl Probe {
    /// This message's number in its burst, if it is in one.
    pub(super) fn index(self) -> Option<u32> {
        match self {
            Probe::No => None,
            Probe::Drain => Some(0),
            Probe::Next(n) | Probe::Since { n, .. } => Some(n),
        }
    }
}

/// How many messages of `len` bytes a pipelined measurement takes: up to 8,
/// and about 16 MiB (at least one message).
pub(super) fn probe_burst(len: usize) -> u32 {
    (16usize << 20).div_ceil(len.max(1)).clamp(1, 8) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_choice_follows_measurements() {
        let mut r = BulkRates::default();
        let t = Instant::now();
        let at = |ms: u64| t + Duration::from_millis(ms);
        // A 1 MiB transfer by `how` that took `us` microseconds, at `when`.
        let mib = |r: &mut BulkRates, how: Bulk, us: u64, when: Instant| {
            r.record_at(how, 1 << 20, Duration::from_micros(us), when)
        };
        assert_eq!(r.choose(t), Bulk::SingleCopy);
        // First samples are warm-ups: slow (page faults), not counted.
        mib(&mut r, Bulk::SingleCopy, 5000, at(1));
        assert_eq!(r.choose(at(1)), Bulk::SingleCopy);
        mib(&mut r, Bulk::SingleCopy, 900, at(2));
        assert_eq!(r.choose(at(2)), Bulk::SingleCopy);
        mib(&mut r, Bulk::SingleCopy, 100, at(2));
        assert_eq!(r.choose(at(2)), Bulk::ProbePipelined);
        // The pipelined copy's warm-up is longer (its first messages are
        // faster than the following ones).
        for _ in 0..1 + PIPELINED_WARM_UP {
            assert_eq!(r.choose(at(3)), Bulk::ProbePipelined);
            mib(&mut r, Bulk::ProbePipelined, 20, at(3));
        }
        assert_eq!(r.choose(at(3)), Bulk::ProbePipelined);
        mib(&mut r, Bulk::ProbePipelined, 150, at(3));
        assert_eq!(r.choose(at(3)), Bulk::ProbePipelined);
        // The best sample counts: single copy's 100 us, not its 900.
        assert!((r.single.rate(at(3)) - (1 << 20) as f64 / 100e-6).abs() < 1.0);
        mib(&mut r, Bulk::ProbePipelined, 50, at(4));
        assert_eq!(r.choose(at(4)), Bulk::Pipelined);
        // A slow sample (noise) does not outweigh the best recent one.
        mib(&mut r, Bulk::Pipelined, 900, at(5));
        assert_eq!(r.choose(at(5)), Bulk::Pipelined);
        // The placement changes: a second later the pipelined copy is
        // slow, and only its new samples count.
        let s = 1000 + BULK_REFRESH.as_millis() as u64;
        for i in 0..3 {
            mib(&mut r, Bulk::Pipelined, 400, at(s + i));
        }
        // Single copy's sample is stale: measured again first.
        assert_eq!(r.choose(at(s + 3)), Bulk::SingleCopy);
        mib(&mut r, Bulk::SingleCopy, 110, at(s + 4));
        assert_eq!(r.choose(at(s + 4)), Bulk::SingleCopy);
        // Then the pipelined copy, once its samples are stale.
        let later = at(s + 5) + 2 * BULK_REFRESH;
        mib(&mut r, Bulk::SingleCopy, 110, later);
        assert_eq!(r.choose(later), Bulk::ProbePipelined);
        // The ring keeps the newest SAMPLES: many slow ones push out a
        // fast one even inside the period.
        let mut q = BulkRates::default();
        for i in 0..3 {
            mib(&mut q, Bulk::SingleCopy, 10, at(i));
        }
        for i in 0..SAMPLES as u64 {
            mib(&mut q, Bulk::SingleCopy, 1000, at(10 + i));
        }
        assert!(q.single.rate(at(20)) < 2e9, "{:?}", q.single);
        assert_eq!(probe_burst(4 << 20), 4);
        assert_eq!(probe_burst(128 << 10), 8);
        assert_eq!(probe_burst(64 << 20), 1);
    }
}
