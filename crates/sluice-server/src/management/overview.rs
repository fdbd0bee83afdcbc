//! `/api/overview`, `/api/whoami`, `/api/cluster-name`, `/api/extensions`
//! and `/api/nodes`: the node and its cluster at a glance.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use sluice_core::counters::MessageCounts;

use super::auth::Caller;
use super::error::{ApiError, ApiResult};
use super::list_query::ListQuery;
use super::rates::{message_stats, with_rate, RateKey};
use super::ManagementState;
use crate::alarm::{free_disk_bytes, resident_bytes};
use crate::handshake::RABBITMQ_VERSION_FOLLOWED;

pub fn routes() -> Router<Arc<ManagementState>> {
    Router::new()
        .route("/api/overview", get(overview))
        .route("/api/whoami", get(whoami))
        .route("/api/cluster-name", get(cluster_name).put(set_cluster_name))
        .route("/api/extensions", get(extensions))
        .route("/api/exchange-types", get(exchange_types))
        .route("/api/nodes", get(nodes))
        .route("/api/nodes/{name}", get(node))
}

/// The exchange types a declaration may name, as `/api/overview` lists them.
fn exchange_types_json() -> Value {
    json!([
        {"name": "direct", "description": "AMQP direct exchange, as per the AMQP specification", "enabled": true},
        {"name": "fanout", "description": "AMQP fanout exchange, as per the AMQP specification", "enabled": true},
        {"name": "headers", "description": "AMQP headers exchange, as per the AMQP specification", "enabled": true},
        {"name": "topic", "description": "AMQP topic exchange, as per the AMQP specification", "enabled": true},
    ])
}

async fn overview(State(state): State<Arc<ManagementState>>, caller: Caller) -> Json<Value> {
    let node = state.broker.node().name.to_string();
    let mut counts = MessageCounts::default();
    let mut exchanges = 0u64;
    let mut queues = Vec::new();
    for vhost in state.broker.vhosts() {
        if !caller.sees_vhost(&vhost.name) {
            continue;
        }
        counts += vhost.counts();
        exchanges += vhost.exchanges().len() as u64;
        queues.extend(vhost.queues());
    }
    let queue_count = queues.len();
    let totals = super::queues::totals(queues).await;
    let (ready, unacked) = (totals.messages_ready, totals.messages_unacknowledged);
    let rates = state.rates.rates(&RateKey::Node);
    let activity = super::peers::cluster_activity(&state).await;
    let visible = |items: &[Value]| {
        items
            .iter()
            .filter(|item| super::connections::visible_to(&caller, item))
            .count()
    };
    let (connections, channels) = (visible(&activity.connections), visible(&activity.channels));
    let mut queue_totals = Map::new();
    with_rate(
        &mut queue_totals,
        "messages",
        ready + unacked,
        rates.gauges[0] + rates.gauges[1],
    );
    with_rate(&mut queue_totals, "messages_ready", ready, rates.gauges[0]);
    with_rate(
        &mut queue_totals,
        "messages_unacknowledged",
        unacked,
        rates.gauges[1],
    );
    let churn = &state.connections.churn;
    let mut churn_rates = Map::new();
    for (name, value) in [
        ("channel_closed", churn.channels_closed.get()),
        ("channel_created", churn.channels_opened.get()),
        ("connection_closed", churn.connections_closed.get()),
        ("connection_created", churn.connections_opened.get()),
        ("queue_created", churn.queues_created.get()),
        ("queue_declared", churn.queues_declared.get()),
        ("queue_deleted", churn.queues_deleted.get()),
    ] {
        with_rate(&mut churn_rates, name, value, 0.0);
    }
    let listeners: Vec<Value> = state
        .listeners
        .iter()
        .map(|listener| {
            json!({
                "node": node,
                "protocol": listener.protocol,
                "ip_address": listener.address.ip().to_string(),
                "port": listener.address.port(),
                "socket_opts": [],
            })
        })
        .collect();
    Json(json!({
        "management_version": RABBITMQ_VERSION_FOLLOWED,
        "rates_mode": "basic",
        "exchange_types": exchange_types_json(),
        "product_version": env!("CARGO_PKG_VERSION"),
        "product_name": "Sluice",
        "rabbitmq_version": RABBITMQ_VERSION_FOLLOWED,
        "cluster_name": cluster_name_of(&state),
        "erlang_version": "none",
        "erlang_full_version": "none (Sluice is written in Rust)",
        "disable_stats": false,
        "enable_queue_totals": false,
        "message_stats": message_stats(&counts, &rates),
        "churn_rates": churn_rates,
        "queue_totals": queue_totals,
        "object_totals": {
            "channels": channels,
            "connections": connections,
            "consumers": totals.consumers,
            "exchanges": exchanges,
            "queues": queue_count,
        },
        "statistics_db_event_queue": 0,
        "node": node,
        "listeners": listeners,
        "contexts": [],
    }))
}

