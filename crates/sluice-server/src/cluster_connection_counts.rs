//! Each vhost's open connections across the cluster, for its
//! `max-connections`, which RabbitMQ counts over the whole cluster. Every
//! node tells its peers how many connections each of its vhosts has, every
//! [`COUNT_REFRESH`]; a vhost's count is its own connections here plus the
//! fresh reports of peers that are up. Between reports a limit can be
//! passed by what connects to several nodes within the same second, as in
//! RabbitMQ, whose connection tracking is also updated after the fact.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice_cluster::link::{Links, PeerState};
use sluice_cluster::node_name::NodeName;
use sluice_core::broker::Broker;

/// The link channel that carries connection counts.
pub const CONNECTION_COUNT_CHANNEL: u16 = 4;

/// How often a node reports its counts.
pub const COUNT_REFRESH: Duration = Duration::from_secs(1);

/// A peer's report is forgotten after this long without another: a node
/// that died takes its connections with it.
const REPORT_LIFETIME: Duration = Duration::from_secs(3);

/// Vhosts in one report at most (each a name and a count).
const REPORT_VHOSTS_MAX: usize = 4096;

type Counts = BTreeMap<String, u64>;

fn encode(counts: &Counts) -> Bytes {
    let mut bytes = Vec::new();
    ciborium::into_writer(counts, &mut bytes).expect("writing into a Vec cannot fail");
    Bytes::from(bytes)
}

fn decode(payload: &[u8]) -> Option<Counts> {
    let counts: Counts = ciborium::from_reader(payload).ok()?;
    (counts.len() <= REPORT_VHOSTS_MAX).then_some(counts)
}

/// This node's vhosts with connections open here.
fn local_counts(broker: &Broker) -> Counts {
    broker
        .vhosts()
        .iter()
        .filter(|vhost| vhost.connection_count() > 0)
        .take(REPORT_VHOSTS_MAX)
        .map(|vhost| (vhost.name.to_string(), vhost.connection_count()))
        .collect()
}

/// Starts reporting this node's counts to its peers and summing theirs
/// into each vhost's count of connections elsewhere.
pub fn start(links: Arc<Links>, broker: Arc<Broker>) {
    let mut reports = links.subscribe(CONNECTION_COUNT_CHANNEL);
    tokio::spawn(async move {
        let mut peers: HashMap<NodeName, (Counts, Instant)> = HashMap::new();
        let mut refresh = tokio::time::interval(COUNT_REFRESH);
        loop {
            tokio::select! {
                report = reports.recv() => {
                    let Some(report) = report else {
                        return;
                    };
                    match decode(&report.payload) {
                        Some(counts) => {
                            peers.insert(report.from, (counts, Instant::now()));
                        }
                        None => tracing::warn!(peer = %report.from, "a connection count report that does not decode"),
                    }
                }
                _ = refresh.tick() => {
                    tell_peers(&links, &encode(&local_counts(&broker))).await;
                }
            }
            let elsewhere = elsewhere(&peers, &links);
            for vhost in broker.vhosts() {
                vhost.set_connections_elsewhere(elsewhere.get(&*vhost.name).copied().unwrap_or(0));
            }
        }
    });
}

/// Each vhost's connections on the peers that are up and reported lately.
fn elsewhere(peers: &HashMap<NodeName, (Counts, Instant)>, links: &Links) -> Counts {
    let mut total = Counts::new();
    for (peer, (counts, at)) in peers {
        let up = matches!(links.peer_state(peer), Some(PeerState::Up));
        if up && at.elapsed() < REPORT_LIFETIME {
            for (vhost, count) in counts {
                *total.entry(vhost.clone()).or_default() += count;
            }
        }
    }
    total
}

async fn tell_peers(links: &Links, report: &Bytes) {
    let peers: Vec<NodeName> = links.peers().cloned().collect();
    for peer in peers {
        if matches!(links.peer_state(&peer), Some(PeerState::Up)) {
            let _ = links
                .send(&peer, CONNECTION_COUNT_CHANNEL, report.clone())
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_count_reports_survive_their_encoding() {
        let counts: Counts = [("/".to_owned(), 3), ("staging".to_owned(), 1)].into();
        assert_eq!(decode(&encode(&counts)), Some(counts));
        assert_eq!(decode(b"not cbor"), None);
    }
}
