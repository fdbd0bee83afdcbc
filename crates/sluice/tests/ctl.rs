//! `sluice ctl` as an operator runs it: the real binary against a real
//! `sluice server`, checked through what AMQP clients then see.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Output};
use std::time::Duration;

use futures_lite::StreamExt as _;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde_json::Value;
use support::{connect, declare_passive, durable_queue_with_confirms, free_port, fresh_dir};

/// A `sluice server` with its management API on a port of its own.
struct Node {
    server: Child,
    amqp_port: u16,
    management_port: u16,
    dir: PathBuf,
}

impl Node {
    /// Starts a node and waits until its API answers (`ctl await_startup`)
    /// and its AMQP port accepts a login.
    async fn start(name: &str) -> Node {
        let dir = fresh_dir(&format!("ctl-{name}"));
        let (amqp_port, management_port) = (free_port(), free_port());
        let config = dir.join("sluice.conf");
        std::fs::write(
            &config,
            format!("management.tcp.port = {management_port}\nmanagement.tcp.ip = 127.0.0.1\n"),
        )
        .unwrap();
        let server = support::server_command(amqp_port, &dir.join("data"), Some(&config))
            .spawn()
            .expect("sluice server starts");
        let node = Node {
            server,
            amqp_port,
            management_port,
            dir,
        };
        let started = node.ctl(&["await_startup", "--timeout", "60"]);
        assert_eq!(started.status.code(), Some(0), "{}", stderr(&started));
        connect(amqp_port)
            .await
            .close(200, "ready".into())
            .await
            .unwrap();
        node
    }

    /// `sluice ctl -n 127.0.0.1:<port> <args>` as guest, not reading the
    /// credentials of whoever runs the tests.
    fn ctl(&self, args: &[&str]) -> Output {
        ctl_at(&format!("127.0.0.1:{}", self.management_port), args)
    }

