//! The queue interface: what every kind of queue does for the channels and
//! the vhost that use it, and what it asks of them in return.
//!
//! One behaviour, many kinds, as RabbitMQ's `rabbit_queue_type`: a channel
//! publishes into, consumes from and settles with any queue through
//! [`Queue`], and never knows its kind. A queue owns the messages it
//! delivered until they are settled; the channel keeps only delivery tag →
//! queue and message id, so that a queue can take back a dead consumer's
//! messages by itself. What follows from an operation beyond the queue
//! (messages to dead-letter, the queue expiring) goes to its
//! [`QueueHost`], the vhost, which routes it: a queue never reaches into
//! the vhost's tables.
//!
//! The kinds: [`crate::classic_queue`] now; [`crate::queue_type`] names
//! them and [`crate::queue_factory`] builds the one a declaration asks for.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use amq_protocol::types::FieldTable;

use crate::confirm::PendingSafety;
use crate::counters::MessageCounts;
use crate::dead_letter::{DeadLetter, DeadLetterTarget};
use crate::error::{AmqpError, AmqpResult};
use crate::message::{Message, QueuedMessage};
use crate::queue_type::QueueType;
use forwarding::{ConsumerKey, ForwardHome, QueueKey};

pub mod forwarding;

/// Identifies a connection within this node, for exclusive queues and
/// exclusive consumers.
pub type ConnectionId = u64;

/// Names a message within its queue while it is out with a consumer: what
/// a channel settles it by.
pub type MessageId = u64;

/// What a queue was declared with; compared on redeclaration.
#[derive(Clone, Debug)]
pub struct QueueOptions {
    pub durable: bool,
    pub exclusive_owner: Option<ConnectionId>,
    pub auto_delete: bool,
    pub arguments: FieldTable,
    /// The index of the metadata log entry that declared it: tells this
    /// queue from an earlier or later one of the same name. 0 for a queue
    /// made outside the metadata log.
    pub declared_at: u64,
    /// The run of its home node that declared it (see
    /// [`crate::metadata::NodeIdentity::incarnation`]).
    pub home_incarnation: u64,
    /// A quorum queue's members and their ids (see
    /// [`crate::definitions::QueueDefinition::members`]); shared by the
    /// queue and its vhost, which changes it in place as the metadata log
    /// adds and removes members. Empty for other kinds.
    pub members: crate::quorum_members::SharedMembership,
}

/// What became of a message offered to a queue.
#[derive(Clone)]
pub enum PublishOutcome {
    /// In the queue, and as safe as it needs to be: confirm it now.
    Enqueued,
    /// In the queue, and safe once this is kept (a persistent message in a
    /// durable queue: once its journal is fsynced).
    Pending(PendingSafety),
    /// The queue is full and its overflow is reject-publish, or it cannot
    /// keep the message safe: publishers with confirms get a nack.
    Rejected,
    /// The queue's home node is down: the message is not in it, and
    /// counts as routed nowhere (mandatory returns it), as in RabbitMQ.
    Unavailable,
}

/// The outcome of removing a consumer.
pub struct ConsumerRemoved {
    pub consumer: Arc<Consumer>,
    /// True when this was the last consumer of an auto-delete queue: the
    /// caller deletes the queue.
    pub queue_now_unused: bool,
    /// A single-active-consumer queue lost its active consumer and another
    /// took over: the caller dispatches once the removed consumer's unacked
    /// messages, if they are to be requeued, are back, so that the new
    /// active consumer receives them first and in order.
    pub active_consumer_changed: bool,
}

/// A queue's counts at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Ready messages, as queue.declare-ok and basic.get-ok count them.
    pub messages_ready: u32,
    /// Ready messages whose bodies are on disk only.
    pub messages_paged: u32,
    /// Delivered or fetched and not yet settled.
    pub messages_unacknowledged: u64,
    /// Body bytes of the ready messages.
    pub ready_bytes: u64,
    pub consumers: u32,
}

/// What the vhost does for its queues: the effects of a queue's operations
/// that reach beyond it. Called with no queue locked.
pub trait QueueHost: Send + Sync {
    /// Routes what `queue` dead-lettered to `target`'s exchange.
    fn dead_letter(&self, queue: &str, target: &DeadLetterTarget, dead_letters: Vec<DeadLetter>);

    /// Routes as [`QueueHost::dead_letter`] does and returns each target
    /// queue's word on its copy, for at-least-once dead-lettering; None
    /// when some message reached no queue (the exchange is missing or
    /// routes it nowhere), to be tried again later.
    fn dead_letter_tracked(
        &self,
        queue: &str,
        target: &DeadLetterTarget,
        dead_letters: Vec<DeadLetter>,
    ) -> Option<Vec<PublishOutcome>>;

    /// `queue` went unused for its `x-expires`: delete it, if it still is.
    fn expire(&self, queue: &Arc<dyn Queue>);
}

