//! Consensus messages over the inter-node links, for every group of the
//! node: requests carry their group and an id, responses find their waiting
//! caller by that id. Incoming requests are handled on tasks of their own,
//! so a slow group never holds up the link's reader, and at most
//! [`REQUESTS_IN_FLIGHT_MAX`] at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use bytes::Bytes;
use openraft::errors::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, OptionalSend, RaftNetworkV2, ReadPolicy};
use tokio::sync::{oneshot, Semaphore};

use super::log_store::{decode, encode_into};
use super::membership::change_on_leader;
use super::raft_slot::RaftSlot;
use super::types::{Command, Raft, TypeConfig, Vote};
use super::wire::{fragments, Message, ProposeRefusal, Reassembly, Request, Response};
use super::CONSENSUS_CHANNEL;
use crate::link::{Links, PeerState};
use crate::node_name::NodeName;

/// Requests from peers being handled at once; more wait in the link's
/// channel queue, which pushes back on the senders.
const REQUESTS_IN_FLIGHT_MAX: usize = 1024;

/// How long the leader works on a membership change a peer asked for: an
/// added member may have a long log to catch up on before it votes. The
/// node that asked gives up on its own bound first.
const MEMBERSHIP_CHANGE_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("node {0} is not reachable")]
    Unreachable(String),
    #[error("no response from node {0} within {1:?}")]
    Timeout(String, Duration),
    #[error("node {0} has no such group")]
    NoGroup(String),
}

/// What a group hands the transport to answer its peers' requests.
#[derive(Clone)]
pub struct GroupEndpoint {
    /// Started again for the request when the member parked it.
    pub raft: Arc<RaftSlot>,
    /// How long a forwarded proposal may wait for its commit on the leader.
    pub propose_timeout: Duration,
}

pub struct Transport {
    /// None for a node that is a cluster of one: its groups have no peers.
    links: Option<Arc<Links>>,
    groups: RwLock<HashMap<u64, GroupEndpoint>>,
    /// Callers waiting for a response, by request id. Entries go when the
    /// response comes or the caller gives up, so this holds at most the
    /// requests in flight.
    pending: Mutex<HashMap<u64, oneshot::Sender<Response>>>,
    next_request: AtomicU64,
    next_message: AtomicU64,
    handling: Arc<Semaphore>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Transport {
    /// Starts receiving the consensus channel of `links`.
    pub fn start(links: Arc<Links>) -> Arc<Transport> {
        let transport = Arc::new(Transport {
            groups: RwLock::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(1),
            next_message: AtomicU64::new(1),
            handling: Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX)),
            links: Some(Arc::clone(&links)),
        });
        let mut received = links.subscribe(CONSENSUS_CHANNEL);
        let weak = Arc::downgrade(&transport);
        tokio::spawn(async move {
            let mut reassembly: HashMap<NodeName, Reassembly> = HashMap::new();
            while let Some(frame) = received.recv().await {
                let Some(transport) = weak.upgrade() else {
                    return;
                };
                let whole = reassembly
                    .entry(frame.from.clone())
                    .or_default()
                    .accept(&frame.payload);
                if let Some(bytes) = whole {
                    transport.receive(frame.from, &bytes).await;
                }
            }
        });
        transport
    }

    /// The transport of a node without links.
    pub fn detached() -> Arc<Transport> {
        Arc::new(Transport {
            groups: RwLock::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(1),
            next_message: AtomicU64::new(1),
            handling: Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX)),
            links: None,
        })
    }

    pub fn register(&self, group: u64, endpoint: GroupEndpoint) {
        self.groups
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(group, endpoint);
    }

    pub fn unregister(&self, group: u64) {
        self.groups
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&group);
    }

    pub fn endpoint(&self, group: u64) -> Option<GroupEndpoint> {
        self.groups
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&group)
            .cloned()
    }

    pub fn is_up(&self, peer: &NodeName) -> bool {
        self.links
            .as_ref()
            .is_some_and(|links| matches!(links.peer_state(peer), Some(PeerState::Up)))
    }

    async fn send(&self, peer: &NodeName, message: &Message) -> Result<(), TransportError> {
        let Some(links) = &self.links else {
            return Err(TransportError::Unreachable(peer.to_string()));
        };
        let message_id = self.next_message.fetch_add(1, Ordering::Relaxed);
        let encoded = encode_into(message, Vec::with_capacity(message.size_hint()));
        for piece in fragments(message_id, &encoded) {
            links
                .send(peer, CONSENSUS_CHANNEL, piece)
                .await
                .map_err(|_| TransportError::Unreachable(peer.to_string()))?;
        }
        Ok(())
    }

    /// Sends `request` to `peer`'s `group` and waits for the response.
    pub async fn request(
        &self,
        peer: &NodeName,
        group: u64,
        request: Request,
        timeout: Duration,
    ) -> Result<Response, TransportError> {
        if !self.is_up(peer) {
            return Err(TransportError::Unreachable(peer.to_string()));
        }
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = oneshot::channel();
        lock(&self.pending).insert(id, sender);
        let sent = self
            .send(peer, &Message::Request { group, id, request })
            .await;
        let outcome = match sent {
            Err(error) => Err(error),
            Ok(()) => match tokio::time::timeout(timeout, receiver).await {
                Ok(Ok(Response::NoGroup)) => Err(TransportError::NoGroup(peer.to_string())),
                Ok(Ok(response)) => Ok(response),
                Ok(Err(_)) | Err(_) => Err(TransportError::Timeout(peer.to_string(), timeout)),
            },
        };
        lock(&self.pending).remove(&id);
        outcome
    }

    async fn receive(self: Arc<Self>, from: NodeName, bytes: &[u8]) {
        let message: Message = match decode(bytes) {
            Ok(message) => message,
            Err(error) => {
                tracing::warn!(peer = %from, %error, "undecodable consensus message");
                return;
            }
        };
        match message {
            Message::Response { id, response } => {
                let waiting = lock(&self.pending).remove(&id);
                if let Some(waiting) = waiting {
                    let _ = waiting.send(response);
                }
            }
            Message::Request { group, id, request } => {
                let Ok(permit) = Arc::clone(&self.handling).acquire_owned().await else {
                    return;
                };
                tokio::spawn(async move {
                    let response = match self.endpoint(group) {
                        Some(endpoint) => handle(endpoint, request).await,
                        None => Response::NoGroup,
                    };
                    let _ = self.send(&from, &Message::Response { id, response }).await;
                    drop(permit);
                });
            }
        }
    }
}

