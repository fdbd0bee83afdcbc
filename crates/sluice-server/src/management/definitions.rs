//! `/api/definitions`: the whole topology and access setup exported in
//! RabbitMQ's definitions format (GET), and imported from it (POST), the
//! format `load_definitions` reads and `rabbitmqctl export_definitions`
//! writes. An import is a series of metadata changes, applied in order
//! (vhosts, users, permissions, limits, exchanges, queues, bindings); the
//! first one refused stops it, with its reason.

use std::path::Path as FilePath;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use sluice_core::definitions_import::{parse_definitions, DefinitionsFileError};
use sluice_core::exchange::Destination;
use sluice_core::vhost::VirtualHost;

use super::access::{permission_json, user_json};
use super::auth::Caller;
use super::error::{ApiError, ApiResult};
use super::json::{table_to_json, to_json};
use super::limits_and_topics::topic_json;
use super::ManagementState;
use crate::handshake::RABBITMQ_VERSION_FOLLOWED;

pub fn routes() -> Router<Arc<ManagementState>> {
    Router::new()
        .route("/api/definitions", get(export).post(import))
        .route(
            "/api/definitions/{vhost}",
            get(export_vhost).post(import_vhost),
        )
}

/// Exchanges that exist in every vhost from the start, left out of exports.
fn is_builtin_exchange(name: &str) -> bool {
    name.is_empty() || name.starts_with("amq.")
}

/// A vhost's exchanges, queues and bindings as definitions list them:
/// what a client declared (exclusive queues, owned by a connection, and
/// the built-in exchanges are left out, as RabbitMQ leaves them out).
fn topology(vhost: &VirtualHost) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    let mut exchanges_here = vhost.exchanges();
    exchanges_here.sort_by(|left, right| left.name.cmp(&right.name));
    let mut queues_here = vhost.queues();
    queues_here.sort_by(|left, right| left.name().cmp(right.name()));
    let mut bindings_here = vhost.bindings();
    bindings_here.sort_by(|(left_source, left), (right_source, right)| {
        (left_source, left.destination.name(), &left.routing_key).cmp(&(
            right_source,
            right.destination.name(),
            &right.routing_key,
        ))
    });
    let exchanges = exchanges_here
        .iter()
        .filter(|exchange| !is_builtin_exchange(&exchange.name))
        .map(|exchange| {
            json!({
                "name": exchange.name.as_ref(),
                "vhost": vhost.name.as_ref(),
                "type": exchange.kind.as_str(),
                "durable": exchange.durable,
                "auto_delete": exchange.auto_delete,
                "internal": exchange.internal,
                "arguments": table_to_json(&exchange.arguments),
            })
        })
        .collect();
    let queues = queues_here
        .iter()
        .filter(|queue| queue.options().exclusive_owner.is_none())
        .map(|queue| {
            let options = queue.options();
            json!({
                "name": queue.name().as_ref(),
                "vhost": vhost.name.as_ref(),
                "durable": options.durable,
                "auto_delete": options.auto_delete,
                "arguments": table_to_json(&options.arguments),
            })
        })
        .collect();
    let bindings = bindings_here
        .iter()
        .filter(|(source, _)| !source.is_empty())
        .map(|(source, binding)| {
            let (destination, kind) = match &binding.destination {
                Destination::Queue(name) => (name, "queue"),
                Destination::Exchange(name) => (name, "exchange"),
            };
            json!({
                "source": source.as_ref(),
                "vhost": vhost.name.as_ref(),
                "destination": destination.as_ref(),
                "destination_type": kind,
                "routing_key": binding.routing_key,
                "arguments": table_to_json(&binding.arguments),
            })
        })
        .collect();
    (exchanges, queues, bindings)
}

