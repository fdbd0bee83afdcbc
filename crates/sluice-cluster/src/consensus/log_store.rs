//! A group's Raft log on disk: a segment log whose records are entries and
//! the markers that change what the log holds (truncated after an index,
//! purged through one, committed through one). Each record also goes to the
//! node's write-ahead log ([`super::wal`]), and openraft hears an append is
//! durable when the round that fdatasyncs the WAL has synced it; the group's
//! segments are written behind it, in large pieces, without an fdatasync
//! of their own until a WAL checkpoint.
//! The vote lives in a file of its own, replaced atomically and durable
//! before `save_vote` returns.
//!
//! Memory holds where each entry is, not the entry: a quorum queue's log
//! carries its message bodies, and a deep queue's log is as large as the
//! queue. Entries not yet applied here stay cached too (within a bound),
//! because replication and apply read them next; the rest are read back
//! from their segment when asked for.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::io::Write;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use bytes::Bytes;
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::EntryPayload;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sluice_store::group_commit::{Location, LogBuffer, Sequence};
use sluice_store::log::SegmentLog;
use sluice_store::record::RECORD_HEADER_SIZE;

use super::types::{Entry, LogId, TypeConfig, Vote};
use super::wal::{Waiter, Wal};

const KIND_ENTRY: u8 = 1;
/// The log keeps entries through this index (None: none) and drops the rest.
const KIND_TRUNCATE: u8 = 2;
/// Entries through this log id are gone (a snapshot covers them).
const KIND_PURGE: u8 = 3;
/// Entries through this log id are committed.
const KIND_COMMITTED: u8 = 4;

/// Segments of a group's log: small, so that purged ones are deleted soon.
const SEGMENT_BYTES_MAX: u64 = 8 * 1024 * 1024;

/// Bytes of entries a group keeps cached beyond those it applied: more
/// than a burst of proposals in flight, far less than a deep queue.
const CACHE_BYTES_MAX: usize = 8 * 1024 * 1024;

const VOTE_FILE: &str = "vote";

/// How long closing a log waits for its last records to be written.
const WRITE_OUT_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(10);

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    encode_into(value, Vec::new())
}

/// Encodes into `bytes`, which the caller sized for the value: growing a
/// buffer as large as a batch of messages would copy it several times.
pub fn encode_into<T: Serialize>(value: &T, mut bytes: Vec<u8>) -> Vec<u8> {
    ciborium::into_writer(value, &mut bytes).expect("encoding into memory cannot fail");
    bytes
}

