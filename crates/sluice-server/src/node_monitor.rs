//! Watches the cluster's other nodes for the metadata: when one goes down,
//! the leader of the metadata group proposes so, and every node deletes that
//! node's non-durable queues, as RabbitMQ does. A node that becomes leader
//! proposes it for the nodes already down, which a leader that died with
//! them could not.

use std::sync::Arc;
use std::time::Duration;

use sluice_cluster::consensus::RaftGroup;
use sluice_cluster::link::{Links, PeerState};
use sluice_cluster::node_name::NodeName;
use sluice_core::broker::Broker;
use sluice_core::metadata::{MetadataCommand, NodeLiveness};

/// How often the monitor looks whether this node became the leader.
const LEADERSHIP_POLL: Duration = Duration::from_millis(500);

/// Which nodes are up, as this node's links see them.
struct LinkLiveness(std::sync::Weak<Links>);

impl NodeLiveness for LinkLiveness {
    fn is_up(&self, node: &str) -> bool {
        let Some(links) = self.0.upgrade() else {
            return false;
        };
        let Ok(node) = node.parse::<NodeName>() else {
            return false;
        };
        *links.node() == node || matches!(links.peer_state(&node), Some(PeerState::Up))
    }

    fn members(&self) -> Vec<String> {
        let Some(links) = self.0.upgrade() else {
            return Vec::new();
        };
        std::iter::once(links.node())
            .chain(links.peers())
            .map(ToString::to_string)
            .collect()
    }
}

/// Starts watching: a task per peer and one for leadership, all ending
/// once the links shut down. The broker learns from the links which nodes
/// are up.
pub fn start(links: &Arc<Links>, broker: &Arc<Broker>, metadata: &Arc<RaftGroup>) {
    broker
        .metadata
        .install_liveness(Arc::new(LinkLiveness(Arc::downgrade(links))));
    for peer in links.peers() {
        let Some(mut state) = links.watch_peer(peer) else {
            continue;
        };
        let (peer, broker, metadata) = (peer.to_string(), Arc::clone(broker), Arc::clone(metadata));
        tokio::spawn(async move {
            while state.changed().await.is_ok() {
                let down = matches!(*state.borrow(), PeerState::Down(_));
                if down && metadata.is_leader() {
                    propose_down(&broker, &peer);
                }
            }
        });
    }
    let weak_links = Arc::downgrade(links);
    let (broker, metadata) = (Arc::clone(broker), Arc::clone(metadata));
    tokio::spawn(async move {
        let mut was_leader = false;
        loop {
            tokio::time::sleep(LEADERSHIP_POLL).await;
            let Some(links) = weak_links.upgrade() else {
                return;
            };
            let is_leader = metadata.is_leader();
            if is_leader && !was_leader {
                for peer in links.peers() {
                    if matches!(links.peer_state(peer), Some(PeerState::Down(_))) {
                        propose_down(&broker, peer.as_str());
                    }
                }
            }
            was_leader = is_leader;
        }
    });
}

fn propose_down(broker: &Broker, node: &str) {
    tracing::info!(node, "a node is down: its non-durable queues go");
    broker
        .metadata
        .propose_in_background(MetadataCommand::NodeDown {
            node: node.to_owned(),
        });
}
