//! Connection-level behaviour over real TCP: protocol header, start, login,
//! tune, vhost, heartbeats and closing, compared with what RabbitMQ 3.10
//! sends (rabbit_reader.erl).

mod support;

use std::time::{Duration, Instant};

use lapin::{Connection, ConnectionProperties};
use sluice_wire::amq_protocol::protocol::{channel, connection, queue, AMQPClass};
use sluice_wire::amq_protocol::types::{AMQPValue, FieldTable};
use sluice_wire::frame::{FrameType, PROTOCOL_HEADER};
use sluice_wire::method::Method;
use support::raw::{channel_close_reply, close_reply, Handshake, RawClient};
use support::TestServer;

const LOGIN_REFUSED_PLAIN: &str = "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile.";

fn text(value: Option<&AMQPValue>) -> String {
    match value {
        Some(AMQPValue::LongString(value)) => String::from_utf8_lossy(value.as_bytes()).into(),
        Some(AMQPValue::ShortString(value)) => value.as_str().to_owned(),
        other => panic!("expected a string, got {other:?}"),
    }
}

// ----- protocol header -----

#[tokio::test]
async fn connection_bad_protocol_header_is_answered_with_0_9_1_then_closed() {
    let server = TestServer::start().await;
    for header in [
        &b"AMQP\x00\x00\x09\x00"[..],
        b"HTTP/1.1",
        b"AMQP\x01\x01\x00\x0a",
    ] {
        let mut client = RawClient::connect(server.address).await;
        client.send(header).await;
        assert_eq!(
            client.read_exact_bytes(8).await,
            PROTOCOL_HEADER,
            "{header:?}"
        );
        assert!(
            client.closed_within(Duration::from_secs(2)).await,
            "socket stays open after bad header {header:?}"
        );
    }
    server.stop().await;
}

// ----- connection.start -----

#[tokio::test]
async fn connection_start_advertises_rabbitmq_capabilities_and_mechanisms() {
    let server = TestServer::start().await;
    let mut client = RawClient::connect(server.address).await;
    let start = client.start().await;
    assert_eq!((start.version_major, start.version_minor), (0, 9));
    let properties = start.server_properties.inner();
    // What clients and their suites check to expect RabbitMQ's behaviour.
    assert_eq!(text(properties.get("product")), "RabbitMQ");
    assert_eq!(text(properties.get("version")), "3.10.8");
    assert_eq!(
        text(properties.get("platform")),
        format!("Sluice {}", env!("CARGO_PKG_VERSION"))
    );
    for key in [
        "version",
        "platform",
        "cluster_name",
        "copyright",
        "information",
    ] {
        assert!(
            properties.contains_key(key),
            "server property {key} missing"
        );
    }
    let Some(AMQPValue::FieldTable(capabilities)) = properties.get("capabilities") else {
        panic!("no capabilities table");
    };
    for capability in [
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "consumer_priorities",
        "authentication_failure_close",
        "per_consumer_qos",
        "direct_reply_to",
    ] {
        assert_eq!(
            capabilities.inner().get(capability),
            Some(&AMQPValue::Boolean(true)),
            "capability {capability}"
        );
    }
    let mechanisms = String::from_utf8_lossy(start.mechanisms.as_bytes()).into_owned();
    let mechanisms: Vec<&str> = mechanisms.split(' ').collect();
    assert!(mechanisms.contains(&"PLAIN"), "{mechanisms:?}");
    assert!(mechanisms.contains(&"AMQPLAIN"), "{mechanisms:?}");
    assert_eq!(start.locales.as_bytes(), b"en_US");
    drop(client);
    server.stop().await;
}

// ----- authentication -----

