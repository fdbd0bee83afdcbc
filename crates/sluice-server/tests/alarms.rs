//! Memory and disk alarms block publishing connections and nothing else.

mod helpers;
mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use helpers::*;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use sluice_server::alarm::resident_bytes;
use sluice_server::limits::READ_BUFFER_MAX_BYTES;
use sluice_wire::amq_protocol::protocol::{basic, connection, queue, AMQPClass};
use sluice_wire::amq_protocol::types::FieldTable;
use sluice_wire::encode::encode_control;
use sluice_wire::frame::{FrameType, FRAME_END};
use sluice_wire::method::Method;
use support::alarm::*;
use support::raw::RawClient;
use support::TestServer;

fn raw_declare(name: &str) -> AMQPClass {
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
    client.send_method(1, raw_declare(queue)).await;
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
    // A watermark of zero bytes sets the alarm from the first sample. The
    // relative watermark is set too: as in RabbitMQ, the absolute one wins.
    let server = TestServer::start_with(|config| {
        config.vm_memory_high_watermark_absolute_bytes = Some(0);
        config.vm_memory_high_watermark_relative = Some(1.0);
    })
    .await;
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
    let server = TestServer::start_with(|config| {
        config.disk_free_limit_absolute_bytes = Some(u64::MAX / 2);
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _publisher = expect_blocked_after_publish(&server, "disk", "low on disk").await;
    server.stop().await;
}

#[tokio::test]
async fn alarms_relative_disk_free_limit_blocks_publishers() {
    // A million times the memory: more free space than any disk has.
    let server = TestServer::start_with(|config| {
        config.disk_free_limit_relative = Some(1e6);
    })
    .await;
    let limits = server.running().alarm_monitor().limits();
    assert!(limits.disk_free_limit_bytes >= limits.total_memory_bytes);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _publisher = expect_blocked_after_publish(&server, "disk", "low on disk").await;
    server.stop().await;
}

#[tokio::test]
async fn alarms_no_alarm_no_block() {
    let server = TestServer::start().await;
    let mut client = RawClient::open(server.address).await;
    client.open_channel(1).await;
    client.send_method(1, raw_declare("calm")).await;
    client.read_method().await;
    client.publish(1, "calm", b"x").await;
    // The next reply is the declare-ok, not a connection.blocked.
    client.send_method(1, raw_declare("calm")).await;
    let (channel_id, method) = client.read_method().await;
    assert_eq!(channel_id, 1);
    assert!(
        matches!(method, Method::Control(AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok))) if ok.message_count == 1)
    );
    server.stop().await;
}