    /// As [`Node::ctl`], requiring success; its standard output.
    fn ctl_ok(&self, args: &[&str]) -> String {
        let output = self.ctl(args);
        assert_eq!(
            output.status.code(),
            Some(0),
            "sluice ctl {args:?} failed: {}",
            stderr(&output)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// A `--formatter json` command's output, parsed.
    fn ctl_json(&self, args: &[&str]) -> Value {
        let mut with_json = vec!["--formatter", "json"];
        with_json.extend_from_slice(args);
        let text = self.ctl_ok(&with_json);
        serde_json::from_str(&text).unwrap_or_else(|error| panic!("{error}: {text}"))
    }

    fn amqp_uri(&self, user: &str, password: &str, vhost: &str) -> String {
        format!(
            "amqp://{user}:{password}@127.0.0.1:{}/{}",
            self.amqp_port,
            vhost.replace('/', "%2f")
        )
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        support::stop(&mut self.server);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ctl_at(node: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["ctl", "-n", node])
        .args(args)
        .env_remove("SLUICE_CTL_USERNAME")
        .env_remove("SLUICE_CTL_PASSWORD")
        .output()
        .expect("sluice ctl runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The rows of a JSON listing whose `key` is `value`.
fn find<'a>(rows: &'a Value, key: &str, value: &str) -> Option<&'a Value> {
    rows.as_array()
        .expect("a JSON array")
        .iter()
        .find(|row| row[key] == value)
}

/// Publishes `count` persistent messages to `queue`, each confirmed.
async fn publish(connection: &Connection, queue: &str, count: usize) {
    let channel = durable_queue_with_confirms(connection, queue).await;
    for index in 0..count {
        channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                format!("message {index}").as_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

/// Asks `probe` until it gives something, for up to 10 s: what the API
/// reports of a connection's channels and consumers is updated as the
/// connection goes, not at once.
async fn eventually<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn login(uri: &str) -> lapin::Result<Connection> {
    Connection::connect(uri, ConnectionProperties::default()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_list_queues_shows_columns_as_a_table_and_as_json() {
    let node = Node::start("list-queues").await;
    let connection = connect(node.amqp_port).await;
    publish(&connection, "orders", 3).await;
    publish(&connection, "empty", 0).await;

    let table = node.ctl_ok(&["list_queues", "name", "messages", "durable"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines[0], "Listing queues for vhost / ...");
    assert_eq!(lines[1], "name    messages  durable");
    assert!(lines.contains(&"orders  3         true"), "{table}");
    assert!(lines.contains(&"empty   0         true"), "{table}");
    assert_eq!(lines.len(), 4, "{table}");

    // rabbitmqctl's defaults (name messages), quiet: no banner.
    let quiet = node.ctl_ok(&["-q", "list_queues"]);
    assert_eq!(quiet.lines().next(), Some("name    messages"), "{quiet}");
    assert!(quiet.lines().any(|line| line == "orders  3"), "{quiet}");

    let json = node.ctl_json(&["list_queues", "name,messages", "type", "messages_ready"]);
    let orders = find(&json, "name", "orders").expect("orders listed");
    assert_eq!(orders["messages"], 3);
    assert_eq!(orders["messages_ready"], 3);
    assert_eq!(orders["type"], "classic");
    let keys: Vec<&String> = orders.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 4);

    // The other listings of the vhost, with their default columns.
    let exchanges = node.ctl_ok(&["-q", "list_exchanges"]);
    assert!(exchanges
        .lines()
        .any(|line| line.split_whitespace().eq(["amq.topic", "topic"])));
    let channel = connection.create_channel().await.unwrap();
    let _consumer = channel
        .basic_consume(
            "orders".into(),
            "watcher".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let consumers = eventually("the consumer is listed", || {
        let consumers = node.ctl_json(&["list_consumers", "queue_name", "consumer_tag"]);
        (consumers != serde_json::json!([])).then_some(consumers)
    })
    .await;
    assert_eq!(
        consumers,
        serde_json::json!([{"queue_name": "orders", "consumer_tag": "watcher"}])
    );
    let connections = node.ctl_json(&["list_connections"]);
    let guest = find(&connections, "user", "guest").expect("the connection is listed");
    assert_eq!(guest["peer_host"], "127.0.0.1");
    assert_eq!(guest["state"], "running");
    let channels = node.ctl_json(&["list_channels", "user", "consumer_count"]);
    assert!(channels
        .as_array()
        .unwrap()
        .iter()
        .any(|row| row["consumer_count"] == 1));
    let bindings = node.ctl_json(&["list_bindings"]);
    let to_orders = find(&bindings, "destination_name", "orders").expect("default binding");
    assert_eq!(to_orders["routing_key"], "orders");
    assert_eq!(to_orders["source_kind"], "exchange");

    // A column rabbitmqctl has but Sluice does not: a usage error, 64.
    let unknown = node.ctl(&["list_queues", "name", "pid"]);
    assert_eq!(unknown.status.code(), Some(64));
    assert!(stderr(&unknown).starts_with("Error: info key(s) pid are not supported"));
    connection.close(200, "done".into()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_users_and_permissions_decide_who_logs_in() {
    let node = Node::start("users").await;
    let alice = node.amqp_uri("alice", "s3cret", "/");
    assert!(login(&alice).await.is_err(), "no such user yet");

    node.ctl_ok(&["add_user", "alice", "s3cret"]);
    assert!(
        login(&alice).await.is_err(),
        "a user without permissions on / is refused"
    );
    node.ctl_ok(&["set_permissions", "alice", ".*", ".*", ".*"]);
    let connection = login(&alice).await.expect("alice logs in");
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_declare(
            "alices".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("configure permission");
    connection.close(200, "done".into()).await.unwrap();

    let users = node.ctl_json(&["list_users"]);
    assert_eq!(
        find(&users, "user", "alice").unwrap()["tags"],
        serde_json::json!([])
    );
    let permissions = node.ctl_json(&["list_permissions"]);
    let row = find(&permissions, "user", "alice").expect("alice's permissions");
    assert_eq!(row["configure"], ".*");
    let own = node.ctl_json(&["list_user_permissions", "alice"]);
    assert_eq!(find(&own, "vhost", "/").unwrap()["read"], ".*");

    node.ctl_ok(&["set_user_tags", "alice", "monitoring", "policymaker"]);
    let users = node.ctl_json(&["list_users"]);
    assert_eq!(
        find(&users, "user", "alice").unwrap()["tags"],
        serde_json::json!(["monitoring", "policymaker"])
    );
    // Tags kept the password; a new password replaces it and keeps the tags.
    login(&alice)
        .await
        .expect("same password after set_user_tags");
    node.ctl_ok(&["change_password", "alice", "n3w"]);
    assert!(login(&alice).await.is_err(), "the old password is refused");
    login(&node.amqp_uri("alice", "n3w", "/"))
        .await
        .expect("the new password");
    let users = node.ctl_json(&["list_users"]);
    assert_eq!(
        find(&users, "user", "alice").unwrap()["tags"],
        serde_json::json!(["monitoring", "policymaker"])
    );

    let again = node.ctl(&["add_user", "alice", "other"]);
    assert_eq!(again.status.code(), Some(70));
    assert!(stderr(&again).contains("user 'alice' already exists"));

    node.ctl_ok(&["clear_permissions", "alice"]);
    assert!(login(&node.amqp_uri("alice", "n3w", "/")).await.is_err());
    node.ctl_ok(&["delete_user", "alice"]);
    assert!(find(&node.ctl_json(&["list_users"]), "user", "alice").is_none());
    let missing = node.ctl(&["delete_user", "alice"]);
    assert_eq!(
        missing.status.code(),
        Some(67),
        "rabbitmqctl's 'no such user'"
    );
    assert_eq!(stderr(&missing), "Error: user 'alice' does not exist\n");
    let unknown_user = node.ctl(&["set_permissions", "nobody", ".*", ".*", ".*"]);
    assert_eq!(unknown_user.status.code(), Some(67));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_vhosts_are_added_listed_and_deleted() {
    let node = Node::start("vhosts").await;
    node.ctl_ok(&["add_vhost", "staging"]);
    let listed = node.ctl_ok(&["-q", "list_vhosts"]);
    assert!(listed.lines().any(|line| line == "staging"), "{listed}");
    assert!(listed.lines().any(|line| line == "/"), "{listed}");

    node.ctl_ok(&[
        "-p",
        "staging",
        "set_permissions",
        "guest",
        ".*",
        ".*",
        ".*",
    ]);
    let connection = support::connect_uri(&node.amqp_uri("guest", "guest", "staging")).await;
    publish(&connection, "in-staging", 1).await;
    let queues = node.ctl_json(&["list_queues", "-p", "staging"]);
    assert_eq!(
        queues,
        serde_json::json!([{"name": "in-staging", "messages": 1}])
    );
    let in_root = node.ctl_json(&["list_queues"]);
    assert_eq!(in_root, serde_json::json!([]));

    node.ctl_ok(&["delete_vhost", "staging"]);
    let listed = node.ctl_ok(&["-q", "list_vhosts"]);
    assert!(!listed.lines().any(|line| line == "staging"), "{listed}");
    let missing = node.ctl(&["delete_vhost", "staging"]);
    assert_eq!(missing.status.code(), Some(65));
    assert_eq!(stderr(&missing), "Error: vhost 'staging' does not exist\n");
    let listing = node.ctl(&["-p", "staging", "list_queues"]);
    assert_eq!(listing.status.code(), Some(65));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_close_connection_closes_a_live_connection_with_320_and_the_reason() {
    let node = Node::start("close").await;
    let connection = connect(node.amqp_port).await;
    let mut events = Box::pin(connection.events_listener());
    let listed = node.ctl_json(&["list_connections", "name", "user"]);
    let name = find(&listed, "user", "guest").expect("listed")["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(name.contains(" -> "), "a name with spaces and '>': {name}");

    node.ctl_ok(&["close_connection", &name, "maintenance window"]);
    let error = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.next().await.expect("events until the close") {
                lapin::Event::Error(error) => return error,
                _ => continue,
            }
        }
    })
    .await
    .expect("the client hears the close");
    let lapin::ErrorKind::ProtocolError(amqp) = error.kind() else {
        panic!("not a connection.close from the broker: {error:?}");
    };
    assert_eq!(amqp.get_id(), 320);
    assert_eq!(
        amqp.get_message().as_str(),
        "CONNECTION_FORCED - maintenance window"
    );
    assert!(!connection.status().connected());

    eventually("the closed connection is gone", || {
        let listed = node.ctl_json(&["list_connections", "name"]);
        find(&listed, "name", &name).is_none().then_some(())
    })
    .await;
    let again = node.ctl(&["close_connection", &name, "twice"]);
    assert_eq!(again.status.code(), Some(65));
    assert_eq!(
        stderr(&again),
        format!("Error: connection '{name}' does not exist\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_purge_queue_and_delete_queue() {
    let node = Node::start("purge-delete").await;
    let connection = connect(node.amqp_port).await;
    publish(&connection, "work", 4).await;
    publish(&connection, "keep", 2).await;
    let channel = connection.create_channel().await.unwrap();

    node.ctl_ok(&["purge_queue", "work"]);
    let work = declare_passive(&channel, "work").await.unwrap();
    assert_eq!(work.message_count(), 0);

    let refused = node.ctl(&["delete_queue", "keep", "--if-empty"]);
    assert_eq!(refused.status.code(), Some(70), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("not empty"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(
        declare_passive(&channel, "keep")
            .await
            .unwrap()
            .message_count(),
        2
    );

    let deleted = node.ctl_ok(&["delete_queue", "keep"]);
    assert_eq!(
        deleted,
        "Deleting queue 'keep' on vhost '/' ...\nQueue was successfully deleted with 2 messages\n"
    );
    assert!(declare_passive(&channel, "keep").await.is_err(), "gone");

    let missing = node.ctl(&["purge_queue", "nothing"]);
    assert_eq!(missing.status.code(), Some(65));
    assert_eq!(
        stderr(&missing),
        "Error: queue 'nothing' in vhost '/' does not exist\n"
    );
    let missing = node.ctl(&["delete_queue", "nothing"]);
    assert_eq!(missing.status.code(), Some(65));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_definitions_exported_from_one_node_rebuild_another() {
    let source = Node::start("export").await;
    let connection = connect(source.amqp_port).await;
    publish(&connection, "billing", 1).await;
    publish(&connection, "shipping", 0).await;
    drop(connection);
    source.ctl_ok(&["add_vhost", "reports"]);
    source.ctl_ok(&["add_user", "carol", "pw"]);

    let file = source.dir.join("definitions.json");
    let file_name = file.to_str().unwrap();
    source.ctl_ok(&["export_definitions", file_name]);
    let exported: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert!(find(&exported["queues"], "name", "billing").is_some());
    let to_stdout = source.ctl_ok(&["export_definitions", "-"]);
    let streamed: Value = serde_json::from_str(&to_stdout).expect("only JSON on stdout");
    assert_eq!(streamed["queues"], exported["queues"]);

    let target = Node::start("import").await;
    assert_eq!(target.ctl_json(&["list_queues"]), serde_json::json!([]));
    target.ctl_ok(&["import_definitions", file_name]);
    let queues = target.ctl_json(&["list_queues", "name", "durable"]);
    for name in ["billing", "shipping"] {
        assert_eq!(find(&queues, "name", name).expect(name)["durable"], true);
    }
    let vhosts = target.ctl_json(&["list_vhosts"]);
    assert!(find(&vhosts, "name", "reports").is_some());
    login(&target.amqp_uri("carol", "pw", "/"))
        .await
        .expect_err("carol has no permissions, but exists:");
    assert!(find(&target.ctl_json(&["list_users"]), "user", "carol").is_some());

    let not_json = target.dir.join("not.json");
    std::fs::write(&not_json, "queues: []").unwrap();
    let refused = target.ctl(&["import_definitions", not_json.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(65));
    assert!(stderr(&refused).contains("is not JSON"));
    let absent = target.ctl(&["import_definitions", "/nonexistent/definitions.json"]);
    assert_eq!(absent.status.code(), Some(65));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_reports_the_node_and_its_health() {
    let node = Node::start("status").await;
    let status = node.ctl_json(&["status"]);
    assert_eq!(status["product_name"], "Sluice");
    let listeners = status["listeners"].as_array().unwrap();
    assert!(listeners.contains(&Value::from(format!("amqp 127.0.0.1:{}", node.amqp_port))));
    let cluster = node.ctl_json(&["cluster_status"]);
    assert_eq!(
        cluster["running_nodes"],
        serde_json::json!([status["node"]])
    );
    let pinged = node.ctl_ok(&["ping"]);
    assert!(pinged.ends_with("Ping succeeded\n"), "{pinged}");
    let check = node.ctl(&["check_if_node_is_quorum_critical"]);
    assert_eq!(check.status.code(), Some(0), "{}", stderr(&check));
    assert!(stdout(&check).contains("no quorum critical queues"));
}

#[tokio::test]
async fn ctl_errors_name_the_problem_and_exit_with_rabbitmqctls_statuses() {
    // Nothing listens there: bound and released at once.
    let port = free_port();
    let unreachable = ctl_at(&format!("127.0.0.1:{port}"), &["list_queues"]);
    assert_eq!(unreachable.status.code(), Some(69));
    assert_eq!(
        stderr(&unreachable),
        format!("Error: unable to reach the node at http://127.0.0.1:{port}: connection refused\n")
    );
    let waited = ctl_at(
        &format!("127.0.0.1:{port}"),
        &["await_startup", "--timeout", "1"],
    );
    assert_eq!(waited.status.code(), Some(75), "{}", stderr(&waited));

    let usage = ctl_at("127.0.0.1:1", &["no_such_command"]);
    assert_eq!(usage.status.code(), Some(64));
    let bad_node = ctl_at("https://broker", &["status"]);
    assert_eq!(bad_node.status.code(), Some(64));

    let node = Node::start("errors").await;
    let wrong = node.ctl(&["--password", "wrong", "list_queues"]);
    assert_eq!(wrong.status.code(), Some(77));
    assert_eq!(
        stderr(&wrong),
        "Error: the node refused the credentials of user 'guest': Login failed\n"
    );
    let from_env = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["ctl", "-n", &format!("127.0.0.1:{}", node.management_port)])
        .arg("list_users")
        .env("SLUICE_CTL_USERNAME", "guest")
        .env("SLUICE_CTL_PASSWORD", "wrong")
        .output()
        .unwrap();
    assert_eq!(
        from_env.status.code(),
        Some(77),
        "the password comes from the environment"
    );

    let bad_policy = node.ctl(&["set_policy", "p", "^q", "{not json"]);
    assert_eq!(bad_policy.status.code(), Some(65));
}

/// Policies go through RabbitMQ's `/api/policies/{vhost}/{name}` and
/// reach the queue that exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_policies_are_set_listed_and_cleared() {
    let node = Node::start("policies").await;
    let connection = connect(node.amqp_port).await;
    publish(&connection, "capped", 0).await;
    node.ctl_ok(&[
        "set_policy",
        "--priority",
        "3",
        "--apply-to",
        "queues",
        "cap",
        "^capped$",
        r#"{"max-length": 1}"#,
    ]);
    let policies = node.ctl_json(&["list_policies"]);
    let cap = find(&policies, "name", "cap").expect("listed");
    assert_eq!(cap["pattern"], "^capped$");
    assert_eq!(cap["priority"], 3);
    assert_eq!(cap["apply-to"], "queues");
    assert_eq!(cap["definition"], serde_json::json!({"max-length": 1}));
    let queues = node.ctl_json(&["list_queues", "name", "policy"]);
    assert_eq!(find(&queues, "name", "capped").unwrap()["policy"], "cap");
    node.ctl_ok(&["clear_policy", "cap"]);
    assert_eq!(node.ctl_json(&["list_policies"]), serde_json::json!([]));
    let missing = node.ctl(&["clear_policy", "cap"]);
    assert_eq!(missing.status.code(), Some(65));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_quorum_queue_members_are_refused_as_rabbitmq_queues_refuses_them() {
    let node = Node::start("members").await;
    let connection = connect(node.amqp_port).await;
    publish(&connection, "classic", 1).await;
    let channel = connection.create_channel().await.unwrap();
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        lapin::types::AMQPValue::LongString("quorum".into()),
    );
    channel
        .queue_declare(
            "replicated".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            arguments,
        )
        .await
        .unwrap();
    let queues = node.ctl_json(&["list_queues", "name", "members"]);
    let member = find(&queues, "name", "replicated").unwrap()["members"][0]
        .as_str()
        .unwrap()
        .to_owned();

    // Already a member: nothing to do, as with RabbitMQ.
    let added = node.ctl_ok(&["add_member", "replicated", &member]);
    assert_eq!(
        added,
        format!("Adding a replica for queue replicated on node {member}...\n")
    );
    let last = node.ctl(&["delete_member", "replicated", &member]);
    assert_eq!(last.status.code(), Some(70), "{}", stderr(&last));
    assert!(stderr(&last).contains("last_node"), "{}", stderr(&last));
    let classic = node.ctl(&["add_member", "classic", &member]);
    assert_eq!(
        stderr(&classic),
        "Error: Cannot add members to a classic queue\n"
    );
    let missing = node.ctl(&["add_member", "nothing", &member]);
    assert_eq!(missing.status.code(), Some(65), "{}", stderr(&missing));
    let stranger = node.ctl(&["grow", "nobody@127.0.0.1:1", "all"]);
    assert!(
        stderr(&stranger).contains("node_not_running"),
        "{}",
        stderr(&stranger)
    );
    // No quorum queue has a member there: nothing to shrink.
    node.ctl_ok(&["shrink", "nobody@127.0.0.1:1"]);
    node.ctl_ok(&["grow", &member, "even", "--queue-pattern", "^repl"]);
    let queues = node.ctl_json(&["list_queues", "name", "members"]);
    assert_eq!(
        find(&queues, "name", "replicated").unwrap()["members"],
        serde_json::json!([member])
    );
}
