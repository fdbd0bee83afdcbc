//! Definitions (exchanges, queues, bindings) as data: what the metadata log's
//! snapshots hold, and what the single-node versions of Sluice kept in
//! `definitions.json`, which a node takes over on its first start with the
//! metadata log. Also the node's storage: the directory of queue journals
//! and the group-commit thread they share.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use amq_protocol::types::FieldTable;
use serde::{Deserialize, Serialize};
use sluice_store::{GroupCommit, StoreError};

use crate::access::AccessDefinitions;
use crate::pager::{Pager, QueueStorage};
use crate::paging::StoreSettings;
use crate::policy::PolicyJson;
use crate::runtime_parameters::{GlobalParameterJson, ParameterJson};

/// Where the single-node versions kept the definitions.
const LEGACY_DEFINITIONS_FILE: &str = "definitions.json";
/// What it is renamed to once the metadata log holds its contents.
const LEGACY_DEFINITIONS_TAKEN_OVER: &str = "definitions.json.taken-over";
const QUEUES_DIR: &str = "queues";
const PAGING_DIR: &str = "paging";

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Definitions {
    pub vhosts: BTreeMap<String, VhostDefinitions>,
    /// Users, permissions and vhost limits; absent from snapshots written
    /// before the metadata log held them.
    #[serde(default)]
    pub access: AccessDefinitions,
    /// Global runtime parameters; absent from snapshots written before the
    /// metadata log held them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub global_parameters: Vec<GlobalParameterJson>,
    /// Counts the policy changes applied (see
    /// [`crate::broker::Broker::policy_generation`]).
    #[serde(default)]
    pub policy_generation: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct VhostDefinitions {
    pub exchanges: Vec<ExchangeDefinition>,
    pub queues: Vec<QueueDefinition>,
    pub bindings: Vec<BindingDefinition>,
    /// As they were given, in name order; absent from snapshots written
    /// before the metadata log held them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<PolicyJson>,
    /// Runtime parameters but `vhost-limits` (kept with the access
    /// definitions), by component and name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<ParameterJson>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ExchangeDefinition {
    pub name: String,
    pub kind: String,
    /// Always true in `definitions.json`, which held durable ones only.
    #[serde(default = "durable_by_default")]
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct QueueDefinition {
    pub name: String,
    /// Names the queue's journal directory; queue names may hold any byte
    /// and be too long for a file name. None for a queue without one.
    #[serde(default)]
    pub store_id: Option<String>,
    /// Always true in `definitions.json`, which held durable ones only.
    #[serde(default = "durable_by_default")]
    pub durable: bool,
    pub auto_delete: bool,
    pub arguments: FieldTable,
    /// The connection an exclusive queue belongs to.
    #[serde(default)]
    pub exclusive_owner: Option<u64>,
    /// The node it lives on; None in `definitions.json` (the node that
    /// takes the file over).
    #[serde(default)]
    pub home: Option<String>,
    /// The run of its home node that declared it: a non-durable queue is
    /// gone once that node restarts.
    #[serde(default)]
    pub home_incarnation: u64,
    /// The metadata log index that declared it (see
    /// [`crate::queue::QueueOptions::declared_at`]).
    #[serde(default)]
    pub declared_at: u64,
    /// A quorum queue's members, its home (the first leader) first; empty
    /// for other kinds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
    /// The Raft id of each member (see
    /// [`crate::quorum_members`]); empty in a definition written
    /// before members could change, whose ids are their places in the
    /// sorted member list.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub member_ids: BTreeMap<String, u64>,
}

fn durable_by_default() -> bool {
    true
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

/// The node's durable state on disk: the directory of queue journals, with
/// the group-commit thread they (and the metadata log) share.
pub struct DefinitionStore {
    data_dir: PathBuf,
    pub group: Arc<GroupCommit>,
    /// What every queue of the node pages and journals with.
    pub storage: Arc<QueueStorage>,
}

impl DefinitionStore {
    /// Opens the data directory (created when missing).
    pub fn open(
        data_dir: &Path,
        group: Arc<GroupCommit>,
        settings: StoreSettings,
    ) -> Result<Arc<Self>, StoreError> {
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
        let storage = Arc::new(QueueStorage {
            group: Arc::clone(&group),
            pager: Pager::start(),
            settings,
            paging_dir,
            resident: Arc::default(),
        });
        Ok(Arc::new(DefinitionStore {
            data_dir: data_dir.to_path_buf(),
            group,
            storage,
        }))
    }

    /// Stops the pager thread: the node is stopping.
    pub fn stop(&self) {
        self.storage.pager.stop();
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn queue_dir(&self, store_id: &str) -> PathBuf {
        self.data_dir.join(QUEUES_DIR).join(store_id)
    }

    /// The definitions a single-node version of Sluice saved in this
    /// directory, not yet taken over by the metadata log.
    ///
    /// # Errors
    /// The file exists but cannot be read or parsed: the node does not
    /// start rather than lose what it held.
    pub fn legacy_definitions(&self) -> Result<Option<Definitions>, StoreError> {
        let path = self.data_dir.join(LEGACY_DEFINITIONS_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|error| {
                StoreError::io(
                    format!("reading {}", path.display()),
                    std::io::Error::new(std::io::ErrorKind::InvalidData, error),
                )
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(StoreError::io(format!("reading {}", path.display()), error)),
        }
    }

    /// Sets `definitions.json` aside once the metadata log holds what it
    /// had; kept, renamed, for whoever wants to look back.
    pub fn retire_legacy_definitions(&self) -> Result<(), StoreError> {
        let from = self.data_dir.join(LEGACY_DEFINITIONS_FILE);
        let to = self.data_dir.join(LEGACY_DEFINITIONS_TAKEN_OVER);
        std::fs::rename(&from, &to)
            .map_err(|error| StoreError::io(format!("renaming {}", from.display()), error))?;
        sluice_store::sync_dir(&self.data_dir)
    }
}

/// A new journal directory name: 16 random hex digits.
pub fn new_store_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}
