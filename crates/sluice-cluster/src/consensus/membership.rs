//! Changing a group's members, on its leader: a new member is added as a
//! learner, which catches up from the leader's log (or a snapshot of it)
//! without a vote, and becomes a voter only once it has; a member leaves
//! the membership in one change. Any node may ask, member of the group or
//! not: the request goes to each member in turn until the leader takes it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers};
use serde::{Deserialize, Serialize};

use super::group::ConsensusNode;
use super::transport::TransportError;
use super::types::{Raft, TypeConfig};
use super::wire::{ProposeRefusal, Request, Response};
use crate::node_name::NodeName;

/// How long a node waits before asking the members again when none of
/// them led, or the leader was busy with another change.
const RETRY_DELAY: Duration = Duration::from_millis(100);

/// One change to a group's members.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberChange {
    /// Adds the member `id` on `node`: a learner that catches up, then a
    /// voter. Done already when it is a voter.
    Add { id: u64, node: String },
    /// Removes the member `id`, voter or learner. Done already when it is
    /// neither.
    Remove { id: u64 },
}

/// Why a membership change was not made.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error("no leader of the group took the change within {}s", .0.as_secs_f64())]
    Timeout(Duration),
    #[error("{0}")]
    Refused(String),
}

impl ConsensusNode {
    /// Makes `change` to `group` on its leader, asking this node's member
    /// (if it has one) and then each of `members` until one leads; returns
    /// once the change is committed. An added member has caught up by then.
    ///
    /// # Errors
    /// No leader took it within `timeout`, or the leader refused it.
    pub async fn change_membership(
        &self,
        group: u64,
        members: &[NodeName],
        change: MemberChange,
        timeout: Duration,
    ) -> Result<(), MembershipError> {
        let Some(transport) = self.transport() else {
            return Err(MembershipError::Refused(
                "a node without peers cannot change a group's members".to_owned(),
            ));
        };
        let deadline = Instant::now() + timeout;
        // A removal the leader failed may still have been made: a leader
        // that removes itself steps down as the change commits, and may
        // answer with an error. It is asked again, of the members, until
        // the deadline: one that no longer counts the member answers done.
        // What the last refusal said is the answer should none agree.
        let retries_refusals = matches!(change, MemberChange::Remove { .. });
        let mut last_refusal = None;
        let mut refused = |reason: String| {
            if retries_refusals {
                tracing::debug!(group, %reason, "a member removal failed; asking again");
                last_refusal = Some(reason);
                None
            } else {
                Some(MembershipError::Refused(reason))
            }
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(last_refusal
                    .map_or(MembershipError::Timeout(timeout), MembershipError::Refused));
            }
            let here = match transport.endpoint(group) {
                Some(endpoint) => endpoint.raft.in_use().await.ok(),
                None => None,
            };
            if let Some(raft) = here {
                match change_on_leader(&raft, &change, left).await {
                    Ok(()) => return Ok(()),
                    Err(ProposeRefusal::Failed(reason)) => {
                        if let Some(error) = refused(reason) {
                            return Err(error);
                        }
                    }
                    Err(ProposeRefusal::NotLeader) => {}
                }
            }
            for member in members {
                let left = deadline.saturating_duration_since(Instant::now());
                let request = Request::ChangeMembership(change.clone());
                match transport.request(member, group, request, left).await {
                    Ok(Response::MembershipChanged(Ok(()))) => return Ok(()),
                    Ok(Response::MembershipChanged(Err(ProposeRefusal::Failed(reason)))) => {
                        if let Some(error) = refused(reason) {
                            return Err(error);
                        }
                    }
                    Ok(_)
                    | Err(TransportError::Unreachable(_) | TransportError::NoGroup(_))
                    | Err(TransportError::Timeout(..)) => {}
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(RETRY_DELAY.min(left)).await;
        }
    }
}

/// Makes `change` if this member leads; [`ProposeRefusal::NotLeader`]
/// when it does not, or when another change is under way (ask again).
pub async fn change_on_leader(
    raft: &Raft,
    change: &MemberChange,
    timeout: Duration,
) -> Result<(), ProposeRefusal> {
    let (leads, voters, nodes) = {
        let metrics = raft.metrics();
        let metrics = metrics.borrow_watched();
        let membership = metrics.membership_config.membership();
        (
            metrics.current_leader == Some(metrics.id),
            membership.voter_ids().collect::<BTreeSet<u64>>(),
            membership
                .nodes()
                .map(|(id, _)| *id)
                .collect::<BTreeSet<u64>>(),
        )
    };
    if !leads {
        return Err(ProposeRefusal::NotLeader);
    }
    // A hibernating leader (see `RaftGroup::hibernate`) wakes to replicate
    // to its new member.
    raft.runtime_config().tick(true);
    raft.runtime_config().heartbeat(true);
    let outcome = tokio::time::timeout(timeout, async {
        match change {
            MemberChange::Add { id, .. } if voters.contains(id) => Ok(()),
            MemberChange::Add { id, node } => {
                // Blocking: returns once the learner has the leader's log.
                raft.add_learner(*id, BasicNode::new(node.as_str()), true)
                    .await
                    .map(drop)?;
                let voter = ChangeMembers::AddVoterIds(BTreeSet::from([*id]));
                raft.change_membership(voter, false).await.map(drop)
            }
            MemberChange::Remove { id } if voters.contains(id) => {
                let removed = ChangeMembers::RemoveVoters(BTreeSet::from([*id]));
                raft.change_membership(removed, false).await.map(drop)
            }
            MemberChange::Remove { id } if nodes.contains(id) => {
                let removed = ChangeMembers::RemoveNodes(BTreeSet::from([*id]));
                raft.change_membership(removed, false).await.map(drop)
            }
            MemberChange::Remove { .. } => Ok(()),
        }
    })
    .await;
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(refusal(&error)),
        Err(_) => Err(ProposeRefusal::Failed(format!(
            "the change was not committed within {}s",
            timeout.as_secs_f64()
        ))),
    }
}

fn refusal(error: &RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> ProposeRefusal {
    if error.forward_to_leader().is_some() {
        return ProposeRefusal::NotLeader;
    }
    match error.api_error() {
        Some(ClientWriteError::ChangeMembershipError(ChangeMembershipError::InProgress(_))) => {
            ProposeRefusal::NotLeader
        }
        _ => ProposeRefusal::Failed(error.to_string()),
    }
}
