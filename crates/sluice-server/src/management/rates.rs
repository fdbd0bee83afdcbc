//! Per-second rates from the broker's counters, computed server side as
//! RabbitMQ's management plugin does: every `collect_statistics_interval`
//! (5 s) each object's counters are read, and its rate is the change since
//! the previous reading over the time between them.
//!
//! One entry per object that exists (vhosts, queues, connections,
//! channels, and the node): entries of objects gone are dropped at the
//! next reading, so the sampler is bounded by what the node holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};
use sluice_core::counters::MessageCounts;
use tokio::sync::watch;
use tokio::time::Instant;

use super::ManagementState;

/// RabbitMQ's default `collect_statistics_interval`.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// What a rate is kept for.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum RateKey {
    Node,
    Vhost(String),
    Queue { vhost: String, name: String },
    Connection(u64),
    Channel { connection: u64, channel: u16 },
}

/// One reading of an object: its message counters, and for queues and the
/// node their depths (ready, unacknowledged), for connections their bytes
/// (received, sent).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Reading {
    pub counts: MessageCounts,
    pub gauges: [u64; 2],
}

/// Per-second rates of a reading's fields.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rates {
    pub published: f64,
    pub confirmed: f64,
    pub delivered: f64,
    pub consume_manual_ack: f64,
    pub consume_no_ack: f64,
    pub get_manual_ack: f64,
    pub get_no_ack: f64,
    pub get_empty: f64,
    pub redelivered: f64,
    pub acked: f64,
    pub returned_unroutable: f64,
    pub dropped_unroutable: f64,
    pub gauges: [f64; 2],
}

#[derive(Default)]
pub struct RateSampler {
    inner: Mutex<Samples>,
}

#[derive(Default)]
struct Samples {
    last: HashMap<RateKey, (Instant, Reading)>,
    rates: HashMap<RateKey, Rates>,
}

impl RateSampler {
    /// The rates of `key` at the last reading; zero before two readings.
    pub fn rates(&self, key: &RateKey) -> Rates {
        self.lock().rates.get(key).copied().unwrap_or_default()
    }

