//! The inter-node link: one authenticated TCP connection per pair of
//! nodes, carrying everything they exchange, multiplexed by channel, with
//! bounded buffers and back pressure, heartbeats that find a dead or hung
//! peer within the heartbeat timeout, and reconnection with backoff.
//!
//! Of each pair, the node whose name sorts first dials and the other
//! accepts, so there is one connection per pair and nobody races to make
//! two. The dialer redials with backoff whenever the link goes down.
//!
//! - `frame`: the link's framing; `handshake`: mutual proof of the cookie.
//! - `connection`: a link that is up: reader, writer, heartbeats.
//! - `subscribers`: who receives each channel.

mod connection;
mod frame;
mod handshake;
mod subscribers;
mod tls;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

pub use connection::{LinkDown, LINK_SEND_BUFFER_BYTES_MAX, LINK_SEND_QUEUE_FRAMES};
pub use frame::{FRAME_PAYLOAD_BYTES_MAX, LINK_CHANNEL};
pub use handshake::HandshakeError;
pub use subscribers::{Received, CHANNEL_QUEUE_FRAMES};
pub use tls::LinkTls;
use tls::Linked;

use crate::cookie::Cookie;
use crate::node_name::NodeName;
use connection::LinkSender;
use subscribers::Subscribers;

/// The default time after which a peer that sent nothing, not even a
/// heartbeat, counts as down: "a few seconds", as asked of a cluster that
/// must fail over quickly. RabbitMQ's `net_ticktime` is 60 s; Erlang's
/// distribution carries far more than liveness and cannot afford false
/// alarms on a loaded VM, where a link here has its own writer task.
pub const HEARTBEAT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// The longest a handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Redialling starts this soon after a failure and doubles up to
/// [`REDIAL_DELAY_MAX`].
const REDIAL_DELAY_MIN: Duration = Duration::from_millis(100);
const REDIAL_DELAY_MAX: Duration = Duration::from_secs(5);

/// What a node needs to link with the others.
#[derive(Clone, Debug)]
pub struct LinkSettings {
    pub node: NodeName,
    /// Every node of the cluster, this one included.
    pub members: Vec<NodeName>,
    pub cookie: Cookie,
    pub heartbeat_timeout: Duration,
    /// TLS on every link (`cluster_link.ssl`); None for plain TCP.
    pub tls: Option<LinkTls>,
}

/// Where a peer's link stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerState {
    /// Never up yet.
    Connecting,
    Up,
    /// It went down, or could not be made, for this reason.
    Down(String),
}

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("cannot listen for other nodes on {address}: {error}")]
    Listen {
        address: String,
        error: std::io::Error,
    },
    #[error("{0} is not a member of the cluster")]
    NotMember(String),
    #[error("no link to {0} is up")]
    PeerDown(String),
}

struct PeerSlot {
    state: watch::Sender<PeerState>,
    /// The link's sender while it is up, with the generation of that link:
    /// a link that ends clears only its own.
    sender: Mutex<Option<(u64, LinkSender)>>,
}

