//! Forwarding: clients use any queue through any node. Operations on a
//! queue homed on another node travel there over the link, and deliveries
//! and answers come back (see [`sluice_core::queue::forwarding`] for what holds
//! across it).
//!
//! Per peer, everything under way lives in a [`Session`] tied to one link:
//! this node's requests to the peer's queues ([`client`]) and the peer's
//! requests to this node's queues ([`served`]), and the [`lane`] that
//! carries both ways' operations out, in order. When the link goes down
//! (or is replaced by a new one) the session ends on both nodes, each
//! knowing what the other held: the home node requeues what the peer's
//! clients had not settled and drops their consumers; the client's node
//! nacks publishes not yet confirmed, cancels the consumers and fails
//! requests. Nothing of one link's conversation reaches the next.
//!
//! - [`wire`]: the operations and their encoding.

mod client;
mod lane;
mod served;
pub mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use sluice_cluster::link::{Links, Received};
use sluice_cluster::node_name::NodeName;
use sluice_core::broker::Broker;
use sluice_core::confirm::PendingSafety;
use sluice_core::error::AmqpError;
use sluice_core::message::{Message, QueuedMessage};
use sluice_core::queue::forwarding::{
    ConsumerKey, ForwardHome, Forwarding, QueueKey, RemoteReply, Settlement,
};
use sluice_core::queue::{ConnectionId, Consumer, MessageId, PublishOutcome, Queue, QueueStats};
use tokio::sync::{mpsc, watch, Notify};

use client::ClientSide;
use lane::Lane;
use served::Served;
use wire::{Op, RecordStream, FORWARD_CHANNEL};

/// Forwarded publishes a node may have unanswered per peer, in messages
/// and in bytes: past either, its publishers into that peer's queues pause
/// (their connections stop reading) until answers bring it under half.
pub const PUBLISHES_IN_FLIGHT_MAX: usize = 20_000;
pub const PUBLISH_BYTES_IN_FLIGHT_MAX: usize = 64 * 1024 * 1024;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Everything under way with one peer on one link.
struct Session {
    link: u64,
    lane: Arc<Lane>,
    client: Mutex<ClientSide>,
    served: Arc<Served>,
    /// Joins the peer's frames into records; used by the receiving task
    /// only.
    inbound: Mutex<RecordStream>,
    /// Wakes the task that answers the peer's publishes.
    publishes_received: Notify,
    ended: AtomicBool,
}

/// The way to one peer's queues, and the service of its requests, across
/// the links that come and go.
pub struct PeerForwarding {
    peer: NodeName,
    links: Arc<Links>,
    broker: Arc<Broker>,
    session: Mutex<Option<Arc<Session>>>,
    /// Bumped when forwarded confirms arrive: wakes connections waiting to
    /// send confirms (the same watch the journals' sync rounds bump).
    confirm_progress: Arc<watch::Sender<u64>>,
    /// Mirrors of the session's in-flight publishes, read on every publish.
    in_flight: AtomicUsize,
    in_flight_bytes: AtomicUsize,
    uncongested: Notify,
}

impl PeerForwarding {
    /// The session of the link that is up now; the one of an earlier link
    /// is ended on the way. None while no link is up.
    fn session(&self) -> Option<Arc<Session>> {
        let generation = self.links.generation(&self.peer);
        let mut current = lock(&self.session);
        if let Some(session) = current.as_ref() {
            if Some(session.link) == generation {
                // A session ended on a live link (its stream was corrupt)
                // stays ended until the link is replaced.
                return (!session.ended.load(Ordering::Acquire)).then(|| Arc::clone(session));
            }
        }
        let ended = current.take();
        let fresh = generation.map(|link| self.open_session(link));
        current.clone_from(&fresh);
        drop(current);
        if let Some(ended) = ended {
            self.end_session(&ended);
        }
        fresh
    }

    /// The session a frame of link `link` belongs to; None for a frame of
    /// a link that is gone.
    fn session_of(&self, link: u64) -> Option<Arc<Session>> {
        self.session().filter(|session| session.link == link)
    }

    fn open_session(&self, link: u64) -> Arc<Session> {
        let session = Arc::new_cyclic(|weak: &std::sync::Weak<Session>| {
            let drained = weak.clone();
            let lane = Lane::start(
                Arc::clone(&self.links),
                self.peer.clone(),
                link,
                move || {
                    if let Some(session) = drained.upgrade() {
                        session.served.dispatch_all();
                    }
                },
            );
            Session {
                link,
                served: Arc::new(Served::new(Arc::clone(&self.broker), Arc::clone(&lane))),
                lane,
                client: Mutex::new(ClientSide::default()),
                inbound: Mutex::new(RecordStream::default()),
                publishes_received: Notify::new(),
                ended: AtomicBool::new(false),
            }
        });
        tokio::spawn(answer_publishes(
            Arc::clone(&session),
            self.confirm_progress.subscribe(),
        ));
        tracing::debug!(peer = %self.peer, link, "forwarding session opened");
        session
    }

