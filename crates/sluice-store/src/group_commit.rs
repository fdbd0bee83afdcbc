//! Group commit: appends go into a log's in-memory buffer on the caller's
//! thread (a copy, no syscall); one sync thread writes every dirty log's
//! buffer and fdatasyncs it, then reports the round. Appends made while a
//! round's fsync runs go into the next round, so under load one fsync covers
//! many messages and the batch grows with the fsync's duration by itself.
//!
//! Durability is tracked per log with sequence numbers: every append gets the
//! log's next sequence number, and a log's `synced_sequence` says up to which
//! append its bytes are on disk.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::log::SegmentLog;
use crate::record::{decode_record, encode_record, Record, RECORD_HEADER_SIZE};
use crate::round_pacing::RoundPacing;
use crate::segment::{segment_path, Segment};
use crate::StoreError;

/// Where a record lives: segment id and byte position of the record start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub segment: u64,
    pub position: u64,
    pub length: u32,
}

/// A point in one log's append order: durable once the log's synced
/// sequence reaches it.
pub type Sequence = u64;

struct Pending {
    /// Bytes appended but not yet written, per segment, with the position
    /// of their first byte.
    chunks: Vec<(u64, u64, BytesMut)>,
    /// Chunks the sync thread took and is writing: readers find them here
    /// until they are in the file.
    writing: Vec<(u64, u64, Bytes)>,
    head_segment: u64,
    head_size: u64,
    next_sequence: Sequence,
    /// A write failed: appends are refused, until `retry_at` when the log
    /// retries failures, for good otherwise.
    failed: bool,
    retry_at: Option<Instant>,
    /// Sequences whose appends died with a failed write, as ranges; each
    /// failure adds one, at most [`LOST_RANGES_MAX`].
    lost: Vec<(Sequence, Sequence)>,
    destroyed: bool,
    /// Something buffered must be fsynced (not only records that can be
    /// lost in a crash without harm).
    needs_sync: bool,
    /// Appends that need the disk since the last round took the buffer.
    durable_appends: u64,
    /// The log is in the sync thread's list for its next round.
    marked: bool,
    /// Bytes of a log with deferred writes appended since it was last
    /// handed to a round.
    deferred_bytes: u64,
}

/// The write side of one [`SegmentLog`]: a buffer of appends waiting for the
/// sync thread, and the log itself.
pub struct LogBuffer {
    pending: Mutex<Pending>,
    log: Mutex<SegmentLog>,
    dir: PathBuf,
    segment_size_max: u64,
    synced_sequence: AtomicU64,
    /// Bytes appended and not yet written to the file: what a slow disk
    /// leaves in memory. Owners bound it by pausing their writers.
    unwritten_bytes: AtomicU64,
    /// Read-only handles on written segments. Readers use these, never the
    /// log's lock, which the sync thread holds across an fsync.
    readers: Mutex<BTreeMap<u64, Arc<File>>>,
    /// Called by the sync thread after a round wrote this log, when a writer
    /// asked for it with [`LogBuffer::request_written_signal`].
    written_signal: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
    /// Segments are zero-filled ahead of use.
    preallocates: bool,
    /// Appends that need no fsync wait in memory until they fill
    /// [`DEFERRED_WRITE_BYTES`] (see [`LogBuffer::with_deferred_writes`]).
    defers_writes: bool,
    /// A helper thread is zero-filling; at most one per log at a time.
    preallocating: Arc<AtomicBool>,
    written_signal_requested: AtomicBool,
    /// After a failed write, take appends again once a backoff passed
    /// (queue journals), rather than never (Raft logs, which must not
    /// carry on with a hole).
    retries_after_failure: AtomicBool,
    /// The wait before the next retry; doubles with each failure in a row.
    retry_backoff: Mutex<Duration>,
    /// Whether any write ever failed: reading `lost` is needed only then.
    ever_lost: AtomicBool,
    /// The node's count of deferred bytes, once this log deferred any.
    deferred_total: OnceLock<Arc<AtomicU64>>,
    /// Segments written without an fsync since the last one: a log whose
    /// appends are made durable elsewhere (a Raft log behind the node's
    /// write-ahead log) syncs them with [`LogBuffer::sync_written`].
    unsynced_segments: Mutex<std::collections::BTreeSet<u64>>,
}

