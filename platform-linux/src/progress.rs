//! The one wait loop's pacing, shared by every blocking call: poll while
//! work arrives; when idle, spin, then yield (for at most [`YIELDS`] yields
//! and [`YIELD_FOR`]), then sleep (or block in `epoll_wait`) for a pause
//! that doubles from [`NAP`] to [`MAX_NAP`] while nothing comes — so an
//! oversubscribed job keeps moving, and idle ranks leave the cores to the
//! ranks and the kernel work (the network stack) that are busy. The yield
//! phase is bounded in time because a machine shared with other jobs (or
//! with the ranks of other "hosts") makes each yield last a time slice:
//! counted yields alone would keep every idle rank runnable for seconds
//! and starve the kernel's packet processing, so that connects to a job's
//! peers went unanswered for longer than the handshake timeout. Look at
//! the clock only every [`CLOCK_EVERY`] rounds (a clock read costs as much
//! as a shared-memory message here), and then check liveness and the
//! timeout.
//!
//! The loop itself is the job API's (`World::wait_until`): it drives every
//! transport on each round, so a request that arrives on one transport
//! while the rank waits for another is served (a blocking call on one
//! transport alone could deadlock a cycle of ranks across transports). The
//! standalone transports use the same pacing for the little they wait on
//! their own (the flush when they are dropped).

use std::time::{Duration, Instant};

/// Rounds between clock reads.
pub const CLOCK_EVERY: u32 = 256;
/// Empty polls before yielding (when ranks do not outnumber cores).
pub const SPIN: u32 = 2000;
/// Empty polls before yielding when ranks outnumber cores.
pub const SPIN_OVERSUBSCRIBED: u32 = 8;
/// Yields before sleeping.
pub const YIELDS: u32 = 5000;
/// The longest the yield phase lasts (checked every [`YIELD_CHECK`]
/// yields).
pub const YIELD_FOR: Duration = Duration::from_millis(2);
/// Yields between two looks at the clock in the yield phase.
pub const YIELD_CHECK: u32 = 64;
/// The first sleep when idle for long.
pub const NAP: Duration = Duration::from_micros(50);
/// The longest sleep: what a message arriving after a long idle spell can
/// wait at most before the rank looks (TCP-only waits block on their
/// sockets instead and wake at once).
pub const MAX_NAP: Duration = Duration::from_millis(1);

/// What to do after an empty poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idle {
    /// Busy-poll again at once. The waiter adds no `spin_loop` hint of
    /// its own: a pass that found nothing already ends with the `sm`
    /// component's `poll_pause` hints (`World::pass`; none without shared
    /// memory), and the spin is bounded (then the loop yields).
    Spin,
    /// Give the core away once.
    Yield,
    /// Sleep (or block on sockets) this long.
    Nap(Duration),
}

/// The state of one blocking wait.
#[derive(Debug)]
pub struct Waiter {
    what: &'static str,
    timeout: Duration,
    started: Option<Instant>,
    rounds: u32,
    idle: u32,
    spin: u32,
    yield_start: Option<Instant>,
    napping: bool,
    nap: Duration,
}

impl Waiter {
    /// A wait for `what` that gives up after `timeout`; `oversubscribed`
    /// (more ranks than cores) yields after a few empty polls.
    pub fn new(what: &'static str, timeout: Duration, oversubscribed: bool) -> Self {
        Self {
            what,
            timeout,
            started: None,
            rounds: 0,
            idle: 0,
            spin: if oversubscribed {
                SPIN_OVERSUBSCRIBED
            } else {
                SPIN
            },
            yield_start: None,
            napping: false,
            nap: NAP,
        }
    }

    /// What is waited for.
    pub fn what(&self) -> &'static str {
        self.what
    }

    /// Records a pass that handled `events`; returns the time when the
    /// caller should look at the clock-driven checks (liveness, timeout):
    /// every [`CLOCK_EVERY`] rounds (the timeout counts from the first
    /// such look).
    pub fn pass(&mut self, events: usize) -> Option<Instant> {
        if events > 0 {
            self.idle = 0;
            self.yield_start = None;
            self.napping = false;
            self.nap = NAP;
        } else {
            self.idle = self.idle.saturating_add(1);
            if self.napping {
                self.nap = (self.nap * 2).min(MAX_NAP);
            } else if self.idle >= self.spin + YIELDS {
                self.napping = true;
            } else if self.idle >= self.spin && (self.idle - self.spin) % YIELD_CHECK == 0 {
                let now = Instant::now();
                let start = *self.yield_start.get_or_insert(now);
                self.napping = now.duration_since(start) >= YIELD_FOR;
            }
        }
        self.rounds = self.rounds.wrapping_add(1);
        if self.rounds % CLOCK_EVERY == 0 {
            let now = Instant::now();
            self.started.get_or_insert(now);
            Some(now)
        } else {
            None
        }
    }

    /// How long the wait has lasted, if longer than its timeout.
    pub fn expired(&self, now: Instant) -> Option<Duration> {
        let waited = now.duration_since(self.started?);
        (waited > self.timeout).then_some(waited)
    }

    /// True on the first empty poll past spinning (the moment to release
    /// resources a busy poller holds back, e.g. a partial lazy-free batch).
    pub fn just_stopped_spinning(&self) -> bool {
        self.idle == self.spin
    }

    /// What to do now, after [`Self::pass`].
    pub fn idle(&self) -> Idle {
        if self.idle == 0 || self.idle < self.spin {
            Idle::Spin
        } else if !self.napping {
            Idle::Yield
        } else {
            Idle::Nap(self.nap)
        }
    }

    /// Carries out [`Self::idle`] without sockets to block on.
    pub fn rest(&self) {
        match self.idle() {
            Idle::Spin => {}
            Idle::Yield => std::thread::yield_now(),
            Idle::Nap(d) => std::thread::sleep(d),
        }
    }
}

