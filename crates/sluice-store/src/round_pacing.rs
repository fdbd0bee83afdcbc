//! When a sync thread shared by many writers holds its next round back.
//!
//! An fdatasync costs about the same however much it covers (about 90 µs
//! of CPU on the machines measured), and each Raft round trip costs about
//! the same however many messages its entry carries. When many writers
//! share one log (the Raft groups of a node's busy quorum queues, sharing
//! its write-ahead log), a round that waits a little gathers more of each
//! writer's appends: fewer fdatasyncs and fuller entries for the same
//! messages. A lone writer (one busy queue) gains nothing from the wait and
//! loses a round trip's worth of time per round, which halved one queue's
//! rate when every round was held back; so only a round with at least
//! `writers_min` writers in it waits.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

pub struct RoundPacing {
    /// A round waits up to `factor` times the last round's duration after
    /// that round started: the sync thread is then busy at most one part
    /// in `factor + 1` of the time. A round costs about the same however
    /// much it writes, so on a machine short of CPU, where rounds take
    /// longer, the pause grows with them.
    factor: u32,
    pause_max: Duration,
    writers_min: u32,
    /// Writers that appended since the last round started.
    writers: AtomicU32,
    rounds_started: AtomicU64,
}

impl RoundPacing {
    pub fn new(factor: u32, pause_max: Duration, writers_min: u32) -> RoundPacing {
        RoundPacing {
            factor,
            pause_max,
            writers_min,
            writers: AtomicU32::new(0),
            // Not zero, so that a writer's counter starting at zero counts
            // its first append.
            rounds_started: AtomicU64::new(1),
        }
    }

    /// Counts a writer into the next round, once per round: `counted_for`
    /// is the writer's own, the round it last counted itself into. A writer
    /// appends from one task at a time, so a plain load and store do; only
    /// its first append of a round touches the shared count.
    pub fn count_writer(&self, counted_for: &AtomicU64) {
        let round = self.rounds_started.load(Ordering::Acquire);
        if counted_for.load(Ordering::Relaxed) != round {
            counted_for.store(round, Ordering::Relaxed);
            self.writers.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// How long after the last round started the next may start, given
    /// how long the last one took.
    pub(crate) fn pause(&self, last_round_took: Duration) -> Duration {
        if self.writers.load(Ordering::Acquire) < self.writers_min {
            return Duration::ZERO;
        }
        (last_round_took * self.factor).min(self.pause_max)
    }

    /// A round takes what was appended: later appends count for the next.
    pub(crate) fn round_starting(&self) {
        self.writers.store(0, Ordering::Release);
        self.rounds_started.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_waits_only_when_enough_writers_appended_since_the_last() {
        let pacing = RoundPacing::new(10, Duration::from_millis(5), 3);
        let writers: Vec<AtomicU64> = (0..3).map(|_| AtomicU64::new(0)).collect();
        let took = Duration::from_micros(200);
        // One writer appending many times is one writer.
        for _ in 0..10 {
            pacing.count_writer(&writers[0]);
        }
        assert_eq!(pacing.pause(took), Duration::ZERO);
        pacing.count_writer(&writers[1]);
        pacing.count_writer(&writers[2]);
        assert_eq!(pacing.pause(took), Duration::from_millis(2));
        assert_eq!(
            pacing.pause(Duration::from_millis(1)),
            Duration::from_millis(5),
            "bounded by pause_max"
        );
        // The next round counts afresh.
        pacing.round_starting();
        assert_eq!(pacing.pause(took), Duration::ZERO);
        pacing.count_writer(&writers[0]);
        pacing.count_writer(&writers[1]);
        assert_eq!(pacing.pause(took), Duration::ZERO);
        pacing.count_writer(&writers[2]);
        assert_eq!(pacing.pause(took), Duration::from_millis(2));
    }
}
