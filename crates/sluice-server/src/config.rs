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

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use crate::cluster_config::{self, ClusterConfig, CLUSTER_KEYS};
use crate::resource_limit::{DiskFreeLimit, MemoryWatermark};
use crate::store_config::{self, StoreConfig, STORE_KEYS};
use crate::tcp_listen_options::{self, TcpListenOptions, TCP_LISTEN_KEYS};

/// AMQP 0-9-1 `FRAME-MIN-SIZE`: the smallest `frame_max` a peer may negotiate. RabbitMQ uses
/// the same floor.
pub const FRAME_MAX_MIN: u32 = 4096;

/// The largest `frame_max` accepted. The wire field is 32 bits, but Java clients read it as a
/// signed `int`, so anything above `i32::MAX` breaks them.
pub const FRAME_MAX_MAX: u32 = i32::MAX as u32;

/// RabbitMQ's hard cap on `max_message_size` (512 MiB); larger values are rejected there too.
pub const MESSAGE_SIZE_MAX: u32 = 512 * 1024 * 1024;

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
    /// Bytes of deliveries all connections together may hold encoded and not
    /// yet written to their sockets (`delivery_buffer_total_max`). Past it,
    /// each connection takes deliveries only up to a 64 KiB floor, so slow
    /// consumers by the thousand cannot hold a megabyte each. Default 64 MiB.
    pub delivery_buffer_total_max: u64,
    /// Time allowed from TCP accept to `connection.open`, in milliseconds
    /// (`handshake_timeout`). Default 10000.
    pub handshake_timeout_ms: u64,
    /// Log level (`log.console.level`): one of RabbitMQ's levels `debug`, `info`, `notice`,
    /// `warning`, `error`, `critical`, `alert`, `emergency`, `none`. Default `info`.
    pub log_level: String,
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
    /// A definitions file in RabbitMQ's JSON format, read at start
    /// (`load_definitions`): its policies apply, its exchanges, queues and
    /// bindings are declared. Default none.
    pub load_definitions: Option<PathBuf>,
    /// This node's name and its cluster (`node_name`,
    /// `cluster_formation.*`, `cluster_link.*`). Default: a cluster of one.
    pub cluster: ClusterConfig,
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

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 5672),
            data_dir: PathBuf::from("./sluice-data"),
            default_user: "guest".to_owned(),
            default_pass: "guest".to_owned(),
            default_vhost: "/".to_owned(),
            loopback_users: vec!["guest".to_owned()],
            heartbeat_secs: 60,
            frame_max: 131_072,
            channel_max: 2047,
            max_message_size: MAX_MESSAGE_SIZE_DEFAULT,
            credit_flow_default_credit: CREDIT_FLOW_DEFAULT_CREDIT,
            delivery_buffer_total_max: DELIVERY_BUFFER_TOTAL_MAX_DEFAULT,
            handshake_timeout_ms: 10_000,
            log_level: "info".to_owned(),
            vm_memory_high_watermark_relative: None,
            vm_memory_high_watermark_absolute_bytes: None,
            disk_free_limit_absolute_bytes: None,
            disk_free_limit_relative: None,
            store: StoreConfig::default(),
            tcp_listen_options: TcpListenOptions::default(),
            load_definitions: None,
            cluster: ClusterConfig::default(),
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

/// Every key [`Config::parse`] accepts, for typo suggestions. `loopback_users.<user>` is
/// listed with the user `guest`, the one people usually write.
const KNOWN_KEYS: &[&str] = &[
    "listeners.tcp.default",
    "data_dir",
    "default_user",
    "default_pass",
    "default_vhost",
    "loopback_users",
    "loopback_users.guest",
    "heartbeat",
    "frame_max",
    "channel_max",
    "max_message_size",
    "credit_flow_default_credit",
    "delivery_buffer_total_max",
    "handshake_timeout",
    "log.console.level",
    "vm_memory_high_watermark.relative",
    "vm_memory_high_watermark.absolute",
    "disk_free_limit.absolute",
    "load_definitions",
    "disk_free_limit.relative",
];

