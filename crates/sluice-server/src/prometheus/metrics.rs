//! The metric families, read from the broker when Prometheus scrapes, under
//! RabbitMQ 3.10's names, types and labels (its `rabbitmq_prometheus`
//! collectors: core metrics, global counters, alarms, identity).
//!
//! As in RabbitMQ, `/metrics` sums the per-object families (queues,
//! connections) into one unlabelled sample each, and `/metrics/per-object`
//! gives one sample per queue (`vhost`, `queue`) or connection (labelled
//! `channel`, as RabbitMQ labels every process). Counters are named without `_total` here: the encoder
//! appends it, as Prometheus wants.

use std::path::PathBuf;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use sluice_cluster::consensus::RaftGroup;
use sluice_core::broker::Broker;
use sluice_core::counters::MessageCounts;
use sluice_core::queue_type::QueueType;
use tokio::sync::watch;

use crate::alarm::{free_disk_bytes, resident_bytes, AlarmLimits, Alarms};
use crate::connection_registry::ConnectionRegistry;
use crate::handshake::RABBITMQ_VERSION_FOLLOWED;
use crate::quorum_hibernation::RunningGroups;

/// Which form of the per-object families a scrape gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Summed over queues and connections: `/metrics`.
    Aggregated,
    /// One sample per queue or connection: `/metrics/per-object`.
    PerObject,
}

/// Whether this node reports `queue`: a classic queue of this node, or a
/// quorum queue this node leads.
fn reported_here(queue: &dyn sluice_core::queue::Queue, local: &str) -> bool {
    match queue.queue_type() {
        QueueType::Quorum => queue.leader().is_some_and(|leader| leader == local),
        _ => queue.forwarded().is_none(),
    }
}

/// What the metrics are read from.
pub struct MetricsSources {
    pub broker: Arc<Broker>,
    pub connections: Arc<ConnectionRegistry>,
    pub alarm_limits: watch::Receiver<AlarmLimits>,
    /// This node's own alarms (RabbitMQ's alarm metrics are per node).
    pub alarms: watch::Receiver<Alarms>,
    pub data_dir: PathBuf,
    /// `rabbitmq_cluster`: the first member's name, as RabbitMQ names a
    /// cluster by its first node unless told otherwise.
    pub cluster_name: String,
    /// `connection_max`, RabbitMQ's TCP socket limit.
    pub connection_max: usize,
    /// The quorum queues' groups running on this node, by group id (the
    /// metadata log index that declared the queue).
    pub quorum_groups: RunningGroups,
}

type Labels = Vec<(String, String)>;

/// One family, its samples read at scrape time.
#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Labels, f64)>,
}

impl Family {
    fn new(name: &'static str, help: &'static str, kind: MetricType) -> Self {
        Self {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }

    fn single(name: &'static str, help: &'static str, kind: MetricType, value: f64) -> Self {
        let mut family = Self::new(name, help, kind);
        family.samples.push((Labels::new(), value));
        family
    }
}

/// The families of one scrape, handed to prometheus-client's encoder.
#[derive(Debug)]
struct Scrape(Vec<Family>);

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in &self.0 {
            let mut metric =
                encoder.encode_descriptor(family.name, family.help, None, family.kind)?;
            for (labels, value) in &family.samples {
                let sample = metric.encode_family(labels)?;
                match family.kind {
                    MetricType::Counter => ConstCounter::new(*value).encode(sample)?,
                    _ => ConstGauge::new(*value).encode(sample)?,
                }
            }
        }
        Ok(())
    }
}

