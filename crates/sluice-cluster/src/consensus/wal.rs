//! The node's write-ahead log for every Raft group on it, as Ra's WAL is
//! for RabbitMQ's quorum queues. A group's record (an entry, a truncation,
//! a purge) goes to two places: the WAL, which the sync thread fdatasyncs
//! once per round for all groups together, and the group's own segments,
//! which it only writes. An append is durable when its WAL record is; so a
//! round costs one fdatasync however many groups appended in it, where one
//! per group's log would cost as many as there are busy queues.
//!
//! The group's segments are what it reads back and what survives the WAL.
//! They are written in large pieces, not every round: a group's records
//! wait in memory (readable) until a few hundred KiB of them are there
//! ([`LogBuffer::with_deferred_writes`]). When the WAL has grown by a few
//! segments, a checkpoint has every group's records from before it
//! written, fdatasyncs the groups' segments, and deletes the WAL's older
//! segments. At start, whatever the
//! WAL still holds is appended again to the groups' segments (replaying a
//! record twice leaves a log as once: an entry replaces what followed its
//! index) and synced before the WAL is emptied.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use sluice_store::group_commit::{GroupCommit, LogBuffer, Sequence};
use sluice_store::log::SegmentLog;
use sluice_store::record::encode_record;
use sluice_store::round_pacing::RoundPacing;

/// The WAL's directory, in the node's data directory.
const WAL_DIR: &str = "raft-wal";

/// The one kind of WAL record: a group's record, after the group's key.
const KIND_GROUP_RECORD: u8 = 1;

/// WAL segments: zero-filled ahead of use, as a log fsynced every round
/// wants (each fdatasync is then cheaper).
const SEGMENT_BYTES_MAX: u64 = if cfg!(test) {
    64 * 1024
} else {
    32 * 1024 * 1024
};

/// Segments the WAL may hold before a checkpoint lets the older go: what
/// a restart replays, and what the WAL costs on disk, at most about this
/// many segments.
const SEGMENTS_BEFORE_CHECKPOINT: u64 = 2;

/// How often a checkpoint looks whether the groups wrote their records,
/// and how long it waits for them before giving up (to try again later).
const CHECKPOINT_POLL: Duration = Duration::from_millis(5);
const CHECKPOINT_WAIT_MAX: Duration = Duration::from_secs(60);

/// The WAL's sync thread holds a round back when at least
/// `WAL_PACE_WRITERS_MIN` groups appended since the last began: up to
/// `WAL_PACE_FACTOR` times the last round's duration after it started,
/// never more than `WAL_PACE_MAX` (see [`RoundPacing`]). Under seed 5's
/// load (40 busy queues; docs/benchmarks.md) this carried 18.8k msg/s at
/// 63 µs of CPU each, against 15.6k at 78 µs unheld. A lone busy queue,
/// whose every Raft round trip would wait for the pause, is not held back
/// (holding every round halved its rate). Neither 3 writers nor a 10 ms
/// bound measured better.
const WAL_PACE_FACTOR: u32 = 10;
const WAL_PACE_MAX: Duration = Duration::from_millis(5);
const WAL_PACE_WRITERS_MIN: u32 = 8;

/// Replayed records are written to a group's segment in chunks this large.
const REPLAY_CHUNK_BYTES: usize = 1024 * 1024;

/// What a group hands the WAL to hear that a round synced its appends.
pub type Waiter = Arc<dyn Fn() + Send + Sync>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn store_error(error: sluice_store::StoreError) -> io::Error {
    io::Error::other(error.to_string())
}

/// The node's write-ahead log.
pub struct Wal {
    root: PathBuf,
    buffer: Arc<LogBuffer>,
    /// The WAL's sync thread, its own.
    syncing: Arc<GroupCommit>,
    /// The node's sync thread, which writes the groups' own logs.
    group_commit: Arc<GroupCommit>,
    /// The groups' own logs, synced at each checkpoint.
    logs: Mutex<Vec<Weak<LogBuffer>>>,
    /// Groups waiting for a round to sync their appends. Shared with the
    /// WAL's written signal, which so never holds the WAL itself.
    waiters: Arc<Mutex<Vec<Waiter>>>,
    checkpointing: AtomicBool,
    /// The oldest segment the WAL holds.
    first_segment: AtomicU64,
}

