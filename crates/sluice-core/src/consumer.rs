//! Consumers, and the sink a queue delivers into.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::queue::{Queue, QueuedMessage};

/// Identifies a connection within this node, for exclusive queues and
/// exclusive consumers.
pub type ConnectionId = u64;

/// Where a queue hands its messages: the channel of a consumer. A queue
/// calls it with its own lock held, so an implementation must not call back
/// into any queue.
pub trait DeliverySink: Send + Sync {
    /// Delivers `entry` to `consumer`, or hands it back when the consumer
    /// cannot take it now (prefetch reached, channel flow off, output buffer
    /// full). A sink that refuses must retry dispatch on the queues of its
    /// consumers once it can take messages again.
    fn deliver(
        &self,
        consumer: &Arc<Consumer>,
        queue: &Arc<Queue>,
        entry: QueuedMessage,
    ) -> Result<(), QueuedMessage>;

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
