//! Validation of queue.declare and basic.consume arguments and of the
//! expiration property, with RabbitMQ 3.10's reply codes and texts
//! (`rabbit_amqqueue:check_declare_arguments`, `rabbit_channel`).

mod helpers;
mod support;

use helpers::*;
use lapin::options::{BasicConsumeOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection};
use support::TestServer;

/// Declares `name` with `arguments` on a fresh channel and returns the
/// error the broker closed the channel with.
async fn declare_refused(
    connection: &Connection,
    name: &str,
    arguments: FieldTable,
) -> (u16, String) {
    let channel = connection.create_channel().await.expect("channel opens");
    amqp_error(declare_with(&channel, name, QueueDeclareOptions::default(), arguments).await)
}

fn refused(key: &str, queue: &str, term: &str) -> (u16, String) {
    (
        406,
        format!(
            "PRECONDITION_FAILED - invalid arg '{key}' for queue '{queue}' in vhost '/': {term}"
        ),
    )
}

#[tokio::test]
async fn arguments_queue_declare_refuses_invalid_values_with_rabbitmq_texts() {
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    let long = AMQPValue::LongLongInt;
    let cases: Vec<(FieldTable, (u16, String))> = vec![
        (
            table(&[("x-max-length", long(-1))]),
            refused("x-max-length", "q", "{value_negative,-1}"),
        ),
        (
            table(&[("x-max-length-bytes", text("many"))]),
            refused("x-max-length-bytes", "q", "\"expected integer, got longstr\""),
        ),
        (
            table(&[("x-message-ttl", long(-5))]),
            refused("x-message-ttl", "q", "{value_negative,-5}"),
        ),
        (
            table(&[("x-message-ttl", long(4_294_967_296))]),
            refused("x-message-ttl", "q", "{value_too_big,4294967296}"),
        ),
        (
            table(&[("x-expires", long(0))]),
            refused("x-expires", "q", "{value_zero,0}"),
        ),
        (
            table(&[("x-expires", AMQPValue::Boolean(true))]),
            refused("x-expires", "q", "\"expected integer, got bool\""),
        ),
        (
            table(&[("x-max-priority", long(256))]),
            refused("x-max-priority", "q", "{max_value_exceeded,256}"),
        ),
        (
            table(&[("x-max-priority", long(-1))]),
            refused("x-max-priority", "q", "{value_negative,-1}"),
        ),
        (
            table(&[("x-dead-letter-routing-key", text("rk"))]),
            refused("x-dead-letter-routing-key", "q", "routing_key_but_no_dlx_defined"),
        ),
        (
            table(&[("x-overflow", text("explode"))]),
            refused("x-overflow", "q", "invalid_overflow"),
        ),
        (
            table(&[("x-overflow", AMQPValue::LongInt(1))]),
            refused("x-overflow", "q", "{unacceptable_type,signedint}"),
        ),
        (
            table(&[("x-queue-mode", text("eager"))]),
            refused("x-queue-mode", "q", "\"unsupported queue mode 'eager'\""),
        ),
        (
            table(&[("x-single-active-consumer", text("yes"))]),
            refused("x-single-active-consumer", "q", "{unacceptable_type,longstr}"),
        ),
        (
            table(&[("x-queue-type", text("fancy"))]),
            refused("x-queue-type", "q", "\"unsupported queue type 'fancy'\""),
        ),
        // The dead-letter exchange name is checked first, by the channel.
        (
            table(&[("x-dead-letter-exchange", AMQPValue::LongInt(1))]),
            (
                406,
                "PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'"
                    .to_owned(),
            ),
        ),
        // Keys are checked in RabbitMQ's order: x-expires before x-max-length.
        (
            table(&[("x-max-length", long(-1)), ("x-expires", long(0))]),
            refused("x-expires", "q", "{value_zero,0}"),
        ),
    ];
    for (arguments, expected) in cases {
        let description = format!("{arguments:?}");
        assert_eq!(
            declare_refused(&connection, "q", arguments).await,
            expected,
            "{description}"
        );
    }
    // Every valid form is accepted, and the refused declarations created nothing.
    let channel = connection.create_channel().await.unwrap();
    let queue = declare_with(
        &channel,
        "q",
        QueueDeclareOptions::default(),
        table(&[
            ("x-expires", long(60_000)),
            ("x-message-ttl", AMQPValue::LongInt(0)),
            ("x-dead-letter-exchange", text("dlx")),
            ("x-dead-letter-routing-key", text("dead")),
            ("x-max-length", AMQPValue::ShortShortUInt(3)),
            ("x-max-length-bytes", long(0)),
            ("x-max-priority", long(255)),
            ("x-overflow", text("reject-publish-dlx")),
            ("x-queue-mode", text("lazy")),
            ("x-single-active-consumer", AMQPValue::Boolean(false)),
            ("x-queue-type", text("classic")),
        ]),
    )
    .await
    .expect("valid arguments are accepted");
    assert_eq!(queue.message_count(), 0);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn arguments_redeclaration_is_compared_not_validated() {
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    let channel = connection.create_channel().await.unwrap();
    declare_with(
        &channel,
        "limited",
        QueueDeclareOptions::default(),
        table(&[("x-max-length", AMQPValue::LongInt(10))]),
    )
    .await
    .unwrap();
    // RabbitMQ reports an existing queue's mismatch, not the invalid value.
    let (code, reply) = declare_refused(
        &connection,
        "limited",
        table(&[("x-max-length", AMQPValue::LongInt(-1))]),
    )
    .await;
    assert_eq!(code, 406);
    assert!(reply.contains("inequivalent arg 'x-max-length'"), "{reply}");
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn arguments_consumer_priority_must_be_an_integer() {
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    let channel = connection.create_channel().await.unwrap();
    declare(&channel, "work").await;
    let error = amqp_error(
        channel
            .basic_consume(
                "work".into(),
                "high".into(),
                BasicConsumeOptions::default(),
                table(&[("x-priority", text("high"))]),
            )
            .await,
    );
    assert_eq!(
        error,
        refused("x-priority", "work", "\"expected integer, got longstr\"")
    );
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_consume(
            "work".into(),
            "wide".into(),
            BasicConsumeOptions::default(),
            table(&[("x-priority", AMQPValue::LongLongInt(1 << 40))]),
        )
        .await
        .expect("a priority of any integer width is accepted");
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn arguments_publish_with_invalid_expiration_closes_the_channel() {
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    declare(&connection.create_channel().await.unwrap(), "target").await;
    for (expiration, term) in [
        ("soon", "no_integer"),
        ("10s", "{leftover_string,\"s\"}"),
        ("-1", "{value_negative,-1}"),
        ("4294967296", "{value_too_big,4294967296}"),
    ] {
        let channel = connection.create_channel().await.unwrap();
        let mut watcher = close_watcher(&channel).await;
        publish_with(
            &channel,
            "",
            "target",
            b"late",
            BasicProperties::default().with_expiration(expiration.into()),
        )
        .await;
        assert_eq!(
            channel_closed_with(&mut watcher).await,
            (
                406,
                format!("PRECONDITION_FAILED - invalid expiration '{expiration}': {term}")
            )
        );
    }
    // A valid expiration goes through, and none of the refused ones was queued.
    let channel = connection.create_channel().await.unwrap();
    publish_with(
        &channel,
        "",
        "target",
        b"fine",
        BasicProperties::default().with_expiration("60000".into()),
    )
    .await;
    assert_eq!(
        get_body(&channel, "target", true).await,
        Some(b"fine".to_vec())
    );
    assert_eq!(get_body(&channel, "target", true).await, None);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}
