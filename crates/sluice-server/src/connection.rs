//! One client connection: the reader task that handles every frame, and the
//! writer task (see [`crate::outbox`]) that sends what channels and queues
//! append to its output buffer.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use amq_protocol::protocol::{channel, connection, AMQPClass};
use futures_util::FutureExt;
use sluice_core::broker::Broker;
use sluice_core::error::AmqpError;
use sluice_core::queue::{same_queue, Queue};
use sluice_wire::content::decode_content_header;
use sluice_wire::encode::encode_control;
use sluice_wire::frame::{Frame, FrameError, FrameType};
use sluice_wire::method::{decode_method, Method, MethodError};
use sluice_wire::reply_code::ReplyCode;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use crate::alarm::Alarms;
use crate::bodies_under_way::BodiesUnderWay;
use crate::channel::{requeue_in_slices, Channel, PendingChange};
use crate::client_stream::{ClientStream, ClientWriteHalf};
use crate::close_signal::CloseSignal;
use crate::connection_context::ConnectionContext;
use crate::connection_registry::{ConnectionIdentity, ConnectionRegistry, Registration};
use crate::delivery::Unacked;
use crate::frame_reader::{FrameReader, ReadError};
use crate::handshake::{handshake, refuse, Client, HandshakeError, Negotiated};
use crate::in_flight::InFlightBytes;
use crate::limits::CLOSE_OK_TIMEOUT_MS;
use crate::outbox::{Outbox, WakeBatch};
use crate::settings::ServerSettings;
use crate::tls::CertificateLogin;
use crate::uncommitted::UncommittedBytes;

/// What handling a frame asks of the connection.
enum Flow {
    Continue,
    /// Close the connection with this error (we send connection.close).
    CloseWith(AmqpError, u16, u16),
    /// The client closed (we answered close-ok), or our close was confirmed.
    Finished,
    /// A channel's method waits for the metadata log: nothing more is read
    /// until it is settled.
    AwaitChange(WaitingChange),
}

/// A channel's metadata change under way, with the ids of the method that
/// started it (for the error, if it fails).
struct WaitingChange {
    channel_id: u16,
    method_ids: (u16, u16),
    change: PendingChange,
}

pub struct Connection {
    context: ConnectionContext,
    peer: SocketAddr,
    channels: HashMap<u16, Channel>,
    /// Channels that handled frames in the current read batch: their
    /// confirms and counts are flushed at its end.
    batch_channels: Vec<u16>,
    heartbeat: Option<Duration>,
    /// Queues this connection's consumers read from, for resuming deliveries
    /// after the output buffer drains.
    consumer_queues: Arc<Mutex<Vec<Arc<dyn Queue>>>>,
    closing: bool,
    /// Changes after every sync round: time to look at confirms that wait
    /// for persistent messages to be on disk.
    durable_rounds: watch::Receiver<u64>,
    /// Congested queues this connection published into; it does not read
    /// its socket until they drain.
    congested_queues: Vec<Arc<dyn Queue>>,
    /// Memory and disk alarms: while one is set, a connection that publishes
    /// is blocked.
    alarms: watch::Receiver<Alarms>,
    /// Whether the frames handled since the last alarm check held a publish.
    published_since_alarm_check: bool,
    /// Whether a channel's large body waits for room among the node's
    /// bodies under way.
    body_room_wanted: bool,
    /// Channels closed with the connection, not yet done with.
    releasing: Option<Releasing>,
    /// The client closed the connection: close-ok follows the release.
    close_ok_owed: bool,
    /// Publishes handled in the current batch. At `publish_credit` the batch
    /// ends, even with frames still buffered: the reader checks its queues'
    /// congestion and the alarms, and lets other connections run.
    publishes_in_batch: u32,
    /// A publish in the current batch left a quorum queue with
    /// `quorum_commands_soft_limit` of its channel's messages in flight:
    /// the batch ends there, so the limit is passed by one batch's worth
    /// at most, not by a whole publish credit.
    soft_limit_reached: bool,
    /// `credit_flow_default_credit`: publishes a reader may route between
    /// two looks at its queues' congestion.
    publish_credit: u32,
    /// Where this connection reports its flow pauses and blocks.
    registration: Registration,
    /// `consumer_timeout`, and when next to look for deliveries past it.
    consumer_timeout: Option<(Duration, tokio::time::Instant)>,
}

/// Channels closed with their connection: their unacked messages go back
/// to their queues before their consumers go.
#[derive(Default)]
struct Releasing {
    channels: Vec<Channel>,
    unacked: Vec<Unacked>,
}

/// What holds a connection back besides its own queues, and where it says
/// so: the resource alarms, and the registry that lists its state.
#[derive(Clone)]
pub struct ResourceThrottle {
    pub alarms: watch::Receiver<Alarms>,
    pub registry: Arc<ConnectionRegistry>,
    /// Bytes buffered for consumers across all connections.
    pub in_flight: Arc<InFlightBytes>,
    /// Large message bodies being read across all connections.
    pub bodies_under_way: Arc<BodiesUnderWay>,
    /// Messages held by open transactions across all connections.
    pub uncommitted: Arc<UncommittedBytes>,
}

