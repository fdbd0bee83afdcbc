//! queue.declare, bind, unbind, purge and delete.

use std::sync::Arc;

use amq_protocol::protocol::{queue, AMQPClass};
use amq_protocol::types::FieldTable;
use sluice_core::access::{Permission, ResourceKind};
use sluice_core::error::{AmqpError, AmqpResult};
use sluice_core::metadata::{BindingChange, MetadataCommand};
use sluice_core::queue::Queue;
use sluice_core::reply_to::{token_of, REPLY_TO_QUEUE};
use sluice_core::vhost::QueueDeclaration;
use sluice_wire::reply_code::ReplyCode;

use super::exchange_methods::string_argument;
use super::Channel;
use crate::connection_context::ConnectionContext;

impl Channel {
    pub(super) fn handle_queue_method(
        &mut self,
        context: &ConnectionContext,
        method: queue::AMQPMethod,
    ) -> AmqpResult<()> {
        match method {
            queue::AMQPMethod::Declare(declare)
                if declare.queue.as_str().starts_with(REPLY_TO_QUEUE) =>
            {
                self.declare_reply_to(context, declare)
            }
            queue::AMQPMethod::Declare(declare) => self.declare_queue(context, declare),
            queue::AMQPMethod::Bind(bind) => {
                let nowait = bind.nowait;
                self.bind_queue(
                    context,
                    (bind.queue.as_str(), bind.exchange.as_str()),
                    bind.routing_key.as_str(),
                    bind.arguments,
                    true,
                    move |channel, context| {
                        if !nowait {
                            channel.reply(
                                context,
                                AMQPClass::Queue(queue::AMQPMethod::BindOk(queue::BindOk {})),
                            );
                        }
                    },
                )
            }
            queue::AMQPMethod::Unbind(unbind) => self.bind_queue(
                context,
                (unbind.queue.as_str(), unbind.exchange.as_str()),
                unbind.routing_key.as_str(),
                unbind.arguments,
                false,
                |channel, context| {
                    channel.reply(
                        context,
                        AMQPClass::Queue(queue::AMQPMethod::UnbindOk(queue::UnbindOk {})),
                    );
                },
            ),
            queue::AMQPMethod::Purge(purge) => self.purge_queue(context, purge),
            queue::AMQPMethod::Delete(delete) => self.delete_queue(context, delete),
            other => Err(AmqpError::command_invalid(format!(
                "unexpected method queue.{}",
                AMQPClass::Queue(other).get_amqp_method_id()
            ))),
        }
    }

    /// queue.declare. A passive declare of "" is not the last declared
    /// queue: RabbitMQ looks up the name as given, and finds none.
    fn declare_queue(
        &mut self,
        context: &ConnectionContext,
        declare: queue::Declare,
    ) -> AmqpResult<()> {
        #[cfg(test)]
        crate::panic_failpoint::check(declare.queue.as_str());
        context.stats.churn.queues_declared.add(1);
        self.declare_queue_after_deletion(context, declare, true)
    }

