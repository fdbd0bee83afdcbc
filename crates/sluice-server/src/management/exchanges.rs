//! `/api/exchanges`: list, show, declare (PUT), delete, and publish.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use sluice_core::access::{Permission, ResourceKind};
use sluice_core::metadata::MetadataCommand;
use sluice_core::vhost::{Exchange, ExchangeDeclaration, VirtualHost};

use super::auth::Caller;
use super::body::JsonObject;
use super::error::{ApiError, ApiResult};
use super::json::table_to_json;
use super::list_query::ListQuery;
use super::publish::publish;
use super::ManagementState;

pub fn routes() -> Router<Arc<ManagementState>> {
    Router::new()
        .route("/api/exchanges", get(list))
        .route("/api/exchanges/{vhost}", get(list_in_vhost))
        .route(
            "/api/exchanges/{vhost}/{name}",
            get(show).put(declare).delete(delete),
        )
        .route("/api/exchanges/{vhost}/{name}/publish", post(publish))
}

/// The default exchange's name in paths and listings.
pub const DEFAULT_EXCHANGE: &str = "amq.default";

/// The exchange a path names: `amq.default` is the default exchange.
pub fn exchange_name(name: &str) -> &str {
    if name == DEFAULT_EXCHANGE {
        ""
    } else {
        name
    }
}

fn exchange_json(state: &ManagementState, vhost: &VirtualHost, exchange: &Exchange) -> Value {
    let policy = state
        .broker
        .exchange_policy(&vhost.name, &exchange.name)
        .map(|policy| policy.name);
    json!({
        "name": exchange.name.as_ref(),
        "vhost": vhost.name.as_ref(),
        "type": exchange.kind.as_str(),
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": table_to_json(&exchange.arguments),
        "user_who_performed_action": "",
        "policy": policy,
    })
}

fn exchanges_of(state: &ManagementState, vhost: &VirtualHost) -> Vec<Value> {
    vhost
        .exchanges()
        .iter()
        .map(|exchange| exchange_json(state, vhost, exchange))
        .collect()
}

async fn list(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    let exchanges = state
        .broker
        .vhosts()
        .iter()
        .filter(|vhost| caller.sees_vhost(&vhost.name))
        .flat_map(|vhost| exchanges_of(&state, vhost))
        .collect();
    Ok(Json(query.apply(exchanges)?))
}

async fn list_in_vhost(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_visible_vhost(&vhost)?;
    let vhost = state.broker.vhost(&vhost).ok_or_else(ApiError::not_found)?;
    Ok(Json(query.apply(exchanges_of(&state, &vhost))?))
}

async fn show(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    caller.require_visible_vhost(&vhost)?;
    let vhost = state.broker.vhost(&vhost).ok_or_else(ApiError::not_found)?;
    let exchange = vhost
        .exchange(exchange_name(&name))
        .map_err(|_| ApiError::not_found())?;
    Ok(Json(exchange_json(&state, &vhost, &exchange)))
}

/// Declares the exchange: 201 when it is new, 204 when an equivalent one
/// was there, 400 with the AMQP reply when it is not equivalent.
async fn declare(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost_name, name)): Path<(String, String)>,
    body: JsonObject,
) -> ApiResult<StatusCode> {
    caller.require_vhost(&vhost_name)?;
    let vhost = state
        .broker
        .vhost(&vhost_name)
        .ok_or_else(ApiError::vhost_not_found)?;
    let name = exchange_name(&name);
    if name.is_empty() {
        return Err(ApiError::not_allowed("Access refused."));
    }
    if name.len() > super::queues::NAME_BYTES_MAX {
        return Err(ApiError::bad_request(format!(
            "exchange should be less than 255 bytes, actually was {}\n",
            name.len()
        )));
    }
    caller.check_access(
        &vhost_name,
        Permission::Configure,
        ResourceKind::Exchange,
        name,
    )?;
    let declaration = ExchangeDeclaration {
        name,
        kind: body.text("type")?.unwrap_or("direct"),
        passive: false,
        // As RabbitMQ: a body that does not say is a transient exchange.
        durable: body.flag("durable", false)?,
        auto_delete: body.flag("auto_delete", false)?,
        internal: body.flag("internal", false)?,
        arguments: body.arguments()?,
    };
    if !vhost.check_exchange_declaration(&declaration)? {
        return Ok(StatusCode::NO_CONTENT);
    }
    if let Some(alternate) = declaration
        .arguments
        .inner()
        .get("alternate-exchange")
        .and_then(|value| value.as_long_string().map(|text| text.to_string()))
    {
        caller.check_access(&vhost_name, Permission::Read, ResourceKind::Exchange, name)?;
        caller.check_access(
            &vhost_name,
            Permission::Write,
            ResourceKind::Exchange,
            &alternate,
        )?;
    }
    let command = MetadataCommand::DeclareExchange {
        vhost: vhost_name,
        name: name.to_owned(),
        kind: declaration.kind.to_owned(),
        durable: declaration.durable,
        auto_delete: declaration.auto_delete,
        internal: declaration.internal,
        arguments: declaration.arguments,
    };
    state.broker.metadata.propose(command).await?;
    Ok(StatusCode::CREATED)
}

#[derive(Debug, Default, Deserialize)]
struct DeleteQuery {
    #[serde(rename = "if-unused")]
    if_unused: Option<String>,
}

async fn delete(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost_name, name)): Path<(String, String)>,
    Query(query): Query<DeleteQuery>,
) -> ApiResult<StatusCode> {
    caller.require_vhost(&vhost_name)?;
    let vhost = state
        .broker
        .vhost(&vhost_name)
        .ok_or_else(ApiError::vhost_not_found)?;
    let name = exchange_name(&name);
    // The default exchange and the amq.* ones cannot be deleted: RabbitMQ's
    // API says access refused.
    if name.is_empty() || name.starts_with("amq.") {
        return Err(ApiError::not_allowed("Access refused."));
    }
    caller.check_access(
        &vhost_name,
        Permission::Configure,
        ResourceKind::Exchange,
        name,
    )?;
    let if_unused = query.if_unused.as_deref() == Some("true");
    if !vhost.check_exchange_deletion(name, if_unused)? {
        return Err(ApiError::not_found());
    }
    let command = MetadataCommand::DeleteExchange {
        vhost: vhost_name,
        name: name.to_owned(),
        if_unused,
    };
    state.broker.metadata.propose(command).await?;
    Ok(StatusCode::NO_CONTENT)
}
