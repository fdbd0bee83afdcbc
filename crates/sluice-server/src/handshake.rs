//! The connection handshake: protocol header, start/start-ok (SASL PLAIN,
//! AMQPLAIN, or EXTERNAL with a verified TLS client certificate),
//! tune/tune-ok, open/open-ok.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use amq_protocol::protocol::{connection, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable, LongString};
use bytes::BytesMut;
use sluice_core::access::{Attempt, LoginError};
use sluice_core::broker::Broker;
use sluice_core::error::AmqpError;
use sluice_core::vhost::{VhostConnectionSlot, VirtualHost};
use sluice_wire::encode::encode_control;
use sluice_wire::frame::{FrameType, FRAME_MIN_SIZE, PROTOCOL_HEADER};
use sluice_wire::method::{decode_method, Method};
use tokio::io::AsyncWriteExt;

use crate::client_stream::ClientWriteHalf;
use crate::connection_context::ClientCapabilities;
use crate::frame_reader::{FrameReader, HandshakeReadError};
use crate::settings::ServerSettings;
use crate::tls::CertificateLogin;

/// Who is on the other end, as far as the socket tells before the
/// handshake.
#[derive(Clone, Copy)]
pub struct Client<'a> {
    pub peer: SocketAddr,
    /// The user a verified TLS client certificate names: SASL EXTERNAL is
    /// offered only then, as RabbitMQ's rabbitmq_auth_mechanism_ssl does.
    pub certificate_login: Option<&'a CertificateLogin>,
}

/// The mechanisms offered without a client certificate.
const MECHANISMS: &[u8] = b"PLAIN AMQPLAIN";
/// The mechanisms offered to a client with a verified certificate.
const MECHANISMS_WITH_EXTERNAL: &[u8] = b"PLAIN AMQPLAIN EXTERNAL";

