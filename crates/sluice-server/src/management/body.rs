//! Request bodies as RabbitMQ's management API reads them: a JSON object
//! (an empty body is an empty object), booleans given as JSON booleans or
//! as the strings `"true"` and `"false"`, and RabbitMQ's errors for what is
//! not JSON or lacks a key.

use amq_protocol::types::FieldTable;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde_json::{Map, Value};
use sluice_core::definitions_import::json_to_table;

use super::error::ApiError;

/// A request body that must be a JSON object.
pub struct JsonObject(pub Map<String, Value>);

impl<State: Send + Sync> FromRequest<State> for JsonObject {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &State) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| ApiError::bad_request(rejection.body_text()))?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(JsonObject(Map::new()));
        }
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(object)) => Ok(JsonObject(object)),
            _ => Err(ApiError::not_json()),
        }
    }
}

impl JsonObject {
    /// A boolean key; `default` when absent.
    pub fn flag(&self, key: &str, default: bool) -> Result<bool, ApiError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(flag)) => Ok(*flag),
            Some(Value::String(text)) if text == "true" => Ok(true),
            Some(Value::String(text)) if text == "false" => Ok(false),
            Some(_) => Err(ApiError::bad_request(format!("[{{not_boolean,{key}}}]"))),
        }
    }

    /// A string key; None when absent.
    pub fn text(&self, key: &str) -> Result<Option<&str>, ApiError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(ApiError::bad_request(format!("[{{not_string,{key}}}]"))),
        }
    }

    /// A string key that must be there.
    pub fn required_text(&self, key: &str) -> Result<&str, ApiError> {
        self.text(key)?.ok_or_else(|| ApiError::key_missing(key))
    }

    /// `arguments`, as AMQP field values; empty when absent.
    pub fn arguments(&self) -> Result<FieldTable, ApiError> {
        match self.0.get("arguments") {
            None | Some(Value::Null) => Ok(FieldTable::default()),
            Some(Value::Object(arguments)) => {
                json_to_table(arguments).map_err(ApiError::bad_request)
            }
            // rabbitmqadmin and the UI may send an empty list for none.
            Some(Value::Array(items)) if items.is_empty() => Ok(FieldTable::default()),
            Some(_) => Err(ApiError::bad_request("[{not_object,arguments}]")),
        }
    }
}
