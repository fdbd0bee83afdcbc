//! Raising and clearing the memory alarm of a test server through its runtime limits,
//! and reading what clients hear about it.
//!
//! lapin is the client for these tests: it advertises the `connection.blocked`
//! capability and reports the notices as connection events. amqprs has callbacks for
//! them but does not advertise the capability, so a broker (RabbitMQ or Sluice) never
//! sends it any.

use std::time::Duration;

use futures_lite::{Stream, StreamExt};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use sluice_server::resource_limit::MemoryWatermark;

use super::TestServer;

/// How long a test waits for the alarm monitor or a client to catch up.
pub const ALARM_TIMEOUT: Duration = Duration::from_secs(5);

/// A watermark of zero bytes: the memory alarm goes off at once.
pub async fn set_memory_alarm(server: &TestServer) {
    let monitor = server.running().alarm_monitor();
    monitor
        .set_vm_memory_high_watermark(MemoryWatermark::Absolute(0))
        .expect("a valid watermark");
    let mut alarms = monitor.subscribe();
    tokio::time::timeout(ALARM_TIMEOUT, alarms.wait_for(|alarms| alarms.memory))
        .await
        .expect("the memory alarm is set")
        .expect("the monitor runs");
}

/// Back to the default watermark, far above what a test uses: the alarm clears.
pub async fn clear_memory_alarm(server: &TestServer) {
    let monitor = server.running().alarm_monitor();
    monitor
        .set_vm_memory_high_watermark(MemoryWatermark::default())
        .expect("a valid watermark");
    let mut alarms = monitor.subscribe();
    tokio::time::timeout(ALARM_TIMEOUT, alarms.wait_for(|alarms| !alarms.memory))
        .await
        .expect("the memory alarm clears")
        .expect("the monitor runs");
}

/// What lapin reported about blocking.
#[derive(Debug, PartialEq, Eq)]
pub enum BlockNotice {
    Blocked(String),
    Unblocked,
}

/// The next connection.blocked or connection.unblocked a lapin connection heard.
pub async fn next_block_notice(
    events: &mut (impl Stream<Item = lapin::Event> + Unpin),
) -> BlockNotice {
    tokio::time::timeout(ALARM_TIMEOUT, async {
        loop {
            match events.next().await.expect("the connection's events go on") {
                lapin::Event::ConnectionBlocked(reason) => return BlockNotice::Blocked(reason),
                lapin::Event::ConnectionUnblocked => return BlockNotice::Unblocked,
                _ => {}
            }
        }
    })
    .await
    .expect("a block notice before the deadline")
}

/// Ready messages in `queue`, asked on a connection of its own that never publishes, so
/// an alarm does not stop it.
pub async fn message_count(server: &TestServer, queue: &str) -> u32 {
    let connection =
        lapin::Connection::connect(&server.uri(), lapin::ConnectionProperties::default())
            .await
            .expect("lapin connects");
    let channel = connection.create_channel().await.expect("channel opens");
    let count = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("the queue exists")
        .message_count();
    connection.close(200, "bye".into()).await.expect("closes");
    count
}
