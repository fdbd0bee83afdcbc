//! What the tests of the real `sluice` binary share: a free port, and a
//! client connection that waits for the broker to start listening.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lapin::options::{ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties};

pub mod cluster;
pub mod raw;

/// A port nothing listens on now, and that this test process has not
/// handed out before: the system may offer a port again once the probe
/// closes, and a cluster's ports are all picked before its nodes start, so
/// without the record two nodes of one test (or of tests running side by
/// side) could be given the same port, and one would fail to start.
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return port;
        }
    }
}

/// Connects as guest, retrying for up to 60 s while the broker starts (a
/// cluster node opens its port only once a majority formed, which takes
/// longer when the tests' other clusters load the machine too).
pub async fn connect(port: u16) -> Connection {
    connect_uri(&format!("amqp://guest:guest@127.0.0.1:{port}/%2f")).await
}

/// As [`connect`], to `uri`. Each attempt is bounded too: a node that
/// closes a connection in its handshake (it is still forming its cluster)
/// can leave lapin's connect waiting for a reply that never comes.
pub async fn connect_uri(uri: &str) -> Connection {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let attempt = tokio::time::timeout(
            CONNECT_ATTEMPT_MAX,
            Connection::connect(uri, ConnectionProperties::default()),
        )
        .await;
        match attempt {
            Ok(Ok(connection)) => return connection,
            _ if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(Err(error)) => panic!("cannot connect to {uri}: {error}"),
            Err(_) => {
                panic!("cannot connect to {uri}: no handshake within {CONNECT_ATTEMPT_MAX:?}")
            }
        }
    }
}

/// How long one connection attempt may take before it is made again.
const CONNECT_ATTEMPT_MAX: Duration = Duration::from_secs(10);

/// A passive queue.declare: the queue's counts, or the broker's refusal
/// (which closes the channel).
pub async fn declare_passive(channel: &Channel, name: &str) -> lapin::Result<lapin::Queue> {
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
}

/// An empty directory of this test process's own, named after `name`.
pub fn fresh_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `sluice server` on `port` with `data_dir` and, when given, a
/// configuration file, its output silenced (a test that reads stderr pipes
/// it and reads it: an unread pipe fills and stalls the server's logging).
/// The caller spawns it.
pub fn server_command(port: u16, data_dir: &Path, config: Option<&Path>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command
        .args([
            "server",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(data_dir);
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    command.stdout(Stdio::null()).stderr(Stdio::null());
    command
}

/// Stops a server the way an operator does (SIGTERM) and waits for it.
pub fn stop(server: &mut std::process::Child) -> std::process::ExitStatus {
    // SAFETY: signalling a child process of this test.
    unsafe {
        libc::kill(server.id() as i32, libc::SIGTERM);
    }
    server.wait().unwrap()
}

/// Declares the durable queue `name`.
pub async fn declare_durable(channel: &Channel, name: &str) {
    declare_durable_with(channel, name, FieldTable::default()).await;
}

/// Declares the durable queue `name` with `arguments`.
pub async fn declare_durable_with(channel: &Channel, name: &str, arguments: FieldTable) {
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            arguments,
        )
        .await
        .expect("queue declared");
}

/// A channel in confirm mode with the durable queue `name` declared.
pub async fn durable_queue_with_confirms(connection: &Connection, name: &str) -> Channel {
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    declare_durable(&channel, name).await;
    channel
}

/// Publishes a persistent message whose body is `number` (4 bytes, big
/// endian) to `queue` through the default exchange; what its confirm will
/// say, on a channel in confirm mode.
pub async fn publish_numbered(
    channel: &Channel,
    queue: &str,
    number: u32,
) -> lapin::PublisherConfirm {
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            lapin::options::BasicPublishOptions::default(),
            &number.to_be_bytes(),
            lapin::BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .expect("publish sent")
}

/// The arguments of a quorum queue.
pub fn quorum_arguments() -> FieldTable {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    arguments
}

/// Takes every message of `queue` with basic.get (no ack) and returns the
/// numbers [`publish_numbered`] put in their bodies, in the queue's order.
pub async fn get_numbered(channel: &Channel, queue: &str) -> Vec<u32> {
    let mut numbers = Vec::new();
    while let Some(message) = channel
        .basic_get(
            queue.into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .expect("basic.get answered")
    {
        numbers.push(u32::from_be_bytes(
            message.delivery.data[..4].try_into().expect("4-byte body"),
        ));
    }
    numbers
}
