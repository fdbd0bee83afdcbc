//! The publish pipeline: one call routes a message, enqueues it into every
//! queue it lands in, whatever their kind, and hands back a confirm ticket
//! that completes when each of them has the message safe. The channel keeps
//! the framing (basic.return for a mandatory message routed nowhere, the
//! confirm sequence numbers); the broker's rules live here.

use std::sync::Arc;

use amq_protocol::types::FieldTable;
use bytes::Bytes;
use sluice_wire::content::RawProperties;

use super::routing::RouteScratch;
use super::{Exchange, VirtualHost};
use crate::confirm::{ConfirmTicket, ForwardedConfirm, PendingSafety};
use crate::error::AmqpResult;
use crate::exchange::ExchangeKind;
use crate::message::Message;
use crate::queue::forwarding::{ForwardHome, QueueKey};
use crate::queue::{same_queue, PublishOutcome, Queue};
use crate::queue_type::QueueType;
use crate::reply_to::token_of;
use crate::sender_selected::{header_routes, may_have_header_routes, without_bcc};

/// Buffers a publisher reuses from one message to the next, so routing and
/// enqueueing allocate nothing in the common case, and the route of its
/// last message, reused while the vhost's topology stands still.
#[derive(Default)]
pub struct PublishScratch {
    route: RouteScratch,
    /// Queues of a message routed by its headers, which is not cached.
    queues: Vec<Arc<dyn Queue>>,
    last: Option<LastRoute>,
    /// The name of each quorum queue the last messages went to, with its word on the
    /// message still to come: the publisher counts its commands in flight
    /// to each (see [`PublishScratch::take_replicated`]).
    replicated: Vec<(Arc<str>, Arc<ForwardedConfirm>)>,
}

impl PublishScratch {
    /// The quorum queues messages went to since last asked, each with the
    /// word it will give on its message: RabbitMQ's channel counts these
    /// commands to hold itself to `quorum_commands_soft_limit`.
    pub fn take_replicated(&mut self) -> std::vec::Drain<'_, (Arc<str>, Arc<ForwardedConfirm>)> {
        self.replicated.drain(..)
    }
}

/// The exchange a publisher last published to, and the queues its last
/// routing key led to there, as of topology version `version`. One entry:
/// a publisher mostly sends to one exchange and key, and one that varies
/// them pays a comparison of the key for the miss.
struct LastRoute {
    version: u64,
    exchange: Arc<Exchange>,
    /// The key `queues` are for; None until a message routed by its key
    /// alone computed them.
    routing_key: Option<Bytes>,
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
    /// Checks the exchange a publish names, as RabbitMQ does first: 404
    /// when missing, 403 when internal. It is kept in `scratch` for the
    /// publish that follows.
    ///
    /// # Errors
    /// 404 NOT_FOUND or 403 ACCESS_REFUSED.
    pub fn check_publish_exchange(
        &self,
        exchange_name: &[u8],
        scratch: &mut PublishScratch,
    ) -> AmqpResult<()> {
        self.publish_exchange(exchange_name, &mut scratch.last)
            .map(drop)
    }

