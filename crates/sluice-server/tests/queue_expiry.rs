//! `x-expires`: a queue unused for that long (no consumers, no basic.get,
//! not redeclared) is deleted, as queue.delete would delete it.

mod helpers;
mod support;

use std::time::Duration;

use helpers::*;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Channel;
use support::TestServer;

/// Whether the vhost still has the queue; looked up directly, since a
/// passive declare counts as a use and would keep it alive.
fn exists(server: &TestServer, name: &str) -> bool {
    server
        .running()
        .broker
        .vhost("/")
        .expect("the default vhost exists")
        .queues()
        .iter()
        .any(|queue| &**queue.name() == name)
}

async fn declare_expiring(channel: &Channel, name: &str, expires_ms: i32, durable: bool) {
    declare_with(
        channel,
        name,
        QueueDeclareOptions {
            durable,
            ..Default::default()
        },
        table(&[("x-expires", AMQPValue::LongInt(expires_ms))]),
    )
    .await
    .expect("queue declares");
}

#[tokio::test]
async fn queue_expiry_deletes_an_unused_queue_and_its_definition() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_expiring(&channel, "forgotten", 150, true).await;
    publish(&channel, "", "forgotten", b"left behind").await;
    eventually("the unused queue is deleted", || {
        !exists(&server, "forgotten")
    })
    .await;
    let passive_declare = |channel: lapin::Channel| async move {
        channel
            .queue_declare(
                "forgotten".into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
    };
    let (code, _) = amqp_error(passive_declare(channel).await);
    assert_eq!(code, 404);
    connection.close(200, "bye".into()).await.unwrap();
    // The deletion is in the metadata log: a restart does not bring it back.
    let server = server.restart().await;
    assert!(
        !exists(&server, "forgotten"),
        "the expired queue stays gone"
    );
    let (connection, channel) = open(&server).await;
    let (code, _) = amqp_error(passive_declare(channel).await);
    assert_eq!(code, 404);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn queue_expiry_spares_a_queue_while_it_has_a_consumer() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_expiring(&channel, "watched", 100, false).await;
    // Kept alive: lapin cancels a consumer it drops.
    let _watcher = channel
        .basic_consume(
            "watched".into(),
            "watcher".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(exists(&server, "watched"), "a consumer keeps it in use");
    // Unused from the moment its last consumer leaves.
    channel
        .basic_cancel("watcher".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    eventually("the queue goes once its consumer left", || {
        !exists(&server, "watched")
    })
    .await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn queue_expiry_basic_get_and_redeclaration_count_as_use() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_expiring(&channel, "polled", 300, false).await;
    declare_expiring(&channel, "redeclared", 300, false).await;
    // Used every 100 ms for three times its expiry: neither goes.
    for _ in 0..9 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(get_body(&channel, "polled", true).await, None);
        declare_expiring(&channel, "redeclared", 300, false).await;
    }
    assert!(exists(&server, "polled"), "basic.get keeps it in use");
    assert!(exists(&server, "redeclared"), "redeclaring keeps it in use");
    eventually("both go once no longer used", || {
        !exists(&server, "polled") && !exists(&server, "redeclared")
    })
    .await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}
