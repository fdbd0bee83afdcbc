//! The AMQP 0-9-1 client behind every `sluice perf` connection: one socket, owned by the one
//! task that publishes or consumes on it, with the frames encoded and decoded by
//! `sluice-wire` (the broker's own codec, `amq-protocol` for the control methods).
//!
//! **Why not a client library.** `sluice perf` shares the machine with the broker it
//! measures, so every cycle it spends is taken from the broker. A general client runs I/O
//! apart from the code that publishes: lapin on a thread per connection, amqprs on tasks of
//! its own, so each message crosses threads or tasks on its way out and its confirm or
//! delivery crosses them again on its way back. On seed 5 at a fifth of its size (400
//! connections, 20k msg/s on a 3-node cluster) lapin took 0.78 of the two cores, a third of
//! it in thread switches and wake-ups; amqprs 0.41. Here the publishing task writes its own frames, as
//! PerfTest's publisher thread does, and reads its confirms when it waits anyway; a consumer
//! acks everything one read delivered in one write.
//!
//! **What it speaks.** PLAIN login; channels opened one after another; the methods a run
//! needs (declarations, qos, consume, confirm.select, publish, ack); deliveries, returns,
//! confirms and cancels coming back. Heartbeats are declined in tune-ok, as a connection
//! that is read and written all the time needs none. No TLS: `amqps://` is refused with a
//! message that says so.
//!
//! **Bounds.** Reading stops while [`INPUT_MAX`] bytes wait to be handled; a frame is at most
//! the negotiated `frame_max`; a message body at most [`BODY_MAX`]; what arrives during a
//! set-up call at most [`EARLY_MAX`] items.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use sluice_wire::amq_protocol::protocol::{basic, channel, connection, AMQPClass};
use sluice_wire::amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};
use sluice_wire::amq_protocol::uri::{AMQPScheme, AMQPUri};
use sluice_wire::content::{decode_content_header, RawProperties};
use sluice_wire::encode::{
    encode_confirm, encode_content, encode_control, encode_publish, join_body,
};
use sluice_wire::frame::{split_frame, Frame, FrameType, FRAME_MIN_SIZE, PROTOCOL_HEADER};
use sluice_wire::method::{decode_method, Method};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};

/// Bytes read and not yet handled past which the connection stops reading: a consumer's
/// prefetch of deliveries fits many times over, and the broker's own flow control takes over
/// when a task falls behind.
pub const INPUT_MAX: usize = 4 << 20;

/// The largest message body accepted from the broker; a larger declared size is refused
/// before any of it is buffered.
pub const BODY_MAX: u64 = 128 << 20;

/// Deliveries, confirms and notices kept while a set-up call waits for its answer: set-up
/// comes before consuming and publishing, so only a broker that misbehaves sends this many.
pub const EARLY_MAX: usize = 4096;

/// How long the handshake and each set-up call may take before the connection is given up.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Channel 0 carries the connection's own methods.
const CONNECTION_CHANNEL: u16 = 0;

/// What a connection can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// connection.close from the broker.
    #[error("connection closed by the broker: {code} {text}")]
    ConnectionClosed { code: u16, text: String },
    /// channel.close from the broker.
    #[error("channel closed by the broker: {code} {text}")]
    ChannelClosed { code: u16, text: String },
    /// The broker sent something this client cannot read or did not expect.
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("no answer from the broker within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Unsupported(String),
}

/// How a connection's socket is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketOptions {
    /// Proposed `frame_max`, unless the URI sets `?frame_max=`; 0 takes the broker's.
    pub frame_max: u32,
    /// SO_SNDBUF and SO_RCVBUF; 0 leaves them to the kernel.
    pub send_buffer: u32,
    pub receive_buffer: u32,
}