/// `credit_flow_default_credit`: the initial credit, alone or as RabbitMQ's
/// `{InitialCredit, MoreCreditAfter}` pair. The second number is accepted
/// and not used: a queue takes a publish in place, so there is no receiver
/// to grant credit back in batches; a paused reader resumes when its queue
/// drains instead (see docs/configuration.md).
fn parse_credit(value: &str) -> Option<u32> {
    let inner = value
        .strip_prefix('{')
        .and_then(|rest| rest.strip_suffix('}'));
    let initial = match inner {
        Some(pair) => {
            let (initial, more_after) = pair.split_once(',')?;
            let more_after: u32 = more_after.trim().parse().ok()?;
            let initial: u32 = initial.trim().parse().ok()?;
            if more_after == 0 || more_after > initial {
                return None;
            }
            initial
        }
        None => value.parse().ok()?,
    };
    Some(initial).filter(|credit| (1..=CREDIT_FLOW_CREDIT_MAX).contains(credit))
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
        // Collected over the whole file, then applied, because RabbitMQ's result does not
        // depend on the order of these lines.
        let mut loopback_none = false;
        let mut loopback_set: Option<Vec<String>> = None;

        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let content = strip_comment(raw).trim();
            if content.is_empty() {
                continue;
            }
            let Some((key, value)) = content.split_once('=') else {
                return Err(ConfigError::Syntax {
                    line,
                    text: content.to_owned(),
                });
            };
            let (key, value) = (key.trim(), value.trim());
            if key.is_empty() || value.is_empty() {
                return Err(ConfigError::Syntax {
                    line,
                    text: content.to_owned(),
                });
            }
            let invalid = |expected: &str| ConfigError::InvalidValue {
                line,
                key: key.to_owned(),
                value: value.to_owned(),
                expected: expected.to_owned(),
            };

            match key {
                "listeners.tcp.default" => {
                    config.listen = parse_listener(value).ok_or_else(|| {
                        invalid("expected a port (5672) or an IP address and port (127.0.0.1:5672, :::5672)")
                    })?;
                }
                "data_dir" => config.data_dir = PathBuf::from(value),
                "default_user" => config.default_user = value.to_owned(),
                "default_pass" => config.default_pass = value.to_owned(),
                "default_vhost" => config.default_vhost = value.to_owned(),
                "loopback_users" => {
                    if value != "none" {
                        return Err(invalid(
                            "expected 'none' (or use 'loopback_users.<user> = true')",
                        ));
                    }
                    loopback_none = true;
                }
                "heartbeat" => {
                    config.heartbeat_secs = value.parse().map_err(|_| {
                        invalid("expected a number of seconds from 0 (disabled) to 65535")
                    })?;
                }
                "frame_max" => {
                    config.frame_max = parse_bytesize(value)
                        .and_then(|bytes| u32::try_from(bytes).ok())
                        .filter(|bytes| (FRAME_MAX_MIN..=FRAME_MAX_MAX).contains(bytes))
                        .ok_or_else(|| {
                            invalid(&format!(
                                "expected a number of bytes from {FRAME_MAX_MIN} to {FRAME_MAX_MAX} (KB, MB, GB suffixes allowed)"
                            ))
                        })?;
                }
                "channel_max" => {
                    let channels: u16 = value.parse().map_err(|_| {
                        invalid("expected a number of channels from 0 (no limit) to 65535")
                    })?;
                    config.channel_max = if channels == 0 { u16::MAX } else { channels };
                }
                "max_message_size" => {
                    config.max_message_size = value
                        .parse()
                        .ok()
                        .filter(|bytes| (1..=MESSAGE_SIZE_MAX).contains(bytes))
                        .ok_or_else(|| {
                            invalid(&format!(
                                "expected a number of bytes from 1 to {MESSAGE_SIZE_MAX}"
                            ))
                        })?;
                }
                "credit_flow_default_credit" => {
                    config.credit_flow_default_credit =
                        parse_credit(value).ok_or_else(|| {
                            invalid(&format!(
                                "expected an initial credit from 1 to {CREDIT_FLOW_CREDIT_MAX}, as `400` or `{{400, 200}}`"
                            ))
                        })?;
                }
                "handshake_timeout" => {
                    config.handshake_timeout_ms = value
                        .parse()
                        .ok()
                        .filter(|ms| *ms > 0)
                        .ok_or_else(|| invalid("expected a positive number of milliseconds"))?;
                }
                "log.console.level" => {
                    if !LOG_LEVELS.contains(&value) {
                        return Err(invalid(&format!(
                            "expected one of {}",
                            LOG_LEVELS.join(", ")
                        )));
                    }
                    config.log_level = value.to_owned();
                }
                "vm_memory_high_watermark.relative" => {
                    config.vm_memory_high_watermark_relative = Some(
                        value
                            .parse::<f64>()
                            .ok()
                            .filter(|fraction| (0.0..=1.0).contains(fraction))
                            .ok_or_else(|| {
                                invalid("expected a fraction of the memory available from 0.0 to 1.0, e.g. 0.6")
                            })?,
                    );
                }
                "delivery_buffer_total_max" => {
                    config.delivery_buffer_total_max = parse_information_unit(value)
                        .filter(|bytes| *bytes > 0)
                        .ok_or_else(|| {
                            invalid(&format!("expected a positive number of bytes with an optional unit: {INFORMATION_UNIT_EXAMPLES}"))
                        })?;
                }
                "vm_memory_high_watermark.absolute" => {
                    config.vm_memory_high_watermark_absolute_bytes =
                        Some(parse_information_unit(value).ok_or_else(|| {
                            invalid(&format!("expected a number of bytes with an optional unit: {INFORMATION_UNIT_EXAMPLES}"))
                        })?);
                }
                "disk_free_limit.absolute" => {
                    config.disk_free_limit_absolute_bytes =
                        Some(parse_information_unit(value).ok_or_else(|| {
                            invalid(&format!("expected a number of bytes with an optional unit: {INFORMATION_UNIT_EXAMPLES}"))
                        })?);
                }
                "disk_free_limit.relative" => {
                    config.disk_free_limit_relative = Some(
                        value
                            .parse::<f64>()
                            .ok()
                            .filter(|multiple| multiple.is_finite() && *multiple >= 0.0)
                            .ok_or_else(|| {
                                invalid("expected a non-negative multiple of the memory available, e.g. 1.5")
                            })?,
                    );
                }
                _ if key.starts_with("store.")
                    || key.starts_with("tcp_listen_options.")
                    || key == "node_name"
                    || key.starts_with("cluster_formation.")
                    || key.starts_with("cluster_link.") =>
                {
                    let applied = if key.starts_with("store.") {
                        store_config::apply(&mut config.store, key, value, parse_information_unit)
                    } else if key.starts_with("tcp_listen_options.") {
                        tcp_listen_options::apply(
                            &mut config.tcp_listen_options,
                            key,
                            value,
                            parse_information_unit,
                        )
                    } else {
                        cluster_config::apply(&mut config.cluster, key, value)
                    };
                    match applied {
                        Some(result) => result.map_err(|expected| invalid(&expected))?,
                        None => {
                            return Err(ConfigError::UnknownKey {
                                line,
                                key: key.to_owned(),
                                suggestion: closest_key(key),
                            })
                        }
                    }
                }
                "load_definitions" => config.load_definitions = Some(PathBuf::from(value)),
                _ => {
                    if let Some(user) = key.strip_prefix("loopback_users.") {
                        let enabled = match value {
                            "true" => true,
                            "false" => false,
                            _ => return Err(invalid("expected 'true' or 'false'")),
                        };
                        let users = loopback_set.get_or_insert_with(Vec::new);
                        users.retain(|existing| existing != user);
                        if enabled {
                            users.push(user.to_owned());
                        }
                    } else if key.starts_with("listeners.tcp.") {
                        return Err(invalid_listener_name(line, key));
                    } else {
                        return Err(ConfigError::UnknownKey {
                            line,
                            key: key.to_owned(),
                            suggestion: closest_key(key),
                        });
                    }
                }
            }
        }

        if loopback_none {
            config.loopback_users.clear();
        } else if let Some(users) = loopback_set {
            config.loopback_users = users;
        }
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
        warnings
    }

    /// The `tracing` filter directive for [`Config::log_level`]: RabbitMQ's eight levels
    /// folded onto tracing's five, and `none` to `off`.
    pub fn log_filter(&self) -> &'static str {
        match self.log_level.as_str() {
            "debug" => "debug",
            "info" | "notice" => "info",
            "warning" => "warn",
            "none" => "off",
            _ => "error",
        }
    }
}

