//! The TLS side of the amqps listener: a rustls server set up once from the
//! `ssl_options.*` files, and the handshake of each accepted connection.
//!
//! The handshake runs in the connection's own task under
//! `handshake_timeout`, never in the accept loop: a client that stalls
//! mid-handshake holds only its own task.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, SupportedProtocolVersion};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::certificate_login::CertificateLogin;
use super::config::{CertificateLoginFrom, PeerVerification, TlsConfig, TlsVersion};
use crate::client_stream::ClientStream;

/// Why the TLS listener cannot be set up. Each names the key, and the file
/// when there is one.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("listeners.ssl.default is set but {key} is not: the TLS listener needs it")]
    Missing { key: &'static str },
    #[error("cluster_link.ssl is true but {key} is not: TLS between the nodes needs it")]
    MissingForLink { key: &'static str },
    #[error("{key}: cannot read {}", path.display())]
    Read {
        key: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{key}: {} holds no {what} in PEM form ({reason})", path.display())]
    Pem {
        key: &'static str,
        path: PathBuf,
        what: &'static str,
        reason: String,
    },
    #[error("{}: the key in {} does not match the certificate in {} ({})", keys.keyfile, keyfile.display(), certfile.display(), keys.certfile)]
    KeyMismatch {
        keys: FileKeys,
        keyfile: PathBuf,
        certfile: PathBuf,
    },
    #[error("{key}: {}: {reason}", path.display())]
    Key {
        key: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{key}: {}: {reason}", path.display())]
    Authorities {
        key: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("ssl_options.versions names no version Sluice speaks (tlsv1.3, tlsv1.2)")]
    NoVersions,
}

/// What the amqps listener needs for each connection it accepts.
#[derive(Clone)]
pub struct TlsListener {
    acceptor: TlsAcceptor,
    login_from: CertificateLoginFrom,
    handshake_timeout: Duration,
}

impl TlsListener {
    /// Reads the certificate, key and authorities `config` names and sets up
    /// the rustls server.
    ///
    /// # Errors
    /// A file missing, unreadable or without PEM in it, a key that does not
    /// match the certificate, `verify_peer` without authorities, or no TLS
    /// version left to offer.
    pub fn new(config: &TlsConfig, handshake_timeout: Duration) -> Result<Self, TlsSetupError> {
        let certfile = required(&config.certfile, "ssl_options.certfile")?;
        let keyfile = required(&config.keyfile, "ssl_options.keyfile")?;
        let chain = read_certificates("ssl_options.certfile", certfile)?;
        let key = read_key(CLIENT_KEYS.keyfile, keyfile)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&protocol_versions(config)?)
            .expect("the ring provider supports TLS 1.2 and 1.3");
        let builder = match config.verify {
            PeerVerification::VerifyNone => builder.with_no_client_auth(),
            PeerVerification::VerifyPeer => {
                let cacertfile = required(&config.cacertfile, "ssl_options.cacertfile")?;
                let roots = read_authorities(CLIENT_KEYS.cacertfile, cacertfile)?;
                let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
                let verifier = if config.fail_if_no_peer_cert {
                    verifier
                } else {
                    verifier.allow_unauthenticated()
                };
                let verifier = verifier
                    .build()
                    .map_err(|error| TlsSetupError::Authorities {
                        key: CLIENT_KEYS.cacertfile,
                        path: cacertfile.to_owned(),
                        reason: error.to_string(),
                    })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let server = builder
            .with_single_cert(chain, key)
            .map_err(|error| match error {
                rustls::Error::InconsistentKeys(_) => TlsSetupError::KeyMismatch {
                    keys: CLIENT_KEYS,
                    keyfile: keyfile.to_owned(),
                    certfile: certfile.to_owned(),
                },
                other => TlsSetupError::Key {
                    key: CLIENT_KEYS.keyfile,
                    path: keyfile.to_owned(),
                    reason: other.to_string(),
                },
            })?;
        Ok(TlsListener {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            login_from: config.login_from,
            handshake_timeout,
        })
    }

    /// Runs the TLS handshake on an accepted socket. None when it failed,
    /// took longer than `handshake_timeout`, or the node began to stop: the
    /// socket is closed and the reason logged.
    pub async fn accept(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Option<ClientStream> {
        let tls = tokio::select! {
            handshake = self.acceptor.accept(stream) => match handshake {
                Ok(tls) => tls,
                Err(error) => {
                    // A plain AMQP client on this port ends here too.
                    tracing::info!(%peer, %error, "TLS handshake failed");
                    return None;
                }
            },
            () = tokio::time::sleep(self.handshake_timeout) => {
                tracing::info!(%peer, timeout_ms = self.handshake_timeout.as_millis() as u64, "TLS handshake not done within handshake_timeout: connection dropped");
                return None;
            }
            _ = shutdown.wait_for(|stopping| *stopping) => return None,
        };
        let (_, session) = tls.get_ref();
        // Present only when the verifier accepted it: with verify_none no
        // certificate is asked for.
        let certificate_login = session
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|certificate| CertificateLogin::from_certificate(certificate, self.login_from));
        tracing::debug!(%peer, version = ?session.protocol_version(), cipher_suite = ?session.negotiated_cipher_suite().map(|suite| suite.suite()), certificate = ?certificate_login, "TLS handshake done");
        let (read_half, write_half) = tokio::io::split(tls);
        Some(ClientStream {
            read_half: Box::new(read_half),
            write_half: Box::new(write_half),
            certificate_login,
            tls: true,
        })
    }
}

/// The configuration keys naming a TLS side's files, for its errors.
#[derive(Clone, Copy, Debug)]
pub struct FileKeys {
    pub certfile: &'static str,
    pub keyfile: &'static str,
    pub cacertfile: &'static str,
}

/// The amqps listener's.
const CLIENT_KEYS: FileKeys = FileKeys {
    certfile: "ssl_options.certfile",
    keyfile: "ssl_options.keyfile",
    cacertfile: "ssl_options.cacertfile",
};

pub(super) fn required<'a>(
    path: &'a Option<PathBuf>,
    key: &'static str,
) -> Result<&'a Path, TlsSetupError> {
    path.as_deref().ok_or(TlsSetupError::Missing { key })
}

pub(super) fn read_file(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsSetupError> {
    std::fs::read(path).map_err(|source| TlsSetupError::Read {
        key,
        path: path.to_owned(),
        source,
    })
}

pub(super) fn read_certificates(
    key: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let pem_error = |reason: String| TlsSetupError::Pem {
        key,
        path: path.to_owned(),
        what: "certificate",
        reason,
    };
    let bytes = read_file(key, path)?;
    let certificates = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| pem_error(error.to_string()))?;
    if certificates.is_empty() {
        return Err(pem_error("no CERTIFICATE section found".to_owned()));
    }
    Ok(certificates)
}

/// The private key of the file `key` names.
pub(super) fn read_key(
    key: &'static str,
    path: &Path,
) -> Result<PrivateKeyDer<'static>, TlsSetupError> {
    let bytes = read_file(key, path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|error| TlsSetupError::Pem {
        key,
        path: path.to_owned(),
        what: "private key",
        reason: error.to_string(),
    })
}

/// The authorities of the file `key` names.
pub(super) fn read_authorities(
    key: &'static str,
    path: &Path,
) -> Result<Arc<RootCertStore>, TlsSetupError> {
    let mut roots = RootCertStore::empty();
    for certificate in read_certificates(key, path)? {
        roots
            .add(certificate)
            .map_err(|error| TlsSetupError::Authorities {
                key,
                path: path.to_owned(),
                reason: error.to_string(),
            })?;
    }
    Ok(Arc::new(roots))
}

/// The versions to offer, newest first; RabbitMQ's older ones are warned
/// about (see [`TlsConfig::warnings`]) and left out.
fn protocol_versions(
    config: &TlsConfig,
) -> Result<Vec<&'static SupportedProtocolVersion>, TlsSetupError> {
    let enabled = config.enabled_versions();
    let mut versions = Vec::new();
    if enabled.contains(&TlsVersion::Tls13) {
        versions.push(&rustls::version::TLS13);
    }
    if enabled.contains(&TlsVersion::Tls12) {
        versions.push(&rustls::version::TLS12);
    }
    if versions.is_empty() {
        return Err(TlsSetupError::NoVersions);
    }
    Ok(versions)
}
