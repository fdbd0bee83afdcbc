//! Frame-level protocol abuse over real TCP, answered the way RabbitMQ 3.10
//! answers it (rabbit_reader.erl, rabbit_command_assembler.erl,
//! rabbit_channel.erl).

mod support;

use std::time::Duration;

use bytes::BytesMut;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable as LapinTable;
use lapin::{Connection, ConnectionProperties};
use sluice_server::config::Config;
use sluice_wire::amq_protocol::protocol::{channel, connection, queue, AMQPClass};
use sluice_wire::amq_protocol::types::FieldTable;
use sluice_wire::encode::encode_control;
use sluice_wire::frame::{FrameType, FRAME_END};
use sluice_wire::method::{decode_method, Method};
use support::raw::{channel_close_reply, close_reply, RawClient};
use support::TestServer;

const METHOD: u8 = FrameType::Method as u8;
const HEADER: u8 = FrameType::Header as u8;
const BODY: u8 = FrameType::Body as u8;
const HEARTBEAT: u8 = FrameType::Heartbeat as u8;

/// Opens a connection with channel 1 open.
async fn open_channel_one(server: &TestServer) -> RawClient {
    let mut client = RawClient::open(server.address).await;
    client.open_channel(1).await;
    client
}

/// Expects connection.close with `code`, and that the socket then closes.
async fn expect_connection_error(client: &mut RawClient, code: u16) -> String {
    let close = client.expect_connection_close().await;
    assert_eq!(close.reply_code, code, "{close:?}");
    assert!(
        client.closed_within(Duration::from_secs(2)).await,
        "socket still open after connection.close {code}"
    );
    close.reply_text.as_str().to_owned()
}

fn declare(name: &str, passive: bool) -> AMQPClass {
    AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
        queue: name.into(),
        passive,
        durable: false,
        exclusive: false,
        auto_delete: false,
        nowait: false,
        arguments: FieldTable::default(),
    }))
}

/// The message count of `name`, seen through lapin on a fresh connection.
async fn message_count(server: &TestServer, name: &str) -> u32 {
    let connection = Connection::connect(&server.uri(), ConnectionProperties::default())
        .await
        .expect("the broker still accepts connections");
    let channel = connection.create_channel().await.unwrap();
    let queue = channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            LapinTable::default(),
        )
        .await
        .unwrap();
    connection.close(200, "bye".into()).await.unwrap();
    queue.message_count()
}

// ----- framing errors: 501 -----