/// What the handshake agreed on.
pub struct Negotiated {
    pub frame_max: u32,
    pub channel_max: u16,
    /// Zero disables heartbeats.
    pub heartbeat_secs: u16,
    pub vhost: Arc<VirtualHost>,
    /// The connection's place in its vhost's `max-connections`.
    pub vhost_slot: VhostConnectionSlot,
    pub user: String,
    pub client_capabilities: ClientCapabilities,
    pub client_properties: FieldTable,
    /// The SASL mechanism the client logged in with.
    pub auth_mechanism: String,
}

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("peer sent an unsupported protocol header {0:?}")]
    BadProtocolHeader(Vec<u8>),
    #[error(transparent)]
    Read(#[from] HandshakeReadError),
    #[error("socket write failed: {0}")]
    Write(#[from] std::io::Error),
    /// The login failed and the client did not ask to be told: the socket
    /// is closed without a connection.close.
    #[error("login refused for user '{0}'")]
    LoginRefused(String),
    /// Refused with a connection.close carrying this error.
    #[error("{0}")]
    Refused(AmqpError, u16, u16),
}

async fn send(socket: &mut ClientWriteHalf, class: AMQPClass) -> std::io::Result<()> {
    let mut out = BytesMut::new();
    encode_control(&mut out, 0, &class);
    socket.write_all(&out).await?;
    socket.flush().await
}

/// The server properties RabbitMQ clients read, with the capabilities
/// RabbitMQ advertises.
/// The RabbitMQ release whose behaviour, replies and texts Sluice follows.
pub const RABBITMQ_VERSION_FOLLOWED: &str = "3.10.8";

fn server_properties(settings: &ServerSettings) -> FieldTable {
    let mut capabilities = FieldTable::default();
    for capability in [
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "consumer_priorities",
        "authentication_failure_close",
        "per_consumer_qos",
        "direct_reply_to",
    ] {
        capabilities.insert(capability.into(), AMQPValue::Boolean(true));
    }
    let mut properties = FieldTable::default();
    properties.insert("capabilities".into(), AMQPValue::FieldTable(capabilities));
    let text = |value: &str| AMQPValue::LongString(LongString::from(value.as_bytes().to_vec()));
    // Clients and their test suites decide what to expect from the product
    // and version (amqp091-go's suite runs its RabbitMQ-only checks, and
    // amqplib's asserts the name, only for "RabbitMQ"): they get the
    // RabbitMQ release whose behaviour Sluice follows. What the broker
    // really is, the platform and information say, and `sluice_version`.
    properties.insert("product".into(), text("RabbitMQ"));
    properties.insert("version".into(), text(RABBITMQ_VERSION_FOLLOWED));
    properties.insert(
        "platform".into(),
        text(concat!("Sluice ", env!("CARGO_PKG_VERSION"))),
    );
    properties.insert("sluice_version".into(), text(env!("CARGO_PKG_VERSION")));
    properties.insert("cluster_name".into(), text(&settings.cluster_name));
    properties.insert("copyright".into(), text("Copyright (c) the Sluice authors"));
    properties.insert(
        "information".into(),
        text(concat!(
            "Sluice ",
            env!("CARGO_PKG_VERSION"),
            ", a broker that behaves as RabbitMQ 3.10 does; licensed under the Apache License 2.0"
        )),
    );
    properties
}

fn string_value(value: Option<&AMQPValue>) -> Option<String> {
    match value? {
        AMQPValue::LongString(value) => {
            Some(String::from_utf8_lossy(value.as_bytes()).into_owned())
        }
        AMQPValue::ShortString(value) => Some(value.as_str().to_owned()),
        _ => None,
    }
}

/// Reads the username and password from a SASL response.
fn credentials(mechanism: &str, response: &[u8]) -> Result<(String, String), AmqpError> {
    match mechanism {
        "PLAIN" => {
            // authzid NUL authcid NUL password
            let mut parts = response.split(|byte| *byte == 0);
            let _authorization = parts.next();
            let (Some(user), Some(password), None) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(AmqpError::access_refused(
                    "Login was refused using authentication mechanism PLAIN. For details see the broker logfile.",
                ));
            };
            Ok((
                String::from_utf8_lossy(user).into_owned(),
                String::from_utf8_lossy(password).into_owned(),
            ))
        }
        "AMQPLAIN" => {
            // A field table without its length prefix.
            let mut table = Vec::with_capacity(response.len() + 4);
            table.extend_from_slice(&(response.len() as u32).to_be_bytes());
            table.extend_from_slice(response);
            let refused = || {
                AmqpError::access_refused(
                    "Login was refused using authentication mechanism AMQPLAIN. For details see the broker logfile.",
                )
            };
            let (_, fields) = amq_protocol::types::parsing::parse_field_table(&table[..])
                .map_err(|_| refused())?;
            let user = string_value(fields.inner().get("LOGIN")).ok_or_else(refused)?;
            let password = string_value(fields.inner().get("PASSWORD")).ok_or_else(refused)?;
            Ok((user, password))
        }
        other => Err(AmqpError::command_invalid(format!(
            "unknown authentication mechanism '{other}'"
        ))),
    }
}

/// The user a start-ok names, and whether they may log in (else why not,
/// for the log).
///
/// # Errors
/// A response that does not parse, or a mechanism not offered: refused
/// with the reply RabbitMQ sends.
fn check_login(
    mechanism: &str,
    response: &[u8],
    client: Client<'_>,
    broker: &Broker,
) -> Result<(String, Result<(), String>), HandshakeError> {
    Ok(match (mechanism, client.certificate_login) {
        // The certificate is the credential: the response (an authorisation
        // identity at most) is not looked at, as in RabbitMQ.
        ("EXTERNAL", Some(CertificateLogin::User(user))) => (
            user.clone(),
            broker
                .login_without_password(user, client.peer.ip())
                .map_err(|reason| reason.to_string()),
        ),
        ("EXTERNAL", Some(CertificateLogin::NoName(reason))) => {
            (String::new(), Err((*reason).to_owned()))
        }
        _ => {
            let (user, password) = credentials(mechanism, response)
                .map_err(|error| HandshakeError::Refused(error, 10, 11))?;
            let login = broker
                .login(&user, &password, client.peer.ip())
                .map_err(|reason| reason.to_string());
            (user, login)
        }
    })
}

