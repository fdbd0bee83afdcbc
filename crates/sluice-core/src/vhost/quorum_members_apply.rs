//! A quorum queue's members as the metadata log changes them, applied on
//! every node: a node that stays a member (or stays outside) keeps its
//! queue object and learns the new members in place; a node that joins
//! starts its member of the group, one that leaves stops its member and
//! erases its files. See [`crate::quorum_membership`] for the whole path.

use std::sync::Arc;

use super::{read, VirtualHost};
use crate::definitions::QueueDefinition;
use crate::error::{AmqpError, AmqpResult};
use crate::queue::Queue;
use crate::queue_type::QueueType;
use crate::quorum_members::{
    classic_queue_refused, last_member_refused, queue_not_found, Membership, ADDED_MEMBER_ID_BASE,
};

impl VirtualHost {
    /// The quorum queue `name` declared at `declared_at`.
    fn quorum_queue_for_change(&self, name: &str, declared_at: u64) -> AmqpResult<Arc<dyn Queue>> {
        let queue = read(&self.queues)
            .get(name)
            .filter(|queue| queue.options().declared_at == declared_at)
            .cloned()
            .ok_or_else(|| AmqpError::not_found(queue_not_found(&self.name, name)))?;
        if queue.queue_type() != QueueType::Quorum {
            return Err(AmqpError::precondition_failed(classic_queue_refused()));
        }
        Ok(queue)
    }

    /// Adds `node` to the queue's members under an id made of the log
    /// `index` of the change (see [`ADDED_MEMBER_ID_BASE`]). A member
    /// already is one: nothing changes, as in RabbitMQ.
    pub fn apply_add_queue_member(
        &self,
        index: u64,
        name: &str,
        declared_at: u64,
        node: &str,
    ) -> AmqpResult<()> {
        let queue = self.quorum_queue_for_change(name, declared_at)?;
        let membership = queue.options().members.get();
        if membership.contains(node) {
            return Ok(());
        }
        let changed = membership.with_member(node, ADDED_MEMBER_ID_BASE + index);
        self.change_queue_members(&queue, changed);
        Ok(())
    }

    /// Removes `node` from the queue's members; the last one stays.
    pub fn apply_remove_queue_member(
        &self,
        name: &str,
        declared_at: u64,
        node: &str,
    ) -> AmqpResult<()> {
        let queue = self.quorum_queue_for_change(name, declared_at)?;
        let membership = queue.options().members.get();
        if !membership.contains(node) {
            return Ok(());
        }
        if membership.members.len() == 1 {
            return Err(AmqpError::precondition_failed(last_member_refused(
                &self.name, name,
            )));
        }
        self.change_queue_members(&queue, membership.without_member(node));
        Ok(())
    }

    /// Gives the queue its new members: in place where this node's part
    /// stays the same, else by replacing the queue object (its bindings,
    /// kept by name, stay). When this node joins, its consumers of the
    /// queue keep reading through the member they read through, as
    /// RabbitMQ's do; new ones read through the new member. Otherwise
    /// consumers through this node hear basic.cancel.
    pub(super) fn change_queue_members(&self, queue: &Arc<dyn Queue>, changed: Membership) {
        let local = &*self.node.name;
        let current = queue.options().members.get();
        let home_stays = queue.home_node().is_none_or(|home| changed.contains(home));
        let joins = !current.contains(local) && changed.contains(local);
        if current.contains(local) == changed.contains(local) && home_stays {
            queue.options().members.set(changed);
            return;
        }
        let definition = self.definition_with_members(queue, changed);
        let replacement = self.materialize_queue(&definition);
        {
            let mut queues = self.queues_mut();
            match queues.get(queue.name()) {
                Some(present) if crate::queue::same_queue(present, queue) => {
                    queues.insert(Arc::clone(queue.name()), Arc::clone(&replacement));
                }
                _ => return,
            }
        }
        self.start_timers_when_ready(&replacement);
        tracing::info!(queue = %queue.name(), vhost = %self.name, members = ?definition.members, "quorum queue members changed");
        if joins {
            // The stand-in goes on carrying its consumers' deliveries and
            // settlements through the link, to a member that stays one;
            // it is dropped with the last channel that holds it.
            return;
        }
        // The member this node leaves stops and erases its log, and what its
        // consumers held goes back through the replacement; a stand-in for
        // a queue homed elsewhere lets go of what it forwarded.
        let (consumers, _) = queue.retire(&replacement);
        for consumer in consumers {
            consumer.sink.cancelled_by_queue(&consumer);
        }
    }

    /// The queue's definition with other members; its home (where nodes
    /// that hold no member reach it) moves to the first member when it
    /// is no longer one.
    fn definition_with_members(
        &self,
        queue: &Arc<dyn Queue>,
        changed: Membership,
    ) -> QueueDefinition {
        let options = queue.options();
        let home = match queue.home_node() {
            Some(home) if changed.contains(home) => home.to_string(),
            _ if changed.contains(&self.node.name) => self.node.name.to_string(),
            _ => changed.members[0].clone(),
        };
        QueueDefinition {
            name: queue.name().to_string(),
            store_id: queue.store_id().map(str::to_owned),
            durable: options.durable,
            auto_delete: options.auto_delete,
            arguments: options.arguments.clone(),
            exclusive_owner: options.exclusive_owner,
            home: Some(home),
            home_incarnation: options.home_incarnation,
            declared_at: options.declared_at,
            members: changed.members,
            member_ids: changed.ids,
        }
    }
}
