//! Publishing on a channel: the content header and body frames assembled
//! into a message, handed to the vhost's publish pipeline (or held by a
//! transaction), and the channel's part of the outcome: basic.return and
//! the confirm waiting on the ticket.

use std::sync::Arc;

use bytes::Bytes;
use sluice_core::arguments::check_expiration_property;
use sluice_core::error::{AmqpError, AmqpResult};
use sluice_core::message::Message;
use sluice_core::queue::{same_queue, Queue};
use sluice_core::reply_to::REPLY_TO_QUEUE;
use sluice_core::sender_selected::check_header_routes;
use sluice_wire::content::{ContentHeader, RawProperties};
use sluice_wire::encode::{encode_content, encode_return, join_body};
use sluice_wire::method::Publish;
use sluice_wire::reply_code::ReplyCode;

use super::{Channel, PendingContent, TxOperation, WaitingConfirm};
use crate::bodies_under_way::{BodiesUnderWay, BodyReservation};
use crate::connection_context::ConnectionContext;

impl Channel {
    pub fn handle_publish(&mut self, publish: Publish) -> AmqpResult<()> {
        if publish.immediate {
            return Err(AmqpError::not_implemented("immediate=true"));
        }
        self.content = Some(PendingContent {
            publish,
            header: None,
            single_body: None,
            body_parts: Vec::new(),
            body_received: 0,
            room: None,
        });
        Ok(())
    }

    pub fn handle_content_header(
        &mut self,
        context: &ConnectionContext,
        header: ContentHeader,
    ) -> AmqpResult<()> {
        let pending = match self.content.as_mut() {
            Some(pending) if pending.header.is_none() => pending,
            _ => {
                return Err(AmqpError::unexpected_frame(
                    "expected method frame, got non method frame instead",
                ))
            }
        };
        if header.class_id != sluice_wire::method::CLASS_BASIC {
            return Err(AmqpError::unexpected_frame(format!(
                "expected content header for class 60, got one for class {} instead",
                header.class_id
            )));
        }
        if header.body_size > context.max_message_size as u64 {
            self.content = None;
            // RabbitMQ words the default limit and a configured one differently.
            let configured = if context.max_message_size == crate::config::MAX_MESSAGE_SIZE_DEFAULT
            {
                ""
            } else {
                "configured "
            };
            return Err(AmqpError::precondition_failed(format!(
                "message size {} is larger than {configured}max size {}",
                header.body_size, context.max_message_size
            )));
        }
        let complete = header.body_size == 0;
        if BodiesUnderWay::is_counted(header.body_size) {
            pending.room = context.bodies_under_way.try_reserve(header.body_size);
        }
        pending.header = Some(header);
        if complete {
            self.finish_publish(context)?;
        }
        Ok(())
    }

    /// The size of the large body under way on this channel that waits for
    /// room among the node's bodies under way before more of it is read.
    pub fn body_room_wanted(&self) -> Option<u64> {
        let pending = self.content.as_ref()?;
        let body_size = pending.header.as_ref()?.body_size;
        (BodiesUnderWay::is_counted(body_size)
            && pending.room.is_none()
            && (pending.body_received as u64) < body_size)
            .then_some(body_size)
    }

    /// Whether the body under way on this channel holds room among the
    /// node's bodies under way.
    pub fn holds_body_room(&self) -> bool {
        self.content
            .as_ref()
            .is_some_and(|pending| pending.room.is_some())
    }

    /// Room found for the body [`Self::body_room_wanted`] named.
    pub fn take_body_room(&mut self, room: BodyReservation) {
        if let Some(pending) = self.content.as_mut() {
            pending.room = Some(room);
        }
    }

    pub fn handle_content_body(
        &mut self,
        context: &ConnectionContext,
        body: Bytes,
    ) -> AmqpResult<()> {
        let pending = match self.content.as_mut() {
            Some(pending) if pending.header.is_some() => pending,
            _ => {
                return Err(AmqpError::unexpected_frame(
                    "expected method frame, got non method frame instead",
                ))
            }
        };
        let body_size = pending.header.as_ref().map_or(0, |header| header.body_size) as usize;
        pending.body_received += body.len();
        if pending.body_received > body_size {
            return Err(AmqpError::frame_error(format!(
                "content body of {} bytes exceeds the {} announced in the content header",
                pending.body_received, body_size
            )));
        }
        if pending.body_parts.is_empty()
            && pending.single_body.is_none()
            && pending.body_received == body_size
        {
            pending.single_body = Some(body);
        } else {
            pending.body_parts.extend(pending.single_body.take());
            pending.body_parts.push(body);
        }
        if pending.body_received == body_size {
            self.finish_publish(context)?;
        }
        Ok(())
    }