#[tokio::test]
async fn frames_bad_frame_end_is_frame_error() {
    let server = TestServer::start().await;
    let mut client = open_channel_one(&server).await;
    let bytes = RawClient::frame_bytes(BODY, 1, b"abc", 0x00);
    client.send(&bytes).await;
    let text = expect_connection_error(&mut client, 501).await;
    assert!(text.starts_with("FRAME_ERROR - "), "{text}");
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn frames_larger_than_frame_max_is_frame_error() {
    let server = TestServer::start_with(|config| config.frame_max = 4096).await;
    // RabbitMQ tolerates frames up to 8 bytes over frame_max (clients are
    // often off by the frame overhead): a body payload of frame_max bytes
    // is accepted.
    let mut client = open_channel_one(&server).await;
    client.send_publish(1, "", "nowhere", false).await;
    client.send_content_header(1, 4096).await;
    client.send_body(1, &[7u8; 4096]).await;
    client.open_channel(2).await;
    // One byte more is a frame error, announced by the size field alone.
    client.send(&[BODY, 0, 1, 0, 0, 0x10, 0x01]).await;
    let text = expect_connection_error(&mut client, 501).await;
    assert!(text.starts_with("FRAME_ERROR - "), "{text}");
    // A size field near 4 GiB is refused before anything is buffered.
    let mut client = open_channel_one(&server).await;
    client.send(&[METHOD, 0, 1, 0xff, 0xff, 0xff, 0xf0]).await;
    expect_connection_error(&mut client, 501).await;
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn frames_unknown_frame_type_is_frame_error() {
    let server = TestServer::start().await;
    for frame_type in [0u8, 4, 9, 0xff] {
        let mut client = open_channel_one(&server).await;
        client.send_frame(frame_type, 1, b"xyz").await;
        let text = expect_connection_error(&mut client, 501).await;
        assert!(text.starts_with("FRAME_ERROR - "), "{text}");
    }
    server.stop().await;
}

#[tokio::test]
async fn frames_heartbeat_with_payload_is_frame_error() {
    let server = TestServer::start().await;
    let mut client = open_channel_one(&server).await;
    client.send_frame(HEARTBEAT, 0, b"x").await;
    expect_connection_error(&mut client, 501).await;
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn frames_heartbeat_on_a_channel_is_unexpected_frame() {
    // The specification asks for 501; RabbitMQ answers 505 and so do we.
    let server = TestServer::start().await;
    let mut client = open_channel_one(&server).await;
    client.send_frame(HEARTBEAT, 1, b"").await;
    let text = expect_connection_error(&mut client, 505).await;
    assert!(text.starts_with("UNEXPECTED_FRAME - "), "{text}");
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn frames_truncated_or_malformed_method_is_frame_error() {
    let server = TestServer::start().await;
    let payloads: [&[u8]; 4] = [
        // queue.declare cut inside its queue name
        &[0, 50, 0, 10, 0, 0, 5, b'a'],
        // basic.publish cut inside its exchange name
        &[0, 60, 0, 40, 0, 0, 9, b'x'],
        // basic.ack without its delivery tag
        &[0, 60, 0, 80, 0, 0],
        // not even a class and method id
        &[0, 50],
    ];
    for payload in payloads {
        let mut client = open_channel_one(&server).await;
        client.send_frame(METHOD, 1, payload).await;
        let text = expect_connection_error(&mut client, 501).await;
        assert!(text.starts_with("FRAME_ERROR - "), "{payload:?}: {text}");
    }
    server.stop().await;
}

#[tokio::test]
async fn frames_unknown_class_or_method_is_not_implemented() {
    // RabbitMQ's reader crashes on an unknown method id and drops the socket
    // without a word; we send 540 NOT_IMPLEMENTED instead (see the report).
    let server = TestServer::start().await;
    for payload in [
        &[0u8, 99, 0, 10][..],
        &[0, 50, 0, 99],
        &[0, 60, 0, 200, 1, 2],
    ] {
        let mut client = open_channel_one(&server).await;
        client.send_frame(METHOD, 1, payload).await;
        let close = client.expect_connection_close().await;
        assert_eq!(close.reply_code, 540, "{payload:?}: {close:?}");
        assert_eq!(
            (close.class_id, close.method_id),
            (
                u16::from_be_bytes([payload[0], payload[1]]),
                u16::from_be_bytes([payload[2], payload[3]])
            )
        );
    }
    server.stop().await;
}

// ----- content sequencing: 505 -----

#[tokio::test]
async fn frames_content_header_without_publish_is_unexpected_frame() {
    let server = TestServer::start().await;
    let mut client = open_channel_one(&server).await;
    client.send_content_header(1, 3).await;
    let text = expect_connection_error(&mut client, 505).await;
    assert!(text.starts_with("UNEXPECTED_FRAME - "), "{text}");
    // A body frame with no publish at all.
    let mut client = open_channel_one(&server).await;
    client.send_body(1, b"abc").await;
    expect_connection_error(&mut client, 505).await;
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn frames_method_while_content_is_expected_is_unexpected_frame() {
    let server = TestServer::start().await;
    // After the header, while the body is due.
    let mut client = open_channel_one(&server).await;
    client.send_publish(1, "", "q", false).await;
    client.send_content_header(1, 10).await;
    client.send_body(1, b"12345").await;
    client.send_method(1, declare("q", false)).await;
    let close = client.expect_connection_close().await;
    assert_eq!(close.reply_code, 505, "{close:?}");
    assert_eq!(
        close.reply_text.as_str(),
        "UNEXPECTED_FRAME - expected content body, got non content body frame instead"
    );
    // As RabbitMQ, the close names the publish that was cut short.
    assert_eq!((close.class_id, close.method_id), (60, 40));
    // Before the header.
    let mut client = open_channel_one(&server).await;
    client.send_publish(1, "", "q", false).await;
    client.send_method(1, declare("q", false)).await;
    assert_eq!(
        expect_connection_error(&mut client, 505).await,
        "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead"
    );
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn frames_content_on_channel_zero_is_unexpected_frame() {
    let server = TestServer::start().await;
    let mut client = RawClient::open(server.address).await;
    client.send_content_header(0, 3).await;
    expect_connection_error(&mut client, 505).await;
    drop(client);
    server.stop().await;
}

// ----- channel state: 504 -----

#[tokio::test]
async fn frames_method_on_a_channel_never_opened_is_channel_error() {
    let server = TestServer::start().await;
    let mut client = RawClient::open(server.address).await;
    client.send_method(3, declare("q", false)).await;
    let close = client.expect_connection_close().await;
    assert_eq!(
        close_reply(&close),
        (504, "CHANNEL_ERROR - expected 'channel.open'".to_owned())
    );
    assert!(client.closed_within(Duration::from_secs(2)).await);
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn frames_content_on_a_channel_never_opened_is_unexpected_frame() {
    let server = TestServer::start().await;
    let mut client = RawClient::open(server.address).await;
    client.send_body(3, b"abc").await;
    expect_connection_error(&mut client, 505).await;
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn frames_second_channel_open_is_channel_error() {
    let server = TestServer::start().await;
    let mut client = open_channel_one(&server).await;
    client
        .send_method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
        )
        .await;
    let close = client.expect_connection_close().await;
    assert_eq!(
        close_reply(&close),
        (504, "CHANNEL_ERROR - second 'channel.open' seen".to_owned())
    );
    assert_eq!((close.class_id, close.method_id), (20, 10));
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn frames_non_connection_method_on_channel_zero_is_channel_error() {
    let server = TestServer::start().await;
    let mut client = RawClient::open(server.address).await;
    client.send_method(0, declare("q", false)).await;
    let close = client.expect_connection_close().await;
    assert_eq!(
        close_reply(&close),
        (
            504,
            "CHANNEL_ERROR - unexpected method in connection state running".to_owned()
        )
    );
    drop(client);
    server.stop().await;
}

// ----- publishing limits -----

#[tokio::test]
async fn frames_publish_with_immediate_is_not_implemented() {
    let server = TestServer::start().await;
    let mut client = open_channel_one(&server).await;
    client.send_publish(1, "", "q", true).await;
    client.send_content_header(1, 2).await;
    client.send_body(1, b"hi").await;
    let close = client.expect_connection_close().await;
    assert_eq!(
        close_reply(&close),
        (540, "NOT_IMPLEMENTED - immediate=true".to_owned())
    );
    assert_eq!((close.class_id, close.method_id), (60, 40));
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn frames_message_over_max_message_size_closes_the_channel() {
    assert_eq!(Config::default().max_message_size, 128 * 1024 * 1024);
    let server = TestServer::start_with(|config| config.max_message_size = 1024).await;
    let mut client = open_channel_one(&server).await;
    client.send_method(1, declare("limited", false)).await;
    client.read_method().await; // declare-ok
    client.publish(1, "limited", &[1u8; 1024]).await;
    client.publish(1, "limited", &[2u8; 2000]).await;
    let close = client.expect_channel_close(1).await;
    assert_eq!(
        channel_close_reply(&close),
        (
            406,
            "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1024"
                .to_owned()
        )
    );
    assert_eq!((close.class_id, close.method_id), (60, 40));
    assert_eq!(message_count(&server, "limited").await, 1);
    drop(client);
    server.stop().await;
}

/// The client closes a channel just as the server closes it for an error:
/// each side answers the other's close, and the connection carries on, as
/// in RabbitMQ (the Java client always answers the server's close).
#[tokio::test]
async fn frames_crossing_channel_closes_leave_the_connection_open() {
    let server = TestServer::start().await;
    let mut client = open_channel_one(&server).await;
    // A channel error (404) and the client's own close, sent together.
    client.send_method(1, declare("missing", true)).await;
    client
        .send_method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::Close(channel::Close {
                reply_code: 200,
                reply_text: "bye".into(),
                class_id: 0,
                method_id: 0,
            })),
        )
        .await;
    let close = client.expect_channel_close(1).await;
    assert_eq!(close.reply_code, 404);
    match client.read_method().await {
        (1, Method::Control(AMQPClass::Channel(channel::AMQPMethod::CloseOk(_)))) => {}
        other => panic!("expected close-ok for the client's close, got {other:?}"),
    }
    // The client answers the server's close, as the specification asks.
    client
        .send_method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
        )
        .await;
    // Still connected: channel 1 opens again and works.
    client.open_channel(1).await;
    client
        .send_method(1, declare("after-crossing", false))
        .await;
    match client.read_method().await {
        (1, Method::Control(AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok)))) => {
            assert_eq!(ok.queue.as_str(), "after-crossing");
        }
        other => panic!("expected declare-ok, got {other:?}"),
    }
    drop(client);
    server.stop().await;
}

// ----- robustness -----

/// xorshift64*: deterministic bytes without a dependency.
struct Bytes64(u64);

impl Bytes64 {
    fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let value = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
            chunk.copy_from_slice(&value[..chunk.len()]);
        }
    }

    fn below(&mut self, bound: usize) -> usize {
        let mut octets = [0u8; 8];
        self.fill(&mut octets);
        (u64::from_le_bytes(octets) % bound as u64) as usize
    }
}

/// Class and method ids the broker knows, so noise reaches argument parsing.
const KNOWN_METHODS: [(u16, u16); 14] = [
    (10, 50),
    (20, 10),
    (20, 40),
    (40, 10),
    (40, 30),
    (50, 10),
    (50, 20),
    (60, 10),
    (60, 20),
    (60, 40),
    (60, 70),
    (60, 80),
    (85, 10),
    (90, 10),
];

/// Sends a few well-framed frames of random content, then connection.close,
/// and expects the broker to finish the connection promptly either way.
async fn well_framed_noise(address: std::net::SocketAddr, seed: u64) {
    let mut client = RawClient::open(address).await;
    client.open_channel(1).await;
    let mut random = Bytes64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    for _ in 0..6 {
        let frame_type = [METHOD, METHOD, METHOD, HEADER, BODY, HEARTBEAT][random.below(6)];
        let channel = random.below(3) as u16;
        let mut payload = vec![0u8; random.below(80)];
        random.fill(&mut payload);
        if frame_type == METHOD && payload.len() >= 4 && random.below(4) != 0 {
            let (class_id, method_id) = KNOWN_METHODS[random.below(KNOWN_METHODS.len())];
            payload[..2].copy_from_slice(&class_id.to_be_bytes());
            payload[2..4].copy_from_slice(&method_id.to_be_bytes());
        }
        if frame_type == HEADER && payload.len() >= 14 {
            payload[..2].copy_from_slice(&60u16.to_be_bytes());
        }
        let bytes = RawClient::frame_bytes(frame_type, channel, &payload, FRAME_END);
        client.send_lenient(&bytes).await;
    }
    let mut close = BytesMut::new();
    encode_control(
        &mut close,
        0,
        &AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
            reply_code: 200,
            reply_text: "bye".into(),
            class_id: 0,
            method_id: 0,
        })),
    );
    client.send_lenient(&close).await;
    // close-ok, the broker's own connection.close, or the socket closing:
    // anything but silence.
    loop {
        match client.read_frame_within(Duration::from_secs(4)).await {
            Ok(None) => return,
            Ok(Some(frame)) if frame.frame_type == FrameType::Method && frame.channel == 0 => {
                if let Ok(Method::Control(AMQPClass::Connection(
                    connection::AMQPMethod::CloseOk(_) | connection::AMQPMethod::Close(_),
                ))) = decode_method(&frame.payload)
                {
                    return;
                }
            }
            Ok(Some(_)) => {}
            Err(_) => panic!("seed {seed}: the broker went silent"),
        }
    }
}

