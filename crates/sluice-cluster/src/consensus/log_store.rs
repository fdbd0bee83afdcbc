//! A group's Raft log on disk: a segment log whose records are entries and
//! the markers that change what the log holds (truncated after an index,
//! purged through one, committed through one). Appends go through the
//! node's group-commit thread, which writes and fdatasyncs every log of a
//! round at once; openraft hears an append is durable when that round has
//! synced it. The vote lives in a file of its own, replaced atomically and
//! durable before `save_vote` returns.
//!
//! Entries are also kept in memory, by index: a group's log is bounded by
//! its snapshots (openraft purges what a snapshot covers).

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::io::Write;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sluice_store::group_commit::{GroupCommit, LogBuffer, Sequence};
use sluice_store::log::SegmentLog;

use super::types::{Entry, LogId, TypeConfig, Vote};

const KIND_ENTRY: u8 = 1;
/// The log keeps entries through this index (None: none) and drops the rest.
const KIND_TRUNCATE: u8 = 2;
/// Entries through this log id are gone (a snapshot covers them).
const KIND_PURGE: u8 = 3;
/// Entries through this log id are committed.
const KIND_COMMITTED: u8 = 4;

/// Segments of a group's log: small, so that purged ones are deleted soon.
const SEGMENT_BYTES_MAX: u64 = 8 * 1024 * 1024;

const VOTE_FILE: &str = "vote";

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut bytes = Vec::new();
    ciborium::into_writer(value, &mut bytes).expect("encoding into memory cannot fail");
    bytes
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> io::Result<T> {
    ciborium::from_reader(bytes)
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error.to_string()))
}

fn failed_log() -> io::Error {
    io::Error::other("the raft log failed earlier and takes no more writes")
}

fn store_error(error: sluice_store::StoreError) -> io::Error {
    io::Error::other(error.to_string())
}

/// What the log holds, as recovery and appends leave it.
#[derive(Default)]
struct LogContents {
    entries: BTreeMap<u64, Entry>,
    /// For each entry, the segment it was written to: segments wholly
    /// before the first kept entry can go.
    segments: BTreeMap<u64, u64>,
    last_purged: Option<LogId>,
    committed: Option<LogId>,
}

impl LogContents {
    fn truncate_after(&mut self, keep_through: Option<u64>) {
        let first_dropped = keep_through.map_or(0, |index| index + 1);
        self.entries.split_off(&first_dropped);
        self.segments.split_off(&first_dropped);
    }

    fn purge(&mut self, through: LogId) {
        let first_kept = through.index + 1;
        self.entries = self.entries.split_off(&first_kept);
        self.segments = self.segments.split_off(&first_kept);
        if self
            .last_purged
            .as_ref()
            .is_none_or(|purged| purged.index < through.index)
        {
            self.last_purged = Some(through);
        }
    }

    /// Replays one record found at recovery.
    fn replay(&mut self, kind: u8, segment: u64, payload: &[u8]) -> io::Result<()> {
        match kind {
            KIND_ENTRY => {
                let entry: Entry = decode(payload)?;
                let index = entry.index();
                self.truncate_after(index.checked_sub(1));
                self.entries.insert(index, entry);
                self.segments.insert(index, segment);
            }
            KIND_TRUNCATE => self.truncate_after(decode(payload)?),
            KIND_PURGE => self.purge(decode(payload)?),
            KIND_COMMITTED => self.committed = decode(payload)?,
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unknown raft log record kind {other}"),
                ))
            }
        }
        Ok(())
    }
}

