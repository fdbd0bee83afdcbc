//! Broker configuration: defaults, and the `rabbitmq.conf`-style file that overrides them.
//!
//! The file format is RabbitMQ's "new style" (sysctl-like) format: one `key = value` per line,
//! `#` starts a comment, blank lines are ignored. Key names are RabbitMQ's wherever the concept
//! is the same, so an existing `rabbitmq.conf` carries over; Sluice adds `data_dir`. A key
//! Sluice does not know, or a value it cannot use, is an error that names the line: a broker
//! that silently ignores a typo in `listeners.tcp.default` is worse than one that refuses to
//! start.
//!
//! Defaults are RabbitMQ's, so that `sluice server` with no file behaves like a fresh
//! RabbitMQ node.

mod keys;
mod suggest;
mod units;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use crate::cluster_config::ClusterConfig;
use crate::management::config::ManagementConfig;
use crate::prometheus::config::PrometheusConfig;
use crate::resource_limit::{DiskFreeLimit, MemoryWatermark};
use crate::store_config::StoreConfig;
use crate::tcp_listen_options::TcpListenOptions;
use crate::tls::TlsConfig;
use keys::{apply_key, ListLines};
use suggest::closest_key;

pub mod ignored_keys;
pub use units::parse_listener;
use units::strip_comment;

/// AMQP 0-9-1 `FRAME-MIN-SIZE`: the smallest `frame_max` a peer may negotiate. RabbitMQ uses
/// the same floor.
pub const FRAME_MAX_MIN: u32 = 4096;

/// The largest `frame_max` accepted. The wire field is 32 bits, but Java clients read it as a
/// signed `int`, so anything above `i32::MAX` breaks them.
pub const FRAME_MAX_MAX: u32 = i32::MAX as u32;

/// RabbitMQ's hard cap on `max_message_size` (512 MiB); larger values are rejected there too.
pub const MESSAGE_SIZE_MAX: u32 = 512 * 1024 * 1024;

/// RabbitMQ's default `consumer_timeout`: 30 minutes.
pub const CONSUMER_TIMEOUT_DEFAULT_MS: u64 = 30 * 60 * 1000;

