//! The management HTTP API over real HTTP, with RabbitMQ's paths, fields,
//! status codes and error bodies, checked against what AMQP clients see.

mod helpers;
mod support;

use helpers::*;
use lapin::options::{BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use serde_json::{json, Value};
use support::raw::{close_reply, RawClient};
use support::TestServer;

async fn start() -> TestServer {
    TestServer::start_with(|config| {
        config.management.listener.ip = "127.0.0.1".parse().unwrap();
        config.management.listener.port = 0;
        config.management.listener.configured = true;
    })
    .await
}

/// An HTTP response: status, the headers asked for, and the body as JSON
/// (Null when empty).
struct Response {
    status: u16,
    location: Option<String>,
    authenticate: Option<String>,
    body: Value,
}

/// One request as `user`, run off the runtime (ureq blocks).
async fn request(
    server: &TestServer,
    method: &'static str,
    path: &str,
    credentials: Option<(&str, &str)>,
    body: Option<Value>,
    reason: Option<&str>,
) -> Response {
    let address = server.running().management_address.expect("the API is on");
    let url = format!("http://{address}{path}");
    let credentials = credentials.map(|(user, password)| (user.to_owned(), password.to_owned()));
    let reason = reason.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut builder = ureq::http::Request::builder().method(method).uri(&url);
        if let Some((user, password)) = &credentials {
            use base64::Engine;
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            builder = builder.header("authorization", format!("Basic {token}"));
        }
        if let Some(reason) = &reason {
            builder = builder.header("x-reason", reason);
        }
        let payload = body.map(|body| body.to_string()).unwrap_or_default();
        let request = builder
            .header("content-type", "application/json")
            .body(payload)
            .unwrap();
        let mut response = agent.run(request).expect("the API answers");
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let (location, authenticate) = (header("location"), header("www-authenticate"));
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        Response {
            status,
            location,
            authenticate,
            body: if text.is_empty() {
                Value::Null
            } else {
                serde_json::from_str(&text).expect("a JSON body")
            },
        }
    })
    .await
    .unwrap()
}

const GUEST: Option<(&str, &str)> = Some(("guest", "guest"));

async fn get(server: &TestServer, path: &str) -> Value {
    let response = request(server, "GET", path, GUEST, None, None).await;
    assert_eq!(response.status, 200, "GET {path}: {}", response.body);
    response.body
}

#[tokio::test]
async fn management_api_authenticates_with_rabbitmq_errors() {
    let server = start().await;
    let anonymous = request(&server, "GET", "/api/overview", None, None, None).await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(
        anonymous.authenticate.as_deref(),
        Some("Basic realm=\"RabbitMQ Management\"")
    );
    assert_eq!(anonymous.body, Value::Null, "a bare 401, as RabbitMQ's");
    let unknown = request(&server, "GET", "/api/nosuch", GUEST, None, None).await;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        unknown.body,
        json!({"error": "Object Not Found", "reason": "Not Found"})
    );
    // amqp091-go's tests list connections with a trailing slash.
    let slash = request(&server, "GET", "/api/connections/", GUEST, None, None).await;
    assert_eq!(slash.status, 200);
    let wrong = request(
        &server,
        "GET",
        "/api/overview",
        Some(("guest", "nope")),
        None,
        None,
    )
    .await;
    assert_eq!(wrong.status, 401);
    assert_eq!(
        wrong.body,
        json!({"error": "not_authorized", "reason": "Login failed"})
    );
    // A user without a management tag may use AMQP but not the API.
    let created = request(
        &server,
        "PUT",
        "/api/users/worker",
        GUEST,
        Some(json!({"password": "pw", "tags": ""})),
        None,
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let refused = request(
        &server,
        "GET",
        "/api/overview",
        Some(("worker", "pw")),
        None,
        None,
    )
    .await;
    assert_eq!(refused.status, 401);
    assert_eq!(
        refused.body,
        json!({"error": "not_authorised", "reason": "Not management user"})
    );
    // A monitoring user reads, but changes nothing.
    let tagged = request(
        &server,
        "PUT",
        "/api/users/watcher",
        GUEST,
        Some(json!({"password": "pw", "tags": ["monitoring"]})),
        None,
    )
    .await;
    assert_eq!(tagged.status, 201);
    let watcher = Some(("watcher", "pw"));
    let whoami = request(&server, "GET", "/api/whoami", watcher, None, None).await;
    assert_eq!(
        whoami.body,
        json!({"name": "watcher", "tags": ["monitoring"]})
    );
    let users = request(&server, "GET", "/api/users", watcher, None, None).await;
    assert_eq!(users.status, 401);
    assert_eq!(users.body["reason"], "Not administrator user");
    let overview = get(&server, "/api/overview").await;
    assert_eq!(overview["rabbitmq_version"], "3.10.8");
    assert_eq!(
        overview["node"],
        server.running().broker.node().name.as_ref()
    );
    let exchanges = server
        .running()
        .broker
        .vhost("/")
        .unwrap()
        .exchanges()
        .len();
    assert!(exchanges >= 5, "the amq.* exchanges");
    assert_eq!(overview["object_totals"]["exchanges"], exchanges);
    server.stop().await;
}

