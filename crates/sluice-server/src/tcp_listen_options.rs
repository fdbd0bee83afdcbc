//! The `tcp_listen_options.*` keys: socket options of the AMQP listener, with RabbitMQ's
//! names and defaults (backlog 128, Nagle's algorithm off, no keepalive, the kernel's own
//! buffer sizes).
//!
//! Buffer sizes and keepalive are set on the listening socket, before `listen`, and every
//! accepted connection inherits them (`nodelay` is set per connection, in `connection.rs`): a receive buffer has to be sized before the handshake,
//! because it decides the window scale TCP announces in it.
//!
//! Why set the buffers at all: the kernel grows each busy connection's buffers to megabytes
//! (`net.ipv4.tcp_rmem`, `tcp_wmem`), outside any budget the broker keeps. With hundreds of
//! publishers flooding a node, their receive buffers held about 1.3 GB before TCP's back
//! pressure reached the clients. `tcp_listen_options.recbuf = 65536` bounds that at 128 KiB a
//! connection (Linux doubles the value for its own bookkeeping), at the cost of throughput
//! on long, fast links.

use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

/// Socket options of the AMQP listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpListenOptions {
    /// Connections the kernel queues before the broker accepts them
    /// (`tcp_listen_options.backlog`); the kernel caps it at `net.core.somaxconn`.
    pub backlog: u32,
    /// Disable Nagle's algorithm on accepted connections (`tcp_listen_options.nodelay`).
    pub nodelay: bool,
    /// TCP keepalive probes on idle connections (`tcp_listen_options.keepalive`).
    pub keepalive: bool,
    /// SO_SNDBUF in bytes (`tcp_listen_options.sndbuf`); `None`: the kernel's autotuning.
    pub sndbuf: Option<u32>,
    /// SO_RCVBUF in bytes (`tcp_listen_options.recbuf`); `None`: the kernel's autotuning.
    pub recbuf: Option<u32>,
}

impl Default for TcpListenOptions {
    /// RabbitMQ's defaults.
    fn default() -> Self {
        TcpListenOptions {
            backlog: 128,
            nodelay: true,
            keepalive: false,
            sndbuf: None,
            recbuf: None,
        }
    }
}

/// Keys handled here, for the parser's typo suggestions.
pub const TCP_LISTEN_KEYS: &[&str] = &[
    "tcp_listen_options.backlog",
    "tcp_listen_options.nodelay",
    "tcp_listen_options.keepalive",
    "tcp_listen_options.sndbuf",
    "tcp_listen_options.recbuf",
];

/// Below this a buffer cannot hold one frame of the smallest `frame_max`.
const BUFFER_BYTES_MIN: u64 = 4096;
/// The kernel stores the doubled size in an `int`.
const BUFFER_BYTES_MAX: u64 = (i32::MAX / 2) as u64;
/// A queue of pending connections beyond this is a misconfiguration, not a need.
const BACKLOG_MAX: u64 = 65_535;

/// Applies one `tcp_listen_options.*` key. Returns None for a key that is not one of these,
/// or the reason the value is unusable.
pub fn apply(
    options: &mut TcpListenOptions,
    key: &str,
    value: &str,
    parse_bytes: impl Fn(&str) -> Option<u64>,
) -> Option<Result<(), String>> {
    let buffer = |value: &str| {
        parse_bytes(value)
            .filter(|bytes| (BUFFER_BYTES_MIN..=BUFFER_BYTES_MAX).contains(bytes))
            .map(|bytes| bytes as u32)
            .ok_or_else(|| {
                format!(
                    "expected a size from {BUFFER_BYTES_MIN} to {BUFFER_BYTES_MAX} bytes, e.g. 65536 or 128KiB"
                )
            })
    };
    let boolean = |value: &str| match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err("expected 'true' or 'false'".to_owned()),
    };
    let result = match key {
        "tcp_listen_options.backlog" => value
            .parse::<u64>()
            .ok()
            .filter(|backlog| (1..=BACKLOG_MAX).contains(backlog))
            .map(|backlog| options.backlog = backlog as u32)
            .ok_or_else(|| format!("expected a number of connections from 1 to {BACKLOG_MAX}")),
        "tcp_listen_options.nodelay" => boolean(value).map(|on| options.nodelay = on),
        "tcp_listen_options.keepalive" => boolean(value).map(|on| options.keepalive = on),
        "tcp_listen_options.sndbuf" => buffer(value).map(|bytes| options.sndbuf = Some(bytes)),
        "tcp_listen_options.recbuf" => buffer(value).map(|bytes| options.recbuf = Some(bytes)),
        _ => return None,
    };
    Some(result)
}

/// Binds a listener on `address` with `options`.
///
/// # Errors
/// The socket calls' errors: the address is taken, not local, or the options are refused.
pub fn bind(address: SocketAddr, options: &TcpListenOptions) -> io::Result<TcpListener> {
    let socket = if address.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As tokio's own `TcpListener::bind`: a restarted node must not wait out TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.set_keepalive(options.keepalive)?;
    if let Some(bytes) = options.sndbuf {
        socket.set_send_buffer_size(bytes)?;
    }
    if let Some(bytes) = options.recbuf {
        socket.set_recv_buffer_size(bytes)?;
    }
    socket.bind(address)?;
    socket.listen(options.backlog)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(text: &str) -> Option<u64> {
        text.parse().ok()
    }

    #[test]
    fn keys_take_rabbitmq_values_and_refuse_others() {
        let mut options = TcpListenOptions::default();
        for (key, value) in [
            ("tcp_listen_options.backlog", "4096"),
            ("tcp_listen_options.nodelay", "false"),
            ("tcp_listen_options.keepalive", "true"),
            ("tcp_listen_options.sndbuf", "196608"),
            ("tcp_listen_options.recbuf", "65536"),
        ] {
            apply(&mut options, key, value, bytes).unwrap().unwrap();
        }
        assert_eq!(
            options,
            TcpListenOptions {
                backlog: 4096,
                nodelay: false,
                keepalive: true,
                sndbuf: Some(196_608),
                recbuf: Some(65_536),
            }
        );
        let refused = |key, value| {
            apply(&mut TcpListenOptions::default(), key, value, bytes)
                .unwrap()
                .unwrap_err()
        };
        assert!(refused("tcp_listen_options.recbuf", "100").contains("from 4096"));
        assert!(refused("tcp_listen_options.backlog", "0").contains("from 1 to"));
        assert!(refused("tcp_listen_options.nodelay", "yes").contains("'true' or 'false'"));
        assert!(apply(&mut options, "tcp_listen_options.linger", "true", bytes).is_none());
    }

    #[tokio::test]
    async fn accepted_connections_inherit_the_listener_options() {
        let options = TcpListenOptions {
            keepalive: true,
            sndbuf: Some(32_768),
            recbuf: Some(65_536),
            ..TcpListenOptions::default()
        };
        let listener = bind("127.0.0.1:0".parse().unwrap(), &options).unwrap();
        let address = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(address).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let socket = TcpSocket::from_std_stream(accepted.into_std().unwrap());
        assert!(socket.keepalive().unwrap());
        // Linux doubles what it is asked for; other kernels store it as given.
        let sent = socket.send_buffer_size().unwrap();
        let received = socket.recv_buffer_size().unwrap();
        assert!((32_768..=65_536).contains(&sent), "SO_SNDBUF {sent}");
        assert!(
            (65_536..=131_072).contains(&received),
            "SO_RCVBUF {received}"
        );
    }
}