/// Where a queue hands its messages: the channel of a consumer. A queue
/// calls it with its own lock held, so an implementation must not call back
/// into any queue.
pub trait DeliverySink: Send + Sync {
    /// Delivers `entry` to `consumer`; false when the consumer cannot take
    /// it now (prefetch reached, channel flow off, output buffer full). A
    /// sink that refuses must retry dispatch on the queues of its consumers
    /// once it can take messages again. A delivery that needs an ack is
    /// settled later by `entry.offset`, its [`MessageId`], on the queue
    /// `queue` hands out (called only for such a delivery).
    fn deliver(
        &self,
        consumer: &Arc<Consumer>,
        queue: &dyn Fn() -> Arc<dyn Queue>,
        entry: &QueuedMessage,
    ) -> bool;

    /// The queue cancelled this consumer (the queue was deleted): the sink
    /// tells the client with basic.cancel.
    fn cancelled_by_queue(&self, consumer: &Arc<Consumer>);
}

/// One basic.consume subscription.
pub struct Consumer {
    pub tag: Arc<str>,
    pub channel_id: u16,
    pub connection_id: ConnectionId,
    /// Messages need no ack: they are settled as soon as they are sent.
    pub no_ack: bool,
    pub exclusive: bool,
    /// `x-priority`: higher goes first while it has prefetch room.
    pub priority: i32,
    /// Per-consumer prefetch (basic.qos with global=false) fixed when the
    /// consumer started, as in RabbitMQ; 0 is unlimited.
    pub prefetch_count: u32,
    /// Deliveries not yet acked, for the per-consumer prefetch.
    pub unacked: AtomicU32,
    pub sink: Arc<dyn DeliverySink>,
}

impl Consumer {
    /// Room under the per-consumer prefetch; channel-wide limits are the
    /// sink's business.
    pub fn has_prefetch_room(&self) -> bool {
        self.no_ack
            || self.prefetch_count == 0
            || self.unacked.load(Ordering::Acquire) < self.prefetch_count
    }
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Consumer")
            .field("tag", &self.tag)
            .field("channel_id", &self.channel_id)
            .field("connection_id", &self.connection_id)
            .field("no_ack", &self.no_ack)
            .field("priority", &self.priority)
            .finish()
    }
}

/// A queue of any kind, as channels and the vhost use it.
pub trait Queue: Send + Sync {
    fn name(&self) -> &Arc<str>;

    /// The name of the vhost it lives in.
    fn vhost_name(&self) -> &Arc<str>;

    fn queue_type(&self) -> QueueType;

    /// The flags and the arguments it was declared with.
    fn options(&self) -> &QueueOptions;

    /// The name the metadata gave a durable queue's journal directory (on
    /// its home node, where its messages live); None for a queue that does
    /// not outlive its node.
    fn store_id(&self) -> Option<&str>;

    /// The node the queue lives on, when not this one.
    fn home_node(&self) -> Option<&Arc<str>> {
        None
    }

    /// A basic.get found the queue empty: counted where the queue keeps its
    /// counters (a queue of another node is counted there, not here).
    fn count_get_empty(&self) {}

    /// A replicated queue's leader, as this node knows it; None for a
    /// queue that has no leader (a classic queue lives on its home node).
    fn leader(&self) -> Option<String> {
        None
    }

    /// Why this node cannot serve the queue's messages, when it cannot
    /// (see [`crate::remote_queue`]).
    fn unavailable(&self) -> Option<AmqpError> {
        None
    }

    /// For a queue whose messages live on another node reachable now: the
    /// way there and the queue's name on it. Consuming, basic.get, purging
    /// and counting such a queue wait for that node's answer, through it.
    fn forwarded(&self) -> Option<(Arc<dyn ForwardHome>, QueueKey)> {
        None
    }

    /// Appends a message and delivers what consumers can take.
    fn publish(&self, message: Arc<Message>) -> PublishOutcome;

    /// Delivers ready messages to consumers with room. Sinks call this
    /// after refusing a delivery, once they have room again.
    fn dispatch(&self);

    /// Registers a consumer. `announce` runs under the queue's lock once
    /// the checks have passed and before the consumer can be given
    /// anything: the caller writes consume-ok there, so no delivery (from a
    /// publish, an ack or a timer on another thread) can overtake it, as
    /// the queue process itself sends consume-ok in RabbitMQ. The caller
    /// dispatches once its own bookkeeping of the consumer is done.
    ///
    /// # Errors
    /// 404 when the queue was deleted meanwhile; 403 when an exclusive
    /// consumer is in the way.
    fn add_consumer(&self, consumer: Arc<Consumer>, announce: &mut dyn FnMut()) -> AmqpResult<()>;

    fn remove_consumer(
        &self,
        connection_id: ConnectionId,
        channel_id: u16,
        tag: &str,
    ) -> Option<ConsumerRemoved>;

