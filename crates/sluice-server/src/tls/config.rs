//! The TLS keys of the configuration file, with RabbitMQ's names and
//! defaults: `listeners.ssl.default`, `ssl_options.*` and
//! `ssl_cert_login_from`. Files are only named here; they are read when the
//! server starts (see [`super::server_config`]), so that an error names the
//! key and the file together.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

/// `ssl_options.verify`: whether the server asks clients for a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PeerVerification {
    /// `verify_none`, RabbitMQ's default: no client certificate is asked for.
    #[default]
    VerifyNone,
    /// `verify_peer`: a client certificate is asked for and, when one comes,
    /// checked against `ssl_options.cacertfile`.
    VerifyPeer,
}

/// A protocol version named by `ssl_options.versions.N`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsVersion {
    Tls12,
    Tls13,
    /// `tlsv1.1` or `tlsv1`: RabbitMQ knows them, rustls does not speak them.
    /// Kept to be named in a warning rather than refused, so that a
    /// deployment's file starts as it is.
    Obsolete(String),
}

/// `ssl_cert_login_from`: which part of a client certificate names the
/// user that SASL EXTERNAL logs in as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CertificateLoginFrom {
    /// RabbitMQ's default: the whole subject in RFC 4514 form, most specific
    /// part first (`CN=client,O=Example`).
    #[default]
    DistinguishedName,
    /// The subject's common name (`client`).
    CommonName,
}

/// The TLS listener and its settings. Default: no TLS listener.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct TlsConfig {
    /// Address of the TLS listener (`listeners.ssl.default`); None
    /// (`listeners.ssl = none`, the default) for none.
    pub listen: Option<SocketAddr>,
    /// Certificate authorities that client certificates are checked against
    /// (`ssl_options.cacertfile`, PEM).
    pub cacertfile: Option<PathBuf>,
    /// The server's certificate chain (`ssl_options.certfile`, PEM).
    pub certfile: Option<PathBuf>,
    /// The server's private key (`ssl_options.keyfile`, PEM, unencrypted).
    pub keyfile: Option<PathBuf>,
    /// `ssl_options.verify`.
    pub verify: PeerVerification,
    /// `ssl_options.fail_if_no_peer_cert`: with `verify_peer`, refuse a
    /// client that presents no certificate. Default false.
    pub fail_if_no_peer_cert: bool,
    /// `ssl_options.versions.N`, by N; None (the default) for TLS 1.2 and 1.3.
    pub versions: Option<BTreeMap<String, TlsVersion>>,
    /// `ssl_cert_login_from`.
    pub login_from: CertificateLoginFrom,
}

/// Keys handled here, for the parser's typo suggestions.
pub const TLS_KEYS: &[&str] = &[
    "listeners.ssl.default",
    "listeners.ssl",
    "ssl_options.cacertfile",
    "ssl_options.certfile",
    "ssl_options.keyfile",
    "ssl_options.verify",
    "ssl_options.fail_if_no_peer_cert",
    "ssl_options.versions.1",
    "ssl_cert_login_from",
];

/// Applies one TLS key. Returns None for a key that is not one of these, or
/// the reason the value is unusable.
pub fn apply(
    config: &mut TlsConfig,
    key: &str,
    value: &str,
    parse_listener: impl Fn(&str) -> Option<SocketAddr>,
) -> Option<Result<(), String>> {
    let result = match key {
        "listeners.ssl" => match value {
            "none" => {
                config.listen = None;
                Ok(())
            }
            _ => Err("expected 'none' (or use 'listeners.ssl.default = 5671')".to_owned()),
        },
        "listeners.ssl.default" => parse_listener(value)
            .map(|listen| config.listen = Some(listen))
            .ok_or_else(|| {
                "expected a port (5671) or an IP address and port (127.0.0.1:5671, :::5671)"
                    .to_owned()
            }),
        "ssl_options.cacertfile" => {
            config.cacertfile = Some(PathBuf::from(value));
            Ok(())
        }
        "ssl_options.certfile" => {
            config.certfile = Some(PathBuf::from(value));
            Ok(())
        }
        "ssl_options.keyfile" => {
            config.keyfile = Some(PathBuf::from(value));
            Ok(())
        }
        // rustls reads unencrypted keys only; refusing here says so before
        // the key file fails to parse with a vaguer message.
        "ssl_options.password" => Err(
            "encrypted private keys are not supported: decrypt the key file (e.g. `openssl pkey -in key.pem -out key-plain.pem`) and leave out ssl_options.password".to_owned(),
        ),
        "ssl_options.verify" => match value {
            "verify_none" => {
                config.verify = PeerVerification::VerifyNone;
                Ok(())
            }
            "verify_peer" => {
                config.verify = PeerVerification::VerifyPeer;
                Ok(())
            }
            _ => Err("expected `verify_peer` or `verify_none`".to_owned()),
        },
        "ssl_options.fail_if_no_peer_cert" => match value {
            "true" => {
                config.fail_if_no_peer_cert = true;
                Ok(())
            }
            "false" => {
                config.fail_if_no_peer_cert = false;
                Ok(())
            }
            _ => Err("expected `true` or `false`".to_owned()),
        },
        "ssl_cert_login_from" => match value {
            "distinguished_name" => {
                config.login_from = CertificateLoginFrom::DistinguishedName;
                Ok(())
            }
            "common_name" => {
                config.login_from = CertificateLoginFrom::CommonName;
                Ok(())
            }
            _ => Err(
                "expected `distinguished_name` or `common_name` (subject_alternative_name is not supported)"
                    .to_owned(),
            ),
        },
        _ => {
            let index = key.strip_prefix("ssl_options.versions.")?;
            return Some(apply_version(config, index, value));
        }
    };
    Some(result)
}

