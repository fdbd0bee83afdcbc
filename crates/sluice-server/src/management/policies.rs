//! `/api/policies`, `/api/parameters` and `/api/global-parameters`:
//! checked as RabbitMQ checks them (its texts, HTML-escaped as its API
//! sends them), then set through the metadata log, which every node
//! applies to the queues and exchanges that exist.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::Value;
use sluice_core::metadata::MetadataCommand;
use sluice_core::policy::{validate_policy, PolicyJson};
use sluice_core::runtime_parameters::{validate_parameter, ParameterJson};

use super::auth::Caller;
use super::body::JsonObject;
use super::change;
use super::error::{ApiError, ApiResult};
use super::json::to_json;
use super::list_query::{ListQuery, SORT_POLICIES};
use super::ManagementState;

pub fn routes() -> Router<Arc<ManagementState>> {
    Router::new()
        .route("/api/policies", get(policies))
        .route("/api/policies/{vhost}", get(vhost_policies))
        .route(
            "/api/policies/{vhost}/{name}",
            get(policy).put(put_policy).delete(delete_policy),
        )
        .route("/api/parameters", get(parameters))
        .route("/api/parameters/{component}", get(component_parameters))
        .route("/api/parameters/{component}/{vhost}", get(vhost_parameters))
        .route(
            "/api/parameters/{component}/{vhost}/{name}",
            get(parameter).put(put_parameter).delete(delete_parameter),
        )
        .route("/api/global-parameters", get(global_parameters))
        .route(
            "/api/global-parameters/{name}",
            get(global_parameter)
                .put(put_global_parameter)
                .delete(delete_global_parameter),
        )
}

/// RabbitMQ's API escapes its validation texts as HTML (`<<"x">>` becomes
/// `&lt;&lt;"x"&gt;&gt;`); clients that show them expect that.
fn escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Policies are listed for every management user, in the vhosts they see.
async fn policies(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    let listed = state
        .broker
        .policies()
        .into_iter()
        .filter(|policy| caller.sees_vhost(&policy.vhost))
        .collect();
    Ok(Json(query.apply_sorted_by(to_json(listed), SORT_POLICIES)?))
}

async fn vhost_policies(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_visible_vhost(&vhost)?;
    let listed = state.broker.vhost_policies(&vhost).unwrap_or_default();
    Ok(Json(query.apply_sorted_by(to_json(listed), SORT_POLICIES)?))
}

async fn policy(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    caller.require_policymaker()?;
    caller.require_visible_vhost(&vhost)?;
    let policy = state
        .broker
        .policy(&vhost, &name)
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(
        serde_json::to_value(policy).expect("a policy always encodes"),
    ))
}

async fn put_policy(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    body: JsonObject,
) -> ApiResult<StatusCode> {
    caller.require_policymaker()?;
    caller.require_vhost(&vhost)?;
    for key in ["pattern", "definition"] {
        if !body.0.contains_key(key) {
            return Err(ApiError::key_missing(key));
        }
    }
    let priority = match body.0.get("priority") {
        None | Some(Value::Null) => 0,
        Some(Value::Number(number)) if number.is_i64() => number.as_i64().unwrap_or_default(),
        Some(other) => {
            return Err(ApiError::bad_request(escaped(&format!(
                "Validation failed\n\npriority should be a number, actually was {}\n",
                erlang_term(other)
            ))))
        }
    };
    let definition = match body.0.get("definition") {
        Some(Value::Object(definition)) => definition.clone(),
        _ => {
            return Err(ApiError::bad_request(escaped(
                "Validation failed\n\nno policy provided\n",
            )))
        }
    };
    let policy = PolicyJson {
        vhost: vhost.clone(),
        name: name.clone(),
        pattern: body.required_text("pattern")?.to_owned(),
        apply_to: body.text("apply-to")?.unwrap_or("all").to_owned(),
        priority,
        definition,
    };
    validate_policy(&policy)
        .map_err(|error| ApiError::bad_request(escaped(&error.rabbitmq_text())))?;
    let existed = state.broker.policy(&vhost, &name).is_some();
    change::put(&state, existed, MetadataCommand::SetPolicy { policy }).await
}