/// Whether more ranks run on this node than there are cores for them: then
/// waits yield almost at once.
///
/// The cores are those of this process's affinity mask — unless the mask
/// is a single CPU: a launcher that binds each rank to a core of its own
/// (`btl run --bind-to core`, `btl bench`, `mpirun --bind-to core`) leaves
/// every rank a one-CPU mask that says nothing of the others', and
/// counting it would make every bound job of two ranks or more
/// "oversubscribed" (yielding after 8 empty polls: a `sched_yield` per poll
/// on the latency path). Then the machine's online CPUs count. Ranks bound
/// several to one core on a machine with enough cores are not detected.
pub fn oversubscribed(local_ranks: u32) -> bool {
    let mask = rustix::thread::sched_getaffinity(None)
        .map(|s| s.count() as usize)
        .unwrap_or(1);
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| cpu_list_len(&s));
    outnumber(local_ranks, mask, online)
}

/// [`oversubscribed`]'s rule: `local_ranks` against the CPUs of our mask,
/// or the `online` ones when the mask is a single CPU.
fn outnumber(local_ranks: u32, mask: usize, online: Option<usize>) -> bool {
    let cores = match (mask, online) {
        (0 | 1, Some(online)) => online,
        (m, _) => m,
    };
    local_ranks as usize > cores.max(1)
}

/// The number of CPUs in a kernel CPU list (`0-3,8,10-11`), `None` if it
/// does not parse.
fn cpu_list_len(list: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in list.trim().split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = part.parse::<usize>().ok()?;
                (a, a)
            }
        };
        n += b.checked_sub(a)? + 1;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_spins_then_yields_then_naps() {
        let mut w = Waiter::new("x", Duration::from_secs(1), true);
        assert!(w.pass(0).is_none());
        assert_eq!(w.idle(), Idle::Spin);
        for _ in 0..SPIN_OVERSUBSCRIBED {
            w.pass(0);
        }
        assert_eq!(w.idle(), Idle::Yield);
        for _ in 0..YIELDS - 1 {
            w.pass(0);
        }
        assert_eq!(w.idle(), Idle::Nap(NAP));
        // The nap doubles while nothing comes, up to MAX_NAP.
        w.pass(0);
        assert_eq!(w.idle(), Idle::Nap(NAP * 2));
        for _ in 0..20 {
            w.pass(0);
        }
        assert_eq!(w.idle(), Idle::Nap(MAX_NAP));
        w.pass(3);
        assert_eq!(w.idle(), Idle::Spin);
        // The clock is looked at every CLOCK_EVERY rounds.
        let mut w = Waiter::new("x", Duration::ZERO, false);
        let seen: Vec<_> = (0..CLOCK_EVERY).filter_map(|_| w.pass(1)).collect();
        assert_eq!(seen.len(), 1);
        assert!(w.expired(seen[0]).is_none());
    }

    #[test]
    fn the_yield_phase_ends_after_yield_for() {
        // Yields that take long (a shared machine) end the phase early.
        let mut w = Waiter::new("x", Duration::from_secs(1), true);
        for _ in 0..=SPIN_OVERSUBSCRIBED {
            w.pass(0);
        }
        assert_eq!(w.idle(), Idle::Yield);
        std::thread::sleep(YIELD_FOR);
        for _ in 0..2 * YIELD_CHECK {
            w.pass(0);
        }
        assert!(matches!(w.idle(), Idle::Nap(_)), "{:?}", w.idle());
    }

    #[test]
    fn bound_ranks_count_the_machine() {
        assert_eq!(cpu_list_len("0-1\n"), Some(2));
        assert_eq!(cpu_list_len("0-3,8,10-11"), Some(7));
        assert_eq!(cpu_list_len("3-1"), None);
        assert_eq!(cpu_list_len("x"), None);
        // Unbound (mask = what the job may use): the mask decides.
        assert!(!outnumber(2, 2, Some(64)));
        assert!(outnumber(3, 2, Some(64)));
        // Bound one per core: the machine decides.
        assert!(!outnumber(2, 1, Some(2)));
        assert!(outnumber(3, 1, Some(2)));
        assert!(outnumber(2, 1, None));
        assert!(!outnumber(1, 1, None));
    }
}
