//! A running Raft group, and proposals to it from any member: the leader
//! writes them; another member hands them to the leader it knows and then
//! waits to apply them itself, so that the proposer reads its own write.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use openraft::async_runtime::WatchReceiver;
use openraft::{BasicNode, Config, SnapshotPolicy};
use tokio::sync::watch;

use super::log_store::LogStore;
use super::raft_slot::{RaftSlot, StartRaft};
use super::state_machine::GroupStateMachine;
use super::transport::{read_index, reply_bytes, GroupEndpoint, GroupNetwork, Transport};
use super::types::{Command, Raft};
use super::wal::Wal;
use super::wire::{ProposeRefusal, Request, Response};
use super::{ConsensusError, ProposeError, StateMachine};
use crate::link::Links;
use crate::node_name::NodeName;

/// How long a proposer waits before asking again when there is no leader,
/// or the one it asked was not.
const RETRY_DELAY: Duration = Duration::from_millis(50);

/// What a group is started with.
pub struct GroupSettings {
    /// 0 is the metadata group.
    pub group: u64,
    /// Where its log, vote and snapshot live.
    pub dir: PathBuf,
    pub local: NodeName,
    /// Every voter by its Raft id, the same on every member. Ids are
    /// stable: a membership change never renumbers a member (see
    /// [`positional_member_ids`] for the ids groups were created with).
    pub members: BTreeMap<u64, NodeName>,
    /// This member was added to a group that already runs: it never
    /// initializes the group, however long it waits, but catches up from
    /// the leader as a learner and votes once the leader made it a voter.
    pub joins: bool,
    pub heartbeat_interval: Duration,
    pub election_timeout: (Duration, Duration),
    /// Entries between snapshots.
    pub snapshot_every: u64,
    /// Entries the log keeps behind its last snapshot, for members that
    /// lag a little: they catch up from the log instead of a snapshot.
    pub kept_behind_snapshot: u64,
    /// This member is a new group's first leader: it initializes the group
    /// and stands for election at once; the other members wait for it.
    /// When no member is (the metadata group), all initialize alike.
    pub stands_first: bool,
    /// Another member stands first (see `stands_first`).
    pub another_stands_first: bool,
}

impl GroupSettings {
    /// A group whose members have the ids of [`positional_member_ids`].
    pub fn new(group: u64, dir: PathBuf, local: NodeName, members: Vec<NodeName>) -> Self {
        Self::with_member_ids(group, dir, local, positional_member_ids(&members))
    }

    /// A group whose members have the ids given.
    pub fn with_member_ids(
        group: u64,
        dir: PathBuf,
        local: NodeName,
        members: BTreeMap<u64, NodeName>,
    ) -> Self {
        GroupSettings {
            group,
            dir,
            local,
            members,
            joins: false,
            // openraft ticks at about a fifth of the heartbeat interval,
            // on every member, whether anything happens or not: 500 ms
            // keeps an idle group at ten wake-ups a second.
            heartbeat_interval: Duration::from_millis(500),
            election_timeout: (Duration::from_millis(1500), Duration::from_millis(3000)),
            snapshot_every: 1000,
            kept_behind_snapshot: 1000,
            stands_first: false,
            another_stands_first: false,
        }
    }

    /// A member's id.
    fn node_id(&self, node: &NodeName) -> Option<u64> {
        self.members
            .iter()
            .find(|(_, member)| *member == node)
            .map(|(id, _)| *id)
    }

