//! Priority queues (`x-max-priority`): messages with a higher `priority`
//! property are delivered first, in publish order within a priority; a
//! priority above the maximum counts as the maximum, none counts as 0.

mod helpers;
mod support;

use helpers::*;
use lapin::options::{BasicGetOptions, BasicRejectOptions, QueueDeclareOptions};
use lapin::types::AMQPValue;
use lapin::{BasicProperties, Channel};
use support::TestServer;

async fn declare_priority(channel: &Channel, name: &str, max_priority: u8) {
    declare_with(
        channel,
        name,
        QueueDeclareOptions::default(),
        table(&[("x-max-priority", AMQPValue::ShortShortUInt(max_priority))]),
    )
    .await
    .expect("queue declares");
}

async fn publish_priority(channel: &Channel, queue: &str, body: &str, priority: Option<u8>) {
    let properties = match priority {
        Some(priority) => BasicProperties::default().with_priority(priority),
        None => BasicProperties::default(),
    };
    publish_with(channel, "", queue, body.as_bytes(), properties).await;
}

/// Every ready message, by basic.get with no-ack, with its redelivered flag.
async fn drain(channel: &Channel, queue: &str) -> Vec<(String, bool)> {
    let mut bodies = Vec::new();
    while let Some(message) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        bodies.push((
            String::from_utf8(message.delivery.data.clone()).unwrap(),
            message.delivery.redelivered,
        ));
    }
    bodies
}

fn bodies(drained: &[(String, bool)]) -> Vec<&str> {
    drained.iter().map(|(body, _)| body.as_str()).collect()
}

async fn wait_ready(server: &TestServer, queue: &str, count: u32) {
    eventually("the messages are in the queue", || {
        server.queue(queue).message_count() == count
    })
    .await;
}

/// A confirming channel and a durable priority queue "q" with `max_priority`.
async fn open_durable_priority_queue(
    server: &TestServer,
    max_priority: u8,
) -> (lapin::Connection, lapin::Channel) {
    let (connection, channel) = open(server).await;
    channel
        .confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare_with(
        &channel,
        "q",
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        table(&[("x-max-priority", AMQPValue::ShortShortUInt(max_priority))]),
    )
    .await
    .unwrap();
    (connection, channel)
}

