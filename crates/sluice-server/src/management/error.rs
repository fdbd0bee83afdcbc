//! The management API's errors, in RabbitMQ's shape: a status and a JSON
//! body `{"error": ..., "reason": ...}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;
use sluice_core::error::AmqpError;
use sluice_wire::reply_code::ReplyCode;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub error: &'static str,
    /// Mostly text; RabbitMQ gives some reasons as Erlang terms in JSON,
    /// `["not_int", "delivery_mode"]`.
    pub reason: Value,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// What RabbitMQ answers for a vhost, queue, exchange, user... that
    /// does not exist.
    pub fn not_found() -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            error: "Object Not Found",
            reason: Value::from("Not Found"),
        }
    }

    /// A 404 a handler answers itself, with its reason, as RabbitMQ's
    /// `rabbit_mgmt_util:not_found/3` (`vhost_not_found`).
    pub fn not_found_because(reason: &'static str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            error: "not_found",
            reason: Value::from(reason),
        }
    }

    /// A path naming a vhost that does not exist, in a change.
    pub fn vhost_not_found() -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            error: "not_found",
            reason: Value::from("vhost_not_found"),
        }
    }

    /// A refusal whose reason RabbitMQ writes as a JSON term.
    pub fn bad_request_value(reason: Value) -> Self {
        ApiError {
            reason,
            ..ApiError::bad_request("")
        }
    }

    pub fn with_reason(self, reason: impl Into<String>) -> Self {
        ApiError {
            reason: Value::String(reason.into()),
            ..self
        }
    }

    /// A body that is not a JSON object.
    pub fn not_json() -> Self {
        ApiError::bad_request("not_json")
    }

    /// A body without a required key, in RabbitMQ's Erlang-term words.
    pub fn key_missing(key: &str) -> Self {
        ApiError::bad_request(format!("[{{key_missing,{key}}}]"))
    }

    pub fn bad_request(reason: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            error: "bad_request",
            reason: Value::String(reason.into()),
        }
    }

    pub fn unauthorized(reason: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            error: "not_authorized",
            reason: Value::String(reason.into()),
        }
    }

    /// Logged in, but not allowed this (a tag or a vhost the user lacks).
    pub fn not_allowed(reason: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            error: "not_authorised",
            reason: Value::String(reason.into()),
        }
    }

    pub fn internal(reason: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            error: "internal_server_error",
            reason: Value::String(reason.into()),
        }
    }

    pub fn unavailable(reason: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            error: "service_unavailable",
            reason: Value::String(reason.into()),
        }
    }
}

/// An AMQP error from a declaration, deletion, binding or purge, as
/// RabbitMQ's API reports the same refusal from its internal channel
/// (`rabbit_mgmt_util:direct_request`): not found is a 404 with the AMQP
/// text, access refused or not allowed a 401 "Access refused.", anything
/// else a 400 with the text alone.
impl From<AmqpError> for ApiError {
    fn from(error: AmqpError) -> Self {
        match error.code {
            ReplyCode::NotFound => ApiError {
                error: "not_found",
                ..ApiError::not_found()
            }
            .with_reason(error.text),
            ReplyCode::AccessRefused | ReplyCode::NotAllowed => {
                ApiError::not_allowed("Access refused.")
            }
            _ => ApiError::bad_request(error.text),
        }
    }
}

impl ApiError {
    /// An AMQP error from a publish or a get, which RabbitMQ's API makes
    /// on a channel of its own and reports as the channel's close, code
    /// and name first: 400 `"404 NOT_FOUND - no exchange 'x' in vhost '/'"`.
    pub fn from_channel(error: AmqpError) -> Self {
        match error.code {
            ReplyCode::AccessRefused => ApiError::not_allowed("Access refused."),
            _ => ApiError::bad_request(format!("{} {error}", error.code.code())),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": self.error, "reason": self.reason});
        let mut response = (self.status, Json(body)).into_response();
        if self.error == "not_authorized" {
            // A failed login: browsers ask for credentials again, as with
            // RabbitMQ (a refusal of a logged-in user does not ask).
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"RabbitMQ Management\""),
            );
        }
        response
    }
}
