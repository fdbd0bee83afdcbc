//! The state of a classic queue, behind its lock.

use std::collections::VecDeque;
use std::sync::Arc;

use super::rules::QueueRules;
use super::unacked::Unacked;
use crate::counters::MessageCounts;
use crate::dead_letter::DeadLetter;
use crate::expiry::NEVER;
use crate::message::QueuedMessage;
use crate::paging::{PagedMessage, ResidentBytes};
use crate::queue::Consumer;
use crate::queue_journal::QueueJournal;
use crate::ready::ReadyMessages;

#[derive(Default)]
pub(super) struct QueueState {
    /// Limits, TTL, expiry and dead-lettering: under the lock, since a
    /// policy change replaces them while the queue runs.
    pub(super) rules: QueueRules,
    /// The head of the ready messages, in memory, in delivery order:
    /// priority first in a priority queue, then offset.
    pub(super) ready: ReadyMessages,
    /// The rest of them, bodies on disk, all after those in `ready`.
    pub(super) paged: VecDeque<PagedMessage>,
    /// Body bytes of every ready message, paged or not.
    pub(super) ready_bytes: u64,
    /// Body bytes of the ready messages in memory.
    pub(super) resident_bytes: ResidentBytes,
    pub(super) next_offset: u64,
    /// Delivered to consumers or fetched with basic.get, not yet settled,
    /// by offset: the queue's until a channel settles them by id.
    pub(super) unacked: Unacked,
    /// Sorted by priority, highest first; registration order within one.
    /// In a single-active-consumer queue, the active consumer first and
    /// the waiting ones after it in registration order, priorities aside.
    pub(super) consumers: Vec<Arc<Consumer>>,
    /// Rotates deliveries among consumers of equal priority.
    pub(super) round_robin: usize,
    /// Auto-delete queues go when their last consumer goes, but only once
    /// they have had one (RabbitMQ semantics).
    pub(super) had_consumer: bool,
    /// Durable queues journal their persistent messages; any queue pages
    /// into one (a non-durable queue's is created when it first pages).
    pub(super) journal: Option<QueueJournal>,
    /// The pager has this queue in its work list.
    pub(super) pager_requested: bool,
    /// The sync thread tells this queue when its journal's buffer is written.
    pub(super) written_signal_set: bool,
    /// Waiting for the node's write budget to drain (see
    /// `request_budget_signal`).
    pub(super) budget_signal_requested: bool,
    /// The backlog's lowest point (messages, bytes) since consumers came:
    /// flow control measures growth from here.
    pub(super) flow_floor: (u64, u64),
    /// Deadlines of the paged messages, one for each entry of `paged`, or
    /// empty while no paged message has one. Kept beside `paged` rather
    /// than in [`PagedMessage`], so a queue without TTL pays nothing for
    /// them, and the head's deadline is known without reading its body.
    pub(super) paged_deadlines: VecDeque<u64>,
    /// Some ready message may have a deadline: the head is checked before
    /// it is delivered. Always set in a queue with a message TTL; in any
    /// other, from the first message with an expiration until it empties.
    pub(super) deadlines: bool,
    /// The message being published: its TTL starts once it was offered to
    /// the consumers waiting, so a TTL of 0 still reaches one that waits.
    pub(super) publishing: Option<u64>,
    /// The queue timer's earliest pending wake-up for this queue; 0 when
    /// none is pending.
    pub(super) timer_at_us: u64,
    /// For `x-expires`: when the queue was last used (created, redeclared,
    /// read with basic.get, or left by its last consumer).
    pub(super) used_at_us: u64,
    /// Messages to dead-letter once the lock is released.
    pub(super) dead_letters: Vec<DeadLetter>,
    /// What happened to messages here, for the management API: counted
    /// under the lock the message path holds anyway.
    pub(super) counts: MessageCounts,
}

impl QueueState {
    pub(super) fn ready_count(&self) -> usize {
        self.ready.len() + self.paged.len()
    }

    /// Moves the flow floor down to the backlog when the queue drained
    /// below it.
    pub(super) fn lower_flow_floor(&mut self) {
        let backlog = self.ready_count() as u64;
        self.flow_floor = (
            self.flow_floor.0.min(backlog),
            self.flow_floor.1.min(self.ready_bytes),
        );
    }

    /// Appends a paged reference, with its deadline when it has one.
    pub(super) fn push_paged(&mut self, paged: PagedMessage, expires_at_us: u64) {
        self.paged.push_back(paged);
        if expires_at_us != NEVER || !self.paged_deadlines.is_empty() {
            // The messages paged before this one had no deadline.
            let missing = self.paged.len() - 1 - self.paged_deadlines.len();
            self.paged_deadlines
                .extend(std::iter::repeat_n(NEVER, missing));
            self.paged_deadlines.push_back(expires_at_us);
        }
    }

    /// Takes the oldest paged reference and its deadline.
    pub(super) fn pop_paged(&mut self) -> Option<(PagedMessage, u64)> {
        let paged = self.paged.pop_front()?;
        let expires_at_us = self.paged_deadlines.pop_front().unwrap_or(NEVER);
        Some((paged, expires_at_us))
    }

    /// The deadline of the oldest paged message.
    pub(super) fn paged_head_deadline(&self) -> u64 {
        self.paged_deadlines.front().copied().unwrap_or(NEVER)
    }

    /// The deadline of the head of the queue.
    pub(super) fn head_deadline(&self) -> u64 {
        match self.ready.front() {
            Some(head) => head.expires_at_us,
            None => self.paged_head_deadline(),
        }
    }

    pub(super) fn take_resident(&mut self) -> Option<QueuedMessage> {
        let entry = self.ready.pop_front()?;
        let body_size = entry.message.body_size() as u64;
        self.ready_bytes -= body_size;
        self.resident_bytes.remove(body_size);
        Some(entry)
    }

    /// Paged messages that left the queue for good.
    pub(super) fn forget_paged<'a>(
        &mut self,
        messages: impl IntoIterator<Item = &'a PagedMessage>,
    ) {
        if let Some(journal) = self.journal.as_mut() {
            journal.append_acks(
                messages
                    .into_iter()
                    .map(|paged| (paged.offset, paged.segment())),
            );
        }
    }

    /// Messages that left the queue for good are acked in the journal.
    /// The iterator is always consumed, journal or not.
    pub(super) fn forget<'a>(&mut self, messages: impl IntoIterator<Item = &'a QueuedMessage>) {
        let Some(journal) = self.journal.as_mut() else {
            messages.into_iter().for_each(drop);
            return;
        };
        journal.append_acks(
            messages
                .into_iter()
                .filter_map(|entry| entry.segment.map(|segment| (entry.offset, segment))),
        );
    }
}
