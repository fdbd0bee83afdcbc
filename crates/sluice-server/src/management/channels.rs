//! `/api/channels` and `/api/consumers`: the channels of the node's
//! connections, and the consumers on them.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::auth::Caller;
use super::connections::visible_to;
use super::error::{ApiError, ApiResult};
use super::json::table_to_json;
use super::list_query::ListQuery;
use super::peers::cluster_activity;
use super::rates::{message_stats, RateKey};
use super::ManagementState;
use crate::connection_registry::{ChannelCounts, ConnectionSnapshot};

pub fn routes() -> Router<Arc<ManagementState>> {
    Router::new()
        .route("/api/channels", get(list))
        .route("/api/channels/{name}", get(show))
        .route("/api/vhosts/{vhost}/channels", get(list_in_vhost))
        .route("/api/consumers", get(consumers))
        .route("/api/consumers/{vhost}", get(consumers_in_vhost))
}

/// A channel's name, as RabbitMQ forms it: its connection's, then the
/// channel number in parentheses.
fn channel_name(connection: &ConnectionSnapshot, channel: &ChannelCounts) -> String {
    format!("{} ({})", connection.identity.name(), channel.channel_id)
}

pub fn channel_json(
    state: &ManagementState,
    connection: &ConnectionSnapshot,
    channel: &ChannelCounts,
) -> Value {
    let identity = &connection.identity;
    let rates = state.rates.rates(&RateKey::Channel {
        connection: connection.connection_id,
        channel: channel.channel_id,
    });
    json!({
        "name": channel_name(connection, channel),
        "number": channel.channel_id,
        "node": state.broker.node().name.as_ref(),
        "user": identity.user,
        "user_who_performed_action": identity.user,
        "vhost": identity.vhost,
        "state": connection.state.as_str(),
        "confirm": channel.confirm,
        "transactional": channel.transactional,
        "prefetch_count": channel.prefetch_count,
        "global_prefetch_count": channel.global_prefetch_count,
        "consumer_count": channel.consumers.len(),
        "messages_unacknowledged": channel.messages_unacknowledged,
        "connection_details": {
            "name": identity.name(),
            "peer_host": identity.peer_address.ip().to_string(),
            "peer_port": identity.peer_address.port(),
        },
        "message_stats": message_stats(&channel.counts, &rates),
    })
}

/// Every channel of this node, with its connection.
fn channels_here(state: &ManagementState) -> Vec<(ConnectionSnapshot, ChannelCounts)> {
    state
        .connections
        .snapshots()
        .into_iter()
        .flat_map(|connection| {
            let channels = connection.channels.clone();
            channels
                .into_iter()
                .map(move |channel| (connection.clone(), channel))
        })
        .collect()
}

/// This node's channels, as the API writes them.
pub fn local_channels(state: &ManagementState) -> Vec<Value> {
    channels_here(state)
        .iter()
        .map(|(connection, channel)| channel_json(state, connection, channel))
        .collect()
}

/// This node's consumers, as the API writes them.
pub fn local_consumers(state: &ManagementState) -> Vec<Value> {
    let node = state.broker.node().name.to_string();
    channels_here(state)
        .iter()
        .flat_map(|(connection, channel)| {
            let identity = &connection.identity;
            let channel_details = json!({
                "connection_name": identity.name(),
                "name": channel_name(connection, channel),
                "node": node,
                "number": channel.channel_id,
                "peer_host": identity.peer_address.ip().to_string(),
                "peer_port": identity.peer_address.port(),
                "user": identity.user,
            });
            channel
                .consumers
                .iter()
                .map(move |(tag, consumer)| {
                    json!({
                        "consumer_tag": tag.as_ref(),
                        "queue": {"name": consumer.queue.as_ref(), "vhost": identity.vhost},
                        "channel_details": channel_details,
                        "ack_required": consumer.ack_required,
                        "exclusive": consumer.exclusive,
                        "prefetch_count": consumer.prefetch_count,
                        "arguments": table_to_json(&consumer.arguments),
                        "active": true,
                        "activity_status": "up",
                    })
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The cluster's channels the caller may see.
async fn visible_channels(state: &ManagementState, caller: &Caller) -> Vec<Value> {
    cluster_activity(state)
        .await
        .channels
        .into_iter()
        .filter(|channel| visible_to(caller, channel))
        .collect()
}

async fn list(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    Ok(Json(query.apply(visible_channels(&state, &caller).await)?))
}

async fn list_in_vhost(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_listed_vhost(&vhost)?;
    let channels = visible_channels(&state, &caller)
        .await
        .into_iter()
        .filter(|channel| channel["vhost"] == vhost)
        .collect();
    Ok(Json(query.apply(channels)?))
}

async fn show(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    visible_channels(&state, &caller)
        .await
        .into_iter()
        .find(|channel| channel["name"] == name)
        .map(Json)
        .ok_or_else(ApiError::not_found)
}

/// The cluster's consumers the caller may see, of one vhost or all.
async fn consumer_list(
    state: &ManagementState,
    caller: &Caller,
    vhost: Option<&str>,
) -> Vec<Value> {
    cluster_activity(state)
        .await
        .consumers
        .into_iter()
        .filter(|consumer| {
            consumer["channel_details"]["user"]
                .as_str()
                .is_some_and(|user| caller.sees_user_connections(user))
                && vhost.is_none_or(|vhost| consumer["queue"]["vhost"] == vhost)
        })
        .collect()
}

/// Consumers have neither vhost nor name, so the default sort leaves them
/// as they are gathered (RabbitMQ's then compares the whole records).
async fn consumers(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    Ok(Json(
        query.apply(consumer_list(&state, &caller, None).await)?,
    ))
}

async fn consumers_in_vhost(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_listed_vhost(&vhost)?;
    Ok(Json(query.apply(
        consumer_list(&state, &caller, Some(&vhost)).await,
    )?))
}
