//! Classic queues in a 3-node cluster of real `sluice server` processes:
//! a queue lives on the node it was declared through, and clients on the
//! other nodes publish to it (with confirms), consume from it (within
//! their prefetch, in order), get, purge, count and delete it. When the
//! consumer's node dies, the messages it held come back; when the queue's
//! node dies, its remote consumers are cancelled and its messages are
//! there again once it returns.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use futures_lite::StreamExt as _;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Consumer};
use support::cluster::{channel_on, cluster, Node};
use support::{declare_durable, declare_passive};

fn started(test: &str) -> Vec<Node> {
    let mut nodes = cluster(test, &["secret", "secret", "secret"]);
    for node in &mut nodes {
        node.start();
    }
    nodes
}

async fn passive_count(channel: &Channel, name: &str) -> (u32, u32) {
    let queue = declare_passive(channel, name).await.expect("queue exists");
    (queue.message_count(), queue.consumer_count())
}

/// Publishes `count` persistent messages numbered from `first`, waiting
/// for every confirm; returns how many were acked.
async fn publish_confirmed(channel: &Channel, queue: &str, first: u32, count: u32) -> u32 {
    let mut pending = Vec::new();
    for number in first..first + count {
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &number.to_be_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("publish sent");
        pending.push(confirm);
    }
    let mut acked = 0;
    for confirm in pending {
        if confirm.await.expect("confirm arrives").is_ack() {
            acked += 1;
        }
    }
    acked
}

fn number(delivery: &Delivery) -> u32 {
    u32::from_be_bytes(delivery.data[..4].try_into().expect("4-byte body"))
}

async fn consumer(channel: &Channel, queue: &str, prefetch: u16) -> Consumer {
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await
        .unwrap();
    channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume-ok")
}

