//! Health checks, as RabbitMQ's API answers them: 200 `{"status":"ok"}`,
//! or 503 `{"status":"failed","reason":...}`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use sluice_core::counters::MessageCounts;
use sluice_core::queue_type::QueueType;

use super::auth::Caller;
use super::error::{ApiError, ApiResult};
use super::queue_ops;
use super::ManagementState;

pub fn routes() -> Router<Arc<ManagementState>> {
    Router::new()
        .route("/api/health/checks/alarms", get(alarms))
        .route("/api/health/checks/local-alarms", get(local_alarms))
        .route(
            "/api/health/checks/node-is-quorum-critical",
            get(node_is_quorum_critical),
        )
        .route("/api/aliveness-test/{vhost}", get(aliveness_test))
}

fn failed(reason: Value) -> (StatusCode, Json<Value>) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"status": "failed", "reason": reason})),
    )
}

fn ok() -> (StatusCode, Json<Value>) {
    (StatusCode::OK, Json(json!({"status": "ok"})))
}

/// The alarms in effect, RabbitMQ's way; `node` names where they are when
/// it is known (this node's own), and is left out for the cluster's, which
/// every node hears merged.
fn alarm_report(
    alarms: crate::alarm::Alarms,
    node: Option<&str>,
    reason: &str,
) -> (StatusCode, Json<Value>) {
    if !alarms.any() {
        return ok();
    }
    let resources = [("memory", alarms.memory), ("disk", alarms.disk)];
    let listed = resources
        .into_iter()
        .filter(|(_, raised)| *raised)
        .map(|(resource, _)| match node {
            Some(node) => json!({"node": node, "resource": resource}),
            None => json!({"resource": resource}),
        })
        .collect();
    let (status, Json(mut body)) = failed(json!(reason));
    body["alarms"] = Value::Array(listed);
    (status, Json(body))
}

/// Alarms anywhere in the cluster.
async fn alarms(
    State(state): State<Arc<ManagementState>>,
    _caller: Caller,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let alarms = *state.cluster_alarms.borrow();
    Ok(alarm_report(
        alarms,
        None,
        "There are alarms in effect in the cluster",
    ))
}

async fn local_alarms(
    State(state): State<Arc<ManagementState>>,
    _caller: Caller,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let alarms = *state.alarms.borrow();
    let node = state.broker.node().name.to_string();
    Ok(alarm_report(
        alarms,
        Some(&node),
        "There are alarms in effect on the node",
    ))
}

/// Fails when stopping this node would leave a quorum queue without a
/// majority of its members online: those it holds a member of whose
/// other online members alone are not a majority.
async fn node_is_quorum_critical(
    State(state): State<Arc<ManagementState>>,
    _caller: Caller,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let local = state.broker.node().name.to_string();
    let members = state.broker.metadata.cluster_nodes(&local);
    if members.len() <= 1 {
        return Ok((
            StatusCode::OK,
            Json(json!({"status": "ok", "reason": "single node cluster"})),
        ));
    }
    let running = state.broker.metadata.running_nodes(&local);
    let mut critical = Vec::new();
    for vhost in state.broker.vhosts() {
        for queue in vhost.queues() {
            if queue.queue_type() != QueueType::Quorum {
                continue;
            }
            let group = queue.options().members.members();
            if !group.contains(&local) {
                continue;
            }
            let online_without_this = group
                .iter()
                .filter(|member| **member != local && running.contains(member))
                .count();
            if online_without_this < group.len() / 2 + 1 {
                critical.push(json!({
                    "name": queue.name().as_ref(),
                    "virtual_host": vhost.name.as_ref(),
                    "type": "quorum",
                    "readable_name": format!("queue '{}' in vhost '{}'", queue.name(), vhost.name),
                }));
            }
        }
    }
    if critical.is_empty() {
        return Ok(ok());
    }
    let (status, Json(mut body)) = failed(json!(
        "There are quorum queues that would lose their quorum if the target node is shut down"
    ));
    body["queues"] = Value::Array(critical);
    Ok((status, Json(body)))
}

/// Declares `aliveness-test` in the vhost, publishes to it and gets the
/// message back, as RabbitMQ's check does.
async fn aliveness_test(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(vhost_name): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.require_vhost(&vhost_name).map_err(|error| {
        if error.status == StatusCode::NOT_FOUND {
            ApiError::not_found()
        } else {
            error
        }
    })?;
    let vhost = state
        .broker
        .vhost(&vhost_name)
        .ok_or_else(ApiError::not_found)?;
    const QUEUE: &str = "aliveness-test";
    let connection_id = state.broker.next_connection_id();
    let declaration = sluice_core::vhost::QueueDeclaration {
        name: QUEUE,
        passive: false,
        durable: false,
        exclusive: false,
        auto_delete: false,
        arguments: Default::default(),
    };
    if vhost
        .check_queue_declaration(&declaration, connection_id)?
        .is_none()
    {
        let queue = vhost.new_queue_definition(&declaration, connection_id);
        state
            .broker
            .metadata
            .propose(sluice_core::metadata::MetadataCommand::DeclareQueue {
                vhost: vhost_name.clone(),
                queue,
                connection: connection_id,
            })
            .await?;
    }
    let message = Arc::new(sluice_core::message::Message {
        exchange: bytes::Bytes::new(),
        routing_key: bytes::Bytes::from_static(QUEUE.as_bytes()),
        properties: Default::default(),
        body: bytes::Bytes::from_static(b"test_message"),
    });
    let mut scratch = sluice_core::vhost::PublishScratch::default();
    let body_bytes = message.body_size();
    let published = vhost.publish(b"", message, &mut scratch, &mut Vec::new())?;
    vhost.counted_channels().add(MessageCounts::of_publish(
        body_bytes,
        published.routed,
        false,
    ));
    let queue = queue_ops::find(&state, &vhost_name, QUEUE)?;
    match queue_ops::get(&queue).await? {
        Some((entry, _)) => {
            queue_ops::settle(
                &queue,
                sluice_core::queue::forwarding::Settlement::Ack,
                &[entry.offset],
            );
            Ok(Json(json!({"status": "ok"})))
        }
        None => Err(ApiError::internal(
            "the aliveness test message did not come back",
        )),
    }
}
