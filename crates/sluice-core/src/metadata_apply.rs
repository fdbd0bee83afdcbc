//! A metadata command applied to the node. Every node applies the same
//! commands in the same order and computes the same reply: whatever a
//! command needs (names, owners, homes) travels in it, and the log index
//! it landed at names what it creates.

use std::sync::Arc;

use crate::access::DefaultAccess;
use crate::broker::Broker;
use crate::error::{AmqpError, AmqpResult};
use crate::exchange::Destination;
use crate::runtime_parameters::ParameterJson;
use crate::vhost::{ExchangeDeclaration, VirtualHost};

use crate::metadata::{BindingChange, MetadataCommand, MetadataReply};

impl Broker {
    /// Applies the command the metadata log committed at `index`.
    pub fn apply_metadata(&self, index: u64, command: MetadataCommand) -> MetadataReply {
        MetadataReply::from_result(self.apply_command(index, command))
    }

    fn apply_command(&self, index: u64, command: MetadataCommand) -> AmqpResult<()> {
        match command {
            MetadataCommand::DeclareExchange {
                vhost,
                name,
                kind,
                durable,
                auto_delete,
                internal,
                arguments,
            } => self
                .vhost_for_change(&vhost)?
                .declare_exchange(ExchangeDeclaration {
                    name: &name,
                    kind: &kind,
                    passive: false,
                    durable,
                    auto_delete,
                    internal,
                    arguments,
                }),
            MetadataCommand::DeleteExchange {
                vhost,
                name,
                if_unused,
            } => self
                .vhost_for_change(&vhost)?
                .delete_exchange(&name, if_unused),
            MetadataCommand::DeclareQueue {
                vhost,
                mut queue,
                connection,
            } => {
                queue.declared_at = index;
                if queue.durable && queue.store_id.is_none() {
                    // Named by the log index: the same on every node, and
                    // never reused by a later queue of the same name.
                    queue.store_id = Some(format!("{index:016x}"));
                }
                let vhost = self.vhost_for_change(&vhost)?;
                self.check_queue_limit(&vhost, &queue.name)?;
                vhost.apply_declare_queue(&queue, connection).map(drop)
            }
            MetadataCommand::DeleteQueue {
                vhost,
                name,
                declared_at,
            } => {
                if let Some(vhost) = self.vhost(&vhost) {
                    vhost.apply_delete_queue(&name, declared_at);
                }
                Ok(())
            }
            MetadataCommand::AddQueueMember {
                vhost,
                name,
                declared_at,
                node,
            } => {
                // Whether `node` is one of the cluster's was checked before
                // the change was proposed: what a node knows of the others
                // (nothing yet, while it replays its log at start) must not
                // make its reply differ.
                let vhost = self.existing_vhost(&vhost)?;
                vhost.apply_add_queue_member(index, &name, declared_at, &node)
            }
            MetadataCommand::RemoveQueueMember {
                vhost,
                name,
                declared_at,
                node,
            } => self
                .existing_vhost(&vhost)?
                .apply_remove_queue_member(&name, declared_at, &node),
            MetadataCommand::Bind(change) => self.apply_binding(change, true),
            MetadataCommand::Unbind(change) => self.apply_binding(change, false),
            MetadataCommand::NodeStarted {
                node,
                incarnation,
                whole_cluster,
            } => {
                for vhost in self.vhosts() {
                    vhost.remove_stale_queues(&node, incarnation);
                    if whole_cluster {
                        vhost.remove_transient_exchanges();
                    }
                }
                Ok(())
            }
            MetadataCommand::NodeDown { node } => {
                for vhost in self.vhosts() {
                    vhost.remove_queues_of_dead_node(&node);
                }
                Ok(())
            }
            MetadataCommand::TakeOver { node, definitions } => {
                for (name, vhost_definitions) in &definitions.vhosts {
                    self.add_vhost(name).take_over(vhost_definitions, &node);
                }
                Ok(())
            }
            MetadataCommand::SeedAccess { defaults } => {
                self.seed_access(defaults);
                Ok(())
            }
            MetadataCommand::PutVhost { name } => {
                self.add_vhost(&name);
                Ok(())
            }
            // Its policies and parameters go with it; its limits with the
            // access control's view of it.
            MetadataCommand::DeleteVhost { name } => {
                self.existing_vhost(&name)?;
                self.remove_vhost(&name);
                self.access.forget_vhost(&name);
                Ok(())
            }
            MetadataCommand::PutUser { user } => self.access.put_user(user),
            MetadataCommand::DeleteUser { name } => self.access.delete_user(&name),
            MetadataCommand::SetPermissions { permissions } => {
                self.existing_vhost(&permissions.vhost)?;
                self.access.set_permissions(permissions)
            }
            MetadataCommand::ClearPermissions { user, vhost } => {
                self.access.clear_permissions(&user, &vhost);
                Ok(())
            }
            MetadataCommand::SetTopicPermissions { permissions } => {
                self.existing_vhost(&permissions.vhost)?;
                self.access.set_topic_permissions(permissions)
            }
            MetadataCommand::ClearTopicPermissions {
                user,
                vhost,
                exchange,
            } => {
                self.access
                    .clear_topic_permissions(&user, &vhost, exchange.as_deref());
                Ok(())
            }
            MetadataCommand::SetVhostLimits { vhost, limits } => {
                self.existing_vhost(&vhost)?;
                self.access.set_vhost_limits(&vhost, limits);
                Ok(())
            }
            MetadataCommand::SetVhostLimit {
                vhost,
                limit,
                value,
            } => {
                self.existing_vhost(&vhost)?;
                self.access.set_vhost_limit(&vhost, limit, value);
                Ok(())
            }
            MetadataCommand::SetPolicy { policy } => self.apply_set_policy(&policy),
            MetadataCommand::ClearPolicy { vhost, name } => self.apply_clear_policy(&vhost, &name),
            MetadataCommand::SetParameter {
                component,
                vhost,
                name,
                value,
            } => self.apply_set_parameter(ParameterJson {
                vhost,
                component,
                name,
                value,
            }),
            MetadataCommand::ClearParameter {
                component,
                vhost,
                name,
            } => self.apply_clear_parameter(&component, &vhost, &name),
            MetadataCommand::SetGlobalParameter { name, value } => {
                self.apply_set_global_parameter(&name, value)
            }
            MetadataCommand::ClearGlobalParameter { name } => {
                self.apply_clear_global_parameter(&name)
            }
        }
    }

