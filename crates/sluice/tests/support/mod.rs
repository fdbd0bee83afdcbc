//! What the tests of the real `sluice` binary share: a free port, and a
//! client connection that waits for the broker to start listening.
#![allow(dead_code)]

use std::net::TcpListener;
use std::time::{Duration, Instant};

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};

pub mod cluster;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Connects as guest, retrying for up to 60 s while the broker starts (a
/// cluster node opens its port only once a majority formed, which takes
/// longer when the tests' other clusters load the machine too).
pub async fn connect(port: u16) -> Connection {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match Connection::connect(
            &format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
            ConnectionProperties::default(),
        )
        .await
        {
            Ok(connection) => return connection,
            Err(error) if Instant::now() < deadline => {
                let _ = error;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("cannot connect: {error}"),
        }
    }
}

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
