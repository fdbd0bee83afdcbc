//! A classic queue's consumers: registration, exclusivity, single active
//! consumer.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::ClassicQueue;
use crate::error::{AmqpError, AmqpResult};
use crate::expiry::now_us;
use crate::queue::{ConnectionId, Consumer, ConsumerRemoved};

impl ClassicQueue {
    /// Registers a consumer. `announce` runs under the queue's lock once the
    /// checks have passed and before the consumer can be given anything:
    /// the caller writes consume-ok there, so no delivery (from a publish,
    /// an ack or a timer on another thread) can overtake it, as the queue
    /// process itself sends consume-ok in RabbitMQ.
    pub(super) fn register_consumer(
        &self,
        consumer: Arc<Consumer>,
        announce: &mut dyn FnMut(),
    ) -> AmqpResult<()> {
        let mut state = self.lock();
        if self.is_deleted() {
            return Err(AmqpError::not_found(format!(
                "no queue '{}' in vhost '{}'",
                self.name, self.vhost
            )));
        }
        // RabbitMQ refuses an exclusive consumer on a single-active-consumer
        // queue whether or not it has consumers (`exclusive_consume_unavailable`).
        let exclusive_in_use = consumer.exclusive
            && (self.single_active_consumer || !state.consumers.is_empty())
            || state.consumers.iter().any(|existing| existing.exclusive);
        if exclusive_in_use {
            return Err(AmqpError::access_refused(format!(
                "queue '{}' in vhost '{}' in exclusive use",
                self.name, self.vhost
            )));
        }
        announce();
        if state.consumers.is_empty() {
            // Flow measures the backlog's growth from where it is now.
            state.flow_floor = (state.ready_count() as u64, state.ready_bytes);
        }
        if self.single_active_consumer {
            // The first consumer registered is the active one, whatever the
            // priorities (RabbitMQ 3.10's `basic_consume`); the others wait
            // in registration order.
            state.consumers.push(consumer);
        } else {
            let position = state
                .consumers
                .partition_point(|existing| existing.priority >= consumer.priority);
            state.consumers.insert(position, consumer);
        }
        state.had_consumer = true;
        // No dispatch here: the caller calls it once its own bookkeeping
        // of the consumer is done.
        Ok(())
    }

    pub(super) fn unregister_consumer(
        &self,
        connection_id: ConnectionId,
        channel_id: u16,
        tag: &str,
    ) -> Option<ConsumerRemoved> {
        let mut state = self.lock();
        let index = state.consumers.iter().position(|consumer| {
            consumer.connection_id == connection_id
                && consumer.channel_id == channel_id
                && &*consumer.tag == tag
        })?;
        let consumer = state.consumers.remove(index);
        let active_consumer_changed =
            self.single_active_consumer && index == 0 && !state.consumers.is_empty();
        if active_consumer_changed {
            Self::promote_next_active(&mut state.consumers);
        }
        self.update_congestion(&mut state);
        if let Some(expires) = state.rules.expiry.expires_us {
            if state.consumers.is_empty() {
                // Unused from now: x-expires counts from the last consumer.
                state.used_at_us = now_us();
                let due = state.used_at_us.saturating_add(expires);
                self.schedule_timer(&mut state, due);
            }
        }
        let queue_now_unused = self.options.auto_delete
            && state.had_consumer
            && state.consumers.is_empty()
            && !self.is_deleted();
        if queue_now_unused {
            // Deleted from here, under the lock that adds consumers: a
            // consumer arriving from another connection before the caller
            // removes the queue finds it gone (404), as in RabbitMQ, whose
            // queue process decides this in one step, instead of joining a
            // queue about to be deleted and never hearing of it.
            self.deleted.store(true, Ordering::Release);
        }
        Some(ConsumerRemoved {
            consumer,
            queue_now_unused,
            active_consumer_changed,
        })
    }

    /// Makes the next consumer of a single-active-consumer queue active:
    /// the one with the highest priority, the earliest registered among
    /// equals, as RabbitMQ 3.10 picks it (`rabbit_queue_consumers:
    /// get_consumer`, the head of its consumer priority queue). Without
    /// priorities that is registration order. The others keep their order.
    pub(super) fn promote_next_active(consumers: &mut Vec<Arc<Consumer>>) {
        let mut next = 0;
        for (index, consumer) in consumers.iter().enumerate() {
            if consumer.priority > consumers[next].priority {
                next = index;
            }
        }
        if next != 0 {
            let active = consumers.remove(next);
            consumers.insert(0, active);
        }
    }

    /// The tag of the consumer receiving messages in a single-active-consumer
    /// queue; None in other queues and while it has no consumer.
    pub(super) fn active_consumer(&self) -> Option<Arc<str>> {
        if !self.single_active_consumer {
            return None;
        }
        self.lock()
            .consumers
            .first()
            .map(|consumer| Arc::clone(&consumer.tag))
    }
}