/// Answers a peer's request to one of this node's groups.
async fn handle(endpoint: GroupEndpoint, request: Request) -> Response {
    let raft = match endpoint.raft.in_use().await {
        Ok(raft) => raft,
        Err(reason) => {
            tracing::debug!(%reason, "a request for a group whose node cannot run");
            return Response::NoGroup;
        }
    };
    match request {
        Request::Append(request) => Response::Append(
            raft.append_entries(request)
                .await
                .map_err(|error| error.to_string()),
        ),
        Request::Vote(request) => {
            Response::Vote(raft.vote(request).await.map_err(|error| error.to_string()))
        }
        Request::Snapshot { vote, meta, data } => {
            let snapshot = openraft::alias::SnapshotOf::<TypeConfig, Vec<u8>> {
                meta,
                snapshot: data,
            };
            Response::Snapshot(
                raft.install_full_snapshot(vote, snapshot)
                    .await
                    .map_err(|error| error.to_string()),
            )
        }
        Request::ReadIndex => {
            Response::ReadIndex(read_index(&raft, endpoint.propose_timeout).await)
        }
        Request::ChangeMembership(change) => Response::MembershipChanged(
            change_on_leader(&raft, &change, MEMBERSHIP_CHANGE_TIMEOUT).await,
        ),
        Request::Propose(command) => {
            // A hibernating leader (see `RaftGroup::hibernate`) wakes for
            // the work a follower hands it.
            raft.runtime_config().tick(true);
            raft.runtime_config().heartbeat(true);
            let written = tokio::time::timeout(
                endpoint.propose_timeout,
                raft.client_write(Command(command)),
            )
            .await;
            Response::Proposed(match written {
                Ok(Ok(response)) => Ok((
                    serde_bytes::ByteBuf::from(response.data.0),
                    response.log_id.index,
                )),
                Ok(Err(error)) if error.forward_to_leader().is_some() => {
                    Err(ProposeRefusal::NotLeader)
                }
                Ok(Err(error)) => Err(ProposeRefusal::Failed(error.to_string())),
                Err(_) => Err(ProposeRefusal::Failed(
                    "not committed in time on the leader".to_owned(),
                )),
            })
        }
    }
}

