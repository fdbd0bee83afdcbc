//! What each key of the configuration file sets, grouped by what it is
//! about. Each group returns None for a key that is not its own, else the
//! outcome: the reason (for the error text) when the value is unusable.

use std::path::PathBuf;

use sluice_core::queue_location::QueueLocator;

use super::units::{
    parse_bytesize, parse_credit, parse_information_unit, parse_listener, INFORMATION_UNIT_EXAMPLES,
};
use super::{
    Config, CREDIT_FLOW_CREDIT_MAX, FRAME_MAX_MAX, FRAME_MAX_MIN, LOG_LEVELS, MESSAGE_SIZE_MAX,
};
use crate::{cluster_config, management, prometheus, store_config, tcp_listen_options, tls};

/// A key's outcome.
pub(super) type Applied = Option<Result<(), String>>;

/// `loopback_users` and `default_user_tags` lines, collected over the
/// whole file and applied at the end, because RabbitMQ's result does not
/// depend on their order.
#[derive(Default)]
pub(super) struct ListLines {
    pub loopback_none: bool,
    pub loopback_users: Option<Vec<String>>,
    pub user_tags: Option<Vec<String>>,
}

impl ListLines {
    pub(super) fn apply_to(self, config: &mut Config) {
        if self.loopback_none {
            config.loopback_users.clear();
        } else if let Some(users) = self.loopback_users {
            config.loopback_users = users;
        }
        if let Some(tags) = self.user_tags {
            config.default_user_tags = tags;
        }
    }
}

/// Applies `key = value` to `config`; None for a key no group knows.
pub(super) fn apply_key(
    config: &mut Config,
    key: &str,
    value: &str,
    lists: &mut ListLines,
) -> Applied {
    node_key(config, key, value)
        .or_else(|| connection_key(config, key, value))
        .or_else(|| resource_key(config, key, value))
        .or_else(|| list_key(lists, key, value))
        .or_else(|| prefixed_key(config, key, value))
}

/// Who the node is and where it keeps things.
fn node_key(config: &mut Config, key: &str, value: &str) -> Applied {
    match key {
        "data_dir" => config.data_dir = PathBuf::from(value),
        "default_user" => config.default_user = value.to_owned(),
        "default_pass" => config.default_pass = value.to_owned(),
        "default_vhost" => config.default_vhost = value.to_owned(),
        "default_permissions.configure" => config.default_permissions.configure = value.to_owned(),
        "default_permissions.write" => config.default_permissions.write = value.to_owned(),
        "default_permissions.read" => config.default_permissions.read = value.to_owned(),
        "load_definitions" => config.load_definitions = Some(PathBuf::from(value)),
        "log.console.level" | "log.file.level" => {
            if !LOG_LEVELS.contains(&value) {
                return Some(Err(format!("expected one of {}", LOG_LEVELS.join(", "))));
            }
            if key == "log.file.level" {
                config.log_file_level = value.to_owned();
            } else {
                config.log_level = value.to_owned();
            }
        }
        "log.console" => match value {
            "true" => config.log_console = true,
            "false" => config.log_console = false,
            _ => return Some(Err("expected `true` or `false`".to_owned())),
        },
        // RabbitMQ's file name is relative to its log directory; Sluice has
        // none, so a relative name is relative to the working directory.
        "log.file" => match value {
            "false" => config.log_file = None,
            path => config.log_file = Some(PathBuf::from(path)),
        },
        _ => return None,
    }
    Some(Ok(()))
}

/// The AMQP listener and what a connection negotiates.
fn connection_key(config: &mut Config, key: &str, value: &str) -> Applied {
    let result = match key {
        "listeners.tcp.default" => parse_listener(value)
            .map(|listen| config.listen = listen)
            .ok_or_else(|| {
                "expected a port (5672) or an IP address and port (127.0.0.1:5672, :::5672)"
                    .to_owned()
            }),
        "heartbeat" => value
            .parse()
            .map(|seconds| config.heartbeat_secs = seconds)
            .map_err(|_| "expected a number of seconds from 0 (disabled) to 65535".to_owned()),
        "frame_max" => parse_bytesize(value)
            .and_then(|bytes| u32::try_from(bytes).ok())
            .filter(|bytes| (FRAME_MAX_MIN..=FRAME_MAX_MAX).contains(bytes))
            .map(|bytes| config.frame_max = bytes)
            .ok_or_else(|| {
                format!(
                    "expected a number of bytes from {FRAME_MAX_MIN} to {FRAME_MAX_MAX} (KB, MB, GB suffixes allowed)"
                )
            }),
        "channel_max" => value
            .parse::<u16>()
            .map(|channels| config.channel_max = if channels == 0 { u16::MAX } else { channels })
            .map_err(|_| "expected a number of channels from 0 (no limit) to 65535".to_owned()),
        "max_message_size" => value
            .parse()
            .ok()
            .filter(|bytes| (1..=MESSAGE_SIZE_MAX).contains(bytes))
            .map(|bytes| config.max_message_size = bytes)
            .ok_or_else(|| format!("expected a number of bytes from 1 to {MESSAGE_SIZE_MAX}")),
        "credit_flow_default_credit" => parse_credit(value)
            .map(|credit| config.credit_flow_default_credit = credit)
            .ok_or_else(|| {
                format!(
                    "expected an initial credit from 1 to {CREDIT_FLOW_CREDIT_MAX}, as `400` or `{{400, 200}}`"
                )
            }),
        "quorum_commands_soft_limit" => value
            .parse::<u32>()
            .ok()
            .filter(|limit| *limit >= 1)
            .map(|limit| config.quorum_commands_soft_limit = limit)
            .ok_or_else(|| "expected a number of messages from 1".to_owned()),
        "handshake_timeout" => value
            .parse()
            .ok()
            .filter(|ms| *ms > 0)
            .map(|ms| config.handshake_timeout_ms = ms)
            .ok_or_else(|| "expected a positive number of milliseconds".to_owned()),
        "consumer_timeout" => match value {
            "false" | "infinity" => {
                config.consumer_timeout_ms = None;
                Ok(())
            }
            number => number
                .parse()
                .ok()
                .filter(|ms| *ms > 0)
                .map(|ms| config.consumer_timeout_ms = Some(ms))
                .ok_or_else(|| "expected a positive number of milliseconds or `false`".to_owned()),
        },
        "queue_leader_locator" => QueueLocator::parse(value)
            .map(|locator| config.queue_leader_locator = locator)
            .ok_or_else(|| "expected `client-local` or `balanced`".to_owned()),
        "connection_max" => match value {
            "infinity" => {
                config.connection_max = None;
                Ok(())
            }
            number => number
                .parse()
                .ok()
                .map(|count| config.connection_max = Some(count))
                .ok_or_else(|| "expected a number of connections or `infinity`".to_owned()),
        },
        _ => return None,
    };
    Some(result)
}

