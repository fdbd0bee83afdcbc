//! Paged messages of a classic queue coming back: read ahead by the pager
//! into the in-memory window as consumers drain it, or read directly.

use std::sync::Arc;

use super::state::QueueState;
use super::{ClassicQueue, CONSUMERLESS_WINDOW_DIVISOR};
use crate::dead_letter::{DeadLetter, DeathReason};
use crate::expiry::NEVER;
use crate::message::{Message, QueuedMessage};
use crate::pager::{PagerWork, QueueStorage};
use crate::paging::PagedMessage;
use crate::queue_journal::read_message;
use sluice_store::group_commit::Location;

/// Paged references a drained queue keeps room for (24 bytes each).
const PAGED_CAPACITY_KEPT: usize = 4096;

/// The read-ahead window a queue may hold in memory now, in messages and
/// body bytes. A queue nobody consumes from keeps only a sliver: hundreds of
/// such queues filling at once would otherwise hold hundreds of windows (the
/// pager fills the whole window once consumers come). Every queue keeps only
/// the sliver while all queues together hold the node's read-ahead budget.
pub(super) fn resident_window(storage: &QueueStorage, has_consumers: bool) -> (usize, u64) {
    let settings = &storage.settings;
    let node_over = storage.resident.bytes() > settings.resident_total_max;
    let divisor = if has_consumers && !node_over {
        1
    } else {
        CONSUMERLESS_WINDOW_DIVISOR
    };
    (
        settings.resident_messages_max / divisor,
        settings.resident_bytes_max / divisor as u64,
    )
}

impl QueuedMessage {
    /// A paged message back in memory, read from its journal record.
    pub(super) fn read_back(paged: PagedMessage, message: Message, expires_at_us: u64) -> Self {
        QueuedMessage {
            offset: paged.offset,
            message: Arc::new(message),
            redelivered: paged.redelivered(),
            segment: Some(paged.segment()),
            expires_at_us,
        }
    }
}

impl ClassicQueue {
    /// Asks the pager to read paged messages back once the in-memory window
    /// is half empty and consumers wait for them.
    ///
    /// The window is the one [`Self::page_in`] fills (smaller while the
    /// node is over its read-ahead budget), and the head must be one it
    /// would read: asking for a read it refuses would keep the pager
    /// thread spinning on this queue.
    pub(super) fn read_ahead_if_low(&self, state: &mut QueueState) {
        let Some(storage) = self.storage.as_ref() else {
            return;
        };
        if state.consumers.is_empty() {
            return;
        }
        let (window, bytes_max) = resident_window(storage, true);
        let resident = state.resident_bytes.get();
        let low = state.ready.len() < window / 2 && resident < bytes_max / 2;
        let head_fits = state
            .paged
            .front()
            .is_some_and(|head| resident == 0 || resident + head.body_size as u64 <= bytes_max);
        if low && head_fits {
            self.request_pager(state);
        }
    }

    pub(super) fn request_pager(&self, state: &mut QueueState) {
        if state.pager_requested || self.is_deleted() {
            return;
        }
        if let Some(storage) = self.storage.as_ref() {
            state.pager_requested = true;
            storage.pager.request(self.arc() as Arc<dyn PagerWork>);
        }
    }

    /// Removes the paged head for good (expired, or over a length limit),
    /// dead-lettering it when the queue has a dead-letter exchange, which
    /// reads its body back. False when nothing is paged.
    pub(super) fn discard_paged_head(&self, state: &mut QueueState, reason: DeathReason) -> bool {
        let Some((paged, _)) = state.pop_paged() else {
            return false;
        };
        state.ready_bytes -= paged.body_size as u64;
        if state.rules.dead_letter.is_some() {
            if let Some(message) = self.read_paged(state, &paged) {
                state.dead_letters.push(DeadLetter {
                    message: Arc::new(message),
                    reason,
                });
            }
        }
        state.forget_paged([&paged]);
        state.counts.add(|counts| &mut counts.dropped, 1);
        true
    }

    /// Reads every paged message of a priority queue back into its level,
    /// under the lock: basic.get on a recovered priority queue answers with
    /// the highest priority, not the oldest message. A priority queue pages
    /// nothing itself, so these are messages recovered from its journal,
    /// which the pager would read back for consumers anyway.
    pub(super) fn read_back_recovered(&self, state: &mut QueueState) {
        while let Some((paged, expires_at_us)) = state.pop_paged() {
            match self.read_paged(state, &paged) {
                Some(message) => {
                    state.resident_bytes.add(paged.body_size as u64);
                    state.ready.push_read_back(QueuedMessage::read_back(
                        paged,
                        message,
                        expires_at_us,
                    ));
                }
                None => {
                    state.ready_bytes -= paged.body_size as u64;
                    state.forget_paged([&paged]);
                }
            }
        }
    }

    /// Reads a paged message back; None (logged) when the disk fails it.
    pub(super) fn read_paged(&self, state: &QueueState, paged: &PagedMessage) -> Option<Message> {
        let journal = state.journal.as_ref()?;
        let location = journal.resolve(paged.offset, paged.location());
        match read_moved_or_original(journal.log(), paged, location) {
            Ok(message) => Some(message),
            Err(error) => {
                tracing::error!(queue = %self.name, offset = paged.offset, %error, "a paged message cannot be read back; it is dropped");
                None
            }
        }
    }

