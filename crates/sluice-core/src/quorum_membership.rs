//! Growing and shrinking quorum queues (`rabbit_quorum_queue:add_member`,
//! `delete_member`, `grow` and `shrink_all`), from any node of the cluster.
//!
//! Adding a member on node N: the metadata log records N as a member with
//! a fresh id ([`MetadataCommand::AddQueueMember`]); every node applies it,
//! and N starts an empty member of the queue's group that waits for the
//! leader. Then the group's leader (found among the members, wherever the
//! request came in) takes N as a learner, which catches up from its log or
//! a snapshot, and makes it a voter once it has. Should that fail, both
//! steps are undone. Removing N goes the other way: the leader drops N from
//! the group first, then the metadata log records it and N stops its member
//! and erases its files. The last member is never removed.

use std::sync::Arc;
use std::time::Duration;

use regex::Regex;

use crate::broker::Broker;
use crate::metadata::MetadataCommand;
use crate::queue::Queue;
use crate::queue_type::QueueType;
use crate::quorum_members::{
    classic_queue_refused, last_member_refused, node_not_in_cluster, queue_not_found,
};
use crate::quorum_queue::replication::MemberChange;

/// How long adding a member may take: the new member catches up on the
/// queue's whole log (every message still in it) before it votes.
const MEMBER_ADD_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the group's leader may take to drop a member.
const MEMBER_REMOVE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a member was not added or removed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// No such queue, or no such node.
    #[error("{0}")]
    NotFound(String),
    /// RabbitMQ refuses it too: a classic queue, the last member, a node
    /// that is not running.
    #[error("{0}")]
    Refused(String),
    /// The queue's group or the metadata log did not make the change.
    #[error("{0}")]
    Failed(String),
}

fn node_not_running(node: &str) -> String {
    format!("node_not_running: {node} is not running")
}

/// Which quorum queues `grow` adds a member to (`rabbitmq-queues grow`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrowStrategy {
    All,
    /// Only those with an even number of members, which a new one makes
    /// odd (a majority of an even number tolerates no more failures).
    Even,
}

impl GrowStrategy {
    pub fn parse(text: &str) -> Option<GrowStrategy> {
        match text {
            "all" => Some(GrowStrategy::All),
            "even" => Some(GrowStrategy::Even),
            _ => None,
        }
    }

    fn takes(self, members: usize) -> bool {
        self == GrowStrategy::All || members.is_multiple_of(2)
    }
}

/// One queue's outcome of a grow or shrink: its member count after, or
/// why it did not change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberChangeOutcome {
    pub vhost: String,
    pub name: String,
    pub result: Result<usize, MembershipError>,
}

impl Broker {
    /// The quorum queue `name` of `vhost`, once this node has applied
    /// every metadata change made before the call.
    async fn quorum_queue(
        &self,
        vhost: &str,
        name: &str,
    ) -> Result<Arc<dyn Queue>, MembershipError> {
        self.metadata
            .sync()
            .await
            .map_err(|error| MembershipError::Failed(error.text))?;
        let queue = self
            .vhost(vhost)
            .and_then(|host| {
                host.queues()
                    .into_iter()
                    .find(|queue| &**queue.name() == name)
            })
            .ok_or_else(|| MembershipError::NotFound(queue_not_found(vhost, name)))?;
        if queue.queue_type() != QueueType::Quorum {
            return Err(MembershipError::Refused(classic_queue_refused()));
        }
        Ok(queue)
    }

    fn check_running(&self, node: &str) -> Result<(), MembershipError> {
        let local = self.node().name.to_string();
        if !self
            .metadata
            .cluster_nodes(&local)
            .iter()
            .any(|known| known == node)
        {
            return Err(MembershipError::NotFound(node_not_in_cluster(node)));
        }
        if !self
            .metadata
            .running_nodes(&local)
            .iter()
            .any(|up| up == node)
        {
            return Err(MembershipError::Refused(node_not_running(node)));
        }
        Ok(())
    }

    /// Adds a member of the quorum queue on `node`; done already when
    /// `node` holds one (as in RabbitMQ).
    ///
    /// # Errors
    /// The queue or node is unknown, the queue is classic, the node is
    /// down, or the group did not take the member in time (undone then).
    pub async fn add_quorum_member(
        &self,
        vhost: &str,
        name: &str,
        node: &str,
    ) -> Result<(), MembershipError> {
        let queue = self.quorum_queue(vhost, name).await?;
        self.check_running(node)?;
        let before = queue.options().members.get();
        if before.contains(node) {
            return Ok(());
        }
        let groups = self.quorum_groups()?;
        let declared_at = queue.options().declared_at;
        let command = |add: bool| {
            let (vhost, name, node) = (vhost.to_owned(), name.to_owned(), node.to_owned());
            if add {
                MetadataCommand::AddQueueMember {
                    vhost,
                    name,
                    declared_at,
                    node,
                }
            } else {
                MetadataCommand::RemoveQueueMember {
                    vhost,
                    name,
                    declared_at,
                    node,
                }
            }
        };
        self.metadata
            .propose(command(true))
            .await
            .map_err(|error| MembershipError::Failed(error.text))?;
        // The queue object may be a new one now (this node joined).
        let id = self
            .quorum_queue(vhost, name)
            .await?
            .options()
            .members
            .get()
            .id_of(node)
            .ok_or_else(|| {
                MembershipError::Failed("the member was removed meanwhile".to_owned())
            })?;
        let change = MemberChange::Add {
            id,
            node: node.to_owned(),
        };
        let added = groups
            .change_members(
                declared_at,
                before.members.clone(),
                change,
                MEMBER_ADD_TIMEOUT,
            )
            .await;
        if let Err(reason) = added {
            tracing::warn!(queue = name, vhost, node, %reason, "adding a quorum queue member failed; undoing it");
            let undo = MemberChange::Remove { id };
            if let Err(error) = groups
                .change_members(declared_at, before.members, undo, MEMBER_REMOVE_TIMEOUT)
                .await
            {
                tracing::warn!(queue = name, vhost, node, %error, "the group did not drop the member it failed to add");
            }
            if let Err(error) = self.metadata.propose(command(false)).await {
                tracing::warn!(queue = name, vhost, node, %error, "the metadata keeps a member its group failed to add");
            }
            return Err(MembershipError::Failed(reason));
        }
        tracing::info!(queue = name, vhost, node, id, "added a quorum queue member");
        Ok(())
    }

