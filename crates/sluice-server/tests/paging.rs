//! Deep queues page their messages to disk and read them back in order; a
//! few unacked messages do not pin the journal; a deep queue being drained
//! does not hold its publishers back.

mod helpers;
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_lite::StreamExt;
use helpers::*;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel};
use sluice_core::classic_queue::CONSUMERLESS_WINDOW_DIVISOR;
use support::TestServer;

/// A body that names its index, padded to `size` bytes.
fn body(index: usize, size: usize) -> Vec<u8> {
    let mut body = format!("message {index:06} ").into_bytes();
    body.resize(size.max(body.len()), b'.');
    body
}

fn index_of(body: &[u8]) -> usize {
    std::str::from_utf8(&body[8..14]).unwrap().parse().unwrap()
}

/// Publishes `count` messages to `queue` and waits for every confirm.
async fn publish_confirmed(
    channel: &Channel,
    queue: &str,
    indexes: impl Iterator<Item = usize>,
    size: usize,
    properties: impl Fn(usize) -> BasicProperties,
) {
    let mut confirms = Vec::new();
    for index in indexes {
        confirms.push(
            channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    &body(index, size),
                    properties(index),
                )
                .await
                .expect("publish is sent"),
        );
    }
    for confirm in confirms {
        assert!(confirm.await.expect("confirmed").is_ack());
    }
}

fn persistent() -> BasicProperties {
    BasicProperties::default().with_delivery_mode(2)
}

fn files_under(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .map(|entry| entry.unwrap().path())
        .map(|path| if path.is_dir() { files_under(&path) } else { 1 })
        .sum()
}