/// Memory, disk and buffer limits.
fn resource_key(config: &mut Config, key: &str, value: &str) -> Applied {
    let bytes = |what: &str| {
        format!(
            "expected a{what} number of bytes with an optional unit: {INFORMATION_UNIT_EXAMPLES}"
        )
    };
    let result = match key {
        "vm_memory_high_watermark.relative" => value
            .parse::<f64>()
            .ok()
            .filter(|fraction| (0.0..=1.0).contains(fraction))
            .map(|fraction| config.vm_memory_high_watermark_relative = Some(fraction))
            .ok_or_else(|| {
                "expected a fraction of the memory available from 0.0 to 1.0, e.g. 0.6".to_owned()
            }),
        "vm_memory_high_watermark.absolute" => parse_information_unit(value)
            .map(|limit| config.vm_memory_high_watermark_absolute_bytes = Some(limit))
            .ok_or_else(|| bytes("")),
        "disk_free_limit.absolute" => parse_information_unit(value)
            .map(|limit| config.disk_free_limit_absolute_bytes = Some(limit))
            .ok_or_else(|| bytes("")),
        "disk_free_limit.relative" => value
            .parse::<f64>()
            .ok()
            .filter(|multiple| multiple.is_finite() && *multiple >= 0.0)
            .map(|multiple| config.disk_free_limit_relative = Some(multiple))
            .ok_or_else(|| {
                "expected a non-negative multiple of the memory available, e.g. 1.5".to_owned()
            }),
        "delivery_buffer_total_max" => parse_information_unit(value)
            .filter(|limit| *limit > 0)
            .map(|limit| config.delivery_buffer_total_max = limit)
            .ok_or_else(|| bytes(" positive")),
        _ => return None,
    };
    Some(result)
}

/// `loopback_users = none` and `loopback_users.<user> = true|false`: as in
/// RabbitMQ, any `loopback_users.<user>` line replaces the whole list with
/// the users set to `true`, and `none` empties it wherever it appears.
/// `default_user_tags.<tag> = true|false` likewise replaces the default
/// user's tags (`administrator`).
fn list_key(lists: &mut ListLines, key: &str, value: &str) -> Applied {
    if key == "loopback_users" {
        if value != "none" {
            return Some(Err(
                "expected 'none' (or use 'loopback_users.<user> = true')".to_owned(),
            ));
        }
        lists.loopback_none = true;
        return Some(Ok(()));
    }
    let (list, item) = if let Some(user) = key.strip_prefix("loopback_users.") {
        (&mut lists.loopback_users, user)
    } else if let Some(tag) = key.strip_prefix("default_user_tags.") {
        (&mut lists.user_tags, tag)
    } else {
        return None;
    };
    let enabled = match value {
        "true" => true,
        "false" => false,
        _ => return Some(Err("expected 'true' or 'false'".to_owned())),
    };
    let items = list.get_or_insert_with(Vec::new);
    items.retain(|existing| existing != item);
    if enabled {
        items.push(item.to_owned());
    }
    Some(Ok(()))
}

/// The key families other modules own: `store.*`, `tcp_listen_options.*`,
/// TLS's, and the cluster's.
fn prefixed_key(config: &mut Config, key: &str, value: &str) -> Applied {
    if key.starts_with("store.") {
        store_config::apply(&mut config.store, key, value, parse_information_unit)
    } else if key.starts_with("tcp_listen_options.") {
        tcp_listen_options::apply(
            &mut config.tcp_listen_options,
            key,
            value,
            parse_information_unit,
        )
    } else if key.starts_with("management.") {
        management::config::apply(&mut config.management, key, value)
    } else if key.starts_with("prometheus.") {
        prometheus::config::apply(&mut config.prometheus, key, value)
    } else if key.starts_with("ssl_") || key.starts_with("listeners.ssl") {
        tls::config::apply(&mut config.tls, key, value, parse_listener)
    } else {
        cluster_config::apply(&mut config.cluster, key, value)
    }
}
