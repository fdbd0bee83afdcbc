//! Writing frames into an output buffer.
//!
//! Deliveries, returns, get-ok and confirms are written by hand straight into
//! the connection's output buffer: one copy of the body, no intermediate
//! values; so is a client's basic.publish (`sluice perf`'s). Control-plane
//! methods go through `amq-protocol`.

use amq_protocol::protocol::{gen_class, AMQPClass};
use bytes::{BufMut, Bytes, BytesMut};

use crate::content::RawProperties;
use crate::frame::{FrameType, FRAME_END, FRAME_OVERHEAD};
use crate::method::{CLASS_BASIC, METHOD_BASIC_ACK, METHOD_BASIC_NACK, METHOD_BASIC_PUBLISH};

const METHOD_BASIC_RETURN: u16 = 50;
const METHOD_BASIC_DELIVER: u16 = 60;
const METHOD_BASIC_GET_OK: u16 = 71;

/// Starts a frame and returns the offset of its size field, to be patched
/// by [`finish_frame`] once the payload is written.
fn start_frame(out: &mut BytesMut, frame_type: FrameType, channel: u16) -> usize {
    out.put_u8(frame_type as u8);
    out.put_u16(channel);
    let size_at = out.len();
    out.put_u32(0);
    size_at
}

fn finish_frame(out: &mut BytesMut, size_at: usize) {
    let payload_size = (out.len() - size_at - 4) as u32;
    out[size_at..size_at + 4].copy_from_slice(&payload_size.to_be_bytes());
    out.put_u8(FRAME_END);
}

/// Short strings longer than 255 bytes cannot be sent; the names this writes
/// come from frames or from validated declarations, which are bounded by 255.
fn put_short_string(out: &mut BytesMut, value: &[u8]) {
    let length = value.len().min(u8::MAX as usize);
    out.put_u8(length as u8);
    out.put_slice(&value[..length]);
}

/// Writes a control-plane method frame.
pub fn encode_control(out: &mut BytesMut, channel: u16, class: &AMQPClass) {
    // The generated serializer needs a seekable writer; control methods are
    // rare enough that a scratch Vec costs nothing that matters. Writing into
    // a growable Vec cannot fail: the serializer only errors on a full buffer.
    let payload = cookie_factory::gen_simple(gen_class(class), Vec::new()).unwrap_or_default();
    let size_at = start_frame(out, FrameType::Method, channel);
    out.put_slice(&payload);
    finish_frame(out, size_at);
}

pub fn encode_heartbeat(out: &mut BytesMut) {
    let size_at = start_frame(out, FrameType::Heartbeat, 0);
    finish_frame(out, size_at);
}

/// Writes the content header and body frames of a message, splitting the
/// body so that no frame exceeds `frame_max`.
pub fn encode_content(
    out: &mut BytesMut,
    channel: u16,
    properties: &RawProperties,
    body: &[u8],
    frame_max: u32,
) {
    let size_at = start_frame(out, FrameType::Header, channel);
    out.put_u16(CLASS_BASIC);
    out.put_u16(0); // weight, unused
    out.put_u64(body.len() as u64);
    out.put_slice(properties.as_bytes());
    finish_frame(out, size_at);
    let chunk_max = (frame_max as usize).saturating_sub(FRAME_OVERHEAD).max(1);
    out.reserve(body.len() + body.len().div_ceil(chunk_max) * FRAME_OVERHEAD);
    for chunk in body.chunks(chunk_max) {
        out.put_u8(FrameType::Body as u8);
        out.put_u16(channel);
        out.put_u32(chunk.len() as u32);
        out.put_slice(chunk);
        out.put_u8(FRAME_END);
    }
}

/// The size [`encode_content`] and a delivery method will write, for
/// accounting output buffers before writing.
pub fn content_frames_size(properties: &RawProperties, body_size: usize, frame_max: u32) -> usize {
    let chunk_max = (frame_max as usize).saturating_sub(FRAME_OVERHEAD).max(1);
    FRAME_OVERHEAD
        + 12
        + properties.as_bytes().len()
        + body_size
        + body_size.div_ceil(chunk_max) * FRAME_OVERHEAD
}

