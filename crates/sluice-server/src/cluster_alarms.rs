//! Memory and disk alarms across the cluster: as in RabbitMQ, an alarm on
//! any node blocks publishers on every node (a publisher on one node feeds
//! queues on others). Each node tells its peers its own alarms whenever
//! they change and every [`ALARM_REFRESH`]; the alarms connections obey are
//! this node's together with those its peers reported. A peer whose link is
//! down, or that has said nothing for a while, counts as alarm-free: a
//! dead node must not block the living.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice_cluster::link::{Links, PeerState};
use sluice_cluster::node_name::NodeName;
use tokio::sync::watch;

use crate::alarm::Alarms;

/// The link channel that carries alarms.
pub const ALARM_CHANNEL: u16 = 3;

/// How often a node repeats its alarms, so that a peer that (re)linked
/// learns them without waiting for a change.
pub const ALARM_REFRESH: Duration = Duration::from_secs(1);

/// A peer's report is forgotten after this long without another.
const REPORT_LIFETIME: Duration = Duration::from_secs(3);

fn encode(alarms: Alarms) -> Bytes {
    Bytes::copy_from_slice(&[u8::from(alarms.memory) | (u8::from(alarms.disk) << 1)])
}

fn decode(payload: &[u8]) -> Option<Alarms> {
    match payload {
        [byte] => Some(Alarms {
            memory: byte & 1 != 0,
            disk: byte & 2 != 0,
        }),
        _ => None,
    }
}

/// What peers reported, and when.
#[derive(Default)]
struct PeerAlarms(HashMap<NodeName, (Alarms, Instant)>);

impl PeerAlarms {
    /// This node's alarms with every fresh report of a peer that is up.
    fn combined(&self, local: Alarms, links: &Links) -> Alarms {
        let mut combined = local;
        for (peer, (alarms, at)) in &self.0 {
            let up = matches!(links.peer_state(peer), Some(PeerState::Up));
            if up && at.elapsed() < REPORT_LIFETIME {
                combined.memory |= alarms.memory;
                combined.disk |= alarms.disk;
            }
        }
        combined
    }
}

/// Starts telling peers this node's alarms and listening to theirs;
/// returns the alarms of the whole cluster, for connections to obey.
pub fn start(links: Arc<Links>, mut local: watch::Receiver<Alarms>) -> watch::Receiver<Alarms> {
    let (combined, receiver) = watch::channel(*local.borrow());
    let mut reports = links.subscribe(ALARM_CHANNEL);
    tokio::spawn(async move {
        let mut peers = PeerAlarms::default();
        let mut refresh = tokio::time::interval(ALARM_REFRESH);
        loop {
            tokio::select! {
                changed = local.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let alarms = *local.borrow();
                    tell_peers(&links, alarms).await;
                }
                report = reports.recv() => {
                    let Some(report) = report else {
                        return;
                    };
                    match decode(&report.payload) {
                        Some(alarms) => note_report(&mut peers, report.from, alarms),
                        None => tracing::warn!(peer = %report.from, "an alarm report that does not decode"),
                    }
                }
                _ = refresh.tick() => {
                    let alarms = *local.borrow();
                    tell_peers(&links, alarms).await;
                }
            }
            let alarms = *local.borrow();
            let now = peers.combined(alarms, &links);
            combined.send_if_modified(|current| {
                let changed = *current != now;
                *current = now;
                changed
            });
        }
    });
    receiver
}

fn note_report(peers: &mut PeerAlarms, peer: NodeName, alarms: Alarms) {
    let before = peers
        .0
        .get(&peer)
        .map(|(alarms, _)| *alarms)
        .unwrap_or_default();
    if before != alarms {
        if alarms.any() {
            tracing::warn!(%peer, reason = alarms.reason(), "resource alarm on another node: publishers are blocked on every node");
        } else {
            tracing::info!(%peer, "resource alarm cleared on another node");
        }
    }
    peers.0.insert(peer, (alarms, Instant::now()));
}

/// Sends this node's alarms to every peer that is up; one that is not hears
/// them with the next refresh after it links.
async fn tell_peers(links: &Links, alarms: Alarms) {
    let peers: Vec<NodeName> = links.peers().cloned().collect();
    for peer in peers {
        if matches!(links.peer_state(&peer), Some(PeerState::Up)) {
            let _ = links.send(&peer, ALARM_CHANNEL, encode(alarms)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarm_reports_survive_their_encoding() {
        for (memory, disk) in [(false, false), (true, false), (false, true), (true, true)] {
            let alarms = Alarms { memory, disk };
            assert_eq!(decode(&encode(alarms)), Some(alarms));
        }
        assert_eq!(decode(&[]), None);
        assert_eq!(decode(&[1, 2]), None);
    }
}
