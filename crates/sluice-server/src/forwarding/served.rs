//! The home node's side of forwarding: what it does for one peer's clients
//! on one link. Their publishes go into its queues and are answered in
//! order once safe; their consumers are consumers of its queues, fed
//! through a [`ProxySink`] within the credit the peer grants; the messages
//! they hold are remembered, so that when the link goes down they are
//! requeued and the consumers removed, as for a client connection that
//! died.
//!
//! Locks here are leaves: a queue delivering calls a sink with its own
//! lock held, so nothing here calls a queue while holding one of these.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use sluice_core::broker::Broker;
use sluice_core::confirm::{ConfirmStatus, ConfirmTicket};
use sluice_core::error::AmqpError;
use sluice_core::message::{Message, QueuedMessage};
use sluice_core::queue::forwarding::{ConsumerKey, QueueKey, Settlement};
use sluice_core::queue::{Consumer, DeliverySink, MessageId, PublishOutcome, Queue};

use super::lane::Lane;
use super::wire::{ConsumeRequest, Op};

/// Deliveries a remote consumer may have on their way before its node
/// grants more, as RabbitMQ's credit flow between a queue and a channel.
pub const CONSUMER_CREDIT: u32 = 400;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A consumer of one of this node's queues on a client of the peer.
struct ServedConsumer {
    queue: Arc<dyn Queue>,
    consumer: Arc<Consumer>,
    sink: Arc<ProxySink>,
}

/// A forwarded publish not answered yet.
struct WaitingAnswer {
    sequence: u64,
    ticket: ConfirmTicket,
    /// Queues that were congested once they took it: the answer, which
    /// returns the peer's publishing credit, waits until they are not, so
    /// that a remote publisher is held to the rate the queue drains at.
    congested: Vec<Arc<dyn Queue>>,
}

#[derive(Default)]
struct Answers {
    /// Publishes received on this link.
    received: u64,
    waiting: VecDeque<WaitingAnswer>,
}

pub struct Served {
    broker: Arc<Broker>,
    lane: Arc<Lane>,
    consumers: Mutex<HashMap<u64, ServedConsumer>>,
    /// Messages out with the peer's clients, by queue: message id →
    /// consumer (0 for basic.get). What the peer settles must be here, and
    /// what is here when the link goes down is requeued.
    outstanding: Mutex<HashMap<QueueKey, HashMap<MessageId, u64>>>,
    answers: Mutex<Answers>,
    /// Set first when the link ends: what a peer's operation still under
    /// way adds after that (a consumer, a message out) is undone at once,
    /// so nothing outlives the session.
    ended: AtomicBool,
}

impl Served {
    pub fn new(broker: Arc<Broker>, lane: Arc<Lane>) -> Self {
        Served {
            broker,
            lane,
            consumers: Mutex::new(HashMap::new()),
            outstanding: Mutex::new(HashMap::new()),
            answers: Mutex::new(Answers::default()),
            ended: AtomicBool::new(false),
        }
    }

    fn queue(&self, key: &QueueKey) -> Option<Arc<dyn Queue>> {
        self.broker
            .vhost(&key.vhost)?
            .home_queue(&key.name, key.declared_at)
    }

    fn no_queue(key: &QueueKey) -> AmqpError {
        AmqpError::not_found(format!("no queue '{}' in vhost '{}'", key.name, key.vhost))
    }

    fn fail(&self, request: u64, error: &AmqpError) {
        self.lane.send(&Op::Failed {
            request,
            code: error.code.code(),
            text: error.text.to_string(),
        });
    }

    /// A message for some of this node's queues. A queue deleted since the
    /// peer routed it takes nothing, as a queue deleted under a local
    /// publisher.
    pub fn publish(&self, targets: &[QueueKey], message: &Arc<Message>) {
        let mut ticket = ConfirmTicket::default();
        let mut congested = Vec::new();
        for key in targets {
            let Some(queue) = self.queue(key) else {
                continue;
            };
            match queue.publish(Arc::clone(message)) {
                PublishOutcome::Enqueued | PublishOutcome::Unavailable => {}
                PublishOutcome::Pending(safety) => ticket.wait_for(safety),
                PublishOutcome::Rejected => ticket.refuse(),
            }
            if queue.is_congested() {
                congested.push(queue);
            }
        }
        let mut answers = lock(&self.answers);
        answers.received += 1;
        let sequence = answers.received;
        answers.waiting.push_back(WaitingAnswer {
            sequence,
            ticket,
            congested,
        });
    }

