//! Raft groups of real nodes in one test process: real links on loopback,
//! real logs and snapshots in temporary directories, fsynced by a real
//! group-commit thread. The state machine is a list of the commands
//! applied, so that every member's history can be compared.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice_cluster::consensus::{
    ConsensusNode, GroupSettings, MemberChange, ProposeError, RaftGroup, StateMachine, Wal,
};
use sluice_cluster::cookie::Cookie;
use sluice_cluster::link::{LinkSettings, Links};
use sluice_cluster::node_name::NodeName;
use sluice_store::GroupCommit;

/// The commands applied, in order, shared with the test.
#[derive(Clone, Default)]
struct History(Arc<Mutex<Vec<String>>>);

impl History {
    fn get(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

impl StateMachine for History {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Bytes {
        let mut applied = self.0.lock().unwrap();
        applied.push(String::from_utf8_lossy(command).into_owned());
        Bytes::from(applied.len().to_string())
    }

    fn snapshot(&self) -> Bytes {
        Bytes::from(self.get().join("\n"))
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(snapshot).map_err(|error| error.to_string())?;
        *self.0.lock().unwrap() = if text.is_empty() {
            Vec::new()
        } else {
            text.split('\n').map(str::to_owned).collect()
        };
        Ok(())
    }
}

/// A state that reads one entry back, as a quorum queue reads a body: a
/// "hold" command needs its own entry until a "release" comes.
#[derive(Clone, Default)]
struct Holder(Arc<Mutex<HolderState>>);

#[derive(Default)]
struct HolderState {
    applied: u64,
    held: Option<u64>,
    since_kept: u64,
}

impl StateMachine for Holder {
    fn apply(&mut self, index: u64, command: &[u8]) -> Bytes {
        let mut state = self.0.lock().unwrap();
        state.applied += 1;
        match command {
            b"hold" => state.held = Some(index),
            b"release" => state.held = None,
            _ => {}
        }
        Bytes::from(index.to_string())
    }

    fn snapshot(&self) -> Bytes {
        let state = self.0.lock().unwrap();
        let held = state.held.map_or(String::new(), |held| held.to_string());
        Bytes::from(format!("{} {held}", state.applied))
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(snapshot).map_err(|error| error.to_string())?;
        let mut state = self.0.lock().unwrap();
        let (applied, held) = text.split_once(' ').ok_or("no space")?;
        state.applied = applied.parse().map_err(|_| "bad count")?;
        state.held = held.parse().ok();
        Ok(())
    }

    fn first_needed(&self) -> Option<u64> {
        self.0.lock().unwrap().held
    }

    fn keep_for_snapshot(&mut self) -> bool {
        let mut state = self.0.lock().unwrap();
        state.since_kept += 1;
        if state.since_kept < 5 {
            return false;
        }
        state.since_kept = 0;
        true
    }
}

const TIMEOUT: Duration = Duration::from_secs(10);

/// One member: its links, its group, its state, on its own directory.
struct Member {
    name: NodeName,
    links: Option<Arc<Links>>,
    wal: Arc<GroupCommit>,
    group: Option<Arc<RaftGroup>>,
    history: History,
    consensus: Option<Arc<ConsensusNode>>,
}

impl Member {
    async fn start(
        name: &NodeName,
        members: &[NodeName],
        dir: &Path,
        snapshot_every: u64,
    ) -> Member {
        let history = History::default();
        Self::start_with(
            name,
            members,
            dir,
            snapshot_every,
            Box::new(history.clone()),
            history,
        )
        .await
    }

    async fn start_with(
        name: &NodeName,
        members: &[NodeName],
        dir: &Path,
        snapshot_every: u64,
        machine: Box<dyn StateMachine>,
        history: History,
    ) -> Member {
        let wal = GroupCommit::start(Duration::ZERO, |_, _| {});
        let links = if members.len() > 1 {
            let settings = LinkSettings {
                node: name.clone(),
                members: members.to_vec(),
                cookie: Cookie::new("shared"),
                heartbeat_timeout: Duration::from_millis(1000),
                tls: None,
            };
            Some(Links::start(settings).await.expect("links start"))
        } else {
            None
        };
        // The member's directory is its data directory and its group's.
        let consensus = ConsensusNode::new(
            links.clone(),
            Wal::open(dir, Arc::clone(&wal)).expect("the WAL opens"),
        );
        let mut settings = GroupSettings::new(7, dir.to_path_buf(), name.clone(), members.to_vec());
        settings.snapshot_every = snapshot_every;
        settings.kept_behind_snapshot = snapshot_every;
        let group = consensus
            .start_group(settings, machine)
            .await
            .expect("the group starts");
        Member {
            name: name.clone(),
            links,
            wal,
            group: Some(group),
            history,
            consensus: None,
        }
    }

    /// A member with the ids given, on a node linked to all of `cluster`;
    /// `joins` when it is added to a group that runs already.
    async fn start_in_cluster(
        name: &NodeName,
        cluster: &[NodeName],
        ids: BTreeMap<u64, NodeName>,
        joins: bool,
        dir: &Path,
    ) -> Member {
        let wal = GroupCommit::start(Duration::ZERO, |_, _| {});
        let settings = LinkSettings {
            node: name.clone(),
            members: cluster.to_vec(),
            cookie: Cookie::new("shared"),
            heartbeat_timeout: Duration::from_millis(1000),
            tls: None,
        };
        let links = Links::start(settings).await.expect("links start");
        let consensus = ConsensusNode::new(
            Some(Arc::clone(&links)),
            Wal::open(dir, Arc::clone(&wal)).expect("the WAL opens"),
        );
        let mut settings = GroupSettings::with_member_ids(7, dir.to_path_buf(), name.clone(), ids);
        settings.joins = joins;
        settings.snapshot_every = 10;
        settings.kept_behind_snapshot = 5;
        let history = History::default();
        let group = consensus
            .start_group(settings, Box::new(history.clone()))
            .await
            .expect("the group starts");
        Member {
            name: name.clone(),
            links: Some(links),
            wal,
            group: Some(group),
            history,
            consensus: Some(consensus),
        }
    }

    fn group(&self) -> &RaftGroup {
        self.group.as_ref().expect("running")
    }

    async fn stop(&mut self) {
        if let Some(group) = self.group.take() {
            group.shutdown().await;
        }
        if let Some(links) = self.links.take() {
            links.shutdown();
        }
        let wal = Arc::clone(&self.wal);
        tokio::task::spawn_blocking(move || wal.stop())
            .await
            .unwrap();
    }
}

fn temporary_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-consensus-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn free_names(count: usize) -> Vec<NodeName> {
    let mut names: Vec<NodeName> = (0..count)
        .map(|index| {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            format!("n{}@127.0.0.1:{port}", index + 1).parse().unwrap()
        })
        .collect();
    names.sort();
    names
}

async fn propose(member: &Member, command: &str) -> Result<String, ProposeError> {
    member
        .group()
        .propose(Bytes::from(command.to_owned()), TIMEOUT)
        .await
        .map(|reply| String::from_utf8_lossy(&reply).into_owned())
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !check() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consensus_a_group_of_one_applies_and_recovers_across_snapshots() {
    let dir = temporary_dir("one");
    let names = free_names(1);
    let mut member = Member::start(&names[0], &names, &dir, 10).await;
    for index in 1..=25 {
        let reply = propose(&member, &format!("c{index}")).await.unwrap();
        assert_eq!(reply, index.to_string(), "the reply is the state machine's");
    }
    assert!(dir.join("snapshot").exists(), "25 entries made a snapshot");
    member.stop().await;

    let mut member = Member::start(&names[0], &names, &dir, 10).await;
    let expected: Vec<String> = (1..=25).map(|index| format!("c{index}")).collect();
    eventually("the state comes back", || member.history.get() == expected).await;
    assert_eq!(propose(&member, "c26").await.unwrap(), "26");
    member.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consensus_three_members_agree_and_a_returning_member_catches_up() {
    let base = temporary_dir("three");
    let names = free_names(3);
    let mut members = Vec::new();
    for (index, name) in names.iter().enumerate() {
        members.push(Member::start(name, &names, &base.join(format!("m{index}")), 20).await);
    }
    // Proposals through every member, leader or not.
    for round in 0..3 {
        for member in &members {
            propose(member, &format!("{}-{round}", member.name.name()))
                .await
                .unwrap();
        }
    }
    // The last proposer has applied everything; the others follow.
    let reference = members[2].history.get();
    assert_eq!(reference.len(), 9);
    for member in &members {
        eventually("every member applies the same history", || {
            member.history.get() == reference
        })
        .await;
    }

    // One member goes; the two others are a majority and go on, past a
    // snapshot, so the returning member must be sent one.
    let gone = members
        .iter()
        .position(|member| !member.group().is_leader())
        .expect("a follower");
    members[gone].stop().await;
    let survivor = (gone + 1) % 3;
    for index in 0..50 {
        propose(&members[survivor], &format!("while-away-{index}"))
            .await
            .unwrap();
    }
    let back = Member::start(&names[gone], &names, &base.join(format!("m{gone}")), 20).await;
    members[gone] = back;
    let expected = members[survivor].history.get();
    assert_eq!(expected.len(), 59);
    eventually("the returning member catches up", || {
        members[gone].history.get() == expected
    })
    .await;
    assert!(propose(&members[gone], "after").await.is_ok());
    for member in &mut members {
        member.stop().await;
    }
    let _ = std::fs::remove_dir_all(&base);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consensus_without_a_majority_a_proposal_times_out() {
    let base = temporary_dir("minority");
    let names = free_names(3);
    let mut members = Vec::new();
    for (index, name) in names.iter().enumerate() {
        members.push(Member::start(name, &names, &base.join(format!("m{index}")), 100).await);
    }
    propose(&members[0], "with-majority").await.unwrap();
    members[1].stop().await;
    members[2].stop().await;
    let timeout = Duration::from_secs(3);
    let began = Instant::now();
    let result = members[0]
        .group()
        .propose(Bytes::from_static(b"without"), timeout)
        .await;
    let waited = began.elapsed();
    assert!(
        matches!(result, Err(ProposeError::Timeout(_))),
        "{result:?}"
    );
    assert!(
        waited < timeout + Duration::from_secs(1),
        "waited {waited:?}"
    );
    members[0].stop().await;
    let _ = std::fs::remove_dir_all(&base);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consensus_keeps_the_entries_its_state_reads_back_across_snapshots_and_restarts() {
    let dir = temporary_dir("held");
    let names = free_names(1);
    let start = |holder: &Holder| {
        Member::start_with(
            &names[0],
            &names,
            &dir,
            10,
            Box::new(holder.clone()),
            History::default(),
        )
    };
    let holder = Holder::default();
    let mut member = start(&holder).await;
    for _ in 0..15 {
        propose(&member, "a").await.unwrap();
    }
    let held: u64 = propose(&member, "hold").await.unwrap().parse().unwrap();
    for _ in 0..60 {
        propose(&member, "b").await.unwrap();
    }
    assert!(dir.join("snapshot").exists(), "a snapshot was taken before");
    assert_eq!(
        member.group().read_command(held).unwrap().as_deref(),
        Some(&b"hold"[..]),
        "60 entries and several snapshots later, the held entry is in the log"
    );
    member.stop().await;

    let holder = Holder::default();
    let mut member = start(&holder).await;
    eventually("the state comes back", || {
        let state = holder.0.lock().unwrap();
        state.held == Some(held) && state.applied >= 76
    })
    .await;
    assert_eq!(
        member.group().read_command(held).unwrap().as_deref(),
        Some(&b"hold"[..])
    );
    propose(&member, "release").await.unwrap();
    for _ in 0..40 {
        propose(&member, "c").await.unwrap();
    }
    // Released, the entry goes with the next snapshot's purge.
    eventually("the released entry is purged", || {
        member.group().read_command(held).unwrap().is_none()
    })
    .await;
    member.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consensus_members_added_catch_up_vote_and_outlive_the_first() {
    let base = temporary_dir("grow");
    let names = free_names(3);
    let only_first = BTreeMap::from([(1, names[0].clone())]);
    let mut members = vec![
        Member::start_in_cluster(&names[0], &names, only_first, false, &base.join("m0")).await,
    ];
    // Past a few snapshots: the new members get one, then the log after it.
    for index in 0..35 {
        propose(&members[0], &format!("c{index}")).await.unwrap();
    }
    // Ids no member had: the first member keeps its 1.
    for (index, id) in [(1, 5_u64), (2, 6)] {
        let ids = BTreeMap::from([(1, names[0].clone()), (id, names[index].clone())]);
        let dir = base.join(format!("m{index}"));
        members.push(Member::start_in_cluster(&names[index], &names, ids, true, &dir).await);
        let change = MemberChange::Add {
            id,
            node: names[index].to_string(),
        };
        // Asked of a node that is not a member yet: it finds the leader.
        members[index]
            .consensus
            .as_ref()
            .unwrap()
            .change_membership(7, &names[..1], change, TIMEOUT)
            .await
            .expect("the member is added");
    }
    let voters: Vec<u64> = members[0].group().voters().into_keys().collect();
    assert_eq!(voters, [1, 5, 6]);
    let expected = members[0].history.get();
    assert_eq!(expected.len(), 35);
    for member in &members {
        eventually("the new members caught up", || {
            member.history.get() == expected
        })
        .await;
    }

    // The first member goes: the two added ones are a majority, elect a
    // leader among themselves and go on.
    members[0].stop().await;
    assert_eq!(propose(&members[1], "after").await.unwrap(), "36");
    eventually("the leader is an added member", || {
        members[1].group().leader() == Some(names[1].clone())
            || members[1].group().leader() == Some(names[2].clone())
    })
    .await;
    // And they remove it.
    members[2]
        .consensus
        .as_ref()
        .unwrap()
        .change_membership(7, &names[1..], MemberChange::Remove { id: 1 }, TIMEOUT)
        .await
        .expect("the member is removed");
    eventually("the removal is known", || {
        members[1].group().voters().into_keys().collect::<Vec<_>>() == [5, 6]
    })
    .await;
    assert_eq!(propose(&members[2], "two").await.unwrap(), "37");
    for member in &mut members {
        member.stop().await;
    }
    let _ = std::fs::remove_dir_all(&base);
}
