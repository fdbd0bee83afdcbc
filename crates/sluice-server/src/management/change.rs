//! What a PUT or DELETE of the API does once it has checked the request:
//! one metadata change, proposed and applied on every node before the
//! answer, with RabbitMQ's status codes.

use axum::http::StatusCode;
use sluice_core::metadata::MetadataCommand;
use sluice_wire::reply_code::ReplyCode;

use super::error::{ApiError, ApiResult};
use super::ManagementState;

/// Proposes `command`, which creates an object (201) or replaces one that
/// `existed` (204).
pub async fn put(
    state: &ManagementState,
    existed: bool,
    command: MetadataCommand,
) -> ApiResult<StatusCode> {
    state.broker.metadata.propose(command).await?;
    Ok(if existed {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::CREATED
    })
}

/// Proposes `command`, which deletes an object, when it `exists`: 204, or
/// RabbitMQ's 404 when there is nothing to delete (also when another
/// deletion got there first, between the check and the log).
pub async fn delete(
    state: &ManagementState,
    exists: bool,
    command: MetadataCommand,
) -> ApiResult<StatusCode> {
    if !exists {
        return Err(ApiError::not_found());
    }
    match state.broker.metadata.propose(command).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(error) if error.code == ReplyCode::NotFound => Err(ApiError::not_found()),
        Err(error) => Err(error.into()),
    }
}