async fn export(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
) -> ApiResult<Json<Value>> {
    caller.require_administrator()?;
    let access = state.broker.access.snapshot();
    let mut vhosts = Vec::new();
    let (mut exchanges, mut queues, mut bindings) = (Vec::new(), Vec::new(), Vec::new());
    // Sorted: the same definitions export the same way on every node.
    let mut all_vhosts = state.broker.vhosts();
    all_vhosts.sort_by(|left, right| left.name.cmp(&right.name));
    for vhost in all_vhosts {
        vhosts.push(json!({"name": vhost.name.as_ref(), "limits": [], "metadata": {"description": "", "tags": []}}));
        let (vhost_exchanges, vhost_queues, vhost_bindings) = topology(&vhost);
        exchanges.extend(vhost_exchanges);
        queues.extend(vhost_queues);
        bindings.extend(vhost_bindings);
    }
    let users: Vec<Value> = access.users.iter().map(user_json).collect();
    let permissions: Vec<Value> = access.permissions.iter().map(permission_json).collect();
    let topic_permissions: Vec<Value> = access.topic_permissions.iter().map(topic_json).collect();
    let parameters = to_json(state.broker.parameters());
    let mut global_parameters = to_json(state.broker.global_parameters());
    if state.broker.global_parameter("cluster_name").is_none() {
        global_parameters.push(json!({"name": "cluster_name", "value": state.cluster_name}));
    }
    let policies = to_json(state.broker.policies());
    Ok(Json(json!({
        "rabbit_version": RABBITMQ_VERSION_FOLLOWED,
        "rabbitmq_version": RABBITMQ_VERSION_FOLLOWED,
        "product_name": "Sluice",
        "product_version": env!("CARGO_PKG_VERSION"),
        "users": users,
        "vhosts": vhosts,
        "permissions": permissions,
        "topic_permissions": topic_permissions,
        "parameters": parameters,
        "global_parameters": global_parameters,
        "policies": policies,
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    })))
}

async fn export_vhost(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(vhost_name): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.require_administrator()?;
    let vhost = state
        .broker
        .vhost(&vhost_name)
        .ok_or_else(ApiError::not_found)?;
    let (exchanges, queues, bindings) = topology(&vhost);
    let parameters = to_json(
        state
            .broker
            .vhost_parameters(&vhost_name)
            .unwrap_or_default(),
    );
    let policies = to_json(state.broker.vhost_policies(&vhost_name).unwrap_or_default());
    Ok(Json(json!({
        "rabbit_version": RABBITMQ_VERSION_FOLLOWED,
        "parameters": parameters,
        "policies": policies,
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    })))
}

async fn import(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    body: Bytes,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    apply(&state, &caller, &body).await
}

/// The kinds of definitions an import into one vhost takes, as RabbitMQ's
/// `apply_defs` for a vhost: users, vhosts and permissions are left alone.
const VHOST_DEFINITIONS: [&str; 5] = ["exchanges", "parameters", "policies", "queues", "bindings"];

/// An import into the vhost of the path: what the body defines of
/// [`VHOST_DEFINITIONS`] lands there, whatever vhost each item names.
async fn import_vhost(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(vhost_name): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    if state.broker.vhost(&vhost_name).is_none() {
        return Err(ApiError::not_found_because("vhost_not_found"));
    }
    let Ok(Value::Object(definitions)) = serde_json::from_slice::<Value>(&body) else {
        return Err(ApiError::bad_request("failed_to_parse_json"));
    };
    let mut for_vhost = serde_json::Map::new();
    for kind in VHOST_DEFINITIONS {
        let Some(Value::Array(items)) = definitions.get(kind) else {
            continue;
        };
        let items = items
            .iter()
            .map(|item| {
                let mut item = item.clone();
                if let Value::Object(fields) = &mut item {
                    fields.insert("vhost".to_owned(), json!(vhost_name));
                }
                item
            })
            .collect();
        for_vhost.insert(kind.to_owned(), Value::Array(items));
    }
    let body = serde_json::to_vec(&Value::Object(for_vhost)).expect("JSON values serialize");
    apply(&state, &caller, &body).await
}

/// Parses definitions and proposes them, in order; the first change
/// refused stops it. The changes are proposed by a task of their own: a
/// client that hangs up mid-import does not leave it half applied.
async fn apply(
    state: &Arc<ManagementState>,
    caller: &Caller,
    body: &[u8],
) -> ApiResult<StatusCode> {
    let loaded =
        parse_definitions(body, FilePath::new("the imported definitions")).map_err(|error| {
            match error {
                DefinitionsFileError::Parse { .. } => ApiError::bad_request("failed_to_parse_json"),
                other => ApiError::bad_request(error_chain(&other)),
            }
        })?;
    let node = state.broker.node().clone();
    let commands = loaded.metadata_commands(&node);
    tracing::info!(commands = commands.len(), by = %caller.user, "importing definitions through the management API");
    let state = Arc::clone(state);
    let proposed = tokio::spawn(async move {
        for command in commands {
            state.broker.metadata.propose(command).await?;
        }
        Ok::<_, sluice_core::error::AmqpError>(())
    });
    match proposed.await {
        Ok(result) => result?,
        Err(error) => {
            tracing::error!(%error, "the definitions import failed");
            return Err(ApiError::internal("the definitions import failed"));
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

/// An error with its causes, one after the other.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
