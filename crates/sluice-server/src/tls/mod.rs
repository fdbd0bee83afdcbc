//! TLS for AMQP client connections (amqps), as RabbitMQ configures it.
//!
//! - [`config`]: the `listeners.ssl.default`, `ssl_options.*` and
//!   `ssl_cert_login_from` keys.
//! - [`listener`]: the rustls server set up from those files, and each
//!   connection's TLS handshake, run in the connection's own task.
//! - [`certificate_login`]: the user a verified client certificate names,
//!   for SASL EXTERNAL.
//! - [`cluster_link`]: TLS between the nodes of a cluster.

pub mod certificate_login;
pub mod cluster_link;
pub mod config;
pub mod listener;

pub use certificate_login::CertificateLogin;
pub use cluster_link::link_tls;
pub use config::{CertificateLoginFrom, PeerVerification, TlsConfig, TlsVersion};
pub use listener::{TlsListener, TlsSetupError};