/// The broker's settings. [`Config::default`] gives RabbitMQ's defaults; [`Config::parse`] and
/// [`Config::from_file`] layer a `rabbitmq.conf`-style file on top.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Address of the AMQP listener (`listeners.tcp.default`). Default `0.0.0.0:5672`.
    pub listen: SocketAddr,
    /// Directory for queue segments and definitions (`data_dir`, a Sluice key).
    /// Default `./sluice-data`.
    pub data_dir: PathBuf,
    /// User created on first start (`default_user`). Default `guest`.
    pub default_user: String,
    /// Password of [`Config::default_user`] (`default_pass`). Default `guest`.
    pub default_pass: String,
    /// Virtual host created on first start (`default_vhost`). Default `/`.
    pub default_vhost: String,
    /// Tags of the default user (`default_user_tags.<tag> = true`). Default
    /// `["administrator"]`.
    pub default_user_tags: Vec<String>,
    /// The default user's permissions on the default vhost
    /// (`default_permissions.configure|write|read`). Default `.*` each.
    pub default_permissions: DefaultPermissions,
    /// Users that may only connect from a loopback address (`loopback_users.<user> = true`,
    /// or `loopback_users = none` for nobody). Default `["guest"]`.
    pub loopback_users: Vec<String>,
    /// Heartbeat timeout proposed in `connection.tune`, in seconds; 0 disables heartbeats
    /// (`heartbeat`). Default 60.
    pub heartbeat_secs: u16,
    /// Largest frame proposed in `connection.tune`, in bytes (`frame_max`). Default 131072.
    pub frame_max: u32,
    /// Highest channel number proposed in `connection.tune` (`channel_max`). Default 2047.
    /// RabbitMQ's `0` ("no limit") is stored as 65535, the protocol's own ceiling.
    pub channel_max: u16,
    /// Largest message body accepted, in bytes (`max_message_size`). Default 128 MiB,
    /// at most 512 MiB.
    pub max_message_size: u32,
    /// Publishes a connection's reader routes between two looks at its
    /// queues' congestion and the alarms, and before it lets other
    /// connections run (`credit_flow_default_credit`, RabbitMQ's initial
    /// credit: `400` or `{400, 200}`). Default 400, as in RabbitMQ.
    pub credit_flow_default_credit: u32,
    /// A channel's messages not yet applied by one quorum queue past which
    /// its connection stops reading until they are fewer
    /// (`quorum_commands_soft_limit`, RabbitMQ's key). Default 128 (RabbitMQ:
    /// 32; see [`crate::channel::QUORUM_COMMANDS_SOFT_LIMIT_DEFAULT`]).
    pub quorum_commands_soft_limit: u32,
    /// Bytes of deliveries all connections together may hold encoded and not
    /// yet written to their sockets (`delivery_buffer_total_max`). Past it,
    /// each connection takes deliveries only up to a 64 KiB floor, so slow
    /// consumers by the thousand cannot hold a megabyte each. Default 64 MiB.
    pub delivery_buffer_total_max: u64,
    /// Time allowed from TCP accept to `connection.open`, in milliseconds
    /// (`handshake_timeout`). Default 10000.
    pub handshake_timeout_ms: u64,
    /// `consumer_timeout`: a delivery left unacknowledged this long closes
    /// its channel, as in RabbitMQ; None never.
    pub consumer_timeout_ms: Option<u64>,
    /// Connections the node accepts at once (`connection_max`); more are
    /// closed as they come, with a log line. None is RabbitMQ's `infinity`,
    /// the default: then the file descriptors the process may open set the
    /// bound.
    pub connection_max: Option<usize>,
    /// Where new classic queues live unless declared with
    /// `x-queue-leader-locator` (`queue_leader_locator`).
    pub queue_leader_locator: sluice_core::queue_location::QueueLocator,
    /// Log level (`log.console.level`): one of RabbitMQ's levels `debug`, `info`, `notice`,
    /// `warning`, `error`, `critical`, `alert`, `emergency`, `none`. Default `info`.
    pub log_level: String,
    /// `log.console`: whether to log to standard error. Default true.
    pub log_console: bool,
    /// `log.file`: a file to log to as well (appended to); None (`false`,
    /// the default) for none.
    pub log_file: Option<PathBuf>,
    /// `log.file.level`, as `log.console.level`.
    pub log_file_level: String,
    /// Keys RabbitMQ documents that do not apply to Sluice, with why: each
    /// is logged once as a warning (see [`ignored_keys`]).
    pub ignored: Vec<(String, &'static str)>,
    /// Memory alarm threshold as a fraction of the memory available
    /// (`vm_memory_high_watermark.relative`), from 0.0 to 1.0. `None` (the default) means
    /// [`VM_MEMORY_HIGH_WATERMARK_RELATIVE_DEFAULT`](crate::resource_limit::VM_MEMORY_HIGH_WATERMARK_RELATIVE_DEFAULT) (0.6) unless an absolute watermark is set;
    /// see [`Config::vm_memory_high_watermark`].
    pub vm_memory_high_watermark_relative: Option<f64>,
    /// Memory alarm threshold in bytes (`vm_memory_high_watermark.absolute`, e.g.
    /// `1073741824`, `1024MiB`, `2GB`). Takes precedence over the relative form when both
    /// are set, as in RabbitMQ. Default `None`.
    pub vm_memory_high_watermark_absolute_bytes: Option<u64>,
    /// Disk alarm threshold: free bytes below which publishers are blocked
    /// (`disk_free_limit.absolute`, e.g. `50000000`, `50MB`, `2GiB`). Takes precedence over
    /// the relative form when both are set, as in RabbitMQ. `None` (the default) means
    /// [`DISK_FREE_LIMIT_DEFAULT_BYTES`](crate::resource_limit::DISK_FREE_LIMIT_DEFAULT_BYTES) (50 MB) unless a relative limit is set; see
    /// [`Config::disk_free_limit`].
    pub disk_free_limit_absolute_bytes: Option<u64>,
    /// Disk alarm threshold as a multiple of the memory available
    /// (`disk_free_limit.relative`, e.g. `1.5`). Default `None`.
    pub disk_free_limit_relative: Option<f64>,
    /// How queues keep messages on disk (`store.*`).
    pub store: StoreConfig,
    /// Socket options of the AMQP listener (`tcp_listen_options.*`).
    pub tcp_listen_options: TcpListenOptions,
    /// The amqps listener and its certificates (`listeners.ssl.default`,
    /// `ssl_options.*`, `ssl_cert_login_from`). Default: none.
    pub tls: TlsConfig,
    /// A definitions file in RabbitMQ's JSON format, read at start
    /// (`load_definitions`): its policies, parameters, exchanges, queues and
    /// bindings are declared. Default none.
    pub load_definitions: Option<PathBuf>,
    /// This node's name and its cluster (`node_name`,
    /// `cluster_formation.*`, `cluster_link.*`). Default: a cluster of one.
    pub cluster: ClusterConfig,
    /// The Prometheus endpoint (`prometheus.*`). Default: port 15692 on
    /// every address.
    pub prometheus: PrometheusConfig,
    /// The management HTTP API (`management.*`). Default: port 15672 on
    /// every address.
    pub management: ManagementConfig,
}

/// Default `delivery_buffer_total_max`: 64 connections' worth of full
/// delivery buffers.
pub const DELIVERY_BUFFER_TOTAL_MAX_DEFAULT: u64 = 64 * 1024 * 1024;

