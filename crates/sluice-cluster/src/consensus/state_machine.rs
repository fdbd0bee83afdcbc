//! The caller's [`StateMachine`] as openraft applies it. The state itself
//! lives in memory; its snapshots are files, replaced atomically. At start
//! openraft installs the last snapshot and applies the committed entries
//! after it again, which is how a node gets its state back.
//!
//! A state that still reads entries it applied (a quorum queue reads its
//! message bodies back from the log) is not snapshotted as it is now: the
//! snapshot would let openraft purge those entries. Instead the state is
//! kept, from time to time, as a candidate; once the first entry the state
//! needs is past a candidate, that candidate becomes the snapshot, and the
//! log is purged only up to it. This is RabbitMQ's release cursor.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use tokio::sync::watch;

use super::log_store::{decode, LogStore};
use super::types::{LogId, Reply, SnapshotMeta, StoredMembership, TypeConfig};
use super::StateMachine;

/// A snapshot as openraft hands it around: the state machine's bytes.
pub type SnapshotData = Vec<u8>;
type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotData>;

/// Candidates kept at most: the oldest goes first (a later one is taken
/// instead, a little later).
const CANDIDATES_MAX: usize = 16;

/// A state kept for a later snapshot, in a file beside the snapshot.
struct Candidate {
    meta: SnapshotMeta,
    path: PathBuf,
}

impl Candidate {
    /// Whether it was kept before `first_needed`: the log may be purged
    /// up to it.
    fn is_before(&self, first_needed: u64) -> bool {
        self.meta
            .last_log_id
            .is_some_and(|log_id| log_id.index < first_needed)
    }
}

struct Inner {
    machine: Box<dyn StateMachine>,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    snapshot_path: PathBuf,
    /// The snapshot on disk; its bytes are read from the file when asked
    /// for (rarely: a restart, a member far behind).
    current: Option<SnapshotMeta>,
    /// Oldest first.
    candidates: VecDeque<Candidate>,
    log: LogStore,
    /// The index of the last entry applied, for proposers waiting to read
    /// their own writes.
    applied: watch::Sender<u64>,
}

/// Shared between openraft's state machine worker and its snapshot builder.
#[derive(Clone)]
pub struct GroupStateMachine {
    inner: Arc<Mutex<Inner>>,
}

fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    inner
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn read_snapshot_file(path: &Path) -> io::Result<Option<(SnapshotMeta, SnapshotData)>> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let (meta, data): (SnapshotMeta, serde_bytes::ByteBuf) = decode(&bytes)?;
            Ok(Some((meta, data.into_vec())))
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Encodes straight into the file: a deep queue's state is tens of
/// megabytes, not to be copied once more on its way out.
fn write_snapshot_file(
    path: &Path,
    meta: &SnapshotMeta,
    data: &[u8],
    sync: bool,
) -> io::Result<()> {
    let mut file = io::BufWriter::new(std::fs::File::create(path)?);
    ciborium::into_writer(&(meta, serde_bytes::Bytes::new(data)), &mut file)
        .map_err(|error| io::Error::other(error.to_string()))?;
    let file = file.into_inner().map_err(|error| error.into_error())?;
    if sync {
        file.sync_all()?;
    }
    Ok(())
}

fn candidate_prefix() -> &'static str {
    "candidate-"
}

