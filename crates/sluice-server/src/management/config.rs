//! The management API's keys, RabbitMQ's: `management.tcp.port` (15672)
//! and `management.tcp.ip`.

use crate::http_listener::HttpListenerConfig;

/// Keys handled here, for the parser's typo suggestions.
pub const MANAGEMENT_KEYS: &[&str] = &["management.tcp.port", "management.tcp.ip"];

/// RabbitMQ's port for `rabbitmq_management`.
pub const MANAGEMENT_PORT_DEFAULT: u16 = 15672;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagementConfig {
    pub listener: HttpListenerConfig,
}

impl Default for ManagementConfig {
    fn default() -> Self {
        ManagementConfig {
            listener: HttpListenerConfig::with_default_port(MANAGEMENT_PORT_DEFAULT),
        }
    }
}

/// Applies one key; None for a key that is not one of these.
pub fn apply(config: &mut ManagementConfig, key: &str, value: &str) -> Option<Result<(), String>> {
    let in_prefix = key.strip_prefix("management.")?;
    config.listener.apply(in_prefix, value)
}