/// On the leader: the index every read after now must see applied.
pub async fn read_index(raft: &Raft, timeout: Duration) -> Result<u64, ProposeRefusal> {
    match tokio::time::timeout(timeout, raft.ensure_linearizable(ReadPolicy::ReadIndex)).await {
        Ok(Ok(read)) => Ok(read.log_id().index),
        Ok(Err(error)) if error.forward_to_leader().is_some() => Err(ProposeRefusal::NotLeader),
        Ok(Err(error)) => Err(ProposeRefusal::Failed(error.to_string())),
        Err(_) => Err(ProposeRefusal::Failed(
            "leadership not confirmed in time".to_owned(),
        )),
    }
}

/// openraft's way to reach a group's peers.
pub struct GroupNetwork {
    pub transport: Arc<Transport>,
    pub group: u64,
}

impl RaftNetworkFactory<TypeConfig> for GroupNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, _target: u64, node: &BasicNode) -> PeerClient {
        PeerClient {
            transport: Arc::clone(&self.transport),
            group: self.group,
            peer: node.addr.parse().ok(),
            name: node.addr.clone(),
        }
    }
}

/// One group's view of one peer.
pub struct PeerClient {
    transport: Arc<Transport>,
    group: u64,
    /// None when the membership names a node that does not parse: every
    /// request to it fails as unreachable.
    peer: Option<NodeName>,
    name: String,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Failure(String);

impl PeerClient {
    async fn call(
        &self,
        request: Request,
        timeout: Duration,
    ) -> Result<Response, RPCError<TypeConfig>> {
        let Some(peer) = &self.peer else {
            return Err(RPCError::Unreachable(Unreachable::new(&Failure(format!(
                "unusable node name '{}'",
                self.name
            )))));
        };
        self.transport
            .request(peer, self.group, request, timeout)
            .await
            .map_err(|error| match error {
                TransportError::Unreachable(_) | TransportError::NoGroup(_) => {
                    RPCError::Unreachable(Unreachable::new(&error))
                }
                TransportError::Timeout(..) => RPCError::Network(NetworkError::new(&error)),
            })
    }
}

fn unexpected(what: &str) -> RPCError<TypeConfig> {
    RPCError::Network(NetworkError::new(&Failure(format!(
        "unexpected response to {what}"
    ))))
}

fn remote(error: String) -> RPCError<TypeConfig> {
    RPCError::Network(NetworkError::new(&Failure(error)))
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self
            .call(Request::Append(request), option.hard_ttl())
            .await?
        {
            Response::Append(result) => result.map_err(remote),
            _ => Err(unexpected("append-entries")),
        }
    }

    async fn vote(
        &mut self,
        request: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self.call(Request::Vote(request), option.hard_ttl()).await? {
            Response::Vote(result) => result.map_err(remote),
            _ => Err(unexpected("vote")),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>,
        cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let request = Request::Snapshot {
            vote,
            meta: snapshot.meta,
            data: snapshot.snapshot,
        };
        let timeout = option.hard_ttl();
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            response = self.call(request, timeout) => match response {
                Ok(Response::Snapshot(result)) => result.map_err(|error| StreamingError::Network(NetworkError::new(&Failure(error)))),
                Ok(_) => Err(StreamingError::Network(NetworkError::new(&Failure("unexpected response to snapshot".to_owned())))),
                Err(RPCError::Unreachable(error)) => Err(StreamingError::Unreachable(error)),
                Err(error) => Err(StreamingError::Network(NetworkError::new(&Failure(error.to_string())))),
            },
        }
    }
}

/// Bytes as the state machine's reply carries them.
pub fn reply_bytes(reply: serde_bytes::ByteBuf) -> Bytes {
    Bytes::from(reply.into_vec())
}