    /// queue.declare once counted. `may_wait`: a queue of that name whose
    /// deletion is already decided (an auto-delete queue its last consumer
    /// just left, its deletion still on its way through the metadata log)
    /// is waited out, and the declaration then creates the queue anew.
    /// Answered with the doomed queue instead, the client's next
    /// basic.consume would meet 404 once the deletion lands, which a client
    /// that closes a connection and declares the queue again on the next
    /// must not see. The deletion is proposed once more, for that very
    /// queue (its `declared_at`), so that waiting for it to be applied is
    /// waiting for this proposal: whichever of the two comes first deletes
    /// it, the other finds nothing to do.
    fn declare_queue_after_deletion(
        &mut self,
        context: &ConnectionContext,
        declare: queue::Declare,
        may_wait: bool,
    ) -> AmqpResult<()> {
        let connection_id = context.connection_id;
        // RabbitMQ checks a named queue before looking it up; a passive
        // declare needs no permission.
        let name = declare.queue.as_str();
        if !declare.passive && !name.is_empty() {
            context.check_access(Permission::Configure, ResourceKind::Queue, name)?;
        }
        let doomed = if may_wait && !declare.passive {
            context.vhost.queue_being_deleted(name)
        } else {
            None
        };
        if let Some(doomed) = doomed {
            let command = context.vhost.deletion_of(&doomed);
            self.propose(context, command, move |channel, context, deleted| {
                if let Err(error) = deleted {
                    tracing::warn!(%error, "a queue being deleted was not deleted before its name was declared again");
                }
                channel.declare_queue_after_deletion(context, declare, false)
            });
            return Ok(());
        }
        let declaration = QueueDeclaration {
            name,
            passive: declare.passive,
            durable: declare.durable,
            exclusive: declare.exclusive,
            auto_delete: declare.auto_delete,
            arguments: declare.arguments,
        };
        let nowait = declare.nowait;
        if let Some(queue) = context
            .vhost
            .check_queue_declaration(&declaration, connection_id)?
        {
            // A queue whose home node is down: RabbitMQ's 404.
            if let Some(error) = queue.unavailable() {
                if error.code == ReplyCode::NotFound {
                    return Err(error);
                }
            }
            self.declared(context, &queue, nowait);
            return Ok(());
        }
        let definition = context
            .vhost
            .new_queue_definition(&declaration, connection_id);
        if declaration.name.is_empty() {
            context.check_access(Permission::Configure, ResourceKind::Queue, &definition.name)?;
        }
        check_dead_letter_access(context, &definition.name, &definition.arguments)?;
        let name = definition.name.clone();
        let command = MetadataCommand::DeclareQueue {
            vhost: context.vhost.name.to_string(),
            queue: definition,
            connection: connection_id,
        };
        self.propose(context, command, move |channel, context, applied| {
            applied?;
            context.stats.churn.queues_created.add(1);
            let queue = context.vhost.queue(&name, connection_id)?;
            // Its own journal failed on this node: the client hears why.
            if queue
                .home_node()
                .is_some_and(|home| **home == *context.vhost.node().name)
            {
                if let Some(error) = queue.unavailable() {
                    return Err(error);
                }
            }
            channel.declared(context, &queue, nowait);
            Ok(())
        });
        Ok(())
    }

    /// A queue declared: it becomes the channel's last declared queue, and
    /// the client hears its counts.
    fn declared(&mut self, context: &ConnectionContext, queue: &Arc<dyn Queue>, nowait: bool) {
        self.last_declared_queue = Some(Arc::clone(queue.name()));
        if nowait {
            return;
        }
        // A queue homed on another node is counted there.
        if let Some((home, key)) = queue.forwarded() {
            let name = Arc::clone(queue.name());
            self.await_remote(home.stats(key), move |channel, context, stats| {
                let stats = stats?;
                channel.reply(
                    context,
                    AMQPClass::Queue(queue::AMQPMethod::DeclareOk(queue::DeclareOk {
                        queue: name.as_ref().into(),
                        message_count: stats.messages_ready,
                        consumer_count: stats.consumers,
                    })),
                );
                Ok(())
            });
            return;
        }
        self.reply(
            context,
            AMQPClass::Queue(queue::AMQPMethod::DeclareOk(queue::DeclareOk {
                queue: queue.name().as_ref().into(),
                message_count: queue.message_count(),
                consumer_count: queue.consumer_count(),
            })),
        );
    }

    /// queue.bind (`bind`) or queue.unbind of `(queue, exchange)`; an
    /// empty queue name is the last declared queue.
    fn bind_queue(
        &mut self,
        context: &ConnectionContext,
        (queue, exchange): (&str, &str),
        routing_key: &str,
        arguments: FieldTable,
        bind: bool,
        reply: impl FnOnce(&mut Channel, &ConnectionContext) + Send + 'static,
    ) -> AmqpResult<()> {
        let name = self.queue_name(queue)?;
        let routing_key = self.binding_key(queue, routing_key)?;
        let change = BindingChange {
            vhost: context.vhost.name.to_string(),
            source: exchange.to_owned(),
            destination: name.to_string(),
            destination_is_queue: true,
            routing_key: routing_key.to_string(),
            arguments,
            connection: context.connection_id,
        };
        self.change_binding(context, change, bind, reply)
    }

    fn purge_queue(&mut self, context: &ConnectionContext, purge: queue::Purge) -> AmqpResult<()> {
        let name = self.queue_name(purge.queue.as_str())?;
        context.check_access(Permission::Read, ResourceKind::Queue, &name)?;
        let queue = context.vhost.queue(&name, context.connection_id)?;
        if let Some(error) = queue.unavailable() {
            return Err(error);
        }
        let nowait = purge.nowait;
        if let Some((home, key)) = queue.forwarded() {
            self.await_remote(home.purge(key), move |channel, context, purged| {
                let message_count = purged?;
                if !nowait {
                    channel.reply(
                        context,
                        AMQPClass::Queue(queue::AMQPMethod::PurgeOk(queue::PurgeOk {
                            message_count,
                        })),
                    );
                }
                Ok(())
            });
            return Ok(());
        }
        let message_count = queue.purge();
        if !nowait {
            self.reply(
                context,
                AMQPClass::Queue(queue::AMQPMethod::PurgeOk(queue::PurgeOk { message_count })),
            );
        }
        Ok(())
    }