/// The whole cycle a client sees: an alarm set at runtime blocks the
/// publisher at its next publish, relaxing the limit unblocks it, and what it
/// held back while blocked goes through.
#[tokio::test]
async fn alarms_set_and_cleared_at_runtime_block_then_unblock_a_publisher() {
    let server = TestServer::start().await;
    let connection = connect(&server).await;
    let mut events = Box::pin(connection.events_listener());
    let channel = connection.create_channel().await.unwrap();
    declare(&channel, "runtime").await;
    publish(&channel, "", "runtime", b"before the alarm").await;
    // Taken before the alarm: a publish still unread when it is set would
    // block the connection and leave the next one unread.
    let queue = server.queue("runtime");
    eventually("the first publish is in the queue", || {
        queue.message_count() == 1
    })
    .await;

    set_memory_alarm(&server).await;
    // As in RabbitMQ, the publish that meets the alarm is taken; the
    // connection is blocked after it.
    publish(&channel, "", "runtime", b"meets the alarm").await;
    assert_eq!(
        next_block_notice(&mut events).await,
        BlockNotice::Blocked("low on memory".to_owned())
    );
    assert!(connection.status().blocked());
    // lapin holds what is published while blocked.
    let held = tokio::spawn(async move {
        publish(&channel, "", "runtime", b"held while blocked").await;
        channel
    });
    tokio::time::sleep(QUIET_PERIOD).await;
    assert_eq!(message_count(&server, "runtime").await, 2);

    clear_memory_alarm(&server).await;
    assert_eq!(next_block_notice(&mut events).await, BlockNotice::Unblocked);
    let channel = tokio::time::timeout(ALARM_TIMEOUT, held)
        .await
        .expect("the held publish is sent")
        .unwrap();
    publish(&channel, "", "runtime", b"after the alarm").await;
    let deadline = tokio::time::Instant::now() + ALARM_TIMEOUT;
    while message_count(&server, "runtime").await < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "publishes flow again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// Consumers drain the queues while publishers are blocked: that is what
/// brings memory back down.
#[tokio::test]
async fn alarms_consumer_keeps_receiving_while_publishers_are_blocked() {
    const BACKLOG: usize = 50;
    let server = TestServer::start().await;
    let (publisher_connection, publisher_channel) = open(&server).await;
    let mut events = Box::pin(publisher_connection.events_listener());
    declare(&publisher_channel, "drain").await;
    for _ in 0..BACKLOG {
        publish(&publisher_channel, "", "drain", b"backlog").await;
    }
    // All taken before the alarm: publishes still unread when it is set
    // would stay unread, and the consumer would wait for them.
    let queue = server.queue("drain");
    eventually("the backlog is in the queue", || {
        queue.message_count() as usize == BACKLOG
    })
    .await;
    set_memory_alarm(&server).await;
    publish(&publisher_channel, "", "drain", b"meets the alarm").await;
    assert_eq!(
        next_block_notice(&mut events).await,
        BlockNotice::Blocked("low on memory".to_owned())
    );

    let (consumer_connection, consumer_channel) = open(&server).await;
    consumer_channel
        .basic_qos(10, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = consumer_channel
        .basic_consume(
            "drain".into(),
            "drainer".into(),
            BasicConsumeOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    // Acks are read and free prefetch room: all of it arrives, ten at a time.
    for _ in 0..=BACKLOG {
        let delivery = next_delivery(&mut consumer).await;
        delivery.ack(Default::default()).await.unwrap();
    }
    assert_no_delivery(&mut consumer).await;
    assert!(
        publisher_connection.status().blocked(),
        "the publisher is still blocked"
    );

    clear_memory_alarm(&server).await;
    assert_eq!(next_block_notice(&mut events).await, BlockNotice::Unblocked);
    publish(&publisher_channel, "", "drain", b"after the alarm").await;
    assert_eq!(next_delivery(&mut consumer).await.data, b"after the alarm");
    consumer_connection.close(200, "bye".into()).await.unwrap();
    publisher_connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// Publishes of `BODY_BYTES` each, whole frames only, so a writer stopped
/// between two chunks leaves the stream well framed.
fn publish_chunk(queue: &str, publishes: usize) -> Vec<u8> {
    let body = vec![7u8; IGNORING_BODY_BYTES];
    let mut chunk = BytesMut::new();
    for _ in 0..publishes {
        encode_control(
            &mut chunk,
            1,
            &AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
                exchange: "".into(),
                routing_key: queue.into(),
                mandatory: false,
                immediate: false,
            })),
        );
        chunk.extend_from_slice(&RawClient::frame_bytes(
            FrameType::Header as u8,
            1,
            &RawClient::content_header_payload(IGNORING_BODY_BYTES as u64),
            FRAME_END,
        ));
        chunk.extend_from_slice(&RawClient::frame_bytes(
            FrameType::Body as u8,
            1,
            &body,
            FRAME_END,
        ));
    }
    chunk.to_vec()
}

/// Waits until a writer the broker stopped reading makes no progress for
/// a while; returns the bytes it got through.
async fn wait_for_stall<T>(
    written_bytes: &AtomicUsize,
    writer: &tokio::task::JoinHandle<T>,
) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut last = usize::MAX;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = written_bytes.load(Ordering::Acquire);
        if now == last {
            return last;
        }
        last = now;
        assert!(
            tokio::time::Instant::now() < deadline && !writer.is_finished(),
            "the writer never stalled: {now} bytes written"
        );
    }
}

