//! Builds the queue a declaration asks for, of the kind its `x-queue-type`
//! names, in one place (LavinMQ's `queue_factory.cr`): the vhost creates
//! and recovers queues through here and holds them only as [`Queue`].

use std::sync::{Arc, Weak};

use amq_protocol::types::FieldTable;

use crate::classic_queue::{ClassicQueue, ClassicQueueSpec};
use crate::dead_letter::DeadLetterTarget;
use crate::definitions::{new_store_id, DefinitionStore};
use crate::expiry::QueueExpiry;
use crate::queue::{Queue, QueueHost, QueueOptions};
use crate::queue_journal::QueueJournal;
use crate::queue_limits::QueueLimits;
use crate::queue_type::QueueType;
use crate::quorum_members::Membership;
use crate::quorum_queue::replication::QuorumGroups;
use crate::quorum_queue::{QuorumQueue, QuorumQueueSpec};

/// A queue to create, or to recover from its saved definition.
pub struct QueueSpec<'a> {
    pub name: Arc<str>,
    pub vhost: Arc<str>,
    pub options: QueueOptions,
    /// The declared arguments merged with the queue's policy: what its
    /// behaviour (limits, TTL, dead-lettering) follows.
    pub effective_arguments: &'a FieldTable,
    pub host: Weak<dyn QueueHost>,
    /// The node's storage; None keeps everything in memory.
    pub store: Option<&'a DefinitionStore>,
    /// A recovered durable queue's journal directory; a new durable queue
    /// gets a fresh one.
    pub store_id: Option<String>,
    /// The node's consensus, for a quorum queue's member.
    pub quorum_groups: Option<&'a Arc<dyn QuorumGroups>>,
    /// The node's count of policy changes when the queue is made: a quorum
    /// queue proposes its policy's rules under it.
    pub policy_generation: u64,
}

/// Why a queue could not be made.
#[derive(Debug, thiserror::Error)]
pub enum QueueCreateError {
    #[error("queue type '{0}' is not supported by this node")]
    Unsupported(String),
    #[error("cannot open the journal: {0}")]
    Journal(#[from] sluice_store::StoreError),
}

/// Makes the queue `spec` describes. A durable queue on a node with storage
/// opens (or creates) its journal and recovers what is in it.
///
/// # Errors
/// A kind this node cannot create, or a journal that cannot be opened.
pub fn create_queue(spec: QueueSpec<'_>) -> Result<Arc<dyn Queue>, QueueCreateError> {
    match QueueType::of_arguments(&spec.options.arguments) {
        Some(QueueType::Classic) => Ok(create_classic(spec)?),
        Some(QueueType::Quorum) => create_quorum(spec),
        Some(other) => Err(QueueCreateError::Unsupported(other.as_str().to_owned())),
        None => Err(QueueCreateError::Unsupported(
            spec.options
                .arguments
                .inner()
                .get(crate::queue_type::QUEUE_TYPE_ARGUMENT)
                .map(|value| format!("{value:?}"))
                .unwrap_or_default(),
        )),
    }
}

/// This node's member of a quorum queue, its log beside the classic
/// queues' journals (a directory of its own, named by the metadata).
fn create_quorum(spec: QueueSpec<'_>) -> Result<Arc<dyn Queue>, QueueCreateError> {
    let unsupported = || QueueCreateError::Unsupported(QueueType::Quorum.as_str().to_owned());
    let groups = spec.quorum_groups.ok_or_else(unsupported)?;
    let store = spec.store.ok_or_else(unsupported)?;
    let store_id = spec.store_id.unwrap_or_else(new_store_id);
    let local = groups.local_node();
    let mut members = spec.options.members.get();
    if members.members.is_empty() {
        // Made outside the metadata log's declaration (a definitions
        // import): a member of one, here.
        members = Membership::of(&[local], &Default::default());
        spec.options.members.set(members.clone());
    }
    let preferred_leader = members.members[0].clone();
    Ok(QuorumQueue::create(
        QuorumQueueSpec {
            name: spec.name,
            vhost: spec.vhost,
            dir: store.queue_dir(&store_id),
            store_id,
            effective_arguments: spec.effective_arguments.clone(),
            policy_generation: spec.policy_generation,
            host: spec.host,
            members,
            preferred_leader,
            node_number: groups.node_number(),
            window_bytes_max: store.storage.settings.resident_bytes_max,
            node_window: Some((
                Arc::clone(&store.storage.resident),
                store.storage.settings.resident_total_max,
            )),
            options: spec.options,
        },
        groups,
    ))
}

fn create_classic(spec: QueueSpec<'_>) -> Result<Arc<ClassicQueue>, QueueCreateError> {
    let journaled = spec.store.filter(|_| spec.options.durable);
    let (store_id, recovered) = match journaled {
        Some(store) => {
            let store_id = spec.store_id.unwrap_or_else(new_store_id);
            let recovered = QueueJournal::recover(
                &store.queue_dir(&store_id),
                Arc::clone(&store.group),
                &store.storage.settings,
            )?;
            (Some(store_id), Some(recovered))
        }
        // No journal here (a node without storage): the name the metadata
        // gave it stays, so that every node describes the queue alike.
        None => (spec.store_id, None),
    };
    let effective = spec.effective_arguments;
    Ok(ClassicQueue::create(ClassicQueueSpec {
        name: spec.name,
        vhost: spec.vhost,
        options: spec.options,
        limits: QueueLimits::from_arguments(effective),
        expiry: QueueExpiry::from_arguments(effective),
        dead_letter: DeadLetterTarget::from_arguments(effective),
        host: spec.host,
        store_id,
        storage: spec.store.map(|store| Arc::clone(&store.storage)),
        recovered,
    }))
}
