//! TLS on the inter-node link (`cluster_link.ssl`). Both ends present a
//! certificate signed by the cluster's authority and check the other's;
//! the cookie handshake then runs inside the encrypted stream, so a node
//! must hold both the cluster's secret and one of its certificates.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// A link's byte stream: plain TCP, or TLS over it.
pub trait LinkIo: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> LinkIo for T {}

pub type LinkStream = Pin<Box<dyn LinkIo>>;

/// The two rustls sides a node's links use: the one it accepts with and
/// the one it dials with.
#[derive(Clone)]
pub struct LinkTls {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

impl std::fmt::Debug for LinkTls {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("LinkTls")
    }
}

impl LinkTls {
    /// `server` must require client certificates, and `client` must
    /// present one: either end refuses a node without.
    pub fn new(server: Arc<ServerConfig>, client: Arc<ClientConfig>) -> Self {
        Self {
            acceptor: TlsAcceptor::from(server),
            connector: TlsConnector::from(client),
        }
    }

    pub async fn accept(&self, stream: TcpStream) -> std::io::Result<LinkStream> {
        Ok(Box::pin(self.acceptor.accept(stream).await?))
    }

    /// Dials over `stream` to the node at `host`. The name a certificate
    /// carries is not what is checked (nodes are named by the cluster's
    /// configuration, and the cookie handshake that follows names them);
    /// the verifier the caller built checks the chain to the authority.
    pub async fn connect(&self, host: &str, stream: TcpStream) -> std::io::Result<LinkStream> {
        let name = match host.trim_matches(['[', ']']).parse::<IpAddr>() {
            Ok(address) => ServerName::IpAddress(address.into()),
            Err(_) => ServerName::try_from(host.to_owned())
                .unwrap_or_else(|_| ServerName::try_from("sluice-node").expect("a valid DNS name")),
        };
        Ok(Box::pin(self.connector.connect(name, stream).await?))
    }
}

/// A link's socket, plain or under TLS.
pub enum Linked {
    Plain(TcpStream),
    Tls(LinkStream),
}

/// A link's two halves, for its reader and its writer.
pub type LinkHalves = (
    Box<dyn AsyncRead + Send + Unpin>,
    Box<dyn AsyncWrite + Send + Unpin>,
);

impl Linked {
    /// The stream the handshake runs over.
    pub fn io(&mut self) -> &mut dyn LinkIo {
        match self {
            Self::Plain(stream) => stream,
            Self::Tls(stream) => &mut **stream,
        }
    }

    /// Plain TCP splits into owned halves, without the lock that the
    /// halves of a shared stream (TLS's) take on every read and write.
    pub fn into_halves(self) -> LinkHalves {
        match self {
            Self::Plain(stream) => {
                let (read, write) = stream.into_split();
                (Box::new(read), Box::new(write))
            }
            Self::Tls(stream) => {
                let (read, write) = tokio::io::split(stream);
                (Box::new(read), Box::new(write))
            }
        }
    }
}
