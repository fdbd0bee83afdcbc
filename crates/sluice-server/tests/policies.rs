//! Policies: loaded from the file `load_definitions` names, in RabbitMQ's
//! JSON format, and set and cleared at runtime through the metadata log.

mod helpers;
mod support;

use std::path::PathBuf;

use helpers::*;
use lapin::options::QueueDeclareOptions;
use lapin::types::AMQPValue;
use sluice_core::metadata::MetadataCommand;
use sluice_core::policy::PolicyJson;
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

/// A policy in RabbitMQ's JSON shape, for the default vhost.
fn runtime_policy(name: &str, pattern: &str, apply_to: &str, definition: &str) -> PolicyJson {
    PolicyJson {
        vhost: "/".into(),
        name: name.into(),
        pattern: pattern.into(),
        apply_to: apply_to.into(),
        priority: 0,
        definition: serde_json::from_str(definition).unwrap(),
    }
}

async fn propose(server: &TestServer, command: MetadataCommand) {
    server
        .running()
        .broker
        .metadata
        .propose(command)
        .await
        .unwrap();
}

#[tokio::test]
async fn policies_set_at_runtime_reach_queues_and_exchanges_that_exist() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "jobs.classic").await;
    declare_with(
        &channel,
        "jobs.quorum",
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        table(&[("x-queue-type", text("quorum"))]),
    )
    .await
    .unwrap();
    publish_numbers(&channel, "jobs.classic", 10).await;
    publish_numbers(&channel, "jobs.quorum", 10).await;
    eventually("the quorum queue holds ten", || {
        server.queue("jobs.quorum").message_count() == 10
    })
    .await;

    let bounded = runtime_policy("bounded", "^jobs\\.", "queues", r#"{"max-length": 3}"#);
    propose(
        &server,
        MetadataCommand::SetPolicy {
            policy: bounded.clone(),
        },
    )
    .await;
    // The classic queue dropped its oldest as the change was applied; the
    // quorum queue once its log carried the new rules.
    assert_eq!(bodies(&channel, "jobs.classic").await, vec!["8", "9", "10"]);
    eventually("the quorum queue is cut to three", || {
        server.queue("jobs.quorum").message_count() == 3
    })
    .await;
    assert_eq!(bodies(&channel, "jobs.quorum").await, vec!["8", "9", "10"]);
    assert_eq!(
        server.running().broker.queue_policy("/", "jobs.quorum"),
        Some(bounded)
    );

    // An exchange that exists takes its alternate exchange from a policy.
    channel
        .exchange_declare(
            "orders".into(),
            lapin::ExchangeKind::Direct,
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
    declare(&channel, "leftovers").await;
    channel
        .queue_bind(
            "leftovers".into(),
            "amq.fanout".into(),
            "".into(),
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
    publish(&channel, "orders", "nobody", b"lost").await;
    // A basic.get on the same channel: the publish was routed before it.
    assert_eq!(bodies(&channel, "leftovers").await, Vec::<String>::new());
    let alternate = runtime_policy(
        "orders-ae",
        "^orders$",
        "exchanges",
        r#"{"alternate-exchange": "amq.fanout"}"#,
    );
    propose(&server, MetadataCommand::SetPolicy { policy: alternate }).await;
    publish(&channel, "orders", "nobody", b"kept").await;
    assert_eq!(bodies(&channel, "leftovers").await, vec!["kept"]);

    // Cleared: the queues take what they are sent again.
    propose(
        &server,
        MetadataCommand::ClearPolicy {
            vhost: "/".into(),
            name: "bounded".into(),
        },
    )
    .await;
    publish_numbers(&channel, "jobs.classic", 5).await;
    assert_eq!(bodies(&channel, "jobs.classic").await.len(), 5);
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn policies_set_at_runtime_survive_a_restart_and_apply_to_new_messages_only() {
    let server = TestServer::start().await;
    let (connection, channel) = open(&server).await;
    declare(&channel, "events").await;
    publish(&channel, "", "events", b"before").await;
    // A redeclaration on the same channel: the publish went in before it.
    declare(&channel, "events").await;
    // A TTL of 0: a message nobody waits for expires as it arrives.
    let fleeting = runtime_policy("fleeting", "^events$", "queues", r#"{"message-ttl": 0}"#);
    propose(
        &server,
        MetadataCommand::SetPolicy {
            policy: fleeting.clone(),
        },
    )
    .await;
    publish(&channel, "", "events", b"during").await;
    assert_eq!(bodies(&channel, "events").await, vec!["before"]);
    connection.close(200, "bye".into()).await.unwrap();

    let server = server.restart().await;
    assert_eq!(
        server.running().broker.policies(),
        vec![fleeting],
        "the policy came back from the metadata log"
    );
    let (connection, channel) = open(&server).await;
    declare(&channel, "events").await;
    publish(&channel, "", "events", b"after restart").await;
    assert_eq!(bodies(&channel, "events").await, Vec::<String>::new());
    propose(
        &server,
        MetadataCommand::ClearPolicy {
            vhost: "/".into(),
            name: "fleeting".into(),
        },
    )
    .await;
    publish(&channel, "", "events", b"kept").await;
    assert_eq!(bodies(&channel, "events").await, vec!["kept"]);
    // A refused change answers with RabbitMQ's text.
    let refused = server
        .running()
        .broker
        .metadata
        .propose(MetadataCommand::SetPolicy {
            policy: runtime_policy("bad", "^x", "queues", r#"{"max-length": "ten"}"#),
        })
        .await
        .unwrap_err();
    assert_eq!(
        refused.text,
        "Validation failed\n\n<<\"ten\">> is not a valid maximum length\n"
    );
    connection.close(200, "bye".into()).await.unwrap();
    server.stop().await;
}
