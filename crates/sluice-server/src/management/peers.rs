//! The cluster's connections, channels and consumers, seen from any node,
//! as RabbitMQ's management API shows those of every node: each node
//! answers for its own over the inter-node link (channel
//! [`MANAGEMENT_CHANNEL`]), and closes its own when asked.
//!
//! A request is one frame: tag 0, an id, and the query in CBOR. The answer
//! is JSON, cut into frames of at most the link's frame size (tag 1, the
//! id, whether it is the last part, the bytes), so a node with many
//! connections answers in several. A peer that is down, or does not
//! answer within [`PEER_ANSWER_TIMEOUT`], is left out of a listing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sluice_cluster::link::{Links, PeerState, Received, FRAME_PAYLOAD_BYTES_MAX};
use sluice_cluster::node_name::NodeName;
use tokio::sync::oneshot;

use super::channels::{local_channels, local_consumers};
use super::connections::local_connections;
use super::ManagementState;

/// The link channel of management queries between nodes.
pub const MANAGEMENT_CHANNEL: u16 = 5;

/// How long a listing waits for a peer's answer.
pub const PEER_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Queries awaiting an answer at most; past it a listing shows this node
/// alone rather than queue up more.
const PENDING_MAX: usize = 1024;

/// An answer's size at most (a node with a great many connections).
const ANSWER_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Peers' queries answered at once at most; one past it is dropped (its
/// asker times out and lists without this node) rather than queued.
const ANSWERING_MAX: usize = 16;

const REQUEST: u8 = 0;
const ANSWER_PART: u8 = 1;
/// Tag, id, last-part flag.
const ANSWER_HEADER_BYTES: usize = 1 + 8 + 1;

/// What one node asks another.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum PeerQuery {
    /// Its connections, channels and consumers, as the API writes them.
    Activity,
    /// Close its connection of this name, as `DELETE /api/connections`.
    CloseConnection { name: String, reason: String },
}

/// A node's connections, channels and consumers, in the API's JSON.
#[derive(Debug, Default)]
pub struct Activity {
    pub connections: Vec<Value>,
    pub channels: Vec<Value>,
    pub consumers: Vec<Value>,
}

impl Activity {
    fn to_json(&self) -> Value {
        json!({
            "connections": self.connections,
            "channels": self.channels,
            "consumers": self.consumers,
        })
    }

    fn from_json(mut value: Value) -> Self {
        let mut take = |key: &str| match value.get_mut(key).map(Value::take) {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        };
        Activity {
            connections: take("connections"),
            channels: take("channels"),
            consumers: take("consumers"),
        }
    }

    fn extend(&mut self, more: Activity) {
        self.connections.extend(more.connections);
        self.channels.extend(more.channels);
        self.consumers.extend(more.consumers);
    }
}

/// This node's way to ask its peers; None in a cluster of one.
pub struct PeerQueries {
    links: Arc<Links>,
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, Pending>>,
}

struct Pending {
    peer: NodeName,
    received: Vec<u8>,
    answer: oneshot::Sender<Vec<u8>>,
}

impl PeerQueries {
    pub fn new(links: Arc<Links>) -> Arc<Self> {
        Arc::new(PeerQueries {
            links,
            next_id: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Pending>> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The peers whose links are up.
    fn peers_up(&self) -> Vec<NodeName> {
        self.links
            .peers()
            .filter(|peer| self.links.peer_state(peer) == Some(PeerState::Up))
            .cloned()
            .collect()
    }

    /// Asks `peer`; None when it is down, does not answer in time, or
    /// answers with something that is not JSON.
    async fn ask(&self, peer: &NodeName, query: &PeerQuery) -> Option<Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        {
            let mut pending = self.lock();
            if pending.len() >= PENDING_MAX {
                tracing::warn!(%peer, "too many management queries to peers unanswered: listing without this one");
                return None;
            }
            pending.insert(
                id,
                Pending {
                    peer: peer.clone(),
                    received: Vec::new(),
                    answer,
                },
            );
        }
        // Forgotten however this ends, a caller that went away included.
        let _forget = Forget { queries: self, id };
        let mut request = BytesMut::new();
        request.put_u8(REQUEST);
        request.put_u64(id);
        let mut encoded = Vec::new();
        ciborium::into_writer(query, &mut encoded).expect("writing into a Vec cannot fail");
        request.extend_from_slice(&encoded);
        let sent = self
            .links
            .send(peer, MANAGEMENT_CHANNEL, request.freeze())
            .await
            .is_ok();
        let answer = if sent {
            tokio::time::timeout(PEER_ANSWER_TIMEOUT, answered)
                .await
                .ok()
                .and_then(Result::ok)
        } else {
            None
        };
        serde_json::from_slice(&answer?).ok()
    }

    /// Every peer's activity that answered.
    async fn activity(&self) -> Activity {
        let peers = self.peers_up();
        let answers = futures_util::future::join_all(
            peers
                .iter()
                .map(|peer| self.ask(peer, &PeerQuery::Activity)),
        )
        .await;
        let mut all = Activity::default();
        for answer in answers.into_iter().flatten() {
            all.extend(Activity::from_json(answer));
        }
        all
    }

    /// Asks every peer to close the connection `name`; whether one did.
    async fn close_connection(&self, name: &str, reason: &str) -> bool {
        let query = PeerQuery::CloseConnection {
            name: name.to_owned(),
            reason: reason.to_owned(),
        };
        let peers = self.peers_up();
        let answers =
            futures_util::future::join_all(peers.iter().map(|peer| self.ask(peer, &query))).await;
        answers
            .into_iter()
            .flatten()
            .any(|answer| answer["closed"] == json!(true))
    }

    /// A part of an answer from `from`.
    fn answer_part(&self, from: &NodeName, mut payload: Bytes) {
        if payload.remaining() < ANSWER_HEADER_BYTES - 1 {
            return;
        }
        let id = payload.get_u64();
        let last = payload.get_u8() == 1;
        let mut pending = self.lock();
        let Some(entry) = pending.get_mut(&id) else {
            return;
        };
        if entry.peer != *from || entry.received.len() + payload.len() > ANSWER_BYTES_MAX {
            pending.remove(&id);
            return;
        }
        entry.received.extend_from_slice(&payload);
        if last {
            if let Some(entry) = pending.remove(&id) {
                let _ = entry.answer.send(entry.received);
            }
        }
    }
}

/// Removes a query's entry when its asker is done with it.
struct Forget<'a> {
    queries: &'a PeerQueries,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.queries.lock().remove(&self.id);
    }
}

