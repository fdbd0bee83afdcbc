//! The metadata of a 3-node cluster of real `sluice server` processes:
//! what a client declares through one node is there on the others; changes
//! go on with a node down (killed or paused) and the node learns them when
//! it returns; with the majority down a change fails, clearly and within
//! the bound, instead of hanging. A lookup through a node that has not yet
//! applied a change another node answered waits for it.

mod support;

use std::time::{Duration, Instant};

use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, ExchangeKind};
use support::cluster::{channel_on, cluster, Node};
use support::declare_passive;

async fn declare_exchange(channel: &Channel, name: &str) -> lapin::Result<()> {
    channel
        .exchange_declare(
            name.into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
}

/// Whether the exchange exists, as a client sees it: a passive declare on
/// a channel of its own (a miss closes the channel).
async fn exchange_exists(connection: &lapin::Connection, name: &str) -> bool {
    let channel = connection.create_channel().await.expect("channel opens");
    channel
        .exchange_declare(
            name.into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .is_ok()
}

async fn queue_exists(connection: &lapin::Connection, name: &str) -> bool {
    let channel = connection.create_channel().await.expect("channel opens");
    declare_passive(&channel, name).await.is_ok()
}

/// Declares auto-delete queue `name` and consumes from it.
async fn consume_from_auto_delete(
    channel: Channel,
    name: &'static str,
) -> lapin::Result<lapin::Consumer> {
    let auto_delete = QueueDeclareOptions {
        auto_delete: true,
        ..Default::default()
    };
    channel
        .queue_declare(name.into(), auto_delete, FieldTable::default())
        .await?;
    channel
        .basic_consume(
            name.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
}

fn started(test: &str) -> Vec<Node> {
    let mut nodes = cluster(test, &["secret", "secret", "secret"]);
    // In any order.
    for index in [1, 2, 0] {
        nodes[index].start();
    }
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_metadata_declared_on_one_node_is_seen_on_the_others() {
    let nodes = started("metadata-seen");
    let (first, channel) = channel_on(&nodes[0]).await;
    declare_exchange(&channel, "orders")
        .await
        .expect("exchange declares");
    channel
        .queue_declare(
            "orders.eu".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("queue declares");
    channel
        .queue_bind(
            "orders.eu".into(),
            "orders".into(),
            "eu".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("queue binds");
    for node in &nodes[1..] {
        // At once: a lookup that misses waits for what the cluster
        // committed before it answers.
        let (connection, channel) = channel_on(node).await;
        assert!(
            queue_exists(&connection, "orders.eu").await,
            "{}",
            node.name
        );
        assert!(
            exchange_exists(&connection, "orders").await,
            "{}",
            node.name
        );
        // The binding is there too: the exchange is in use.
        let refused = channel
            .exchange_delete(
                "orders".into(),
                ExchangeDeleteOptions {
                    if_unused: true,
                    ..Default::default()
                },
            )
            .await;
        assert!(refused.is_err(), "{} sees the binding", node.name);
        // Its messages are on node 1, and this node asks there.
        let channel = connection.create_channel().await.expect("channel opens");
        let got = channel
            .basic_get("orders.eu".into(), BasicGetOptions::default())
            .await
            .expect("served through this node");
        assert!(got.is_none(), "the queue is empty");
        connection.close(200, "bye".into()).await.ok();
    }
    first.close(200, "bye".into()).await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_metadata_changes_go_on_without_a_node_which_learns_them_on_return() {
    let mut nodes = started("metadata-return");
    let (first, channel) = channel_on(&nodes[0]).await;
    declare_exchange(&channel, "before")
        .await
        .expect("declares");

    // Killed: the two others are a majority.
    nodes[2].kill();
    declare_exchange(&channel, "while-killed")
        .await
        .expect("declares with a node down");
    nodes[2].start();
    let (third, _) = channel_on(&nodes[2]).await;
    assert!(exchange_exists(&third, "before").await);
    assert!(exchange_exists(&third, "while-killed").await);
    third.close(200, "bye".into()).await.ok();

    // Paused, as if partitioned: the same.
    nodes[1].signal(libc::SIGSTOP);
    declare_exchange(&channel, "while-paused")
        .await
        .expect("declares with a node hung");
    nodes[1].signal(libc::SIGCONT);
    let (second, _) = channel_on(&nodes[1]).await;
    assert!(exchange_exists(&second, "while-paused").await);
    second.close(200, "bye".into()).await.ok();
    first.close(200, "bye".into()).await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_metadata_without_a_majority_a_change_fails_clearly_within_the_bound() {
    let mut nodes = started("metadata-minority");
    let (first, channel) = channel_on(&nodes[0]).await;
    declare_exchange(&channel, "with-majority")
        .await
        .expect("declares");
    nodes[1].kill();
    nodes[2].kill();
    let began = Instant::now();
    let error = declare_exchange(&channel, "without-majority")
        .await
        .expect_err("no majority, no change");
    let waited = began.elapsed();
    let text = error.to_string();
    assert!(
        text.contains("541") || text.contains("INTERNAL_ERROR"),
        "{text}"
    );
    assert!(text.contains("no majority"), "{text}");
    assert!(
        waited < Duration::from_secs(20),
        "failed only after {waited:?}"
    );
    // Reads stay local: what exists is still there.
    let (still, _) = channel_on(&nodes[0]).await;
    assert!(exchange_exists(&still, "with-majority").await);
    still.close(200, "bye".into()).await.ok();
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_metadata_a_dead_node_takes_its_non_durable_queues_with_it() {
    let mut nodes = started("metadata-dead-node");
    let (third, channel) = channel_on(&nodes[2]).await;
    for (name, durable) in [("lives-on", true), ("goes-with-its-node", false)] {
        channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions {
                    durable,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("queue declares");
    }
    drop(third);
    nodes[2].kill();
    let (first, _) = channel_on(&nodes[0]).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while queue_exists(&first, "goes-with-its-node").await {
        assert!(Instant::now() < deadline, "the dead node's queue stayed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The durable one waits for its node; meanwhile it is answered for as
    // RabbitMQ answers for a queue whose node is gone.
    let channel = first.create_channel().await.expect("channel opens");
    let error = declare_passive(&channel, "lives-on")
        .await
        .expect_err("its node is down");
    let text = error.to_string();
    let expected = format!(
        "NOT_FOUND - home node '{}' of durable queue 'lives-on' in vhost '/' is down or inaccessible",
        nodes[2].name
    );
    assert!(text.contains(&expected), "{text}");
    nodes[2].start();
    let (back, _) = channel_on(&nodes[2]).await;
    assert!(queue_exists(&back, "lives-on").await, "back with its node");
    assert!(!queue_exists(&back, "goes-with-its-node").await);
    back.close(200, "bye".into()).await.ok();
    first.close(200, "bye".into()).await.ok();
}

/// amqp091-go's reconnect example, with the deletion's window held open:
/// a connection consuming from an auto-delete queue closes (its consumer
/// still on, as a client that does not cancel first) while the two other
/// nodes are paused, so the queue's deletion is decided but cannot commit.
/// The next connection declares the queue again and consumes from it: the
/// declaration waits for the deletion and makes the queue anew instead of
/// answering with the doomed queue, whose consume would meet 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_metadata_an_auto_delete_queue_declared_again_while_its_deletion_is_under_way() {
    let nodes = started("metadata-auto-delete-again");
    let consume = |channel| consume_from_auto_delete(channel, "reconnect");
    let (old, old_channel) = channel_on(&nodes[0]).await;
    // Kept: lapin cancels a consumer it drops, and the point is a close
    // with the consumer still on.
    let _old_consumer = consume(old_channel).await.expect("first consumer");
    let (new, new_channel) = channel_on(&nodes[0]).await;

    nodes[1].signal(libc::SIGSTOP);
    nodes[2].signal(libc::SIGSTOP);
    old.close(200, "reconnect".into())
        .await
        .expect("close-ok, though the deletion cannot commit yet");
    let declared_again = tokio::spawn(consume(new_channel));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !declared_again.is_finished(),
        "answered before the deletion could commit"
    );
    nodes[1].signal(libc::SIGCONT);
    nodes[2].signal(libc::SIGCONT);
    let _new_consumer = tokio::time::timeout(Duration::from_secs(30), declared_again)
        .await
        .expect("answered once the majority is back")
        .expect("the task ran")
        .expect("declared anew and consumed from");
    let queue = declare_passive(
        &new.create_channel().await.expect("channel opens"),
        "reconnect",
    )
    .await
    .expect("the new queue is there");
    assert_eq!(queue.consumer_count(), 1);
    new.close(200, "bye".into()).await.ok();
}

/// A passive declaration of an auto-delete queue whose last consumer left
/// finds no queue, though the two other nodes are paused and its deletion
/// cannot commit yet: the queue is gone for clients from the moment its
/// deletion is decided, as for its consumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_metadata_a_passive_declare_finds_no_queue_whose_deletion_is_under_way() {
    let nodes = started("metadata-passive-doomed");
    let (old, old_channel) = channel_on(&nodes[0]).await;
    // Kept, so that the close below leaves with the consumer still on.
    let _consumer = consume_from_auto_delete(old_channel, "doomed")
        .await
        .expect("declared and consumed from");
    let (new, _) = channel_on(&nodes[0]).await;

    nodes[1].signal(libc::SIGSTOP);
    nodes[2].signal(libc::SIGSTOP);
    old.close(200, "bye".into())
        .await
        .expect("close-ok, though the deletion cannot commit yet");
    let channel = new.create_channel().await.expect("channel opens");
    let error = declare_passive(&channel, "doomed")
        .await
        .expect_err("no queue while its deletion is under way");
    let text = error.to_string();
    assert!(
        text.contains("NOT_FOUND - no queue 'doomed' in vhost '/'"),
        "{text}"
    );
    nodes[1].signal(libc::SIGCONT);
    nodes[2].signal(libc::SIGCONT);
    // Another node sees the queue until the deletion commits.
    let (other, _) = channel_on(&nodes[1]).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while queue_exists(&other, "doomed").await {
        assert!(Instant::now() < deadline, "the deletion never committed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    other.close(200, "bye".into()).await.ok();
    new.close(200, "bye".into()).await.ok();
}