    fn delete_queue(
        &mut self,
        context: &ConnectionContext,
        delete: queue::Delete,
    ) -> AmqpResult<()> {
        let name = self.queue_name(delete.queue.as_str())?;
        context.check_access(Permission::Configure, ResourceKind::Queue, &name)?;
        let nowait = delete.nowait;
        let reply = move |channel: &mut Channel, context: &ConnectionContext, message_count| {
            if !nowait {
                channel.reply(
                    context,
                    AMQPClass::Queue(queue::AMQPMethod::DeleteOk(queue::DeleteOk {
                        message_count,
                    })),
                );
            }
        };
        let Some(queue) = context.vhost.check_queue_deletion(
            &name,
            delete.if_unused,
            delete.if_empty,
            context.connection_id,
        )?
        else {
            // Deleting a missing queue succeeds, as in RabbitMQ 3.x.
            reply(self, context, 0);
            return Ok(());
        };
        match queue.forwarded() {
            // Counted, and checked for if-empty and if-unused, by its home
            // node first.
            Some((home, key)) => {
                let (if_unused, if_empty) = (delete.if_unused, delete.if_empty);
                self.await_remote(home.stats(key), move |channel, context, stats| {
                    let stats = stats?;
                    context
                        .vhost
                        .check_queue_deletable(&queue, stats, if_unused, if_empty)?;
                    channel.propose_deletion(context, &queue, stats.messages_ready, reply);
                    Ok(())
                });
            }
            None => {
                let message_count = queue.message_count();
                self.propose_deletion(context, &queue, message_count, reply);
            }
        }
        Ok(())
    }

    /// Deletes `queue` through the metadata log; `reply` answers with
    /// `message_count` once it is gone.
    fn propose_deletion(
        &mut self,
        context: &ConnectionContext,
        queue: &Arc<dyn Queue>,
        message_count: u32,
        reply: impl FnOnce(&mut Channel, &ConnectionContext, u32) + Send + 'static,
    ) {
        let command = context.vhost.deletion_of(queue);
        // RabbitMQ's order: delete-ok, then basic.cancel for this channel's
        // consumers of the queue (py-amqp, under kombu and Celery, expects
        // it).
        self.deliveries.hold_cancels();
        self.propose(context, command, move |channel, context, applied| {
            if let Err(error) = applied {
                channel.deliveries.release_cancels();
                return Err(error);
            }
            context.stats.churn.queues_deleted.add(1);
            // Its consumers were cancelled as the deletion was applied.
            channel.prune_cancelled_consumers();
            reply(channel, context, message_count);
            channel.deliveries.release_cancels();
            Ok(())
        });
    }

    /// queue.declare of the reply-to pseudo-queue or of a reply name: always
    /// passive, as in RabbitMQ. The pseudo-queue exists; a reply name exists
    /// while its consumer does, with one consumer and no messages.
    pub(super) fn declare_reply_to(
        &mut self,
        context: &ConnectionContext,
        declare: queue::Declare,
    ) -> AmqpResult<()> {
        let name = declare.queue.as_str();
        let exists = name == REPLY_TO_QUEUE
            || token_of(name.as_bytes())
                .is_some_and(|token| context.broker.reply_to.contains(token));
        if !exists {
            return Err(AmqpError::not_found(format!(
                "no queue '{name}' in vhost '{}'",
                context.vhost.name
            )));
        }
        self.last_declared_queue = Some(Arc::from(name));
        if !declare.nowait {
            self.reply(
                context,
                AMQPClass::Queue(queue::AMQPMethod::DeclareOk(queue::DeclareOk {
                    queue: declare.queue,
                    message_count: 0,
                    consumer_count: 1,
                })),
            );
        }
        Ok(())
    }
}

/// A new queue that dead-letters to an exchange: RabbitMQ wants read on
/// the queue and write on that exchange.
fn check_dead_letter_access(
    context: &ConnectionContext,
    queue: &str,
    arguments: &FieldTable,
) -> AmqpResult<()> {
    let Some(exchange) = string_argument(arguments, "x-dead-letter-exchange") else {
        return Ok(());
    };
    context.check_access(Permission::Read, ResourceKind::Queue, queue)?;
    context.check_access(Permission::Write, ResourceKind::Exchange, &exchange)
}