    /// The exchange named `name`, from `scratch` while the topology has not
    /// changed since it was looked up.
    fn publish_exchange<'a>(
        &self,
        name: &[u8],
        cached: &'a mut Option<LastRoute>,
    ) -> AmqpResult<&'a mut LastRoute> {
        let version = self.topology.current();
        let hit = cached
            .as_ref()
            .is_some_and(|last| last.version == version && last.exchange.name.as_bytes() == name);
        if !hit {
            let exchange = self.exchange_for_publish(name)?;
            let mut queues = cached.take().map(|last| last.queues).unwrap_or_default();
            queues.clear();
            *cached = Some(LastRoute {
                version,
                exchange,
                routing_key: None,
                queues,
            });
        }
        Ok(cached.as_mut().expect("set above"))
    }

    /// Routes `message`, published to the exchange named `exchange_name`,
    /// and enqueues it into every queue it lands in. Queues that are
    /// congested after taking it are added to `congested` (each once): the
    /// publisher's connection pauses until they drain. The caller counts
    /// the publish (see [`crate::vhost::counts`]).
    ///
    /// # Errors
    /// 404 or 403 for the exchange (see [`Self::check_publish_exchange`]);
    /// 406 PRECONDITION_FAILED for `CC` or `BCC` headers that are not
    /// arrays of strings, as RabbitMQ refuses them.
    pub fn publish(
        &self,
        exchange_name: &[u8],
        message: Arc<Message>,
        scratch: &mut PublishScratch,
        congested: &mut Vec<Arc<dyn Queue>>,
    ) -> AmqpResult<Published> {
        let header_routed = may_have_header_routes(&message.properties);
        let last = self.publish_exchange(exchange_name, &mut scratch.last)?;
        let headers_exchange = last.exchange.kind == ExchangeKind::Headers;
        let reads_headers = headers_exchange && message.properties.has_headers();
        let (message, queues, is_default) = if !header_routed && !reads_headers {
            if last.routing_key.as_ref() != Some(&message.routing_key) {
                let LastRoute {
                    exchange, queues, ..
                } = &mut *last;
                self.route(
                    exchange,
                    &message.routing_key,
                    None,
                    &mut scratch.route,
                    queues,
                );
                last.routing_key = Some(message.routing_key.clone());
            }
            (message, &last.queues, last.exchange.is_default())
        } else {
            let exchange = Arc::clone(&last.exchange);
            let message =
                self.route_by_headers(&exchange, message, &mut scratch.route, &mut scratch.queues)?;
            (message, &scratch.queues, exchange.is_default())
        };
        if queues.is_empty() && is_default {
            // A reply to a direct reply-to name reaches its consumer, or is
            // dropped when that channel is gone. Either way it counts as
            // routed to no queue, so mandatory still returns it, as in
            // RabbitMQ (where reply names are "not a queue").
            if let Some(token) = token_of(&message.routing_key) {
                self.reply_to.deliver(token, &message);
            }
        }
        let (ticket, routed) = enqueue(&message, queues, congested, &mut scratch.replicated);
        Ok(Published {
            message,
            routed,
            ticket,
        })
    }

    /// Fills `scratch.queues` with the queues a message lands in when its
    /// headers take part: the headers exchange, or `CC` and `BCC`, which add
    /// routing keys (and `BCC` is stripped). Returns the message as they
    /// take it. Other messages with headers pass as they came, without
    /// their headers decoded.
    fn route_by_headers(
        &self,
        exchange: &Arc<Exchange>,
        message: Arc<Message>,
        route: &mut RouteScratch,
        queues: &mut Vec<Arc<dyn Queue>>,
    ) -> AmqpResult<Arc<Message>> {
        let header_routed = may_have_header_routes(&message.properties);
        let decoded = message.properties.decode().ok();
        let headers = decoded
            .as_ref()
            .and_then(|properties| properties.headers().as_ref());
        let routing_headers = headers.filter(|_| exchange.kind == ExchangeKind::Headers);
        let header_keys = match headers.filter(|_| header_routed) {
            Some(headers) => header_routes(headers.inner())?,
            None => Vec::new(),
        };
        let mut keys: Vec<&[u8]> = Vec::with_capacity(1 + header_keys.len());
        keys.push(&message.routing_key);
        keys.extend(header_keys.iter().map(|key| &key[..]));
        self.route_keys(exchange, &keys, routing_headers, route, queues);
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

/// Offers `message` to each of `queues` and gathers their word on it, with
/// whether any of them took it. Queues homed on other nodes get it through
/// one forward per home node, naming them all: a message crosses each link
/// once, however many queues there it lands in.
fn enqueue(
    message: &Arc<Message>,
    queues: &[Arc<dyn Queue>],
    congested: &mut Vec<Arc<dyn Queue>>,
    replicated: &mut Vec<(Arc<str>, Arc<ForwardedConfirm>)>,
) -> (ConfirmTicket, bool) {
    let mut ticket = ConfirmTicket::default();
    let mut taken = false;
    let mut forwards: Vec<Forward> = Vec::new();
    for queue in queues {
        match queue.forwarded() {
            Some((home, key)) => {
                let forward = match forwards.iter_mut().position(|known| {
                    std::ptr::addr_eq(Arc::as_ptr(&known.home), Arc::as_ptr(&home))
                }) {
                    Some(index) => &mut forwards[index],
                    None => {
                        forwards.push(Forward {
                            home,
                            targets: Vec::new(),
                            quorum_targets: Vec::new(),
                        });
                        forwards.last_mut().expect("pushed above")
                    }
                };
                forward.targets.push(key);
                if queue.queue_type() == QueueType::Quorum {
                    forward.quorum_targets.push(Arc::clone(queue.name()));
                }
            }
            None => {
                let outcome = queue.publish(Arc::clone(message));
                if let PublishOutcome::Pending(PendingSafety::Forwarded(confirm)) = &outcome {
                    if queue.queue_type() == QueueType::Quorum {
                        replicated.push((Arc::clone(queue.name()), Arc::clone(confirm)));
                    }
                }
                taken |= record(outcome, &mut ticket);
            }
        }
        if queue.is_congested() && !congested.iter().any(|known| same_queue(known, queue)) {
            congested.push(Arc::clone(queue));
        }
    }
    for forward in forwards {
        let outcome = forward.home.publish(message, forward.targets);
        if let PublishOutcome::Pending(PendingSafety::Forwarded(confirm)) = &outcome {
            // One word from the home node covers all its targets.
            for queue in forward.quorum_targets {
                replicated.push((queue, Arc::clone(confirm)));
            }
        }
        taken |= record(outcome, &mut ticket);
    }
    (ticket, taken)
}

/// The queues of one home node a message goes to in one forward.
struct Forward {
    home: Arc<dyn ForwardHome>,
    targets: Vec<QueueKey>,
    /// The names of those that are quorum queues.
    quorum_targets: Vec<Arc<str>>,
}

/// Adds a queue's word on a message to its ticket; whether the queue took it.
fn record(outcome: PublishOutcome, ticket: &mut ConfirmTicket) -> bool {
    match outcome {
        PublishOutcome::Enqueued => {}
        PublishOutcome::Pending(safety) => ticket.wait_for(safety),
        PublishOutcome::Rejected => ticket.refuse(),
        PublishOutcome::Unavailable => return false,
    }
    true
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
