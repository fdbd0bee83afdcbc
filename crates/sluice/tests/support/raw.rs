//! A client that speaks just enough AMQP to open a connection and write
//! pre-encoded frames: faster than any client library, so a test can flood
//! a broker or hold a million deliveries at almost no cost of its own, and
//! it can vanish without a close handshake, as a crashed client does.

use bytes::{BufMut, BytesMut};
use sluice_wire::amq_protocol::protocol::{basic, channel, connection, AMQPClass};
use sluice_wire::amq_protocol::types::{FieldTable, LongString};
use sluice_wire::encode::encode_control;
use sluice_wire::frame::{split_frame, Frame, FrameType, FRAME_END, PROTOCOL_HEADER};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const FRAME_MAX: u32 = 131_072;

/// A method frame on `channel_id`.
pub fn method(out: &mut BytesMut, channel_id: u16, class: AMQPClass) {
    encode_control(out, channel_id, &class);
}

/// A frame of `frame_type` carrying `payload`.
pub fn frame(out: &mut BytesMut, frame_type: FrameType, channel_id: u16, payload: &[u8]) {
    out.put_u8(frame_type as u8);
    out.put_u16(channel_id);
    out.put_u32(payload.len() as u32);
    out.put_slice(payload);
    out.put_u8(FRAME_END);
}

/// A persistent-less publish of `body` to the default exchange with
/// `routing_key`: method, header and body frames.
pub fn publish(out: &mut BytesMut, channel_id: u16, routing_key: &str, body: &[u8]) {
    publish_header(out, channel_id, routing_key, body.len() as u64);
    frame(out, FrameType::Body, channel_id, body);
}

/// The method and content header of a publish whose body of `body_size`
/// bytes the caller sends in frames of its own.
pub fn publish_header(out: &mut BytesMut, channel_id: u16, routing_key: &str, body_size: u64) {
    method(
        out,
        channel_id,
        AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
            exchange: "".into(),
            routing_key: routing_key.into(),
            mandatory: false,
            immediate: false,
        })),
    );
    let mut header = BytesMut::with_capacity(14);
    header.put_u16(60);
    header.put_u16(0);
    header.put_u64(body_size);
    header.put_u16(0);
    frame(out, FrameType::Header, channel_id, &header);
}

/// An open connection as guest to vhost `/`, heartbeats off, with channels
/// 1..=`channels` open.
pub struct RawConnection {
    pub stream: TcpStream,
    /// Bytes read but not yet taken as frames.
    pub inbound: BytesMut,
}

impl RawConnection {
    pub async fn open(port: u16, channels: u16) -> RawConnection {
        let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut raw = RawConnection {
            stream,
            inbound: BytesMut::new(),
        };
        raw.stream.write_all(&PROTOCOL_HEADER).await.unwrap();
        raw.next_frame().await; // connection.start
        let mut out = BytesMut::new();
        method(
            &mut out,
            0,
            AMQPClass::Connection(connection::AMQPMethod::StartOk(connection::StartOk {
                client_properties: FieldTable::default(),
                mechanism: "PLAIN".into(),
                response: LongString::from(b"\0guest\0guest".to_vec()),
                locale: "en_US".into(),
            })),
        );
        raw.stream.write_all(&out).await.unwrap();
        raw.next_frame().await; // connection.tune
        out.clear();
        method(
            &mut out,
            0,
            AMQPClass::Connection(connection::AMQPMethod::TuneOk(connection::TuneOk {
                channel_max: channels.max(1),
                frame_max: FRAME_MAX,
                heartbeat: 0,
            })),
        );
        method(
            &mut out,
            0,
            AMQPClass::Connection(connection::AMQPMethod::Open(connection::Open {
                virtual_host: "/".into(),
            })),
        );
        for channel_id in 1..=channels {
            method(
                &mut out,
                channel_id,
                AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
            );
        }
        raw.stream.write_all(&out).await.unwrap();
        raw.next_frame().await; // connection.open-ok
        for _ in 0..channels {
            raw.next_frame().await; // channel.open-ok
        }
        raw
    }

    /// The next frame the broker sent.
    pub async fn next_frame(&mut self) -> Frame {
        loop {
            if let Some(frame) =
                split_frame(&mut self.inbound, FRAME_MAX).expect("well-formed frames")
            {
                return frame;
            }
            assert!(
                self.stream.read_buf(&mut self.inbound).await.unwrap() > 0,
                "broker hung up"
            );
        }
    }
}

/// Whether `frame` is the method `class_id`.`method_id`.
pub fn is_method(frame: &Frame, class_id: u16, method_id: u16) -> bool {
    let payload = &frame.payload;
    frame.frame_type == FrameType::Method
        && payload.len() >= 4
        && u16::from_be_bytes([payload[0], payload[1]]) == class_id
        && u16::from_be_bytes([payload[2], payload[3]]) == method_id
}