/// The first wait before a failed log is written to again, and the
/// longest: it doubles with each failure in a row.
const RETRY_BACKOFF_MIN: Duration = Duration::from_millis(100);
const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Failures a log retries in its life; past this it stays failed (the disk
/// is not coming back, and the ranges of lost appends stay small).
const LOST_RANGES_MAX: usize = 1024;

/// How long deleting or dropping a log waits for a segment being zero-filled:
/// a 1 GiB segment at a slow disk's 100 MB/s.
const PREALLOCATION_WAIT_MAX: Duration = Duration::from_secs(10);

impl Drop for LogBuffer {
    fn drop(&mut self) {
        self.wait_for_preallocation();
        self.forget_deferred();
    }
}

/// Threads that write and fsync one round's logs side by side: a round over
/// many queue journals then takes about one fsync's time. Beyond this, the
/// disk's queue, not the thread count, sets the pace.
const SYNC_THREADS_MAX: usize = 8;

/// How often an idle sync thread checks whether writers paused over the write
/// budget may resume (see [`GroupCommit::when_write_budget_drained`]).
const BUDGET_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// What a log with deferred writes gathers before a round writes it, and
/// what all of them together may hold on a node: large writes instead of
/// one per log and round, in a bounded amount of memory.
const DEFERRED_WRITE_BYTES: u64 = 256 * 1024;
const DEFERRED_TOTAL_MAX: u64 = 32 * 1024 * 1024;

/// What the sync thread calls when a log's buffer was written out.
pub type WrittenSignal = Box<dyn Fn() + Send + Sync>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl LogBuffer {
    pub fn new(log: SegmentLog, segment_size_max: u64) -> Arc<Self> {
        Self::build(log, segment_size_max, false, false)
    }

    /// A log whose appends need no fsync of their own (a Raft log behind
    /// the node's write-ahead log, which makes them durable): they stay in
    /// memory, readable, until [`DEFERRED_WRITE_BYTES`] of them are there,
    /// the node holds [`DEFERRED_TOTAL_MAX`] in such logs, or
    /// [`LogBuffer::write_soon`] asks, and are then written in one go
    /// instead of with every round.
    pub fn with_deferred_writes(log: SegmentLog, segment_size_max: u64) -> Arc<Self> {
        Self::build(log, segment_size_max, false, true)
    }

    /// A log whose segments are zero-filled ahead of use by a helper thread,
    /// so that appends overwrite instead of growing the file: for logs that
    /// fsync often (durable queues), where it makes each fdatasync cheaper.
    pub fn with_preallocation(log: SegmentLog, segment_size_max: u64) -> Arc<Self> {
        let buffer = Self::build(log, segment_size_max, true, false);
        let (head, head_size) = {
            let pending = lock(&buffer.pending);
            (pending.head_segment, pending.head_size)
        };
        if head_size >= segment_size_max / 2 {
            buffer.preallocate(head + 1);
        }
        buffer
    }

    fn build(
        log: SegmentLog,
        segment_size_max: u64,
        preallocates: bool,
        defers_writes: bool,
    ) -> Arc<Self> {
        let (head_segment, head_size) = log.head().unwrap_or((1, 0));
        Arc::new(LogBuffer {
            preallocates,
            defers_writes,
            preallocating: Arc::new(AtomicBool::new(false)),
            dir: log.dir.clone(),
            unwritten_bytes: AtomicU64::new(0),
            readers: Mutex::new(BTreeMap::new()),
            written_signal: Mutex::new(None),
            written_signal_requested: AtomicBool::new(false),
            retries_after_failure: AtomicBool::new(false),
            retry_backoff: Mutex::new(RETRY_BACKOFF_MIN),
            ever_lost: AtomicBool::new(false),
            unsynced_segments: Mutex::new(std::collections::BTreeSet::new()),
            deferred_total: OnceLock::new(),
            pending: Mutex::new(Pending {
                writing: Vec::new(),
                chunks: Vec::new(),
                head_segment,
                head_size,
                next_sequence: 1,
                needs_sync: false,
                marked: false,
                deferred_bytes: 0,
                durable_appends: 0,
                failed: false,
                retry_at: None,
                lost: Vec::new(),
                destroyed: false,
            }),
            log: Mutex::new(log),
            segment_size_max,
            synced_sequence: AtomicU64::new(0),
        })
    }

    /// Appends a record; returns where it will live and the sequence number
    /// to wait for with [`LogBuffer::is_synced`]. Returns None when the log
    /// has failed or was destroyed.
    pub fn append(
        self: &Arc<Self>,
        group: &GroupCommit,
        kind: u8,
        payload_parts: &[&[u8]],
    ) -> Option<(Location, Sequence)> {
        self.append_record(group, kind, payload_parts, true)
    }

    /// Appends a record that need not be fsynced for its own sake (an ack:
    /// losing it in a crash only means a redelivery). It is written with the
    /// next round and reaches the disk with the next fsync of the log, but it
    /// never makes a round fsync.
    pub fn append_unsynced(
        self: &Arc<Self>,
        group: &GroupCommit,
        kind: u8,
        payload_parts: &[&[u8]],
    ) -> Option<(Location, Sequence)> {
        self.append_record(group, kind, payload_parts, false)
    }

    fn append_record(
        self: &Arc<Self>,
        group: &GroupCommit,
        kind: u8,
        payload_parts: &[&[u8]],
        needs_sync: bool,
    ) -> Option<(Location, Sequence)> {
        let mut pending = lock(&self.pending);
        if pending.destroyed || (pending.failed && !self.retry_now(&mut pending)) {
            return None;
        }
        pending.needs_sync |= needs_sync;
        pending.durable_appends += u64::from(needs_sync);
        let length =
            RECORD_HEADER_SIZE + 1 + payload_parts.iter().map(|part| part.len()).sum::<usize>();
        if pending.head_size > 0 && pending.head_size + length as u64 > self.segment_size_max {
            pending.head_segment += 1;
            pending.head_size = 0;
        }
        // Half way through a segment, the next one is prepared: a log that
        // is written to fast gets its segments zero-filled ahead of use, and
        // an idle one costs no disk for it.
        let half = self.segment_size_max / 2;
        let crossed_half = pending.head_size < half && pending.head_size + length as u64 >= half;
        let segment = pending.head_segment;
        let position = pending.head_size;
        // Bytes a log with deferred writes keeps count as deferred, not as
        // waiting for the disk, until the log is handed to a round.
        if self.defers_writes && !pending.marked {
            pending.deferred_bytes += length as u64;
            group
                .deferred_total
                .fetch_add(length as u64, Ordering::Relaxed);
            self.deferred_total
                .get_or_init(|| Arc::clone(&group.deferred_total));
        } else {
            group
                .unwritten_total
                .fetch_add(length as u64, Ordering::Relaxed);
        }
        let due = !self.defers_writes
            || needs_sync
            || pending.deferred_bytes >= DEFERRED_WRITE_BYTES
            || group.deferred_total.load(Ordering::Relaxed) >= DEFERRED_TOTAL_MAX;
        if due {
            self.mark(&mut pending, group);
        }
        match pending.chunks.last_mut() {
            Some((chunk_segment, _, bytes)) if *chunk_segment == segment => {
                encode_record(bytes, kind, payload_parts)
            }
            _ => {
                // Sized for what a round (or a deferral) gathers, so that
                // appends do not copy it over as it grows.
                let capacity = if self.defers_writes {
                    DEFERRED_WRITE_BYTES as usize + length
                } else {
                    length.max(64 * 1024)
                };
                let mut bytes = BytesMut::with_capacity(capacity);
                encode_record(&mut bytes, kind, payload_parts);
                pending.chunks.push((segment, position, bytes));
            }
        }
        pending.head_size += length as u64;
        self.unwritten_bytes
            .fetch_add(length as u64, Ordering::Relaxed);
        let sequence = pending.next_sequence;
        pending.next_sequence += 1;
        drop(pending);
        if crossed_half {
            self.preallocate(segment + 1);
        }
        Some((
            Location {
                segment,
                position,
                length: length as u32,
            },
            sequence,
        ))
    }

    /// Takes what this log deferred out of the node's count (the log is
    /// going): no round will write it.
    fn forget_deferred(&self) {
        let deferred = std::mem::take(&mut lock(&self.pending).deferred_bytes);
        self.unwritten_bytes.fetch_sub(deferred, Ordering::Relaxed);
        if let Some(total) = self.deferred_total.get() {
            total.fetch_sub(deferred, Ordering::Relaxed);
        }
    }

    /// Puts the log in the next round's list, once.
    fn mark(self: &Arc<Self>, pending: &mut Pending, group: &GroupCommit) {
        if pending.marked {
            return;
        }
        pending.marked = true;
        let deferred = std::mem::take(&mut pending.deferred_bytes);
        group.deferred_total.fetch_sub(deferred, Ordering::Relaxed);
        group.unwritten_total.fetch_add(deferred, Ordering::Relaxed);
        group.mark_dirty(Arc::clone(self));
    }

    /// Has the next round write whatever this log holds unwritten (a log
    /// with deferred writes keeps it otherwise); wait for
    /// [`LogBuffer::last_sequence`] with [`LogBuffer::is_synced`].
    pub fn write_soon(self: &Arc<Self>, group: &GroupCommit) {
        let mut pending = lock(&self.pending);
        if !pending.chunks.is_empty() {
            self.mark(&mut pending, group);
        }
    }

    /// Zero-fills the file of segment `id` on a helper thread, unless this
    /// log does not preallocate or is already at it (then the segment is
    /// simply created when first written, as without preallocation).
    fn preallocate(&self, id: u64) {
        if !self.preallocates || self.preallocating.swap(true, Ordering::AcqRel) {
            return;
        }
        let (dir, size, busy) = (
            self.dir.clone(),
            self.segment_size_max,
            Arc::clone(&self.preallocating),
        );
        let spawned = std::thread::Builder::new()
            .name("sluice-prealloc".into())
            .spawn(move || {
                if let Err(error) = Segment::preallocate(&dir, id, size) {
                    tracing::debug!(%error, "could not preallocate a segment");
                }
                busy.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.preallocating.store(false, Ordering::Release);
        }
    }

    /// The sequence number of the last append so far.
    pub fn last_sequence(&self) -> Sequence {
        lock(&self.pending).next_sequence - 1
    }

    /// Whether the next round must fsync this log.
    fn needs_sync(&self) -> bool {
        lock(&self.pending).needs_sync
    }

    /// Fsyncs every segment written without an fsync since the last one.
    /// Appends not yet written are not covered: wait for their sequence
    /// with [`LogBuffer::is_synced`] first.
    ///
    /// # Errors
    /// The fsync failed; the segments stay to be synced again.
    pub fn sync_written(&self) -> Result<(), StoreError> {
        let segments = std::mem::take(&mut *lock(&self.unsynced_segments));
        let log = lock(&self.log);
        for (done, segment) in segments.iter().enumerate() {
            if let Err(error) = log.sync(*segment) {
                lock(&self.unsynced_segments).extend(segments.iter().skip(done));
                return Err(error);
            }
        }
        Ok(())
    }

    /// Whether the append with this sequence number is on disk.
    pub fn is_synced(&self, sequence: Sequence) -> bool {
        self.synced_sequence.load(Ordering::Acquire) >= sequence && !self.is_lost(sequence)
    }

    /// The directory the log's segments are in.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Whether writing this log failed and it takes no appends now.
    pub fn has_failed(&self) -> bool {
        lock(&self.pending).failed
    }

    /// Whether the append numbered `sequence` died with a failed write: it
    /// will never be durable.
    pub fn is_lost(&self, sequence: Sequence) -> bool {
        self.ever_lost.load(Ordering::Acquire)
            && lock(&self.pending)
                .lost
                .iter()
                .any(|(first, last)| (*first..=*last).contains(&sequence))
    }

    /// After a failed write, take appends again once the backoff passed
    /// (see [`Self::retry_now`]); queue journals do, Raft logs do not.
    pub fn retry_after_failures(&self) {
        self.retries_after_failure.store(true, Ordering::Release);
    }

    /// Whether a failed log takes appends again now: its backoff passed.
    /// They go to a new segment, past whatever the failed write left in
    /// the old one (recovery skips a torn record in an older segment).
    fn retry_now(&self, pending: &mut Pending) -> bool {
        match pending.retry_at {
            Some(at) if Instant::now() >= at => {
                pending.failed = false;
                pending.retry_at = None;
                if pending.head_size > 0 {
                    pending.head_segment += 1;
                    pending.head_size = 0;
                }
                tracing::warn!(dir = %self.dir.display(), "writing to a log again after its write failed");
                true
            }
            _ => false,
        }
    }

    /// Reads back the record at `location`: from the buffer when it has not
    /// been written yet, else from the file, without waiting for a sync.
    pub fn read(&self, location: Location) -> Result<Record, StoreError> {
        let buffered = {
            let pending = lock(&self.pending);
            let written = pending
                .writing
                .iter()
                .map(|(segment, start, bytes)| (*segment, *start, &bytes[..]));
            let unwritten = pending
                .chunks
                .iter()
                .map(|(segment, start, bytes)| (*segment, *start, &bytes[..]));
            written
                .chain(unwritten)
                .find_map(|(segment, start, bytes)| {
                    let end = start + bytes.len() as u64;
                    (segment == location.segment
                        && location.position >= start
                        && location.position < end)
                        .then(|| {
                            let offset = (location.position - start) as usize;
                            Bytes::copy_from_slice(
                                &bytes[offset..offset + location.length as usize],
                            )
                        })
                })
        };
        let bytes = match buffered {
            Some(bytes) => bytes,
            None => {
                let file = self.reader(location.segment)?;
                let mut bytes = vec![0; location.length as usize];
                file.read_exact_at(&mut bytes, location.position)
                    .map_err(|error| {
                        StoreError::io(
                            format!(
                                "reading segment {} of {}",
                                location.segment,
                                self.dir.display()
                            ),
                            error,
                        )
                    })?;
                Bytes::from(bytes)
            }
        };
        decode_record(&bytes)
            .map(|(record, _)| record)
            .map_err(|error| {
                StoreError::io(
                    "reading a record back",
                    std::io::Error::new(std::io::ErrorKind::InvalidData, error),
                )
            })
    }

    fn reader(&self, segment: u64) -> Result<Arc<File>, StoreError> {
        let mut readers = lock(&self.readers);
        if let Some(file) = readers.get(&segment) {
            return Ok(Arc::clone(file));
        }
        let path = segment_path(&self.dir, segment);
        let file = Arc::new(
            File::open(&path)
                .map_err(|error| StoreError::io(format!("opening {}", path.display()), error))?,
        );
        readers.insert(segment, Arc::clone(&file));
        Ok(file)
    }

    /// Every valid record of a segment that is completely written, with its
    /// location; None while part of the segment is still buffered.
    pub fn scan_segment(
        &self,
        segment: u64,
    ) -> Result<Option<Vec<(Location, Record)>>, StoreError> {
        {
            let pending = lock(&self.pending);
            let buffered = pending.head_segment <= segment
                || pending.chunks.iter().any(|(id, _, _)| *id == segment)
                || pending.writing.iter().any(|(id, _, _)| *id == segment);
            if buffered {
                return Ok(None);
            }
        }
        let scan = Segment::scan(&segment_path(&self.dir, segment))?;
        Ok(Some(
            scan.records
                .into_iter()
                .map(|(position, record)| {
                    let location = Location {
                        segment,
                        position,
                        length: (RECORD_HEADER_SIZE + 1 + record.payload.len()) as u32,
                    };
                    (location, record)
                })
                .collect(),
        ))
    }

    /// Bytes appended but not yet handed to the file.
    pub fn unwritten_bytes(&self) -> u64 {
        self.unwritten_bytes.load(Ordering::Relaxed)
    }

    /// Sets what the sync thread calls after writing this log, once asked.
    pub fn set_written_signal(&self, signal: WrittenSignal) {
        *lock(&self.written_signal) = Some(Arc::from(signal));
    }

    /// Asks for the written signal after the next round that writes this log.
    pub fn request_written_signal(&self) {
        self.written_signal_requested.store(true, Ordering::Release);
    }

    fn signal_written(&self) {
        if self.written_signal_requested.swap(false, Ordering::AcqRel) {
            // Called without the lock held: the signal takes its queue's
            // lock, under which the queue may be replacing or dropping it.
            let signal = lock(&self.written_signal).clone();
            if let Some(signal) = signal {
                signal();
            }
        }
    }

    /// Sends the next append to a new segment.
    pub fn start_new_segment(&self) {
        let mut pending = lock(&self.pending);
        if pending.head_size > 0 {
            pending.head_segment += 1;
            pending.head_size = 0;
        }
    }

    /// The segment that appends currently go to.
    pub fn head_segment(&self) -> u64 {
        lock(&self.pending).head_segment
    }

    /// Deletes whole segments older than `segment`.
    pub fn remove_segments_before(&self, segment: u64) -> Result<usize, StoreError> {
        // Dropping the read handles lets the file system free the space.
        lock(&self.readers).retain(|id, _| *id >= segment);
        lock(&self.log).remove_segments_before(segment)
    }

    /// Waits for a helper thread zero-filling a segment of this log to
    /// finish, so that nothing writes into the directory after its owner is
    /// done with it.
    fn wait_for_preallocation(&self) {
        let deadline = Instant::now() + PREALLOCATION_WAIT_MAX;
        while self.preallocating.load(Ordering::Acquire) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Stops writing and deletes the log's files.
    pub fn destroy(&self) -> Result<(), StoreError> {
        self.forget_deferred();
        let mut pending = lock(&self.pending);
        pending.destroyed = true;
        pending.chunks.clear();
        // What was still buffered went with the queue. As in RabbitMQ, a
        // publish into a queue deleted before its message was written is
        // confirmed, not left waiting: its confirm would otherwise hold up
        // every later confirm on its channel. The round that finds this log
        // destroyed wakes the waiters.
        let last_sequence = pending.next_sequence - 1;
        self.synced_sequence
            .fetch_max(last_sequence, Ordering::AcqRel);
        drop(pending);
        self.wait_for_preallocation();
        lock(&self.readers).clear();
        *lock(&self.written_signal) = None;
        let mut log = lock(&self.log);
        let dir = log.dir.clone();
        log.remove_segments_before(u64::MAX)?;
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(StoreError::io(format!("deleting {}", dir.display()), error)),
        }
    }

    /// One sync round for this log: write what is buffered, fdatasync each
    /// segment written, then advance the synced sequence. Counts its
    /// fsyncs and the durable appends they covered into `stats`.
    fn write_and_sync(&self, group: &GroupCommit) -> Result<(), StoreError> {
        let stats = &group.stats;
        let (chunks, last_sequence, needs_sync, durable_appends) = {
            let mut pending = lock(&self.pending);
            // Out of the list: the next append (or `write_soon`) puts it back.
            pending.marked = false;
            if pending.destroyed {
                // Its buffered appends were dropped with it.
                group.forget_unwritten(self.unwritten_bytes.swap(0, Ordering::Relaxed));
                return Ok(());
            }
            let chunks: Vec<(u64, u64, Bytes)> = std::mem::take(&mut pending.chunks)
                .into_iter()
                .map(|(segment, start, bytes)| (segment, start, bytes.freeze()))
                .collect();
            pending.writing.clone_from(&chunks);
            (
                chunks,
                pending.next_sequence - 1,
                std::mem::take(&mut pending.needs_sync),
                std::mem::take(&mut pending.durable_appends),
            )
        };
        let mut log = lock(&self.log);
        let mut written_segments = Vec::new();
        let mut written_bytes = 0;
        for (segment, _, bytes) in &chunks {
            log.write(*segment, bytes)?;
            written_bytes += bytes.len() as u64;
            if !written_segments.contains(segment) {
                written_segments.push(*segment);
            }
        }
        // In the page cache now: readers go to the file from here on.
        lock(&self.pending).writing.clear();
        self.unwritten_bytes
            .fetch_sub(written_bytes, Ordering::Relaxed);
        group.forget_unwritten(written_bytes);
        // Every append that needs the disk set `needs_sync`; when none did,
        // the sequence still advances: all earlier durable appends were
        // synced by earlier rounds.
        if needs_sync {
            // With the segments earlier rounds wrote without an fsync.
            let mut segments = std::mem::take(&mut *lock(&self.unsynced_segments));
            segments.extend(&written_segments);
            for segment in &segments {
                log.sync(*segment)?;
            }
            stats
                .fsyncs
                .fetch_add(segments.len() as u64, Ordering::Relaxed);
            stats
                .durable_appends
                .fetch_add(durable_appends, Ordering::Relaxed);
        } else {
            lock(&self.unsynced_segments).extend(&written_segments);
        }
        drop(log);
        self.synced_sequence.store(last_sequence, Ordering::Release);
        if self.ever_lost.load(Ordering::Acquire) {
            *lock(&self.retry_backoff) = RETRY_BACKOFF_MIN;
        }
        Ok(())
    }

    /// A write failed: everything not synced is lost (its confirms become
    /// nacks), and appends are refused, for a backoff when the log retries.
    fn mark_failed(&self, group: &GroupCommit) {
        let mut pending = lock(&self.pending);
        let first_lost = self.synced_sequence.load(Ordering::Acquire) + 1;
        let last_lost = pending.next_sequence - 1;
        if first_lost <= last_lost {
            pending.lost.push((first_lost, last_lost));
            self.ever_lost.store(true, Ordering::Release);
        }
        pending.failed = true;
        pending.chunks.clear();
        pending.writing.clear();
        group.forget_unwritten(self.unwritten_bytes.swap(0, Ordering::Relaxed));
        if self.retries_after_failure.load(Ordering::Acquire)
            && pending.lost.len() < LOST_RANGES_MAX
        {
            let mut backoff = lock(&self.retry_backoff);
            pending.retry_at = Some(Instant::now() + *backoff);
            tracing::warn!(dir = %self.dir.display(), retry_in_ms = backoff.as_millis() as u64, "a log's write failed; its unconfirmed appends are nacked, and it is written to again after a pause");
            *backoff = (*backoff * 2).min(RETRY_BACKOFF_MAX);
        }
    }
}

/// What the sync thread has done since it started: how well group commit
/// batches is `durable_appends / fsyncs`.
#[derive(Default)]
pub struct SyncStats {
    pub fsyncs: AtomicU64,
    pub durable_appends: AtomicU64,
    /// Rounds a paced sync thread held back (see [`RoundPacing`]).
    pub held_rounds: AtomicU64,
}

/// The node's sync thread and the set of logs with unwritten appends.
pub struct GroupCommit {
    pub stats: SyncStats,
    dirty: Mutex<Vec<Arc<LogBuffer>>>,
    wake: Condvar,
    stop: AtomicBool,
    rounds: AtomicU64,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Rounds start at most this often: a longer interval gathers more
    /// appends into each fsync, for disks where an fsync is expensive.
    sync_interval: Duration,
    /// For a sync thread shared by many writers: when a round waits to
    /// gather more.
    pacing: Option<RoundPacing>,
    /// Bytes appended to any log and not yet written: the node's memory
    /// waiting on its disk.
    unwritten_total: AtomicU64,
    /// The node-wide bound on `unwritten_total` that writers check with
    /// [`GroupCommit::is_over_write_budget`]; u64::MAX is none.
    unwritten_total_max: AtomicU64,
    /// Called once `unwritten_total` is back to half the bound, for writers
    /// that paused over it.
    budget_waiters: Mutex<Vec<WrittenSignal>>,
    /// Bytes logs with deferred writes hold and have not handed to a round
    /// yet; past [`DEFERRED_TOTAL_MAX`], their appends are written at once.
    deferred_total: Arc<AtomicU64>,
}

/// How many rounds have completed; readers compare it to know when to look
/// at their logs' synced sequences again.
pub type DurableEpoch = u64;

impl GroupCommit {
    /// Starts the sync thread. `on_round` runs on it after every round, with
    /// the round count and the logs that failed in it, so the caller can wake
    /// whoever waits for durability. Rounds start at most once per
    /// `sync_interval`; zero starts one as soon as anything is appended.
    pub fn start(
        sync_interval: Duration,
        on_round: impl Fn(DurableEpoch, &[Arc<LogBuffer>]) + Send + 'static,
    ) -> Arc<Self> {
        Self::spawn("sluice-sync", sync_interval, None, on_round)
    }

    /// Starts a sync thread named `name` (a log that wants rounds of its
    /// own, apart from the node's).
    pub fn start_named(
        name: &str,
        sync_interval: Duration,
        on_round: impl Fn(DurableEpoch, &[Arc<LogBuffer>]) + Send + 'static,
    ) -> Arc<Self> {
        Self::spawn(name, sync_interval, None, on_round)
    }

    /// Starts a sync thread named `name` whose rounds wait as `pacing`
    /// says; its writers count themselves with [`GroupCommit::count_writer`].
    pub fn start_paced(
        name: &str,
        pacing: RoundPacing,
        on_round: impl Fn(DurableEpoch, &[Arc<LogBuffer>]) + Send + 'static,
    ) -> Arc<Self> {
        Self::spawn(name, Duration::ZERO, Some(pacing), on_round)
    }

    fn spawn(
        name: &str,
        sync_interval: Duration,
        pacing: Option<RoundPacing>,
        on_round: impl Fn(DurableEpoch, &[Arc<LogBuffer>]) + Send + 'static,
    ) -> Arc<Self> {
        let group = Arc::new(GroupCommit {
            stats: SyncStats::default(),
            sync_interval,
            pacing,
            dirty: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            rounds: AtomicU64::new(0),
            thread: Mutex::new(None),
            unwritten_total: AtomicU64::new(0),
            unwritten_total_max: AtomicU64::new(u64::MAX),
            budget_waiters: Mutex::new(Vec::new()),
            deferred_total: Arc::new(AtomicU64::new(0)),
        });
        let worker = Arc::clone(&group);
        let thread = crate::essential_thread::spawn(name, move || worker.run(on_round));
        *lock(&group.thread) = Some(thread);
        group
    }

    /// Counts a writer into the next round of a paced sync thread (see
    /// [`RoundPacing::count_writer`]); nothing for one that is not paced.
    pub fn count_writer(&self, counted_for: &AtomicU64) {
        if let Some(pacing) = &self.pacing {
            pacing.count_writer(counted_for);
        }
    }

    fn mark_dirty(&self, log: Arc<LogBuffer>) {
        lock(&self.dirty).push(log);
        self.wake.notify_one();
    }

    pub fn rounds(&self) -> DurableEpoch {
        self.rounds.load(Ordering::Acquire)
    }

    /// Bounds the bytes all logs together may hold unwritten: past it,
    /// writers are expected to pause (see [`GroupCommit::is_over_write_budget`]).
    /// Per-log bounds alone would let the total grow with the number of logs.
    pub fn set_write_budget(&self, unwritten_total_max: u64) {
        self.unwritten_total_max
            .store(unwritten_total_max, Ordering::Relaxed);
    }

    /// Bytes appended to any log of this group and not yet written.
    pub fn unwritten_total(&self) -> u64 {
        self.unwritten_total.load(Ordering::Relaxed)
    }

    /// Whether the logs together hold more unwritten than the write budget.
    pub fn is_over_write_budget(&self) -> bool {
        self.unwritten_total() > self.unwritten_total_max.load(Ordering::Relaxed)
    }

    /// Whether the unwritten total is down to half the budget: writers that
    /// paused over it may resume. The gap keeps them from flapping.
    pub fn is_write_budget_drained(&self) -> bool {
        self.unwritten_total() <= self.unwritten_total_max.load(Ordering::Relaxed) / 2
    }

    /// Calls `signal` from the sync thread once the unwritten total is down
    /// to half the budget. Never inline, so the caller may hold its own
    /// locks; while signals wait, an idle sync thread looks every
    /// `BUDGET_POLL_INTERVAL`.
    pub fn when_write_budget_drained(&self, signal: WrittenSignal) {
        lock(&self.budget_waiters).push(signal);
        // The last write may have drained the budget just before the push,
        // with the sync thread then going idle: wake it to look again.
        // Under `dirty`, which the thread holds from its look at the
        // waiters until it waits, so the wake-up cannot fall in between.
        let _dirty = lock(&self.dirty);
        self.wake.notify_one();
    }

    fn forget_unwritten(&self, bytes: u64) {
        self.unwritten_total.fetch_sub(bytes, Ordering::Relaxed);
    }

    fn signal_budget_waiters(&self) {
        if !self.is_write_budget_drained() {
            return;
        }
        let waiters = std::mem::take(&mut *lock(&self.budget_waiters));
        for signal in waiters {
            signal();
        }
    }

    fn run(&self, on_round: impl Fn(DurableEpoch, &[Arc<LogBuffer>])) {
        let mut round_started = Instant::now();
        let mut round_took = Duration::ZERO;
        loop {
            let since_last = round_started.elapsed();
            if since_last < self.sync_interval && !self.stop.load(Ordering::Acquire) {
                std::thread::sleep(self.sync_interval - since_last);
            }
            let mut logs = {
                let mut dirty = lock(&self.dirty);
                while dirty.is_empty() && !self.stop.load(Ordering::Acquire) {
                    if lock(&self.budget_waiters).is_empty() {
                        dirty = self
                            .wake
                            .wait(dirty)
                            .unwrap_or_else(|poisoned| poisoned.into_inner());
                    } else {
                        dirty = self
                            .wake
                            .wait_timeout(dirty, BUDGET_POLL_INTERVAL)
                            .unwrap_or_else(|poisoned| poisoned.into_inner())
                            .0;
                        // Signals take their writers' locks, which may be
                        // held by someone appending (and so wanting `dirty`).
                        drop(dirty);
                        self.signal_budget_waiters();
                        dirty = lock(&self.dirty);
                    }
                }
                if dirty.is_empty() {
                    return;
                }
                if let Some(pacing) = &self.pacing {
                    let wait = pacing
                        .pause(round_took)
                        .saturating_sub(round_started.elapsed());
                    if !wait.is_zero() && !self.stop.load(Ordering::Acquire) {
                        self.stats.held_rounds.fetch_add(1, Ordering::Relaxed);
                        drop(dirty);
                        std::thread::sleep(wait);
                        dirty = lock(&self.dirty);
                    }
                    pacing.round_starting();
                }
                std::mem::take(&mut *dirty)
            };
            round_started = Instant::now();
            // Logs that need an fsync first, side by side; logs only to be
            // written (the Raft logs behind the write-ahead log) after, on
            // the threads at hand: a write alone takes no helper thread.
            logs.sort_by_cached_key(|log| !log.needs_sync());
            let syncing = logs.iter().take_while(|log| log.needs_sync()).count();
            let helpers = syncing.clamp(1, SYNC_THREADS_MAX) - 1;
            let failed = Mutex::new(Vec::new());
            let next = AtomicUsize::new(0);
            // One log's write and fsync at a time; several threads share a
            // round's logs, so one round costs about one fsync's time, not
            // one per queue journal.
            let work = || {
                while let Some(log) = logs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Err(error) = log.write_and_sync(self) {
                        tracing::error!(%error, "a log failed to write; its unconfirmed messages will be nacked");
                        log.mark_failed(self);
                        lock(&failed).push(Arc::clone(log));
                    }
                    log.signal_written();
                    self.signal_budget_waiters();
                }
            };
            if helpers == 0 {
                work();
            } else {
                std::thread::scope(|scope| {
                    for _ in 0..helpers {
                        scope.spawn(work);
                    }
                    work();
                });
            }
            let failed = failed
                .into_inner()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let round = self.rounds.fetch_add(1, Ordering::AcqRel) + 1;
            on_round(round, &failed);
            round_took = round_started.elapsed();
        }
    }

    /// Writes what is buffered, then stops the sync thread.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.notify_all();
        let thread = lock(&self.thread).take();
        if let Some(thread) = thread {
            // The last owner may let go on the sync thread itself (a signal
            // it runs holds a reference for a moment): that thread sees the
            // stop flag once its round ends and cannot wait for itself.
            if thread.thread().id() == std::thread::current().id() {
                return;
            }
            let name = thread.thread().name().unwrap_or("sync").to_owned();
            let _ = thread.join();
            let fsyncs = self.stats.fsyncs.load(Ordering::Relaxed);
            let durable_appends = self.stats.durable_appends.load(Ordering::Relaxed);
            tracing::info!(
                thread = name,
                fsyncs,
                durable_appends,
                held_rounds = self.stats.held_rounds.load(Ordering::Relaxed),
                appends_per_fsync = durable_appends as f64 / fsyncs.max(1) as f64,
                "group commit totals"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn group_commit_stopped_from_its_own_sync_thread_ends_that_thread() {
        // A written signal may hold the last reference to its WAL, whose
        // drop stops the sync thread the signal runs on.
        let dir = crate::log::tests::temp_dir("group-self-stop");
        let (log, _) = SegmentLog::recover_all(&dir).unwrap();
        let buffer = LogBuffer::new(log, 4096);
        let group = GroupCommit::start(Duration::ZERO, |_, _| {});
        let (stopped_sender, stopped) = mpsc::channel();
        let owner = Mutex::new(Some(Arc::clone(&group)));
        buffer.set_written_signal(Box::new(move || {
            let group = lock(&owner).take();
            if let Some(group) = group {
                group.stop();
                let _ = stopped_sender.send(());
            }
        }));
        buffer.request_written_signal();
        let (_, sequence) = buffer.append(&group, 1, &[b"last words"]).unwrap();
        stopped
            .recv_timeout(Duration::from_secs(5))
            .expect("the signal ran and stop returned on the sync thread");
        assert!(buffer.is_synced(sequence));
        let sync_thread = lock(&group.thread).take();
        assert!(sync_thread.is_none(), "stop took the thread's handle");
    }

    #[test]
    fn group_commit_syncs_appends_and_reads_them_back() {
        let dir = crate::log::tests::temp_dir("group");
        let (log, _) = SegmentLog::recover_all(&dir).unwrap();
        let buffer = LogBuffer::new(log, 256);
        let (rounds_sender, rounds) = mpsc::channel();
        let group = GroupCommit::start(Duration::ZERO, move |round, failed| {
            assert!(failed.is_empty());
            let _ = rounds_sender.send(round);
        });
        let mut locations = Vec::new();
        let mut last_sequence = 0;
        for index in 0..20u8 {
            let payload = vec![index; 40];
            let (location, sequence) = buffer.append(&group, 1, &[&payload]).unwrap();
            locations.push(location);
            last_sequence = sequence;
        }
        // Readable before and after the write.
        assert_eq!(
            &buffer.read(locations[3]).unwrap().payload[..],
            &[3u8; 40][..]
        );
        while !buffer.is_synced(last_sequence) {
            rounds
                .recv_timeout(Duration::from_secs(5))
                .expect("a sync round completes");
        }
        assert_eq!(
            &buffer.read(locations[19]).unwrap().payload[..],
            &[19u8; 40][..]
        );
        // 20 records of 49 bytes with 256-byte segments roll over several times.
        assert!(locations.last().unwrap().segment > 1);
        // Every append needed the disk, and every fsync covered at least one.
        let fsyncs = group.stats.fsyncs.load(Ordering::Relaxed);
        assert!(fsyncs >= 1);
        assert_eq!(group.stats.durable_appends.load(Ordering::Relaxed), 20);
        group.stop();
        drop(buffer);
        let (_, records) = SegmentLog::recover_all(&dir).unwrap();
        assert_eq!(records.len(), 20);
        assert!(records
            .iter()
            .enumerate()
            .all(|(index, found)| found.record.payload[0] == index as u8));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Rounds of `writers` writers, each appending once and waiting for
    /// the round to sync it; the rounds the sync thread held back.
    fn held_rounds_with(writers: usize) -> u64 {
        let dir = crate::log::tests::temp_dir(&format!("paced-{writers}"));
        let (log, _) = SegmentLog::recover_all(&dir).unwrap();
        let buffer = LogBuffer::new(log, 1024 * 1024);
        // Any round that can be held is, for the whole bound.
        let pacing = RoundPacing::new(1_000_000, Duration::from_millis(5), 3);
        let group = GroupCommit::start_paced("sluice-paced-test", pacing, |_, _| {});
        let counted: Vec<AtomicU64> = (0..writers).map(|_| AtomicU64::new(0)).collect();
        for _ in 0..5 {
            let mut last = 0;
            for writer in &counted {
                group.count_writer(writer);
                last = buffer.append(&group, 1, &[b"record"]).unwrap().1;
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while !buffer.is_synced(last) {
                assert!(Instant::now() < deadline, "a round syncs the appends");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        group.stop();
        std::fs::remove_dir_all(&dir).unwrap();
        group.stats.held_rounds.load(Ordering::Relaxed)
    }

    #[test]
    fn a_paced_sync_thread_holds_rounds_back_only_for_enough_writers() {
        assert_eq!(held_rounds_with(1), 0, "a lone writer is never held back");
        assert!(held_rounds_with(3) > 0, "three writers are");
    }

    #[test]
    fn deferred_writes_wait_in_memory_until_asked_or_large() {
        let dir = crate::log::tests::temp_dir("deferred");
        let (log, _) = SegmentLog::recover_all(&dir).unwrap();
        let buffer = LogBuffer::with_deferred_writes(log, 64 * 1024 * 1024);
        let group = GroupCommit::start(Duration::ZERO, |_, _| {});
        let (location, sequence) = buffer.append_unsynced(&group, 1, &[b"first"]).unwrap();
        // No round writes it, yet it reads back, and it counts as deferred,
        // not as waiting for the disk.
        std::thread::sleep(Duration::from_millis(50));
        assert!(!buffer.is_synced(sequence));
        assert_eq!(&buffer.read(location).unwrap().payload[..], b"first");
        assert!(group.deferred_total.load(Ordering::Relaxed) > 0);
        assert_eq!(group.unwritten_total(), 0);
        buffer.write_soon(&group);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !buffer.is_synced(sequence) {
            assert!(Instant::now() < deadline, "write_soon wrote it");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(group.deferred_total.load(Ordering::Relaxed), 0);
        assert_eq!(group.unwritten_total(), 0);
        // Appends past the bound are handed to a round without being asked:
        // the one that reaches it and those before. Any after it may start
        // the next deferral, if a round took the log in between.
        let payload = vec![7u8; 4096];
        let record_length = (RECORD_HEADER_SIZE + 1 + payload.len()) as u64;
        let mut deferred = 0;
        let mut reaching = None;
        let mut last = 0;
        for _ in 0..=(DEFERRED_WRITE_BYTES / 4096) {
            last = buffer.append_unsynced(&group, 1, &[&payload]).unwrap().1;
            deferred += record_length;
            if reaching.is_none() && deferred >= DEFERRED_WRITE_BYTES {
                reaching = Some(last);
            }
        }
        let reaching = reaching.expect("the appends pass the bound");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !buffer.is_synced(reaching) {
            assert!(Instant::now() < deadline, "a large deferral is written");
            std::thread::sleep(Duration::from_millis(1));
        }
        // What started the next deferral is written when asked.
        buffer.write_soon(&group);
        while !buffer.is_synced(last) {
            assert!(Instant::now() < deadline, "write_soon wrote the rest");
            std::thread::sleep(Duration::from_millis(1));
        }
        // None of them made a round fsync; `sync_written` does.
        assert_eq!(group.stats.fsyncs.load(Ordering::Relaxed), 0);
        buffer.sync_written().unwrap();
        // A log dropped with deferred bytes leaves no count behind.
        buffer.append_unsynced(&group, 1, &[b"dropped"]).unwrap();
        drop(buffer);
        assert_eq!(group.deferred_total.load(Ordering::Relaxed), 0);
        group.stop();
        let (_, records) = SegmentLog::recover_all(&dir).unwrap();
        assert_eq!(records.len(), 2 + (DEFERRED_WRITE_BYTES / 4096) as usize);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn write_budget_counts_every_log_and_signals_when_drained() {
        let dirs = [
            crate::log::tests::temp_dir("budget-a"),
            crate::log::tests::temp_dir("budget-b"),
        ];
        let buffers: Vec<Arc<LogBuffer>> = dirs
            .iter()
            .map(|dir| LogBuffer::new(SegmentLog::recover_all(dir).unwrap().0, 1 << 20))
            .collect();
        // The first round starts only after this interval: the appends below
        // all wait in memory until then.
        let group = GroupCommit::start(Duration::from_secs(2), |_, _| {});
        group.set_write_budget(3000);
        let payload = vec![1u8; 991]; // 1000 bytes with the record's header
        for buffer in &buffers {
            buffer.append_unsynced(&group, 1, &[&payload]).unwrap();
        }
        assert_eq!(group.unwritten_total(), 2000);
        assert!(!group.is_over_write_budget(), "two logs, 2000 of 3000");
        buffers[0].append_unsynced(&group, 1, &[&payload]).unwrap();
        buffers[1].append_unsynced(&group, 1, &[&payload]).unwrap();
        assert!(group.is_over_write_budget(), "4000 across both logs");
        assert!(!group.is_write_budget_drained());
        let (drained_sender, drained) = mpsc::channel();
        group.when_write_budget_drained(Box::new(move || {
            let _ = drained_sender.send(());
        }));
        drained
            .recv_timeout(Duration::from_secs(10))
            .expect("the sync round drains the budget and signals");
        assert_eq!(group.unwritten_total(), 0);
        assert!(group.is_write_budget_drained());
        group.stop();
        drop(buffers);
        for dir in dirs {
            std::fs::remove_dir_all(dir).unwrap();
        }
    }

    #[test]
    fn preallocated_segments_are_taken_over_and_recover_without_their_zeros() {
        let dir = crate::log::tests::temp_dir("prealloc");
        let (log, _) = SegmentLog::recover_all(&dir).unwrap();
        let segment_size = 64 * 1024;
        let buffer = LogBuffer::with_preallocation(log, segment_size);
        let group = GroupCommit::start(Duration::ZERO, |_, _| {});
        let payload = vec![7u8; 1000];
        let append_and_sync = |count: usize| {
            let mut last = 0;
            for _ in 0..count {
                last = buffer.append(&group, 1, &[&payload]).unwrap().1;
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while !buffer.is_synced(last) {
                assert!(Instant::now() < deadline, "never synced");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        // Past half of segment 1: segment 2 is zero-filled ahead of use.
        append_and_sync(40);
        let ready = dir.join(format!("{:016}.seg.ready", 2));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            assert!(Instant::now() < deadline, "segment 2 was never prepared");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(std::fs::metadata(&ready).unwrap().len(), segment_size);
        // Rolling over takes the prepared file: full size, records at its start.
        append_and_sync(40);
        assert!(!ready.exists());
        let second = crate::segment::segment_path(&dir, 2);
        assert_eq!(std::fs::metadata(&second).unwrap().len(), segment_size);
        group.stop();
        drop(buffer);
        let (_, records) = SegmentLog::recover_all(&dir).unwrap();
        assert_eq!(records.len(), 80, "every record, none made of zeros");
        assert!(records
            .iter()
            .all(|found| found.record.payload[..] == payload[..]));
        assert!(std::fs::metadata(&second).unwrap().len() < segment_size);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