/// What the broker sent on the connection's channels, one message or notice at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// basic.deliver with its whole body.
    Delivery { delivery_tag: u64, body: Bytes },
    /// A publisher confirm (basic.ack, or basic.nack with `acked: false`).
    Confirm {
        delivery_tag: u64,
        multiple: bool,
        acked: bool,
    },
    /// basic.return of a mandatory message no queue took (its content read and dropped).
    Returned,
    /// basic.cancel: the broker ended a consumer (its queue was deleted, say).
    Cancelled,
}

/// A message whose method arrived and whose content is still coming.
#[derive(Debug)]
enum PendingContent {
    AwaitingHeader(ContentKind),
    Body {
        kind: ContentKind,
        size: u64,
        remaining: u64,
        parts: Vec<Bytes>,
    },
}

#[derive(Debug, Clone, Copy)]
enum ContentKind {
    Delivery(u64),
    Returned,
}

/// One open AMQP connection.
pub struct ClientConnection {
    reader: OwnedReadHalf,
    writer: OwnedWriteHalf,
    input: BytesMut,
    output: BytesMut,
    frame_max: u32,
    /// The last channel number handed out.
    last_channel: u16,
    content: Option<PendingContent>,
    /// Items decoded during a set-up call that belong to the task's later reading.
    early: VecDeque<Incoming>,
}

impl ClientConnection {
    /// Connects to `uri`, logs in and opens the URI's vhost; `name` is the connection name
    /// the broker shows.
    ///
    /// # Errors
    /// [`ClientError`] if the broker cannot be reached, refuses the login or the vhost, or
    /// the URI asks for TLS.
    pub async fn open(
        uri: &AMQPUri,
        options: SocketOptions,
        name: &str,
    ) -> Result<ClientConnection, ClientError> {
        if uri.scheme != AMQPScheme::AMQP {
            return Err(ClientError::Unsupported(
                "sluice perf speaks plain amqp:// only; for TLS use PerfTest (bench/amqps)".into(),
            ));
        }
        let stream = open_socket(&uri.authority.host, uri.authority.port, options).await?;
        let (reader, writer) = stream.into_split();
        let mut connection = ClientConnection {
            reader,
            writer,
            input: BytesMut::with_capacity(64 << 10),
            output: BytesMut::with_capacity(16 << 10),
            // The handshake's frames are bounded by the protocol minimum until tune.
            frame_max: FRAME_MIN_SIZE,
            last_channel: 0,
            content: None,
            early: VecDeque::new(),
        };
        let proposed = uri.query.frame_max.unwrap_or(options.frame_max);
        tokio::time::timeout(CALL_TIMEOUT, connection.handshake(uri, proposed, name))
            .await
            .map_err(|_| ClientError::Timeout(CALL_TIMEOUT))??;
        Ok(connection)
    }

    async fn handshake(
        &mut self,
        uri: &AMQPUri,
        proposed_frame_max: u32,
        name: &str,
    ) -> Result<(), ClientError> {
        self.output.put_slice(&PROTOCOL_HEADER);
        self.flush().await?;
        match self.next_method(CONNECTION_CHANNEL).await? {
            AMQPClass::Connection(connection::AMQPMethod::Start(_)) => {}
            other => return Err(unexpected("connection.start", &other)),
        }
        let user = &uri.authority.userinfo;
        let mut client_properties = FieldTable::default();
        client_properties.insert("product".into(), long_string("sluice perf"));
        client_properties.insert("connection_name".into(), long_string(name));
        let mut capabilities = FieldTable::default();
        for capability in [
            "publisher_confirms",
            "consumer_cancel_notify",
            "basic.nack",
            // A refused login is then told with connection.close 403, not a closed socket.
            "authentication_failure_close",
        ] {
            capabilities.insert(capability.into(), AMQPValue::Boolean(true));
        }
        client_properties.insert("capabilities".into(), AMQPValue::FieldTable(capabilities));
        self.send(
            CONNECTION_CHANNEL,
            &AMQPClass::Connection(connection::AMQPMethod::StartOk(connection::StartOk {
                client_properties,
                mechanism: "PLAIN".into(),
                response: LongString::from(format!("\0{}\0{}", user.username, user.password)),
                locale: "en_US".into(),
            })),
        );
        self.flush().await?;
        let tune = match self.next_method(CONNECTION_CHANNEL).await? {
            AMQPClass::Connection(connection::AMQPMethod::Tune(tune)) => tune,
            other => return Err(unexpected("connection.tune", &other)),
        };
        let frame_max = match (proposed_frame_max, tune.frame_max) {
            (0, broker) => broker,
            (ours, 0) => ours,
            (ours, broker) => ours.min(broker),
        }
        .max(FRAME_MIN_SIZE);
        self.send(
            CONNECTION_CHANNEL,
            &AMQPClass::Connection(connection::AMQPMethod::TuneOk(connection::TuneOk {
                channel_max: tune.channel_max,
                frame_max,
                heartbeat: 0,
            })),
        );
        self.send(
            CONNECTION_CHANNEL,
            &AMQPClass::Connection(connection::AMQPMethod::Open(connection::Open {
                virtual_host: uri.vhost.as_str().into(),
            })),
        );
        self.flush().await?;
        self.frame_max = frame_max;
        match self.next_method(CONNECTION_CHANNEL).await? {
            AMQPClass::Connection(connection::AMQPMethod::OpenOk(_)) => Ok(()),
            other => Err(unexpected("connection.open-ok", &other)),
        }
    }

