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
        let vhost = &context.vhost;
        match method {
            exchange::AMQPMethod::Declare(declare) => {
                vhost.declare_exchange(ExchangeDeclaration {
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
                        AMQPClass::Exchange(exchange::AMQPMethod::DeclareOk(
                            exchange::DeclareOk {},
                        )),
                    );
                }
            }
            exchange::AMQPMethod::Delete(delete) => {
                vhost.delete_exchange(delete.exchange.as_str(), delete.if_unused)?;
                if !delete.nowait {
                    self.reply(
                        context,
                        AMQPClass::Exchange(exchange::AMQPMethod::DeleteOk(exchange::DeleteOk {})),
                    );
                }
            }
            exchange::AMQPMethod::Bind(bind) => {
                vhost.bind(
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
            }
            exchange::AMQPMethod::Unbind(unbind) => {
                vhost.unbind(
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
            }
            other => {
                return Err(AmqpError::command_invalid(format!(
                    "unexpected method exchange.{}",
                    AMQPClass::Exchange(other).get_amqp_method_id()
                )))
            }
        }
        Ok(())
    }
}
