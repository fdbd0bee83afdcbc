//! The management API of a 3-node cluster of real `sluice server`
//! processes: any node lists the connections, channels and consumers of
//! all, closes a connection held by another node, and shows where a
//! quorum queue's members and leader are.

mod support;

use std::io::Write;
use std::time::{Duration, Instant};

use base64::Engine;
use lapin::options::{BasicConsumeOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::ConnectionProperties;
use serde_json::Value;
use support::cluster::{cluster, wait_until_every_node_serves, Node};
use support::free_port;

/// One request to the API at `port` as guest: status and JSON body.
fn call(port: u16, method: &str, path: &str, reason: Option<&str>) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let token = base64::engine::general_purpose::STANDARD.encode("guest:guest");
    let mut request = ureq::http::Request::builder()
        .method(method)
        .uri(format!("http://127.0.0.1:{port}{path}"))
        .header("authorization", format!("Basic {token}"));
    if let Some(reason) = reason {
        request = request.header("x-reason", reason);
    }
    let mut response = agent
        .run(request.body(String::new()).unwrap())
        .expect("the API answers");
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).expect("a JSON body")
    };
    (status, body)
}

async fn call_async(port: u16, method: &'static str, path: String) -> (u16, Value) {
    tokio::task::spawn_blocking(move || call(port, method, &path, None))
        .await
        .unwrap()
}

/// Waits until `check` holds for the listing at `path` of node `port`.
async fn eventually_listed(port: u16, path: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = call_async(port, "GET", path.to_owned()).await;
        if status == 200 && check(&body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{path} never satisfied: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn names(listing: &Value) -> Vec<String> {
    listing
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_management_api_shows_and_closes_connections_of_every_node() {
    let mut nodes: Vec<Node> = cluster("management", &["secret", "secret", "secret"]);
    let ports: Vec<u16> = nodes.iter().map(|_| free_port()).collect();
    for (node, port) in nodes.iter().zip(&ports) {
        let mut config = std::fs::OpenOptions::new()
            .append(true)
            .open(&node.config)
            .unwrap();
        writeln!(
            config,
            "management.tcp.port = {port}\nmanagement.tcp.ip = 127.0.0.1"
        )
        .unwrap();
    }
    for node in &mut nodes {
        node.start();
    }
    wait_until_every_node_serves(&nodes).await;
    let connection = lapin::Connection::connect(
        &format!("amqp://guest:guest@127.0.0.1:{}/%2f", nodes[2].amqp_port),
        ConnectionProperties::default().with_connection_name("on-node-3".into()),
    )
    .await
    .expect("connects to node 3");
    let channel = connection.create_channel().await.unwrap();
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    channel
        .queue_declare(
            "orders".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            arguments,
        )
        .await
        .expect("a quorum queue is declared");
    let _consumer = channel
        .basic_consume(
            "orders".into(),
            "order-worker".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    // Node 1 lists node 3's connection, channel and consumer.
    let listed = eventually_listed(ports[0], "/api/connections", |listing| {
        listing.as_array().is_some_and(|items| {
            items
                .iter()
                .any(|item| item["client_properties"]["connection_name"] == "on-node-3")
        })
    })
    .await;
    let on_node_3 = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["client_properties"]["connection_name"] == "on-node-3")
        .unwrap()
        .clone();
    assert_eq!(on_node_3["node"], nodes[2].name.as_str());
    let name = on_node_3["name"].as_str().unwrap().to_owned();
    let channels = eventually_listed(ports[0], "/api/channels", |listing| {
        names(listing).contains(&format!("{name} (1)"))
    })
    .await;
    assert_eq!(channels.as_array().unwrap().len(), 1);
    let consumers = eventually_listed(ports[1], "/api/consumers", |listing| {
        listing.as_array().is_some_and(|items| !items.is_empty())
    })
    .await;
    assert_eq!(consumers[0]["consumer_tag"], "order-worker");
    assert_eq!(
        consumers[0]["channel_details"]["node"],
        nodes[2].name.as_str()
    );
    // Every node, and the quorum queue's members and leader.
    let (_, cluster_nodes) = call_async(ports[1], "GET", "/api/nodes".to_owned()).await;
    assert_eq!(
        cluster_nodes
            .as_array()
            .unwrap()
            .iter()
            .filter(|node| node["running"] == true)
            .count(),
        3
    );
    let queue = eventually_listed(ports[0], "/api/queues/%2F/orders", |queue| {
        queue["leader"].is_string() && queue["consumers"] == 1
    })
    .await;
    assert_eq!(queue["type"], "quorum");
    let mut members: Vec<&str> = queue["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    members.sort();
    let mut expected: Vec<&str> = nodes.iter().map(|node| node.name.as_str()).collect();
    expected.sort();
    assert_eq!(members, expected);
    assert_eq!(queue["online"].as_array().unwrap().len(), 3);
    // Closed through node 1: node 3's client hears it.
    let encoded = name.replace(' ', "%20").replace('>', "%3E");
    let first = ports[0];
    let (status, _) = tokio::task::spawn_blocking(move || {
        call(
            first,
            "DELETE",
            &format!("/api/connections/{encoded}"),
            Some("rebalancing"),
        )
    })
    .await
    .unwrap();
    assert_eq!(status, 204);
    let deadline = Instant::now() + Duration::from_secs(10);
    while connection.status().connected() {
        assert!(Instant::now() < deadline, "the connection was not closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eventually_listed(ports[1], "/api/connections", |listing| {
        listing.as_array().is_some_and(Vec::is_empty)
    })
    .await;
    for node in &mut nodes {
        node.kill();
    }
}
