//! Writes the seed inputs in `fuzz/seeds/` from the real encoders, so the
//! fuzzer starts from valid frames rather than having to discover the format.
//!
//! Run from `fuzz/`: `cargo run --example make_seeds`.

use std::fs;
use std::path::Path;

use bytes::{BufMut, BytesMut};
use sluice_wire::amq_protocol::protocol::basic::AMQPProperties;
use sluice_wire::amq_protocol::protocol::{basic, connection, exchange, queue, AMQPClass};
use sluice_wire::amq_protocol::types::{AMQPValue, FieldArray, FieldTable};
use sluice_wire::content::RawProperties;
use sluice_wire::encode::{encode_confirm, encode_content, encode_control, encode_heartbeat};

/// The `frames` target reads 4 bytes of frame_max selector and 1 chunk-size
/// seed before the stream; 131072 - 4096 selects RabbitMQ's default 128 KiB.
fn frames_input(stream: &[u8], chunk_seed: u8) -> Vec<u8> {
    let mut input = Vec::new();
    input.put_u32(131_072 - 4096);
    input.put_u8(chunk_seed);
    input.extend_from_slice(stream);
    input
}

fn arguments() -> FieldTable {
    let mut nested = FieldTable::default();
    nested.insert("level".into(), AMQPValue::LongLongInt(2));
    let mut table = FieldTable::default();
    table.insert("x-max-length".into(), AMQPValue::LongInt(1000));
    table.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("classic".into()),
    );
    table.insert("x-message-ttl".into(), AMQPValue::LongLongInt(60_000));
    table.insert("nested".into(), AMQPValue::FieldTable(nested.clone()));
    table.insert(
        "list".into(),
        AMQPValue::FieldArray(FieldArray::from(vec![
            AMQPValue::Boolean(true),
            AMQPValue::FieldTable(nested),
        ])),
    );
    table
}

fn full_properties() -> AMQPProperties {
    AMQPProperties::default()
        .with_content_type("application/json".into())
        .with_content_encoding("gzip".into())
        .with_headers(arguments())
        .with_delivery_mode(2)
        .with_priority(5)
        .with_correlation_id("c-1".into())
        .with_reply_to("amq.rabbitmq.reply-to".into())
        .with_expiration("60000".into())
        .with_message_id("m-1".into())
        .with_timestamp(1_700_000_000)
        .with_type("event".into())
        .with_user_id("guest".into())
        .with_app_id("seed".into())
        .with_cluster_id("".into())
}

fn publish(
    out: &mut BytesMut,
    channel: u16,
    routing_key: &str,
    properties: &AMQPProperties,
    body: &[u8],
) {
    let method = AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
        exchange: "amq.topic".into(),
        routing_key: routing_key.into(),
        mandatory: true,
        immediate: false,
    }));
    encode_control(out, channel, &method);
    encode_content(
        out,
        channel,
        &RawProperties::from_properties(properties),
        body,
        131_072,
    );
}

fn main() -> std::io::Result<()> {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let frames_dir = seeds.join("frames");
    let properties_dir = seeds.join("properties");
    fs::create_dir_all(&frames_dir)?;
    fs::create_dir_all(&properties_dir)?;

    // A publish with the common properties and a 1 KB body.
    let mut out = BytesMut::new();
    publish(
        &mut out,
        1,
        "a.b.c",
        &AMQPProperties::default().with_delivery_mode(2),
        &[b'x'; 1024],
    );
    fs::write(frames_dir.join("publish"), frames_input(&out, 63))?;
    // The same, fed in small chunks (chunk seed 0 gives a chunk of 1 first).
    fs::write(frames_dir.join("publish_chunked"), frames_input(&out, 0))?;

    // A publish with every property and a body split over several frames.
    let mut out = BytesMut::new();
    publish(
        &mut out,
        2,
        "orders.eu",
        &full_properties(),
        &vec![7u8; 9000],
    );
    let method = AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
        exchange: "".into(),
        routing_key: "q".into(),
        mandatory: false,
        immediate: false,
    }));
    encode_control(&mut out, 2, &method);
    encode_content(
        &mut out,
        2,
        &RawProperties::from_properties(&AMQPProperties::default()),
        b"",
        4096,
    );
    fs::write(
        frames_dir.join("publish_full_properties"),
        frames_input(&out, 17),
    )?;

    // Control plane: start-ok, declare, bind, consume, then acks.
    let mut out = BytesMut::new();
    let control = [
        AMQPClass::Connection(connection::AMQPMethod::StartOk(connection::StartOk {
            client_properties: arguments(),
            mechanism: "PLAIN".into(),
            response: "\0guest\0guest".into(),
            locale: "en_US".into(),
        })),
        AMQPClass::Connection(connection::AMQPMethod::TuneOk(connection::TuneOk {
            channel_max: 2047,
            frame_max: 131_072,
            heartbeat: 60,
        })),
        AMQPClass::Exchange(exchange::AMQPMethod::Declare(exchange::Declare {
            exchange: "events".into(),
            kind: "headers".into(),
            passive: false,
            durable: true,
            auto_delete: false,
            internal: false,
            nowait: false,
            arguments: arguments(),
        })),
        AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
            queue: "q".into(),
            passive: false,
            durable: true,
            exclusive: false,
            auto_delete: false,
            nowait: false,
            arguments: arguments(),
        })),
        AMQPClass::Queue(queue::AMQPMethod::Bind(queue::Bind {
            queue: "q".into(),
            exchange: "events".into(),
            routing_key: "".into(),
            nowait: false,
            arguments: arguments(),
        })),
        AMQPClass::Basic(basic::AMQPMethod::Consume(basic::Consume {
            queue: "q".into(),
            consumer_tag: "ctag".into(),
            no_local: false,
            no_ack: false,
            exclusive: false,
            nowait: false,
            arguments: arguments(),
        })),
        AMQPClass::Basic(basic::AMQPMethod::Reject(basic::Reject {
            delivery_tag: 3,
            requeue: true,
        })),
    ];
    for class in &control {
        encode_control(&mut out, 1, class);
    }
    encode_confirm(&mut out, 1, 1, false, true);
    encode_confirm(&mut out, 1, 2, true, false);
    encode_heartbeat(&mut out);
    fs::write(frames_dir.join("control"), frames_input(&out, 5))?;

    // Properties: none, the fast path, and every field.
    let sets = [
        ("empty", AMQPProperties::default()),
        (
            "persistent_text",
            AMQPProperties::default()
                .with_content_type("text/plain".into())
                .with_delivery_mode(2)
                .with_priority(1),
        ),
        (
            "expiration",
            AMQPProperties::default().with_expiration("1000".into()),
        ),
        ("full", full_properties()),
    ];
    for (name, properties) in &sets {
        fs::write(
            properties_dir.join(name),
            RawProperties::from_properties(properties).as_bytes(),
        )?;
    }
    println!("wrote seeds to {}", seeds.display());
    Ok(())
}
