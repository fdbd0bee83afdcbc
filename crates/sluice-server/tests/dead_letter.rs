//! Dead-letter exchanges: rejected, expired and overflowing messages
//! republished with RabbitMQ 3.10's x-death history, routing key override,
//! a missing exchange, cycles, and policies that set it all.

mod helpers;
mod support;

use std::path::PathBuf;
use std::time::Duration;

use helpers::*;
use lapin::message::Delivery;
use lapin::options::{
    BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicRejectOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldArray, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Consumer, ExchangeKind};
use support::TestServer;

fn long_string(text: &str) -> AMQPValue {
    AMQPValue::LongString(text.into())
}

async fn declare_exchange(channel: &Channel, name: &str, kind: ExchangeKind) {
    channel
        .exchange_declare(
            name.into(),
            kind,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("exchange declares");
}

async fn bind(channel: &Channel, queue: &str, exchange: &str, routing_key: &str) {
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            routing_key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("queue binds");
}

async fn declare_arguments(channel: &Channel, name: &str, arguments: &[(&str, AMQPValue)]) {
    declare_with(
        channel,
        name,
        QueueDeclareOptions::default(),
        table(arguments),
    )
    .await
    .expect("queue declares");
}

async fn consume(channel: &Channel, queue: &str, no_ack: bool) -> Consumer {
    channel
        .basic_consume(
            queue.into(),
            format!("{queue}-consumer").as_str().into(),
            BasicConsumeOptions {
                no_ack,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("basic.consume succeeds")
}

/// A fanout dead-letter exchange "dlx" into the queue "dead".
async fn dead_letter_sink(channel: &Channel) -> Consumer {
    declare_exchange(channel, "dlx", ExchangeKind::Fanout).await;
    declare(channel, "dead").await;
    bind(channel, "dead", "dlx", "").await;
    consume(channel, "dead", true).await
}

fn headers(delivery: &Delivery) -> FieldTable {
    delivery
        .properties
        .headers()
        .clone()
        .expect("a dead-lettered message has headers")
}

fn deaths(delivery: &Delivery) -> Vec<FieldTable> {
    match headers(delivery).inner().get("x-death") {
        Some(AMQPValue::FieldArray(array)) => array
            .as_slice()
            .iter()
            .map(|death| match death {
                AMQPValue::FieldTable(table) => table.clone(),
                other => panic!("an x-death entry is a table, got {other:?}"),
            })
            .collect(),
        other => panic!("x-death is an array, got {other:?}"),
    }
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Checks one x-death entry field by field, and that it has no others.
fn assert_death(
    entry: &FieldTable,
    count: i64,
    queue: &str,
    reason: &str,
    exchange: &str,
    routing_keys: &[&str],
    original_expiration: Option<&str>,
) {
    let fields = entry.inner();
    assert_eq!(fields.get("count"), Some(&AMQPValue::LongLongInt(count)));
    assert_eq!(fields.get("queue"), Some(&long_string(queue)));
    assert_eq!(fields.get("reason"), Some(&long_string(reason)));
    assert_eq!(fields.get("exchange"), Some(&long_string(exchange)));
    let keys: Vec<AMQPValue> = routing_keys.iter().map(|key| long_string(key)).collect();
    assert_eq!(
        fields.get("routing-keys"),
        Some(&AMQPValue::FieldArray(FieldArray::from(keys)))
    );
    match fields.get("time") {
        Some(AMQPValue::Timestamp(time)) => {
            assert!(
                now_s().abs_diff(*time) < 60,
                "time is seconds since the epoch: {time}"
            )
        }
        other => panic!("time is a timestamp, got {other:?}"),
    }
    assert_eq!(
        fields.get("original-expiration"),
        original_expiration.map(long_string).as_ref()
    );
    let expected_fields = 6 + usize::from(original_expiration.is_some());
    assert_eq!(fields.len(), expected_fields, "fields: {fields:?}");
}

fn assert_first_death(delivery: &Delivery, queue: &str, reason: &str, exchange: &str) {
    let headers = headers(delivery);
    let fields = headers.inner();
    assert_eq!(fields.get("x-first-death-queue"), Some(&long_string(queue)));
    assert_eq!(
        fields.get("x-first-death-reason"),
        Some(&long_string(reason))
    );
    assert_eq!(
        fields.get("x-first-death-exchange"),
        Some(&long_string(exchange))
    );
    // RabbitMQ 3.10 has no x-last-death-* headers.
    assert!(!fields
        .keys()
        .any(|key| key.as_str().starts_with("x-last-death")));
}

#[tokio::test]
async fn dead_letter_reject_and_nack_without_requeue_write_x_death() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let mut dead = dead_letter_sink(&channel).await;
    declare_arguments(&channel, "work", &[("x-dead-letter-exchange", text("dlx"))]).await;
    let mut work = consume(&channel, "work", false).await;

    publish(&channel, "", "work", b"refused").await;
    let delivery = next_delivery(&mut work).await;
    delivery
        .acker
        .reject(BasicRejectOptions { requeue: false })
        .await
        .unwrap();
    let dead_lettered = next_delivery(&mut dead).await;
    assert_eq!(dead_lettered.data, b"refused");
    // Republished to the dead-letter exchange with the original key.
    assert_eq!(dead_lettered.exchange.as_str(), "dlx");
    assert_eq!(dead_lettered.routing_key.as_str(), "work");
    let entries = deaths(&dead_lettered);
    assert_eq!(entries.len(), 1);
    assert_death(&entries[0], 1, "work", "rejected", "", &["work"], None);
    assert_first_death(&dead_lettered, "work", "rejected", "");

    // nack without requeue dead-letters too. Republishing the dead-lettered
    // copy into "work" and refusing it again counts a second death for
    // the same queue and reason: one entry, count 2.
    publish_with(
        &channel,
        "",
        "work",
        b"refused",
        dead_lettered.properties.clone(),
    )
    .await;
    let delivery = next_delivery(&mut work).await;
    delivery
        .acker
        .nack(BasicNackOptions {
            requeue: false,
            multiple: false,
        })
        .await
        .unwrap();
    let again = next_delivery(&mut dead).await;
    let entries = deaths(&again);
    assert_eq!(entries.len(), 1);
    assert_death(&entries[0], 2, "work", "rejected", "", &["work"], None);
    assert_first_death(&again, "work", "rejected", "");
    assert_eq!(server.queue("work").message_count(), 0);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn dead_letter_expired_message_keeps_its_original_expiration() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let mut dead = dead_letter_sink(&channel).await;
    declare_arguments(
        &channel,
        "ageing",
        &[("x-dead-letter-exchange", text("dlx"))],
    )
    .await;
    bind(&channel, "ageing", "amq.direct", "age").await;
    publish_with(&channel, "amq.direct", "age", b"old", expiring_in("50")).await;
    let dead_lettered = next_delivery(&mut dead).await;
    assert_eq!(dead_lettered.data, b"old");
    // The copy does not expire again where it lands.
    assert_eq!(dead_lettered.properties.expiration(), &None);
    let entries = deaths(&dead_lettered);
    assert_eq!(entries.len(), 1);
    assert_death(
        &entries[0],
        1,
        "ageing",
        "expired",
        "amq.direct",
        &["age"],
        Some("50"),
    );
    assert_first_death(&dead_lettered, "ageing", "expired", "amq.direct");
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn dead_letter_routing_key_replaces_the_keys_and_drops_cc() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_exchange(&channel, "parking", ExchangeKind::Direct).await;
    declare(&channel, "parked").await;
    bind(&channel, "parked", "parking", "parked-key").await;
    declare(&channel, "original-key").await;
    bind(&channel, "original-key", "parking", "work").await;
    declare_arguments(
        &channel,
        "work",
        &[
            ("x-dead-letter-exchange", text("parking")),
            ("x-dead-letter-routing-key", text("parked-key")),
        ],
    )
    .await;
    let mut parked = consume(&channel, "parked", true).await;
    let mut original = consume(&channel, "original-key", true).await;
    let cc = table(&[(
        "CC",
        AMQPValue::FieldArray(FieldArray::from(vec![long_string("copy")])),
    )]);
    publish_with(
        &channel,
        "",
        "work",
        b"rerouted",
        BasicProperties::default().with_headers(cc),
    )
    .await;
    let delivery = get_message(&channel, "work").await;
    delivery
        .acker
        .reject(BasicRejectOptions { requeue: false })
        .await
        .unwrap();
    let dead_lettered = next_delivery(&mut parked).await;
    assert_eq!(dead_lettered.routing_key.as_str(), "parked-key");
    assert!(!headers(&dead_lettered).inner().contains_key("CC"));
    let entries = deaths(&dead_lettered);
    // The death records the keys it was published with, CC included.
    assert_death(
        &entries[0],
        1,
        "work",
        "rejected",
        "",
        &["work", "copy"],
        None,
    );
    // The original key no longer routes it.
    assert_no_delivery(&mut original).await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

async fn get_message(channel: &Channel, queue: &str) -> Delivery {
    channel
        .basic_get(
            queue.into(),
            lapin::options::BasicGetOptions { no_ack: false },
        )
        .await
        .expect("basic.get answers")
        .expect("the queue has a message")
        .delivery
}

#[tokio::test]
async fn dead_letter_max_length_zero_dead_letters_with_maxlen() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let mut dead = dead_letter_sink(&channel).await;
    declare_arguments(
        &channel,
        "full",
        &[
            ("x-max-length", AMQPValue::LongInt(0)),
            ("x-dead-letter-exchange", text("dlx")),
        ],
    )
    .await;
    publish(&channel, "", "full", b"no-room").await;
    let dead_lettered = next_delivery(&mut dead).await;
    assert_eq!(dead_lettered.data, b"no-room");
    assert_death(
        &deaths(&dead_lettered)[0],
        1,
        "full",
        "maxlen",
        "",
        &["full"],
        None,
    );
    assert_first_death(&dead_lettered, "full", "maxlen", "");
    assert_eq!(server.queue("full").message_count(), 0);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn dead_letter_reject_publish_dlx_nacks_and_dead_letters_the_new_message() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let mut dead = dead_letter_sink(&channel).await;
    declare_arguments(
        &channel,
        "bounded",
        &[
            ("x-max-length", AMQPValue::LongInt(1)),
            ("x-overflow", text("reject-publish-dlx")),
            ("x-dead-letter-exchange", text("dlx")),
        ],
    )
    .await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut confirmations = Vec::new();
    for body in ["kept", "refused"] {
        let confirm = channel
            .basic_publish(
                "".into(),
                "bounded".into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                BasicProperties::default(),
            )
            .await
            .unwrap();
        confirmations.push(confirm.await.unwrap());
    }
    assert_eq!(confirmations[0], Confirmation::Ack(None));
    assert_eq!(confirmations[1], Confirmation::Nack(None));
    let dead_lettered = next_delivery(&mut dead).await;
    assert_eq!(dead_lettered.data, b"refused");
    assert_death(
        &deaths(&dead_lettered)[0],
        1,
        "bounded",
        "maxlen",
        "",
        &["bounded"],
        None,
    );
    assert_eq!(
        get_body(&channel, "bounded", true).await.as_deref(),
        Some(&b"kept"[..])
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn dead_letter_to_a_missing_exchange_drops_the_message() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_arguments(
        &channel,
        "orphan",
        &[("x-dead-letter-exchange", text("later"))],
    )
    .await;
    publish(&channel, "", "orphan", b"lost").await;
    let delivery = get_message(&channel, "orphan").await;
    delivery
        .acker
        .reject(BasicRejectOptions { requeue: false })
        .await
        .unwrap();
    // The exchange is looked up when a message dies, not at declaration:
    // once it exists, the next one arrives, and only that one.
    declare_exchange(&channel, "later", ExchangeKind::Fanout).await;
    declare(&channel, "arrived").await;
    bind(&channel, "arrived", "later", "").await;
    publish(&channel, "", "orphan", b"found").await;
    let delivery = get_message(&channel, "orphan").await;
    delivery
        .acker
        .reject(BasicRejectOptions { requeue: false })
        .await
        .unwrap();
    let mut arrived = consume(&channel, "arrived", true).await;
    assert_eq!(next_delivery(&mut arrived).await.data, b"found");
    assert_no_delivery(&mut arrived).await;
    assert_eq!(server.queue("orphan").message_count(), 0);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn dead_letter_automatic_cycle_is_dropped_but_a_rejected_one_goes_on() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    // "loop" expires into a fanout that routes back into "loop" and into
    // "observer": the copy for "loop" closes a cycle with no rejection in
    // it, and is dropped; the observer sees the one death.
    declare_exchange(&channel, "loop-dlx", ExchangeKind::Fanout).await;
    declare_arguments(
        &channel,
        "loop",
        &[
            ("x-message-ttl", AMQPValue::LongInt(50)),
            ("x-dead-letter-exchange", text("loop-dlx")),
        ],
    )
    .await;
    declare(&channel, "observer").await;
    bind(&channel, "loop", "loop-dlx", "").await;
    bind(&channel, "observer", "loop-dlx", "").await;
    let mut observer = consume(&channel, "observer", true).await;
    publish(&channel, "", "loop", b"round").await;
    let first = next_delivery(&mut observer).await;
    assert_death(
        &deaths(&first)[0],
        1,
        "loop",
        "expired",
        "",
        &["loop"],
        None,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_no_delivery(&mut observer).await;
    assert_eq!(server.queue("loop").message_count(), 0);

    // A rejection back into the same queue is the application's choice:
    // the copy returns, with its death counted.
    declare_arguments(
        &channel,
        "retry",
        &[
            ("x-dead-letter-exchange", text("")),
            ("x-dead-letter-routing-key", text("retry")),
        ],
    )
    .await;
    publish(&channel, "", "retry", b"again").await;
    let delivery = get_message(&channel, "retry").await;
    delivery
        .acker
        .reject(BasicRejectOptions { requeue: false })
        .await
        .unwrap();
    let mut retry = consume(&channel, "retry", true).await;
    let back = next_delivery(&mut retry).await;
    assert_eq!(back.data, b"again");
    assert_death(
        &deaths(&back)[0],
        1,
        "retry",
        "rejected",
        "",
        &["retry"],
        None,
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// A definitions file in the temporary directory, removed when dropped.
struct DefinitionsFile(PathBuf);

impl DefinitionsFile {
    fn new(json: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "sluice-dead-letter-{}-{}.json",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::write(&path, json).unwrap();
        DefinitionsFile(path)
    }
}

impl Drop for DefinitionsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test]
async fn dead_letter_policy_sets_message_ttl_and_dead_letter_exchange() {
    let file = DefinitionsFile::new(
        r#"{
  "policies": [
    {"vhost": "/", "name": "expire-to-parking", "pattern": "^policed$", "apply-to": "queues",
     "priority": 0, "definition": {"message-ttl": 50, "dead-letter-exchange": "parking",
     "dead-letter-routing-key": "from-policy"}}
  ],
  "exchanges": [
    {"name": "parking", "vhost": "/", "type": "direct", "durable": true,
     "auto_delete": false, "internal": false, "arguments": {}}
  ],
  "queues": [
    {"name": "parked", "vhost": "/", "durable": true, "auto_delete": false, "arguments": {}}
  ],
  "bindings": [
    {"source": "parking", "vhost": "/", "destination": "parked",
     "destination_type": "queue", "routing_key": "from-policy", "arguments": {}}
  ]
}"#,
    );
    let path = file.0.clone();
    let server = TestServer::start_with(|config| config.load_definitions = Some(path)).await;
    let (connection, channel) = open(&server).await;
    // Declared without arguments: the policy gives it its TTL and DLX.
    declare(&channel, "policed").await;
    publish(&channel, "", "policed", b"timed-out").await;
    let mut parked = consume(&channel, "parked", true).await;
    let dead_lettered = next_delivery(&mut parked).await;
    assert_eq!(dead_lettered.data, b"timed-out");
    assert_eq!(dead_lettered.routing_key.as_str(), "from-policy");
    assert_death(
        &deaths(&dead_lettered)[0],
        1,
        "policed",
        "expired",
        "",
        &["policed"],
        None,
    );
    assert_eq!(server.queue("policed").message_count(), 0);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn dead_letter_persistent_copy_in_a_durable_queue_survives_a_restart() {
    let data_dir =
        std::env::temp_dir().join(format!("sluice-dead-letter-durable-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let dir = data_dir.clone();
    let server = TestServer::start_with(move |config| config.data_dir = dir).await;
    let (connection, channel) = open(&server).await;
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .exchange_declare(
            "durable-dlx".into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    declare_with(&channel, "graveyard", durable, FieldTable::default())
        .await
        .unwrap();
    bind(&channel, "graveyard", "durable-dlx", "").await;
    declare_with(
        &channel,
        "source",
        durable,
        table(&[("x-dead-letter-exchange", text("durable-dlx"))]),
    )
    .await
    .unwrap();
    publish_with(
        &channel,
        "",
        "source",
        b"kept-on-disk",
        BasicProperties::default().with_delivery_mode(2),
    )
    .await;
    let delivery = get_message(&channel, "source").await;
    delivery
        .acker
        .reject(BasicRejectOptions { requeue: false })
        .await
        .unwrap();
    let graveyard = server.queue("graveyard");
    eventually("the copy lands in the durable queue", || {
        graveyard.message_count() == 1
    })
    .await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;

    let dir = data_dir.clone();
    let server = TestServer::start_with(move |config| config.data_dir = dir).await;
    let (connection, channel) = open(&server).await;
    let recovered = get_message(&channel, "graveyard").await;
    assert_eq!(recovered.data, b"kept-on-disk");
    assert_death(
        &deaths(&recovered)[0],
        1,
        "source",
        "rejected",
        "",
        &["source"],
        None,
    );
    assert_eq!(server.queue("source").message_count(), 0);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
    let _ = std::fs::remove_dir_all(&data_dir);
}