struct Shared {
    contents: Mutex<LogContents>,
    buffer: Arc<LogBuffer>,
    wal: Arc<GroupCommit>,
    /// Appends waiting for their round's fsync, in append order.
    waiting: Mutex<VecDeque<(Sequence, IOFlushed<TypeConfig>)>>,
    vote_path: PathBuf,
    vote: Mutex<Option<Vote>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    /// Tells openraft about every append its round made durable (or that
    /// will never be, when the log failed).
    fn complete_synced(&self) {
        let failed = self.buffer.has_failed();
        let mut waiting = lock(&self.waiting);
        while let Some((sequence, _)) = waiting.front() {
            if !failed && !self.buffer.is_synced(*sequence) {
                break;
            }
            let (_, callback) = waiting.pop_front().expect("a front entry");
            if failed {
                callback.io_completed(Err(io::Error::other("the raft log failed to write")));
            } else {
                callback.io_completed(Ok(()));
            }
        }
        // A round that signals may have been one that took only earlier
        // appends; the round that syncs those still waiting must signal too.
        if !waiting.is_empty() {
            self.buffer.request_written_signal();
        }
    }

    /// Appends a record, durable with the next round.
    fn append(&self, kind: u8, payload: &[u8]) -> io::Result<(u64, Sequence)> {
        let (location, sequence) = self
            .buffer
            .append(&self.wal, kind, &[payload])
            .ok_or_else(failed_log)?;
        Ok((location.segment, sequence))
    }

    /// Appends a record that needs no fsync of its own: written with the
    /// next round, on disk with the next fsync of the log.
    fn append_unsynced(&self, kind: u8, payload: &[u8]) -> io::Result<()> {
        self.buffer
            .append_unsynced(&self.wal, kind, &[payload])
            .ok_or_else(failed_log)?;
        Ok(())
    }
}

/// The log of one group; cheap to clone (openraft asks for readers).
#[derive(Clone)]
pub struct LogStore {
    shared: Arc<Shared>,
}

impl LogStore {
    /// Opens (or creates) the log in `dir` and replays it.
    pub fn open(dir: &Path, wal: Arc<GroupCommit>) -> io::Result<LogStore> {
        std::fs::create_dir_all(dir)?;
        let mut contents = LogContents::default();
        let mut replay_error = None;
        let log = SegmentLog::recover(&dir.join("log"), |record| {
            if replay_error.is_none() {
                if let Err(error) = contents.replay(record.kind, record.segment, record.payload) {
                    replay_error = Some(error);
                }
            }
        })
        .map_err(store_error)?;
        if let Some(error) = replay_error {
            return Err(error);
        }
        let vote_path = dir.join(VOTE_FILE);
        let vote = match std::fs::read(&vote_path) {
            Ok(bytes) => Some(decode(&bytes)?),
            Err(error) if error.kind() == io::ErrorKind::NotFound => None,
            Err(error) => return Err(error),
        };
        let buffer = LogBuffer::new(log, SEGMENT_BYTES_MAX);
        let shared = Arc::new(Shared {
            contents: Mutex::new(contents),
            buffer: Arc::clone(&buffer),
            wal,
            waiting: Mutex::new(VecDeque::new()),
            vote_path,
            vote: Mutex::new(vote),
        });
        let weak = Arc::downgrade(&shared);
        buffer.set_written_signal(Box::new(move || {
            if let Some(shared) = weak.upgrade() {
                shared.complete_synced();
            }
        }));
        Ok(LogStore { shared })
    }

