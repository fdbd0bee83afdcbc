//! The TCP listener: accepts connections and stops them on shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sluice_cluster::cookie::Cookie;
use sluice_cluster::link::{LinkSettings, Links};
use sluice_core::broker::{Broker, BrokerSettings};
use sluice_core::definitions::{DefinitionStore, Definitions};
use sluice_core::definitions_import::{load_definitions, DefinitionsFileError, LoadedDefinitions};
use sluice_core::paging::StoreSettings;
use sluice_core::vhost::RecoveryError;
use sluice_store::GroupCommit;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::alarm::AlarmMonitor;
use crate::cluster_config::Membership;
use crate::config::Config;
use crate::connection;
use crate::connection_registry::{ConnectionRegistry, ConnectionSnapshot};
use crate::data_dir_lock::{DataDirLock, DataDirLockError};
use crate::in_flight::InFlightBytes;
use crate::resource_limit::LimitError;
use crate::settings::ServerSettings;
use crate::tcp_listen_options;

/// Open connections get this long to finish their close handshake when the
/// broker shuts down.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

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
}

/// A server that is accepting connections.
pub struct RunningServer {
    pub local_address: SocketAddr,
    pub broker: Arc<Broker>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    group_commit: Arc<GroupCommit>,
    store: Arc<DefinitionStore>,
    alarm_monitor: AlarmMonitor,
    connections: Arc<ConnectionRegistry>,
    in_flight: Arc<InFlightBytes>,
    links: Option<Arc<Links>>,
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
        if let Some(links) = &self.links {
            links.shutdown();
        }
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
        // Write what the last publishes buffered before the process goes.
        let group_commit = self.group_commit;
        let store = self.store;
        let _ = tokio::task::spawn_blocking(move || {
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
    // Checked first: a misconfigured cluster stops the node before anything
    // is opened.
    let membership = config.cluster.membership().map_err(ServerError::Cluster)?;
    // Read first: a bad file stops the node before anything is opened.
    let loaded = match &config.load_definitions {
        Some(path) => Some(load_definitions(path).map_err(ServerError::Definitions)?),
        None => None,
    };
    // Before anything in the directory is read or written.
    let data_dir_lock = DataDirLock::acquire(&config.data_dir)?;
    let (listener, local_address) = bind_amqp(&config)?;
    // First: the store's read-ahead budget depends on the memory watermark.
    let alarm_monitor = AlarmMonitor::start(
        config.vm_memory_high_watermark(),
        config.disk_free_limit(),
        config.data_dir.clone(),
    )
    .map_err(ServerError::Limit)?;
    let (group_commit, durable_rounds, store, broker) = open_node(
        &config,
        loaded,
        alarm_monitor.limits().memory_watermark_bytes,
    )?;
    let links = match membership {
        Some(membership) => {
            let started = start_links(&config, membership, cluster_listener).await;
            Some(started.inspect_err(|_| {
                store.stop();
                group_commit.stop();
            })?)
        }
        None => None,
    };
    let alarms = alarm_monitor.subscribe();
    let connections = ConnectionRegistry::new(alarm_monitor.subscribe());
    let settings = Arc::new(ServerSettings::from_config(&config));
    let (shutdown, shutdown_receiver) = watch::channel(false);
    let in_flight = InFlightBytes::new(config.delivery_buffer_total_max);
    tracing::info!(address = %local_address, "listening for AMQP 0-9-1 connections");
    let task = tokio::spawn(accept_loop(
        listener,
        Arc::clone(&broker),
        settings,
        shutdown_receiver,
        durable_rounds,
        connection::ResourceThrottle {
            alarms,
            registry: Arc::clone(&connections),
            in_flight: Arc::clone(&in_flight),
        },
    ));
    Ok(RunningServer {
        local_address,
        broker,
        shutdown,
        task,
        group_commit,
        store,
        alarm_monitor,
        connections,
        in_flight,
        links,
        _data_dir_lock: data_dir_lock,
    })
}

/// The node's storage and broker: the group commit and the watch its sync
/// rounds bump, the data directory's definitions, and the broker recovered
/// from them with a loaded definitions file applied.
#[allow(clippy::type_complexity)]
fn open_node(
    config: &Config,
    mut loaded: Option<LoadedDefinitions>,
    memory_watermark_bytes: u64,
) -> Result<
    (
        Arc<GroupCommit>,
        watch::Receiver<u64>,
        Arc<DefinitionStore>,
        Arc<Broker>,
    ),
    ServerError,
> {
    let (group_commit, durable_rounds, store, definitions) =
        open_store(config, memory_watermark_bytes)?;
    let broker = match open_broker(config, loaded.as_mut(), &store, definitions) {
        Ok(broker) => broker,
        Err(error) => {
            // Nothing is lost: the journals and definitions stay as they were.
            store.stop();
            group_commit.stop();
            return Err(ServerError::Recovery(error));
        }
    };
    if let Some(loaded) = &loaded {
        broker.import_definitions(&loaded.file);
    }
    Ok((group_commit, durable_rounds, store, broker))
}

/// The AMQP listener, with `tcp_listen_options`, and its address.
fn bind_amqp(config: &Config) -> Result<(TcpListener, SocketAddr), ServerError> {
    let bind_error = |source| ServerError::Bind {
        address: config.listen,
        source,
    };
    let listener =
        tcp_listen_options::bind(config.listen, &config.tcp_listen_options).map_err(bind_error)?;
    let local_address = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local_address))
}

