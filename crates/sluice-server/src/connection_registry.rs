//! Every open connection with its flow-control state, for the management API to list
//! (RabbitMQ's `rabbitmqctl list_connections name user vhost state`) and to close.
//!
//! A connection registers once its handshake is done and is gone from the registry when
//! its [`Registration`] is dropped. It reports only pauses and resumes (a flow pause, a
//! block), never individual messages, so publishing costs nothing extra. Whether an
//! alarm is in effect comes from the alarm monitor when a snapshot is taken.
//!
//! An operator closes a connection through the registry ([`ConnectionRegistry::force_close`]):
//! the connection hears the reason on its [`Registration::close_requests`] and closes with
//! 320 CONNECTION_FORCED and that reason as the text, as RabbitMQ's
//! `rabbit_networking:close_connection` does.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use amq_protocol::types::FieldTable;
use sluice_core::counters::{Counter, MessageCounts};
use sluice_core::queue::ConnectionId;
use sluice_core::vhost::counts::CountedChannel;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::alarm::Alarms;
use crate::delivery::ChannelDeliveries;

/// A connection is shown in `flow` for this long after its last flow pause ended, as in
/// RabbitMQ (`rabbit_reader`, 5 seconds): a publisher held to a queue's drain rate is paused
/// for milliseconds at a time, and a state polled every few seconds would otherwise almost
/// never show it.
pub const FLOW_STATE_LINGER: Duration = Duration::from_secs(5);

/// What a connection is doing about flow control, with RabbitMQ's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionState {
    /// Read as fast as it sends.
    Running,
    /// Paused now, or within [`FLOW_STATE_LINGER`], because a queue it publishes into is
    /// congested.
    Flow,
    /// A resource alarm is in effect, but the connection has not published since: it is
    /// still read, and will be blocked at its next publish.
    Blocking,
    /// Not read because of a resource alarm: it published while one was in effect.
    Blocked,
}

impl ConnectionState {
    pub fn as_str(&self) -> &'static str {
        match self {
            ConnectionState::Running => "running",
            ConnectionState::Flow => "flow",
            ConnectionState::Blocking => "blocking",
            ConnectionState::Blocked => "blocked",
        }
    }
}

impl fmt::Display for ConnectionState {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// What a connection counts, for the management API: bytes each way
/// (RabbitMQ's `recv_oct` and `send_oct`), and the message counters of
/// its open channels. The reader and the writer add to the byte counts
/// once per socket read and write.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    pub received_bytes: Counter,
    pub sent_bytes: Counter,
    /// Bounded by the connection's channel_max.
    channels: Mutex<BTreeMap<u16, Arc<ChannelStatus>>>,
    /// The node's churn, which this connection's channels add to.
    pub churn: Arc<Churn>,
}

/// What opened and closed on this node since it started, RabbitMQ's churn
/// counters (`rabbitmq_connections_opened_total` and the like).
#[derive(Debug, Default)]
pub struct Churn {
    pub connections_opened: Counter,
    pub connections_closed: Counter,
    pub channels_opened: Counter,
    pub channels_closed: Counter,
    /// queue.declare calls, passive ones included.
    pub queues_declared: Counter,
    /// Of those, the ones that made a new queue.
    pub queues_created: Counter,
    pub queues_deleted: Counter,
}

/// What a channel shows the management API besides its counters: its
/// modes, prefetch and consumers. The channel writes it when those change
/// (basic.qos, confirm.select, tx.select, consume, cancel), never per
/// message; what changes per message (the unacknowledged count) is read
/// from its deliveries when asked.
pub struct ChannelStatus {
    deliveries: Arc<ChannelDeliveries>,
    /// basic.qos global=false: the prefetch of consumers started next.
    consumer_prefetch: AtomicU32,
    confirm: AtomicBool,
    transactional: AtomicBool,
    /// By consumer tag; bounded as the channel's consumers are.
    consumers: Mutex<BTreeMap<Arc<str>, ConsumerStatus>>,
}

/// A consumer as the management API lists it.
#[derive(Clone, Debug)]
pub struct ConsumerStatus {
    pub queue: Arc<str>,
    pub ack_required: bool,
    pub exclusive: bool,
    pub prefetch_count: u32,
    pub arguments: FieldTable,
}

impl fmt::Debug for ChannelStatus {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("ChannelStatus")
            .field("counts", &self.deliveries.counts())
            .finish_non_exhaustive()
    }
}