#[tokio::test]
async fn connection_plain_and_amqplain_logins_succeed() {
    let server = TestServer::start().await;
    RawClient::open_with(server.address, Handshake::plain("guest", "guest")).await;
    RawClient::open_with(server.address, Handshake::amqplain("guest", "guest")).await;
    // lapin with its AMQPLAIN option.
    let uri = format!("{}?auth_mechanism=amqplain", server.uri());
    let connection = Connection::connect(&uri, ConnectionProperties::default())
        .await
        .expect("AMQPLAIN login through lapin");
    assert!(connection.status().connected());
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn connection_wrong_password_or_unknown_user_is_access_refused() {
    let server = TestServer::start().await;
    for handshake in [
        Handshake::plain("guest", "wrong"),
        Handshake::plain("nobody", "guest"),
    ] {
        let mut client = RawClient::connect(server.address).await;
        client.start().await;
        client.send_start_ok(&handshake).await;
        let close = client.expect_connection_close().await;
        assert_eq!(close_reply(&close), (403, LOGIN_REFUSED_PLAIN.to_owned()));
        assert_eq!((close.class_id, close.method_id), (0, 0));
        assert!(client.closed_within(Duration::from_secs(1)).await);
    }
    let mut client = RawClient::connect(server.address).await;
    client.start().await;
    client
        .send_start_ok(&Handshake::amqplain("guest", "wrong"))
        .await;
    let close = client.expect_connection_close().await;
    assert_eq!(
        close_reply(&close),
        (
            403,
            "ACCESS_REFUSED - Login was refused using authentication mechanism AMQPLAIN. For details see the broker logfile.".to_owned()
        )
    );
    // A real client sees the refusal as an error, not a hang.
    let uri = format!("amqp://guest:wrong@{}/%2f", server.address);
    assert!(Connection::connect(&uri, ConnectionProperties::default())
        .await
        .is_err());
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn connection_login_refused_without_capability_closes_the_socket_silently() {
    // RabbitMQ sends connection.close on a failed login only to clients that
    // announce authentication_failure_close; older clients expect the socket
    // to close.
    let server = TestServer::start().await;
    let mut client = RawClient::connect(server.address).await;
    client.start().await;
    let handshake = Handshake {
        authentication_failure_close: false,
        ..Handshake::plain("guest", "wrong")
    };
    client.send_start_ok(&handshake).await;
    let frame = client.read_frame().await;
    assert!(
        frame.is_none(),
        "expected the socket to close, got {frame:?}"
    );
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn connection_unknown_mechanism_is_command_invalid() {
    let server = TestServer::start().await;
    let mut client = RawClient::connect(server.address).await;
    client.start().await;
    let handshake = Handshake {
        mechanism: "EXTERNAL".to_owned(),
        response: Vec::new(),
        ..Handshake::default()
    };
    client.send_start_ok(&handshake).await;
    let close = client.expect_connection_close().await;
    assert_eq!(
        close_reply(&close),
        (
            503,
            "COMMAND_INVALID - unknown authentication mechanism 'EXTERNAL'".to_owned()
        )
    );
    drop(client);
    server.stop().await;
}

// ----- tune -----

#[tokio::test]
async fn connection_tune_proposes_configured_limits() {
    let server = TestServer::start().await;
    let mut client = RawClient::connect(server.address).await;
    client.start().await;
    let tune = client.start_ok(&Handshake::default()).await;
    assert_eq!(
        (tune.channel_max, tune.frame_max, tune.heartbeat),
        (2047, 131_072, 60)
    );
    // Stopping does not wait for a connection stuck in its handshake.
    let started = Instant::now();
    server.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "stop waited {:?} for a handshaking client",
        started.elapsed()
    );
    assert!(client.closed_within(Duration::from_secs(1)).await);

    let server = TestServer::start_with(|config| {
        config.frame_max = 8192;
        config.channel_max = 16;
        config.heartbeat_secs = 5;
    })
    .await;
    let mut client = RawClient::connect(server.address).await;
    client.start().await;
    let tune = client.start_ok(&Handshake::default()).await;
    assert_eq!(
        (tune.channel_max, tune.frame_max, tune.heartbeat),
        (16, 8192, 5)
    );
    drop(client);
    // Real clients take the server's values.
    let connection = Connection::connect(&server.uri(), ConnectionProperties::default())
        .await
        .unwrap();
    assert_eq!(connection.configuration().frame_max(), 8192);
    assert_eq!(connection.configuration().channel_max(), 16);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn connection_tune_ok_lower_limits_are_used() {
    let server = TestServer::start().await;
    let handshake = Handshake {
        frame_max: Some(4096),
        channel_max: Some(10),
        ..Handshake::default()
    };
    let (mut client, _) = RawClient::open_with(server.address, handshake.clone()).await;
    client.open_channel(10).await;
    // Channel ids above the negotiated channel_max are refused.
    client
        .send_method(
            11,
            AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
        )
        .await;
    let close = client.expect_connection_close().await;
    assert_eq!(
        close_reply(&close),
        (
            530,
            "NOT_ALLOWED - channel id 11 is above the negotiated channel_max 10".to_owned()
        )
    );
    assert_eq!((close.class_id, close.method_id), (20, 10));

    // A frame that fits the server's frame_max but not the negotiated one.
    let (mut client, _) = RawClient::open_with(server.address, handshake).await;
    client.open_channel(1).await;
    client.send_publish(1, "", "q", false).await;
    client.send_content_header(1, 5000).await;
    client.send_body(1, &[0u8; 4200]).await;
    let close = client.expect_connection_close().await;
    assert_eq!(close.reply_code, 501, "{close:?}");
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn connection_tune_ok_above_server_limits_is_not_allowed() {
    let server = TestServer::start().await;
    let cases = [
        (
            Some(200_000),
            None,
            "NOT_ALLOWED - negotiated frame_max = 200000 is higher than the maximum allowed value (131072)",
        ),
        (
            Some(1000),
            None,
            "NOT_ALLOWED - negotiated frame_max = 1000 is lower than the minimum allowed value (4096)",
        ),
        (
            Some(0),
            None,
            "NOT_ALLOWED - negotiated frame_max = 0 is higher than the maximum allowed value (131072)",
        ),
        (
            None,
            Some(4000),
            "NOT_ALLOWED - negotiated channel_max = 4000 is higher than the maximum allowed value (2047)",
        ),
        (
            None,
            Some(0),
            "NOT_ALLOWED - negotiated channel_max = 0 (no limit) is higher than the maximum allowed value (2047)",
        ),
    ];
    for (frame_max, channel_max, expected) in cases {
        let handshake = Handshake {
            frame_max,
            channel_max,
            ..Handshake::default()
        };
        let mut client = RawClient::connect(server.address).await;
        client.start().await;
        let tune = client.start_ok(&handshake).await;
        client.tune_ok_and_open(&handshake, tune).await;
        let close = client.expect_connection_close().await;
        assert_eq!(close_reply(&close), (530, expected.to_owned()));
        // RabbitMQ names connection.tune as the failing method.
        assert_eq!((close.class_id, close.method_id), (10, 30));
    }
    server.stop().await;
}

// ----- vhost -----

#[tokio::test]
async fn connection_open_to_missing_vhost_is_not_allowed() {
    let server = TestServer::start().await;
    let mut client = RawClient::connect(server.address).await;
    let handshake = Handshake {
        vhost: "nope".to_owned(),
        ..Handshake::default()
    };
    client.handshake_until_open(&handshake).await;
    let close = client.expect_connection_close().await;
    assert_eq!(
        close_reply(&close),
        (530, "NOT_ALLOWED - vhost nope not found".to_owned())
    );
    assert_eq!((close.class_id, close.method_id), (10, 40));
    assert!(client.closed_within(Duration::from_secs(1)).await);
    drop(client);
    server.stop().await;
}

/// A vhost name of 250 bytes makes "vhost … not found" longer than a short
/// string: the text is cut as RabbitMQ cuts it, where it used to panic the
/// connection's task and leave the client without an answer.
#[tokio::test]
async fn connection_open_to_a_long_missing_vhost_gets_a_cut_text() {
    let server = TestServer::start().await;
    let mut client = RawClient::connect(server.address).await;
    let handshake = Handshake {
        vhost: "v".repeat(250),
        ..Handshake::default()
    };
    client.handshake_until_open(&handshake).await;
    let close = client.expect_connection_close().await;
    let (code, text) = close_reply(&close);
    assert_eq!(code, 530);
    assert_eq!(text.len(), 255, "{text}");
    assert!(text.starts_with("NOT_ALLOWED - vhost vvv"), "{text}");
    assert!(text.ends_with("..."), "{text}");
    drop(client);
    server.stop().await;
}

// ----- heartbeats -----

#[tokio::test]
async fn connection_heartbeats_flow_and_keep_a_live_client_connected() {
    let server = TestServer::start_with(|config| config.heartbeat_secs = 1).await;
    let handshake = Handshake {
        heartbeat: 1,
        ..Handshake::default()
    };
    let (mut client, tune) = RawClient::open_with(server.address, handshake).await;
    assert_eq!(tune.heartbeat, 1);
    // Answer every heartbeat for 3 s: more than the 2 s the broker allows a
    // silent client, so the connection survives only because we talk.
    let started = Instant::now();
    let mut heartbeats = 0;
    while started.elapsed() < Duration::from_secs(3) {
        let frame = client
            .read_frame_within(Duration::from_millis(1500))
            .await
            .expect("the broker sends a heartbeat at least every second")
            .expect("connection stays open while we send heartbeats");
        assert_eq!(frame.frame_type, FrameType::Heartbeat);
        assert_eq!(frame.channel, 0);
        heartbeats += 1;
        client.send_frame(FrameType::Heartbeat as u8, 0, &[]).await;
    }
    assert!(heartbeats >= 3, "only {heartbeats} heartbeats in 3 s");
    client.open_channel(1).await;
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn connection_silent_client_is_disconnected_after_two_heartbeat_intervals() {
    let server = TestServer::start_with(|config| config.heartbeat_secs = 1).await;
    let handshake = Handshake {
        heartbeat: 1,
        ..Handshake::default()
    };
    let (mut client, _) = RawClient::open_with(server.address, handshake).await;
    let started = Instant::now();
    assert!(
        client.closed_within(Duration::from_millis(3500)).await,
        "silent client still connected after 3.5 s"
    );
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(1500),
        "disconnected too early: {elapsed:?}"
    );
    drop(client);
    server.stop().await;
}

// ----- closing -----

#[tokio::test]
async fn connection_client_close_is_answered_with_close_ok() {
    let server = TestServer::start().await;
    let mut client = RawClient::open(server.address).await;
    client.open_channel(1).await;
    client
        .send_method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
                reply_code: 200,
                reply_text: "bye".into(),
                class_id: 0,
                method_id: 0,
            })),
        )
        .await;
    match client.read_method().await {
        (0, Method::Control(AMQPClass::Connection(connection::AMQPMethod::CloseOk(_)))) => {}
        other => panic!("expected close-ok, got {other:?}"),
    }
    assert!(client.closed_within(Duration::from_secs(1)).await);
    // And through lapin and amqprs.
    let connection = Connection::connect(&server.uri(), ConnectionProperties::default())
        .await
        .unwrap();
    connection.close(200, "bye".into()).await.unwrap();
    let arguments = amqprs::connection::OpenConnectionArguments::new(
        &server.address.ip().to_string(),
        server.address.port(),
        "guest",
        "guest",
    );
    let connection = amqprs::connection::Connection::open(&arguments)
        .await
        .unwrap();
    connection.close().await.unwrap();
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn connection_server_shutdown_sends_connection_forced() {
    let server = TestServer::start().await;
    let mut client = RawClient::open(server.address).await;
    client.open_channel(1).await;
    let stopping = tokio::spawn(server.stop());
    let close = client.expect_connection_close().await;
    assert_eq!(
        close_reply(&close),
        (
            320,
            "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
                .to_owned()
        )
    );
    assert!(client.closed_within(Duration::from_secs(2)).await);
    tokio::time::timeout(Duration::from_secs(3), stopping)
        .await
        .expect("server stops")
        .unwrap();
}

#[tokio::test]
async fn connection_channel_close_is_answered_with_close_ok() {
    let server = TestServer::start().await;
    let mut client = RawClient::open(server.address).await;
    client.open_channel(1).await;
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
    match client.read_method().await {
        (1, Method::Control(AMQPClass::Channel(channel::AMQPMethod::CloseOk(_)))) => {}
        other => panic!("expected channel.close-ok, got {other:?}"),
    }
    // The id is free again.
    client.open_channel(1).await;
    drop(client);
    server.stop().await;
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

#[tokio::test]
async fn connection_frames_after_server_channel_close_are_ignored_until_close_ok() {
    let server = TestServer::start().await;
    let mut client = RawClient::open(server.address).await;
    client.open_channel(1).await;
    client.send_method(1, declare("missing", true)).await;
    let close = client.expect_channel_close(1).await;
    assert_eq!(
        channel_close_reply(&close),
        (
            404,
            "NOT_FOUND - no queue 'missing' in vhost '/'".to_owned()
        )
    );
    assert_eq!((close.class_id, close.method_id), (50, 10));
    // Until close-ok, everything on the channel is dropped: a declare, a
    // whole message, even a stray body frame.
    client.send_method(1, declare("ignored", false)).await;
    client.publish(1, "ignored", b"dropped").await;
    client.send_body(1, b"stray").await;
    client
        .send_method(
            1,
            AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
        )
        .await;
    // The next thing we hear is the open-ok of the reopened channel.
    client.open_channel(1).await;
    client.send_method(1, declare("ignored", true)).await;
    let close = client.expect_channel_close(1).await;
    assert_eq!(
        close.reply_code, 404,
        "the ignored declare created the queue"
    );
    drop(client);
    server.stop().await;
}

/// `handshake_timeout` bounds the whole handshake: a client that sends its
/// protocol header a byte at a time, each within the timeout, is still
/// dropped once the timeout has passed since it connected.
#[tokio::test]
async fn connection_handshake_timeout_is_a_deadline_not_an_idle_timer() {
    let server = TestServer::start_with(|config| config.handshake_timeout_ms = 600).await;
    let mut client = RawClient::connect(server.address).await;
    let began = Instant::now();
    let mut dropped_after = None;
    // A byte every 250 ms: each read comes well within the timeout.
    for byte in PROTOCOL_HEADER {
        client.send_lenient(&[byte]).await;
        if client.closed_within(Duration::from_millis(250)).await {
            dropped_after = Some(began.elapsed());
            break;
        }
    }
    let dropped_after = dropped_after.expect("dropped while still dribbling its header");
    assert!(
        dropped_after < Duration::from_millis(1500),
        "dropped only after {dropped_after:?}"
    );
    server.stop().await;
}

/// `connection_max`: past it a new connection is closed at once, and once
/// one closes there is room again.
#[tokio::test]
async fn connection_max_closes_connections_past_the_limit() {
    let server = TestServer::start_with(|config| config.connection_max = Some(2)).await;
    let uri = format!("amqp://guest:guest@{}/%2f", server.address);
    let connect = || Connection::connect(&uri, ConnectionProperties::default());
    let first = connect().await.expect("the first connects");
    let _second = connect().await.expect("the second connects");
    assert!(connect().await.is_err(), "the third is refused");
    first.close(200, "bye".into()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match connect().await {
            Ok(third) => {
                third.close(200, "bye".into()).await.unwrap();
                break;
            }
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("no room after a connection closed: {error}"),
        }
    }
    server.stop().await;
}
