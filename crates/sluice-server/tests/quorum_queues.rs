//! Quorum queues on a single node (a group of one): RabbitMQ's declaration
//! rules and texts, confirms once committed, consumers within prefetch,
//! redeliveries counted in `x-delivery-count`, the delivery limit, length
//! limits, basic.get, purge, delete, and everything kept across a restart.

mod helpers;
mod support;

use helpers::*;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions,
    BasicQosOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
    QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use support::TestServer;

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

fn quorum(extra: &[(&str, AMQPValue)]) -> FieldTable {
    let mut arguments = table(extra);
    arguments.insert("x-queue-type".into(), text("quorum"));
    arguments
}

async fn declare_quorum(
    channel: &Channel,
    name: &str,
    extra: &[(&str, AMQPValue)],
) -> lapin::Queue {
    declare_with(channel, name, durable(), quorum(extra))
        .await
        .expect("the quorum queue declares")
}

/// Publishes persistent messages `first..first + count` (4-byte bodies)
/// and returns the confirms: true for each ack.
async fn publish_confirmed(
    channel: &Channel,
    queue: &str,
    numbers: std::ops::Range<u32>,
) -> Vec<bool> {
    let mut pending = Vec::new();
    for number in numbers {
        pending.push(
            channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    &number.to_be_bytes(),
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .expect("publish sent"),
        );
    }
    let mut acks = Vec::new();
    for confirm in pending {
        acks.push(confirm.await.expect("confirm arrives").is_ack());
    }
    acks
}

fn number(body: &[u8]) -> u32 {
    u32::from_be_bytes(body[..4].try_into().expect("a 4-byte body"))
}

/// Takes every message left in `queue` (basic.get, no-ack): their numbers.
async fn drain(channel: &Channel, queue: &str) -> Vec<u32> {
    let mut numbers = Vec::new();
    while let Some(body) = get_body(channel, queue, true).await {
        numbers.push(number(&body));
    }
    numbers
}

/// The reply code of a passive declaration of `queue`: 404 once it is gone.
async fn passive_declare_code(channel: &Channel, queue: &str) -> u16 {
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    amqp_error(declare_with(channel, queue, passive, FieldTable::default()).await).0
}

