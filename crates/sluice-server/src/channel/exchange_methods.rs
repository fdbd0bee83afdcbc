//! exchange.declare, delete, bind and unbind.

use std::sync::Arc;

use amq_protocol::protocol::{exchange, AMQPClass};
use sluice_core::error::{AmqpError, AmqpResult};
use sluice_core::exchange::Destination;
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

    /// exchange.declare. Declare-ok is sent only once the vhost has
    /// accepted the declaration; a refusal is returned instead.
    fn declare_exchange(
        &mut self,
        context: &ConnectionContext,
        declare: exchange::Declare,
    ) -> AmqpResult<()> {
        context.vhost.declare_exchange(ExchangeDeclaration {
            name: declare.exchange.as_str(),
            kind: declare.kind.as_str(),
            passive: declare.passive,
            durable: declare.durable,
            auto_delete: declare.auto_delete,
            internal: declare.internal,
            arguments: declare.arguments,
        })?;
        if !declare.nowait {
            self.reply(
                context,
                AMQPClass::Exchange(exchange::AMQPMethod::DeclareOk(exchange::DeclareOk {})),
            );
        }
        Ok(())
    }

    /// exchange.delete. With `if_unused`, an exchange that is the source of
    /// any binding is refused.
    fn delete_exchange(
        &mut self,
        context: &ConnectionContext,
        delete: exchange::Delete,
    ) -> AmqpResult<()> {
        context
            .vhost
            .delete_exchange(delete.exchange.as_str(), delete.if_unused)?;
        if !delete.nowait {
            self.reply(
                context,
                AMQPClass::Exchange(exchange::AMQPMethod::DeleteOk(exchange::DeleteOk {})),
            );
        }
        Ok(())
    }

    /// exchange.bind: routes from exchange `source` to exchange
    /// `destination`; both must exist.
    fn bind_exchange(
        &mut self,
        context: &ConnectionContext,
        bind: exchange::Bind,
    ) -> AmqpResult<()> {
        context.vhost.bind(
            bind.source.as_str(),
            Destination::Exchange(Arc::from(bind.destination.as_str())),
            bind.routing_key.as_str(),
            bind.arguments,
            context.connection_id,
        )?;
        if !bind.nowait {
            self.reply(
                context,
                AMQPClass::Exchange(exchange::AMQPMethod::BindOk(exchange::BindOk {})),
            );
        }
        Ok(())
    }

    /// exchange.unbind. Unbinding what is not bound succeeds, as in RabbitMQ.
    fn unbind_exchange(
        &mut self,
        context: &ConnectionContext,
        unbind: exchange::Unbind,
    ) -> AmqpResult<()> {
        context.vhost.unbind(
            unbind.source.as_str(),
            Destination::Exchange(Arc::from(unbind.destination.as_str())),
            unbind.routing_key.as_str(),
            unbind.arguments,
            context.connection_id,
        )?;
        if !unbind.nowait {
            self.reply(
                context,
                AMQPClass::Exchange(exchange::AMQPMethod::UnbindOk(exchange::UnbindOk {})),
            );
        }
        Ok(())
    }
}
