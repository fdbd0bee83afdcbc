//! exchange.* methods and routing, as RabbitMQ 3.10 clients see them.

mod helpers;
mod support;

use helpers::*;
use lapin::options::{
    BasicConsumeOptions, ExchangeBindOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    ExchangeUnbindOptions, QueueBindOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, ExchangeKind};
use support::TestServer;

async fn declare_exchange(
    channel: &Channel,
    name: &str,
    kind: ExchangeKind,
    options: ExchangeDeclareOptions,
) -> lapin::Result<()> {
    channel
        .exchange_declare(name.into(), kind, options, FieldTable::default())
        .await
}

async fn bind(channel: &Channel, queue: &str, exchange: &str, key: &str, arguments: FieldTable) {
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            key.into(),
            QueueBindOptions::default(),
            arguments,
        )
        .await
        .expect("queue.bind succeeds");
}

async fn bind_exchange(channel: &Channel, destination: &str, source: &str, key: &str) {
    channel
        .exchange_bind(
            destination.into(),
            source.into(),
            key.into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("exchange.bind succeeds");
}

/// Drains a queue with basic.get, returning the bodies in order.
async fn drain(channel: &Channel, queue: &str) -> Vec<String> {
    let mut bodies = Vec::new();
    while let Some(body) = get_body(channel, queue, true).await {
        bodies.push(String::from_utf8(body).unwrap());
    }
    bodies
}

#[tokio::test]
async fn exchanges_declare_each_type_and_route() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    for (name, kind) in [
        ("x-direct", ExchangeKind::Direct),
        ("x-fanout", ExchangeKind::Fanout),
        ("x-topic", ExchangeKind::Topic),
        ("x-headers", ExchangeKind::Headers),
    ] {
        declare_exchange(&channel, name, kind, ExchangeDeclareOptions::default())
            .await
            .unwrap();
        let queue = format!("q-{name}");
        declare(&channel, &queue).await;
        bind(&channel, &queue, name, "key", FieldTable::default()).await;
        publish(&channel, name, "key", name.as_bytes()).await;
        // Redeclaring identically succeeds.
        declare_exchange(
            &channel,
            name,
            match name {
                "x-direct" => ExchangeKind::Direct,
                "x-fanout" => ExchangeKind::Fanout,
                "x-topic" => ExchangeKind::Topic,
                _ => ExchangeKind::Headers,
            },
            ExchangeDeclareOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(drain(&channel, &queue).await, vec![name.to_owned()]);
    }
    // Direct routes on the exact key only.
    publish(&channel, "x-direct", "other", b"lost").await;
    assert!(drain(&channel, "q-x-direct").await.is_empty());
    // Fanout ignores the key.
    publish(&channel, "x-fanout", "other", b"fan").await;
    assert_eq!(drain(&channel, "q-x-fanout").await, vec!["fan"]);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn exchanges_passive_declare_of_missing_exchange_is_404() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let error = amqp_error(
        declare_exchange(
            &channel,
            "missing",
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            },
        )
        .await,
    );
    assert_eq!(
        error,
        (
            404,
            "NOT_FOUND - no exchange 'missing' in vhost '/'".to_owned()
        )
    );
    // Passive declare of an existing exchange succeeds whatever the type.
    let channel = connection.create_channel().await.unwrap();
    declare_exchange(
        &channel,
        "amq.topic",
        ExchangeKind::Direct,
        ExchangeDeclareOptions {
            passive: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn exchanges_redeclare_with_other_type_or_durability_is_406() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_exchange(
        &channel,
        "logs",
        ExchangeKind::Direct,
        ExchangeDeclareOptions::default(),
    )
    .await
    .unwrap();
    let error = amqp_error(
        declare_exchange(
            &channel,
            "logs",
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
        )
        .await,
    );
    assert_eq!(
        error,
        (
            406,
            "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'logs' in vhost '/': received 'fanout' but current is 'direct'"
                .to_owned()
        )
    );
    let channel = connection.create_channel().await.unwrap();
    let error = amqp_error(
        declare_exchange(
            &channel,
            "logs",
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
        )
        .await,
    );
    assert_eq!(
        error,
        (
            406,
            "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'logs' in vhost '/': received 'true' but current is 'false'"
                .to_owned()
        )
    );
    // A standard exchange is checked for equivalence like any other.
    let channel = connection.create_channel().await.unwrap();
    declare_exchange(
        &channel,
        "amq.direct",
        ExchangeKind::Direct,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let (code, text) = amqp_error(
        declare_exchange(
            &channel,
            "amq.direct",
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
        )
        .await,
    );
    assert_eq!(code, 406);
    assert!(text.contains("inequivalent arg 'type'"), "{text}");
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn exchanges_unknown_type_closes_the_connection_with_503() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let error = amqp_error(
        declare_exchange(
            &channel,
            "odd",
            ExchangeKind::Custom("x-nonesuch".into()),
            ExchangeDeclareOptions::default(),
        )
        .await,
    );
    assert_eq!(
        error,
        (
            503,
            "COMMAND_INVALID - unknown exchange type 'x-nonesuch'".to_owned()
        )
    );
    assert!(connection.create_channel().await.is_err());
    server.stop().await;
}

#[tokio::test]
async fn exchanges_reserved_names_are_refused_with_403() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let error = amqp_error(
        declare_exchange(
            &channel,
            "amq.custom",
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
        )
        .await,
    );
    assert_eq!(
        error,
        (
            403,
            "ACCESS_REFUSED - exchange name 'amq.custom' contains reserved prefix 'amq.*'"
                .to_owned()
        )
    );
    let channel = connection.create_channel().await.unwrap();
    let error = amqp_error(
        channel
            .exchange_delete("amq.fanout".into(), ExchangeDeleteOptions::default())
            .await,
    );
    assert_eq!(
        error,
        (
            403,
            "ACCESS_REFUSED - deletion of system exchange 'amq.fanout' in vhost '/' not allowed"
                .to_owned()
        )
    );
    let channel = connection.create_channel().await.unwrap();
    let error = amqp_error(
        declare_exchange(
            &channel,
            "",
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
        )
        .await,
    );
    assert_eq!(
        error,
        (
            403,
            "ACCESS_REFUSED - operation not permitted on the default exchange".to_owned()
        )
    );
    // Passively too, as in RabbitMQ.
    let channel = connection.create_channel().await.unwrap();
    let error = amqp_error(
        declare_exchange(
            &channel,
            "",
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            },
        )
        .await,
    );
    assert_eq!(
        error,
        (
            403,
            "ACCESS_REFUSED - operation not permitted on the default exchange".to_owned()
        )
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn exchanges_standard_exchanges_exist() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    // The default exchange too, though a passive declare of it is refused
    // (checked in exchanges_reserved_names_are_refused_with_403).
    for name in [
        "amq.direct",
        "amq.fanout",
        "amq.topic",
        "amq.headers",
        "amq.match",
    ] {
        declare_exchange(
            &channel,
            name,
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            },
        )
        .await
        .unwrap_or_else(|error| panic!("exchange '{name}' exists: {error}"));
    }
    // The default exchange routes by queue name.
    declare(&channel, "by-name").await;
    publish(&channel, "", "by-name", b"direct to queue").await;
    assert_eq!(drain(&channel, "by-name").await, vec!["direct to queue"]);
    // And the amq.* ones route as their types say.
    bind(&channel, "by-name", "amq.fanout", "", FieldTable::default()).await;
    publish(&channel, "amq.fanout", "whatever", b"fanned").await;
    assert_eq!(drain(&channel, "by-name").await, vec!["fanned"]);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn exchanges_default_exchange_cannot_be_bound_or_unbound() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "q").await;
    let error = amqp_error(
        channel
            .queue_bind(
                "q".into(),
                "".into(),
                "q".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await,
    );
    let refused = (
        403,
        "ACCESS_REFUSED - operation not permitted on the default exchange".to_owned(),
    );
    assert_eq!(error, refused);
    let channel = connection.create_channel().await.unwrap();
    let error = amqp_error(
        channel
            .queue_unbind("q".into(), "".into(), "q".into(), FieldTable::default())
            .await,
    );
    assert_eq!(error, refused);
    let channel = connection.create_channel().await.unwrap();
    let error = amqp_error(
        channel
            .exchange_bind(
                "".into(),
                "amq.direct".into(),
                "k".into(),
                ExchangeBindOptions::default(),
                FieldTable::default(),
            )
            .await,
    );
    assert_eq!(error, refused);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn exchanges_auto_delete_goes_with_its_last_binding() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let auto_delete = ExchangeDeclareOptions {
        auto_delete: true,
        ..Default::default()
    };
    declare_exchange(&channel, "transient", ExchangeKind::Direct, auto_delete)
        .await
        .unwrap();
    declare(&channel, "q1").await;
    declare(&channel, "q2").await;
    bind(&channel, "q1", "transient", "a", FieldTable::default()).await;
    bind(&channel, "q2", "transient", "b", FieldTable::default()).await;
    channel
        .queue_unbind(
            "q1".into(),
            "transient".into(),
            "a".into(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    // One binding left: still there.
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    declare_exchange(&channel, "transient", ExchangeKind::Direct, passive)
        .await
        .unwrap();
    channel
        .queue_unbind(
            "q2".into(),
            "transient".into(),
            "b".into(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let (code, _) =
        amqp_error(declare_exchange(&channel, "transient", ExchangeKind::Direct, passive).await);
    assert_eq!(code, 404);
    // Deleting the bound queue also removes the binding.
    let channel = connection.create_channel().await.unwrap();
    declare_exchange(&channel, "transient2", ExchangeKind::Fanout, auto_delete)
        .await
        .unwrap();
    bind(&channel, "q1", "transient2", "", FieldTable::default()).await;
    channel
        .queue_delete("q1".into(), Default::default())
        .await
        .unwrap();
    let (code, _) =
        amqp_error(declare_exchange(&channel, "transient2", ExchangeKind::Fanout, passive).await);
    assert_eq!(code, 404);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn exchanges_internal_exchange_refuses_publishes() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_exchange(
        &channel,
        "inner",
        ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            internal: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    declare_exchange(
        &channel,
        "outer",
        ExchangeKind::Fanout,
        ExchangeDeclareOptions::default(),
    )
    .await
    .unwrap();
    declare(&channel, "behind-inner").await;
    bind(&channel, "behind-inner", "inner", "", FieldTable::default()).await;
    bind_exchange(&channel, "inner", "outer", "").await;
    // Reachable through an exchange-to-exchange binding.
    publish(&channel, "outer", "", b"via outer").await;
    assert_eq!(drain(&channel, "behind-inner").await, vec!["via outer"]);
    // Not directly.
    let mut watcher = close_watcher(&channel).await;
    publish(&channel, "inner", "", b"direct").await;
    let error = channel_closed_with(&mut watcher).await;
    assert_eq!(
        error,
        (
            403,
            "ACCESS_REFUSED - cannot publish to internal exchange 'inner' in vhost '/'".to_owned()
        )
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn exchanges_exchange_to_exchange_bindings_and_cycles() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    for name in ["e1", "e2", "e3"] {
        declare_exchange(
            &channel,
            name,
            ExchangeKind::Topic,
            ExchangeDeclareOptions::default(),
        )
        .await
        .unwrap();
    }
    declare(&channel, "at-e2").await;
    declare(&channel, "at-e3").await;
    bind(&channel, "at-e2", "e2", "#", FieldTable::default()).await;
    bind(&channel, "at-e3", "e3", "only.*", FieldTable::default()).await;
    bind_exchange(&channel, "e2", "e1", "#").await;
    bind_exchange(&channel, "e1", "e2", "#").await; // a cycle
    bind_exchange(&channel, "e3", "e2", "#").await;
    publish(&channel, "e1", "only.once", b"m1").await;
    publish(&channel, "e2", "other", b"m2").await;
    assert_eq!(drain(&channel, "at-e2").await, vec!["m1", "m2"]);
    assert_eq!(drain(&channel, "at-e3").await, vec!["m1"]);
    // Unbinding breaks the path.
    channel
        .exchange_unbind(
            "e2".into(),
            "e1".into(),
            "#".into(),
            ExchangeUnbindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    publish(&channel, "e1", "only.once", b"m3").await;
    assert!(drain(&channel, "at-e2").await.is_empty());
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn exchanges_delete_if_unused_refuses_a_bound_exchange() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    for name in ["source", "sink"] {
        declare_exchange(
            &channel,
            name,
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
        )
        .await
        .unwrap();
    }
    declare(&channel, "q").await;
    bind(&channel, "q", "source", "", FieldTable::default()).await;
    bind_exchange(&channel, "sink", "source", "").await;
    let if_unused = ExchangeDeleteOptions {
        if_unused: true,
        ..Default::default()
    };
    // Only bindings with the exchange as source count: "sink" is unused.
    channel
        .exchange_delete("sink".into(), if_unused)
        .await
        .unwrap();
    let error = amqp_error(channel.exchange_delete("source".into(), if_unused).await);
    assert_eq!(
        error,
        (
            406,
            "PRECONDITION_FAILED - exchange 'source' in vhost '/' in use".to_owned()
        )
    );
    let channel = connection.create_channel().await.unwrap();
    channel
        .exchange_delete("source".into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    // Deleting a missing exchange succeeds, as in RabbitMQ 3.x.
    channel
        .exchange_delete("source".into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn exchanges_topic_wildcards() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    let patterns = [
        ("star", "a.*.c"),
        ("hash", "a.#"),
        ("hash-middle", "a.#.c"),
        ("all", "#"),
        ("exact", "a.b.c"),
    ];
    for (queue, pattern) in patterns {
        declare(&channel, queue).await;
        bind(&channel, queue, "amq.topic", pattern, FieldTable::default()).await;
    }
    for key in ["a.b.c", "a", "a.b", "a.b.b.c", "b.c", "a..c", ""] {
        publish(&channel, "amq.topic", key, key.as_bytes()).await;
    }
    assert_eq!(drain(&channel, "star").await, vec!["a.b.c", "a..c"]);
    assert_eq!(
        drain(&channel, "hash").await,
        vec!["a.b.c", "a", "a.b", "a.b.b.c", "a..c"]
    );
    assert_eq!(
        drain(&channel, "hash-middle").await,
        vec!["a.b.c", "a.b.b.c", "a..c"]
    );
    assert_eq!(
        drain(&channel, "all").await,
        vec!["a.b.c", "a", "a.b", "a.b.b.c", "b.c", "a..c", ""]
    );
    assert_eq!(drain(&channel, "exact").await, vec!["a.b.c"]);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn exchanges_headers_match_all_and_any() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "all").await;
    declare(&channel, "any").await;
    bind(
        &channel,
        "all",
        "amq.headers",
        "",
        table(&[
            ("x-match", text("all")),
            ("format", text("pdf")),
            ("type", text("report")),
        ]),
    )
    .await;
    bind(
        &channel,
        "any",
        "amq.match",
        "",
        table(&[
            ("x-match", text("any")),
            ("format", text("pdf")),
            ("type", text("report")),
        ]),
    )
    .await;
    bind_exchange(&channel, "amq.match", "amq.headers", "").await;
    let send = |name: &'static str, headers: FieldTable| {
        let channel = channel.clone();
        async move {
            publish_with(
                &channel,
                "amq.headers",
                "ignored",
                name.as_bytes(),
                BasicProperties::default().with_headers(headers),
            )
            .await
        }
    };
    send(
        "both",
        table(&[("format", text("pdf")), ("type", text("report"))]),
    )
    .await;
    send("format-only", table(&[("format", text("pdf"))])).await;
    send(
        "wrong-value",
        table(&[("format", text("zip")), ("type", text("log"))]),
    )
    .await;
    send(
        "typed-int",
        table(&[("format", AMQPValue::LongInt(1)), ("type", text("report"))]),
    )
    .await;
    assert_eq!(drain(&channel, "all").await, vec!["both"]);
    assert_eq!(
        drain(&channel, "any").await,
        vec!["both", "format-only", "typed-int"]
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn exchanges_amqprs_declare_bind_and_consume() {
    use amqprs::channel::{
        BasicConsumeArguments, BasicPublishArguments, ExchangeDeclareArguments,
        ExchangeDeleteArguments, QueueBindArguments, QueueDeclareArguments,
    };
    let server = TestServer::start().await;
    let (connection, channel) = amqprs_open(&server).await;
    channel
        .exchange_declare(ExchangeDeclareArguments::new("prs-topic", "topic"))
        .await
        .unwrap();
    channel
        .queue_declare(QueueDeclareArguments::new("prs-q"))
        .await
        .unwrap();
    channel
        .queue_bind(QueueBindArguments::new("prs-q", "prs-topic", "stock.*"))
        .await
        .unwrap();
    let (_, mut messages) = channel
        .basic_consume_rx(
            BasicConsumeArguments::new("prs-q", "")
                .auto_ack(true)
                .finish(),
        )
        .await
        .unwrap();
    for key in ["stock.nyse", "bond.nyse", "stock.lse"] {
        channel
            .basic_publish(
                amqprs::BasicProperties::default(),
                key.as_bytes().to_vec(),
                BasicPublishArguments::new("prs-topic", key),
            )
            .await
            .unwrap();
    }
    for expected in ["stock.nyse", "stock.lse"] {
        let message = tokio::time::timeout(ARRIVAL_TIMEOUT, messages.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(message.content.unwrap(), expected.as_bytes());
        assert_eq!(message.deliver.unwrap().routing_key(), expected);
    }
    channel
        .exchange_delete(ExchangeDeleteArguments::new("prs-topic"))
        .await
        .unwrap();
    connection.close().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn exchanges_consumers_see_exchange_and_routing_key() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "seen").await;
    bind(&channel, "seen", "amq.direct", "rk", FieldTable::default()).await;
    let mut consumer = channel
        .basic_consume(
            "seen".into(),
            "".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    publish(&channel, "amq.direct", "rk", b"x").await;
    let delivery = next_delivery(&mut consumer).await;
    assert_eq!(delivery.exchange.as_str(), "amq.direct");
    assert_eq!(delivery.routing_key.as_str(), "rk");
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// Sender-selected distribution: CC and BCC headers add routing keys, each
/// queue gets one copy, BCC never reaches a consumer, and the alternate
/// exchange takes the message only when no key routes it.
#[tokio::test]
async fn exchanges_cc_and_bcc_headers_add_routing_keys() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_exchange(
        &channel,
        "x-cc-ae",
        ExchangeKind::Fanout,
        ExchangeDeclareOptions::default(),
    )
    .await
    .unwrap();
    declare(&channel, "q-ae").await;
    bind(&channel, "q-ae", "x-cc-ae", "", FieldTable::default()).await;
    channel
        .exchange_declare(
            "x-cc".into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
            table(&[("alternate-exchange", text("x-cc-ae"))]),
        )
        .await
        .unwrap();
    for (queue, key) in [("q-main", "main"), ("q-cc", "cc"), ("q-bcc", "bcc")] {
        declare(&channel, queue).await;
        bind(&channel, queue, "x-cc", key, FieldTable::default()).await;
    }
    let keys = |values: &[&str]| {
        AMQPValue::FieldArray(
            values
                .iter()
                .map(|value| text(value))
                .collect::<Vec<_>>()
                .into(),
        )
    };
    let with_headers =
        |entries: &[(&str, AMQPValue)]| BasicProperties::default().with_headers(table(entries));

    // CC repeats the routing key and names a key bound nowhere: still one
    // copy per queue, and the alternate exchange is not used.
    publish_with(
        &channel,
        "x-cc",
        "main",
        b"m1",
        with_headers(&[
            ("CC", keys(&["cc", "main", "unbound"])),
            ("BCC", keys(&["bcc"])),
        ]),
    )
    .await;
    let copy = channel
        .basic_get(
            "q-cc".into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
        .expect("the CC queue has its copy");
    let headers = copy.delivery.properties.headers().clone().unwrap();
    assert!(
        headers.inner().contains_key("CC"),
        "CC is kept: {headers:?}"
    );
    assert!(
        !headers.inner().contains_key("BCC"),
        "BCC is stripped: {headers:?}"
    );
    assert_eq!(drain(&channel, "q-main").await, vec!["m1"]);
    assert_eq!(drain(&channel, "q-bcc").await, vec!["m1"]);
    assert!(drain(&channel, "q-cc").await.is_empty());
    assert!(drain(&channel, "q-ae").await.is_empty());

    // The routing key matches nothing but a CC key does: no alternate.
    publish_with(
        &channel,
        "x-cc",
        "nowhere",
        b"m2",
        with_headers(&[("CC", keys(&["cc"]))]),
    )
    .await;
    assert_eq!(drain(&channel, "q-cc").await, vec!["m2"]);
    assert!(drain(&channel, "q-ae").await.is_empty());
    // No key matches: the alternate exchange takes it, once.
    publish_with(
        &channel,
        "x-cc",
        "nowhere",
        b"m3",
        with_headers(&[("BCC", keys(&["none"]))]),
    )
    .await;
    assert_eq!(drain(&channel, "q-ae").await, vec!["m3"]);

    // The default exchange routes CC keys to the queues they name.
    publish_with(
        &channel,
        "",
        "q-main",
        b"m4",
        with_headers(&[("CC", keys(&["q-bcc"]))]),
    )
    .await;
    assert_eq!(drain(&channel, "q-main").await, vec!["m4"]);
    assert_eq!(drain(&channel, "q-bcc").await, vec!["m4"]);

    // A CC that is not an array makes the message invalid: refused, and
    // stored nowhere.
    let mut watcher = close_watcher(&channel).await;
    publish_with(
        &channel,
        "x-cc",
        "main",
        b"m5",
        with_headers(&[("CC", text("cc"))]),
    )
    .await;
    assert_eq!(
        channel_closed_with(&mut watcher).await,
        (
            406,
            "PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,\"CC\",longstr}"
                .to_owned()
        )
    );
    let channel = connection.create_channel().await.unwrap();
    assert!(drain(&channel, "q-main").await.is_empty());
    assert!(drain(&channel, "q-cc").await.is_empty());

    // In a transaction too, at the publish: nothing published before it in
    // the transaction is applied.
    let channel = connection.create_channel().await.unwrap();
    channel.tx_select().await.unwrap();
    let mut watcher = close_watcher(&channel).await;
    publish_with(&channel, "x-cc", "main", b"t1", BasicProperties::default()).await;
    publish_with(
        &channel,
        "x-cc",
        "main",
        b"t2",
        with_headers(&[("BCC", text("bcc"))]),
    )
    .await;
    assert_eq!(
        channel_closed_with(&mut watcher).await,
        (
            406,
            "PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,\"BCC\",longstr}"
                .to_owned()
        )
    );
    let channel = connection.create_channel().await.unwrap();
    assert!(drain(&channel, "q-main").await.is_empty());
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// A publisher reuses the route of its last message while the vhost's
/// topology stands still; every bind, unbind and delete made meanwhile on
/// another channel must still take effect for its very next message.
#[tokio::test]
async fn exchanges_repeated_publishes_follow_bindings_changed_meanwhile() {
    let server = TestServer::start().await;
    let (connection, publisher) = open(&server).await;
    let admin = connection.create_channel().await.unwrap();
    declare_exchange(
        &admin,
        "x",
        ExchangeKind::Direct,
        ExchangeDeclareOptions::default(),
    )
    .await
    .unwrap();
    declare(&admin, "q1").await;
    declare(&admin, "q2").await;
    bind(&admin, "q1", "x", "k", FieldTable::default()).await;
    publish(&publisher, "x", "k", b"1").await;
    bind(&admin, "q2", "x", "k", FieldTable::default()).await;
    publish(&publisher, "x", "k", b"2").await;
    admin
        .queue_unbind("q1".into(), "x".into(), "k".into(), FieldTable::default())
        .await
        .unwrap();
    publish(&publisher, "x", "k", b"3").await;
    admin
        .queue_delete("q2".into(), Default::default())
        .await
        .unwrap();
    publish(&publisher, "x", "k", b"lost with q2's bindings").await;
    declare(&admin, "q2").await;
    bind(&admin, "q2", "x", "k", FieldTable::default()).await;
    publish(&publisher, "x", "k", b"4").await;
    // The default exchange routes by queue name: a queue declared after a
    // publish found none gets the next one.
    publish(&publisher, "", "late", b"before").await;
    declare(&admin, "late").await;
    publish(&publisher, "", "late", b"after").await;
    assert_eq!(drain(&admin, "q1").await, ["1", "2"]);
    assert_eq!(drain(&admin, "q2").await, ["4"]);
    assert_eq!(drain(&admin, "late").await, ["after"]);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}
