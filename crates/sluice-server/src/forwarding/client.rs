//! The client's side of forwarding: what this node has under way with one
//! peer's queues on one link. Publishes wait for the peer's answers (the
//! publisher's confirms, and the credit that bounds them); consumers are
//! proxies whose deliveries go to their channel, or wait here while it has
//! no room; requests wait for their reply. When the link goes down all of
//! it ends: publishes are nacked, consumers cancelled, requests failed.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use sluice_core::confirm::ForwardedConfirm;
use sluice_core::error::{AmqpError, AmqpResult};
use sluice_core::expiry::NEVER;
use sluice_core::message::QueuedMessage;
use sluice_core::queue::forwarding::{QueueKey, Settlement};
use sluice_core::queue::{ConnectionId, Consumer, MessageId, Queue, QueueStats};
use sluice_wire::reply_code::ReplyCode;
use tokio::sync::oneshot;

use super::lane::Lane;
use super::served::CONSUMER_CREDIT;
use super::wire::Op;

/// Credit is returned to the home node in batches of this many deliveries.
const CREDIT_BATCH: u32 = CONSUMER_CREDIT / 4;

/// A consumer of a queue on the peer, on one of this node's channels.
pub struct Proxy {
    pub key: QueueKey,
    pub queue: Arc<dyn Queue>,
    pub consumer: Arc<Consumer>,
    /// Writes consume-ok; run when the home node accepts.
    announce: Option<Box<dyn FnOnce() + Send>>,
    started: Option<oneshot::Sender<AmqpResult<()>>>,
    /// Deliveries its channel had no room for, oldest first; at most the
    /// credit the home node was given.
    parked: VecDeque<QueuedMessage>,
    /// Deliveries handed to the channel and not yet credited back.
    to_grant: u32,
}

/// A request's reply, or the reason there is none.
pub type RequestReply = oneshot::Sender<Op>;

/// A publish sent and not answered yet.
struct InFlight {
    sequence: u64,
    confirm: Arc<ForwardedConfirm>,
    bytes: usize,
}

#[derive(Default)]
pub struct ClientSide {
    next_id: u64,
    published: u64,
    in_flight: VecDeque<InFlight>,
    pub in_flight_bytes: usize,
    proxies: HashMap<u64, Proxy>,
    requests: HashMap<u64, RequestReply>,
    /// The link ended: whatever a caller that still held the session
    /// starts now fails at once rather than wait for an answer that will
    /// never come.
    ended: bool,
}

impl ClientSide {
    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub fn in_flight_count(&self) -> usize {
        self.in_flight.len()
    }

    pub fn publish(&mut self, lane: &Lane, op: &Op, bytes: usize) -> Arc<ForwardedConfirm> {
        let confirm = Arc::new(ForwardedConfirm::default());
        if self.ended {
            confirm.refuse();
            return confirm;
        }
        self.published += 1;
        self.in_flight.push_back(InFlight {
            sequence: self.published,
            confirm: Arc::clone(&confirm),
            bytes,
        });
        self.in_flight_bytes += bytes;
        lane.send(op);
        confirm
    }

    pub fn answers(&mut self, through: u64, refused: &[u64]) {
        while let Some(head) = self.in_flight.front() {
            if head.sequence > through {
                break;
            }
            let head = self.in_flight.pop_front().expect("checked");
            self.in_flight_bytes -= head.bytes;
            if refused.contains(&head.sequence) {
                head.confirm.refuse();
            } else {
                head.confirm.confirm();
            }
        }
    }

    pub fn consume(
        &mut self,
        lane: &Lane,
        queue: Arc<dyn Queue>,
        key: QueueKey,
        consumer: Arc<Consumer>,
        announce: Box<dyn FnOnce() + Send>,
    ) -> oneshot::Receiver<AmqpResult<()>> {
        let id = self.next_id();
        let (started, reply) = oneshot::channel();
        if self.ended {
            // Dropped: the caller hears that the home node is gone.
            return reply;
        }
        lane.send(&Op::Consume(super::wire::ConsumeRequest {
            consumer: id,
            key: key.clone(),
            tag: Arc::clone(&consumer.tag),
            connection_id: consumer.connection_id,
            channel_id: consumer.channel_id,
            no_ack: consumer.no_ack,
            exclusive: consumer.exclusive,
            priority: consumer.priority,
            prefetch_count: consumer.prefetch_count,
        }));
        self.proxies.insert(
            id,
            Proxy {
                key,
                queue,
                consumer,
                announce: Some(announce),
                started: Some(started),
                parked: VecDeque::new(),
                to_grant: 0,
            },
        );
        reply
    }

