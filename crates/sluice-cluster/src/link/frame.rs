//! Frames on an inter-node link: `length:u32 channel:u16 kind:u8 payload`,
//! `length` counting the payload only. Channels multiplex everything two
//! nodes exchange (the Raft traffic of every group, forwarded client
//! operations, deliveries); channel 0 belongs to the link itself.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Bytes before the payload.
pub const FRAME_HEADER_BYTES: usize = 4 + 2 + 1;

/// The largest payload a frame may carry. A node's largest message is 512
/// MiB (RabbitMQ's `max_message_size` cap); upper layers cut what they send
/// into pieces this size, so one large message does not hold the link for
/// the time it takes to send it all, and a corrupt length cannot make the
/// reader buffer gigabytes.
pub const FRAME_PAYLOAD_BYTES_MAX: usize = 1024 * 1024;

/// The link's own channel: handshake and heartbeats.
pub const LINK_CHANNEL: u16 = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Upper-layer bytes for a channel.
    Data = 1,
    /// Nothing: proof of life when there is nothing else to send.
    Heartbeat = 2,
    /// Handshake steps (see `handshake.rs`).
    Hello = 3,
    Challenge = 4,
    Proof = 5,
    Welcome = 6,
    /// The sender refuses the link; the payload says why, for the log.
    Refuse = 7,
}

impl FrameKind {
    fn from_byte(byte: u8) -> Option<FrameKind> {
        Some(match byte {
            1 => FrameKind::Data,
            2 => FrameKind::Heartbeat,
            3 => FrameKind::Hello,
            4 => FrameKind::Challenge,
            5 => FrameKind::Proof,
            6 => FrameKind::Welcome,
            7 => FrameKind::Refuse,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub channel: u16,
    pub kind: FrameKind,
    pub payload: Bytes,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame payload of {0} bytes is over the {FRAME_PAYLOAD_BYTES_MAX}-byte limit")]
    TooLarge(usize),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
}

/// Appends one frame to `out`.
pub fn encode_frame(out: &mut BytesMut, channel: u16, kind: FrameKind, payload: &[u8]) {
    debug_assert!(payload.len() <= FRAME_PAYLOAD_BYTES_MAX);
    out.reserve(FRAME_HEADER_BYTES + payload.len());
    out.put_u32(payload.len() as u32);
    out.put_u16(channel);
    out.put_u8(kind as u8);
    out.put_slice(payload);
}

/// Takes the next whole frame off the front of `buffer`; None until one
/// has arrived whole.
pub fn split_frame(buffer: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
    if buffer.len() < FRAME_HEADER_BYTES {
        return Ok(None);
    }
    let length = u32::from_be_bytes(buffer[..4].try_into().expect("four bytes")) as usize;
    if length > FRAME_PAYLOAD_BYTES_MAX {
        return Err(FrameError::TooLarge(length));
    }
    let kind = FrameKind::from_byte(buffer[6]).ok_or(FrameError::UnknownKind(buffer[6]))?;
    if buffer.len() < FRAME_HEADER_BYTES + length {
        buffer.reserve(FRAME_HEADER_BYTES + length - buffer.len());
        return Ok(None);
    }
    let mut frame = buffer.split_to(FRAME_HEADER_BYTES + length);
    frame.advance(4);
    let channel = frame.get_u16();
    frame.advance(1);
    Ok(Some(Frame {
        channel,
        kind,
        payload: frame.freeze(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_frames_round_trip_whole_and_in_pieces() {
        let mut encoded = BytesMut::new();
        encode_frame(&mut encoded, 7, FrameKind::Data, b"hello");
        encode_frame(&mut encoded, LINK_CHANNEL, FrameKind::Heartbeat, b"");
        let mut buffer = BytesMut::new();
        let mut frames = Vec::new();
        for byte in encoded.iter() {
            buffer.put_u8(*byte);
            while let Some(frame) = split_frame(&mut buffer).unwrap() {
                frames.push(frame);
            }
        }
        assert_eq!(
            frames,
            vec![
                Frame {
                    channel: 7,
                    kind: FrameKind::Data,
                    payload: Bytes::from_static(b"hello")
                },
                Frame {
                    channel: LINK_CHANNEL,
                    kind: FrameKind::Heartbeat,
                    payload: Bytes::new()
                },
            ]
        );
    }

    #[test]
    fn link_frame_over_the_limit_or_of_unknown_kind_is_refused() {
        let mut buffer = BytesMut::new();
        buffer.put_u32(FRAME_PAYLOAD_BYTES_MAX as u32 + 1);
        buffer.put_u16(1);
        buffer.put_u8(1);
        assert_eq!(
            split_frame(&mut buffer),
            Err(FrameError::TooLarge(FRAME_PAYLOAD_BYTES_MAX + 1))
        );
        let mut buffer = BytesMut::new();
        buffer.put_u32(0);
        buffer.put_u16(1);
        buffer.put_u8(99);
        assert_eq!(split_frame(&mut buffer), Err(FrameError::UnknownKind(99)));
    }
}