/// Sluice has one AMQP listener; RabbitMQ allows several under any name. Naming the one key
/// that works is more helpful than "unknown key".
fn invalid_listener_name(line: usize, key: &str) -> ConfigError {
    ConfigError::UnknownKey {
        line,
        key: key.to_owned(),
        suggestion: Some("listeners.tcp.default"),
    }
}

/// Cuts a comment off a line. `#` starts a comment at the start of a line or after
/// whitespace, so values such as passwords may contain `#`.
fn strip_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    for (i, &byte) in bytes.iter().enumerate() {
        if byte == b'#' && (i == 0 || bytes[i - 1].is_ascii_whitespace()) {
            return &line[..i];
        }
    }
    line
}

/// Parses a listener address in the forms RabbitMQ accepts for `listeners.tcp.*`: a bare
/// port (`5672`, meaning all IPv4 interfaces), `IP:PORT` (`127.0.0.1:5673`), and IPv6 with
/// the port after the last colon (`:::5672`, `::1:5672`) or in brackets (`[::1]:5672`).
/// Port 0 asks the OS for a free port, which tests use.
pub fn parse_listener(text: &str) -> Option<SocketAddr> {
    let text = text.trim();
    if let Ok(port) = text.parse::<u16>() {
        return Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some(addr);
    }
    let (ip, port) = text.rsplit_once(':')?;
    let ip = ip.trim_start_matches('[').trim_end_matches(']');
    Some(SocketAddr::new(ip.parse().ok()?, port.parse().ok()?))
}

