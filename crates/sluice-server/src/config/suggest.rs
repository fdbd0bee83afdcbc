//! "Did you mean": the known key nearest to a misspelt one.

use crate::cluster_config::CLUSTER_KEYS;
use crate::management::config::MANAGEMENT_KEYS;
use crate::prometheus::config::PROMETHEUS_KEYS;
use crate::store_config::STORE_KEYS;
use crate::tcp_listen_options::TCP_LISTEN_KEYS;
use crate::tls::config::TLS_KEYS;

/// Every key [`Config::parse`] accepts, for typo suggestions. `loopback_users.<user>` is
/// listed with the user `guest`, the one people usually write.
pub(super) const KNOWN_KEYS: &[&str] = &[
    "listeners.tcp.default",
    "data_dir",
    "default_user",
    "default_pass",
    "default_vhost",
    "default_user_tags.administrator",
    "default_permissions.configure",
    "default_permissions.write",
    "default_permissions.read",
    "loopback_users",
    "loopback_users.guest",
    "heartbeat",
    "frame_max",
    "channel_max",
    "max_message_size",
    "credit_flow_default_credit",
    "quorum_commands_soft_limit",
    "delivery_buffer_total_max",
    "handshake_timeout",
    "connection_max",
    "queue_leader_locator",
    "consumer_timeout",
    "log.console.level",
    "log.console",
    "log.file",
    "log.file.level",
    "vm_memory_high_watermark.relative",
    "vm_memory_high_watermark.absolute",
    "disk_free_limit.absolute",
    "load_definitions",
    "disk_free_limit.relative",
];

/// The known key nearest to `key`, if it is within a typo's distance.
pub(super) fn closest_key(key: &str) -> Option<&'static str> {
    /// More edits than this and the suggestion is more likely noise than help.
    const TYPO_DISTANCE_MAX: usize = 3;
    KNOWN_KEYS
        .iter()
        .chain(STORE_KEYS)
        .chain(TCP_LISTEN_KEYS)
        .chain(CLUSTER_KEYS)
        .chain(TLS_KEYS)
        .chain(PROMETHEUS_KEYS)
        .chain(MANAGEMENT_KEYS)
        .map(|known| (edit_distance(key, known), *known))
        .filter(|(distance, _)| *distance <= TYPO_DISTANCE_MAX)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, known)| known)
}

/// Levenshtein distance: the number of single-character edits between two
/// keys.
fn edit_distance(a: &str, b: &str) -> usize {
    strsim::levenshtein(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_basics() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("heartbeat", "heartbeat"), 0);
        assert_eq!(edit_distance("hartbeat", "heartbeat"), 1);
        assert_eq!(closest_key("zzzzzzzz"), None);
    }
}
