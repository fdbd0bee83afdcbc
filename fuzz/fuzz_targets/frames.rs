//! Bytes from a socket, through the splitter and the decoders, as the server
//! reads them. Any error is fine; a panic, an abort or a hang is a bug.
//!
//! Input layout: 4 bytes choose frame_max, 1 byte seeds the chunk sizes, the
//! rest is the stream.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use sluice_wire::content::decode_content_header;
use sluice_wire::frame::{split_frame, FrameType, FRAME_MIN_SIZE};
use sluice_wire::method::decode_method;

/// frame_max goes up to 1 MiB: `split_frame` reserves up to frame_max bytes for
/// a frame it is waiting on, and the full u32 range would only test the
/// allocator. RabbitMQ's default is 128 KiB.
const FRAME_MAX_SPAN: u32 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let frame_max =
        FRAME_MIN_SIZE + u32::from_be_bytes([data[0], data[1], data[2], data[3]]) % FRAME_MAX_SPAN;
    let mut chunk_seed = data[4];
    let mut stream = &data[5..];
    let mut buffer = BytesMut::new();
    while !stream.is_empty() {
        // Chunk sizes 1..=64, varied by a tiny LCG so that one input exercises
        // frames split at many different points.
        let chunk_size = (chunk_seed as usize % 64 + 1).min(stream.len());
        chunk_seed = chunk_seed.wrapping_mul(37).wrapping_add(11);
        buffer.extend_from_slice(&stream[..chunk_size]);
        stream = &stream[chunk_size..];
        loop {
            let before = buffer.len();
            let frame = match split_frame(&mut buffer, frame_max) {
                Ok(Some(frame)) => frame,
                Ok(None) => {
                    assert_eq!(
                        buffer.len(),
                        before,
                        "split_frame consumed bytes without a frame"
                    );
                    break;
                }
                // A framing error closes the connection.
                Err(_) => return,
            };
            assert!(
                buffer.len() < before,
                "split_frame returned a frame without consuming bytes"
            );
            // frame_max bounds the whole frame, plus RabbitMQ's fudge of one
            // frame overhead: the payload alone never exceeds frame_max.
            assert!(frame.payload.len() <= frame_max as usize);
            match frame.frame_type {
                FrameType::Method => {
                    let _ = decode_method(&frame.payload);
                }
                FrameType::Header => {
                    if let Ok(header) = decode_content_header(&frame.payload) {
                        // RawProperties::new accepted them, so decode must too.
                        header
                            .properties
                            .decode()
                            .expect("accepted properties must decode");
                        let _ = (
                            header.properties.is_persistent(),
                            header.properties.priority(),
                        );
                        let _ = (
                            header.properties.expiration(),
                            header.properties.has_headers(),
                        );
                    }
                }
                FrameType::Body | FrameType::Heartbeat => {}
            }
        }
    }
});
