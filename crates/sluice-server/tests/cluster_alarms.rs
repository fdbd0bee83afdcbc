//! An alarm on one node of a cluster blocks publishers on every node, and
//! clearing it there unblocks them: three servers linked in one test
//! process, each on its own ports and data directory.

mod support;

use sluice_server::resource_limit::MemoryWatermark;
use sluice_wire::amq_protocol::protocol::{connection, queue, AMQPClass};
use sluice_wire::amq_protocol::types::FieldTable;
use sluice_wire::method::Method;
use support::cluster::TestCluster;
use support::raw::RawClient;

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
    let cluster = TestCluster::start("alarms", 3, |_, _, _| {}).await;
    let servers = &cluster.servers;
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

    cluster.stop().await;
}