impl Wal {
    /// Opens the WAL in `root` (the node's data directory), first handing
    /// every record it still holds to its group's segments. Groups are
    /// named by their directory, relative to `root`; records of a group
    /// whose directory is gone (its queue was deleted) are dropped.
    ///
    /// # Errors
    /// The WAL or a group's segments cannot be read, written or synced.
    pub fn open(root: &Path, group_commit: Arc<GroupCommit>) -> io::Result<Arc<Wal>> {
        let dir = root.join(WAL_DIR);
        replay(root, &dir)?;
        let log = SegmentLog::recover(&dir, |_| {}).map_err(store_error)?;
        let buffer = LogBuffer::with_preallocation(log, SEGMENT_BYTES_MAX);
        // Its own sync thread: its rounds wait for no queue journal's fsync.
        let pacing = RoundPacing::new(WAL_PACE_FACTOR, WAL_PACE_MAX, WAL_PACE_WRITERS_MIN);
        let syncing = GroupCommit::start_paced("sluice-wal", pacing, |_, _| {});
        let waiters: Arc<Mutex<Vec<Waiter>>> = Arc::default();
        let wal = Arc::new(Wal {
            syncing,
            root: root.to_path_buf(),
            first_segment: AtomicU64::new(buffer.head_segment()),
            buffer: Arc::clone(&buffer),
            group_commit,
            logs: Mutex::new(Vec::new()),
            waiters: Arc::clone(&waiters),
            checkpointing: AtomicBool::new(false),
        });
        buffer.set_written_signal(Box::new(move || {
            let waiting = std::mem::take(&mut *lock(&waiters));
            for waiter in waiting {
                waiter();
            }
        }));
        Ok(wal)
    }

    pub(super) fn group_commit(&self) -> &Arc<GroupCommit> {
        &self.group_commit
    }

    /// How the WAL names the group whose log is in `dir`.
    pub(super) fn key(&self, dir: &Path) -> Vec<u8> {
        dir.strip_prefix(&self.root)
            .unwrap_or(dir)
            .as_os_str()
            .as_bytes()
            .to_vec()
    }

    /// A group's own log, to be synced by checkpoints.
    pub(super) fn register_log(&self, log: &Arc<LogBuffer>) {
        let mut logs = lock(&self.logs);
        logs.retain(|log| log.strong_count() > 0);
        logs.push(Arc::downgrade(log));
    }

    /// Appends a group's record; returns the sequence number that says
    /// when it is durable ([`Wal::is_synced`]), or None once the WAL failed.
    /// `counted_for` is the group's own, for the pacing of rounds.
    pub(super) fn append(
        self: &Arc<Self>,
        key: &[u8],
        counted_for: &AtomicU64,
        kind: u8,
        payload: &[u8],
    ) -> Option<Sequence> {
        self.syncing.count_writer(counted_for);
        let key_length = (key.len() as u16).to_be_bytes();
        let (_, sequence) = self.buffer.append(
            &self.syncing,
            KIND_GROUP_RECORD,
            &[&key_length, key, &[kind], payload],
        )?;
        self.checkpoint_if_due();
        Some(sequence)
    }

    pub(super) fn is_synced(&self, sequence: Sequence) -> bool {
        self.buffer.is_synced(sequence)
    }

    pub(super) fn has_failed(&self) -> bool {
        self.buffer.has_failed()
    }

    /// Calls `waiter` after the next round that writes the WAL.
    pub(super) fn wait(&self, waiter: Waiter) {
        lock(&self.waiters).push(waiter);
        self.buffer.request_written_signal();
    }

    fn checkpoint_if_due(self: &Arc<Self>) {
        let held = self.buffer.head_segment() - self.first_segment.load(Ordering::Acquire);
        if held < SEGMENTS_BEFORE_CHECKPOINT || self.checkpointing.swap(true, Ordering::AcqRel) {
            return;
        }
        let wal = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("sluice-wal-checkpoint".into())
            .spawn(move || {
                if let Err(reason) = wal.checkpoint() {
                    tracing::error!(%reason, "a checkpoint of the raft write-ahead log failed; it keeps its segments and tries again");
                }
                wal.checkpointing.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.checkpointing.store(false, Ordering::Release);
        }
    }

    /// Makes every group's records from before now durable in the group's
    /// own segments, then deletes the WAL segments that held them.
    fn checkpoint(&self) -> Result<(), String> {
        // Records from here on go to a new segment; a group appends to its
        // own log before the WAL, so what the older segments hold is within
        // each group's appends so far.
        self.buffer.start_new_segment();
        let keep_from = self.buffer.head_segment();
        let logs: Vec<Arc<LogBuffer>> = lock(&self.logs).iter().filter_map(Weak::upgrade).collect();
        let deadline = Instant::now() + CHECKPOINT_WAIT_MAX;
        for log in logs {
            let appended = log.last_sequence();
            log.write_soon(&self.group_commit);
            while !log.is_synced(appended) {
                if log.has_failed() {
                    return Err(format!(
                        "the raft log in {} failed: the write-ahead log keeps its records for the next start",
                        log.dir().display()
                    ));
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "{} was not written within {CHECKPOINT_WAIT_MAX:?}",
                        log.dir().display()
                    ));
                }
                std::thread::sleep(CHECKPOINT_POLL);
            }
            log.sync_written().map_err(|error| error.to_string())?;
        }
        self.buffer
            .remove_segments_before(keep_from)
            .map_err(|error| error.to_string())?;
        self.first_segment.store(keep_from, Ordering::Release);
        Ok(())
    }
}