    fn openraft_config(&self) -> Result<Config, ConsensusError> {
        let millis = |duration: Duration| duration.as_millis() as u64;
        Config {
            cluster_name: format!("sluice-group-{}", self.group),
            heartbeat_interval: millis(self.heartbeat_interval),
            election_timeout_min: millis(self.election_timeout.0),
            election_timeout_max: millis(self.election_timeout.1),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_every),
            max_in_snapshot_log_to_keep: self.kept_behind_snapshot,
            // Followers get entries while the leader's own fsync runs.
            broadcast_submitted_on_append: Some(true),
            // openraft keeps the times of each entry's six stages for its
            // runtime statistics, in rings of this many per group (1,024 by
            // default, about 150 KiB once filled). Sluice reads none of
            // them, and a node holds a group per quorum queue.
            log_stage_capacity: Some(LOG_STAGE_CAPACITY),
            ..Config::default()
        }
        .validate()
        .map_err(|error| ConsensusError::Fatal {
            group: self.group,
            reason: error.to_string(),
        })
    }
}

/// See `log_stage_capacity` in [`GroupSettings::openraft_config`].
const LOG_STAGE_CAPACITY: u64 = 8;

/// The ids every group had before members could change, and every group
/// still gets when it is created: each member's place in the sorted member
/// list, from 1. A member added later gets an id of its own that no member
/// of the group ever had, so ids never need to change.
pub fn positional_member_ids(members: &[NodeName]) -> BTreeMap<u64, NodeName> {
    let mut sorted = members.to_vec();
    sorted.sort();
    sorted.dedup();
    sorted
        .into_iter()
        .enumerate()
        .map(|(position, member)| (position as u64 + 1, member))
        .collect()
}

/// The node's consensus: its links (None for a cluster of one), its
/// write-ahead log, and the transport its groups share.
pub struct ConsensusNode {
    wal: Arc<Wal>,
    transport: Option<Arc<Transport>>,
}

impl ConsensusNode {
    /// The node's write-ahead log, to stop it last.
    pub fn wal(&self) -> &Arc<Wal> {
        &self.wal
    }

    pub fn new(links: Option<Arc<Links>>, wal: Arc<Wal>) -> Arc<ConsensusNode> {
        Arc::new(ConsensusNode {
            wal,
            transport: links.map(Transport::start),
        })
    }

    pub(super) fn transport(&self) -> Option<&Arc<Transport>> {
        self.transport.as_ref()
    }

