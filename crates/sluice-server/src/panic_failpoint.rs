//! In this crate's own tests only: a queue.declare of [`PANIC_QUEUE`]
//! panics in the connection's task, to show that a bug there closes that
//! connection with 541 and gives back what it held, and nothing else.

/// The queue name that panics.
pub const PANIC_QUEUE: &str = "sluice.test.panic";

/// A consumer with this tag panics when its channel's release cancels it.
pub const PANIC_ON_RELEASE_TAG: &str = "sluice.test.panic-on-release";

pub fn check(queue: &str) {
    if queue == PANIC_QUEUE {
        panic!("the test failpoint was declared");
    }
}

pub fn check_release(consumer_tag: &str) {
    if consumer_tag == PANIC_ON_RELEASE_TAG {
        panic!("the test failpoint was released");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_lite::StreamExt;
    use lapin::options::{BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    use lapin::{BasicProperties, Connection, ConnectionProperties};

    use super::PANIC_QUEUE;
    use crate::config::Config;

    async fn connect(address: std::net::SocketAddr) -> Connection {
        Connection::connect(
            &format!("amqp://guest:guest@{address}/%2f"),
            ConnectionProperties::default(),
        )
        .await
        .expect("connects")
    }

    /// A server on a free port with a fresh data directory named after `name`.
    async fn start(name: &str) -> (crate::RunningServer, std::path::PathBuf) {
        let data_dir = std::env::temp_dir().join(format!("sluice-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data_dir);
        let server = crate::start(Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: data_dir.clone(),
            ..Config::default()
        })
        .await
        .expect("server starts");
        (server, data_dir)
    }

    /// Waits (10 s at most) until the queue `held` has `messages` ready and
    /// no consumer: what a released connection held is back.
    async fn wait_until_held_returns(address: std::net::SocketAddr, messages: u32) {
        let witness = connect(address).await;
        let channel = witness.create_channel().await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let queue = channel
                .queue_declare(
                    "held".into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap();
            if queue.message_count() == messages && queue.consumer_count() == 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "still held: {queue:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        witness.close(200, "bye".into()).await.unwrap();
    }

    #[tokio::test]
    async fn panic_in_a_connection_closes_it_with_541_and_requeues_what_it_held() {
        let (server, data_dir) = start("panic").await;
        let address = server.local_address;

        let doomed = connect(address).await;
        let channel = doomed.create_channel().await.unwrap();
        channel
            .queue_declare(
                "held".into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        for _ in 0..3 {
            channel
                .basic_publish(
                    "".into(),
                    "held".into(),
                    BasicPublishOptions::default(),
                    b"m",
                    BasicProperties::default(),
                )
                .await
                .unwrap();
        }
        let mut consumer = channel
            .basic_consume(
                "held".into(),
                "holder".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        for _ in 0..3 {
            consumer
                .next()
                .await
                .expect("a delivery")
                .expect("delivered");
        }
        let other = doomed.create_channel().await.unwrap();
        let error = other
            .queue_declare(
                PANIC_QUEUE.into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect_err("the panic closes the connection");
        let text = error.to_string();
        assert!(text.contains("INTERNAL_ERROR"), "{text}");

        // Its consumer is gone and its unacked messages are back.
        wait_until_held_returns(address, 3).await;
        server.stop().await;
        let _ = std::fs::remove_dir_all(&data_dir);
    }

    #[tokio::test]
    async fn panic_while_releasing_a_channel_still_releases_the_others() {
        let (server, data_dir) = start("panic-release").await;
        let address = server.local_address;

        let doomed = connect(address).await;
        let setup = doomed.create_channel().await.unwrap();
        for queue in ["trap", "held"] {
            setup
                .queue_declare(
                    queue.into(),
                    QueueDeclareOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        }
        // The trap's consumer panics when its channel is released; nine
        // other channels each hold a message of another queue.
        let trap = doomed.create_channel().await.unwrap();
        // Kept: a consumer dropped is cancelled.
        let _trap_consumer = trap
            .basic_consume(
                "trap".into(),
                super::PANIC_ON_RELEASE_TAG.into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let mut holders = Vec::new();
        for _ in 0..9 {
            setup
                .basic_publish(
                    "".into(),
                    "held".into(),
                    BasicPublishOptions::default(),
                    b"m",
                    BasicProperties::default(),
                )
                .await
                .unwrap();
            let channel = doomed.create_channel().await.unwrap();
            channel
                .basic_qos(1, lapin::options::BasicQosOptions::default())
                .await
                .unwrap();
            let mut consumer = channel
                .basic_consume(
                    "held".into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
            consumer
                .next()
                .await
                .expect("a delivery")
                .expect("delivered");
            holders.push((channel, consumer));
        }
        // The close is answered: the release that panicked went on.
        tokio::time::timeout(Duration::from_secs(5), doomed.close(200, "bye".into()))
            .await
            .expect("close-ok within 5 s")
            .unwrap();

        // Every other channel's consumer is gone and its message back.
        wait_until_held_returns(address, 9).await;
        server.stop().await;
        let _ = std::fs::remove_dir_all(&data_dir);
    }
}
