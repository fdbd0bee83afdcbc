//! `close_connection`.

use super::client::{api_path, Subject};
use super::error::CtlResult;
use super::Context;

/// Closes the connection named `name`; its client receives
/// connection.close with 320 (CONNECTION_FORCED) and `reason`.
pub fn close_connection(context: &Context, name: &str, reason: &str) -> CtlResult<()> {
    context
        .output
        .banner(&format!("Closing connection {name}, reason: {reason}..."));
    let path = api_path(&["connections", name]);
    let answer = context.client.send("DELETE", &path, None, Some(reason))?;
    if (200..300).contains(&answer.status) {
        Ok(())
    } else {
        Err(context
            .client
            .refusal(&answer, &Subject::Connection(name.to_owned())))
    }
}