/// Writes basic.deliver (the content follows with [`encode_content`]).
pub fn encode_deliver(
    out: &mut BytesMut,
    channel: u16,
    consumer_tag: &[u8],
    delivery_tag: u64,
    redelivered: bool,
    exchange: &[u8],
    routing_key: &[u8],
) {
    let size_at = start_frame(out, FrameType::Method, channel);
    out.put_u16(CLASS_BASIC);
    out.put_u16(METHOD_BASIC_DELIVER);
    put_short_string(out, consumer_tag);
    out.put_u64(delivery_tag);
    out.put_u8(redelivered as u8);
    put_short_string(out, exchange);
    put_short_string(out, routing_key);
    finish_frame(out, size_at);
}

/// Writes basic.get-ok (the content follows with [`encode_content`]).
pub fn encode_get_ok(
    out: &mut BytesMut,
    channel: u16,
    delivery_tag: u64,
    redelivered: bool,
    exchange: &[u8],
    routing_key: &[u8],
    message_count: u32,
) {
    let size_at = start_frame(out, FrameType::Method, channel);
    out.put_u16(CLASS_BASIC);
    out.put_u16(METHOD_BASIC_GET_OK);
    out.put_u64(delivery_tag);
    out.put_u8(redelivered as u8);
    put_short_string(out, exchange);
    put_short_string(out, routing_key);
    out.put_u32(message_count);
    finish_frame(out, size_at);
}

/// Writes basic.return (the content follows with [`encode_content`]).
pub fn encode_return(
    out: &mut BytesMut,
    channel: u16,
    reply_code: u16,
    reply_text: &str,
    exchange: &[u8],
    routing_key: &[u8],
) {
    let size_at = start_frame(out, FrameType::Method, channel);
    out.put_u16(CLASS_BASIC);
    out.put_u16(METHOD_BASIC_RETURN);
    out.put_u16(reply_code);
    put_short_string(out, reply_text.as_bytes());
    put_short_string(out, exchange);
    put_short_string(out, routing_key);
    finish_frame(out, size_at);
}

/// Writes a publisher confirm: basic.ack, or basic.nack when the broker could
/// not take responsibility for the message.
pub fn encode_confirm(
    out: &mut BytesMut,
    channel: u16,
    delivery_tag: u64,
    multiple: bool,
    positive: bool,
) {
    let size_at = start_frame(out, FrameType::Method, channel);
    out.put_u16(CLASS_BASIC);
    if positive {
        out.put_u16(METHOD_BASIC_ACK);
        out.put_u64(delivery_tag);
        out.put_u8(multiple as u8);
    } else {
        out.put_u16(METHOD_BASIC_NACK);
        out.put_u64(delivery_tag);
        out.put_u8(multiple as u8); // requeue bit is meaningless from a broker
    }
    finish_frame(out, size_at);
}

/// Writes basic.publish, as a client sends it (the content follows with
/// [`encode_content`]): `sluice perf` publishes with it.
pub fn encode_publish(
    out: &mut BytesMut,
    channel: u16,
    exchange: &[u8],
    routing_key: &[u8],
    mandatory: bool,
) {
    let size_at = start_frame(out, FrameType::Method, channel);
    out.put_u16(CLASS_BASIC);
    out.put_u16(METHOD_BASIC_PUBLISH);
    out.put_u16(0); // ticket, reserved
    put_short_string(out, exchange);
    put_short_string(out, routing_key);
    out.put_u8(mandatory as u8);
    finish_frame(out, size_at);
}