/// Parses cuttlefish's `bytesize` (used by RabbitMQ for `frame_max`): an integer with an
/// optional `KB`, `MB` or `GB` suffix, each a power of 1024.
fn parse_bytesize(text: &str) -> Option<u64> {
    let (digits, multiplier) = if let Some(digits) = text.strip_suffix("KB") {
        (digits, 1 << 10)
    } else if let Some(digits) = text.strip_suffix("MB") {
        (digits, 1 << 20)
    } else if let Some(digits) = text.strip_suffix("GB") {
        (digits, 1 << 30)
    } else {
        (text, 1)
    };
    parse_digits(digits)?.checked_mul(multiplier)
}

/// Examples of the information units [`parse_information_unit`] accepts, for error messages.
const INFORMATION_UNIT_EXAMPLES: &str = "50000000, 50MB, 500MiB, 500Mi, 2GB, 2GiB, 2Gi, 1TB";

/// Parses RabbitMQ's information units (used by `vm_memory_high_watermark.absolute` and
/// `disk_free_limit.absolute`), after `rabbit_resource_monitor_misc:parse_information_unit`:
/// digits, then an optional unit, case-insensitive. `kib`, `ki` (and `mib`, `gib`, `tib`,
/// `pib` alike) are powers of 1024; `kb`, `mb`, `gb`, `tb`, `pb` are powers of 1000. A bare
/// `k`, `m`, `g` is a power of 1024, as in RabbitMQ 3.10, so a 3.10 `rabbitmq.conf` means
/// the same here. RabbitMQ 3.13 added the `T` and `P` units and the `Ki`, `Mi`, `Gi` forms,
/// which Sluice accepts too, but also made bare letters powers of 1000 (as Kubernetes
/// does), which Sluice does not follow.
fn parse_information_unit(text: &str) -> Option<u64> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number = parse_digits(digits)?;
    let unit = unit.to_ascii_lowercase();
    let multiplier: u64 = match unit.as_str() {
        "" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "p" | "pi" | "pib" => 1 << 50,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "pb" => 1_000_000_000_000_000,
        _ => return None,
    };
    number.checked_mul(multiplier)
}

/// Digits only: `str::parse` would also take a leading `+`.
fn parse_digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The known key nearest to `key`, if it is within a typo's distance.
fn closest_key(key: &str) -> Option<&'static str> {
    /// More edits than this and the suggestion is more likely noise than help.
    const TYPO_DISTANCE_MAX: usize = 3;
    KNOWN_KEYS
        .iter()
        .chain(STORE_KEYS)
        .chain(TCP_LISTEN_KEYS)
        .chain(CLUSTER_KEYS)
        .map(|known| (edit_distance(key, known), *known))
        .filter(|(distance, _)| *distance <= TYPO_DISTANCE_MAX)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, known)| known)
}

