//! One producer: its own connection and channel, a [`RateLimiter`], and with confirms an
//! [`InflightWindow`] and the queue of confirms it is waiting for.
//!
//! A producer is one tokio task, whatever the rate: it sleeps until the next message is due,
//! or until the broker confirms when the window is full. Confirms are awaited in publish
//! order (the broker confirms in that order on a channel); the ones that are ready are
//! settled before every publish, so confirm latency is measured to within one publish.
//!
//! lapin writes frames on its own I/O thread and resolves a publish once its frames are
//! written. Waiting for that before the next publish would cost two thread hand-offs per
//! message (a fifth of what PerfTest reaches), so publishes are pipelined: each publish is
//! started (its frames queued, in order) and kept as a pending future, which resolves when
//! its frames are written and, with confirms, when the broker confirms. Without confirms at
//! most [`WRITES_PENDING_MAX`] publishes wait for the socket, so a broker that stops reading
//! (TCP back pressure) stops the producer instead of growing lapin's buffers.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use futures_lite::future;
use lapin::options::BasicPublishOptions;
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Confirmation, Connection, PublisherConfirm};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::body::{self, Clock};
use crate::inflight::InflightWindow;
use crate::rate_limiter::RateLimiter;
use crate::stats::Stats;
use crate::workload::Workload;
use crate::PerfError;

/// Publishes started and not yet written to the socket, without confirms. Enough to let
/// lapin's I/O thread write many messages per wake-up; small enough that TCP back pressure
/// reaches the producer within a few hundred kilobytes.
pub const WRITES_PENDING_MAX: usize = 256;

/// AMQP delivery-mode for persistent messages.
const DELIVERY_MODE_PERSISTENT: u8 = 2;

pub struct Publisher {
    pub connection: Connection,
    channel: Arc<Channel>,
    exchange: ShortString,
    routing_key: ShortString,
    options: BasicPublishOptions,
    properties: BasicProperties,
    size: usize,
    /// `None`: no confirms.
    confirm: Option<u64>,
    message_limit: Option<u64>,
    clock: Clock,
    stats: Arc<Stats>,
}

/// A started publish: resolves once written (without confirms, to `NotRequested`) or
/// confirmed.
type PendingPublish = Pin<Box<dyn Future<Output = lapin::Result<Confirmation>> + Send>>;

type PendingConfirm = (StdInstant, PendingPublish);

impl Publisher {
    /// Opens the producer's channel (in confirm mode if the workload asks for confirms).
    ///
    /// # Errors
    /// [`PerfError::Amqp`] if the channel cannot be opened.
    pub async fn open(
        connection: Connection,
        workload: &Workload,
        routing_key: String,
        stats: Arc<Stats>,
    ) -> Result<Publisher, PerfError> {
        let channel = connection
            .create_channel()
            .await
            .map_err(PerfError::amqp("opening a producer channel"))?;
        if workload.confirm.is_some() {
            channel
                .confirm_select(Default::default())
                .await
                .map_err(PerfError::amqp("confirm.select"))?;
        }
        let mut properties = BasicProperties::default();
        if workload.persistent() {
            properties = properties.with_delivery_mode(DELIVERY_MODE_PERSISTENT);
        }
        Ok(Publisher {
            connection,
            channel: Arc::new(channel),
            exchange: workload.exchange.as_str().into(),
            routing_key: routing_key.into(),
            options: BasicPublishOptions {
                mandatory: workload.mandatory(),
                immediate: false,
            },
            properties,
            size: workload.size,
            confirm: workload.confirm,
            message_limit: workload.pmessages,
            clock: if workload.use_millis {
                Clock::UnixMillis
            } else {
                Clock::MonotonicNanos
            },
            stats,
        })
    }