fn capabilities_of(client_properties: &FieldTable) -> ClientCapabilities {
    let Some(AMQPValue::FieldTable(capabilities)) = client_properties.inner().get("capabilities")
    else {
        return ClientCapabilities::default();
    };
    let flag = |name: &str| {
        matches!(
            capabilities.inner().get(name),
            Some(AMQPValue::Boolean(true))
        )
    };
    ClientCapabilities {
        consumer_cancel_notify: flag("consumer_cancel_notify"),
        authentication_failure_close: flag("authentication_failure_close"),
        connection_blocked: flag("connection.blocked"),
    }
}

/// Expects a connection-class method on channel 0.
async fn expect_connection_method(
    reader: &mut FrameReader,
    timeout: Duration,
    expected: &str,
) -> Result<connection::AMQPMethod, HandshakeError> {
    let frame = reader.next_frame(Some(timeout)).await?;
    let unexpected = |what: &str| {
        HandshakeError::Refused(
            AmqpError::command_invalid(format!("expected '{expected}', got {what}")),
            10,
            0,
        )
    };
    if frame.frame_type != FrameType::Method {
        return Err(unexpected("a non-method frame"));
    }
    match decode_method(&frame.payload) {
        Ok(Method::Control(AMQPClass::Connection(method))) => Ok(method),
        Ok(_) => Err(unexpected("a method of another class")),
        Err(error) => Err(HandshakeError::Refused(
            AmqpError::frame_error(error.to_string()),
            10,
            0,
        )),
    }
}

/// The lowest channel_max a client may ask for (RabbitMQ's `?CHANNEL_MIN`).
const CHANNEL_MIN: u32 = 1;

/// RabbitMQ's check of a tune-ok value (`validate_negotiated_integer_value`
/// in rabbit_reader.erl): a value below the minimum, above the server's
/// limit, or zero ("no limit") while the server has a limit is refused with
/// 530 NOT_ALLOWED rather than quietly lowered, so a client never believes
/// it may use more than the server allows.
fn validate_negotiated(
    field: &str,
    minimum: u32,
    server: u32,
    client: u32,
) -> Result<(), AmqpError> {
    if client != 0 && client < minimum {
        return Err(AmqpError::not_allowed(format!(
            "negotiated {field} = {client} is lower than the minimum allowed value ({minimum})"
        )));
    }
    if server != 0 && (client == 0 || client > server) {
        let detail = if field == "channel_max" && client == 0 {
            " (no limit)"
        } else {
            ""
        };
        return Err(AmqpError::not_allowed(format!(
            "negotiated {field} = {client}{detail} is higher than the maximum allowed value ({server})"
        )));
    }
    Ok(())
}

/// Runs the handshake on a fresh connection. On a refusal the caller sends
/// the connection.close in the error and closes the socket.
pub async fn handshake(
    reader: &mut FrameReader,
    writer: &mut ClientWriteHalf,
    client: Client<'_>,
    broker: &Broker,
    settings: &ServerSettings,
) -> Result<Negotiated, HandshakeError> {
    let timeout = settings.handshake_timeout;
    let header = reader
        .read_raw(PROTOCOL_HEADER.len(), Some(timeout))
        .await
        .map_err(HandshakeReadError::from)?;
    if header[..] != PROTOCOL_HEADER[..] {
        // The specification's answer to a header we do not speak: our own
        // header, then close.
        writer.write_all(&PROTOCOL_HEADER).await?;
        writer.flush().await?;
        return Err(HandshakeError::BadProtocolHeader(header.to_vec()));
    }
    let (start_ok, user, client_capabilities) =
        authenticate(reader, writer, client, broker, settings).await?;
    let (frame_max, channel_max, heartbeat_secs) = tune(reader, writer, settings).await?;
    let (vhost, vhost_slot) = open_vhost(reader, writer, broker, &user, timeout).await?;
    Ok(Negotiated {
        frame_max,
        channel_max,
        heartbeat_secs,
        vhost,
        vhost_slot,
        user,
        client_capabilities,
        auth_mechanism: start_ok.mechanism.to_string(),
        client_properties: start_ok.client_properties,
    })
}