impl Wal {
    /// Writes what the WAL holds, stops its sync thread and logs its group
    /// commit totals; once every group is stopped, as the node stops.
    /// Blocks until the thread is done.
    pub fn stop(&self) {
        self.syncing.stop();
    }
}

impl Drop for Wal {
    /// Writes what the WAL holds and stops its sync thread.
    fn drop(&mut self) {
        self.syncing.stop();
    }
}

/// A group's log as replay appends to it.
struct ReplayTarget {
    log: SegmentLog,
    head: u64,
    chunk: BytesMut,
    records: u64,
}

impl ReplayTarget {
    /// The log of the group in `dir`; None when the directory is gone.
    fn open(dir: &Path) -> io::Result<Option<ReplayTarget>> {
        // Only a directory that is not there is a deleted queue: any other
        // error stops the start, so that no record is dropped for it.
        match std::fs::metadata(dir) {
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
            Ok(_) => {}
        }
        let log = SegmentLog::recover(&dir.join("log"), |_| {}).map_err(store_error)?;
        let head = log.head().map_or(1, |(id, _)| id);
        Ok(Some(ReplayTarget {
            log,
            head,
            chunk: BytesMut::new(),
            records: 0,
        }))
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.chunk.is_empty() {
            self.log
                .write(self.head, &self.chunk)
                .map_err(store_error)?;
            self.chunk.clear();
        }
        Ok(())
    }
}

/// Splits a WAL record into the group's key, its record's kind and payload.
fn parse(record: &[u8]) -> Option<(&[u8], u8, &[u8])> {
    let key_length = u16::from_be_bytes(record.get(..2)?.try_into().ok()?) as usize;
    let key = record.get(2..2 + key_length)?;
    let kind = *record.get(2 + key_length)?;
    Some((key, kind, &record[3 + key_length..]))
}

