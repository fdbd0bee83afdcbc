//! `/api/queues`: list, show (with type, node, leader and members, counts
//! and rates), declare (PUT), delete, purge (`DELETE .../contents`), get.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::{self, StreamExt};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sluice_core::access::{Permission, ResourceKind};
use sluice_core::metadata::MetadataCommand;
use sluice_core::queue::{Queue, QueueStats};
use sluice_core::queue_type::QueueType;
use sluice_core::vhost::{QueueDeclaration, VirtualHost};

use super::auth::Caller;
use super::body::JsonObject;
use super::error::{ApiError, ApiResult};
use super::json::table_to_json;
use super::list_query::ListQuery;
use super::publish;
use super::queue_ops;
use super::rates::{message_stats, with_rate, RateKey};
use super::ManagementState;

/// The longest name AMQP carries (a short string).
pub const NAME_BYTES_MAX: usize = 255;

/// How long a listing waits for another node's count of its queue.
const REMOTE_COUNTS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Queues of other nodes counted at once, for one listing.
const REMOTE_COUNTS_IN_FLIGHT: usize = 32;

pub fn routes() -> Router<Arc<ManagementState>> {
    Router::new()
        .route("/api/queues", get(list))
        .route("/api/queues/{vhost}", get(list_in_vhost))
        .route(
            "/api/queues/{vhost}/{name}",
            get(show).put(declare).delete(delete_queue),
        )
        .route("/api/queues/{vhost}/{name}/contents", delete(purge))
        .route("/api/queues/{vhost}/{name}/get", post(publish::get))
}

/// A queue's counts: this node's own for a classic queue here or a quorum
/// queue with a member here; its home node's otherwise (None when that
/// node cannot answer: the queue is listed as down).
async fn counts(queue: &Arc<dyn Queue>) -> Option<QueueStats> {
    if let Some(stats) = queue_ops::stats_here(queue) {
        return Some(stats);
    }
    if queue.unavailable().is_some() {
        return None;
    }
    // A home node that is up but does not answer shows its queue as down
    // rather than hold up the whole listing.
    tokio::time::timeout(REMOTE_COUNTS_TIMEOUT, queue_ops::stats(queue))
        .await
        .ok()?
        .ok()
}

/// Messages and consumers of some queues, added up.
#[derive(Clone, Copy, Debug, Default)]
pub struct QueueTotals {
    pub messages_ready: u64,
    pub messages_unacknowledged: u64,
    pub consumers: u64,
}

/// What `queues` hold, wherever each is held: the home nodes of remote
/// classic queues are asked at once; a queue whose node cannot answer adds
/// nothing, as it is listed down.
pub async fn totals(queues: Vec<Arc<dyn Queue>>) -> QueueTotals {
    let counted = futures_util::future::join_all(queues.iter().map(counts)).await;
    let mut totals = QueueTotals::default();
    for stats in counted.into_iter().flatten() {
        totals.messages_ready += u64::from(stats.messages_ready);
        totals.messages_unacknowledged += stats.messages_unacknowledged;
        totals.consumers += u64::from(stats.consumers);
    }
    totals
}

fn queue_json(
    state: &ManagementState,
    vhost: &VirtualHost,
    queue: &Arc<dyn Queue>,
    stats: Option<QueueStats>,
) -> Value {
    let options = queue.options();
    let local = state.broker.node().name.to_string();
    let home = queue
        .home_node()
        .map_or_else(|| local.clone(), |home| home.to_string());
    let key = RateKey::Queue {
        vhost: vhost.name.to_string(),
        name: queue.name().to_string(),
    };
    let rates = state.rates.rates(&key);
    let mut object = Map::new();
    object.insert("name".into(), json!(queue.name().as_ref()));
    object.insert("vhost".into(), json!(vhost.name.as_ref()));
    object.insert("type".into(), json!(queue.queue_type().as_str()));
    object.insert("durable".into(), json!(options.durable));
    object.insert("auto_delete".into(), json!(options.auto_delete));
    object.insert("exclusive".into(), json!(options.exclusive_owner.is_some()));
    object.insert("arguments".into(), table_to_json(&options.arguments));
    let policy = state.broker.queue_policy(&vhost.name, queue.name());
    object.insert(
        "policy".into(),
        json!(policy.as_ref().map(|policy| &policy.name)),
    );
    object.insert(
        "effective_policy_definition".into(),
        policy.map_or_else(|| json!({}), |policy| Value::Object(policy.definition)),
    );
    object.insert(
        "state".into(),
        json!(if stats.is_some() { "running" } else { "down" }),
    );
    if queue.queue_type() == QueueType::Quorum {
        let running = state.broker.metadata.running_nodes(&local);
        let leader = queue.leader();
        object.insert("node".into(), json!(leader.clone().unwrap_or(home)));
        object.insert("leader".into(), json!(leader));
        let members = options.members.members();
        object.insert("members".into(), json!(members));
        object.insert(
            "online".into(),
            json!(members
                .iter()
                .filter(|member| running.contains(member))
                .collect::<Vec<_>>()),
        );
    } else {
        object.insert("node".into(), json!(home));
    }
    if let Some(stats) = stats {
        let ready = stats.messages_ready as u64;
        let unacked = stats.messages_unacknowledged;
        with_rate(
            &mut object,
            "messages",
            ready + unacked,
            rates.gauges[0] + rates.gauges[1],
        );
        with_rate(&mut object, "messages_ready", ready, rates.gauges[0]);
        with_rate(
            &mut object,
            "messages_unacknowledged",
            unacked,
            rates.gauges[1],
        );
        object.insert("messages_paged_out".into(), json!(stats.messages_paged));
        object.insert("message_bytes_ready".into(), json!(stats.ready_bytes));
        object.insert("consumers".into(), json!(stats.consumers));
    }
    object.insert(
        "message_stats".into(),
        message_stats(&queue.counts(), &rates),
    );
    Value::Object(object)
}