impl GroupStateMachine {
    /// The state machine with the snapshot saved at `snapshot_path`, if
    /// any, ready for openraft to install. Candidates a previous run left
    /// are deleted: they were never promised to anyone.
    pub fn open(
        machine: Box<dyn StateMachine>,
        snapshot_path: PathBuf,
        log: LogStore,
    ) -> io::Result<(GroupStateMachine, watch::Receiver<u64>)> {
        let current = read_snapshot_file(&snapshot_path)?.map(|(meta, _)| meta);
        if let Some(dir) = snapshot_path.parent() {
            for entry in std::fs::read_dir(dir)?.flatten() {
                if entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with(candidate_prefix())
                {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        let (applied, applied_receiver) = watch::channel(0);
        let machine = GroupStateMachine {
            inner: Arc::new(Mutex::new(Inner {
                machine,
                last_applied: None,
                membership: StoredMembership::default(),
                snapshot_path,
                current,
                candidates: VecDeque::new(),
                log,
                applied,
            })),
        };
        Ok((machine, applied_receiver))
    }
}

impl Inner {
    fn meta_now(&self) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
        }
    }

    /// Makes `path` (a complete file) the snapshot, durably.
    fn promote(&mut self, path: &Path, meta: SnapshotMeta) -> io::Result<()> {
        std::fs::File::open(path)?.sync_all()?;
        std::fs::rename(path, &self.snapshot_path)?;
        if let Some(dir) = self.snapshot_path.parent() {
            sluice_store::sync_dir(dir).map_err(|error| io::Error::other(error.to_string()))?;
        }
        self.current = Some(meta);
        Ok(())
    }

    /// Writes `data` as the snapshot, atomically.
    fn save_snapshot(&mut self, meta: SnapshotMeta, data: &[u8]) -> io::Result<()> {
        let temporary = self.snapshot_path.with_extension("tmp");
        write_snapshot_file(&temporary, &meta, data, false)?;
        self.promote(&temporary, meta)
    }

    fn drop_candidate(candidate: Candidate) {
        let _ = std::fs::remove_file(candidate.path);
    }

    /// After an entry: keeps the state as a candidate when the machine
    /// asks, or forgets the candidates when the state needs no entry
    /// (it can be snapshotted as it is).
    fn after_apply(&mut self) -> io::Result<()> {
        if self.machine.first_needed().is_none() {
            while let Some(candidate) = self.candidates.pop_front() {
                Self::drop_candidate(candidate);
            }
            return Ok(());
        }
        if !self.machine.keep_for_snapshot() {
            return Ok(());
        }
        let meta = self.meta_now();
        let index = meta.last_log_id.map_or(0, |log_id| log_id.index);
        let path = self
            .snapshot_path
            .with_file_name(format!("{}{index}", candidate_prefix()));
        write_snapshot_file(&path, &meta, &self.machine.snapshot(), false)?;
        self.candidates.push_back(Candidate { meta, path });
        if self.candidates.len() > CANDIDATES_MAX {
            if let Some(oldest) = self.candidates.pop_front() {
                Self::drop_candidate(oldest);
            }
        }
        Ok(())
    }

    /// Takes a snapshot of what the log may be purged up to: the state as
    /// it is when it needs no entry, else the newest candidate from before
    /// the first entry it needs. None when there is none yet.
    fn take_snapshot(&mut self) -> io::Result<Option<SnapshotMeta>> {
        match self.machine.first_needed() {
            None => {
                let meta = self.meta_now();
                if self.current.as_ref() != Some(&meta) {
                    let data = self.machine.snapshot();
                    self.save_snapshot(meta.clone(), &data)?;
                }
                Ok(Some(meta))
            }
            Some(first_needed) => {
                let mut newest = None;
                while self
                    .candidates
                    .front()
                    .is_some_and(|candidate| candidate.is_before(first_needed))
                {
                    if let Some(older) =
                        newest.replace(self.candidates.pop_front().expect("a front"))
                    {
                        Self::drop_candidate(older);
                    }
                }
                match newest {
                    Some(Candidate { meta, path }) => {
                        self.promote(&path, meta.clone())?;
                        Ok(Some(meta))
                    }
                    None => Ok(None),
                }
            }
        }
    }

    fn snapshot(&self) -> io::Result<Option<Snapshot>> {
        let Some(meta) = &self.current else {
            return Ok(None);
        };
        let Some((meta_on_disk, data)) = read_snapshot_file(&self.snapshot_path)? else {
            return Ok(None);
        };
        debug_assert_eq!(&meta_on_disk, meta);
        Ok(Some(Snapshot {
            meta: meta_on_disk,
            snapshot: data,
        }))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for GroupStateMachine {
    type SnapshotData = SnapshotData;

    /// Called only when [`RaftStateMachine::try_create_snapshot_builder`]
    /// found there is a snapshot to take, or when openraft needs one for a
    /// member behind the purged log: then the last one is it.
    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let mut inner = lock(&self.inner);
        inner.take_snapshot()?;
        match inner.snapshot()? {
            Some(snapshot) => Ok(snapshot),
            None => Ok(Snapshot {
                meta: SnapshotMeta::default(),
                snapshot: SnapshotData::new(),
            }),
        }
    }
}

impl RaftStateMachine<TypeConfig> for GroupStateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let inner = lock(&self.inner);
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let reply = {
                let mut inner = lock(&self.inner);
                inner.last_applied = Some(entry.log_id);
                let reply = match entry.payload {
                    EntryPayload::Blank => Reply::default(),
                    EntryPayload::Normal(command) => {
                        Reply(inner.machine.apply(entry.log_id.index, &command.0).to_vec())
                    }
                    EntryPayload::Membership(membership) => {
                        inner.membership = StoredMembership::new(Some(entry.log_id), membership);
                        inner.machine.members_changed();
                        Reply::default()
                    }
                };
                if let Err(error) = inner.after_apply() {
                    // Without this candidate the log is purged a little
                    // later, from a later one.
                    tracing::warn!(%error, "could not keep a state for a later snapshot");
                }
                inner.log.applied_through(entry.log_id.index);
                inner.applied.send_replace(entry.log_id.index);
                reply
            };
            if let Some(responder) = responder {
                responder.send(reply);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    /// Defers a snapshot nobody needs while there is nothing to take.
    async fn try_create_snapshot_builder(&mut self, force: bool) -> Option<Self::SnapshotBuilder> {
        let inner = lock(&self.inner);
        let ready = match inner.machine.first_needed() {
            None => true,
            Some(first_needed) => inner
                .candidates
                .front()
                .is_some_and(|candidate| candidate.is_before(first_needed)),
        };
        drop(inner);
        (force || ready).then(|| self.clone())
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let mut inner = lock(&self.inner);
        inner
            .machine
            .restore(&snapshot)
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        let index = meta.last_log_id.map_or(0, |log_id| log_id.index);
        while let Some(candidate) = inner.candidates.pop_front() {
            Inner::drop_candidate(candidate);
        }
        if inner.current.as_ref() != Some(meta) {
            inner.save_snapshot(meta.clone(), &snapshot)?;
        }
        inner.applied.send_replace(index);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        lock(&self.inner).snapshot()
    }
}
