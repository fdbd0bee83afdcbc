//! Alternate exchanges (`alternate-exchange`): where an exchange sends what
//! it cannot route, as RabbitMQ 3.10's `rabbit_exchange:route` does.

mod helpers;
mod support;

use helpers::*;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeBindOptions, ExchangeDeclareOptions,
    QueueBindOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, ExchangeKind};
use support::TestServer;

async fn exchange(channel: &Channel, name: &str, kind: ExchangeKind, alternate: Option<&str>) {
    exchange_with(channel, name, kind, alternate, false).await
}

async fn exchange_with(
    channel: &Channel,
    name: &str,
    kind: ExchangeKind,
    alternate: Option<&str>,
    internal: bool,
) {
    let arguments = match alternate {
        Some(alternate) => table(&[("alternate-exchange", text(alternate))]),
        None => FieldTable::default(),
    };
    channel
        .exchange_declare(
            name.into(),
            kind,
            ExchangeDeclareOptions {
                internal,
                ..Default::default()
            },
            arguments,
        )
        .await
        .expect("exchange declares");
}

async fn queue_bound(channel: &Channel, queue: &str, exchange: &str, key: &str) {
    declare(channel, queue).await;
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("queue.bind succeeds");
}

/// Publishes with mandatory on a confirming channel; true when the message
/// came back with basic.return.
async fn returned(channel: &Channel, exchange: &str, key: &str, body: &[u8]) -> bool {
    let confirm = channel
        .basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            body,
            BasicProperties::default(),
        )
        .await
        .expect("publish is sent");
    let confirmation = tokio::time::timeout(ARRIVAL_TIMEOUT, confirm)
        .await
        .expect("confirmed in time")
        .expect("confirmation arrives");
    match confirmation {
        Confirmation::Ack(returned) => returned.is_some(),
        other => panic!("expected an ack, got {other:?}"),
    }
}

async fn bodies(channel: &Channel, queue: &str) -> Vec<String> {
    let mut all = Vec::new();
    while let Some(body) = get_body(channel, queue, true).await {
        all.push(String::from_utf8(body).unwrap());
    }
    all
}

async fn confirming(server: &TestServer) -> (lapin::Connection, Channel) {
    let (connection, channel) = open(server).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    (connection, channel)
}

#[tokio::test]
async fn alternate_exchange_takes_only_what_the_exchange_cannot_route() {
    let server = TestServer::start().await;
    let (connection, channel) = confirming(&server).await;
    exchange(&channel, "unrouted", ExchangeKind::Fanout, None).await;
    queue_bound(&channel, "leftovers", "unrouted", "").await;
    exchange(&channel, "orders", ExchangeKind::Direct, Some("unrouted")).await;
    queue_bound(&channel, "paid", "orders", "paid").await;

    assert!(!returned(&channel, "orders", "paid", b"routed").await);
    assert!(!returned(&channel, "orders", "refunded", b"unroutable").await);
    assert_eq!(bodies(&channel, "paid").await, vec!["routed"]);
    assert_eq!(bodies(&channel, "leftovers").await, vec!["unroutable"]);

    // The alternate keeps the original exchange and routing key.
    publish(&channel, "orders", "lost", b"check").await;
    let message = channel
        .basic_get(
            "leftovers".into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
        .expect("a message in the alternate's queue");
    assert_eq!(message.delivery.exchange.as_str(), "orders");
    assert_eq!(message.delivery.routing_key.as_str(), "lost");
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn alternate_exchange_chains_are_followed_and_cycles_stop() {
    let server = TestServer::start().await;
    let (connection, channel) = confirming(&server).await;
    // first -> second (routes nothing) -> last, an internal fanout.
    exchange_with(&channel, "last", ExchangeKind::Fanout, None, true).await;
    queue_bound(&channel, "end-of-chain", "last", "").await;
    exchange(&channel, "second", ExchangeKind::Topic, Some("last")).await;
    exchange(&channel, "first", ExchangeKind::Direct, Some("second")).await;
    assert!(!returned(&channel, "first", "anything", b"chained").await);
    assert_eq!(bodies(&channel, "end-of-chain").await, vec!["chained"]);

    // ping <-> pong name each other and route nothing: the walk stops and
    // the message, routed nowhere, is returned.
    exchange(&channel, "ping", ExchangeKind::Direct, Some("pong")).await;
    exchange(&channel, "pong", ExchangeKind::Direct, Some("ping")).await;
    assert!(returned(&channel, "ping", "k", b"cycle").await);

    // A missing alternate only means unroutable.
    exchange(
        &channel,
        "dangling",
        ExchangeKind::Direct,
        Some("no-such-exchange"),
    )
    .await;
    assert!(returned(&channel, "dangling", "k", b"nowhere").await);

    // An alternate that routes nowhere itself does not stop a return.
    exchange(&channel, "empty-alternate", ExchangeKind::Direct, None).await;
    exchange(
        &channel,
        "front",
        ExchangeKind::Direct,
        Some("empty-alternate"),
    )
    .await;
    assert!(returned(&channel, "front", "k", b"still lost").await);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn alternate_exchange_applies_per_exchange_on_the_walk() {
    let server = TestServer::start().await;
    let (connection, channel) = confirming(&server).await;
    exchange(&channel, "outer-ae", ExchangeKind::Fanout, None).await;
    queue_bound(&channel, "outer-leftovers", "outer-ae", "").await;
    exchange(&channel, "inner-ae", ExchangeKind::Fanout, None).await;
    queue_bound(&channel, "inner-leftovers", "inner-ae", "").await;
    exchange(&channel, "inner", ExchangeKind::Direct, Some("inner-ae")).await;
    exchange(&channel, "outer", ExchangeKind::Fanout, Some("outer-ae")).await;
    channel
        .exchange_bind(
            "inner".into(),
            "outer".into(),
            "".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    // outer routes to inner, so outer's alternate is not used; inner routes
    // nowhere, so inner's is.
    assert!(!returned(&channel, "outer", "k", b"via inner").await);
    assert_eq!(bodies(&channel, "inner-leftovers").await, vec!["via inner"]);
    assert!(bodies(&channel, "outer-leftovers").await.is_empty());
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn alternate_exchange_argument_is_checked_and_compared() {
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    let channel = connection.create_channel().await.unwrap();
    let error = amqp_error(
        channel
            .exchange_declare(
                "bad".into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                table(&[("alternate-exchange", AMQPValue::LongInt(7))]),
            )
            .await,
    );
    assert_eq!(
        error,
        (
            406,
            "PRECONDITION_FAILED - invalid type 'signedint' for arg 'alternate-exchange' in exchange 'bad' in vhost '/'"
                .to_owned()
        )
    );
    let channel = connection.create_channel().await.unwrap();
    exchange(&channel, "with-ae", ExchangeKind::Direct, Some("ae-1")).await;
    let error = amqp_error(
        channel
            .exchange_declare(
                "with-ae".into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                table(&[("alternate-exchange", text("ae-2"))]),
            )
            .await,
    );
    assert_eq!(
        error,
        (
            406,
            "PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'with-ae' in vhost '/': received the value 'ae-2' of type 'longstr' but current is the value 'ae-1' of type 'longstr'"
                .to_owned()
        )
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}
