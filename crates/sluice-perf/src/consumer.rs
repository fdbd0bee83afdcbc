//! One consumer: its own connection and channel, prefetch, a queue (named, or its own
//! server-named one bound with the run's routing key, as PerfTest does), and acks one by
//! one, every N with `multiple`, or none with `--autoack`.
//!
//! The consumer task reads its own socket: it handles every delivery one read brought, then
//! writes the acks they call for in one write.
//!
//! Latency is taken when the delivery is read, from the timestamp in the body
//! ([`crate::body`]); `--consumer-rate` then paces the consumer before it acks, as
//! PerfTest's does.

use std::sync::Arc;

use sluice_wire::amq_protocol::protocol::{basic, AMQPClass};
use sluice_wire::amq_protocol::types::FieldTable;
use tokio::sync::watch;

use crate::body::{self, Clock};
use crate::client::{short_string, ClientConnection, Incoming};
use crate::rate_limiter::RateLimiter;
use crate::stats::Stats;
use crate::topology::{self, unexpected_answer};
use crate::workload::Workload;
use crate::PerfError;

pub struct Consumer {
    pub connection: ClientConnection,
    channel: u16,
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
        mut connection: ClientConnection,
        workload: &Workload,
        queue: Option<String>,
        run_key: &str,
        stats: Arc<Stats>,
    ) -> Result<Consumer, PerfError> {
        let channel = connection
            .open_channel()
            .await
            .map_err(PerfError::amqp("opening a consumer channel"))?;
        if let Some(qos) = workload.qos.filter(|&qos| qos > 0) {
            connection
                .call(
                    channel,
                    AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos {
                        prefetch_count: qos,
                        global: false,
                    })),
                )
                .await
                .map_err(PerfError::amqp("basic.qos"))?;
        }
        let queue = match queue {
            Some(queue) => queue,
            None => {
                let name = topology::declare_queue(&mut connection, channel, workload, "").await?;
                if !workload.exchange.is_empty() {
                    let key = workload.routing_key.as_deref().unwrap_or(run_key);
                    topology::bind_queue(&mut connection, channel, &name, &workload.exchange, key)
                        .await?;
                }
                name
            }
        };
        let answer = connection
            .call(
                channel,
                AMQPClass::Basic(basic::AMQPMethod::Consume(basic::Consume {
                    queue: short_string(&queue),
                    consumer_tag: "".into(),
                    no_local: false,
                    no_ack: workload.autoack,
                    exclusive: false,
                    nowait: false,
                    arguments: FieldTable::default(),
                })),
            )
            .await
            .map_err(PerfError::amqp("basic.consume"))?;
        if !matches!(answer, AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(_))) {
            return Err(unexpected_answer("basic.consume".into(), &answer));
        }
        Ok(Consumer {
            connection,
            channel,
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
    /// [`PerfError::Amqp`] if the connection or channel fails.
    pub async fn run(
        mut self,
        mut limiter: RateLimiter,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Consumer, PerfError> {
        let mut unacked: u32 = 0;
        let mut consumed: u64 = 0;
        'reading: loop {
            while let Some(incoming) = self
                .connection
                .next_incoming()
                .map_err(PerfError::amqp("receiving a delivery"))?
            {
                if *stop.borrow() || self.message_limit.is_some_and(|n| consumed >= n) {
                    break 'reading;
                }
                let delivery_tag = match incoming {
                    Incoming::Delivery { delivery_tag, body } => {
                        let latency_us =
                            body::timestamp(&body).and_then(|stamp| self.clock.elapsed_us(stamp));
                        self.stats.on_consumed(latency_us);
                        consumed += 1;
                        delivery_tag
                    }
                    Incoming::Cancelled => break 'reading,
                    Incoming::Confirm { .. } | Incoming::Returned => continue,
                };
                if limiter.is_limited() {
                    // Acks already queued go out first: pacing holds back what comes next,
                    // not what was handled.
                    self.flush().await?;
                    tokio::select! {
                        biased;
                        _ = stop.changed() => break 'reading,
                        _ = limiter.acquire() => {}
                    }
                }
                if self.autoack {
                    continue;
                }
                unacked += 1;
                if unacked >= self.ack_every {
                    self.connection
                        .ack(self.channel, delivery_tag, self.ack_every > 1);
                    unacked = 0;
                }
            }
            self.flush().await?;
            if *stop.borrow() || self.message_limit.is_some_and(|n| consumed >= n) {
                break;
            }
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                read = self.connection.read_more() => {
                    read.map_err(PerfError::amqp("receiving a delivery"))?;
                }
            }
        }
        // Acks of what was handled go out even when the run stops mid-read.
        self.flush().await?;
        Ok(self)
    }

    async fn flush(&mut self) -> Result<(), PerfError> {
        self.connection
            .flush()
            .await
            .map_err(PerfError::amqp("basic.ack"))
    }
}