/// Serves one accepted client, plain or TLS, until it closes.
pub async fn serve(
    client: ClientStream,
    (peer, local): (SocketAddr, SocketAddr),
    broker: Arc<Broker>,
    settings: Arc<ServerSettings>,
    mut shutdown: watch::Receiver<bool>,
    durable_rounds: watch::Receiver<u64>,
    throttle: ResourceThrottle,
) {
    let ResourceThrottle {
        alarms,
        registry,
        in_flight,
        bodies_under_way,
        uncommitted,
    } = throttle;
    let ClientStream {
        read_half,
        mut write_half,
        certificate_login,
        tls,
    } = client;
    let mut reader = FrameReader::new(read_half, settings.frame_max);
    let negotiated = negotiate(
        &mut reader,
        &mut write_half,
        (peer, certificate_login.as_ref()),
        (&broker, &settings),
        &mut shutdown,
    );
    let Some(negotiated) = negotiated.await else {
        return;
    };
    let connection_id = broker.next_connection_id();
    tracing::info!(%peer, connection_id, user = %negotiated.user, vhost = %negotiated.vhost.name, tls, "connection opened");
    let registration = registry.register(
        connection_id,
        ConnectionIdentity {
            peer_address: peer,
            local_address: local,
            user: negotiated.user.clone(),
            vhost: negotiated.vhost.name.to_string(),
            tls,
            auth_mechanism: negotiated.auth_mechanism.clone(),
            frame_max: negotiated.frame_max,
            channel_max: negotiated.channel_max,
            heartbeat_secs: negotiated.heartbeat_secs,
            client_properties: negotiated.client_properties.clone(),
        },
    );
    let heartbeat = (negotiated.heartbeat_secs > 0)
        .then(|| Duration::from_secs(negotiated.heartbeat_secs as u64));
    let stats = registration.stats();
    let mut signal = CloseSignal::new(shutdown, registration.close_requests());
    reader.count_into(Arc::clone(&stats));
    let outbox = Outbox::new(in_flight, Arc::clone(&stats));
    let consumer_queues: Arc<Mutex<Vec<Arc<dyn Queue>>>> = Arc::new(Mutex::new(Vec::new()));
    let writer = spawn_writer(&outbox, write_half, heartbeat, &consumer_queues);
    let mut connection = Connection {
        context: ConnectionContext {
            connection_id,
            broker: Arc::clone(&broker),
            vhost: negotiated.vhost,
            user: negotiated.user.as_str().into(),
            vhost_slot: negotiated.vhost_slot,
            outbox: Arc::clone(&outbox),
            frame_max: negotiated.frame_max,
            channel_max: negotiated.channel_max,
            max_message_size: settings.max_message_size,
            quorum_commands_soft_limit: settings.quorum_commands_soft_limit,
            client_capabilities: negotiated.client_capabilities,
            stats,
            bodies_under_way,
            uncommitted,
        },
        peer,
        channels: HashMap::new(),
        batch_channels: Vec::new(),
        heartbeat,
        consumer_queues,
        closing: false,
        durable_rounds,
        congested_queues: Vec::new(),
        alarms,
        published_since_alarm_check: false,
        body_room_wanted: false,
        releasing: None,
        close_ok_owed: false,
        publishes_in_batch: 0,
        soft_limit_reached: false,
        publish_credit: settings.publish_credit,
        registration,
        consumer_timeout: settings.consumer_timeout.map(|timeout| {
            (
                timeout,
                tokio::time::Instant::now() + timeout_check_interval(timeout),
            )
        }),
    };
    let ran = AssertUnwindSafe(connection.run(&mut reader, &mut signal))
        .catch_unwind()
        .await;
    if let Err(panic) = ran {
        // A bug, not the client's doing: this connection closes with 541
        // and gives back what it held (below); the others carry on.
        tracing::error!(%peer, connection_id, panic = panic_text(&*panic), "a connection's handling panicked; closing it");
        connection.closing = false;
        connection.start_close(
            &AmqpError::new(ReplyCode::InternalError, "internal error"),
            0,
            0,
        );
    }
    let shutting_down = signal.shutting_down();
    // A panic while releasing loses only the channel it struck: the rest
    // are released on the next try (one try more per channel at most).
    let tries = connection.channels_to_release() + 1;
    for _ in 0..tries {
        match AssertUnwindSafe(connection.release(shutting_down))
            .catch_unwind()
            .await
        {
            Ok(()) => break,
            Err(panic) => {
                tracing::error!(%peer, connection_id, panic = panic_text(&*panic), "releasing a connection's channels panicked; releasing the others");
            }
        }
    }
    outbox.close();
    let _ = tokio::time::timeout(Duration::from_millis(CLOSE_OK_TIMEOUT_MS), writer).await;
    linger_until_client_closes(&mut reader, &mut signal).await;
    tracing::info!(%peer, connection_id, "connection closed");
}

/// What a panic said, for the log.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// Starts the connection's writer task. When it has drained a buffer that
/// refused deliveries, it asks the queues of the connection's consumers to
/// dispatch again.
fn spawn_writer(
    outbox: &Arc<Outbox>,
    write_half: ClientWriteHalf,
    heartbeat: Option<Duration>,
    consumer_queues: &Arc<Mutex<Vec<Arc<dyn Queue>>>>,
) -> tokio::task::JoinHandle<()> {
    let resume_queues = Arc::clone(consumer_queues);
    tokio::spawn(
        Arc::clone(outbox).run_writer(write_half, heartbeat, move || {
            let queues: Vec<Arc<dyn Queue>> = resume_queues
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone();
            for queue in queues {
                queue.dispatch();
            }
        }),
    )
}