/// This node's own activity.
pub fn local_activity(state: &ManagementState) -> Activity {
    Activity {
        connections: local_connections(state),
        channels: local_channels(state),
        consumers: local_consumers(state),
    }
}

/// The whole cluster's activity: this node's and that of every peer that
/// answers.
pub async fn cluster_activity(state: &ManagementState) -> Activity {
    let mut activity = local_activity(state);
    if let Some(peers) = &state.peers {
        activity.extend(peers.activity().await);
    }
    activity
}

/// Closes the connection `name` wherever it is; whether it was found.
pub async fn close_connection(state: &ManagementState, name: &str, reason: &str) -> bool {
    if close_local_connection(state, name, reason) {
        return true;
    }
    match &state.peers {
        Some(peers) => peers.close_connection(name, reason).await,
        None => false,
    }
}

fn close_local_connection(state: &ManagementState, name: &str, reason: &str) -> bool {
    let Some(connection) = state
        .connections
        .snapshots()
        .into_iter()
        .find(|connection| connection.identity.name() == name)
    else {
        return false;
    };
    tracing::info!(connection = %name, %reason, "closing a connection through the management API");
    state
        .connections
        .force_close(connection.connection_id, reason)
}

/// Answers the peers' queries and routes their answers to ours, until
/// the node shuts down.
pub fn serve(
    state: Arc<ManagementState>,
    links: Arc<Links>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut frames = links.subscribe(MANAGEMENT_CHANNEL);
    let answering = Arc::new(tokio::sync::Semaphore::new(ANSWERING_MAX));
    tokio::spawn(async move {
        loop {
            let received = tokio::select! {
                received = frames.recv() => received,
                _ = shutdown.wait_for(|stop| *stop) => return,
            };
            let Some(Received { from, payload, .. }) = received else {
                return;
            };
            let mut payload = payload;
            if payload.is_empty() {
                continue;
            }
            match payload.get_u8() {
                REQUEST if payload.remaining() >= 8 => {
                    let id = payload.get_u64();
                    let Ok(query) = ciborium::from_reader::<PeerQuery, _>(payload.as_ref()) else {
                        tracing::warn!(peer = %from, "a management query that does not decode");
                        continue;
                    };
                    let Ok(permit) = Arc::clone(&answering).try_acquire_owned() else {
                        tracing::warn!(peer = %from, "too many management queries at once: one is dropped");
                        continue;
                    };
                    let state = Arc::clone(&state);
                    let links = Arc::clone(&links);
                    tokio::spawn(async move {
                        let _permit = permit;
                        let answer = match query {
                            PeerQuery::Activity => local_activity(&state).to_json(),
                            PeerQuery::CloseConnection { name, reason } => {
                                json!({"closed": close_local_connection(&state, &name, &reason)})
                            }
                        };
                        send_answer(&links, &from, id, &answer).await;
                    });
                }
                ANSWER_PART => {
                    if let Some(peers) = &state.peers {
                        peers.answer_part(&from, payload);
                    }
                }
                _ => tracing::warn!(peer = %from, "a management frame of an unknown kind"),
            }
        }
    });
}

/// Sends `answer` to `peer` in parts that fit the link's frames.
async fn send_answer(links: &Links, peer: &NodeName, id: u64, answer: &Value) {
    let bytes = serde_json::to_vec(answer).expect("JSON values always encode");
    let part_max = FRAME_PAYLOAD_BYTES_MAX - ANSWER_HEADER_BYTES;
    let mut parts = bytes.chunks(part_max).peekable();
    if parts.peek().is_none() {
        return;
    }
    while let Some(part) = parts.next() {
        let mut frame = BytesMut::with_capacity(ANSWER_HEADER_BYTES + part.len());
        frame.put_u8(ANSWER_PART);
        frame.put_u64(id);
        frame.put_u8(u8::from(parts.peek().is_none()));
        frame.extend_from_slice(part);
        if links
            .send(peer, MANAGEMENT_CHANNEL, frame.freeze())
            .await
            .is_err()
        {
            return;
        }
    }
}