    fn end_session(&self, session: &Arc<Session>) {
        if session.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        session.lane.close();
        session.publishes_received.notify_one();
        let error =
            AmqpError::not_found(format!("home node '{}' is down or inaccessible", self.peer));
        let cancelled = lock(&session.client).end(&error);
        self.in_flight.store(0, Ordering::Release);
        self.in_flight_bytes.store(0, Ordering::Release);
        for consumer in cancelled {
            consumer.sink.cancelled_by_queue(&consumer);
        }
        session.served.end();
        self.confirm_progress.send_modify(|progress| *progress += 1);
        self.uncongested.notify_waiters();
        tracing::info!(peer = %self.peer, link = session.link, "forwarding session ended with its link");
    }

    fn mirror_in_flight(&self, client: &ClientSide) {
        self.in_flight
            .store(client.in_flight_count(), Ordering::Release);
        self.in_flight_bytes
            .store(client.in_flight_bytes, Ordering::Release);
    }

    /// Handles one record from the peer.
    fn receive(&self, session: &Arc<Session>, op: Op) {
        match op {
            Op::Publish { targets, message } => {
                session.served.publish(&targets, &message);
                session.publishes_received.notify_one();
            }
            Op::Consume(request) => session.served.consume(request),
            Op::Cancel { consumer } => session.served.cancel(consumer),
            Op::Credit { consumer, amount } => session.served.credit(consumer, amount),
            Op::Settle {
                key,
                settlement,
                messages,
            } => session.served.settle(&key, settlement, &messages),
            Op::ConsumersGone { key, gone } => session.served.consumers_gone(&key, &gone),
            Op::Get {
                request,
                key,
                no_ack,
            } => session.served.get(request, &key, no_ack),
            Op::Purge { request, key } => session.served.purge(request, &key),
            Op::Stats { request, key } => session.served.stats(request, &key),
            Op::Answers { through, refused } => {
                {
                    let mut client = lock(&session.client);
                    client.answers(through, &refused);
                    self.mirror_in_flight(&client);
                }
                self.confirm_progress.send_modify(|progress| *progress += 1);
                if !self.is_congested() {
                    self.uncongested.notify_waiters();
                }
            }
            Op::ConsumeOk { consumer } => lock(&session.client).consume_ok(consumer),
            Op::Failed {
                request,
                code,
                text,
            } => lock(&session.client).failed(request, code, text),
            Op::Deliver {
                consumer,
                message_id,
                redelivered,
                message,
            } => lock(&session.client).deliver(
                &session.lane,
                consumer,
                client::delivered(message_id, redelivered, message),
            ),
            Op::Cancelled { consumer } => {
                let cancelled = lock(&session.client).cancelled(consumer);
                if let Some(consumer) = cancelled {
                    consumer.sink.cancelled_by_queue(&consumer);
                }
            }
            reply @ (Op::GetOk { request, .. }
            | Op::GetEmpty { request }
            | Op::Purged { request, .. }
            | Op::Counted { request, .. }) => lock(&session.client).reply(request, reply),
        }
    }

    /// Sends a request and waits for its reply; the link going down first
    /// fails it.
    fn request(&self, key: &QueueKey, make: impl FnOnce(u64) -> Op) -> RemoteReply<Op> {
        let home_down = client::home_down(self.peer.as_str(), key);
        let Some(session) = self.session() else {
            return Box::pin(std::future::ready(Err(home_down)));
        };
        let receiver = lock(&session.client).request(&session.lane, make);
        Box::pin(async move {
            match receiver.await {
                Ok(reply) => client::reply_or_error(reply),
                Err(_) => Err(home_down),
            }
        })
    }
}

impl ForwardHome for PeerForwarding {
    fn is_up(&self) -> bool {
        self.links.generation(&self.peer).is_some()
    }

    fn publish(&self, message: &Arc<Message>, targets: Vec<QueueKey>) -> PublishOutcome {
        let Some(session) = self.session() else {
            return PublishOutcome::Unavailable;
        };
        let bytes = message.body_size();
        let op = Op::Publish {
            targets,
            message: Arc::clone(message),
        };
        let confirm = {
            let mut client = lock(&session.client);
            let confirm = client.publish(&session.lane, &op, bytes);
            self.mirror_in_flight(&client);
            confirm
        };
        PublishOutcome::Pending(PendingSafety::Forwarded(confirm))
    }

