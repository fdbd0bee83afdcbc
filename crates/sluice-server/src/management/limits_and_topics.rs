//! `/api/topic-permissions` and `/api/vhost-limits`: the rest of access
//! control, for administrators, through the metadata log.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, put};
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use sluice_core::access::{TopicPermissionDefinition, VhostLimit, VhostLimits};
use sluice_core::metadata::MetadataCommand;

use super::auth::Caller;
use super::body::JsonObject;
use super::change;
use super::error::{ApiError, ApiResult};
use super::list_query::{ListQuery, SORT_TOPIC_PERMISSIONS};
use super::ManagementState;

pub fn routes() -> Router<Arc<ManagementState>> {
    Router::new()
        .route("/api/topic-permissions", get(topic_permissions))
        .route(
            "/api/topic-permissions/{vhost}/{user}",
            get(topic_permissions_of)
                .put(put_topic_permissions)
                .delete(delete_topic_permissions),
        )
        .route("/api/vhost-limits", get(vhost_limits))
        .route("/api/vhost-limits/{vhost}", get(vhost_limits_of))
        .route(
            "/api/vhost-limits/{vhost}/{name}",
            put(put_vhost_limit).delete(delete_vhost_limit),
        )
}

pub(super) fn topic_json(permission: &TopicPermissionDefinition) -> Value {
    json!({
        "user": permission.user,
        "vhost": permission.vhost,
        "exchange": permission.exchange,
        "write": permission.write,
        "read": permission.read,
    })
}

fn topics(
    state: &ManagementState,
    keep: impl Fn(&TopicPermissionDefinition) -> bool,
) -> Vec<Value> {
    state
        .broker
        .access
        .snapshot()
        .topic_permissions
        .iter()
        .filter(|permission| keep(permission))
        .map(topic_json)
        .collect()
}

async fn topic_permissions(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_administrator()?;
    Ok(Json(query.apply_sorted_by(
        topics(&state, |_| true),
        SORT_TOPIC_PERMISSIONS,
    )?))
}

async fn topic_permissions_of(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    caller.require_administrator()?;
    let listed = topics(&state, |permission| {
        permission.vhost == vhost && permission.user == user
    });
    if listed.is_empty() {
        return Err(ApiError::not_found());
    }
    Ok(Json(Value::Array(listed)))
}

async fn put_topic_permissions(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
    body: JsonObject,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    for key in ["exchange", "write", "read"] {
        if !body.0.contains_key(key) {
            return Err(ApiError::key_missing(key));
        }
    }
    if state.broker.vhost(&vhost).is_none() || !state.broker.access.user_exists(&user) {
        return Err(ApiError::bad_request("vhost_or_user_not_found"));
    }
    let exchange = body.required_text("exchange")?.to_owned();
    let existed = !topics(&state, |permission| {
        permission.vhost == vhost && permission.user == user && permission.exchange == exchange
    })
    .is_empty();
    let permissions = TopicPermissionDefinition {
        user,
        vhost,
        exchange,
        write: body.required_text("write")?.to_owned(),
        read: body.required_text("read")?.to_owned(),
    };
    change::put(
        &state,
        existed,
        MetadataCommand::SetTopicPermissions { permissions },
    )
    .await
}

async fn delete_topic_permissions(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    if topics(&state, |permission| {
        permission.vhost == vhost && permission.user == user
    })
    .is_empty()
    {
        return Err(ApiError::not_found());
    }
    state
        .broker
        .metadata
        .propose(MetadataCommand::ClearTopicPermissions {
            user,
            vhost,
            exchange: None,
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

fn limits_json(vhost: &str, limits: &VhostLimits) -> Option<Value> {
    let mut value = Map::new();
    if let Some(max) = limits.max_connections {
        value.insert("max-connections".into(), json!(max));
    }
    if let Some(max) = limits.max_queues {
        value.insert("max-queues".into(), json!(max));
    }
    (!value.is_empty()).then(|| json!({"vhost": vhost, "value": value}))
}

/// Limits of the vhosts the caller sees, as RabbitMQ lists them.
async fn vhost_limits(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
) -> ApiResult<Json<Value>> {
    let listed: Vec<Value> = state
        .broker
        .access
        .snapshot()
        .vhost_limits
        .iter()
        .filter(|(vhost, _)| caller.lists_vhost(vhost))
        .filter_map(|(vhost, limits)| limits_json(vhost, limits))
        .collect();
    Ok(Json(Value::Array(listed)))
}

async fn vhost_limits_of(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(vhost): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.require_listed_vhost(&vhost)?;
    let limits = state.broker.access.vhost_limits(&vhost);
    Ok(Json(Value::Array(
        limits_json(&vhost, &limits).into_iter().collect(),
    )))
}

/// Sets one limit: `max-connections` or `max-queues`, `{"value": N}`;
/// a negative value is no limit, as in RabbitMQ.
async fn put_vhost_limit(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    body: JsonObject,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    if state.broker.vhost(&vhost).is_none() {
        return Err(ApiError::vhost_not_found());
    }
    let value = match body.0.get("value") {
        Some(Value::Number(number)) => number.as_i64(),
        Some(Value::String(text)) => text.parse().ok(),
        None => return Err(ApiError::key_missing("value")),
        _ => None,
    }
    .ok_or_else(|| ApiError::bad_request(format!("invalid value for limit '{name}'")))?;
    let limit = u64::try_from(value).ok();
    change_limit(&state, vhost, &name, limit).await
}

async fn delete_vhost_limit(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    if state.broker.vhost(&vhost).is_none() {
        return Err(ApiError::not_found());
    }
    change_limit(&state, vhost, &name, None).await
}

/// Proposes the change of `name` alone: the other limit is left as it is
/// when the log applies the change, so concurrent changes to different
/// limits both hold.
async fn change_limit(
    state: &ManagementState,
    vhost: String,
    name: &str,
    value: Option<u64>,
) -> ApiResult<StatusCode> {
    let limit = VhostLimit::from_name(name).ok_or_else(|| {
        ApiError::bad_request(format!(
            "unrecognised limit '{name}' (max-connections or max-queues)"
        ))
    })?;
    state
        .broker
        .metadata
        .propose(MetadataCommand::SetVhostLimit {
            vhost,
            limit,
            value,
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
