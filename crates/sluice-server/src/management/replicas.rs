//! Quorum queue members ("replicas") as RabbitMQ 3.13's API adds and
//! removes them: one queue's (`/api/queues/quorum/{vhost}/{name}/replicas/
//! add` and `/delete`, with `{"node": ...}`), or on one node for many
//! queues (`/api/queues/quorum/replicas/on/{node}/grow` and `/shrink`).
//! Administrators only; 204 once done. See [`sluice_core::quorum_membership`].

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, post};
use axum::Router;
use regex::Regex;
use sluice_core::quorum_membership::{GrowStrategy, MembershipError};

use super::auth::Caller;
use super::body::JsonObject;
use super::error::{ApiError, ApiResult};
use super::ManagementState;

pub fn routes() -> Router<Arc<ManagementState>> {
    Router::new()
        .route(
            "/api/queues/quorum/{vhost}/{name}/replicas/add",
            post(add_member),
        )
        .route(
            "/api/queues/quorum/{vhost}/{name}/replicas/delete",
            delete(delete_member),
        )
        .route("/api/queues/quorum/replicas/on/{node}/grow", post(grow))
        .route(
            "/api/queues/quorum/replicas/on/{node}/shrink",
            delete(shrink),
        )
}

/// An unknown queue or node is a 404, anything else refused a 400, each
/// with its reason.
fn api_error(error: MembershipError) -> ApiError {
    match error {
        MembershipError::NotFound(reason) => ApiError::not_found().with_reason(reason),
        MembershipError::Refused(reason) | MembershipError::Failed(reason) => {
            ApiError::bad_request(reason)
        }
    }
}

async fn add_member(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    body: JsonObject,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    caller.require_visible_vhost(&vhost)?;
    let node = body.required_text("node")?;
    state
        .broker
        .add_quorum_member(&vhost, &name, node)
        .await
        .map_err(api_error)?;
    Ok(StatusCode::NO_CONTENT)
}

async fn delete_member(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    body: JsonObject,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    caller.require_visible_vhost(&vhost)?;
    let node = body.required_text("node")?;
    state
        .broker
        .delete_quorum_member(&vhost, &name, node)
        .await
        .map_err(api_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// A pattern of the body, `.*` when absent, as RabbitMQ matches it.
fn pattern(body: &JsonObject, key: &str) -> ApiResult<Regex> {
    let text = body.text(key)?.unwrap_or(".*");
    Regex::new(text).map_err(|error| ApiError::bad_request(format!("{key}: {error}")))
}

/// Queues that could not grow are logged, as RabbitMQ does; the request
/// succeeds for the others.
async fn grow(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(node): Path<String>,
    body: JsonObject,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    let vhost_pattern = pattern(&body, "vhost_pattern")?;
    let queue_pattern = pattern(&body, "queue_pattern")?;
    let strategy = body.required_text("strategy")?;
    let strategy = GrowStrategy::parse(strategy).ok_or_else(|| {
        ApiError::bad_request(format!("strategy '{strategy}' is not recognised."))
    })?;
    let outcomes = state
        .broker
        .grow_quorum_queues(&node, &vhost_pattern, &queue_pattern, strategy)
        .await
        .map_err(api_error)?;
    for outcome in outcomes.iter().filter(|outcome| outcome.result.is_err()) {
        tracing::warn!(queue = %outcome.name, vhost = %outcome.vhost, %node, result = ?outcome.result, "a quorum queue did not grow");
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn shrink(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(node): Path<String>,
) -> ApiResult<StatusCode> {
    caller.require_administrator()?;
    let outcomes = state.broker.shrink_quorum_queues(&node).await;
    for outcome in outcomes.iter().filter(|outcome| outcome.result.is_err()) {
        tracing::warn!(queue = %outcome.name, vhost = %outcome.vhost, %node, result = ?outcome.result, "a quorum queue did not shrink");
    }
    Ok(StatusCode::NO_CONTENT)
}