    pub fn consume_ok(&mut self, id: u64) {
        let Some(proxy) = self.proxies.get_mut(&id) else {
            return;
        };
        if let Some(announce) = proxy.announce.take() {
            announce();
        }
        if let Some(started) = proxy.started.take() {
            let _ = started.send(Ok(()));
        }
    }

    /// A request or a consume refused by the home node, in its words.
    pub fn failed(&mut self, id: u64, code: u16, text: String) {
        if let Some(mut proxy) = self.proxies.remove(&id) {
            if let Some(started) = proxy.started.take() {
                let _ = started.send(Err(refusal(code, text)));
            }
            return;
        }
        if let Some(reply) = self.requests.remove(&id) {
            let _ = reply.send(Op::Failed {
                request: id,
                code,
                text,
            });
        }
    }

    pub fn request(&mut self, lane: &Lane, make: impl FnOnce(u64) -> Op) -> oneshot::Receiver<Op> {
        let id = self.next_id();
        let (reply, receiver) = oneshot::channel();
        if self.ended {
            return receiver;
        }
        self.requests.insert(id, reply);
        lane.send(&make(id));
        receiver
    }

    pub fn reply(&mut self, id: u64, op: Op) {
        if let Some(reply) = self.requests.remove(&id) {
            let _ = reply.send(op);
        }
    }

    /// A delivery for a proxy: to its channel now, or parked until the
    /// channel has room.
    pub fn deliver(&mut self, lane: &Lane, id: u64, entry: QueuedMessage) {
        let Some(proxy) = self.proxies.get_mut(&id) else {
            return;
        };
        if proxy.parked.is_empty() && hand_over(proxy, &entry) {
            grant(lane, id, proxy, 1);
        } else {
            proxy.parked.push_back(entry);
        }
    }

    /// Hands parked deliveries of `key`'s proxies to their channels while
    /// they take them.
    pub fn dispatch(&mut self, lane: &Lane, key: &QueueKey) {
        for (id, proxy) in self.proxies.iter_mut() {
            if proxy.key != *key || proxy.parked.is_empty() {
                continue;
            }
            let mut handed = 0;
            while let Some(entry) = proxy.parked.front() {
                if !hand_over(proxy, entry) {
                    break;
                }
                proxy.parked.pop_front();
                handed += 1;
            }
            grant(lane, *id, proxy, handed);
        }
    }

    /// Removes the proxy of a consumer; what it had parked goes back to
    /// the queue (a no-ack consumer's parked messages are gone, as
    /// messages on their way to a no-ack consumer whose channel closes).
    pub fn cancel(
        &mut self,
        lane: &Lane,
        key: &QueueKey,
        connection_id: ConnectionId,
        channel_id: u16,
        tag: &str,
    ) -> Option<Arc<Consumer>> {
        let id = self.proxies.iter().find_map(|(id, proxy)| {
            let consumer = &proxy.consumer;
            (proxy.key == *key
                && consumer.connection_id == connection_id
                && consumer.channel_id == channel_id
                && *consumer.tag == *tag)
                .then_some(*id)
        })?;
        let proxy = self.proxies.remove(&id)?;
        lane.send(&Op::Cancel { consumer: id });
        return_parked(lane, &proxy);
        Some(proxy.consumer)
    }