const IGNORING_BODY_BYTES: usize = 4096;
const IGNORING_PUBLISHES_PER_CHUNK: usize = 16;
/// Far more than socket buffers hold: a broker that kept reading would let
/// the writer get through all of it.
const IGNORING_OFFERED_BYTES_MAX: usize = 256 << 20;
/// What the process's resident memory may grow by in a second of the
/// ignored client trying to write, against the megabytes a second it would
/// offer if read.
const IGNORING_RESIDENT_GROWTH_MAX_BYTES: u64 = 4 << 20;

/// A publisher that ignores connection.blocked and keeps writing is simply
/// not read: its writes stall once the socket buffers are full, nothing of
/// it reaches a queue or the broker's memory, and it is not disconnected.
/// Once the alarm clears, everything it wrote is taken.
#[tokio::test]
async fn alarms_publisher_ignoring_the_block_is_not_read_nor_disconnected() {
    let server = TestServer::start().await;
    let mut client = RawClient::open(server.address).await;
    client.open_channel(1).await;
    client.send_method(1, raw_declare("ignored")).await;
    client.read_method().await; // declare-ok
    set_memory_alarm(&server).await;

    let chunk = publish_chunk("ignored", IGNORING_PUBLISHES_PER_CHUNK);
    let chunk_bytes = chunk.len();
    let written_bytes = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let written_bytes = Arc::clone(&written_bytes);
        let stop = Arc::clone(&stop);
        async move {
            while !stop.load(Ordering::Acquire)
                && written_bytes.load(Ordering::Acquire) < IGNORING_OFFERED_BYTES_MAX
            {
                client.send(&chunk).await;
                written_bytes.fetch_add(chunk.len(), Ordering::AcqRel);
            }
            client
        }
    });

    let stalled_at = wait_for_stall(&written_bytes, &writer).await;
    assert!(stalled_at < IGNORING_OFFERED_BYTES_MAX);
    // While the client keeps trying, the broker's memory stays put: it holds
    // at most one read of the socket. (The bound leaves room for the other
    // tests of this binary, which run alongside in the same process.)
    let resident_at_stall = resident_bytes().unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let grown = resident_bytes().unwrap().saturating_sub(resident_at_stall);
    assert!(
        grown < IGNORING_RESIDENT_GROWTH_MAX_BYTES,
        "resident memory grew by {grown} bytes while the client kept writing"
    );
    assert_eq!(written_bytes.load(Ordering::Acquire), stalled_at);
    // At most the publishes of the read that met the alarm got in.
    let message_bytes = IGNORING_BODY_BYTES + 64;
    let taken = message_count(&server, "ignored").await as usize;
    assert!(
        taken <= READ_BUFFER_MAX_BYTES / message_bytes + 1,
        "{taken} publishes taken while blocked"
    );

    clear_memory_alarm(&server).await;
    stop.store(true, Ordering::Release);
    let mut client = tokio::time::timeout(ALARM_TIMEOUT, writer)
        .await
        .expect("the writer finishes once the broker reads again")
        .unwrap();
    let published =
        written_bytes.load(Ordering::Acquire) / chunk_bytes * IGNORING_PUBLISHES_PER_CHUNK;
    // Still connected: it hears blocked, then unblocked, and everything it
    // wrote is in the queue.
    let mut notices = Vec::new();
    while notices.len() < 2 {
        match client.read_method().await {
            (0, Method::Control(AMQPClass::Connection(connection::AMQPMethod::Blocked(_)))) => {
                notices.push("blocked")
            }
            (0, Method::Control(AMQPClass::Connection(connection::AMQPMethod::Unblocked(_)))) => {
                notices.push("unblocked")
            }
            other => panic!("expected connection.blocked/unblocked, got {other:?}"),
        }
    }
    assert_eq!(notices, ["blocked", "unblocked"]);
    client.send_method(1, raw_declare("ignored")).await;
    match client.read_method().await {
        (1, Method::Control(AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok)))) => {
            assert_eq!(ok.message_count as usize, published);
        }
        other => panic!("expected queue.declare-ok, got {other:?}"),
    }
    server.stop().await;
}

