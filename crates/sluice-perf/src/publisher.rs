//! One producer: its own connection and channel, a [`RateLimiter`], and with confirms an
//! [`InflightWindow`] and the publishes it is waiting to have confirmed.
//!
//! A producer is one tokio task, whatever the rate, and writes its own socket: it sleeps
//! until the next message is due, or until the broker confirms when the window is full, and
//! reads the confirms that arrived whenever it wakes, so confirm latency is measured to
//! within one wake-up. A publish returns once its frames are in the kernel's send buffer:
//! without confirms, a broker that stops reading (TCP back pressure) stops the producer
//! there, as it stops PerfTest's publisher thread, with nothing queued in between.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use sluice_wire::amq_protocol::protocol::{confirm, AMQPClass};
use sluice_wire::content::RawProperties;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::body::{self, Clock};
use crate::client::{self, ClientConnection, Incoming};
use crate::inflight::InflightWindow;
use crate::rate_limiter::RateLimiter;
use crate::stats::Stats;
use crate::topology::unexpected_answer;
use crate::workload::Workload;
use crate::PerfError;

pub struct Publisher {
    pub connection: ClientConnection,
    channel: u16,
    exchange: String,
    routing_key: String,
    mandatory: bool,
    properties: RawProperties,
    size: usize,
    /// `None`: no confirms.
    confirm: Option<u64>,
    message_limit: Option<u64>,
    clock: Clock,
    stats: Arc<Stats>,
}

/// A publish waiting for its confirm: its sequence number on the channel (the delivery tag
/// the broker confirms it with) and when it was sent.
type PendingConfirm = (u64, StdInstant);

impl Publisher {
    /// Opens the producer's channel (in confirm mode if the workload asks for confirms).
    ///
    /// # Errors
    /// [`PerfError::Amqp`] if the channel cannot be opened.
    pub async fn open(
        mut connection: ClientConnection,
        workload: &Workload,
        routing_key: String,
        stats: Arc<Stats>,
    ) -> Result<Publisher, PerfError> {
        let channel = connection
            .open_channel()
            .await
            .map_err(PerfError::amqp("opening a producer channel"))?;
        if workload.confirm.is_some() {
            let answer = connection
                .call(
                    channel,
                    AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select {
                        nowait: false,
                    })),
                )
                .await
                .map_err(PerfError::amqp("confirm.select"))?;
            if !matches!(answer, AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(_))) {
                return Err(unexpected_answer("confirm.select".into(), &answer));
            }
        }
        Ok(Publisher {
            connection,
            channel,
            exchange: workload.exchange.clone(),
            routing_key,
            mandatory: workload.mandatory(),
            properties: client::publish_properties(workload.persistent()),
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
        mut self,
        mut limiter: RateLimiter,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Publisher, PerfError> {
        let mut window = InflightWindow::new(self.confirm.unwrap_or(0));
        let mut pending: VecDeque<PendingConfirm> = VecDeque::new();
        let mut body = body::new_body(self.size);
        let mut sequence: u32 = 0;
        loop {
            self.settle_arrived(&mut pending, &mut window)?;
            if *stop.borrow() || self.message_limit.is_some_and(|n| window.published() >= n) {
                break;
            }
            if self.confirm.is_some() && !window.has_room() {
                tokio::select! {
                    biased;
                    _ = stop.changed() => break,
                    read = self.connection.read_more() => {
                        read.map_err(PerfError::amqp("waiting for confirms"))?;
                    }
                }
                continue;
            }
            if let Some(due) = limiter.try_acquire(Instant::now()) {
                tokio::select! {
                    biased;
                    _ = stop.changed() => break,
                    read = self.connection.read_more() => {
                        read.map_err(PerfError::amqp("waiting for confirms"))?;
                    }
                    _ = tokio::time::sleep_until(due) => {}
                }
                continue;
            }
            body::stamp(&mut body, sequence, self.clock.now());
            sequence = sequence.wrapping_add(1);
            self.connection.publish(
                self.channel,
                &self.exchange,
                &self.routing_key,
                self.mandatory,
                &self.properties,
                &body,
            );
            window.on_publish();
            self.stats.on_published();
            if self.confirm.is_some() {
                pending.push_back((window.published(), StdInstant::now()));
            }
            // A broker that stops reading (a congested queue, an alarm) holds the publish
            // here; the run's end must not wait for it, as the consumers that would drain
            // the queue stop too. What is left unwritten goes out with the close.
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                flushed = self.connection.flush() => {
                    flushed.map_err(PerfError::amqp("basic.publish"))?;
                }
            }
        }
        // After the last of a message limit, the outstanding confirms still belong to the
        // run: wait for them (bounded) so the counts are complete and the connection closes
        // with nothing in flight.
        let deadline = Instant::now() + FINAL_CONFIRMS_WAIT_MAX;
        while !pending.is_empty() && !*stop.borrow() {
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                _ = tokio::time::sleep_until(deadline) => break,
                read = self.connection.read_more() => {
                    read.map_err(PerfError::amqp("waiting for confirms"))?;
                }
            }
            self.settle_arrived(&mut pending, &mut window)?;
        }
        Ok(self)
    }

    /// Settles every confirm and return read so far.
    fn settle_arrived(
        &mut self,
        pending: &mut VecDeque<PendingConfirm>,
        window: &mut InflightWindow,
    ) -> Result<(), PerfError> {
        while let Some(incoming) = self
            .connection
            .next_incoming()
            .map_err(PerfError::amqp("basic.publish"))?
        {
            match incoming {
                Incoming::Confirm {
                    delivery_tag,
                    multiple,
                    acked,
                } => {
                    let mut settle = |sent_at: StdInstant| {
                        window.on_confirm(acked);
                        self.stats
                            .on_confirm(acked, sent_at.elapsed().as_micros() as u64);
                    };
                    if multiple {
                        while let Some(&(tag, sent_at)) = pending.front() {
                            if tag > delivery_tag {
                                break;
                            }
                            pending.pop_front();
                            settle(sent_at);
                        }
                    } else if let Ok(at) =
                        pending.binary_search_by_key(&delivery_tag, |&(tag, _)| tag)
                    {
                        if let Some((_, sent_at)) = pending.remove(at) {
                            settle(sent_at);
                        }
                    }
                }
                Incoming::Returned => self.stats.on_returned(),
                // Nothing is consumed on a producer's channel.
                Incoming::Delivery { .. } | Incoming::Cancelled => {}
            }
        }
        Ok(())
    }
}

/// How long a producer that reached its message limit waits for its last
/// confirms before it stops.
const FINAL_CONFIRMS_WAIT_MAX: Duration = Duration::from_secs(30);