    /// Answers the publishes, oldest first, that are settled and no longer
    /// held by a congested queue. Returns a queue the oldest unanswered one
    /// waits on to drain, if that is what holds it.
    pub fn answer(&self) -> Option<Arc<dyn Queue>> {
        let mut through = None;
        let mut refused = Vec::new();
        let mut held_by = None;
        {
            let mut answers = lock(&self.answers);
            while let Some(head) = answers.waiting.front_mut() {
                let status = head.ticket.status();
                if status == ConfirmStatus::Pending {
                    break;
                }
                head.congested.retain(|queue| queue.is_congested());
                if let Some(queue) = head.congested.first() {
                    held_by = Some(Arc::clone(queue));
                    break;
                }
                if status == ConfirmStatus::Refused {
                    refused.push(head.sequence);
                }
                through = Some(head.sequence);
                answers.waiting.pop_front();
            }
        }
        if let Some(through) = through {
            self.lane.send(&Op::Answers { through, refused });
        }
        held_by
    }

    pub fn consume(self: &Arc<Self>, request: ConsumeRequest) {
        let Some(queue) = self.queue(&request.key) else {
            self.fail(request.consumer, &Self::no_queue(&request.key));
            return;
        };
        let sink = Arc::new(ProxySink {
            consumer: request.consumer,
            key: request.key.clone(),
            credit: AtomicU32::new(CONSUMER_CREDIT),
            served: Arc::downgrade(self),
        });
        let consumer = Arc::new(Consumer {
            tag: request.tag,
            channel_id: request.channel_id,
            connection_id: request.connection_id,
            no_ack: request.no_ack,
            exclusive: request.exclusive,
            priority: request.priority,
            prefetch_count: request.prefetch_count,
            unacked: AtomicU32::new(0),
            sink: Arc::clone(&sink) as Arc<dyn DeliverySink>,
        });
        lock(&self.consumers).insert(
            request.consumer,
            ServedConsumer {
                queue: Arc::clone(&queue),
                consumer: Arc::clone(&consumer),
                sink,
            },
        );
        let lane = &self.lane;
        let added = queue.add_consumer(consumer, &mut || {
            lane.send(&Op::ConsumeOk {
                consumer: request.consumer,
            })
        });
        match added {
            Ok(()) if self.ended.load(Ordering::SeqCst) => {
                let served = lock(&self.consumers).remove(&request.consumer);
                if let Some(served) = served {
                    self.remove_from_queue(&served);
                }
            }
            Ok(()) => queue.dispatch(),
            Err(error) => {
                lock(&self.consumers).remove(&request.consumer);
                self.fail(request.consumer, &error);
            }
        }
    }

    pub fn cancel(&self, consumer: u64) {
        let Some(served) = lock(&self.consumers).remove(&consumer) else {
            return;
        };
        self.remove_from_queue(&served);
    }

    /// Takes a consumer of the peer off its queue; an auto-delete queue it
    /// leaves unused is deleted, as when a local consumer leaves.
    fn remove_from_queue(&self, served: &ServedConsumer) {
        let consumer = &served.consumer;
        let Some(removed) = served.queue.remove_consumer(
            consumer.connection_id,
            consumer.channel_id,
            &consumer.tag,
        ) else {
            return;
        };
        if removed.queue_now_unused {
            if let Some(vhost) = self.broker.vhost(served.queue.vhost_name()) {
                vhost.propose_queue_deletion(&served.queue);
            }
        }
        if removed.active_consumer_changed {
            served.queue.dispatch();
        }
    }

    pub fn credit(&self, consumer: u64, amount: u32) {
        let queue = {
            let consumers = lock(&self.consumers);
            let Some(served) = consumers.get(&consumer) else {
                return;
            };
            served.sink.credit.fetch_add(amount, Ordering::AcqRel);
            Arc::clone(&served.queue)
        };
        queue.dispatch();
    }