/// A body that arrived in several frames is joined into one buffer; a body of
/// one frame is kept as the slice it already is.
pub fn join_body(parts: Vec<Bytes>, body_size: usize) -> Bytes {
    match parts.len() {
        0 => Bytes::new(),
        1 => parts.into_iter().next().unwrap_or_default(),
        _ => {
            let mut joined = BytesMut::with_capacity(body_size);
            for part in parts {
                joined.put_slice(&part);
            }
            joined.freeze()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::decode_content_header;
    use crate::frame::{split_frame, Frame};
    use amq_protocol::frame::parse_frame;
    use amq_protocol::frame::AMQPFrame;
    use amq_protocol::protocol::basic;

    fn frames(mut out: BytesMut) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(frame) = split_frame(&mut out, u32::MAX).unwrap() {
            frames.push(frame);
        }
        assert!(out.is_empty());
        frames
    }

    #[test]
    fn encode_deliver_matches_amq_protocol() {
        let mut out = BytesMut::new();
        encode_deliver(&mut out, 3, b"ctag", 17, true, b"ex", b"rk");
        let (_, frame) = parse_frame(&out[..]).unwrap();
        assert_eq!(
            frame,
            AMQPFrame::Method(
                3,
                AMQPClass::Basic(basic::AMQPMethod::Deliver(basic::Deliver {
                    consumer_tag: "ctag".into(),
                    delivery_tag: 17,
                    redelivered: true,
                    exchange: "ex".into(),
                    routing_key: "rk".into(),
                }))
            )
        );
    }

    #[test]
    fn encode_get_ok_return_and_confirm_match_amq_protocol() {
        let mut out = BytesMut::new();
        encode_get_ok(&mut out, 1, 5, false, b"", b"q", 9);
        let (_, frame) = parse_frame(&out[..]).unwrap();
        assert!(matches!(
            frame,
            AMQPFrame::Method(
                1,
                AMQPClass::Basic(basic::AMQPMethod::GetOk(basic::GetOk {
                    message_count: 9,
                    delivery_tag: 5,
                    ..
                }))
            )
        ));
        let mut out = BytesMut::new();
        encode_return(&mut out, 1, 312, "NO_ROUTE", b"amq.direct", b"nowhere");
        let (_, frame) = parse_frame(&out[..]).unwrap();
        assert!(matches!(
            frame,
            AMQPFrame::Method(
                1,
                AMQPClass::Basic(basic::AMQPMethod::Return(basic::Return {
                    reply_code: 312,
                    ..
                }))
            )
        ));
        let mut out = BytesMut::new();
        encode_confirm(&mut out, 2, 10, true, false);
        let (_, frame) = parse_frame(&out[..]).unwrap();
        assert!(matches!(
            frame,
            AMQPFrame::Method(
                2,
                AMQPClass::Basic(basic::AMQPMethod::Nack(basic::Nack {
                    delivery_tag: 10,
                    multiple: true,
                    ..
                }))
            )
        ));
    }

    #[test]
    fn encode_publish_matches_amq_protocol() {
        let mut out = BytesMut::new();
        encode_publish(&mut out, 4, b"amq.topic", b"a.b", true);
        let (_, frame) = parse_frame(&out[..]).unwrap();
        assert_eq!(
            frame,
            AMQPFrame::Method(
                4,
                AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
                    exchange: "amq.topic".into(),
                    routing_key: "a.b".into(),
                    mandatory: true,
                    immediate: false,
                }))
            )
        );
    }

    #[test]
    fn encode_content_splits_body_at_frame_max() {
        let properties =
            RawProperties::from_properties(&basic::AMQPProperties::default().with_delivery_mode(2));
        let body = vec![7u8; 10_000];
        let mut out = BytesMut::new();
        encode_content(&mut out, 1, &properties, &body, 4096);
        assert_eq!(
            out.len(),
            content_frames_size(&properties, body.len(), 4096)
        );
        let frames = frames(out);
        assert_eq!(frames.len(), 1 + 3);
        let header = decode_content_header(&frames[0].payload).unwrap();
        assert_eq!(header.body_size, 10_000);
        assert!(header.properties.is_persistent());
        assert!(frames[1..]
            .iter()
            .all(|frame| frame.payload.len() + FRAME_OVERHEAD <= 4096));
        let joined = join_body(
            frames[1..]
                .iter()
                .map(|frame| frame.payload.clone())
                .collect(),
            10_000,
        );
        assert_eq!(&joined[..], &body[..]);
    }

    #[test]
    fn encode_heartbeat_is_eight_bytes() {
        let mut out = BytesMut::new();
        encode_heartbeat(&mut out);
        assert_eq!(&out[..], &[8, 0, 0, 0, 0, 0, 0, 0xCE]);
    }
}
