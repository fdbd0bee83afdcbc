//! The settings connections use, taken from the configuration once.

use std::time::Duration;

use crate::config::Config;

#[derive(Clone, Debug)]
pub struct ServerSettings {
    pub frame_max: u32,
    pub channel_max: u16,
    pub heartbeat_secs: u16,
    pub max_message_size: u32,
    pub publish_credit: u32,
    pub handshake_timeout: Duration,
    pub cluster_name: String,
    /// Disable Nagle's algorithm on each accepted connection (`tcp_listen_options.nodelay`).
    pub nodelay: bool,
}

impl ServerSettings {
    pub fn from_config(config: &Config) -> Self {
        ServerSettings {
            frame_max: config.frame_max,
            channel_max: config.channel_max,
            heartbeat_secs: config.heartbeat_secs,
            max_message_size: config.max_message_size,
            publish_credit: config.credit_flow_default_credit,
            handshake_timeout: Duration::from_millis(config.handshake_timeout_ms),
            cluster_name: format!("sluice@{}", hostname()),
            nodelay: config.tcp_listen_options.nodelay,
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "localhost".to_owned())
}
