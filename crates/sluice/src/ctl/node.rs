//! Commands about the node as a whole: `status`, `cluster_status`, `ping`,
//! `await_startup` and `check_if_node_is_quorum_critical`.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::client::{api_path, Subject};
use super::error::{CtlError, CtlResult};
use super::output::Field;
use super::Context;

/// How long `await_startup` waits without `--timeout`: rabbitmqctl's
/// default for it.
pub const AWAIT_STARTUP_SECONDS_DEFAULT: u64 = 300;

/// Pause between two attempts of `await_startup`: short against a node's
/// start-up of a second or more, long enough not to spin.
const AWAIT_STARTUP_RETRY_INTERVAL: Duration = Duration::from_millis(250);

pub fn status(context: &Context) -> CtlResult<()> {
    let overview = context.client.get("/api/overview", &Subject::Node)?;
    let name = overview["node"].as_str().unwrap_or_default().to_owned();
    let node = context
        .client
        .get(&api_path(&["nodes", &name]), &Subject::Node)?;
    context.output.banner(&format!("Status of node {name} ..."));
    let alarms = alarms_of(&node, false);
    let listeners: Vec<Value> = overview["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|listener| {
            Value::from(format!(
                "{} {}:{}",
                listener["protocol"].as_str().unwrap_or("?"),
                listener["ip_address"].as_str().unwrap_or("?"),
                listener["port"]
            ))
        })
        .collect();
    let uptime_seconds = node["uptime"].as_u64().map(|ms| ms / 1000);
    let totals = &overview["object_totals"];
    context.output.fields(&[
        Field::new("node", "Node", Value::from(name)),
        Field::new("product_name", "Product", overview["product_name"].clone()),
        Field::new(
            "product_version",
            "Version",
            overview["product_version"].clone(),
        ),
        Field::new(
            "rabbitmq_version",
            "RabbitMQ version followed",
            overview["rabbitmq_version"].clone(),
        ),
        Field::new(
            "cluster_name",
            "Cluster name",
            overview["cluster_name"].clone(),
        ),
        Field::new("os_pid", "OS PID", node["os_pid"].clone()),
        Field::new("uptime_seconds", "Uptime (seconds)", uptime_seconds.into()),
        Field::new("processors", "Processors", node["processors"].clone()),
        Field::new("data_directory", "Data directory", node["db_dir"].clone()),
        Field::new(
            "memory_used",
            "Memory used (bytes)",
            node["mem_used"].clone(),
        ),
        Field::new(
            "memory_limit",
            "Memory high watermark (bytes)",
            node["mem_limit"].clone(),
        ),
        Field::new(
            "disk_free",
            "Free disk space (bytes)",
            node["disk_free"].clone(),
        ),
        Field::new(
            "disk_free_limit",
            "Free disk space low watermark (bytes)",
            node["disk_free_limit"].clone(),
        ),
        Field::new("alarms", "Alarms", alarms.into()),
        Field::new("fd_used", "File descriptors used", node["fd_used"].clone()),
        Field::new(
            "fd_total",
            "File descriptor limit",
            node["fd_total"].clone(),
        ),
        Field::new("sockets_used", "Sockets used", node["sockets_used"].clone()),
        Field::new(
            "sockets_total",
            "Socket limit",
            node["sockets_total"].clone(),
        ),
        Field::new("listeners", "Listeners", listeners.into()),
        Field::new("connections", "Connections", totals["connections"].clone()),
        Field::new("channels", "Channels", totals["channels"].clone()),
        Field::new("queues", "Queues", totals["queues"].clone()),
        Field::new("consumers", "Consumers", totals["consumers"].clone()),
    ]);
    Ok(())
}

/// The alarms a node reports, "memory" and "disk", each followed by the
/// node's name when `named`.
fn alarms_of(node: &Value, named: bool) -> Vec<Value> {
    [("mem_alarm", "memory"), ("disk_free_alarm", "disk")]
        .into_iter()
        .filter(|(key, _)| node[*key] == true)
        .map(|(_, resource)| match (named, node["name"].as_str()) {
            (true, Some(name)) => Value::from(format!("{resource} on {name}")),
            _ => Value::from(resource),
        })
        .collect()
}

pub fn cluster_status(context: &Context) -> CtlResult<()> {
    let overview = context.client.get("/api/overview", &Subject::Node)?;
    let nodes = context.client.get("/api/nodes", &Subject::Node)?;
    let nodes = nodes.as_array().cloned().unwrap_or_default();
    context.output.banner(&format!(
        "Cluster status of node {} ...",
        overview["node"].as_str().unwrap_or_default()
    ));
    let names = |running_only: bool| -> Vec<Value> {
        nodes
            .iter()
            .filter(|node| !running_only || node["running"] == true)
            .map(|node| node["name"].clone())
            .collect()
    };
    let alarms: Vec<Value> = nodes
        .iter()
        .flat_map(|node| alarms_of(node, true))
        .collect();
    context.output.fields(&[
        Field::new(
            "cluster_name",
            "Cluster name",
            overview["cluster_name"].clone(),
        ),
        Field::new("disk_nodes", "Disk nodes", names(false).into()),
        Field::new("running_nodes", "Running nodes", names(true).into()),
        Field::new("alarms", "Alarms", alarms.into()),
    ]);
    Ok(())
}

pub fn ping(context: &Context) -> CtlResult<()> {
    context.output.banner(&format!(
        "Will ping the node at {} ...",
        context.client.base_url()
    ));
    context.client.get("/api/overview", &Subject::Node)?;
    context.output.message("Ping succeeded");
    Ok(())
}

/// Asks until the API answers or `timeout_seconds` pass; a refusal (bad
/// credentials) ends the wait at once, as waiting would not change it.
pub fn await_startup(context: &Context, timeout_seconds: u64) -> CtlResult<()> {
    context.output.banner(&format!(
        "Waiting for the node at {} to start ...",
        context.client.base_url()
    ));
    let deadline = Instant::now() + Duration::from_secs(timeout_seconds);
    loop {
        match context.client.get("/api/overview", &Subject::Node) {
            Ok(_) => return Ok(()),
            Err(CtlError::Unreachable { .. } | CtlError::TimedOut { .. })
                if Instant::now() + AWAIT_STARTUP_RETRY_INTERVAL < deadline =>
            {
                std::thread::sleep(AWAIT_STARTUP_RETRY_INTERVAL);
            }
            Err(CtlError::Unreachable { url, reason }) => {
                return Err(CtlError::TimedOut {
                    url: format!("{url} ({reason})"),
                    seconds: timeout_seconds,
                })
            }
            Err(error) => return Err(error),
        }
    }
}

pub fn check_if_node_is_quorum_critical(context: &Context) -> CtlResult<()> {
    context.output.banner(&format!(
        "Checking if the node at {} is critical for quorum of any quorum queues ...",
        context.client.base_url()
    ));
    let path = "/api/health/checks/node-is-quorum-critical";
    let answer = context.client.send("GET", path, None, None)?;
    match answer.status {
        200 => {
            context
                .output
                .message("Node reported no quorum critical queues");
            Ok(())
        }
        503 => {
            let body = answer.json()?;
            let queues: Vec<&str> = body["queues"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|queue| queue["readable_name"].as_str())
                .collect();
            let reason = body["reason"].as_str().unwrap_or("the check failed");
            Err(CtlError::CheckFailed(if queues.is_empty() {
                reason.to_owned()
            } else {
                format!("{reason}: {}", queues.join(", "))
            }))
        }
        _ => Err(context.client.refusal(&answer, &Subject::Node)),
    }
}
