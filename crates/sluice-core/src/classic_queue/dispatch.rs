//! Delivering a classic queue's ready messages: to consumers, by priority
//! and round robin, and to basic.get.

use std::sync::Arc;

use super::state::QueueState;
use super::ClassicQueue;
use crate::counters::DeliveredBy;
use crate::dead_letter::DeathReason;
use crate::expiry::now_us;
use crate::message::QueuedMessage;
use crate::queue::Queue;

impl ClassicQueue {
    /// Delivers ready messages to consumers with room. Sinks call this after
    /// refusing a delivery, once they have room again.
    pub(super) fn dispatch_now(&self) {
        let mut state = self.lock();
        self.dispatch_locked(&mut state);
        self.unlock(state);
    }

    pub(super) fn dispatch_locked(&self, state: &mut QueueState) {
        self.deliver_ready(state);
        if !state.paged.is_empty() {
            self.read_ahead_if_low(state);
        }
        state.lower_flow_floor();
        if self.is_congested() {
            self.update_congestion(state);
        }
    }

    /// Delivers from the head while consumers take messages. Expired heads
    /// go first, so no consumer receives a message past its deadline; a
    /// queue without deadlines pays one branch per message for that.
    pub(super) fn deliver_ready(&self, state: &mut QueueState) {
        if state.ready.is_priority() && !state.paged.is_empty() {
            // Recovered messages of a priority queue wait on disk in offset
            // order: deliver once all are read back, in priority order.
            // Meanwhile they still expire: the oldest is the head of its
            // priority level, and anything published since is resident.
            if state.deadlines {
                let now = now_us();
                while state.paged_head_deadline() <= now
                    && self.discard_paged_head(state, DeathReason::Expired)
                {}
            }
            if !state.paged.is_empty() {
                if !state.consumers.is_empty() {
                    self.request_pager(state);
                }
                if state.deadlines {
                    let paged_head_deadline = state.paged_head_deadline();
                    self.schedule_timer(state, paged_head_deadline);
                }
                return;
            }
        }
        let deadlines = state.deadlines;
        loop {
            if deadlines {
                self.expire_head(state);
            }
            if state.ready.is_empty() || state.consumers.is_empty() || !self.deliver_one(state) {
                break;
            }
        }
        if deadlines {
            let head_deadline = state.head_deadline();
            self.schedule_timer(state, head_deadline);
        }
    }

    /// Offers the head message to the highest-priority consumers first,
    /// round-robin within a priority. Returns false when nobody could take it.
    /// A single-active-consumer queue offers it to its active consumer only.
    pub(super) fn deliver_one(&self, state: &mut QueueState) -> bool {
        let consumer_count = if self.single_active_consumer {
            state.consumers.len().min(1)
        } else {
            state.consumers.len()
        };
        let mut group_start = 0;
        while group_start < consumer_count {
            let priority = state.consumers[group_start].priority;
            let group_len = state.consumers[group_start..consumer_count]
                .iter()
                .take_while(|consumer| consumer.priority == priority)
                .count();
            for step in 0..group_len {
                let index = group_start + (state.round_robin + step) % group_len;
                if !state.consumers[index].has_prefetch_room() {
                    continue;
                }
                // The sink refuses (and hands the message back) when the
                // channel's prefetch, flow or output buffer has no room: one
                // lock of the channel and its outbox per delivery, no
                // separate check beforehand.
                let Some(entry) = state.ready.pop_front() else {
                    return false;
                };
                let body_size = entry.message.body_size() as u64;
                let persisted = entry.segment.map(|segment| (entry.offset, segment));
                let consumer = &state.consumers[index];
                let no_ack = consumer.no_ack;
                // The sink takes a handle to this queue only for a delivery
                // it records: one reference count per message that needs an
                // ack, none for the attempts it refuses.
                let handle = || self.arc() as Arc<dyn Queue>;
                if !consumer.sink.deliver(consumer, &handle, &entry) {
                    state.ready.push_front(entry);
                    continue;
                }
                state.ready_bytes -= body_size;
                state.resident_bytes.remove(body_size);
                state.counts.count_delivery(
                    body_size as usize,
                    entry.redelivered,
                    DeliveredBy::Consume { no_ack },
                );
                if !no_ack {
                    // The queue's until the channel settles it by offset.
                    state.unacked.insert(entry);
                } else if let (Some(persisted), Some(journal)) = (persisted, state.journal.as_mut())
                {
                    // Sent without ack: settled as it leaves.
                    journal.append_acks([persisted]);
                }
                state.round_robin = state.round_robin.wrapping_add(step + 1);
                return true;
            }
            group_start += group_len;
        }
        false
    }

    /// basic.get: the head message and the count left behind it. A paged
    /// head is read from disk here, under the lock: basic.get answers now,
    /// and it is not the path that throughput depends on.
    pub(super) fn get_head(&self, no_ack: bool) -> Option<(QueuedMessage, u32)> {
        let mut state = self.lock();
        if state.rules.expiry.expires_us.is_some() {
            state.used_at_us = now_us();
        }
        if state.ready.is_priority() && !state.paged.is_empty() {
            self.read_back_recovered(&mut state);
        }
        if state.deadlines {
            self.expire_head(&mut state);
        }
        let entry = loop {
            if let Some(entry) = state.take_resident() {
                break Some(entry);
            }
            let Some((paged, expires_at_us)) = state.pop_paged() else {
                break None;
            };
            state.ready_bytes -= paged.body_size as u64;
            match self.read_paged(&state, &paged) {
                Some(message) => {
                    break Some(QueuedMessage::read_back(paged, message, expires_at_us))
                }
                None => state.forget_paged([&paged]),
            }
        };
        let Some(entry) = entry else {
            self.unlock(state);
            return None;
        };
        state.counts.count_delivery(
            entry.message.body_size(),
            entry.redelivered,
            DeliveredBy::Get { no_ack },
        );
        if !no_ack {
            state.unacked.insert(entry.clone());
        } else {
            state.forget([&entry]);
        }
        let remaining = state.ready_count() as u32;
        state.lower_flow_floor();
        if self.is_congested() {
            self.update_congestion(&mut state);
        }
        if state.deadlines {
            let head_deadline = state.head_deadline();
            self.schedule_timer(&mut state, head_deadline);
        }
        self.unlock(state);
        Some((entry, remaining))
    }
}
