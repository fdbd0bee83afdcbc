//! Drain-bounded ingress: publishers into a queue whose consumers are behind
//! are paused, so the backlog stays bounded instead of growing without end.

mod helpers;
mod support;

use std::time::Duration;

use helpers::*;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use sluice_core::classic_queue::FLOW_BACKLOG_MESSAGES;
use support::TestServer;

const MESSAGES: usize = 20_000;

async fn message_count(server: &TestServer, queue: &str) -> u32 {
    let (connection, channel) = open(server).await;
    let count = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap()
        .message_count();
    connection.close(200, "bye".into()).await.unwrap();
    count
}

/// Publishes without confirms from its own connection, in the background.
fn publish_in_background(server: &TestServer, queue: &'static str) -> tokio::task::JoinHandle<()> {
    let uri = server.uri();
    tokio::spawn(async move {
        let connection = lapin::Connection::connect(&uri, lapin::ConnectionProperties::default())
            .await
            .unwrap();
        let channel = connection.create_channel().await.unwrap();
        for _ in 0..MESSAGES {
            channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    &[0u8; 100],
                    BasicProperties::default(),
                )
                .await
                .unwrap();
        }
        // Wait until the broker has read everything: a declare round trip
        // is answered only after the publishes before it.
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        connection.close(200, "bye".into()).await.unwrap();
    })
}

#[tokio::test]
async fn flow_publisher_is_paused_while_consumers_are_behind() {
    let server = TestServer::start().await;
    let (_consumer_connection, consumer_channel) = open(&server).await;
    declare(&consumer_channel, "behind").await;
    // A consumer that takes one message and never acks it: the queue cannot drain.
    let consumer = stuck_consumer(&consumer_channel, "behind").await;
    let publisher = publish_in_background(&server, "behind");
    // Wait for the backlog to pass the bound, however slow the machine is,
    // then give an unthrottled publisher ample time to send everything.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while (message_count(&server, "behind").await as usize) <= FLOW_BACKLOG_MESSAGES {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the backlog never built up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let backlog = message_count(&server, "behind").await as usize;
    assert!(
        backlog > FLOW_BACKLOG_MESSAGES && backlog < MESSAGES - FLOW_BACKLOG_MESSAGES,
        "backlog {backlog} should stop a little past {FLOW_BACKLOG_MESSAGES}"
    );
    assert!(!publisher.is_finished(), "the publisher is paused");
    // The consumer goes: a queue without consumers is a buffer and takes the rest.
    consumer_channel
        .basic_cancel("stuck".into(), Default::default())
        .await
        .unwrap();
    drop(consumer);
    tokio::time::timeout(Duration::from_secs(10), publisher)
        .await
        .expect("the publisher resumes")
        .unwrap();
    // One message is out with the cancelled consumer, unacked.
    assert_eq!(
        message_count(&server, "behind").await as usize,
        MESSAGES - 1
    );
    server.stop().await;
}

