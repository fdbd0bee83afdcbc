//! A queue this node knows from the metadata but does not hold: one homed
//! on another node of the cluster, or one of its own whose journal could
//! not be opened. It has a name, options and a home for routing tables,
//! redeclarations and snapshots. Operations on the messages of a queue
//! homed elsewhere are carried to its home node (see
//! [`crate::queue::forwarding`]) while the link there is up; otherwise, and for a
//! queue whose storage failed, they are refused with the reason.
//!
//! A quorum queue this node holds no member of can be served by any of its
//! members: while the link to the home member is down, operations go to
//! another member whose link is up, and stay with it while it is.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::Notify;

use crate::counters::MessageCounts;
use crate::error::{AmqpError, AmqpResult};
use crate::message::{Message, QueuedMessage};
use crate::metadata::MetadataProposer;
use crate::queue::forwarding::{ConsumerKey, ForwardHome, QueueKey, Settlement};
use crate::queue::{
    Consumer, ConsumerRemoved, MessageId, PublishOutcome, Queue, QueueOptions, QueueStats,
};
use crate::queue_type::QueueType;
use sluice_wire::reply_code::ReplyCode;

/// Why this node cannot serve the queue's messages.
#[derive(Clone)]
pub enum Unreachable {
    /// Homed on another node: operations on its messages go there while
    /// the link is up. The cluster's view of that node says whether it is.
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
    /// The nodes that can serve it, the home first: the home alone for a
    /// classic queue, every member for a quorum queue.
    servers: Vec<Arc<str>>,
    store_id: Option<String>,
    unreachable: Unreachable,
    key: QueueKey,
    /// The way to each of `servers`, once the node has one (it is
    /// installed after the metadata is first applied).
    links: Vec<OnceLock<Arc<dyn ForwardHome>>>,
    /// The server operations go to now: the home, or while its link is
    /// down, another whose link is up.
    serving: AtomicUsize,
    deleted: AtomicBool,
    /// Never notified: while no link carries its messages, the queue is
    /// never congested.
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
        let key = QueueKey {
            vhost: Arc::clone(&vhost),
            name: Arc::clone(&name),
            declared_at: options.declared_at,
        };
        RemoteQueue {
            key,
            servers: vec![Arc::clone(&home)],
            links: vec![OnceLock::new()],
            serving: AtomicUsize::new(0),
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

    /// A quorum queue's other members serve it too while its home's link
    /// is down: `members` in the group's order (the home among them).
    #[must_use]
    pub fn served_by_members(mut self, members: &[String]) -> Self {
        for member in members {
            if *member != *self.home {
                self.servers.push(Arc::from(member.as_str()));
                self.links.push(OnceLock::new());
            }
        }
        self
    }

    pub fn key(&self) -> &QueueKey {
        &self.key
    }

    /// The way to server `index`, whether or not the link is up.
    fn link(&self, index: usize) -> Option<&Arc<dyn ForwardHome>> {
        if let Some(link) = self.links[index].get() {
            return Some(link);
        }
        let Unreachable::OtherNode(cluster) = &self.unreachable else {
            return None;
        };
        let link = cluster.forward_home(&self.servers[index])?;
        Some(self.links[index].get_or_init(|| link))
    }

    /// The way to the server operations go to now, whether or not the link
    /// is up: consumers were added and messages delivered through it, so
    /// their cancels and settlements go there.
    fn home_link(&self) -> Option<&Arc<dyn ForwardHome>> {
        self.link(self.serving.load(Ordering::Acquire))
    }

    /// The way to a server while the link is up: the one serving now, or
    /// when its link is down, the first other whose link is up, which then
    /// serves from now on. What the old one delivered is its node's to give
    /// back (its consumers here were cancelled when the link went down).
    fn forward(&self) -> Option<&Arc<dyn ForwardHome>> {
        let serving = self.serving.load(Ordering::Acquire);
        if let Some(link) = self.link(serving).filter(|link| link.is_up()) {
            return Some(link);
        }
        let index = (0..self.servers.len())
            .filter(|index| *index != serving)
            .find(|index| self.link(*index).is_some_and(|link| link.is_up()))?;
        self.serving.store(index, Ordering::Release);
        tracing::info!(queue = %self.name, vhost = %self.vhost, node = %self.servers[index], "quorum queue reached through another member");
        self.link(index)
    }

    /// The error an operation on this queue's messages gets.
    fn refusal(&self) -> AmqpError {
        match &self.unreachable {
            // RabbitMQ's words for a classic queue whose node is gone (or
            // not reachable from here, which a client cannot tell apart).
            Unreachable::OtherNode(_) => AmqpError::not_found(format!(
                "home node '{}' of {} queue '{}' in vhost '{}' is down or inaccessible",
                self.home,
                if self.options.durable {
                    "durable"
                } else {
                    "non-durable"
                },
                self.name,
                self.vhost
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
        match self.forward() {
            Some(_) => None,
            None => Some(self.refusal()),
        }
    }

    fn forwarded(&self) -> Option<(Arc<dyn ForwardHome>, QueueKey)> {
        self.forward()
            .map(|link| (Arc::clone(link), self.key.clone()))
    }

    /// Forwarded to the home node. A queue whose node is down takes
    /// nothing: the message counts as routed nowhere, as in RabbitMQ; a
    /// queue whose storage failed refuses it, so a publisher with confirms
    /// gets a nack rather than a silent loss.
    fn publish(&self, message: Arc<Message>) -> PublishOutcome {
        match (self.forward(), &self.unreachable) {
            (Some(link), _) => link.publish(&message, vec![self.key.clone()]),
            (None, Unreachable::OtherNode(_)) => PublishOutcome::Unavailable,
            (None, Unreachable::LocalStorage(_)) => PublishOutcome::Rejected,
        }
    }

    fn dispatch(&self) {
        if let Some(link) = self.forward() {
            link.dispatch(&self.key);
        }
    }

    fn add_consumer(
        &self,
        _consumer: Arc<Consumer>,
        _announce: &mut dyn FnMut(),
    ) -> AmqpResult<()> {
        Err(self.refusal())
    }

    /// Consumers are added through [`Queue::forwarded`], asynchronously.
    fn remove_consumer(
        &self,
        connection_id: crate::queue::ConnectionId,
        channel_id: u16,
        tag: &str,
    ) -> Option<ConsumerRemoved> {
        let consumer = self
            .home_link()?
            .cancel(&self.key, connection_id, channel_id, tag)?;
        // An auto-delete queue left unused is the home node's to delete.
        Some(ConsumerRemoved {
            consumer,
            queue_now_unused: false,
            active_consumer_changed: false,
        })
    }

    fn active_consumer_tag(&self) -> Option<Arc<str>> {
        None
    }

    fn has_consumer_on(&self, connection_id: crate::queue::ConnectionId) -> bool {
        self.home_link()
            .is_some_and(|link| link.has_consumer_on(&self.key, connection_id))
    }

    fn settle(&self, messages: &[MessageId]) {
        if let Some(link) = self.home_link() {
            link.settle(&self.key, Settlement::Ack, messages);
        }
    }

    fn reject(&self, messages: &[MessageId]) {
        if let Some(link) = self.home_link() {
            link.settle(&self.key, Settlement::Reject, messages);
        }
    }

    fn requeue(&self, messages: &[MessageId]) {
        if let Some(link) = self.home_link() {
            link.settle(&self.key, Settlement::Requeue, messages);
        }
    }

    fn get(&self, _no_ack: bool) -> Option<(QueuedMessage, u32)> {
        None
    }

    fn purge(&self) -> u32 {
        0
    }

    /// This node's consumers of it are handed back for basic.cancel; the
    /// home node drops the messages.
    fn delete(&self) -> (Vec<Arc<Consumer>>, u32) {
        self.deleted.store(true, Ordering::Release);
        let consumers = self
            .home_link()
            .map(|link| link.forget_queue(&self.key))
            .unwrap_or_default();
        (consumers, 0)
    }

    fn consumers_gone(&self, gone: &[ConsumerKey]) {
        if let Some(link) = self.forward() {
            link.consumers_gone(&self.key, gone);
        }
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
        self.forward().is_some_and(|link| link.is_congested())
    }

    fn uncongested(&self) -> tokio::sync::futures::Notified<'_> {
        match self.home_link() {
            Some(link) => link.uncongested(),
            None => self.uncongested.notified(),
        }
    }
}
