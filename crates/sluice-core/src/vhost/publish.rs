//! The publish pipeline: one call routes a message, enqueues it into every
//! queue it lands in, whatever their kind, and hands back a confirm ticket
//! that completes when each of them has the message safe. The channel keeps
//! the framing (basic.return for a mandatory message routed nowhere, the
//! confirm sequence numbers); the broker's rules live here.

use std::sync::Arc;

use amq_protocol::types::FieldTable;
use sluice_wire::content::RawProperties;

use super::routing::RouteScratch;
use super::{Exchange, VirtualHost};
use crate::confirm::ConfirmTicket;
use crate::error::AmqpResult;
use crate::exchange::ExchangeKind;
use crate::message::Message;
use crate::queue::{same_queue, PublishOutcome, Queue};
use crate::reply_to::token_of;
use crate::sender_selected::{header_routes, may_have_header_routes, without_bcc};

/// Buffers a publisher reuses from one message to the next, so routing and
/// enqueueing allocate nothing in the common case.
#[derive(Default)]
pub struct PublishScratch {
    route: RouteScratch,
    queues: Vec<Arc<dyn Queue>>,
}

/// What became of a published message.
pub struct Published {
    /// The message as the queues took it (without its `BCC` header): what a
    /// mandatory message routed nowhere is returned as.
    pub message: Arc<Message>,
    /// Whether any queue took it; a mandatory message that no queue took
    /// goes back to its publisher with basic.return.
    pub routed: bool,
    /// Complete once every queue that took it has it safe.
    pub ticket: ConfirmTicket,
}

impl VirtualHost {
    /// Routes `message` from `exchange` and enqueues it into every queue it
    /// lands in. Queues that are congested after taking it are added to
    /// `congested` (each once): the publisher's connection pauses until they
    /// drain.
    ///
    /// # Errors
    /// 406 PRECONDITION_FAILED for `CC` or `BCC` headers that are not
    /// arrays of strings, as RabbitMQ refuses them.
    pub fn publish(
        &self,
        exchange: &Arc<Exchange>,
        message: Arc<Message>,
        scratch: &mut PublishScratch,
        congested: &mut Vec<Arc<dyn Queue>>,
    ) -> AmqpResult<Published> {
        let message = self.route_message(exchange, message, scratch)?;
        let routed = !scratch.queues.is_empty();
        if !routed && exchange.is_default() {
            // A reply to a direct reply-to name reaches its consumer, or is
            // dropped when that channel is gone. Either way it counts as
            // routed to no queue, so mandatory still returns it, as in
            // RabbitMQ (where reply names are "not a queue").
            if let Some(token) = token_of(&message.routing_key) {
                self.reply_to.deliver(token, &message);
            }
        }
        let mut ticket = ConfirmTicket::default();
        for queue in scratch.queues.drain(..) {
            match queue.publish(Arc::clone(&message)) {
                PublishOutcome::Enqueued => {}
                PublishOutcome::Pending(safety) => ticket.wait_for(safety),
                PublishOutcome::Rejected => ticket.refuse(),
            }
            if queue.is_congested() && !congested.iter().any(|known| same_queue(known, &queue)) {
                congested.push(queue);
            }
        }
        Ok(Published {
            message,
            routed,
            ticket,
        })
    }

    /// Fills `scratch.queues` with the queues `message` lands in, and
    /// returns the message as they take it. Headers are decoded only when
    /// something reads them: the headers exchange, or `CC` and `BCC`, which
    /// add routing keys (and `BCC` is stripped). Other messages with headers
    /// pass as they came.
    fn route_message(
        &self,
        exchange: &Arc<Exchange>,
        message: Arc<Message>,
        scratch: &mut PublishScratch,
    ) -> AmqpResult<Arc<Message>> {
        let header_routed = may_have_header_routes(&message.properties);
        let headers_exchange = exchange.kind == ExchangeKind::Headers;
        let reads_headers = headers_exchange && message.properties.has_headers();
        if !header_routed && !reads_headers {
            self.route(
                exchange,
                &message.routing_key,
                None,
                &mut scratch.route,
                &mut scratch.queues,
            );
            return Ok(message);
        }
        let decoded = message.properties.decode().ok();
        let headers = decoded
            .as_ref()
            .and_then(|properties| properties.headers().as_ref());
        let routing_headers = headers.filter(|_| headers_exchange);
        let header_keys = match headers.filter(|_| header_routed) {
            Some(headers) => header_routes(headers.inner())?,
            None => Vec::new(),
        };
        let mut keys: Vec<&[u8]> = Vec::with_capacity(1 + header_keys.len());
        keys.push(&message.routing_key);
        keys.extend(header_keys.iter().map(|key| &key[..]));
        self.route_keys(
            exchange,
            &keys,
            routing_headers,
            &mut scratch.route,
            &mut scratch.queues,
        );
        let kept = headers
            .filter(|_| header_routed)
            .and_then(without_bcc)
            .zip(decoded.as_ref());
        Ok(match kept {
            Some((kept, properties)) => Arc::new(strip_to(&message, properties, kept)),
            None => message,
        })
    }
}

/// The message with its headers replaced by `kept` (the `BCC` header gone).
fn strip_to(
    message: &Message,
    properties: &amq_protocol::protocol::basic::AMQPProperties,
    kept: FieldTable,
) -> Message {
    Message {
        properties: RawProperties::from_properties(&properties.clone().with_headers(kept)),
        ..message.clone()
    }
}
