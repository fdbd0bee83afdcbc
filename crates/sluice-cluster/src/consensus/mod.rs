//! Raft groups, on `openraft`: the only module of Sluice that names its
//! types. A group replicates a [`StateMachine`] of the caller's over its
//! members; commands and replies are opaque bytes.
//!
//! - `types`: the openraft type configuration: commands, replies, node ids.
//! - `log_store`: a group's log on disk, appended through the node's
//!   group-commit thread (one fdatasync for every group's appends of a
//!   round), with its vote in a file of its own.
//! - `state_machine`: the caller's state machine as openraft applies it,
//!   and its snapshots on disk.
//! - `wire`: what nodes send each other for consensus, encoded.
//! - `transport`: those messages over the inter-node links, requests
//!   matched with responses, for every group of the node.
//! - `group`: a running group and the way to propose to it from any member.

mod group;
mod log_store;
mod state_machine;
mod transport;
mod types;
mod wire;

pub use group::{ConsensusNode, GroupSettings, RaftGroup};

use std::time::Duration;

use bytes::Bytes;

/// The link channel that carries consensus traffic.
pub const CONSENSUS_CHANNEL: u16 = 1;

/// A replicated, deterministic state machine, applied in log order on every
/// member of its group.
pub trait StateMachine: Send + 'static {
    /// Applies the command committed at log `index` and returns the reply
    /// for whoever proposed it. Same state, command and index give the same
    /// result on every node.
    fn apply(&mut self, index: u64, command: &[u8]) -> Bytes;

    /// The whole state, for a snapshot.
    fn snapshot(&self) -> Bytes;

    /// Replaces the whole state with a snapshot's: a restart, or a member
    /// that fell behind the log the others kept.
    ///
    /// # Errors
    /// The snapshot cannot be decoded.
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String>;
}

/// Why a group could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ConsensusError {
    #[error("{context}: {source}")]
    Storage {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("raft group {group} failed: {reason}")]
    Fatal { group: u64, reason: String },
}

impl ConsensusError {
    fn storage(context: impl Into<String>, source: std::io::Error) -> Self {
        ConsensusError::Storage {
            context: context.into(),
            source,
        }
    }
}

/// Why a proposal was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    #[error("no majority of the cluster answered within {}s", .0.as_secs_f64())]
    Timeout(Duration),
    #[error("{0}")]
    Fatal(String),
    #[error("the node is shutting down")]
    ShuttingDown,
}
