//! Messages through the API: `POST /api/exchanges/{vhost}/{name}/publish`
//! and `POST /api/queues/{vhost}/{name}/get`, with RabbitMQ's body fields,
//! encodings and errors. Meant for trying things out, as in RabbitMQ: a
//! publish is answered once routed, without waiting for a confirm.

use std::sync::Arc;

use amq_protocol::protocol::BasicProperties as AMQPProperties;
use amq_protocol::types::ShortString;
use axum::extract::{Path, State};
use axum::Json;
use base64::Engine;
use bytes::Bytes;
use serde_json::{json, Map, Value};
use sluice_core::access::{Permission, ResourceKind};
use sluice_core::counters::MessageCounts;
use sluice_core::error::AmqpError;
use sluice_core::message::Message;
use sluice_core::queue::forwarding::Settlement;
use sluice_core::queue::{MessageId, Queue};
use sluice_core::vhost::PublishScratch;
use sluice_wire::content::RawProperties;

use super::auth::Caller;
use super::body::JsonObject;
use super::error::{ApiError, ApiResult};
use super::exchanges::exchange_name;
use super::json::table_to_json;
use super::queue_ops;
use super::ManagementState;

const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// How many messages one `get` may take at most.
const GET_COUNT_MAX: u64 = 10_000;

/// Body bytes one `get` takes at most: it stops after the message that
/// passes this, so that one answer stays a bounded size.
const GET_BODY_BYTES_MAX: usize = 64 * 1024 * 1024;

pub async fn publish(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost_name, name)): Path<(String, String)>,
    body: JsonObject,
) -> ApiResult<Json<Value>> {
    caller.require_vhost(&vhost_name)?;
    let vhost = state
        .broker
        .vhost(&vhost_name)
        .ok_or_else(ApiError::vhost_not_found)?;
    let missing: Vec<&str> = ["properties", "routing_key", "payload", "payload_encoding"]
        .into_iter()
        .filter(|key| !body.0.contains_key(*key))
        .collect();
    if !missing.is_empty() {
        return Err(keys_missing(&missing));
    }
    let exchange = exchange_name(&name);
    caller.check_access(
        &vhost_name,
        Permission::Write,
        ResourceKind::Exchange,
        exchange,
    )?;
    let routing_key = body.required_text("routing_key")?;
    let payload = body.required_text("payload")?;
    let body_bytes = match body.required_text("payload_encoding")? {
        "string" => Bytes::copy_from_slice(payload.as_bytes()),
        "base64" => Bytes::from(
            BASE64
                .decode(payload)
                .map_err(|_| ApiError::bad_request_value(json!(["not_base64", payload])))?,
        ),
        other => {
            return Err(ApiError::bad_request_value(json!([
                "unsupported_encoding",
                other
            ])))
        }
    };
    let properties = match body.0.get("properties") {
        Some(Value::Object(properties)) => properties_from_json(properties)?,
        _ => AMQPProperties::default(),
    };
    if let Some(user_id) = properties.user_id() {
        if user_id.as_str() != caller.user {
            return Err(ApiError::from_channel(AmqpError::precondition_failed(
                format!(
                    "user_id property set to '{}' but authenticated user was '{}'",
                    user_id.as_str(),
                    caller.user
                ),
            )));
        }
    }
    let message = Arc::new(Message {
        exchange: Bytes::copy_from_slice(exchange.as_bytes()),
        routing_key: Bytes::copy_from_slice(routing_key.as_bytes()),
        properties: RawProperties::from_properties(&properties),
        body: body_bytes,
    });
    let mut scratch = PublishScratch::default();
    let mut congested = Vec::new();
    let body_bytes = message.body_size();
    let published = vhost
        .publish(exchange.as_bytes(), message, &mut scratch, &mut congested)
        .map_err(ApiError::from_channel)?;
    // Counted as RabbitMQ counts it, on the vhost (there, on the API's
    // internal channel).
    vhost.counted_channels().add(MessageCounts::of_publish(
        body_bytes,
        published.routed,
        false,
    ));
    Ok(Json(json!({"routed": published.routed})))
}

fn keys_missing(keys: &[&str]) -> ApiError {
    let listed: Vec<String> = keys
        .iter()
        .map(|key| format!("{{key_missing,{key}}}"))
        .collect();
    ApiError::bad_request(format!("[{}]", listed.join(",")))
}