    /// The vhost a change names. A metadata log written before vhosts were
    /// kept in it (not yet seeded) names them without creating them first.
    fn vhost_for_change(&self, name: &str) -> AmqpResult<Arc<VirtualHost>> {
        match self.vhost(name) {
            Some(vhost) => Ok(vhost),
            None if !self.access.is_seeded() => Ok(self.add_vhost(name)),
            None => Err(AmqpError::not_allowed(format!("vhost {name} not found"))),
        }
    }

    fn existing_vhost(&self, name: &str) -> AmqpResult<Arc<VirtualHost>> {
        self.vhost(name)
            .ok_or_else(|| AmqpError::not_found(format!("vhost '{name}' does not exist")))
    }

    /// `max-queues`: counted when a new queue is declared, with RabbitMQ's
    /// text; a redeclaration of an existing queue is not refused.
    fn check_queue_limit(&self, vhost: &VirtualHost, queue: &str) -> AmqpResult<()> {
        let Some(limit) = self.access.vhost_limits(&vhost.name).max_queues else {
            return Ok(());
        };
        if vhost.has_queue(queue) || (vhost.queue_count() as u64) < limit {
            return Ok(());
        }
        Err(AmqpError::precondition_failed(format!(
            "cannot declare queue '{queue}': queue limit in vhost '{}' ({limit}) is reached",
            vhost.name
        )))
    }

    /// The first seed applied acts, the ones after it do nothing.
    fn seed_access(&self, defaults: Option<DefaultAccess>) {
        if !self.access.mark_seeded() {
            return;
        }
        let Some(defaults) = defaults else {
            return;
        };
        self.add_vhost(&defaults.vhost);
        // A user of the same name (a definitions file's) is left as it is.
        if !self.access.user_exists(&defaults.user.name) {
            if let Err(error) = self.access.put_user(defaults.user) {
                tracing::error!(%error, "the default user was not created");
            }
        }
        let (user, vhost) = (&defaults.permissions.user, &defaults.permissions.vhost);
        if self.access.permissions(user, vhost).is_none() {
            if let Err(error) = self.access.set_permissions(defaults.permissions) {
                tracing::error!(%error, "the default user's permissions were not set");
            }
        }
    }

    fn apply_binding(&self, change: BindingChange, bind: bool) -> AmqpResult<()> {
        let vhost = self.vhost_for_change(&change.vhost)?;
        let destination = if change.destination_is_queue {
            Destination::Queue(change.destination.as_str().into())
        } else {
            Destination::Exchange(change.destination.as_str().into())
        };
        if bind {
            vhost.bind(
                &change.source,
                destination,
                &change.routing_key,
                change.arguments,
                change.connection,
            )
        } else {
            vhost.unbind(
                &change.source,
                destination,
                &change.routing_key,
                change.arguments,
                change.connection,
            )
        }
    }
}
