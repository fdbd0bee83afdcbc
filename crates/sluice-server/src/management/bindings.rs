//! `/api/bindings`: list, and bind and unbind between an exchange and a
//! queue (`e/{source}/q/{queue}`) or two exchanges (`e/{source}/e/{dest}`).
//!
//! A binding is addressed as RabbitMQ addresses it, by its properties key:
//! the routing key, URL-encoded, followed for a binding with arguments by
//! `~` and a hash of the arguments (`~` alone for an empty key without).

use std::sync::Arc;

use amq_protocol::types::FieldTable;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use base64::Engine;
use serde_json::{json, Value};
use sluice_core::access::{Permission, ResourceKind};
use sluice_core::exchange::Destination;
use sluice_core::metadata::{BindingChange, MetadataCommand};
use sluice_core::vhost::VirtualHost;

use super::auth::Caller;
use super::body::JsonObject;
use super::error::{ApiError, ApiResult};
use super::exchanges::exchange_name;
use super::json::table_to_json;
use super::list_query::{ListQuery, SORT_BINDINGS};
use super::ManagementState;

pub fn routes() -> Router<Arc<ManagementState>> {
    Router::new()
        .route("/api/bindings", get(list))
        .route("/api/bindings/{vhost}", get(list_in_vhost))
        .route(
            "/api/bindings/{vhost}/e/{source}/{kind}/{destination}",
            get(list_between).post(bind),
        )
        .route(
            "/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}",
            get(show).delete(unbind),
        )
        .route(
            "/api/exchanges/{vhost}/{name}/bindings/source",
            get(from_exchange),
        )
        .route(
            "/api/exchanges/{vhost}/{name}/bindings/destination",
            get(to_exchange),
        )
        .route("/api/queues/{vhost}/{name}/bindings", get(to_queue))
}

/// One binding of a vhost, flattened.
struct Listed {
    source: String,
    destination: String,
    destination_is_queue: bool,
    routing_key: String,
    arguments: FieldTable,
}

/// RabbitMQ's `quote_plus`: letters, digits, `.`, `-`, `~` and `_` stay,
/// a space is `+`, everything else is %XX.
fn quote_plus(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b' ' => encoded.push('+'),
            byte if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'-' | b'~' | b'_') => {
                encoded.push(byte as char)
            }
            byte => encoded.push_str(&format!("%{byte:02X}")),
        }
    }
    encoded
}

/// A binding's properties key. With arguments, `~` and a hash of them
/// follows: RabbitMQ's is of the Erlang term, which clients only echo back;
/// this one is FNV-1a of the arguments' JSON, the same on every node and
/// every build, so a key listed by one node addresses the binding on any.
fn properties_key(routing_key: &str, arguments: &FieldTable) -> String {
    if arguments.inner().is_empty() {
        return if routing_key.is_empty() {
            "~".to_owned()
        } else {
            quote_plus(routing_key)
        };
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in table_to_json(arguments).to_string().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let hash = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&hash.to_be_bytes()[..4]);
    format!("{}~{hash}", quote_plus(routing_key))
}

fn bindings_of(vhost: &VirtualHost) -> Vec<Listed> {
    let mut listed: Vec<Listed> = Vec::new();
    // The default exchange's implicit bindings, as RabbitMQ lists them.
    for queue in vhost.queues() {
        listed.push(Listed {
            source: String::new(),
            destination: queue.name().to_string(),
            destination_is_queue: true,
            routing_key: queue.name().to_string(),
            arguments: FieldTable::default(),
        });
    }
    for (source, binding) in vhost.bindings() {
        let (destination, destination_is_queue) = match &binding.destination {
            Destination::Queue(name) => (name.to_string(), true),
            Destination::Exchange(name) => (name.to_string(), false),
        };
        listed.push(Listed {
            source: source.to_string(),
            destination,
            destination_is_queue,
            routing_key: binding.routing_key.clone(),
            arguments: binding.arguments.clone(),
        });
    }
    listed
}

