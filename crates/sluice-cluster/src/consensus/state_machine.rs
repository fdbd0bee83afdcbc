//! The caller's [`StateMachine`] as openraft applies it. The state itself
//! lives in memory; its snapshots are files, replaced atomically. At start
//! openraft installs the last snapshot and applies the committed entries
//! after it again, which is how a node gets its state back.

use std::io;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use tokio::sync::watch;

use super::log_store::{decode, encode};
use super::types::{LogId, Reply, SnapshotMeta, StoredMembership, TypeConfig};
use super::StateMachine;

/// A snapshot as openraft hands it around: the state machine's bytes.
pub type SnapshotData = Vec<u8>;
type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotData>;

struct Inner {
    machine: Box<dyn StateMachine>,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    snapshot_path: PathBuf,
    current: Option<(SnapshotMeta, SnapshotData)>,
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

impl GroupStateMachine {
    /// The state machine with the snapshot saved at `snapshot_path`, if
    /// any, ready for openraft to install.
    pub fn open(
        machine: Box<dyn StateMachine>,
        snapshot_path: PathBuf,
    ) -> io::Result<(GroupStateMachine, watch::Receiver<u64>)> {
        let current = match std::fs::read(&snapshot_path) {
            Ok(bytes) => {
                let (meta, data): (SnapshotMeta, serde_bytes::ByteBuf) = decode(&bytes)?;
                Some((meta, data.into_vec()))
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => None,
            Err(error) => return Err(error),
        };
        let (applied, applied_receiver) = watch::channel(0);
        let machine = GroupStateMachine {
            inner: Arc::new(Mutex::new(Inner {
                machine,
                last_applied: None,
                membership: StoredMembership::default(),
                snapshot_path,
                current,
                applied,
            })),
        };
        Ok((machine, applied_receiver))
    }
}

impl Inner {
    /// Writes the snapshot beside the log, atomically, and keeps it.
    fn save_snapshot(&mut self, meta: SnapshotMeta, data: SnapshotData) -> io::Result<()> {
        let temporary = self.snapshot_path.with_extension("tmp");
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(&encode(&(&meta, serde_bytes::Bytes::new(&data))))?;
        file.sync_all()?;
        std::fs::rename(&temporary, &self.snapshot_path)?;
        if let Some(dir) = self.snapshot_path.parent() {
            sluice_store::sync_dir(dir).map_err(|error| io::Error::other(error.to_string()))?;
        }
        self.current = Some((meta, data));
        Ok(())
    }

    fn snapshot(&self) -> Option<Snapshot> {
        self.current.as_ref().map(|(meta, data)| Snapshot {
            meta: meta.clone(),
            snapshot: data.clone(),
        })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for GroupStateMachine {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let mut inner = lock(&self.inner);
        let data = inner.machine.snapshot().to_vec();
        let meta = SnapshotMeta {
            last_log_id: inner.last_applied,
            last_membership: inner.membership.clone(),
        };
        inner.save_snapshot(meta.clone(), data.clone())?;
        Ok(Snapshot {
            meta,
            snapshot: data,
        })
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
                        Reply::default()
                    }
                };
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
        let unchanged = inner
            .current
            .as_ref()
            .is_some_and(|(current, _)| current == meta);
        if !unchanged {
            inner.save_snapshot(meta.clone(), snapshot)?;
        }
        inner.applied.send_replace(index);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        Ok(lock(&self.inner).snapshot())
    }
}