/// `ssl_options.versions.N = tlsv1.3`: the first such line replaces the
/// default set, as RabbitMQ's list does.
fn apply_version(config: &mut TlsConfig, index: &str, value: &str) -> Result<(), String> {
    let version = match value {
        "tlsv1.3" => TlsVersion::Tls13,
        "tlsv1.2" => TlsVersion::Tls12,
        "tlsv1.1" | "tlsv1" => TlsVersion::Obsolete(value.to_owned()),
        _ => return Err("expected `tlsv1.3` or `tlsv1.2`".to_owned()),
    };
    config
        .versions
        .get_or_insert_with(BTreeMap::new)
        .insert(index.to_owned(), version);
    Ok(())
}

impl TlsConfig {
    /// The versions to offer: those listed, else TLS 1.2 and 1.3.
    pub fn enabled_versions(&self) -> Vec<TlsVersion> {
        match &self.versions {
            Some(listed) => listed.values().cloned().collect(),
            None => vec![TlsVersion::Tls13, TlsVersion::Tls12],
        }
    }

    /// Settings accepted but without effect, for the log.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        for version in self.enabled_versions() {
            if let TlsVersion::Obsolete(name) = version {
                warnings.push(format!(
                    "ssl_options.versions: {name} is not offered; Sluice speaks TLS 1.2 and 1.3 only"
                ));
            }
        }
        if self.listen.is_some()
            && self.fail_if_no_peer_cert
            && self.verify == PeerVerification::VerifyNone
        {
            warnings.push(
                "ssl_options.fail_if_no_peer_cert = true does nothing with ssl_options.verify = verify_none: no client certificate is asked for".to_owned(),
            );
        }
        warnings
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Config::default()).map_err(|error| error.to_string())
    }

    #[test]
    fn tls_config_keys_as_rabbitmq_writes_them() {
        let config = parse(
            "listeners.ssl.default = 127.0.0.1:5671
ssl_options.cacertfile = /etc/sluice/ca.pem
ssl_options.certfile = /etc/sluice/server.pem
ssl_options.keyfile = /etc/sluice/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = true
ssl_options.versions.1 = tlsv1.3
ssl_cert_login_from = common_name",
        )
        .unwrap();
        let tls = &config.tls;
        assert_eq!(tls.listen, Some("127.0.0.1:5671".parse().unwrap()));
        assert_eq!(tls.certfile, Some(PathBuf::from("/etc/sluice/server.pem")));
        assert_eq!(tls.verify, PeerVerification::VerifyPeer);
        assert!(tls.fail_if_no_peer_cert);
        assert_eq!(tls.enabled_versions(), vec![TlsVersion::Tls13]);
        assert_eq!(tls.login_from, CertificateLoginFrom::CommonName);
        assert!(config.warnings().is_empty(), "{:?}", config.warnings());
    }

    #[test]
    fn tls_config_defaults_are_rabbitmq_defaults() {
        let tls = parse("").unwrap().tls;
        assert_eq!(tls.listen, None);
        assert_eq!(tls.verify, PeerVerification::VerifyNone);
        assert!(!tls.fail_if_no_peer_cert);
        assert_eq!(
            tls.enabled_versions(),
            vec![TlsVersion::Tls13, TlsVersion::Tls12]
        );
        assert_eq!(tls.login_from, CertificateLoginFrom::DistinguishedName);
        let port_only = parse("listeners.ssl.default = 5671").unwrap().tls;
        assert_eq!(port_only.listen, Some("0.0.0.0:5671".parse().unwrap()));
        assert_eq!(
            parse("listeners.ssl.default = 5671\nlisteners.ssl = none")
                .unwrap()
                .tls
                .listen,
            None
        );
    }

    #[test]
    fn tls_config_mistakes_name_the_line() {
        assert!(parse("ssl_options.verify = yes")
            .unwrap_err()
            .starts_with("line 1: invalid value 'yes' for 'ssl_options.verify'"));
        assert!(parse("ssl_options.versions.1 = sslv3")
            .unwrap_err()
            .contains("tlsv1.3"));
        assert!(parse("ssl_options.password = secret")
            .unwrap_err()
            .contains("encrypted private keys are not supported"));
        assert!(parse("listeners.ssl.other = 5671")
            .unwrap_err()
            .contains("did you mean 'listeners.ssl.default'"));
        assert!(parse("ssl_options.certfil = /x.pem")
            .unwrap_err()
            .contains("did you mean 'ssl_options.certfile'"));
    }

    #[test]
    fn tls_config_obsolete_versions_are_warned_about() {
        let config = parse(
            "listeners.ssl.default = 5671
ssl_options.versions.1 = tlsv1.2
ssl_options.versions.2 = tlsv1.1
ssl_options.honor_cipher_order = true",
        )
        .unwrap();
        let warnings = config.warnings();
        assert!(warnings.iter().any(|warning| warning.contains("tlsv1.1")));
        assert!(warnings
            .iter()
            .any(|warning| warning.starts_with("'ssl_options.honor_cipher_order'")));
    }
}