/// RabbitMQ's default initial credit, `{400, 200}`.
pub const CREDIT_FLOW_DEFAULT_CREDIT: u32 = 400;

/// Beyond this, a reader would route for many milliseconds between looks at
/// its queues, and congestion would no longer bound what it sends them.
const CREDIT_FLOW_CREDIT_MAX: u32 = 100_000;

/// RabbitMQ's default `max_message_size`: 128 MiB.
pub const MAX_MESSAGE_SIZE_DEFAULT: u32 = 134_217_728;

/// `default_permissions.*`: regular expressions, as in `set_permissions`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefaultPermissions {
    pub configure: String,
    pub write: String,
    pub read: String,
}

impl Default for DefaultPermissions {
    fn default() -> Self {
        Self {
            configure: ".*".to_owned(),
            write: ".*".to_owned(),
            read: ".*".to_owned(),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 5672),
            data_dir: PathBuf::from("./sluice-data"),
            default_user: "guest".to_owned(),
            default_pass: "guest".to_owned(),
            default_vhost: "/".to_owned(),
            default_user_tags: vec!["administrator".to_owned()],
            default_permissions: DefaultPermissions::default(),
            loopback_users: vec!["guest".to_owned()],
            heartbeat_secs: 60,
            frame_max: 131_072,
            channel_max: 2047,
            max_message_size: MAX_MESSAGE_SIZE_DEFAULT,
            credit_flow_default_credit: CREDIT_FLOW_DEFAULT_CREDIT,
            quorum_commands_soft_limit: crate::channel::QUORUM_COMMANDS_SOFT_LIMIT_DEFAULT,
            delivery_buffer_total_max: DELIVERY_BUFFER_TOTAL_MAX_DEFAULT,
            handshake_timeout_ms: 10_000,
            consumer_timeout_ms: Some(CONSUMER_TIMEOUT_DEFAULT_MS),
            connection_max: None,
            queue_leader_locator: sluice_core::queue_location::QueueLocator::ClientLocal,
            log_level: "info".to_owned(),
            log_console: true,
            log_file: None,
            log_file_level: "info".to_owned(),
            ignored: Vec::new(),
            vm_memory_high_watermark_relative: None,
            vm_memory_high_watermark_absolute_bytes: None,
            disk_free_limit_absolute_bytes: None,
            disk_free_limit_relative: None,
            store: StoreConfig::default(),
            tcp_listen_options: TcpListenOptions::default(),
            tls: TlsConfig::default(),
            load_definitions: None,
            cluster: ClusterConfig::default(),
            prometheus: PrometheusConfig::default(),
            management: ManagementConfig::default(),
        }
    }
}

/// Why a configuration could not be loaded. Parse errors carry the 1-based line number.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A line is neither blank, a comment, nor `key = value`.
    #[error("line {line}: expected 'key = value', found '{text}'")]
    Syntax { line: usize, text: String },
    /// The key is not one Sluice understands.
    #[error("line {line}: unknown key '{key}'{}", suggestion_text(suggestion))]
    UnknownKey {
        line: usize,
        key: String,
        /// The closest known key, when one is close enough to be a likely typo.
        suggestion: Option<&'static str>,
    },
    /// The key is known but the value cannot be used.
    #[error("line {line}: invalid value '{value}' for '{key}': {expected}")]
    InvalidValue {
        line: usize,
        key: String,
        value: String,
        expected: String,
    },
}

fn suggestion_text(suggestion: &Option<&'static str>) -> String {
    match suggestion {
        Some(key) => format!(" (did you mean '{key}'?)"),
        None => String::new(),
    }
}

/// RabbitMQ's log levels, accepted by `log.console.level`.
const LOG_LEVELS: &[&str] = &[
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
    "none",
];

