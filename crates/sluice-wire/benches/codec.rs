//! The per-message cost of the wire codec on the hot path.
//!
//! - `split_decode_publish`: a read buffer holding 1000 basic.publish
//!   messages (method, content header, 1 KB body frame) split into frames and
//!   decoded as the server does.
//! - `encode_deliver`: 1000 deliveries (basic.deliver plus content) of 1 KB
//!   written into an output buffer.
//!
//! Throughput is per message: criterion's "elem/s" is messages per second,
//! and the time per iteration divided by 1000 is the cost of one message.
//! Run with `cargo bench -p sluice-wire --bench codec`.

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use sluice_wire::amq_protocol::protocol::basic::{self, AMQPProperties};
use sluice_wire::amq_protocol::protocol::AMQPClass;
use sluice_wire::content::{decode_content_header, RawProperties};
use sluice_wire::encode::{encode_content, encode_control, encode_deliver};
use sluice_wire::frame::{split_frame, FrameType};
use sluice_wire::method::{decode_method, Method};

const MESSAGES: usize = 1000;
const BODY_SIZE: usize = 1024;
/// RabbitMQ's default; a 1 KB body fits in one body frame.
const FRAME_MAX: u32 = 131_072;

fn properties() -> RawProperties {
    RawProperties::from_properties(
        &AMQPProperties::default()
            .with_content_type("application/octet-stream".into())
            .with_delivery_mode(2),
    )
}

fn publish_stream() -> Bytes {
    let method = AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
        exchange: "amq.direct".into(),
        routing_key: "bench.queue".into(),
        mandatory: false,
        immediate: false,
    }));
    let properties = properties();
    let body = vec![b'x'; BODY_SIZE];
    let mut out = BytesMut::new();
    for _ in 0..MESSAGES {
        encode_control(&mut out, 1, &method);
        encode_content(&mut out, 1, &properties, &body, FRAME_MAX);
    }
    out.freeze()
}

/// What the server's reader does per frame, minus routing.
fn split_and_decode(mut buffer: BytesMut) -> usize {
    let mut published = 0;
    while let Some(frame) = split_frame(&mut buffer, FRAME_MAX).expect("valid stream") {
        match frame.frame_type {
            FrameType::Method => {
                let Method::Publish(publish) = decode_method(&frame.payload).expect("valid method")
                else {
                    unreachable!("only publishes in the stream");
                };
                black_box(publish);
            }
            FrameType::Header => {
                let header = decode_content_header(&frame.payload).expect("valid header");
                black_box(header.properties.is_persistent());
                black_box(header);
            }
            FrameType::Body => {
                black_box(frame.payload);
                published += 1;
            }
            FrameType::Heartbeat => {}
        }
    }
    published
}

fn bench_split_decode(c: &mut Criterion) {
    let stream = publish_stream();
    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Elements(MESSAGES as u64));
    group.bench_function("split_decode_publish_1k", |b| {
        // The copy into a fresh buffer stands for the socket read and is
        // left out of the measurement.
        b.iter_batched(
            || BytesMut::from(&stream[..]),
            |buffer| assert_eq!(split_and_decode(buffer), MESSAGES),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

fn bench_encode_deliver(c: &mut Criterion) {
    let properties = properties();
    let body = vec![b'x'; BODY_SIZE];
    let mut out = BytesMut::with_capacity(MESSAGES * (BODY_SIZE + 256));
    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Elements(MESSAGES as u64));
    group.bench_function("encode_deliver_1k", |b| {
        b.iter(|| {
            // The output buffer is reused, as a connection's writer does.
            out.clear();
            for delivery_tag in 1..=MESSAGES as u64 {
                encode_deliver(
                    &mut out,
                    1,
                    b"amq.ctag-bench",
                    delivery_tag,
                    false,
                    b"amq.direct",
                    b"bench.queue",
                );
                encode_content(&mut out, 1, &properties, &body, FRAME_MAX);
            }
            black_box(out.len())
        })
    });
    group.finish();
}

criterion_group!(benches, bench_split_decode, bench_encode_deliver);
criterion_main!(benches);