fn binding_json(vhost: &str, binding: &Listed) -> Value {
    json!({
        "source": binding.source,
        "vhost": vhost,
        "destination": binding.destination,
        "destination_type": if binding.destination_is_queue { "queue" } else { "exchange" },
        "routing_key": binding.routing_key,
        "arguments": table_to_json(&binding.arguments),
        "properties_key": properties_key(&binding.routing_key, &binding.arguments),
    })
}

/// The bindings of a visible vhost that `keep` picks, as JSON.
fn listed_json(
    state: &ManagementState,
    caller: &Caller,
    vhost_name: &str,
    keep: impl Fn(&Listed) -> bool,
) -> ApiResult<Vec<Value>> {
    caller.require_visible_vhost(vhost_name)?;
    let vhost = state
        .broker
        .vhost(vhost_name)
        .ok_or_else(ApiError::not_found)?;
    Ok(bindings_of(&vhost)
        .iter()
        .filter(|binding| keep(binding))
        .map(|binding| binding_json(vhost_name, binding))
        .collect())
}

/// Bindings have no name: sorted by vhost, source, destination, routing
/// key and properties key unless the query says otherwise, as in RabbitMQ.
fn sorted(query: &ListQuery, items: Vec<Value>) -> ApiResult<Value> {
    query.apply_sorted_by(items, SORT_BINDINGS)
}

async fn list(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    let mut all = Vec::new();
    for vhost in state.broker.vhosts() {
        if caller.sees_vhost(&vhost.name) {
            all.extend(listed_json(&state, &caller, &vhost.name, |_| true)?);
        }
    }
    Ok(Json(sorted(&query, all)?))
}

async fn list_in_vhost(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path(vhost): Path<String>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    let listed = listed_json(&state, &caller, &vhost, |_| true)?;
    Ok(Json(sorted(&query, listed)?))
}

/// `q` or `e` in a binding path.
fn destination_is_queue(kind: &str) -> ApiResult<bool> {
    match kind {
        "q" => Ok(true),
        "e" => Ok(false),
        _ => Err(ApiError::not_found()),
    }
}

async fn list_between(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, source, kind, destination)): Path<(String, String, String, String)>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    let to_queue = destination_is_queue(&kind)?;
    let source = exchange_name(&source).to_owned();
    let listed = listed_json(&state, &caller, &vhost, |binding| {
        binding.source == source
            && binding.destination == destination
            && binding.destination_is_queue == to_queue
    })?;
    Ok(Json(sorted(&query, listed)?))
}

async fn show(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, source, kind, destination, props)): Path<(String, String, String, String, String)>,
) -> ApiResult<Json<Value>> {
    let to_queue = destination_is_queue(&kind)?;
    let source = exchange_name(&source).to_owned();
    listed_json(&state, &caller, &vhost, |binding| {
        binding.source == source
            && binding.destination == destination
            && binding.destination_is_queue == to_queue
            && addressed_by(binding, &props)
    })?
    .into_iter()
    .next()
    .map(Json)
    .ok_or_else(ApiError::not_found)
}

/// Whether `props` (decoded once from the path) names `binding`: its
/// properties key, or, for a binding without arguments, its routing key
/// itself (a client that encoded the key once).
fn addressed_by(binding: &Listed, props: &str) -> bool {
    properties_key(&binding.routing_key, &binding.arguments) == props
        || (binding.arguments.inner().is_empty() && binding.routing_key == props)
}

