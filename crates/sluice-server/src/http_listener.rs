//! The HTTP endpoints' listeners (management API, Prometheus): their
//! `<prefix>.tcp.port` and `<prefix>.tcp.ip` keys, and binding them.
//!
//! RabbitMQ's plugins listen on fixed default ports (15672, 15692). Several
//! Sluice nodes, or a RabbitMQ, on one machine would fight over them, so a
//! default port in use is logged and that endpoint stays off; a port that
//! was configured and cannot be had stops the start.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpListenerConfig {
    pub ip: IpAddr,
    pub port: u16,
    /// Whether the port or address was set: then a port in use stops the
    /// start.
    pub configured: bool,
}

impl HttpListenerConfig {
    /// Every address, on `port`, not configured.
    pub fn with_default_port(port: u16) -> Self {
        HttpListenerConfig {
            ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port,
            configured: false,
        }
    }

    pub fn address(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }

    /// Applies `<prefix>.tcp.port` or `<prefix>.tcp.ip` (`key_in_prefix` is
    /// the part after the prefix's dot); None for another key.
    pub fn apply(&mut self, key_in_prefix: &str, value: &str) -> Option<Result<(), String>> {
        let result = match key_in_prefix {
            "tcp.port" => value
                .parse::<u16>()
                .map(|port| self.port = port)
                .map_err(|_| "expected a port number (0 to 65535)".to_owned()),
            "tcp.ip" => value
                .parse::<IpAddr>()
                .map(|ip| self.ip = ip)
                .map_err(|_| "expected an IP address, e.g. 0.0.0.0 or ::".to_owned()),
            _ => return None,
        };
        if result.is_ok() {
            self.configured = true;
        }
        Some(result)
    }
}

/// Why an endpoint could not listen.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for {endpoint} on {address} ({prefix}.tcp.port, {prefix}.tcp.ip)")]
pub struct HttpListenError {
    /// What the listener serves, as the log names it.
    pub endpoint: &'static str,
    /// Its keys' prefix.
    pub prefix: &'static str,
    pub address: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds `config`'s address for `endpoint` (keys `prefix.tcp.*`); None
/// when the default port was taken (logged).
pub fn bind(
    config: &HttpListenerConfig,
    endpoint: &'static str,
    prefix: &'static str,
) -> Result<Option<std::net::TcpListener>, HttpListenError> {
    let address = config.address();
    let error = |source| HttpListenError {
        endpoint,
        prefix,
        address,
        source,
    };
    match std::net::TcpListener::bind(address) {
        Ok(listener) => {
            listener.set_nonblocking(true).map_err(error)?;
            Ok(Some(listener))
        }
        Err(source) if config.configured => Err(error(source)),
        Err(problem) => {
            tracing::warn!(%address, error = %problem, "the {endpoint} endpoint is off: its default port is taken (set {prefix}.tcp.port for this node)");
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_listener_keys_are_read_and_checked() {
        let mut config = HttpListenerConfig::with_default_port(15672);
        assert!(!config.configured);
        assert_eq!(config.apply("tcp.port", "9000"), Some(Ok(())));
        assert_eq!(config.apply("tcp.ip", "127.0.0.1"), Some(Ok(())));
        assert_eq!(config.address(), "127.0.0.1:9000".parse().unwrap());
        assert!(config.configured);
        assert!(config.apply("tcp.port", "70000").unwrap().is_err());
        assert!(config.apply("tcp.ip", "localhost").unwrap().is_err());
        assert!(config.apply("ssl.port", "1").is_none());
    }

    #[test]
    fn a_taken_default_port_turns_the_endpoint_off_and_a_configured_one_fails() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let mut config = HttpListenerConfig::with_default_port(port);
        config.ip = "127.0.0.1".parse().unwrap();
        assert!(bind(&config, "the management API", "management")
            .unwrap()
            .is_none());
        config.configured = true;
        let refused = bind(&config, "the management API", "management").unwrap_err();
        assert_eq!(
            refused.to_string(),
            format!("cannot listen for the management API on 127.0.0.1:{port} (management.tcp.port, management.tcp.ip)")
        );
    }
}