    /// Opens (or creates) a group's storage, replays it, and starts its
    /// Raft node; a group never started before is initialized with its
    /// members (the same on every member, so it is safe on all of them).
    ///
    /// # Errors
    /// Its storage cannot be opened or read.
    pub async fn start_group(
        &self,
        settings: GroupSettings,
        machine: Box<dyn StateMachine>,
    ) -> Result<Arc<RaftGroup>, ConsensusError> {
        let group = settings.group;
        let fatal = |reason: String| ConsensusError::Fatal { group, reason };
        let local_id = settings
            .node_id(&settings.local)
            .ok_or_else(|| fatal(format!("{} is not a member", settings.local)))?;
        let dir = &settings.dir;
        claim_dir(dir, local_id).map_err(|error| {
            ConsensusError::storage(format!("preparing {}", dir.display()), error)
        })?;
        let log = LogStore::open(dir, Arc::clone(&self.wal)).map_err(|error| {
            ConsensusError::storage(format!("opening the log in {}", dir.display()), error)
        })?;
        let snapshot_path = dir.join("snapshot");
        let (state_machine, applied) =
            GroupStateMachine::open(machine, snapshot_path.clone(), log.clone()).map_err(
                |error| {
                    ConsensusError::storage(format!("reading {}", snapshot_path.display()), error)
                },
            )?;
        let transport = match &self.transport {
            Some(transport) => Arc::clone(transport),
            None if settings.members.len() == 1 => Transport::detached(),
            None => return Err(fatal("a group of several members needs links".to_owned())),
        };
        let config = Arc::new(settings.openraft_config()?);
        let start: StartRaft = {
            let (transport, log) = (Arc::clone(&transport), log.clone());
            Box::new(move || {
                let network = GroupNetwork {
                    transport: Arc::clone(&transport),
                    group,
                };
                let started = Raft::new(
                    local_id,
                    Arc::clone(&config),
                    network,
                    log.clone(),
                    state_machine.clone(),
                );
                Box::pin(async move { started.await.map_err(|error| error.to_string()) })
            })
        };
        let raft = start().await.map_err(fatal)?;
        let slot = Arc::new(RaftSlot::new(raft.clone(), start));
        let propose_timeout = settings.election_timeout.1 * 4;
        transport.register(
            group,
            GroupEndpoint {
                raft: Arc::clone(&slot),
                propose_timeout,
            },
        );
        let fresh = !raft
            .is_initialized()
            .await
            .map_err(|error| fatal(error.to_string()))?;
        // A joining member waits for the leader to reach it: initializing
        // would start a group of its own.
        if fresh && !settings.joins {
            let members: BTreeMap<u64, BasicNode> = settings
                .members
                .iter()
                .map(|(id, member)| (*id, BasicNode::new(member.as_str())))
                .collect();
            if !settings.another_stands_first {
                initialize(&raft, members, group).await;
            } else {
                // A member that initializes stands for election at once:
                // with a first leader named, the others wait for it and
                // initialize themselves only if it never showed up.
                let wait = settings.election_timeout.1 * 2;
                tokio::spawn(initialize_unless_led(raft.clone(), members, group, wait));
            }
        }
        let alone = settings.members.len() == 1
            && !settings.joins
            && raft
                .with_raft_state(|state| {
                    state
                        .membership_state
                        .effective()
                        .membership()
                        .voter_ids()
                        .count()
                })
                .await
                .map_err(|error| fatal(error.to_string()))?
                == 1;
        if alone {
            // Alone, it need not wait an election timeout to find out that
            // nobody else leads: it stands at once. Alone as its log says:
            // the member list it was started with may predate changes the
            // log holds, and a member that stood at once in a group of
            // several would only unseat its leader.
            raft.trigger()
                .elect(false)
                .await
                .map_err(|error| fatal(error.to_string()))?;
        } else if settings.stands_first && fresh {
            // The other members start their groups as they apply the same
            // declaration, a moment apart: it stands until one answers,
            // well before any of them would stand itself.
            tokio::spawn(stand_first(raft.clone(), settings.election_timeout.0));
        }
        Ok(Arc::new(RaftGroup {
            group,
            local_id,
            raft: slot,
            log,
            transport,
            applied,
            commit_latency_micros: AtomicU64::new(0),
        }))
    }
}

/// A group this node is a member of.
/// A member's term and log positions (RabbitMQ's `rabbitmq_raft_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupStatus {
    pub term: u64,
    pub last_written_index: u64,
    pub commit_index: u64,
    pub last_applied_index: u64,
    pub snapshot_index: u64,
    /// How long this member's last proposal took to be committed and
    /// applied (RabbitMQ's `rabbitmq_raft_entry_commit_latency_seconds`);
    /// zero before its first.
    pub commit_latency: Duration,
}

pub struct RaftGroup {
    group: u64,
    local_id: u64,
    /// Parked while the member hibernates (see `raft_slot`).
    raft: Arc<RaftSlot>,
    log: LogStore,
    transport: Arc<Transport>,
    applied: watch::Receiver<u64>,
    /// See [`GroupStatus::commit_latency`], in microseconds.
    commit_latency_micros: AtomicU64,
}

impl RaftGroup {
    /// Where the leader this node knows of is.
    fn current_leader(&self) -> Leader {
        // Copied out before `member_name` borrows the metrics again: a
        // borrow held across a second one deadlocks the moment openraft's
        // writer queues between the two (the lock prefers writers), and
        // with it every task on that worker thread.
        let leader = self.raft.metrics(|metrics| metrics.current_leader);
        match leader {
            Some(leader) if leader == self.local_id => Leader::Here,
            Some(leader) => self
                .member_name(leader)
                .map_or(Leader::Unknown, Leader::Peer),
            None => Leader::Unknown,
        }
    }

