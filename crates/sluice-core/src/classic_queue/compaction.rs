//! Compaction of a classic queue's journal: a few live messages pinning a
//! run of old segments are moved forward so the run can be deleted.

use std::sync::Arc;

use super::ClassicQueue;
use crate::queue_journal::QueueJournal;

/// How long compaction waits for its moved copies to be synced before it
/// leaves the old segments for a later pass.
const COMPACTION_SYNC_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(30);

impl ClassicQueue {
    /// Moves the live messages out of a run of sparse old segments so the
    /// run can be deleted. Scanning happens off the lock; moving is a copy
    /// into the journal's buffer under it.
    pub(super) fn compact(&self) {
        let (segments, log) = {
            let state = self.lock();
            let Some(journal) = state.journal.as_ref() else {
                return;
            };
            if !journal.wants_compaction() {
                return;
            }
            (journal.compaction_segments(), Arc::clone(journal.log()))
        };
        let mut moved = 0;
        for segment in segments {
            let found = match QueueJournal::scan_messages(&log, segment) {
                Ok(Some(found)) => found,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(queue = %self.name, segment, %error, "cannot scan a segment for compaction");
                    continue;
                }
            };
            let mut state = self.lock();
            let Some(journal) = state.journal.as_mut() else {
                return;
            };
            let live: Vec<_> = found
                .into_iter()
                .filter(|found| journal.is_live(found))
                .map(|found| found.detach())
                .collect();
            moved += journal.relocate(live);
        }
        let waits_for = self
            .lock()
            .journal
            .as_ref()
            .and_then(|journal| journal.reclaim_waits_for());
        if let Some(sequence) = waits_for {
            // The old copies go only once the moved ones are durable.
            let deadline = std::time::Instant::now() + COMPACTION_SYNC_WAIT_MAX;
            while !log.is_synced(sequence) && !log.is_lost(sequence) {
                if std::time::Instant::now() > deadline {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        if let Some(journal) = self.lock().journal.as_mut() {
            journal.reclaim(true);
        }
        if moved > 0 {
            tracing::info!(queue = %self.name, moved, "compacted the journal: moved live messages out of old segments");
        }
    }
}
