//! A classic queue's rules (length limits, message TTL, `x-expires`,
//! dead-lettering), read from its effective arguments when it is made, and
//! replaced while it runs when a policy changes them, as RabbitMQ's
//! `rabbit_amqqueue_process:process_args_policy` does: a lower limit drops
//! (or dead-letters) the oldest messages at once, a new TTL applies to the
//! messages published from then on and expired heads go, and a new
//! `x-expires` counts from the change.

use amq_protocol::types::FieldTable;

use super::ClassicQueue;
use crate::dead_letter::DeadLetterTarget;
use crate::expiry::{now_us, QueueExpiry};
use crate::queue_limits::{Overflow, QueueLimits};

/// What a classic queue does with length, time and the messages it drops.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct QueueRules {
    /// `x-max-length`, `x-max-length-bytes` and `x-overflow`.
    pub(super) limits: QueueLimits,
    /// `x-message-ttl` and `x-expires`.
    pub(super) expiry: QueueExpiry,
    /// `x-dead-letter-exchange` and `x-dead-letter-routing-key`.
    pub(super) dead_letter: Option<DeadLetterTarget>,
}

impl QueueRules {
    /// The rules of a queue's effective arguments (declared, merged with
    /// its policy).
    pub(super) fn from_arguments(arguments: &FieldTable) -> Self {
        QueueRules {
            limits: QueueLimits::from_arguments(arguments),
            expiry: QueueExpiry::from_arguments(arguments),
            dead_letter: DeadLetterTarget::from_arguments(arguments),
        }
    }
}

impl ClassicQueue {
    /// Takes on new rules (a policy changed); nothing happens when they
    /// are the ones it has.
    pub(super) fn change_rules(&self, rules: QueueRules) {
        let mut state = self.lock();
        if self.is_deleted() || state.rules == rules {
            return;
        }
        let expires_changed = state.rules.expiry.expires_us != rules.expiry.expires_us;
        state.rules = rules;
        if expires_changed {
            if let Some(expires) = state.rules.expiry.expires_us {
                // As RabbitMQ's `init_exp`: the timer starts again.
                let now = now_us();
                state.used_at_us = now;
                self.schedule_timer(&mut state, now.saturating_add(expires));
            }
        }
        let limits = state.rules.limits;
        if limits.is_limited() && limits.overflow == Overflow::DropHead {
            self.drop_head_over_limits(&mut state);
        }
        if state.rules.expiry.has_message_ttl() {
            state.deadlines = true;
        }
        if state.deadlines {
            self.expire_head(&mut state);
            let head_deadline = state.head_deadline();
            self.schedule_timer(&mut state, head_deadline);
        }
        self.update_congestion(&mut state);
        self.unlock(state);
    }
}
