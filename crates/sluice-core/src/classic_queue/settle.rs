//! Messages leaving a classic queue: settled by consumers, requeued,
//! purged, or dropped with the queue.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::ClassicQueue;
use crate::dead_letter::{DeadLetter, DeathReason};
use crate::expiry::NEVER;
use crate::queue::{Consumer, MessageId};
use crate::queue_journal::QueueJournal;
use crate::queue_limits::Overflow;

impl ClassicQueue {
    /// Consumers settled these messages: acked (`dead` None), or rejected
    /// without requeue (basic.reject, basic.nack) and dead-lettered for
    /// `dead` when the queue has a dead-letter exchange. Settling freed
    /// prefetch room, so this also delivers what it can: one lock for both.
    /// An id no longer out (the queue was purged or deleted since) is
    /// skipped.
    pub(super) fn settle_with(&self, messages: &[MessageId], dead: Option<DeathReason>) {
        let mut state = self.lock();
        let settled_as = dead;
        let dead = dead.filter(|_| state.rules.dead_letter.is_some());
        for offset in messages {
            let Some(entry) = state.unacked.remove(*offset) else {
                continue;
            };
            state.forget([&entry]);
            match settled_as {
                None => state.counts.add(|counts| &mut counts.acked, 1),
                Some(_) => state.counts.add(|counts| &mut counts.dropped, 1),
            }
            if let Some(reason) = dead {
                state.dead_letters.push(DeadLetter {
                    message: entry.message,
                    reason,
                });
            }
        }
        self.dispatch_locked(&mut state);
        let wants_compaction = state
            .journal
            .as_ref()
            .is_some_and(|journal| journal.wants_compaction());
        if wants_compaction {
            self.request_pager(&mut state);
        }
        self.unlock(state);
    }

    /// Puts messages back at their original positions, marked redelivered,
    /// and delivers them again.
    pub(super) fn requeue_messages(&self, messages: &[MessageId]) {
        let mut state = self.lock();
        let mut requeued = Vec::with_capacity(messages.len());
        for offset in messages {
            let Some(mut entry) = state.unacked.remove(*offset) else {
                continue;
            };
            if self.is_deleted() {
                continue;
            }
            entry.redelivered = true;
            if entry.expires_at_us != NEVER {
                // It keeps the deadline it was published with.
                state.deadlines = true;
            }
            let body_size = entry.message.body_size() as u64;
            state.ready_bytes += body_size;
            state.resident_bytes.add(body_size);
            requeued.push(entry);
        }
        // Back where their offsets place them, all at once: every paged
        // message is newer than a delivered one.
        state.ready.merge_requeued(requeued);
        // Requeued messages count against the limits again, as in
        // RabbitMQ's `requeue_and_run`: the oldest go (dead-lettered where
        // the queue says so) before anything is delivered.
        if state.rules.limits.is_limited() && state.rules.limits.overflow == Overflow::DropHead {
            self.drop_head_over_limits(&mut state);
        }
        self.dispatch_locked(&mut state);
        self.unlock(state);
    }

    /// Drops every ready message; messages out with consumers stay out.
    pub(super) fn purge_ready(&self) -> u32 {
        let mut state = self.lock();
        let purged = state.ready_count() as u32;
        state
            .counts
            .add(|counts| &mut counts.dropped, u64::from(purged));
        let ready = state.ready.take_all();
        state.forget(&ready);
        let paged = std::mem::take(&mut state.paged);
        state.forget_paged(&paged);
        state.paged_deadlines.clear();
        state.ready_bytes = 0;
        state.resident_bytes.clear();
        self.update_congestion(&mut state);
        purged
    }

    /// Marks the queue deleted and empties it. Returns the consumers, whom
    /// the caller notifies with basic.cancel, and the number of ready
    /// messages dropped.
    pub(super) fn mark_deleted(&self) -> (Vec<Arc<Consumer>>, u32) {
        let (consumers, dropped, journal) = self.clear_for_deletion();
        // Outside the queue's lock: destroying takes the log's locks, which
        // the sync thread may hold while it signals this queue, and removes
        // the journal's directory, which can be slow.
        if let Some(journal) = journal {
            journal.destroy();
        }
        (consumers, dropped)
    }

    pub(super) fn clear_for_deletion(&self) -> (Vec<Arc<Consumer>>, u32, Option<QueueJournal>) {
        let mut state = self.lock();
        self.deleted.store(true, Ordering::Release);
        let dropped = state.ready_count() as u32;
        state.ready.clear();
        state.paged.clear();
        state.paged_deadlines.clear();
        state.dead_letters.clear();
        state.unacked.clear();
        state.ready_bytes = 0;
        state.resident_bytes.clear();
        let journal = state.journal.take();
        self.update_congestion(&mut state);
        (std::mem::take(&mut state.consumers), dropped, journal)
    }
}