/// This node's links to the other members.
pub struct Links {
    settings: LinkSettings,
    local_address: SocketAddr,
    peers: BTreeMap<NodeName, PeerSlot>,
    subscribers: Subscribers,
    generation: std::sync::atomic::AtomicU64,
    stop: watch::Sender<bool>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Links {
    /// Listens on the node's inter-node address, and dials every member
    /// whose name sorts after this node's.
    ///
    /// # Errors
    /// The listener cannot be bound.
    pub async fn start(settings: LinkSettings) -> Result<Arc<Links>, LinkError> {
        let host_port = settings.node.host_port().to_owned();
        let listener = TcpListener::bind(&host_port)
            .await
            .map_err(|error| LinkError::Listen {
                address: host_port.clone(),
                error,
            })?;
        Links::start_on(listener, settings)
    }

    /// As [`Links::start`], on a listener already bound: for a node whose
    /// name carries the address of something in front of it (a proxy, a
    /// NAT), and for tests that bind port 0 first.
    ///
    /// # Errors
    /// The listener's address cannot be read.
    pub fn start_on(
        listener: TcpListener,
        settings: LinkSettings,
    ) -> Result<Arc<Links>, LinkError> {
        let local_address = listener.local_addr().map_err(|error| LinkError::Listen {
            address: settings.node.host_port().to_owned(),
            error,
        })?;
        let peers = settings
            .members
            .iter()
            .filter(|member| **member != settings.node)
            .map(|member| {
                let slot = PeerSlot {
                    state: watch::Sender::new(PeerState::Connecting),
                    sender: Mutex::new(None),
                };
                (member.clone(), slot)
            })
            .collect();
        let links = Arc::new(Links {
            settings,
            local_address,
            peers,
            subscribers: Subscribers::default(),
            generation: std::sync::atomic::AtomicU64::new(0),
            stop: watch::Sender::new(false),
        });
        tokio::spawn(Arc::clone(&links).accept_loop(listener));
        for peer in links.peers.keys() {
            if links.settings.node < *peer {
                tokio::spawn(Arc::clone(&links).dial_loop(peer.clone()));
            }
        }
        Ok(links)
    }

    pub fn node(&self) -> &NodeName {
        &self.settings.node
    }

    /// Where the listener is bound.
    pub fn local_address(&self) -> SocketAddr {
        self.local_address
    }

    pub fn peers(&self) -> impl Iterator<Item = &NodeName> {
        self.peers.keys()
    }

    pub fn peer_state(&self, peer: &NodeName) -> Option<PeerState> {
        self.peers.get(peer).map(|slot| slot.state.borrow().clone())
    }

    /// Follows a peer's state.
    pub fn watch_peer(&self, peer: &NodeName) -> Option<watch::Receiver<PeerState>> {
        self.peers.get(peer).map(|slot| slot.state.subscribe())
    }

    /// Receives the data frames of `channel` from every peer. Channel 0 is
    /// the link's own.
    ///
    /// # Panics
    /// For channel 0.
    pub fn subscribe(&self, channel: u16) -> mpsc::Receiver<Received> {
        assert_ne!(channel, LINK_CHANNEL, "channel 0 is the link's own");
        self.subscribers.subscribe(channel)
    }

    /// Sends `payload` (at most [`FRAME_PAYLOAD_BYTES_MAX`]) to `peer` on
    /// `channel`, waiting while the peer's send buffer is full.
    ///
    /// # Errors
    /// The peer is not a member, or its link is not up.
    ///
    /// # Panics
    /// For a payload over [`FRAME_PAYLOAD_BYTES_MAX`] or channel 0.
    pub async fn send(
        &self,
        peer: &NodeName,
        channel: u16,
        payload: Bytes,
    ) -> Result<(), LinkError> {
        self.send_if(peer, None, channel, payload).await
    }

    /// The generation of the link to `peer` while one is up. Every link a
    /// node makes or accepts gets a new one, so a conversation tied to one
    /// link (a remote consumer, a forwarded publish awaiting its confirm)
    /// can tell that the link it began on is gone, even when a new one came
    /// up in between.
    pub fn generation(&self, peer: &NodeName) -> Option<u64> {
        let slot = self.peers.get(peer)?;
        lock(&slot.sender)
            .as_ref()
            .map(|(generation, _)| *generation)
    }

    /// As [`Links::send`], only on the link of generation `link`: a frame
    /// meant for a conversation on a link that went down is not sent on its
    /// successor.
    ///
    /// # Errors
    /// The peer is not a member, or that link is no longer up.
    pub async fn send_on(
        &self,
        peer: &NodeName,
        link: u64,
        channel: u16,
        payload: Bytes,
    ) -> Result<(), LinkError> {
        self.send_if(peer, Some(link), channel, payload).await
    }

    async fn send_if(
        &self,
        peer: &NodeName,
        link: Option<u64>,
        channel: u16,
        payload: Bytes,
    ) -> Result<(), LinkError> {
        assert!(
            payload.len() <= FRAME_PAYLOAD_BYTES_MAX,
            "a frame payload over the limit"
        );
        assert_ne!(channel, LINK_CHANNEL, "channel 0 is the link's own");
        let slot = self
            .peers
            .get(peer)
            .ok_or_else(|| LinkError::NotMember(peer.to_string()))?;
        let sender = lock(&slot.sender)
            .as_ref()
            .filter(|(generation, _)| link.is_none_or(|link| *generation == link))
            .map(|(_, sender)| sender.clone());
        let Some(sender) = sender else {
            return Err(LinkError::PeerDown(peer.to_string()));
        };
        if sender.send(channel, payload).await {
            Ok(())
        } else {
            Err(LinkError::PeerDown(peer.to_string()))
        }
    }

    /// Closes every link and stops listening and dialling.
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
        for slot in self.peers.values() {
            lock(&slot.sender).take();
        }
    }

    async fn stopped(mut stop: watch::Receiver<bool>) {
        let _ = stop.wait_for(|stop| *stop).await;
    }