#[tokio::test]
async fn priority_queue_delivers_higher_priority_first() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_priority(&channel, "q", 10).await;
    publish_priority(&channel, "q", "low-1", Some(1)).await;
    publish_priority(&channel, "q", "none", None).await;
    publish_priority(&channel, "q", "high-1", Some(9)).await;
    publish_priority(&channel, "q", "low-2", Some(1)).await;
    publish_priority(&channel, "q", "high-2", Some(9)).await;
    publish_priority(&channel, "q", "zero", Some(0)).await;
    wait_ready(&server, "q", 6).await;
    let mut consumer = channel
        .basic_consume(
            "q".into(),
            "c".into(),
            lapin::options::BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let mut received = Vec::new();
    for _ in 0..6 {
        let delivery = next_delivery(&mut consumer).await;
        received.push(String::from_utf8(delivery.data.clone()).unwrap());
    }
    assert_eq!(
        received,
        ["high-1", "high-2", "low-1", "low-2", "none", "zero"]
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn priority_queue_priority_above_the_max_counts_as_the_max() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_priority(&channel, "q", 5).await;
    publish_priority(&channel, "q", "four", Some(4)).await;
    publish_priority(&channel, "q", "five", Some(5)).await;
    publish_priority(&channel, "q", "two-hundred", Some(200)).await;
    publish_priority(&channel, "q", "six", Some(6)).await;
    wait_ready(&server, "q", 4).await;
    let drained = drain(&channel, "q").await;
    assert_eq!(bodies(&drained), ["five", "two-hundred", "six", "four"]);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn priority_queue_requeue_returns_messages_to_their_priority_in_order() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_priority(&channel, "q", 3).await;
    for (body, priority) in [
        ("a-low", 1),
        ("b-high", 3),
        ("c-low", 1),
        ("d-high", 3),
        ("e-low", 1),
    ] {
        publish_priority(&channel, "q", body, Some(priority)).await;
    }
    wait_ready(&server, "q", 5).await;
    // Take four without ack: b, d (high), then a, c (low).
    let mut taken = Vec::new();
    for expected in ["b-high", "d-high", "a-low", "c-low"] {
        let message = channel
            .basic_get("q".into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
            .expect("a message");
        assert_eq!(message.delivery.data, expected.as_bytes());
        taken.push(message);
    }
    // Requeue newest first: each goes back to its priority, in publish order.
    for message in taken.iter().rev() {
        channel
            .basic_reject(
                message.delivery.delivery_tag,
                BasicRejectOptions { requeue: true },
            )
            .await
            .unwrap();
    }
    let drained = drain(&channel, "q").await;
    assert_eq!(
        drained,
        [
            ("b-high".to_owned(), true),
            ("d-high".to_owned(), true),
            ("a-low".to_owned(), true),
            ("c-low".to_owned(), true),
            ("e-low".to_owned(), false),
        ]
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// Priority queues do not page: with a window of 4 messages, twenty still
/// come out in priority order.
#[tokio::test]
async fn priority_queue_deeper_than_the_paging_window_keeps_priority_order() {
    let server = TestServer::start_with(|config| {
        config.store.settings.resident_messages_max = 4;
    })
    .await;
    let (connection, channel) = open(&server).await;
    declare_priority(&channel, "q", 2).await;
    for index in 0..20 {
        publish_priority(&channel, "q", &format!("m{index}"), Some((index % 3) as u8)).await;
    }
    wait_ready(&server, "q", 20).await;
    assert_eq!(server.queue("q").stats().messages_paged, 0);
    let drained = drain(&channel, "q").await;
    let expected: Vec<String> = [2, 1, 0]
        .into_iter()
        .flat_map(|priority| {
            (0..20)
                .filter(move |index| index % 3 == priority)
                .map(|index| format!("m{index}"))
        })
        .collect();
    assert_eq!(bodies(&drained), expected);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// Message TTL applies at the head of a priority queue as anywhere else.
#[tokio::test]
async fn priority_queue_expired_head_is_dropped() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_priority(&channel, "q", 5).await;
    publish_with(
        &channel,
        "",
        "q",
        b"expiring-high",
        expiring_in("0").with_priority(5),
    )
    .await;
    publish_priority(&channel, "q", "low", Some(1)).await;
    publish_priority(&channel, "q", "high", Some(5)).await;
    let drained = drain(&channel, "q").await;
    assert_eq!(bodies(&drained), ["high", "low"]);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// A durable priority queue recovers its persistent messages as references
/// in offset order; they are read back into their levels before anything
/// is delivered, so after a restart both basic.get and consumers see
/// priority order, and messages published since recovery take their place.
#[tokio::test]
async fn priority_queue_recovered_messages_keep_priority_order() {
    let data_dir = std::env::temp_dir().join(format!("sluice-priority-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let start = |data_dir: std::path::PathBuf| {
        TestServer::start_with(move |config| {
            config.data_dir = data_dir;
        })
    };
    let server = start(data_dir.clone()).await;
    let (connection, channel) = open_durable_priority_queue(&server, 9).await;
    for (body, priority) in [("a-1", 1), ("b-9", 9), ("c-1", 1), ("d-5", 5), ("e-9", 9)] {
        publish_with(
            &channel,
            "",
            "q",
            body.as_bytes(),
            BasicProperties::default()
                .with_delivery_mode(2)
                .with_priority(priority),
        )
        .await;
    }
    channel.wait_for_confirms().await.unwrap();
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;

    let server = start(data_dir.clone()).await;
    assert_eq!(server.queue("q").stats().messages_paged, 5);
    let (connection, channel) = open(&server).await;
    // Published after recovery: newer than every recovered message.
    publish_priority(&channel, "q", "f-9", Some(9)).await;
    publish_priority(&channel, "q", "g-1", Some(1)).await;
    let first = channel
        .basic_get("q".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("a message");
    assert_eq!(first.delivery.data, b"b-9");
    assert!(first.delivery.redelivered);
    let mut consumer = channel
        .basic_consume(
            "q".into(),
            "c".into(),
            lapin::options::BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let mut received = Vec::new();
    for _ in 0..6 {
        let delivery = next_delivery(&mut consumer).await;
        received.push(String::from_utf8(delivery.data.clone()).unwrap());
    }
    assert_eq!(received, ["e-9", "f-9", "d-5", "a-1", "c-1", "g-1"]);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// Consumers of a recovered priority queue get priority order too: nothing
/// is delivered until the pager has read every recovered message back.
#[tokio::test]
async fn priority_queue_recovered_messages_reach_consumers_in_priority_order() {
    let data_dir =
        std::env::temp_dir().join(format!("sluice-priority-consume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let start = |data_dir: std::path::PathBuf| {
        TestServer::start_with(move |config| {
            config.data_dir = data_dir;
            config.store.settings.resident_messages_max = 4;
        })
    };
    let server = start(data_dir.clone()).await;
    let (connection, channel) = open_durable_priority_queue(&server, 2).await;
    for index in 0..30 {
        publish_with(
            &channel,
            "",
            "q",
            format!("m{index}").as_bytes(),
            BasicProperties::default()
                .with_delivery_mode(2)
                .with_priority((index % 3) as u8),
        )
        .await;
    }
    channel.wait_for_confirms().await.unwrap();
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;

    let server = start(data_dir.clone()).await;
    let (connection, channel) = open(&server).await;
    let mut consumer = channel
        .basic_consume(
            "q".into(),
            "c".into(),
            lapin::options::BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let mut received = Vec::new();
    for _ in 0..30 {
        let delivery = next_delivery(&mut consumer).await;
        received.push(String::from_utf8(delivery.data.clone()).unwrap());
    }
    let expected: Vec<String> = [2, 1, 0]
        .into_iter()
        .flat_map(|priority| {
            (0..30)
                .filter(move |index| index % 3 == priority)
                .map(|index| format!("m{index}"))
        })
        .collect();
    assert_eq!(received, expected);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
    let _ = std::fs::remove_dir_all(&data_dir);
}
