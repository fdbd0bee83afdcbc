//! queue.declare, bind, unbind, purge and delete.

use std::sync::Arc;

use amq_protocol::protocol::{queue, AMQPClass};
use amq_protocol::types::FieldTable;
use sluice_core::error::{AmqpError, AmqpResult};
use sluice_core::exchange::Destination;
use sluice_core::reply_to::{token_of, REPLY_TO_QUEUE};
use sluice_core::vhost::QueueDeclaration;

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
                )?;
                if !nowait {
                    self.reply(
                        context,
                        AMQPClass::Queue(queue::AMQPMethod::BindOk(queue::BindOk {})),
                    );
                }
                Ok(())
            }
            queue::AMQPMethod::Unbind(unbind) => {
                self.bind_queue(
                    context,
                    (unbind.queue.as_str(), unbind.exchange.as_str()),
                    unbind.routing_key.as_str(),
                    unbind.arguments,
                    false,
                )?;
                self.reply(
                    context,
                    AMQPClass::Queue(queue::AMQPMethod::UnbindOk(queue::UnbindOk {})),
                );
                Ok(())
            }
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
        let (queue, _created) = context.vhost.declare_queue(
            QueueDeclaration {
                name: declare.queue.as_str(),
                passive: declare.passive,
                durable: declare.durable,
                exclusive: declare.exclusive,
                auto_delete: declare.auto_delete,
                arguments: declare.arguments,
            },
            context.connection_id,
        )?;
        self.last_declared_queue = Some(Arc::clone(queue.name()));
        if !declare.nowait {
            self.reply(
                context,
                AMQPClass::Queue(queue::AMQPMethod::DeclareOk(queue::DeclareOk {
                    queue: queue.name().as_ref().into(),
                    message_count: queue.message_count(),
                    consumer_count: queue.consumer_count(),
                })),
            );
        }
        Ok(())
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
    ) -> AmqpResult<()> {
        let name = self.queue_name(queue)?;
        let routing_key = self.binding_key(queue, routing_key)?;
        let destination = Destination::Queue(Arc::from(name.as_ref()));
        let connection_id = context.connection_id;
        if bind {
            context.vhost.bind(
                exchange,
                destination,
                &routing_key,
                arguments,
                connection_id,
            )
        } else {
            context.vhost.unbind(
                exchange,
                destination,
                &routing_key,
                arguments,
                connection_id,
            )
        }
    }

    fn purge_queue(&mut self, context: &ConnectionContext, purge: queue::Purge) -> AmqpResult<()> {
        let name = self.queue_name(purge.queue.as_str())?;
        let queue = context.vhost.queue(&name, context.connection_id)?;
        let message_count = queue.purge();
        if !purge.nowait {
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
        let (message_count, consumers) = context.vhost.delete_queue(
            &name,
            delete.if_unused,
            delete.if_empty,
            context.connection_id,
        )?;
        for consumer in consumers {
            consumer.sink.cancelled_by_queue(&consumer);
        }
        self.prune_cancelled_consumers();
        if !delete.nowait {
            self.reply(
                context,
                AMQPClass::Queue(queue::AMQPMethod::DeleteOk(queue::DeleteOk {
                    message_count,
                })),
            );
        }
        Ok(())
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
