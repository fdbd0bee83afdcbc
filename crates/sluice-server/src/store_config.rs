//! The `store.*` configuration keys: how queues keep messages on disk.
//! RabbitMQ's classic message store has its own knobs; docs/configuration.md
//! maps them to these.

use std::time::Duration;

use sluice_core::paging::{StoreSettings, SEGMENT_SIZE_BYTES_MAX};

/// Storage settings from the configuration file.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreConfig {
    pub settings: StoreSettings,
    /// Least time between the starts of two sync rounds (`store.sync_interval`,
    /// milliseconds). Default 0: a round starts as soon as anything waits,
    /// and batches grow with the fsync's own duration.
    pub sync_interval: Duration,
    /// Bytes all queue journals together may hold unwritten before every
    /// queue adding to them pauses its publishers
    /// (`store.write_buffer_total_max`): the per-queue bound alone would let
    /// a node's memory grow with its number of queues.
    pub write_buffer_total_max: u64,
}

/// Twice the per-queue default: one queue may use its whole buffer, and a
/// burst across hundreds of queues still stops at this.
pub const WRITE_BUFFER_TOTAL_MAX_DEFAULT: u64 = 128 * 1024 * 1024;

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            settings: StoreSettings::default(),
            sync_interval: Duration::ZERO,
            write_buffer_total_max: WRITE_BUFFER_TOTAL_MAX_DEFAULT,
        }
    }
}

/// Keys handled here, for the parser's typo suggestions.
pub const STORE_KEYS: &[&str] = &[
    "store.segment_size",
    "store.sync_interval",
    "store.read_ahead_messages",
    "store.read_ahead_bytes",
    "store.write_buffer_max",
    "store.write_buffer_total_max",
    "store.read_ahead_total_max",
    "store.missing_segments",
];

/// Segments smaller than this would roll over every few messages.
const SEGMENT_SIZE_BYTES_MIN: u64 = 1024 * 1024;
/// A sync interval beyond a second would hold every confirm that long.
const SYNC_INTERVAL_MS_MAX: u64 = 1000;
/// The window must hold at least one message; beyond a million, paging
/// no longer bounds memory in any useful way.
const READ_AHEAD_MESSAGES_MAX: u64 = 1_000_000;

/// Applies one `store.*` key. Returns None for a key that is not one of
/// these, or the reason the value is unusable.
pub fn apply(
    config: &mut StoreConfig,
    key: &str,
    value: &str,
    parse_bytes: impl Fn(&str) -> Option<u64>,
) -> Option<Result<(), String>> {
    let settings = &mut config.settings;
    let result = match key {
        "store.missing_segments" => match value {
            "refuse" => {
                settings.missing_segments = sluice_store::MissingSegments::Refuse;
                Ok(())
            }
            "skip" => {
                settings.missing_segments = sluice_store::MissingSegments::Skip;
                Ok(())
            }
            _ => Err("expected `refuse` or `skip`".to_owned()),
        },
        "store.segment_size" => parse_bytes(value)
            .filter(|bytes| (SEGMENT_SIZE_BYTES_MIN..=SEGMENT_SIZE_BYTES_MAX).contains(bytes))
            .map(|bytes| settings.segment_size_bytes = bytes)
            .ok_or_else(|| {
                format!(
                    "expected a size from {SEGMENT_SIZE_BYTES_MIN} bytes (1MiB) to {SEGMENT_SIZE_BYTES_MAX} (1GiB), e.g. 64MiB"
                )
            }),
        "store.sync_interval" => value
            .parse::<u64>()
            .ok()
            .filter(|ms| *ms <= SYNC_INTERVAL_MS_MAX)
            .map(|ms| config.sync_interval = Duration::from_millis(ms))
            .ok_or_else(|| {
                format!("expected a number of milliseconds from 0 to {SYNC_INTERVAL_MS_MAX}")
            }),
        "store.read_ahead_messages" => value
            .parse::<u64>()
            .ok()
            .filter(|count| (1..=READ_AHEAD_MESSAGES_MAX).contains(count))
            .map(|count| settings.resident_messages_max = count as usize)
            .ok_or_else(|| {
                format!("expected a number of messages from 1 to {READ_AHEAD_MESSAGES_MAX}")
            }),
        "store.read_ahead_bytes" => parse_bytes(value)
            .filter(|bytes| *bytes > 0)
            .map(|bytes| settings.resident_bytes_max = bytes)
            .ok_or_else(|| "expected a positive size, e.g. 8MiB".to_owned()),
        "store.write_buffer_max" => parse_bytes(value)
            .filter(|bytes| *bytes > 0)
            .map(|bytes| settings.unwritten_bytes_max = bytes)
            .ok_or_else(|| "expected a positive size, e.g. 64MiB".to_owned()),
        "store.read_ahead_total_max" => parse_bytes(value)
            .filter(|bytes| *bytes > 0)
            .map(|bytes| settings.resident_total_max = bytes)
            .ok_or_else(|| "expected a positive size, e.g. 256MiB".to_owned()),
        "store.write_buffer_total_max" => parse_bytes(value)
            .filter(|bytes| *bytes > 0)
            .map(|bytes| config.write_buffer_total_max = bytes)
            .ok_or_else(|| "expected a positive size, e.g. 128MiB".to_owned()),
        _ => return None,
    };
    Some(result)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn store_keys_set_the_store_settings() {
        let config = Config::parse(
            "store.segment_size = 16MiB\nstore.sync_interval = 5\nstore.read_ahead_messages = 500\nstore.read_ahead_bytes = 2MiB\nstore.write_buffer_max = 32MB\nstore.write_buffer_total_max = 1GiB\nstore.read_ahead_total_max = 100MiB\n",
            Config::default(),
        )
        .unwrap();
        let settings = &config.store.settings;
        assert_eq!(settings.segment_size_bytes, 16 << 20);
        assert_eq!(config.store.sync_interval.as_millis(), 5);
        assert_eq!(settings.resident_messages_max, 500);
        assert_eq!(settings.resident_bytes_max, 2 << 20);
        assert_eq!(settings.unwritten_bytes_max, 32_000_000);
        assert_eq!(config.store.write_buffer_total_max, 1 << 30);
        assert_eq!(settings.resident_total_max, 100 << 20);
    }

    #[test]
    fn bad_store_values_name_the_key_and_what_is_expected() {
        for (line, expected) in [
            ("store.segment_size = 100KiB", "expected a size from"),
            ("store.segment_size = 2GiB", "expected a size from"),
            ("store.sync_interval = 5000", "milliseconds from 0 to 1000"),
            ("store.read_ahead_messages = 0", "from 1 to"),
            ("store.read_ahead_bytes = lots", "positive size"),
        ] {
            let error = Config::parse(line, Config::default())
                .unwrap_err()
                .to_string();
            let key = line.split(" =").next().unwrap();
            assert!(
                error.contains(key) && error.contains(expected),
                "{line}: {error}"
            );
        }
        let error = Config::parse("store.segment_sise = 1MiB", Config::default())
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("did you mean 'store.segment_size'"),
            "{error}"
        );
    }
}