    /// The negotiated frame size.
    pub fn frame_max(&self) -> u32 {
        self.frame_max
    }

    /// Opens a new channel and returns its number.
    ///
    /// # Errors
    /// [`ClientError`] if the broker refuses or the connection fails.
    pub async fn open_channel(&mut self) -> Result<u16, ClientError> {
        self.last_channel = self.last_channel.checked_add(1).ok_or_else(|| {
            ClientError::Unsupported("every channel number of the connection is used".into())
        })?;
        let number = self.last_channel;
        match self
            .call(
                number,
                AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
            )
            .await?
        {
            AMQPClass::Channel(channel::AMQPMethod::OpenOk(_)) => Ok(number),
            other => Err(unexpected("channel.open-ok", &other)),
        }
    }

    /// Sends a synchronous method on `channel` and waits for the broker's answer on it.
    /// Deliveries and confirms that arrive meanwhile are kept for [`Self::next_incoming`].
    ///
    /// # Errors
    /// [`ClientError::ChannelClosed`] if the broker refuses (the channel is then closed),
    /// [`ClientError::ConnectionClosed`], or an I/O error.
    pub async fn call(
        &mut self,
        channel: u16,
        method: AMQPClass,
    ) -> Result<AMQPClass, ClientError> {
        self.send(channel, &method);
        self.flush().await?;
        tokio::time::timeout(CALL_TIMEOUT, self.next_method(channel))
            .await
            .map_err(|_| ClientError::Timeout(CALL_TIMEOUT))?
    }

    /// Queues a method frame for the next [`Self::flush`].
    pub fn send(&mut self, channel: u16, method: &AMQPClass) {
        encode_control(&mut self.output, channel, method);
    }

    /// Queues a basic.publish with its content for the next [`Self::flush`]. `properties`
    /// are encoded once by the caller: they are the same for every message of a run.
    pub fn publish(
        &mut self,
        channel: u16,
        exchange: &str,
        routing_key: &str,
        mandatory: bool,
        properties: &RawProperties,
        body: &[u8],
    ) {
        let out = &mut self.output;
        encode_publish(
            out,
            channel,
            exchange.as_bytes(),
            routing_key.as_bytes(),
            mandatory,
        );
        encode_content(out, channel, properties, body, self.frame_max);
    }

    /// Queues a basic.ack for the next [`Self::flush`]: the same method a broker confirms
    /// with.
    pub fn ack(&mut self, channel: u16, delivery_tag: u64, multiple: bool) {
        encode_confirm(&mut self.output, channel, delivery_tag, multiple, true);
    }

