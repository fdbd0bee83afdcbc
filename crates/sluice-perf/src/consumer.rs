//! One consumer: its own connection and channel, prefetch, a queue (named, or its own
//! server-named one bound with the run's routing key, as PerfTest does), and acks one by
//! one, every N with `multiple`, or none with `--autoack`.
//!
//! Acks are queued on the channel without waiting for them to be written (see `run`).
//!
//! Latency is taken when the delivery arrives, from the timestamp in the body
//! ([`crate::body`]); `--consumer-rate` then paces the consumer before it acks, as
//! PerfTest's does.

use std::sync::Arc;

use futures_lite::{future, StreamExt as _};
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueBindOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer as LapinConsumer};
use tokio::sync::watch;

use crate::body::{self, Clock};
use crate::rate_limiter::RateLimiter;
use crate::stats::Stats;
use crate::topology;
use crate::workload::Workload;
use crate::PerfError;

pub struct Consumer {
    pub connection: Connection,
    /// Acks go through the channel, not the delivery's `Acker` (see `run`).
    channel: Channel,
    deliveries: LapinConsumer,
    autoack: bool,
    /// Ack with `multiple` every this many deliveries; 1 acks each one.
    ack_every: u32,
    message_limit: Option<u64>,
    clock: Clock,
    stats: Arc<Stats>,
}

impl Consumer {
    /// Opens the consumer's channel, sets prefetch, declares its own queue when the workload
    /// has no named queues, and starts consuming.
    ///
    /// # Errors
    /// [`PerfError::Amqp`] for any refused step.
    pub async fn open(
        connection: Connection,
        workload: &Workload,
        queue: Option<String>,
        run_key: &str,
        stats: Arc<Stats>,
    ) -> Result<Consumer, PerfError> {
        let channel = connection
            .create_channel()
            .await
            .map_err(PerfError::amqp("opening a consumer channel"))?;
        if let Some(qos) = workload.qos.filter(|&qos| qos > 0) {
            channel
                .basic_qos(qos, BasicQosOptions::default())
                .await
                .map_err(PerfError::amqp("basic.qos"))?;
        }
        let queue = match queue {
            Some(queue) => queue,
            None => {
                let name = topology::declare_queue(&channel, workload, "").await?;
                if !workload.exchange.is_empty() {
                    let key = workload.routing_key.as_deref().unwrap_or(run_key);
                    channel
                        .queue_bind(
                            name.as_str().into(),
                            workload.exchange.as_str().into(),
                            key.into(),
                            QueueBindOptions::default(),
                            FieldTable::default(),
                        )
                        .await
                        .map_err(PerfError::amqp("queue.bind"))?;
                }
                name
            }
        };
        let deliveries = channel
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: workload.autoack,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(PerfError::amqp("basic.consume"))?;
        Ok(Consumer {
            connection,
            channel,
            deliveries,
            autoack: workload.autoack,
            ack_every: workload.multi_ack_every.unwrap_or(1).max(1),
            message_limit: workload.cmessages,
            clock: if workload.use_millis {
                Clock::UnixMillis
            } else {
                Clock::MonotonicNanos
            },
            stats,
        })
    }

    /// Consumes until `stop` turns true, the message limit is reached or the broker cancels.
    ///
    /// # Errors
    /// [`PerfError::Amqp`] if a delivery or an ack fails.
    pub async fn run(
        mut self,
        mut limiter: RateLimiter,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Consumer, PerfError> {
        let mut unacked: u32 = 0;
        let mut consumed: u64 = 0;
        loop {
            if *stop.borrow() || self.message_limit.is_some_and(|n| consumed >= n) {
                break;
            }
            let delivery = tokio::select! {
                biased;
                _ = stop.changed() => break,
                delivery = self.deliveries.next() => delivery,
            };
            let Some(delivery) = delivery else { break };
            let delivery = delivery.map_err(PerfError::amqp("receiving a delivery"))?;
            let latency_us =
                body::timestamp(&delivery.data).and_then(|stamp| self.clock.elapsed_us(stamp));
            self.stats.on_consumed(latency_us);
            consumed += 1;
            if limiter.is_limited() {
                tokio::select! {
                    biased;
                    _ = stop.changed() => break,
                    _ = limiter.acquire() => {}
                }
            }
            if self.autoack {
                continue;
            }
            unacked += 1;
            if unacked >= self.ack_every {
                // The first poll queues the ack frame on the channel, in order; waiting
                // for it to be written would cost two thread hand-offs per message.
                // `Acker::ack` is not used: lapin spawns a task per acker call, so two
                // multiple acks can reach the wire in either order, and the broker
                // rightly refuses the older one with 406 "unknown delivery tag".
                // A failed ack means the channel is gone, which the delivery stream
                // reports next.
                let ack = self.channel.basic_ack(
                    delivery.delivery_tag,
                    BasicAckOptions {
                        multiple: self.ack_every > 1,
                    },
                );
                if let Some(Err(err)) = future::poll_once(ack).await {
                    return Err(PerfError::amqp("basic.ack")(err));
                }
                unacked = 0;
            }
        }
        Ok(self)
    }
}