    async fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        let stop = self.stop.subscribe();
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = Self::stopped(stop.clone()) => return,
            };
            match accepted {
                Ok((stream, address)) => {
                    tokio::spawn(Arc::clone(&self).accept_one(stream, address));
                }
                Err(error) => {
                    tracing::warn!(%error, "accepting a link failed");
                    tokio::time::sleep(REDIAL_DELAY_MIN).await;
                }
            }
        }
    }

    async fn accept_one(self: Arc<Self>, stream: TcpStream, address: SocketAddr) {
        let settings = &self.settings;
        let _ = stream.set_nodelay(true);
        let handshake = async {
            let mut stream = match &settings.tls {
                Some(tls) => Linked::Tls(tls.accept(stream).await.map_err(HandshakeError::Tls)?),
                None => Linked::Plain(stream),
            };
            let handshaken = handshake::accept(
                &mut stream.io(),
                &settings.node,
                &settings.members,
                &settings.cookie,
            )
            .await?;
            Ok((stream, handshaken))
        };
        let (stream, handshaken) = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
            Ok(Ok(linked)) => linked,
            Ok(Err(error)) => {
                log_refusal(&address.to_string(), &error);
                return;
            }
            Err(_) => {
                tracing::warn!(%address, "a node did not finish its link handshake in time");
                return;
            }
        };
        self.run_link(stream, handshaken).await;
    }

    async fn dial_loop(self: Arc<Self>, peer: NodeName) {
        let mut delay = REDIAL_DELAY_MIN;
        let mut last_failure = String::new();
        loop {
            if *self.stop.borrow() {
                return;
            }
            match self.dial(&peer).await {
                Ok((stream, handshaken)) => {
                    last_failure.clear();
                    delay = REDIAL_DELAY_MIN;
                    self.run_link(stream, handshaken).await;
                }
                Err(failure) => {
                    if failure != last_failure {
                        tracing::warn!(%peer, reason = %failure, "cannot link to a node; retrying");
                        self.set_state(&peer, PeerState::Down(failure.clone()));
                        last_failure = failure;
                    }
                }
            }
            // Jittered, so nodes that failed together do not redial in step.
            let jitter = rand::random_range(0.8..1.2);
            tokio::select! {
                () = tokio::time::sleep(delay.mul_f64(jitter)) => {}
                () = Self::stopped(self.stop.subscribe()) => return,
            }
            delay = (delay * 2).min(REDIAL_DELAY_MAX);
        }
    }

    async fn dial(&self, peer: &NodeName) -> Result<(Linked, handshake::Handshaken), String> {
        let connect = TcpStream::connect(peer.host_port());
        let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => return Err(error.to_string()),
            Err(_) => return Err("connecting timed out".to_owned()),
        };
        let _ = stream.set_nodelay(true);
        let settings = &self.settings;
        let handshake = async {
            let mut stream = match &settings.tls {
                Some(tls) => {
                    let host = peer
                        .host_port()
                        .rsplit_once(':')
                        .map_or("", |(host, _)| host);
                    Linked::Tls(
                        tls.connect(host, stream)
                            .await
                            .map_err(HandshakeError::Tls)?,
                    )
                }
                None => Linked::Plain(stream),
            };
            let handshaken =
                handshake::dial(&mut stream.io(), &settings.node, peer, &settings.cookie).await?;
            Ok((stream, handshaken))
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
            Ok(Ok(linked)) => Ok(linked),
            Ok(Err(error)) => {
                log_refusal(peer.as_str(), &error);
                Err(error.to_string())
            }
            Err(_) => Err("the handshake timed out".to_owned()),
        }
    }

    fn set_state(&self, peer: &NodeName, state: PeerState) {
        if let Some(slot) = self.peers.get(peer) {
            slot.state.send_replace(state);
        }
    }

    /// Runs a link that passed its handshake until it goes down.
    async fn run_link(&self, stream: Linked, handshaken: handshake::Handshaken) {
        let peer = handshaken.peer;
        let Some(slot) = self.peers.get(&peer) else {
            return;
        };
        let (sender, queue) = connection::send_queue();
        let generation = self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // A peer that restarted may dial before this node noticed the old
        // link die: the newest link wins.
        *lock(&slot.sender) = Some((generation, sender));
        slot.state.send_replace(PeerState::Up);
        tracing::info!(%peer, "link up");
        let down = connection::run(
            stream.into_halves(),
            handshaken.buffer,
            queue,
            (&peer, generation, &self.subscribers),
            self.settings.heartbeat_timeout,
            Self::stopped(self.stop.subscribe()),
        )
        .await;
        let mut current = lock(&slot.sender);
        if current
            .as_ref()
            .is_some_and(|(mine, _)| *mine == generation)
        {
            current.take();
            drop(current);
            slot.state.send_replace(PeerState::Down(down.to_string()));
            if !matches!(down, LinkDown::Shutdown) {
                tracing::warn!(%peer, reason = %down, "link down");
            }
        }
    }
}

/// A failed handshake is logged by both sides with the reason; a cookie
/// mismatch, which needs an operator, as an error.
fn log_refusal(peer: &str, error: &HandshakeError) {
    match error {
        HandshakeError::CookieMismatch => tracing::error!(
            peer,
            "link refused: this node's cookie differs from the peer's (SLUICE_COOKIE or $HOME/.sluice.cookie must be the same on every node)"
        ),
        HandshakeError::Refused(reason) => {
            tracing::error!(peer, reason = %reason, "link refused by the peer")
        }
        other => tracing::warn!(peer, error = %other, "link handshake failed"),
    }
}