/// Runs the handshake; None when it failed or was refused (the client told
/// why where the protocol lets it), or shutdown came first. A connection
/// still in its handshake has nothing to close politely: on shutdown it is
/// dropped, so stopping never waits out handshake_timeout.
async fn negotiate(
    reader: &mut FrameReader,
    write_half: &mut ClientWriteHalf,
    (peer, certificate_login): (SocketAddr, Option<&CertificateLogin>),
    (broker, settings): (&Arc<Broker>, &Arc<ServerSettings>),
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Negotiated> {
    let client = Client {
        peer,
        certificate_login,
    };
    let handshake_result = tokio::select! {
        result = handshake(reader, write_half, client, broker, settings) => result,
        _ = shutdown_requested(shutdown) => {
            tracing::info!(%peer, "shutting down: connection dropped during its handshake");
            return None;
        }
        // A deadline for the whole handshake, as RabbitMQ's: a client that
        // dribbles it a byte at a time would pass every per-read timeout.
        () = tokio::time::sleep(settings.handshake_timeout) => {
            tracing::info!(%peer, timeout_ms = settings.handshake_timeout.as_millis() as u64, "handshake not done within handshake_timeout: connection dropped");
            return None;
        }
    };
    match handshake_result {
        Ok(negotiated) => Some(negotiated),
        Err(HandshakeError::Refused(error, class_id, method_id)) => {
            tracing::info!(%peer, %error, "connection refused during handshake");
            refuse(reader, write_half, &error, class_id, method_id).await;
            None
        }
        Err(error) => {
            tracing::info!(%peer, %error, "handshake failed");
            // A TLS client then reads a close_notify, not a cut connection.
            let _ = tokio::time::timeout(
                Duration::from_millis(CLOSE_OK_TIMEOUT_MS),
                write_half.shutdown(),
            )
            .await;
            None
        }
    }
}

/// Like RabbitMQ's reader in its `closed` state: discards what the client
/// still sends (late acks from consumer threads) until it closes the
/// socket, so that closing with unread bytes does not reset the connection
/// under the client. Not at all when the node is shutting down.
async fn linger_until_client_closes(reader: &mut FrameReader, signal: &mut CloseSignal) {
    let linger = Duration::from_millis(if signal.shutting_down() {
        0
    } else {
        CLOSE_OK_TIMEOUT_MS
    });
    let discard_until_client_closes = async {
        loop {
            match reader.next_buffered() {
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(_) => break,
            }
            if reader.fill(None).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        _ = tokio::time::timeout(linger, discard_until_client_closes) => {}
        _ = signal.requested() => {}
    }
}

/// How a batch of buffered frames ended.
enum Batch {
    /// Every buffered frame was handled.
    Drained,
    /// The publish credit was spent with frames left.
    CreditSpent,
    /// The connection's close completed.
    Finished,
    /// The bytes no longer split into frames.
    Unframed(FrameError),
    /// A method waits for the metadata log; the frames after it wait too.
    AwaitChange(WaitingChange),
}

/// A heartbeat frame is valid only empty and on channel 0. As RabbitMQ: a
/// heartbeat with a payload is not a frame it knows (501); one on a channel
/// is out of place (505, where the specification says 501).
fn check_heartbeat(frame: &Frame) -> Flow {
    if !frame.payload.is_empty() {
        return Flow::CloseWith(
            AmqpError::frame_error(format!(
                "heartbeat frame with a payload of {} bytes",
                frame.payload.len()
            )),
            0,
            0,
        );
    }
    if frame.channel != 0 {
        return Flow::CloseWith(
            AmqpError::unexpected_frame(format!("heartbeat frame on channel {}", frame.channel)),
            0,
            0,
        );
    }
    Flow::Continue
}

/// A method arrived where content frames were due: RabbitMQ's command
/// assembler names the publish whose content was cut short, not the method
/// that interrupted it, in its words for the two states.
fn content_cut_short(channel: &Channel) -> Flow {
    let text = if channel.expects_content_body() {
        "expected content body, got non content body frame instead"
    } else {
        "expected content header for class 60, got non content header frame instead"
    };
    Flow::CloseWith(AmqpError::unexpected_frame(text), 60, 40)
}

/// Decodes a method frame; a method that cannot be decoded closes the
/// connection, naming it where it can.
fn decode_method_frame(frame: &Frame) -> Result<Method, Flow> {
    decode_method(&frame.payload).map_err(|error| match error {
        MethodError::Unknown {
            class_id,
            method_id,
        } => Flow::CloseWith(
            AmqpError::not_implemented(error.to_string()),
            class_id,
            method_id,
        ),
        MethodError::Malformed {
            class_id,
            method_id,
        } => Flow::CloseWith(
            AmqpError::frame_error(error.to_string()),
            class_id,
            method_id,
        ),
        error => Flow::CloseWith(AmqpError::frame_error(error.to_string()), 0, 0),
    })
}

/// Resolves once shutdown is asked for; never, if the server handle is gone
/// without asking.
async fn shutdown_requested(shutdown: &mut watch::Receiver<bool>) {
    if shutdown.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

impl Connection {
    async fn run(&mut self, reader: &mut FrameReader, signal: &mut CloseSignal) {
        loop {
            self.close_timed_out_channels();
            // Handle every frame already read, then flush their confirms;
            // writers woken by it all are woken once, at the end.
            let wake_batch = WakeBatch::begin();
            let credit_spent = match self.handle_buffered_frames(reader) {
                Batch::Drained => false,
                Batch::CreditSpent => true,
                Batch::Finished => return,
                Batch::Unframed(error) => {
                    self.flush_batch();
                    self.start_close(&AmqpError::frame_error(error.to_string()), 0, 0);
                    // The stream is no longer framed: nothing more can be read.
                    drop(wake_batch);
                    self.wait_for_writer().await;
                    return;
                }
                Batch::AwaitChange(waiting) => {
                    self.flush_batch();
                    drop(wake_batch);
                    self.finish_change(waiting).await;
                    continue;
                }
            };
            self.flush_batch();
            drop(wake_batch);
            // A close started by these frames: what its channels held goes
            // back now, not once the client's close-ok arrives.
            self.finish_releasing().await;
            if !self.wait_while_congested(signal).await {
                continue;
            }
            if !self.wait_while_slow(signal).await {
                continue;
            }
            if !self.wait_while_alarmed(signal).await {
                continue;
            }
            if !self.wait_for_room_for_bodies(signal).await {
                continue;
            }
            self.context.outbox.wait_below_reader_pause().await;
            if self.context.outbox.is_broken() {
                return;
            }
            // A reader whose socket always has data and whose queues take
            // everything (they have no consumers) would otherwise run for
            // tokio's whole cooperative budget, a hundred reads, before other
            // connections, handshakes and consumers, get a turn. A read that
            // filled all the room it had, or a spent credit, says the client
            // has more queued: let the others run first. A reader that keeps
            // up with its client waits on the socket anyway, and does not
            // pay for the yield (it would break up its consumers' writes).
            if credit_spent || reader.last_read_was_full() {
                tokio::task::yield_now().await;
            }
            if credit_spent {
                continue;
            }
            if !self.wait_for_input(reader, signal).await {
                return;
            }
        }
    }

    /// Handles the frames already read, up to the publish credit.
    fn handle_buffered_frames(&mut self, reader: &mut FrameReader) -> Batch {
        self.publishes_in_batch = 0;
        self.soft_limit_reached = false;
        loop {
            if self.publishes_in_batch >= self.publish_credit || self.soft_limit_reached {
                return Batch::CreditSpent;
            }
            match reader.next_buffered() {
                Ok(Some(frame)) => match self.handle_frame(frame) {
                    Flow::Continue => {}
                    Flow::CloseWith(error, class_id, method_id) => {
                        self.start_close(&error, class_id, method_id)
                    }
                    Flow::Finished => return Batch::Finished,
                    Flow::AwaitChange(waiting) => return Batch::AwaitChange(waiting),
                },
                Ok(None) => return Batch::Drained,
                Err(error) => return Batch::Unframed(error),
            }
        }
    }

    /// Waits for more bytes from the client, a sync round that completes
    /// confirms, or a close request. False when the connection is over:
    /// the client went silent past its heartbeats (or past our close),
    /// closed, or failed.
    async fn wait_for_input(&mut self, reader: &mut FrameReader, signal: &mut CloseSignal) -> bool {
        let timeout = if self.closing {
            Some(Duration::from_millis(CLOSE_OK_TIMEOUT_MS))
        } else {
            self.heartbeat.map(|interval| interval * 2)
        };
        tokio::select! {
            read = reader.fill(timeout) => match read {
                Ok(_) => return true,
                Err(ReadError::Timeout(limit)) => {
                    if !self.closing {
                        tracing::warn!(peer = %self.peer, "missed heartbeats from client, timeout: {}s", limit.as_secs() / 2);
                    }
                }
                Err(ReadError::Closed) => {
                    if !self.closing {
                        tracing::info!(peer = %self.peer, "client closed the TCP connection without connection.close");
                    }
                }
                Err(ReadError::Io(error)) => {
                    tracing::info!(peer = %self.peer, %error, "connection read failed");
                }
            },
            _ = self.durable_rounds.changed(), if self.has_waiting_confirms() => {
                self.flush_waiting_confirms();
                return true;
            }
            error = signal.requested(), if !self.closing => {
                self.start_close(&error, 0, 0);
                return true;
            }
            () = consumer_timeout_check(self.consumer_timeout), if !self.closing => return true,
        }
        false
    }

    /// `consumer_timeout`: a channel holding a delivery unacknowledged for
    /// longer is closed with RabbitMQ's 406, which requeues what it held.
    /// Looked at every half timeout (at most every 30 s), as RabbitMQ
    /// looks at its channels' deliveries periodically.
    fn close_timed_out_channels(&mut self) {
        let Some((timeout, next_check)) = self.consumer_timeout else {
            return;
        };
        let now = tokio::time::Instant::now();
        if now < next_check || self.closing {
            return;
        }
        self.consumer_timeout = Some((timeout, now + timeout_check_interval(timeout)));
        let timed_out: Vec<u16> = self
            .channels
            .iter()
            .filter(|(_, channel)| !channel.closing)
            .filter(|(_, channel)| {
                channel
                    .deliveries
                    .oldest_unacked_since()
                    .is_some_and(|since| since.elapsed() > timeout)
            })
            .map(|(id, _)| *id)
            .collect();
        for channel_id in timed_out {
            tracing::warn!(peer = %self.peer, channel_id, timeout_ms = timeout.as_millis() as u64, "consumer ack timed out on channel");
            let error = AmqpError::precondition_failed(format!(
                "delivery acknowledgement on channel {channel_id} timed out. Timeout value used: {} ms. This timeout value can be configured, see consumers doc guide to learn more",
                timeout.as_millis()
            ));
            if let Flow::CloseWith(error, class_id, method_id) =
                self.channel_error(channel_id, error, (0, 0))
            {
                self.start_close(&error, class_id, method_id);
            }
        }
    }

    /// Waits for a channel's metadata change (bounded by the metadata log's
    /// own timeout), then lets the channel reply or fail.
    async fn finish_change(&mut self, waiting: WaitingChange) {
        let mut change = waiting.change;
        loop {
            let (proposal, then) = change.into_parts();
            let applied = proposal.await;
            let Some(channel) = self.channels.get_mut(&waiting.channel_id) else {
                return;
            };
            let outcome = then(channel, &self.context, applied);
            channel.flush_counts();
            if let Err(error) = outcome {
                let (class_id, method_id) = waiting.method_ids;
                if let Flow::CloseWith(error, class_id, method_id) =
                    self.channel_error(waiting.channel_id, error, (class_id, method_id))
                {
                    self.start_close(&error, class_id, method_id);
                }
                return;
            }
            // A method tried again after a read barrier may now propose.
            match channel.take_pending_change() {
                Some(next) => change = next,
                None => break,
            }
        }
        self.refresh_consumer_queues();
    }

    async fn wait_for_writer(&self) {
        let drained = self.context.outbox.drained();
        let _ = tokio::time::timeout(Duration::from_millis(100), drained).await;
    }

    fn send(&self, channel_id: u16, class: AMQPClass) {
        self.context
            .outbox
            .append(|out| encode_control(out, channel_id, &class));
    }

    /// Sends connection.close and stops handling anything but close-ok.
    fn start_close(&mut self, error: &AmqpError, class_id: u16, method_id: u16) {
        if self.closing {
            return;
        }
        tracing::warn!(peer = %self.peer, connection_id = self.context.connection_id, %error, "closing connection");
        self.closing = true;
        self.release_channels();
        self.send(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
                reply_code: error.code.code(),
                reply_text: error.reply_text(),
                class_id,
                method_id,
            })),
        );
    }

    /// Pauses reading while a queue this connection published into is
    /// congested (its consumers are behind), so the publisher is held to
    /// the rate the queue drains at. Returns false when a close request
    /// (shutdown, an operator) started a close during the wait.
    async fn wait_while_congested(&mut self, signal: &mut CloseSignal) -> bool {
        // A body that holds room is read to its end first (one message more
        // for the congested queue): paused mid-body, it would keep its room
        // from everyone else's, among them perhaps the consumers whose acks
        // would end the congestion. Its channels keep their congested queues
        // for the next look.
        if self.holds_body_room() {
            return true;
        }
        for channel in self.channels.values_mut() {
            channel.take_congested_queues(&mut self.congested_queues);
        }
        if self.congested_queues.is_empty() || self.closing {
            self.congested_queues.clear();
            return true;
        }
        // The registry hears of a pause only when there is one: most batches
        // end with no congested queue and cost nothing here.
        let mut paused = false;
        while let Some(queue) = self.congested_queues.last().cloned() {
            let uncongested = queue.uncongested();
            tokio::pin!(uncongested);
            uncongested.as_mut().enable();
            if !queue.is_congested() || queue.has_consumer_on(self.context.connection_id) {
                self.congested_queues.pop();
                continue;
            }
            if !paused {
                paused = true;
                self.registration.flow_started();
            }
            tokio::select! {
                _ = uncongested => {}
                _ = self.durable_rounds.changed(), if self.has_waiting_confirms() => {
                    self.flush_waiting_confirms();
                }
                error = signal.requested() => {
                    self.congested_queues.clear();
                    self.registration.flow_ended();
                    self.start_close(&error, 0, 0);
                    return false;
                }
            }
        }
        if paused {
            self.registration.flow_ended();
        }
        true
    }

    /// Pauses reading while a channel has `quorum_commands_soft_limit` or
    /// more messages not yet applied by one quorum queue, as RabbitMQ's
    /// queue client blocks its channel: each publisher waits on its own
    /// messages instead of filling the queue member's backlog for all.
    /// Every applied entry moves the confirm rounds on, so each round is
    /// a time to look again; a queue deleted meanwhile refuses what it held
    /// without one, hence the look every [`SLOW_RELOOK`] too. Returns false
    /// when a close request (shutdown, an operator) started a close during
    /// the wait.
    async fn wait_while_slow(&mut self, signal: &mut CloseSignal) -> bool {
        if self.closing || self.holds_body_room() {
            return true;
        }
        let mut paused = false;
        while self.channels.values_mut().any(Channel::is_slow) {
            if !paused {
                paused = true;
                self.registration.flow_started();
            }
            tokio::select! {
                changed = self.durable_rounds.changed() => {
                    if changed.is_err() {
                        // The node is stopping: no rounds come any more.
                        tokio::time::sleep(SLOW_RELOOK).await;
                    }
                }
                () = tokio::time::sleep(SLOW_RELOOK) => {}
                error = signal.requested() => {
                    self.registration.flow_ended();
                    self.start_close(&error, 0, 0);
                    return false;
                }
            }
            // The round may have completed confirms this wait would
            // otherwise hold back.
            self.flush_waiting_confirms();
        }
        if paused {
            self.registration.flow_ended();
        }
        true
    }

    /// A large body whose header found no room among the node's bodies
    /// under way (see `bodies_under_way`) is not read until it has room:
    /// the connection is not read meanwhile, as under an alarm, but its
    /// confirms go on. Returns false when a close request (shutdown, an
    /// operator) started a close during the wait.
    ///
    /// Only a connection that holds no room waits, and for one body: its
    /// frames come in the order the client interleaves its channels, so one
    /// whose body holds room must read on or that body never finishes (and
    /// the room never comes back). Its other large bodies go without room;
    /// the memory alarm still bounds them.
    async fn wait_for_room_for_bodies(&mut self, signal: &mut CloseSignal) -> bool {
        if !std::mem::take(&mut self.body_room_wanted) || self.closing || self.holds_body_room() {
            return true;
        }
        let Some((channel_id, bytes)) = self
            .channels
            .iter()
            .find_map(|(id, channel)| channel.body_room_wanted().map(|bytes| (*id, bytes)))
        else {
            return true;
        };
        tracing::debug!(peer = %self.peer, connection_id = self.context.connection_id, channel_id, bytes, "a large body waits for room among the bodies under way");
        let bodies = Arc::clone(&self.context.bodies_under_way);
        // One wait, kept across the confirms flushed meanwhile: made anew,
        // it would lose its place in the semaphore's queue.
        let reserve = bodies.reserve(bytes);
        tokio::pin!(reserve);
        let reservation = loop {
            tokio::select! {
                reservation = &mut reserve => break reservation,
                _ = self.durable_rounds.changed(), if self.has_waiting_confirms() => {
                    self.flush_waiting_confirms();
                }
                error = signal.requested() => {
                    self.start_close(&error, 0, 0);
                    return false;
                }
            }
        };
        if let Some(channel) = self.channels.get_mut(&channel_id) {
            channel.take_body_room(reservation);
        }
        true
    }

    /// Whether a body under way on one of this connection's channels holds
    /// room among the node's bodies under way.
    fn holds_body_room(&self) -> bool {
        self.channels.values().any(Channel::holds_body_room)
    }

    /// While a memory or disk alarm is set, a connection that publishes is
    /// not read (RabbitMQ's "blocked"); one that only consumes carries on,
    /// since its acks are what free memory. As in RabbitMQ, a connection is
    /// blocked when it publishes while the alarm is in effect, not before
    /// ("blocking" until then): one that published before the alarm but now
    /// only acks keeps being read. Clients that advertised the capability
    /// hear connection.blocked and connection.unblocked. Returns false when
    /// a close request started a close during the wait.
    async fn wait_while_alarmed(&mut self, signal: &mut CloseSignal) -> bool {
        let published = std::mem::take(&mut self.published_since_alarm_check);
        let alarms = *self.alarms.borrow();
        if !alarms.any() || !published || self.closing {
            return true;
        }
        let notify = self.context.client_capabilities.connection_blocked;
        self.registration.blocked();
        tracing::info!(peer = %self.peer, connection_id = self.context.connection_id, reason = alarms.reason(), "connection blocked");
        if notify {
            self.send(
                0,
                AMQPClass::Connection(connection::AMQPMethod::Blocked(connection::Blocked {
                    reason: alarms.reason().into(),
                })),
            );
        }
        loop {
            tokio::select! {
                changed = self.alarms.changed() => {
                    // A monitor that stopped raises no alarm any more.
                    if changed.is_err() || !self.alarms.borrow().any() {
                        break;
                    }
                }
                _ = self.durable_rounds.changed(), if self.has_waiting_confirms() => {
                    self.flush_waiting_confirms();
                }
                error = signal.requested() => {
                    self.registration.unblocked();
                    self.start_close(&error, 0, 0);
                    return false;
                }
            }
        }
        self.registration.unblocked();
        tracing::info!(peer = %self.peer, connection_id = self.context.connection_id, "connection unblocked");
        if notify {
            self.send(
                0,
                AMQPClass::Connection(connection::AMQPMethod::Unblocked(connection::Unblocked {})),
            );
        }
        true
    }

    fn has_waiting_confirms(&self) -> bool {
        self.channels.values().any(Channel::has_waiting_confirms)
    }

    fn flush_waiting_confirms(&mut self) {
        let mut failed = Vec::new();
        for (channel_id, channel) in self.channels.iter_mut() {
            if channel.has_waiting_confirms() {
                if let Err(error) = channel.flush_confirms(&self.context) {
                    failed.push((*channel_id, error));
                }
                channel.flush_counts();
            }
        }
        self.close_failed_commits(failed);
    }

    /// The end of a read batch: the confirms and counts of the channels
    /// that handled its frames.
    fn flush_batch(&mut self) {
        let mut failed = Vec::new();
        for channel_id in self.batch_channels.drain(..) {
            if let Some(channel) = self.channels.get_mut(&channel_id) {
                if channel.has_confirms() {
                    if let Err(error) = channel.flush_confirms(&self.context) {
                        failed.push((channel_id, error));
                    }
                }
                channel.flush_counts();
            }
        }
        self.close_failed_commits(failed);
    }

    /// Closes the channels whose committed transaction could not be
    /// completed, naming tx.commit as RabbitMQ does.
    fn close_failed_commits(&mut self, failed: Vec<(u16, AmqpError)>) {
        const TX_COMMIT: (u16, u16) = (90, 20);
        for (channel_id, error) in failed {
            if let Flow::CloseWith(error, class_id, method_id) =
                self.channel_error(channel_id, error, TX_COMMIT)
            {
                self.start_close(&error, class_id, method_id);
            }
        }
    }

    fn handle_frame(&mut self, frame: Frame) -> Flow {
        if self.closing {
            return self.frame_while_closing(&frame);
        }
        match frame.frame_type {
            FrameType::Heartbeat => check_heartbeat(&frame),
            FrameType::Method | FrameType::Header | FrameType::Body => {
                let channel_id = frame.channel;
                let flow = if frame.frame_type == FrameType::Method {
                    self.handle_method_frame(frame)
                } else {
                    self.handle_content_frame(frame)
                };
                // Any frame may have completed a publish (its last content
                // frame can come in a later read than its method) or
                // settled deliveries: flush that channel's confirms and
                // counts at the end of this batch.
                if !self.batch_channels.contains(&channel_id) {
                    self.batch_channels.push(channel_id);
                }
                flow
            }
        }
    }

    /// After our connection.close only close-ok (or a crossing close)
    /// matters.
    fn frame_while_closing(&mut self, frame: &Frame) -> Flow {
        if frame.frame_type != FrameType::Method || frame.channel != 0 {
            return Flow::Continue;
        }
        match decode_method(&frame.payload) {
            Ok(Method::Control(AMQPClass::Connection(connection::AMQPMethod::CloseOk(_)))) => {
                Flow::Finished
            }
            Ok(Method::Control(AMQPClass::Connection(connection::AMQPMethod::Close(_)))) => {
                self.send(
                    0,
                    AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})),
                );
                Flow::Finished
            }
            _ => Flow::Continue,
        }
    }

    fn handle_method_frame(&mut self, frame: Frame) -> Flow {
        let method = match decode_method_frame(&frame) {
            Ok(method) => method,
            Err(flow) => return flow,
        };
        if frame.channel == 0 {
            return self.handle_connection_method(method);
        }
        let ids = method_ids(&method);
        let channel_id = frame.channel;
        if let Method::Control(AMQPClass::Channel(channel::AMQPMethod::Open(_))) = &method {
            return self.open_channel(channel_id);
        }
        let Some(channel) = self.channels.get_mut(&channel_id) else {
            return Flow::CloseWith(
                AmqpError::channel_error("expected 'channel.open'"),
                ids.0,
                ids.1,
            );
        };
        if channel.closing {
            return self.method_on_closing_channel(channel_id, method);
        }
        if channel.expects_content() {
            return content_cut_short(channel);
        }
        let context = &self.context;
        let result = match method {
            Method::Publish(publish) => {
                self.published_since_alarm_check = true;
                self.publishes_in_batch += 1;
                channel.handle_publish(publish)
            }
            Method::Ack(ack) => channel.handle_ack(ack),
            Method::Nack(nack) => channel.handle_nack(nack),
            Method::Reject(reject) => channel.handle_reject(reject),
            Method::Control(AMQPClass::Channel(channel::AMQPMethod::Close(close))) => {
                tracing::debug!(
                    channel_id,
                    reply_code = close.reply_code,
                    "client closed channel"
                );
                channel.release(context);
                self.channels.remove(&channel_id);
                self.send(
                    channel_id,
                    AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
                );
                return Flow::Continue;
            }
            Method::Control(AMQPClass::Channel(channel::AMQPMethod::CloseOk(_))) => Ok(()),
            Method::Control(class) => {
                let is_consume = matches!(
                    class,
                    AMQPClass::Basic(
                        amq_protocol::protocol::basic::AMQPMethod::Consume(_)
                            | amq_protocol::protocol::basic::AMQPMethod::Cancel(_)
                    )
                );
                // Kept to ask again should this node's copy of the metadata
                // lack what it names (see `retry_after_sync`).
                let again = (looks_up_metadata(&class) && context.broker.metadata.is_replicated())
                    .then(|| class.clone());
                let result = channel.handle_control(context, class);
                if let (Err(error), Some(class)) = (&result, again) {
                    if error.code == ReplyCode::NotFound {
                        return Flow::AwaitChange(retry_after_sync(
                            context, channel_id, ids, class,
                        ));
                    }
                }
                if let Some(change) = channel.take_pending_change() {
                    if result.is_ok() {
                        return Flow::AwaitChange(WaitingChange {
                            channel_id,
                            method_ids: ids,
                            change,
                        });
                    }
                }
                if is_consume && result.is_ok() {
                    self.refresh_consumer_queues();
                }
                result
            }
        };
        match result {
            Ok(()) => Flow::Continue,
            Err(error) => self.channel_error(channel_id, error, ids),
        }
    }

    /// After our channel.close only its close-ok (or a crossing close)
    /// matters; anything else is dropped, as the specification asks.
    fn method_on_closing_channel(&mut self, channel_id: u16, method: Method) -> Flow {
        match method {
            Method::Control(AMQPClass::Channel(channel::AMQPMethod::CloseOk(_))) => {
                self.channels.remove(&channel_id);
            }
            Method::Control(AMQPClass::Channel(channel::AMQPMethod::Close(_))) => {
                // The two closes crossed. Answered, but the channel
                // stays closing until the client's close-ok for ours, as
                // in RabbitMQ: forgotten now, that close-ok would land on
                // an unknown channel and close the whole connection.
                self.send(
                    channel_id,
                    AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
                );
            }
            _ => {}
        }
        Flow::Continue
    }

    fn handle_content_frame(&mut self, frame: Frame) -> Flow {
        // The header and body of a publish are publishing too: a body under
        // way when an alarm goes off is not read on past it, whatever its
        // size.
        self.published_since_alarm_check = true;
        let channel_id = frame.channel;
        // Content on channel 0 or on a channel never opened: RabbitMQ's
        // command assembler expects a method there.
        let Some(channel) = self.channels.get_mut(&channel_id) else {
            return Flow::CloseWith(
                AmqpError::unexpected_frame("expected method frame, got non method frame instead"),
                0,
                0,
            );
        };
        if channel.closing {
            return Flow::Continue;
        }
        let result = if frame.frame_type == FrameType::Header {
            let handled = match decode_content_header(&frame.payload) {
                Ok(header) => channel.handle_content_header(&self.context, header),
                Err(error) => Err(AmqpError::frame_error(error.to_string())),
            };
            self.body_room_wanted |= channel.body_room_wanted().is_some();
            handled
        } else {
            channel.handle_content_body(&self.context, frame.payload)
        };
        self.soft_limit_reached |= channel.take_soft_limit_reached();
        match result {
            Ok(()) => Flow::Continue,
            Err(error) => self.channel_error(channel_id, error, (60, 40)),
        }
    }

    /// Soft errors close the channel; hard ones the whole connection.
    fn channel_error(
        &mut self,
        channel_id: u16,
        error: AmqpError,
        (class_id, method_id): (u16, u16),
    ) -> Flow {
        if error.code.is_hard_error() {
            return Flow::CloseWith(error, class_id, method_id);
        }
        tracing::debug!(peer = %self.peer, channel_id, %error, "closing channel");
        if let Some(channel) = self.channels.get_mut(&channel_id) {
            // Confirms already earned still go out; a transaction still
            // waiting for the disk is abandoned with the channel.
            let _ = channel.flush_confirms(&self.context);
            channel.release(&self.context);
            channel.closing = true;
        }
        self.send(
            channel_id,
            AMQPClass::Channel(channel::AMQPMethod::Close(channel::Close {
                reply_code: error.code.code(),
                reply_text: error.reply_text(),
                class_id,
                method_id,
            })),
        );
        Flow::Continue
    }

    fn open_channel(&mut self, channel_id: u16) -> Flow {
        if channel_id > self.context.channel_max {
            return Flow::CloseWith(
                AmqpError::not_allowed(format!(
                    "channel id {channel_id} is above the negotiated channel_max {}",
                    self.context.channel_max
                )),
                20,
                10,
            );
        }
        if self.channels.contains_key(&channel_id) {
            return Flow::CloseWith(
                AmqpError::channel_error("second 'channel.open' seen"),
                20,
                10,
            );
        }
        self.channels
            .insert(channel_id, Channel::new(channel_id, &self.context));
        self.send(
            channel_id,
            AMQPClass::Channel(channel::AMQPMethod::OpenOk(channel::OpenOk {})),
        );
        Flow::Continue
    }

    fn handle_connection_method(&mut self, method: Method) -> Flow {
        match method {
            Method::Control(AMQPClass::Connection(connection::AMQPMethod::Close(close))) => {
                tracing::debug!(peer = %self.peer, reply_code = close.reply_code, "client closed connection");
                // Close-ok once what the connection held is released
                // (`release`), its exclusive queues deleted.
                self.release_channels();
                self.close_ok_owed = true;
                Flow::Finished
            }
            Method::Control(AMQPClass::Connection(connection::AMQPMethod::CloseOk(_))) => {
                Flow::Finished
            }
            Method::Control(AMQPClass::Connection(connection::AMQPMethod::UpdateSecret(_))) => {
                self.send(
                    0,
                    AMQPClass::Connection(connection::AMQPMethod::UpdateSecretOk(
                        connection::UpdateSecretOk {},
                    )),
                );
                Flow::Continue
            }
            other => {
                let (class_id, method_id) = method_ids(&other);
                Flow::CloseWith(
                    AmqpError::channel_error("unexpected method in connection state running"),
                    class_id,
                    method_id,
                )
            }
        }
    }

    fn refresh_consumer_queues(&self) {
        let mut queues = self
            .consumer_queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        queues.clear();
        for channel in self.channels.values() {
            for queue in channel.consumer_queues() {
                if !queues.iter().any(|known| same_queue(known, &queue)) {
                    queues.push(queue);
                }
            }
        }
    }

    /// Closes every channel: each stops taking deliveries before any message
    /// is requeued, or one channel's messages would go to another channel of
    /// this connection and come back at its release, once more per channel.
    /// The requeue itself, and what follows it, is [`Self::finish_releasing`].
    fn release_channels(&mut self) {
        let releasing = self.releasing.get_or_insert_with(Default::default);
        for (_, mut channel) in self.channels.drain() {
            releasing
                .unacked
                .extend(channel.close_deliveries(&self.context));
            releasing.channels.push(channel);
        }
    }

    /// Requeues what the channels closed by [`Self::release_channels`] held,
    /// in slices that let other connections run, then cancels their
    /// consumers.
    ///
    /// Channels are taken out one at a time: should finishing one panic,
    /// the others stay to be finished by the release that follows.
    async fn finish_releasing(&mut self) {
        let Some(releasing) = self.releasing.as_mut() else {
            return;
        };
        let unacked = std::mem::take(&mut releasing.unacked);
        requeue_in_slices(unacked).await;
        while let Some(mut channel) = self
            .releasing
            .as_mut()
            .and_then(|releasing| releasing.channels.pop())
        {
            channel.finish_release(&self.context);
        }
        self.releasing = None;
        self.refresh_consumer_queues();
    }

    /// Channels open or closed but not yet done with.
    fn channels_to_release(&self) -> usize {
        self.channels.len()
            + self
                .releasing
                .as_ref()
                .map_or(0, |releasing| releasing.channels.len())
    }

    /// The connection is gone: channels released, exclusive queues deleted,
    /// and then, when the client closed it, close-ok: as with RabbitMQ, a
    /// client that declares the same exclusive queue on a new connection
    /// right after close-ok finds it gone, not locked.
    async fn release(&mut self, shutting_down: bool) {
        self.release_channels();
        self.finish_releasing().await;
        let deleted = self
            .context
            .vhost
            .remove_exclusive_queues(self.context.connection_id);
        // Bounded: without a majority a deletion fails within the metadata
        // log's own bound, and this one more is a backstop. A node shutting
        // down does not wait: the deletions go on without it.
        let wait = if shutting_down {
            Duration::ZERO
        } else {
            EXCLUSIVE_DELETION_WAIT_MAX
        };
        match tokio::time::timeout(wait, deleted).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(peer = %self.peer, connection_id = self.context.connection_id, %error, "an exclusive queue of a closed connection could not be deleted yet");
            }
            Err(_) if shutting_down => {}
            Err(_) => {
                tracing::warn!(peer = %self.peer, connection_id = self.context.connection_id, waited = ?wait, "the deletion of a closed connection's exclusive queues is still under way; close-ok goes first");
            }
        }
        if std::mem::take(&mut self.close_ok_owed) {
            self.send(
                0,
                AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})),
            );
        }
    }
}

