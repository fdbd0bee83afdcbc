//! What a classic queue does with time: message TTL at the head, and
//! `x-expires`, driven by the node's queue timer.

use std::sync::Arc;

use super::state::QueueState;
use super::ClassicQueue;
use crate::dead_letter::{DeadLetter, DeathReason};
use crate::expiry::{now_us, NEVER};
use crate::queue::Queue;
use crate::queue_timer::QueueTimer;

impl ClassicQueue {
    /// Starts what the queue does with time, once it is shared: the
    /// `x-expires` countdown, and the TTL of recovered messages. Those
    /// journaled with their deadline keep it, so one that passed while the
    /// node was down is due now; those journaled without one (the queue got
    /// its TTL later) count the queue's TTL from recovery: late, never early.
    pub(super) fn start_timed_work(&self) {
        let mut state = self.lock();
        let now = now_us();
        state.used_at_us = now;
        if let Some(ttl) = state.rules.expiry.message_ttl_us {
            state.deadlines = true;
            if !state.paged.is_empty() {
                let fallback = now.saturating_add(ttl).min(NEVER - 1);
                if state.paged_deadlines.is_empty() {
                    let count = state.paged.len();
                    state.paged_deadlines = std::iter::repeat_n(fallback, count).collect();
                } else {
                    for deadline in state.paged_deadlines.iter_mut() {
                        if *deadline == NEVER {
                            *deadline = fallback;
                        }
                    }
                }
            }
        }
        if !state.paged_deadlines.is_empty() {
            state.deadlines = true;
            let head_deadline = state.head_deadline();
            self.schedule_timer(&mut state, head_deadline);
        }
        if let Some(expires) = state.rules.expiry.expires_us {
            self.schedule_timer(&mut state, now.saturating_add(expires));
        }
    }

    /// Asks the queue timer to call [`Queue::run_timer`] at `at_us`, unless
    /// an earlier call is pending already: a later one would find the head
    /// changed anyway, and reschedules then.
    pub(super) fn schedule_timer(&self, state: &mut QueueState, at_us: u64) {
        if at_us == NEVER || self.is_deleted() {
            return;
        }
        if state.timer_at_us != 0 && state.timer_at_us <= at_us {
            return;
        }
        state.timer_at_us = at_us;
        let this: std::sync::Weak<Self> = self.this.clone();
        QueueTimer::schedule(this, at_us);
    }

    /// The queue timer's call: expires what is due at the head and deletes
    /// the queue when it has gone unused for its `x-expires`.
    pub(super) fn timer_work(&self, at_us: u64) {
        let mut state = self.lock();
        if state.timer_at_us != 0 && state.timer_at_us <= at_us {
            state.timer_at_us = 0;
        }
        if self.is_deleted() {
            return;
        }
        if state.deadlines {
            self.dispatch_locked(&mut state);
            self.update_congestion(&mut state);
        }
        let mut expired = false;
        if let Some(expires) = state.rules.expiry.expires_us {
            if state.consumers.is_empty() {
                let due = state.used_at_us.saturating_add(expires);
                if due <= now_us() {
                    expired = true;
                } else {
                    self.schedule_timer(&mut state, due);
                }
            }
        }
        self.unlock(state);
        if expired {
            if let Some(host) = self.host.upgrade() {
                let queue: Arc<dyn Queue> = self.arc();
                host.expire(&queue);
            }
        }
    }

    /// Whether the queue went unused for its `x-expires`: no consumers,
    /// and no basic.get or redeclaration for that long.
    pub(super) fn unused_for_expiry(&self) -> bool {
        let state = self.lock();
        let Some(expires) = state.rules.expiry.expires_us else {
            return false;
        };
        state.consumers.is_empty() && state.used_at_us.saturating_add(expires) <= now_us()
    }

    /// The queue was used (redeclared, or read with basic.get): its
    /// `x-expires` countdown starts again.
    pub(super) fn touch_used(&self) {
        let mut state = self.lock();
        if state.rules.expiry.expires_us.is_some() {
            state.used_at_us = now_us();
        }
    }

    /// Removes the expired messages at the head, and only there: a message
    /// deeper in the queue waits until it reaches the head, as in
    /// RabbitMQ, so this never scans the queue. Bounded by the queue's
    /// length, as RabbitMQ's `drop_expired_msgs`. A paged head is dropped
    /// without reading it, unless it is to be dead-lettered.
    pub(super) fn expire_head(&self, state: &mut QueueState) {
        let now = now_us();
        loop {
            if let Some(head) = state.ready.front() {
                if head.expires_at_us > now || state.publishing == Some(head.offset) {
                    break;
                }
                let Some(entry) = state.take_resident() else {
                    break;
                };
                state.forget([&entry]);
                state.counts.add(|counts| &mut counts.dropped, 1);
                if state.rules.dead_letter.is_some() {
                    state.dead_letters.push(DeadLetter {
                        message: entry.message,
                        reason: DeathReason::Expired,
                    });
                }
            } else if state.paged_head_deadline() <= now {
                if !self.discard_paged_head(state, DeathReason::Expired) {
                    break;
                }
            } else {
                break;
            }
        }
        if state.ready_count() == 0 && !state.rules.expiry.has_message_ttl() {
            state.deadlines = false;
        }
    }
}