    /// Deletes segments that hold only purged entries.
    fn drop_purged_segments(&self) -> io::Result<()> {
        let first_needed = {
            let contents = lock(&self.shared.contents);
            contents.segments.values().next().copied()
        };
        let before = first_needed.unwrap_or_else(|| self.shared.buffer.head_segment());
        self.shared
            .buffer
            .remove_segments_before(before)
            .map_err(store_error)?;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let contents = lock(&self.shared.contents);
        Ok(contents
            .entries
            .range(range)
            .map(|(_, entry)| entry.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(*lock(&self.shared.vote))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let contents = lock(&self.shared.contents);
        let last_purged_log_id = contents.last_purged;
        let last_log_id = contents
            .entries
            .values()
            .next_back()
            .map(|entry| entry.log_id())
            .or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    /// Written beside the log, replaced atomically, and synced with its
    /// directory before returning: a vote must never be forgotten.
    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let path = &self.shared.vote_path;
        let temporary = path.with_extension("tmp");
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(&encode(vote))?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)?;
        if let Some(dir) = path.parent() {
            sluice_store::sync_dir(dir).map_err(store_error)?;
        }
        *lock(&self.shared.vote) = Some(*vote);
        Ok(())
    }

    /// Recorded with the next round, without an fsync of its own: losing
    /// the last one in a crash only means the restarted node learns it
    /// from the leader (or, alone, commits its log again as leader).
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        self.shared
            .append_unsynced(KIND_COMMITTED, &encode(&committed))?;
        lock(&self.shared.contents).committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(lock(&self.shared.contents).committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + Send,
    {
        let mut last_sequence = None;
        {
            let mut contents = lock(&self.shared.contents);
            for entry in entries {
                let (segment, sequence) = self.shared.append(KIND_ENTRY, &encode(&entry))?;
                let index = entry.index();
                contents.segments.insert(index, segment);
                contents.entries.insert(index, entry);
                last_sequence = Some(sequence);
            }
        }
        match last_sequence {
            None => callback.io_completed(Ok(())),
            Some(sequence) => {
                lock(&self.shared.waiting).push_back((sequence, callback));
                // Asked for before looking: a round that ends after the
                // look signals, one that ended before it is seen by it.
                self.shared.buffer.request_written_signal();
                self.shared.complete_synced();
            }
        }
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let keep_through = last_log_id.map(|log_id| log_id.index);
        self.shared.append(KIND_TRUNCATE, &encode(&keep_through))?;
        lock(&self.shared.contents).truncate_after(keep_through);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.shared.append(KIND_PURGE, &encode(&log_id))?;
        let committed = {
            let mut contents = lock(&self.shared.contents);
            contents.purge(log_id);
            contents.committed
        };
        // Segments about to go may hold the last commit record: write it
        // again after the purge record.
        self.shared
            .append_unsynced(KIND_COMMITTED, &encode(&committed))?;
        self.drop_purged_segments()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::EntryPayload;

    use super::super::types::Command;

    fn entry(term: u64, index: u64) -> Entry {
        openraft::Entry {
            log_id: LogId::new(
                openraft::impls::leader_id_adv::LeaderId { term, node_id: 1 },
                index,
            ),
            payload: EntryPayload::Normal(Command(vec![index as u8; 3])),
        }
    }

    #[test]
    fn log_contents_replay_truncates_purges_and_overwrites() {
        let mut contents = LogContents::default();
        for index in 1..=5 {
            contents
                .replay(KIND_ENTRY, 1, &encode(&entry(1, index)))
                .unwrap();
        }
        // A new leader's entry at 4 replaces 4 and drops 5.
        contents
            .replay(KIND_ENTRY, 2, &encode(&entry(2, 4)))
            .unwrap();
        assert_eq!(
            contents.entries.keys().copied().collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        assert_eq!(contents.entries[&4].log_id.leader_id.term, 2);
        contents
            .replay(KIND_TRUNCATE, 2, &encode(&Some(3u64)))
            .unwrap();
        assert_eq!(
            contents.entries.keys().copied().collect::<Vec<_>>(),
            [1, 2, 3]
        );
        contents
            .replay(KIND_PURGE, 2, &encode(&entry(1, 2).log_id))
            .unwrap();
        assert_eq!(contents.entries.keys().copied().collect::<Vec<_>>(), [3]);
        assert_eq!(contents.last_purged.map(|id| id.index), Some(2));
        contents
            .replay(KIND_COMMITTED, 2, &encode(&Some(entry(1, 3).log_id)))
            .unwrap();
        assert_eq!(contents.committed.map(|id| id.index), Some(3));
        assert!(contents.replay(99, 2, &[]).is_err());
    }
}