/// Appends what the WAL in `dir` holds to the groups' segments, syncs them
/// and empties the WAL.
fn replay(root: &Path, dir: &Path) -> io::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let mut targets: HashMap<Vec<u8>, Option<ReplayTarget>> = HashMap::new();
    let mut failure = None;
    let mut wal = SegmentLog::recover(dir, |view| {
        if failure.is_some() {
            return;
        }
        let result = (|| {
            let (key, kind, payload) = parse(view.payload).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a write-ahead log record without its group",
                )
            })?;
            if !targets.contains_key(key) {
                let target = ReplayTarget::open(&root.join(OsStr::from_bytes(key)))?;
                targets.insert(key.to_vec(), target);
            }
            if let Some(Some(target)) = targets.get_mut(key) {
                encode_record(&mut target.chunk, kind, &[payload]);
                target.records += 1;
                if target.chunk.len() >= REPLAY_CHUNK_BYTES {
                    target.flush()?;
                }
            }
            Ok(())
        })();
        failure = result.err();
    })
    .map_err(store_error)?;
    if let Some(error) = failure {
        return Err(error);
    }
    let mut records = 0;
    let mut groups = 0;
    for target in targets.values_mut().flatten() {
        target.flush()?;
        target.log.sync(target.head).map_err(store_error)?;
        records += target.records;
        groups += 1;
    }
    if groups > 0 {
        tracing::info!(
            records,
            groups,
            "raft logs completed from the write-ahead log"
        );
    }
    wal.remove_segments_before(u64::MAX).map_err(store_error)?;
    sluice_store::sync_dir(dir).map_err(store_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::storage::{IOFlushed, RaftLogStorage};
    use openraft::EntryPayload;

    use super::super::log_store::LogStore;
    use super::super::types::{Command, Entry, LogId, TypeConfig};

    fn entry(index: u64, size: usize) -> Entry {
        openraft::Entry {
            log_id: LogId::new(
                openraft::impls::leader_id_adv::LeaderId {
                    term: 1,
                    node_id: 1,
                },
                index,
            ),
            payload: EntryPayload::Normal(Command(vec![index as u8; size])),
        }
    }

    fn temporary_root(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sluice-wal-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Appends entries `indexes` of `size` bytes and waits until openraft
    /// would hear they are durable.
    async fn append_durably(
        log: &mut LogStore,
        indexes: std::ops::RangeInclusive<u64>,
        size: usize,
    ) {
        let (sender, receiver) = <TypeConfig as openraft::type_config::TypeConfigExt>::oneshot();
        log.append(
            indexes.map(|index| entry(index, size)),
            IOFlushed::signal(sender),
        )
        .await
        .unwrap();
        receiver.await.unwrap().unwrap();
    }

    fn wal_segments(root: &Path) -> usize {
        std::fs::read_dir(root.join(WAL_DIR))
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter(|entry| sluice_store::segment::segment_id(&entry.path()).is_some())
                    .count()
            })
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn appends_durable_in_the_wal_complete_a_group_log_that_lost_them() {
        let root = temporary_root("replay");
        let group_dir = root.join("queues").join("q1");
        let group_commit = GroupCommit::start(Duration::ZERO, |_, _| {});
        let wal = Wal::open(&root, Arc::clone(&group_commit)).unwrap();
        let mut log = LogStore::open(&group_dir, Arc::clone(&wal)).unwrap();
        append_durably(&mut log, 1..=3, 100).await;
        drop(log);
        drop(wal);
        group_commit.stop();
        // A crash before the group's own writes reached the disk: only
        // what the WAL synced is left.
        std::fs::remove_dir_all(group_dir.join("log")).unwrap();

        let group_commit = GroupCommit::start(Duration::ZERO, |_, _| {});
        let wal = Wal::open(&root, Arc::clone(&group_commit)).unwrap();
        assert_eq!(wal_segments(&root), 0, "replayed records leave the WAL");
        let mut log = LogStore::open(&group_dir, Arc::clone(&wal)).unwrap();
        for index in 1..=3 {
            assert_eq!(
                log.read_command(index).unwrap().as_deref(),
                Some(&vec![index as u8; 100][..])
            );
        }
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.map(|id| id.index), Some(3));
        // Appending goes on after the replayed entries.
        append_durably(&mut log, 4..=4, 10).await;
        assert_eq!(
            log.read_command(4).unwrap().as_deref(),
            Some(&[4u8; 10][..])
        );
        drop(log);
        group_commit.stop();
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn replay_leaves_a_deleted_group_deleted() {
        let root = temporary_root("deleted");
        let group_dir = root.join("queues").join("gone");
        let group_commit = GroupCommit::start(Duration::ZERO, |_, _| {});
        let wal = Wal::open(&root, Arc::clone(&group_commit)).unwrap();
        let mut log = LogStore::open(&group_dir, Arc::clone(&wal)).unwrap();
        append_durably(&mut log, 1..=2, 10).await;
        drop(log);
        drop(wal);
        group_commit.stop();
        std::fs::remove_dir_all(&group_dir).unwrap();

        let group_commit = GroupCommit::start(Duration::ZERO, |_, _| {});
        Wal::open(&root, Arc::clone(&group_commit)).unwrap();
        assert!(!group_dir.exists());
        group_commit.stop();
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn a_checkpoint_lets_the_older_wal_segments_go_once_the_groups_hold_their_records() {
        let root = temporary_root("checkpoint");
        let group_commit = GroupCommit::start(Duration::ZERO, |_, _| {});
        let wal = Wal::open(&root, Arc::clone(&group_commit)).unwrap();
        let mut first = LogStore::open(&root.join("a"), Arc::clone(&wal)).unwrap();
        let mut second = LogStore::open(&root.join("b"), Arc::clone(&wal)).unwrap();
        // Ten WAL segments' worth, from two groups.
        let entries = 10 * SEGMENT_BYTES_MAX / 1024;
        for index in 1..=entries {
            append_durably(&mut first, index..=index, 512).await;
            append_durably(&mut second, index..=index, 512).await;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while wal_segments(&root) > SEGMENTS_BEFORE_CHECKPOINT as usize + 1 {
            assert!(
                Instant::now() < deadline,
                "{} WAL segments stay",
                wal_segments(&root)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        first.write_out().await;
        second.write_out().await;
        drop((first, second));
        drop(wal);
        group_commit.stop();
        // Without the WAL, the groups' own segments hold everything.
        std::fs::remove_dir_all(root.join(WAL_DIR)).unwrap();
        let group_commit = GroupCommit::start(Duration::ZERO, |_, _| {});
        let wal = Wal::open(&root, Arc::clone(&group_commit)).unwrap();
        for group in ["a", "b"] {
            let mut log = LogStore::open(&root.join(group), Arc::clone(&wal)).unwrap();
            let state = log.get_log_state().await.unwrap();
            assert_eq!(
                state.last_log_id.map(|id| id.index),
                Some(entries),
                "{group}"
            );
            assert_eq!(
                log.read_command(entries / 2)
                    .unwrap()
                    .map(|command| command.len()),
                Some(512)
            );
        }
        group_commit.stop();
        let _ = std::fs::remove_dir_all(&root);
    }
}
