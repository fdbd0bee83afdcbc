//! Policies and definitions loaded from the file `load_definitions` names,
//! in RabbitMQ's JSON format.

mod helpers;
mod support;

use std::path::PathBuf;

use helpers::*;
use lapin::options::QueueDeclareOptions;
use lapin::types::AMQPValue;
use support::TestServer;

/// A definitions file in the temporary directory, removed when dropped.
struct DefinitionsFile(PathBuf);

impl DefinitionsFile {
    fn new(json: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "sluice-definitions-{}-{}.json",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::write(&path, json).unwrap();
        DefinitionsFile(path)
    }
}

impl Drop for DefinitionsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

const DEFINITIONS: &str = r#"{
  "rabbit_version": "3.10.8",
  "topic_permissions": [],
  "policies": [
    {"vhost": "/", "name": "limit", "pattern": "^limited\\.", "apply-to": "queues",
     "priority": 1, "definition": {"max-length": 2, "ha-mode": "all"}},
    {"vhost": "/", "name": "tight", "pattern": "^limited\\.tight", "apply-to": "all",
     "priority": 5, "definition": {"max-length": 1}},
    {"vhost": "/", "name": "refuse", "pattern": "^refusing$", "apply-to": "queues",
     "priority": 0, "definition": {"max-length": 1, "overflow": "reject-publish"}},
    {"vhost": "/", "name": "orders-ae", "pattern": "^orders$", "apply-to": "exchanges",
     "priority": 0, "definition": {"alternate-exchange": "unrouted"}},
    {"vhost": "/", "name": "queues-only", "pattern": "^orders$", "apply-to": "queues",
     "priority": 9, "definition": {"max-length": 0}}
  ],
  "exchanges": [
    {"name": "unrouted", "vhost": "/", "type": "fanout", "durable": true,
     "auto_delete": false, "internal": false, "arguments": {}},
    {"name": "orders", "vhost": "/", "type": "direct", "durable": true,
     "auto_delete": false, "internal": false, "arguments": {}}
  ],
  "queues": [
    {"name": "leftovers", "vhost": "/", "durable": true, "auto_delete": false, "arguments": {}}
  ],
  "bindings": [
    {"source": "unrouted", "vhost": "/", "destination": "leftovers",
     "destination_type": "queue", "routing_key": "", "arguments": {}}
  ]
}"#;

async fn bodies(channel: &lapin::Channel, queue: &str) -> Vec<String> {
    let mut all = Vec::new();
    while let Some(body) = get_body(channel, queue, true).await {
        all.push(String::from_utf8(body).unwrap());
    }
    all
}

async fn publish_numbers(channel: &lapin::Channel, queue: &str, count: u32) {
    for number in 1..=count {
        publish(channel, "", queue, number.to_string().as_bytes()).await;
    }
}

#[tokio::test]
async fn policies_max_length_policy_limits_matching_queues() {
    let file = DefinitionsFile::new(DEFINITIONS);
    let path = file.0.clone();
    let server = TestServer::start_with(|config| config.load_definitions = Some(path)).await;
    let (connection, channel) = open(&server).await;

    declare(&channel, "limited.a").await;
    declare(&channel, "unlimited").await;
    publish_numbers(&channel, "limited.a", 4).await;
    publish_numbers(&channel, "unlimited", 4).await;
    // drop-head, RabbitMQ's default overflow, keeps the newest two.
    assert_eq!(bodies(&channel, "limited.a").await, vec!["3", "4"]);
    assert_eq!(bodies(&channel, "unlimited").await.len(), 4);

    // The highest priority policy that matches is the one that applies.
    declare(&channel, "limited.tight").await;
    publish_numbers(&channel, "limited.tight", 3).await;
    assert_eq!(bodies(&channel, "limited.tight").await, vec!["3"]);

    // Between a policy's limit and the queue's own, the smaller wins.
    for (name, own, kept) in [
        ("limited.small", 1, vec!["3"]),
        ("limited.large", 10, vec!["2", "3"]),
    ] {
        declare_with(
            &channel,
            name,
            QueueDeclareOptions::default(),
            table(&[("x-max-length", AMQPValue::LongInt(own))]),
        )
        .await
        .unwrap();
        publish_numbers(&channel, name, 3).await;
        assert_eq!(bodies(&channel, name).await, kept, "{name}");
    }

    // The policy's overflow mode applies too: reject-publish keeps the first.
    declare(&channel, "refusing").await;
    publish_numbers(&channel, "refusing", 3).await;
    assert_eq!(bodies(&channel, "refusing").await, vec!["1"]);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn policies_alternate_exchange_policy_and_imported_definitions() {
    let file = DefinitionsFile::new(DEFINITIONS);
    let path = file.0.clone();
    let server = TestServer::start_with(|config| config.load_definitions = Some(path)).await;
    let (connection, channel) = open(&server).await;
    // The file declared the exchanges, the queue and the binding; the
    // policy gave "orders" its alternate exchange.
    publish(&channel, "orders", "nobody-listens", b"unroutable").await;
    assert_eq!(bodies(&channel, "leftovers").await, vec!["unroutable"]);
    // That worked although "queues-only" (priority 9) also matches the name
    // "orders": a queue policy does not apply to an exchange. For a queue
    // named "orders" it is the one that applies (max-length 0 keeps nothing).
    declare(&channel, "orders").await;
    publish(&channel, "", "orders", b"dropped").await;
    assert_eq!(bodies(&channel, "orders").await, Vec::<String>::new());
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn policies_invalid_file_stops_the_node_from_starting() {
    for json in [
        r#"{"policies": [{"vhost": "/", "name": "p", "pattern": "^q", "apply-to": "queues",
            "priority": 0, "definition": {"max-length": -1}}]}"#,
        r#"{"policies": [{"vhost": "/", "name": "p", "pattern": "(", "definition": {}}]}"#,
        "not json",
    ] {
        let file = DefinitionsFile::new(json);
        let data_dir =
            std::env::temp_dir().join(format!("sluice-policies-refused-{}", std::process::id()));
        let config = sluice_server::config::Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: data_dir.clone(),
            load_definitions: Some(file.0.clone()),
            ..Default::default()
        };
        let result = sluice_server::start(config).await;
        let _ = std::fs::remove_dir_all(&data_dir);
        let error = match result {
            Ok(server) => {
                server.stop().await;
                panic!("a node with an invalid definitions file started: {json}");
            }
            Err(error) => error,
        };
        let source = std::error::Error::source(&error).map(|source| source.to_string());
        assert!(source.is_some(), "{error}");
    }
}