async fn whoami(caller: Caller) -> Json<Value> {
    Json(json!({"name": caller.user, "tags": caller.tags}))
}

/// The `cluster_name` global parameter once set, else the first member's
/// name, as RabbitMQ names a cluster after a node.
pub fn cluster_name_of(state: &ManagementState) -> String {
    match state.broker.global_parameter("cluster_name") {
        Some(parameter) => match parameter.value {
            Value::String(name) => name,
            other => other.to_string(),
        },
        None => state.cluster_name.clone(),
    }
}

async fn cluster_name(State(state): State<Arc<ManagementState>>, _caller: Caller) -> Json<Value> {
    Json(json!({"name": cluster_name_of(&state)}))
}

async fn set_cluster_name(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    body: super::body::JsonObject,
) -> ApiResult<axum::http::StatusCode> {
    caller.require_administrator()?;
    let name = body.required_text("name")?.to_owned();
    state
        .broker
        .metadata
        .propose(sluice_core::metadata::MetadataCommand::SetGlobalParameter {
            name: "cluster_name".to_owned(),
            value: Value::String(name),
        })
        .await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// The UI's plugins: none.
async fn extensions(_caller: Caller) -> Json<Value> {
    Json(json!([]))
}

async fn exchange_types(_caller: Caller) -> Json<Value> {
    Json(exchange_types_json())
}

async fn nodes(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_monitor()?;
    let local = state.broker.node().name.to_string();
    let running = state.broker.metadata.running_nodes(&local);
    let nodes = state
        .broker
        .metadata
        .cluster_nodes(&local)
        .into_iter()
        .map(|name| node_json(&state, &name, running.contains(&name)))
        .collect();
    Ok(Json(query.apply(nodes)?))
}

async fn node(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.require_monitor()?;
    let local = state.broker.node().name.to_string();
    if !state.broker.metadata.cluster_nodes(&local).contains(&name) {
        return Err(ApiError::not_found());
    }
    let running = state.broker.metadata.running_nodes(&local).contains(&name);
    Ok(Json(node_json(&state, &name, running)))
}

/// A node as `/api/nodes` lists it. Only this node's own figures are
/// known here; another node is listed with its name and whether it is up.
fn node_json(state: &ManagementState, name: &str, running: bool) -> Value {
    let local = *state.broker.node().name == *name;
    if !local {
        return json!({"name": name, "type": "disc", "running": running});
    }
    let limits = *state.alarm_limits.borrow();
    let alarms = *state.alarms.borrow();
    let descriptors = crate::fd_limit::file_descriptors().ok();
    let uptime_ms = state
        .started_at
        .elapsed()
        .map_or(0, |elapsed| elapsed.as_millis() as u64);
    json!({
        "name": name,
        "type": "disc",
        "running": true,
        "os_pid": std::process::id().to_string(),
        "uptime": uptime_ms,
        "processors": std::thread::available_parallelism().map_or(1, |count| count.get()),
        "mem_used": resident_bytes().unwrap_or(0),
        "mem_limit": limits.memory_watermark_bytes,
        "mem_alarm": alarms.memory,
        "mem_calculation_strategy": "rss",
        "disk_free": free_disk_bytes(&state.data_dir).unwrap_or(0),
        "disk_free_limit": limits.disk_free_limit_bytes,
        "disk_free_alarm": alarms.disk,
        "fd_used": descriptors.as_ref().map_or(0, |fds| fds.used),
        "fd_total": descriptors.as_ref().map_or(0, |fds| fds.total),
        "sockets_used": state.connections.len(),
        "sockets_total": state.connection_max,
        "db_dir": state.data_dir.display().to_string(),
        "rates_mode": "basic",
        "partitions": [],
        "being_drained": false,
        "exchange_types": exchange_types_json(),
        "auth_mechanisms": [
            {"name": "PLAIN", "description": "SASL PLAIN authentication mechanism", "enabled": true},
            {"name": "AMQPLAIN", "description": "QPid AMQPLAIN mechanism", "enabled": true},
        ],
    })
}
