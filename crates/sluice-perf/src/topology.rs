//! Declaring what a run needs, as PerfTest does: the exchange (unless it is the default
//! exchange or a predefined `amq.*` one), the named queues with their bindings, or, without
//! named queues, one server-named queue per consumer (see [`crate::consumer`]). Queues are
//! durable when messages are persistent, auto-delete unless told otherwise.

use sluice_wire::amq_protocol::protocol::{channel, exchange, queue, AMQPClass};
use sluice_wire::amq_protocol::types::{AMQPValue, FieldTable};
use sluice_wire::amq_protocol::uri::AMQPUri;

use crate::client::{short_string, ClientConnection, ClientError, SocketOptions};
use crate::workload::{QueueArgument, Workload};
use crate::PerfError;

/// Opens a connection named `name` (the broker shows it in its connection list).
///
/// **Frame size.** A frame that fits the message is proposed (see
/// [`Workload::frame_max`]): the broker then never splits a body, and neither end keeps
/// buffers sized for 128 KiB frames per connection.
///
/// # Errors
/// [`PerfError::Amqp`] if the broker cannot be reached or refuses the login, or
/// [`PerfError::Args`] if the URI does not parse.
pub async fn connect(
    uri: &str,
    options: SocketOptions,
    name: &str,
) -> Result<ClientConnection, PerfError> {
    let parsed: AMQPUri = uri
        .parse()
        .map_err(|err| PerfError::Args(format!("--uri {}: {err}", redact(uri))))?;
    ClientConnection::open(&parsed, options, name)
        .await
        .map_err(PerfError::amqp(format!("connecting to {}", redact(uri))))
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

/// Declares a queue (`""` for a server-named one) on `channel` and returns its name.
///
/// # Errors
/// [`PerfError::Amqp`] if the broker refuses the declaration.
pub async fn declare_queue(
    connection: &mut ClientConnection,
    channel: u16,
    workload: &Workload,
    name: &str,
) -> Result<String, PerfError> {
    let declared = connection
        .call(
            channel,
            AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
                queue: short_string(name),
                passive: false,
                durable: workload.durable_queues(),
                exclusive: false,
                auto_delete: workload.auto_delete_queues(),
                nowait: false,
                arguments: queue_arguments(workload),
            })),
        )
        .await
        .map_err(PerfError::amqp(format!("queue.declare '{name}'")))?;
    match declared {
        AMQPClass::Queue(queue::AMQPMethod::DeclareOk(ok)) => Ok(ok.queue.to_string()),
        other => Err(unexpected_answer(format!("queue.declare '{name}'"), &other)),
    }
}

/// Binds `name` to `exchange` on `channel`.
///
/// # Errors
/// [`PerfError::Amqp`] if the broker refuses the binding.
pub async fn bind_queue(
    connection: &mut ClientConnection,
    channel: u16,
    name: &str,
    exchange: &str,
    key: &str,
) -> Result<(), PerfError> {
    connection
        .call(
            channel,
            AMQPClass::Queue(queue::AMQPMethod::Bind(queue::Bind {
                queue: short_string(name),
                exchange: short_string(exchange),
                routing_key: short_string(key),
                nowait: false,
                arguments: FieldTable::default(),
            })),
        )
        .await
        .map_err(PerfError::amqp(format!("queue.bind '{name}'")))?;
    Ok(())
}

