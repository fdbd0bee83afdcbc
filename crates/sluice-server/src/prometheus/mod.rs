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

use crate::http_listener::{self, HttpListenError, LimitedListener, HTTP_CONNECTIONS_MAX};
use config::PrometheusConfig;
use metrics::{MetricsSources, Scope};

/// Prometheus's text exposition format, as RabbitMQ serves it.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Binds the endpoint; None when its default port was taken (see
/// [`crate::http_listener`]).
pub fn bind(config: &PrometheusConfig) -> Result<Option<std::net::TcpListener>, HttpListenError> {
    http_listener::bind(&config.listener, "Prometheus", "prometheus")
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
        let listener = LimitedListener::new(listener, HTTP_CONNECTIONS_MAX);
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