impl ChannelStatus {
    pub fn new(deliveries: &Arc<ChannelDeliveries>) -> Arc<Self> {
        Arc::new(ChannelStatus {
            deliveries: Arc::clone(deliveries),
            consumer_prefetch: AtomicU32::new(0),
            confirm: AtomicBool::new(false),
            transactional: AtomicBool::new(false),
            consumers: Mutex::new(BTreeMap::new()),
        })
    }

    pub fn set_consumer_prefetch(&self, prefetch_count: u32) {
        self.consumer_prefetch
            .store(prefetch_count, Ordering::Relaxed);
    }

    pub fn set_confirm(&self) {
        self.confirm.store(true, Ordering::Relaxed);
    }

    pub fn set_transactional(&self) {
        self.transactional.store(true, Ordering::Relaxed);
    }

    pub fn consumer_added(&self, tag: &Arc<str>, consumer: ConsumerStatus) {
        lock(&self.consumers).insert(Arc::clone(tag), consumer);
    }

    pub fn consumer_removed(&self, tag: &str) {
        lock(&self.consumers).remove(tag);
    }

    fn snapshot(&self, channel_id: u16) -> ChannelCounts {
        ChannelCounts {
            channel_id,
            counts: self.deliveries.counts(),
            prefetch_count: self.consumer_prefetch.load(Ordering::Relaxed),
            global_prefetch_count: self.deliveries.channel_prefetch(),
            confirm: self.confirm.load(Ordering::Relaxed),
            transactional: self.transactional.load(Ordering::Relaxed),
            messages_unacknowledged: self.deliveries.unacked_count(),
            consumers: lock(&self.consumers)
                .iter()
                .map(|(tag, consumer)| (Arc::clone(tag), consumer.clone()))
                .collect(),
        }
    }
}

impl ConnectionStats {
    pub fn channel_opened(&self, channel_id: u16, status: Arc<ChannelStatus>) {
        lock(&self.channels).insert(channel_id, status);
        self.churn.channels_opened.add(1);
    }

    pub fn channel_closed(&self, channel_id: u16) {
        if lock(&self.channels).remove(&channel_id).is_some() {
            self.churn.channels_closed.add(1);
        }
    }

    /// Every open channel as it is now, by channel number.
    pub fn channel_counts(&self) -> Vec<ChannelCounts> {
        let channels: Vec<(u16, Arc<ChannelStatus>)> = lock(&self.channels)
            .iter()
            .map(|(channel_id, status)| (*channel_id, Arc::clone(status)))
            .collect();
        channels
            .iter()
            .map(|(channel_id, status)| status.snapshot(*channel_id))
            .collect()
    }
}

/// One channel's message counts, modes and consumers at one moment.
#[derive(Clone, Debug)]
pub struct ChannelCounts {
    pub channel_id: u16,
    pub counts: MessageCounts,
    /// basic.qos global=false.
    pub prefetch_count: u32,
    /// basic.qos global=true.
    pub global_prefetch_count: u32,
    pub confirm: bool,
    pub transactional: bool,
    pub messages_unacknowledged: usize,
    pub consumers: Vec<(Arc<str>, ConsumerStatus)>,
}

/// What a connection is, fixed once its handshake is done.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnectionIdentity {
    pub peer_address: SocketAddr,
    /// The listener's address the client reached.
    pub local_address: SocketAddr,
    pub user: String,
    pub vhost: String,
    pub tls: bool,
    /// PLAIN, AMQPLAIN or EXTERNAL.
    pub auth_mechanism: String,
    pub frame_max: u32,
    pub channel_max: u16,
    /// Zero when heartbeats are off.
    pub heartbeat_secs: u16,
    pub client_properties: FieldTable,
}

impl ConnectionIdentity {
    /// The connection's name as RabbitMQ forms it, and as its management
    /// API and tools address it: `"127.0.0.1:54321 -> 127.0.0.1:5672"`.
    pub fn name(&self) -> String {
        format!(
            "{} -> {}",
            address_text(self.peer_address),
            address_text(self.local_address)
        )
    }
}

/// An address as RabbitMQ writes it in a connection's name
/// (`rabbit_misc:ntoab`): IPv6 in brackets, an IPv4-mapped one as IPv4.
fn address_text(address: SocketAddr) -> String {
    match address {
        SocketAddr::V4(v4) => v4.to_string(),
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => format!("{v4}:{}", v6.port()),
            None => format!("[{}]:{}", v6.ip(), v6.port()),
        },
    }
}

