//! `/api/vhosts`, `/api/users`, `/api/permissions`: who may do what where.
//! Changes go through the metadata log like every other change, so every
//! node applies them; reading them, except one's own, is for
//! administrators, as in RabbitMQ.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use sluice_core::access::{HashingAlgorithm, PasswordHash, PermissionDefinition, UserDefinition};
use sluice_core::metadata::MetadataCommand;

use super::auth::Caller;
use super::body::JsonObject;
use super::change;
use super::error::{ApiError, ApiResult};
use super::list_query::{ListQuery, SORT_PERMISSIONS};
use super::rates::{message_stats, with_rate, RateKey};
use super::ManagementState;

pub fn routes() -> Router<Arc<ManagementState>> {
    Router::new()
        .route("/api/vhosts", get(vhosts))
        .route(
            "/api/vhosts/{name}",
            get(vhost).put(put_vhost).delete(delete_vhost),
        )
        .route("/api/vhosts/{name}/permissions", get(vhost_permissions))
        .route("/api/users", get(users))
        .route(
            "/api/users/{name}",
            get(user).put(put_user).delete(delete_user),
        )
        .route("/api/users/{name}/permissions", get(user_permissions))
        .route("/api/permissions", get(permissions))
        .route(
            "/api/permissions/{vhost}/{user}",
            get(permission)
                .put(put_permission)
                .delete(delete_permission),
        )
}

async fn vhost_json(state: &ManagementState, name: &str) -> Value {
    let vhost = state.broker.vhost(name);
    let counts = vhost
        .as_ref()
        .map(|vhost| vhost.counts())
        .unwrap_or_default();
    let queues = vhost
        .as_ref()
        .map(|vhost| vhost.queues())
        .unwrap_or_default();
    let totals = super::queues::totals(queues).await;
    let rates = state.rates.rates(&RateKey::Vhost(name.to_owned()));
    let local = state.broker.node().name.to_string();
    let cluster_state: serde_json::Map<String, Value> = state
        .broker
        .metadata
        .cluster_nodes(&local)
        .into_iter()
        .map(|node| {
            let running = state.broker.metadata.running_nodes(&local).contains(&node);
            (node, json!(if running { "running" } else { "nodedown" }))
        })
        .collect();
    let mut object = json!({
        "name": name,
        "description": "",
        "tags": [],
        "default_queue_type": "undefined",
        "tracing": false,
        "cluster_state": cluster_state,
        "message_stats": message_stats(&counts, &rates),
    });
    let fields = object.as_object_mut().expect("built as an object");
    let (ready, unacked) = (totals.messages_ready, totals.messages_unacknowledged);
    with_rate(
        fields,
        "messages",
        ready + unacked,
        rates.gauges[0] + rates.gauges[1],
    );
    with_rate(fields, "messages_ready", ready, rates.gauges[0]);
    with_rate(fields, "messages_unacknowledged", unacked, rates.gauges[1]);
    object
}

async fn vhosts(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    let mut listed = Vec::new();
    for vhost in state.broker.vhosts() {
        if caller.lists_vhost(&vhost.name) {
            listed.push(vhost_json(&state, &vhost.name).await);
        }
    }
    Ok(Json(query.apply(listed)?))
}

/// One vhost: for administrators only, as in RabbitMQ (the list is for
/// every management user).
async fn vhost(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.require_administrator()?;
    if state.broker.vhost(&name).is_none() {
        return Err(ApiError::not_found());
    }
    Ok(Json(vhost_json(&state, &name).await))
}

async fn put_vhost(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    let existed = state.broker.vhost(&name).is_some();
    let status = change::put(
        &state,
        existed,
        MetadataCommand::PutVhost { name: name.clone() },
    )
    .await?;
    if !existed {
        // As RabbitMQ's `put_vhost`: whoever creates a vhost may use it.
        let permissions = PermissionDefinition {
            user: caller.user.clone(),
            vhost: name,
            configure: ".*".to_owned(),
            write: ".*".to_owned(),
            read: ".*".to_owned(),
        };
        state
            .broker
            .metadata
            .propose(MetadataCommand::SetPermissions { permissions })
            .await?;
    }
    Ok(status)
}

async fn delete_vhost(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    let exists = state.broker.vhost(&name).is_some();
    change::delete(&state, exists, MetadataCommand::DeleteVhost { name }).await
}

pub(super) fn user_json(user: &UserDefinition) -> Value {
    json!({
        "name": user.name,
        "password_hash": user.password_hash,
        "hashing_algorithm": user.hashing_algorithm.definitions_name(),
        "tags": user.tags,
        "limits": {},
    })
}

async fn users(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_administrator()?;
    let listed = state
        .broker
        .access
        .snapshot()
        .users
        .iter()
        .map(user_json)
        .collect();
    Ok(Json(query.apply(listed)?))
}

async fn user(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.require_administrator()?;
    let user = state
        .broker
        .access
        .user(&name)
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(user_json(&user)))
}

