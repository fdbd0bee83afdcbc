//! exchange.declare, delete, bind and unbind.

use std::sync::Arc;

use amq_protocol::protocol::{exchange, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable};
use sluice_core::access::{Permission, ResourceKind};
use sluice_core::error::{AmqpError, AmqpResult};
use sluice_core::exchange::Destination;
use sluice_core::metadata::{BindingChange, MetadataCommand};
use sluice_core::vhost::ExchangeDeclaration;

use super::Channel;
use crate::connection_context::ConnectionContext;

impl Channel {
    pub(super) fn handle_exchange_method(
        &mut self,
        context: &ConnectionContext,
        method: exchange::AMQPMethod,
    ) -> AmqpResult<()> {
        match method {
            exchange::AMQPMethod::Declare(declare) => self.declare_exchange(context, declare),
            exchange::AMQPMethod::Delete(delete) => self.delete_exchange(context, delete),
            exchange::AMQPMethod::Bind(bind) => self.bind_exchange(context, bind),
            exchange::AMQPMethod::Unbind(unbind) => self.unbind_exchange(context, unbind),
            other => Err(AmqpError::command_invalid(format!(
                "unexpected method exchange.{}",
                AMQPClass::Exchange(other).get_amqp_method_id()
            ))),
        }
    }

    /// exchange.declare. Declare-ok is sent only once the declaration is
    /// applied (or found equivalent to what exists); a refusal is returned
    /// instead.
    fn declare_exchange(
        &mut self,
        context: &ConnectionContext,
        declare: exchange::Declare,
    ) -> AmqpResult<()> {
        let declaration = ExchangeDeclaration {
            name: declare.exchange.as_str(),
            kind: declare.kind.as_str(),
            passive: declare.passive,
            durable: declare.durable,
            auto_delete: declare.auto_delete,
            internal: declare.internal,
            arguments: declare.arguments,
        };
        let nowait = declare.nowait;
        let reply = move |channel: &mut Channel, context: &ConnectionContext| {
            if !nowait {
                channel.reply(
                    context,
                    AMQPClass::Exchange(exchange::AMQPMethod::DeclareOk(exchange::DeclareOk {})),
                );
            }
        };
        // The default exchange is refused by the declaration check, with
        // RabbitMQ's own text; a passive declare needs no permission.
        if !declaration.passive && !declaration.name.is_empty() {
            context.check_access(
                Permission::Configure,
                ResourceKind::Exchange,
                declaration.name,
            )?;
        }
        if !context.vhost.check_exchange_declaration(&declaration)? {
            reply(self, context);
            return Ok(());
        }
        // A new exchange with an alternate: read on it, write on the
        // alternate, as RabbitMQ checks.
        if let Some(alternate) = string_argument(&declaration.arguments, "alternate-exchange") {
            context.check_access(Permission::Read, ResourceKind::Exchange, declaration.name)?;
            context.check_access(Permission::Write, ResourceKind::Exchange, &alternate)?;
        }
        let command = MetadataCommand::DeclareExchange {
            vhost: context.vhost.name.to_string(),
            name: declaration.name.to_owned(),
            kind: declaration.kind.to_owned(),
            durable: declaration.durable,
            auto_delete: declaration.auto_delete,
            internal: declaration.internal,
            arguments: declaration.arguments,
        };
        self.propose(context, command, move |channel, context, applied| {
            applied?;
            reply(channel, context);
            Ok(())
        });
        Ok(())
    }

    /// exchange.delete. With `if_unused`, an exchange that is the source of
    /// any binding is refused.
    fn delete_exchange(
        &mut self,
        context: &ConnectionContext,
        delete: exchange::Delete,
    ) -> AmqpResult<()> {
        let name = delete.exchange.as_str();
        if !name.is_empty() {
            context.check_access(Permission::Configure, ResourceKind::Exchange, name)?;
        }
        let nowait = delete.nowait;
        let reply = move |channel: &mut Channel, context: &ConnectionContext| {
            if !nowait {
                channel.reply(
                    context,
                    AMQPClass::Exchange(exchange::AMQPMethod::DeleteOk(exchange::DeleteOk {})),
                );
            }
        };
        if !context
            .vhost
            .check_exchange_deletion(name, delete.if_unused)?
        {
            // Deleting a missing exchange succeeds, as in RabbitMQ 3.x.
            reply(self, context);
            return Ok(());
        }
        let command = MetadataCommand::DeleteExchange {
            vhost: context.vhost.name.to_string(),
            name: name.to_owned(),
            if_unused: delete.if_unused,
        };
        self.propose(context, command, move |channel, context, applied| {
            applied?;
            reply(channel, context);
            Ok(())
        });
        Ok(())
    }

