//! `purge_queue` and `delete_queue`.

use super::client::{api_path, Subject};
use super::error::CtlResult;
use super::Context;

pub fn purge_queue(context: &Context, name: &str) -> CtlResult<()> {
    let vhost = &context.vhost;
    context
        .output
        .banner(&format!("Purging queue '{name}' in vhost '{vhost}' ..."));
    context.client.delete(
        &api_path(&["queues", vhost, name, "contents"]),
        &Subject::queue(vhost, name),
    )
}

/// Deletes the queue and says how many messages went with it: the count
/// is read just before the deletion (the API's DELETE answers none), so
/// messages published in between are not in it.
pub fn delete_queue(
    context: &Context,
    name: &str,
    if_empty: bool,
    if_unused: bool,
) -> CtlResult<()> {
    let vhost = &context.vhost;
    let mut conditions = Vec::new();
    if if_empty {
        conditions.push("if queue is empty");
    }
    if if_unused {
        conditions.push("if queue is unused");
    }
    let conditions = if conditions.is_empty() {
        String::new()
    } else {
        format!("{} ", conditions.join(" and "))
    };
    context.output.banner(&format!(
        "Deleting queue '{name}' on vhost '{vhost}' {conditions}..."
    ));
    let path = api_path(&["queues", vhost, name]);
    let subject = Subject::queue(vhost, name);
    let queue = context.client.get(&path, &subject)?;
    let mut query = Vec::new();
    if if_empty {
        query.push("if-empty=true");
    }
    if if_unused {
        query.push("if-unused=true");
    }
    let path = if query.is_empty() {
        path
    } else {
        format!("{path}?{}", query.join("&"))
    };
    context.client.delete(&path, &subject)?;
    context.output.message(&format!(
        "Queue was successfully deleted with {} messages",
        queue["messages"].as_u64().unwrap_or(0)
    ));
    Ok(())
}
