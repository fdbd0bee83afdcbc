//! The node's queue timer: one thread that wakes queues at their deadlines,
//! so that a message expires at the head of its queue, and an unused queue
//! with `x-expires` is deleted, with no traffic to trigger either.
//!
//! Queues are changed from tokio tasks, from the pager thread and from the
//! sync thread, so the timer is a plain thread rather than a task on the
//! runtime: any of them can schedule a wake-up. It is started the first time
//! a queue asks for one, so a node whose queues have no TTL and no expiry
//! never runs it. It holds weak references only: a deleted queue is not
//! kept alive by a pending wake-up.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::panic::AssertUnwindSafe;
use std::sync::{Condvar, Mutex, MutexGuard, Once, Weak};

use crate::expiry::{instant_of, now_us};

/// A queue's timed work: implemented by the queue kinds with TTL or
/// `x-expires`.
pub trait TimedWork: Send + Sync {
    /// Expires what is due at the head, and the queue itself when it went
    /// unused for its `x-expires`; `at_us` is the wake-up's time.
    fn run_timer(&self, at_us: u64);

    /// The queue's name, for the log.
    fn name(&self) -> &str;
}

/// A wake-up for one queue at `at_us` on the deadline clock.
struct WakeUp {
    at_us: u64,
    queue: Weak<dyn TimedWork>,
}

impl PartialEq for WakeUp {
    fn eq(&self, other: &Self) -> bool {
        self.at_us == other.at_us
    }
}

impl Eq for WakeUp {}

impl PartialOrd for WakeUp {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for WakeUp {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at_us.cmp(&other.at_us)
    }
}

/// Wake-ups by time, earliest first. A queue schedules one only when it
/// is earlier than the one it already has pending (it keeps that time), so
/// the heap holds about one entry per timed queue; a superseded later entry
/// stays until its time and is then a no-op.
pub struct QueueTimer {
    wake_ups: Mutex<BinaryHeap<Reverse<WakeUp>>>,
    changed: Condvar,
    started: Once,
}

static TIMER: QueueTimer = QueueTimer {
    wake_ups: Mutex::new(BinaryHeap::new()),
    changed: Condvar::new(),
    started: Once::new(),
};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl QueueTimer {
    /// Asks for `queue` to be woken at `at_us` (see [`crate::expiry`]).
    pub fn schedule(queue: Weak<dyn TimedWork>, at_us: u64) {
        TIMER.started.call_once(|| {
            sluice_store::essential_thread::spawn("sluice-queue-timer", || TIMER.run());
        });
        let mut wake_ups = lock(&TIMER.wake_ups);
        let earliest = wake_ups
            .peek()
            .is_none_or(|Reverse(first)| at_us < first.at_us);
        wake_ups.push(Reverse(WakeUp { at_us, queue }));
        drop(wake_ups);
        if earliest {
            TIMER.changed.notify_one();
        }
    }

    fn run(&self) {
        let mut wake_ups = lock(&self.wake_ups);
        loop {
            let now = now_us();
            let next = wake_ups.peek().map(|Reverse(first)| first.at_us);
            match next {
                None => {
                    wake_ups = self
                        .changed
                        .wait(wake_ups)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                Some(at_us) if at_us <= now => {
                    let Some(Reverse(due)) = wake_ups.pop() else {
                        continue;
                    };
                    // The queue's work may schedule wake-ups of its own (and
                    // of queues it dead-letters into): never hold the heap
                    // while it runs.
                    drop(wake_ups);
                    if let Some(queue) = due.queue.upgrade() {
                        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                            queue.run_timer(due.at_us)
                        }));
                        if outcome.is_err() {
                            tracing::error!(queue = %queue.name(), "a queue's timed work panicked; the timer carries on");
                        }
                    }
                    wake_ups = lock(&self.wake_ups);
                }
                Some(at_us) => {
                    let timeout = instant_of(at_us).saturating_duration_since(instant_of(now));
                    wake_ups = self
                        .changed
                        .wait_timeout(wake_ups, timeout)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0;
                }
            }
        }
    }
}
