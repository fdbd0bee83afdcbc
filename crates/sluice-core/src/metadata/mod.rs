//! The cluster's metadata as a log of changes: vhosts, users and
//! permissions, exchanges, queues and bindings, policies and runtime
//! parameters are set and deleted by [`MetadataCommand`]s that every
//! node applies in the same order (the metadata Raft group of
//! `sluice-server`). A client's change is checked locally, proposed, and
//! answered only once applied on the node it came through; reads and
//! routing are local.
//!
//! Here: the changes, the reply every node computes for each, and the way
//! into the log. [`crate::metadata_apply`] applies a change to the node,
//! [`crate::metadata_snapshot`] writes the node out and brings it back.

mod command;

pub use command::{BindingChange, MetadataCommand, MetadataReply};

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use crate::error::{AmqpError, AmqpResult};
use crate::queue::forwarding::{ForwardHome, Forwarding};
use crate::quorum_queue::replication::QuorumGroups;
use sluice_wire::reply_code::ReplyCode;

/// A proposal on its way through the metadata log.
pub type Proposal = Pin<Box<dyn Future<Output = AmqpResult<()>> + Send>>;

/// Where metadata changes are proposed: the cluster's metadata log.
pub trait MetadataLog: Send + Sync {
    /// Proposes `command`; resolves once it is applied on this node, with
    /// the reply every node computed for it, or with why it could not be
    /// committed (no majority within the bound).
    fn propose(&self, command: MetadataCommand) -> Proposal;

    /// Resolves once this node has applied every change committed anywhere
    /// before the call: a read barrier.
    fn sync(&self) -> Proposal;

    /// Whether other nodes share the log: only then can this node's copy
    /// lag a change that was already answered.
    fn is_replicated(&self) -> bool;

    /// The index of the last entry applied on this node.
    fn applied_index(&self) -> u64;

    /// Resolves once this node has applied the entry at `index` (an entry
    /// another node already applied), or fails after the log's bound.
    fn wait_applied(&self, index: u64) -> Proposal;
}

/// This node, as the metadata names it.
#[derive(Clone, Debug)]
pub struct NodeIdentity {
    /// `node_name`, the home of the queues declared through this node.
    pub name: Arc<str>,
    /// Random per run: a non-durable queue declared in an earlier run of
    /// its home node is gone (see [`MetadataCommand::NodeStarted`]).
    pub incarnation: u64,
}

impl NodeIdentity {
    /// The name of a node that is a cluster of one and names itself not.
    pub const STANDALONE: &'static str = "sluice@localhost:25672";

    pub fn new(name: &str) -> Self {
        NodeIdentity {
            name: Arc::from(name),
            incarnation: rand::random::<u64>() | 1,
        }
    }
}

/// Whether the other nodes of the cluster are reachable, as the links see
/// them.
pub trait NodeLiveness: Send + Sync {
    fn is_up(&self, node: &str) -> bool;

    /// Every member of the cluster, this node included.
    fn members(&self) -> Vec<String>;
}

/// The node's way into the metadata log, installed once the log is up, and
/// its view of which other nodes are up.
#[derive(Default)]
pub struct MetadataProposer {
    log: OnceLock<Arc<dyn MetadataLog>>,
    runtime: OnceLock<tokio::runtime::Handle>,
    liveness: OnceLock<Arc<dyn NodeLiveness>>,
    forwarding: OnceLock<Arc<dyn Forwarding>>,
    quorum_groups: OnceLock<Arc<dyn QuorumGroups>>,
}

impl MetadataProposer {
    /// Installs the log; proposals made from threads outside the runtime
    /// (queue timers) run on `runtime`.
    pub fn install(&self, log: Arc<dyn MetadataLog>, runtime: tokio::runtime::Handle) {
        let _ = self.log.set(log);
        let _ = self.runtime.set(runtime);
    }

    /// Installs the view of the other nodes (a cluster of one has none).
    pub fn install_liveness(&self, liveness: Arc<dyn NodeLiveness>) {
        let _ = self.liveness.set(liveness);
    }

    /// Installs the way to queues homed on other nodes.
    pub fn install_forwarding(&self, forwarding: Arc<dyn Forwarding>) {
        let _ = self.forwarding.set(forwarding);
    }

