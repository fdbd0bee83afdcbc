//! The settings connections use, taken from the configuration once.

use std::time::Duration;

use crate::config::Config;
use crate::fd_limit;

#[derive(Clone, Debug)]
pub struct ServerSettings {
    pub frame_max: u32,
    pub channel_max: u16,
    pub heartbeat_secs: u16,
    pub max_message_size: u32,
    pub publish_credit: u32,
    pub quorum_commands_soft_limit: u32,
    pub handshake_timeout: Duration,
    pub cluster_name: String,
    /// Disable Nagle's algorithm on each accepted connection (`tcp_listen_options.nodelay`).
    pub nodelay: bool,
    /// Connections accepted at once: `connection_max`, held to what the
    /// file descriptors allow.
    pub connection_max: usize,
    /// `consumer_timeout`.
    pub consumer_timeout: Option<Duration>,
}

impl ServerSettings {
    pub fn from_config(config: &Config) -> Self {
        ServerSettings {
            frame_max: config.frame_max,
            channel_max: config.channel_max,
            heartbeat_secs: config.heartbeat_secs,
            max_message_size: config.max_message_size,
            publish_credit: config.credit_flow_default_credit,
            quorum_commands_soft_limit: config.quorum_commands_soft_limit,
            handshake_timeout: Duration::from_millis(config.handshake_timeout_ms),
            cluster_name: format!("sluice@{}", hostname()),
            nodelay: config.tcp_listen_options.nodelay,
            connection_max: connection_max(config),
            consumer_timeout: config.consumer_timeout_ms.map(Duration::from_millis),
        }
    }
}

/// `connection_max`, and no more than the file descriptors leave room for
/// (the soft limit raised to the hard one first).
fn connection_max(config: &Config) -> usize {
    let budget = match fd_limit::raise_open_files_limit() {
        Ok((limit, before)) => {
            let budget = fd_limit::connection_budget(limit);
            tracing::info!(
                limit,
                before,
                connections = budget,
                "file descriptors: the soft limit raised to the hard one"
            );
            budget
        }
        Err(error) => {
            tracing::warn!(%error, "cannot read the limit on open files; connections are bounded by connection_max only");
            usize::MAX
        }
    };
    match config.connection_max {
        Some(max) if max < budget => max,
        Some(max) => {
            if max > budget {
                tracing::warn!(connection_max = max, connections = budget, "connection_max is more than the file descriptors allow; holding connections to what they allow");
            }
            budget
        }
        None => budget,
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "localhost".to_owned())
}
