//! AMQP over TLS (amqps), configured with RabbitMQ's keys: real TCP, real
//! TLS, a real client (amqprs over rustls), and certificates made here for
//! each test by a test certificate authority.

mod helpers;
mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use amqprs::channel::{
    BasicAckArguments, BasicConsumeArguments, BasicPublishArguments, ConfirmSelectArguments,
    QueueDeclareArguments,
};
use amqprs::connection::{Connection as AmqprsConnection, OpenConnectionArguments};
use amqprs::security::SecurityCredentials;
use amqprs::tls::TlsAdaptor;
use amqprs::BasicProperties;
use helpers::{next_event, record_events, ChannelEvent};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use sluice_server::config::Config;
use sluice_wire::amq_protocol::protocol::{connection, AMQPClass};
use sluice_wire::amq_protocol::types::{AMQPValue, FieldTable};
use sluice_wire::encode::encode_control;
use sluice_wire::frame::{split_frame, PROTOCOL_HEADER};
use sluice_wire::method::{decode_method, Method};
use support::cluster::TestCluster;
use support::TestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a refused client may take to see its connection end.
const PROMPTLY: Duration = Duration::from_secs(2);

/// A certificate authority, the server's certificate for `localhost` and
/// 127.0.0.1, and client certificates, as PEM files in a directory removed
/// with it.
struct Pki {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Pki {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "sluice-tls-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params
            .distinguished_name
            .push(DnType::CommonName, "Sluice test CA");
        let key = KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        std::fs::write(dir.join("ca_certificate.pem"), certificate.pem()).unwrap();
        let pki = Pki {
            dir,
            issuer: Issuer::new(params, key),
        };
        pki.issue(
            "server",
            &[(DnType::CommonName, "localhost")],
            vec!["localhost".into(), "127.0.0.1".into()],
        );
        pki
    }

    /// Issues a certificate named `name` with `subject` (in certificate
    /// order); writes `NAME_certificate.pem` and `NAME_key.pem`.
    fn issue(&self, name: &str, subject: &[(DnType, &str)], alt_names: Vec<String>) {
        let mut params = CertificateParams::new(alt_names).unwrap();
        let mut distinguished_name = DistinguishedName::new();
        for (kind, value) in subject {
            distinguished_name.push(kind.clone(), *value);
        }
        params.distinguished_name = distinguished_name;
        let key = KeyPair::generate().unwrap();
        let certificate = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::write(self.certificate(name), certificate.pem()).unwrap();
        std::fs::write(self.key(name), key.serialize_pem()).unwrap();
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca_certificate.pem")
    }

    fn certificate(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}_certificate.pem"))
    }

    fn key(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}_key.pem"))
    }

    /// The configuration lines of an amqps listener on a free port, with
    /// `extra` lines after them.
    fn config(&self, extra: &str) -> String {
        format!(
            "listeners.ssl.default = 127.0.0.1:0
ssl_options.cacertfile = {}
ssl_options.certfile = {}
ssl_options.keyfile = {}
{extra}",
            self.ca().display(),
            self.certificate("server").display(),
            self.key("server").display(),
        )
    }

    /// A client that trusts this CA, with `client`'s certificate if named.
    fn client(&self, client: Option<&str>) -> TlsAdaptor {
        match client {
            None => TlsAdaptor::without_client_auth(Some(&self.ca()), "localhost".into()),
            Some(name) => TlsAdaptor::with_client_auth(
                Some(&self.ca()),
                &self.certificate(name),
                &self.key(name),
                "localhost".into(),
            ),
        }
        .expect("the client's TLS set-up")
    }
}

/// A server with the TLS configuration `text` applied.
async fn start_tls(text: &str) -> (TestServer, SocketAddr) {
    let text = text.to_owned();
    let server = TestServer::start_with(move |config| {
        *config = Config::parse(&text, config.clone()).expect("the TLS configuration parses");
    })
    .await;
    let address = server.running().tls_address.expect("an amqps listener");
    (server, address)
}