#[tokio::test]
async fn frames_random_bytes_never_hang_or_crash_the_broker() {
    let server = TestServer::start().await;
    let mut tasks = Vec::new();
    for seed in 1..=6u64 {
        let address = server.address;
        tasks.push(tokio::spawn(async move {
            let mut client = RawClient::open(address).await;
            if seed % 2 == 0 {
                client.open_channel(1).await;
            }
            let mut random = Bytes64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut chunk = vec![0u8; 16 * 1024];
            // Half the connections start with a plausible frame header on
            // channel 1, so the garbage reaches past the frame splitter.
            if seed % 3 == 0 {
                client.send_lenient(&[METHOD, 0, 1, 0, 0, 0, 40]).await;
            }
            for _ in 0..20 {
                random.fill(&mut chunk);
                client.send_lenient(&chunk).await;
            }
            // Whatever the broker made of it, it ends the connection.
            assert!(
                client.closed_within(Duration::from_secs(4)).await,
                "seed {seed}: connection not closed"
            );
        }));
    }
    for seed in 1..=240u64 {
        tasks.push(tokio::spawn(well_framed_noise(server.address, seed)));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // A fresh client is still served.
    let connection = Connection::connect(&server.uri(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_declare(
            "after-noise".into(),
            QueueDeclareOptions::default(),
            LapinTable::default(),
        )
        .await
        .unwrap();
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn frames_client_vanishing_mid_publish_enqueues_nothing() {
    let server = TestServer::start().await;
    let mut client = open_channel_one(&server).await;
    client.send_method(1, declare("half", false)).await;
    client.read_method().await; // declare-ok
    client.publish(1, "half", b"whole").await;
    client.send_publish(1, "", "half", false).await;
    client.send_content_header(1, 1000).await;
    client.send_body(1, &[0u8; 500]).await;
    // Half a frame too, then the socket goes away.
    client.send(&[BODY, 0, 1, 0, 0, 1, 0xf4, 1, 2, 3]).await;
    drop(client);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(message_count(&server, "half").await, 1);
    server.stop().await;
}

/// pika writes a publish's method, header and body frames with separate
/// syscalls; the confirm must still come when the last frame arrives in a
/// later read than the method.
#[tokio::test]
async fn frames_confirm_arrives_when_content_comes_in_separate_reads() {
    let server = TestServer::start().await;
    let mut client = open_channel_one(&server).await;
    client.send_method(1, declare("split", false)).await;
    client.read_method().await; // declare-ok
    client
        .send_method(
            1,
            AMQPClass::Confirm(
                sluice_wire::amq_protocol::protocol::confirm::AMQPMethod::Select(
                    sluice_wire::amq_protocol::protocol::confirm::Select { nowait: false },
                ),
            ),
        )
        .await;
    client.read_method().await; // select-ok
    client.send_publish(1, "", "split", false).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    client.send_content_header(1, 5).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    client.send_body(1, b"hello").await;
    let (channel_id, method) = client.read_method().await;
    assert_eq!(channel_id, 1);
    assert!(
        matches!(method, Method::Ack(ack) if ack.delivery_tag == 1 && !ack.multiple),
        "expected basic.ack 1, got {method:?}"
    );
    server.stop().await;
}