    /// The pager's work for this queue: read paged messages back into the
    /// window while consumers wait for them, then compact the journal if a
    /// run of old segments is pinned by a few live messages.
    pub(super) fn pager_work(&self) {
        self.page_in();
        self.compact();
        let mut state = self.lock();
        state.pager_requested = false;
        // Anything that came up while the pager worked is picked up here,
        // under the same lock that requests it.
        if !state.paged.is_empty() {
            self.read_ahead_if_low(&mut state);
        }
        let wants_compaction = state
            .journal
            .as_ref()
            .is_some_and(|journal| journal.wants_compaction());
        if wants_compaction && !state.pager_requested {
            self.request_pager(&mut state);
        }
    }

    pub(super) fn page_in(&self) {
        let Some(storage) = self.storage.as_ref() else {
            return;
        };
        loop {
            // Copy out what to read, under the lock.
            let Some((batch, log)) = self.read_ahead_batch(storage) else {
                return;
            };
            // Read without it: publishers keep appending meanwhile.
            let read: Vec<_> = batch
                .iter()
                .map(|(paged, location)| read_moved_or_original(&log, paged, *location))
                .collect();
            let mut state = self.lock();
            self.hand_over_read(&mut state, &batch, read);
            self.deliver_ready(&mut state);
            self.unlock(state);
        }
    }

    /// The paged references to read next and the log to read them from,
    /// copied out under the lock; None when there is nothing to read: no
    /// room in the window, no consumer, nothing paged.
    #[allow(clippy::type_complexity)]
    fn read_ahead_batch(
        &self,
        storage: &QueueStorage,
    ) -> Option<(Vec<(PagedMessage, Location)>, Arc<sluice_store::LogBuffer>)> {
        let state = self.lock();
        // A priority queue reads all of its paged messages (recovered ones:
        // it never pages) back, window or not.
        let (window, bytes_max) = if state.ready.is_priority() {
            (usize::MAX, u64::MAX)
        } else {
            resident_window(storage, !state.consumers.is_empty())
        };
        let room = window
            .saturating_sub(state.ready.len())
            .min(storage.settings.read_batch_messages());
        let journal = state.journal.as_ref()?;
        if room == 0
            || state.paged.is_empty()
            || state.consumers.is_empty()
            || self.is_deleted()
            || state.resident_bytes.get() >= bytes_max
        {
            return None;
        }
        let mut bytes = state.resident_bytes.get();
        let batch: Vec<(PagedMessage, Location)> = state
            .paged
            .iter()
            .take(room)
            .take_while(|paged| {
                bytes += paged.body_size as u64;
                bytes <= bytes_max || bytes == paged.body_size as u64
            })
            .map(|paged| (*paged, journal.resolve(paged.offset, paged.location())))
            .collect();
        (!batch.is_empty()).then(|| (batch, Arc::clone(journal.log())))
    }

    /// Puts what was read back into the window, in order. Only what is
    /// still wanted: a purge or a basic.get may have taken some of the
    /// batch meanwhile.
    fn hand_over_read(
        &self,
        state: &mut QueueState,
        batch: &[(PagedMessage, Location)],
        read: Vec<Result<Message, sluice_store::StoreError>>,
    ) {
        for ((paged, _), message) in batch.iter().zip(read) {
            match state.paged.front() {
                Some(front) if front.offset == paged.offset => {}
                _ => continue,
            }
            let expires_at_us = state.pop_paged().map_or(NEVER, |(_, deadline)| deadline);
            match message {
                Ok(message) => {
                    state.resident_bytes.add(paged.body_size as u64);
                    state.ready.push_read_back(QueuedMessage::read_back(
                        *paged,
                        message,
                        expires_at_us,
                    ));
                }
                Err(error) => {
                    tracing::error!(queue = %self.name, offset = paged.offset, %error, "a paged message cannot be read back; it is dropped");
                    state.ready_bytes -= paged.body_size as u64;
                    state.forget_paged([paged]);
                }
            }
        }
        // A queue that was deep gives its reference memory back as it
        // drains.
        if state.paged.capacity() > PAGED_CAPACITY_KEPT
            && state.paged.capacity() > 4 * state.paged.len()
        {
            let keep = (2 * state.paged.len()).max(PAGED_CAPACITY_KEPT);
            state.paged.shrink_to(keep);
        }
    }
}

/// Reads a paged message at `location`, where compaction may have moved
/// it; if that copy cannot be read (it died with a failed write, which
/// keeps the old segments), from where it was written first.
fn read_moved_or_original(
    log: &sluice_store::LogBuffer,
    paged: &PagedMessage,
    location: Location,
) -> Result<Message, sluice_store::StoreError> {
    read_message(log, location).or_else(|error| {
        if location == paged.location() {
            Err(error)
        } else {
            read_message(log, paged.location())
        }
    })
}