/// Declares the exchange and the named queues and binds them, the `k`-th queue through
/// connection `k` modulo their number (one per URI: on a cluster whose queues are placed
/// where they are declared, the queues spread over the nodes). With `--predeclared`, a
/// queue that exists already is used as it is, whatever it was declared with, as PerfTest's
/// `-p` does; one that does not is declared.
///
/// # Errors
/// [`PerfError::Amqp`] if the broker refuses a declaration.
pub async fn declare(
    connections: &mut [ClientConnection],
    workload: &Workload,
) -> Result<(), PerfError> {
    async fn open(connection: &mut ClientConnection) -> Result<u16, PerfError> {
        connection
            .open_channel()
            .await
            .map_err(PerfError::amqp("opening the setup channel"))
    }
    let mut channels = Vec::with_capacity(connections.len());
    for connection in connections.iter_mut() {
        channels.push(open(connection).await?);
    }
    let exchange = workload.exchange.as_str();
    let predefined = exchange.is_empty() || exchange.starts_with("amq.");
    if !predefined {
        connections[0]
            .call(
                channels[0],
                AMQPClass::Exchange(exchange::AMQPMethod::Declare(exchange::Declare {
                    exchange: short_string(exchange),
                    kind: short_string(&workload.exchange_type),
                    passive: false,
                    // Durable, as PerfTest declares it: the two can then share a broker.
                    durable: true,
                    auto_delete: false,
                    internal: false,
                    nowait: false,
                    arguments: FieldTable::default(),
                })),
            )
            .await
            .map_err(PerfError::amqp(format!("exchange.declare '{exchange}'")))?;
    }
    for (index, name) in workload.queue_names().into_iter().enumerate() {
        let through = index % connections.len();
        let connection = &mut connections[through];
        let exists = workload.predeclared
            && connection
                .call(
                    channels[through],
                    AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
                        queue: short_string(&name),
                        passive: true,
                        durable: false,
                        exclusive: false,
                        auto_delete: false,
                        nowait: false,
                        arguments: FieldTable::default(),
                    })),
                )
                .await
                .is_ok();
        if !exists {
            if workload.predeclared {
                // The failed passive declare closed the channel.
                channels[through] = open(connection).await?;
            }
            declare_queue(connection, channels[through], workload, &name).await?;
        }
        if !exchange.is_empty() {
            bind_queue(
                connection,
                channels[through],
                &name,
                exchange,
                &workload.binding_key(&name),
            )
            .await?;
        }
    }
    for (connection, channel) in connections.iter_mut().zip(channels) {
        close_channel(connection, channel).await;
    }
    Ok(())
}

/// Deletes the named queues (between the runs of a sweep, so that one run's backlog does
/// not become the next one's latency).
///
/// # Errors
/// [`PerfError::Amqp`] if a channel cannot be opened.
pub async fn delete_queues(
    connection: &mut ClientConnection,
    workload: &Workload,
) -> Result<(), PerfError> {
    for name in workload.queue_names() {
        // A fresh channel each time: deleting an auto-deleted queue closes the channel
        // with 404 on some brokers.
        let channel = connection
            .open_channel()
            .await
            .map_err(PerfError::amqp("opening a channel"))?;
        let deleted = connection
            .call(
                channel,
                AMQPClass::Queue(queue::AMQPMethod::Delete(queue::Delete {
                    queue: short_string(&name),
                    if_unused: false,
                    if_empty: false,
                    nowait: false,
                })),
            )
            .await;
        match deleted {
            Ok(_) => close_channel(connection, channel).await,
            Err(ClientError::ChannelClosed { .. }) => {}
            Err(err) => return Err(PerfError::amqp(format!("queue.delete '{name}'"))(err)),
        }
    }
    Ok(())
}

/// Closes a set-up channel; a failure only means the connection is going anyway.
async fn close_channel(connection: &mut ClientConnection, channel: u16) {
    let _ = connection
        .call(
            channel,
            AMQPClass::Channel(channel::AMQPMethod::Close(channel::Close {
                reply_code: 200,
                reply_text: "OK".into(),
                class_id: 0,
                method_id: 0,
            })),
        )
        .await;
}

/// An answer of the wrong kind to a set-up call.
pub fn unexpected_answer(context: String, answer: &AMQPClass) -> PerfError {
    PerfError::amqp(context)(ClientError::Protocol(format!(
        "unexpected answer: class {} method {}",
        answer.get_amqp_class_id(),
        answer.get_amqp_method_id()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpSocket;

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
        let options = SocketOptions {
            frame_max: 0,
            send_buffer: 65_536,
            receive_buffer: 32_768,
        };
        let stream = crate::client::open_socket("localhost", port, options)
            .await
            .unwrap();
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