    /// Writes everything queued. Meanwhile it keeps reading (up to [`INPUT_MAX`]), so a
    /// broker that waits for its own writes to be read before it reads more cannot leave
    /// both ends waiting on each other.
    ///
    /// # Errors
    /// An I/O error, or the broker closing the socket.
    pub async fn flush(&mut self) -> Result<(), ClientError> {
        while !self.output.is_empty() {
            let reading = self.input.len() < INPUT_MAX;
            tokio::select! {
                written = self.writer.write(&self.output) => {
                    let written = written?;
                    if written == 0 {
                        return Err(closed_socket());
                    }
                    self.output.advance(written);
                }
                read = self.reader.read_buf(&mut self.input), if reading => {
                    if read? == 0 {
                        return Err(closed_socket());
                    }
                }
            }
        }
        Ok(())
    }

    /// Waits until the broker sent more. Cancel-safe: nothing read is lost if another branch
    /// of a `select!` wins.
    ///
    /// # Errors
    /// An I/O error, or the broker closing the socket.
    pub async fn read_more(&mut self) -> Result<(), ClientError> {
        if self.input.len() >= INPUT_MAX {
            // The caller handles what is buffered before reading more.
            return Ok(());
        }
        if self.reader.read_buf(&mut self.input).await? == 0 {
            return Err(closed_socket());
        }
        Ok(())
    }

    /// The next whole item among the bytes read so far, or `None` if more must be read.
    /// A close from the broker is answered and returned as an error.
    ///
    /// # Errors
    /// [`ClientError::ConnectionClosed`], [`ClientError::ChannelClosed`], or
    /// [`ClientError::Protocol`] for frames that do not parse.
    pub fn next_incoming(&mut self) -> Result<Option<Incoming>, ClientError> {
        if let Some(item) = self.early.pop_front() {
            return Ok(Some(item));
        }
        while let Some(frame) = self.next_frame()? {
            if frame.frame_type == FrameType::Method {
                let method = decode(&frame)?;
                if let Some(item) = self.on_method(frame.channel, method)? {
                    return Ok(Some(item));
                }
            } else if let Some(item) = self.on_content_frame(frame)? {
                return Ok(Some(item));
            }
        }
        Ok(None)
    }