/// Room for an entry's encoding: its command and what surrounds it.
pub fn entry_size_hint(entry: &Entry) -> usize {
    64 + match &entry.payload {
        EntryPayload::Normal(command) => command.0.len(),
        _ => 256,
    }
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

/// An entry as memory knows it: its id, and where its record is.
#[derive(Clone, Copy)]
struct Stored {
    log_id: LogId,
    location: Location,
}

/// What the log holds, as recovery and appends leave it.
#[derive(Default)]
struct LogContents {
    stored: BTreeMap<u64, Stored>,
    /// Entries not applied here yet, and the last applied while within
    /// [`CACHE_BYTES_MAX`], with their encoded sizes.
    cached: BTreeMap<u64, (Entry, usize)>,
    cached_bytes: usize,
    last_purged: Option<LogId>,
    committed: Option<LogId>,
}

impl LogContents {
    /// Records an entry appended after the last one (openraft truncates
    /// a conflicting tail before it appends over it).
    fn insert(&mut self, entry: Entry, location: Location, cache: bool) {
        let index = entry.index();
        self.stored.insert(
            index,
            Stored {
                log_id: entry.log_id(),
                location,
            },
        );
        if cache {
            let size = location.length as usize;
            self.cached.insert(index, (entry, size));
            self.cached_bytes += size;
            while self.cached_bytes > CACHE_BYTES_MAX && self.cached.len() > 1 {
                self.uncache_first();
            }
        }
    }

    fn uncache_first(&mut self) {
        if let Some((_, (_, size))) = self.cached.pop_first() {
            self.cached_bytes -= size;
        }
    }

    /// Entries through `index` were applied: nothing reads them soon.
    fn uncache_through(&mut self, index: u64) {
        while self
            .cached
            .first_key_value()
            .is_some_and(|(first, _)| *first <= index)
        {
            self.uncache_first();
        }
    }

    fn truncate_after(&mut self, keep_through: Option<u64>) {
        let first_dropped = keep_through.map_or(0, |index| index + 1);
        self.stored.split_off(&first_dropped);
        for (_, size) in self.cached.split_off(&first_dropped).into_values() {
            self.cached_bytes -= size;
        }
    }

    fn purge(&mut self, through: LogId) {
        let first_kept = through.index + 1;
        self.stored = self.stored.split_off(&first_kept);
        self.uncache_through(through.index);
        if self
            .last_purged
            .as_ref()
            .is_none_or(|purged| purged.index < through.index)
        {
            self.last_purged = Some(through);
        }
    }

    fn last_log_id(&self) -> Option<LogId> {
        self.stored
            .values()
            .next_back()
            .map(|stored| stored.log_id)
            .or(self.last_purged)
    }

    /// Replays one record found at recovery.
    fn replay(&mut self, kind: u8, location: Location, payload: &[u8]) -> io::Result<()> {
        match kind {
            KIND_ENTRY => {
                // A record written over a tail that a crash kept from being
                // truncated: the later one wins, and what followed it goes.
                let entry: Entry = decode(payload)?;
                self.truncate_after(entry.index().checked_sub(1));
                self.insert(entry, location, false);
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
    wal: Arc<Wal>,
    /// The group's name in the WAL.
    key: Vec<u8>,
    /// The WAL round this group last counted itself into (its pacing).
    wal_round: AtomicU64,
    /// Appends waiting for the WAL round that syncs them, in append order,
    /// with their WAL sequence numbers.
    waiting: Mutex<VecDeque<(Sequence, IOFlushed<TypeConfig>)>>,
    /// Calls `complete_synced`; handed to the WAL while appends wait.
    waiter: OnceLock<Waiter>,
    waiter_handed: AtomicBool,
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
        let mut handed = false;
        loop {
            let failed = self.wal.has_failed() || self.buffer.has_failed();
            let mut waiting = lock(&self.waiting);
            while let Some((sequence, _)) = waiting.front() {
                if !failed && !self.wal.is_synced(*sequence) {
                    break;
                }
                let (_, callback) = waiting.pop_front().expect("a front entry");
                if failed {
                    callback.io_completed(Err(io::Error::other("the raft log failed to write")));
                } else {
                    callback.io_completed(Ok(()));
                }
            }
            if waiting.is_empty() || handed {
                return;
            }
            drop(waiting);
            // Appends still wait: the waiter goes to the WAL (unless it is
            // there already), then one more look. A round that ends after
            // this signals the waiter; one that ended before, and may have
            // been the last for a while, is seen by the look.
            if !self.waiter_handed.swap(true, Ordering::AcqRel) {
                if let Some(waiter) = self.waiter.get() {
                    self.wal.wait(Arc::clone(waiter));
                }
            }
            handed = true;
        }
    }

    /// Appends a record to the group's log and to the WAL: durable once
    /// the WAL's returned sequence is synced. The group's log first, so a
    /// WAL checkpoint that sees this record in the WAL finds it among the
    /// group's appends too.
    fn append(&self, kind: u8, payload: &[u8]) -> io::Result<(Location, Sequence)> {
        let (location, _) = self
            .buffer
            .append_unsynced(self.wal.group_commit(), kind, &[payload])
            .ok_or_else(failed_log)?;
        let sequence = self
            .wal
            .append(&self.key, &self.wal_round, kind, payload)
            .ok_or_else(failed_log)?;
        Ok((location, sequence))
    }

    /// Reads an entry back from its record.
    fn read(&self, location: Location) -> io::Result<Entry> {
        let record = self.buffer.read(location).map_err(store_error)?;
        decode(&record.payload)
    }

    /// Appends a record that needs no fsync of its own, to the group's
    /// log alone: written with the next round, on disk with the next
    /// checkpoint (a crash before it may lose it, which costs nothing).
    fn append_unsynced(&self, kind: u8, payload: &[u8]) -> io::Result<()> {
        self.buffer
            .append_unsynced(self.wal.group_commit(), kind, &[payload])
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
    pub fn open(dir: &Path, wal: Arc<Wal>) -> io::Result<LogStore> {
        std::fs::create_dir_all(dir)?;
        let mut contents = LogContents::default();
        let mut replay_error = None;
        let log = SegmentLog::recover(&dir.join("log"), |record| {
            if replay_error.is_none() {
                let location = Location {
                    segment: record.segment,
                    position: record.position,
                    length: (RECORD_HEADER_SIZE + 1 + record.payload.len()) as u32,
                };
                if let Err(error) = contents.replay(record.kind, location, record.payload) {
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
        let buffer = LogBuffer::with_deferred_writes(log, SEGMENT_BYTES_MAX);
        wal.register_log(&buffer);
        let shared = Arc::new(Shared {
            contents: Mutex::new(contents),
            buffer,
            key: wal.key(dir),
            wal_round: AtomicU64::new(0),
            wal,
            waiting: Mutex::new(VecDeque::new()),
            waiter: OnceLock::new(),
            waiter_handed: AtomicBool::new(false),
            vote_path,
            vote: Mutex::new(vote),
        });
        let weak = Arc::downgrade(&shared);
        let _ = shared.waiter.set(Arc::new(move || {
            if let Some(shared) = weak.upgrade() {
                shared.waiter_handed.store(false, Ordering::Release);
                shared.complete_synced();
            }
        }));
        Ok(LogStore { shared })
    }

    /// Has what the group's segments do not hold yet written to them, and
    /// waits for it (within [`WRITE_OUT_WAIT_MAX`]).
    pub async fn write_out(&self) {
        let buffer = &self.shared.buffer;
        let appended = buffer.last_sequence();
        buffer.write_soon(self.shared.wal.group_commit());
        let deadline = tokio::time::Instant::now() + WRITE_OUT_WAIT_MAX;
        while !buffer.is_synced(appended) && !buffer.has_failed() {
            if tokio::time::Instant::now() > deadline {
                tracing::warn!(dir = %buffer.dir().display(), "a raft log's last records were not written in time; the write-ahead log has them for the next start");
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Entries through `index` were applied here: they leave the cache.
    pub fn applied_through(&self, index: u64) {
        lock(&self.shared.contents).uncache_through(index);
    }

    /// The command of the entry at `index`, read back from the log: None
    /// when the log no longer holds it, or holds no command there.
    ///
    /// # Errors
    /// The entry cannot be read or decoded.
    pub fn read_command(&self, index: u64) -> io::Result<Option<Bytes>> {
        let wanted = {
            let contents = lock(&self.shared.contents);
            match (contents.cached.get(&index), contents.stored.get(&index)) {
                (Some((entry, _)), _) => Ok(entry.clone()),
                (None, Some(stored)) => Err(stored.location),
                (None, None) => return Ok(None),
            }
        };
        let entry = match wanted {
            Ok(entry) => entry,
            Err(location) => self.shared.read(location)?,
        };
        Ok(match entry.payload {
            EntryPayload::Normal(command) => Some(Bytes::from(command.0)),
            _ => None,
        })
    }

    /// Deletes segments that hold only purged entries.
    fn drop_purged_segments(&self) -> io::Result<()> {
        let first_needed = {
            let contents = lock(&self.shared.contents);
            contents
                .stored
                .values()
                .next()
                .map(|stored| stored.location.segment)
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
        // Cached entries are cloned under the lock; the others are read
        // from disk after it, so that appends do not wait on the reads.
        let wanted: Vec<Result<Entry, Location>> = {
            let contents = lock(&self.shared.contents);
            contents
                .stored
                .range(range)
                .map(|(index, stored)| match contents.cached.get(index) {
                    Some((entry, _)) => Ok(entry.clone()),
                    None => Err(stored.location),
                })
                .collect()
        };
        wanted
            .into_iter()
            .map(|wanted| match wanted {
                Ok(entry) => Ok(entry),
                Err(location) => self.shared.read(location),
            })
            .collect()
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(*lock(&self.shared.vote))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let contents = lock(&self.shared.contents);
        Ok(LogState {
            last_purged_log_id: contents.last_purged,
            last_log_id: contents.last_log_id(),
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
                let (location, sequence) = self.shared.append(
                    KIND_ENTRY,
                    &encode_into(&entry, Vec::with_capacity(entry_size_hint(&entry))),
                )?;
                contents.insert(entry, location, true);
                last_sequence = Some(sequence);
            }
        }
        match last_sequence {
            None => callback.io_completed(Ok(())),
            Some(sequence) => {
                lock(&self.shared.waiting).push_back((sequence, callback));
                // A round that ended before this look is seen by it; one
                // that ends after it signals the waiter it hands the WAL.
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
        let purges_all = {
            let contents = lock(&self.shared.contents);
            contents
                .stored
                .keys()
                .next_back()
                .is_none_or(|last| *last <= log_id.index)
        };
        if purges_all {
            // Nothing stays: the records from here on go to a segment of
            // their own, and every earlier one can be deleted.
            self.shared.buffer.start_new_segment();
        }
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

    fn at(segment: u64, index: u64) -> Location {
        Location {
            segment,
            position: index * 100,
            length: 100,
        }
    }

    fn indexes(contents: &LogContents) -> Vec<u64> {
        contents.stored.keys().copied().collect()
    }

    #[test]
    fn log_contents_replay_truncates_purges_and_overwrites() {
        let mut contents = LogContents::default();
        for index in 1..=5 {
            contents
                .replay(KIND_ENTRY, at(1, index), &encode(&entry(1, index)))
                .unwrap();
        }
        // A new leader's entry at 4 replaces 4 and drops 5.
        contents
            .replay(KIND_ENTRY, at(2, 4), &encode(&entry(2, 4)))
            .unwrap();
        assert_eq!(indexes(&contents), [1, 2, 3, 4]);
        assert_eq!(contents.stored[&4].log_id.leader_id.term, 2);
        assert_eq!(contents.stored[&4].location.segment, 2);
        contents
            .replay(KIND_TRUNCATE, at(2, 5), &encode(&Some(3u64)))
            .unwrap();
        assert_eq!(indexes(&contents), [1, 2, 3]);
        contents
            .replay(KIND_PURGE, at(2, 6), &encode(&entry(1, 2).log_id))
            .unwrap();
        assert_eq!(indexes(&contents), [3]);
        assert_eq!(contents.last_purged.map(|id| id.index), Some(2));
        contents
            .replay(KIND_COMMITTED, at(2, 7), &encode(&Some(entry(1, 3).log_id)))
            .unwrap();
        assert_eq!(contents.committed.map(|id| id.index), Some(3));
        assert!(contents.replay(99, at(2, 8), &[]).is_err());
        // Recovery caches nothing: the entries stay on disk.
        assert!(contents.cached.is_empty());
    }

    #[test]
    fn the_cache_holds_unapplied_entries_within_its_bound() {
        let mut contents = LogContents::default();
        let big = |index| Location {
            segment: 1,
            position: index,
            length: (CACHE_BYTES_MAX / 4) as u32,
        };
        for index in 1..=3 {
            contents.insert(entry(1, index), big(index), true);
        }
        contents.uncache_through(1);
        assert_eq!(contents.cached.keys().copied().collect::<Vec<_>>(), [2, 3]);
        for index in 4..=8 {
            contents.insert(entry(1, index), big(index), true);
        }
        // Over the bound, the oldest go first; all stay stored.
        assert!(contents.cached_bytes <= CACHE_BYTES_MAX);
        assert_eq!(
            contents.cached.keys().copied().collect::<Vec<_>>(),
            [5, 6, 7, 8]
        );
        assert_eq!(indexes(&contents), (1..=8).collect::<Vec<_>>());
        contents.truncate_after(Some(6));
        assert_eq!(contents.cached.keys().copied().collect::<Vec<_>>(), [5, 6]);
        assert_eq!(contents.cached_bytes, 2 * (CACHE_BYTES_MAX / 4));
    }

    #[tokio::test]
    async fn entries_are_read_back_from_disk_after_apply_and_restart() {
        let dir = std::env::temp_dir().join(format!(
            "sluice-log-store-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let group_commit = sluice_store::GroupCommit::start(std::time::Duration::ZERO, |_, _| {});
        let wal = Wal::open(&dir, Arc::clone(&group_commit)).unwrap();
        let group_dir = dir.join("group");
        let mut log = LogStore::open(&group_dir, Arc::clone(&wal)).unwrap();
        let (sender, receiver) = <TypeConfig as openraft::type_config::TypeConfigExt>::oneshot();
        let flushed = IOFlushed::signal(sender);
        log.append((1..=3).map(|index| entry(1, index)), flushed)
            .await
            .unwrap();
        receiver.await.unwrap().unwrap();
        log.applied_through(3);
        assert!(lock(&log.shared.contents).cached.is_empty());
        assert_eq!(
            log.read_command(2).unwrap().as_deref(),
            Some(&[2u8, 2, 2][..])
        );
        let read = log.try_get_log_entries(1..=3).await.unwrap();
        assert_eq!(
            read,
            (1..=3).map(|index| entry(1, index)).collect::<Vec<_>>()
        );
        log.write_out().await;
        drop(log);
        let mut reopened = LogStore::open(&group_dir, wal).unwrap();
        assert_eq!(
            reopened.read_command(3).unwrap().as_deref(),
            Some(&[3u8; 3][..])
        );
        assert_eq!(reopened.read_command(4).unwrap(), None);
        let state = reopened.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.map(|id| id.index), Some(3));
        drop(reopened);
        group_commit.stop();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
