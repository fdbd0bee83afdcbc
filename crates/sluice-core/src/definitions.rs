//! Durable definitions (exchanges, queues, bindings) kept in one file in the
//! data directory, rewritten atomically (write, fsync, rename, fsync the
//! directory) whenever a durable definition changes, and read back at start.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use amq_protocol::types::FieldTable;
use serde::{Deserialize, Serialize};
use sluice_store::{GroupCommit, StoreError};

use crate::pager::{Pager, QueueStorage};
use crate::paging::StoreSettings;

const DEFINITIONS_FILE: &str = "definitions.json";
const QUEUES_DIR: &str = "queues";
const PAGING_DIR: &str = "paging";

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Definitions {
    pub vhosts: BTreeMap<String, VhostDefinitions>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct VhostDefinitions {
    pub exchanges: Vec<ExchangeDefinition>,
    pub queues: Vec<QueueDefinition>,
    pub bindings: Vec<BindingDefinition>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ExchangeDefinition {
    pub name: String,
    pub kind: String,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct QueueDefinition {
    pub name: String,
    /// Names the queue's journal directory; queue names may hold any byte
    /// and be too long for a file name.
    pub store_id: String,
    pub auto_delete: bool,
    pub arguments: FieldTable,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BindingDefinition {
    pub source: String,
    pub destination: String,
    /// "queue" or "exchange", as RabbitMQ's definitions name them.
    pub destination_type: String,
    pub routing_key: String,
    pub arguments: FieldTable,
}

/// The node's durable state on disk: the definitions file and the
/// directory of queue journals, sharing one group-commit thread.
pub struct DefinitionStore {
    data_dir: PathBuf,
    current: Mutex<Definitions>,
    pub group: Arc<GroupCommit>,
    /// What every queue of the node pages and journals with.
    pub storage: Arc<QueueStorage>,
}

impl DefinitionStore {
    /// Opens the data directory (created when missing) and reads the
    /// definitions saved there.
    pub fn open(
        data_dir: &Path,
        group: Arc<GroupCommit>,
        settings: StoreSettings,
    ) -> Result<(Arc<Self>, Definitions), StoreError> {
        std::fs::create_dir_all(data_dir.join(QUEUES_DIR))
            .map_err(|error| StoreError::io(format!("creating {}", data_dir.display()), error))?;
        // Paging files of non-durable queues mean nothing after a restart.
        let paging_dir = data_dir.join(PAGING_DIR);
        match std::fs::remove_dir_all(&paging_dir) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                return Err(StoreError::io(
                    format!("clearing {}", paging_dir.display()),
                    error,
                ))
            }
        }
        let path = data_dir.join(DEFINITIONS_FILE);
        let definitions = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|error| {
                StoreError::io(
                    format!("reading {}", path.display()),
                    std::io::Error::new(std::io::ErrorKind::InvalidData, error),
                )
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Definitions::default(),
            Err(error) => return Err(StoreError::io(format!("reading {}", path.display()), error)),
        };
        let storage = Arc::new(QueueStorage {
            group: Arc::clone(&group),
            pager: Pager::start(),
            settings,
            paging_dir,
            resident: Arc::default(),
        });
        let store = Arc::new(DefinitionStore {
            data_dir: data_dir.to_path_buf(),
            current: Mutex::new(definitions.clone()),
            group,
            storage,
        });
        Ok((store, definitions))
    }

    /// Stops the pager thread: the node is stopping.
    pub fn stop(&self) {
        self.storage.pager.stop();
    }

    pub fn queue_dir(&self, store_id: &str) -> PathBuf {
        self.data_dir.join(QUEUES_DIR).join(store_id)
    }

    /// Replaces one vhost's definitions with a snapshot and rewrites the
    /// file. The snapshot is taken under the file's lock: two changes saved
    /// at once would otherwise race, and the one with the older snapshot,
    /// written last, would drop the other's queue from the file. A failure
    /// is logged: the change stays in effect in memory, as the client was
    /// told.
    pub fn save_vhost(&self, vhost: &str, snapshot: impl FnOnce() -> VhostDefinitions) {
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let definitions = snapshot();
        if current.vhosts.get(vhost) == Some(&definitions) {
            return;
        }
        current.vhosts.insert(vhost.to_owned(), definitions);
        if let Err(error) = self.write(&current) {
            tracing::error!(%error, "could not save definitions");
        }
    }

    fn write(&self, definitions: &Definitions) -> Result<(), StoreError> {
        let path = self.data_dir.join(DEFINITIONS_FILE);
        let temporary = self.data_dir.join(format!("{DEFINITIONS_FILE}.tmp"));
        let bytes = serde_json::to_vec_pretty(definitions).map_err(|error| {
            StoreError::io(
                "encoding definitions",
                std::io::Error::new(std::io::ErrorKind::InvalidData, error),
            )
        })?;
        let context = |what: &str| format!("{what} {}", temporary.display());
        let mut file = std::fs::File::create(&temporary)
            .map_err(|error| StoreError::io(context("creating"), error))?;
        file.write_all(&bytes)
            .and_then(|_| file.sync_all())
            .map_err(|error| StoreError::io(context("writing"), error))?;
        std::fs::rename(&temporary, &path)
            .map_err(|error| StoreError::io(context("renaming"), error))?;
        sluice_store::sync_dir(&self.data_dir)
    }
}

/// A new journal directory name: 16 random hex digits.
pub fn new_store_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}