    /// The home node cancelled a consumer (its queue was deleted).
    pub fn cancelled(&mut self, id: u64) -> Option<Arc<Consumer>> {
        let mut proxy = self.proxies.remove(&id)?;
        if let Some(started) = proxy.started.take() {
            let _ = started.send(Err(AmqpError::not_found(format!(
                "queue '{}' in vhost '{}' was deleted",
                proxy.key.name, proxy.key.vhost
            ))));
            return None;
        }
        Some(proxy.consumer)
    }

    pub fn forget_queue(&mut self, key: &QueueKey) -> Vec<Arc<Consumer>> {
        let ids: Vec<u64> = self
            .proxies
            .iter()
            .filter(|(_, proxy)| proxy.key == *key)
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter()
            .filter_map(|id| self.proxies.remove(&id))
            .filter(|proxy| proxy.started.is_none())
            .map(|proxy| proxy.consumer)
            .collect()
    }

    pub fn has_consumer_on(&self, key: &QueueKey, connection_id: ConnectionId) -> bool {
        self.proxies
            .values()
            .any(|proxy| proxy.key == *key && proxy.consumer.connection_id == connection_id)
    }

    /// The link ended: every publish is nacked, every request and consume
    /// under way fails with `error`; returns the consumers that had
    /// started, for basic.cancel.
    pub fn end(&mut self, error: &AmqpError) -> Vec<Arc<Consumer>> {
        self.ended = true;
        for in_flight in self.in_flight.drain(..) {
            in_flight.confirm.refuse();
        }
        self.in_flight_bytes = 0;
        self.requests.clear();
        let mut cancelled = Vec::new();
        for (_, mut proxy) in self.proxies.drain() {
            match proxy.started.take() {
                Some(started) => {
                    let _ = started.send(Err(error.clone()));
                }
                None => cancelled.push(proxy.consumer),
            }
        }
        cancelled
    }
}

fn hand_over(proxy: &Proxy, entry: &QueuedMessage) -> bool {
    let queue = &proxy.queue;
    proxy
        .consumer
        .sink
        .deliver(&proxy.consumer, &|| Arc::clone(queue), entry)
}

/// Credits deliveries handed to the channel back to the home node, in
/// batches.
fn grant(lane: &Lane, id: u64, proxy: &mut Proxy, handed: u32) {
    proxy.to_grant += handed;
    if proxy.to_grant >= CREDIT_BATCH {
        lane.send(&Op::Credit {
            consumer: id,
            amount: proxy.to_grant,
        });
        proxy.to_grant = 0;
    }
}

fn return_parked(lane: &Lane, proxy: &Proxy) {
    if proxy.consumer.no_ack || proxy.parked.is_empty() {
        return;
    }
    lane.send(&Op::Settle {
        key: proxy.key.clone(),
        settlement: Settlement::Requeue,
        messages: proxy.parked.iter().map(|entry| entry.offset).collect(),
    });
}

/// A delivered message as this node's channels hold it.
pub fn delivered(
    message_id: MessageId,
    redelivered: bool,
    message: Arc<sluice_core::message::Message>,
) -> QueuedMessage {
    QueuedMessage {
        offset: message_id,
        message,
        redelivered,
        segment: None,
        expires_at_us: NEVER,
    }
}

/// The error a request gets when the link to the home node is down or goes
/// down before the answer.
pub fn home_down(home: &str, key: &QueueKey) -> AmqpError {
    AmqpError::not_found(format!(
        "home node '{home}' of queue '{}' in vhost '{}' is down or inaccessible",
        key.name, key.vhost
    ))
}

/// A request's reply as the caller wants it, or the home node's refusal.
pub fn reply_or_error(reply: Op) -> AmqpResult<Op> {
    match reply {
        Op::Failed { code, text, .. } => Err(refusal(code, text)),
        other => Ok(other),
    }
}

/// The home node's AMQP reply, as this node's channel fails with it.
fn refusal(code: u16, text: String) -> AmqpError {
    AmqpError::new(
        ReplyCode::from_code(code).unwrap_or(ReplyCode::InternalError),
        text,
    )
}

/// The stats a Counted reply carries.
pub fn counted(messages: u32, consumers: u32) -> QueueStats {
    QueueStats {
        messages_ready: messages,
        consumers,
        ..QueueStats::default()
    }
}