/// How often a connection paused by `quorum_commands_soft_limit` looks at
/// its channels again when no confirm round came.
const SLOW_RELOOK: Duration = Duration::from_millis(50);

/// The longest a closing connection waits for its exclusive queues'
/// deletion before it says close-ok anyway.
const EXCLUSIVE_DELETION_WAIT_MAX: Duration = Duration::from_secs(10);

/// How often a connection looks for deliveries past `consumer_timeout`.
fn timeout_check_interval(timeout: Duration) -> Duration {
    (timeout / 2).clamp(Duration::from_millis(10), Duration::from_secs(30))
}

/// Resolves when the next look for deliveries past `consumer_timeout` is
/// due; never without one.
async fn consumer_timeout_check(timeout: Option<(Duration, tokio::time::Instant)>) {
    match timeout {
        Some((_, next_check)) => tokio::time::sleep_until(next_check).await,
        None => std::future::pending().await,
    }
}

/// Methods that name an exchange or queue which may have been declared
/// through another node a moment ago.
fn looks_up_metadata(class: &AMQPClass) -> bool {
    use amq_protocol::protocol::basic;
    matches!(
        class,
        AMQPClass::Exchange(_)
            | AMQPClass::Queue(_)
            | AMQPClass::Basic(basic::AMQPMethod::Consume(_) | basic::AMQPMethod::Get(_))
    )
}

/// A lookup found nothing in this node's copy of the metadata, which may
/// lag a change another node already answered: wait until this node has
/// applied everything committed so far, then handle the method again. If
/// the cluster cannot say (no majority), the local copy answers.
fn retry_after_sync(
    context: &ConnectionContext,
    channel_id: u16,
    method_ids: (u16, u16),
    class: AMQPClass,
) -> WaitingChange {
    let change = PendingChange::new(
        context.broker.metadata.sync(),
        Box::new(
            move |channel: &mut Channel, context: &ConnectionContext, _synced| {
                channel.handle_control(context, class)
            },
        ),
    );
    WaitingChange {
        channel_id,
        method_ids,
        change,
    }
}

fn method_ids(method: &Method) -> (u16, u16) {
    match method {
        Method::Publish(_) => (60, 40),
        Method::Ack(_) => (60, 80),
        Method::Reject(_) => (60, 90),
        Method::Nack(_) => (60, 120),
        Method::Control(class) => (class.get_amqp_class_id(), class.get_amqp_method_id()),
    }
}
