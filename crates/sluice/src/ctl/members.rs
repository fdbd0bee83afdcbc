//! rabbitmq-queues' `add_member`, `delete_member`, `grow` and `shrink`:
//! a quorum queue's members (replicas), over the API's
//! `/api/queues/quorum/...` endpoints.

use serde_json::json;

use super::args::GrowStrategy;
use super::client::{api_path, Subject};
use super::error::{CtlError, CtlResult};
use super::Context;

/// Sends a change and requires its 204. A 404 that names a node (one the
/// cluster does not have) is said as the node's refusal, not as a missing
/// queue.
fn change(
    context: &Context,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
    subject: &Subject,
) -> CtlResult<()> {
    let answer = context
        .client
        .send(method, path, body.map(|body| body.to_string()), None)?;
    if (200..300).contains(&answer.status) {
        return Ok(());
    }
    let reason = answer
        .json()
        .ok()
        .and_then(|body| body["reason"].as_str().map(str::to_owned));
    match reason {
        Some(reason) if answer.status == 404 && reason.starts_with("node_not_running") => {
            Err(CtlError::Refused(reason))
        }
        _ => Err(context.client.refusal(&answer, subject)),
    }
}

fn queue_path(context: &Context, name: &str, action: &str) -> String {
    api_path(&["queues", "quorum", &context.vhost, name, "replicas", action])
}

pub fn add_member(context: &Context, name: &str, node: &str) -> CtlResult<()> {
    context.output.banner(&format!(
        "Adding a replica for queue {name} on node {node}..."
    ));
    let subject = Subject::queue(&context.vhost, name);
    let body = json!({ "node": node });
    change(
        context,
        "POST",
        &queue_path(context, name, "add"),
        Some(body),
        &subject,
    )
}

pub fn delete_member(context: &Context, name: &str, node: &str) -> CtlResult<()> {
    context.output.banner(&format!(
        "Removing a replica for queue {name} on node {node}..."
    ));
    let subject = Subject::queue(&context.vhost, name);
    let body = json!({ "node": node });
    let path = queue_path(context, name, "delete");
    change(context, "DELETE", &path, Some(body), &subject)
}

pub fn grow(
    context: &Context,
    node: &str,
    strategy: GrowStrategy,
    vhost_pattern: &str,
    queue_pattern: &str,
) -> CtlResult<()> {
    let strategy = strategy.as_str();
    context
        .output
        .banner(&format!("Growing {strategy} quorum queues on {node}..."));
    let body = json!({
        "vhost_pattern": vhost_pattern,
        "queue_pattern": queue_pattern,
        "strategy": strategy,
    });
    let path = api_path(&["queues", "quorum", "replicas", "on", node, "grow"]);
    change(context, "POST", &path, Some(body), &Subject::Node)
}

pub fn shrink(context: &Context, node: &str) -> CtlResult<()> {
    context
        .output
        .banner(&format!("Shrinking quorum queues on {node}..."));
    let path = api_path(&["queues", "quorum", "replicas", "on", node, "shrink"]);
    change(context, "DELETE", &path, None, &Subject::Node)
}