/// Message properties from the JSON RabbitMQ's API takes; keys it does not
/// know are ignored, as RabbitMQ ignores them.
fn properties_from_json(json: &Map<String, Value>) -> ApiResult<AMQPProperties> {
    let mut properties = AMQPProperties::default();
    let text = |key: &str| -> ApiResult<Option<ShortString>> {
        match json.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) if text.len() <= 255 => Ok(Some(text.as_str().into())),
            Some(_) => Err(ApiError::bad_request_value(json!(["not_string", key]))),
        }
    };
    let integer = |key: &str, max: u64| -> ApiResult<Option<u64>> {
        match json.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(number)) => match number.as_u64() {
                Some(value) if value <= max => Ok(Some(value)),
                _ => Err(ApiError::bad_request_value(json!(["not_int", key]))),
            },
            Some(_) => Err(ApiError::bad_request_value(json!(["not_int", key]))),
        }
    };
    if let Some(value) = text("content_type")? {
        properties = properties.with_content_type(value);
    }
    if let Some(value) = text("content_encoding")? {
        properties = properties.with_content_encoding(value);
    }
    match json.get("headers") {
        Some(Value::Object(headers)) => {
            // A key or nesting AMQP cannot carry is refused, as a value
            // that is not a table is.
            let headers = sluice_core::definitions_import::json_to_table(headers)
                .map_err(|_| ApiError::bad_request_value(json!(["not_table", "headers"])))?;
            properties = properties.with_headers(headers);
        }
        None | Some(Value::Null) => {}
        Some(_) => return Err(ApiError::bad_request_value(json!(["not_table", "headers"]))),
    }
    if let Some(value) = integer("delivery_mode", u8::MAX as u64)? {
        properties = properties.with_delivery_mode(value as u8);
    }
    if let Some(value) = integer("priority", u8::MAX as u64)? {
        properties = properties.with_priority(value as u8);
    }
    if let Some(value) = text("correlation_id")? {
        properties = properties.with_correlation_id(value);
    }
    if let Some(value) = text("reply_to")? {
        properties = properties.with_reply_to(value);
    }
    if let Some(value) = text("expiration")? {
        properties = properties.with_expiration(value);
    }
    if let Some(value) = text("message_id")? {
        properties = properties.with_message_id(value);
    }
    if let Some(value) = integer("timestamp", u64::MAX)? {
        properties = properties.with_timestamp(value);
    }
    if let Some(value) = text("type")? {
        properties = properties.with_type(value);
    }
    if let Some(value) = text("user_id")? {
        properties = properties.with_user_id(value);
    }
    if let Some(value) = text("app_id")? {
        properties = properties.with_app_id(value);
    }
    if let Some(value) = text("cluster_id")? {
        properties = properties.with_cluster_id(value);
    }
    Ok(properties)
}

/// Properties as RabbitMQ's API writes them: only those set.
fn properties_to_json(properties: &AMQPProperties) -> Value {
    let mut json = Map::new();
    let mut text = |key: &str, value: &Option<ShortString>| {
        if let Some(value) = value {
            json.insert(key.to_owned(), json!(value.as_str()));
        }
    };
    text("content_type", properties.content_type());
    text("content_encoding", properties.content_encoding());
    text("correlation_id", properties.correlation_id());
    text("reply_to", properties.reply_to());
    text("expiration", properties.expiration());
    text("message_id", properties.message_id());
    text("type", properties.kind());
    text("user_id", properties.user_id());
    text("app_id", properties.app_id());
    text("cluster_id", properties.cluster_id());
    if let Some(mode) = properties.delivery_mode() {
        json.insert("delivery_mode".into(), json!(mode));
    }
    if let Some(priority) = properties.priority() {
        json.insert("priority".into(), json!(priority));
    }
    if let Some(timestamp) = properties.timestamp() {
        json.insert("timestamp".into(), json!(timestamp));
    }
    if let Some(headers) = properties.headers() {
        json.insert("headers".into(), table_to_json(headers));
    }
    // RabbitMQ writes no properties as an empty list.
    if json.is_empty() {
        return Value::Array(Vec::new());
    }
    Value::Object(json)
}

