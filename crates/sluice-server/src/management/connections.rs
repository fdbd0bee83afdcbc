//! `/api/connections`: the node's AMQP connections, and closing one.
//!
//! A connection is named as RabbitMQ names it (`"127.0.0.1:54321 ->
//! 127.0.0.1:5672"`); `DELETE /api/connections/{name}` closes it with 320
//! CONNECTION_FORCED and the `X-Reason` header (or RabbitMQ's default) as
//! the text.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Map, Value};

use super::auth::Caller;
use super::error::{ApiError, ApiResult};
use super::json::table_to_json;
use super::list_query::ListQuery;
use super::peers::{close_connection, cluster_activity};
use super::rates::{with_rate, RateKey};
use super::ManagementState;
use crate::connection_registry::ConnectionSnapshot;

/// What a connection closed through the API hears without an `X-Reason`.
const DEFAULT_CLOSE_REASON: &str = "Closed via management plugin";

pub fn routes() -> Router<Arc<ManagementState>> {
    Router::new()
        .route("/api/connections", get(list))
        .route("/api/connections/{name}", get(show).delete(close))
        .route("/api/connections/{name}/channels", get(channels_of))
        .route("/api/vhosts/{vhost}/connections", get(list_in_vhost))
}

/// This node's connections, as the API writes them.
pub fn local_connections(state: &ManagementState) -> Vec<Value> {
    state
        .connections
        .snapshots()
        .iter()
        .map(|connection| connection_json(state, connection))
        .collect()
}

/// Whether the caller sees an item (a connection, a channel) of the user
/// its `user` field names: monitors see all, others their own.
pub fn visible_to(caller: &Caller, item: &Value) -> bool {
    item["user"]
        .as_str()
        .is_some_and(|user| caller.sees_user_connections(user))
}
pub fn connection_json(state: &ManagementState, connection: &ConnectionSnapshot) -> Value {
    let identity = &connection.identity;
    let rates = state
        .rates
        .rates(&RateKey::Connection(connection.connection_id));
    let client_properties = table_to_json(&identity.client_properties);
    let user_provided_name = client_properties
        .get("connection_name")
        .cloned()
        .unwrap_or(Value::Null);
    let mut object = Map::new();
    object.insert("name".into(), json!(identity.name()));
    object.insert("node".into(), json!(state.broker.node().name.as_ref()));
    object.insert("type".into(), json!("network"));
    object.insert("protocol".into(), json!("AMQP 0-9-1"));
    object.insert("user".into(), json!(identity.user));
    object.insert("user_who_performed_action".into(), json!(identity.user));
    object.insert("vhost".into(), json!(identity.vhost));
    object.insert("state".into(), json!(connection.state.as_str()));
    object.insert("channels".into(), json!(connection.channels.len()));
    object.insert("channel_max".into(), json!(identity.channel_max));
    object.insert("frame_max".into(), json!(identity.frame_max));
    object.insert("timeout".into(), json!(identity.heartbeat_secs));
    object.insert("auth_mechanism".into(), json!(identity.auth_mechanism));
    object.insert(
        "host".into(),
        json!(identity.local_address.ip().to_string()),
    );
    object.insert("port".into(), json!(identity.local_address.port()));
    object.insert(
        "peer_host".into(),
        json!(identity.peer_address.ip().to_string()),
    );
    object.insert("peer_port".into(), json!(identity.peer_address.port()));
    object.insert("ssl".into(), json!(identity.tls));
    object.insert(
        "connected_at".into(),
        json!(connection
            .connected_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64)),
    );
    object.insert("client_properties".into(), client_properties);
    object.insert("user_provided_name".into(), user_provided_name);
    with_rate(
        &mut object,
        "recv_oct",
        connection.received_bytes,
        rates.gauges[0],
    );
    with_rate(
        &mut object,
        "send_oct",
        connection.sent_bytes,
        rates.gauges[1],
    );
    object.insert("time_in_flow_ms".into(), json!(connection.time_in_flow_ms));
    object.insert("time_blocked_ms".into(), json!(connection.time_blocked_ms));
    Value::Object(object)
}

async fn list(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    let connections = cluster_activity(&state)
        .await
        .connections
        .into_iter()
        .filter(|connection| visible_to(&caller, connection))
        .collect();
    Ok(Json(query.apply(connections)?))
}

async fn list_in_vhost(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_listed_vhost(&vhost)?;
    let connections = cluster_activity(&state)
        .await
        .connections
        .into_iter()
        .filter(|connection| visible_to(&caller, connection) && connection["vhost"] == vhost)
        .collect();
    Ok(Json(query.apply(connections)?))
}

/// The connection named `name`, anywhere in the cluster, if the caller may
/// see it: 404 when there is none, RabbitMQ's 401 when it is another
/// user's.
async fn find(state: &ManagementState, caller: &Caller, name: &str) -> ApiResult<Value> {
    let connection = cluster_activity(state)
        .await
        .connections
        .into_iter()
        .find(|connection| connection["name"] == name)
        .ok_or_else(ApiError::not_found)?;
    if visible_to(caller, &connection) {
        Ok(connection)
    } else {
        Err(ApiError::not_allowed(
            "User not authorised to access object",
        ))
    }
}

async fn show(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(find(&state, &caller, &name).await?))
}

async fn channels_of(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(name): Path<String>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    find(&state, &caller, &name).await?;
    let channels = cluster_activity(&state)
        .await
        .channels
        .into_iter()
        .filter(|channel| channel["connection_details"]["name"] == name)
        .collect();
    Ok(Json(query.apply(channels)?))
}

/// Closes the connection, on whichever node it is. Monitoring users see
/// every connection but close only their own, as in RabbitMQ.
async fn close(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    let connection = find(&state, &caller, &name).await?;
    if !caller.is_administrator() && connection["user"] != caller.user.as_str() {
        return Err(ApiError::not_allowed(
            "User not authorised to access object",
        ));
    }
    // UTF-8 as clients send it; a header that is not text is taken as best
    // it can be rather than dropped for the default.
    let reason = headers
        .get("x-reason")
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
        .unwrap_or_else(|| DEFAULT_CLOSE_REASON.to_owned());
    tracing::info!(connection = %name, %reason, by = %caller.user, "closing a connection through the management API");
    if close_connection(&state, &name, &reason).await {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found())
    }
}
