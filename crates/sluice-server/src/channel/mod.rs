//! One AMQP channel as its connection's reader task sees it: content being
//! assembled, confirm and tx modes, consumers, and the methods that act on
//! exchanges, queues and messages.
//!
//! - `publish`: content assembly and the publish pipeline's outcome;
//!   `confirms`: publisher confirms; `transaction`: tx mode.
//! - `acks`: basic.ack, nack, reject, recover.
//! - `exchange_methods`, `queue_methods`, `basic_methods`: the control
//!   methods of each class; `metadata_change`: those that wait for the
//!   metadata log.

mod acks;
mod basic_methods;
mod confirms;
mod exchange_methods;
mod metadata_change;
mod publish;
mod queue_methods;
mod quorum_commands;
mod transaction;

use acks::requeue_by_queue;
pub use acks::requeue_in_slices;
pub use metadata_change::PendingChange;
use quorum_commands::QuorumCommands;
pub use quorum_commands::QUORUM_COMMANDS_SOFT_LIMIT_DEFAULT;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use amq_protocol::protocol::{channel, confirm, AMQPClass};
use bytes::Bytes;
use sluice_core::confirm::ConfirmTicket;
use sluice_core::counters::{flush_counts, MessageCounts};
use sluice_core::error::{AmqpError, AmqpResult};
use sluice_core::message::Message;
use sluice_core::queue::{MessageId, Queue};
use sluice_core::vhost::counts::{CountedChannel, CountedKey};
use sluice_core::vhost::PublishScratch;
use sluice_wire::content::ContentHeader;
use sluice_wire::encode::encode_control;
use sluice_wire::method::Publish;

use crate::access_check::PublishPermit;
use crate::bodies_under_way::BodyReservation;
use crate::connection_context::ConnectionContext;
use crate::connection_registry::ChannelStatus;
use crate::delivery::{ChannelDeliveries, Unacked};
use crate::uncommitted::HeldByTransaction;

/// A publish whose content header and body frames are still arriving.
struct PendingContent {
    publish: Publish,
    header: Option<ContentHeader>,
    /// A body that arrived whole in one frame: the common case, kept
    /// without allocating a vector of parts.
    single_body: Option<Bytes>,
    body_parts: Vec<Bytes>,
    body_received: usize,
    /// A large body's room among the node's bodies under way; None while
    /// it waits for room, or for a body too small to count.
    room: Option<BodyReservation>,
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

struct Transaction {
    operations: Vec<TxOperation>,
    /// The bytes of its publishes, counted against the bounds on
    /// uncommitted messages.
    held: HeldByTransaction,
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
    /// What the management API shows of this channel.
    status: Arc<ChannelStatus>,
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
    /// A metadata change the last method proposed, not yet handed to the
    /// connection.
    pending_change: Option<PendingChange>,
    publish_scratch: PublishScratch,
    /// The exchange this channel may publish to, checked once per change.
    publish_permit: PublishPermit,
    /// Queues this channel published into that are congested: the
    /// connection stops reading until they drain.
    congested_queues: Vec<Arc<dyn Queue>>,
    /// This channel's messages not applied yet by each quorum queue it
    /// published into (`quorum_commands_soft_limit`).
    quorum_commands: QuorumCommands,
    /// A publish reached the soft limit since the connection last asked.
    soft_limit_reached: bool,
    /// Buffers an ack reuses, so that settling does not allocate.
    settled_scratch: Vec<Unacked>,
    dispatched_scratch: Vec<Arc<dyn Queue>>,
    message_ids_scratch: Vec<MessageId>,
    /// What the publishing side counted (publishes, confirms, acks) since
    /// the connection last flushed it into `deliveries.counters()`: plain
    /// integers, as only the connection's task touches a channel, handed
    /// over once per read batch rather than an atomic add per message.
    unflushed: MessageCounts,
    /// This channel among its vhost's counted channels, until it drops.
    counted_key: Option<CountedKey>,
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
        let counted_key = context
            .vhost
            .counted_channels()
            .register(&(Arc::clone(&deliveries) as Arc<dyn CountedChannel>));
        let status = ChannelStatus::new(&deliveries);
        context.stats.channel_opened(id, Arc::clone(&status));
        Channel {
            id,
            deliveries,
            status,
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
            pending_change: None,
            publish_scratch: PublishScratch::default(),
            publish_permit: PublishPermit::default(),
            congested_queues: Vec::new(),
            quorum_commands: QuorumCommands::new(context.quorum_commands_soft_limit),
            soft_limit_reached: false,
            settled_scratch: Vec::new(),
            dispatched_scratch: Vec::new(),
            message_ids_scratch: Vec::new(),
            unflushed: MessageCounts::default(),
            counted_key: Some(counted_key),
        }
    }

