//! The openraft type configuration of every Sluice group.

use serde::{Deserialize, Serialize};

/// A command as the log carries it: the caller's bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command(#[serde(with = "serde_bytes")] pub Vec<u8>);

/// A state machine's reply to a command.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply(#[serde(with = "serde_bytes")] pub Vec<u8>);

/// Logged as its size: the bytes are the caller's to make sense of.
impl std::fmt::Display for Command {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "command of {} bytes", self.0.len())
    }
}

impl std::fmt::Display for Reply {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "reply of {} bytes", self.0.len())
    }
}

openraft::declare_raft_types!(
    /// Sluice's Raft types: node ids are stable member ids (see
    /// `group::positional_member_ids`), nodes are named by their
    /// `NAME@HOST:PORT`.
    pub TypeConfig:
        D = Command,
        R = Reply,
        NodeId = u64,
        Node = openraft::BasicNode,
);

pub type Raft = openraft::Raft<TypeConfig, super::state_machine::GroupStateMachine>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
