//! Raft groups, on `openraft`: the only module of Sluice that names its
//! types. A group replicates a [`StateMachine`] of the caller's over its
//! members; commands and replies are opaque bytes.
//!
//! - `types`: the openraft type configuration: commands, replies, node ids.
//! - `wal`: the node's write-ahead log: every group's appends, one
//!   fdatasync a round for all of them.
//! - `log_store`: a group's log on disk, written behind the WAL, with its
//!   vote in a file of its own.
//! - `state_machine`: the caller's state machine as openraft applies it,
//!   and its snapshots on disk.
//! - `wire`: what nodes send each other for consensus, encoded.
//! - `transport`: those messages over the inter-node links, requests
//!   matched with responses, for every group of the node.
//! - `group`: a running group and the way to propose to it from any member.
//! - `membership`: adding and removing a group's members, on its leader.

mod group;
mod log_store;
mod membership;
mod raft_slot;
mod state_machine;
mod transport;
mod types;
mod wal;
mod wire;

pub use group::{
    holds_member_files, positional_member_ids, ConsensusNode, GroupSettings, GroupStatus, RaftGroup,
};
pub use membership::{MemberChange, MembershipError};
pub use raft_slot::parked_total;
pub use wal::Wal;

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

    /// The first log index whose entry the state still reads back (a
    /// quorum queue's oldest message, whose body only the log holds); None
    /// when it reads none. The log is kept from there on: snapshots are
    /// taken from before it.
    fn first_needed(&self) -> Option<u64> {
        None
    }

    /// Asked after each entry while [`StateMachine::first_needed`] is
    /// Some: whether to keep the state as it is now for a later snapshot
    /// (one taken once the first needed entry has moved past it). Each
    /// costs a [`StateMachine::snapshot`]: a machine asks for one when the
    /// work since the last one makes that cheap by comparison.
    fn keep_for_snapshot(&mut self) -> bool {
        false
    }

    /// The group's members changed: a leader that removed itself leaves
    /// the rest to elect one, which a member whose timers are off for
    /// hibernation would never do.
    fn members_changed(&mut self) {}
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