/// A JSON value as RabbitMQ's texts print the Erlang term it became.
fn erlang_term(value: &Value) -> String {
    match value {
        Value::String(text) => format!("<<\"{text}\">>"),
        other => other.to_string(),
    }
}

async fn delete_policy(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    caller.require_policymaker()?;
    caller.require_vhost(&vhost)?;
    let exists = state.broker.policy(&vhost, &name).is_some();
    change::delete(&state, exists, MetadataCommand::ClearPolicy { vhost, name }).await
}

/// Parameters are for policymakers, as in RabbitMQ.
async fn parameters(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_policymaker()?;
    let listed = state
        .broker
        .parameters()
        .into_iter()
        .filter(|parameter| caller.sees_vhost(&parameter.vhost))
        .collect();
    Ok(Json(query.apply(to_json(listed))?))
}

async fn component_parameters(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(component): Path<String>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_policymaker()?;
    let listed = state
        .broker
        .parameters()
        .into_iter()
        .filter(|parameter| parameter.component == component && caller.sees_vhost(&parameter.vhost))
        .collect();
    Ok(Json(query.apply(to_json(listed))?))
}

async fn vhost_parameters(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((component, vhost)): Path<(String, String)>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_policymaker()?;
    caller.require_visible_vhost(&vhost)?;
    let listed = state
        .broker
        .vhost_parameters(&vhost)
        .unwrap_or_default()
        .into_iter()
        .filter(|parameter| parameter.component == component)
        .collect();
    Ok(Json(query.apply(to_json(listed))?))
}

async fn parameter(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((component, vhost, name)): Path<(String, String, String)>,
) -> ApiResult<Json<Value>> {
    caller.require_policymaker()?;
    caller.require_visible_vhost(&vhost)?;
    let parameter = state
        .broker
        .parameter(&component, &vhost, &name)
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(
        serde_json::to_value(parameter).expect("a parameter always encodes"),
    ))
}

async fn put_parameter(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((component, vhost, name)): Path<(String, String, String)>,
    body: JsonObject,
) -> ApiResult<StatusCode> {
    caller.require_policymaker()?;
    caller.require_vhost(&vhost)?;
    let value = body
        .0
        .get("value")
        .cloned()
        .ok_or_else(|| ApiError::key_missing("value"))?;
    let parameter = ParameterJson {
        vhost: vhost.clone(),
        component: component.clone(),
        name: name.clone(),
        value: value.clone(),
    };
    validate_parameter(&parameter)
        .map_err(|error| ApiError::bad_request(escaped(&error.rabbitmq_text())))?;
    let existed = state.broker.parameter(&component, &vhost, &name).is_some();
    let command = MetadataCommand::SetParameter {
        component,
        vhost,
        name,
        value,
    };
    change::put(&state, existed, command).await
}

async fn delete_parameter(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((component, vhost, name)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    caller.require_policymaker()?;
    caller.require_vhost(&vhost)?;
    let exists = state.broker.parameter(&component, &vhost, &name).is_some();
    let command = MetadataCommand::ClearParameter {
        component,
        vhost,
        name,
    };
    change::delete(&state, exists, command).await
}

async fn global_parameters(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_policymaker()?;
    Ok(Json(
        query.apply(to_json(state.broker.global_parameters()))?,
    ))
}

async fn global_parameter(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.require_policymaker()?;
    let parameter = state
        .broker
        .global_parameter(&name)
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(
        serde_json::to_value(parameter).expect("a parameter always encodes"),
    ))
}

async fn put_global_parameter(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(name): Path<String>,
    body: JsonObject,
) -> ApiResult<StatusCode> {
    caller.require_policymaker()?;
    let value = body
        .0
        .get("value")
        .cloned()
        .ok_or_else(|| ApiError::key_missing("value"))?;
    let existed = state.broker.global_parameter(&name).is_some();
    change::put(
        &state,
        existed,
        MetadataCommand::SetGlobalParameter { name, value },
    )
    .await
}

async fn delete_global_parameter(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    caller.require_policymaker()?;
    let exists = state.broker.global_parameter(&name).is_some();
    change::delete(
        &state,
        exists,
        MetadataCommand::ClearGlobalParameter { name },
    )
    .await
}