#[tokio::test]
async fn flow_queue_without_consumers_takes_everything() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "buffer").await;
    tokio::time::timeout(
        Duration::from_secs(20),
        publish_in_background(&server, "buffer"),
    )
    .await
    .expect("the publisher is never paused")
    .unwrap();
    assert_eq!(message_count(&server, "buffer").await as usize, MESSAGES);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn flow_connection_consuming_its_own_queue_is_never_paused() {
    let server = TestServer::start().await;
    let (connection, publish_channel) = open(&server).await;
    declare(&publish_channel, "own").await;
    let consume_channel = connection.create_channel().await.unwrap();
    consume_channel
        .basic_qos(10, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = consume_channel
        .basic_consume(
            "own".into(),
            "self".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let acker = tokio::spawn(async move {
        for _ in 0..MESSAGES {
            let delivery = next_delivery(&mut consumer).await;
            delivery.ack(Default::default()).await.unwrap();
        }
    });
    for _ in 0..MESSAGES {
        publish_channel
            .basic_publish(
                "".into(),
                "own".into(),
                BasicPublishOptions::default(),
                &[1u8; 100],
                BasicProperties::default(),
            )
            .await
            .unwrap();
    }
    tokio::time::timeout(Duration::from_secs(30), acker)
        .await
        .expect("every message is consumed: no deadlock")
        .unwrap();
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// The node-wide write budget: with a budget of one byte, every queue that
/// pages pauses its publishers after each append until the sync thread has
/// written it out. Publishers into several queues must all still finish
/// (each pause ends), spending time in flow on the way, and every message
/// must be there and readable back from disk.
#[tokio::test]
async fn flow_write_budget_pauses_paging_queues_and_always_resumes_them() {
    let server = TestServer::start_with(|config| {
        config.store.write_buffer_total_max = 1;
        config.store.settings.resident_messages_max = 16;
    })
    .await;
    let (connection, channel) = open(&server).await;
    const QUEUES: [&str; 3] = ["budget-1", "budget-2", "budget-3"];
    for queue in QUEUES {
        declare(&channel, queue).await;
    }
    let publishers: Vec<_> = QUEUES
        .iter()
        .map(|queue| publish_in_background(&server, queue))
        .collect();
    let mut longest_flow_ms = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !publishers.iter().all(|publisher| publisher.is_finished()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a publisher paused over the write budget never resumed"
        );
        for snapshot in server.running().connections() {
            longest_flow_ms = longest_flow_ms.max(snapshot.time_in_flow_ms);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for publisher in publishers {
        publisher.await.unwrap();
    }
    assert!(longest_flow_ms > 0, "no publisher was ever paused");
    for queue in QUEUES {
        assert_eq!(message_count(&server, queue).await as usize, MESSAGES);
    }
    let mut consumer = channel
        .basic_consume(
            QUEUES[0].into(),
            "drain".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    for _ in 0..MESSAGES {
        next_delivery(&mut consumer).await;
    }
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// The node-wide bound on bytes in flight to consumers. Consumers that never
/// read their sockets would each pin a full delivery buffer (1 MiB); with
/// the bound exceeded, each takes only the 64 KiB floor, so the total stays
/// near the bound plus the floor per connection. When they go, nothing is
/// left counted.
#[tokio::test]
async fn flow_deliveries_in_flight_are_bounded_across_connections() {
    use sluice_server::limits::{OUTBOX_DELIVERY_BYTES_MAX, OUTBOX_DELIVERY_FLOOR_BYTES};
    use sluice_wire::amq_protocol::protocol::{basic, AMQPClass};
    use sluice_wire::amq_protocol::types::FieldTable as WireTable;
    use support::raw::RawClient;

    const STUCK_CONSUMERS: usize = 4;
    const MESSAGES_PER_QUEUE: usize = 12_000;
    let server = TestServer::start_with(|config| config.delivery_buffer_total_max = 1).await;
    let (connection, channel) = open(&server).await;
    let body = vec![7u8; 1000];
    for index in 0..STUCK_CONSUMERS {
        let queue = format!("stuck-{index}");
        declare(&channel, &queue).await;
        for _ in 0..MESSAGES_PER_QUEUE {
            channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    &body,
                    BasicProperties::default(),
                )
                .await
                .unwrap();
        }
    }
    message_count(&server, "stuck-0").await; // every publish handled
    let mut stuck = Vec::new();
    for index in 0..STUCK_CONSUMERS {
        let mut client = RawClient::open(server.address).await;
        client.open_channel(1).await;
        client
            .send_method(
                1,
                AMQPClass::Basic(basic::AMQPMethod::Consume(basic::Consume {
                    queue: format!("stuck-{index}").as_str().into(),
                    consumer_tag: "".into(),
                    no_local: false,
                    no_ack: true,
                    exclusive: false,
                    nowait: true,
                    arguments: WireTable::default(),
                })),
            )
            .await;
        // From here the client never reads: the kernel's buffers fill, then
        // the broker's.
        stuck.push(client);
    }
    let mut peak = 0;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        peak = peak.max(server.running().in_flight_delivery_bytes());
    }
    // A writer may be holding one buffer taken at the floor while the next
    // fills to it again: two floors and a delivery each.
    let bound = STUCK_CONSUMERS as u64 * (2 * OUTBOX_DELIVERY_FLOOR_BYTES as u64 + 2048);
    assert!(
        peak > 0 && peak <= bound,
        "in flight peaked at {peak} bytes; bound {bound}"
    );
    assert!(bound < STUCK_CONSUMERS as u64 * OUTBOX_DELIVERY_BYTES_MAX as u64);
    drop(stuck);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.running().in_flight_delivery_bytes() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} bytes still counted after the consumers went",
            server.running().in_flight_delivery_bytes()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// `credit_flow_default_credit` is how many publishes a reader routes before
/// it looks at its queues' congestion again. With a credit of 1 it looks after
/// every publish, so a publisher into a queue whose consumer is stuck stops
/// at the first publish past the congestion bound. The publishes arrive in
/// one write, so with the default credit the reader would route hundreds
/// more from its buffer before looking.
#[tokio::test]
async fn flow_credit_of_one_stops_the_publisher_at_the_bound() {
    use sluice_wire::amq_protocol::protocol::{basic, AMQPClass};
    use sluice_wire::encode::encode_control;
    use sluice_wire::frame::{FrameType, FRAME_END};
    use support::raw::RawClient;

    let server = TestServer::start_with(|config| config.credit_flow_default_credit = 1).await;
    let (_consumer_connection, consumer_channel) = open(&server).await;
    declare(&consumer_channel, "credit").await;
    let _consumer = stuck_consumer(&consumer_channel, "credit").await;

    let mut batch = bytes::BytesMut::new();
    for _ in 0..FLOW_BACKLOG_MESSAGES * 3 {
        encode_control(
            &mut batch,
            1,
            &AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
                exchange: "".into(),
                routing_key: "credit".into(),
                mandatory: false,
                immediate: false,
            })),
        );
        batch.extend_from_slice(&RawClient::frame_bytes(
            FrameType::Header as u8,
            1,
            &RawClient::content_header_payload(10),
            FRAME_END,
        ));
        batch.extend_from_slice(&RawClient::frame_bytes(
            FrameType::Body as u8,
            1,
            &[1u8; 10],
            FRAME_END,
        ));
    }
    let mut publisher = RawClient::open(server.address).await;
    publisher.open_channel(1).await;
    let writer = tokio::spawn(async move {
        publisher.send_lenient(&batch).await;
        publisher
    });
    let queue = server.queue("credit");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !queue.is_congested() {
        assert!(tokio::time::Instant::now() < deadline, "never congested");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Ample time for a reader that kept routing to show it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        queue.message_count() as usize,
        FLOW_BACKLOG_MESSAGES + 1,
        "the publish that crossed the bound is the last one routed"
    );
    writer.abort();
    server.stop().await;
}
