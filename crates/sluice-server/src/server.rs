//! The AMQP listeners, plain and TLS: accept connections and stop them on
//! shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sluice_cluster::consensus::{ConsensusError, ConsensusNode, GroupSettings, RaftGroup, Wal};
use sluice_cluster::cookie::Cookie;
use sluice_cluster::link::{LinkSettings, Links};
use sluice_cluster::node_name::NodeName;
use sluice_core::access::FirstStartDefaults;
use sluice_core::broker::{Broker, BrokerSettings};
use sluice_core::definitions::DefinitionStore;
use sluice_core::definitions_import::{load_definitions, DefinitionsFileError, LoadedDefinitions};
use sluice_core::metadata::{MetadataCommand, NodeIdentity};
use sluice_core::paging::StoreSettings;
use sluice_core::vhost::RecoveryError;
use sluice_store::GroupCommit;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::alarm::AlarmMonitor;
use crate::bodies_under_way::BodiesUnderWay;
use crate::client_stream::ClientStream;
use crate::cluster_config::Membership;
use crate::config::Config;
use crate::connection;
use crate::connection_registry::{ConnectionRegistry, ConnectionSnapshot};
use crate::data_dir_lock::{DataDirLock, DataDirLockError};
use crate::forwarding::NodeForwarding;
use crate::http_listener::HttpListenError;
use crate::in_flight::InFlightBytes;
use crate::limits::{BODIES_UNDER_WAY_WATERMARK_DIVISOR, TX_UNCOMMITTED_WATERMARK_DIVISOR};
use crate::management::peers::PeerQueries;
use crate::management::{self, ListenerInfo, ManagementState};
use crate::metadata_log::{
    MetadataStateMachine, RaftMetadataLog, METADATA_CHANGE_TIMEOUT, METADATA_GROUP,
};
use crate::node_monitor;
use crate::prometheus;
use crate::prometheus::metrics::MetricsSources;
use crate::quorum_groups::NodeQuorumGroups;
use crate::resource_limit::LimitError;
use crate::settings::ServerSettings;
use crate::tcp_listen_options;
use crate::tls::{TlsListener, TlsSetupError};
use crate::uncommitted::UncommittedBytes;
use crate::{cluster_alarms, cluster_connection_counts};
use sluice_core::quorum_queue::replication::QuorumGroups;