    /// Publishes on `limiter`'s schedule until `stop` turns true or the message limit is reached.
    ///
    /// # Errors
    /// [`PerfError::Amqp`] if publishing fails (the connection or channel was closed).
    pub async fn run(
        self,
        mut limiter: RateLimiter,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Publisher, PerfError> {
        let mut window = InflightWindow::new(self.confirm.unwrap_or(0));
        let mut pending: VecDeque<PendingConfirm> = VecDeque::new();
        let mut body = body::new_body(self.size);
        let mut sequence: u32 = 0;
        loop {
            if *stop.borrow() || self.message_limit.is_some_and(|n| window.published() >= n) {
                break;
            }
            self.settle_ready(&mut pending, &mut window).await;
            let full = match self.confirm {
                Some(_) => !window.has_room(),
                None => pending.len() >= WRITES_PENDING_MAX,
            };
            if full {
                tokio::select! {
                    biased;
                    _ = stop.changed() => break,
                    confirmation = next_confirm(&mut pending) => {
                        self.settle(confirmation, &mut window);
                    }
                }
                continue;
            }
            if let Some(due) = limiter.try_acquire(Instant::now()) {
                tokio::select! {
                    biased;
                    _ = stop.changed() => break,
                    confirmation = next_confirm(&mut pending), if !pending.is_empty() => {
                        self.settle(confirmation, &mut window);
                    }
                    _ = tokio::time::sleep_until(due) => {}
                }
                continue;
            }
            body::stamp(&mut body, sequence, self.clock.now());
            sequence = sequence.wrapping_add(1);
            let sent_at = StdInstant::now();
            let mut publish = self.start_publish(body.clone());
            // The first poll queues the frames; a publish that fails at once (closed
            // channel) ends the producer with its error.
            if let Some(result) = future::poll_once(&mut publish).await {
                let confirmation = result.map_err(PerfError::amqp("basic.publish"))?;
                window.on_publish();
                self.stats.on_published();
                self.settle((sent_at, Ok(confirmation)), &mut window);
                continue;
            }
            window.on_publish();
            self.stats.on_published();
            pending.push_back((sent_at, publish));
        }
        // After the last of a message limit, the outstanding publishes and
        // confirms still belong to the run: wait for them (bounded) so the
        // counts are complete and the connection closes with nothing in flight.
        let deadline = tokio::time::Instant::now() + FINAL_CONFIRMS_WAIT_MAX;
        while !pending.is_empty() && !*stop.borrow() {
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                _ = tokio::time::sleep_until(deadline) => break,
                confirmation = next_confirm(&mut pending) => {
                    self.settle(confirmation, &mut window);
                }
            }
        }
        Ok(self)
    }

    fn start_publish(&self, body: Vec<u8>) -> PendingPublish {
        let channel = Arc::clone(&self.channel);
        let (exchange, routing_key) = (self.exchange.clone(), self.routing_key.clone());
        let (options, properties) = (self.options, self.properties.clone());
        Box::pin(async move {
            let confirm: PublisherConfirm = channel
                .basic_publish(exchange, routing_key, options, &body, properties)
                .await?;
            confirm.await
        })
    }

    /// Settles the confirms at the front of the queue that have already arrived.
    async fn settle_ready(
        &self,
        pending: &mut VecDeque<PendingConfirm>,
        window: &mut InflightWindow,
    ) {
        while let Some((_, confirm)) = pending.front_mut() {
            match future::poll_once(confirm).await {
                Some(result) => {
                    let (sent_at, _) = pending.pop_front().expect("front exists");
                    self.settle((sent_at, result), window);
                }
                None => break,
            }
        }
    }

    fn settle(
        &self,
        (sent_at, result): (StdInstant, lapin::Result<Confirmation>),
        window: &mut InflightWindow,
    ) {
        // A failed publish means the channel is gone; the next publish reports it.
        let Ok(confirmation) = result else { return };
        if confirmation == Confirmation::NotRequested {
            return;
        }
        let acked = confirmation.is_ack();
        if confirmation.take_message().is_some() {
            self.stats.on_returned();
        }
        window.on_confirm(acked);
        self.stats
            .on_confirm(acked, sent_at.elapsed().as_micros() as u64);
    }
}

/// How long a producer that reached its message limit waits for its last
/// confirms before it stops.
const FINAL_CONFIRMS_WAIT_MAX: Duration = Duration::from_secs(30);

/// Waits for the oldest outstanding confirm. Cancel-safe: the confirm stays queued until it
/// resolves.
async fn next_confirm(
    pending: &mut VecDeque<PendingConfirm>,
) -> (StdInstant, lapin::Result<Confirmation>) {
    let (_, confirm) = pending
        .front_mut()
        .expect("next_confirm is only called with confirms pending");
    let result = confirm.await;
    let (sent_at, _) = pending.pop_front().expect("front exists");
    (sent_at, result)
}
