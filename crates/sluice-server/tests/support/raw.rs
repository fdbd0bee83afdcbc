//! A raw-socket AMQP 0-9-1 client for tests that must send what no real
//! client would: bad headers, broken frames, half messages.
//!
//! Frames are written by hand or with `sluice_wire::encode::encode_control`,
//! and read back with `sluice_wire::frame::split_frame` and
//! `sluice_wire::method::decode_method`. Every read has a deadline so a
//! broker that stays silent fails the test instead of hanging it.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use sluice_wire::amq_protocol::auth::{Credentials, SASLMechanism};
use sluice_wire::amq_protocol::protocol::{basic, channel, connection, AMQPClass};
use sluice_wire::amq_protocol::types::{AMQPValue, FieldTable, LongString};
use sluice_wire::encode::encode_control;
use sluice_wire::frame::{split_frame, Frame, FrameType, FRAME_END, PROTOCOL_HEADER};
use sluice_wire::method::{decode_method, Method};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long any single read waits before the test is failed.
pub const READ_DEADLINE: Duration = Duration::from_secs(4);

/// What the hand-driven handshake sends.
#[derive(Clone, Debug)]
pub struct Handshake {
    pub mechanism: String,
    pub response: Vec<u8>,
    /// `None` answers tune with the server's own value.
    pub channel_max: Option<u16>,
    pub frame_max: Option<u32>,
    pub heartbeat: u16,
    pub vhost: String,
    /// Whether client-properties carry `authentication_failure_close`.
    pub authentication_failure_close: bool,
}

impl Default for Handshake {
    fn default() -> Self {
        Handshake::plain("guest", "guest")
    }
}

impl Handshake {
    pub fn plain(user: &str, password: &str) -> Self {
        Handshake {
            mechanism: "PLAIN".to_owned(),
            response: format!("\0{user}\0{password}").into_bytes(),
            channel_max: None,
            frame_max: None,
            heartbeat: 0,
            vhost: "/".to_owned(),
            authentication_failure_close: true,
        }
    }

    pub fn amqplain(user: &str, password: &str) -> Self {
        let credentials = Credentials::new(user.into(), password.into());
        Handshake {
            mechanism: "AMQPLAIN".to_owned(),
            response: credentials
                .sasl_auth_string(SASLMechanism::AMQPlain)
                .as_bytes()
                .to_vec(),
            ..Handshake::plain(user, password)
        }
    }
}

/// What the server sent in connection.tune.
#[derive(Clone, Copy, Debug)]
pub struct Tune {
    pub channel_max: u16,
    pub frame_max: u32,
    pub heartbeat: u16,
}

pub struct RawClient {
    pub stream: TcpStream,
    buffer: BytesMut,
}

impl RawClient {
    pub async fn connect(address: SocketAddr) -> Self {
        let stream = TcpStream::connect(address).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        RawClient {
            stream,
            buffer: BytesMut::with_capacity(64 * 1024),
        }
    }

    /// A connection that completed the handshake with guest/guest on "/".
    pub async fn open(address: SocketAddr) -> Self {
        Self::open_with(address, Handshake::default()).await.0
    }

    /// Runs the whole handshake and expects connection.open-ok.
    pub async fn open_with(address: SocketAddr, handshake: Handshake) -> (Self, Tune) {
        let mut client = Self::connect(address).await;
        let tune = client.handshake_until_open(&handshake).await;
        match client.read_method().await {
            (0, Method::Control(AMQPClass::Connection(connection::AMQPMethod::OpenOk(_)))) => {}
            other => panic!("expected connection.open-ok, got {other:?}"),
        }
        (client, tune)
    }

    /// Sends the protocol header and reads connection.start.
    pub async fn start(&mut self) -> connection::Start {
        self.send(&PROTOCOL_HEADER).await;
        match self.read_method().await {
            (0, Method::Control(AMQPClass::Connection(connection::AMQPMethod::Start(start)))) => {
                start
            }
            other => panic!("expected connection.start, got {other:?}"),
        }
    }

