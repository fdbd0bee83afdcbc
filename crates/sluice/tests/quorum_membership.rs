//! A quorum queue's members grown and shrunk on a 3-node cluster of real
//! `sluice server` processes, through the management API and `sluice ctl`
//! of nodes that are not members: the new members catch up with what was published
//! before them and carry the queue once its first node is killed; a
//! removed member is gone with its files while the queue keeps serving;
//! the membership outlives a restart.

mod support;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use futures_lite::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicGetOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use serde_json::{json, Value};
use support::cluster::{channel_on, cluster, wait_until_every_node_serves, Node};
use support::{declare_durable_with, free_port, quorum_arguments};

/// Messages published before the queue grows.
const MESSAGES: u32 = 300;

/// One request to the API at `port` as guest, with a JSON body: status
/// and JSON body.
fn call(port: u16, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(90)))
        .build()
        .into();
    let token = base64::engine::general_purpose::STANDARD.encode("guest:guest");
    let request = ureq::http::Request::builder()
        .method(method)
        .uri(format!("http://127.0.0.1:{port}{path}"))
        .header("authorization", format!("Basic {token}"))
        .header("content-type", "application/json");
    let text = body.map(|body| body.to_string()).unwrap_or_default();
    // A node restarting does not listen yet: status 0.
    let Ok(mut response) = agent.run(request.body(text).unwrap()) else {
        return (0, Value::Null);
    };
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    (status, body)
}

async fn call_async(
    port: u16,
    method: &'static str,
    path: String,
    body: Option<Value>,
) -> (u16, Value) {
    tokio::task::spawn_blocking(move || call(port, method, &path, body))
        .await
        .unwrap()
}

/// Asks node `api` to add `node` to `queue`'s members (`change` "add") or
/// to remove it ("delete"), as `rabbitmq-queues` does through the HTTP API:
/// the status and body of the answer.
async fn change_member(api: u16, change: &'static str, queue: &str, node: &str) -> (u16, Value) {
    let method = if change == "add" { "POST" } else { "DELETE" };
    call_async(
        api,
        method,
        format!("/api/queues/quorum/%2F/{queue}/replicas/{change}"),
        Some(json!({ "node": node })),
    )
    .await
}

