//! An alarm on one node of a cluster blocks publishers on every node, and
//! clearing it there unblocks them: three servers linked in one test
//! process, each on its own ports and data directory.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_cluster::node_name::NodeName;
use sluice_server::cluster_config::ClusterConfig;
use sluice_server::config::Config;
use sluice_server::resource_limit::MemoryWatermark;
use sluice_server::server::start_with_cluster_listener;
use sluice_server::RunningServer;
use sluice_wire::amq_protocol::protocol::{connection, queue, AMQPClass};
use sluice_wire::amq_protocol::types::FieldTable;
use sluice_wire::method::Method;
use support::raw::RawClient;
use tokio::net::TcpListener;

async fn three_nodes(test: &str) -> (Vec<RunningServer>, Vec<std::path::PathBuf>) {
    // Every node of this process shares the secret.
    std::env::set_var("SLUICE_COOKIE", "alarm test secret");
    let mut listeners = Vec::new();
    let mut names: Vec<NodeName> = Vec::new();
    for index in 1..=3 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let name = format!("sluice{index}@{}", listener.local_addr().unwrap());
        names.push(name.parse().unwrap());
        listeners.push(listener);
    }
    let members: BTreeMap<u32, NodeName> = (1..=3).zip(names.iter().cloned()).collect();
    let mut starting = Vec::new();
    let mut dirs = Vec::new();
    for (listener, name) in listeners.into_iter().zip(&names) {
        let data_dir = std::env::temp_dir().join(format!(
            "sluice-{test}-{}-{}",
            name.name(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&data_dir);
        dirs.push(data_dir.clone());
        let config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir,
            cluster: ClusterConfig {
                node_name: Some(name.clone()),
                peer_discovery_backend: Some("classic_config".to_owned()),
                classic_config_nodes: members.clone(),
                link_heartbeat_timeout: Duration::from_secs(1),
                ..ClusterConfig::default()
            },
            ..Config::default()
        };
        starting.push(tokio::spawn(start_with_cluster_listener(
            config,
            Some(listener),
        )));
    }
    let mut servers = Vec::new();
    for started in starting {
        servers.push(started.await.unwrap().expect("the node starts"));
    }
    (servers, dirs)
}

/// Declares `queue` on channel 1 and publishes once into it.
async fn publish_once(client: &mut RawClient, queue: &str) {
    client
        .send_method(
            1,
            AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
                queue: queue.into(),
                passive: false,
                durable: false,
                exclusive: false,
                auto_delete: false,
                nowait: false,
                arguments: FieldTable::default(),
            })),
        )
        .await;
    client.read_method().await; // declare-ok
    client.publish(1, queue, b"m").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_alarms_one_nodes_alarm_blocks_publishers_on_the_others() {
    let (servers, dirs) = three_nodes("alarms").await;
    // Node 3 runs out of memory, as far as its watermark says.
    servers[2]
        .alarm_monitor()
        .set_vm_memory_high_watermark(MemoryWatermark::Absolute(0))
        .unwrap();

    let mut publisher = RawClient::open(servers[0].local_address).await;
    publisher.open_channel(1).await;
    publish_once(&mut publisher, "fed-from-node-1").await;
    let (channel_id, method) = publisher.read_method().await;
    assert_eq!(channel_id, 0);
    match method {
        Method::Control(AMQPClass::Connection(connection::AMQPMethod::Blocked(blocked))) => {
            assert_eq!(blocked.reason.as_str(), "low on memory");
        }
        other => panic!("expected connection.blocked on node 1, got {other:?}"),
    }

    // Cleared on node 3: node 1's publisher is unblocked.
    servers[2]
        .alarm_monitor()
        .set_vm_memory_high_watermark(MemoryWatermark::Relative(1.0))
        .unwrap();
    let (channel_id, method) = publisher.read_method().await;
    assert_eq!(channel_id, 0);
    assert!(
        matches!(
            method,
            Method::Control(AMQPClass::Connection(connection::AMQPMethod::Unblocked(_)))
        ),
        "expected connection.unblocked, got {method:?}"
    );

    for server in servers {
        server.stop().await;
    }
    for dir in dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}
