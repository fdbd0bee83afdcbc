//! A queue this node knows from the metadata but does not hold: one homed
//! on another node of the cluster, or one of its own whose journal could
//! not be opened. It has a name, options and a home for routing tables,
//! redeclarations and snapshots; every operation on its messages is
//! refused with the reason.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::counters::MessageCounts;
use crate::error::{AmqpError, AmqpResult};
use crate::message::{Message, QueuedMessage};
use crate::metadata::MetadataProposer;
use crate::queue::{
    Consumer, ConsumerRemoved, MessageId, PublishOutcome, Queue, QueueOptions, QueueStats,
};
use crate::queue_type::QueueType;
use sluice_wire::reply_code::ReplyCode;

/// Why this node cannot serve the queue's messages.
#[derive(Clone)]
pub enum Unreachable {
    /// Homed on another node: operations on its messages are not yet
    /// forwarded there. The cluster's view of that node says whether it is
    /// up.
    OtherNode(Arc<MetadataProposer>),
    /// Homed here, but its journal could not be opened: the reason.
    LocalStorage(String),
}

pub struct RemoteQueue {
    name: Arc<str>,
    vhost: Arc<str>,
    queue_type: QueueType,
    options: QueueOptions,
    home: Arc<str>,
    store_id: Option<String>,
    unreachable: Unreachable,
    deleted: AtomicBool,
    /// Never notified: a queue with no messages here is never congested.
    uncongested: Notify,
}

impl RemoteQueue {
    pub fn new(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        home: Arc<str>,
        store_id: Option<String>,
        unreachable: Unreachable,
    ) -> Self {
        let queue_type = QueueType::of_arguments(&options.arguments).unwrap_or(QueueType::Classic);
        RemoteQueue {
            name,
            vhost,
            queue_type,
            options,
            home,
            store_id,
            unreachable,
            deleted: AtomicBool::new(false),
            uncongested: Notify::new(),
        }
    }

    /// The error an operation on this queue's messages gets.
    fn refusal(&self) -> AmqpError {
        match &self.unreachable {
            // RabbitMQ's words for a classic queue whose node is gone.
            Unreachable::OtherNode(cluster) if !cluster.is_node_up(&self.home) => {
                AmqpError::not_found(format!(
                    "home node '{}' of {} queue '{}' in vhost '{}' is down or inaccessible",
                    self.home,
                    if self.options.durable { "durable" } else { "non-durable" },
                    self.name,
                    self.vhost
                ))
            }
            Unreachable::OtherNode(_) => AmqpError::not_implemented(format!(
                "queue '{}' in vhost '{}' is on node '{}': using a queue of another node is not supported yet",
                self.name, self.vhost, self.home
            )),
            Unreachable::LocalStorage(reason) => AmqpError::new(
                ReplyCode::InternalError,
                format!(
                    "queue '{}' in vhost '{}' is unavailable: {reason}",
                    self.name, self.vhost
                ),
            ),
        }
    }
}

impl Queue for RemoteQueue {
    fn name(&self) -> &Arc<str> {
        &self.name
    }

    fn vhost_name(&self) -> &Arc<str> {
        &self.vhost
    }

    fn queue_type(&self) -> QueueType {
        self.queue_type
    }

    fn options(&self) -> &QueueOptions {
        &self.options
    }

    fn store_id(&self) -> Option<&str> {
        self.store_id.as_deref()
    }

    fn home_node(&self) -> Option<&Arc<str>> {
        Some(&self.home)
    }

    fn unavailable(&self) -> Option<AmqpError> {
        Some(self.refusal())
    }

    /// Refused: with confirms the publisher gets a nack rather than a
    /// silent loss.
    fn publish(&self, _message: Arc<Message>) -> PublishOutcome {
        PublishOutcome::Rejected
    }

    fn dispatch(&self) {}

    fn add_consumer(
        &self,
        _consumer: Arc<Consumer>,
        _announce: &mut dyn FnMut(),
    ) -> AmqpResult<()> {
        Err(self.refusal())
    }

    fn remove_consumer(
        &self,
        _connection_id: crate::queue::ConnectionId,
        _channel_id: u16,
        _tag: &str,
    ) -> Option<ConsumerRemoved> {
        None
    }

    fn active_consumer_tag(&self) -> Option<Arc<str>> {
        None
    }

    fn has_consumer_on(&self, _connection_id: crate::queue::ConnectionId) -> bool {
        false
    }

    fn settle(&self, _messages: &[MessageId]) {}

    fn reject(&self, _messages: &[MessageId]) {}

    fn requeue(&self, _messages: &[MessageId]) {}

    fn get(&self, _no_ack: bool) -> Option<(QueuedMessage, u32)> {
        None
    }

    fn purge(&self) -> u32 {
        0
    }

    fn delete(&self) -> (Vec<Arc<Consumer>>, u32) {
        self.deleted.store(true, Ordering::Release);
        (Vec::new(), 0)
    }

    fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    fn stats(&self) -> QueueStats {
        QueueStats::default()
    }

    fn counts(&self) -> MessageCounts {
        MessageCounts::default()
    }

    fn touch(&self) {}

    fn is_unused_for_expiry(&self) -> bool {
        false
    }

    fn start_timers(&self) {}

    fn is_congested(&self) -> bool {
        false
    }

    fn uncongested(&self) -> tokio::sync::futures::Notified<'_> {
        self.uncongested.notified()
    }
}
