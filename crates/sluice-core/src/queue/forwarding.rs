//! Operations on a queue that lives on another node of the cluster,
//! carried to that node. A client may use any queue through any node: the
//! node it is connected to holds a [`crate::remote_queue::RemoteQueue`]
//! for each queue homed elsewhere, and that queue hands what the client
//! does to the home node through a [`ForwardHome`]. The server implements
//! it over the inter-node link; the core only asks.
//!
//! What holds across the link as it holds locally: a publish is confirmed
//! once every target queue has it safe (and nacked when the link to its
//! home goes down first); a consumer gets consume-ok before any delivery,
//! within its prefetch; acks, nacks and rejects reach the message's queue;
//! messages from one publisher reach a queue in the order published.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::error::AmqpResult;
use crate::message::{Message, QueuedMessage};
use crate::queue::{ConnectionId, Consumer, MessageId, PublishOutcome, Queue, QueueStats};

/// A queue as another node names it: by vhost and name, and by the
/// metadata entry that declared it, so that an operation meant for one
/// queue never lands in a later queue of the same name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct QueueKey {
    pub vhost: Arc<str>,
    pub name: Arc<str>,
    pub declared_at: u64,
}

/// A consumer as a queue's members name it, whichever node it reads
/// through: its connection, channel and tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerKey {
    pub connection_id: ConnectionId,
    pub channel_id: u16,
    pub tag: Arc<str>,
}

/// What a client did with messages delivered from a remote queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// basic.ack: gone for good.
    Ack,
    /// basic.nack or reject without requeue: dead-lettered where the
    /// queue says so.
    Reject,
    /// Back to the queue, redelivered: a nack or reject with requeue, a
    /// recover, a closed channel.
    Requeue,
}

/// The answer to a forwarded request, once the home node gave it.
pub type RemoteReply<T> = Pin<Box<dyn Future<Output = AmqpResult<T>> + Send>>;

/// The node's way to the other nodes' queues, installed once its links are
/// up (a cluster of one has none).
pub trait Forwarding: Send + Sync {
    /// The way to the queues homed on `node`.
    fn home(&self, node: &str) -> Option<Arc<dyn ForwardHome>>;
}

/// Carries operations on the queues of one other node. Every call that
/// returns at once queues what it sends; nothing here blocks on the
/// network.
pub trait ForwardHome: Send + Sync {
    /// Whether the link to the home node is up.
    fn is_up(&self) -> bool;

    /// Sends `message` to the home node once, for every queue of
    /// `targets`. Pending until the home node says they all have it safe;
    /// Rejected when the link is down.
    fn publish(&self, message: &Arc<Message>, targets: Vec<QueueKey>) -> PublishOutcome;

    /// Whether publishers into the home node's queues should pause: the
    /// forwarded messages not yet taken in there passed their bound.
    fn is_congested(&self) -> bool;

    /// Resolves when [`Self::is_congested`] may have turned false.
    fn uncongested(&self) -> tokio::sync::futures::Notified<'_>;

    /// Subscribes `consumer` to the queue `key` (this node's handle to it
    /// is `queue`). `announce` runs once the home node accepted it and
    /// before the consumer is handed any message (the caller writes
    /// consume-ok there); the reply is the home node's refusal otherwise.
    fn consume(
        &self,
        queue: Arc<dyn Queue>,
        key: QueueKey,
        consumer: Arc<Consumer>,
        announce: Box<dyn FnOnce() + Send>,
    ) -> RemoteReply<()>;

    /// Removes a consumer; returns it when it was known. Its unacked
    /// messages stay with its channel, as basic.cancel leaves them.
    fn cancel(
        &self,
        key: &QueueKey,
        connection_id: ConnectionId,
        channel_id: u16,
        tag: &str,
    ) -> Option<Arc<Consumer>>;

    /// Forgets every consumer of `key` here (the queue was deleted) and
    /// returns them, for basic.cancel.
    fn forget_queue(&self, key: &QueueKey) -> Vec<Arc<Consumer>>;

    fn has_consumer_on(&self, key: &QueueKey, connection_id: ConnectionId) -> bool;

    /// Hands deliveries that arrived while their channel had no room to
    /// the consumers of `key` that can take them now.
    fn dispatch(&self, key: &QueueKey);

    fn settle(&self, key: &QueueKey, settlement: Settlement, messages: &[MessageId]);

    /// Tells the home node's member of quorum queue `key` that consumers
    /// `gone` are gone, what they held to go back (see
    /// [`crate::queue::Queue::retire`]).
    fn consumers_gone(&self, key: &QueueKey, gone: &[ConsumerKey]);

    /// basic.get on the home node: the message (settled later by its id,
    /// unless `no_ack`) and the count left behind it.
    fn get(&self, key: QueueKey, no_ack: bool) -> RemoteReply<Option<(QueuedMessage, u32)>>;

    fn purge(&self, key: QueueKey) -> RemoteReply<u32>;

    /// The queue's counts, for queue.declare-ok and queue.delete-ok.
    fn stats(&self, key: QueueKey) -> RemoteReply<QueueStats>;
}