    /// exchange.bind: routes from exchange `source` to exchange
    /// `destination`; both must exist.
    fn bind_exchange(
        &mut self,
        context: &ConnectionContext,
        bind: exchange::Bind,
    ) -> AmqpResult<()> {
        let nowait = bind.nowait;
        self.change_binding(
            context,
            BindingChange {
                vhost: context.vhost.name.to_string(),
                source: bind.source.to_string(),
                destination: bind.destination.to_string(),
                destination_is_queue: false,
                routing_key: bind.routing_key.to_string(),
                arguments: bind.arguments,
                connection: context.connection_id,
            },
            true,
            move |channel, context| {
                if !nowait {
                    channel.reply(
                        context,
                        AMQPClass::Exchange(exchange::AMQPMethod::BindOk(exchange::BindOk {})),
                    );
                }
            },
        )
    }

    /// exchange.unbind. Unbinding what is not bound succeeds, as in RabbitMQ.
    fn unbind_exchange(
        &mut self,
        context: &ConnectionContext,
        unbind: exchange::Unbind,
    ) -> AmqpResult<()> {
        let nowait = unbind.nowait;
        self.change_binding(
            context,
            BindingChange {
                vhost: context.vhost.name.to_string(),
                source: unbind.source.to_string(),
                destination: unbind.destination.to_string(),
                destination_is_queue: false,
                routing_key: unbind.routing_key.to_string(),
                arguments: unbind.arguments,
                connection: context.connection_id,
            },
            false,
            move |channel, context| {
                if !nowait {
                    channel.reply(
                        context,
                        AMQPClass::Exchange(exchange::AMQPMethod::UnbindOk(exchange::UnbindOk {})),
                    );
                }
            },
        )
    }

    /// Checks a binding change here, then proposes it; `reply` answers once
    /// it is applied.
    pub(super) fn change_binding(
        &mut self,
        context: &ConnectionContext,
        change: BindingChange,
        bind: bool,
        reply: impl FnOnce(&mut Channel, &ConnectionContext) + Send + 'static,
    ) -> AmqpResult<()> {
        // RabbitMQ's checks: write on the destination, read on the source.
        let (destination, destination_kind) = if change.destination_is_queue {
            (
                Destination::Queue(Arc::from(change.destination.as_str())),
                ResourceKind::Queue,
            )
        } else {
            (
                Destination::Exchange(Arc::from(change.destination.as_str())),
                ResourceKind::Exchange,
            )
        };
        context.check_access(Permission::Write, destination_kind, &change.destination)?;
        context.check_access(Permission::Read, ResourceKind::Exchange, &change.source)?;
        context
            .vhost
            .check_binding(&change.source, destination, context.connection_id)?;
        context.check_topic_access(&change.source, &change.routing_key, false)?;
        let command = if bind {
            MetadataCommand::Bind(change)
        } else {
            MetadataCommand::Unbind(change)
        };
        self.propose(context, command, move |channel, context, applied| {
            applied?;
            reply(channel, context);
            Ok(())
        });
        Ok(())
    }
}

/// A string argument (long or short string), as RabbitMQ's `r_arg` reads it.
pub(super) fn string_argument(arguments: &FieldTable, key: &str) -> Option<String> {
    match arguments.inner().get(key)? {
        AMQPValue::LongString(name) => Some(String::from_utf8_lossy(name.as_bytes()).into_owned()),
        AMQPValue::ShortString(name) => Some(name.as_str().to_owned()),
        _ => None,
    }
}