    /// The node of the member `id`, as the group's current membership
    /// (the last one this member saw, committed or not) names it: members
    /// come and go, so no list fixed at the start would do.
    fn member_name(&self, id: u64) -> Option<NodeName> {
        self.raft.metrics(|metrics| {
            let node = metrics.membership_config.membership().get_node(&id)?;
            node.addr.parse().ok()
        })
    }

    /// The voters of the group's current membership, by id.
    pub fn voters(&self) -> BTreeMap<u64, NodeName> {
        self.raft.metrics(|metrics| {
            let membership = metrics.membership_config.membership();
            membership
                .voter_ids()
                .filter_map(|id| {
                    let node = membership.get_node(&id)?;
                    Some((id, node.addr.parse().ok()?))
                })
                .collect()
        })
    }

    /// The leader this node knows of.
    pub fn leader(&self) -> Option<NodeName> {
        let leader = self.raft.metrics(|metrics| metrics.current_leader)?;
        self.member_name(leader)
    }

    pub fn is_leader(&self) -> bool {
        self.raft.metrics(|metrics| metrics.current_leader) == Some(self.local_id)
    }

    /// The command of the entry at `index` in this member's log, read
    /// back (from disk, unless it is about to be applied): None once the
    /// log was purged past it. The state machine keeps what it reads this
    /// way ([`StateMachine::first_needed`]).
    ///
    /// # Errors
    /// The entry cannot be read or decoded.
    pub fn read_command(&self, index: u64) -> std::io::Result<Option<Bytes>> {
        self.log.read_command(index)
    }

    /// This member's term and log positions, for metrics.
    pub fn status(&self) -> GroupStatus {
        let index = |log_id: &Option<crate::consensus::types::LogId>| {
            log_id.as_ref().map_or(0, |log_id| log_id.index)
        };
        self.raft.metrics(|metrics| GroupStatus {
            term: metrics.current_term,
            last_written_index: metrics.last_log_index.unwrap_or(0),
            commit_index: index(&metrics.local_committed),
            last_applied_index: index(&metrics.last_applied),
            snapshot_index: index(&metrics.snapshot),
            commit_latency: Duration::from_micros(
                self.commit_latency_micros.load(Ordering::Relaxed),
            ),
        })
    }

    /// The index of the last entry applied on this node.
    pub fn applied_index(&self) -> u64 {
        *self.applied.borrow()
    }