impl Config {
    /// Reads `path` and applies it on top of [`Config::default`].
    ///
    /// # Errors
    /// [`ConfigError::Read`] if the file cannot be read; otherwise as [`Config::parse`].
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, Self::default())
    }

    /// Applies the `rabbitmq.conf`-style `text` on top of `base`. When a key appears twice,
    /// the later line wins.
    ///
    /// As in RabbitMQ, any `loopback_users.<user>` line replaces the whole list with the users
    /// set to `true`, and `loopback_users = none` empties it wherever it appears.
    ///
    /// # Errors
    /// The first line that is malformed ([`ConfigError::Syntax`]), names an unknown key
    /// ([`ConfigError::UnknownKey`]) or holds an unusable value
    /// ([`ConfigError::InvalidValue`]).
    pub fn parse(text: &str, base: Self) -> Result<Self, ConfigError> {
        let mut config = base;
        let mut lists = ListLines::default();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let content = strip_comment(raw).trim();
            if content.is_empty() {
                continue;
            }
            let syntax = || ConfigError::Syntax {
                line,
                text: content.to_owned(),
            };
            let (key, value) = content.split_once('=').ok_or_else(syntax)?;
            let (key, value) = (key.trim(), value.trim());
            if key.is_empty() || value.is_empty() {
                return Err(syntax());
            }
            match apply_key(&mut config, key, value, &mut lists) {
                Some(Ok(())) => {}
                Some(Err(expected)) => {
                    return Err(ConfigError::InvalidValue {
                        line,
                        key: key.to_owned(),
                        value: value.to_owned(),
                        expected,
                    })
                }
                None if key.starts_with("listeners.tcp.") => {
                    return Err(invalid_listener_name(line, key, "listeners.tcp.default"))
                }
                None if key.starts_with("listeners.ssl.") => {
                    return Err(invalid_listener_name(line, key, "listeners.ssl.default"))
                }
                None if ignored_keys::reason(key).is_some() => {
                    if !config.ignored.iter().any(|(known, _)| known == key) {
                        let reason = ignored_keys::reason(key).expect("checked");
                        config.ignored.push((key.to_owned(), reason));
                    }
                }
                None => {
                    return Err(ConfigError::UnknownKey {
                        line,
                        key: key.to_owned(),
                        suggestion: closest_key(key),
                    })
                }
            }
        }
        lists.apply_to(&mut config);
        Ok(config)
    }

    /// The memory alarm's threshold. As in RabbitMQ's schema, an absolute watermark takes
    /// precedence over a relative one; with neither, the default fraction applies.
    pub fn vm_memory_high_watermark(&self) -> MemoryWatermark {
        match (
            self.vm_memory_high_watermark_absolute_bytes,
            self.vm_memory_high_watermark_relative,
        ) {
            (Some(bytes), _) => MemoryWatermark::Absolute(bytes),
            (None, Some(fraction)) => MemoryWatermark::Relative(fraction),
            (None, None) => MemoryWatermark::default(),
        }
    }

    /// The disk alarm's threshold. As in RabbitMQ's schema, an absolute limit takes
    /// precedence over a relative one; with neither, the default 50 MB applies.
    pub fn disk_free_limit(&self) -> DiskFreeLimit {
        match (
            self.disk_free_limit_absolute_bytes,
            self.disk_free_limit_relative,
        ) {
            (Some(bytes), _) => DiskFreeLimit::Absolute(bytes),
            (None, Some(multiple)) => DiskFreeLimit::MemoryRelative(multiple),
            (None, None) => DiskFreeLimit::default(),
        }
    }

    /// Settings that are accepted but partly ignored, in RabbitMQ's words, for the log once
    /// logging is up (the file is read before that).
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.vm_memory_high_watermark_absolute_bytes.is_some()
            && self.vm_memory_high_watermark_relative.is_some()
        {
            warnings.push(
                "both vm_memory_high_watermark.absolute and vm_memory_high_watermark.relative are configured; vm_memory_high_watermark.absolute has precedence".to_owned(),
            );
        }
        if self.disk_free_limit_absolute_bytes.is_some() && self.disk_free_limit_relative.is_some()
        {
            warnings.push(
                "both disk_free_limit.absolute and disk_free_limit.relative are configured; disk_free_limit.absolute has precedence".to_owned(),
            );
        }
        warnings.extend(self.tls.warnings());
        for (key, reason) in &self.ignored {
            warnings.push(format!(
                "'{key}' is accepted but does nothing in Sluice: {reason}"
            ));
        }
        warnings
    }

    /// The `tracing` filter directive for [`Config::log_level`] (the console's).
    pub fn log_filter(&self) -> &'static str {
        log_filter_for(&self.log_level)
    }

    /// The `tracing` filter directive for [`Config::log_file_level`].
    pub fn log_file_filter(&self) -> &'static str {
        log_filter_for(&self.log_file_level)
    }
}

/// A `tracing` filter directive for one of RabbitMQ's eight levels, folded onto tracing's
/// five, and `none` to `off`.
fn log_filter_for(level: &str) -> &'static str {
    // openraft narrates every vote and timer at info: Sluice says what
    // an operator needs (links, leaders lost, changes failing) itself.
    match level {
        "debug" => "debug",
        "info" | "notice" => "info,openraft=warn",
        "warning" => "warn",
        "none" => "off",
        _ => "error",
    }
}

/// Sluice has one AMQP listener and one amqps listener; RabbitMQ allows several under any
/// name. Naming the one key that works is more helpful than "unknown key".
fn invalid_listener_name(line: usize, key: &str, suggestion: &'static str) -> ConfigError {
    ConfigError::UnknownKey {
        line,
        key: key.to_owned(),
        suggestion: Some(suggestion),
    }
}

#[cfg(test)]
mod tests;
