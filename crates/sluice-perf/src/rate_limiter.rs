//! A per-task send schedule: the n-th message of a task is due at `start + n / rate`.
//!
//! Keeping an absolute schedule (instead of sleeping `1 / rate` after each send) means timer
//! granularity and scheduling delays do not add up: a task that wakes 3 ms late sends the
//! messages that fell due meanwhile at once and is back on schedule. The catch-up burst is
//! bounded by [`CATCH_UP_MAX`], so a task that was stalled for seconds (a blocked connection,
//! a full in-flight window) resumes at the requested rate instead of flooding the broker with
//! everything it "owes".
//!
//! Tasks with the same rate do not share one schedule: [`RateLimiter::staggered`] spreads
//! their first messages evenly across one interval. A hundred producers at 30 msg/s that all
//! started on the same tick would publish a hundred messages at once every 33 ms, and the
//! burst would queue in the broker and both clients, measuring up to several milliseconds
//! of queueing that a hundred independent clients would not cause. PerfTest's producers,
//! each a thread started one after another, are spread the same way by their start times.

use std::time::Duration;

use tokio::time::Instant;

/// How far behind its schedule a task may fall before the schedule is moved forward. A
/// second's worth of messages at most is sent back to back after a stall; beyond that the
/// lost time is forgotten.
pub const CATCH_UP_MAX: Duration = Duration::from_secs(1);

/// Paces one producer (or one consumer's acks) at `rate` messages per second.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    /// Time between two messages; `None` means unlimited.
    interval: Option<Duration>,
    /// When the next message is due.
    next_due: Instant,
}

impl RateLimiter {
    /// A limiter whose first message is due at `start`. A `rate` that is not positive or
    /// not finite means "as fast as possible".
    pub fn new(rate_per_second: f64, start: Instant) -> Self {
        let interval = (rate_per_second.is_finite() && rate_per_second > 0.0)
            .then(|| Duration::from_secs_f64(1.0 / rate_per_second));
        RateLimiter {
            interval,
            next_due: start,
        }
    }

    /// The `index`-th of `count` limiters with the same rate: its first message is due
    /// `index / count` of an interval after `start`, so together the tasks send at evenly
    /// spaced instants instead of in bursts.
    pub fn staggered(rate_per_second: f64, start: Instant, index: usize, count: usize) -> Self {
        let mut limiter = RateLimiter::new(rate_per_second, start);
        if let Some(interval) = limiter.interval {
            let share = index as f64 / count.max(1) as f64;
            limiter.next_due += interval.mul_f64(share.clamp(0.0, 1.0));
        }
        limiter
    }

    pub fn is_limited(&self) -> bool {
        self.interval.is_some()
    }

    /// Takes one send permit. Returns `None` if a message may go now (and books it), or the
    /// instant to wait for before calling again.
    pub fn try_acquire(&mut self, now: Instant) -> Option<Instant> {
        // Unlimited: `None`, every message may go at once.
        let interval = self.interval?;
        if now < self.next_due {
            return Some(self.next_due);
        }
        // Forget a stall longer than CATCH_UP_MAX rather than bursting through it.
        if now.duration_since(self.next_due) > CATCH_UP_MAX {
            self.next_due = now - CATCH_UP_MAX;
        }
        self.next_due += interval;
        None
    }

    /// Waits until a message may be sent, then books it.
    pub async fn acquire(&mut self) {
        while let Some(due) = self.try_acquire(Instant::now()) {
            tokio::time::sleep_until(due).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limiter_unlimited_never_waits() {
        let start = Instant::now();
        let mut limiter = RateLimiter::new(0.0, start);
        assert!(!limiter.is_limited());
        for _ in 0..1000 {
            assert_eq!(limiter.try_acquire(start), None);
        }
        assert!(!RateLimiter::new(f64::NAN, start).is_limited());
        assert!(!RateLimiter::new(-1.0, start).is_limited());
    }

    #[test]
    fn rate_limiter_spaces_messages_by_the_interval() {
        let start = Instant::now();
        let mut limiter = RateLimiter::new(100.0, start);
        assert_eq!(limiter.try_acquire(start), None);
        // The second message is due 10 ms later, and asking again does not move it.
        let due = limiter.try_acquire(start).expect("must wait");
        assert_eq!(due - start, Duration::from_millis(10));
        assert_eq!(
            limiter.try_acquire(start + Duration::from_millis(5)),
            Some(due)
        );
        assert_eq!(limiter.try_acquire(due), None);
    }

    #[test]
    fn rate_limiter_catches_up_after_a_late_wake_up() {
        let start = Instant::now();
        let mut limiter = RateLimiter::new(1000.0, start);
        // Waking 5 ms late: the 5 messages that fell due meanwhile go at once, plus the one
        // due exactly now; then the schedule is back in the future.
        let late = start + Duration::from_millis(5);
        let mut sent = 0;
        while limiter.try_acquire(late).is_none() {
            sent += 1;
        }
        assert_eq!(sent, 6);
    }

    #[test]
    fn rate_limiter_bounds_the_burst_after_a_stall() {
        let start = Instant::now();
        let mut limiter = RateLimiter::new(100.0, start);
        let after_stall = start + Duration::from_secs(10);
        let mut sent = 0;
        while limiter.try_acquire(after_stall).is_none() {
            sent += 1;
        }
        // One second of catch-up at 100 msg/s, plus the message due now.
        assert_eq!(sent, 101);
    }

    #[test]
    fn staggered_limiters_send_at_evenly_spaced_instants() {
        let start = Instant::now();
        let count = 4;
        // Four producers at 100 msg/s: together one message every 2.5 ms, none at once.
        let mut due: Vec<Duration> = (0..count)
            .flat_map(|index| {
                let mut limiter = RateLimiter::staggered(100.0, start, index, count);
                let mut times = Vec::new();
                for _ in 0..3 {
                    let at = limiter.try_acquire(start).unwrap_or(start);
                    times.push(at - start);
                    let _ = limiter.try_acquire(at);
                }
                times
            })
            .collect();
        due.sort();
        let expected: Vec<Duration> = (0..12u32)
            .map(|n| Duration::from_micros(2500) * n)
            .collect();
        assert_eq!(due, expected);
        // Unlimited limiters have no schedule to spread.
        let mut unlimited = RateLimiter::staggered(0.0, start, 3, count);
        assert_eq!(unlimited.try_acquire(start), None);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limiter_holds_the_rate_over_time() {
        let start = Instant::now();
        let mut limiter = RateLimiter::new(250.0, start);
        let mut sent = 0u32;
        while Instant::now() < start + Duration::from_secs(4) {
            limiter.acquire().await;
            sent += 1;
        }
        // 4 s at 250 msg/s; the paused clock makes this exact up to the boundary message.
        assert!((1000..=1001).contains(&sent), "sent {sent}");
    }
}
