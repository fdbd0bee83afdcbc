//! Quorum queues on a 3-node cluster of real `sluice server` processes,
//! under the faults the issue names: the leader's node is killed (SIGKILL)
//! or hung (SIGSTOP) while a publisher with confirms writes through a
//! surviving node and a consumer reads through another. Every confirmed
//! message is delivered, none is lost, and confirms resume within seconds.

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_lite::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use support::cluster::{channel_on, cluster, Node};
use support::{declare_durable, declare_durable_with, quorum_arguments};

/// Confirms a publisher keeps waiting for at once.
const IN_FLIGHT: usize = 100;
/// How long confirms may stop after the leader's node fails (the issue's
/// bound).
const CONFIRMS_RESUME_WITHIN: Duration = Duration::from_secs(5);

/// A channel on `node` in confirm mode.
async fn confirming_channel_on(node: &Node) -> (lapin::Connection, lapin::Channel) {
    let (connection, channel) = channel_on(node).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    (connection, channel)
}

/// What the publisher saw: the numbers confirmed, and when each confirm
/// came.
#[derive(Default)]
struct Published {
    confirmed: BTreeSet<u32>,
    nacked: BTreeSet<u32>,
    confirm_times: Vec<Instant>,
}

/// Publishes numbered persistent messages through the node listening on
/// `amqp_port` until `stop`,
/// `IN_FLIGHT` confirms outstanding at most.
async fn publish_until(
    amqp_port: u16,
    stop: Arc<std::sync::atomic::AtomicBool>,
    published: Arc<Mutex<Published>>,
) {
    let connection = support::connect(amqp_port).await;
    let channel = connection.create_channel().await.expect("channel opens");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut waiting = std::collections::VecDeque::new();
    let confirm_of =
        |confirm: lapin::Result<lapin::Confirmation>| confirm.expect("a confirm arrives").is_ack();
    let mut number = 0u32;
    loop {
        let stopping = stop.load(std::sync::atomic::Ordering::Acquire);
        if waiting.len() == IN_FLIGHT || (stopping && !waiting.is_empty()) {
            let (sent, confirm) = waiting.pop_front().expect("one waiting");
            let acked = confirm_of(confirm.await);
            let mut published = published.lock().unwrap();
            if acked {
                published.confirmed.insert(sent);
            } else {
                published.nacked.insert(sent);
            }
            published.confirm_times.push(Instant::now());
            continue;
        }
        if stopping {
            return;
        }
        let confirm = support::publish_numbered(&channel, "ledger", number).await;
        waiting.push_back((number, confirm));
        number += 1;
    }
}