    /// Removes the quorum queue's member on `node`; done already when
    /// `node` holds none (as in RabbitMQ).
    ///
    /// # Errors
    /// The queue is unknown or classic, `node` holds its last member, or
    /// the group did not drop the member in time.
    pub async fn delete_quorum_member(
        &self,
        vhost: &str,
        name: &str,
        node: &str,
    ) -> Result<(), MembershipError> {
        let queue = self.quorum_queue(vhost, name).await?;
        let membership = queue.options().members.get();
        let Some(id) = membership.id_of(node).filter(|_| membership.contains(node)) else {
            return Ok(());
        };
        if membership.members.len() == 1 {
            return Err(MembershipError::Refused(last_member_refused(vhost, name)));
        }
        let groups = self.quorum_groups()?;
        let declared_at = queue.options().declared_at;
        groups
            .change_members(
                declared_at,
                membership.members,
                MemberChange::Remove { id },
                MEMBER_REMOVE_TIMEOUT,
            )
            .await
            .map_err(MembershipError::Failed)?;
        self.metadata
            .propose(MetadataCommand::RemoveQueueMember {
                vhost: vhost.to_owned(),
                name: name.to_owned(),
                declared_at,
                node: node.to_owned(),
            })
            .await
            .map_err(|error| MembershipError::Failed(error.text))?;
        tracing::info!(
            queue = name,
            vhost,
            node,
            id,
            "removed a quorum queue member"
        );
        Ok(())
    }

    fn quorum_groups(
        &self,
    ) -> Result<&Arc<dyn crate::quorum_queue::replication::QuorumGroups>, MembershipError> {
        self.metadata.quorum_groups().ok_or_else(|| {
            MembershipError::Refused("this node holds no quorum queue members".to_owned())
        })
    }

    /// Adds a member on `node` to every quorum queue whose vhost and name
    /// match the patterns, that has none there and that `strategy` takes
    /// (`rabbit_quorum_queue:grow`), one queue after another.
    ///
    /// # Errors
    /// `node` is unknown or not running.
    pub async fn grow_quorum_queues(
        &self,
        node: &str,
        vhost_pattern: &Regex,
        queue_pattern: &Regex,
        strategy: GrowStrategy,
    ) -> Result<Vec<MemberChangeOutcome>, MembershipError> {
        self.check_running(node)?;
        let chosen = self.quorum_queues_where(|vhost, queue, members| {
            vhost_pattern.is_match(vhost)
                && queue_pattern.is_match(queue)
                && !members.iter().any(|member| member == node)
                && strategy.takes(members.len())
        });
        let mut outcomes = Vec::with_capacity(chosen.len());
        for (vhost, name, size) in chosen {
            let result = self
                .add_quorum_member(&vhost, &name, node)
                .await
                .map(|()| size + 1);
            outcomes.push(MemberChangeOutcome {
                vhost,
                name,
                result,
            });
        }
        Ok(outcomes)
    }

    /// Removes the member on `node` of every quorum queue that has one
    /// (`rabbit_quorum_queue:shrink_all`); a queue whose last member it is
    /// keeps it, and says so in its outcome.
    pub async fn shrink_quorum_queues(&self, node: &str) -> Vec<MemberChangeOutcome> {
        let chosen =
            self.quorum_queues_where(|_, _, members| members.iter().any(|member| member == node));
        let mut outcomes = Vec::with_capacity(chosen.len());
        for (vhost, name, size) in chosen {
            let result = self
                .delete_quorum_member(&vhost, &name, node)
                .await
                .map(|()| size - 1);
            outcomes.push(MemberChangeOutcome {
                vhost,
                name,
                result,
            });
        }
        outcomes
    }

    /// Vhost, name and member count of the quorum queues `wanted` takes,
    /// in order.
    fn quorum_queues_where(
        &self,
        wanted: impl Fn(&str, &str, &[String]) -> bool,
    ) -> Vec<(String, String, usize)> {
        let mut chosen = Vec::new();
        for vhost in self.vhosts() {
            for queue in vhost.queues() {
                let members = queue.options().members.members();
                if queue.queue_type() == QueueType::Quorum
                    && wanted(&vhost.name, queue.name(), &members)
                {
                    chosen.push((
                        vhost.name.to_string(),
                        queue.name().to_string(),
                        members.len(),
                    ));
                }
            }
        }
        chosen.sort();
        chosen
    }
}

#[cfg(test)]
#[path = "quorum_membership_test.rs"]
mod tests;
