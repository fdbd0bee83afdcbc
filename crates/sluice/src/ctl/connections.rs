//! `close_connection`.

use super::client::{api_path, Subject};
use super::error::CtlResult;
use super::Context;

/// Closes the connection named `name`; its client receives
/// connection.close with 320 (CONNECTION_FORCED) and `reason`.
///
/// The connection is looked up first: RabbitMQ answers the DELETE of a
/// name that is not (or no longer) there with 404, but Sluice's API with
/// 204, and a mistyped name must not pass for a closed connection.
pub fn close_connection(context: &Context, name: &str, reason: &str) -> CtlResult<()> {
    context
        .output
        .banner(&format!("Closing connection {name}, reason: {reason}..."));
    let path = api_path(&["connections", name]);
    let subject = Subject::Connection(name.to_owned());
    context.client.get(&path, &subject)?;
    let answer = context.client.send("DELETE", &path, None, Some(reason))?;
    if (200..300).contains(&answer.status) {
        Ok(())
    } else {
        Err(context.client.refusal(&answer, &subject))
    }
}