impl MetricsSources {
    /// The text a scrape gets, in Prometheus's 0.0.4 format.
    pub fn exposition(&self, scope: Scope) -> String {
        let mut families = Vec::new();
        self.identity(&mut families);
        self.core(scope, &mut families);
        self.raft(scope, &mut families);
        self.global_counters(&mut families);
        self.node_resources(&mut families);
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Scrape(families)));
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
            .expect("writing into a String cannot fail");
        text
    }

    fn identity(&self, families: &mut Vec<Family>) {
        let node = self.broker.node().name.to_string();
        let mut identity = Family::new(
            "rabbitmq_identity_info",
            "RabbitMQ node & cluster identity info",
            MetricType::Unknown,
        );
        identity.samples.push((
            vec![
                ("rabbitmq_node".to_owned(), node),
                ("rabbitmq_cluster".to_owned(), self.cluster_name.clone()),
                (
                    "rabbitmq_cluster_permanent_id".to_owned(),
                    format!("sluice-cluster-id-{}", self.cluster_name),
                ),
            ],
            1.0,
        ));
        families.push(identity);
        let mut build = Family::new(
            "rabbitmq_build_info",
            "RabbitMQ & Erlang/OTP version info",
            MetricType::Unknown,
        );
        build.samples.push((
            vec![
                ("product_name".to_owned(), "Sluice".to_owned()),
                (
                    "product_version".to_owned(),
                    env!("CARGO_PKG_VERSION").to_owned(),
                ),
                (
                    "rabbitmq_version".to_owned(),
                    RABBITMQ_VERSION_FOLLOWED.to_owned(),
                ),
                (
                    "prometheus_plugin_version".to_owned(),
                    env!("CARGO_PKG_VERSION").to_owned(),
                ),
                ("prometheus_client_version".to_owned(), "0.26".to_owned()),
                ("erlang_version".to_owned(), "none".to_owned()),
            ],
            1.0,
        ));
        families.push(build);
    }

    /// Connections, channels, queues and consumers: totals, and per-object
    /// or summed queue and connection families.
    fn core(&self, scope: Scope, families: &mut Vec<Family>) {
        let connections = self.connections.snapshots();
        let channels: usize = connections
            .iter()
            .map(|connection| connection.channels.len())
            .sum();
        let per_object = scope == Scope::PerObject;
        let mut ready = Family::new(
            "rabbitmq_queue_messages_ready",
            "Messages ready to be delivered to consumers",
            MetricType::Gauge,
        );
        let mut unacked = Family::new(
            "rabbitmq_queue_messages_unacked",
            "Messages delivered to consumers but not yet acknowledged",
            MetricType::Gauge,
        );
        let mut depth = Family::new(
            "rabbitmq_queue_messages",
            "Sum of ready and unacknowledged messages - total queue depth",
            MetricType::Gauge,
        );
        let mut consumers = Family::new(
            "rabbitmq_queue_consumers",
            "Consumers on a queue",
            MetricType::Gauge,
        );
        let (mut queue_count, mut consumer_count) = (0u64, 0u64);
        let local = self.broker.node().name.to_string();
        let mut published = Family::new(
            "rabbitmq_queue_messages_published",
            "Total number of messages published to queues",
            MetricType::Counter,
        );
        let mut totals = [0f64; 5];
        for vhost in self.broker.vhosts() {
            for queue in vhost.queues() {
                // Counted where the queue lives, once in the cluster: a
                // classic queue by its node, a quorum queue by its
                // leader's, as RabbitMQ reports them.
                if !reported_here(queue.as_ref(), &local) {
                    continue;
                }
                queue_count += 1;
                let stats = queue.stats();
                let values = [
                    stats.messages_ready as f64,
                    stats.messages_unacknowledged as f64,
                    (u64::from(stats.messages_ready) + stats.messages_unacknowledged) as f64,
                    stats.consumers as f64,
                    queue.counts().published as f64,
                ];
                consumer_count += u64::from(stats.consumers);
                if per_object {
                    let labels = vec![
                        ("vhost".to_owned(), vhost.name.to_string()),
                        ("queue".to_owned(), queue.name().to_string()),
                    ];
                    for (family, value) in [
                        &mut ready,
                        &mut unacked,
                        &mut depth,
                        &mut consumers,
                        &mut published,
                    ]
                    .into_iter()
                    .zip(values)
                    {
                        family.samples.push((labels.clone(), value));
                    }
                } else {
                    for (total, value) in totals.iter_mut().zip(values) {
                        *total += value;
                    }
                }
            }
        }
        if !per_object {
            for (family, total) in [
                &mut ready,
                &mut unacked,
                &mut depth,
                &mut consumers,
                &mut published,
            ]
            .into_iter()
            .zip(totals)
            {
                family.samples.push((Labels::new(), total));
            }
        }
        families.extend([ready, unacked, depth, consumers, published]);
        let mut incoming = Family::new(
            "rabbitmq_connection_incoming_bytes",
            "Total number of bytes received on a connection",
            MetricType::Counter,
        );
        let mut outgoing = Family::new(
            "rabbitmq_connection_outgoing_bytes",
            "Total number of bytes sent on a connection",
            MetricType::Counter,
        );
        let mut connection_channels = Family::new(
            "rabbitmq_connection_channels",
            "Channels on a connection",
            MetricType::Gauge,
        );
        let mut sums = [0f64; 3];
        for connection in &connections {
            let values = [
                connection.received_bytes as f64,
                connection.sent_bytes as f64,
                connection.channels.len() as f64,
            ];
            if per_object {
                // RabbitMQ labels a connection's samples with its process
                // id, under `channel`.
                let labels = vec![(
                    "channel".to_owned(),
                    format!(
                        "{} ({})",
                        connection.identity.peer_address, connection.connection_id
                    ),
                )];
                for (family, value) in [&mut incoming, &mut outgoing, &mut connection_channels]
                    .into_iter()
                    .zip(values)
                {
                    family.samples.push((labels.clone(), value));
                }
            } else {
                for (sum, value) in sums.iter_mut().zip(values) {
                    *sum += value;
                }
            }
        }
        if !per_object {
            for (family, sum) in [&mut incoming, &mut outgoing, &mut connection_channels]
                .into_iter()
                .zip(sums)
            {
                family.samples.push((Labels::new(), sum));
            }
        }
        families.extend([incoming, outgoing, connection_channels]);
        families.push(Family::single(
            "rabbitmq_connections",
            "Connections currently open",
            MetricType::Gauge,
            connections.len() as f64,
        ));
        families.push(Family::single(
            "rabbitmq_channels",
            "Channels currently open",
            MetricType::Gauge,
            channels as f64,
        ));
        families.push(Family::single(
            "rabbitmq_consumers",
            "Consumers currently connected",
            MetricType::Gauge,
            consumer_count as f64,
        ));
        families.push(Family::single(
            "rabbitmq_queues",
            "Queues available",
            MetricType::Gauge,
            queue_count as f64,
        ));
        families.push(Family::single(
            "rabbitmq_channel_consumers",
            "Consumers on a channel",
            MetricType::Gauge,
            consumer_count as f64,
        ));
        families.push(Family::single(
            "rabbitmq_process_open_tcp_sockets",
            "Open TCP sockets",
            MetricType::Gauge,
            connections.len() as f64,
        ));
        families.push(Family::single(
            "rabbitmq_process_max_tcp_sockets",
            "Open TCP sockets limit",
            MetricType::Gauge,
            self.connection_max as f64,
        ));
        let churn = &self.connections.churn;
        for (name, help, counter) in [
            (
                "rabbitmq_connections_opened",
                "Total number of connections opened",
                &churn.connections_opened,
            ),
            (
                "rabbitmq_connections_closed",
                "Total number of connections closed or terminated",
                &churn.connections_closed,
            ),
            (
                "rabbitmq_channels_opened",
                "Total number of channels opened",
                &churn.channels_opened,
            ),
            (
                "rabbitmq_channels_closed",
                "Total number of channels closed",
                &churn.channels_closed,
            ),
            (
                "rabbitmq_queues_declared",
                "Total number of queues declared",
                &churn.queues_declared,
            ),
            (
                "rabbitmq_queues_created",
                "Total number of queues created",
                &churn.queues_created,
            ),
            (
                "rabbitmq_queues_deleted",
                "Total number of queues deleted",
                &churn.queues_deleted,
            ),
        ] {
            families.push(Family::single(
                name,
                help,
                MetricType::Counter,
                counter.get() as f64,
            ));
        }
        let mut global_consumers = Family::new(
            "rabbitmq_global_consumers",
            "Current number of consumers",
            MetricType::Gauge,
        );
        global_consumers.samples.push((
            vec![("protocol".to_owned(), "amqp091".to_owned())],
            consumer_count as f64,
        ));
        families.push(global_consumers);
        // A publisher is a channel that has published, as RabbitMQ counts
        // them (it counts one when a channel first publishes).
        let publishers = connections
            .iter()
            .flat_map(|connection| &connection.channels)
            .filter(|channel| channel.counts.published > 0)
            .count();
        let mut global_publishers = Family::new(
            "rabbitmq_global_publishers",
            "Current number of publishers",
            MetricType::Gauge,
        );
        global_publishers.samples.push((
            vec![("protocol".to_owned(), "amqp091".to_owned())],
            publishers as f64,
        ));
        families.push(global_publishers);
    }

    /// Each quorum queue member's Raft term and log positions, as the
    /// quorum-queue dashboard reads them (summed in the aggregated form, as
    /// RabbitMQ sums them).
    fn raft(&self, scope: Scope, families: &mut Vec<Family>) {
        let running: Vec<(u64, Arc<RaftGroup>)> = self
            .quorum_groups
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .map(|(id, (group, _))| (*id, Arc::clone(group)))
            .collect();
        let mut raft_families = [
            Family::new(
                "rabbitmq_raft_term",
                "Current Raft term number",
                MetricType::Counter,
            ),
            Family::new(
                "rabbitmq_raft_log_snapshot_index",
                "Raft log snapshot index",
                MetricType::Gauge,
            ),
            Family::new(
                "rabbitmq_raft_log_last_applied_index",
                "Raft log last applied index",
                MetricType::Gauge,
            ),
            Family::new(
                "rabbitmq_raft_log_commit_index",
                "Raft log commit index",
                MetricType::Gauge,
            ),
            Family::new(
                "rabbitmq_raft_log_last_written_index",
                "Raft log last written index",
                MetricType::Gauge,
            ),
        ];
        // A latency does not add up: summed, it is the slowest member's.
        let mut latency = Family::new(
            "rabbitmq_raft_entry_commit_latency_seconds",
            "Time taken for a log entry to be committed",
            MetricType::Gauge,
        );
        let mut slowest = 0f64;
        let mut totals = [0f64; 5];
        for vhost in self.broker.vhosts() {
            for queue in vhost.queues() {
                let group_id = queue.options().declared_at;
                let Some((_, group)) = running.iter().find(|(id, _)| *id == group_id) else {
                    continue;
                };
                let status = group.status();
                let values = [
                    status.term,
                    status.snapshot_index,
                    status.last_applied_index,
                    status.commit_index,
                    status.last_written_index,
                ]
                .map(|value| value as f64);
                if scope == Scope::PerObject {
                    let labels = vec![
                        ("vhost".to_owned(), vhost.name.to_string()),
                        ("queue".to_owned(), queue.name().to_string()),
                    ];
                    for (family, value) in raft_families.iter_mut().zip(values) {
                        family.samples.push((labels.clone(), value));
                    }
                    latency
                        .samples
                        .push((labels, status.commit_latency.as_secs_f64()));
                } else {
                    slowest = slowest.max(status.commit_latency.as_secs_f64());
                    for (total, value) in totals.iter_mut().zip(values) {
                        *total += value;
                    }
                }
            }
        }
        if scope == Scope::Aggregated && !running.is_empty() {
            for (family, total) in raft_families.iter_mut().zip(totals) {
                family.samples.push((Labels::new(), total));
            }
            latency.samples.push((Labels::new(), slowest));
        }
        families.extend(raft_families);
        families.push(latency);
    }

    /// RabbitMQ's global counters, for protocol `amqp091`: the sums of
    /// every vhost's counts on this node.
    fn global_counters(&self, families: &mut Vec<Family>) {
        let mut counts = MessageCounts::default();
        for vhost in self.broker.vhosts() {
            counts += vhost.counts();
        }
        let protocol = || vec![("protocol".to_owned(), "amqp091".to_owned())];
        for (name, help, value) in [
            (
                "rabbitmq_global_messages_received",
                "Total number of messages received from publishers",
                counts.published,
            ),
            (
                "rabbitmq_global_messages_received_confirm",
                "Total number of messages received from publishers expecting confirmations",
                counts.received_confirm,
            ),
            (
                "rabbitmq_global_messages_routed",
                "Total number of messages routed to queues or streams",
                counts.routed,
            ),
            (
                "rabbitmq_global_messages_unroutable_dropped",
                "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
                counts.dropped_unroutable,
            ),
            (
                "rabbitmq_global_messages_unroutable_returned",
                "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable",
                counts.returned_unroutable,
            ),
            (
                "rabbitmq_global_messages_confirmed",
                "Total number of messages confirmed to publishers",
                counts.confirmed,
            ),
            (
                "rabbitmq_global_messages_delivered",
                "Total number of messages delivered to consumers",
                counts.delivered,
            ),
            (
                "rabbitmq_global_messages_delivered_consume_manual_ack",
                "Total number of messages delivered to consumers using manual acknowledgement mode",
                counts.consume_manual_ack(),
            ),
            (
                "rabbitmq_global_messages_delivered_consume_auto_ack",
                "Total number of messages delivered to consumers using automatic acknowledgement mode",
                counts.delivered_consume_no_ack,
            ),
            (
                "rabbitmq_global_messages_delivered_get_manual_ack",
                "Total number of messages delivered to consumers via basic.get using manual acknowledgement mode",
                counts.get_manual_ack(),
            ),
            (
                "rabbitmq_global_messages_delivered_get_auto_ack",
                "Total number of messages delivered to consumers via basic.get using automatic acknowledgement mode",
                counts.delivered_get_no_ack,
            ),
            (
                "rabbitmq_global_messages_get_empty",
                "Total number of times basic.get operations fetched no message",
                counts.get_empty,
            ),
            (
                "rabbitmq_global_messages_redelivered",
                "Total number of messages redelivered to consumers",
                counts.redelivered,
            ),
            (
                "rabbitmq_global_messages_acknowledged",
                "Total number of messages acknowledged by consumers",
                counts.acked,
            ),
        ] {
            let mut family = Family::new(name, help, MetricType::Counter);
            family.samples.push((protocol(), value as f64));
            families.push(family);
        }
    }

    /// Memory, disk, file descriptors and alarms of this node.
    fn node_resources(&self, families: &mut Vec<Family>) {
        let limits = *self.alarm_limits.borrow();
        let alarms = *self.alarms.borrow();
        let descriptors = crate::fd_limit::file_descriptors().ok();
        let gauges: [(&'static str, &'static str, Option<f64>); 8] = [
            (
                "rabbitmq_process_resident_memory_bytes",
                "Memory used in bytes",
                resident_bytes().map(|bytes| bytes as f64),
            ),
            (
                "rabbitmq_resident_memory_limit_bytes",
                "Memory high watermark in bytes",
                Some(limits.memory_watermark_bytes as f64),
            ),
            (
                "rabbitmq_disk_space_available_bytes",
                "Disk space available in bytes",
                free_disk_bytes(&self.data_dir).map(|bytes| bytes as f64),
            ),
            (
                "rabbitmq_disk_space_available_limit_bytes",
                "Free disk space low watermark in bytes",
                Some(limits.disk_free_limit_bytes as f64),
            ),
            (
                "rabbitmq_process_open_fds",
                "Open file descriptors",
                descriptors.map(|fds| fds.used as f64),
            ),
            (
                "rabbitmq_process_max_fds",
                "Open file descriptors limit",
                descriptors.map(|fds| fds.total as f64),
            ),
            (
                "rabbitmq_alarms_memory_used_watermark",
                "is 1 if VM memory watermark alarm is in effect",
                Some(f64::from(u8::from(alarms.memory))),
            ),
            (
                "rabbitmq_alarms_free_disk_space_watermark",
                "is 1 if free disk space watermark alarm is in effect",
                Some(f64::from(u8::from(alarms.disk))),
            ),
        ];
        for (name, help, value) in gauges {
            // RabbitMQ's alarm families are untyped.
            let kind = if name.starts_with("rabbitmq_alarms_") {
                MetricType::Unknown
            } else {
                MetricType::Gauge
            };
            if let Some(value) = value {
                families.push(Family::single(name, help, kind, value));
            }
        }
        families.push(Family::single(
            "rabbitmq_alarms_file_descriptor_limit",
            "is 1 if file descriptor limit alarm is in effect",
            MetricType::Unknown,
            0.0,
        ));
    }
}
