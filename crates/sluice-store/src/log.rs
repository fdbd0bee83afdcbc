//! A directory of segments: the durable log of one queue (or of the node's
//! definitions). Records are appended to the newest segment; a new segment
//! starts when the newest passes the size bound; old segments are deleted
//! whole once their owner no longer needs them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::record::Record;
use crate::record::RecordError;
use crate::segment::{is_preallocation_leftover, segment_id, Segment};
use crate::StoreError;

/// A record found at recovery, with where it lives.
pub struct RecoveredRecord {
    pub segment: u64,
    pub position: u64,
    pub record: Record,
}

/// A record as recovery visits it: borrowed from the segment being read.
pub struct RecordView<'a> {
    pub segment: u64,
    pub position: u64,
    pub kind: u8,
    pub payload: &'a [u8],
}

/// What recovery does about segment files missing between others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MissingSegments {
    /// Refuse to open the log: the operator restores the files or decides.
    #[default]
    Refuse,
    /// Open it without them, saying which are gone.
    Skip,
}

/// Segments are only ever deleted oldest first, so the ids on disk run
/// without a gap; a gap is a file lost from the middle.
fn check_contiguous(dir: &Path, ids: &[u64], policy: MissingSegments) -> Result<(), StoreError> {
    let missing: Vec<u64> = ids
        .windows(2)
        .flat_map(|pair| pair[0] + 1..pair[1])
        .take(1000)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let error = StoreError::MissingSegments {
        dir: dir.display().to_string(),
        missing,
        first: ids[0],
        last: ids[ids.len() - 1],
    };
    match policy {
        MissingSegments::Refuse => Err(error),
        MissingSegments::Skip => {
            tracing::error!(%error, "opening the log without the missing segments (store.missing_segments = skip)");
            Ok(())
        }
    }
}

pub struct SegmentLog {
    pub dir: PathBuf,
    segments: BTreeMap<u64, Segment>,
}

impl SegmentLog {
    /// Opens the log in `dir` (created when missing) and hands every valid
    /// record to `visit`, oldest first, one segment in memory at a time. A
    /// torn or corrupt tail of any segment is cut off and logged; the records
    /// before it are kept.
    ///
    /// # Errors
    /// I/O errors, and [`StoreError::MissingSegments`] for a segment missing
    /// between others (see [`SegmentLog::recover_with`] to go on without).
    pub fn recover(dir: &Path, visit: impl FnMut(RecordView<'_>)) -> Result<Self, StoreError> {
        Self::recover_with(dir, MissingSegments::Refuse, visit)
    }

    /// As [`SegmentLog::recover`], with what to do about segments missing
    /// from the middle of the log.
    ///
    /// # Errors
    /// As [`SegmentLog::recover`].
    pub fn recover_with(
        dir: &Path,
        missing_segments: MissingSegments,
        mut visit: impl FnMut(RecordView<'_>),
    ) -> Result<Self, StoreError> {
        let created = !dir.exists();
        std::fs::create_dir_all(dir)
            .map_err(|error| StoreError::io(format!("creating {}", dir.display()), error))?;
        if created {
            if let Some(parent) = dir.parent() {
                crate::sync_dir(parent)?;
            }
        }
        let paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|error| StoreError::io(format!("listing {}", dir.display()), error))?
            .filter_map(|entry| entry.ok())
            .map(|entry| entry.path())
            .collect();
        for path in paths.iter().filter(|path| is_preallocation_leftover(path)) {
            let _ = std::fs::remove_file(path);
        }
        let mut ids: Vec<u64> = paths.iter().filter_map(|path| segment_id(path)).collect();
        ids.sort_unstable();
        check_contiguous(dir, &ids, missing_segments)?;
        let newest = ids.last().copied();
        let mut segments = BTreeMap::new();
        // One buffer, grown to the largest segment, for every segment read.
        let mut buffer = Vec::new();
        for id in ids {
            let mut segment = Segment::open(dir, id)?;
            let (valid_length, stopped_by) =
                Segment::scan_into(&segment.path, &mut buffer, |position, kind, payload| {
                    visit(RecordView {
                        segment: id,
                        position,
                        kind,
                        payload,
                    })
                })?;
            let preallocated_tail = matches!(stopped_by, Some(RecordError::BadLength(0)))
                && buffer[valid_length as usize..]
                    .iter()
                    .all(|byte| *byte == 0);
            if preallocated_tail {
                // The unused zeros of a preallocated segment: nothing was lost.
                segment.truncate(valid_length)?;
            } else if let Some(reason) = &stopped_by {
                if Some(id) == newest {
                    // Where appends continue: a crash mid-write tears this
                    // tail, and what it held was never confirmed.
                    tracing::warn!(
                        segment = %segment.path.display(),
                        kept_bytes = valid_length,
                        dropped_bytes = segment.size - valid_length,
                        %reason,
                        "truncating a torn segment tail"
                    );
                    segment.truncate(valid_length)?;
                } else {
                    // An older segment is damaged, or was torn together with
                    // a power loss mid-round. Nothing is appended to it again,
                    // so its bytes are kept as they are for inspection: what
                    // follows the damage is skipped, not destroyed.
                    tracing::error!(
                        segment = %segment.path.display(),
                        valid_bytes = valid_length,
                        skipped_bytes = segment.size - valid_length,
                        %reason,
                        "a journal segment is damaged: the records after the damage are skipped; the file is kept"
                    );
                }
            }
            segments.insert(id, segment);
        }
        Ok(SegmentLog {
            dir: dir.to_path_buf(),
            segments,
        })
    }

    /// Recovers the log and collects its records: for tests and small logs.
    pub fn recover_all(dir: &Path) -> Result<(Self, Vec<RecoveredRecord>), StoreError> {
        let mut records = Vec::new();
        let log = Self::recover(dir, |view| {
            records.push(RecoveredRecord {
                segment: view.segment,
                position: view.position,
                record: Record {
                    kind: view.kind,
                    payload: Bytes::copy_from_slice(view.payload),
                },
            })
        })?;
        Ok((log, records))
    }

    /// The newest segment's id and size, where appends continue.
    pub fn head(&self) -> Option<(u64, u64)> {
        self.segments
            .last_key_value()
            .map(|(id, segment)| (*id, segment.size))
    }

    /// Appends bytes to segment `id`, creating it when it is new.
    pub fn write(&mut self, id: u64, bytes: &[u8]) -> Result<(), StoreError> {
        let segment = match self.segments.entry(id) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => {
                let segment = Segment::open(&self.dir, id)?;
                // The new name (a created file, or a preallocated one
                // renamed) must be on disk before anything written into it
                // is reported durable; this runs before the round's fsync.
                crate::sync_dir(&self.dir)?;
                entry.insert(segment)
            }
        };
        segment.write(bytes)
    }