async fn next_delivery(consumer: &mut Consumer) -> Delivery {
    tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("a delivery within 10 s")
        .expect("the consumer is not cancelled")
        .expect("a delivery, not an error")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_queue_on_one_node_is_used_through_the_others() {
    let mut nodes = started("forwarded");
    let (_first, on_home) = channel_on(&nodes[0]).await;
    declare_durable(&on_home, "orders").await;
    let (_second, publisher) = channel_on(&nodes[1]).await;
    let (_third, on_third) = channel_on(&nodes[2]).await;
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();

    // Published through node 2, confirmed once node 1 has them safe.
    assert_eq!(publish_confirmed(&publisher, "orders", 0, 2000).await, 2000);
    // Counted by the home node, whichever node is asked.
    assert_eq!(passive_count(&on_third, "orders").await, (2000, 0));

    // basic.get through node 3: the head message, and the count behind it.
    let got = on_third
        .basic_get("orders".into(), BasicGetOptions::default())
        .await
        .unwrap()
        .expect("a message");
    assert_eq!(number(&got.delivery), 0);
    assert_eq!(got.message_count, 1999);
    got.delivery.ack(BasicAckOptions::default()).await.unwrap();

    // Consumed through node 3 within a prefetch of 50, in order.
    let mut deliveries = consumer(&on_third, "orders", 50).await;
    assert_eq!(passive_count(&on_home, "orders").await.1, 1);
    for expected in 1..2000 {
        let delivery = next_delivery(&mut deliveries).await;
        assert_eq!(number(&delivery), expected, "in publish order");
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    // Every ack reached the home node: nothing ready, nothing held.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(passive_count(&on_home, "orders").await, (0, 1));

    // Purge and delete through a node that does not hold it.
    drop(deliveries);
    on_third.close(200, "done".into()).await.unwrap();
    // The home node hears of the closed channel a moment later (as a
    // RabbitMQ queue hears of a channel on another node going down):
    // until then it may still hand that consumer what comes in.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while passive_count(&on_home, "orders").await.1 != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the consumer stays at home"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(publish_confirmed(&publisher, "orders", 0, 10).await, 10);
    let purged = publisher
        .queue_purge("orders".into(), QueuePurgeOptions::default())
        .await
        .unwrap();
    assert_eq!(purged, 10);
    assert_eq!(publish_confirmed(&publisher, "orders", 0, 3).await, 3);
    let dropped = publisher
        .queue_delete("orders".into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    assert_eq!(dropped, 3);
    let (_fresh, check) = channel_on(&nodes[0]).await;
    assert!(declare_passive(&check, "orders").await.is_err());
    for node in &mut nodes {
        node.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_queue_messages_held_on_a_node_that_dies_come_back() {
    let mut nodes = started("consumer-dies");
    let (_first, on_home) = channel_on(&nodes[0]).await;
    declare_durable(&on_home, "work").await;
    on_home
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    assert_eq!(publish_confirmed(&on_home, "work", 0, 100).await, 100);

    // A consumer on node 3 takes 20 and acks none of them.
    let (_third, on_third) = channel_on(&nodes[2]).await;
    let mut deliveries = consumer(&on_third, "work", 20).await;
    let mut held = HashSet::new();
    for _ in 0..20 {
        held.insert(number(&next_delivery(&mut deliveries).await));
    }
    assert_eq!(passive_count(&on_home, "work").await, (80, 1));

    nodes[2].kill();
    // The home node sees the link go and takes the 20 back.
    let (_second, on_second) = channel_on(&nodes[1]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while passive_count(&on_second, "work").await != (100, 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the dead consumer's messages came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Redelivered first, in their place, through node 2.
    let mut again = consumer(&on_second, "work", 100).await;
    for expected in 0..100 {
        let delivery = next_delivery(&mut again).await;
        assert_eq!(number(&delivery), expected);
        assert_eq!(delivery.redelivered, held.contains(&expected));
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    nodes[0].kill();
    nodes[1].kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_queue_whose_node_dies_cancels_remote_consumers_and_returns_with_it() {
    let mut nodes = started("home-dies");
    let (_first, on_home) = channel_on(&nodes[0]).await;
    declare_durable(&on_home, "ledger").await;
    on_home
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    assert_eq!(publish_confirmed(&on_home, "ledger", 0, 50).await, 50);

    let (_second, on_second) = channel_on(&nodes[1]).await;
    let mut deliveries = consumer(&on_second, "ledger", 10).await;
    for expected in 0..10 {
        assert_eq!(number(&next_delivery(&mut deliveries).await), expected);
    }
    nodes[0].kill();
    // basic.cancel from the server ends the consumer's stream.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = deliveries.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the remote consumer was cancelled");

    // While it is down: RabbitMQ's 404 for the queue.
    let (third, onthird) = channel_on(&nodes[2]).await;
    let error = onthird
        .basic_get("ledger".into(), BasicGetOptions::default())
        .await
        .expect_err("the queue's node is down");
    assert!(
        error.to_string().contains("is down or inaccessible"),
        "{error}"
    );
    // A message routed only to it is unroutable: mandatory returns it, and
    // the confirm is an ack, as for any unroutable message.
    let publisher = third.create_channel().await.unwrap();
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let confirmation = publisher
        .basic_publish(
            "".into(),
            "ledger".into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            b"lost?",
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirmation.is_ack());
    assert!(
        confirmation.take_message().is_some(),
        "returned as unroutable"
    );

    // Back with its node, every message still there: the 10 delivered to
    // the cancelled consumer were never acked.
    nodes[0].start();
    let (again, onthird) = channel_on(&nodes[2]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let channel = again.create_channel().await.unwrap();
        let counted = declare_passive(&channel, "ledger").await;
        if let Ok(queue) = counted {
            assert_eq!(queue.message_count(), 50);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the queue came back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut deliveries = consumer(&onthird, "ledger", 50).await;
    for expected in 0..50 {
        let delivery = next_delivery(&mut deliveries).await;
        assert_eq!(number(&delivery), expected);
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    for node in &mut nodes {
        node.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_queue_balanced_locator_spreads_queues_over_the_nodes() {
    let mut nodes = started("balanced");
    let (first, on_first) = channel_on(&nodes[0]).await;
    let mut balanced = FieldTable::default();
    balanced.insert(
        "x-queue-leader-locator".into(),
        lapin::types::AMQPValue::LongString("balanced".into()),
    );
    // Each goes to the running node with the fewest queues: a tie keeps it
    // on the declaring node, then goes by name.
    for name in ["spread-1", "spread-2", "spread-3"] {
        on_first
            .queue_declare(
                name.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                balanced.clone(),
            )
            .await
            .expect("declared");
    }
    // An unknown locator is refused as RabbitMQ refuses it.
    let mut unknown = FieldTable::default();
    unknown.insert(
        "x-queue-leader-locator".into(),
        lapin::types::AMQPValue::LongString("nearest".into()),
    );
    let refused = first
        .create_channel()
        .await
        .unwrap()
        .queue_declare("spread-x".into(), QueueDeclareOptions::default(), unknown)
        .await
        .expect_err("refused");
    assert!(
        refused
            .to_string()
            .contains("invalid arg 'x-queue-leader-locator'"),
        "{refused}"
    );

    // With node 3 gone, its queue answers for it; the others still serve.
    nodes[2].kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (name, on_third) in [("spread-1", false), ("spread-2", false), ("spread-3", true)] {
        let channel = first.create_channel().await.unwrap();
        let got = channel
            .basic_get(name.into(), BasicGetOptions::default())
            .await;
        match got {
            Ok(got) => assert!(!on_third && got.is_none(), "{name} is served"),
            Err(error) => {
                assert!(on_third, "{name}: {error}");
                assert!(error.to_string().contains(&nodes[2].name), "{error}");
            }
        }
    }
    nodes[0].kill();
    nodes[1].kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_queue_on_a_paused_node_answers_publishers_and_serves_again_once_it_resumes() {
    let mut nodes = started("paused-home");
    let (_first, on_home) = channel_on(&nodes[0]).await;
    declare_durable(&on_home, "held-up").await;
    let (second, publisher) = channel_on(&nodes[1]).await;
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    assert_eq!(publish_confirmed(&publisher, "held-up", 0, 10).await, 10);

    // The queue's node hangs: a publish through node 2 is answered anyway,
    // once the link is found dead: nacked, or (sent after that) returned
    // as unroutable. Never a silent ack, never a hang.
    nodes[0].signal(libc::SIGSTOP);
    let confirmation = tokio::time::timeout(Duration::from_secs(10), async {
        publisher
            .basic_publish(
                "".into(),
                "held-up".into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                &999u32.to_be_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap()
    })
    .await
    .expect("answered within 10 s");
    assert!(
        confirmation.is_nack() || confirmation.take_message().is_some(),
        "nacked or returned"
    );

    // It resumes: the link comes back and the queue is served through the
    // other nodes again, with every confirmed message in order.
    nodes[0].signal(libc::SIGCONT);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let channel = second.create_channel().await.unwrap();
        let counted = declare_passive(&channel, "held-up").await;
        if counted.is_ok_and(|queue| queue.message_count() >= 10) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "served again");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_third, on_third) = channel_on(&nodes[2]).await;
    let mut deliveries = consumer(&on_third, "held-up", 20).await;
    for expected in 0..10 {
        let delivery = next_delivery(&mut deliveries).await;
        assert_eq!(number(&delivery), expected);
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    for node in &mut nodes {
        node.kill();
    }
}
