//! A client's byte stream, plain TCP or TLS, as the two halves a connection
//! uses: its reader task reads one, its writer task writes the other.
//!
//! The halves are boxed trait objects rather than a type parameter on every
//! connection type: one allocation per connection and one indirect call per
//! socket read or write (each of which is a syscall moving kilobytes), where
//! generics would compile the whole connection twice.

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::tls::CertificateLogin;

/// The half a connection reads frames from.
pub type ClientReadHalf = Box<dyn AsyncRead + Send + Unpin>;

/// The half a connection's writer task writes to. Writes must be followed
/// by a flush: a TLS stream holds records back until then.
pub type ClientWriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// An accepted client, ready for the AMQP handshake.
pub struct ClientStream {
    pub read_half: ClientReadHalf,
    pub write_half: ClientWriteHalf,
    /// On a TLS connection whose client presented a verified certificate:
    /// the user that certificate names, offered to SASL EXTERNAL.
    pub certificate_login: Option<CertificateLogin>,
    /// Whether the client came over TLS, for the log.
    pub tls: bool,
}

impl ClientStream {
    /// A plain TCP client. Its halves split without a lock between them.
    pub fn plain(stream: TcpStream) -> Self {
        let (read_half, write_half) = stream.into_split();
        ClientStream {
            read_half: Box::new(read_half),
            write_half: Box::new(write_half),
            certificate_login: None,
            tls: false,
        }
    }
}
