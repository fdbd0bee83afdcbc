//! One AMQP channel as its connection's reader task sees it: content being
//! assembled, confirm and tx modes, consumers, and the methods that act on
//! exchanges, queues and messages.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use amq_protocol::protocol::{basic, channel, confirm, exchange, queue, tx, AMQPClass};
use bytes::Bytes;
use sluice_core::arguments::{as_integer, check_consume_arguments, check_expiration_property};
use sluice_core::confirm::{ConfirmStatus, ConfirmTicket};
use sluice_core::error::{AmqpError, AmqpResult};
use sluice_core::exchange::Destination;
use sluice_core::message::Message;
use sluice_core::queue::{same_queue, Consumer, MessageId, Queue};
use sluice_core::reply_to::{token_of, REPLY_TO_QUEUE};
use sluice_core::sender_selected::check_header_routes;
use sluice_core::vhost::{ExchangeDeclaration, PublishScratch, QueueDeclaration};
use sluice_wire::content::{ContentHeader, RawProperties};
use sluice_wire::encode::{
    encode_confirm, encode_content, encode_control, encode_return, join_body,
};
use sluice_wire::method::{Ack, Nack, Publish, Reject};
use sluice_wire::reply_code::ReplyCode;

use crate::connection_context::ConnectionContext;
use crate::delivery::{ChannelDeliveries, Unacked};
use crate::limits::TX_UNCOMMITTED_BYTES_MAX;

/// A publish whose content header and body frames are still arriving.
struct PendingContent {
    publish: Publish,
    header: Option<ContentHeader>,
    /// A body that arrived whole in one frame: the common case, kept
    /// without allocating a vector of parts.
    single_body: Option<Bytes>,
    body_parts: Vec<Bytes>,
    body_received: usize,
}

/// Publisher confirms: sequence numbers and the acks not yet written, so one
/// basic.ack with multiple can cover every publish of a read batch or of a
/// sync round.
#[derive(Default)]
struct Confirms {
    next_sequence: u64,
    /// Every publish up to here is confirmed; those after `sent_through`
    /// still need their basic.ack written.
    confirmed_through: u64,
    sent_through: u64,
    /// Publishes that cannot be acked yet (persistent messages waiting for
    /// fsync) or that will be nacked, in sequence order. Anything published
    /// after the first of them waits behind it, so that an ack with multiple
    /// never covers a publish that is not confirmed.
    waiting: VecDeque<WaitingConfirm>,
}

struct WaitingConfirm {
    sequence: u64,
    ticket: ConfirmTicket,
}

/// A tx.commit applied, whose commit-ok waits until its persistent messages
/// are on disk, as in RabbitMQ: a transaction is the protocol's own way to
/// know a message is safe.
#[derive(Default)]
struct PendingCommit {
    /// Every message of the transaction; refused when a queue refused one
    /// (`reject-publish`, a failed journal).
    ticket: ConfirmTicket,
    /// Commit-oks owed: a client that sends tx.commit again before the
    /// first commit-ok still gets one reply for each.
    replies: u32,
}

/// Work buffered by a channel in tx mode until tx.commit.
enum TxOperation {
    Publish(Arc<Message>, Publish),
    /// Acks, nacks and rejects: their messages are taken from the unacked
    /// ones when the method arrives, so an unknown or repeated tag fails
    /// then (as in RabbitMQ), and go back on rollback.
    Settle {
        settled: Vec<Unacked>,
        requeue: Option<bool>,
    },
}

#[derive(Default)]
struct Transaction {
    operations: Vec<TxOperation>,
    body_bytes: usize,
}

struct ChannelConsumer {
    queue: Arc<dyn Queue>,
}

/// The channel's consumer of the `amq.rabbitmq.reply-to` pseudo-queue.
struct ReplyConsumer {
    tag: Arc<str>,
    /// Names the consumer in the broker's registry and in the reply-to
    /// names of this channel's requests.
    token: Box<str>,
}

pub struct Channel {
    pub id: u16,
    pub deliveries: Arc<ChannelDeliveries>,
    /// We sent channel.close and wait for close-ok; other frames are dropped.
    pub closing: bool,
    content: Option<PendingContent>,
    confirms: Option<Confirms>,
    tx: Option<Transaction>,
    committing: Option<PendingCommit>,
    consumers: HashMap<Arc<str>, ChannelConsumer>,
    reply_consumer: Option<ReplyConsumer>,
    /// basic.qos global=false: the prefetch given to consumers started next.
    consumer_prefetch: u32,
    next_consumer_tag: u64,
    /// The queue named by an empty queue name in later methods.
    last_declared_queue: Option<Arc<str>>,
    publish_scratch: PublishScratch,
    /// Queues this channel published into that are congested: the
    /// connection stops reading until they drain.
    congested_queues: Vec<Arc<dyn Queue>>,
    /// Buffers an ack reuses, so that settling does not allocate.
    settled_scratch: Vec<Unacked>,
    dispatched_scratch: Vec<Arc<dyn Queue>>,
    message_ids_scratch: Vec<MessageId>,
}