/// Open connections get this long to finish their close handshake when the
/// broker shuts down.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The metadata group's log and snapshots, in the data directory.
const METADATA_DIR: &str = "metadata";

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot open the data directory")]
    Store(#[source] sluice_store::StoreError),
    #[error("cannot load definitions")]
    Definitions(#[source] DefinitionsFileError),
    #[error("cannot listen on {address}")]
    Bind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid resource limit")]
    Limit(#[source] LimitError),
    #[error(transparent)]
    DataDir(#[from] DataDirLockError),
    #[error(transparent)]
    Recovery(RecoveryError),
    #[error("invalid cluster configuration: {0}")]
    Cluster(String),
    #[error("cannot read the cluster's cookie")]
    Cookie(#[source] sluice_cluster::cookie::CookieError),
    #[error("cannot link with the cluster's other nodes")]
    Links(#[source] sluice_cluster::link::LinkError),
    #[error("cannot open the raft write-ahead log")]
    Wal(#[source] std::io::Error),
    #[error("cannot start the metadata log")]
    Metadata(#[source] ConsensusError),
    #[error("cannot take over the single-node definitions: {0}")]
    TakeOver(String),
    #[error("cannot create the default vhost and user: {0}")]
    Seed(String),
    #[error("invalid TLS configuration")]
    Tls(#[source] TlsSetupError),
    #[error(transparent)]
    HttpListen(#[from] HttpListenError),
}

/// A server that is accepting connections.
pub struct RunningServer {
    pub local_address: SocketAddr,
    /// The amqps listener's address, when `listeners.ssl.default` is set.
    pub tls_address: Option<SocketAddr>,
    /// Where Prometheus scrapes, unless the endpoint is off.
    pub prometheus_address: Option<SocketAddr>,
    prometheus_task: Option<tokio::task::JoinHandle<()>>,
    /// Where the management API listens, unless it is off.
    pub management_address: Option<SocketAddr>,
    management_task: Option<tokio::task::JoinHandle<()>>,
    pub broker: Arc<Broker>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    group_commit: Arc<GroupCommit>,
    store: Arc<DefinitionStore>,
    alarm_monitor: AlarmMonitor,
    connections: Arc<ConnectionRegistry>,
    in_flight: Arc<InFlightBytes>,
    links: Option<Arc<Links>>,
    /// The metadata group: exchanges, queues and bindings of the cluster.
    metadata: Arc<RaftGroup>,
    /// The groups of the quorum queues this node holds a member of.
    quorum_groups: Arc<NodeQuorumGroups>,
    /// Held while the server runs: no second server on this data directory.
    _data_dir_lock: DataDirLock,
}

impl RunningServer {
    /// This node's links to the other members of its cluster; None for a
    /// cluster of one.
    pub fn cluster_links(&self) -> Option<&Arc<Links>> {
        self.links.as_ref()
    }

    /// The memory and disk alarms: what is in effect, and the thresholds, which can be
    /// changed while the server runs.
    pub fn alarm_monitor(&self) -> &AlarmMonitor {
        &self.alarm_monitor
    }

    /// Bytes encoded for consumers and not yet written to their sockets,
    /// across all connections.
    pub fn in_flight_delivery_bytes(&self) -> u64 {
        self.in_flight.total()
    }

    /// File descriptors open and allowed (the soft limit, raised to the
    /// hard one at start); connections are held to a share of them.
    ///
    /// # Errors
    /// `/proc/self/fd` or the limit cannot be read.
    pub fn file_descriptors(&self) -> std::io::Result<crate::fd_limit::FileDescriptors> {
        crate::fd_limit::file_descriptors()
    }

    /// Bytes queue journals hold in memory, waiting for the disk.
    pub fn unwritten_journal_bytes(&self) -> u64 {
        self.group_commit.unwritten_total()
    }

    /// Every open connection with its flow-control state, oldest first.
    pub fn connections(&self) -> Vec<ConnectionSnapshot> {
        self.connections.snapshots()
    }

    /// Closes every connection with CONNECTION_FORCED and stops accepting.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
        if let Some(prometheus) = self.prometheus_task {
            let _ = prometheus.await;
        }
        if let Some(management) = self.management_task {
            let _ = management.await;
        }
        // After the connections: their exclusive queues' deletions may
        // still be on their way through the log.
        self.quorum_groups.stop_all().await;
        self.metadata.shutdown().await;
        if let Some(links) = &self.links {
            links.shutdown();
        }
        // Write what the last publishes buffered before the process goes.
        let group_commit = self.group_commit;
        let store = self.store;
        let wal = Arc::clone(self.quorum_groups.consensus.wal());
        let _ = tokio::task::spawn_blocking(move || {
            wal.stop();
            store.stop();
            group_commit.stop();
        })
        .await;
    }
}

/// Binds the listener and starts accepting in the background.
pub async fn start(config: Config) -> Result<RunningServer, ServerError> {
    start_with_cluster_listener(config, None).await
}

/// As [`start`], with the inter-node listener bound already (a test binds
/// port 0 first, then names the node by the port it got).
pub async fn start_with_cluster_listener(
    config: Config,
    cluster_listener: Option<TcpListener>,
) -> Result<RunningServer, ServerError> {
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    ignore_file_size_signal();
    // Checked first: a misconfigured cluster stops the node before anything
    // is opened.
    let membership = config.cluster.membership().map_err(ServerError::Cluster)?;
    // So are the TLS files: a missing certificate stops the node here.
    let tls = match config.tls.listen {
        Some(_) => Some(
            TlsListener::new(
                &config.tls,
                Duration::from_millis(config.handshake_timeout_ms),
            )
            .map_err(ServerError::Tls)?,
        ),
        None => None,
    };
    // Read first: a bad file stops the node before anything is opened.
    let loaded = match &config.load_definitions {
        Some(path) => Some(load_definitions(path).map_err(ServerError::Definitions)?),
        None => None,
    };
    // Before anything in the directory is read or written.
    let data_dir_lock = DataDirLock::acquire(&config.data_dir)?;
    // First: the store's read-ahead budget depends on the memory watermark.
    let alarm_monitor = AlarmMonitor::start(
        config.vm_memory_high_watermark(),
        config.disk_free_limit(),
        config.data_dir.clone(),
    )
    .map_err(ServerError::Limit)?;
    let (group_commit, confirm_progress, store) =
        open_store(&config, alarm_monitor.limits().memory_watermark_bytes)?;
    let durable_rounds = confirm_progress.subscribe();
    let storage = (&store, &confirm_progress);
    let node = match open_node(&config, loaded, membership, cluster_listener, storage).await {
        Ok(node) => node,
        Err(error) => {
            // Nothing is lost: the journals and the metadata log stay as
            // they were.
            store.stop();
            group_commit.stop();
            return Err(error);
        }
    };
    let OpenNode {
        broker,
        links,
        metadata,
        quorum_groups,
    } = node;
    // Only now, as RabbitMQ: a client that connects before the node has
    // joined its cluster and caught up is refused, and retries, rather
    // than left waiting on a socket nobody reads.
    let bound = match bind_listeners(&config, tls) {
        Ok(bound) => bound,
        Err(error) => {
            quorum_groups.stop_all().await;
            metadata.shutdown().await;
            if let Some(links) = &links {
                links.shutdown();
            }
            store.stop();
            group_commit.stop();
            return Err(error);
        }
    };
    // A vhost's max-connections counts every node's connections.
    if let Some(links) = &links {
        cluster_connection_counts::start(Arc::clone(links), Arc::clone(&broker));
    }
    // An alarm on any node of the cluster blocks publishers here too.
    let alarms = match &links {
        Some(links) => cluster_alarms::start(Arc::clone(links), alarm_monitor.subscribe()),
        None => alarm_monitor.subscribe(),
    };
    let connections = ConnectionRegistry::new(alarms.clone());
    let settings = Arc::new(ServerSettings::from_config(&config));
    let (shutdown, shutdown_receiver) = watch::channel(false);
    let BoundListeners {
        plain: listener,
        address: local_address,
        tls: tls_listener,
        prometheus: prometheus_listener,
        management: management_listener,
    } = bound;
    let prometheus = match prometheus_listener {
        Some(listener) => {
            let sources = Arc::new(MetricsSources {
                broker: Arc::clone(&broker),
                connections: Arc::clone(&connections),
                alarm_limits: alarm_monitor.watch_limits(),
                alarms: alarm_monitor.subscribe(),
                data_dir: config.data_dir.clone(),
                cluster_name: cluster_name(&config),
                connection_max: settings.connection_max,
                quorum_groups: Arc::clone(&quorum_groups.running),
            });
            match prometheus::serve(
                listener,
                &config.prometheus,
                sources,
                shutdown_receiver.clone(),
            ) {
                Ok(serving) => Some(serving),
                Err(error) => {
                    tracing::warn!(%error, "the Prometheus endpoint is off");
                    None
                }
            }
        }
        None => None,
    };
    crate::deleted_owners::start(
        Arc::clone(&broker),
        Arc::clone(&connections),
        shutdown_receiver.clone(),
    );
    let mut listeners = vec![ListenerInfo {
        protocol: "amqp",
        address: local_address,
    }];
    if let Some((_, _, address)) = &tls_listener {
        listeners.push(ListenerInfo {
            protocol: "amqp/ssl",
            address: *address,
        });
    }
    let management_state = Arc::new(ManagementState {
        broker: Arc::clone(&broker),
        connections: Arc::clone(&connections),
        alarms: alarm_monitor.subscribe(),
        cluster_alarms: alarms.clone(),
        alarm_limits: alarm_monitor.watch_limits(),
        data_dir: config.data_dir.clone(),
        cluster_name: cluster_name(&config),
        listeners,
        started_at: std::time::SystemTime::now(),
        connection_max: settings.connection_max,
        quorum_groups: Arc::clone(&quorum_groups.running),
        rates: Default::default(),
        peers: links
            .as_ref()
            .map(|links| PeerQueries::new(Arc::clone(links))),
    });
    // Every node answers its peers' API, whether or not its own HTTP
    // listener is on: a listing through any node shows the whole cluster.
    if let Some(links) = &links {
        management::peers::serve(
            Arc::clone(&management_state),
            Arc::clone(links),
            shutdown_receiver.clone(),
        );
    }
    let management = match management_listener {
        Some(listener) => {
            match management::serve(listener, management_state, shutdown_receiver.clone()) {
                Ok(serving) => Some(serving),
                Err(error) => {
                    tracing::warn!(%error, "the management API is off");
                    None
                }
            }
        }
        None => None,
    };
    let in_flight = InFlightBytes::new(config.delivery_buffer_total_max);
    let memory_watermark_bytes = alarm_monitor.limits().memory_watermark_bytes;
    let bodies_under_way =
        BodiesUnderWay::new(memory_watermark_bytes / BODIES_UNDER_WAY_WATERMARK_DIVISOR);
    let uncommitted =
        UncommittedBytes::new(memory_watermark_bytes / TX_UNCOMMITTED_WATERMARK_DIVISOR);
    tracing::info!(address = %local_address, "listening for AMQP 0-9-1 connections");
    let tls_address = tls_listener.as_ref().map(|(_, _, address)| *address);
    if let Some(address) = tls_address {
        tracing::info!(%address, "listening for AMQP 0-9-1 connections over TLS");
    }
    let task = tokio::spawn(accept_loop(
        Listeners {
            plain: listener,
            tls: tls_listener.map(|(listener, tls, _)| (listener, tls)),
        },
        Arc::clone(&broker),
        settings,
        shutdown_receiver,
        durable_rounds,
        connection::ResourceThrottle {
            alarms,
            registry: Arc::clone(&connections),
            in_flight: Arc::clone(&in_flight),
            bodies_under_way,
            uncommitted,
        },
    ));
    Ok(RunningServer {
        local_address,
        tls_address,
        prometheus_address: prometheus.as_ref().map(|(address, _)| *address),
        prometheus_task: prometheus.map(|(_, task)| task),
        management_address: management.as_ref().map(|(address, _)| *address),
        management_task: management.map(|(_, task)| task),
        broker,
        shutdown,
        task,
        group_commit,
        store,
        alarm_monitor,
        connections,
        in_flight,
        links,
        metadata,
        quorum_groups,
        _data_dir_lock: data_dir_lock,
    })
}

/// A node up and caught up with its cluster: the broker, its links to the
/// other nodes (None for a cluster of one), and the metadata group.
struct OpenNode {
    broker: Arc<Broker>,
    links: Option<Arc<Links>>,
    metadata: Arc<RaftGroup>,
    quorum_groups: Arc<NodeQuorumGroups>,
}

/// The broker of a node: linked with its peers, its metadata log started
/// and replayed into it (durable queues reopening their journals on the
/// way), a single-node data directory taken over, a loaded definitions
/// file applied.
async fn open_node(
    config: &Config,
    loaded: Option<LoadedDefinitions>,
    membership: Option<Membership>,
    cluster_listener: Option<TcpListener>,
    (store, confirm_progress): (&Arc<DefinitionStore>, &Arc<watch::Sender<u64>>),
) -> Result<OpenNode, ServerError> {
    let (local, members) = match &membership {
        Some(membership) => (membership.node.clone(), membership.members.clone()),
        None => {
            let local: NodeName = match &config.cluster.node_name {
                Some(name) => name.clone(),
                None => NodeIdentity::STANDALONE
                    .parse()
                    .expect("the standalone node name parses"),
            };
            (local.clone(), vec![local])
        }
    };
    let node_number = members
        .iter()
        .position(|member| *member == local)
        .map_or(0, |position| position + 1);
    let whole_cluster = members.len() == 1;
    let broker = Arc::new(open_broker(
        config,
        store,
        NodeIdentity::new(local.as_str()),
        u16::try_from(node_number).expect("at most CLUSTER_NODES_MAX members"),
    ));
    // Queues the metadata log brings back start their timers once all of it
    // is replayed.
    broker.begin_start();
    let links = match membership {
        Some(membership) => Some(start_links(config, membership, cluster_listener).await?),
        None => None,
    };
    if let Some(links) = &links {
        broker.metadata.install_forwarding(NodeForwarding::start(
            Arc::clone(links),
            Arc::clone(&broker),
            Arc::clone(confirm_progress),
        ));
    }
    let stop_links = |links: &Option<Arc<Links>>| {
        if let Some(links) = links {
            links.shutdown();
        }
    };
    // Before any group opens its log: what the WAL holds completes them.
    let wal = match Wal::open(&config.data_dir, Arc::clone(&store.group)) {
        Ok(wal) => wal,
        Err(error) => {
            stop_links(&links);
            return Err(ServerError::Wal(error));
        }
    };
    let consensus = ConsensusNode::new(links.clone(), wal);
    // Before the metadata log replays: the quorum queues it declares start
    // their members on it.
    let quorum_groups = Arc::new(NodeQuorumGroups {
        consensus: Arc::clone(&consensus),
        local: local.clone(),
        node_number: u16::try_from(node_number).expect("at most CLUSTER_NODES_MAX members"),
        confirm_progress: Arc::clone(confirm_progress),
        running: Arc::default(),
    });
    crate::quorum_hibernation::start(&quorum_groups.running, links.as_ref());
    broker
        .metadata
        .install_quorum_groups(Arc::clone(&quorum_groups) as Arc<dyn QuorumGroups>);
    let metadata = match start_metadata_log(config, &broker, local, members, &consensus).await {
        Ok(metadata) => metadata,
        Err(error) => {
            stop_links(&links);
            return Err(error);
        }
    };
    let caught_up = catch_up(&broker, store, loaded.as_ref(), whole_cluster).await;
    if let Err(error) =
        caught_up.and_then(|()| broker.finish_start().map_err(ServerError::Recovery))
    {
        quorum_groups.stop_all().await;
        metadata.shutdown().await;
        stop_links(&links);
        return Err(error);
    }
    if let Some(links) = &links {
        node_monitor::start(links, &broker, &metadata);
    }
    Ok(OpenNode {
        broker,
        links,
        metadata,
        quorum_groups,
    })
}

/// Starts the metadata group with the broker as its state machine; the
/// broker proposes through it from then on.
async fn start_metadata_log(
    config: &Config,
    broker: &Arc<Broker>,
    local: NodeName,
    members: Vec<NodeName>,
    consensus: &Arc<ConsensusNode>,
) -> Result<Arc<RaftGroup>, ServerError> {
    let replicated = members.len() > 1;
    let settings = GroupSettings::new(
        METADATA_GROUP,
        config.data_dir.join(METADATA_DIR),
        local,
        members,
    );
    let state_machine = Box::new(MetadataStateMachine {
        broker: Arc::clone(broker),
    });
    let group = consensus
        .start_group(settings, state_machine)
        .await
        .map_err(ServerError::Metadata)?;
    broker.metadata.install(
        Arc::new(RaftMetadataLog {
            group: Arc::clone(&group),
            timeout: METADATA_CHANGE_TIMEOUT,
            replicated,
        }),
        tokio::runtime::Handle::current(),
    );
    Ok(group)
}

/// Waits for the cluster (a majority of it) and the metadata it holds:
/// this node's start is itself a change every node applies, and once it is
/// applied here, so is everything before it. Then takes over a single-node
/// data directory and applies a loaded definitions file.
async fn catch_up(
    broker: &Arc<Broker>,
    store: &Arc<DefinitionStore>,
    loaded: Option<&LoadedDefinitions>,
    whole_cluster: bool,
) -> Result<(), ServerError> {
    let node = broker.node().clone();
    loop {
        let started = MetadataCommand::NodeStarted {
            node: node.name.to_string(),
            incarnation: node.incarnation,
            whole_cluster,
        };
        match broker.metadata.propose(started).await {
            Ok(()) => break,
            Err(error) => {
                tracing::warn!(%error, "waiting for a majority of the cluster's nodes");
            }
        }
    }
    let legacy = store.legacy_definitions().map_err(ServerError::Store)?;
    if let Some(definitions) = legacy {
        let take_over = MetadataCommand::TakeOver {
            node: node.name.to_string(),
            definitions,
        };
        broker
            .metadata
            .propose(take_over)
            .await
            .map_err(|error| ServerError::TakeOver(error.to_string()))?;
        store
            .retire_legacy_definitions()
            .map_err(ServerError::Store)?;
        tracing::info!("took over the definitions of a single-node data directory");
    }
    // Every node proposes it; the first applied creates the defaults, and
    // only on the cluster's first start (or the first with users kept in
    // the metadata log).
    let with_defaults = !loaded.is_some_and(LoadedDefinitions::brings_access);
    broker
        .metadata
        .propose(broker.seed_command(with_defaults))
        .await
        .map_err(|error| ServerError::Seed(error.to_string()))?;
    if let Some(loaded) = loaded {
        for command in loaded.metadata_commands(&node) {
            if let Err(error) = broker.metadata.propose(command.clone()).await {
                tracing::error!(?command, %error, "definitions file: skipping an entry");
            }
        }
    }
    Ok(())
}

/// The AMQP listener, with `tcp_listen_options`, and its address.
fn bind_amqp(
    config: &Config,
    address: SocketAddr,
) -> Result<(TcpListener, SocketAddr), ServerError> {
    let bind_error = |source| ServerError::Bind { address, source };
    let listener =
        tcp_listen_options::bind(address, &config.tcp_listen_options).map_err(bind_error)?;
    let local_address = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local_address))
}

/// The amqps listener: its socket, its TLS set-up and its address.
type BoundTlsListener = (TcpListener, TlsListener, SocketAddr);

/// The plain AMQP listener and, with `listeners.ssl.default`, the amqps
/// one; both take `tcp_listen_options`.
fn bind_listeners(
    config: &Config,
    tls: Option<TlsListener>,
) -> Result<BoundListeners, ServerError> {
    let (plain, address) = bind_amqp(config, config.listen)?;
    let tls = match (tls, config.tls.listen) {
        (Some(tls), Some(address)) => {
            let (listener, address) = bind_amqp(config, address)?;
            Some((listener, tls, address))
        }
        _ => None,
    };
    let prometheus = prometheus::bind(&config.prometheus)?;
    let management = management::bind(&config.management)?;
    Ok(BoundListeners {
        plain,
        address,
        tls,
        prometheus,
        management,
    })
}

/// `rabbitmq_cluster` in the metrics: the first member's name (RabbitMQ
/// names a cluster after a node unless `cluster_name` says otherwise), or
/// this node's.
fn cluster_name(config: &Config) -> String {
    config
        .cluster
        .classic_config_nodes
        .values()
        .next()
        .or(config.cluster.node_name.as_ref())
        .map_or_else(
            || NodeIdentity::STANDALONE.to_owned(),
            |name| name.to_string(),
        )
}

/// What a node listens on, bound before it serves.
struct BoundListeners {
    plain: TcpListener,
    address: SocketAddr,
    tls: Option<BoundTlsListener>,
    /// None when the default port was taken (see [`prometheus::bind`]).
    prometheus: Option<std::net::TcpListener>,
    /// None when the default port was taken (see [`management::bind`]).
    management: Option<std::net::TcpListener>,
}

/// The group commit, the watch bumped whenever confirms may have come due
/// (by its sync rounds, and by confirms forwarded from other nodes), which
/// wakes readers waiting to send them, and the data directory's store.
type NodeStorage = (
    Arc<GroupCommit>,
    Arc<watch::Sender<u64>>,
    Arc<DefinitionStore>,
);

fn open_store(config: &Config, memory_watermark_bytes: u64) -> Result<NodeStorage, ServerError> {
    let confirm_progress = Arc::new(watch::Sender::new(0u64));
    let rounds = Arc::clone(&confirm_progress);
    let group_commit = GroupCommit::start(config.store.sync_interval, move |_round, _failed| {
        rounds.send_modify(|progress| *progress += 1);
    });
    group_commit.set_write_budget(config.store.write_buffer_total_max);
    let store = DefinitionStore::open(
        &config.data_dir,
        Arc::clone(&group_commit),
        store_settings_within_watermark(config, memory_watermark_bytes),
    )
    .map_err(|error| {
        group_commit.stop();
        ServerError::Store(error)
    })?;
    Ok((group_commit, confirm_progress, store))
}

/// The node's broker: empty until the metadata log is replayed into it
/// (policies included: a loaded definitions file's are proposed to the
/// log, with its other sections, once the node caught up).
fn open_broker(
    config: &Config,
    store: &Arc<DefinitionStore>,
    node: NodeIdentity,
    node_number: u16,
) -> Broker {
    Broker::open(
        &BrokerSettings {
            defaults: FirstStartDefaults {
                user: config.default_user.clone(),
                pass: config.default_pass.clone(),
                vhost: config.default_vhost.clone(),
                user_tags: config.default_user_tags.clone(),
                configure: config.default_permissions.configure.clone(),
                write: config.default_permissions.write.clone(),
                read: config.default_permissions.read.clone(),
            },
            loopback_users: config.loopback_users.clone(),
            node,
            node_number,
            queue_locator: config.queue_leader_locator,
        },
        Some(Arc::clone(store)),
    )
}

/// Links this node with the others of its cluster, with the shared cookie.
async fn start_links(
    config: &Config,
    membership: Membership,
    listener: Option<TcpListener>,
) -> Result<Arc<Links>, ServerError> {
    let cookie = Cookie::load().map_err(ServerError::Cookie)?;
    let tls = crate::tls::link_tls(&config.cluster.link_tls).map_err(ServerError::Tls)?;
    let settings = LinkSettings {
        node: membership.node,
        members: membership.members,
        cookie,
        heartbeat_timeout: config.cluster.link_heartbeat_timeout,
        tls,
    };
    let (node, count) = (settings.node.clone(), settings.members.len());
    let links = match listener {
        Some(listener) => Links::start_on(listener, settings),
        None => Links::start(settings).await,
    }
    .map_err(ServerError::Links)?;
    tracing::info!(%node, nodes = count, address = %links.local_address(), "listening for the cluster's other nodes");
    Ok(links)
}

/// The store's settings, with the node's read-ahead budget held to a quarter
/// of the memory watermark: on a small node, full read-ahead windows across
/// many queues would otherwise reach the watermark on their own, and the
/// alarm would block publishers where paging should have absorbed them.
fn store_settings_within_watermark(config: &Config, watermark_bytes: u64) -> StoreSettings {
    let mut settings = config.store.settings.clone();
    settings.resident_total_max = settings
        .resident_total_max
        .min(watermark_bytes / READ_AHEAD_WATERMARK_DIVISOR);
    settings
}

/// See [`store_settings_within_watermark`].
const READ_AHEAD_WATERMARK_DIVISOR: u64 = 4;

/// The sockets the node accepts clients on.
struct Listeners {
    plain: TcpListener,
    /// The amqps listener, and the TLS its connections start with.
    tls: Option<(TcpListener, TlsListener)>,
}

/// Accepts on the amqps listener, or never when there is none.
async fn accept_tls(
    tls: Option<&(TcpListener, TlsListener)>,
) -> std::io::Result<(TcpStream, SocketAddr)> {
    match tls {
        Some((listener, _)) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// What every connection task shares.
#[derive(Clone)]
struct ConnectionShared {
    broker: Arc<Broker>,
    settings: Arc<ServerSettings>,
    shutdown: watch::Receiver<bool>,
    durable_rounds: watch::Receiver<u64>,
    throttle: connection::ResourceThrottle,
}

impl ConnectionShared {
    /// Serves a client; over TLS, its handshake first, in this same task,
    /// so that a slow TLS client holds up no one else.
    async fn serve(self, stream: TcpStream, peer: SocketAddr, tls: Option<TlsListener>) {
        let mut shutdown = self.shutdown;
        // The listener's address, for the connection's name.
        let Ok(local) = stream.local_addr() else {
            return;
        };
        let client = match tls {
            None => ClientStream::plain(stream),
            Some(tls) => match tls.accept(stream, peer, &mut shutdown).await {
                Some(client) => client,
                None => return,
            },
        };
        connection::serve(
            client,
            (peer, local),
            self.broker,
            self.settings,
            shutdown,
            self.durable_rounds,
            self.throttle,
        )
        .await;
    }
}

async fn accept_loop(
    listeners: Listeners,
    broker: Arc<Broker>,
    settings: Arc<ServerSettings>,
    mut shutdown: watch::Receiver<bool>,
    durable_rounds: watch::Receiver<u64>,
    throttle: connection::ResourceThrottle,
) {
    let shared = ConnectionShared {
        broker,
        settings: Arc::clone(&settings),
        shutdown: shutdown.clone(),
        durable_rounds,
        throttle,
    };
    // Plain and TLS connections together count against connection_max.
    let mut connections = JoinSet::new();
    let mut refusals = RefusalLog::default();
    loop {
        let (accepted, tls) = tokio::select! {
            accepted = listeners.plain.accept() => (accepted, None),
            accepted = accept_tls(listeners.tls.as_ref()) => {
                (accepted, listeners.tls.as_ref().map(|(_, tls)| tls.clone()))
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            _ = shutdown.changed() => break,
        };
        match accepted {
            Ok((stream, peer)) if connections.len() >= settings.connection_max => {
                // Closed at once: the client sees its connection end
                // rather than wait on a socket nobody reads.
                drop(stream);
                refusals.note(peer, settings.connection_max);
            }
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(settings.nodelay);
                connections.spawn(shared.clone().serve(stream, peer, tls));
            }
            Err(error) => {
                // Out of file descriptors and the like: back off rather than spin.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    drop(listeners);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.abort_all();
}

/// Connections closed at `connection_max`, logged at most once a second
/// so that a flood of them does not flood the log too.
#[derive(Default)]
struct RefusalLog {
    last_logged: Option<std::time::Instant>,
    since_logged: u64,
}

impl RefusalLog {
    fn note(&mut self, peer: SocketAddr, connection_max: usize) {
        self.since_logged += 1;
        let due = self
            .last_logged
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(1));
        if due {
            tracing::warn!(%peer, connection_max, refused = self.since_logged, "connection refused: the node has connection_max connections open");
            self.last_logged = Some(std::time::Instant::now());
            self.since_logged = 0;
        }
    }
}

/// Runs the broker until `shutdown` resolves.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let mut shutdown = std::pin::pin!(shutdown);
    // A node may wait long for a majority of its cluster: a signal meanwhile
    // stops it there (nothing it holds is lost: it has served nothing yet).
    let server = tokio::select! {
        started = start(config) => started?,
        () = &mut shutdown => {
            tracing::info!("stopped before the node was ready");
            return Ok(());
        }
    };
    shutdown.await;
    tracing::info!("shutting down");
    server.stop().await;
    Ok(())
}

/// A write past the file-size limit (`ulimit -f`) raises SIGXFSZ, whose
/// default kills the process with a core dump. Ignored, the write fails
/// with EFBIG instead, which a journal handles like any failed write: what
/// it held is nacked, and it is written to again once the limit allows.
fn ignore_file_size_signal() {
    // SAFETY: setting a signal's disposition to SIG_IGN installs no
    // handler code; it is safe at any time.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}
