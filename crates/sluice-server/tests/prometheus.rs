//! The Prometheus endpoint, scraped over real HTTP and read with a
//! Prometheus text parser: RabbitMQ's metric names, types and labels, with
//! values that follow what clients do.

mod helpers;
mod support;

use helpers::*;
use prometheus_parse::{Scrape, Value};
use support::TestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn start() -> TestServer {
    TestServer::start_with(|config| {
        config.prometheus.listener.ip = "127.0.0.1".parse().unwrap();
        config.prometheus.listener.port = 0;
        config.prometheus.listener.configured = true;
    })
    .await
}

/// GET `path`: the response's head and body.
async fn get(server: &TestServer, path: &str) -> (String, String) {
    let address = server
        .running()
        .prometheus_address
        .expect("the endpoint is on");
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    (head.to_owned(), body.to_owned())
}

async fn scrape(server: &TestServer, path: &str) -> Scrape {
    let (head, body) = get(server, path).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_lowercase()
            .contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
        "{head}"
    );
    Scrape::parse(body.lines().map(|line| Ok(line.to_owned()))).expect("Prometheus text")
}

/// The value of the sample of `metric` whose labels include `labels`.
fn value(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|sample| {
            sample.metric == metric
                && labels
                    .iter()
                    .all(|(name, value)| sample.labels.get(name) == Some(*value))
        })
        .map(|sample| match sample.value {
            Value::Counter(value) | Value::Gauge(value) | Value::Untyped(value) => value,
            ref other => panic!("{metric}: unexpected {other:?}"),
        })
}

#[tokio::test]
async fn prometheus_metrics_follow_what_clients_do_under_rabbitmqs_names() {
    let server = start().await;
    let (_connection, channel) = open(&server).await;
    declare(&channel, "metered").await;
    for body in [b"one", b"two", b"six"] {
        publish(&channel, "", "metered", body).await;
    }
    eventually("the messages are in", || {
        server.queue("metered").message_count() == 3
    })
    .await;

    let aggregated = scrape(&server, "/metrics").await;
    assert_eq!(
        value(&aggregated, "rabbitmq_queue_messages_ready", &[]),
        Some(3.0)
    );
    assert_eq!(
        value(&aggregated, "rabbitmq_queue_messages", &[]),
        Some(3.0)
    );
    assert_eq!(value(&aggregated, "rabbitmq_connections", &[]), Some(1.0));
    assert_eq!(value(&aggregated, "rabbitmq_queues", &[]), Some(1.0));
    assert_eq!(
        value(
            &aggregated,
            "rabbitmq_global_messages_received_total",
            &[("protocol", "amqp091")]
        ),
        Some(3.0)
    );
    assert!(matches!(
        aggregated
            .samples
            .iter()
            .find(|sample| sample.metric == "rabbitmq_global_messages_received_total")
            .map(|sample| &sample.value),
        Some(Value::Counter(_))
    ));
    // The dashboards join on identity_info's node and cluster labels.
    let identity = aggregated
        .samples
        .iter()
        .find(|sample| sample.metric == "rabbitmq_identity_info")
        .expect("identity info");
    assert!(identity.labels.get("rabbitmq_node").is_some());
    assert!(identity.labels.get("rabbitmq_cluster").is_some());
    assert!(value(&aggregated, "rabbitmq_resident_memory_limit_bytes", &[]).unwrap() > 0.0);
    assert!(value(&aggregated, "rabbitmq_process_open_fds", &[]).unwrap() > 0.0);
    assert_eq!(
        value(&aggregated, "rabbitmq_alarms_memory_used_watermark", &[]),
        Some(0.0)
    );
    // Churn, as the overview dashboard charts it.
    for (metric, expected) in [
        ("rabbitmq_connections_opened_total", 1.0),
        ("rabbitmq_channels_opened_total", 1.0),
        ("rabbitmq_queues_declared_total", 1.0),
        ("rabbitmq_queues_created_total", 1.0),
        ("rabbitmq_queues_deleted_total", 0.0),
    ] {
        assert_eq!(value(&aggregated, metric, &[]), Some(expected), "{metric}");
    }
    assert!(aggregated
        .docs
        .get("rabbitmq_queue_messages_ready")
        .is_some_and(|help| help.starts_with("Messages ready to be delivered to consumers")));

    // Per object: one sample per queue, labelled as RabbitMQ labels them.
    let per_object = scrape(&server, "/metrics/per-object").await;
    assert_eq!(
        value(
            &per_object,
            "rabbitmq_queue_messages_ready",
            &[("vhost", "/"), ("queue", "metered")]
        ),
        Some(3.0)
    );

    // Consumed and acknowledged: the counters and gauges move.
    for _ in 0..3 {
        assert!(get_body(&channel, "metered", false).await.is_some());
    }
    let consumed = scrape(&server, "/metrics").await;
    assert_eq!(
        value(&consumed, "rabbitmq_queue_messages_ready", &[]),
        Some(0.0)
    );
    assert_eq!(
        value(&consumed, "rabbitmq_queue_messages_unacked", &[]),
        Some(3.0)
    );
    assert_eq!(
        value(
            &consumed,
            "rabbitmq_global_messages_delivered_total",
            &[("protocol", "amqp091")]
        ),
        Some(3.0)
    );
    // The dashboards chart deliveries by how they were taken.
    assert!(get_body(&channel, "metered", true).await.is_none());
    let split = scrape(&server, "/metrics").await;
    for (metric, expected) in [
        (
            "rabbitmq_global_messages_delivered_get_manual_ack_total",
            3.0,
        ),
        ("rabbitmq_global_messages_delivered_get_auto_ack_total", 0.0),
        (
            "rabbitmq_global_messages_delivered_consume_manual_ack_total",
            0.0,
        ),
        ("rabbitmq_global_messages_get_empty_total", 1.0),
    ] {
        assert_eq!(
            value(&split, metric, &[("protocol", "amqp091")]),
            Some(expected),
            "{metric}"
        );
    }
    channel
        .queue_delete("metered".into(), Default::default())
        .await
        .unwrap();
    let deleted = scrape(&server, "/metrics").await;
    assert_eq!(
        value(&deleted, "rabbitmq_queues_deleted_total", &[]),
        Some(1.0)
    );
    assert_eq!(value(&deleted, "rabbitmq_queues", &[]), Some(0.0));
    // A publish on a channel in confirm mode counts as one expecting a
    // confirmation.
    channel.confirm_select(Default::default()).await.unwrap();
    publish(&channel, "", "nowhere", b"confirmed").await;
    let confirming = scrape(&server, "/metrics").await;
    let protocol = [("protocol", "amqp091")];
    assert_eq!(
        value(
            &confirming,
            "rabbitmq_global_messages_received_confirm_total",
            &protocol
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &confirming,
            "rabbitmq_global_messages_received_total",
            &protocol
        ),
        Some(4.0)
    );
}