#[tokio::test]
async fn management_api_declares_publishes_gets_and_deletes_what_clients_see() {
    let server = start().await;
    let transient = request(
        &server,
        "PUT",
        "/api/exchanges/%2F/scratch",
        GUEST,
        Some(json!({})),
        None,
    )
    .await;
    assert_eq!(transient.status, 201);
    let scratch = get(&server, "/api/exchanges/%2F/scratch").await;
    assert_eq!(
        (scratch["type"].as_str(), scratch["durable"].as_bool()),
        (Some("direct"), Some(false))
    );
    let exchange = json!({"type": "direct", "durable": true});
    let new = request(
        &server,
        "PUT",
        "/api/exchanges/%2F/orders",
        GUEST,
        Some(exchange.clone()),
        None,
    )
    .await;
    assert_eq!(new.status, 201);
    let again = request(
        &server,
        "PUT",
        "/api/exchanges/%2F/orders",
        GUEST,
        Some(exchange),
        None,
    )
    .await;
    assert_eq!(again.status, 204);
    let inequivalent = request(
        &server,
        "PUT",
        "/api/exchanges/%2F/orders",
        GUEST,
        Some(json!({"type": "direct", "durable": false})),
        None,
    )
    .await;
    assert_eq!(inequivalent.status, 400);
    assert_eq!(
        inequivalent.body["reason"],
        "inequivalent arg 'durable' for exchange 'orders' in vhost '/': received 'false' but current is 'true'"
    );
    let queue = request(
        &server,
        "PUT",
        "/api/queues/%2F/jobs",
        GUEST,
        Some(json!({"durable": true, "arguments": {"x-max-length": 100}})),
        None,
    )
    .await;
    assert_eq!(queue.status, 201, "{}", queue.body);
    let bound = request(
        &server,
        "POST",
        "/api/bindings/%2F/e/orders/q/jobs",
        GUEST,
        Some(json!({"routing_key": "new.*", "arguments": {}})),
        None,
    )
    .await;
    assert_eq!(bound.status, 201);
    assert_eq!(bound.location.as_deref(), Some("jobs/new.%252A"));
    // An AMQP client sees the queue and its binding.
    let (_connection, channel) = open(&server).await;
    publish(&channel, "orders", "new.*", b"from amqp").await;
    let routed = request(
        &server,
        "POST",
        "/api/exchanges/%2F/orders/publish",
        GUEST,
        Some(json!({
            "properties": {"delivery_mode": 2, "headers": {"n": 1}, "message_id": "m1"},
            "routing_key": "new.*",
            "payload": "from http",
            "payload_encoding": "string",
        })),
        None,
    )
    .await;
    assert_eq!(routed.body, json!({"routed": true}));
    let unrouted = request(
        &server,
        "POST",
        "/api/exchanges/%2F/orders/publish",
        GUEST,
        Some(json!({"properties": {}, "routing_key": "old", "payload": "x", "payload_encoding": "string"})),
        None,
    )
    .await;
    assert_eq!(unrouted.body, json!({"routed": false}));
    let shown = get(&server, "/api/queues/%2F/jobs").await;
    assert_eq!(shown["messages"], 2);
    assert_eq!(shown["type"], "classic");
    assert_eq!(shown["arguments"], json!({"x-max-length": 100}));
    let bindings = get(&server, "/api/queues/%2F/jobs/bindings").await;
    assert_eq!(
        bindings
            .as_array()
            .unwrap()
            .iter()
            .map(|binding| (
                binding["source"].as_str().unwrap(),
                binding["properties_key"].as_str().unwrap()
            ))
            .collect::<Vec<_>>(),
        [("", "jobs"), ("orders", "new.%2A")]
    );
    let got = request(
        &server,
        "POST",
        "/api/queues/%2F/jobs/get",
        GUEST,
        Some(json!({"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"})),
        None,
    )
    .await;
    let messages = got.body.as_array().expect("a list of messages");
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["payload"], "from amqp");
    assert_eq!(messages[1]["payload"], "from http");
    assert_eq!(messages[1]["message_count"], 0);
    assert_eq!(
        messages[1]["properties"],
        json!({"delivery_mode": 2, "headers": {"n": 1}, "message_id": "m1"})
    );
    // Requeued, and redelivered to the next reader.
    let delivery = get_body(&channel, "jobs", true).await;
    assert_eq!(delivery.as_deref(), Some(&b"from amqp"[..]));
    // Counted as RabbitMQ counts them: two gets to acknowledge (the API's),
    // one with automatic acknowledgement (the client's).
    let stats = &get(&server, "/api/queues/%2F/jobs").await["message_stats"];
    assert_eq!(
        (stats["get"].as_u64(), stats["get_no_ack"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(
        (stats["deliver"].as_u64(), stats["deliver_get"].as_u64()),
        (Some(0), Some(3))
    );
    assert_eq!(stats["redeliver"], 1);
    // The vhost holds what its queues hold, and counts every publish, the
    // client's and the API's two (one routed nowhere).
    let vhost = get(&server, "/api/vhosts/%2F").await;
    assert_eq!(
        (
            vhost["messages"].as_u64(),
            vhost["messages_ready"].as_u64(),
            vhost["messages_unacknowledged"].as_u64()
        ),
        (Some(1), Some(1), Some(0))
    );
    assert_eq!(vhost["message_stats"]["publish"], 3);
    assert_eq!(vhost["message_stats"]["drop_unroutable"], 1);
    let overview = get(&server, "/api/overview").await;
    assert_eq!(overview["queue_totals"]["messages_ready"], 1);
    let purged = request(
        &server,
        "DELETE",
        "/api/queues/%2F/jobs/contents",
        GUEST,
        None,
        None,
    )
    .await;
    assert_eq!(purged.status, 204);
    assert_eq!(get(&server, "/api/queues/%2F/jobs").await["messages"], 0);
    let deleted = request(&server, "DELETE", "/api/queues/%2F/jobs", GUEST, None, None).await;
    assert_eq!(deleted.status, 204);
    let missing = request(&server, "DELETE", "/api/queues/%2F/jobs", GUEST, None, None).await;
    assert_eq!(missing.status, 404);
    assert_eq!(
        missing.body,
        json!({"error": "Object Not Found", "reason": "Not Found"})
    );
    let passive = channel
        .queue_declare(
            "jobs".into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            Default::default(),
        )
        .await;
    assert_eq!(amqp_error(passive).0, 404);
    server.stop().await;
}

#[tokio::test]
async fn management_api_lists_connections_channels_and_consumers_and_closes_one() {
    let server = start().await;
    let (connection, channel) = open(&server).await;
    channel
        .basic_qos(7, BasicQosOptions::default())
        .await
        .unwrap();
    declare(&channel, "work").await;
    let _consumer = channel
        .basic_consume(
            "work".into(),
            "worker-1".into(),
            BasicConsumeOptions::default(),
            Default::default(),
        )
        .await
        .unwrap();
    let connections = get(&server, "/api/connections").await;
    let listed = &connections.as_array().unwrap()[0];
    assert_eq!(listed["user"], "guest");
    assert_eq!(listed["vhost"], "/");
    assert_eq!(listed["protocol"], "AMQP 0-9-1");
    let name = listed["name"].as_str().unwrap().to_owned();
    assert!(name.ends_with(&format!(" -> {}", server.address)), "{name}");
    let channels = get(&server, "/api/channels").await;
    let first = &channels.as_array().unwrap()[0];
    assert_eq!(first["name"], format!("{name} (1)"));
    assert_eq!(first["prefetch_count"], 7);
    assert_eq!(first["consumer_count"], 1);
    let consumers = get(&server, "/api/consumers/%2F").await;
    assert_eq!(consumers[0]["consumer_tag"], "worker-1");
    assert_eq!(consumers[0]["queue"], json!({"name": "work", "vhost": "/"}));
    assert_eq!(consumers[0]["prefetch_count"], 7);
    // Paged and trimmed as RabbitMQ's lists are.
    let page = get(
        &server,
        "/api/queues?page=1&page_size=1&columns=name,consumers",
    )
    .await;
    assert_eq!(page["items"], json!([{"name": "work", "consumers": 1}]));
    connection.close(200, "done".into()).await.unwrap();
    // Closing a connection: the client hears 320 and the reason given.
    let mut raw = RawClient::open(server.address).await;
    let mut name = String::new();
    eventually("the raw connection is listed", || {
        let snapshots = server.running().connections();
        if let Some(snapshot) = snapshots
            .iter()
            .find(|snapshot| snapshot.identity.user == "guest")
        {
            name = snapshot.identity.name();
        }
        snapshots.len() == 1
    })
    .await;
    let path = format!(
        "/api/connections/{}",
        name.replace(' ', "%20").replace('>', "%3E")
    );
    let closed = request(
        &server,
        "DELETE",
        &path,
        GUEST,
        None,
        Some("maintenance window"),
    )
    .await;
    assert_eq!(closed.status, 204);
    let close = raw.expect_connection_close().await;
    assert_eq!(
        close_reply(&close),
        (320, "CONNECTION_FORCED - maintenance window".to_owned())
    );
    server.stop().await;
}

#[tokio::test]
async fn management_api_users_vhosts_and_permissions_reach_amqp_logins() {
    let server = start().await;
    let put = |path: &'static str, body: Value| {
        let server = &server;
        async move {
            request(server, "PUT", path, GUEST, Some(body), None)
                .await
                .status
        }
    };
    assert_eq!(put("/api/vhosts/staging", json!({})).await, 201);
    assert_eq!(
        put(
            "/api/users/deployer",
            json!({"password": "s3cret", "tags": "management"})
        )
        .await,
        201
    );
    assert_eq!(
        put(
            "/api/permissions/staging/deployer",
            json!({"configure": ".*", "write": ".*", "read": ".*"})
        )
        .await,
        201
    );
    let permissions = get(&server, "/api/users/deployer/permissions").await;
    assert_eq!(
        permissions,
        json!([{"user": "deployer", "vhost": "staging", "configure": ".*", "write": ".*", "read": ".*"}])
    );
    // The new user logs in over AMQP to the new vhost.
    let uri = format!("amqp://deployer:s3cret@{}/staging", server.address);
    let connection = lapin::Connection::connect(&uri, Default::default())
        .await
        .expect("the new user logs in");
    assert!(connection.status().connected());
    // A limit set through the API holds for AMQP clients.
    let limited = request(
        &server,
        "PUT",
        "/api/vhost-limits/staging/max-queues",
        GUEST,
        Some(json!({"value": 1})),
        None,
    )
    .await;
    assert_eq!(limited.status, 204, "{}", limited.body);
    assert_eq!(
        get(&server, "/api/vhost-limits/staging").await,
        json!([{"vhost": "staging", "value": {"max-queues": 1}}])
    );
    let channel = connection.create_channel().await.unwrap();
    declare(&channel, "first").await;
    let second = channel
        .queue_declare("second".into(), Default::default(), Default::default())
        .await;
    assert_eq!(amqp_error(second).0, 406);
    let topic = request(
        &server,
        "PUT",
        "/api/topic-permissions/staging/deployer",
        GUEST,
        Some(json!({"exchange": "amq.topic", "write": "^deploy\\.", "read": ".*"})),
        None,
    )
    .await;
    assert_eq!(topic.status, 201);
    assert_eq!(
        get(&server, "/api/topic-permissions/staging/deployer").await[0]["write"],
        "^deploy\\."
    );
    // Its management view holds its own vhost only.
    let vhosts = request(
        &server,
        "GET",
        "/api/vhosts",
        Some(("deployer", "s3cret")),
        None,
        None,
    )
    .await;
    assert_eq!(vhosts.body.as_array().unwrap().len(), 1);
    assert_eq!(vhosts.body[0]["name"], "staging");
    // Deleting the user closes its connection, as RabbitMQ does.
    let mut raw = RawClient::open_with(
        server.address,
        support::raw::Handshake {
            vhost: "staging".into(),
            ..support::raw::Handshake::plain("deployer", "s3cret")
        },
    )
    .await
    .0;
    let deleted = request(&server, "DELETE", "/api/users/deployer", GUEST, None, None).await;
    assert_eq!(deleted.status, 204);
    let close = raw.expect_connection_close().await;
    assert_eq!(
        close_reply(&close),
        (
            320,
            "CONNECTION_FORCED - user 'deployer' is deleted".to_owned()
        )
    );
    let missing = request(&server, "DELETE", "/api/users/deployer", GUEST, None, None).await;
    assert_eq!(missing.status, 404);
    server.stop().await;
}

#[tokio::test]
async fn management_api_definitions_export_and_import_round_trip() {
    let source = start().await;
    let definitions = json!({
        "vhosts": [{"name": "/"}, {"name": "billing"}],
        "users": [{
            "name": "accountant",
            "password_hash": "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR",
            "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": ["management"],
        }],
        "permissions": [{"user": "accountant", "vhost": "billing", "configure": "^inv", "write": ".*", "read": ".*"}],
        "parameters": [{"vhost": "billing", "component": "vhost-limits", "name": "limits", "value": {"max-queues": 10}}],
        "policies": [{"vhost": "billing", "name": "short", "pattern": "^invoices", "apply-to": "queues", "priority": 0, "definition": {"message-ttl": 60000}}],
        "exchanges": [{"name": "invoices", "vhost": "billing", "type": "topic", "durable": true, "auto_delete": false, "internal": false, "arguments": {}}],
        "queues": [{"name": "invoices.eu", "vhost": "billing", "durable": true, "auto_delete": false, "arguments": {"x-max-length": 50}}],
        "bindings": [{"source": "invoices", "vhost": "billing", "destination": "invoices.eu", "destination_type": "queue", "routing_key": "eu.#", "arguments": {}}],
    });
    let imported = request(
        &source,
        "POST",
        "/api/definitions",
        GUEST,
        Some(definitions),
        None,
    )
    .await;
    assert_eq!(imported.status, 204, "{}", imported.body);
    let not_json = request(&source, "POST", "/api/definitions", GUEST, None, None).await;
    assert_eq!(not_json.status, 400);
    // What was imported is what an AMQP client finds.
    let (_connection, channel) = open(&source).await;
    drop(channel);
    let shown = get(&source, "/api/queues/billing/invoices.eu").await;
    assert_eq!(shown["arguments"], json!({"x-max-length": 50}));
    let exported = get(&source, "/api/definitions").await;
    let names = |section: &str| -> Vec<String> {
        exported[section]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| item["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert!(names("users").contains(&"accountant".to_owned()));
    assert!(names("vhosts").contains(&"billing".to_owned()));
    assert_eq!(names("exchanges"), ["invoices"]);
    assert_eq!(names("queues"), ["invoices.eu"]);
    assert_eq!(names("policies"), ["short"]);
    assert_eq!(exported["bindings"][0]["routing_key"], "eu.#");
    assert_eq!(
        exported["parameters"],
        json!([{"value": {"max-queues": 10}, "vhost": "billing", "component": "vhost-limits", "name": "limits"}])
    );
    // Into a fresh node, and out again: the same definitions.
    let target = start().await;
    let again = request(
        &target,
        "POST",
        "/api/definitions",
        GUEST,
        Some(exported.clone()),
        None,
    )
    .await;
    assert_eq!(again.status, 204, "{}", again.body);
    let round_tripped = get(&target, "/api/definitions").await;
    for section in [
        "users",
        "vhosts",
        "permissions",
        "parameters",
        "exchanges",
        "queues",
        "bindings",
    ] {
        assert_eq!(round_tripped[section], exported[section], "{section}");
    }
    // Into one vhost: its kinds of definitions land there, whatever vhost
    // they name; users and vhosts are left alone.
    let into_vhost = json!({
        "users": [{"name": "ignored", "password_hash": "", "tags": []}],
        "vhosts": [{"name": "ignored"}],
        "queues": [{"name": "archive", "vhost": "elsewhere", "durable": true, "auto_delete": false, "arguments": {}}],
        "exchanges": [{"name": "archived", "vhost": "elsewhere", "type": "fanout", "durable": true, "auto_delete": false, "internal": false, "arguments": {}}],
        "bindings": [{"source": "archived", "vhost": "elsewhere", "destination": "archive", "destination_type": "queue", "routing_key": "", "arguments": {}}],
    });
    let imported = request(
        &target,
        "POST",
        "/api/definitions/billing",
        GUEST,
        Some(into_vhost.clone()),
        None,
    )
    .await;
    assert_eq!(imported.status, 204, "{}", imported.body);
    let billing = get(&target, "/api/definitions/billing").await;
    let queue_names: Vec<&str> = billing["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|queue| queue["name"].as_str().unwrap())
        .collect();
    assert_eq!(queue_names, ["archive", "invoices.eu"]);
    assert_eq!(billing["bindings"].as_array().unwrap().len(), 2);
    let users = get(&target, "/api/users").await;
    assert!(!users.to_string().contains("ignored"));
    assert_eq!(
        get(&target, "/api/vhosts").await.as_array().unwrap().len(),
        2
    );
    let unknown = request(
        &target,
        "POST",
        "/api/definitions/nowhere",
        GUEST,
        Some(into_vhost),
        None,
    )
    .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        unknown.body,
        json!({"error": "not_found", "reason": "vhost_not_found"})
    );
    // The imported password hash logs in.
    let uri = format!("amqp://accountant:test12@{}/billing", target.address);
    let login = lapin::Connection::connect(&uri, Default::default()).await;
    assert!(login.is_ok(), "the imported user logs in: {login:?}");
    source.stop().await;
    target.stop().await;
}

#[tokio::test]
async fn management_api_policies_and_parameters_change_live_queues() {
    let server = start().await;
    let (_connection, channel) = open(&server).await;
    declare(&channel, "orders").await;
    for number in 0..5 {
        publish(&channel, "", "orders", format!("order {number}").as_bytes()).await;
    }
    let policy = json!({"pattern": "^orders$", "definition": {"max-length": 2}, "priority": 1, "apply-to": "queues"});
    let set = request(
        &server,
        "PUT",
        "/api/policies/%2F/bounded",
        GUEST,
        Some(policy.clone()),
        None,
    )
    .await;
    assert_eq!(set.status, 201, "{}", set.body);
    let again = request(
        &server,
        "PUT",
        "/api/policies/%2F/bounded",
        GUEST,
        Some(policy),
        None,
    )
    .await;
    assert_eq!(again.status, 204);
    // The live queue drops to the new limit, oldest first.
    let shown = get(&server, "/api/queues/%2F/orders").await;
    assert_eq!(shown["policy"], "bounded");
    assert_eq!(
        shown["effective_policy_definition"],
        json!({"max-length": 2})
    );
    assert_eq!(shown["messages"], 2);
    assert_eq!(
        get_body(&channel, "orders", true).await.as_deref(),
        Some(&b"order 3"[..])
    );
    assert_eq!(
        get(&server, "/api/policies/%2F/bounded").await,
        json!({"vhost": "/", "name": "bounded", "pattern": "^orders$", "apply-to": "queues", "definition": {"max-length": 2}, "priority": 1})
    );
    // Refusals in RabbitMQ's words, escaped as its API escapes them.
    let bad_key = request(
        &server,
        "PUT",
        "/api/policies/%2F/bad",
        GUEST,
        Some(json!({"pattern": "x", "definition": {"bogus-key": 1}})),
        None,
    )
    .await;
    assert_eq!(bad_key.status, 400);
    assert_eq!(
        bad_key.body["reason"],
        "Validation failed\n\n[{&lt;&lt;\"bogus-key\"&gt;&gt;,1}] are not recognised policy settings\n"
    );
    let bad_priority = request(
        &server,
        "PUT",
        "/api/policies/%2F/bad",
        GUEST,
        Some(json!({"pattern": "x", "definition": {"max-length": 1}, "priority": "3"})),
        None,
    )
    .await;
    assert_eq!(
        bad_priority.body["reason"],
        "Validation failed\n\npriority should be a number, actually was &lt;&lt;\"3\"&gt;&gt;\n"
    );
    // Cleared: the limit goes with it.
    let cleared = request(
        &server,
        "DELETE",
        "/api/policies/%2F/bounded",
        GUEST,
        None,
        None,
    )
    .await;
    assert_eq!(cleared.status, 204);
    for number in 0..4 {
        publish(&channel, "", "orders", format!("more {number}").as_bytes()).await;
    }
    let unbounded = get(&server, "/api/queues/%2F/orders").await;
    assert_eq!(unbounded["messages"], 5);
    assert_eq!(unbounded["policy"], Value::Null);
    let missing = request(
        &server,
        "DELETE",
        "/api/policies/%2F/bounded",
        GUEST,
        None,
        None,
    )
    .await;
    assert_eq!(missing.status, 404);
    // Parameters: vhost limits are one, unknown components are refused.
    let limits = request(
        &server,
        "PUT",
        "/api/parameters/vhost-limits/%2F/limits",
        GUEST,
        Some(json!({"value": {"max-connections": 50}})),
        None,
    )
    .await;
    assert_eq!(limits.status, 201, "{}", limits.body);
    assert_eq!(
        get(&server, "/api/vhost-limits/%2F").await,
        json!([{"vhost": "/", "value": {"max-connections": 50}}])
    );
    let unknown = request(
        &server,
        "PUT",
        "/api/parameters/nosuch-component/%2F/x",
        GUEST,
        Some(json!({"value": {}})),
        None,
    )
    .await;
    assert_eq!(unknown.status, 400);
    assert_eq!(
        unknown.body["reason"],
        "Validation failed\n\ncomponent nosuch-component not found\n"
    );
    let named = request(
        &server,
        "PUT",
        "/api/cluster-name",
        GUEST,
        Some(json!({"name": "production-eu"})),
        None,
    )
    .await;
    assert_eq!(named.status, 204);
    assert_eq!(
        get(&server, "/api/cluster-name").await,
        json!({"name": "production-eu"})
    );
    assert_eq!(
        get(&server, "/api/overview").await["cluster_name"],
        "production-eu"
    );
    server.stop().await;
}

/// `(vhost, name)` of each item of a list, in its order.
fn vhosts_and_names(listed: &Value) -> Vec<(String, String)> {
    listed
        .as_array()
        .expect("a list")
        .iter()
        .map(|item| {
            let text = |key: &str| item[key].as_str().unwrap_or_default().to_owned();
            (text("vhost"), text("name"))
        })
        .collect()
}

#[tokio::test]
async fn management_api_lists_sort_by_vhost_then_name_as_rabbitmq_does() {
    let server = start().await;
    let put = |path: String, body: Value| {
        let server = &server;
        async move {
            let response = request(server, "PUT", &path, GUEST, Some(body), None).await;
            assert!(
                matches!(response.status, 201 | 204),
                "PUT {path}: {}",
                response.body
            );
        }
    };
    // Names that interleave across vhosts: sorted by name alone, vhost b's
    // "aa" would come first and vhost a's "zz" last.
    for vhost in ["a", "b"] {
        put(format!("/api/vhosts/{vhost}"), json!({})).await;
    }
    for (vhost, name) in [("b", "aa"), ("a", "zz"), ("%2F", "mm"), ("a", "bb")] {
        put(format!("/api/queues/{vhost}/{name}"), json!({})).await;
        put(format!("/api/exchanges/{vhost}/x-{name}"), json!({})).await;
    }
    let by_vhost_then_name = [("/", "mm"), ("a", "bb"), ("a", "zz"), ("b", "aa")]
        .map(|(vhost, name)| (vhost.to_owned(), name.to_owned()));
    assert_eq!(
        vhosts_and_names(&get(&server, "/api/queues").await),
        by_vhost_then_name
    );
    let exchanges = get(&server, "/api/exchanges?columns=vhost,name").await;
    let ours: Vec<(String, String)> = vhosts_and_names(&exchanges)
        .into_iter()
        .filter_map(|(vhost, name)| Some((vhost, name.strip_prefix("x-")?.to_owned())))
        .collect();
    assert_eq!(ours, by_vhost_then_name);
    // A sort field asked for comes first; vhost and name break its ties.
    let by_durable = get(&server, "/api/queues?sort=durable&sort_reverse=true").await;
    let reversed: Vec<_> = by_vhost_then_name.iter().rev().cloned().collect();
    assert_eq!(vhosts_and_names(&by_durable), reversed);
    // Bindings: the default exchange's, by vhost first.
    let bindings: Vec<(String, String)> = get(&server, "/api/bindings")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|binding| {
            let text = |key: &str| binding[key].as_str().unwrap_or_default().to_owned();
            (text("vhost"), text("destination"))
        })
        .collect();
    assert_eq!(bindings, by_vhost_then_name);
    // Policies: by priority, then vhost and name.
    for (vhost, name, priority) in [("b", "p", 0), ("a", "q", 1), ("%2F", "r", 0)] {
        put(
            format!("/api/policies/{vhost}/{name}"),
            json!({"pattern": "^none$", "definition": {"max-length": 1}, "priority": priority}),
        )
        .await;
    }
    assert_eq!(
        vhosts_and_names(&get(&server, "/api/policies").await),
        [("/", "r"), ("b", "p"), ("a", "q")]
            .map(|(vhost, name)| (vhost.to_owned(), name.to_owned()))
    );
    server.stop().await;
}

#[tokio::test]
async fn management_api_vhost_limit_changes_made_at_once_both_hold() {
    let server = start().await;
    for round in 1..=10u64 {
        let limit = |name: &str, value: u64| {
            let path = format!("/api/vhost-limits/%2F/{name}");
            let server = &server;
            async move {
                request(
                    server,
                    "PUT",
                    &path,
                    GUEST,
                    Some(json!({"value": value})),
                    None,
                )
                .await
            }
        };
        let (connections, queues) = tokio::join!(
            limit("max-connections", 100 + round),
            limit("max-queues", round)
        );
        assert_eq!((connections.status, queues.status), (204, 204));
        assert_eq!(
            get(&server, "/api/vhost-limits/%2F").await,
            json!([{"vhost": "/", "value": {"max-connections": 100 + round, "max-queues": round}}]),
            "round {round}"
        );
    }
    let unknown = request(
        &server,
        "PUT",
        "/api/vhost-limits/%2F/max-channels",
        GUEST,
        Some(json!({"value": 1})),
        None,
    )
    .await;
    assert_eq!(unknown.status, 400);
    let cleared = request(
        &server,
        "DELETE",
        "/api/vhost-limits/%2F/max-queues",
        GUEST,
        None,
        None,
    )
    .await;
    assert_eq!(cleared.status, 204);
    assert_eq!(
        get(&server, "/api/vhost-limits/%2F").await,
        json!([{"vhost": "/", "value": {"max-connections": 110}}])
    );
    server.stop().await;
}

#[tokio::test]
async fn management_api_serves_a_bounded_number_of_connections_and_the_next_waits() {
    use sluice_server::http_listener::HTTP_CONNECTIONS_MAX;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    let server = start().await;
    let address = server.running().management_address.expect("the API is on");
    // Connections that send nothing hold every slot.
    let mut idle = Vec::new();
    for _ in 0..HTTP_CONNECTIONS_MAX {
        idle.push(TcpStream::connect(address).await.unwrap());
    }
    let mut waiting = TcpStream::connect(address).await.unwrap();
    waiting
        .write_all(
            b"GET /api/overview HTTP/1.1\r\nHost: localhost\r\n\
              Authorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    let early = tokio::time::timeout(
        std::time::Duration::from_millis(500),
        waiting.read_to_end(&mut answer),
    )
    .await;
    assert!(early.is_err(), "no answer while every slot is taken");
    drop(idle);
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        waiting.read_to_end(&mut answer),
    )
    .await
    .expect("an answer once the idle connections close")
    .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    server.stop().await;
}
