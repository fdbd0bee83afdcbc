//! A message entering a classic queue: limits, TTL, the journal, paging.

use std::sync::Arc;

use super::read_ahead::resident_window;
use super::state::QueueState;
use super::ClassicQueue;
use crate::confirm::PendingSafety;
use crate::dead_letter::{DeadLetter, DeathReason};
use crate::expiry::{now_us, wall_ms_of, NEVER};
use crate::message::{Message, QueuedMessage};
use crate::paging::PagedMessage;
use crate::queue::PublishOutcome;
use crate::queue_journal::QueueJournal;
use crate::queue_limits::Overflow;
use sluice_store::group_commit::Location;

impl ClassicQueue {
    /// Appends a message and delivers what consumers can take.
    pub(super) fn publish_message(&self, message: Arc<Message>) -> PublishOutcome {
        let mut state = self.lock();
        if self.is_deleted() {
            // Routed to a queue being deleted: lost with it, as in RabbitMQ.
            return PublishOutcome::Enqueued;
        }
        let body_size = message.body_size() as u64;
        if self.limits.is_limited() && self.limits.overflow != Overflow::DropHead {
            let length_after = state.ready_count() as u64 + 1;
            let bytes_after = state.ready_bytes + body_size;
            if self.limits.exceeded(length_after, bytes_after) {
                if self.limits.overflow == Overflow::RejectPublishDlx && self.dead_letter.is_some()
                {
                    drop(state);
                    self.send_dead_letters(vec![DeadLetter {
                        message,
                        reason: DeathReason::Maxlen,
                    }]);
                }
                return PublishOutcome::Rejected;
            }
        }
        let offset = state.next_offset;
        state.next_offset += 1;
        // One branch for a queue without TTL and a message without
        // expiration; the clock is read only past it.
        let expires_at_us =
            if self.expiry.has_message_ttl() || message.properties.expiration().is_some() {
                let deadline = self.expiry.deadline_of(&message, now_us());
                if deadline != NEVER {
                    state.deadlines = true;
                    state.publishing = Some(offset);
                }
                deadline
            } else {
                NEVER
            };
        let mut durability = None;
        let mut written_at = None;
        if message.properties.is_persistent() {
            if let Some(journal) = state
                .journal
                .as_mut()
                .filter(|journal| journal.is_durable())
            {
                // Saved as wall-clock time: the TTL keeps counting while
                // the node is down.
                let wall_deadline_ms = (expires_at_us != NEVER).then(|| wall_ms_of(expires_at_us));
                match journal.append_message(offset, &message, wall_deadline_ms) {
                    Some((location, ticket)) => {
                        written_at = Some(location);
                        durability = Some(ticket);
                    }
                    // The journal failed: the message cannot be made durable.
                    None => {
                        state.publishing = None;
                        return PublishOutcome::Rejected;
                    }
                }
            }
        }
        state.ready_bytes += body_size;
        self.counters.count_publish(body_size as usize);
        let paged = self
            .page_out_location(&mut state, offset, &message, written_at)
            .map(|location| PagedMessage::new(offset, location, message.body_size(), false));
        match paged {
            Some(paged) => {
                state.push_paged(paged, expires_at_us);
                // A message bigger than the window pages even into an empty
                // queue: an idle consumer would otherwise never be offered
                // it, nor anything published behind it.
                self.read_ahead_if_low(&mut state);
            }
            None => {
                state.resident_bytes.add(body_size);
                state.ready.push_back(QueuedMessage {
                    offset,
                    message,
                    redelivered: false,
                    segment: written_at.map(|location| location.segment),
                    expires_at_us,
                });
                self.dispatch_locked(&mut state);
            }
        }
        if self.limits.is_limited() && self.limits.overflow == Overflow::DropHead {
            self.drop_head_over_limits(&mut state);
        }
        // Offered to the waiting consumers: from here its TTL applies. Left
        // set, it would keep this message from ever expiring once requeued.
        state.publishing = None;
        if state.deadlines {
            self.expire_head(&mut state);
            let head_deadline = state.head_deadline();
            self.schedule_timer(&mut state, head_deadline);
        }
        self.update_congestion(&mut state);
        self.unlock(state);
        match durability {
            Some(durability) => PublishOutcome::Pending(PendingSafety::Journal(durability)),
            None => PublishOutcome::Enqueued,
        }
    }

    /// Where a new message waits on disk when the in-memory window is full
    /// (or earlier messages are already paged: order is kept); None keeps
    /// it in memory. A persistent message of a durable queue is on disk
    /// already; others are written to the journal for the purpose.
    pub(super) fn page_out_location(
        &self,
        state: &mut QueueState,
        offset: u64,
        message: &Message,
        written_at: Option<Location>,
    ) -> Option<Location> {
        let storage = self.storage.as_ref()?;
        if state.ready.is_priority() {
            // Priority queues do not page: see PRIORITY_QUEUE_READY_MESSAGES_MAX.
            return None;
        }
        let (window_messages, window_bytes) = resident_window(storage, !state.consumers.is_empty());
        let window_full = state.ready.len() >= window_messages
            || state.resident_bytes.get() + message.body_size() as u64 > window_bytes;
        if state.paged.is_empty() && !window_full {
            return None;
        }
        if written_at.is_some() {
            return written_at;
        }
        if state.journal.is_none() {
            let dir = storage
                .paging_dir
                .join(format!("{:016x}", rand::random::<u64>()));
            match QueueJournal::create_paging(&dir, Arc::clone(&storage.group), &storage.settings) {
                Ok(journal) => state.journal = Some(journal),
                Err(error) => {
                    tracing::warn!(queue = %self.name, %error, "cannot page messages out; keeping them in memory");
                    return None;
                }
            }
        }
        state.journal.as_mut()?.append_paged(offset, message)
    }

    /// Drops the oldest ready messages until the queue is within its
    /// limits, dead-lettering them (reason `maxlen`) when the queue has a
    /// dead-letter exchange.
    pub(super) fn drop_head_over_limits(&self, state: &mut QueueState) {
        while self
            .limits
            .exceeded(state.ready_count() as u64, state.ready_bytes)
        {
            if let Some(dropped) = state.take_resident() {
                state.forget([&dropped]);
                self.counters.dropped.add(1);
                if self.dead_letter.is_some() {
                    state.dead_letters.push(DeadLetter {
                        message: dropped.message,
                        reason: DeathReason::Maxlen,
                    });
                }
            } else if !self.discard_paged_head(state, DeathReason::Maxlen) {
                break;
            }
        }
    }
}
