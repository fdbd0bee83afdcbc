//! A client holding a great many unacknowledged messages vanishes: they all
//! go back to their queue, marked redelivered, and meanwhile the broker keeps
//! answering a client of another queue within a second.
//!
//! The holder is a raw socket with 200 consumers on one queue and no
//! prefetch limit; it closes without a word, as a crashed client does.
//!
//! `cargo test --release -p sluice --test requeue -- --ignored` runs the
//! issue's size (1,000,000 messages) and prints what it measured.

mod support;

use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use lapin::options::{BasicGetOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use sluice_wire::amq_protocol::protocol::{basic, AMQPClass};
use support::raw::{is_method, method, publish, RawConnection};
use support::{connect, declare_passive, free_port, fresh_dir, server_command, stop};
use tokio::io::AsyncWriteExt;

const CONSUMERS: u16 = 200;
const BODY: &[u8] = b"held by a client about to vanish";

/// What one run saw.
struct Observed {
    requeue_took: Duration,
    /// Round trips of the other queue's client while the requeue ran.
    probe_round_trips: Vec<Duration>,
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Publishes `count` messages to `queue` through a raw connection, kept
/// open until the broker has taken them all (closed with publishes still
/// unread, a socket is reset and they are lost).
async fn publish_many(port: u16, queue: &str, count: usize) -> RawConnection {
    let mut publisher = RawConnection::open(port, 1).await;
    let mut batch = BytesMut::new();
    for sent in 0..count {
        publish(&mut batch, 1, queue, BODY);
        if batch.len() > 256 * 1024 || sent + 1 == count {
            publisher.stream.write_all(&batch).await.unwrap();
            batch.clear();
        }
    }
    publisher
}

/// Waits until `queue` holds `count` ready messages.
async fn wait_for_ready(channel: &lapin::Channel, queue: &str, count: usize, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let ready = declare_passive(channel, queue)
            .await
            .unwrap()
            .message_count() as usize;
        if ready == count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{queue} holds {ready} of {count} messages after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Opens `CONSUMERS` consumers on `queue` and reads deliveries until it
/// holds `count`, acknowledging none.
async fn hold(port: u16, queue: &str, count: usize) -> RawConnection {
    let mut holder = RawConnection::open(port, CONSUMERS).await;
    let mut out = BytesMut::new();
    for channel_id in 1..=CONSUMERS {
        method(
            &mut out,
            channel_id,
            AMQPClass::Basic(basic::AMQPMethod::Consume(basic::Consume {
                queue: queue.into(),
                consumer_tag: "".into(),
                no_local: false,
                no_ack: false,
                exclusive: false,
                nowait: false,
                arguments: Default::default(),
            })),
        );
    }
    holder.stream.write_all(&out).await.unwrap();
    let mut delivered = 0;
    while delivered < count {
        let frame = holder.next_frame().await;
        if is_method(&frame, 60, 60) {
            delivered += 1;
        }
    }
    holder
}

/// Publishes one message to `queue` and gets it back: one round trip
/// through the broker for a client with nothing to do with the requeue.
async fn probe(channel: &lapin::Channel, queue: &str) -> Duration {
    let started = Instant::now();
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            b"probe",
            BasicProperties::default(),
        )
        .await
        .unwrap();
    while channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .is_none()
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    started.elapsed()
}

async fn run(held: usize) -> Observed {
    let port = free_port();
    let data_dir = fresh_dir("requeue");
    let mut server = Server(server_command(port, &data_dir, None).spawn().unwrap());
    let setup = connect(port).await;
    let channel = setup.create_channel().await.unwrap();
    for queue in ["held", "probe"] {
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
    let publisher = publish_many(port, "held", held).await;
    wait_for_ready(&channel, "held", held, Duration::from_secs(120)).await;
    drop(publisher);
    let holder = tokio::time::timeout(Duration::from_secs(120), hold(port, "held", held))
        .await
        .expect("the consumers receive every message within 120 s");
    let counts = declare_passive(&channel, "held").await.unwrap();
    assert_eq!(counts.message_count(), 0, "every message is out, unacked");

    let probe_connection = connect(port).await;
    let probe_channel = probe_connection.create_channel().await.unwrap();
    probe(&probe_channel, "probe").await;
    let round_trips = Arc::new(Mutex::new(Vec::new()));
    let probing = {
        let round_trips = Arc::clone(&round_trips);
        tokio::spawn(async move {
            loop {
                let round_trip = probe(&probe_channel, "probe").await;
                round_trips.lock().unwrap().push(round_trip);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    // The client vanishes: no channel.close, no connection.close. Round
    // trips counted from here on overlap the requeue, or follow it.
    round_trips.lock().unwrap().clear();
    let vanished = Instant::now();
    drop(holder);
    wait_for_ready(&channel, "held", held, Duration::from_secs(120)).await;
    let requeue_took = vanished.elapsed();
    // A requeue quicker than a round trip still has the one in flight
    // during it counted.
    let deadline = Instant::now() + Duration::from_secs(30);
    while round_trips.lock().unwrap().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the other queue's client got no answer"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    probing.abort();
    let probe_round_trips = round_trips.lock().unwrap().clone();

    let first = channel
        .basic_get("held".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the queue holds the requeued messages");
    assert!(
        first.delivery.redelivered,
        "requeued messages are redelivered"
    );
    assert_eq!(first.delivery.data, BODY);

    assert!(stop(&mut server.0).success());
    let _ = std::fs::remove_dir_all(&data_dir);
    Observed {
        requeue_took,
        probe_round_trips,
    }
}

fn check(observed: &Observed) {
    let slowest = observed.probe_round_trips.iter().max().copied();
    eprintln!(
        "requeue took {:?}; {} probe round trips during and just after it, slowest {slowest:?}",
        observed.requeue_took,
        observed.probe_round_trips.len()
    );
    assert!(
        slowest.is_some_and(|slowest| slowest < Duration::from_secs(1)),
        "another queue's client waited {slowest:?} for a round trip during the requeue"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_of_a_vanished_clients_hundred_thousand_unacked_keeps_others_served() {
    check(&run(100_000).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "heavy: a million unacked messages; run with --release -- --ignored"]
async fn requeue_of_a_vanished_clients_million_unacked_keeps_others_served() {
    check(&run(1_000_000).await);
}
