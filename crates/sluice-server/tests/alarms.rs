//! Memory and disk alarms block publishing connections and nothing else.

mod helpers;
mod support;

use std::time::Duration;

use helpers::*;
use sluice_wire::amq_protocol::protocol::{connection, queue, AMQPClass};
use sluice_wire::amq_protocol::types::FieldTable;
use sluice_wire::method::Method;
use support::raw::RawClient;
use support::TestServer;

fn declare(name: &str) -> AMQPClass {
    AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
        queue: name.into(),
        passive: false,
        durable: false,
        exclusive: false,
        auto_delete: false,
        nowait: false,
        arguments: FieldTable::default(),
    }))
}

/// Opens channel 1, declares `queue`, publishes once, and expects
/// connection.blocked with `reason`.
async fn expect_blocked_after_publish(server: &TestServer, queue: &str, reason: &str) -> RawClient {
    let mut client = RawClient::open(server.address).await;
    client.open_channel(1).await;
    client.send_method(1, declare(queue)).await;
    client.read_method().await; // declare-ok
    client.publish(1, queue, b"first").await;
    let (channel_id, method) = client.read_method().await;
    assert_eq!(channel_id, 0);
    match method {
        Method::Control(AMQPClass::Connection(connection::AMQPMethod::Blocked(blocked))) => {
            assert_eq!(blocked.reason.as_str(), reason);
        }
        other => panic!("expected connection.blocked, got {other:?}"),
    }
    client
}

#[tokio::test]
async fn alarms_memory_watermark_blocks_publishers_but_not_consumers() {
    // A watermark of a few bytes: the alarm is set from the first sample.
    let server =
        TestServer::start_with(|config| config.vm_memory_high_watermark_relative = 1e-12).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut publisher = expect_blocked_after_publish(&server, "alarmed", "low on memory").await;

    // A publisher that ignores the block is not read: what it sends now
    // does not reach the queue.
    for _ in 0..200 {
        publisher.publish(1, "alarmed", b"ignored the block").await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A connection that only consumes is served: it sees the first message only.
    let (connection, channel) = open(&server).await;
    assert_eq!(
        get_body(&channel, "alarmed", true).await.as_deref(),
        Some(&b"first"[..])
    );
    assert_eq!(get_body(&channel, "alarmed", true).await, None);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn alarms_disk_free_limit_blocks_publishers() {
    let server = TestServer::start_with(|config| config.disk_free_limit_bytes = u64::MAX / 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _publisher = expect_blocked_after_publish(&server, "disk", "low on disk").await;
    server.stop().await;
}

#[tokio::test]
async fn alarms_no_alarm_no_block() {
    let server = TestServer::start().await;
    let mut client = RawClient::open(server.address).await;
    client.open_channel(1).await;
    client.send_method(1, declare("calm")).await;
    client.read_method().await;
    client.publish(1, "calm", b"x").await;
    // The next reply is the declare-ok, not a connection.blocked.
    client.send_method(1, declare("calm")).await;
    let (channel_id, method) = client.read_method().await;
    assert_eq!(channel_id, 1);
    assert!(
        matches!(method, Method::Control(AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok))) if ok.message_count == 1)
    );
    server.stop().await;
}
