//! Declaring what a run needs, as PerfTest does: the exchange (unless it is the default
//! exchange or a predefined `amq.*` one), the named queues with their bindings, or, without
//! named queues, one server-named queue per consumer (see [`crate::consumer`]). Queues are
//! durable when messages are persistent, auto-delete unless told otherwise.

use async_compat::Compat;
use lapin::options::{
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::tcp::AsyncTcpStream;
use lapin::types::{AMQPValue, FieldTable};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::net::{TcpSocket, TcpStream};

use crate::workload::{QueueArgument, Workload};
use crate::PerfError;

/// How each connection is set up, from the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionOptions {
    /// Proposed `frame_max`, unless the URI sets `?frame_max=`; 0 takes the broker's.
    pub frame_max: u32,
    /// SO_SNDBUF and SO_RCVBUF; 0 leaves them to the kernel.
    pub send_buffer: u32,
    pub receive_buffer: u32,
}

/// Opens a connection named `name` (the broker shows it in its connection list).
///
/// **Frame size.** lapin gives every connection a receive and a send buffer of 32 frames
/// each, filled with zeroes, at the negotiated frame size: at RabbitMQ's and Sluice's 128 KiB
/// that is 8 MiB a connection, 1.6 GB for 100 producers and 100 consumers. A frame that fits
/// the message keeps both the memory and the zeroing in proportion.
///
/// **Socket buffers.** PerfTest sets SO_SNDBUF and SO_RCVBUF to 64 KiB. Left to the kernel,
/// a publisher's send buffer grows to 4 MiB, so a publisher without confirms that outruns
/// its broker keeps megabytes in the kernel, and the time its messages wait there counts as
/// latency: one unthrottled publisher against Sluice measured a p50 of 60–75 ms with
/// autotuned buffers and 27–33 ms with PerfTest's. So `sluice perf` sets them as PerfTest
/// does, on its own socket; lapin's connector takes that socket in place of one it would open.
///
/// # Errors
/// [`PerfError::Amqp`] if the broker cannot be reached or refuses the login, or
/// [`PerfError::Args`] if the URI does not parse.
pub async fn connect(
    uri: &str,
    options: ConnectionOptions,
    name: &str,
) -> Result<Connection, PerfError> {
    let mut parsed: AMQPUri = uri
        .parse()
        .map_err(|err| PerfError::Args(format!("--uri {}: {err}", redact(uri))))?;
    if parsed.query.frame_max.is_none() && options.frame_max > 0 {
        parsed.query.frame_max = Some(options.frame_max);
    }
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    let connecting = if parsed.scheme == AMQPScheme::AMQP {
        let runtime = lapin::runtime::default_runtime()
            .map_err(PerfError::amqp("starting lapin's runtime"))?;
        Connection::connector(
            parsed,
            runtime,
            async move |uri: AMQPUri, _| {
                Ok(AsyncTcpStream::Plain(open_socket(&uri, options).await?))
            },
            properties,
        )
        .await
    } else {
        // TLS: lapin's own socket, with the kernel's buffer sizes.
        Connection::connect_uri(parsed, properties).await
    };
    connecting.map_err(PerfError::amqp(format!("connecting to {}", redact(uri))))
}

/// Connects a TCP socket to the URI's host with the options' buffer sizes and Nagle's
/// algorithm off, trying each address the host resolves to.
async fn open_socket(
    uri: &AMQPUri,
    options: ConnectionOptions,
) -> std::io::Result<Compat<TcpStream>> {
    let host = (uri.authority.host.as_str(), uri.authority.port);
    let mut last_error = None;
    for address in tokio::net::lookup_host(host).await? {
        let socket = if address.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        if options.send_buffer > 0 {
            socket.set_send_buffer_size(options.send_buffer)?;
        }
        if options.receive_buffer > 0 {
            socket.set_recv_buffer_size(options.receive_buffer)?;
        }
        match socket.connect(address).await {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                return Ok(Compat::new(stream));
            }
            Err(err) => last_error = Some(err),
        }
    }
    Err(last_error.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{} resolves to no address", uri.authority.host),
        )
    }))
}

/// The URI without its password, for messages.
pub fn redact(uri: &str) -> String {
    match (uri.find("://"), uri.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &uri[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &uri[..scheme + 3], &uri[at..]),
                None => uri.to_owned(),
            }
        }
        _ => uri.to_owned(),
    }
}

fn exchange_kind(name: &str) -> ExchangeKind {
    match name {
        "direct" => ExchangeKind::Direct,
        "fanout" => ExchangeKind::Fanout,
        "topic" => ExchangeKind::Topic,
        "headers" => ExchangeKind::Headers,
        other => ExchangeKind::Custom(other.to_owned()),
    }
}

