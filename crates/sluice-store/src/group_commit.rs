//! Group commit: appends go into a log's in-memory buffer on the caller's
//! thread (a copy, no syscall); one sync thread writes every dirty log's
//! buffer and fdatasyncs it, then reports the round. Appends made while a
//! round's fsync runs go into the next round, so under load one fsync covers
//! many messages and the batch grows with the fsync's duration by itself.
//!
//! Durability is tracked per log with sequence numbers: every append gets the
//! log's next sequence number, and a log's `synced_sequence` says up to which
//! append its bytes are on disk.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use bytes::{Bytes, BytesMut};

use crate::log::SegmentLog;
use crate::record::{decode_record, encode_record, Record, RECORD_HEADER_SIZE};
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
    head_segment: u64,
    head_size: u64,
    next_sequence: Sequence,
    failed: bool,
    destroyed: bool,
    /// Something buffered must be fsynced (not only records that can be
    /// lost in a crash without harm).
    needs_sync: bool,
}

/// The write side of one [`SegmentLog`]: a buffer of appends waiting for the
/// sync thread, and the log itself.
pub struct LogBuffer {
    pending: Mutex<Pending>,
    log: Mutex<SegmentLog>,
    segment_size_max: u64,
    synced_sequence: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl LogBuffer {
    pub fn new(log: SegmentLog, segment_size_max: u64) -> Arc<Self> {
        let (head_segment, head_size) = log.head().unwrap_or((1, 0));
        Arc::new(LogBuffer {
            pending: Mutex::new(Pending {
                chunks: Vec::new(),
                head_segment,
                head_size,
                next_sequence: 1,
                needs_sync: false,
                failed: false,
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
        pending.needs_sync |= needs_sync;
        if pending.failed || pending.destroyed {
            return None;
        }
        let length =
            RECORD_HEADER_SIZE + 1 + payload_parts.iter().map(|part| part.len()).sum::<usize>();
        if pending.head_size > 0 && pending.head_size + length as u64 > self.segment_size_max {
            pending.head_segment += 1;
            pending.head_size = 0;
        }
        let segment = pending.head_segment;
        let position = pending.head_size;
        if pending.chunks.is_empty() {
            group.mark_dirty(Arc::clone(self));
        }
        match pending.chunks.last_mut() {
            Some((chunk_segment, _, bytes)) if *chunk_segment == segment => {
                encode_record(bytes, kind, payload_parts)
            }
            _ => {
                let mut bytes = BytesMut::with_capacity(length.max(64 * 1024));
                encode_record(&mut bytes, kind, payload_parts);
                pending.chunks.push((segment, position, bytes));
            }
        }
        pending.head_size += length as u64;
        let sequence = pending.next_sequence;
        pending.next_sequence += 1;
        Some((
            Location {
                segment,
                position,
                length: length as u32,
            },
            sequence,
        ))
    }

    /// Whether the append with this sequence number is on disk.
    pub fn is_synced(&self, sequence: Sequence) -> bool {
        self.synced_sequence.load(Ordering::Acquire) >= sequence
    }

    /// Whether writing this log failed: its waiting appends never become durable.
    pub fn has_failed(&self) -> bool {
        lock(&self.pending).failed
    }

    /// Reads back the record at `location`, from the buffer when it has not
    /// been written yet.
    pub fn read(&self, location: Location) -> Result<Record, StoreError> {
        let bytes = {
            let pending = lock(&self.pending);
            pending.chunks.iter().find_map(|(segment, start, bytes)| {
                let end = start + bytes.len() as u64;
                (*segment == location.segment
                    && location.position >= *start
                    && location.position < end)
                    .then(|| {
                        let offset = (location.position - start) as usize;
                        Bytes::copy_from_slice(&bytes[offset..offset + location.length as usize])
                    })
            })
        };
        let bytes = match bytes {
            Some(bytes) => bytes,
            None => lock(&self.log).read(
                location.segment,
                location.position,
                location.length as usize,
            )?,
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

    /// The segment that appends currently go to.
    pub fn head_segment(&self) -> u64 {
        lock(&self.pending).head_segment
    }

    /// Deletes whole segments older than `segment`.
    pub fn remove_segments_before(&self, segment: u64) -> Result<usize, StoreError> {
        lock(&self.log).remove_segments_before(segment)
    }

    /// Stops writing and deletes the log's files.
    pub fn destroy(&self) -> Result<(), StoreError> {
        let mut pending = lock(&self.pending);
        pending.destroyed = true;
        pending.chunks.clear();
        drop(pending);
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
    /// segment written, then advance the synced sequence.
    fn write_and_sync(&self) -> Result<(), StoreError> {
        let (chunks, last_sequence, needs_sync) = {
            let mut pending = lock(&self.pending);
            if pending.destroyed {
                return Ok(());
            }
            (
                std::mem::take(&mut pending.chunks),
                pending.next_sequence - 1,
                std::mem::take(&mut pending.needs_sync),
            )
        };
        let mut log = lock(&self.log);
        let mut written_segments = Vec::new();
        for (segment, _, bytes) in &chunks {
            log.write(*segment, bytes)?;
            if !written_segments.contains(segment) {
                written_segments.push(*segment);
            }
        }
        // Every append that needs the disk set `needs_sync`; when none did,
        // the sequence still advances: all earlier durable appends were
        // synced by earlier rounds.
        if needs_sync {
            for segment in written_segments {
                log.sync(segment)?;
            }
        }
        drop(log);
        self.synced_sequence.store(last_sequence, Ordering::Release);
        Ok(())
    }

    fn mark_failed(&self) {
        let mut pending = lock(&self.pending);
        pending.failed = true;
        pending.chunks.clear();
    }
}

/// The node's sync thread and the set of logs with unwritten appends.
pub struct GroupCommit {
    dirty: Mutex<Vec<Arc<LogBuffer>>>,
    wake: Condvar,
    stop: AtomicBool,
    rounds: AtomicU64,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// How many rounds have completed; readers compare it to know when to look
/// at their logs' synced sequences again.
pub type DurableEpoch = u64;

impl GroupCommit {
    /// Starts the sync thread. `on_round` runs on it after every round, with
    /// the round count and the logs that failed in it, so the caller can wake
    /// whoever waits for durability.
    pub fn start(on_round: impl Fn(DurableEpoch, &[Arc<LogBuffer>]) + Send + 'static) -> Arc<Self> {
        let group = Arc::new(GroupCommit {
            dirty: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            rounds: AtomicU64::new(0),
            thread: Mutex::new(None),
        });
        let worker = Arc::clone(&group);
        let thread = std::thread::Builder::new()
            .name("sluice-sync".into())
            .spawn(move || worker.run(on_round))
            .expect("the sync thread starts");
        *lock(&group.thread) = Some(thread);
        group
    }

    fn mark_dirty(&self, log: Arc<LogBuffer>) {
        lock(&self.dirty).push(log);
        self.wake.notify_one();
    }

    pub fn rounds(&self) -> DurableEpoch {
        self.rounds.load(Ordering::Acquire)
    }

    fn run(&self, on_round: impl Fn(DurableEpoch, &[Arc<LogBuffer>])) {
        loop {
            let logs = {
                let mut dirty = lock(&self.dirty);
                while dirty.is_empty() && !self.stop.load(Ordering::Acquire) {
                    dirty = self
                        .wake
                        .wait(dirty)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                if dirty.is_empty() {
                    return;
                }
                std::mem::take(&mut *dirty)
            };
            let mut failed = Vec::new();
            for log in &logs {
                if let Err(error) = log.write_and_sync() {
                    tracing::error!(%error, "a log failed to write; its unconfirmed messages will be nacked");
                    log.mark_failed();
                    failed.push(Arc::clone(log));
                }
            }
            let round = self.rounds.fetch_add(1, Ordering::AcqRel) + 1;
            on_round(round, &failed);
        }
    }

    /// Writes what is buffered, then stops the sync thread.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.notify_all();
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn group_commit_syncs_appends_and_reads_them_back() {
        let dir = crate::log::tests::temp_dir("group");
        let (log, _) = SegmentLog::recover(&dir).unwrap();
        let buffer = LogBuffer::new(log, 256);
        let (rounds_sender, rounds) = mpsc::channel();
        let group = GroupCommit::start(move |round, failed| {
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
        group.stop();
        drop(buffer);
        let (_, records) = SegmentLog::recover(&dir).unwrap();
        assert_eq!(records.len(), 20);
        assert!(records
            .iter()
            .enumerate()
            .all(|(index, found)| found.record.payload[0] == index as u8));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
