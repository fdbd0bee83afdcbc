//! The HTTP endpoints' listeners (management API, Prometheus): their
//! `<prefix>.tcp.port` and `<prefix>.tcp.ip` keys, binding them, and the
//! bound on the connections each serves at once ([`LimitedListener`]).
//!
//! RabbitMQ's plugins listen on fixed default ports (15672, 15692). Several
//! Sluice nodes, or a RabbitMQ, on one machine would fight over them, so a
//! default port in use is logged and that endpoint stays off; a port that
//! was configured and cannot be had stops the start.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connections one HTTP listener serves at once. Each holds a file
/// descriptor (which AMQP connections need too) and a task, and nothing
/// else bounds them: a burst of scrapers or browser tabs, or a client that
/// opens connections and sends nothing, would otherwise take descriptors
/// until the node could accept no AMQP connection either. The management
/// UI and tools use a few connections each, so this leaves them room.
pub const HTTP_CONNECTIONS_MAX: usize = 256;

/// How long a connection may send and receive nothing before it is closed
/// (cowboy's `idle_timeout` in RabbitMQ, 60 s): a client that opens
/// connections and sends nothing gives its slots back instead of holding
/// the listener shut, and a browser's kept-alive connection is let go.
pub const HTTP_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

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

/// A listener that serves at most `connections_max` connections at once.
///
/// Past the bound it stops accepting until a served connection closes: the
/// further connections wait in the kernel's accept queue (and, once that is
/// full, the clients' connects wait) and are served in turn. Waiting is
/// back pressure a client already copes with, as a slow answer; closing
/// them at once would turn a busy moment into failed scrapes and UI pages.
pub struct LimitedListener {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    idle_timeout: Duration,
}

impl LimitedListener {
    /// # Panics
    /// If `connections_max` is 0 (no connection would ever be served) or
    /// above the semaphore's bound.
    pub fn new(listener: TcpListener, connections_max: usize) -> Self {
        assert!(connections_max > 0 && connections_max <= Semaphore::MAX_PERMITS);
        LimitedListener {
            listener,
            slots: Arc::new(Semaphore::new(connections_max)),
            idle_timeout: HTTP_IDLE_TIMEOUT,
        }
    }

    /// With connections closed after `idle_timeout` without traffic
    /// instead of [`HTTP_IDLE_TIMEOUT`].
    #[must_use]
    pub fn with_idle_timeout(mut self, idle_timeout: Duration) -> Self {
        self.idle_timeout = idle_timeout;
        self
    }
}

impl axum::serve::Listener for LimitedListener {
    type Io = LimitedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let slot = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let (stream, address) = axum::serve::Listener::accept(&mut self.listener).await;
        (
            LimitedStream {
                stream,
                idle: Box::pin(tokio::time::sleep(self.idle_timeout)),
                idle_timeout: self.idle_timeout,
                _slot: slot,
            },
            address,
        )
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// A served connection: its slot is given back when it is dropped, at the
/// latest once it has been idle for its listener's idle timeout.
pub struct LimitedStream {
    stream: TcpStream,
    /// Set again on every read or write that moves bytes.
    idle: Pin<Box<tokio::time::Sleep>>,
    idle_timeout: Duration,
    _slot: OwnedSemaphorePermit,
}

impl LimitedStream {
    /// What a read or write that is not ready yet returns: still pending,
    /// or an error once the connection was idle too long (the server then
    /// closes it).
    fn pending_or_idle<T>(&mut self, context: &mut Context<'_>) -> Poll<io::Result<T>> {
        match self.idle.as_mut().poll(context) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "HTTP connection idle for too long",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// A read or write's outcome: one that moved bytes sets the idle
    /// deadline again; one not ready yet may have met it.
    fn idle_checked<T>(
        &mut self,
        context: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_pending() {
            return self.pending_or_idle(context);
        }
        let deadline = tokio::time::Instant::now() + self.idle_timeout;
        self.idle.as_mut().reset(deadline);
        polled
    }
}

impl AsyncRead for LimitedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_read(context, buffer);
        self.idle_checked(context, polled)
    }
}

impl AsyncWrite for LimitedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(context, buffer);
        self.idle_checked(context, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(context, buffers);
        self.idle_checked(context, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(context)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::serve::Listener;
    use futures_util::FutureExt;

    #[tokio::test]
    async fn a_connection_past_the_bound_waits_until_a_served_one_closes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut limited = LimitedListener::new(listener, 2);
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(TcpStream::connect(address).await.unwrap());
        }
        let (first, _) = limited.accept().await;
        let (_second, _) = limited.accept().await;
        let mut third = Box::pin(limited.accept());
        assert!(
            third.as_mut().now_or_never().is_none(),
            "a third connection is not taken while two are served"
        );
        drop(first);
        let (_third, from) = third.await;
        assert_eq!(from, clients[2].local_addr().unwrap());
    }

    #[tokio::test]
    async fn an_idle_connection_is_closed_and_gives_its_slot_back() {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut limited =
            LimitedListener::new(listener, 1).with_idle_timeout(Duration::from_millis(200));
        let _idle_client = TcpStream::connect(address).await.unwrap();
        let mut waiting_client = TcpStream::connect(address).await.unwrap();
        let (mut idle, _) = limited.accept().await;
        // The server's read of the idle client fails once it was idle for
        // the timeout, and the connection is dropped with its slot.
        let mut buffer = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buffer))
            .await
            .expect("the idle timeout ends the read");
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::TimedOut);
        drop(idle);
        let (mut second, _) = tokio::time::timeout(Duration::from_secs(5), limited.accept())
            .await
            .expect("the slot is free again");
        // Traffic keeps a connection: a byte every 100 ms outlives the 200 ms
        // timeout.
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            tokio::io::AsyncWriteExt::write_all(&mut waiting_client, b"x")
                .await
                .unwrap();
            assert_eq!(second.read(&mut buffer).await.unwrap(), 1);
        }
    }

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