    /// Closes the connection politely, waiting (bounded) for close-ok.
    pub async fn close(mut self) {
        self.send(
            CONNECTION_CHANNEL,
            &AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
                reply_code: 200,
                reply_text: "OK".into(),
                class_id: 0,
                method_id: 0,
            })),
        );
        let closing = async {
            self.flush().await?;
            loop {
                // Anything else still arriving is dropped: the run is over.
                if let AMQPClass::Connection(connection::AMQPMethod::CloseOk(_)) =
                    self.next_method(CONNECTION_CHANNEL).await?
                {
                    return Ok::<(), ClientError>(());
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), closing).await;
    }

    fn next_frame(&mut self) -> Result<Option<Frame>, ClientError> {
        split_frame(&mut self.input, self.frame_max)
            .map_err(|err| ClientError::Protocol(err.to_string()))
    }

    /// Reads until a method arrives on `channel` (or a connection-level close), keeping any
    /// asynchronous items that arrive first.
    async fn next_method(&mut self, channel: u16) -> Result<AMQPClass, ClientError> {
        loop {
            while let Some(frame) = self.next_frame()? {
                if frame.frame_type != FrameType::Method {
                    if let Some(item) = self.on_content_frame(frame)? {
                        self.keep_early(item)?;
                    }
                    continue;
                }
                let method = decode(&frame)?;
                let asynchronous = matches!(
                    &method,
                    Method::Ack(_)
                        | Method::Nack(_)
                        | Method::Control(AMQPClass::Basic(
                            basic::AMQPMethod::Deliver(_)
                                | basic::AMQPMethod::Return(_)
                                | basic::AMQPMethod::Cancel(_)
                        ))
                        | Method::Control(AMQPClass::Connection(
                            connection::AMQPMethod::Blocked(_)
                                | connection::AMQPMethod::Unblocked(_)
                        ))
                );
                if asynchronous || frame.channel != channel && frame.channel != CONNECTION_CHANNEL {
                    if let Some(item) = self.on_method(frame.channel, method)? {
                        self.keep_early(item)?;
                    }
                    continue;
                }
                let Method::Control(class) = method else {
                    return Err(ClientError::Protocol("unexpected basic method".into()));
                };
                return match self.closed(frame.channel, &class) {
                    Some(err) => Err(err),
                    None => Ok(class),
                };
            }
            self.read_more().await?;
        }
    }

    /// Keeps an item that arrived during a set-up call, within [`EARLY_MAX`].
    fn keep_early(&mut self, item: Incoming) -> Result<(), ClientError> {
        if self.early.len() >= EARLY_MAX {
            return Err(ClientError::Protocol(format!(
                "more than {EARLY_MAX} deliveries and notices arrived while waiting for an answer"
            )));
        }
        self.early.push_back(item);
        Ok(())
    }

    /// An asynchronous method: what it means for the task, if anything.
    fn on_method(&mut self, channel: u16, method: Method) -> Result<Option<Incoming>, ClientError> {
        Ok(match method {
            Method::Ack(ack) => Some(Incoming::Confirm {
                delivery_tag: ack.delivery_tag,
                multiple: ack.multiple,
                acked: true,
            }),
            Method::Nack(nack) => Some(Incoming::Confirm {
                delivery_tag: nack.delivery_tag,
                multiple: nack.multiple,
                acked: false,
            }),
            Method::Control(AMQPClass::Basic(basic::AMQPMethod::Deliver(deliver))) => {
                self.content = Some(PendingContent::AwaitingHeader(ContentKind::Delivery(
                    deliver.delivery_tag,
                )));
                None
            }
            Method::Control(AMQPClass::Basic(basic::AMQPMethod::Return(_))) => {
                self.content = Some(PendingContent::AwaitingHeader(ContentKind::Returned));
                None
            }
            Method::Control(AMQPClass::Basic(basic::AMQPMethod::Cancel(cancel))) => {
                if !cancel.nowait {
                    self.send(
                        channel,
                        &AMQPClass::Basic(basic::AMQPMethod::CancelOk(basic::CancelOk {
                            consumer_tag: cancel.consumer_tag,
                        })),
                    );
                }
                Some(Incoming::Cancelled)
            }
            Method::Control(class) => match self.closed(channel, &class) {
                Some(err) => return Err(err),
                // Flow, blocked and unblocked notices: the broker's back pressure shows as
                // a socket it stops reading, which the writes already wait for.
                None => None,
            },
            Method::Publish(_) | Method::Reject(_) => {
                return Err(ClientError::Protocol(format!(
                    "the broker sent a client-only method on channel {channel}"
                )))
            }
        })
    }

    /// A close from the broker, answered with close-ok, as an error.
    fn closed(&mut self, channel: u16, class: &AMQPClass) -> Option<ClientError> {
        match class {
            AMQPClass::Connection(connection::AMQPMethod::Close(close)) => {
                self.send(
                    CONNECTION_CHANNEL,
                    &AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})),
                );
                Some(ClientError::ConnectionClosed {
                    code: close.reply_code,
                    text: close.reply_text.to_string(),
                })
            }
            AMQPClass::Channel(channel::AMQPMethod::Close(close)) => {
                self.send(
                    channel,
                    &AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
                );
                Some(ClientError::ChannelClosed {
                    code: close.reply_code,
                    text: close.reply_text.to_string(),
                })
            }
            _ => None,
        }
    }

    fn on_content_frame(&mut self, frame: Frame) -> Result<Option<Incoming>, ClientError> {
        match (frame.frame_type, self.content.take()) {
            (FrameType::Heartbeat, content) => {
                self.content = content;
                Ok(None)
            }
            (FrameType::Header, Some(PendingContent::AwaitingHeader(kind))) => {
                let header = decode_content_header(&frame.payload)
                    .map_err(|err| ClientError::Protocol(err.to_string()))?;
                if header.body_size > BODY_MAX {
                    return Err(ClientError::Protocol(format!(
                        "a message body of {} bytes is more than this client takes ({BODY_MAX})",
                        header.body_size
                    )));
                }
                if header.body_size == 0 {
                    return Ok(Some(complete(kind, Vec::new(), 0)));
                }
                self.content = Some(PendingContent::Body {
                    kind,
                    size: header.body_size,
                    remaining: header.body_size,
                    parts: Vec::new(),
                });
                Ok(None)
            }
            (
                FrameType::Body,
                Some(PendingContent::Body {
                    kind,
                    size,
                    remaining,
                    mut parts,
                }),
            ) => {
                let received = frame.payload.len() as u64;
                if received > remaining {
                    return Err(ClientError::Protocol(
                        "a body frame runs past the size its header declared".into(),
                    ));
                }
                parts.push(frame.payload);
                if received == remaining {
                    return Ok(Some(complete(kind, parts, size)));
                }
                self.content = Some(PendingContent::Body {
                    kind,
                    size,
                    remaining: remaining - received,
                    parts,
                });
                Ok(None)
            }
            (frame_type, _) => Err(ClientError::Protocol(format!(
                "a {frame_type:?} frame on channel {} where none was expected",
                frame.channel
            ))),
        }
    }
}