    /// Waits until this node has applied the entry at `index`.
    ///
    /// # Errors
    /// Not applied within `timeout`, or the group stopped.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> Result<(), ProposeError> {
        let mut applied = self.applied.clone();
        let reached = tokio::time::timeout(timeout, async {
            applied
                .wait_for(|applied| *applied >= index)
                .await
                .map(drop)
        })
        .await;
        match reached {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(ProposeError::ShuttingDown),
            Err(_) => Err(ProposeError::Timeout(timeout)),
        }
    }

    /// Proposes `command`; returns the state machine's reply once it is
    /// committed and applied on this node. Asks again across leader
    /// changes until `timeout`.
    ///
    /// # Errors
    /// No leader with a majority within `timeout`, or the group failed.
    pub async fn propose(&self, command: Bytes, timeout: Duration) -> Result<Bytes, ProposeError> {
        self.propose_and(command, timeout, Applied::Here).await
    }

    /// As [`RaftGroup::propose`], but returns once the command is committed
    /// and applied on the leader, without waiting for this member to apply
    /// it (it learns the commit with the leader's next message): for a
    /// proposer that needs only the leader's reply.
    ///
    /// # Errors
    /// As [`RaftGroup::propose`].
    pub async fn propose_committed(
        &self,
        command: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, ProposeError> {
        self.propose_and(command, timeout, Applied::OnLeader).await
    }

    async fn propose_and(
        &self,
        command: Bytes,
        timeout: Duration,
        applied: Applied,
    ) -> Result<Bytes, ProposeError> {
        let started = Instant::now();
        let deadline = started + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ProposeError::Timeout(timeout));
            }
            let attempt = match self.current_leader() {
                Leader::Here => self.write_here(&command, left).await,
                Leader::Peer(peer) => self.write_on(&peer, &command, left, applied).await,
                Leader::Unknown => Attempt::Retry,
            };
            match attempt {
                Attempt::Done(reply) => {
                    let took = started.elapsed().as_micros();
                    self.commit_latency_micros
                        .store(u64::try_from(took).unwrap_or(u64::MAX), Ordering::Relaxed);
                    return Ok(reply);
                }
                Attempt::Failed(error) => return Err(error),
                Attempt::Retry => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    tokio::time::sleep(RETRY_DELAY.min(left)).await;
                }
            }
        }
    }

    /// This node is the leader: write, and the reply comes once applied
    /// here.
    async fn write_here(&self, command: &Bytes, left: Duration) -> Attempt {
        let raft = match self.raft.in_use().await {
            Ok(raft) => raft,
            Err(reason) => return Attempt::Failed(ProposeError::Fatal(reason)),
        };
        let write = raft.client_write(Command(command.to_vec()));
        match tokio::time::timeout(left, write).await {
            Ok(Ok(response)) => Attempt::Done(Bytes::from(response.data.0)),
            Ok(Err(error)) if error.forward_to_leader().is_some() => Attempt::Retry,
            Ok(Err(error)) => Attempt::Failed(ProposeError::Fatal(error.to_string())),
            Err(_) => Attempt::Failed(ProposeError::Timeout(left)),
        }
    }

    /// Another node leads: it writes, then this node waits to apply it.
    /// A leader that stops answering (hung, cut off) is given up on as
    /// soon as another is elected, so the proposal goes there instead of
    /// waiting out the whole timeout on a dead one.
    async fn write_on(
        &self,
        leader: &NodeName,
        command: &Bytes,
        left: Duration,
        applied: Applied,
    ) -> Attempt {
        let request = Request::Propose(command.to_vec());
        let forwarded = self.transport.request(leader, self.group, request, left);
        let response = tokio::select! {
            response = forwarded => response,
            () = self.leader_changes_from(leader) => return Attempt::Retry,
        };
        match response {
            Ok(Response::Proposed(Ok((reply, _)))) if applied == Applied::OnLeader => {
                Attempt::Done(reply_bytes(reply))
            }
            Ok(Response::Proposed(Ok((reply, index)))) => {
                match self.wait_applied(index, left).await {
                    Ok(()) => Attempt::Done(reply_bytes(reply)),
                    Err(error) => Attempt::Failed(error),
                }
            }
            Ok(Response::Proposed(Err(ProposeRefusal::Failed(reason)))) => {
                tracing::debug!(group = self.group, %leader, %reason, "the leader could not write a proposal");
                Attempt::Retry
            }
            Ok(_) | Err(_) => Attempt::Retry,
        }
    }

    /// A read barrier: returns once this node has applied every change
    /// committed before the call, wherever it was proposed. A lookup that
    /// found nothing here asks this before it answers "not found", so a
    /// client that declared something through another node a moment ago
    /// finds it.
    ///
    /// # Errors
    /// No leader confirmed within `timeout`.
    pub async fn sync(&self, timeout: Duration) -> Result<(), ProposeError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ProposeError::Timeout(timeout));
            }
            let index = match self.current_leader() {
                Leader::Here => match self.raft.in_use().await {
                    Ok(raft) => read_index(&raft, left).await.ok(),
                    Err(reason) => return Err(ProposeError::Fatal(reason)),
                },
                Leader::Peer(peer) => {
                    match self
                        .transport
                        .request(&peer, self.group, Request::ReadIndex, left)
                        .await
                    {
                        Ok(Response::ReadIndex(Ok(index))) => Some(index),
                        _ => None,
                    }
                }
                Leader::Unknown => None,
            };
            match index {
                Some(index) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    return self.wait_applied(index, left).await;
                }
                None => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    tokio::time::sleep(RETRY_DELAY.min(left)).await;
                }
            }
        }
    }

    /// Resolves with the leader once this node knows of one other than
    /// `known` (None: any leader); None once the group stopped.
    pub async fn leader_other_than(&self, known: Option<&NodeName>) -> Option<NodeName> {
        let mut restarts = self.raft.restarts();
        loop {
            let Some(raft) = self.raft.if_running() else {
                // Parked, the leader it knew stands until it runs again.
                if let Some(leader) = self.leader().filter(|leader| Some(leader) != known) {
                    return Some(leader);
                }
                if self.raft.is_stopped() {
                    return None;
                }
                restarts.changed().await.ok()?;
                continue;
            };
            let mut metrics = raft.metrics();
            drop(raft);
            loop {
                if let Some(leader) = self.leader().filter(|leader| Some(leader) != known) {
                    return Some(leader);
                }
                // Its metrics end when the node parks or stops.
                if metrics.changed().await.is_err() {
                    break;
                }
            }
            if self.raft.is_stopped() {
                return None;
            }
        }
    }

    /// Resolves once this node knows of a leader other than `leader`.
    /// Keeps the node running meanwhile: a proposal waits on it.
    async fn leader_changes_from(&self, leader: &NodeName) {
        let Ok(raft) = self.raft.in_use().await else {
            return std::future::pending().await;
        };
        let mut metrics = raft.metrics();
        loop {
            let current = metrics.borrow_watched().current_leader;
            let current = current.and_then(|id| self.member_name(id));
            if current.is_some_and(|current| current != *leader) {
                return;
            }
            if metrics.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Stops this member's timers: no heartbeats, no election timeouts, no
    /// wake-ups at all while its group is idle. It still answers its
    /// peers and replicates what is proposed. [`RaftGroup::park`] follows.
    pub fn hibernate(&self) {
        self.raft.set_asleep(true);
    }

    /// Whether the member hibernates with its Raft node running: since
    /// [`RaftGroup::hibernate`], or started again by a peer or a proposal.
    pub fn runs_while_asleep(&self) -> bool {
        self.raft.is_asleep() && self.raft.if_running().is_some()
    }

    /// Compacts a hibernating member's log, so that a queue that was
    /// drained and left alone keeps no entries beyond the last few, then
    /// parks its Raft node (see `raft_slot`), which starts again when a
    /// peer, a proposal or [`RaftGroup::wake`] needs it, timers still off.
    /// Asked a while after [`RaftGroup::hibernate`], so that no heartbeat
    /// the node sent is still under way: its answer would find the node
    /// gone.
    pub fn park(&self) {
        let (slot, group) = (Arc::clone(&self.raft), self.group);
        tokio::spawn(async move {
            if let Some(raft) = slot.if_running() {
                compact(raft, group).await;
            }
            if slot.is_asleep() {
                slot.park().await;
            }
        });
    }

    /// Starts this member's timers again, and its Raft node if parked.
    pub fn wake(&self) {
        self.raft.set_asleep(false);
        let (slot, group) = (Arc::clone(&self.raft), self.group);
        tokio::spawn(async move {
            if let Err(reason) = slot.in_use().await {
                tracing::debug!(group, %reason, "a woken member did not start");
            }
        });
    }

    /// Stops the group's Raft node.
    pub async fn shutdown(&self) {
        self.transport.unregister(self.group);
        if let Err(error) = self.raft.stop().await {
            tracing::warn!(group = self.group, %error, "raft group did not stop cleanly");
        }
        // Its segments complete, as a log opened again in this process
        // reads them (the WAL completes them only at the next start).
        self.log.write_out().await;
    }
}

/// How long compaction waits for the snapshot it asked for.
const COMPACTION_SNAPSHOT_WAIT: Duration = Duration::from_secs(5);

/// Takes a snapshot of what is applied (if the state can be snapshotted
/// there: see [`StateMachine::first_needed`]) and purges the log up to the
/// snapshot, all of it: an idle group's log holds only what its state
/// still reads.
async fn compact(raft: Raft, group: u64) {
    let index = |log_id: Option<crate::consensus::types::LogId>| log_id.map(|id| id.index);
    let (applied, snapshot, purged) = {
        let metrics = raft.metrics();
        let metrics = metrics.borrow_watched();
        (
            index(metrics.last_applied),
            index(metrics.snapshot),
            index(metrics.purged),
        )
    };
    // Compacted at its last hibernation, and nothing applied since: a
    // member started again by a peer's heartbeat parks without writing
    // the same snapshot again.
    if snapshot >= applied && purged >= snapshot {
        return;
    }
    if raft.trigger().snapshot().await.is_err() {
        return;
    }
    let mut metrics = raft.metrics();
    let caught_up = tokio::time::timeout(COMPACTION_SNAPSHOT_WAIT, async {
        loop {
            let snapshot = index(metrics.borrow_watched().snapshot);
            if snapshot >= applied || metrics.changed().await.is_err() {
                return;
            }
        }
    })
    .await;
    if caught_up.is_err() {
        tracing::debug!(group, "the log is compacted up to an older snapshot");
    }
    let snapshot = index(raft.metrics().borrow_watched().snapshot);
    let Some(snapshot) = snapshot else {
        return;
    };
    if raft.trigger().purge_log(snapshot).await.is_err() {
        return;
    }
    // Purged before the node parks, which would cut the purge short.
    let mut metrics = raft.metrics();
    let _ = tokio::time::timeout(COMPACTION_SNAPSHOT_WAIT, async {
        while index(metrics.borrow_watched().purged) < Some(snapshot) {
            if metrics.changed().await.is_err() {
                return;
            }
        }
    })
    .await;
}

/// Initializes a new group with its members.
async fn initialize(raft: &Raft, members: BTreeMap<u64, BasicNode>, group: u64) {
    // Another member's identical initialization may have come first: then
    // there is nothing to do.
    if let Err(error) = raft.initialize(members).await {
        tracing::debug!(group, %error, "group initialized by another member");
    }
}

/// Initializes a new group after `wait` unless a leader showed up first.
async fn initialize_unless_led(
    raft: Raft,
    members: BTreeMap<u64, BasicNode>,
    group: u64,
    wait: Duration,
) {
    tokio::time::sleep(wait).await;
    let led = raft.metrics().borrow_watched().current_leader.is_some();
    if !led
        && raft
            .is_initialized()
            .await
            .is_ok_and(|initialized| !initialized)
    {
        initialize(&raft, members, group).await;
    }
}

/// How often a group's first leader stands again while its peers start.
const STAND_FIRST_EVERY: Duration = Duration::from_millis(50);

/// Stands for election every [`STAND_FIRST_EVERY`] until the group has a
/// leader, for at most `within`.
async fn stand_first(raft: Raft, within: Duration) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if raft.metrics().borrow_watched().current_leader.is_some() {
            return;
        }
        if raft.trigger().elect(false).await.is_err() {
            return;
        }
        tokio::time::sleep(STAND_FIRST_EVERY).await;
    }
}