    fn is_congested(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) >= PUBLISHES_IN_FLIGHT_MAX
            || self.in_flight_bytes.load(Ordering::Acquire) >= PUBLISH_BYTES_IN_FLIGHT_MAX
    }

    fn uncongested(&self) -> tokio::sync::futures::Notified<'_> {
        self.uncongested.notified()
    }

    fn consume(
        &self,
        queue: Arc<dyn Queue>,
        key: QueueKey,
        consumer: Arc<Consumer>,
        announce: Box<dyn FnOnce() + Send>,
    ) -> RemoteReply<()> {
        let home_down = client::home_down(self.peer.as_str(), &key);
        let Some(session) = self.session() else {
            return Box::pin(std::future::ready(Err(home_down)));
        };
        let started = lock(&session.client).consume(&session.lane, queue, key, consumer, announce);
        Box::pin(async move { started.await.unwrap_or(Err(home_down)) })
    }

    fn cancel(
        &self,
        key: &QueueKey,
        connection_id: ConnectionId,
        channel_id: u16,
        tag: &str,
    ) -> Option<Arc<Consumer>> {
        let session = lock(&self.session).clone()?;
        let cancelled =
            lock(&session.client).cancel(&session.lane, key, connection_id, channel_id, tag);
        cancelled
    }

    fn forget_queue(&self, key: &QueueKey) -> Vec<Arc<Consumer>> {
        let session = lock(&self.session).clone();
        match session {
            Some(session) => lock(&session.client).forget_queue(key),
            None => Vec::new(),
        }
    }

    fn has_consumer_on(&self, key: &QueueKey, connection_id: ConnectionId) -> bool {
        let Some(session) = lock(&self.session).clone() else {
            return false;
        };
        let has = lock(&session.client).has_consumer_on(key, connection_id);
        has
    }

    fn dispatch(&self, key: &QueueKey) {
        let session = lock(&self.session).clone();
        if let Some(session) = session {
            lock(&session.client).dispatch(&session.lane, key);
        }
    }

    fn settle(&self, key: &QueueKey, settlement: Settlement, messages: &[MessageId]) {
        // Settlements for a link that is gone are dropped: the home node
        // requeued those messages when it went.
        let session = lock(&self.session).clone();
        if let Some(session) = session {
            session.lane.send(&Op::Settle {
                key: key.clone(),
                settlement,
                messages: messages.to_vec(),
            });
        }
    }

    fn consumers_gone(&self, key: &QueueKey, gone: &[ConsumerKey]) {
        // The first thing this node may send the peer (its consumers read
        // through its own member until now), so the session opens here.
        // Dropped with a link that is down: the peer then takes this node
        // for down, and its consumers with it.
        if let Some(session) = self.session() {
            session.lane.send(&Op::ConsumersGone {
                key: key.clone(),
                gone: gone.to_vec(),
            });
        }
    }

    fn get(&self, key: QueueKey, no_ack: bool) -> RemoteReply<Option<(QueuedMessage, u32)>> {
        let reply = self.request(&key.clone(), move |request| Op::Get {
            request,
            key,
            no_ack,
        });
        Box::pin(async move {
            match reply.await? {
                Op::GetOk {
                    message_id,
                    redelivered,
                    remaining,
                    message,
                    ..
                } => Ok(Some((
                    client::delivered(message_id, redelivered, message),
                    remaining,
                ))),
                _ => Ok(None),
            }
        })
    }

    fn purge(&self, key: QueueKey) -> RemoteReply<u32> {
        let reply = self.request(&key.clone(), move |request| Op::Purge { request, key });
        Box::pin(async move {
            match reply.await? {
                Op::Purged { count, .. } => Ok(count),
                _ => Ok(0),
            }
        })
    }

    fn stats(&self, key: QueueKey) -> RemoteReply<QueueStats> {
        let reply = self.request(&key.clone(), move |request| Op::Stats { request, key });
        Box::pin(async move {
            match reply.await? {
                Op::Counted {
                    messages,
                    consumers,
                    ..
                } => Ok(client::counted(messages, consumers)),
                _ => Ok(QueueStats::default()),
            }
        })
    }
}