    /// Installs the node's consensus for quorum queues: without it, a node
    /// cannot hold a member of one.
    pub fn install_quorum_groups(&self, groups: Arc<dyn QuorumGroups>) {
        let _ = self.quorum_groups.set(groups);
    }

    pub fn quorum_groups(&self) -> Option<&Arc<dyn QuorumGroups>> {
        self.quorum_groups.get()
    }

    /// The way to the queues homed on `node`, once installed.
    pub fn forward_home(&self, node: &str) -> Option<Arc<dyn ForwardHome>> {
        self.forwarding.get()?.home(node)
    }

    /// The members of the cluster that are up now, `local` among them; just
    /// `local` in a cluster of one.
    pub fn running_nodes(&self, local: &str) -> Vec<String> {
        match self.liveness.get() {
            Some(liveness) => liveness
                .members()
                .into_iter()
                .filter(|node| node == local || liveness.is_up(node))
                .collect(),
            None => vec![local.to_owned()],
        }
    }

    /// Every member of the cluster, up or not; just `local` in a cluster
    /// of one.
    pub fn cluster_nodes(&self, local: &str) -> Vec<String> {
        match self.liveness.get() {
            Some(liveness) => liveness.members(),
            None => vec![local.to_owned()],
        }
    }

    /// A node's number: its place in the sorted member list, from 1, as
    /// the top bits of its connection ids carry it.
    pub fn node_number_of(&self, node: &str) -> Option<u16> {
        let mut nodes = self.cluster_nodes(node);
        nodes.sort();
        let position = nodes.iter().position(|known| known == node)?;
        u16::try_from(position + 1).ok()
    }

    pub fn is_installed(&self) -> bool {
        self.log.get().is_some()
    }

    pub fn propose(&self, command: MetadataCommand) -> Proposal {
        match self.log.get() {
            Some(log) => log.propose(command),
            None => Box::pin(std::future::ready(Err(AmqpError::new(
                ReplyCode::InternalError,
                "the metadata log is not running",
            )))),
        }
    }

    /// See [`MetadataLog::sync`]; nothing to wait for without a log.
    pub fn sync(&self) -> Proposal {
        match self.log.get() {
            Some(log) => log.sync(),
            None => Box::pin(std::future::ready(Ok(()))),
        }
    }

    /// See [`MetadataLog::applied_index`]; 0 without a log.
    pub fn applied_index(&self) -> u64 {
        self.log.get().map_or(0, |log| log.applied_index())
    }

    /// See [`MetadataLog::wait_applied`]; nothing to wait for without a log.
    pub fn wait_applied(&self, index: u64) -> Proposal {
        match self.log.get() {
            Some(log) => log.wait_applied(index),
            None => Box::pin(std::future::ready(Ok(()))),
        }
    }

    /// See [`MetadataLog::is_replicated`].
    pub fn is_replicated(&self) -> bool {
        self.log.get().is_some_and(|log| log.is_replicated())
    }

    /// Proposes a change nobody waits for (a queue deleted because it
    /// expired); a failure is logged.
    pub fn propose_in_background(&self, command: MetadataCommand) {
        drop(self.propose_detached(command));
    }

    /// Proposes a change that goes through whether or not the returned
    /// future is awaited (a queue deleted because its owner closed): it
    /// says when the change is applied on this node. A failure is logged.
    pub fn propose_detached(&self, command: MetadataCommand) -> Proposal {
        let Some(runtime) = self.runtime.get() else {
            tracing::error!(
                ?command,
                "metadata change dropped: the metadata log is not running"
            );
            return Box::pin(std::future::ready(Err(AmqpError::new(
                ReplyCode::InternalError,
                "the metadata log is not running",
            ))));
        };
        let proposal = self.propose(command.clone());
        let applied = runtime.spawn(async move {
            let result = proposal.await;
            if let Err(error) = &result {
                tracing::warn!(?command, %error, "a metadata change failed");
            }
            result
        });
        Box::pin(async move {
            applied.await.unwrap_or_else(|_| {
                Err(AmqpError::new(
                    ReplyCode::InternalError,
                    "a metadata change was abandoned",
                ))
            })
        })
    }
}
