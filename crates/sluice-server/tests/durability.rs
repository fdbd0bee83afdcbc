//! Durable queues across a restart of the server on the same data directory.

mod helpers;
mod support;

use helpers::*;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, ExchangeKind};
use support::TestServer;

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

/// An empty data directory of the test's own, named after it.
fn fresh_data_dir(name: &str) -> std::path::PathBuf {
    let data_dir = std::env::temp_dir().join(format!("sluice-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    data_dir
}

/// A server on `data_dir`, recovering whatever is there.
async fn start_on(data_dir: &std::path::Path) -> TestServer {
    let data_dir = data_dir.to_path_buf();
    TestServer::start_with(move |config| config.data_dir = data_dir).await
}

async fn restart(server: TestServer, data_dir: &std::path::Path) -> TestServer {
    server.stop().await;
    start_on(data_dir).await
}

#[tokio::test]
async fn durability_persistent_messages_survive_a_restart_and_acked_ones_do_not() {
    let data_dir = fresh_data_dir("durability");
    let server = start_on(&data_dir).await;
    let (connection, channel) = open(&server).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    channel
        .queue_declare("durable-q".into(), durable(), FieldTable::default())
        .await
        .unwrap();
    channel
        .queue_declare(
            "transient-q".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .exchange_declare(
            "durable-x".into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            "durable-q".into(),
            "durable-x".into(),
            "k.#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for index in 0..10 {
        let persistent = index % 2 == 0;
        let properties = if persistent {
            BasicProperties::default().with_delivery_mode(2)
        } else {
            BasicProperties::default()
        };
        let confirm = channel
            .basic_publish(
                "durable-x".into(),
                "k.a".into(),
                BasicPublishOptions::default(),
                format!("m{index}").as_bytes(),
                properties,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }
    // Ack the first persistent message; it must not come back.
    let first = channel
        .basic_get("durable-q".into(), BasicGetOptions::default())
        .await
        .unwrap()
        .expect("a message");
    assert_eq!(first.data, b"m0");
    first.ack(BasicAckOptions::default()).await.unwrap();
    connection.close(200, "bye".into()).await.unwrap();

    let server = restart(server, &data_dir).await;
    let (connection, channel) = open(&server).await;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let queue = channel
        .queue_declare("durable-q".into(), passive, FieldTable::default())
        .await
        .unwrap();
    // m2, m4, m6, m8: persistent and not acked. Transient ones are gone.
    assert_eq!(queue.message_count(), 4);
    let mut bodies = Vec::new();
    while let Some(message) = channel
        .basic_get("durable-q".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        assert!(
            message.delivery.redelivered,
            "recovered messages are marked redelivered"
        );
        bodies.push(String::from_utf8(message.delivery.data.clone()).unwrap());
    }
    assert_eq!(bodies, vec!["m2", "m4", "m6", "m8"]);
    // The transient queue is gone; the durable exchange and its binding are back.
    let (code, _) = amqp_error(
        channel
            .queue_declare("transient-q".into(), passive, FieldTable::default())
            .await,
    );
    assert_eq!(code, 404);
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    channel
        .basic_publish(
            "durable-x".into(),
            "k.b".into(),
            BasicPublishOptions::default(),
            b"after",
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(
        get_body(&channel, "durable-q", true).await.as_deref(),
        Some(&b"after"[..])
    );
    connection.close(200, "bye".into()).await.unwrap();

    // Everything consumed with no-ack: nothing comes back after another restart.
    let server = restart(server, &data_dir).await;
    let (connection, channel) = open(&server).await;
    let queue = channel
        .queue_declare("durable-q".into(), passive, FieldTable::default())
        .await
        .unwrap();
    assert_eq!(queue.message_count(), 0);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// Publishes a persistent message; returns its confirm, still to come.
async fn publish_persistent(channel: &lapin::Channel, queue: &str) -> lapin::PublisherConfirm {
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            b"x",
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .unwrap()
}

/// A persistent publish into a durable queue deleted before its message
/// reached the disk is confirmed (as in RabbitMQ), and the confirms after it
/// on the channel are not held up.
#[tokio::test]
async fn durability_publish_into_a_queue_deleted_before_the_sync_is_confirmed() {
    let data_dir = fresh_data_dir("deleted-sync");
    let dir = data_dir.clone();
    let server = TestServer::start_with(move |config| {
        config.data_dir = dir;
        // Rounds at most once a second: a publish just after one waits.
        config.store.sync_interval = std::time::Duration::from_secs(1);
    })
    .await;
    let (connection, channel) = open(&server).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for queue in ["doomed", "kept"] {
        declare_with(&channel, queue, durable(), FieldTable::default())
            .await
            .unwrap();
    }
    // This one's round starts at once; the next publish waits for the next.
    assert!(publish_persistent(&channel, "kept")
        .await
        .await
        .unwrap()
        .is_ack());
    let into_doomed = publish_persistent(&channel, "doomed").await;
    let after = publish_persistent(&channel, "kept").await;
    let deleter = connection.create_channel().await.unwrap();
    deleter
        .queue_delete("doomed".into(), Default::default())
        .await
        .unwrap();
    let confirmed = tokio::time::timeout(ARRIVAL_TIMEOUT, async {
        (into_doomed.await.unwrap(), after.await.unwrap())
    })
    .await
    .expect("both confirms arrive");
    assert!(confirmed.0.is_ack() && confirmed.1.is_ack());
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test]
async fn durability_deleted_queue_does_not_come_back() {
    let data_dir = fresh_data_dir("durability-delete");
    let server = start_on(&data_dir).await;
    let (connection, channel) = open(&server).await;
    channel
        .queue_declare("doomed".into(), durable(), FieldTable::default())
        .await
        .unwrap();
    publish_with(
        &channel,
        "",
        "doomed",
        b"x",
        BasicProperties::default().with_delivery_mode(2),
    )
    .await;
    channel
        .queue_delete("doomed".into(), Default::default())
        .await
        .unwrap();
    connection.close(200, "bye".into()).await.unwrap();
    let server = restart(server, &data_dir).await;
    let (_connection, channel) = open(&server).await;
    let (code, _) = amqp_error(
        channel
            .queue_declare(
                "doomed".into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await,
    );
    assert_eq!(code, 404);
    assert!(
        std::fs::read_dir(data_dir.join("queues"))
            .unwrap()
            .next()
            .is_none(),
        "the journal directory was deleted"
    );
    server.stop().await;
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// A persistent message's TTL keeps counting while the node is down, as in
/// RabbitMQ: one that expired meanwhile is gone after the restart, whether
/// its deadline came from its own expiration or from the queue's TTL, and
/// one with time left is still there. One with a dead-letter exchange is
/// dead-lettered, through bindings recovered after its queue.
#[tokio::test]
async fn durability_message_ttl_keeps_counting_while_the_node_is_down() {
    /// Longer than reopening takes, so that a TTL restarted at recovery
    /// would still hold the messages when they are looked for.
    const TTL_MS: i32 = 1000;
    let data_dir = fresh_data_dir("durable-ttl");
    let server = start_on(&data_dir).await;
    let (connection, channel) = open(&server).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare_with(&channel, "own-expiration", durable(), FieldTable::default())
        .await
        .unwrap();
    declare_with(
        &channel,
        "queue-ttl",
        durable(),
        table(&[("x-message-ttl", AMQPValue::LongInt(TTL_MS))]),
    )
    .await
    .unwrap();
    let durable_exchange = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .exchange_declare(
            "dlx".into(),
            ExchangeKind::Fanout,
            durable_exchange,
            FieldTable::default(),
        )
        .await
        .unwrap();
    declare_with(
        &channel,
        "dead-ttl",
        durable(),
        table(&[
            ("x-message-ttl", AMQPValue::LongInt(TTL_MS)),
            ("x-dead-letter-exchange", text("dlx")),
        ]),
    )
    .await
    .unwrap();
    // A priority queue's recovered messages wait on disk until all are read
    // back; they expire meanwhile all the same.
    declare_with(
        &channel,
        "priority-ttl",
        durable(),
        table(&[
            ("x-max-priority", AMQPValue::LongInt(5)),
            ("x-message-ttl", AMQPValue::LongInt(TTL_MS)),
            ("x-dead-letter-exchange", text("dlx")),
        ]),
    )
    .await
    .unwrap();
    declare_with(&channel, "dead-letters", durable(), FieldTable::default())
        .await
        .unwrap();
    // Bindings recover in order: these come back before the dead-letter
    // queue's, and take a while.
    channel
        .exchange_declare(
            "busy".into(),
            ExchangeKind::Direct,
            durable_exchange,
            FieldTable::default(),
        )
        .await
        .unwrap();
    for index in 0..500 {
        channel
            .queue_bind(
                "dead-letters".into(),
                "busy".into(),
                format!("key-{index}").as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
    channel
        .queue_bind(
            "dead-letters".into(),
            "dlx".into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let persistent = || BasicProperties::default().with_delivery_mode(2);
    let short = TTL_MS.to_string();
    for (queue, body, properties) in [
        (
            "own-expiration",
            "short",
            persistent().with_expiration(short.as_str().into()),
        ),
        (
            "own-expiration",
            "long",
            persistent().with_expiration("600000".into()),
        ),
        ("own-expiration", "never", persistent()),
        ("queue-ttl", "ttl", persistent()),
        ("dead-ttl", "dead", persistent()),
        (
            "priority-ttl",
            "dead priority",
            persistent().with_priority(3),
        ),
    ] {
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                properties,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
    // Down for longer than the TTLs.
    tokio::time::sleep(std::time::Duration::from_millis(TTL_MS as u64 + 200)).await;
    let server = start_on(&data_dir).await;
    let (connection, channel) = open(&server).await;
    let mut bodies = Vec::new();
    while let Some(body) = get_body(&channel, "own-expiration", true).await {
        bodies.push(String::from_utf8(body).unwrap());
    }
    assert_eq!(bodies, ["long", "never"]);
    assert_eq!(get_body(&channel, "queue-ttl", true).await, None);
    let dead_letters = server.queue("dead-letters");
    // No consumer and no basic.get on their queues: the timers do it.
    eventually("the expired messages are dead-lettered", || {
        dead_letters.message_count() == 2
    })
    .await;
    assert_eq!(server.queue("priority-ttl").message_count(), 0);
    let mut dead = Vec::new();
    while let Some(body) = get_body(&channel, "dead-letters", true).await {
        dead.push(String::from_utf8(body).unwrap());
    }
    dead.sort();
    assert_eq!(dead, ["dead", "dead priority"]);
    assert_eq!(get_body(&channel, "dead-ttl", true).await, None);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// A durable queue whose journal cannot be opened at start stops the node
/// with a message naming it, rather than coming up without it: skipped, the
/// queue would have been dropped from the definitions at the next save, its
/// messages with it. Once the cause is fixed, the node starts with the queue
/// and its messages.
#[tokio::test]
async fn durability_unreadable_journal_stops_the_start_and_drops_nothing() {
    let data_dir = fresh_data_dir("unreadable-journal");
    let server = start_on(&data_dir).await;
    let (connection, channel) = open(&server).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    channel
        .queue_declare("kept".into(), durable(), FieldTable::default())
        .await
        .unwrap();
    for body in [&b"one"[..], b"two"] {
        channel
            .basic_publish(
                "".into(),
                "kept".into(),
                Default::default(),
                body,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let journal = data_dir
        .join("queues")
        .join(server.queue("kept").store_id().unwrap());
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;

    // The journal's directory is replaced by a file: it cannot be opened.
    let aside = data_dir.join("journal-aside");
    std::fs::rename(&journal, &aside).unwrap();
    std::fs::write(&journal, b"not a directory").unwrap();
    let config = sluice_server::config::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data_dir.clone(),
        ..Default::default()
    };
    let error = match sluice_server::start(config).await {
        Ok(_) => panic!("a node missing a durable queue's journal started"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("queue 'kept' in vhost '/'"), "{error}");

    std::fs::remove_file(&journal).unwrap();
    std::fs::rename(&aside, &journal).unwrap();
    let server = start_on(&data_dir).await;
    let (connection, channel) = open(&server).await;
    assert_eq!(
        get_body(&channel, "kept", true).await.as_deref(),
        Some(&b"one"[..])
    );
    assert_eq!(
        get_body(&channel, "kept", true).await.as_deref(),
        Some(&b"two"[..])
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
    let _ = std::fs::remove_dir_all(&data_dir);
}