#[tokio::test]
async fn prometheus_unknown_paths_are_404_and_a_configured_port_in_use_stops_the_start() {
    let server = start().await;
    let (head, _) = get(&server, "/nothing-here").await;
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let refused = support::start_error(|config| {
        config.prometheus.listener.ip = "127.0.0.1".parse().unwrap();
        config.prometheus.listener.port = port;
        config.prometheus.listener.configured = true;
    })
    .await;
    assert!(
        refused.contains(&format!("cannot listen for Prometheus on 127.0.0.1:{port}")),
        "{refused}"
    );
}

/// A quorum queue's member: its Raft term and log positions, as the
/// quorum-queue dashboard reads them.
#[tokio::test]
async fn prometheus_raft_metrics_follow_a_quorum_queues_log() {
    let server = start().await;
    let (_connection, channel) = open(&server).await;
    declare_with(
        &channel,
        "replicated",
        lapin::options::QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        table(&[("x-queue-type", text("quorum"))]),
    )
    .await
    .unwrap();
    for body in [b"one", b"two"] {
        publish(&channel, "", "replicated", body).await;
    }
    eventually("the messages are in", || {
        server.queue("replicated").message_count() == 2
    })
    .await;
    let per_object = scrape(&server, "/metrics/per-object").await;
    let queue = [("vhost", "/"), ("queue", "replicated")];
    let term = value(&per_object, "rabbitmq_raft_term_total", &queue).expect("a term");
    assert!(term >= 1.0, "{term}");
    let written = value(&per_object, "rabbitmq_raft_log_last_written_index", &queue).unwrap();
    let committed = value(&per_object, "rabbitmq_raft_log_commit_index", &queue).unwrap();
    let applied = value(&per_object, "rabbitmq_raft_log_last_applied_index", &queue).unwrap();
    // Two enqueues at least, each committed and applied before it counts.
    assert!(
        written >= 2.0 && committed >= 2.0 && applied >= 2.0,
        "{written} {committed} {applied}"
    );
    assert!(committed <= written);
    assert!(value(&per_object, "rabbitmq_raft_log_snapshot_index", &queue).is_some());
    // The enqueues took some time to commit, and less than a second here.
    let latency = value(
        &per_object,
        "rabbitmq_raft_entry_commit_latency_seconds",
        &queue,
    )
    .unwrap();
    assert!(latency > 0.0 && latency < 1.0, "{latency}");
    // Reported by the leader, as RabbitMQ reports a quorum queue.
    assert_eq!(
        value(&per_object, "rabbitmq_queue_messages_ready", &queue),
        Some(2.0)
    );
    assert_eq!(
        value(
            &per_object,
            "rabbitmq_queue_messages_published_total",
            &queue
        ),
        Some(2.0)
    );
    let aggregated = scrape(&server, "/metrics").await;
    assert_eq!(
        value(
            &aggregated,
            "rabbitmq_global_publishers",
            &[("protocol", "amqp091")]
        ),
        Some(1.0)
    );
}
