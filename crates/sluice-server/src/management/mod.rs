//! The management HTTP API: RabbitMQ's `rabbitmq_management` JSON API, with
//! its paths, field names and status codes, so that the tools written
//! against it (rabbitmqadmin, client libraries' test suites, scripts,
//! `sluice ctl`) work unchanged.
//!
//! Everything is read from what the broker keeps anyway (its tables, the
//! queues' counts, the connection registry); the only state of its own is
//! the [`rates`] sampler, which turns counters into per-second rates
//! every few seconds.
//!
//! - [`config`]: the `management.*` keys.
//! - [`auth`]: basic authentication and the tags' rules.
//! - [`error`], [`list_query`], [`json`]: the shapes every endpoint shares.
//! - one module per resource: [`overview`], [`connections`], [`channels`],
//!   [`exchanges`], [`queues`], [`bindings`], [`access`] (vhosts, users,
//!   permissions), [`limits_and_topics`], [`policies`] (and parameters),
//!   [`definitions`], [`health`], [`replicas`] (quorum queue members).
//! - [`ui`]: the web UI's static files, at `/` and `/ui/`.

pub mod access;
pub mod auth;
pub mod bindings;
pub mod body;
pub mod change;
pub mod channels;
pub mod config;
pub mod connections;
pub mod definitions;
pub mod error;
pub mod exchanges;
pub mod health;
pub mod json;
pub mod limits_and_topics;
pub mod list_query;
pub mod overview;
pub mod peers;
pub mod policies;
pub mod publish;
pub mod queue_ops;
pub mod queues;
pub mod rates;
pub mod replicas;
pub mod ui;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::Uri;
use axum::serve::ListenerExt;
use axum::{Router, ServiceExt};
use sluice_core::broker::Broker;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::alarm::{AlarmLimits, Alarms};
use crate::connection_registry::ConnectionRegistry;
use crate::http_listener::{self, HttpListenError, LimitedListener, HTTP_CONNECTIONS_MAX};
use crate::quorum_hibernation::RunningGroups;
use config::ManagementConfig;

/// The largest request body taken (a definitions import, a publish):
/// RabbitMQ's default `management.http.max_body_size`, 20 MiB.
const MAX_BODY_BYTES: usize = 20 * 1024 * 1024;

/// A listener of the node, as `/api/overview` lists it.
#[derive(Clone, Debug)]
pub struct ListenerInfo {
    pub protocol: &'static str,
    pub address: SocketAddr,
}

/// What the endpoints read from and act on.
pub struct ManagementState {
    pub broker: Arc<Broker>,
    pub connections: Arc<ConnectionRegistry>,
    /// This node's own alarms.
    pub alarms: watch::Receiver<Alarms>,
    /// Alarms anywhere in the cluster.
    pub cluster_alarms: watch::Receiver<Alarms>,
    pub alarm_limits: watch::Receiver<AlarmLimits>,
    pub data_dir: PathBuf,
    pub cluster_name: String,
    pub listeners: Vec<ListenerInfo>,
    pub started_at: SystemTime,
    /// `connection_max`, RabbitMQ's socket limit.
    pub connection_max: usize,
    pub quorum_groups: RunningGroups,
    pub rates: rates::RateSampler,
    /// The way to the other nodes' connections; None in a cluster of one.
    pub peers: Option<Arc<peers::PeerQueries>>,
}

/// Binds the API's listener; None when its default port was taken.
pub fn bind(config: &ManagementConfig) -> Result<Option<std::net::TcpListener>, HttpListenError> {
    http_listener::bind(&config.listener, "the management API", "management")
}

/// Serves `listener` until `shutdown` turns true; samples rates meanwhile.
pub fn serve(
    listener: std::net::TcpListener,
    state: Arc<ManagementState>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::from_std(listener)?;
    let address = listener.local_addr()?;
    let router = router(Arc::clone(&state));
    tracing::info!(%address, "serving the management API");
    let sampler = tokio::spawn(rates::run(Arc::clone(&state), shutdown.clone()));
    let task = tokio::spawn(async move {
        let stopped = async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        };
        // Routed without a trailing slash: clients write `/api/connections/`
        // too (amqp091-go's tests do), and RabbitMQ takes both.
        let service = tower::util::MapRequest::new(router, without_trailing_slash)
            .into_make_service_with_connect_info::<SocketAddr>();
        // The tap does nothing: axum gives a peer's address (`ConnectInfo`,
        // which the loopback-only users' check reads) to any listener
        // wrapped in it, and to none of ours otherwise.
        let listener = LimitedListener::new(listener, HTTP_CONNECTIONS_MAX).tap_io(|_| ());
        if let Err(error) = axum::serve(listener, service)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::warn!(%error, "the management API stopped");
        }
        sampler.abort();
    });
    Ok((address, task))
}

fn without_trailing_slash(mut request: Request) -> Request {
    let path = request.uri().path();
    if path.len() > 1 && path.ends_with('/') {
        let trimmed = path.trim_end_matches('/');
        let rewritten = match request.uri().query() {
            Some(query) => format!("{trimmed}?{query}"),
            None => trimmed.to_owned(),
        };
        if let Ok(uri) = rewritten.parse::<Uri>() {
            *request.uri_mut() = uri;
        }
    }
    request
}

fn router(state: Arc<ManagementState>) -> Router {
    Router::new()
        .merge(overview::routes())
        .merge(connections::routes())
        .merge(channels::routes())
        .merge(exchanges::routes())
        .merge(queues::routes())
        .merge(replicas::routes())
        .merge(bindings::routes())
        .merge(access::routes())
        .merge(limits_and_topics::routes())
        .merge(definitions::routes())
        .merge(policies::routes())
        .merge(health::routes())
        .merge(ui::routes())
        .fallback(|| async { error::ApiError::not_found() })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}