    pub fn settle(&self, key: &QueueKey, settlement: Settlement, messages: &[MessageId]) {
        let mut settled = Vec::with_capacity(messages.len());
        let mut holders = Vec::new();
        {
            let mut outstanding = lock(&self.outstanding);
            let Some(of_queue) = outstanding.get_mut(key) else {
                return;
            };
            for id in messages {
                // Only what this link delivered and nothing settled it yet:
                // a message requeued when an earlier link died may be out
                // with someone else by now.
                if let Some(consumer) = of_queue.remove(id) {
                    settled.push(*id);
                    if consumer != 0 {
                        holders.push(consumer);
                    }
                }
            }
            if of_queue.is_empty() {
                outstanding.remove(key);
            }
        }
        if settled.is_empty() {
            return;
        }
        {
            let consumers = lock(&self.consumers);
            for holder in holders {
                if let Some(served) = consumers.get(&holder) {
                    served.consumer.unacked.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        let Some(queue) = self.queue(key) else {
            return;
        };
        match settlement {
            Settlement::Ack => queue.settle(&settled),
            Settlement::Reject => queue.reject(&settled),
            Settlement::Requeue => {
                settled.sort_unstable();
                queue.requeue(&settled);
            }
        }
        queue.dispatch();
    }

    /// Consumers of the peer's whose member there left quorum queue `key`'s
    /// members: this node's member returns what they held.
    pub fn consumers_gone(&self, key: &QueueKey, gone: &[ConsumerKey]) {
        match self.queue(key) {
            Some(queue) => queue.consumers_gone(gone),
            None => {
                tracing::warn!(queue = %key.name, vhost = %key.vhost, "consumers gone from a queue not found here")
            }
        }
    }

    pub fn get(self: &Arc<Self>, request: u64, key: &QueueKey, no_ack: bool) {
        let Some(queue) = self.queue(key) else {
            self.fail(request, &Self::no_queue(key));
            return;
        };
        queue.touch();
        // A queue whose basic.get waits for its log (a quorum queue)
        // answers when it has.
        if let Some((log, local_key)) = queue.forwarded() {
            let (served, key) = (Arc::clone(self), key.clone());
            tokio::spawn(async move {
                match log.get(local_key, no_ack).await {
                    Ok(got) => served.answer_get(request, &key, queue.as_ref(), got, no_ack),
                    Err(error) => served.fail(request, &error),
                }
            });
            return;
        }
        let got = queue.get(no_ack);
        self.answer_get(request, key, queue.as_ref(), got, no_ack);
    }

    fn answer_get(
        &self,
        request: u64,
        key: &QueueKey,
        queue: &dyn Queue,
        got: Option<(QueuedMessage, u32)>,
        no_ack: bool,
    ) {
        match got {
            Some((entry, remaining)) => {
                if !no_ack && !self.hold(key, entry.offset, 0) {
                    queue.requeue(&[entry.offset]);
                    return;
                }
                self.lane.send(&Op::GetOk {
                    request,
                    message_id: entry.offset,
                    redelivered: entry.redelivered,
                    remaining,
                    message: entry.message,
                });
            }
            None => self.lane.send(&Op::GetEmpty { request }),
        }
    }

    pub fn purge(self: &Arc<Self>, request: u64, key: &QueueKey) {
        let Some(queue) = self.queue(key) else {
            self.fail(request, &Self::no_queue(key));
            return;
        };
        if let Some((log, local_key)) = queue.forwarded() {
            let served = Arc::clone(self);
            tokio::spawn(async move {
                match log.purge(local_key).await {
                    Ok(count) => served.lane.send(&Op::Purged { request, count }),
                    Err(error) => served.fail(request, &error),
                }
            });
            return;
        }
        self.lane.send(&Op::Purged {
            request,
            count: queue.purge(),
        });
    }

    pub fn stats(&self, request: u64, key: &QueueKey) {
        match self.queue(key) {
            Some(queue) => {
                let stats = queue.stats();
                self.lane.send(&Op::Counted {
                    request,
                    messages: stats.messages_ready,
                    consumers: stats.consumers,
                });
            }
            None => self.fail(request, &Self::no_queue(key)),
        }
    }

    /// Records a message as out with the peer's client `consumer` (0 for
    /// basic.get); false once the session ended, when it must go back.
    fn hold(&self, key: &QueueKey, message: MessageId, consumer: u64) -> bool {
        let mut outstanding = lock(&self.outstanding);
        if self.ended.load(Ordering::SeqCst) {
            return false;
        }
        // Looked up first: the key is cloned only for a queue's first
        // message out, not for every delivery.
        match outstanding.get_mut(key) {
            Some(of_queue) => {
                of_queue.insert(message, consumer);
            }
            None => {
                outstanding.insert(key.clone(), HashMap::from([(message, consumer)]));
            }
        }
        true
    }

    /// Lets every queue with a consumer of the peer deliver again (the
    /// lane drained after refusing a delivery).
    pub fn dispatch_all(&self) {
        let queues: Vec<Arc<dyn Queue>> = lock(&self.consumers)
            .values()
            .map(|served| Arc::clone(&served.queue))
            .collect();
        for queue in queues {
            queue.dispatch();
        }
    }

    /// The link is gone: the peer's consumers leave their queues and the
    /// messages its clients held go back, as when a client connection
    /// dies.
    pub fn end(&self) {
        {
            let _outstanding = lock(&self.outstanding);
            self.ended.store(true, Ordering::SeqCst);
        }
        let consumers: Vec<ServedConsumer> = lock(&self.consumers)
            .drain()
            .map(|(_, served)| served)
            .collect();
        for served in &consumers {
            self.remove_from_queue(served);
        }
        let outstanding = std::mem::take(&mut *lock(&self.outstanding));
        for (key, messages) in outstanding {
            let Some(queue) = self.queue(&key) else {
                continue;
            };
            let mut ids: Vec<MessageId> = messages.into_keys().collect();
            ids.sort_unstable();
            queue.requeue(&ids);
            queue.dispatch();
        }
        lock(&self.answers).waiting.clear();
    }
}

/// Where a queue of this node hands messages for a consumer on a peer: onto
/// the lane to that peer, within the credit the peer granted.
pub struct ProxySink {
    consumer: u64,
    key: QueueKey,
    credit: AtomicU32,
    served: Weak<Served>,
}

impl DeliverySink for ProxySink {
    fn deliver(
        &self,
        consumer: &Arc<Consumer>,
        _queue: &dyn Fn() -> Arc<dyn Queue>,
        entry: &QueuedMessage,
    ) -> bool {
        let Some(served) = self.served.upgrade() else {
            return false;
        };
        if self.credit.load(Ordering::Acquire) == 0 {
            return false;
        }
        // Recorded before it is sent: the peer's ack may come back before
        // this thread runs again.
        if !consumer.no_ack && !served.hold(&self.key, entry.offset, self.consumer) {
            return false;
        }
        let sent = served.lane.send_delivery(&Op::Deliver {
            consumer: self.consumer,
            message_id: entry.offset,
            redelivered: entry.redelivered,
            message: Arc::clone(&entry.message),
        });
        if !sent {
            if !consumer.no_ack {
                if let Some(of_queue) = lock(&served.outstanding).get_mut(&self.key) {
                    of_queue.remove(&entry.offset);
                }
            }
            return false;
        }
        self.credit.fetch_sub(1, Ordering::AcqRel);
        if !consumer.no_ack {
            consumer.unacked.fetch_add(1, Ordering::AcqRel);
        }
        true
    }

    fn cancelled_by_queue(&self, _consumer: &Arc<Consumer>) {
        let Some(served) = self.served.upgrade() else {
            return;
        };
        lock(&served.consumers).remove(&self.consumer);
        // What it was delivered is settled by no one through this node any
        // more: the queue was deleted, or its member here left the members
        // and had it returned. The peer's late settlements of these ids
        // must not reach whatever serves the queue here now.
        if let Some(of_queue) = lock(&served.outstanding).get_mut(&self.key) {
            of_queue.retain(|_, holder| *holder != self.consumer);
        }
        served.lane.send(&Op::Cancelled {
            consumer: self.consumer,
        });
    }
}
