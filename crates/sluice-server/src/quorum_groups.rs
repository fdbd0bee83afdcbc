//! The node's Raft groups for its quorum queues: each member the core asks
//! for is a group of the node's consensus (see
//! `sluice_cluster::consensus`), on the links and group commit every group
//! shares. A group starts in the background; proposals wait for it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::quorum_hibernation::{Activity, RunningGroups};
use bytes::Bytes;
use sluice_cluster::consensus::{
    holds_member_files, ConsensusNode, GroupSettings, MemberChange as ConsensusChange, RaftGroup,
    StateMachine,
};
use sluice_cluster::node_name::NodeName;
use sluice_core::quorum_queue::replication::{
    GroupSpec, MemberChange, MembersChanged, Proposed, QuorumGroups, ReplicatedLog,
    ReplicatedMachine,
};
use tokio::sync::watch;

/// How long one proposal may wait for its commit; the queue proposes it
/// again after a leader change.
const PROPOSE_TIMEOUT: Duration = Duration::from_secs(10);

const QUEUE_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(150);
const QUEUE_ELECTION_TIMEOUT: (Duration, Duration) =
    (Duration::from_millis(600), Duration::from_millis(1200));

/// The node's consensus, for quorum queues.
pub struct NodeQuorumGroups {
    pub consensus: Arc<ConsensusNode>,
    pub local: NodeName,
    pub node_number: u16,
    /// Bumped when confirms may have come due.
    pub confirm_progress: Arc<watch::Sender<u64>>,
    /// The groups running on this node, stopped with it.
    pub running: RunningGroups,
}

impl NodeQuorumGroups {
    /// Stops every group of the node (it is shutting down).
    pub async fn stop_all(&self) {
        let groups: Vec<Arc<RaftGroup>> = lock(&self.running)
            .drain()
            .map(|(_, (group, _))| group)
            .collect();
        for group in groups {
            group.shutdown().await;
        }
    }
}

/// The core's machine as the consensus applies it; applying an entry
/// wakes a hibernating member.
struct Adapter {
    machine: Box<dyn ReplicatedMachine>,
    activity: Arc<Activity>,
}

impl StateMachine for Adapter {
    fn apply(&mut self, index: u64, command: &[u8]) -> Bytes {
        self.activity.touch(true);
        self.machine.apply(index, command)
    }

    fn snapshot(&self) -> Bytes {
        self.machine.snapshot()
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        self.machine.restore(snapshot)
    }

    fn first_needed(&self) -> Option<u64> {
        self.machine.first_needed()
    }

    fn keep_for_snapshot(&mut self) -> bool {
        self.machine.keep_for_snapshot()
    }

    /// Every member wakes, its timers on: should the leader have removed
    /// itself, the others elect the next one.
    fn members_changed(&mut self) {
        self.activity.touch(true);
    }
}

/// Where a member's group stands.
#[derive(Clone)]
enum Started {
    Starting,
    Running(Arc<RaftGroup>),
    Failed(String),
}

/// One member of a quorum queue's group.
struct QuorumGroupLog {
    group_id: u64,
    running: RunningGroups,
    activity: Arc<Activity>,
    started: watch::Receiver<Started>,
    confirm_progress: Arc<watch::Sender<u64>>,
    /// Set once stopped: a group that finishes starting afterwards stops.
    stop: Mutex<Option<bool>>,
    dir: std::path::PathBuf,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl QuorumGroupLog {
    fn running(&self) -> Option<Arc<RaftGroup>> {
        match &*self.started.borrow() {
            Started::Running(group) => Some(Arc::clone(group)),
            _ => None,
        }
    }
}

/// Stops a group, erasing its files when its queue was deleted.
async fn stop_group(group: Arc<RaftGroup>, erase: bool, dir: std::path::PathBuf) {
    group.shutdown().await;
    if erase {
        if let Err(error) = std::fs::remove_dir_all(&dir) {
            if error.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %dir.display(), %error, "could not remove a deleted quorum queue's log");
            }
        }
    }
}

impl ReplicatedLog for QuorumGroupLog {
    fn propose(&self, entry: Bytes, applied_here: bool) -> Proposed {
        // A leader replicates what it is handed, asleep or not; it wakes
        // to keep its followers' leases while it is busy. A follower
        // wakes when it applies, having heard from its leader.
        self.activity.touch(self.is_leader());
        let mut started = self.started.clone();
        Box::pin(async move {
            let state = started
                .wait_for(|state| !matches!(state, Started::Starting))
                .await
                .map_err(|_| "the group stopped".to_owned())?
                .clone();
            match state {
                Started::Running(group) if applied_here => group
                    .propose(entry, PROPOSE_TIMEOUT)
                    .await
                    .map_err(|error| error.to_string()),
                Started::Running(group) => group
                    .propose_committed(entry, PROPOSE_TIMEOUT)
                    .await
                    .map_err(|error| error.to_string()),
                Started::Failed(reason) => Err(reason),
                Started::Starting => unreachable!("waited for the start"),
            }
        })
    }

    fn is_leader(&self) -> bool {
        self.running().is_some_and(|group| group.is_leader())
    }

    fn leader(&self) -> Option<String> {
        self.running()?.leader().map(|leader| leader.to_string())
    }

    fn read_entry(&self, index: u64) -> Result<Option<Bytes>, String> {
        let group = self
            .running()
            .ok_or_else(|| "the queue's log is not open".to_owned())?;
        group.read_command(index).map_err(|error| error.to_string())
    }