/// connection.start and start-ok: the client's credentials checked. Returns
/// the start-ok, the user and the client's capabilities.
async fn authenticate(
    reader: &mut FrameReader,
    writer: &mut ClientWriteHalf,
    client: Client<'_>,
    broker: &Broker,
    settings: &ServerSettings,
) -> Result<(connection::StartOk, String, ClientCapabilities), HandshakeError> {
    let mechanisms = match client.certificate_login {
        Some(_) => MECHANISMS_WITH_EXTERNAL,
        None => MECHANISMS,
    };
    send(
        writer,
        AMQPClass::Connection(connection::AMQPMethod::Start(connection::Start {
            version_major: 0,
            version_minor: 9,
            server_properties: server_properties(settings),
            mechanisms: LongString::from(mechanisms.to_vec()),
            locales: LongString::from(b"en_US".to_vec()),
        })),
    )
    .await?;
    let connection::AMQPMethod::StartOk(start_ok) =
        expect_connection_method(reader, settings.handshake_timeout, "connection.start-ok").await?
    else {
        return Err(HandshakeError::Refused(
            AmqpError::command_invalid("expected 'connection.start-ok'"),
            10,
            11,
        ));
    };
    let mechanism = start_ok.mechanism.as_str().to_owned();
    let (user, login) = throttled_login(&mechanism, &start_ok, client, broker, settings).await?;
    let client_capabilities = capabilities_of(&start_ok.client_properties);
    if let Err(reason) = login {
        let peer = client.peer;
        tracing::warn!(%peer, %mechanism, %reason, "login refused");
        // As RabbitMQ: only a client that announced
        // authentication_failure_close is told why; others see the socket
        // close, which is what the specification has them expect.
        if !client_capabilities.authentication_failure_close {
            return Err(HandshakeError::LoginRefused(user));
        }
        return Err(HandshakeError::Refused(
            AmqpError::access_refused(format!(
                "Login was refused using authentication mechanism {mechanism}. For details see the broker logfile."
            )),
            0,
            0,
        ));
    }
    Ok((start_ok, user, client_capabilities))
}

/// Checks the credentials once the address's failed logins allow it; an
/// attempt whose turn would come too late is refused unchecked.
async fn throttled_login(
    mechanism: &str,
    start_ok: &connection::StartOk,
    client: Client<'_>,
    broker: &Broker,
    settings: &ServerSettings,
) -> Result<(String, Result<(), String>), HandshakeError> {
    let (throttle, address) = (&broker.login_throttle, client.peer.ip());
    match throttle.attempt(address, Instant::now(), settings.handshake_timeout) {
        Attempt::Refuse => return Ok((String::new(), Err(LoginError::Throttled.to_string()))),
        Attempt::After(wait) if !wait.is_zero() => tokio::time::sleep(wait).await,
        Attempt::After(_) => {}
    }
    let (user, login) = check_login(mechanism, start_ok.response.as_bytes(), client, broker)?;
    match &login {
        Ok(()) => throttle.succeeded(address),
        Err(_) => throttle.failed(address, Instant::now()),
    }
    Ok((user, login))
}

/// connection.tune and tune-ok: the limits both sides accept, as
/// (frame_max, channel_max, heartbeat seconds).
async fn tune(
    reader: &mut FrameReader,
    writer: &mut ClientWriteHalf,
    settings: &ServerSettings,
) -> Result<(u32, u16, u16), HandshakeError> {
    send(
        writer,
        AMQPClass::Connection(connection::AMQPMethod::Tune(connection::Tune {
            channel_max: settings.channel_max,
            frame_max: settings.frame_max,
            heartbeat: settings.heartbeat_secs,
        })),
    )
    .await?;
    let connection::AMQPMethod::TuneOk(tune_ok) =
        expect_connection_method(reader, settings.handshake_timeout, "connection.tune-ok").await?
    else {
        return Err(HandshakeError::Refused(
            AmqpError::command_invalid("expected 'connection.tune-ok'"),
            10,
            31,
        ));
    };
    // RabbitMQ names connection.tune (10, 30) as the failing method.
    validate_negotiated(
        "frame_max",
        FRAME_MIN_SIZE,
        settings.frame_max,
        tune_ok.frame_max,
    )
    .and_then(|()| {
        validate_negotiated(
            "channel_max",
            CHANNEL_MIN,
            settings.channel_max.into(),
            tune_ok.channel_max.into(),
        )
    })
    .map_err(|error| HandshakeError::Refused(error, 10, 30))?;
    // Zero is only accepted when the server has no limit either.
    let frame_max = match tune_ok.frame_max {
        0 => settings.frame_max,
        requested => requested,
    };
    let channel_max = match tune_ok.channel_max {
        0 => settings.channel_max,
        requested => requested,
    };
    reader.frame_max = frame_max;
    Ok((frame_max, channel_max, tune_ok.heartbeat))
}

