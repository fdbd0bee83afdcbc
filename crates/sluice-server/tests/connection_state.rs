//! The connection registry a management API reads: who is connected, and which
//! connections flow control is holding back (`running`, `flow`, `blocking`, `blocked`).

mod helpers;
mod support;

use std::time::Duration;

use helpers::*;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use sluice_server::connection_registry::{ConnectionSnapshot, ConnectionState};
use support::alarm::*;
use support::TestServer;

/// Waits until some connection satisfies `matches`, and returns it.
async fn wait_for_connection(
    server: &TestServer,
    what: &str,
    matches: impl Fn(&ConnectionSnapshot) -> bool,
) -> ConnectionSnapshot {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(found) = server.running().connections().into_iter().find(&matches) {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no connection {what}: {:?}",
            server.running().connections()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until exactly `count` connections are listed.
async fn wait_for_count(server: &TestServer, count: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while server.running().connections().len() != count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "expected {count} connections: {:?}",
            server.running().connections()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn connection(server: &TestServer, connection_id: u64) -> ConnectionSnapshot {
    server
        .running()
        .connections()
        .into_iter()
        .find(|snapshot| snapshot.connection_id == connection_id)
        .expect("the connection is listed")
}

#[tokio::test]
async fn connection_state_lists_open_connections_until_they_close() {
    let server = TestServer::start().await;
    assert!(server.running().connections().is_empty());
    let (first, _first_channel) = open(&server).await;
    let (second, _second_channel) = open(&server).await;
    let snapshots = server.running().connections();
    assert_eq!(snapshots.len(), 2);
    for snapshot in &snapshots {
        assert_eq!(snapshot.identity.user, "guest");
        assert_eq!(snapshot.identity.vhost, "/");
        assert!(snapshot.identity.peer_address.ip().is_loopback());
        assert_eq!(snapshot.state, ConnectionState::Running);
        assert_eq!(snapshot.time_in_flow_ms, 0);
        assert_eq!(snapshot.time_blocked_ms, 0);
        assert_eq!(snapshot.blocked_since, None);
    }
    assert!(snapshots[0].connection_id < snapshots[1].connection_id);
    first.close(200, "bye".into()).await.unwrap();
    wait_for_count(&server, 1).await;
    assert_eq!(
        server.running().connections()[0].connection_id,
        snapshots[1].connection_id
    );
    second.close(200, "bye".into()).await.unwrap();
    wait_for_count(&server, 0).await;
    server.stop().await;
}

#[tokio::test]
async fn connection_state_flow_while_paused_by_a_congested_queue() {
    let server = TestServer::start().await;
    let (_consumer_connection, consumer_channel) = open(&server).await;
    declare(&consumer_channel, "behind").await;
    // One message out and never acked: the queue cannot drain.
    let _consumer = stuck_consumer(&consumer_channel, "behind").await;
    let uri = server.uri();
    let publisher = tokio::spawn(async move {
        let connection = lapin::Connection::connect(&uri, lapin::ConnectionProperties::default())
            .await
            .unwrap();
        let channel = connection.create_channel().await.unwrap();
        for _ in 0..20_000 {
            channel
                .basic_publish(
                    "".into(),
                    "behind".into(),
                    BasicPublishOptions::default(),
                    &[0u8; 100],
                    BasicProperties::default(),
                )
                .await
                .unwrap();
        }
        channel
            .queue_declare(
                "behind".into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        connection
    });

    let paused = wait_for_connection(&server, "in flow", |snapshot| {
        snapshot.state == ConnectionState::Flow
    })
    .await;
    // The publisher stays paused while the consumer holds its message, and
    // the time it has spent so grows.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let later = connection(&server, paused.connection_id);
    assert_eq!(later.state, ConnectionState::Flow);
    assert!(
        later.time_in_flow_ms > paused.time_in_flow_ms,
        "{} then {}",
        paused.time_in_flow_ms,
        later.time_in_flow_ms
    );
    assert_eq!(later.time_blocked_ms, 0);
    assert!(!publisher.is_finished());
    // The consumer goes: a queue without consumers takes the rest.
    consumer_channel
        .basic_cancel("stuck".into(), Default::default())
        .await
        .unwrap();
    let publisher_connection = tokio::time::timeout(Duration::from_secs(10), publisher)
        .await
        .expect("the publisher resumes")
        .unwrap();
    publisher_connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn connection_state_blocking_then_blocked_under_an_alarm() {
    let server = TestServer::start().await;
    let (publisher, publisher_channel) = open(&server).await;
    let mut events = Box::pin(publisher.events_listener());
    let (consumer, _consumer_channel) = open(&server).await;
    declare(&publisher_channel, "alarmed").await;
    let snapshots = server.running().connections();
    let (publisher_id, consumer_id) = (snapshots[0].connection_id, snapshots[1].connection_id);

    set_memory_alarm(&server).await;
    // Neither has published since the alarm: both are still read.
    assert_eq!(
        connection(&server, publisher_id).state,
        ConnectionState::Blocking
    );
    assert_eq!(
        connection(&server, consumer_id).state,
        ConnectionState::Blocking
    );
    publish(&publisher_channel, "", "alarmed", b"meets the alarm").await;
    assert_eq!(
        next_block_notice(&mut events).await,
        BlockNotice::Blocked("low on memory".to_owned())
    );
    let blocked = wait_for_connection(&server, "blocked", |snapshot| {
        snapshot.state == ConnectionState::Blocked
    })
    .await;
    assert_eq!(blocked.connection_id, publisher_id);
    assert!(blocked.blocked_since.is_some());
    assert_eq!(
        connection(&server, consumer_id).state,
        ConnectionState::Blocking
    );
    tokio::time::sleep(Duration::from_millis(100)).await;

    clear_memory_alarm(&server).await;
    assert_eq!(next_block_notice(&mut events).await, BlockNotice::Unblocked);
    let unblocked = connection(&server, publisher_id);
    assert_eq!(unblocked.state, ConnectionState::Running);
    assert_eq!(unblocked.blocked_since, None);
    assert!(unblocked.time_blocked_ms >= 100, "{unblocked:?}");
    assert_eq!(
        connection(&server, consumer_id).state,
        ConnectionState::Running
    );
    publisher.close(200, "bye".into()).await.unwrap();
    consumer.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}
