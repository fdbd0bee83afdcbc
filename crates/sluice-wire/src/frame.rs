//! Splitting a byte stream into AMQP frames.
//!
//! A frame is `type:u8 channel:u16 size:u32 payload[size] 0xCE`. The splitter
//! hands out the payload as a [`Bytes`] slice of the read buffer, so a message
//! body travels from the socket to a queue without being copied.

use bytes::{Buf, Bytes, BytesMut};

/// The bytes a client sends first: `AMQP` then protocol id 0, version 0-9-1.
pub const PROTOCOL_HEADER: [u8; 8] = *b"AMQP\x00\x00\x09\x01";
/// Type, channel and size.
pub const FRAME_HEADER_SIZE: usize = 7;
/// Every frame ends with this octet; anything else is a framing error.
pub const FRAME_END: u8 = 0xCE;
/// Header plus end octet: what a frame costs beyond its payload.
pub const FRAME_OVERHEAD: usize = FRAME_HEADER_SIZE + 1;
/// The smallest frame_max a peer may negotiate (AMQP 0-9-1 section 4.2.3).
pub const FRAME_MIN_SIZE: u32 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameType {
    Method = 1,
    Header = 2,
    Body = 3,
    Heartbeat = 8,
}

impl FrameType {
    fn from_octet(octet: u8) -> Option<Self> {
        match octet {
            1 => Some(FrameType::Method),
            2 => Some(FrameType::Header),
            3 => Some(FrameType::Body),
            8 => Some(FrameType::Heartbeat),
            _ => None,
        }
    }
}

/// One frame, its payload a slice of the buffer it was read into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub frame_type: FrameType,
    pub channel: u16,
    pub payload: Bytes,
}

/// A byte stream that is not a sequence of valid frames. All are connection
/// errors with reply code 501 (FRAME_ERROR), as RabbitMQ sends them.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame size {size} exceeds the negotiated frame_max {frame_max}")]
    TooLarge { size: u64, frame_max: u32 },
    #[error("invalid frame end marker 0x{0:02x}, expected 0xce")]
    BadFrameEnd(u8),
    #[error("unknown frame type {0}")]
    UnknownType(u8),
}

/// How far past `frame_max` a frame may run. The specification bounds the
/// whole frame by frame_max, but many clients get it wrong by the frame
/// overhead, and RabbitMQ accepts a payload of up to frame_max bytes
/// (`?FRAME_SIZE_FUDGE` in rabbit_reader.erl); refusing them would break
/// clients that work against RabbitMQ.
pub const FRAME_SIZE_FUDGE: usize = FRAME_OVERHEAD;

/// Takes the next whole frame off the front of `buffer`, or returns `None`
/// when more bytes are needed. `frame_max` bounds the whole frame including
/// header and end octet (as the specification defines it), plus
/// [`FRAME_SIZE_FUDGE`], so a hostile size field can never make the caller
/// buffer more than `frame_max + FRAME_SIZE_FUDGE` bytes.
pub fn split_frame(buffer: &mut BytesMut, frame_max: u32) -> Result<Option<Frame>, FrameError> {
    if buffer.len() < FRAME_HEADER_SIZE {
        return Ok(None);
    }
    let type_octet = buffer[0];
    let frame_type =
        FrameType::from_octet(type_octet).ok_or(FrameError::UnknownType(type_octet))?;
    let channel = u16::from_be_bytes([buffer[1], buffer[2]]);
    let payload_size = u32::from_be_bytes([buffer[3], buffer[4], buffer[5], buffer[6]]) as usize;
    let frame_size = payload_size as u64 + FRAME_OVERHEAD as u64;
    if frame_size > frame_max as u64 + FRAME_SIZE_FUDGE as u64 {
        return Err(FrameError::TooLarge {
            size: frame_size,
            frame_max,
        });
    }
    let frame_size = frame_size as usize;
    if buffer.len() < frame_size {
        // Make room for the rest now, once, instead of growing step by step.
        buffer.reserve(frame_size - buffer.len());
        return Ok(None);
    }
    let end_octet = buffer[frame_size - 1];
    if end_octet != FRAME_END {
        return Err(FrameError::BadFrameEnd(end_octet));
    }
    buffer.advance(FRAME_HEADER_SIZE);
    let payload = buffer.split_to(payload_size).freeze();
    buffer.advance(1);
    Ok(Some(Frame {
        frame_type,
        channel,
        payload,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_bytes(frame_type: u8, channel: u16, payload: &[u8], end: u8) -> Vec<u8> {
        let mut bytes = vec![frame_type];
        bytes.extend_from_slice(&channel.to_be_bytes());
        bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        bytes.extend_from_slice(payload);
        bytes.push(end);
        bytes
    }

    #[test]
    fn frame_split_whole_and_partial() {
        let bytes = frame_bytes(3, 7, b"hello", FRAME_END);
        let mut buffer = BytesMut::new();
        for (index, byte) in bytes.iter().enumerate() {
            buffer.extend_from_slice(&[*byte]);
            let result = split_frame(&mut buffer, 4096).unwrap();
            if index + 1 < bytes.len() {
                assert!(result.is_none());
            } else {
                let frame = result.unwrap();
                assert_eq!(frame.frame_type, FrameType::Body);
                assert_eq!(frame.channel, 7);
                assert_eq!(&frame.payload[..], b"hello");
            }
        }
        assert!(buffer.is_empty());
    }

    #[test]
    fn frame_split_two_in_one_buffer() {
        let mut bytes = frame_bytes(8, 0, b"", FRAME_END);
        bytes.extend(frame_bytes(1, 1, b"abc", FRAME_END));
        let mut buffer = BytesMut::from(&bytes[..]);
        assert_eq!(
            split_frame(&mut buffer, 4096).unwrap().unwrap().frame_type,
            FrameType::Heartbeat
        );
        assert_eq!(
            &split_frame(&mut buffer, 4096).unwrap().unwrap().payload[..],
            b"abc"
        );
        assert!(split_frame(&mut buffer, 4096).unwrap().is_none());
    }

    #[test]
    fn frame_split_rejects_bad_end_type_and_size() {
        let mut buffer = BytesMut::from(&frame_bytes(1, 1, b"abc", 0x00)[..]);
        assert_eq!(
            split_frame(&mut buffer, 4096),
            Err(FrameError::BadFrameEnd(0))
        );
        let mut buffer = BytesMut::from(&frame_bytes(9, 1, b"abc", FRAME_END)[..]);
        assert_eq!(
            split_frame(&mut buffer, 4096),
            Err(FrameError::UnknownType(9))
        );
        let mut buffer = BytesMut::from(&[1u8, 0, 1, 0xff, 0xff, 0xff, 0xff][..]);
        assert!(matches!(
            split_frame(&mut buffer, 4096),
            Err(FrameError::TooLarge { .. })
        ));
        // A payload of frame_max bytes fits (RabbitMQ's fudge of one frame
        // overhead); one more byte does not.
        let mut buffer = BytesMut::from(&frame_bytes(3, 1, &[0u8; 4096], FRAME_END)[..]);
        assert!(split_frame(&mut buffer, 4096).unwrap().is_some());
        let mut buffer = BytesMut::from(&frame_bytes(3, 1, &[0u8; 4097], FRAME_END)[..]);
        assert_eq!(
            split_frame(&mut buffer, 4096),
            Err(FrameError::TooLarge {
                size: 4097 + FRAME_OVERHEAD as u64,
                frame_max: 4096
            })
        );
    }
}
