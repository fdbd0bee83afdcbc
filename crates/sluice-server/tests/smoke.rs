//! A first end-to-end check with both Rust clients.

mod support;

use amqprs::channel::{BasicPublishArguments, QueueDeclareArguments};
use amqprs::connection::{Connection as AmqprsConnection, OpenConnectionArguments};
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use support::TestServer;
use tokio_stream_lite::next;

mod tokio_stream_lite {
    use futures_lite::StreamExt;
    pub async fn next<S: futures_lite::Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
        stream.next().await
    }
}

#[tokio::test]
async fn smoke_lapin_publish_and_consume() {
    let server = TestServer::start().await;
    let connection = Connection::connect(&server.uri(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_declare(
            "smoke".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .basic_publish(
            "".into(),
            "smoke".into(),
            BasicPublishOptions::default(),
            b"hello",
            BasicProperties::default(),
        )
        .await
        .unwrap();
    let mut consumer = channel
        .basic_consume(
            "smoke".into(),
            "c1".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let delivery = next(&mut consumer).await.unwrap().unwrap();
    assert_eq!(delivery.data, b"hello");
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn smoke_amqprs_declares_and_publishes() {
    let server = TestServer::start().await;
    let arguments = OpenConnectionArguments::new(
        &server.address.ip().to_string(),
        server.address.port(),
        "guest",
        "guest",
    );
    let connection = AmqprsConnection::open(&arguments).await.unwrap();
    let channel = connection.open_channel(None).await.unwrap();
    let (name, message_count, _) = channel
        .queue_declare(QueueDeclareArguments::new("amqprs-smoke"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(name, "amqprs-smoke");
    assert_eq!(message_count, 0);
    channel
        .basic_publish(
            amqprs::BasicProperties::default(),
            b"one".to_vec(),
            BasicPublishArguments::new("", "amqprs-smoke"),
        )
        .await
        .unwrap();
    let (_, message_count, _) = channel
        .queue_declare(
            QueueDeclareArguments::new("amqprs-smoke")
                .passive(true)
                .finish(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(message_count, 1);
    connection.close().await.unwrap();
    server.stop().await;
}