/// A blocked connection is not read, so the client's heartbeats are not
/// either (lapin even stops sending them while blocked): as RabbitMQ pauses
/// its heartbeat monitor, the broker must not take the silence for a dead
/// peer.
#[tokio::test]
async fn alarms_heartbeats_do_not_close_a_blocked_connection() {
    const HEARTBEAT_SECS: u16 = 1;
    let server = TestServer::start_with(|config| config.heartbeat_secs = HEARTBEAT_SECS).await;
    let connection = lapin::Connection::connect(
        &format!("{}?heartbeat={HEARTBEAT_SECS}", server.uri()),
        lapin::ConnectionProperties::default(),
    )
    .await
    .unwrap();
    assert_eq!(connection.configuration().heartbeat(), HEARTBEAT_SECS);
    let mut events = Box::pin(connection.events_listener());
    let channel = connection.create_channel().await.unwrap();
    declare(&channel, "heartbeat").await;
    set_memory_alarm(&server).await;
    publish(&channel, "", "heartbeat", b"meets the alarm").await;
    assert_eq!(
        next_block_notice(&mut events).await,
        BlockNotice::Blocked("low on memory".to_owned())
    );
    // Several heartbeat intervals; the broker's timeout is two of them.
    tokio::time::sleep(Duration::from_millis(3500) * HEARTBEAT_SECS as u32).await;
    assert!(connection.status().connected(), "still open while blocked");

    clear_memory_alarm(&server).await;
    assert_eq!(next_block_notice(&mut events).await, BlockNotice::Unblocked);
    publish(&channel, "", "heartbeat", b"after the alarm").await;
    // A round trip on the same channel: the connection is alive both ways.
    let queue = declare(&channel, "heartbeat").await;
    assert_eq!(queue.message_count(), 2);
    // And it stays so once heartbeats are read again.
    tokio::time::sleep(Duration::from_millis(2500) * HEARTBEAT_SECS as u32).await;
    assert!(connection.status().connected());
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

/// A large message whose publish began before the memory alarm is not read
/// on past it: the body frames of a publish under way stop at the alarm as
/// publishes do, so bodies of any size cannot carry memory past the bound.
#[tokio::test]
async fn alarms_body_of_a_large_message_under_way_is_not_read_past_the_alarm() {
    const BODY_BYTES: usize = 100 << 20;
    const FRAME_BODY_BYTES: usize = 128 * 1024 - 8;
    let server = TestServer::start().await;
    let mut client = RawClient::open(server.address).await;
    client.open_channel(1).await;
    client.send_method(1, raw_declare("large")).await;
    client.read_method().await; // declare-ok
    client
        .send_method(
            1,
            AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
                exchange: "".into(),
                routing_key: "large".into(),
                mandatory: false,
                immediate: false,
            })),
        )
        .await;
    client.send_content_header(1, BODY_BYTES as u64).await;
    let frame = RawClient::frame_bytes(
        FrameType::Body as u8,
        1,
        &vec![7u8; FRAME_BODY_BYTES],
        FRAME_END,
    );
    // A first part of the body goes in before the alarm.
    for _ in 0..8 {
        client.send(&frame).await;
    }
    // Read and handled before the alarm, so that what follows is the body
    // of a publish already under way.
    tokio::time::sleep(Duration::from_millis(300)).await;
    set_memory_alarm(&server).await;

    let written_bytes = Arc::new(AtomicUsize::new(0));
    let frames = BODY_BYTES / FRAME_BODY_BYTES - 8;
    let writer = tokio::spawn({
        let written_bytes = Arc::clone(&written_bytes);
        async move {
            for _ in 0..frames {
                client.send(&frame).await;
                written_bytes.fetch_add(FRAME_BODY_BYTES, Ordering::AcqRel);
            }
            client
        }
    });
    // The writer stalls: what it sent is not read.
    let last = wait_for_stall(&written_bytes, &writer).await;
    assert!(
        last < BODY_BYTES / 4,
        "{last} bytes of the body were taken past the alarm"
    );
    clear_memory_alarm(&server).await;
    let _client = tokio::time::timeout(ALARM_TIMEOUT, writer)
        .await
        .expect("the rest of the body is read once the alarm clears")
        .unwrap();
    server.stop().await;
}
