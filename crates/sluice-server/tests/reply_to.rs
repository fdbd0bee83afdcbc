//! Direct reply-to (`amq.rabbitmq.reply-to`), as RabbitMQ 3.10's
//! rabbit_channel implements it.

mod helpers;
mod support;

use helpers::*;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Consumer};
use support::TestServer;

const REPLY_TO: &str = "amq.rabbitmq.reply-to";

async fn consume_replies(channel: &Channel, no_ack: bool) -> lapin::Result<Consumer> {
    channel
        .basic_consume(
            REPLY_TO.into(),
            "replies".into(),
            BasicConsumeOptions {
                no_ack,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
}

async fn consume(channel: &Channel, queue: &str) -> Consumer {
    channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("consumes")
}

fn asking_for_reply() -> BasicProperties {
    BasicProperties::default()
        .with_reply_to(REPLY_TO.into())
        .with_correlation_id("request-1".into())
}

/// Sends a request from `client` and returns the reply name the RPC server
/// sees on it.
async fn request(client: &Channel, server_requests: &mut Consumer, body: &[u8]) -> String {
    publish_with(client, "", "rpc", body, asking_for_reply()).await;
    let delivery = next_delivery(server_requests).await;
    assert_eq!(delivery.data, body);
    assert_eq!(
        delivery
            .properties
            .correlation_id()
            .as_ref()
            .map(|id| id.as_str()),
        Some("request-1"),
        "other properties pass unchanged"
    );
    delivery
        .properties
        .reply_to()
        .as_ref()
        .expect("the request keeps a reply-to")
        .to_string()
}

#[tokio::test]
async fn reply_to_round_trip_without_a_queue() {
    let server = TestServer::start().await;
    let (client_connection, client) = open(&server).await;
    let (server_connection, rpc_server) = open(&server).await;
    declare(&rpc_server, "rpc").await;
    let mut requests = consume(&rpc_server, "rpc").await;
    let mut replies = consume_replies(&client, true).await.unwrap();

    let reply_name = request(&client, &mut requests, b"ping").await;
    assert!(
        reply_name.starts_with("amq.rabbitmq.reply-to.") && reply_name.len() > REPLY_TO.len() + 16,
        "{reply_name}"
    );
    // The reply goes through the default exchange, straight to the consumer.
    publish(&rpc_server, "", &reply_name, b"pong").await;
    let reply = next_delivery(&mut replies).await;
    assert_eq!(reply.data, b"pong");
    assert_eq!(reply.routing_key.as_str(), reply_name);
    assert_eq!(reply.exchange.as_str(), "");

    // Another channel gets another name; a made-up name reaches nobody.
    let other = client_connection.create_channel().await.unwrap();
    let _other_replies = consume_replies(&other, true).await.unwrap();
    publish_with(&other, "", "rpc", b"second", asking_for_reply()).await;
    let other_name = next_delivery(&mut requests)
        .await
        .properties
        .reply_to()
        .as_ref()
        .unwrap()
        .to_string();
    assert_ne!(other_name, reply_name);
    publish(
        &rpc_server,
        "",
        "amq.rabbitmq.reply-to.made-up-token",
        b"forged",
    )
    .await;
    assert_no_delivery(&mut replies).await;

    // No queue was created for any of it.
    let (code, _) = amqp_error(
        declare_with(
            &server_connection.create_channel().await.unwrap(),
            "amq.rabbitmq.reply-to.made-up-token",
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await,
    );
    assert_eq!(code, 404);
    client_connection.close(200, "bye".into()).await.unwrap();
    server_connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn reply_to_consumer_must_be_no_ack_and_single() {
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    let channel = connection.create_channel().await.unwrap();
    assert_eq!(
        amqp_error(consume_replies(&channel, false).await),
        (
            406,
            "PRECONDITION_FAILED - reply consumer cannot acknowledge".to_owned()
        )
    );
    let channel = connection.create_channel().await.unwrap();
    consume_replies(&channel, true).await.unwrap();
    let second = channel
        .basic_consume(
            REPLY_TO.into(),
            "again".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    assert_eq!(
        amqp_error(second),
        (
            406,
            "PRECONDITION_FAILED - reply consumer already set".to_owned()
        )
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn reply_to_request_without_a_reply_consumer_is_refused() {
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    let channel = connection.create_channel().await.unwrap();
    declare(&channel, "rpc").await;
    let mut watcher = close_watcher(&channel).await;
    publish_with(&channel, "", "rpc", b"orphan", asking_for_reply()).await;
    assert_eq!(
        channel_closed_with(&mut watcher).await,
        (
            406,
            "PRECONDITION_FAILED - fast reply consumer does not exist".to_owned()
        )
    );
    // Nothing was enqueued, and a reply-to naming a real queue is untouched.
    let channel = connection.create_channel().await.unwrap();
    assert_eq!(get_body(&channel, "rpc", true).await, None);
    publish_with(
        &channel,
        "",
        "rpc",
        b"classic",
        BasicProperties::default().with_reply_to("my-queue".into()),
    )
    .await;
    let message = channel
        .basic_get(
            "rpc".into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        message
            .delivery
            .properties
            .reply_to()
            .as_ref()
            .map(|name| name.as_str()),
        Some("my-queue")
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn reply_to_declare_reports_the_pseudo_queue_and_live_reply_names() {
    let server = TestServer::start().await;
    let (connection, client) = open(&server).await;
    let (server_connection, rpc_server) = open(&server).await;
    declare(&rpc_server, "rpc").await;
    let mut requests = consume(&rpc_server, "rpc").await;
    for passive in [true, false] {
        let queue = declare_with(
            &client,
            REPLY_TO,
            QueueDeclareOptions {
                passive,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("the pseudo-queue always exists");
        assert_eq!((queue.message_count(), queue.consumer_count()), (0, 1));
    }
    let _replies = consume_replies(&client, true).await.unwrap();
    let reply_name = request(&client, &mut requests, b"hello").await;
    let probe = server_connection.create_channel().await.unwrap();
    let queue = declare_with(
        &probe,
        &reply_name,
        QueueDeclareOptions {
            passive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("a live reply name exists");
    assert_eq!((queue.message_count(), queue.consumer_count()), (0, 1));

    // Once the requesting channel is gone, its name no longer exists.
    client.close(200, "done".into()).await.unwrap();
    let (code, text) = amqp_error(
        declare_with(
            &probe,
            &reply_name,
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await,
    );
    assert_eq!(code, 404);
    assert_eq!(
        text,
        format!("NOT_FOUND - no queue '{reply_name}' in vhost '/'")
    );
    connection.close(200, "bye".into()).await.unwrap();
    server_connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn reply_to_a_gone_channel_is_dropped_or_returned_if_mandatory() {
    let server = TestServer::start().await;
    let (connection, client) = open(&server).await;
    let (server_connection, rpc_server) = open(&server).await;
    declare(&rpc_server, "rpc").await;
    let mut requests = consume(&rpc_server, "rpc").await;
    let _replies = consume_replies(&client, true).await.unwrap();
    let reply_name = request(&client, &mut requests, b"slow job").await;
    client.close(200, "gave up".into()).await.unwrap();

    rpc_server
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let publish_reply = |mandatory| {
        let rpc_server = rpc_server.clone();
        let reply_name = reply_name.clone();
        async move {
            rpc_server
                .basic_publish(
                    "".into(),
                    reply_name.as_str().into(),
                    BasicPublishOptions {
                        mandatory,
                        ..Default::default()
                    },
                    b"too late",
                    BasicProperties::default(),
                )
                .await
                .expect("publish is sent")
                .await
                .expect("confirmed")
        }
    };
    // Dropped silently: the publisher's channel stays open and is acked.
    assert_eq!(publish_reply(false).await, Confirmation::Ack(None));
    // With mandatory, RabbitMQ treats a reply name as no queue: returned.
    let Confirmation::Ack(Some(returned)) = publish_reply(true).await else {
        panic!("expected the reply to be returned");
    };
    assert_eq!(returned.reply_code, 312);
    assert!(rpc_server.status().connected());
    connection.close(200, "bye".into()).await.unwrap();
    server_connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}