/// Levenshtein distance over bytes; keys are ASCII.
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, &ca) in a.as_bytes().iter().enumerate() {
        current[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Config::default())
    }

    fn error(text: &str) -> String {
        parse(text)
            .expect_err("config should be rejected")
            .to_string()
    }

    #[test]
    fn defaults_are_rabbitmq_defaults() {
        let config = Config::default();
        assert_eq!(config.listen, "0.0.0.0:5672".parse().unwrap());
        assert_eq!(config.data_dir, PathBuf::from("./sluice-data"));
        assert_eq!(config.default_user, "guest");
        assert_eq!(config.default_pass, "guest");
        assert_eq!(config.default_vhost, "/");
        assert_eq!(config.loopback_users, vec!["guest".to_owned()]);
        assert_eq!(config.heartbeat_secs, 60);
        assert_eq!(config.frame_max, 131_072);
        assert_eq!(config.channel_max, 2047);
        assert_eq!(config.max_message_size, 134_217_728);
        assert_eq!(config.handshake_timeout_ms, 10_000);
        assert_eq!(config.log_level, "info");
        assert_eq!(config.load_definitions, None);
        assert_eq!(
            config.vm_memory_high_watermark(),
            MemoryWatermark::Relative(0.6)
        );
        assert_eq!(
            config.disk_free_limit(),
            DiskFreeLimit::Absolute(50_000_000)
        );
        assert!(config.warnings().is_empty());
    }

    #[test]
    fn load_definitions_names_a_file() {
        let config = parse("load_definitions = /etc/sluice/definitions.json").unwrap();
        assert_eq!(
            config.load_definitions,
            Some(PathBuf::from("/etc/sluice/definitions.json"))
        );
    }

    #[test]
    fn empty_text_and_comments_keep_base() {
        let text = "\n# a comment\n   \n\t# indented comment\n";
        assert_eq!(parse(text).unwrap(), Config::default());
        let base = Config {
            heartbeat_secs: 5,
            ..Config::default()
        };
        assert_eq!(Config::parse("", base.clone()).unwrap(), base);
    }

    #[test]
    fn trailing_comment_and_whitespace() {
        let config = parse("  heartbeat   =  30   # seconds\r\n").unwrap();
        assert_eq!(config.heartbeat_secs, 30);
    }

    #[test]
    fn hash_inside_value_is_kept() {
        let config = parse("default_pass = s3cr#t # the password").unwrap();
        assert_eq!(config.default_pass, "s3cr#t");
    }

    #[test]
    fn later_line_wins() {
        let config = parse("heartbeat = 10\nheartbeat = 20").unwrap();
        assert_eq!(config.heartbeat_secs, 20);
    }

    #[test]
    fn listener_forms() {
        let cases = [
            ("5672", "0.0.0.0:5672"),
            ("0.0.0.0:5672", "0.0.0.0:5672"),
            ("127.0.0.1:5673", "127.0.0.1:5673"),
            (":::5672", "[::]:5672"),
            ("::1:5672", "[::1]:5672"),
            ("[::1]:5674", "[::1]:5674"),
            ("0", "0.0.0.0:0"),
        ];
        for (value, expected) in cases {
            let config = parse(&format!("listeners.tcp.default = {value}")).unwrap();
            assert_eq!(config.listen, expected.parse().unwrap(), "{value}");
        }
    }

    #[test]
    fn listener_invalid() {
        for value in [
            "abc",
            "127.0.0.1",
            "127.0.0.1:99999",
            "localhost:5672",
            "1.2.3:5672",
        ] {
            let message = error(&format!("\nlisteners.tcp.default = {value}"));
            assert!(
                message.starts_with(&format!(
                    "line 2: invalid value '{value}' for 'listeners.tcp.default'"
                )),
                "{message}"
            );
        }
    }

    #[test]
    fn listener_other_names_point_to_default() {
        assert_eq!(
            error("listeners.tcp.1 = 5672"),
            "line 1: unknown key 'listeners.tcp.1' (did you mean 'listeners.tcp.default'?)"
        );
    }

    #[test]
    fn data_dir() {
        let config = parse("data_dir = /var/lib/sluice").unwrap();
        assert_eq!(config.data_dir, PathBuf::from("/var/lib/sluice"));
    }

    #[test]
    fn default_user_pass_vhost() {
        let config =
            parse("default_user = admin\ndefault_pass = p@ss word\ndefault_vhost = prod").unwrap();
        assert_eq!(config.default_user, "admin");
        assert_eq!(config.default_pass, "p@ss word");
        assert_eq!(config.default_vhost, "prod");
    }

    #[test]
    fn loopback_users_replace_the_list() {
        let config = parse("loopback_users.alice = true\nloopback_users.bob = false").unwrap();
        assert_eq!(config.loopback_users, vec!["alice".to_owned()]);

        let config = parse("loopback_users.guest = false").unwrap();
        assert!(config.loopback_users.is_empty());

        let config = parse("loopback_users.guest = true\nloopback_users.ops = true").unwrap();
        assert_eq!(
            config.loopback_users,
            vec!["guest".to_owned(), "ops".to_owned()]
        );
    }

    #[test]
    fn loopback_users_none_wins_wherever_it_is() {
        let config = parse("loopback_users = none\nloopback_users.alice = true").unwrap();
        assert!(config.loopback_users.is_empty());
        let config = parse("loopback_users.alice = true\nloopback_users = none").unwrap();
        assert!(config.loopback_users.is_empty());
    }

    #[test]
    fn loopback_users_invalid() {
        assert_eq!(
            error("loopback_users.guest = yes"),
            "line 1: invalid value 'yes' for 'loopback_users.guest': expected 'true' or 'false'"
        );
        assert!(error("loopback_users = guest").starts_with("line 1: invalid value 'guest'"));
    }

    #[test]
    fn heartbeat() {
        assert_eq!(parse("heartbeat = 0").unwrap().heartbeat_secs, 0);
        assert_eq!(parse("heartbeat = 580").unwrap().heartbeat_secs, 580);
        assert_eq!(
            error("# c\n\n\n\nheartbeat = abc"),
            "line 5: invalid value 'abc' for 'heartbeat': expected a number of seconds from 0 (disabled) to 65535"
        );
        assert!(error("heartbeat = 65536").starts_with("line 1: invalid value '65536'"));
        assert!(error("heartbeat = -1").starts_with("line 1: invalid value '-1'"));
    }

    #[test]
    fn frame_max() {
        assert_eq!(parse("frame_max = 4096").unwrap().frame_max, 4096);
        assert_eq!(parse("frame_max = 1048576").unwrap().frame_max, 1_048_576);
        assert_eq!(parse("frame_max = 256KB").unwrap().frame_max, 262_144);
        assert_eq!(parse("frame_max = 1MB").unwrap().frame_max, 1_048_576);
        assert_eq!(
            parse("frame_max = 2147483647").unwrap().frame_max,
            FRAME_MAX_MAX
        );
        for value in ["0", "4095", "2147483648", "4GB", "big", "+8192"] {
            let message = error(&format!("frame_max = {value}"));
            assert!(
                message.starts_with(&format!("line 1: invalid value '{value}' for 'frame_max'")),
                "{message}"
            );
        }
    }

    #[test]
    fn channel_max() {
        assert_eq!(parse("channel_max = 128").unwrap().channel_max, 128);
        assert_eq!(parse("channel_max = 0").unwrap().channel_max, u16::MAX);
        assert!(error("channel_max = 70000").starts_with("line 1: invalid value '70000'"));
    }

    #[test]
    fn credit_flow_default_credit_takes_a_number_or_rabbitmqs_pair() {
        assert_eq!(Config::default().credit_flow_default_credit, 400);
        for (value, credit) in [("200", 200), ("{400, 200}", 400), ("{1000,500}", 1000)] {
            let line = format!("credit_flow_default_credit = {value}");
            assert_eq!(parse(&line).unwrap().credit_flow_default_credit, credit);
        }
        for value in ["0", "{200, 400}", "{400}", "lots", "200000"] {
            let message = error(&format!("credit_flow_default_credit = {value}"));
            assert!(message.contains("expected an initial credit"), "{message}");
        }
    }

    #[test]
    fn delivery_buffer_total_max_takes_a_size() {
        assert_eq!(Config::default().delivery_buffer_total_max, 64 << 20);
        let config = parse("delivery_buffer_total_max = 16MiB").unwrap();
        assert_eq!(config.delivery_buffer_total_max, 16 << 20);
        let message = error("delivery_buffer_total_max = 0");
        assert!(
            message.contains("expected a positive number of bytes"),
            "{message}"
        );
    }

    #[test]
    fn max_message_size() {
        assert_eq!(
            parse("max_message_size = 1024").unwrap().max_message_size,
            1024
        );
        assert_eq!(
            parse("max_message_size = 536870912")
                .unwrap()
                .max_message_size,
            MESSAGE_SIZE_MAX
        );
        for value in ["0", "536870913", "1MB"] {
            let message = error(&format!("max_message_size = {value}"));
            assert!(
                message.starts_with(&format!("line 1: invalid value '{value}'")),
                "{message}"
            );
        }
    }

    #[test]
    fn handshake_timeout() {
        assert_eq!(
            parse("handshake_timeout = 3000")
                .unwrap()
                .handshake_timeout_ms,
            3000
        );
        assert!(error("handshake_timeout = 0").starts_with("line 1: invalid value '0'"));
        assert!(error("handshake_timeout = infinity").starts_with("line 1: invalid value"));
    }

    #[test]
    fn log_level() {
        for (level, filter) in [
            ("debug", "debug"),
            ("info", "info"),
            ("notice", "info"),
            ("warning", "warn"),
            ("error", "error"),
            ("critical", "error"),
            ("alert", "error"),
            ("emergency", "error"),
            ("none", "off"),
        ] {
            let config = parse(&format!("log.console.level = {level}")).unwrap();
            assert_eq!(config.log_level, level);
            assert_eq!(config.log_filter(), filter);
        }
        assert!(error("log.console.level = loud").starts_with(
            "line 1: invalid value 'loud' for 'log.console.level': expected one of debug, info"
        ));
    }

    #[test]
    fn vm_memory_high_watermark_relative() {
        for (value, fraction) in [("0.4", 0.4), ("0", 0.0), ("1", 1.0), ("1.0", 1.0)] {
            let config = parse(&format!("vm_memory_high_watermark.relative = {value}")).unwrap();
            assert_eq!(
                config.vm_memory_high_watermark(),
                MemoryWatermark::Relative(fraction),
                "{value}"
            );
        }
        assert_eq!(
            error("vm_memory_high_watermark.relative = 1.5"),
            "line 1: invalid value '1.5' for 'vm_memory_high_watermark.relative': expected a fraction of the memory available from 0.0 to 1.0, e.g. 0.6"
        );
        for value in ["-0.1", "forty", "NaN", "40%"] {
            let message = error(&format!("vm_memory_high_watermark.relative = {value}"));
            assert!(
                message.starts_with(&format!(
                    "line 1: invalid value '{value}' for 'vm_memory_high_watermark.relative'"
                )),
                "{message}"
            );
        }
    }

    #[test]
    fn vm_memory_high_watermark_absolute() {
        let cases = [
            ("1073741824", 1 << 30),
            ("1024MiB", 1 << 30),
            ("1024M", 1 << 30),
            ("1Gi", 1 << 30),
            ("1G", 1 << 30),
            ("2GB", 2_000_000_000),
            ("2gb", 2_000_000_000),
            ("0", 0),
        ];
        for (value, bytes) in cases {
            let config = parse(&format!("vm_memory_high_watermark.absolute = {value}")).unwrap();
            assert_eq!(
                config.vm_memory_high_watermark(),
                MemoryWatermark::Absolute(bytes),
                "{value}"
            );
        }
        assert_eq!(
            error("\nvm_memory_high_watermark.absolute = 2 GB"),
            "line 2: invalid value '2 GB' for 'vm_memory_high_watermark.absolute': expected a number of bytes with an optional unit: 50000000, 50MB, 500MiB, 500Mi, 2GB, 2GiB, 2Gi, 1TB"
        );
        for value in ["0.5", "1.5GB", "-1", "2XB", "GB", "99999999999999999999"] {
            let message = error(&format!("vm_memory_high_watermark.absolute = {value}"));
            assert!(
                message.starts_with(&format!(
                    "line 1: invalid value '{value}' for 'vm_memory_high_watermark.absolute'"
                )),
                "{message}"
            );
        }
    }

    #[test]
    fn vm_memory_high_watermark_absolute_wins_over_relative() {
        // Whichever line comes first, as in RabbitMQ's schema translation.
        for text in [
            "vm_memory_high_watermark.relative = 0.5\nvm_memory_high_watermark.absolute = 2GB",
            "vm_memory_high_watermark.absolute = 2GB\nvm_memory_high_watermark.relative = 0.5",
        ] {
            let config = parse(text).unwrap();
            assert_eq!(
                config.vm_memory_high_watermark(),
                MemoryWatermark::Absolute(2_000_000_000)
            );
            assert_eq!(config.warnings().len(), 1);
            assert!(
                config.warnings()[0].contains("vm_memory_high_watermark.absolute has precedence")
            );
        }
    }

    #[test]
    fn disk_free_limit_relative() {
        for (value, multiple) in [("1.0", 1.0), ("1.5", 1.5), ("2", 2.0), ("0", 0.0)] {
            let config = parse(&format!("disk_free_limit.relative = {value}")).unwrap();
            assert_eq!(
                config.disk_free_limit(),
                DiskFreeLimit::MemoryRelative(multiple),
                "{value}"
            );
        }
        assert_eq!(
            error("disk_free_limit.relative = -1"),
            "line 1: invalid value '-1' for 'disk_free_limit.relative': expected a non-negative multiple of the memory available, e.g. 1.5"
        );
        for value in ["inf", "NaN", "two", "50MB"] {
            let message = error(&format!("disk_free_limit.relative = {value}"));
            assert!(
                message.starts_with(&format!(
                    "line 1: invalid value '{value}' for 'disk_free_limit.relative'"
                )),
                "{message}"
            );
        }
    }

    #[test]
    fn disk_free_limit_absolute_wins_over_relative() {
        let config =
            parse("disk_free_limit.absolute = 1GB\ndisk_free_limit.relative = 2.0").unwrap();
        assert_eq!(
            config.disk_free_limit(),
            DiskFreeLimit::Absolute(1_000_000_000)
        );
        assert!(config.warnings()[0].contains("disk_free_limit.absolute has precedence"));
    }

    #[test]
    fn disk_free_limit_units() {
        let cases = [
            ("50000000", 50_000_000),
            ("1000kB", 1_000_000),
            ("50MB", 50_000_000),
            ("50mb", 50_000_000),
            ("1GB", 1_000_000_000),
            ("2TB", 2_000_000_000_000),
            ("512k", 512 * 1024),
            ("512KiB", 512 * 1024),
            ("500M", 500 << 20),
            ("500MiB", 500 << 20),
            ("2G", 2 << 30),
            ("2GiB", 2 << 30),
            ("2gib", 2 << 30),
            ("1TiB", 1 << 40),
            ("1Ti", 1 << 40),
            ("1PiB", 1 << 50),
            ("1PB", 1_000_000_000_000_000),
        ];
        for (value, bytes) in cases {
            let config = parse(&format!("disk_free_limit.absolute = {value}")).unwrap();
            assert_eq!(
                config.disk_free_limit(),
                DiskFreeLimit::Absolute(bytes),
                "{value}"
            );
        }
        for value in ["MB", "50XB", "1.5GB", "-1", "50 MB"] {
            let message = error(&format!("disk_free_limit.absolute = {value}"));
            assert!(
                message.starts_with(&format!(
                    "line 1: invalid value '{value}' for 'disk_free_limit.absolute'"
                )),
                "{message}"
            );
        }
    }

    #[test]
    fn unknown_key_names_line_and_suggests() {
        assert_eq!(
            error("\n\nlistners.tcp.default = 5672"),
            "line 3: unknown key 'listners.tcp.default' (did you mean 'listeners.tcp.default'?)"
        );
        assert_eq!(
            error("credit_flow_default_credi = 400"),
            "line 1: unknown key 'credit_flow_default_credi' (did you mean 'credit_flow_default_credit'?)"
        );
    }

    #[test]
    fn tcp_listen_options_are_read_and_checked() {
        let config = parse(
            "tcp_listen_options.backlog = 4096\ntcp_listen_options.recbuf = 64KiB\n\
             tcp_listen_options.nodelay = false",
        )
        .unwrap();
        assert_eq!(config.tcp_listen_options.backlog, 4096);
        assert_eq!(config.tcp_listen_options.recbuf, Some(65_536));
        assert_eq!(config.tcp_listen_options.sndbuf, None);
        assert!(!config.tcp_listen_options.nodelay);
        assert_eq!(
            error("tcp_listen_options.recbf = 65536"),
            "line 1: unknown key 'tcp_listen_options.recbf' (did you mean 'tcp_listen_options.recbuf'?)"
        );
        assert!(error("\ntcp_listen_options.sndbuf = 1k")
            .starts_with("line 2: invalid value '1k' for 'tcp_listen_options.sndbuf'"));
    }

    #[test]
    fn syntax_errors_name_line() {
        assert_eq!(
            error("heartbeat = 1\nheartbeat 30"),
            "line 2: expected 'key = value', found 'heartbeat 30'"
        );
        assert_eq!(
            error("heartbeat ="),
            "line 1: expected 'key = value', found 'heartbeat ='"
        );
        assert_eq!(error("= 5"), "line 1: expected 'key = value', found '= 5'");
    }

    #[test]
    fn first_error_is_reported() {
        assert!(error("heartbeat = x\nbogus = 1").starts_with("line 1:"));
    }

    #[test]
    fn from_file_reads_and_reports_missing_file() {
        let path =
            std::env::temp_dir().join(format!("sluice-config-test-{}.conf", std::process::id()));
        std::fs::write(
            &path,
            "# test\nlisteners.tcp.default = 127.0.0.1:5673\nheartbeat = 15\n",
        )
        .unwrap();
        let config = Config::from_file(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(config.listen, "127.0.0.1:5673".parse().unwrap());
        assert_eq!(config.heartbeat_secs, 15);

        let message = Config::from_file(&path).unwrap_err().to_string();
        assert!(message.starts_with("cannot read config file "), "{message}");
        assert!(
            !message.contains("os error"),
            "the cause belongs in source(): {message}"
        );
    }

    #[test]
    fn full_rabbitmq_style_file() {
        let text = "\
# Sluice example
listeners.tcp.default = 127.0.0.1:5673
data_dir = /tmp/sluice
default_user = admin
default_pass = admin
default_vhost = /
loopback_users = none
heartbeat = 30
frame_max = 131072
channel_max = 2047
max_message_size = 16777216
handshake_timeout = 5000
log.console.level = warning
vm_memory_high_watermark.relative = 0.5
disk_free_limit.absolute = 2GB
";
        let config = parse(text).unwrap();
        assert_eq!(config.listen, "127.0.0.1:5673".parse().unwrap());
        assert!(config.loopback_users.is_empty());
        assert_eq!(config.max_message_size, 16_777_216);
        assert_eq!(
            config.disk_free_limit(),
            DiskFreeLimit::Absolute(2_000_000_000)
        );
        assert_eq!(
            config.vm_memory_high_watermark(),
            MemoryWatermark::Relative(0.5)
        );
    }

    #[test]
    fn edit_distance_basics() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("heartbeat", "heartbeat"), 0);
        assert_eq!(edit_distance("hartbeat", "heartbeat"), 1);
        assert_eq!(closest_key("zzzzzzzz"), None);
    }
}
