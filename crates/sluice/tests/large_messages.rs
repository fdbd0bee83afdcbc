//! Publishers each sending a large message at once: together more than the
//! memory watermark. Half-read bodies are no message a consumer could take
//! or the pager could move to disk, so were they all read side by side the
//! alarm would stop every one of them midway and memory would never fall.
//! The node reads only as many large bodies at once as fit its bound on
//! bodies under way (a quarter of the watermark): every message arrives
//! whole, and memory stays within the watermark and that bound.

mod support;

use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_lite::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use sluice_wire::frame::FrameType;
use support::raw::{frame, publish_header, RawConnection, FRAME_MAX};
use support::{connect, free_port, fresh_dir, server_command};
use tokio::io::AsyncWriteExt;

const WATERMARK_MIB: u64 = 512;
const PUBLISHERS: usize = 12;
const BODY_BYTES: usize = 48 << 20;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A broker at `WATERMARK_MIB`, with its directory named after `name` and
/// its port.
fn start_broker(name: &str) -> (Server, std::path::PathBuf, u16) {
    let port = free_port();
    let root = fresh_dir(name);
    let config = root.join("sluice.conf");
    std::fs::write(
        &config,
        format!("vm_memory_high_watermark.absolute = {WATERMARK_MIB}MiB\n"),
    )
    .unwrap();
    let server = Server(
        server_command(port, &root.join("data"), Some(&config))
            .spawn()
            .unwrap(),
    );
    (server, root, port)
}

fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(0)
        / 1024
}

/// Publishes one message of `BODY_BYTES` to `queue`, a body frame at a time.
async fn publish_large(port: u16, queue: &str, fill: u8) -> RawConnection {
    let mut publisher = RawConnection::open(port, 1).await;
    let mut out = BytesMut::new();
    publish_header(&mut out, 1, queue, BODY_BYTES as u64);
    publisher.stream.write_all(&out).await.unwrap();
    let chunk = vec![fill; FRAME_MAX as usize - 8];
    let mut sent = 0;
    while sent < BODY_BYTES {
        let size = chunk.len().min(BODY_BYTES - sent);
        out.clear();
        frame(&mut out, FrameType::Body, 1, &chunk[..size]);
        publisher.stream.write_all(&out).await.unwrap();
        sent += size;
    }
    publisher
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_from_many_publishers_at_once_all_arrive_within_the_watermark() {
    let (server, root, port) = start_broker("large-messages");
    let pid = server.0.id();
    let connection = connect(port).await;
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_declare(
            "large".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .basic_qos(1, BasicQosOptions::default())
        .await
        .unwrap();
    let mut deliveries = channel
        .basic_consume(
            "large".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let consumed = Arc::new(AtomicUsize::new(0));
    let consumer = {
        let consumed = Arc::clone(&consumed);
        tokio::spawn(async move {
            while let Some(Ok(delivery)) = deliveries.next().await {
                assert_eq!(delivery.data.len(), BODY_BYTES, "a message arrives whole");
                // Each publisher's body is one byte throughout: a body
                // spliced from two publishers' frames would show it.
                let fill = delivery.data[0];
                assert!(delivery.data.iter().step_by(4096).all(|byte| *byte == fill));
                assert_eq!(delivery.data[BODY_BYTES - 1], fill);
                delivery.ack(BasicAckOptions::default()).await.unwrap();
                consumed.fetch_add(1, Ordering::AcqRel);
            }
        })
    };

    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|index| tokio::spawn(publish_large(port, "large", index as u8)))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut peak_rss_mib = 0;
    while consumed.load(Ordering::Acquire) < PUBLISHERS {
        peak_rss_mib = peak_rss_mib.max(rss_mib(pid));
        assert!(
            Instant::now() < deadline,
            "{} of {PUBLISHERS} large messages arrived within 60 s (broker RSS {} MiB, peak {peak_rss_mib} MiB)",
            consumed.load(Ordering::Acquire),
            rss_mib(pid)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("peak broker RSS {peak_rss_mib} MiB at a watermark of {WATERMARK_MIB} MiB");
    // Messages queued faster than the consumer takes them may bring the
    // node to its watermark, where the alarm holds publishers; past it by
    // no more than the bodies already under way.
    assert!(
        peak_rss_mib < WATERMARK_MIB + WATERMARK_MIB / 4,
        "the broker reached {peak_rss_mib} MiB at a watermark of {WATERMARK_MIB} MiB"
    );
    for publisher in publishers {
        publisher.await.unwrap();
    }
    consumer.abort();
    drop(server);
    let _ = std::fs::remove_dir_all(&root);
}

/// Two large bodies interleaved on two channels of one connection, together
/// past the bound: the connection reads its frames in the client's order,
/// so the second body must not wait for room the first holds (it goes
/// without), or neither would ever finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_interleaved_on_one_connection_past_the_bound_both_arrive() {
    const INTERLEAVED_BODY_BYTES: usize = 100 << 20;
    let (_server, root, port) = start_broker("large-interleaved");
    let connection = connect(port).await;
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_declare(
            "interleaved".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();

    let mut publisher = RawConnection::open(port, 2).await;
    let mut out = BytesMut::new();
    for channel_id in [1, 2] {
        publish_header(
            &mut out,
            channel_id,
            "interleaved",
            INTERLEAVED_BODY_BYTES as u64,
        );
    }
    publisher.stream.write_all(&out).await.unwrap();
    let chunk = vec![9u8; FRAME_MAX as usize - 8];
    let mut sent = 0;
    let writing = tokio::spawn(async move {
        while sent < INTERLEAVED_BODY_BYTES {
            let size = chunk.len().min(INTERLEAVED_BODY_BYTES - sent);
            let mut out = BytesMut::new();
            for channel_id in [1, 2] {
                frame(&mut out, FrameType::Body, channel_id, &chunk[..size]);
            }
            publisher.stream.write_all(&out).await.unwrap();
            sent += size;
        }
        publisher
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = support::declare_passive(&channel, "interleaved")
            .await
            .unwrap()
            .message_count();
        if ready == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{ready} of 2 interleaved large messages arrived within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _publisher = writing.await.unwrap();
    let _ = std::fs::remove_dir_all(&root);
}