/// Where an error arose, for the class and method ids of the close.
pub type MethodIds = (u16, u16);

impl Channel {
    pub fn new(id: u16, context: &ConnectionContext) -> Self {
        let deliveries = Arc::new(ChannelDeliveries::new(
            id,
            context.frame_max,
            context.client_capabilities.consumer_cancel_notify,
            Arc::clone(&context.outbox),
            Arc::clone(&context.vhost),
        ));
        context
            .stats
            .channel_opened(id, Arc::clone(deliveries.counters()));
        Channel {
            id,
            deliveries,
            closing: false,
            content: None,
            confirms: None,
            tx: None,
            committing: None,
            consumers: HashMap::new(),
            reply_consumer: None,
            consumer_prefetch: 0,
            next_consumer_tag: 1,
            last_declared_queue: None,
            publish_scratch: PublishScratch::default(),
            congested_queues: Vec::new(),
            settled_scratch: Vec::new(),
            dispatched_scratch: Vec::new(),
            message_ids_scratch: Vec::new(),
        }
    }

    fn reply(&self, context: &ConnectionContext, class: AMQPClass) {
        context
            .outbox
            .append(|out| encode_control(out, self.id, &class));
    }

    /// Whether this channel may owe publish confirms or a commit-ok.
    pub fn has_confirms(&self) -> bool {
        self.confirms.is_some() || self.committing.is_some()
    }