/// Consumes through `node`, acking everything, recording what arrived.
async fn consume_into(node: &Node, received: Arc<Mutex<BTreeSet<u32>>>) -> lapin::Connection {
    let (connection, channel) = channel_on(node).await;
    channel
        .basic_qos(100, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = channel
        .basic_consume(
            "ledger".into(),
            "reader".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume-ok");
    tokio::spawn(async move {
        while let Some(Ok(delivery)) = consumer.next().await {
            let number = u32::from_be_bytes(delivery.data[..4].try_into().unwrap());
            received.lock().unwrap().insert(number);
            let _ = delivery.ack(BasicAckOptions::default()).await;
        }
    });
    connection
}

/// Publishes one persistent message numbered `number` to `queue` and waits
/// for its confirm: true for an ack.
async fn publish_one(channel: &lapin::Channel, queue: &str, number: u32) -> bool {
    support::publish_numbered(channel, queue, number)
        .await
        .await
        .expect("a confirm arrives")
        .is_ack()
}

async fn wait_until(what: &str, within: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

enum Fault {
    Kill,
    Pause,
}

async fn leader_fails_while_publishing_and_consuming(test: &str, fault: Fault) {
    let mut nodes = cluster(test, &["secret", "secret", "secret"]);
    for node in &mut nodes {
        node.start();
    }
    // Declared through node 1: its first leader.
    let (_declaring, channel) = channel_on(&nodes[0]).await;
    declare_durable_with(&channel, "ledger", quorum_arguments()).await;
    drop(channel);
    // Node 1 stands first; the others hear of it.
    nodes[1].wait_for_log(
        &["quorum queue leader", "ledger", &nodes[0].name],
        Duration::from_secs(20),
    );

    let published = Arc::new(Mutex::new(Published::default()));
    let received = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _consuming = consume_into(&nodes[2], Arc::clone(&received)).await;
    let publisher = {
        let (stop, published) = (Arc::clone(&stop), Arc::clone(&published));
        let port = nodes[1].amqp_port;
        tokio::spawn(async move { publish_until(port, stop, published).await })
    };
    wait_until(
        "2,000 confirms before the fault",
        Duration::from_secs(60),
        || published.lock().unwrap().confirmed.len() >= 2000,
    )
    .await;

    nodes[1].mark();
    let failed_at = Instant::now();
    match fault {
        Fault::Kill => nodes[0].kill(),
        Fault::Pause => nodes[0].signal(libc::SIGSTOP),
    }
    let confirmed_at_fault = published.lock().unwrap().confirmed.len();
    wait_until(
        "confirms resume on the surviving nodes",
        Duration::from_secs(30),
        || published.lock().unwrap().confirmed.len() >= confirmed_at_fault + 2000,
    )
    .await;
    // The longest gap between confirms since the fault.
    let gap = {
        let published = published.lock().unwrap();
        let mut last = failed_at;
        let mut longest = Duration::ZERO;
        for &at in published.confirm_times.iter().filter(|at| **at > failed_at) {
            longest = longest.max(at - last);
            last = at;
        }
        longest
    };
    assert!(
        gap < CONFIRMS_RESUME_WITHIN,
        "confirms stopped for {gap:?} after the leader's node failed at {:?}; node 2 logged:\n{}",
        std::time::SystemTime::now() - failed_at.elapsed(),
        nodes[1].logged_since_mark().join("\n")
    );
    if matches!(fault, Fault::Pause) {
        nodes[0].signal(libc::SIGCONT);
    }

    // Another node leads now.
    wait_until(
        "a surviving node is elected",
        Duration::from_secs(10),
        || {
            [&nodes[1].name, &nodes[2].name]
                .iter()
                .any(|successor| nodes[1].has_logged(&["quorum queue leader", "ledger", successor]))
        },
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Release);
    publisher.await.expect("the publisher ends");
    let confirmed = published.lock().unwrap().confirmed.clone();
    wait_until(
        "every confirmed message is delivered",
        Duration::from_secs(60),
        || {
            let received = received.lock().unwrap();
            confirmed.iter().all(|number| received.contains(number))
        },
    )
    .await;
    for node in &mut nodes {
        node.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_cluster_leader_killed_loses_nothing_confirmed() {
    leader_fails_while_publishing_and_consuming("qq-kill", Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_cluster_leader_paused_loses_nothing_confirmed() {
    leader_fails_while_publishing_and_consuming("qq-pause", Fault::Pause).await;
}

/// An idle queue's members hibernate (no timers, their Raft nodes parked); a
/// publish wakes them, and a leader that dies while they sleep is replaced
/// all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_cluster_idle_queue_hibernates_and_still_fails_over() {
    let mut nodes = cluster("qq-idle", &["secret", "secret", "secret"]);
    for node in &mut nodes {
        node.start();
    }
    let (_declaring, channel) = channel_on(&nodes[0]).await;
    declare_durable_with(&channel, "ledger", quorum_arguments()).await;
    nodes[1].wait_for_log(
        &["quorum queue leader", "ledger", &nodes[0].name],
        Duration::from_secs(20),
    );
    let (_publishing, publisher) = confirming_channel_on(&nodes[1]).await;
    assert!(publish_one(&publisher, "ledger", 0).await);
    // Past the hibernation delay: every member sleeps, its Raft node
    // parked.
    for node in &nodes {
        node.wait_for_log(
            &["idle quorum queue members parked", "parked=1"],
            Duration::from_secs(20),
        );
    }
    // A publish through a follower wakes the group.
    for node in &nodes {
        node.mark();
    }
    assert!(publish_one(&publisher, "ledger", 1).await);
    for node in &nodes {
        node.wait_for_log(
            &["idle quorum queue members parked", "parked=1"],
            Duration::from_secs(20),
        );
    }
    // The parked leader dies; the next publish waits for a new one.
    nodes[0].kill();
    let started = Instant::now();
    assert!(
        publish_one(&publisher, "ledger", 2).await,
        "confirmed by the new leader"
    );
    assert!(
        started.elapsed() < CONFIRMS_RESUME_WITHIN,
        "confirmed after {:?}",
        started.elapsed()
    );
    let (_consuming, consumer) = channel_on(&nodes[2]).await;
    assert_eq!(support::get_numbered(&consumer, "ledger").await, [0, 1, 2]);
    for node in &mut nodes {
        node.kill();
    }
}

/// A queue of one member, used through a node that holds none: publishes
/// (confirmed), counts, basic.get, a consumer and a purge all reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_cluster_queue_is_used_through_a_node_that_is_not_a_member() {
    let mut nodes = cluster("qq-nonmember", &["secret", "secret", "secret"]);
    for node in &mut nodes {
        node.start();
    }
    let (_declaring, channel) = channel_on(&nodes[0]).await;
    let mut arguments = quorum_arguments();
    arguments.insert("x-quorum-initial-group-size".into(), AMQPValue::LongInt(1));
    declare_durable_with(&channel, "solo", arguments).await;
    let (_elsewhere, third) = channel_on(&nodes[2]).await;
    third
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for number in 0u32..20 {
        assert!(publish_one(&third, "solo", number).await);
    }
    let counted = third
        .queue_declare(
            "solo".into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("declare-ok");
    assert_eq!(counted.message_count(), 20);
    let got = third
        .basic_get(
            "solo".into(),
            lapin::options::BasicGetOptions { no_ack: false },
        )
        .await
        .unwrap()
        .expect("a message");
    assert_eq!(
        u32::from_be_bytes(got.delivery.data[..4].try_into().unwrap()),
        0
    );
    got.delivery.ack(BasicAckOptions::default()).await.unwrap();
    let reader = _elsewhere.create_channel().await.unwrap();
    reader
        .basic_qos(5, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = reader
        .basic_consume(
            "solo".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume-ok");
    for expected in 1u32..20 {
        let delivery = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .expect("a delivery in time")
            .expect("the consumer runs")
            .expect("a delivery");
        assert_eq!(
            u32::from_be_bytes(delivery.data[..4].try_into().unwrap()),
            expected
        );
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    reader.close(200, "done".into()).await.unwrap();
    for number in 0u32..5 {
        assert!(publish_one(&third, "solo", number).await);
    }
    let purged = third
        .queue_purge("solo".into(), lapin::options::QueuePurgeOptions::default())
        .await
        .expect("purge-ok");
    assert_eq!(purged, 5);
    for node in &mut nodes {
        node.kill();
    }
}

/// At-least-once dead-lettering across a leader's death: messages rejected
/// while their dead-letter target does not exist stay in the queue; the
/// leader dies; once the target is declared, the new leader delivers every
/// one of them there (some perhaps twice, none lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_cluster_dead_letters_at_least_once_across_a_leader_kill() {
    let mut nodes = cluster("qq-dlx", &["secret", "secret", "secret"]);
    for node in &mut nodes {
        node.start();
    }
    let (_declaring, channel) = channel_on(&nodes[0]).await;
    let mut arguments = quorum_arguments();
    for (key, value) in [
        ("x-dead-letter-exchange", ""),
        ("x-dead-letter-routing-key", "rejects"),
        ("x-dead-letter-strategy", "at-least-once"),
        ("x-overflow", "reject-publish"),
    ] {
        arguments.insert(key.into(), AMQPValue::LongString(value.into()));
    }
    declare_durable_with(&channel, "orders", arguments).await;
    nodes[1].wait_for_log(
        &["quorum queue leader", "orders", &nodes[0].name],
        Duration::from_secs(20),
    );
    let (_publishing, publisher) = confirming_channel_on(&nodes[1]).await;
    for number in 0..20 {
        assert!(publish_one(&publisher, "orders", number).await);
    }
    // Rejected through node 3, with nowhere to go yet.
    let (_rejecting, rejecter) = channel_on(&nodes[2]).await;
    for _ in 0..20 {
        let got = rejecter
            .basic_get(
                "orders".into(),
                lapin::options::BasicGetOptions { no_ack: false },
            )
            .await
            .unwrap()
            .expect("a message");
        rejecter
            .basic_nack(
                got.delivery.delivery_tag,
                lapin::options::BasicNackOptions {
                    multiple: false,
                    requeue: false,
                },
            )
            .await
            .unwrap();
    }
    // Let the rejections commit, then the leader dies.
    tokio::time::sleep(Duration::from_secs(1)).await;
    nodes[0].kill();
    // The target, declared on the surviving majority.
    declare_durable(&publisher, "rejects").await;
    let mut numbers = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(40);
    while numbers.len() < 20 {
        assert!(
            Instant::now() < deadline,
            "dead-lettered so far: {numbers:?}"
        );
        match publisher
            .basic_get(
                "rejects".into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap()
        {
            Some(message) => {
                numbers.insert(u32::from_be_bytes(
                    message.delivery.data[..4].try_into().unwrap(),
                ));
            }
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert_eq!(numbers, (0..20).collect::<BTreeSet<_>>());
    for node in &mut nodes {
        node.kill();
    }
}

/// Messages this node has taken from publishers, from its own Prometheus
/// endpoint (no peer is asked, so paused peers do not hold it up).
fn messages_received(prometheus_port: u16) -> u64 {
    let text = ureq::get(&format!("http://127.0.0.1:{prometheus_port}/metrics"))
        .call()
        .expect("the Prometheus endpoint answers")
        .body_mut()
        .read_to_string()
        .unwrap();
    text.lines()
        .find_map(|line| {
            line.strip_prefix("rabbitmq_global_messages_received_total{protocol=\"amqp091\"} ")
        })
        .and_then(|value| value.trim().parse::<f64>().ok())
        .expect("the received counter is exported") as u64
}

/// `quorum_commands_soft_limit` (here 32, RabbitMQ's default): with no
/// majority (two nodes of three paused) nothing commits, and a publisher
/// without confirms gets 32 messages into the queue before its connection
/// stops being read; the rest wait in its socket, not in the node's memory.
/// Once the nodes resume, every message arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_cluster_publisher_waits_at_the_commands_soft_limit() {
    const SOFT_LIMIT: u64 = 32;
    const SENT: u32 = 2000;
    let mut nodes = cluster("qq-soft-limit", &["secret", "secret", "secret"]);
    let prometheus_port = support::free_port();
    for (index, node) in nodes.iter().enumerate() {
        let mut config = std::fs::OpenOptions::new()
            .append(true)
            .open(&node.config)
            .unwrap();
        let port = if index == 0 {
            prometheus_port
        } else {
            support::free_port()
        };
        std::io::Write::write_all(
            &mut config,
            format!(
                "quorum_commands_soft_limit = {SOFT_LIMIT}\nprometheus.tcp.port = {port}\nmanagement.tcp.port = {}\n",
                support::free_port()
            )
                .as_bytes(),
        )
        .unwrap();
    }
    for node in &mut nodes {
        node.start();
    }
    let (first_connection, first) = confirming_channel_on(&nodes[0]).await;
    declare_durable_with(&first, "bounded", quorum_arguments()).await;
    // One confirmed message: the group has a leader and a majority.
    assert!(publish_one(&first, "bounded", 0).await);
    let before = messages_received(prometheus_port);
    nodes[1].signal(libc::SIGSTOP);
    nodes[2].signal(libc::SIGSTOP);

    let publisher_port = nodes[0].amqp_port;
    let publisher = tokio::spawn(async move {
        let connection = support::connect(publisher_port).await;
        let channel = connection.create_channel().await.expect("channel opens");
        for number in 1..=SENT {
            // No confirms: the publish is on its way once sent.
            drop(support::publish_numbered(&channel, "bounded", number).await);
        }
        connection
    });
    // The node takes the soft limit's worth and then reads no more, however
    // long the majority stays away.
    wait_until(
        "the soft limit's worth is taken",
        Duration::from_secs(10),
        || messages_received(prometheus_port) - before >= SOFT_LIMIT,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let taken = messages_received(prometheus_port) - before;
    assert_eq!(
        taken, SOFT_LIMIT,
        "a publisher without confirms is held at the soft limit while nothing commits"
    );

    nodes[1].signal(libc::SIGCONT);
    nodes[2].signal(libc::SIGCONT);
    let publisher_connection = tokio::time::timeout(Duration::from_secs(60), publisher)
        .await
        .expect("the publisher finishes once the majority is back")
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let counted = support::declare_passive(&first, "bounded")
            .await
            .expect("declare-ok")
            .message_count();
        if counted == SENT + 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{counted} of {} messages in the queue",
            SENT + 1
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    publisher_connection
        .close(200, "done".into())
        .await
        .unwrap();
    first_connection.close(200, "done".into()).await.unwrap();
    for node in &mut nodes {
        node.kill();
    }
}
