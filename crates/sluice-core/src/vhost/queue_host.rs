//! The vhost as its queues' host: it routes what they dead-letter and
//! deletes them when they expire. A queue hands these up through
//! [`QueueHost`] with no lock held; it never reaches into the vhost itself.

use std::sync::Arc;

use super::routing::RouteScratch;
use super::VirtualHost;
use crate::dead_letter::{dead_lettered, is_cycle, DeadLetter, DeadLetterTarget, DeathReason};
use crate::exchange::ExchangeKind;
use crate::queue::{PublishOutcome, Queue, QueueHost};

/// Dead-letter problems (a missing exchange, a cycle) are logged once per
/// queue and kind, as RabbitMQ logs a cycle once; this bounds how many the
/// vhost remembers, after which new ones are no longer logged.
pub(super) const DEAD_LETTER_WARNINGS_MAX: usize = 1024;

impl VirtualHost {
    /// Logs a dead-letter problem once per `key`.
    fn warn_dead_letter_once(&self, key: String, warning: impl FnOnce()) {
        let mut logged = self
            .dead_letter_warnings
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if logged.len() < DEAD_LETTER_WARNINGS_MAX && logged.insert(key) {
            warning();
        }
    }

    /// Republishes what `queue` dead-lettered to `target`'s exchange, with
    /// the x-death history, routed by the dead-letter routing key or the
    /// messages' own keys. Called with no queue locked. As in RabbitMQ
    /// 3.10, a missing exchange drops the messages, and a copy that would
    /// close a cycle without a rejection in it is dropped for that queue.
    /// Persistent copies entering durable queues are journaled as any
    /// publish. Returns each target queue's word on its copy, and whether
    /// some message reached no queue at all (for at-least-once
    /// dead-lettering, which waits for both; the others ignore them).
    fn route_dead_letters(
        &self,
        queue: &str,
        target: &DeadLetterTarget,
        dead_letters: Vec<DeadLetter>,
    ) -> (Vec<PublishOutcome>, bool) {
        let mut outcomes = Vec::new();
        let mut unrouted = false;
        let exchange = match self.exchange(&target.exchange) {
            Ok(exchange) => exchange,
            Err(_) => {
                self.warn_dead_letter_once(format!("missing {queue} {}", target.exchange), || {
                    tracing::warn!(queue, vhost = %self.name, exchange = %target.exchange, "the dead-letter exchange does not exist; dead-lettered messages are dropped, or kept for at-least-once dead-lettering");
                });
                return (outcomes, true);
            }
        };
        let time_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        let mut scratch = RouteScratch::default();
        let mut destinations: Vec<Arc<dyn Queue>> = Vec::new();
        for dead in dead_letters {
            let copy = dead_lettered(&dead.message, dead.reason, queue, target, time_s);
            let headers = (exchange.kind == ExchangeKind::Headers).then_some(&copy.headers);
            let keys: Vec<&[u8]> = copy.routing_keys.iter().map(|key| &key[..]).collect();
            self.route_keys(&exchange, &keys, headers, &mut scratch, &mut destinations);
            let message = Arc::new(copy.message);
            unrouted |= destinations.is_empty();
            for destination in destinations.drain(..) {
                if dead.reason != DeathReason::Rejected
                    && is_cycle(destination.name(), &copy.headers)
                {
                    self.warn_dead_letter_once(format!("cycle {queue} {}", destination.name()), || {
                        tracing::warn!(queue, vhost = %self.name, into = %destination.name(), "message dropped: dead-letter queues cycle detected; this cycle will not be reported again");
                    });
                    continue;
                }
                outcomes.push(destination.publish(Arc::clone(&message)));
            }
        }
        (outcomes, unrouted)
    }
}

impl QueueHost for VirtualHost {
    fn dead_letter(&self, queue: &str, target: &DeadLetterTarget, dead_letters: Vec<DeadLetter>) {
        self.route_dead_letters(queue, target, dead_letters);
    }

    fn dead_letter_tracked(
        &self,
        queue: &str,
        target: &DeadLetterTarget,
        dead_letters: Vec<DeadLetter>,
    ) -> Option<Vec<PublishOutcome>> {
        let (outcomes, unrouted) = self.route_dead_letters(queue, target, dead_letters);
        (!unrouted).then_some(outcomes)
    }

    /// Proposes deleting a queue that went unused for its `x-expires`, as
    /// queue.delete would: bindings removed, any consumer that came
    /// meanwhile told with basic.cancel. Its messages are not
    /// dead-lettered, as in RabbitMQ.
    fn expire(&self, queue: &Arc<dyn Queue>) {
        if !queue.is_unused_for_expiry() {
            return;
        }
        tracing::info!(queue = %queue.name(), vhost = %self.name, messages = queue.message_count(), "deleting a queue unused for its x-expires");
        self.propose_queue_deletion(queue);
    }
}