/// Answers a peer's publishes as they become safe (and as the queues they
/// went into drain), until the session ends.
async fn answer_publishes(session: Arc<Session>, mut progress: watch::Receiver<u64>) {
    loop {
        if session.ended.load(Ordering::Acquire) {
            return;
        }
        let received = session.publishes_received.notified();
        let held_by = session.served.answer();
        match held_by {
            Some(queue) => {
                let drained = queue.uncongested();
                if !queue.is_congested() {
                    continue;
                }
                tokio::select! {
                    () = drained => {}
                    () = received => {}
                }
            }
            None => {
                tokio::select! {
                    () = received => {}
                    changed = progress.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// The node's forwarding to and from every peer.
pub struct NodeForwarding {
    peers: HashMap<String, Arc<PeerForwarding>>,
}

impl Forwarding for NodeForwarding {
    fn home(&self, node: &str) -> Option<Arc<dyn ForwardHome>> {
        self.peers
            .get(node)
            .map(|peer| Arc::clone(peer) as Arc<dyn ForwardHome>)
    }
}

impl NodeForwarding {
    /// Starts forwarding over `links`: receives the peers' operations and
    /// follows their links, so that a session ends as soon as its link does.
    pub fn start(
        links: Arc<Links>,
        broker: Arc<Broker>,
        confirm_progress: Arc<watch::Sender<u64>>,
    ) -> Arc<NodeForwarding> {
        let peers: HashMap<String, Arc<PeerForwarding>> = links
            .peers()
            .map(|peer| {
                let forwarding = Arc::new(PeerForwarding {
                    peer: peer.clone(),
                    links: Arc::clone(&links),
                    broker: Arc::clone(&broker),
                    session: Mutex::new(None),
                    confirm_progress: Arc::clone(&confirm_progress),
                    in_flight: AtomicUsize::new(0),
                    in_flight_bytes: AtomicUsize::new(0),
                    uncongested: Notify::new(),
                });
                (peer.to_string(), forwarding)
            })
            .collect();
        for peer in peers.values() {
            if let Some(states) = links.watch_peer(&peer.peer) {
                tokio::spawn(follow_link(Arc::clone(peer), states));
            }
        }
        let forwarding = Arc::new(NodeForwarding { peers });
        tokio::spawn(receive(
            Arc::clone(&forwarding),
            links.subscribe(FORWARD_CHANNEL),
        ));
        forwarding
    }
}

/// Ends a peer's session whenever its link changes (down, or replaced).
async fn follow_link(
    peer: Arc<PeerForwarding>,
    mut states: watch::Receiver<sluice_cluster::link::PeerState>,
) {
    while states.changed().await.is_ok() {
        peer.session();
    }
}

/// A peer names queues by the metadata entry that declared them, which it
/// applied before it sent the operation; this node may not have yet. Wait
/// for it here, before the operation finds no queue (a publish would be
/// dropped, a consume refused): the entry is committed, so it comes soon.
/// Waiting holds up every peer's operations, for as long as this node lags
/// the metadata log, and at most the log's bound.
async fn catch_up_with(broker: &Broker, op: &Op) {
    let newest = match op {
        Op::Publish { targets, .. } => targets.iter().map(|key| key.declared_at).max(),
        Op::Consume(request) => Some(request.key.declared_at),
        Op::Settle { key, .. }
        | Op::ConsumersGone { key, .. }
        | Op::Get { key, .. }
        | Op::Purge { key, .. }
        | Op::Stats { key, .. } => Some(key.declared_at),
        _ => None,
    };
    let Some(newest) = newest else {
        return;
    };
    if newest <= broker.metadata.applied_index() {
        return;
    }
    if let Err(error) = broker.metadata.wait_applied(newest).await {
        tracing::warn!(%error, index = newest, "a forwarded operation names a queue this node has not caught up with");
    }
}

/// Hands every record from every peer to its session, in order.
async fn receive(forwarding: Arc<NodeForwarding>, mut frames: mpsc::Receiver<Received>) {
    while let Some(frame) = frames.recv().await {
        let Some(peer) = forwarding.peers.get(frame.from.as_str()) else {
            continue;
        };
        let Some(session) = peer.session_of(frame.link) else {
            continue;
        };
        let mut records = Vec::new();
        let joined = lock(&session.inbound).accept(frame.payload, |record| records.push(record));
        if let Err(error) = joined {
            tracing::error!(peer = %peer.peer, %error, "dropping the forwarding session: its stream is corrupt");
            peer.end_session(&session);
            continue;
        }
        for record in records {
            match Op::decode(record) {
                Ok(op) => {
                    catch_up_with(&peer.broker, &op).await;
                    peer.receive(&session, op);
                }
                Err(error) => {
                    tracing::error!(peer = %peer.peer, %error, "dropping the forwarding session");
                    peer.end_session(&session);
                    break;
                }
            }
        }
    }
}
