//! A metadata command applied to the node. Every node applies the same
//! commands in the same order and computes the same reply: whatever a
//! command needs (names, owners, homes) travels in it, and the log index
//! it landed at names what it creates.

use crate::broker::Broker;
use crate::error::AmqpResult;
use crate::exchange::Destination;
use crate::vhost::ExchangeDeclaration;

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
                .add_vhost(&vhost)
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
            } => self.add_vhost(&vhost).delete_exchange(&name, if_unused),
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
                self.add_vhost(&vhost)
                    .apply_declare_queue(&queue, connection)
                    .map(drop)
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
        }
    }

    fn apply_binding(&self, change: BindingChange, bind: bool) -> AmqpResult<()> {
        let vhost = self.add_vhost(&change.vhost);
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