/// The queues of `vhosts` as JSON, counted (remote ones a few at a time).
async fn queues_json(state: &ManagementState, vhosts: Vec<Arc<VirtualHost>>) -> Vec<Value> {
    let queues: Vec<(Arc<VirtualHost>, Arc<dyn Queue>)> = vhosts
        .into_iter()
        .flat_map(|vhost| {
            vhost
                .queues()
                .into_iter()
                .map(move |queue| (Arc::clone(&vhost), queue))
        })
        .collect();
    // Boxed: the stream's futures then have one nameable type, which keeps
    // the handler's future `Send` for axum.
    let counting: Vec<BoxFuture<'_, Value>> = queues
        .into_iter()
        .map(|(vhost, queue)| counted(state, vhost, queue).boxed())
        .collect();
    stream::iter(counting)
        .buffered(REMOTE_COUNTS_IN_FLIGHT)
        .collect()
        .await
}

async fn counted(state: &ManagementState, vhost: Arc<VirtualHost>, queue: Arc<dyn Queue>) -> Value {
    let stats = counts(&queue).await;
    queue_json(state, &vhost, &queue, stats)
}

async fn list(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    let vhosts = state
        .broker
        .vhosts()
        .into_iter()
        .filter(|vhost| caller.sees_vhost(&vhost.name))
        .collect();
    Ok(Json(query.apply(queues_json(&state, vhosts).await)?))
}

async fn list_in_vhost(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    caller.require_visible_vhost(&vhost)?;
    let vhost = state.broker.vhost(&vhost).ok_or_else(ApiError::not_found)?;
    Ok(Json(query.apply(queues_json(&state, vec![vhost]).await)?))
}

async fn show(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost_name, name)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    caller.require_visible_vhost(&vhost_name)?;
    let vhost = state
        .broker
        .vhost(&vhost_name)
        .ok_or_else(ApiError::not_found)?;
    let queue = queue_ops::find(&state, &vhost_name, &name).map_err(|_| ApiError::not_found())?;
    let stats = counts(&queue).await;
    Ok(Json(queue_json(&state, &vhost, &queue, stats)))
}

/// Declares the queue: 201 when new, 204 when an equivalent one was
/// there, 400 with the AMQP reply otherwise.
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
    // AMQP cannot name a longer queue; RabbitMQ's API refuses one, so.
    if name.len() > NAME_BYTES_MAX {
        return Err(ApiError::bad_request(format!(
            "queue should be less than 255 bytes, actually was {}\n",
            name.len()
        )));
    }
    caller.check_access(
        &vhost_name,
        Permission::Configure,
        ResourceKind::Queue,
        &name,
    )?;
    let declaration = QueueDeclaration {
        name: &name,
        passive: false,
        // As RabbitMQ: a body that does not say is a transient queue.
        durable: body.flag("durable", false)?,
        exclusive: false,
        auto_delete: body.flag("auto_delete", false)?,
        arguments: body.arguments()?,
    };
    // The API is no connection: it owns nothing exclusive.
    let connection_id = state.broker.next_connection_id();
    if vhost
        .check_queue_declaration(&declaration, connection_id)?
        .is_some()
    {
        return Ok(StatusCode::NO_CONTENT);
    }
    let definition = vhost.new_queue_definition(&declaration, connection_id);
    if let Some(exchange) = declaration
        .arguments
        .inner()
        .get("x-dead-letter-exchange")
        .and_then(|value| value.as_long_string().map(|text| text.to_string()))
    {
        caller.check_access(&vhost_name, Permission::Read, ResourceKind::Queue, &name)?;
        caller.check_access(
            &vhost_name,
            Permission::Write,
            ResourceKind::Exchange,
            &exchange,
        )?;
    }
    let command = MetadataCommand::DeclareQueue {
        vhost: vhost_name,
        queue: definition,
        connection: connection_id,
    };
    state.broker.metadata.propose(command).await?;
    Ok(StatusCode::CREATED)
}

/// A queue that is not there is RabbitMQ's plain 404; one that refuses use
/// (another connection's exclusive queue) says why.
fn missing_as_404(error: sluice_core::error::AmqpError) -> ApiError {
    if error.code == sluice_wire::reply_code::ReplyCode::NotFound {
        ApiError::not_found()
    } else {
        error.into()
    }
}

#[derive(Debug, Default, Deserialize)]
struct DeleteQuery {
    #[serde(rename = "if-unused")]
    if_unused: Option<String>,
    #[serde(rename = "if-empty")]
    if_empty: Option<String>,
}

async fn delete_queue(
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
    caller.check_access(
        &vhost_name,
        Permission::Configure,
        ResourceKind::Queue,
        &name,
    )?;
    let queue = queue_ops::find_for_use(&state, &vhost_name, &name).map_err(missing_as_404)?;
    let if_unused = query.if_unused.as_deref() == Some("true");
    let if_empty = query.if_empty.as_deref() == Some("true");
    if if_unused || if_empty {
        let stats = queue_ops::stats(&queue).await?;
        vhost.check_queue_deletable(&queue, stats, if_unused, if_empty)?;
    }
    state
        .broker
        .metadata
        .propose(vhost.deletion_of(&queue))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn purge(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost_name, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    caller.require_vhost(&vhost_name)?;
    caller.check_access(&vhost_name, Permission::Read, ResourceKind::Queue, &name)?;
    let queue = queue_ops::find_for_use(&state, &vhost_name, &name).map_err(missing_as_404)?;
    queue_ops::purge(&queue).await?;
    Ok(StatusCode::NO_CONTENT)
}
