//! Exchanges, queues and bindings live in the metadata log: declared once
//! applied, back after a restart (durable ones only), and a single-node
//! data directory's `definitions.json` taken over on first start.

mod helpers;
mod support;

use helpers::*;
use lapin::options::{
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::ExchangeKind;
use support::TestServer;

fn queue_names(server: &TestServer) -> Vec<String> {
    let mut names: Vec<String> = server
        .running()
        .broker
        .vhost("/")
        .expect("the default vhost exists")
        .queues()
        .iter()
        .map(|queue| queue.name().to_string())
        .collect();
    names.sort();
    names
}

fn has_exchange(server: &TestServer, name: &str) -> bool {
    server
        .running()
        .broker
        .vhost("/")
        .expect("the default vhost exists")
        .exchange(name)
        .is_ok()
}

async fn declare_exchange(channel: &lapin::Channel, name: &str, durable: bool) {
    channel
        .exchange_declare(
            name.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("exchange declares");
}

async fn declare_queue(channel: &lapin::Channel, name: &str, options: QueueDeclareOptions) {
    channel
        .queue_declare(name.into(), options, FieldTable::default())
        .await
        .expect("queue declares");
}

#[tokio::test]
async fn metadata_durable_definitions_come_back_after_a_restart_and_transient_ones_do_not() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_exchange(&channel, "kept.x", true).await;
    declare_exchange(&channel, "passing.x", false).await;
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    declare_queue(&channel, "kept", durable).await;
    declare_queue(&channel, "passing", QueueDeclareOptions::default()).await;
    declare_queue(
        &channel,
        "owned",
        QueueDeclareOptions {
            exclusive: true,
            ..Default::default()
        },
    )
    .await;
    declare_queue(&channel, "deleted", durable).await;
    channel
        .queue_bind(
            "kept".into(),
            "kept.x".into(),
            "k.#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("queue binds");
    channel
        .queue_delete("deleted".into(), QueueDeleteOptions::default())
        .await
        .expect("queue deletes");
    // Declared means applied: the broker holds them already.
    assert_eq!(queue_names(&server), ["kept", "owned", "passing"]);
    // Stopped without a clean close of the connection: the exclusive queue
    // goes with the node's run, not with a deletion.
    drop(connection);
    let server = server.restart().await;
    assert_eq!(queue_names(&server), ["kept"]);
    assert!(has_exchange(&server, "kept.x"));
    assert!(
        !has_exchange(&server, "passing.x"),
        "a transient exchange goes with the node"
    );
    let (connection, channel) = open(&server).await;
    publish(&channel, "kept.x", "k.1", b"routed").await;
    eventually("the binding routes again", || {
        server.queue("kept").message_count() == 1
    })
    .await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn metadata_a_refused_declaration_is_refused_by_the_log_with_rabbitmq_text() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare_queue(&channel, "shape", QueueDeclareOptions::default()).await;
    let (code, text) = amqp_error(
        channel
            .queue_declare(
                "shape".into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await,
    );
    assert_eq!(code, 406);
    assert!(
        text.contains("inequivalent arg 'durable' for queue 'shape' in vhost '/'"),
        "{text}"
    );
    drop(connection);
    server.stop().await;
}

const LEGACY_DEFINITIONS: &str = r#"{
  "vhosts": {
    "/": {
      "exchanges": [
        {"name": "legacy.x", "kind": "direct", "auto_delete": false, "internal": false, "arguments": {}}
      ],
      "queues": [
        {"name": "legacy", "store_id": "00000000000000aa", "auto_delete": false, "arguments": {}}
      ],
      "bindings": [
        {"source": "legacy.x", "destination": "legacy", "destination_type": "queue", "routing_key": "old", "arguments": {}}
      ]
    }
  }
}"#;

#[tokio::test]
async fn metadata_a_single_node_data_directory_is_taken_over_on_first_start() {
    let data_dir = std::env::temp_dir().join(format!("sluice-take-over-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    std::fs::create_dir_all(&data_dir).unwrap();
    std::fs::write(data_dir.join("definitions.json"), LEGACY_DEFINITIONS).unwrap();
    let dir = data_dir.clone();
    let server = TestServer::start_with(move |config| config.data_dir = dir).await;
    assert_eq!(queue_names(&server), ["legacy"]);
    assert!(has_exchange(&server, "legacy.x"));
    assert!(
        !data_dir.join("definitions.json").exists(),
        "the file is set aside"
    );
    assert!(data_dir.join("definitions.json.taken-over").exists());
    assert!(
        data_dir.join("queues").join("00000000000000aa").exists(),
        "the queue keeps its journal directory"
    );
    let server = server.restart().await;
    assert_eq!(queue_names(&server), ["legacy"], "the log holds it now");
    let (connection, channel) = open(&server).await;
    publish(&channel, "legacy.x", "old", b"still bound").await;
    eventually("the binding routes", || {
        server.queue("legacy").message_count() == 1
    })
    .await;
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
    let _ = std::fs::remove_dir_all(&data_dir);
}