/// connection.open: the vhost the client asks for, checked as RabbitMQ
/// checks it: it exists, is under its `max-connections`, and the user has
/// permissions there.
async fn open_vhost(
    reader: &mut FrameReader,
    writer: &mut ClientWriteHalf,
    broker: &Broker,
    user: &str,
    timeout: Duration,
) -> Result<(Arc<VirtualHost>, VhostConnectionSlot), HandshakeError> {
    let connection::AMQPMethod::Open(open) =
        expect_connection_method(reader, timeout, "connection.open").await?
    else {
        return Err(HandshakeError::Refused(
            AmqpError::command_invalid("expected 'connection.open'"),
            10,
            40,
        ));
    };
    let vhost_name = open.virtual_host.as_str();
    let refused = |text: String| HandshakeError::Refused(AmqpError::not_allowed(text), 10, 40);
    let Some(vhost) = broker.vhost(vhost_name) else {
        return Err(refused(format!("vhost {vhost_name} not found")));
    };
    let limit = broker.access.vhost_limits(vhost_name).max_connections;
    let Some(slot) = vhost.open_connection(limit) else {
        return Err(refused(format!(
            "access to vhost '{vhost_name}' refused for user '{user}': connection limit ({}) is reached",
            limit.unwrap_or_default()
        )));
    };
    if broker.access.permissions(user, vhost_name).is_none() {
        return Err(refused(format!(
            "access to vhost '{vhost_name}' refused for user '{user}'"
        )));
    }
    send(
        writer,
        AMQPClass::Connection(connection::AMQPMethod::OpenOk(connection::OpenOk {})),
    )
    .await?;
    Ok((vhost, slot))
}

/// Sends connection.close for a refused handshake and gives the client a
/// moment to read it before the socket closes.
pub async fn refuse(
    reader: &mut FrameReader,
    writer: &mut ClientWriteHalf,
    error: &AmqpError,
    class_id: u16,
    method_id: u16,
) {
    let close = AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
        reply_code: error.code.code(),
        reply_text: error.reply_text(),
        class_id,
        method_id,
    }));
    if send(writer, close).await.is_err() {
        return;
    }
    // Wait briefly for close-ok; whatever arrives, we close afterwards.
    let _ = reader
        .next_frame(Some(Duration::from_millis(
            crate::limits::CLOSE_OK_TIMEOUT_MS,
        )))
        .await;
    let _ = writer.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_wire::reply_code::ReplyCode;

    #[test]
    fn handshake_plain_and_amqplain_credentials() {
        assert_eq!(
            credentials("PLAIN", b"\0guest\0secret").unwrap(),
            ("guest".to_owned(), "secret".to_owned())
        );
        assert!(credentials("PLAIN", b"guest").is_err());
        // AMQPLAIN: LOGIN and PASSWORD as a table without its length.
        let mut response = Vec::new();
        response.push(5);
        response.extend_from_slice(b"LOGIN");
        response.push(b'S');
        response.extend_from_slice(&5u32.to_be_bytes());
        response.extend_from_slice(b"guest");
        response.push(8);
        response.extend_from_slice(b"PASSWORD");
        response.push(b'S');
        response.extend_from_slice(&3u32.to_be_bytes());
        response.extend_from_slice(b"pwd");
        assert_eq!(
            credentials("AMQPLAIN", &response).unwrap(),
            ("guest".to_owned(), "pwd".to_owned())
        );
        assert_eq!(
            credentials("EXTERNAL", b"").unwrap_err().code,
            ReplyCode::CommandInvalid
        );
    }
}