    /// Takes one reading of every object in `readings`; objects not in it
    /// are forgotten.
    pub fn record(&self, now: Instant, readings: HashMap<RateKey, Reading>) {
        let mut samples = self.lock();
        let mut last = HashMap::with_capacity(readings.len());
        let mut rates = HashMap::with_capacity(readings.len());
        for (key, reading) in readings {
            if let Some((then, before)) = samples.last.get(&key) {
                let seconds = now.duration_since(*then).as_secs_f64();
                if seconds > 0.0 {
                    rates.insert(key.clone(), rates_between(before, &reading, seconds));
                }
            }
            last.insert(key, (now, reading));
        }
        samples.last = last;
        samples.rates = rates;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Samples> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn rates_between(before: &Reading, after: &Reading, seconds: f64) -> Rates {
    // A counter that went backwards (an object deleted and made again under
    // the same key) has no rate this time.
    let rate = |before: u64, after: u64| after.saturating_sub(before) as f64 / seconds;
    // Depths go down as well as up.
    let change = |before: u64, after: u64| (after as f64 - before as f64) / seconds;
    let (early, late) = (&before.counts, &after.counts);
    Rates {
        published: rate(before.counts.published, after.counts.published),
        confirmed: rate(before.counts.confirmed, after.counts.confirmed),
        delivered: rate(before.counts.delivered, after.counts.delivered),
        consume_manual_ack: rate(early.consume_manual_ack(), late.consume_manual_ack()),
        consume_no_ack: rate(
            early.delivered_consume_no_ack,
            late.delivered_consume_no_ack,
        ),
        get_manual_ack: rate(early.get_manual_ack(), late.get_manual_ack()),
        get_no_ack: rate(early.delivered_get_no_ack, late.delivered_get_no_ack),
        get_empty: rate(early.get_empty, late.get_empty),
        redelivered: rate(before.counts.redelivered, after.counts.redelivered),
        acked: rate(before.counts.acked, after.counts.acked),
        returned_unroutable: rate(
            before.counts.returned_unroutable,
            after.counts.returned_unroutable,
        ),
        dropped_unroutable: rate(
            before.counts.dropped_unroutable,
            after.counts.dropped_unroutable,
        ),
        gauges: [
            change(before.gauges[0], after.gauges[0]),
            change(before.gauges[1], after.gauges[1]),
        ],
    }
}

/// A number and its rate, as RabbitMQ writes them: `name` and
/// `name_details: {rate}`.
pub fn with_rate(map: &mut Map<String, Value>, name: &str, value: u64, rate: f64) {
    map.insert(name.to_owned(), json!(value));
    map.insert(format!("{name}_details"), json!({ "rate": round(rate) }));
}

/// `message_stats` as RabbitMQ writes it for an object with these counts:
/// `deliver` and `deliver_no_ack` are consumers' deliveries with manual and
/// automatic acknowledgement, `get` and `get_no_ack` basic.get's,
/// `deliver_get` all four.
pub fn message_stats(counts: &MessageCounts, rates: &Rates) -> Value {
    let mut stats = Map::new();
    with_rate(&mut stats, "publish", counts.published, rates.published);
    with_rate(&mut stats, "confirm", counts.confirmed, rates.confirmed);
    with_rate(&mut stats, "deliver_get", counts.delivered, rates.delivered);
    with_rate(
        &mut stats,
        "deliver",
        counts.consume_manual_ack(),
        rates.consume_manual_ack,
    );
    with_rate(
        &mut stats,
        "deliver_no_ack",
        counts.delivered_consume_no_ack,
        rates.consume_no_ack,
    );
    with_rate(
        &mut stats,
        "get",
        counts.get_manual_ack(),
        rates.get_manual_ack,
    );
    with_rate(
        &mut stats,
        "get_no_ack",
        counts.delivered_get_no_ack,
        rates.get_no_ack,
    );
    with_rate(&mut stats, "get_empty", counts.get_empty, rates.get_empty);
    with_rate(
        &mut stats,
        "redeliver",
        counts.redelivered,
        rates.redelivered,
    );
    with_rate(&mut stats, "ack", counts.acked, rates.acked);
    with_rate(
        &mut stats,
        "return_unroutable",
        counts.returned_unroutable,
        rates.returned_unroutable,
    );
    with_rate(
        &mut stats,
        "drop_unroutable",
        counts.dropped_unroutable,
        rates.dropped_unroutable,
    );
    Value::Object(stats)
}

/// Rates to one decimal, as the management UI shows them.
fn round(rate: f64) -> f64 {
    (rate * 10.0).round() / 10.0
}

/// Reads every object now and then every [`SAMPLE_INTERVAL`] until
/// shutdown.
pub async fn run(state: Arc<ManagementState>, mut shutdown: watch::Receiver<bool>) {
    let mut ticks = tokio::time::interval(SAMPLE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let readings = read_all(&state);
        state.rates.record(Instant::now(), readings);
    }
}

fn read_all(state: &ManagementState) -> HashMap<RateKey, Reading> {
    let mut readings = HashMap::new();
    let mut node = Reading::default();
    for vhost in state.broker.vhosts() {
        let counts = vhost.counts();
        let mut depth = [0u64; 2];
        for queue in vhost.queues() {
            let Some(stats) = super::queue_ops::stats_here(&queue) else {
                continue;
            };
            let gauges = [stats.messages_ready as u64, stats.messages_unacknowledged];
            depth[0] += gauges[0];
            depth[1] += gauges[1];
            readings.insert(
                RateKey::Queue {
                    vhost: vhost.name.to_string(),
                    name: queue.name().to_string(),
                },
                Reading {
                    counts: queue.counts(),
                    gauges,
                },
            );
        }
        node.counts += counts;
        node.gauges[0] += depth[0];
        node.gauges[1] += depth[1];
        readings.insert(
            RateKey::Vhost(vhost.name.to_string()),
            Reading {
                counts,
                gauges: depth,
            },
        );
    }
    readings.insert(RateKey::Node, node);
    for connection in state.connections.snapshots() {
        let mut counts = MessageCounts::default();
        for channel in &connection.channels {
            counts += channel.counts;
            readings.insert(
                RateKey::Channel {
                    connection: connection.connection_id,
                    channel: channel.channel_id,
                },
                Reading {
                    counts: channel.counts,
                    gauges: [0, 0],
                },
            );
        }
        readings.insert(
            RateKey::Connection(connection.connection_id),
            Reading {
                counts,
                gauges: [connection.received_bytes, connection.sent_bytes],
            },
        );
    }
    readings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_the_change_between_two_readings_per_second() {
        let sampler = RateSampler::default();
        let start = Instant::now();
        let key = RateKey::Queue {
            vhost: "/".into(),
            name: "q".into(),
        };
        let mut reading = Reading::default();
        reading.counts.published = 100;
        reading.gauges = [50, 0];
        sampler.record(start, HashMap::from([(key.clone(), reading)]));
        assert_eq!(
            sampler.rates(&key),
            Rates::default(),
            "one reading has no rate"
        );
        reading.counts.published = 600;
        reading.gauges = [30, 10];
        sampler.record(
            start + Duration::from_secs(5),
            HashMap::from([(key.clone(), reading)]),
        );
        let rates = sampler.rates(&key);
        assert_eq!(rates.published, 100.0);
        assert_eq!(rates.gauges, [-4.0, 2.0]);
        sampler.record(start + Duration::from_secs(10), HashMap::new());
        assert_eq!(
            sampler.rates(&key),
            Rates::default(),
            "gone objects are forgotten"
        );
        let stats = message_stats(&reading.counts, &rates);
        assert_eq!(stats["publish"], 600);
        assert_eq!(stats["publish_details"]["rate"], 100.0);
    }
}
