//! Policies in a 3-node cluster of real `sluice server` processes: a
//! policy proposed through one node reaches queues that already exist on
//! another (a classic queue homed there, a quorum queue it leads), and
//! stays in the metadata log across a restart of the whole cluster.

mod support;

use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;
use support::cluster::{channel_on, cluster, Node};
use support::{declare_durable_with, declare_passive};

/// How long a change may take to reach every node, on a machine the other
/// tests load too.
const SETTLE_WITHIN: Duration = Duration::from_secs(30);

const POLICY_FILE: &str = r#"{
  "policies": [
    {"vhost": "/", "name": "bounded", "pattern": "^jobs\\.", "apply-to": "queues",
     "priority": 0, "definition": {"max-length": 3}}
  ]
}"#;

/// Queues placed on the node the client declares them through.
fn local_arguments(queue_type: &str) -> FieldTable {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(queue_type.into()),
    );
    arguments.insert(
        "x-queue-leader-locator".into(),
        AMQPValue::LongString("client-local".into()),
    );
    arguments
}

async fn publish_confirmed(channel: &lapin::Channel, queue: &str, count: u32) {
    for number in 1..=count {
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                number.to_string().as_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("publish sent")
            .await
            .expect("a confirm arrives");
        assert!(confirm.is_ack(), "message {number} to {queue} confirmed");
    }
}

/// The queue's ready messages, as a client of `node` sees them.
async fn message_count(node: &Node, queue: &str) -> u32 {
    let (connection, channel) = channel_on(node).await;
    let count = declare_passive(&channel, queue)
        .await
        .expect("the queue exists")
        .message_count();
    let _ = connection.close(200, "bye".into()).await;
    count
}

async fn wait_for_count(node: &Node, queue: &str, wanted: u32) {
    let deadline = Instant::now() + SETTLE_WITHIN;
    loop {
        let count = message_count(node, queue).await;
        if count == wanted {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{queue} on {} holds {count}, not {wanted}",
            node.name
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn start_all(nodes: &mut [Node]) {
    for node in nodes.iter_mut() {
        node.start();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_policies_proposed_through_one_node_reach_queues_on_another_and_persist() {
    let mut nodes = cluster("policies", &["secret", "secret", "secret"]);
    start_all(&mut nodes);
    let (connection, channel) = channel_on(&nodes[2]).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare_durable_with(&channel, "jobs.classic", local_arguments("classic")).await;
    declare_durable_with(&channel, "jobs.quorum", local_arguments("quorum")).await;
    publish_confirmed(&channel, "jobs.classic", 10).await;
    publish_confirmed(&channel, "jobs.quorum", 10).await;
    connection.close(200, "bye".into()).await.unwrap();
    assert_eq!(message_count(&nodes[2], "jobs.classic").await, 10);

    // Node 1 comes back with a definitions file: it proposes the policy to
    // the metadata log as it starts, and every node applies it.
    nodes[0].kill();
    let definitions = nodes[0].data_dir.with_file_name("definitions.json");
    std::fs::write(&definitions, POLICY_FILE).unwrap();
    let config = std::fs::read_to_string(&nodes[0].config).unwrap();
    let with_definitions = format!("{config}load_definitions = {}\n", definitions.display());
    std::fs::write(&nodes[0].config, &with_definitions).unwrap();
    nodes[0].start();
    wait_for_count(&nodes[2], "jobs.classic", 3).await;
    wait_for_count(&nodes[2], "jobs.quorum", 3).await;

    // Without the file, the whole cluster restarts: the policy comes back
    // from the metadata log alone, and still bounds both queues.
    std::fs::write(&nodes[0].config, config).unwrap();
    for node in nodes.iter_mut() {
        node.kill();
    }
    start_all(&mut nodes);
    let (connection, channel) = channel_on(&nodes[2]).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    publish_confirmed(&channel, "jobs.classic", 5).await;
    publish_confirmed(&channel, "jobs.quorum", 5).await;
    connection.close(200, "bye".into()).await.unwrap();
    wait_for_count(&nodes[2], "jobs.classic", 3).await;
    wait_for_count(&nodes[2], "jobs.quorum", 3).await;
    // Through the node that proposed it too.
    wait_for_count(&nodes[0], "jobs.quorum", 3).await;
}