/// One connection as it was when the snapshot was taken.
#[derive(Clone, Debug)]
pub struct ConnectionSnapshot {
    pub connection_id: ConnectionId,
    pub identity: Arc<ConnectionIdentity>,
    pub connected_at: SystemTime,
    pub state: ConnectionState,
    /// Time spent paused by congested queues since the connection opened, the current
    /// pause included.
    pub time_in_flow_ms: u64,
    /// Time spent blocked by resource alarms since the connection opened, the current
    /// block included.
    pub time_blocked_ms: u64,
    /// When the current block started; `None` unless the state is
    /// [`ConnectionState::Blocked`].
    pub blocked_since: Option<SystemTime>,
    /// Bytes read from the client since the handshake.
    pub received_bytes: u64,
    /// Bytes written to the client since the handshake.
    pub sent_bytes: u64,
    pub channels: Vec<ChannelCounts>,
}

/// The open connections. It holds one entry per connection that finished its handshake,
/// so it is bounded by the sockets the listener can accept (the process's file
/// descriptor limit).
pub struct ConnectionRegistry {
    connections: Mutex<BTreeMap<ConnectionId, Arc<Entry>>>,
    alarms: watch::Receiver<Alarms>,
    pub churn: Arc<Churn>,
}

struct Entry {
    identity: Arc<ConnectionIdentity>,
    connected_at: SystemTime,
    throttle: Mutex<Throttle>,
    stats: Arc<ConnectionStats>,
    /// Why an operator wants the connection closed; None until then.
    close_request: watch::Sender<Option<Arc<str>>>,
}

/// Pause and block times of one connection.
#[derive(Debug, Default)]
struct Throttle {
    flow_started_at: Option<Instant>,
    flow_ended_at: Option<Instant>,
    time_in_flow: Duration,
    blocked_at: Option<(Instant, SystemTime)>,
    time_blocked: Duration,
}

impl Throttle {
    fn state(&self, alarms: Alarms, now: Instant) -> ConnectionState {
        // As in RabbitMQ, an alarm outranks flow: it is the longer-lived reason.
        if self.blocked_at.is_some() {
            ConnectionState::Blocked
        } else if alarms.any() {
            ConnectionState::Blocking
        } else if self.flow_started_at.is_some()
            || self
                .flow_ended_at
                .is_some_and(|ended| now.duration_since(ended) < FLOW_STATE_LINGER)
        {
            ConnectionState::Flow
        } else {
            ConnectionState::Running
        }
    }

    fn time_in_flow(&self, now: Instant) -> Duration {
        self.time_in_flow
            + self
                .flow_started_at
                .map_or(Duration::ZERO, |started| now.duration_since(started))
    }

    fn time_blocked(&self, now: Instant) -> Duration {
        self.time_blocked
            + self
                .blocked_at
                .map_or(Duration::ZERO, |(started, _)| now.duration_since(started))
    }
}

impl ConnectionRegistry {
    /// An empty registry that reads whether an alarm is in effect from `alarms`.
    pub fn new(alarms: watch::Receiver<Alarms>) -> Arc<Self> {
        Arc::new(ConnectionRegistry {
            connections: Mutex::new(BTreeMap::new()),
            alarms,
            churn: Arc::default(),
        })
    }

    /// Adds a connection; it stays listed until the returned registration is dropped.
    pub fn register(
        self: &Arc<Self>,
        connection_id: ConnectionId,
        identity: ConnectionIdentity,
    ) -> Registration {
        // Subscribed before the entry is listed: a close asked for as soon
        // as it is listed is heard.
        let (close_request, close_requests) = watch::channel(None);
        let entry = Arc::new(Entry {
            identity: Arc::new(identity),
            connected_at: SystemTime::now(),
            throttle: Mutex::new(Throttle::default()),
            stats: Arc::new(ConnectionStats {
                churn: Arc::clone(&self.churn),
                ..ConnectionStats::default()
            }),
            close_request,
        });
        lock(&self.connections).insert(connection_id, Arc::clone(&entry));
        self.churn.connections_opened.add(1);
        Registration {
            registry: Arc::clone(self),
            connection_id,
            entry,
            close_requests,
        }
    }

    /// Every open connection, oldest first.
    pub fn snapshots(&self) -> Vec<ConnectionSnapshot> {
        let entries: Vec<(ConnectionId, Arc<Entry>)> = lock(&self.connections)
            .iter()
            .map(|(id, entry)| (*id, Arc::clone(entry)))
            .collect();
        let alarms = *self.alarms.borrow();
        let now = Instant::now();
        entries
            .into_iter()
            .map(|(connection_id, entry)| {
                let throttle = lock(&entry.throttle);
                ConnectionSnapshot {
                    connection_id,
                    identity: Arc::clone(&entry.identity),
                    connected_at: entry.connected_at,
                    state: throttle.state(alarms, now),
                    time_in_flow_ms: throttle.time_in_flow(now).as_millis() as u64,
                    time_blocked_ms: throttle.time_blocked(now).as_millis() as u64,
                    blocked_since: throttle.blocked_at.map(|(_, since)| since),
                    received_bytes: entry.stats.received_bytes.get(),
                    sent_bytes: entry.stats.sent_bytes.get(),
                    channels: entry.stats.channel_counts(),
                }
            })
            .collect()
    }

