//! Message TTL: `x-message-ttl` and the per-message `expiration`, with
//! RabbitMQ's semantics: the lower of the two applies, messages expire at
//! the head of the queue (on time, with no traffic), and an expired
//! message never reaches a consumer or basic.get.

mod helpers;
mod support;

use std::time::Duration;

use helpers::*;
use lapin::options::{BasicConsumeOptions, BasicNackOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Channel;
use support::TestServer;

async fn declare_with_ttl(channel: &Channel, name: &str, ttl_ms: i32) {
    declare_with(
        channel,
        name,
        QueueDeclareOptions::default(),
        table(&[("x-message-ttl", AMQPValue::LongInt(ttl_ms))]),
    )
    .await
    .expect("queue declares");
}

async fn get_text(channel: &Channel, queue: &str) -> Option<String> {
    get_body(channel, queue, true)
        .await
        .map(|body| String::from_utf8(body).unwrap())
}

#[tokio::test]
async fn ttl_head_expires_with_no_traffic() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_with_ttl(&channel, "idle", 100).await;
    for body in ["a", "b", "c"] {
        publish(&channel, "", "idle", body.as_bytes()).await;
    }
    let queue = server.queue("idle");
    eventually("the messages are in the queue", || {
        queue.message_count() == 3
    })
    .await;
    // Nobody publishes, consumes or polls: only the queue's timer can
    // remove them.
    eventually("the expired messages leave the idle queue", || {
        queue.message_count() == 0
    })
    .await;
    assert_eq!(get_text(&channel, "idle").await, None);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn ttl_zero_reaches_only_a_waiting_consumer() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_with_ttl(&channel, "instant", 0).await;
    declare_with_ttl(&channel, "nobody-waits", 0).await;
    let mut consumer = channel
        .basic_consume(
            "instant".into(),
            "waiting".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    publish(&channel, "", "instant", b"caught").await;
    publish(&channel, "", "nobody-waits", b"lost").await;
    let delivery = next_delivery(&mut consumer).await;
    assert_eq!(delivery.data, b"caught");
    // Published after the delivery above, on the same channel: handled.
    assert_eq!(get_text(&channel, "nobody-waits").await, None);
    assert_eq!(server.queue("nobody-waits").message_count(), 0);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn ttl_the_lower_of_queue_ttl_and_expiration_applies() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    // A long queue TTL, a short expiration: the expiration applies.
    declare_with_ttl(&channel, "long-ttl", 60_000).await;
    publish_with(&channel, "", "long-ttl", b"short", expiring_in("50")).await;
    // A short queue TTL, a long expiration: the queue's TTL applies.
    declare_with_ttl(&channel, "short-ttl", 50).await;
    publish_with(&channel, "", "short-ttl", b"long", expiring_in("60000")).await;
    let long_ttl = server.queue("long-ttl");
    let short_ttl = server.queue("short-ttl");
    eventually("both messages expire", || {
        long_ttl.message_count() == 0 && short_ttl.message_count() == 0
    })
    .await;
    // A message with neither limit reached stays.
    publish(&channel, "", "long-ttl", b"stays").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        get_text(&channel, "long-ttl").await.as_deref(),
        Some("stays")
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn ttl_expiration_deeper_in_the_queue_waits_for_the_head_and_is_never_delivered() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "mixed").await;
    publish(&channel, "", "mixed", b"first").await;
    publish_with(&channel, "", "mixed", b"expiring", expiring_in("50")).await;
    publish(&channel, "", "mixed", b"last").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // RabbitMQ expires only at the head: the expired message behind
    // "first" is still counted ...
    assert_eq!(server.queue("mixed").message_count(), 3);
    // ... but is dropped, not delivered, once it reaches the head.
    assert_eq!(get_text(&channel, "mixed").await.as_deref(), Some("first"));
    assert_eq!(get_text(&channel, "mixed").await.as_deref(), Some("last"));
    assert_eq!(get_text(&channel, "mixed").await, None);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn ttl_expired_head_is_skipped_for_a_consumer() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "skip").await;
    publish_with(&channel, "", "skip", b"stale", expiring_in("30")).await;
    publish(&channel, "", "skip", b"fresh").await;
    // No consumer, no timer-visible change for "fresh": wait past "stale".
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut consumer = channel
        .basic_consume(
            "skip".into(),
            "late".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    assert_eq!(next_delivery(&mut consumer).await.data, b"fresh");
    assert_no_delivery(&mut consumer).await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn ttl_paged_messages_expire_without_being_read() {
    let server = TestServer::start_with(|config| {
        config.store.settings.resident_messages_max = 8;
    })
    .await;
    let (connection, channel) = open(&server).await;
    declare_with_ttl(&channel, "deep", 150).await;
    for index in 0..40 {
        publish(&channel, "", "deep", format!("m{index}").as_bytes()).await;
    }
    let queue = server.queue("deep");
    eventually("all 40 are in the queue", || queue.message_count() == 40).await;
    assert!(
        queue.stats().messages_paged > 0,
        "some messages were paged out"
    );
    eventually("the paged messages expire too", || {
        queue.message_count() == 0
    })
    .await;
    assert_eq!(queue.stats().messages_paged, 0);
    assert_eq!(get_text(&channel, "deep").await, None);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn ttl_paged_expiration_is_honoured_when_paged_back_in() {
    let server = TestServer::start_with(|config| {
        config.store.settings.resident_messages_max = 8;
    })
    .await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "window").await;
    for index in 0..20 {
        publish(&channel, "", "window", format!("keep{index}").as_bytes()).await;
    }
    // Deep in the paged part: these expire while others are ahead of them.
    for index in 0..5 {
        let body = format!("expire{index}");
        publish_with(&channel, "", "window", body.as_bytes(), expiring_in("50")).await;
    }
    publish(&channel, "", "window", b"tail").await;
    let queue = server.queue("window");
    eventually("all are in the queue", || queue.message_count() == 26).await;
    assert!(queue.stats().messages_paged > 0);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut bodies = Vec::new();
    while let Some(body) = get_text(&channel, "window").await {
        bodies.push(body);
    }
    let mut expected: Vec<String> = (0..20).map(|index| format!("keep{index}")).collect();
    expected.push("tail".to_owned());
    assert_eq!(bodies, expected);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn ttl_requeued_message_keeps_its_original_expiry() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_with_ttl(&channel, "requeued", 300).await;
    channel
        .basic_qos(1, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = channel
        .basic_consume(
            "requeued".into(),
            "holder".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    publish(&channel, "", "requeued", b"held").await;
    let delivery = next_delivery(&mut consumer).await;
    // Held past its TTL, then requeued: it is expired, not redelivered.
    tokio::time::sleep(Duration::from_millis(450)).await;
    delivery
        .acker
        .nack(BasicNackOptions {
            requeue: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_no_delivery(&mut consumer).await;
    assert_eq!(server.queue("requeued").message_count(), 0);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// A message with its own expiration, delivered at once and held past it,
/// then requeued, is expired rather than delivered again, on a queue with
/// no TTL of its own.
#[tokio::test]
async fn ttl_own_expiration_applies_to_a_message_requeued_after_it() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "own").await;
    channel
        .basic_qos(1, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = channel
        .basic_consume(
            "own".into(),
            "holder".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    publish_with(&channel, "", "own", b"short-lived", expiring_in("100")).await;
    let delivery = next_delivery(&mut consumer).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    delivery
        .acker
        .nack(BasicNackOptions {
            requeue: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let queue = server.queue("own");
    eventually("the requeued message expires", || {
        queue.message_count() == 0
    })
    .await;
    assert_no_delivery(&mut consumer).await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}
