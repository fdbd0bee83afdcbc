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
use crate::queue_journal::{Durability, QueueJournal};
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
        if self.refuses_for_length(&state, body_size) {
            if state.rules.limits.overflow == Overflow::RejectPublishDlx {
                let target = state.rules.dead_letter.clone();
                drop(state);
                self.send_dead_letters(
                    target,
                    vec![DeadLetter {
                        message,
                        reason: DeathReason::Maxlen,
                    }],
                );
            }
            return PublishOutcome::Rejected;
        }
        let offset = state.next_offset;
        state.next_offset += 1;
        let expires_at_us = self.deadline_of_new(&mut state, &message, offset);
        let Ok((written_at, durability)) =
            self.journal_if_persistent(&mut state, &message, offset, expires_at_us)
        else {
            state.publishing = None;
            return PublishOutcome::Rejected;
        };
        state.ready_bytes += body_size;
        state.counts.count_publish(body_size as usize);
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
        self.after_publish(&mut state);
        self.unlock(state);
        match durability {
            Some(durability) => PublishOutcome::Pending(PendingSafety::Journal(durability)),
            None => PublishOutcome::Enqueued,
        }
    }

    /// Whether a new message of `body_size` bytes is refused for the
    /// queue's length limits (`reject-publish`, `reject-publish-dlx`).
    fn refuses_for_length(&self, state: &QueueState, body_size: u64) -> bool {
        if !state.rules.limits.is_limited() || state.rules.limits.overflow == Overflow::DropHead {
            return false;
        }
        let length_after = state.ready_count() as u64 + 1;
        let bytes_after = state.ready_bytes + body_size;
        state.rules.limits.exceeded(length_after, bytes_after)
    }

    /// A new message's deadline. One branch for a queue without TTL and a
    /// message without expiration; the clock is read only past it. A
    /// message with a deadline is marked as being published: its TTL starts
    /// once it was offered to the consumers waiting.
    fn deadline_of_new(&self, state: &mut QueueState, message: &Message, offset: u64) -> u64 {
        if !state.rules.expiry.has_message_ttl() && message.properties.expiration().is_none() {
            return NEVER;
        }
        let deadline = state.rules.expiry.deadline_of(message, now_us());
        if deadline != NEVER {
            state.deadlines = true;
            state.publishing = Some(offset);
        }
        deadline
    }

    /// Journals a persistent message entering a durable queue: where it was
    /// written and the ticket that tells when it is on disk. Err when the
    /// journal failed: the message cannot be made durable.
    fn journal_if_persistent(
        &self,
        state: &mut QueueState,
        message: &Message,
        offset: u64,
        expires_at_us: u64,
    ) -> Result<(Option<Location>, Option<Durability>), ()> {
        if !message.properties.is_persistent() {
            return Ok((None, None));
        }
        let Some(journal) = state
            .journal
            .as_mut()
            .filter(|journal| journal.is_durable())
        else {
            return Ok((None, None));
        };
        // Saved as wall-clock time: the TTL keeps counting while the node
        // is down.
        let wall_deadline_ms = (expires_at_us != NEVER).then(|| wall_ms_of(expires_at_us));
        match journal.append_message(offset, message, wall_deadline_ms) {
            Some((location, ticket)) => Ok((Some(location), Some(ticket))),
            None => Err(()),
        }
    }

    /// What follows a publish, under the same lock: drop-head limits, the
    /// head's TTL, and congestion.
    fn after_publish(&self, state: &mut QueueState) {
        if state.rules.limits.is_limited() && state.rules.limits.overflow == Overflow::DropHead {
            self.drop_head_over_limits(state);
        }
        // Offered to the waiting consumers: from here its TTL applies. Left
        // set, it would keep this message from ever expiring once requeued.
        state.publishing = None;
        if state.deadlines {
            self.expire_head(state);
            let head_deadline = state.head_deadline();
            self.schedule_timer(state, head_deadline);
        }
        self.update_congestion(state);
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
        while state
            .rules
            .limits
            .exceeded(state.ready_count() as u64, state.ready_bytes)
        {
            if let Some(dropped) = state.take_resident() {
                state.forget([&dropped]);
                state.counts.add(|counts| &mut counts.dropped, 1);
                if state.rules.dead_letter.is_some() {
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