/// A message whose content is all here: its parts joined (a body of one frame stays the slice
/// it already is). `size` is at most [`BODY_MAX`].
fn complete(kind: ContentKind, parts: Vec<Bytes>, size: u64) -> Incoming {
    match kind {
        ContentKind::Returned => Incoming::Returned,
        ContentKind::Delivery(delivery_tag) => Incoming::Delivery {
            delivery_tag,
            body: join_body(parts, size as usize),
        },
    }
}

fn decode(frame: &Frame) -> Result<Method, ClientError> {
    decode_method(&frame.payload).map_err(|err| ClientError::Protocol(err.to_string()))
}

fn unexpected(expected: &str, got: &AMQPClass) -> ClientError {
    ClientError::Protocol(format!(
        "expected {expected}, got class {} method {}",
        got.get_amqp_class_id(),
        got.get_amqp_method_id()
    ))
}

fn closed_socket() -> ClientError {
    ClientError::Io(std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "the broker closed the socket",
    ))
}

fn long_string(text: &str) -> AMQPValue {
    AMQPValue::LongString(text.into())
}

/// Connects a TCP socket to `host:port` with the options' buffer sizes and Nagle's algorithm
/// off, trying each address the host resolves to.
///
/// **Socket buffers.** PerfTest sets SO_SNDBUF and SO_RCVBUF to 64 KiB. Left to the kernel,
/// a publisher's send buffer grows to 4 MiB, so a publisher without confirms that outruns
/// its broker keeps megabytes in the kernel, and the time its messages wait there counts as
/// latency: one unthrottled publisher against Sluice measured a p50 of 60–75 ms with
/// autotuned buffers and 27–33 ms with PerfTest's.
pub async fn open_socket(
    host: &str,
    port: u16,
    options: SocketOptions,
) -> std::io::Result<TcpStream> {
    let mut last_error = None;
    for address in tokio::net::lookup_host((host, port)).await? {
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
                return Ok(stream);
            }
            Err(err) => last_error = Some(err),
        }
    }
    Err(last_error.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{host} resolves to no address"),
        )
    }))
}

/// A message's properties as sent: persistent (delivery-mode 2) or not.
pub fn publish_properties(persistent: bool) -> RawProperties {
    let mut properties = basic::AMQPProperties::default();
    if persistent {
        properties = properties.with_delivery_mode(2);
    }
    RawProperties::from_properties(&properties)
}

/// A short string from `text`, cut to AMQP's 255 bytes at a character boundary.
pub fn short_string(text: &str) -> ShortString {
    let mut end = text.len().min(u8::MAX as usize);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].into()
}