async fn bind(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, source, kind, destination)): Path<(String, String, String, String)>,
    body: JsonObject,
) -> ApiResult<(StatusCode, HeaderMap)> {
    caller.require_vhost(&vhost)?;
    let to_queue = destination_is_queue(&kind)?;
    let source = exchange_name(&source);
    if source.is_empty() {
        return Err(ApiError::not_allowed("Access refused."));
    }
    let routing_key = body.text("routing_key")?.unwrap_or("").to_owned();
    let arguments = body.arguments()?;
    let destination_kind = if to_queue {
        ResourceKind::Queue
    } else {
        ResourceKind::Exchange
    };
    caller.check_access(&vhost, Permission::Write, destination_kind, &destination)?;
    caller.check_access(&vhost, Permission::Read, ResourceKind::Exchange, source)?;
    // Both parts quoted once more, as RabbitMQ writes it.
    let location = format!(
        "{}/{}",
        quote_plus(&destination),
        quote_plus(&properties_key(&routing_key, &arguments))
    );
    let change = BindingChange {
        vhost,
        source: source.to_owned(),
        destination,
        destination_is_queue: to_queue,
        routing_key,
        arguments,
        connection: state.broker.next_connection_id(),
    };
    state
        .broker
        .metadata
        .propose(MetadataCommand::Bind(change))
        .await?;
    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_str(&location) {
        headers.insert(header::LOCATION, value);
    }
    Ok((StatusCode::CREATED, headers))
}

async fn unbind(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost_name, source, kind, destination, props)): Path<(
        String,
        String,
        String,
        String,
        String,
    )>,
) -> ApiResult<StatusCode> {
    caller.require_vhost(&vhost_name)?;
    let to_queue = destination_is_queue(&kind)?;
    let source = exchange_name(&source).to_owned();
    let vhost = state
        .broker
        .vhost(&vhost_name)
        .ok_or_else(ApiError::vhost_not_found)?;
    let binding = bindings_of(&vhost)
        .into_iter()
        .find(|binding| {
            binding.source == source
                && binding.destination == destination
                && binding.destination_is_queue == to_queue
                && addressed_by(binding, &props)
        })
        .ok_or_else(ApiError::not_found)?;
    if binding.source.is_empty() {
        return Err(ApiError::not_allowed("Access refused."));
    }
    let destination_kind = if to_queue {
        ResourceKind::Queue
    } else {
        ResourceKind::Exchange
    };
    caller.check_access(
        &vhost_name,
        Permission::Write,
        destination_kind,
        &destination,
    )?;
    caller.check_access(
        &vhost_name,
        Permission::Read,
        ResourceKind::Exchange,
        &source,
    )?;
    let change = BindingChange {
        vhost: vhost_name,
        source,
        destination,
        destination_is_queue: to_queue,
        routing_key: binding.routing_key,
        arguments: binding.arguments,
        connection: state.broker.next_connection_id(),
    };
    state
        .broker
        .metadata
        .propose(MetadataCommand::Unbind(change))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn from_exchange(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    let name = exchange_name(&name).to_owned();
    let listed = listed_json(&state, &caller, &vhost, |binding| binding.source == name)?;
    Ok(Json(sorted(&query, listed)?))
}

async fn to_exchange(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    let listed = listed_json(&state, &caller, &vhost, |binding| {
        !binding.destination_is_queue && binding.destination == name
    })?;
    Ok(Json(sorted(&query, listed)?))
}

async fn to_queue(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost, name)): Path<(String, String)>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    let listed = listed_json(&state, &caller, &vhost, |binding| {
        binding.destination_is_queue && binding.destination == name
    })?;
    Ok(Json(sorted(&query, listed)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_keys_are_written_as_rabbitmq_writes_them() {
        use amq_protocol::types::AMQPValue;
        let none = FieldTable::default();
        assert_eq!(properties_key("a.*", &none), "a.%2A");
        assert_eq!(properties_key("#", &none), "%23");
        assert_eq!(properties_key("", &none), "~");
        assert_eq!(properties_key("a b~c", &none), "a+b~c");
        let mut arguments = FieldTable::default();
        arguments.insert("x-match".into(), AMQPValue::LongString("all".into()));
        let key = properties_key("k", &arguments);
        assert!(key.starts_with("k~") && key.len() > 2, "{key}");
    }
}