    fn is_stopped(&self) -> bool {
        if lock(&self.stop).is_some() {
            return true;
        }
        // Started, and no longer among the node's running groups: the
        // node stopped them all.
        matches!(&*self.started.borrow(), Started::Running(_))
            && !lock(&self.running).contains_key(&self.group_id)
    }

    fn confirms_due(&self) {
        self.confirm_progress
            .send_modify(|progress| *progress = progress.wrapping_add(1));
    }

    fn stop(&self, erase: bool) {
        *lock(&self.stop) = Some(erase);
        if let Some(group) = self.running() {
            lock(&self.running).remove(&self.group_id);
            tracing::debug!(
                group = self.group_id,
                erase,
                "stopping a quorum queue's group"
            );
            tokio::spawn(stop_group(group, erase, self.dir.clone()));
        }
    }
}

/// Logs each leader the group has, as this member learns of it: where a
/// queue is served from, and when that moved.
async fn log_leaders(group: Arc<RaftGroup>, label: String) {
    let mut known = None;
    while let Some(leader) = group.leader_other_than(known.as_ref()).await {
        tracing::info!(queue = %label, %leader, "quorum queue leader");
        known = Some(leader);
    }
}

impl QuorumGroups for NodeQuorumGroups {
    fn open(&self, spec: GroupSpec, machine: Box<dyn ReplicatedMachine>) -> Arc<dyn ReplicatedLog> {
        let (started_sender, started) = watch::channel(Started::Starting);
        let activity = Activity::new();
        let log = Arc::new(QuorumGroupLog {
            group_id: spec.group,
            running: Arc::clone(&self.running),
            activity: Arc::clone(&activity),
            started,
            confirm_progress: Arc::clone(&self.confirm_progress),
            stop: Mutex::new(None),
            dir: spec.dir.clone(),
        });
        let members: Result<BTreeMap<u64, NodeName>, String> = spec
            .members
            .iter()
            .map(|(id, member)| {
                member
                    .parse()
                    .map(|node| (*id, node))
                    .map_err(|_| format!("member '{member}' is not a node name"))
            })
            .collect();
        let members = match members {
            Ok(members) => members,
            Err(reason) => {
                tracing::error!(group = spec.group, %reason, "cannot start a quorum queue's group");
                started_sender.send_replace(Started::Failed(reason));
                return log;
            }
        };
        let mut settings =
            GroupSettings::with_member_ids(spec.group, spec.dir, self.local.clone(), members);
        settings.joins = spec.joins;
        settings.stands_first = spec.preferred_leader == self.local.as_str() && !spec.joins;
        settings.another_stands_first = !settings.stands_first;
        // A queue's clients wait on its leader: a dead or hung one is
        // replaced within about two seconds (the followers wait out its
        // lease, then elect), inside the five allowed for confirms to
        // resume.
        settings.heartbeat_interval = QUEUE_HEARTBEAT_INTERVAL;
        settings.election_timeout = QUEUE_ELECTION_TIMEOUT;
        let label = spec.label.clone();
        let consensus = Arc::clone(&self.consensus);
        let running = Arc::clone(&self.running);
        let weak = Arc::downgrade(&log);
        tokio::spawn(async move {
            let dir = settings.dir.clone();
            let settings_group = settings.group;
            let adapter = Adapter {
                machine,
                activity: Arc::clone(&activity),
            };
            match consensus.start_group(settings, Box::new(adapter)).await {
                Ok(group) => {
                    activity.attach(&group);
                    tokio::spawn(log_leaders(Arc::clone(&group), label));
                    let group_id = settings_group;
                    lock(&running).insert(group_id, (Arc::clone(&group), Arc::clone(&activity)));
                    started_sender.send_replace(Started::Running(Arc::clone(&group)));
                    // Stopped while it started (or dropped): stop it now.
                    let stop = weak.upgrade().map_or(Some(false), |log| *lock(&log.stop));
                    if let Some(erase) = stop {
                        lock(&running).remove(&group_id);
                        stop_group(group, erase, dir).await;
                    }
                }
                Err(error) => {
                    tracing::error!(%error, "a quorum queue's group did not start");
                    started_sender.send_replace(Started::Failed(error.to_string()));
                }
            }
        });
        log
    }

    fn ran_here_before(&self, dir: &std::path::Path, members: &BTreeMap<u64, String>) -> bool {
        members
            .iter()
            .find(|(_, node)| **node == self.local.as_str())
            .is_some_and(|(id, _)| holds_member_files(dir, *id))
    }

    fn change_members(
        &self,
        group: u64,
        members: Vec<String>,
        change: MemberChange,
        timeout: Duration,
    ) -> MembersChanged {
        let consensus = Arc::clone(&self.consensus);
        Box::pin(async move {
            let members: Vec<NodeName> = members
                .iter()
                .filter_map(|member| member.parse().ok())
                .collect();
            let change = match change {
                MemberChange::Add { id, node } => ConsensusChange::Add { id, node },
                MemberChange::Remove { id } => ConsensusChange::Remove { id },
            };
            consensus
                .change_membership(group, &members, change, timeout)
                .await
                .map_err(|error| error.to_string())
        })
    }

    fn local_node(&self) -> String {
        self.local.to_string()
    }

    fn node_number(&self) -> u16 {
        self.node_number
    }
}