/// Arguments that dead-letter to the queue `target` through the default
/// exchange.
fn dead_letter_to(target: &str) -> [(&'static str, AMQPValue); 2] {
    [
        ("x-dead-letter-exchange", text("")),
        ("x-dead-letter-routing-key", text(target)),
    ]
}

async fn confirming_channel(server: &TestServer) -> (lapin::Connection, Channel) {
    let (connection, channel) = open(server).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    (connection, channel)
}

#[tokio::test]
async fn quorum_queue_declarations_follow_rabbitmq_rules_and_texts() {
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    let refusals: [(&str, QueueDeclareOptions, FieldTable, &str); 5] = [
        (
            "transient",
            QueueDeclareOptions::default(),
            quorum(&[]),
            "PRECONDITION_FAILED - invalid property 'non-durable' for queue 'transient' in vhost '/'",
        ),
        (
            "auto",
            QueueDeclareOptions {
                durable: true,
                auto_delete: true,
                ..Default::default()
            },
            quorum(&[]),
            "PRECONDITION_FAILED - invalid property 'auto-delete' for queue 'auto' in vhost '/'",
        ),
        (
            "mine",
            QueueDeclareOptions {
                durable: true,
                exclusive: true,
                ..Default::default()
            },
            quorum(&[]),
            "PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue 'mine' in vhost '/'",
        ),
        (
            "prioritised",
            durable(),
            quorum(&[("x-max-priority", AMQPValue::LongInt(5))]),
            "PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue 'prioritised' in vhost '/'",
        ),
        (
            "dlx-overflow",
            durable(),
            quorum(&[("x-overflow", text("reject-publish-dlx"))]),
            "PRECONDITION_FAILED - invalid arg 'x-overflow' with value 'reject-publish-dlx' for queue 'dlx-overflow' in vhost '/'",
        ),
    ];
    for (name, options, arguments, expected) in refusals {
        let channel = connection.create_channel().await.unwrap();
        let (code, message) = amqp_error(declare_with(&channel, name, options, arguments).await);
        assert_eq!((code, message.as_str()), (406, expected));
    }
    let channel = connection.create_channel().await.unwrap();
    let declared = declare_quorum(&channel, "q", &[]).await;
    assert_eq!(
        (declared.message_count(), declared.consumer_count()),
        (0, 0)
    );
    // The same again is fine; another type is not.
    declare_quorum(&channel, "q", &[]).await;
    let (code, message) =
        amqp_error(declare_with(&channel, "q", durable(), FieldTable::default()).await);
    assert_eq!(code, 406, "{message}");
    assert!(
        message.contains("inequivalent arg 'x-queue-type'"),
        "{message}"
    );
    server.stop().await;
}

#[tokio::test]
async fn quorum_queue_confirms_delivers_in_order_and_counts_redeliveries() {
    let server = TestServer::start().await;
    let (_connection, channel) = confirming_channel(&server).await;
    declare_quorum(&channel, "orders", &[]).await;
    let acks = publish_confirmed(&channel, "orders", 0..500).await;
    assert!(acks.iter().all(|ack| *ack), "every publish is confirmed");
    let declared = declare_quorum(&channel, "orders", &[]).await;
    assert_eq!(declared.message_count(), 500);

    // basic.get takes the head; a nack puts it back, counted.
    let got = channel
        .basic_get("orders".into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .expect("a message");
    assert_eq!(number(&got.delivery.data), 0);
    assert_eq!(got.message_count, 499);
    assert!(!got.delivery.redelivered);
    channel
        .basic_nack(
            got.delivery.delivery_tag,
            BasicNackOptions {
                multiple: false,
                requeue: true,
            },
        )
        .await
        .unwrap();

    let consumer_channel = server_channel(&_connection).await;
    consumer_channel
        .basic_qos(50, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = consumer_channel
        .basic_consume(
            "orders".into(),
            "reader".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let first = next_delivery(&mut consumer).await;
    assert_eq!(number(&first.data), 0, "the returned message comes first");
    assert!(first.redelivered);
    let count = first
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get("x-delivery-count").cloned());
    assert_eq!(count, Some(AMQPValue::LongLongInt(1)));
    first.ack(BasicAckOptions::default()).await.unwrap();
    for expected in 1..500 {
        let delivery = next_delivery(&mut consumer).await;
        assert_eq!(number(&delivery.data), expected, "in publish order");
        assert!(!delivery.redelivered);
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    eventually("the queue is empty", || {
        server.queue("orders").message_count() == 0
    })
    .await;
    server.stop().await;
}

async fn server_channel(connection: &lapin::Connection) -> Channel {
    connection.create_channel().await.expect("channel opens")
}

#[tokio::test]
async fn quorum_queue_returns_what_a_closed_channel_held_and_survives_a_restart() {
    let server = TestServer::start().await;
    let (connection, channel) = confirming_channel(&server).await;
    declare_quorum(&channel, "kept", &[]).await;
    assert!(publish_confirmed(&channel, "kept", 0..100)
        .await
        .iter()
        .all(|ack| *ack));
    // A consumer takes ten and its channel closes without acking them.
    let reader = server_channel(&connection).await;
    reader
        .basic_qos(10, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = reader
        .basic_consume(
            "kept".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for expected in 0..10 {
        assert_eq!(number(&next_delivery(&mut consumer).await.data), expected);
    }
    assert_no_delivery(&mut consumer).await;
    reader.close(200, "done".into()).await.unwrap();
    eventually("the ten are back", || {
        server.queue("kept").stats().messages_unacknowledged == 0
    })
    .await;
    // Ten taken for good.
    for _ in 0..10 {
        let got = channel
            .basic_get("kept".into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
            .expect("a message");
        assert!(got.delivery.redelivered, "the returned ones first");
    }
    drop(connection);

    let server = server.restart().await;
    let (_connection, channel) = confirming_channel(&server).await;
    let declared = declare_quorum(&channel, "kept", &[]).await;
    assert_eq!(
        declared.message_count(),
        90,
        "what was confirmed and not taken"
    );
    assert_eq!(drain(&channel, "kept").await, (10..100).collect::<Vec<_>>());
    // Purged and deleted like any queue.
    assert!(publish_confirmed(&channel, "kept", 0..5)
        .await
        .iter()
        .all(|ack| *ack));
    let purged = channel
        .queue_purge("kept".into(), QueuePurgeOptions::default())
        .await
        .unwrap();
    assert_eq!(purged, 5);
    channel
        .queue_delete("kept".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    assert_eq!(passive_declare_code(&channel, "kept").await, 404);
    server.stop().await;
}

#[tokio::test]
async fn quorum_queue_dead_letters_past_the_delivery_limit_and_nacks_past_its_length() {
    let server = TestServer::start().await;
    let (_connection, channel) = confirming_channel(&server).await;
    declare_with(&channel, "dead", durable(), FieldTable::default())
        .await
        .unwrap();
    declare_quorum(
        &channel,
        "limited",
        &[
            [("x-delivery-limit", AMQPValue::LongInt(1))].as_slice(),
            &dead_letter_to("dead"),
        ]
        .concat(),
    )
    .await;
    assert!(publish_confirmed(&channel, "limited", 7..8).await[0]);
    // Delivered, returned once (allowed), delivered again, returned: past
    // the limit, it goes to the dead-letter queue.
    for round in 0..2 {
        let got = channel
            .basic_get("limited".into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("delivered in round {round}"));
        channel
            .basic_nack(
                got.delivery.delivery_tag,
                BasicNackOptions {
                    multiple: false,
                    requeue: true,
                },
            )
            .await
            .unwrap();
    }
    eventually("dead-lettered", || {
        server.queue("dead").message_count() == 1
    })
    .await;
    let dead = channel
        .basic_get("dead".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the dead letter");
    assert_eq!(number(&dead.delivery.data), 7);
    let death = first_death(&dead.delivery);
    assert_eq!(death.inner().get("reason"), Some(&text("delivery_limit")));
    assert_eq!(get_body(&channel, "limited", true).await, None);

    // reject-publish: the publish past the limit is nacked.
    declare_quorum(
        &channel,
        "short",
        &[
            ("x-max-length", AMQPValue::LongInt(2)),
            ("x-overflow", text("reject-publish")),
        ],
    )
    .await;
    let acks = publish_confirmed(&channel, "short", 0..3).await;
    assert_eq!(acks, [true, true, false]);
    // drop-head (the default): the oldest go.
    declare_quorum(
        &channel,
        "rolling",
        &[("x-max-length", AMQPValue::LongInt(2))],
    )
    .await;
    assert!(publish_confirmed(&channel, "rolling", 0..5)
        .await
        .iter()
        .all(|ack| *ack));
    assert_eq!(drain(&channel, "rolling").await, [3, 4]);
    server.stop().await;
}

#[tokio::test]
async fn quorum_queue_messages_expire_on_time_in_an_idle_queue() {
    let server = TestServer::start().await;
    let (_connection, channel) = confirming_channel(&server).await;
    declare_with(&channel, "expired", durable(), FieldTable::default())
        .await
        .unwrap();
    declare_quorum(
        &channel,
        "delayed",
        &[
            [("x-message-ttl", AMQPValue::LongInt(300))].as_slice(),
            &dead_letter_to("expired"),
        ]
        .concat(),
    )
    .await;
    assert!(publish_confirmed(&channel, "delayed", 0..3)
        .await
        .iter()
        .all(|ack| *ack));
    // Nothing else happens to the queue: its leader's tick expires them.
    eventually("all three dead-lettered", || {
        server.queue("expired").message_count() == 3
    })
    .await;
    assert_eq!(server.queue("delayed").message_count(), 0);
    assert_eq!(drain(&channel, "expired").await, [0, 1, 2]);
    server.stop().await;
}

#[tokio::test]
async fn quorum_queue_unused_for_its_x_expires_is_deleted() {
    let server = TestServer::start().await;
    let (_connection, channel) = confirming_channel(&server).await;
    declare_quorum(
        &channel,
        "short-lived",
        &[("x-expires", AMQPValue::LongInt(500))],
    )
    .await;
    assert!(publish_confirmed(&channel, "short-lived", 0..2)
        .await
        .iter()
        .all(|ack| *ack));
    // Publishing is not using: it goes half a second after its declaration.
    eventually("deleted", || {
        server
            .running()
            .broker
            .vhost("/")
            .is_some_and(|vhost| vhost.queue("short-lived", 0).is_err())
    })
    .await;
    assert_eq!(passive_declare_code(&channel, "short-lived").await, 404);
    server.stop().await;
}

/// A 1 KiB body that names its number and whose every byte depends on it.
fn numbered_kib(number: u32) -> Vec<u8> {
    let mut body = number.to_be_bytes().to_vec();
    body.extend((0..1020u32).map(|offset| (number.wrapping_mul(31).wrapping_add(offset)) as u8));
    body
}

/// Consumes the messages `numbers` with acks: each whole, each once, and
/// those from `fresh_from` on (never handed to a consumer before) in
/// order. Messages that went back come in the order they went back, which
/// RabbitMQ does not promise either.
async fn consume_all(
    channel: &Channel,
    queue: &str,
    numbers: std::ops::Range<u32>,
    fresh_from: u32,
) {
    let mut consumer = consumer_with_prefetch(channel, queue, "", 100).await;
    let mut received = Vec::new();
    let mut last_fresh = None;
    for _ in numbers.clone() {
        let delivery = next_delivery(&mut consumer).await;
        let got = number(&delivery.data);
        assert!(delivery.data == numbered_kib(got), "message {got} is whole");
        if got >= fresh_from {
            assert!(last_fresh < Some(got), "{got} after {last_fresh:?}");
            last_fresh = Some(got);
        }
        received.push(got);
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    channel
        .basic_cancel(consumer.tag().as_str().into(), Default::default())
        .await
        .unwrap();
    received.sort_unstable();
    assert_eq!(received, numbers.collect::<Vec<_>>(), "each message once");
}

#[tokio::test]
async fn quorum_queue_deeper_than_its_window_is_read_back_from_its_log_across_a_restart() {
    // A window of 64 messages: nearly every body comes back from the log.
    let server =
        TestServer::start_with(|config| config.store.settings.resident_bytes_max = 64 * 1024).await;
    let (connection, channel) = confirming_channel(&server).await;
    declare_quorum(&channel, "deep", &[]).await;
    let total = 12_000u32;
    let mut pending = Vec::new();
    for number in 0..total {
        pending.push(
            channel
                .basic_publish(
                    "".into(),
                    "deep".into(),
                    BasicPublishOptions::default(),
                    &numbered_kib(number),
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .unwrap(),
        );
    }
    for confirm in pending {
        assert!(confirm.await.unwrap().is_ack());
    }
    let logged = dir_bytes(&server.data_dir().join("queues"));
    assert!(
        logged > u64::from(total) * 1024,
        "the log holds every body: {logged} bytes"
    );
    let reader = server_channel(&connection).await;
    consume_all(&reader, "deep", 0..2_000, 0).await;
    connection.close(200, "done".into()).await.unwrap();
    // Acks are settled once committed: a stop before then would redeliver.
    eventually("the acks are applied and the rest is back", || {
        let stats = server.queue("deep").stats();
        stats.messages_ready == total - 2_000 && stats.messages_unacknowledged == 0
    })
    .await;

    // The default window (8 MiB) holds part of the 10,000 left after the
    // restart; the rest is read from the log as the consumer gets there.
    let server = server.restart().await;
    let (_connection, channel) = confirming_channel(&server).await;
    let declared = declare_quorum(&channel, "deep", &[]).await;
    assert_eq!(declared.message_count(), total - 2_000);
    // The first consumer was handed at most its credit (twice its
    // prefetch) beyond what it acked.
    consume_all(&channel, "deep", 2_000..total, 2_200).await;
    eventually("every ack is applied", || {
        let stats = server.queue("deep").stats();
        stats.messages_ready == 0 && stats.messages_unacknowledged == 0
    })
    .await;
    // Drained and left alone (it hibernates after ten seconds), the queue
    // compacts its log: the bodies' disk is given back.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    loop {
        let left = dir_bytes(&server.data_dir().join("queues"));
        if left < 256 * 1024 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the drained queue still holds {left} bytes: {}",
            listing(&server.data_dir().join("queues"))
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    server.stop().await;
}

/// The files under `dir` with their sizes, for a failure's message.
fn listing(dir: &std::path::Path) -> String {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return String::new();
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(metadata) if metadata.is_dir() => listing(&entry.path()),
            Ok(metadata) => format!("{} {}; ", entry.path().display(), metadata.len()),
            Err(_) => String::new(),
        })
        .collect()
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(metadata) if metadata.is_dir() => dir_bytes(&entry.path()),
            Ok(metadata) => metadata.len(),
            Err(_) => 0,
        })
        .sum()
}

#[tokio::test]
async fn quorum_queue_dead_letters_at_least_once_keeping_what_reaches_no_queue() {
    let server = TestServer::start().await;
    let (connection, channel) = confirming_channel(&server).await;
    let refused = declare_with(
        &channel,
        "bad-strategy",
        durable(),
        quorum(&[("x-dead-letter-strategy", text("twice"))]),
    )
    .await;
    assert_eq!(
        amqp_error(refused),
        (
            406,
            "PRECONDITION_FAILED - invalid arg 'x-dead-letter-strategy' for queue 'bad-strategy' in vhost '/': invalid_dlx_strategy".to_owned()
        )
    );
    let channel = server_channel(&connection).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare_quorum(
        &channel,
        "source",
        &[
            dead_letter_to("later").as_slice(),
            &[
                ("x-dead-letter-strategy", text("at-least-once")),
                ("x-overflow", text("reject-publish")),
                ("x-max-length", AMQPValue::LongInt(3)),
            ],
        ]
        .concat(),
    )
    .await;
    assert!(publish_confirmed(&channel, "source", 0..3)
        .await
        .iter()
        .all(|ack| *ack));
    // Two rejected while no queue is bound to take them: at most once,
    // they would be gone; at least once, they stay, and still count
    // against x-max-length.
    for _ in 0..2 {
        let got = channel
            .basic_get("source".into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
            .expect("a message");
        channel
            .basic_nack(
                got.delivery.delivery_tag,
                BasicNackOptions {
                    multiple: false,
                    requeue: false,
                },
            )
            .await
            .unwrap();
    }
    eventually("the rejects are applied", || {
        server.queue("source").stats().messages_unacknowledged == 0
    })
    .await;
    assert_eq!(
        publish_confirmed(&channel, "source", 3..4).await,
        [false],
        "full: the two waiting to be dead-lettered count"
    );
    // The target appears: the waiting messages reach it, with x-death.
    declare_with(&channel, "later", durable(), FieldTable::default())
        .await
        .unwrap();
    eventually("dead-lettered once the target exists", || {
        server.queue("later").message_count() == 2
    })
    .await;
    let mut numbers = Vec::new();
    for _ in 0..2 {
        let dead = channel
            .basic_get("later".into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
            .expect("a dead letter");
        let death = first_death(&dead.delivery);
        assert_eq!(death.inner().get("reason"), Some(&text("rejected")));
        assert_eq!(death.inner().get("queue"), Some(&text("source")));
        numbers.push(number(&dead.delivery.data));
    }
    numbers.sort_unstable();
    assert_eq!(numbers, [0, 1]);
    // Settled in the source (a moment after the target has them): its
    // room is back, and only then.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !publish_confirmed(&channel, "source", 4..5).await[0] {
        assert!(
            std::time::Instant::now() < deadline,
            "the room never came back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(publish_confirmed(&channel, "source", 5..6).await, [true]);
    assert_eq!(publish_confirmed(&channel, "source", 6..7).await, [false]);
    assert_eq!(drain(&channel, "source").await, [2, 4, 5]);
    server.stop().await;
}