    /// Asks the connection to close with CONNECTION_FORCED and `reason` as
    /// the reply text. False when no such connection is open.
    pub fn force_close(&self, connection_id: ConnectionId, reason: &str) -> bool {
        let entry = lock(&self.connections).get(&connection_id).cloned();
        match entry {
            Some(entry) => {
                entry.close_request.send_replace(Some(Arc::from(reason)));
                true
            }
            None => false,
        }
    }

    /// Closes, as [`Self::force_close`], every connection whose identity
    /// `chosen` picks (a deleted user's, a deleted vhost's); how many.
    pub fn force_close_where(
        &self,
        chosen: impl Fn(&ConnectionIdentity) -> bool,
        reason: &str,
    ) -> usize {
        let reason: Arc<str> = Arc::from(reason);
        let entries: Vec<Arc<Entry>> = lock(&self.connections)
            .values()
            .filter(|entry| chosen(&entry.identity))
            .cloned()
            .collect();
        for entry in &entries {
            entry.close_request.send_replace(Some(Arc::clone(&reason)));
        }
        entries.len()
    }

    /// How many connections are open.
    pub fn len(&self) -> usize {
        lock(&self.connections).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A connection's place in the registry, through which it reports its pauses.
pub struct Registration {
    registry: Arc<ConnectionRegistry>,
    connection_id: ConnectionId,
    entry: Arc<Entry>,
    close_requests: watch::Receiver<Option<Arc<str>>>,
}

impl Registration {
    /// Where the connection hears that an operator closed it, and why.
    pub fn close_requests(&self) -> watch::Receiver<Option<Arc<str>>> {
        self.close_requests.clone()
    }

    /// Where the connection counts its bytes and registers its channels.
    pub fn stats(&self) -> Arc<ConnectionStats> {
        Arc::clone(&self.entry.stats)
    }

    /// The connection stopped reading for a congested queue.
    pub fn flow_started(&self) {
        let mut throttle = lock(&self.entry.throttle);
        if throttle.flow_started_at.is_none() {
            throttle.flow_started_at = Some(Instant::now());
        }
    }

    /// The connection reads again after a flow pause.
    pub fn flow_ended(&self) {
        let mut throttle = lock(&self.entry.throttle);
        if let Some(started) = throttle.flow_started_at.take() {
            let now = Instant::now();
            throttle.time_in_flow += now.duration_since(started);
            throttle.flow_ended_at = Some(now);
        }
    }

    /// The connection stopped reading for a resource alarm.
    pub fn blocked(&self) {
        let mut throttle = lock(&self.entry.throttle);
        if throttle.blocked_at.is_none() {
            throttle.blocked_at = Some((Instant::now(), SystemTime::now()));
        }
    }

    /// The alarm cleared and the connection reads again.
    pub fn unblocked(&self) {
        let mut throttle = lock(&self.entry.throttle);
        if let Some((started, _)) = throttle.blocked_at.take() {
            throttle.time_blocked += started.elapsed();
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.registry.connections).remove(&self.connection_id);
        self.registry.churn.connections_closed.add(1);
    }
}

/// A panic elsewhere leaves the times as they were, which are still worth reading.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> (watch::Sender<Alarms>, Arc<ConnectionRegistry>) {
        let (sender, alarms) = watch::channel(Alarms::default());
        (sender, ConnectionRegistry::new(alarms))
    }

    fn only(registry: &ConnectionRegistry) -> ConnectionSnapshot {
        let mut snapshots = registry.snapshots();
        assert_eq!(snapshots.len(), 1);
        snapshots.remove(0)
    }

    const PEER: &str = "127.0.0.1:50000";

    fn identity(peer: &str, user: &str, vhost: &str) -> ConnectionIdentity {
        ConnectionIdentity {
            peer_address: peer.parse().unwrap(),
            local_address: "127.0.0.1:5672".parse().unwrap(),
            user: user.to_owned(),
            vhost: vhost.to_owned(),
            tls: false,
            auth_mechanism: "PLAIN".to_owned(),
            frame_max: 131_072,
            channel_max: 2047,
            heartbeat_secs: 60,
            client_properties: FieldTable::default(),
        }
    }