fn queue_arguments(workload: &Workload) -> FieldTable {
    let mut table = FieldTable::default();
    for argument in workload.queue_arguments() {
        match argument {
            QueueArgument::Int(key, value) => {
                table.insert(key.into(), AMQPValue::LongLongInt(value));
            }
            QueueArgument::Text(key, value) => {
                table.insert(key.into(), AMQPValue::LongString(value.into()));
            }
        }
    }
    table
}

/// Declares a queue (`""` for a server-named one) and returns its name.
///
/// # Errors
/// [`PerfError::Amqp`] if the broker refuses the declaration.
pub async fn declare_queue(
    channel: &Channel,
    workload: &Workload,
    name: &str,
) -> Result<String, PerfError> {
    let queue = channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable: workload.durable_queues(),
                auto_delete: workload.auto_delete_queues(),
                ..QueueDeclareOptions::default()
            },
            queue_arguments(workload),
        )
        .await
        .map_err(PerfError::amqp(format!("queue.declare '{name}'")))?;
    Ok(queue.name().to_string())
}

/// Declares the exchange and the named queues and binds them, the `k`-th queue through
/// connection `k` modulo their number (one per URI: on a cluster whose queues are placed
/// where they are declared, the queues spread over the nodes). With `--predeclared`, a
/// queue that exists already is used as it is, whatever it was declared with, as PerfTest's
/// `-p` does; one that does not is declared.
///
/// # Errors
/// [`PerfError::Amqp`] if the broker refuses a declaration.
pub async fn declare(connections: &[Connection], workload: &Workload) -> Result<(), PerfError> {
    async fn open(connection: &Connection) -> Result<Channel, PerfError> {
        connection
            .create_channel()
            .await
            .map_err(PerfError::amqp("opening the setup channel"))
    }
    let mut channels = Vec::with_capacity(connections.len());
    for connection in connections {
        channels.push(open(connection).await?);
    }
    let exchange = workload.exchange.as_str();
    let predefined = exchange.is_empty() || exchange.starts_with("amq.");
    if !predefined {
        channels[0]
            .exchange_declare(
                exchange.into(),
                exchange_kind(&workload.exchange_type),
                // Durable, as PerfTest declares it: the two can then share a broker.
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(PerfError::amqp(format!("exchange.declare '{exchange}'")))?;
    }
    for (index, name) in workload.queue_names().into_iter().enumerate() {
        let through = index % connections.len();
        let channel = &mut channels[through];
        let exists = workload.predeclared
            && channel
                .queue_declare(
                    name.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .is_ok();
        if !exists {
            if workload.predeclared {
                // The failed passive declare closed the channel.
                *channel = open(&connections[through]).await?;
            }
            declare_queue(channel, workload, &name).await?;
        }
        if !exchange.is_empty() {
            channel
                .queue_bind(
                    name.as_str().into(),
                    exchange.into(),
                    workload.binding_key(&name).into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(PerfError::amqp(format!("queue.bind '{name}'")))?;
        }
    }
    for channel in channels {
        let _ = channel.close(200, "OK".into()).await;
    }
    Ok(())
}

/// Deletes the named queues (between the runs of a sweep, so that one run's backlog does
/// not become the next one's latency).
///
/// # Errors
/// [`PerfError::Amqp`] if a deletion fails for another reason than the queue being gone.
pub async fn delete_queues(connection: &Connection, workload: &Workload) -> Result<(), PerfError> {
    for name in workload.queue_names() {
        // A fresh channel each time: deleting an auto-deleted queue closes the channel
        // with 404 on some brokers.
        let channel = connection
            .create_channel()
            .await
            .map_err(PerfError::amqp("opening a channel"))?;
        if channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await
            .is_ok()
        {
            let _ = channel.close(200, "OK".into()).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_redacts_the_password() {
        assert_eq!(
            redact("amqp://guest:secret@host:5672/%2f"),
            "amqp://guest:***@host:5672/%2f"
        );
        assert_eq!(redact("amqp://localhost"), "amqp://localhost");
    }

    #[tokio::test]
    async fn sockets_get_the_asked_buffer_sizes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let uri: AMQPUri = format!("amqp://localhost:{port}").parse().unwrap();
        let options = ConnectionOptions {
            frame_max: 0,
            send_buffer: 65_536,
            receive_buffer: 32_768,
        };
        let stream = open_socket(&uri, options).await.unwrap().into_inner();
        assert!(stream.nodelay().unwrap());
        let socket = TcpSocket::from_std_stream(stream.into_std().unwrap());
        // Linux doubles what it is asked for, to leave room for its own bookkeeping.
        let sent = socket.send_buffer_size().unwrap();
        let received = socket.recv_buffer_size().unwrap();
        assert!((65_536..=131_072).contains(&sent), "SO_SNDBUF {sent}");
        assert!(
            (32_768..=65_536).contains(&received),
            "SO_RCVBUF {received}"
        );
    }
}