/// The group commit (and the watch its sync rounds bump, which wakes
/// readers waiting to confirm persistent messages), and the data
/// directory's definitions.
#[allow(clippy::type_complexity)]
fn open_store(
    config: &Config,
    memory_watermark_bytes: u64,
) -> Result<
    (
        Arc<GroupCommit>,
        watch::Receiver<u64>,
        Arc<DefinitionStore>,
        Definitions,
    ),
    ServerError,
> {
    let (durable_rounds_sender, durable_rounds) = watch::channel(0u64);
    let group_commit = GroupCommit::start(config.store.sync_interval, move |round, _failed| {
        let _ = durable_rounds_sender.send(round);
    });
    group_commit.set_write_budget(config.store.write_buffer_total_max);
    let (store, definitions) = DefinitionStore::open(
        &config.data_dir,
        Arc::clone(&group_commit),
        store_settings_within_watermark(config, memory_watermark_bytes),
    )
    .map_err(|error| {
        group_commit.stop();
        ServerError::Store(error)
    })?;
    Ok((group_commit, durable_rounds, store, definitions))
}

/// The node's broker: its users and vhosts, recovered from `definitions`,
/// with the policies of a loaded definitions file.
fn open_broker(
    config: &Config,
    loaded: Option<&mut LoadedDefinitions>,
    store: &Arc<DefinitionStore>,
    definitions: Definitions,
) -> Result<Arc<Broker>, RecoveryError> {
    Broker::open(
        &BrokerSettings {
            default_user: config.default_user.clone(),
            default_pass: config.default_pass.clone(),
            default_vhost: config.default_vhost.clone(),
            loopback_users: config.loopback_users.clone(),
            policies: loaded
                .map(|loaded| std::mem::take(&mut loaded.policies))
                .unwrap_or_default(),
        },
        Some((Arc::clone(store), definitions)),
    )
    .map(Arc::new)
}

/// Links this node with the others of its cluster, with the shared cookie.
async fn start_links(
    config: &Config,
    membership: Membership,
    listener: Option<TcpListener>,
) -> Result<Arc<Links>, ServerError> {
    let cookie = Cookie::load().map_err(ServerError::Cookie)?;
    let settings = LinkSettings {
        node: membership.node,
        members: membership.members,
        cookie,
        heartbeat_timeout: config.cluster.link_heartbeat_timeout,
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

async fn accept_loop(
    listener: TcpListener,
    broker: Arc<Broker>,
    settings: Arc<ServerSettings>,
    mut shutdown: watch::Receiver<bool>,
    durable_rounds: watch::Receiver<u64>,
    throttle: connection::ResourceThrottle,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    connections.spawn(connection::serve(
                        stream,
                        peer,
                        Arc::clone(&broker),
                        Arc::clone(&settings),
                        shutdown.clone(),
                        durable_rounds.clone(),
                        throttle.clone(),
                    ));
                }
                Err(error) => {
                    // Out of file descriptors and the like: back off rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.abort_all();
}

/// Runs the broker until `shutdown` resolves.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let server = start(config).await?;
    shutdown.await;
    tracing::info!("shutting down");
    server.stop().await;
    Ok(())
}