/// What `get` does with the messages it took.
#[derive(Clone, Copy)]
enum AckMode {
    /// Put back, redelivered.
    Requeue,
    /// Acknowledged: gone.
    Ack,
    /// Rejected without requeue: dead-lettered where the queue says so.
    Reject,
}

pub async fn get(
    State(state): State<Arc<ManagementState>>,
    caller: Caller,
    Path((vhost_name, name)): Path<(String, String)>,
    body: JsonObject,
) -> ApiResult<Json<Value>> {
    caller.require_vhost(&vhost_name)?;
    let missing: Vec<&str> = ["ackmode", "count", "encoding"]
        .into_iter()
        .filter(|key| !body.0.contains_key(*key))
        .collect();
    if !missing.is_empty() {
        return Err(keys_missing(&missing));
    }
    let ack_mode = match body.required_text("ackmode")? {
        "ack_requeue_true" | "reject_requeue_true" => AckMode::Requeue,
        "ack_requeue_false" => AckMode::Ack,
        "reject_requeue_false" => AckMode::Reject,
        other => return Err(ApiError::bad_request(format!("unknown ackmode '{other}'"))),
    };
    let base64 = match body.required_text("encoding")? {
        "auto" => false,
        "base64" => true,
        _ => {
            return Err(ApiError::bad_request(
                "Unsupported encoding. Please use auto or base64.",
            ))
        }
    };
    // rabbitmqadmin sends the count as a string.
    let count = match body.0.get("count") {
        Some(Value::Number(number)) => number.as_u64(),
        Some(Value::String(text)) => text.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| ApiError::bad_request_value(json!(["not_int", "count"])))?
    .min(GET_COUNT_MAX);
    let truncate = match body.0.get("truncate") {
        Some(Value::Number(number)) => number.as_u64().map(|limit| limit as usize),
        Some(Value::String(text)) => text.parse().ok(),
        _ => None,
    };
    caller.check_access(&vhost_name, Permission::Read, ResourceKind::Queue, &name)?;
    // RabbitMQ's get names the missing queue as its channel saw it.
    let queue = queue_ops::find_for_use(&state, &vhost_name, &name).map_err(|error| {
        ApiError::from(error.clone()).with_reason(format!("NOT_FOUND - {}", error.text))
    })?;
    let settlement = match ack_mode {
        AckMode::Requeue => Settlement::Requeue,
        AckMode::Ack => Settlement::Ack,
        AckMode::Reject => Settlement::Reject,
    };
    // Whatever happens from here (a failed get part-way, a client gone
    // mid-request), what was taken is settled, requeued at worst.
    let mut taken = Taken {
        queue: Arc::clone(&queue),
        ids: Vec::new(),
        settlement: Settlement::Requeue,
    };
    let mut messages = Vec::new();
    let mut body_bytes = 0usize;
    while (messages.len() as u64) < count && body_bytes < GET_BODY_BYTES_MAX {
        let got = queue_ops::get(&queue)
            .await
            .map_err(ApiError::from_channel)?;
        let Some((entry, remaining)) = got else {
            break;
        };
        taken.ids.push(entry.offset);
        let message = &entry.message;
        let properties = message.properties.decode().unwrap_or_default();
        let payload_bytes = message.body.len();
        body_bytes += payload_bytes;
        let shown = &message.body[..truncate.unwrap_or(payload_bytes).min(payload_bytes)];
        let (payload, encoding) = match std::str::from_utf8(shown) {
            Ok(text) if !base64 => (text.to_owned(), "string"),
            _ => (BASE64.encode(shown), "base64"),
        };
        messages.push(json!({
            "payload_bytes": payload_bytes,
            "redelivered": entry.redelivered,
            "exchange": String::from_utf8_lossy(&message.exchange),
            "routing_key": String::from_utf8_lossy(&message.routing_key),
            "message_count": remaining,
            "properties": properties_to_json(&properties),
            "payload": payload,
            "payload_encoding": encoding,
        }));
    }
    taken.settlement = settlement;
    drop(taken);
    Ok(Json(Value::Array(messages)))
}

/// Messages a get took, settled when it is done with them, however it
/// ends: as asked once the answer is made, requeued before that.
struct Taken {
    queue: Arc<dyn Queue>,
    ids: Vec<MessageId>,
    settlement: Settlement,
}

impl Drop for Taken {
    fn drop(&mut self) {
        queue_ops::settle(&self.queue, self.settlement, &self.ids);
    }
}
