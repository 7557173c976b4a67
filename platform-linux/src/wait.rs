//! One way to wait in setup code: poll a condition until a deadline,
//! sleeping between polls with a pause that doubles up to a ceiling.
//!
//! Every setup loop (attaching a segment, fetching its descriptor, reading
//! the wire-up, connecting to a service, waiting for a child) uses a
//! [`Deadline`], so that each wait has a bound, none spins, and the
//! back-off is written once. Progress passes never wait: they return and
//! are called again (see `World::progress`).
//!
//! ```
//! use btl_linux::wait::Deadline;
//! use std::time::Duration;
//!
//! let mut polls = 0;
//! let got = Deadline::new(Duration::from_secs(1)).poll(|| {
//!     polls += 1;
//!     Ok::<_, ()>((polls == 3).then_some(polls))
//! });
//! assert_eq!(got, Ok(Some(3)));
//! ```

use std::time::{Duration, Instant};

/// The first pause between two polls when none is given.
pub const FIRST_PAUSE: Duration = Duration::from_millis(1);
/// The longest pause between two polls when none is given.
pub const MAX_PAUSE: Duration = Duration::from_millis(20);

/// A deadline with a back-off: [`pause`](Self::pause) sleeps (never past the
/// deadline) and says whether there is time left to poll again.
#[derive(Debug, Clone)]
pub struct Deadline {
    start: Instant,
    timeout: Duration,
    pause: Duration,
    max_pause: Duration,
}

impl Deadline {
    /// A deadline `timeout` from now, pausing [`FIRST_PAUSE`] doubling up to
    /// [`MAX_PAUSE`].
    pub fn new(timeout: Duration) -> Self {
        Self {
            start: Instant::now(),
            timeout,
            pause: FIRST_PAUSE,
            max_pause: MAX_PAUSE,
        }
    }

    /// The same deadline with pauses from `first` doubling up to `max`
    /// (`max` is raised to `first` if smaller).
    #[must_use]
    pub fn pauses(mut self, first: Duration, max: Duration) -> Self {
        self.pause = first;
        self.max_pause = max.max(first);
        self
    }

    /// The time since the deadline was made.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// The time left before the deadline (zero once it has passed).
    pub fn remaining(&self) -> Duration {
        self.timeout.saturating_sub(self.start.elapsed())
    }

    /// True once the deadline has passed.
    pub fn expired(&self) -> bool {
        self.start.elapsed() >= self.timeout
    }

    /// The instant of the deadline.
    pub fn at(&self) -> Instant {
        self.start + self.timeout
    }

    /// Sleeps for the next pause, cut at the deadline, and doubles the
    /// pause; false (without sleeping) when the deadline has passed.
    pub fn pause(&mut self) -> bool {
        let left = self.remaining();
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(self.pause.min(left));
        self.pause = (self.pause * 2).min(self.max_pause);
        true
    }

    /// Calls `attempt` until it returns `Ok(Some(_))` or an error, pausing
    /// between calls; `Ok(None)` once the deadline passes. `attempt` runs at
    /// least once, and once more after the last pause.
    pub fn poll<T, E>(
        &mut self,
        mut attempt: impl FnMut() -> Result<Option<T>, E>,
    ) -> Result<Option<T>, E> {
        loop {
            if let Some(v) = attempt()? {
                return Ok(Some(v));
            }
            if !self.pause() {
                return Ok(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_returns_the_value_once_ready() {
        let mut n = 0;
        let got = Deadline::new(Duration::from_secs(5)).poll(|| {
            n += 1;
            Ok::<_, ()>((n == 4).then_some(n))
        });
        assert_eq!(got, Ok(Some(4)));
    }

    #[test]
    fn poll_times_out_within_the_deadline_and_a_pause() {
        let t = Instant::now();
        let mut d =
            Deadline::new(Duration::from_millis(50)).pauses(FIRST_PAUSE, Duration::from_millis(5));
        let got = d.poll(|| Ok::<Option<()>, ()>(None));
        assert_eq!(got, Ok(None));
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(50), "{took:?}");
        assert!(took < Duration::from_millis(500), "{took:?}");
        assert!(d.expired());
        assert_eq!(d.remaining(), Duration::ZERO);
    }

    #[test]
    fn poll_passes_errors_through_at_once() {
        let got = Deadline::new(Duration::from_secs(5)).poll(|| Err::<Option<()>, _>("bad"));
        assert_eq!(got, Err("bad"));
    }

    #[test]
    fn pauses_double_up_to_the_ceiling() {
        let mut d = Deadline::new(Duration::from_secs(5))
            .pauses(Duration::from_micros(10), Duration::from_micros(40));
        for _ in 0..4 {
            assert!(d.pause());
        }
        assert_eq!(d.pause, Duration::from_micros(40));
    }
}
