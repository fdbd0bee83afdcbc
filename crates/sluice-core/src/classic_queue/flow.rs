//! Flow control of a classic queue: when it counts as congested, so that
//! the connections publishing into it pause, and when it stops.

use std::sync::atomic::Ordering;

use super::state::QueueState;
use super::{
    ClassicQueue, FLOW_BACKLOG_BYTES, FLOW_BACKLOG_MESSAGES, PRIORITY_QUEUE_READY_BYTES_MAX,
    PRIORITY_QUEUE_READY_MESSAGES_MAX,
};

impl ClassicQueue {
    /// Re-evaluates congestion after the backlog, the consumers or the
    /// journal's unwritten bytes changed. A queue is congested while its
    /// backlog grows faster than consumers drain it, or while the disk is
    /// behind with its journal.
    pub(super) fn update_congestion(&self, state: &mut QueueState) {
        let backlog = (state.ready_count() as u64, state.ready_bytes);
        if state.consumers.is_empty() {
            state.flow_floor = backlog;
        } else {
            state.lower_flow_floor();
        }
        let floor = state.flow_floor;
        let unwritten = state
            .journal
            .as_ref()
            .map_or(0, |journal| journal.unwritten_bytes());
        let unwritten_max = self
            .storage
            .as_ref()
            .map_or(u64::MAX, |storage| storage.settings.unwritten_bytes_max);
        let group = self.storage.as_ref().map(|storage| &storage.group);
        let priority = state.ready.is_priority();
        if !self.is_congested() {
            let flow_over = !state.consumers.is_empty()
                && (backlog.0 > floor.0 + FLOW_BACKLOG_MESSAGES as u64
                    || backlog.1 > floor.1 + FLOW_BACKLOG_BYTES);
            // The node's journals together hold too much unwritten: every
            // queue adding to it pauses, not just the largest.
            let budget_over =
                unwritten > 0 && group.is_some_and(|group| group.is_over_write_budget());
            let store_over = unwritten > unwritten_max || budget_over;
            let memory_over = priority
                && (backlog.0 > PRIORITY_QUEUE_READY_MESSAGES_MAX as u64
                    || backlog.1 > PRIORITY_QUEUE_READY_BYTES_MAX);
            if (flow_over || store_over || memory_over) && !self.is_deleted() {
                self.congested.store(true, Ordering::Release);
                if unwritten > unwritten_max {
                    self.request_written_signal(state);
                }
                if budget_over {
                    self.request_budget_signal(state);
                }
            }
        } else {
            let flow_drained = state.consumers.is_empty()
                || (backlog.0 <= floor.0 + FLOW_BACKLOG_MESSAGES as u64 / 2
                    && backlog.1 <= floor.1 + FLOW_BACKLOG_BYTES / 2);
            let budget_drained = group.is_none_or(|group| group.is_write_budget_drained());
            let store_drained = unwritten <= unwritten_max / 2 && budget_drained;
            let memory_drained = !priority
                || (backlog.0 <= PRIORITY_QUEUE_READY_MESSAGES_MAX as u64 / 2
                    && backlog.1 <= PRIORITY_QUEUE_READY_BYTES_MAX / 2);
            if (flow_drained && store_drained && memory_drained) || self.is_deleted() {
                self.congested.store(false, Ordering::Release);
                self.uncongested.notify_waiters();
            } else {
                if unwritten > unwritten_max / 2 {
                    self.request_written_signal(state);
                }
                if !budget_drained {
                    self.request_budget_signal(state);
                }
            }
        }
    }

    /// Asks the sync thread to re-evaluate this queue's congestion once the
    /// node's unwritten total is back under half the write budget.
    pub(super) fn request_budget_signal(&self, state: &mut QueueState) {
        let Some(storage) = self.storage.as_ref() else {
            return;
        };
        if state.budget_signal_requested {
            return;
        }
        state.budget_signal_requested = true;
        let queue = self.this.clone();
        storage.group.when_write_budget_drained(Box::new(move || {
            if let Some(queue) = queue.upgrade() {
                let mut state = queue.lock();
                state.budget_signal_requested = false;
                queue.update_congestion(&mut state);
            }
        }));
    }

    /// Asks the sync thread to tell this queue when it wrote the journal's
    /// buffer, so that publishers paused for the disk resume.
    pub(super) fn request_written_signal(&self, state: &mut QueueState) {
        let Some(journal) = state.journal.as_ref() else {
            return;
        };
        if !state.written_signal_set {
            let queue = self.this.clone();
            journal.log().set_written_signal(Box::new(move || {
                if let Some(queue) = queue.upgrade() {
                    let mut state = queue.lock();
                    queue.update_congestion(&mut state);
                }
            }));
            state.written_signal_set = true;
        }
        journal.log().request_written_signal();
    }
}