    pub fn sync(&self, id: u64) -> Result<(), StoreError> {
        match self.segments.get(&id) {
            Some(segment) => segment.sync(),
            None => Ok(()),
        }
    }

    pub fn read(&self, id: u64, position: u64, length: usize) -> Result<Bytes, StoreError> {
        match self.segments.get(&id) {
            Some(segment) => segment.read_at(position, length),
            None => Err(StoreError::io(
                format!("reading segment {id} of {}", self.dir.display()),
                std::io::Error::new(std::io::ErrorKind::NotFound, "segment was deleted"),
            )),
        }
    }

    /// Deletes every segment older than `id`.
    pub fn remove_segments_before(&mut self, id: u64) -> Result<usize, StoreError> {
        let doomed: Vec<u64> = self.segments.range(..id).map(|(id, _)| *id).collect();
        for doomed_id in &doomed {
            if let Some(segment) = self.segments.remove(doomed_id) {
                std::fs::remove_file(&segment.path).map_err(|error| {
                    StoreError::io(format!("deleting {}", segment.path.display()), error)
                })?;
            }
        }
        Ok(doomed.len())
    }

    pub fn segment_ids(&self) -> Vec<u64> {
        self.segments.keys().copied().collect()
    }

    /// Deletes the whole log (the queue was deleted).
    pub fn destroy(self) -> Result<(), StoreError> {
        let dir = self.dir.clone();
        drop(self);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(StoreError::io(format!("deleting {}", dir.display()), error)),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::record::encode_record;
    use bytes::BytesMut;
    use std::io::Write;

    pub(crate) fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sluice-store-{name}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn record_bytes(kind: u8, payload: &[u8]) -> BytesMut {
        let mut out = BytesMut::new();
        encode_record(&mut out, kind, &[payload]);
        out
    }

    #[test]
    fn log_recovery_truncates_a_torn_tail() {
        let dir = temp_dir("torn");
        let (mut log, records) = SegmentLog::recover_all(&dir).unwrap();
        assert!(records.is_empty());
        log.write(1, &record_bytes(1, b"first")).unwrap();
        log.write(1, &record_bytes(1, b"second")).unwrap();
        log.sync(1).unwrap();
        drop(log);
        // A crash mid-write leaves half a record behind.
        let torn = record_bytes(1, b"third, torn");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(crate::segment::segment_path(&dir, 1))
            .unwrap();
        file.write_all(&torn[..torn.len() - 3]).unwrap();
        drop(file);

        let (mut log, records) = SegmentLog::recover_all(&dir).unwrap();
        let payloads: Vec<&[u8]> = records
            .iter()
            .map(|found| &found.record.payload[..])
            .collect();
        assert_eq!(payloads, vec![&b"first"[..], &b"second"[..]]);
        // Appends continue after the valid prefix.
        log.write(1, &record_bytes(1, b"fourth")).unwrap();
        drop(log);
        let (_, records) = SegmentLog::recover_all(&dir).unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(&records[2].record.payload[..], b"fourth");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn log_recovery_refuses_a_segment_missing_from_the_middle_unless_told_to_skip_it() {
        let dir = temp_dir("missing-middle");
        let (mut log, _) = SegmentLog::recover_all(&dir).unwrap();
        for segment in 1..=4 {
            log.write(
                segment,
                &record_bytes(1, format!("in {segment}").as_bytes()),
            )
            .unwrap();
        }
        drop(log);
        std::fs::remove_file(crate::segment::segment_path(&dir, 2)).unwrap();
        std::fs::remove_file(crate::segment::segment_path(&dir, 3)).unwrap();

        let refused = SegmentLog::recover_all(&dir).err().expect("refused");
        let text = refused.to_string();
        assert!(
            matches!(&refused, StoreError::MissingSegments { missing, first: 1, last: 4, .. } if *missing == [2, 3]),
            "{text}"
        );
        assert!(text.contains(&dir.display().to_string()), "{text}");
        assert!(text.contains("store.missing_segments = skip"), "{text}");

        let mut seen = Vec::new();
        let log = SegmentLog::recover_with(&dir, MissingSegments::Skip, |view| {
            seen.push(view.payload.to_vec())
        })
        .unwrap();
        assert_eq!(seen, [b"in 1".to_vec(), b"in 4".to_vec()]);
        assert_eq!(log.segment_ids(), vec![1, 4]);
        // The oldest going, as compaction deletes them, is no gap.
        std::fs::remove_file(crate::segment::segment_path(&dir, 1)).unwrap();
        assert!(SegmentLog::recover_all(&dir).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn log_recovery_keeps_a_damaged_older_segment_as_it_is() {
        let dir = temp_dir("damaged-old");
        let (mut log, _) = SegmentLog::recover_all(&dir).unwrap();
        log.write(1, &record_bytes(1, b"before the damage"))
            .unwrap();
        log.write(1, &record_bytes(1, b"damaged")).unwrap();
        log.write(1, &record_bytes(1, b"after the damage")).unwrap();
        log.write(2, &record_bytes(1, b"newer")).unwrap();
        drop(log);
        let path = crate::segment::segment_path(&dir, 1);
        let mut contents = std::fs::read(&path).unwrap();
        let damaged_at = record_bytes(1, b"before the damage").len() + 12;
        contents[damaged_at] ^= 0x01;
        std::fs::write(&path, &contents).unwrap();

        let (log, records) = SegmentLog::recover_all(&dir).unwrap();
        let payloads: Vec<&[u8]> = records
            .iter()
            .map(|found| &found.record.payload[..])
            .collect();
        assert_eq!(payloads, vec![&b"before the damage"[..], &b"newer"[..]]);
        // Skipped, not cut off: the bytes after the damage are still there.
        assert_eq!(std::fs::read(&path).unwrap(), contents);
        log.destroy().unwrap();
    }

    #[test]
    fn log_recovery_stops_at_a_flipped_byte_and_removes_old_segments() {
        let dir = temp_dir("flipped");
        let (mut log, _) = SegmentLog::recover_all(&dir).unwrap();
        log.write(1, &record_bytes(1, b"old")).unwrap();
        log.write(2, &record_bytes(1, b"good")).unwrap();
        log.write(2, &record_bytes(1, b"will be flipped")).unwrap();
        drop(log);
        let path = crate::segment::segment_path(&dir, 2);
        let mut contents = std::fs::read(&path).unwrap();
        let last = contents.len() - 2;
        contents[last] ^= 0x01;
        std::fs::write(&path, contents).unwrap();

        let (mut log, records) = SegmentLog::recover_all(&dir).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[1].segment, 2);
        assert_eq!(log.segment_ids(), vec![1, 2]);
        assert_eq!(log.remove_segments_before(2).unwrap(), 1);
        assert_eq!(log.segment_ids(), vec![2]);
        assert!(!crate::segment::segment_path(&dir, 1).exists());
        log.destroy().unwrap();
        assert!(!dir.exists());
    }
}