    /// Sends start-ok and reads connection.tune (panics on anything else).
    pub async fn start_ok(&mut self, handshake: &Handshake) -> Tune {
        self.send_start_ok(handshake).await;
        match self.read_method().await {
            (0, Method::Control(AMQPClass::Connection(connection::AMQPMethod::Tune(tune)))) => {
                Tune {
                    channel_max: tune.channel_max,
                    frame_max: tune.frame_max,
                    heartbeat: tune.heartbeat,
                }
            }
            other => panic!("expected connection.tune, got {other:?}"),
        }
    }

    pub async fn send_start_ok(&mut self, handshake: &Handshake) {
        let mut capabilities = FieldTable::default();
        for name in [
            "publisher_confirms",
            "basic.nack",
            "consumer_cancel_notify",
            "connection.blocked",
        ] {
            capabilities.insert(name.into(), AMQPValue::Boolean(true));
        }
        if handshake.authentication_failure_close {
            capabilities.insert(
                "authentication_failure_close".into(),
                AMQPValue::Boolean(true),
            );
        }
        let mut client_properties = FieldTable::default();
        client_properties.insert(
            "product".into(),
            AMQPValue::LongString(LongString::from("sluice raw test client")),
        );
        client_properties.insert("capabilities".into(), AMQPValue::FieldTable(capabilities));
        self.send_method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::StartOk(connection::StartOk {
                client_properties,
                mechanism: handshake.mechanism.as_str().into(),
                response: LongString::from(handshake.response.clone()),
                locale: "en_US".into(),
            })),
        )
        .await;
    }

    /// Sends tune-ok and connection.open.
    pub async fn tune_ok_and_open(&mut self, handshake: &Handshake, tune: Tune) {
        self.send_method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::TuneOk(connection::TuneOk {
                channel_max: handshake.channel_max.unwrap_or(tune.channel_max),
                frame_max: handshake.frame_max.unwrap_or(tune.frame_max),
                heartbeat: handshake.heartbeat,
            })),
        )
        .await;
        self.send_method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Open(connection::Open {
                virtual_host: handshake.vhost.as_str().into(),
            })),
        )
        .await;
    }

    /// Everything up to (not including) reading connection.open-ok.
    pub async fn handshake_until_open(&mut self, handshake: &Handshake) -> Tune {
        self.start().await;
        let tune = self.start_ok(handshake).await;
        self.tune_ok_and_open(handshake, tune).await;
        tune
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("socket write");
    }

    /// Writes, ignoring a failure: for tests where the broker may already
    /// have closed the socket.
    pub async fn send_lenient(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes).await;
    }

    pub async fn send_method(&mut self, channel: u16, class: AMQPClass) {
        let mut out = BytesMut::new();
        encode_control(&mut out, channel, &class);
        self.send(&out).await;
    }

    /// A frame of any type with any payload, ended by `end`.
    pub fn frame_bytes(frame_type: u8, channel: u16, payload: &[u8], end: u8) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(payload.len() + 8);
        bytes.push(frame_type);
        bytes.extend_from_slice(&channel.to_be_bytes());
        bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        bytes.extend_from_slice(payload);
        bytes.push(end);
        bytes
    }

    pub async fn send_frame(&mut self, frame_type: u8, channel: u16, payload: &[u8]) {
        let bytes = Self::frame_bytes(frame_type, channel, payload, FRAME_END);
        self.send(&bytes).await;
    }

    /// basic.publish to `exchange` with `routing_key`.
    pub async fn send_publish(
        &mut self,
        channel: u16,
        exchange: &str,
        routing_key: &str,
        immediate: bool,
    ) {
        self.send_method(
            channel,
            AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
                exchange: exchange.into(),
                routing_key: routing_key.into(),
                mandatory: false,
                immediate,
            })),
        )
        .await;
    }

    /// A content header of class basic with no properties.
    pub fn content_header_payload(body_size: u64) -> Vec<u8> {
        let mut payload = BytesMut::new();
        payload.put_u16(60);
        payload.put_u16(0);
        payload.put_u64(body_size);
        payload.put_u16(0); // property flags: none
        payload.to_vec()
    }

    pub async fn send_content_header(&mut self, channel: u16, body_size: u64) {
        let payload = Self::content_header_payload(body_size);
        self.send_frame(FrameType::Header as u8, channel, &payload)
            .await;
    }

    pub async fn send_body(&mut self, channel: u16, body: &[u8]) {
        self.send_frame(FrameType::Body as u8, channel, body).await;
    }

    /// A whole message: publish, header and one body frame.
    pub async fn publish(&mut self, channel: u16, routing_key: &str, body: &[u8]) {
        self.send_publish(channel, "", routing_key, false).await;
        self.send_content_header(channel, body.len() as u64).await;
        self.send_body(channel, body).await;
    }

    /// The next frame, `None` when the server closed the socket.
    pub async fn read_frame(&mut self) -> Option<Frame> {
        self.read_frame_within(READ_DEADLINE)
            .await
            .expect("no frame from the server before the deadline")
    }

    /// The next frame; `Err` when nothing came within `limit`.
    pub async fn read_frame_within(
        &mut self,
        limit: Duration,
    ) -> Result<Option<Frame>, tokio::time::error::Elapsed> {
        tokio::time::timeout(limit, async {
            loop {
                if let Some(frame) =
                    split_frame(&mut self.buffer, u32::MAX).expect("server framing")
                {
                    return Some(frame);
                }
                match self.stream.read_buf(&mut self.buffer).await {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                }
            }
        })
        .await
    }

    /// The next method frame, skipping heartbeats; panics on EOF or on a
    /// content frame.
    pub async fn read_method(&mut self) -> (u16, Method) {
        loop {
            let frame = self
                .read_frame()
                .await
                .expect("server closed the socket while a method was expected");
            match frame.frame_type {
                FrameType::Heartbeat => continue,
                FrameType::Method => {
                    let method = decode_method(&frame.payload).expect("server method decodes");
                    return (frame.channel, method);
                }
                other => panic!("expected a method frame, got {other:?}"),
            }
        }
    }

    /// Expects connection.close and answers it with close-ok.
    pub async fn expect_connection_close(&mut self) -> connection::Close {
        let close = self.expect_connection_close_only().await;
        self.send_method_lenient(
            0,
            AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})),
        )
        .await;
        close
    }

    /// Expects connection.close without answering it.
    pub async fn expect_connection_close_only(&mut self) -> connection::Close {
        match self.read_method().await {
            (0, Method::Control(AMQPClass::Connection(connection::AMQPMethod::Close(close)))) => {
                close
            }
            other => panic!("expected connection.close, got {other:?}"),
        }
    }

    async fn send_method_lenient(&mut self, channel: u16, class: AMQPClass) {
        let mut out = BytesMut::new();
        encode_control(&mut out, channel, &class);
        self.send_lenient(&out).await;
    }

    /// Expects channel.close on `channel` (without answering it).
    pub async fn expect_channel_close(&mut self, channel_id: u16) -> channel::Close {
        match self.read_method().await {
            (id, Method::Control(AMQPClass::Channel(channel::AMQPMethod::Close(close))))
                if id == channel_id =>
            {
                close
            }
            other => panic!("expected channel.close on channel {channel_id}, got {other:?}"),
        }
    }

    pub async fn open_channel(&mut self, channel_id: u16) {
        self.send_method(
            channel_id,
            AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
        )
        .await;
        match self.read_method().await {
            (id, Method::Control(AMQPClass::Channel(channel::AMQPMethod::OpenOk(_))))
                if id == channel_id => {}
            other => panic!("expected channel.open-ok on {channel_id}, got {other:?}"),
        }
    }

    /// Whether the server closes the socket within `limit`, ignoring any
    /// frames (heartbeats, a close) it sends before that.
    pub async fn closed_within(&mut self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.read_frame_within(left).await {
                Ok(None) => return true,
                Ok(Some(_)) => continue,
                Err(_) => return false,
            }
        }
    }

    /// Reads raw bytes (for the protocol header the server answers with).
    pub async fn read_exact_bytes(&mut self, count: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; count];
        tokio::time::timeout(READ_DEADLINE, self.stream.read_exact(&mut bytes))
            .await
            .expect("bytes before the deadline")
            .expect("socket read");
        bytes
    }
}

/// Reply code and text of a close, for compact assertions.
pub fn close_reply(close: &connection::Close) -> (u16, String) {
    (close.reply_code, close.reply_text.as_str().to_owned())
}

pub fn channel_close_reply(close: &channel::Close) -> (u16, String) {
    (close.reply_code, close.reply_text.as_str().to_owned())
}