/// Consumes `count` messages with acks and returns their indexes in order.
async fn consume_all(channel: &Channel, queue: &str, count: usize) -> Vec<(usize, bool)> {
    let mut consumer = consumer_with_prefetch(channel, queue, "drain", 100).await;
    let mut seen = Vec::with_capacity(count);
    while seen.len() < count {
        let delivery = next_delivery(&mut consumer).await;
        seen.push((index_of(&delivery.data), delivery.redelivered));
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    seen
}

#[tokio::test]
async fn paging_a_deep_transient_queue_keeps_a_window_in_memory_and_delivers_all_in_order() {
    const MESSAGES: usize = 5000;
    let server = TestServer::start_with(|config| {
        config.store.settings.resident_messages_max = 64;
    })
    .await;
    let (_connection, channel) = open(&server).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare(&channel, "deep").await;
    publish_confirmed(&channel, "deep", 0..MESSAGES, 512, |_| {
        BasicProperties::default()
    })
    .await;
    let queue = server.queue("deep");
    assert_eq!(queue.message_count() as usize, MESSAGES);
    // Without consumers, a queue keeps only a sliver of its window.
    assert_eq!(
        queue.stats().messages_paged as usize,
        MESSAGES - 64 / CONSUMERLESS_WINDOW_DIVISOR,
        "all but the consumerless window is paged out"
    );
    assert!(files_under(&server.data_dir().join("paging")) > 0);

    let seen = consume_all(&channel, "deep", MESSAGES).await;
    let indexes: Vec<usize> = seen.iter().map(|(index, _)| *index).collect();
    assert_eq!(indexes, (0..MESSAGES).collect::<Vec<_>>());
    assert!(seen.iter().all(|(_, redelivered)| !redelivered));
    assert_eq!(queue.message_count(), 0);
    assert_eq!(queue.stats().messages_paged, 0);
    server.stop().await;
}

#[tokio::test]
async fn paging_a_durable_queue_recovers_only_persistent_messages_as_references() {
    const MESSAGES: usize = 4000;
    let data_dir = std::env::temp_dir().join(format!("sluice-paging-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let start = |data_dir: PathBuf| {
        TestServer::start_with(move |config| {
            config.data_dir = data_dir;
            config.store.settings.resident_messages_max = 32;
        })
    };
    let server = start(data_dir.clone()).await;
    let (connection, channel) = open(&server).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare_with(
        &channel,
        "durable-deep",
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    // Every fourth message is transient: paged to the same journal, but
    // gone after a restart.
    publish_confirmed(&channel, "durable-deep", 0..MESSAGES, 700, |index| {
        if index % 4 == 3 {
            BasicProperties::default()
        } else {
            persistent()
        }
    })
    .await;
    assert_eq!(
        server.queue("durable-deep").message_count() as usize,
        MESSAGES
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;

    let server = start(data_dir.clone()).await;
    let queue = server.queue("durable-deep");
    let persistent_count = MESSAGES - MESSAGES / 4;
    assert_eq!(queue.message_count() as usize, persistent_count);
    assert_eq!(
        queue.stats().messages_paged as usize,
        persistent_count,
        "recovered bodies stay on disk until read"
    );
    let (_connection, channel) = open(&server).await;
    let first = channel
        .basic_get("durable-deep".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("a message");
    assert_eq!(index_of(&first.delivery.data), 0);
    assert!(first.delivery.redelivered);
    let seen = consume_all(&channel, "durable-deep", persistent_count - 1).await;
    let expected: Vec<usize> = (1..MESSAGES).filter(|index| index % 4 != 3).collect();
    assert_eq!(
        seen.iter().map(|(index, _)| *index).collect::<Vec<_>>(),
        expected
    );
    assert!(seen.iter().all(|(_, redelivered)| *redelivered));
    server.stop().await;
    std::fs::remove_dir_all(&data_dir).unwrap();
}

#[tokio::test]
async fn paging_basic_get_reads_a_paged_head_and_purge_and_delete_drop_paged_messages() {
    let server = TestServer::start_with(|config| {
        config.store.settings.resident_messages_max = 8;
    })
    .await;
    let (_connection, channel) = open(&server).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare(&channel, "gotten").await;
    publish_confirmed(&channel, "gotten", 0..100, 64, |_| {
        BasicProperties::default()
    })
    .await;
    // No consumer: the pager never reads ahead, so basic.get reads the
    // paged head itself once the window is used up.
    for expected in 0..20 {
        let body = get_body(&channel, "gotten", true).await.expect("a message");
        assert_eq!(index_of(&body), expected);
    }
    let purged = channel
        .queue_purge("gotten".into(), QueuePurgeOptions::default())
        .await
        .unwrap();
    assert_eq!(purged, 80);
    assert_eq!(get_body(&channel, "gotten", true).await, None);
    let paging_dir = server.data_dir().join("paging");
    assert!(files_under(&paging_dir) > 0);
    channel
        .queue_delete("gotten".into(), Default::default())
        .await
        .unwrap();
    assert_eq!(
        files_under(&paging_dir),
        0,
        "a deleted queue's paging file goes with it"
    );
    server.stop().await;
}

#[tokio::test]
async fn paging_compaction_frees_segments_pinned_by_one_unacked_message() {
    const MESSAGES: usize = 600;
    let data_dir = std::env::temp_dir().join(format!("sluice-compaction-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let start = |data_dir: PathBuf| {
        TestServer::start_with(move |config| {
            config.data_dir = data_dir;
            config.store.settings.segment_size_bytes = 64 * 1024;
            config.store.settings.resident_messages_max = 16;
        })
    };
    let server = start(data_dir.clone()).await;
    let (connection, channel) = open(&server).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare_with(
        &channel,
        "pinned",
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    publish_confirmed(&channel, "pinned", 0..MESSAGES, 4096, |_| persistent()).await;
    let queue_dir = server
        .data_dir()
        .join("queues")
        .join(server.queue("pinned").store_id().unwrap());
    let before = files_under(&queue_dir);
    assert!(before > 30, "600 × 4 KiB in 64 KiB segments: {before}");

    // Message 0 is taken and held; everything after it is consumed and acked.
    let holder = connection.create_channel().await.unwrap();
    let held = holder
        .basic_get("pinned".into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .expect("the first message");
    assert_eq!(index_of(&held.delivery.data), 0);
    let seen = consume_all(&channel, "pinned", MESSAGES - 1).await;
    assert_eq!(seen.last().unwrap().0, MESSAGES - 1);
    // Acks are sent without a reply: wait until the broker has them all.
    let queue = server.queue("pinned");
    let deadline = Instant::now() + Duration::from_secs(10);
    while queue.stats().messages_unacknowledged > 1 {
        assert!(Instant::now() < deadline, "acks never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // What may stay: a run shorter than compaction bothers with (the moved
    // copy's segment and segments of acks written after it) and the head.
    let allowed = sluice_core::queue_journal::COMPACTION_RUN_SEGMENTS_MIN as usize;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut after = files_under(&queue_dir);
    while after > allowed {
        assert!(
            Instant::now() < deadline,
            "one unacked message still pins {after} segments of {before}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        after = files_under(&queue_dir);
    }
    // The held message was moved, not lost: it comes back after a restart.
    server.stop().await;
    drop((holder, connection));
    let server = start(data_dir.clone()).await;
    let (_connection, channel) = open(&server).await;
    let body = get_body(&channel, "pinned", true)
        .await
        .expect("the held message");
    assert_eq!(index_of(&body), 0);
    assert_eq!(get_body(&channel, "pinned", true).await, None);
    server.stop().await;
    std::fs::remove_dir_all(&data_dir).unwrap();
}

/// Seed 002's scenario in small: consumers join a deep queue and drain it
/// faster than a steady publisher fills it. The queue's backlog shrinks
/// overall, so it must never count as congested and never pause the
/// publisher, however deep it still is.
#[tokio::test]
async fn paging_a_publisher_is_not_paused_while_consumers_drain_a_deep_queue() {
    const BACKLOG: usize = 20_000;
    let server = TestServer::start_with(|config| {
        config.store.settings.resident_messages_max = 256;
    })
    .await;
    let (_connection, channel) = open(&server).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare(&channel, "catch-up").await;
    publish_confirmed(&channel, "catch-up", 0..BACKLOG, 256, |_| {
        BasicProperties::default()
    })
    .await;
    let queue = server.queue("catch-up");

    let (_consumer_connection, consumer_channel) = open(&server).await;
    consumer_channel
        .basic_qos(300, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = consumer_channel
        .basic_consume(
            "catch-up".into(),
            "catching-up".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let draining = tokio::spawn(async move {
        let mut received = 0;
        while let Some(delivery) = consumer.next().await {
            let delivery = delivery.unwrap();
            delivery.ack(BasicAckOptions::default()).await.unwrap();
            received += 1;
            if received % 50 == 0 {
                // About 10k msg/s at most: drained over seconds, not at once.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        received
    });
    // A publisher at ~1k msg/s, slower than the consumer.
    let mut congested_seen = false;
    for batch in 0..20 {
        let start = BACKLOG + batch * 10;
        publish_confirmed(&channel, "catch-up", start..start + 10, 256, |_| {
            BasicProperties::default()
        })
        .await;
        congested_seen |= queue.is_congested();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !congested_seen,
        "a draining deep queue paused its publisher (backlog {})",
        queue.message_count()
    );
    // The old rule (pause while more than 1024 wait) would have paused it
    // throughout: the queue was still that deep when the publisher finished.
    assert!(
        queue.message_count() as usize > sluice_core::classic_queue::FLOW_BACKLOG_MESSAGES,
        "the test needs a deep queue throughout; it drained to {}",
        queue.message_count()
    );
    draining.abort();
    server.stop().await;
}

/// A message bigger than the read-ahead window is paged even into an empty
/// queue; an idle consumer with room still gets it, and what follows it.
#[tokio::test]
async fn paging_a_message_bigger_than_the_window_reaches_an_idle_consumer() {
    let server = TestServer::start_with(|config| {
        config.store.settings.resident_bytes_max = 64 * 1024;
    })
    .await;
    let (_connection, channel) = open(&server).await;
    declare(&channel, "big").await;
    let mut consumer = channel
        .basic_consume(
            "big".into(),
            "idle".into(),
            lapin::options::BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let big = vec![7u8; 100 * 1024];
    publish(&channel, "", "big", &big).await;
    publish(&channel, "", "big", b"small, behind it").await;
    assert_eq!(next_delivery(&mut consumer).await.data, big);
    assert_eq!(next_delivery(&mut consumer).await.data, b"small, behind it");
    server.stop().await;
}
