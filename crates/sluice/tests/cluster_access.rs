//! Users, permissions and vhost limits in a 3-node cluster of real
//! `sluice server` processes: a RabbitMQ export loaded at start lets its
//! users in through every node, and a vhost's `max-queues` counts the
//! queues declared through all of them.

mod support;

use std::io::Write;
use std::path::PathBuf;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use support::cluster::{cluster, Node};
use support::connect_uri;

fn exported_definitions() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../sluice-server/tests/fixtures/rabbitmq-3.10.8-definitions.json")
}

fn uri(node: &Node, user: &str, password: &str, vhost: &str) -> String {
    format!(
        "amqp://{user}:{password}@127.0.0.1:{}/{}",
        node.amqp_port,
        vhost.replace('/', "%2f")
    )
}

async fn login(node: &Node, user: &str, password: &str, vhost: &str) -> lapin::Result<Connection> {
    Connection::connect(
        &uri(node, user, password, vhost),
        ConnectionProperties::default(),
    )
    .await
}

/// Logs in once the node is up (it refuses connections until it has
/// joined its cluster).
async fn login_when_up(node: &Node, user: &str, password: &str, vhost: &str) -> Connection {
    connect_uri(&uri(node, user, password, vhost)).await
}

async fn declare(connection: &Connection, name: &str) -> lapin::Result<lapin::Queue> {
    let channel = connection.create_channel().await.expect("channel opens");
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_access_users_and_limits_hold_on_every_node() {
    let mut nodes = cluster("access", &["secret", "secret", "secret"]);
    for node in &nodes {
        let mut config = std::fs::OpenOptions::new()
            .append(true)
            .open(&node.config)
            .unwrap();
        writeln!(
            config,
            "load_definitions = {}",
            exported_definitions().display()
        )
        .unwrap();
    }
    for node in &mut nodes {
        node.start();
    }
    for node in &nodes {
        login_when_up(node, "alice", "alice-pw", "staging").await;
        login_when_up(node, "bob", "bob-pw", "/").await;
        match login(node, "bob", "bob-pw", "staging").await {
            Err(error) => assert!(
                error
                    .to_string()
                    .contains("access to vhost 'staging' refused for user 'bob'"),
                "{error}"
            ),
            Ok(_) => panic!("bob has no permissions in staging"),
        }
    }
    // staging's max-queues is 3 and carol.inbox is one: two more fit, on
    // whichever nodes they are declared through.
    let first = login_when_up(&nodes[0], "alice", "alice-pw", "staging").await;
    let second = login_when_up(&nodes[1], "alice", "alice-pw", "staging").await;
    let third = login_when_up(&nodes[2], "alice", "alice-pw", "staging").await;
    declare(&first, "lim.1").await.expect("under the limit");
    declare(&second, "lim.2").await.expect("under the limit");
    let refused = declare(&third, "lim.3")
        .await
        .expect_err("the vhost is full");
    assert!(
        refused.to_string().contains(
            "cannot declare queue 'lim.3': queue limit in vhost 'staging' (3) is reached"
        ),
        "{refused}"
    );
}