    /// Hands what the publishing side counted to the counters readers see:
    /// at the end of each read batch, and when the channel drops.
    pub fn flush_counts(&mut self) {
        flush_counts(&mut self.unflushed, self.deliveries.counters());
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
            self.status.consumer_removed(&tag);
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

    /// Prefetch room was freed: let this channel's queues deliver again.
    fn dispatch_consumer_queues(&self) {
        for entry in self.consumers.values() {
            entry.queue.dispatch();
        }
    }

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
                self.status.set_confirm();
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
            // As RabbitMQ 3.x: a client may not stop the server's
            // deliveries this way (prefetch does it), and amqp091-go's own
            // tests expect this refusal.
            channel::AMQPMethod::Flow(flow) if !flow.active => {
                Err(AmqpError::not_implemented("active=false"))
            }
            channel::AMQPMethod::Flow(_) => {
                self.reply(
                    context,
                    AMQPClass::Channel(channel::AMQPMethod::FlowOk(channel::FlowOk {
                        active: true,
                    })),
                );
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

    /// Closes the channel's side of things: consumers cancelled (auto-delete
    /// queues that lose their last consumer go), unacked messages back to
    /// their queues in order, marked redelivered.
    pub fn release(&mut self, context: &ConnectionContext) {
        let unacked = self.close_deliveries(context);
        requeue_by_queue(unacked);
        self.finish_release(context);
    }

    /// The first half of [`Self::release`]: the channel takes no more
    /// deliveries, and hands back its unacked messages (with those of an
    /// uncommitted transaction's acks) for the caller to requeue before
    /// [`Self::finish_release`].
    ///
    /// Requeued before this channel's consumers go, while a
    /// single-active-consumer queue's active consumer is still this (closed)
    /// one and takes nothing: its successor, promoted then, gets the old
    /// one's unacked messages before anything behind them, as RabbitMQ's
    /// `handle_ch_down` requeues before it runs the queue. Requeued after the
    /// promotion, a publish or the pager on another thread could deliver
    /// newer messages to it first.
    pub fn close_deliveries(&mut self, context: &ConnectionContext) -> Vec<Unacked> {
        context.stats.channel_closed(self.id);
        self.cancel_reply_consumer(context);
        // Acks of an uncommitted transaction never happened: their messages
        // are requeued with the other unacked ones.
        if let Some(transaction) = self.tx.take() {
            self.restore_held_acks(transaction.operations);
        }
        self.deliveries.close()
    }

    /// The second half of [`Self::release`]: the channel's consumers
    /// cancelled, a single active consumer's successor promoted.
    pub fn finish_release(&mut self, context: &ConnectionContext) {
        let tags: Vec<Arc<str>> = self.consumers.keys().cloned().collect();
        let mut new_active: Vec<Arc<dyn Queue>> = Vec::new();
        for tag in tags {
            #[cfg(test)]
            crate::panic_failpoint::check_release(&tag);
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

impl Drop for Channel {
    /// What the channel counted stays in its vhost's totals.
    fn drop(&mut self) {
        self.flush_counts();
        if let Some(key) = self.counted_key.take() {
            self.deliveries.vhost().counted_channels().retire(key);
        }
    }
}
