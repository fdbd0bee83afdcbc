//! What a quorum queue's log holds, and what applying it asks of the
//! member that applied it.

use serde::{Deserialize, Serialize};

/// A consumer, as every member names it: the channel it reads through and
/// its tag.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ConsumerId {
    pub connection: u64,
    pub channel: u16,
    pub tag: String,
}

/// A delivery, within its consumer: what that consumer settles it by.
pub type DeliveryId = u64;

/// A message as the state machine holds it: where its body is (the index
/// of the log entry that enqueued it), and what the queue's rules need.
/// Written as a tuple, not a map: a deep queue's snapshot holds millions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "MessageTuple", into = "MessageTuple")]
pub struct MessageRef {
    /// The log index of its enqueue: names the message on every member.
    pub index: u64,
    /// Body bytes, for `x-max-length-bytes`.
    pub size: u32,
    /// When it expires (log time, milliseconds), if it does.
    pub expires_at_ms: Option<u64>,
    /// Times it went back to the queue after a delivery (RabbitMQ's
    /// `x-delivery-count`).
    pub delivery_count: u32,
}

/// [`MessageRef`]'s fields in order, as it is written.
#[derive(Clone, Copy, Serialize, Deserialize)]
struct MessageTuple(u64, u32, Option<u64>, u32);

impl From<MessageTuple> for MessageRef {
    fn from(MessageTuple(index, size, expires_at_ms, delivery_count): MessageTuple) -> Self {
        MessageRef {
            index,
            size,
            expires_at_ms,
            delivery_count,
        }
    }
}

impl From<MessageRef> for MessageTuple {
    fn from(message: MessageRef) -> Self {
        MessageTuple(
            message.index,
            message.size,
            message.expires_at_ms,
            message.delivery_count,
        )
    }
}

/// How a consumer takes messages.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerSpec {
    /// Deliveries it may hold unsettled; 0 is unlimited.
    pub prefetch: u32,
    /// Settled as soon as delivered (basic.consume with no-ack).
    pub no_ack: bool,
    /// `x-priority`: higher goes first while it has credit.
    pub priority: i32,
}

/// What happens past `x-max-length` / `x-max-length-bytes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Overflow {
    /// The oldest ready messages are dropped (dead-lettered `maxlen`).
    #[default]
    DropHead,
    /// New messages are refused: publishers with confirms get a nack.
    RejectPublish,
}

/// The queue's rules, from its arguments and policies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueConfig {
    pub max_length: Option<u64>,
    pub max_length_bytes: Option<u64>,
    pub overflow: Overflow,
    /// `x-delivery-limit`: a message returned more often than this is
    /// dead-lettered (`delivery_limit`) instead.
    pub delivery_limit: Option<u32>,
    /// `x-expires`, milliseconds: the queue goes once unused this long.
    #[serde(default)]
    pub expires_ms: Option<u64>,
    /// `x-message-ttl`, milliseconds.
    pub message_ttl_ms: Option<u64>,
    pub single_active_consumer: bool,
    /// `x-dead-letter-strategy: at-least-once` (with a dead-letter exchange
    /// and `reject-publish`): a dead-lettered message stays in the queue,
    /// counted against its length limits, until the leader has it safe in
    /// its dead-letter targets.
    #[serde(default)]
    pub dead_letter_at_least_once: bool,
}

/// One entry of the queue's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A message, from `publisher` with its sequence number when the
    /// publisher may send it again (a resend after a leader change is
    /// recognised and not enqueued twice). `ttl_ms` is the message's own
    /// expiration property.
    Enqueue {
        publisher: Option<(u64, u64)>,
        size: u32,
        ttl_ms: Option<u64>,
    },
    /// A consumer subscribes.
    Checkout {
        consumer: ConsumerId,
        spec: ConsumerSpec,
    },
    /// basic.cancel: it gets nothing more; what it holds stays its until
    /// settled or returned.
    Cancel { consumer: ConsumerId },
    /// Acked: gone for good.
    Settle {
        consumer: ConsumerId,
        deliveries: Vec<DeliveryId>,
    },
    /// Requeued (nack or reject with requeue, a closed channel).
    Return {
        consumer: ConsumerId,
        deliveries: Vec<DeliveryId>,
    },
    /// Given to a consumer's member but never to its client (the consumer
    /// went first): back to the queue, first, not counted as delivered.
    Release {
        consumer: ConsumerId,
        deliveries: Vec<DeliveryId>,
    },
    /// Rejected without requeue: dead-lettered (`rejected`).
    Discard {
        consumer: ConsumerId,
        deliveries: Vec<DeliveryId>,
    },
    /// The consumers of a connection are gone (it closed, or its node
    /// died): removed, their deliveries returned.
    ConnectionDown { connection: u64 },
    /// basic.get: the next ready message, settled at once (`settled`, for
    /// no-ack) or held by the getter's channel under `consumer` (a tag no
    /// subscription has) until it settles it.
    Dequeue { consumer: ConsumerId, settled: bool },
    /// The node numbered `node` went down: every consumer of its
    /// connections is gone, its deliveries returned.
    NodeDown { node: u16 },
    /// One consumer is gone, its deliveries returned: the member it read
    /// through left the queue's members, and it heard basic.cancel.
    ConsumerDown { consumer: ConsumerId },
    /// queue.purge: every ready message dropped.
    Purge,
    /// Time passed (expiry is judged by log time, the same on every
    /// member).
    Tick,
    /// The queue was used without a consumer: redeclared (its
    /// `x-expires` countdown starts again).
    Touch,
    /// At-least-once dead-lettering: the messages enqueued at `indexes`
    /// are safe in their dead-letter targets and leave the queue.
    DeadLettered { indexes: Vec<u64> },
    /// A policy change gave the queue new rules (RabbitMQ's
    /// `update_config`). Every member that applies the policy change
    /// proposes it, under the node's count of policy changes
    /// (`generation`); the machine keeps the newest and skips the others,
    /// so the change applies once, at the same entry on every member.
    SetConfig {
        config: QueueConfig,
        generation: u64,
    },
}

/// Why a message left the queue other than by an ack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeadLetterReason {
    Expired,
    Rejected,
    MaxLen,
    DeliveryLimit,
}

impl DeadLetterReason {
    /// RabbitMQ's name in `x-death`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::Expired => "expired",
            DeadLetterReason::Rejected => "rejected",
            DeadLetterReason::MaxLen => "maxlen",
            DeadLetterReason::DeliveryLimit => "delivery_limit",
        }
    }
}

/// What applying an entry asks of the member: deliveries to send (by the
/// member serving that consumer), messages to dead-letter or drop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    Deliver {
        consumer: ConsumerId,
        delivery: DeliveryId,
        message: MessageRef,
    },
    DeadLetter {
        reason: DeadLetterReason,
        message: MessageRef,
    },
}

/// The answer to an entry, for whoever proposed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Ok,
    /// The enqueue went in (or had gone in already: a resend).
    Enqueued,
    /// `reject-publish`: the queue is full.
    Rejected,
    /// The number of messages a purge dropped.
    Purged(u64),
    /// basic.get's message (with its delivery, to settle it by) and the
    /// count of ready messages left; None when there was none.
    Dequeued(Option<(DeliveryId, MessageRef, u64)>),
    /// A settlement named deliveries the consumer does not hold, or a
    /// consumer the queue does not know.
    Unknown,
}