    /// The queues this channel's consumers read from.
    pub fn consumer_queues(&self) -> impl Iterator<Item = Arc<dyn Queue>> + '_ {
        self.consumers
            .values()
            .map(|entry| Arc::clone(&entry.queue))
    }

    pub fn expects_content(&self) -> bool {
        self.content.is_some()
    }

    /// Whether the publish in progress has its content header and waits for
    /// body frames.
    pub fn expects_content_body(&self) -> bool {
        self.content
            .as_ref()
            .is_some_and(|pending| pending.header.is_some())
    }

    /// Forgets consumers the queue cancelled since the last method.
    fn prune_cancelled_consumers(&mut self) {
        for tag in self.deliveries.take_cancelled_by_queue() {
            self.consumers.remove(&tag);
        }
    }

    fn queue_name<'a>(&self, name: &'a str) -> AmqpResult<std::borrow::Cow<'a, str>> {
        if !name.is_empty() {
            return Ok(std::borrow::Cow::Borrowed(name));
        }
        match &self.last_declared_queue {
            Some(last) => Ok(std::borrow::Cow::Owned(last.to_string())),
            None => Err(AmqpError::not_found("no previously declared queue")),
        }
    }

    /// RabbitMQ's shortcut for queue.bind and queue.unbind naming neither a
    /// queue nor a routing key: the key is the last declared queue's name,
    /// so `queue.bind(exchange)` right after a declare binds that queue
    /// under its own name.
    fn binding_key<'a>(
        &self,
        queue: &str,
        routing_key: &'a str,
    ) -> AmqpResult<std::borrow::Cow<'a, str>> {
        if queue.is_empty() && routing_key.is_empty() {
            self.queue_name("")
        } else {
            Ok(std::borrow::Cow::Borrowed(routing_key))
        }
    }

    // ----- publishing -----

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
        pending.header = Some(header);
        if complete {
            self.finish_publish(context)?;
        }
        Ok(())
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
    fn finish_publish(&mut self, context: &ConnectionContext) -> AmqpResult<()> {
        let Some(pending) = self.content.take() else {
            return Ok(());
        };
        let Some(header) = pending.header else {
            return Ok(());
        };
        let publish = pending.publish;
        // RabbitMQ's order: the exchange (404, then 403 when internal), then
        // the properties; all at publish time, in tx mode too.
        context
            .vhost
            .check_publish_exchange(&publish.exchange, &mut self.publish_scratch)?;
        let mut properties = header.properties;
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
            transaction.body_bytes += message.body_size();
            if transaction.body_bytes > TX_UNCOMMITTED_BYTES_MAX {
                return Err(AmqpError::precondition_failed(format!(
                    "transaction holds more than {TX_UNCOMMITTED_BYTES_MAX} bytes of uncommitted messages"
                )));
            }
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
    fn direct_reply_to(&self, properties: RawProperties) -> AmqpResult<RawProperties> {
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
    fn route_and_enqueue(
        &mut self,
        context: &ConnectionContext,
        message: Arc<Message>,
        publish: &Publish,
    ) -> AmqpResult<()> {
        let published = context.vhost.publish(
            &publish.exchange,
            message,
            publish.mandatory,
            &mut self.publish_scratch,
            &mut self.congested_queues,
        )?;
        let counters = self.deliveries.counters();
        counters.count_publish(published.message.body_size());
        match (published.routed, publish.mandatory) {
            (true, _) => counters.routed.add(1),
            (false, true) => counters.returned_unroutable.add(1),
            (false, false) => counters.dropped_unroutable.add(1),
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

    /// The congested queues this channel published into since last asked.
    pub fn take_congested_queues(&mut self, into: &mut Vec<Arc<dyn Queue>>) {
        for queue in self.congested_queues.drain(..) {
            if !into.iter().any(|known| same_queue(known, &queue)) {
                into.push(queue);
            }
        }
    }

    /// Whether confirms or a commit-ok wait for a sync round.
    pub fn has_waiting_confirms(&self) -> bool {
        self.committing.is_some()
            || self
                .confirms
                .as_ref()
                .is_some_and(|confirms| !confirms.waiting.is_empty())
    }

    /// Writes the confirms accumulated while handling a batch of frames: one
    /// basic.ack with multiple for a run of publishes; and the commit-ok of
    /// a committed transaction once its messages are on disk. An error is a
    /// transaction that could not be completed: it closes the channel.
    pub fn flush_confirms(&mut self, context: &ConnectionContext) -> AmqpResult<()> {
        self.settle_commit(context)?;
        let channel_id = self.id;
        let Some(confirms) = self.confirms.as_mut() else {
            return Ok(());
        };
        let counters = self.deliveries.counters();
        let write_acks = |confirms: &mut Confirms| {
            if confirms.confirmed_through == confirms.sent_through {
                return;
            }
            let confirmed = confirms.confirmed_through - confirms.sent_through;
            counters.confirmed.add(confirmed);
            context.vhost.counters().local().confirmed.add(confirmed);
            let multiple = confirmed > 1;
            let delivery_tag = confirms.confirmed_through;
            confirms.sent_through = confirms.confirmed_through;
            context
                .outbox
                .append(|out| encode_confirm(out, channel_id, delivery_tag, multiple, true));
        };
        while let Some(front) = confirms.waiting.front() {
            let status = front.ticket.status();
            if status == ConfirmStatus::Refused {
                // Acks for earlier publishes go out first, so that a
                // multiple ack never covers this nack.
                let sequence = front.sequence;
                write_acks(confirms);
                context
                    .outbox
                    .append(|out| encode_confirm(out, channel_id, sequence, false, false));
                counters.refused.add(1);
                context.vhost.counters().local().refused.add(1);
                confirms.confirmed_through = sequence;
                confirms.sent_through = sequence;
            } else if status == ConfirmStatus::Confirmed {
                confirms.confirmed_through = front.sequence;
            } else {
                break;
            }
            confirms.waiting.pop_front();
        }
        write_acks(confirms);
        Ok(())
    }

    /// Sends the commit-ok of an applied transaction once every persistent
    /// message in it is on disk; RabbitMQ's "partial tx completion" when a
    /// queue refused one or its journal failed.
    fn settle_commit(&mut self, context: &ConnectionContext) -> AmqpResult<()> {
        let Some(commit) = &self.committing else {
            return Ok(());
        };
        match commit.ticket.status() {
            ConfirmStatus::Refused => {
                self.committing = None;
                return Err(AmqpError::precondition_failed("partial tx completion"));
            }
            ConfirmStatus::Pending => return Ok(()),
            ConfirmStatus::Confirmed => {}
        }
        let replies = commit.replies;
        self.committing = None;
        for _ in 0..replies {
            self.reply(
                context,
                AMQPClass::Tx(tx::AMQPMethod::CommitOk(tx::CommitOk {})),
            );
        }
        Ok(())
    }

    // ----- acknowledgements -----

    pub fn handle_ack(&mut self, ack: Ack) -> AmqpResult<()> {
        self.settle(ack.delivery_tag, ack.multiple, None)
    }

    pub fn handle_nack(&mut self, nack: Nack) -> AmqpResult<()> {
        self.settle(nack.delivery_tag, nack.multiple, Some(nack.requeue))
    }

    pub fn handle_reject(&mut self, reject: Reject) -> AmqpResult<()> {
        self.settle(reject.delivery_tag, false, Some(reject.requeue))
    }

    /// basic.ack (`requeue` None), nack and reject (`requeue` Some).
    fn settle(
        &mut self,
        delivery_tag: u64,
        multiple: bool,
        requeue: Option<bool>,
    ) -> AmqpResult<()> {
        if let Some(transaction) = self.tx.as_mut() {
            let mut settled = Vec::new();
            self.deliveries.take(delivery_tag, multiple, &mut settled)?;
            transaction
                .operations
                .push(TxOperation::Settle { settled, requeue });
            return Ok(());
        }
        let mut settled = std::mem::take(&mut self.settled_scratch);
        let result = self.deliveries.settle(delivery_tag, multiple, &mut settled);
        if let Ok(others_wait) = result {
            self.finish_settle(&mut settled, requeue, others_wait);
        }
        settled.clear();
        self.settled_scratch = settled;
        result.map(drop)
    }

    /// Hands settled messages to their queues: acked, requeued, or rejected
    /// (dead-lettered where the queue says so); then lets this channel's
    /// queues deliver into the prefetch room freed. Leaves `settled` empty
    /// or to be cleared.
    fn finish_settle(
        &mut self,
        settled: &mut Vec<Unacked>,
        requeue: Option<bool>,
        others_wait: bool,
    ) {
        if requeue.is_none() {
            let acked = settled.len() as u64;
            self.deliveries.counters().acked.add(acked);
            self.deliveries.vhost().counters().local().acked.add(acked);
        }
        let mut dispatched = std::mem::take(&mut self.dispatched_scratch);
        if requeue == Some(true) {
            for entry in settled.iter() {
                if !dispatched
                    .iter()
                    .any(|queue| same_queue(queue, &entry.queue))
                {
                    dispatched.push(Arc::clone(&entry.queue));
                }
            }
            requeue_by_queue(settled.drain(..));
        } else {
            // nack and reject without requeue dead-letter where the
            // queue has a dead-letter exchange.
            let rejected = requeue == Some(false);
            settle_by_queue(
                settled,
                rejected,
                &mut dispatched,
                &mut self.message_ids_scratch,
            );
        }
        // Settling and requeueing dispatch on their own queues. The other
        // queues of this channel's consumers are asked only when one of
        // them was refused for the channel-wide prefetch (`others_wait`),
        // which this freed room under: an ack touches only the queues it
        // settles.
        for entry in self.consumers.values().filter(|_| others_wait) {
            if !dispatched
                .iter()
                .any(|queue| same_queue(queue, &entry.queue))
            {
                entry.queue.dispatch();
            }
        }
        dispatched.clear();
        self.dispatched_scratch = dispatched;
    }

    /// Prefetch room was freed: let this channel's queues deliver again.
    fn dispatch_consumer_queues(&self) {
        for entry in self.consumers.values() {
            entry.queue.dispatch();
        }
    }

    // ----- control methods -----

    /// Handles a control-plane method other than channel.open/close, which
    /// the connection handles.
    pub fn handle_control(
        &mut self,
        context: &ConnectionContext,
        class: AMQPClass,
    ) -> AmqpResult<()> {
        self.prune_cancelled_consumers();
        match class {
            AMQPClass::Channel(method) => self.handle_channel_method(context, method),
            AMQPClass::Exchange(method) => self.handle_exchange_method(context, method),
            AMQPClass::Queue(method) => self.handle_queue_method(context, method),
            AMQPClass::Basic(method) => self.handle_basic_method(context, method),
            AMQPClass::Confirm(confirm::AMQPMethod::Select(select)) => {
                if self.tx.is_some() {
                    return Err(AmqpError::precondition_failed(
                        "cannot switch from tx to confirm mode",
                    ));
                }
                self.confirms.get_or_insert_with(Confirms::default);
                if !select.nowait {
                    self.reply(
                        context,
                        AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(confirm::SelectOk {})),
                    );
                }
                Ok(())
            }
            AMQPClass::Tx(method) => self.handle_tx_method(context, method),
            AMQPClass::Access(_) => {
                // access.request is deprecated; RabbitMQ answers it with a ticket of 1.
                self.reply(
                    context,
                    AMQPClass::Access(amq_protocol::protocol::access::AMQPMethod::RequestOk(
                        amq_protocol::protocol::access::RequestOk {},
                    )),
                );
                Ok(())
            }
            other => Err(AmqpError::command_invalid(format!(
                "method {}.{} is not valid on channel {}",
                other.get_amqp_class_id(),
                other.get_amqp_method_id(),
                self.id
            ))),
        }
    }

    fn handle_channel_method(
        &mut self,
        context: &ConnectionContext,
        method: channel::AMQPMethod,
    ) -> AmqpResult<()> {
        match method {
            channel::AMQPMethod::Flow(flow) => {
                self.deliveries.set_flow(flow.active);
                self.reply(
                    context,
                    AMQPClass::Channel(channel::AMQPMethod::FlowOk(channel::FlowOk {
                        active: flow.active,
                    })),
                );
                if flow.active {
                    self.dispatch_consumer_queues();
                }
                Ok(())
            }
            channel::AMQPMethod::Open(_) => {
                Err(AmqpError::channel_error("second 'channel.open' seen"))
            }
            channel::AMQPMethod::FlowOk(_) => Ok(()),
            other => Err(AmqpError::command_invalid(format!(
                "unexpected method channel.{}",
                AMQPClass::Channel(other).get_amqp_method_id()
            ))),
        }
    }

    fn handle_exchange_method(
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

    fn handle_queue_method(
        &mut self,
        context: &ConnectionContext,
        method: queue::AMQPMethod,
    ) -> AmqpResult<()> {
        let vhost = &context.vhost;
        match method {
            queue::AMQPMethod::Declare(declare)
                if declare.queue.as_str().starts_with(REPLY_TO_QUEUE) =>
            {
                self.declare_reply_to(context, declare)?
            }
            queue::AMQPMethod::Declare(declare) => {
                // A passive declare of "" is not the last declared queue:
                // RabbitMQ looks up the name as given, and finds none.
                let (queue, _created) = vhost.declare_queue(
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
            }
            queue::AMQPMethod::Bind(bind) => {
                let name = self.queue_name(bind.queue.as_str())?;
                let routing_key =
                    self.binding_key(bind.queue.as_str(), bind.routing_key.as_str())?;
                vhost.bind(
                    bind.exchange.as_str(),
                    Destination::Queue(Arc::from(name.as_ref())),
                    &routing_key,
                    bind.arguments,
                    context.connection_id,
                )?;
                if !bind.nowait {
                    self.reply(
                        context,
                        AMQPClass::Queue(queue::AMQPMethod::BindOk(queue::BindOk {})),
                    );
                }
            }
            queue::AMQPMethod::Unbind(unbind) => {
                let name = self.queue_name(unbind.queue.as_str())?;
                let routing_key =
                    self.binding_key(unbind.queue.as_str(), unbind.routing_key.as_str())?;
                vhost.unbind(
                    unbind.exchange.as_str(),
                    Destination::Queue(Arc::from(name.as_ref())),
                    &routing_key,
                    unbind.arguments,
                    context.connection_id,
                )?;
                self.reply(
                    context,
                    AMQPClass::Queue(queue::AMQPMethod::UnbindOk(queue::UnbindOk {})),
                );
            }
            queue::AMQPMethod::Purge(purge) => {
                let name = self.queue_name(purge.queue.as_str())?;
                let queue = vhost.queue(&name, context.connection_id)?;
                let message_count = queue.purge();
                if !purge.nowait {
                    self.reply(
                        context,
                        AMQPClass::Queue(queue::AMQPMethod::PurgeOk(queue::PurgeOk {
                            message_count,
                        })),
                    );
                }
            }
            queue::AMQPMethod::Delete(delete) => {
                let name = self.queue_name(delete.queue.as_str())?;
                let (message_count, consumers) = vhost.delete_queue(
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
            }
            other => {
                return Err(AmqpError::command_invalid(format!(
                    "unexpected method queue.{}",
                    AMQPClass::Queue(other).get_amqp_method_id()
                )))
            }
        }
        Ok(())
    }

    /// queue.declare of the reply-to pseudo-queue or of a reply name: always
    /// passive, as in RabbitMQ. The pseudo-queue exists; a reply name exists
    /// while its consumer does, with one consumer and no messages.
    fn declare_reply_to(
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

    fn handle_basic_method(
        &mut self,
        context: &ConnectionContext,
        method: basic::AMQPMethod,
    ) -> AmqpResult<()> {
        match method {
            basic::AMQPMethod::Qos(qos) => {
                if qos.global {
                    self.deliveries
                        .set_channel_prefetch(qos.prefetch_count as u32);
                } else {
                    self.consumer_prefetch = qos.prefetch_count as u32;
                }
                self.reply(
                    context,
                    AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})),
                );
                self.dispatch_consumer_queues();
            }
            basic::AMQPMethod::Consume(consume) => self.consume(context, consume)?,
            basic::AMQPMethod::Cancel(cancel) => {
                let tag = cancel.consumer_tag.as_str();
                if self
                    .reply_consumer
                    .as_ref()
                    .is_some_and(|consumer| consumer.tag.as_ref() == tag)
                {
                    self.cancel_reply_consumer(context);
                } else if let Some(queue) = self.cancel_consumer(context, tag) {
                    // Its unacked messages stay with the channel (basic.cancel
                    // does not requeue them): the new active consumer takes
                    // the ready ones now.
                    queue.dispatch();
                }
                if !cancel.nowait {
                    self.reply(
                        context,
                        AMQPClass::Basic(basic::AMQPMethod::CancelOk(basic::CancelOk {
                            consumer_tag: cancel.consumer_tag,
                        })),
                    );
                }
            }
            basic::AMQPMethod::Get(get) => {
                let name = self.queue_name(get.queue.as_str())?;
                let queue = context.vhost.queue(&name, context.connection_id)?;
                match queue.get(get.no_ack) {
                    Some((entry, message_count)) => {
                        self.deliveries
                            .deliver_get(&queue, entry, message_count, get.no_ack)
                    }
                    None => self.reply(
                        context,
                        AMQPClass::Basic(basic::AMQPMethod::GetEmpty(basic::GetEmpty {})),
                    ),
                }
            }
            basic::AMQPMethod::Recover(recover) => {
                if !recover.requeue {
                    return Err(AmqpError::not_implemented("requeue=false"));
                }
                // recover-ok goes before the redeliveries, as in RabbitMQ:
                // clients such as lapin drop deliveries they hold when
                // recover-ok arrives, expecting the redeliveries after it.
                self.reply(
                    context,
                    AMQPClass::Basic(basic::AMQPMethod::RecoverOk(basic::RecoverOk {})),
                );
                self.recover(true)?;
            }
            basic::AMQPMethod::RecoverAsync(recover) => self.recover(recover.requeue)?,
            other => {
                return Err(AmqpError::command_invalid(format!(
                    "unexpected method basic.{}",
                    AMQPClass::Basic(other).get_amqp_method_id()
                )))
            }
        }
        Ok(())
    }

    fn recover(&mut self, requeue: bool) -> AmqpResult<()> {
        if !requeue {
            return Err(AmqpError::not_implemented("requeue=false"));
        }
        requeue_by_queue(self.deliveries.take_all_unacked());
        self.dispatch_consumer_queues();
        Ok(())
    }

    fn consume(&mut self, context: &ConnectionContext, consume: basic::Consume) -> AmqpResult<()> {
        if consume.queue.as_str() == REPLY_TO_QUEUE {
            return self.consume_replies(context, consume);
        }
        // A reused tag is refused before the queue is looked up, as in
        // RabbitMQ.
        let tag: Arc<str> = if consume.consumer_tag.as_str().is_empty() {
            loop {
                let candidate = format!(
                    "amq.ctag-{}-{}",
                    context.connection_id, self.next_consumer_tag
                );
                self.next_consumer_tag += 1;
                if !self.consumers.contains_key(candidate.as_str()) {
                    break Arc::from(candidate);
                }
            }
        } else {
            Arc::from(consume.consumer_tag.as_str())
        };
        if self.consumers.contains_key(&tag) {
            return Err(AmqpError::not_allowed(format!(
                "attempt to reuse consumer tag '{tag}'"
            )));
        }
        let name = self.queue_name(consume.queue.as_str())?;
        let queue = context.vhost.queue(&name, context.connection_id)?;
        check_consume_arguments(
            &consume.arguments,
            &format!("queue '{}' in vhost '{}'", queue.name(), queue.vhost_name()),
        )?;
        // Validated as an integer; RabbitMQ accepts any width, so a priority
        // beyond i32 is clamped rather than refused.
        let priority = consume
            .arguments
            .inner()
            .get("x-priority")
            .and_then(as_integer)
            .map_or(0, |priority| {
                priority.clamp(i32::MIN as i64, i32::MAX as i64) as i32
            });
        let consumer = Arc::new(Consumer {
            tag: Arc::clone(&tag),
            channel_id: self.id,
            connection_id: context.connection_id,
            no_ack: consume.no_ack,
            exclusive: consume.exclusive,
            priority,
            prefetch_count: self.consumer_prefetch,
            unacked: AtomicU32::new(0),
            sink: self.deliveries.clone(),
        });
        queue.add_consumer(consumer, &mut || {
            if !consume.nowait {
                self.reply(
                    context,
                    AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(basic::ConsumeOk {
                        consumer_tag: tag.as_ref().into(),
                    })),
                );
            }
        })?;
        self.consumers.insert(
            Arc::clone(&tag),
            ChannelConsumer {
                queue: Arc::clone(&queue),
            },
        );
        queue.dispatch();
        Ok(())
    }

    /// basic.consume on `amq.rabbitmq.reply-to`, with RabbitMQ's checks in
    /// RabbitMQ's order.
    fn consume_replies(
        &mut self,
        context: &ConnectionContext,
        consume: basic::Consume,
    ) -> AmqpResult<()> {
        let requested = consume.consumer_tag.as_str();
        if self.consumers.contains_key(requested) {
            return Err(AmqpError::not_allowed(format!(
                "attempt to reuse consumer tag '{requested}'"
            )));
        }
        if !consume.no_ack {
            return Err(AmqpError::precondition_failed(
                "reply consumer cannot acknowledge",
            ));
        }
        if self.reply_consumer.is_some() {
            return Err(AmqpError::precondition_failed("reply consumer already set"));
        }
        let tag: Arc<str> = if requested.is_empty() {
            let tag = format!(
                "amq.ctag-{}-{}",
                context.connection_id, self.next_consumer_tag
            );
            self.next_consumer_tag += 1;
            Arc::from(tag)
        } else {
            Arc::from(requested)
        };
        let token = context
            .broker
            .reply_to
            .register(Arc::clone(&tag), self.deliveries.clone());
        self.reply_consumer = Some(ReplyConsumer {
            tag: Arc::clone(&tag),
            token,
        });
        if !consume.nowait {
            self.reply(
                context,
                AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(basic::ConsumeOk {
                    consumer_tag: tag.as_ref().into(),
                })),
            );
        }
        Ok(())
    }

    fn cancel_reply_consumer(&mut self, context: &ConnectionContext) {
        if let Some(consumer) = self.reply_consumer.take() {
            context.broker.reply_to.unregister(&consumer.token);
        }
    }

    /// Removes a consumer from its queue. Returns the queue when it is a
    /// single-active-consumer queue whose active consumer this was: the
    /// caller dispatches it, after requeueing what is to be requeued.
    fn cancel_consumer(
        &mut self,
        context: &ConnectionContext,
        tag: &str,
    ) -> Option<Arc<dyn Queue>> {
        // Cancelling an unknown tag succeeds, as in RabbitMQ.
        let entry = self.consumers.remove(tag)?;
        let removed = entry
            .queue
            .remove_consumer(context.connection_id, self.id, tag)?;
        if removed.queue_now_unused {
            context.vhost.remove_queue(&entry.queue);
        }
        removed.active_consumer_changed.then_some(entry.queue)
    }

    fn handle_tx_method(
        &mut self,
        context: &ConnectionContext,
        method: tx::AMQPMethod,
    ) -> AmqpResult<()> {
        match method {
            tx::AMQPMethod::Select(_) => {
                if self.confirms.is_some() {
                    return Err(AmqpError::precondition_failed(
                        "cannot switch from confirm to tx mode",
                    ));
                }
                self.tx.get_or_insert_with(Transaction::default);
                self.reply(
                    context,
                    AMQPClass::Tx(tx::AMQPMethod::SelectOk(tx::SelectOk {})),
                );
            }
            tx::AMQPMethod::Commit(_) => {
                let Some(transaction) = self.tx.as_mut() else {
                    return Err(AmqpError::precondition_failed(
                        "channel is not transactional",
                    ));
                };
                let operations = std::mem::take(&mut transaction.operations);
                transaction.body_bytes = 0;
                // Leave tx mode while applying, so the operations take effect
                // instead of being buffered again.
                let transaction = self.tx.take();
                self.committing.get_or_insert_with(Default::default).replies += 1;
                let result = self.apply_transaction(context, operations);
                self.tx = transaction;
                if result.is_err() {
                    // The channel closes with the error: no commit-ok is owed.
                    self.committing = None;
                }
                result?;
                // Commit-ok now if nothing waits for the disk, else once the
                // sync round has it (the connection flushes this channel).
                self.settle_commit(context)?;
            }
            tx::AMQPMethod::Rollback(_) => {
                let Some(transaction) = self.tx.as_mut() else {
                    return Err(AmqpError::precondition_failed(
                        "channel is not transactional",
                    ));
                };
                let operations = std::mem::take(&mut transaction.operations);
                transaction.body_bytes = 0;
                self.restore_held_acks(operations);
                self.reply(
                    context,
                    AMQPClass::Tx(tx::AMQPMethod::RollbackOk(tx::RollbackOk {})),
                );
            }
            other => {
                return Err(AmqpError::command_invalid(format!(
                    "unexpected method tx.{}",
                    AMQPClass::Tx(other).get_amqp_method_id()
                )))
            }
        }
        Ok(())
    }

    fn apply_transaction(
        &mut self,
        context: &ConnectionContext,
        operations: Vec<TxOperation>,
    ) -> AmqpResult<()> {
        for operation in operations {
            match operation {
                TxOperation::Publish(message, publish) => {
                    self.route_and_enqueue(context, message, &publish)?
                }
                TxOperation::Settle {
                    mut settled,
                    requeue,
                } => {
                    self.deliveries.release_held(&settled);
                    let others_wait = self.deliveries.take_channel_prefetch_refusal();
                    self.finish_settle(&mut settled, requeue, others_wait);
                }
            }
        }
        Ok(())
    }

    /// The messages a transaction's acks, nacks and rejects took are
    /// unacked again (rollback, or the channel closing).
    fn restore_held_acks(&mut self, operations: Vec<TxOperation>) {
        let held: Vec<Unacked> = operations
            .into_iter()
            .flat_map(|operation| match operation {
                TxOperation::Settle { settled, .. } => settled,
                TxOperation::Publish(..) => Vec::new(),
            })
            .collect();
        if !held.is_empty() {
            self.deliveries.restore(held);
        }
    }

    /// Closes the channel's side of things: consumers cancelled (auto-delete
    /// queues that lose their last consumer go), unacked messages back to
    /// their queues in order, marked redelivered.
    pub fn release(&mut self, context: &ConnectionContext) {
        context.stats.channel_closed(self.id);
        self.cancel_reply_consumer(context);
        // Acks of an uncommitted transaction never happened: their messages
        // are requeued with the other unacked ones.
        if let Some(transaction) = self.tx.take() {
            self.restore_held_acks(transaction.operations);
        }
        let unacked = self.deliveries.close();
        // Requeued before this channel's consumers go, while a
        // single-active-consumer queue's active consumer is still this
        // (closed) one and takes nothing: its successor, promoted below,
        // then gets the old one's unacked messages before anything behind
        // them, as RabbitMQ's `handle_ch_down` requeues before it runs the
        // queue. Requeued after the promotion, a publish or the pager on
        // another thread could deliver newer messages to it first.
        requeue_by_queue(unacked);
        let tags: Vec<Arc<str>> = self.consumers.keys().cloned().collect();
        let mut new_active: Vec<Arc<dyn Queue>> = Vec::new();
        for tag in tags {
            if let Some(queue) = self.cancel_consumer(context, &tag) {
                new_active.push(queue);
            }
        }
        for queue in new_active {
            queue.dispatch();
        }
        self.content = None;
        self.tx = None;
    }
}

/// Acked (or rejected) messages, settled by id with one call (one lock)
/// per run of the same queue. `ids` is a buffer the channel reuses.
fn settle_by_queue(
    acked: &[Unacked],
    rejected: bool,
    settled_queues: &mut Vec<Arc<dyn Queue>>,
    ids: &mut Vec<MessageId>,
) {
    let mut start = 0;
    while start < acked.len() {
        let queue = &acked[start].queue;
        ids.clear();
        ids.extend(
            acked[start..]
                .iter()
                .take_while(|entry| same_queue(&entry.queue, queue))
                .map(|entry| entry.message_id),
        );
        if rejected {
            queue.reject(ids);
        } else {
            queue.settle(ids);
        }
        if !settled_queues.iter().any(|known| same_queue(known, queue)) {
            settled_queues.push(Arc::clone(queue));
        }
        start += ids.len();
    }
    ids.clear();
}

/// Requeued messages, handed back per queue in their original order.
fn requeue_by_queue(requeued: impl IntoIterator<Item = Unacked>) {
    let mut by_queue: HashMap<*const (), (Arc<dyn Queue>, Vec<MessageId>)> = HashMap::new();
    for entry in requeued {
        by_queue
            .entry(Arc::as_ptr(&entry.queue) as *const ())
            .or_insert_with(|| (Arc::clone(&entry.queue), Vec::new()))
            .1
            .push(entry.message_id);
    }
    for (_, (queue, ids)) in by_queue {
        queue.requeue(&ids);
    }
}
