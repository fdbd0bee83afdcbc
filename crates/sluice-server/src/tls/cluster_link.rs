//! TLS between the nodes of a cluster (`cluster_link.ssl = true`): every
//! node presents its certificate (`cluster_link.ssl_options.certfile` and
//! `.keyfile`) and accepts only peers whose certificate the cluster's
//! authority (`.cacertfile`) signed, in both directions.
//!
//! The name in a peer's certificate is not checked against the address
//! dialled: nodes are named by the cluster's configuration, and the cookie
//! handshake that runs inside the TLS stream proves which member a peer is.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme,
};
use sluice_cluster::link::LinkTls;

use super::listener::{read_authorities, read_certificates, read_key, FileKeys, TlsSetupError};
use crate::cluster_config::LinkTlsConfig;

const LINK_KEYS: FileKeys = FileKeys {
    certfile: "cluster_link.ssl_options.certfile",
    keyfile: "cluster_link.ssl_options.keyfile",
    cacertfile: "cluster_link.ssl_options.cacertfile",
};

/// The link's TLS sides, or None when `cluster_link.ssl` is off.
///
/// # Errors
/// A file missing, unreadable or without PEM in it, or a key that does not
/// match the certificate, naming the key and the file.
pub fn link_tls<'a>(config: &'a LinkTlsConfig) -> Result<Option<LinkTls>, TlsSetupError> {
    if !config.enabled {
        return Ok(None);
    }
    let required = |path: &'a Option<std::path::PathBuf>, key| {
        path.as_deref().ok_or(TlsSetupError::MissingForLink { key })
    };
    let certfile = required(&config.certfile, LINK_KEYS.certfile)?;
    let keyfile = required(&config.keyfile, LINK_KEYS.keyfile)?;
    let cacertfile = required(&config.cacertfile, LINK_KEYS.cacertfile)?;
    let chain = read_certificates(LINK_KEYS.certfile, certfile)?;
    let key = read_key(LINK_KEYS.keyfile, keyfile)?;
    let roots = read_authorities(LINK_KEYS.cacertfile, cacertfile)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let authority_error = |error: rustls::Error| TlsSetupError::Authorities {
        key: LINK_KEYS.cacertfile,
        path: cacertfile.to_owned(),
        reason: error.to_string(),
    };
    let key_error = |error: rustls::Error| match error {
        rustls::Error::InconsistentKeys(_) => TlsSetupError::KeyMismatch {
            keys: LINK_KEYS,
            keyfile: keyfile.to_owned(),
            certfile: certfile.to_owned(),
        },
        other => TlsSetupError::Key {
            key: LINK_KEYS.keyfile,
            path: keyfile.to_owned(),
            reason: other.to_string(),
        },
    };
    let client_verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
            .build()
            .map_err(|error| authority_error(rustls::Error::General(error.to_string())))?;
    let server = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default versions")
        .with_client_cert_verifier(client_verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(key_error)?;
    let server_verifier = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
        .build()
        .map_err(|error| authority_error(rustls::Error::General(error.to_string())))?;
    let client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SignedByClusterAuthority(server_verifier)))
        .with_client_auth_cert(chain, key)
        .map_err(key_error)?;
    Ok(Some(LinkTls::new(Arc::new(server), Arc::new(client))))
}

/// WebPKI's verification of the peer's chain to the cluster's authority,
/// without the check of the name in it (see the module's note).
#[derive(Debug)]
struct SignedByClusterAuthority(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for SignedByClusterAuthority {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // WebPKI checks the chain first; a name mismatch is reported only
        // for a chain that verified.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .verify_tls12_signature(message, certificate, signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .verify_tls13_signature(message, certificate, signature)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