    /// The tag of the consumer receiving messages in a single-active-consumer
    /// queue; None in other queues and while it has no consumer.
    fn active_consumer_tag(&self) -> Option<Arc<str>>;

    /// Whether a consumer of this queue reads through `connection_id`: that
    /// connection must never be paused for this queue, or it would stop
    /// reading the acks that drain it.
    fn has_consumer_on(&self, connection_id: ConnectionId) -> bool;

    /// Consumers acked these messages: they leave the queue for good. The
    /// ack freed prefetch room, so the queue delivers what it can.
    fn settle(&self, messages: &[MessageId]);

    /// Consumers rejected these messages without requeue: they leave the
    /// queue, dead-lettered (reason `rejected`) where the queue says so.
    fn reject(&self, messages: &[MessageId]);

    /// Puts messages back at their original positions, marked redelivered,
    /// and delivers them again.
    fn requeue(&self, messages: &[MessageId]);

    /// basic.get: the head message and the count left behind it. Unless
    /// `no_ack`, it stays the queue's until settled by its offset.
    fn get(&self, no_ack: bool) -> Option<(QueuedMessage, u32)>;

    /// Drops every ready message; messages out with consumers stay out.
    fn purge(&self) -> u32;

    /// Marks the queue deleted and empties it. Returns the consumers, whom
    /// the caller notifies with basic.cancel, and the number of ready
    /// messages dropped.
    fn delete(&self) -> (Vec<Arc<Consumer>>, u32);

    /// As [`Queue::delete`], for this node's object of a queue that goes
    /// on elsewhere: a quorum queue's member on a node that left its
    /// members, to be replaced here by `successor`. What its consumers
    /// held goes back to the queue through `successor`, since this object
    /// can no longer settle it.
    fn retire(&self, _successor: &Arc<dyn Queue>) -> (Vec<Arc<Consumer>>, u32) {
        self.delete()
    }

    /// The consumers `gone` are gone from a quorum queue, what they held
    /// returned (see [`Queue::retire`]). Nothing for other kinds.
    fn consumers_gone(&self, _gone: &[ConsumerKey]) {}

    fn is_deleted(&self) -> bool;

    fn stats(&self) -> QueueStats;

    /// Messages taken in, delivered, redelivered, acked and dropped since
    /// the queue was created (or the node started).
    fn counts(&self) -> MessageCounts;

    /// Ready messages, as queue.declare-ok and basic.get-ok count them.
    fn message_count(&self) -> u32 {
        self.stats().messages_ready
    }

    fn consumer_count(&self) -> u32 {
        self.stats().consumers
    }

    /// The queue was used (redeclared, or read with basic.get): its
    /// `x-expires` countdown starts again.
    fn touch(&self);

    /// Whether the queue went unused for its `x-expires`.
    fn is_unused_for_expiry(&self) -> bool;

    /// Starts what the queue does with time, once it is shared and its
    /// bindings are in place.
    fn start_timers(&self);

    /// A policy change gave the queue new effective arguments (declared,
    /// merged with the policy that applies now): it takes on their limits,
    /// TTL, expiry and dead-lettering from here, as RabbitMQ's queues do
    /// on `policy_changed`. `generation` orders the changes (see
    /// [`crate::broker::Broker::policy_generation`]). Nothing to do for a
    /// queue held by another node: its home applies the change itself.
    fn apply_policy(&self, _effective_arguments: &FieldTable, _generation: u64) {}

    /// The node numbered `node_number` went down: a queue that keeps
    /// consumers of other nodes takes back what they held.
    fn node_down(&self, _node_number: u16) {}

    /// Whether publishers into this queue should pause: it has consumers
    /// and they are not keeping up, or its storage is behind.
    fn is_congested(&self) -> bool;

    /// Resolves when the queue stops being congested; create it before
    /// checking [`Queue::is_congested`] so no wake-up is missed.
    fn uncongested(&self) -> tokio::sync::futures::Notified<'_>;

    fn is_exclusive(&self) -> bool {
        self.options().exclusive_owner.is_some()
    }

    /// Exclusive queues are usable only by the connection that declared them.
    ///
    /// # Errors
    /// 405 RESOURCE_LOCKED for any other connection.
    fn check_access(&self, connection_id: ConnectionId) -> AmqpResult<()> {
        match self.options().exclusive_owner {
            Some(owner) if owner != connection_id => Err(AmqpError::resource_locked(format!(
                "cannot obtain exclusive access to locked queue '{}' in vhost '{}'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.",
                self.name(),
                self.vhost_name()
            ))),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Debug for dyn Queue {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Queue")
            .field("name", self.name())
            .field("vhost", self.vhost_name())
            .field("type", &self.queue_type())
            .field("options", self.options())
            .finish()
    }
}

/// Whether two handles are the same queue.
pub fn same_queue(a: &Arc<dyn Queue>, b: &Arc<dyn Queue>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}
