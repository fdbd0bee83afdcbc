//! The Prometheus endpoint's keys, RabbitMQ's `rabbitmq_prometheus` ones:
//! `prometheus.tcp.port` (15692), `prometheus.tcp.ip`, `prometheus.path`
//! (`/metrics`) and `prometheus.return_per_object_metrics`.

use crate::http_listener::HttpListenerConfig;

/// Keys handled here, for the parser's typo suggestions.
pub const PROMETHEUS_KEYS: &[&str] = &[
    "prometheus.tcp.port",
    "prometheus.tcp.ip",
    "prometheus.path",
    "prometheus.return_per_object_metrics",
];

/// RabbitMQ's port for `rabbitmq_prometheus`.
pub const PROMETHEUS_PORT_DEFAULT: u16 = 15692;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrometheusConfig {
    pub listener: HttpListenerConfig,
    /// Where the aggregated metrics are served; per-object ones at
    /// `{path}/per-object`.
    pub path: String,
    /// Serve per-object metrics at `path` too, as RabbitMQ does with
    /// `prometheus.return_per_object_metrics = true`.
    pub per_object_by_default: bool,
}

impl Default for PrometheusConfig {
    fn default() -> Self {
        Self {
            listener: HttpListenerConfig::with_default_port(PROMETHEUS_PORT_DEFAULT),
            path: "/metrics".to_owned(),
            per_object_by_default: false,
        }
    }
}

/// Applies one key; None for a key that is not one of these.
pub fn apply(config: &mut PrometheusConfig, key: &str, value: &str) -> Option<Result<(), String>> {
    let result = match key {
        "prometheus.tcp.port" | "prometheus.tcp.ip" => {
            return config.listener.apply(&key["prometheus.".len()..], value)
        }
        "prometheus.path" => {
            if value.starts_with('/') && value.len() > 1 && !value.ends_with('/') {
                config.path = value.to_owned();
                Ok(())
            } else {
                Err("expected a path such as /metrics".to_owned())
            }
        }
        "prometheus.return_per_object_metrics" => match value {
            "true" | "false" => {
                config.per_object_by_default = value == "true";
                Ok(())
            }
            _ => Err("expected 'true' or 'false'".to_owned()),
        },
        _ => return None,
    };
    Some(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_keys_are_read_and_checked() {
        let mut config = PrometheusConfig::default();
        assert_eq!(config.listener.address().port(), 15692);
        assert!(!config.listener.configured);
        for (key, value) in [
            ("prometheus.tcp.port", "9419"),
            ("prometheus.tcp.ip", "127.0.0.1"),
            ("prometheus.path", "/stats"),
            ("prometheus.return_per_object_metrics", "true"),
        ] {
            assert_eq!(apply(&mut config, key, value), Some(Ok(())), "{key}");
        }
        assert_eq!(config.listener.address(), "127.0.0.1:9419".parse().unwrap());
        assert!(config.listener.configured && config.per_object_by_default);
        assert_eq!(config.path, "/stats");
        assert!(apply(&mut config, "prometheus.tcp.port", "99999")
            .unwrap()
            .is_err());
        assert!(apply(&mut config, "prometheus.path", "metrics")
            .unwrap()
            .is_err());
        assert!(apply(&mut config, "prometheus.ssl.port", "1").is_none());
    }
}
