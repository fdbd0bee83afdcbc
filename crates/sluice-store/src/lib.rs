//! Durable storage for Sluice.
//!
//! - [`record`]: the on-disk record: length, CRC-32 checksum, kind, payload.
//! - [`segment`]: one append-only file of records, and scanning it back.
//! - [`log`]: a sequence of segments in a directory, rolled at a size bound,
//!   with whole segments deleted once nothing in them is needed.
//! - [`group_commit`]: the sync thread that writes buffered records and makes
//!   them durable with one fdatasync per file per round, and the epochs that
//!   tell publishers when their records are durable.
//! - [`round_pacing`]: when a sync thread shared by many writers holds a
//!   round back to gather more of them.
//!
//! Storage code checks length and checksum before writing and again after
//! reading: a torn or corrupt tail is truncated at recovery, never trusted.

pub mod essential_thread;
pub mod group_commit;
pub mod log;
pub mod record;
pub mod round_pacing;
pub mod segment;

pub use group_commit::{DurableEpoch, GroupCommit, LogBuffer};
pub use log::{MissingSegments, SegmentLog};
pub use record::{Record, RecordError};

/// Storage failures. An I/O error on a log is fatal for that log: callers
/// stop accepting writes to it and nack what waits on it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// Segments are numbered without gaps (only the oldest are ever
    /// deleted): a gap is a file lost from the middle, and its records with
    /// it.
    #[error(
        "{dir} is missing segment file(s) {missing:?} between segments {first} and {last}: the records in them would be lost. Restore the files, or set store.missing_segments = skip to start without them"
    )]
    MissingSegments {
        dir: String,
        missing: Vec<u64>,
        first: u64,
        last: u64,
    },
}

impl StoreError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        StoreError::Io {
            context: context.into(),
            source,
        }
    }
}

/// Makes the entries of `dir` durable: a file created, renamed or removed
/// in it survives a power loss only once its directory is synced too (an
/// fdatasync of the file itself does not promise its name).
pub fn sync_dir(dir: &std::path::Path) -> Result<(), StoreError> {
    std::fs::File::open(dir)
        .and_then(|directory| directory.sync_all())
        .map_err(|error| StoreError::io(format!("syncing the directory {}", dir.display()), error))
}
