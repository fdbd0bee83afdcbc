//! The Prometheus endpoint: RabbitMQ's `rabbitmq_prometheus` metric names,
//! types and labels, so that the Grafana dashboards written for RabbitMQ
//! ("RabbitMQ-Overview", "RabbitMQ-Quorum-Queues-Raft") work as they are.
//!
//! Everything is read when Prometheus scrapes, from the counters and state
//! the broker keeps anyway: serving metrics adds nothing to the path of a
//! message.
//!
//! - [`config`]: the `prometheus.*` keys.
//! - [`metrics`]: what is collected, and under which names.

pub mod config;
pub mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

use config::PrometheusConfig;
use metrics::{MetricsSources, Scope};

/// Prometheus's text exposition format, as RabbitMQ serves it.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Why the endpoint could not listen.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for Prometheus on {address} (prometheus.tcp.port, prometheus.tcp.ip)")]
pub struct PrometheusListenError {
    pub address: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds the endpoint. A port that was configured and cannot be had stops
/// the start; the default one in use (a second node on the machine, a
/// RabbitMQ) is logged, and the node runs without the endpoint.
pub fn bind(
    config: &PrometheusConfig,
) -> Result<Option<std::net::TcpListener>, PrometheusListenError> {
    let address = config.address();
    match std::net::TcpListener::bind(address) {
        Ok(listener) => {
            listener
                .set_nonblocking(true)
                .map_err(|source| PrometheusListenError { address, source })?;
            Ok(Some(listener))
        }
        Err(source) if config.configured => Err(PrometheusListenError { address, source }),
        Err(error) => {
            tracing::warn!(%address, %error, "the Prometheus endpoint is off: its default port is taken (set prometheus.tcp.port for this node)");
            Ok(None)
        }
    }
}

/// Serves `listener` until `shutdown` turns true.
pub fn serve(
    listener: std::net::TcpListener,
    config: &PrometheusConfig,
    sources: Arc<MetricsSources>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::from_std(listener)?;
    let address = listener.local_addr()?;
    let default_scope = if config.per_object_by_default {
        Scope::PerObject
    } else {
        Scope::Aggregated
    };
    let router = Router::new()
        .route(
            &config.path,
            get(
                move |State(sources): State<Arc<MetricsSources>>| async move {
                    exposition(&sources, default_scope)
                },
            ),
        )
        .route(
            &format!("{}/per-object", config.path),
            get(|State(sources): State<Arc<MetricsSources>>| async move {
                exposition(&sources, Scope::PerObject)
            }),
        )
        .with_state(sources);
    tracing::info!(%address, path = %config.path, "serving Prometheus metrics");
    let task = tokio::spawn(async move {
        let stopped = async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        };
        if let Err(error) = axum::serve(listener, router)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::warn!(%error, "the Prometheus endpoint stopped");
        }
    });
    Ok((address, task))
}

fn exposition(sources: &MetricsSources, scope: Scope) -> impl IntoResponse {
    ([(CONTENT_TYPE, TEXT_FORMAT)], sources.exposition(scope))
}