/// The members of `queue` as node `port` lists them, once `check` holds.
async fn members_once(port: u16, queue: &str, check: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) =
            call_async(port, "GET", format!("/api/queues/%2F/{queue}"), None).await;
        let members: Vec<String> = body["members"]
            .as_array()
            .map(|members| {
                members
                    .iter()
                    .filter_map(|member| member.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if status == 200 && check(&members) {
            return members;
        }
        assert!(
            Instant::now() < deadline,
            "members never as expected: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn sorted(names: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
    names.sort();
    names
}

fn same_members(members: &[String], expected: &[&str]) -> bool {
    let mut members = members.to_vec();
    members.sort();
    members == sorted(expected)
}

/// The quorum queues' log directories in a node's data directory.
fn queue_dirs(data_dir: &Path) -> Vec<String> {
    std::fs::read_dir(data_dir.join("queues"))
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok())
                .filter(|entry| entry.path().is_dir())
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn with_management(nodes: &[Node]) -> Vec<u16> {
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
    ports
}

/// A cluster of `count` nodes with the management API on, started, each
/// listening; the nodes and their API ports.
async fn started_with_management(test: &str, count: usize) -> (Vec<Node>, Vec<u16>) {
    let mut nodes = cluster(test, &vec!["secret"; count]);
    let api = with_management(&nodes);
    for node in &mut nodes {
        node.start();
    }
    wait_until_every_node_serves(&nodes).await;
    (nodes, api)
}

async fn publish_confirmed(node: &Node, numbers: std::ops::Range<u32>) {
    publish_confirmed_to(node, "grown", numbers).await;
}

async fn publish_confirmed_to(node: &Node, queue: &str, numbers: std::ops::Range<u32>) {
    let (_connection, channel) = channel_on(node).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut confirms = Vec::new();
    for number in numbers {
        confirms.push(support::publish_numbered(&channel, queue, number).await);
    }
    for confirm in confirms {
        assert!(confirm.await.expect("a confirm arrives").is_ack());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_membership_grows_fails_over_to_added_members_and_shrinks() {
    let (mut nodes, api) = started_with_management("membership", 3).await;
    let names: Vec<String> = nodes.iter().map(|node| node.name.clone()).collect();

    // A queue of one member, on node 1, with messages.
    let (_declaring, channel) = channel_on(&nodes[0]).await;
    let mut arguments = quorum_arguments();
    arguments.insert("x-quorum-initial-group-size".into(), AMQPValue::LongInt(1));
    declare_durable_with(&channel, "grown", arguments).await;
    publish_confirmed(&nodes[0], 0..MESSAGES).await;
    assert_eq!(
        members_once(api[0], "grown", |_| true).await,
        [names[0].clone()]
    );

    // Asked of node 3, which holds no member: node 2 joins.
    let (status, body) = change_member(api[2], "add", "grown", &names[1]).await;
    assert_eq!(status, 204, "{body}");
    // Then every quorum queue grows to node 3, with `sluice ctl` asking
    // node 2.
    let arguments = [
        "ctl".to_owned(),
        "-n".to_owned(),
        format!("127.0.0.1:{}", api[1]),
        "grow".to_owned(),
        names[2].clone(),
        "all".to_owned(),
        "--queue-pattern".to_owned(),
        "^grown$".to_owned(),
    ];
    let grown = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(&arguments)
            .env_remove("SLUICE_CTL_USERNAME")
            .env_remove("SLUICE_CTL_PASSWORD")
            .output()
            .expect("sluice ctl runs")
    })
    .await
    .unwrap();
    assert!(
        grown.status.success(),
        "{}",
        String::from_utf8_lossy(&grown.stderr)
    );
    let all = [names[0].as_str(), names[1].as_str(), names[2].as_str()];
    members_once(api[0], "grown", |members| same_members(members, &all)).await;
    members_once(api[2], "grown", |members| same_members(members, &all)).await;

    // Refusals, with their reasons.
    let (status, body) = change_member(api[0], "add", "grown", "nobody@127.0.0.1:1").await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["reason"]
            .as_str()
            .unwrap()
            .contains("node_not_running"),
        "{body}"
    );
    let (status, _) = change_member(api[0], "add", "missing", &names[1]).await;
    assert_eq!(status, 404);

    // The first member goes: the added ones caught up, elect a leader
    // and hand out everything published before they joined.
    nodes[0].kill();
    let (_consuming, channel) = channel_on(&nodes[1]).await;
    let mut consumer = channel
        .basic_consume(
            "grown".into(),
            "reader".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume-ok");
    let mut received = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.len() < MESSAGES as usize {
        let left = deadline.saturating_duration_since(Instant::now());
        let delivery = tokio::time::timeout(left, consumer.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {MESSAGES} arrived", received.len()))
            .expect("a delivery")
            .expect("a delivery");
        received.insert(u32::from_be_bytes(delivery.data[..4].try_into().unwrap()));
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    assert_eq!(received, (0..MESSAGES).collect());
    channel.close(200, "done".into()).await.unwrap();
    nodes[0].start();

    // Node 3's member goes, asked of node 2; its files go with it.
    let on_node_3 = queue_dirs(&nodes[2].data_dir);
    assert_eq!(
        on_node_3.len(),
        1,
        "node 3 holds the queue's log: {on_node_3:?}"
    );
    let path = format!("/api/queues/quorum/replicas/on/{}/shrink", names[2]);
    let (status, body) = call_async(api[1], "DELETE", path.clone(), None).await;
    assert_eq!(status, 204, "{body}");
    let two = [names[0].as_str(), names[1].as_str()];
    // Shrink answers 204 and logs a queue it could not change, as RabbitMQ
    // does. Removing the member that leads has failed that way once in CI
    // on a loaded machine (the reply of the group that lost its leader did
    // not come back); an operator asks again, and so does this test, once.
    let shrunk = |port| async move {
        let (_, body) = call_async(port, "GET", "/api/queues/%2F/grown".into(), None).await;
        body["members"]
            .as_array()
            .is_some_and(|members| members.len() == 2)
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !shrunk(api[2]).await && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if !shrunk(api[2]).await {
        let (status, body) = call_async(api[1], "DELETE", path, None).await;
        assert_eq!(status, 204, "{body}");
    }
    members_once(api[2], "grown", |members| same_members(members, &two)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !queue_dirs(&nodes[2].data_dir).is_empty() {
        assert!(Instant::now() < deadline, "node 3 kept the queue's log");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The queue keeps serving, through node 3 too.
    publish_confirmed(&nodes[2], 1000..1001).await;
    let (_getting, channel) = channel_on(&nodes[0]).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let message = loop {
        if let Some(message) = channel
            .basic_get("grown".into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get answers")
        {
            break message;
        }
        assert!(Instant::now() < deadline, "the last message never came");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(message.delivery.data, 1000u32.to_be_bytes());

    // The last member stays.
    nodes[1].kill();
    nodes[1].start();
    members_once(api[1], "grown", |members| same_members(members, &two)).await;
    let (status, body) = change_member(api[1], "delete", "grown", &names[0]).await;
    assert_eq!(status, 204, "{body}");
    let only = [names[1].as_str()];
    members_once(api[0], "grown", |members| same_members(members, &only)).await;
    let (status, body) = change_member(api[0], "delete", "grown", &names[1]).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["reason"].as_str().unwrap().starts_with("last_node"),
        "{body}"
    );
}

/// A node that holds no member of a quorum queue reaches it through its
/// home member, and once that member's node is killed, through another
/// member: on a 4-node cluster with a queue of three members, a publisher
/// with confirms and then a consumer on the fourth node carry on across
/// the kill, and every confirmed message is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_queue_outside_its_members_is_served_by_another_member_when_its_home_dies() {
    let (mut nodes, api) = started_with_management("outside-members", 4).await;
    let (_declaring, channel) = channel_on(&nodes[0]).await;
    let mut arguments = quorum_arguments();
    arguments.insert("x-quorum-initial-group-size".into(), AMQPValue::LongInt(3));
    declare_durable_with(&channel, "spread", arguments).await;
    let members = members_once(api[0], "spread", |members| members.len() == 3).await;
    let outside = nodes
        .iter()
        .position(|node| !members.contains(&node.name))
        .expect("a node that is not a member");
    let home = nodes
        .iter()
        .position(|node| node.name == members[0])
        .expect("the home is a node of the cluster");

    publish_confirmed_to(&nodes[outside], "spread", 0..20).await;
    nodes[home].kill();
    // Until the link to the dead home is known to be down, a publish sent
    // there is nacked; each message is published again until confirmed.
    let (_publishing, publisher) = channel_on(&nodes[outside]).await;
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    for number in 20u32..40 {
        loop {
            let confirmed = support::publish_numbered(&publisher, "spread", number)
                .await
                .await
                .is_ok_and(|confirm| confirm.is_ack());
            if confirmed {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no member took message {number} after the home died"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    let (_consuming, reader) = channel_on(&nodes[outside]).await;
    let mut consumer = reader
        .basic_consume(
            "spread".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume-ok through another member");
    let mut received = std::collections::BTreeSet::new();
    while received.len() < 40 {
        let delivery = tokio::time::timeout(Duration::from_secs(20), consumer.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of 40 delivered: {received:?}", received.len()))
            .expect("the consumer runs")
            .expect("a delivery");
        received.insert(u32::from_be_bytes(delivery.data[..4].try_into().unwrap()));
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    assert_eq!(received, (0u32..40).collect());
    for node in &mut nodes {
        node.kill();
    }
}

/// The leader of an idle queue, whose members hibernate with their Raft
/// nodes parked, is removed: the two members left elect another at once
/// (they wake as the membership changes, or nobody would stand), and the
/// queue keeps its messages and takes more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_membership_removing_an_idle_queues_leader_leaves_the_others_to_elect() {
    let (mut nodes, api) = started_with_management("remove-idle-leader", 3).await;
    let (_declaring, channel) = channel_on(&nodes[0]).await;
    declare_durable_with(&channel, "idle", quorum_arguments()).await;
    nodes[1].wait_for_log(
        &["quorum queue leader", "idle", &nodes[0].name],
        Duration::from_secs(20),
    );
    publish_confirmed_to(&nodes[1], "idle", 0..5).await;
    for node in &nodes {
        node.wait_for_log(
            &["idle quorum queue members parked", "parked=1"],
            Duration::from_secs(30),
        );
    }
    let (status, body) = change_member(api[1], "delete", "idle", &nodes[0].name).await;
    assert_eq!(status, 204, "{body}");
    let left = [nodes[1].name.as_str(), nodes[2].name.as_str()];
    members_once(api[1], "idle", |members| same_members(members, &left)).await;
    let started = Instant::now();
    publish_confirmed_to(&nodes[1], "idle", 5..6).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "confirmed after {:?}",
        started.elapsed()
    );
    let (_reading, reader) = channel_on(&nodes[2]).await;
    assert_eq!(
        support::get_numbered(&reader, "idle").await,
        [0, 1, 2, 3, 4, 5]
    );
    // The removed member was parked: it is erased all the same.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !queue_dirs(&nodes[0].data_dir).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the removed member's files stay: {:?}",
            queue_dirs(&nodes[0].data_dir)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for node in &mut nodes {
        node.kill();
    }
}

/// The next delivery of `consumer` within a few seconds: its number and
/// whether it came marked redelivered. Panics when the broker cancelled
/// the consumer (its stream ends) or nothing comes.
async fn next_numbered(consumer: &mut lapin::Consumer) -> (u32, bool, u64) {
    let delivery = tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("a delivery within 10 s")
        .expect("the consumer was not cancelled")
        .expect("a delivery, not an error");
    (
        u32::from_be_bytes(delivery.data[..4].try_into().expect("4-byte body")),
        delivery.redelivered,
        delivery.delivery_tag,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_membership_joining_node_keeps_its_consumers_and_their_unacked_messages() {
    let (nodes, api) = started_with_management("join-keeps-consumers", 3).await;
    let (_declaring, channel) = channel_on(&nodes[0]).await;
    let mut arguments = quorum_arguments();
    arguments.insert("x-quorum-initial-group-size".into(), AMQPValue::LongInt(1));
    declare_durable_with(&channel, "kept", arguments).await;
    assert_eq!(
        members_once(api[0], "kept", |_| true).await,
        [nodes[0].name.clone()]
    );

    // A consumer on node 2, which holds no member, holds five unacked.
    let (_consuming, consuming) = channel_on(&nodes[1]).await;
    consuming
        .basic_qos(100, lapin::options::BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = consuming
        .basic_consume(
            "kept".into(),
            "kept-worker".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    publish_confirmed_to(&nodes[0], "kept", 0..5).await;
    let mut held = Vec::new();
    for expected in 0..5 {
        let (number, redelivered, tag) = next_numbered(&mut consumer).await;
        assert_eq!((number, redelivered), (expected, false));
        held.push(tag);
    }

    // Node 2 joins the queue's members.
    let (status, body) = change_member(api[2], "add", "kept", &nodes[1].name).await;
    assert_eq!(status, 204, "{body}");
    let both = [nodes[0].name.as_str(), nodes[1].name.as_str()];
    members_once(api[1], "kept", |members| same_members(members, &both)).await;

    // The consumer was not cancelled: it settles what it held and gets
    // what comes next, each once, none of it again.
    for tag in held {
        consuming
            .basic_ack(tag, BasicAckOptions::default())
            .await
            .expect("the ack is taken");
    }
    publish_confirmed_to(&nodes[0], "kept", 5..10).await;
    for expected in 5..10 {
        let (number, redelivered, tag) = next_numbered(&mut consumer).await;
        assert_eq!((number, redelivered), (expected, false));
        consuming
            .basic_ack(tag, BasicAckOptions::default())
            .await
            .unwrap();
    }
    // Everything was settled once: nothing is left, ready or unacked.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = call_async(api[1], "GET", "/api/queues/%2F/kept".into(), None).await;
        if status == 200 && body["messages"] == 0 && body["messages_unacknowledged"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "messages left behind: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(500), consumer.next())
            .await
            .is_err(),
        "nothing is delivered twice"
    );
}

/// Waits until node `port` shows `queue`'s ready and unacknowledged
/// counts as `expected`; otherwise says what it shows.
async fn counts_once(port: u16, queue: &str, expected: (u64, u64)) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) =
            call_async(port, "GET", format!("/api/queues/%2F/{queue}"), None).await;
        let counts = (
            body["messages_ready"].as_u64().unwrap_or(u64::MAX),
            body["messages_unacknowledged"].as_u64().unwrap_or(u64::MAX),
        );
        if status == 200 && counts == expected {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{queue}: (ready, unacked) never {expected:?}: {status} {body}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Panics with `failure` and what every node logged.
fn fail_with_logs(nodes: &[Node], failure: &str) -> ! {
    let logs: Vec<String> = nodes
        .iter()
        .map(|node| format!("=== {}\n{}", node.name, node.logged_since_mark().join("\n")))
        .collect();
    panic!("{failure}\n{}", logs.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_membership_leaving_node_gives_back_what_its_consumers_held() {
    let (nodes, api) = started_with_management("leave-gives-back", 3).await;
    let (_declaring, channel) = channel_on(&nodes[0]).await;
    declare_durable_with(&channel, "left", quorum_arguments()).await;
    members_once(api[0], "left", |members| members.len() == 3).await;

    // Two consumers on node 2, a member, hold five messages each.
    let (consuming, first) = channel_on(&nodes[1]).await;
    let second = consuming.create_channel().await.unwrap();
    let mut consumers = Vec::new();
    for (channel, tag) in [(&first, "first"), (&second, "second")] {
        channel
            .basic_qos(5, lapin::options::BasicQosOptions::default())
            .await
            .unwrap();
        consumers.push(
            channel
                .basic_consume(
                    "left".into(),
                    tag.into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap(),
        );
    }
    publish_confirmed_to(&nodes[0], "left", 0..10).await;
    let mut held = Vec::new();
    for consumer in &mut consumers {
        for _ in 0..5 {
            held.push(next_numbered(consumer).await);
        }
    }
    if let Err(failure) = counts_once(api[0], "left", (0, 10)).await {
        fail_with_logs(&nodes, &failure);
    }

    // Node 2 leaves the members: its consumers hear basic.cancel, and
    // what they held goes back to the queue instead of staying out with
    // consumers no member serves.
    let (status, body) = change_member(api[2], "delete", "left", &nodes[1].name).await;
    assert_eq!(status, 204, "{body}");
    let left = [nodes[0].name.as_str(), nodes[2].name.as_str()];
    members_once(api[0], "left", |members| same_members(members, &left)).await;
    for consumer in &mut consumers {
        let end = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .expect("the consumer hears basic.cancel");
        assert!(end.is_none(), "cancelled, not delivered to: {end:?}");
    }
    if let Err(failure) = counts_once(api[0], "left", (10, 0)).await {
        fail_with_logs(&nodes, &failure);
    }
    // The channels' late acks are taken and change nothing.
    for (_, _, tag) in &held[..5] {
        first
            .basic_ack(*tag, BasicAckOptions::default())
            .await
            .expect("the ack is taken");
    }
    second.close(200, "done".into()).await.unwrap();
    let (_reading, reader) = channel_on(&nodes[2]).await;
    let mut returned = support::get_numbered(&reader, "left").await;
    returned.sort_unstable();
    assert_eq!(returned, (0..10).collect::<Vec<u32>>());
}