    #[test]
    fn connection_registry_lists_until_dropped() {
        let (_alarms, registry) = registry();
        let first = registry.register(7, identity(PEER, "guest", "/"));
        let second = registry.register(9, identity("10.0.0.1:1", "ops", "prod"));
        let snapshots = registry.snapshots();
        assert_eq!(
            snapshots
                .iter()
                .map(|snapshot| (snapshot.connection_id, snapshot.identity.user.as_str()))
                .collect::<Vec<_>>(),
            [(7, "guest"), (9, "ops")]
        );
        assert_eq!(snapshots[1].identity.vhost, "prod");
        assert_eq!(
            snapshots[0].identity.name(),
            "127.0.0.1:50000 -> 127.0.0.1:5672"
        );
        assert_eq!(snapshots[0].state, ConnectionState::Running);
        assert_eq!(snapshots[0].blocked_since, None);
        drop(first);
        assert_eq!(only(&registry).connection_id, 9);
        drop(second);
        assert!(registry.is_empty());
    }

    #[test]
    fn connection_registry_closes_on_request() {
        let (_alarms, registry) = registry();
        let alice = registry.register(1, identity(PEER, "alice", "/"));
        let bob = registry.register(2, identity("127.0.0.1:50001", "bob", "prod"));
        let (mut alice_hears, mut bob_hears) = (alice.close_requests(), bob.close_requests());
        assert!(!alice_hears.has_changed().unwrap());
        assert!(registry.force_close(1, "bye"));
        assert!(!registry.force_close(3, "no such connection"));
        assert!(alice_hears.has_changed().unwrap());
        assert_eq!(alice_hears.borrow_and_update().as_deref(), Some("bye"));
        let closed = registry.force_close_where(
            |identity| identity.vhost == "prod",
            "vhost 'prod' is deleted",
        );
        assert_eq!(closed, 1);
        assert_eq!(
            bob_hears.borrow_and_update().as_deref(),
            Some("vhost 'prod' is deleted")
        );
        assert!(!alice_hears.has_changed().unwrap(), "not chosen");
    }

    #[test]
    fn connection_names_write_ipv6_as_rabbitmq_does() {
        let mut named = identity("[::1]:50000", "guest", "/");
        named.local_address = "[::ffff:10.0.0.2]:5672".parse().unwrap();
        assert_eq!(named.name(), "[::1]:50000 -> 10.0.0.2:5672");
    }

    #[tokio::test(start_paused = true)]
    async fn connection_registry_flow_time_and_linger() {
        let (_alarms, registry) = registry();
        let registration = registry.register(1, identity(PEER, "guest", "/"));
        registration.flow_started();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let snapshot = only(&registry);
        assert_eq!(snapshot.state, ConnectionState::Flow);
        assert_eq!(snapshot.time_in_flow_ms, 300, "the current pause counts");
        registration.flow_ended();
        registration.flow_started();
        tokio::time::sleep(Duration::from_millis(200)).await;
        registration.flow_ended();
        tokio::time::sleep(FLOW_STATE_LINGER - Duration::from_millis(1)).await;
        let snapshot = only(&registry);
        assert_eq!(snapshot.state, ConnectionState::Flow, "shown for a while");
        assert_eq!(snapshot.time_in_flow_ms, 500);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(only(&registry).state, ConnectionState::Running);
    }

    #[tokio::test(start_paused = true)]
    async fn connection_registry_blocking_then_blocked() {
        let (alarms, registry) = registry();
        let registration = registry.register(1, identity(PEER, "guest", "/"));
        registration.flow_started();
        alarms.send_replace(Alarms {
            memory: true,
            disk: false,
        });
        assert_eq!(
            only(&registry).state,
            ConnectionState::Blocking,
            "an alarm outranks flow"
        );
        registration.flow_ended();
        registration.blocked();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let snapshot = only(&registry);
        assert_eq!(snapshot.state, ConnectionState::Blocked);
        assert!(snapshot.blocked_since.is_some());
        assert_eq!(snapshot.time_blocked_ms, 2000);
        alarms.send_replace(Alarms::default());
        registration.unblocked();
        tokio::time::sleep(FLOW_STATE_LINGER).await;
        let snapshot = only(&registry);
        assert_eq!(snapshot.state, ConnectionState::Running);
        assert_eq!(snapshot.time_blocked_ms, 2000);
        assert_eq!(snapshot.blocked_since, None);
        assert_eq!(ConnectionState::Blocking.to_string(), "blocking");
    }
}