/// Where a proposal must be applied before its proposer hears back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Applied {
    Here,
    OnLeader,
}

enum Leader {
    Here,
    Peer(NodeName),
    Unknown,
}

/// The file in a group's directory that names the member whose files they
/// are.
const MEMBER_ID_FILE: &str = "member_id";

/// Whether `dir` holds the files of member `local_id`: it ran on this node
/// before, as opposed to a member new here (its directory is missing, or
/// holds what an earlier member left, which [`claim_dir`] erases). A
/// directory without the file is one of a version that wrote none, whose
/// ids never changed: it is this member's.
pub fn holds_member_files(dir: &std::path::Path, local_id: u64) -> bool {
    match std::fs::read_to_string(dir.join(MEMBER_ID_FILE)) {
        Ok(text) => text.trim().parse() == Ok(local_id),
        Err(_) => dir.exists(),
    }
}

/// Makes `dir` this member's: files an earlier member of this node left
/// there (it was removed while the node was down, then the node was added
/// again under a new id) are erased, as a new member starts empty. A
/// directory without the file is one of a version that wrote none, whose
/// ids never changed: it is this member's.
fn claim_dir(dir: &std::path::Path, local_id: u64) -> std::io::Result<()> {
    let file = dir.join(MEMBER_ID_FILE);
    match std::fs::read_to_string(&file) {
        Ok(text) if text.trim().parse() == Ok(local_id) => return Ok(()),
        Ok(text) => {
            tracing::info!(dir = %dir.display(), earlier = %text.trim(), local_id, "erasing what an earlier member left");
            std::fs::remove_dir_all(dir)?;
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    std::fs::create_dir_all(dir)?;
    let temporary = dir.join(format!("{MEMBER_ID_FILE}.new"));
    std::fs::write(&temporary, local_id.to_string())?;
    std::fs::rename(&temporary, &file)?;
    Ok(())
}

enum Attempt {
    Done(Bytes),
    Failed(ProposeError),
    Retry,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> NodeName {
        text.parse().unwrap()
    }

    #[test]
    fn a_directory_holds_a_members_files_only_once_it_claimed_them() {
        let dir = std::env::temp_dir().join(format!("sluice-holds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!holds_member_files(&dir, 2), "no directory");
        claim_dir(&dir, 2).unwrap();
        assert!(holds_member_files(&dir, 2));
        assert!(!holds_member_files(&dir, 9), "an earlier member's");
        std::fs::remove_file(dir.join(MEMBER_ID_FILE)).unwrap();
        assert!(holds_member_files(&dir, 9), "a version that kept no ids");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn member_ids_of_a_group_created_before_ids_were_kept_are_sorted_positions() {
        let members = [
            name("c@127.0.0.1:3"),
            name("a@127.0.0.1:1"),
            name("b@127.0.0.1:2"),
        ];
        let ids = positional_member_ids(&members);
        let expected: Vec<(u64, &str)> = vec![
            (1, "a@127.0.0.1:1"),
            (2, "b@127.0.0.1:2"),
            (3, "c@127.0.0.1:3"),
        ];
        let got: Vec<(u64, String)> = ids
            .into_iter()
            .map(|(id, node)| (id, node.to_string()))
            .collect();
        assert_eq!(
            got,
            expected
                .into_iter()
                .map(|(id, node)| (id, node.to_owned()))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn member_ids_given_are_kept_whatever_their_order() {
        let ids = BTreeMap::from([(2, name("a@127.0.0.1:1")), (7, name("z@127.0.0.1:9"))]);
        let settings = GroupSettings::with_member_ids(
            3,
            PathBuf::from("/nowhere"),
            name("z@127.0.0.1:9"),
            ids,
        );
        assert_eq!(settings.node_id(&settings.local), Some(7));
        assert_eq!(settings.node_id(&name("b@127.0.0.1:2")), None);
    }

    #[test]
    fn member_dir_of_an_earlier_member_is_erased_and_a_legacy_one_kept() {
        let dir = std::env::temp_dir().join(format!("sluice-claim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // A directory of a version that wrote no id: kept, and named now.
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vote"), b"legacy").unwrap();
        claim_dir(&dir, 2).unwrap();
        assert!(dir.join("vote").exists());
        assert_eq!(
            std::fs::read_to_string(dir.join(MEMBER_ID_FILE)).unwrap(),
            "2"
        );
        // The same member again: untouched.
        claim_dir(&dir, 2).unwrap();
        assert!(dir.join("vote").exists());
        // Another member of this node, added later under a new id: starts
        // empty.
        claim_dir(&dir, 9).unwrap();
        assert!(!dir.join("vote").exists());
        assert_eq!(
            std::fs::read_to_string(dir.join(MEMBER_ID_FILE)).unwrap(),
            "9"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