    /// The whole message has arrived: route it, or buffer it in tx mode.
    pub(super) fn finish_publish(&mut self, context: &ConnectionContext) -> AmqpResult<()> {
        let Some(pending) = self.content.take() else {
            return Ok(());
        };
        let Some(header) = pending.header else {
            return Ok(());
        };
        let publish = pending.publish;
        // RabbitMQ's order: write permission, the exchange (404, then 403
        // when internal), then the properties; all at publish time, in tx
        // mode too.
        self.publish_permit.check(context, &publish.exchange)?;
        context
            .vhost
            .check_publish_exchange(&publish.exchange, &mut self.publish_scratch)?;
        self.publish_permit
            .check_routing_key(context, &publish.exchange, &publish.routing_key)?;
        let mut properties = header.properties;
        context.check_user_id(&properties)?;
        if properties.has_reply_to() {
            properties = self.direct_reply_to(properties)?;
        }
        if let Some(expiration) = properties.expiration() {
            check_expiration_property(expiration)?;
        }
        let message = Arc::new(Message {
            exchange: publish.exchange.clone(),
            routing_key: publish.routing_key.clone(),
            properties,
            body: match pending.single_body {
                Some(body) => body,
                None => join_body(pending.body_parts, header.body_size as usize),
            },
        });
        if let Some(transaction) = self.tx.as_mut() {
            check_header_routes(&message.properties)?;
            transaction.held.hold(message.body_size() as u64)?;
            transaction
                .operations
                .push(TxOperation::Publish(message, publish));
            return Ok(());
        }
        self.route_and_enqueue(context, message, &publish)
    }

    /// A request asking for a direct reply (reply-to
    /// `amq.rabbitmq.reply-to`) gets this channel's reply name instead, as
    /// RabbitMQ's `maybe_set_fast_reply_to` does; any other reply-to is left
    /// as it is.
    pub(super) fn direct_reply_to(&self, properties: RawProperties) -> AmqpResult<RawProperties> {
        if properties.reply_to().as_deref() != Some(REPLY_TO_QUEUE.as_bytes()) {
            return Ok(properties);
        }
        let Some(consumer) = &self.reply_consumer else {
            return Err(AmqpError::precondition_failed(
                "fast reply consumer does not exist",
            ));
        };
        let decoded = properties
            .decode()
            .map_err(|_| AmqpError::syntax_error("cannot decode message properties"))?;
        let reply_name = format!(
            "{}{}",
            sluice_core::reply_to::REPLY_TO_PREFIX,
            consumer.token
        );
        Ok(RawProperties::from_properties(
            &decoded.with_reply_to(reply_name.as_str().into()),
        ))
    }

    /// Publishes through the vhost's pipeline, then does the channel's
    /// part: basic.return for a mandatory message no queue took, and the
    /// confirm (or the transaction's commit) waiting on the ticket.
    pub(super) fn route_and_enqueue(
        &mut self,
        context: &ConnectionContext,
        message: Arc<Message>,
        publish: &Publish,
    ) -> AmqpResult<()> {
        let published = context.vhost.publish(
            &publish.exchange,
            message,
            &mut self.publish_scratch,
            &mut self.congested_queues,
        )?;
        for (queue, confirm) in self.publish_scratch.take_replicated() {
            self.soft_limit_reached |= self.quorum_commands.record(&queue, confirm);
        }
        let counts = &mut self.unflushed;
        counts.count_publish(published.message.body_size());
        counts.count_routing(published.routed, publish.mandatory);
        if self.confirms.is_some() {
            counts.add(|counts| &mut counts.received_confirm, 1);
        }
        if !published.routed && publish.mandatory {
            let message = &published.message;
            context.outbox.append(|out| {
                encode_return(
                    out,
                    self.id,
                    ReplyCode::NoRoute.code(),
                    "NO_ROUTE",
                    &message.exchange,
                    &message.routing_key,
                );
                encode_content(
                    out,
                    self.id,
                    &message.properties,
                    &message.body,
                    context.frame_max,
                );
            });
        }
        let ticket = published.ticket;
        if let Some(commit) = self.committing.as_mut() {
            commit.ticket.merge(ticket);
        } else if let Some(confirms) = self.confirms.as_mut() {
            confirms.next_sequence += 1;
            let sequence = confirms.next_sequence;
            if confirms.waiting.is_empty() && ticket.is_immediate() {
                confirms.confirmed_through = sequence;
            } else {
                confirms
                    .waiting
                    .push_back(WaitingConfirm { sequence, ticket });
            }
        }
        Ok(())
    }

    /// Whether a quorum queue has `quorum_commands_soft_limit` or more of
    /// this channel's messages not applied yet: its connection stops
    /// reading until they are fewer.
    pub fn is_slow(&mut self) -> bool {
        self.quorum_commands.is_slow()
    }

    /// Whether a publish since last asked left a quorum queue with
    /// `quorum_commands_soft_limit` of this channel's messages in flight.
    pub fn take_soft_limit_reached(&mut self) -> bool {
        std::mem::take(&mut self.soft_limit_reached)
    }

    /// The congested queues this channel published into since last asked.
    pub fn take_congested_queues(&mut self, into: &mut Vec<Arc<dyn Queue>>) {
        for queue in self.congested_queues.drain(..) {
            if !into.iter().any(|known| same_queue(known, &queue)) {
                into.push(queue);
            }
        }
    }
}