/// Tags as RabbitMQ takes them: a list, or one string separated by commas.
fn tags(body: &JsonObject) -> ApiResult<Vec<String>> {
    match body.0.get("tags") {
        None => Err(ApiError::bad_request("tags_not_present")),
        Some(Value::String(text)) => Ok(text
            .split(',')
            .map(str::trim)
            .filter(|tag| !tag.is_empty())
            .map(str::to_owned)
            .collect()),
        Some(Value::Array(items)) => Ok(items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()),
        Some(_) => Err(ApiError::bad_request("tags_not_present")),
    }
}

async fn put_user(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(name): Path<String>,
    body: JsonObject,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    let tags = tags(&body)?;
    let existing = state.broker.access.user(&name);
    let user = if let Some(password) = body.text("password")? {
        UserDefinition::with_password(&name, password, tags)
    } else if let Some(hash) = body.text("password_hash")? {
        let algorithm = HashingAlgorithm::from_definitions(Some(
            body.text("hashing_algorithm")?
                .unwrap_or("rabbit_password_hashing_sha256"),
        ))
        .map_err(ApiError::bad_request)?;
        PasswordHash::from_base64(hash)
            .map_err(|_| ApiError::bad_request_value(json!(["not_base64", hash])))?;
        UserDefinition {
            name: name.clone(),
            password_hash: hash.to_owned(),
            hashing_algorithm: algorithm,
            tags,
        }
    } else {
        // Tags only: an existing user keeps its password, a new one has
        // none (it can log in only by other means), as in RabbitMQ.
        match &existing {
            Some(existing) => UserDefinition {
                tags,
                ..existing.clone()
            },
            None => UserDefinition {
                name: name.clone(),
                password_hash: String::new(),
                hashing_algorithm: HashingAlgorithm::default(),
                tags,
            },
        }
    };
    change::put(
        &state,
        existing.is_some(),
        MetadataCommand::PutUser { user },
    )
    .await
}

async fn delete_user(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    let exists = state.broker.access.user_exists(&name);
    change::delete(&state, exists, MetadataCommand::DeleteUser { name }).await
}

pub(super) fn permission_json(permission: &PermissionDefinition) -> Value {
    json!({
        "user": permission.user,
        "vhost": permission.vhost,
        "configure": permission.configure,
        "write": permission.write,
        "read": permission.read,
    })
}

/// The permissions `keep` picks, sorted by vhost and user.
fn permissions_json(
    state: &ManagementState,
    keep: impl Fn(&PermissionDefinition) -> bool,
) -> Vec<Value> {
    let mut listed: Vec<PermissionDefinition> = state
        .broker
        .access
        .snapshot()
        .permissions
        .into_iter()
        .filter(|permission| keep(permission))
        .collect();
    listed.sort_by(|left, right| (&left.vhost, &left.user).cmp(&(&right.vhost, &right.user)));
    listed.iter().map(permission_json).collect()
}

async fn permissions(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_administrator()?;
    Ok(Json(query.apply_sorted_by(
        permissions_json(&state, |_| true),
        SORT_PERMISSIONS,
    )?))
}

async fn vhost_permissions(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_administrator()?;
    caller.require_visible_vhost(&vhost)?;
    Ok(Json(query.apply_sorted_by(
        permissions_json(&state, |permission| permission.vhost == vhost),
        SORT_PERMISSIONS,
    )?))
}

async fn user_permissions(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(user): Path<String>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_administrator()?;
    if !state.broker.access.user_exists(&user) {
        return Err(ApiError::not_found());
    }
    Ok(Json(query.apply_sorted_by(
        permissions_json(&state, |permission| permission.user == user),
        SORT_PERMISSIONS,
    )?))
}

async fn permission(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    caller.require_administrator()?;
    permissions_json(&state, |permission| {
        permission.vhost == vhost && permission.user == user
    })
    .into_iter()
    .next()
    .map(Json)
    .ok_or_else(ApiError::not_found)
}

async fn put_permission(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
    body: JsonObject,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    let missing: Vec<&str> = ["configure", "write", "read"]
        .into_iter()
        .filter(|key| !body.0.contains_key(*key))
        .collect();
    if let Some(key) = missing.first() {
        return Err(ApiError::key_missing(key));
    }
    if state.broker.vhost(&vhost).is_none() || !state.broker.access.user_exists(&user) {
        return Err(ApiError::bad_request("vhost_or_user_not_found"));
    }
    let existed = state.broker.access.permissions(&user, &vhost).is_some();
    let permissions = PermissionDefinition {
        user,
        vhost,
        configure: body.required_text("configure")?.to_owned(),
        write: body.required_text("write")?.to_owned(),
        read: body.required_text("read")?.to_owned(),
    };
    change::put(
        &state,
        existed,
        MetadataCommand::SetPermissions { permissions },
    )
    .await
}

async fn delete_permission(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, user)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    let exists = state.broker.access.permissions(&user, &vhost).is_some();
    change::delete(
        &state,
        exists,
        MetadataCommand::ClearPermissions { user, vhost },
    )
    .await
}
