//! What a quorum queue asks of the node's consensus: a replicated log of
//! its own over its members, to which it proposes entries and whose
//! committed entries it applies. The server provides it (on the
//! `consensus` module of `sluice-cluster`); the core only asks, as it does
//! for forwarding.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

/// Applied to a group's committed entries, in log order, on every member.
pub trait ReplicatedMachine: Send + 'static {
    /// Applies the entry at `index`; the reply goes to its proposer.
    fn apply(&mut self, index: u64, command: &[u8]) -> Bytes;

    /// The whole state, for a snapshot.
    fn snapshot(&self) -> Bytes;

    /// Replaces the state with a snapshot's.
    ///
    /// # Errors
    /// The snapshot cannot be decoded.
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String>;

    /// The first log index whose entry the state still reads back (the
    /// oldest message's); the log is kept from there on.
    fn first_needed(&self) -> Option<u64> {
        None
    }

    /// Whether to keep the state as it is now for a later snapshot.
    fn keep_for_snapshot(&mut self) -> bool {
        false
    }
}

/// The group a queue runs on, as it is started on one member.
pub struct GroupSpec {
    /// Unique on the cluster for the queue's life: the metadata log index
    /// that declared it.
    pub group: u64,
    /// What the group is, for the log: "queue 'q' in vhost '/'".
    pub label: String,
    /// Where this member keeps its log.
    pub dir: PathBuf,
    /// Every member's node name by its Raft id, as the metadata has them
    /// when the member starts (see [`crate::quorum_members`]).
    pub members: BTreeMap<u64, String>,
    /// This member was added to a group that already runs: it catches up
    /// from the leader and never initializes the group.
    pub joins: bool,
    /// The member that stands for leader first (the node the queue was
    /// placed on); any member may lead later.
    pub preferred_leader: String,
}

/// A proposal's outcome: the applied entry's reply, or why it was not
/// applied (it may still be, later: a proposer that retries must make its
/// entries idempotent).
pub type Proposed = Pin<Box<dyn Future<Output = Result<Bytes, String>> + Send>>;

/// One member's handle on its group.
pub trait ReplicatedLog: Send + Sync {
    /// Proposes `entry`; resolves once it is committed and applied, with
    /// the state machine's reply: applied on this member too when
    /// `applied_here`, else on the leader (this member applies it a moment
    /// later).
    fn propose(&self, entry: Bytes, applied_here: bool) -> Proposed;

    /// Whether this member leads now: the one that acts on what applying
    /// an entry asks beyond the queue (dead-lettering), once.
    fn is_leader(&self) -> bool;

    /// The leader this member knows of.
    fn leader(&self) -> Option<String>;

    /// The entry at `index` in this member's log, read back: None once the
    /// log no longer holds it.
    ///
    /// # Errors
    /// It cannot be read (an I/O error, or the log is not open).
    fn read_entry(&self, index: u64) -> Result<Option<Bytes>, String>;

    /// Confirms may have come due: wakes whoever sends them.
    fn confirms_due(&self);

    /// Stops this member; with `erase`, its log is deleted too (the queue
    /// was deleted).
    fn stop(&self, erase: bool);

    /// Whether this member stopped (its queue was deleted, or its node is
    /// shutting down): work waiting on the log gives up.
    fn is_stopped(&self) -> bool;
}

/// One change to a group's members, made on its leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberChange {
    /// The member `id` on `node` joins: a learner until it has caught up
    /// from the leader, then a voter.
    Add { id: u64, node: String },
    /// The member `id` leaves.
    Remove { id: u64 },
}

/// A membership change's outcome.
pub type MembersChanged = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// The node's consensus, for the quorum queues it holds a member of.
pub trait QuorumGroups: Send + Sync {
    /// Makes `change` to `group` on its leader, found among `members` (the
    /// queue's, as the metadata has them) or this node's own member;
    /// resolves once the change is committed (an added member has caught
    /// up by then), or with why not within `timeout`.
    fn change_members(
        &self,
        group: u64,
        members: Vec<String>,
        change: MemberChange,
        timeout: std::time::Duration,
    ) -> MembersChanged;

    /// Starts (or reopens, replaying its log into `machine`) this node's
    /// member of a group. Returns at once; proposals wait for the start.
    fn open(&self, spec: GroupSpec, machine: Box<dyn ReplicatedMachine>) -> Arc<dyn ReplicatedLog>;

    /// Whether this node's member among `members` (ids to nodes) ran here
    /// before: `dir` holds its own files, not nothing or an earlier
    /// member's.
    fn ran_here_before(&self, dir: &std::path::Path, members: &BTreeMap<u64, String>) -> bool;

    /// This node's name, as group members are named.
    fn local_node(&self) -> String;

    /// This node's number: the top bits of its connection ids.
    fn node_number(&self) -> u16;
}