fn arguments(address: SocketAddr, tls: TlsAdaptor) -> OpenConnectionArguments {
    let mut arguments =
        OpenConnectionArguments::new(&address.ip().to_string(), address.port(), "guest", "guest");
    arguments.tls_adaptor(tls);
    arguments
}

async fn open(
    arguments: &OpenConnectionArguments,
) -> Result<AmqprsConnection, amqprs::error::Error> {
    tokio::time::timeout(Duration::from_secs(10), AmqprsConnection::open(arguments))
        .await
        .expect("the connection attempt ends in time")
}

/// Whether the peer closes `stream` within [`PROMPTLY`], whatever it sends
/// before.
async fn closed_promptly(stream: &mut TcpStream) -> bool {
    let drain = async {
        let mut buffer = [0u8; 1024];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(PROMPTLY, drain).await.is_ok()
}

// ----- publishing and consuming -----

#[tokio::test]
async fn tls_amqprs_publishes_and_consumes_with_confirms() {
    let pki = Pki::new();
    let (server, address) = start_tls(&pki.config("")).await;
    let connection = open(&arguments(address, pki.client(None)))
        .await
        .expect("amqps connects");
    let channel = connection.open_channel(None).await.unwrap();
    let mut events = record_events(&channel).await;
    channel
        .confirm_select(ConfirmSelectArguments::default())
        .await
        .unwrap();
    channel
        .queue_declare(QueueDeclareArguments::new("over-tls"))
        .await
        .unwrap();
    const COUNT: u64 = 200;
    // 1 KB bodies, as the benchmarks send, and one larger than a TLS record.
    for number in 0..COUNT {
        let size = if number == 0 { 100_000 } else { 1000 };
        let mut body = format!("m{number} ").into_bytes();
        body.resize(size, b'x');
        channel
            .basic_publish(
                BasicProperties::default(),
                body,
                BasicPublishArguments::new("", "over-tls"),
            )
            .await
            .unwrap();
    }
    let mut confirmed = 0;
    while confirmed < COUNT {
        match next_event(&mut events).await {
            ChannelEvent::Ack { delivery_tag, .. } => confirmed = delivery_tag,
            other => panic!("expected confirms, got {other:?}"),
        }
    }
    let (_, mut deliveries) = channel
        .basic_consume_rx(BasicConsumeArguments::new("over-tls", "tls-consumer"))
        .await
        .unwrap();
    for number in 0..COUNT {
        let delivery = tokio::time::timeout(helpers::ARRIVAL_TIMEOUT, deliveries.recv())
            .await
            .expect("a delivery in time")
            .expect("the consumer is open");
        let body = delivery.content.expect("a body");
        assert!(body.starts_with(format!("m{number} ").as_bytes()));
        assert_eq!(body.len(), if number == 0 { 100_000 } else { 1000 });
        let tag = delivery.deliver.expect("a deliver").delivery_tag();
        channel
            .basic_ack(BasicAckArguments::new(tag, false))
            .await
            .unwrap();
    }
    connection.close().await.unwrap();
    // The plain listener keeps working beside the TLS one.
    let plain = AmqprsConnection::open(&OpenConnectionArguments::new(
        &server.address.ip().to_string(),
        server.address.port(),
        "guest",
        "guest",
    ))
    .await
    .expect("the plain listener still serves");
    plain.close().await.unwrap();
    server.stop().await;
}

// ----- peer verification -----

#[tokio::test]
async fn tls_verify_peer_with_fail_if_no_peer_cert_needs_a_client_certificate() {
    let pki = Pki::new();
    pki.issue("client", &[(DnType::CommonName, "someone")], Vec::new());
    let (server, address) = start_tls(
        &pki.config("ssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = true"),
    )
    .await;
    assert!(
        open(&arguments(address, pki.client(None))).await.is_err(),
        "a client without a certificate is refused"
    );
    let connection = open(&arguments(address, pki.client(Some("client"))))
        .await
        .expect("a client with a certificate connects");
    connection.close().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn tls_verify_peer_refuses_a_certificate_from_another_authority() {
    let pki = Pki::new();
    let stranger = Pki::new();
    stranger.issue("client", &[(DnType::CommonName, "guest")], Vec::new());
    std::fs::copy(stranger.certificate("client"), pki.certificate("stranger")).unwrap();
    std::fs::copy(stranger.key("client"), pki.key("stranger")).unwrap();
    let (server, address) = start_tls(&pki.config("ssl_options.verify = verify_peer")).await;
    assert!(open(&arguments(address, pki.client(Some("stranger"))))
        .await
        .is_err());
    // Without fail_if_no_peer_cert, no certificate at all is fine.
    let connection = open(&arguments(address, pki.client(None))).await.unwrap();
    connection.close().await.unwrap();
    server.stop().await;
}

// ----- SASL EXTERNAL -----

fn external(address: SocketAddr, tls: TlsAdaptor) -> OpenConnectionArguments {
    let mut arguments = arguments(address, tls);
    arguments.credentials(SecurityCredentials::new_external());
    arguments
}

#[tokio::test]
async fn tls_external_logs_in_as_the_certificate_common_name() {
    let pki = Pki::new();
    pki.issue(
        "guest",
        &[
            (DnType::OrganizationName, "Sluice tests"),
            (DnType::CommonName, "guest"),
        ],
        Vec::new(),
    );
    pki.issue("nobody", &[(DnType::CommonName, "nobody")], Vec::new());
    let (server, address) = start_tls(&pki.config(
        "ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = true
ssl_cert_login_from = common_name",
    ))
    .await;
    let connection = open(&external(address, pki.client(Some("guest"))))
        .await
        .expect("EXTERNAL logs in as guest");
    let channel = connection.open_channel(None).await.unwrap();
    channel
        .queue_declare(QueueDeclareArguments::new("external"))
        .await
        .unwrap();
    connection.close().await.unwrap();
    // amqprs does not announce authentication_failure_close: it sees the
    // connection end, as the specification has it.
    assert!(open(&external(address, pki.client(Some("nobody"))))
        .await
        .is_err());
    // A client that announces it is told why, as for a wrong password.
    let mut client = RawTlsClient::connect(address, &pki, Some("nobody")).await;
    let start = client.start().await;
    assert_eq!(start.mechanisms.to_string(), "PLAIN AMQPLAIN EXTERNAL");
    client.start_ok("EXTERNAL", b"").await;
    assert_eq!(
        client.close_reply().await,
        (
            403,
            "ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL. For details see the broker logfile.".to_owned()
        )
    );
    server.stop().await;
}

#[tokio::test]
async fn tls_external_is_offered_only_with_a_verified_certificate() {
    let pki = Pki::new();
    let (server, address) = start_tls(&pki.config("ssl_options.verify = verify_peer")).await;
    let mut client = RawTlsClient::connect(address, &pki, None).await;
    let start = client.start().await;
    assert_eq!(start.mechanisms.to_string(), "PLAIN AMQPLAIN");
    client.start_ok("EXTERNAL", b"").await;
    assert_eq!(
        client.close_reply().await,
        (
            503,
            "COMMAND_INVALID - unknown authentication mechanism 'EXTERNAL'".to_owned()
        )
    );
    server.stop().await;
}

/// A client driving the handshake by hand over TLS, to see what no real
/// client shows: the mechanisms offered, the reply to a refused login.
struct RawTlsClient {
    stream: tokio_rustls::client::TlsStream<TcpStream>,
    buffer: bytes::BytesMut,
}

impl RawTlsClient {
    async fn connect(address: SocketAddr, pki: &Pki, client: Option<&str>) -> Self {
        let read_certificates = |path: PathBuf| {
            let pem = std::fs::read(path).unwrap();
            <CertificateDer as PemObject>::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .unwrap()
        };
        let mut roots = rustls::RootCertStore::empty();
        for certificate in read_certificates(pki.ca()) {
            roots.add(certificate).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        let config = match client {
            None => builder.with_no_client_auth(),
            Some(name) => builder
                .with_client_auth_cert(
                    read_certificates(pki.certificate(name)),
                    PrivateKeyDer::from_pem_file(pki.key(name)).unwrap(),
                )
                .unwrap(),
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let stream = TcpStream::connect(address).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let stream = connector.connect(name, stream).await.expect("TLS connects");
        RawTlsClient {
            stream,
            buffer: bytes::BytesMut::new(),
        }
    }

    async fn read_connection_method(&mut self) -> connection::AMQPMethod {
        loop {
            if let Some(frame) = split_frame(&mut self.buffer, 131_072).unwrap() {
                match decode_method(&frame.payload).unwrap() {
                    Method::Control(AMQPClass::Connection(method)) => return method,
                    other => panic!("expected a connection method, got {other:?}"),
                }
            }
            let read = tokio::time::timeout(PROMPTLY, self.stream.read_buf(&mut self.buffer))
                .await
                .expect("the server answers in time")
                .unwrap();
            assert!(read > 0, "the server closed the connection");
        }
    }

    async fn start(&mut self) -> connection::Start {
        self.stream.write_all(&PROTOCOL_HEADER).await.unwrap();
        match self.read_connection_method().await {
            connection::AMQPMethod::Start(start) => start,
            other => panic!("expected connection.start, got {other:?}"),
        }
    }

    async fn start_ok(&mut self, mechanism: &str, response: &[u8]) {
        let mut capabilities = FieldTable::default();
        capabilities.insert(
            "authentication_failure_close".into(),
            AMQPValue::Boolean(true),
        );
        let mut client_properties = FieldTable::default();
        client_properties.insert("capabilities".into(), AMQPValue::FieldTable(capabilities));
        let start_ok =
            AMQPClass::Connection(connection::AMQPMethod::StartOk(connection::StartOk {
                client_properties,
                mechanism: mechanism.into(),
                response: response.to_vec().into(),
                locale: "en_US".into(),
            }));
        let mut out = bytes::BytesMut::new();
        encode_control(&mut out, 0, &start_ok);
        self.stream.write_all(&out).await.unwrap();
        self.stream.flush().await.unwrap();
    }

    async fn close_reply(&mut self) -> (u16, String) {
        match self.read_connection_method().await {
            connection::AMQPMethod::Close(close) => {
                (close.reply_code, close.reply_text.as_str().to_owned())
            }
            other => panic!("expected connection.close, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn tls_external_by_distinguished_name_as_rabbitmq_writes_it() {
    let pki = Pki::new();
    pki.issue(
        "client",
        &[
            (DnType::OrganizationName, "Sluice tests"),
            (DnType::CommonName, "dn-client"),
        ],
        Vec::new(),
    );
    // RabbitMQ's default ssl_cert_login_from: the user is named by the
    // whole subject, most specific part first.
    let (server, address) = start_tls(&pki.config(
        "ssl_options.verify = verify_peer
default_user = CN=dn-client,O=Sluice tests",
    ))
    .await;
    let connection = open(&external(address, pki.client(Some("client"))))
        .await
        .expect("EXTERNAL logs in as the subject's user");
    connection.close().await.unwrap();
    // Without a certificate EXTERNAL is not offered: the client cannot use it.
    assert!(open(&external(address, pki.client(None))).await.is_err());
    server.stop().await;
}

// ----- the wrong protocol on each port -----

#[tokio::test]
async fn tls_plain_amqp_on_the_tls_port_is_closed_promptly() {
    let pki = Pki::new();
    let (server, address) = start_tls(&pki.config("")).await;
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(&PROTOCOL_HEADER).await.unwrap();
    assert!(closed_promptly(&mut stream).await);
    // The listener serves TLS clients after it.
    let connection = open(&arguments(address, pki.client(None))).await.unwrap();
    connection.close().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn tls_client_hello_on_the_plain_port_is_closed_promptly() {
    let pki = Pki::new();
    let (server, _) = start_tls(&pki.config("")).await;
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(pki.ca()).unwrap();
    for certificate in CertificateDer::pem_slice_iter(&ca) {
        roots.add(certificate.unwrap()).unwrap();
    }
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let stream = TcpStream::connect(server.address).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    // The plain listener answers a header it does not speak with its own,
    // which is no TLS record: the TLS client gives up at once.
    let handshake = tokio::time::timeout(PROMPTLY, connector.connect(name, stream))
        .await
        .expect("the handshake ends promptly");
    assert!(handshake.is_err());
    // And seen from a socket: the AMQP header, then the close.
    let mut stream = TcpStream::connect(server.address).await.unwrap();
    stream
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03])
        .await
        .unwrap();
    let mut header = [0u8; 8];
    tokio::time::timeout(PROMPTLY, stream.read_exact(&mut header))
        .await
        .expect("the header in time")
        .unwrap();
    assert_eq!(header, PROTOCOL_HEADER);
    assert!(closed_promptly(&mut stream).await);
    server.stop().await;
}

#[tokio::test]
async fn tls_handshake_that_stalls_is_dropped_after_handshake_timeout() {
    let pki = Pki::new();
    let (server, address) = start_tls(&pki.config("handshake_timeout = 300")).await;
    // Connected, and silent: the server's handshake waits for a ClientHello.
    let mut stalled = TcpStream::connect(address).await.unwrap();
    // Others are served meanwhile.
    let connection = open(&arguments(address, pki.client(None))).await.unwrap();
    connection.close().await.unwrap();
    assert!(closed_promptly(&mut stalled).await);
    server.stop().await;
}

#[tokio::test]
async fn tls_connections_count_against_connection_max() {
    let pki = Pki::new();
    let (server, address) = start_tls(&pki.config("connection_max = 1")).await;
    let first = open(&arguments(address, pki.client(None))).await.unwrap();
    let mut plain = TcpStream::connect(server.address).await.unwrap();
    assert!(closed_promptly(&mut plain).await, "the second is refused");
    first.close().await.unwrap();
    server.stop().await;
}

// ----- configuration mistakes -----

/// The error `sluice server` would print for `text`, cause chain and all.
async fn startup_error(pki: &Pki, text: &str) -> String {
    let data_dir = pki.dir.join("data");
    let mut config = Config::parse(text, Config::default()).expect("the file parses");
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.data_dir = data_dir;
    match sluice_server::start(config).await {
        Ok(server) => {
            server.stop().await;
            panic!("the server started with {text}");
        }
        Err(error) => {
            let mut text = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                text.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            text
        }
    }
}

#[tokio::test]
async fn tls_configuration_mistakes_stop_the_start_naming_key_and_file() {
    let pki = Pki::new();
    let missing = pki.dir.join("missing.pem");
    let text = pki.config("").replace(
        &pki.certificate("server").display().to_string(),
        &missing.display().to_string(),
    );
    let error = startup_error(&pki, &text).await;
    assert!(
        error.contains("ssl_options.certfile") && error.contains(&missing.display().to_string()),
        "{error}"
    );
    assert!(error.contains("No such file"), "{error}");

    pki.issue("other", &[(DnType::CommonName, "other")], Vec::new());
    let text = pki.config("").replace(
        &pki.key("server").display().to_string(),
        &pki.key("other").display().to_string(),
    );
    let error = startup_error(&pki, &text).await;
    assert!(
        error.contains("does not match") && error.contains("ssl_options.keyfile"),
        "{error}"
    );

    let not_pem = pki.dir.join("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    let text = pki.config("").replace(
        &pki.ca().display().to_string(),
        &not_pem.display().to_string(),
    ) + "\nssl_options.verify = verify_peer";
    let error = startup_error(&pki, &text).await;
    assert!(
        error.contains("ssl_options.cacertfile") && error.contains("not.pem"),
        "{error}"
    );

    let error = startup_error(&pki, "listeners.ssl.default = 127.0.0.1:0").await;
    assert!(error.contains("ssl_options.certfile is not"), "{error}");
    assert_no_file_in(&pki.dir.join("data"));
}

/// A TLS mistake stops the node before it writes anything.
fn assert_no_file_in(dir: &Path) {
    let entries = std::fs::read_dir(dir).map(|entries| entries.count());
    assert!(
        matches!(entries, Err(_) | Ok(0)),
        "the data directory was written to"
    );
}

/// Three nodes whose links run over TLS, each with a certificate `pki`
/// issued, or `other` for the nodes `strangers` lists; waits for the first
/// `expected` (the others refuse a stranger, which never starts).
async fn tls_cluster(pki: &Pki, other: &Pki, strangers: &[usize], expected: usize) -> TestCluster {
    use sluice_server::cluster_config::LinkTlsConfig;

    TestCluster::start("tls-link", expected, |index, name, config| {
        let issuer = if strangers.contains(&index) {
            other
        } else {
            pki
        };
        let certificate = format!("node{index}");
        issuer.issue(
            &certificate,
            &[(DnType::CommonName, name.name())],
            Vec::new(),
        );
        config.cluster.link_tls = LinkTlsConfig {
            enabled: true,
            cacertfile: Some(pki.ca()),
            certfile: Some(issuer.certificate(&certificate)),
            keyfile: Some(issuer.key(&certificate)),
        };
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_between_cluster_nodes_carries_the_metadata() {
    let (pki, other) = (Pki::new(), Pki::new());
    let cluster = tls_cluster(&pki, &other, &[], 3).await;
    let servers = &cluster.servers;
    let exchange = sluice_core::metadata::MetadataCommand::DeclareExchange {
        vhost: "/".into(),
        name: "over-tls".into(),
        kind: "direct".into(),
        durable: true,
        auto_delete: false,
        internal: false,
        arguments: Default::default(),
    };
    servers[0]
        .broker
        .metadata
        .propose(exchange)
        .await
        .expect("a majority over TLS links commits it");
    for server in servers {
        helpers::eventually("every node applies it", || {
            server
                .broker
                .vhost("/")
                .is_some_and(|vhost| vhost.exchange("over-tls").is_ok())
        })
        .await;
    }
    cluster.stop().await;
}

#[tokio::test]
async fn tls_between_cluster_nodes_needs_all_three_files() {
    let pki = Pki::new();
    let text = format!(
        "node_name = a@127.0.0.1:1\n\
         cluster_formation.classic_config.nodes.1 = a@127.0.0.1:1\n\
         cluster_formation.classic_config.nodes.2 = b@127.0.0.1:2\n\
         cluster_link.ssl = true\n\
         cluster_link.ssl_options.cacertfile = {}\n\
         cluster_link.ssl_options.certfile = {}\n",
        pki.ca().display(),
        pki.certificate("server").display()
    );
    std::env::set_var("SLUICE_COOKIE", support::cluster::COOKIE);
    let text = support::start_error(|config| {
        *config = Config::parse(&text, config.clone()).unwrap();
    })
    .await;
    assert!(
        text.contains("cluster_link.ssl is true but cluster_link.ssl_options.keyfile is not"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_between_cluster_nodes_refuses_a_node_the_authority_did_not_sign() {
    let (pki, other) = (Pki::new(), Pki::new());
    // The third node's certificate comes from another authority: the two
    // others form the cluster without it.
    let cluster = tls_cluster(&pki, &other, &[2], 2).await;
    let links = cluster.servers[0].cluster_links().expect("a cluster");
    helpers::eventually("the stranger's link is refused over TLS", || {
        matches!(
            links.peer_state(&cluster.names[2]),
            Some(sluice_cluster::link::PeerState::Down(reason)) if reason.contains("TLS")
        )
    })
    .await;
    cluster.stop().await;
}
