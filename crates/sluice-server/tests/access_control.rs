//! Users, permissions and vhost limits: a definitions file exported by
//! RabbitMQ 3.10.8 (tests/fixtures) loaded unchanged, its users logging in
//! with their RabbitMQ passwords, and every refused operation answered with
//! the code and text RabbitMQ 3.10.8 answers it with (recorded against a
//! real node with the same definitions).

mod helpers;
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use helpers::*;
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    ExchangeBindOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use support::TestServer;

fn exported_definitions() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rabbitmq-3.10.8-definitions.json")
}

async fn start_with_export() -> TestServer {
    TestServer::start_with(|config| config.load_definitions = Some(exported_definitions())).await
}

fn uri(server: &TestServer, user: &str, password: &str, vhost: &str) -> String {
    format!(
        "amqp://{user}:{password}@{}/{}",
        server.address,
        vhost.replace('/', "%2f")
    )
}

async fn login(
    server: &TestServer,
    user: &str,
    password: &str,
    vhost: &str,
) -> lapin::Result<Connection> {
    Connection::connect(
        &uri(server, user, password, vhost),
        ConnectionProperties::default(),
    )
    .await
}

async fn channel_of(server: &TestServer, user: &str, password: &str, vhost: &str) -> Channel {
    let connection = login(server, user, password, vhost)
        .await
        .unwrap_or_else(|error| panic!("{user} logs in to {vhost}: {error}"));
    let channel = connection.create_channel().await.expect("channel opens");
    // The connection closes when the last handle goes; the channel keeps it.
    std::mem::forget(connection);
    channel
}

async fn bob(server: &TestServer) -> Channel {
    channel_of(server, "bob", "bob-pw", "/").await
}

fn refused(queue_or_exchange: &str, name: &str, vhost: &str, user: &str) -> (u16, String) {
    (
        403,
        format!(
            "ACCESS_REFUSED - access to {queue_or_exchange} '{name}' in vhost '{vhost}' refused for user '{user}'"
        ),
    )
}

/// bob's request was refused with RabbitMQ's 403 for `kind` `name` in `/`.
fn assert_refused_to_bob<T: std::fmt::Debug>(result: lapin::Result<T>, kind: &str, name: &str) {
    assert_eq!(amqp_error(result), refused(kind, name, "/", "bob"));
}

fn declare_options(passive: bool) -> QueueDeclareOptions {
    QueueDeclareOptions {
        passive,
        ..Default::default()
    }
}

async fn declare_queue(
    channel: &Channel,
    name: &str,
    arguments: FieldTable,
) -> lapin::Result<lapin::Queue> {
    channel
        .queue_declare(name.into(), declare_options(false), arguments)
        .await
}

/// Publishes with confirms on: a refused publish closes the channel, and
/// the confirm carries the close error.
async fn publish_confirmed(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    properties: BasicProperties,
) -> lapin::Result<()> {
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let confirm = channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            BasicPublishOptions::default(),
            b"body",
            properties,
        )
        .await?;
    confirm.await.map(drop)
}

#[tokio::test]
async fn rabbitmq_export_loads_unchanged_and_its_users_log_in_with_their_passwords() {
    let server = start_with_export().await;
    for (user, password, vhost) in [
        ("alice", "alice-pw", "/"),
        ("alice", "alice-pw", "staging"),
        ("bob", "bob-pw", "/"),
        ("carol", "carol-pw", "staging"),
        ("guest", "guest", "/"),
    ] {
        let connection = login(&server, user, password, vhost).await;
        assert!(connection.is_ok(), "{user} on {vhost}: {connection:?}");
    }
    // The file's queues, in their vhosts.
    let alice = channel_of(&server, "alice", "alice-pw", "/").await;
    alice
        .queue_declare(
            "bob.jobs".into(),
            declare_options(true),
            FieldTable::default(),
        )
        .await
        .expect("bob.jobs was imported");
    let staging = channel_of(&server, "alice", "alice-pw", "staging").await;
    staging
        .queue_declare(
            "carol.inbox".into(),
            declare_options(true),
            FieldTable::default(),
        )
        .await
        .expect("carol.inbox was imported into staging");
    // Wrong passwords, unknown users and the passwordless user are refused
    // alike, with RabbitMQ's text.
    let login_refused = (
        403,
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile."
            .to_owned(),
    );
    for (user, password) in [
        ("alice", "bob-pw"),
        ("mallory", "x"),
        ("certuser", "anything"),
    ] {
        assert_eq!(
            amqp_error(login(&server, user, password, "/").await),
            login_refused,
            "{user}"
        );
    }
}

#[tokio::test]
async fn vhost_access_and_connection_limit_are_refused_as_rabbitmq_refuses_them() {
    let server = start_with_export().await;
    assert_eq!(
        amqp_error(login(&server, "bob", "bob-pw", "staging").await),
        (
            530,
            "NOT_ALLOWED - access to vhost 'staging' refused for user 'bob'".to_owned()
        )
    );
    assert_eq!(
        amqp_error(login(&server, "carol", "carol-pw", "/").await),
        (
            530,
            "NOT_ALLOWED - access to vhost '/' refused for user 'carol'".to_owned()
        )
    );
    assert_eq!(
        amqp_error(login(&server, "alice", "alice-pw", "nope").await),
        (530, "NOT_ALLOWED - vhost nope not found".to_owned())
    );
    // staging: max-connections 5.
    let mut open = Vec::new();
    for _ in 0..5 {
        open.push(
            login(&server, "alice", "alice-pw", "staging")
                .await
                .expect("under the limit"),
        );
    }
    assert_eq!(
        amqp_error(login(&server, "alice", "alice-pw", "staging").await),
        (
            530,
            "NOT_ALLOWED - access to vhost 'staging' refused for user 'alice': connection limit (5) is reached"
                .to_owned()
        )
    );
    // A closed connection gives its place back.
    open.pop().unwrap().close(200, "bye".into()).await.unwrap();
    eventually("the closed connection leaves the count", || {
        server
            .running()
            .broker
            .vhost("staging")
            .is_some_and(|vhost| vhost.connection_count() == 4)
    })
    .await;
    login(&server, "alice", "alice-pw", "staging")
        .await
        .expect("room again");
}

#[tokio::test]
async fn queue_limit_refuses_new_queues_with_rabbitmqs_text() {
    let server = start_with_export().await;
    let staging = channel_of(&server, "alice", "alice-pw", "staging").await;
    // carol.inbox counts: two more fit under max-queues 3.
    for name in ["lim.1", "lim.2"] {
        declare_queue(&staging, name, FieldTable::default())
            .await
            .unwrap();
    }
    assert_eq!(
        amqp_error(declare_queue(&staging, "lim.3", FieldTable::default()).await),
        (
            406,
            "PRECONDITION_FAILED - cannot declare queue 'lim.3': queue limit in vhost 'staging' (3) is reached"
                .to_owned()
        )
    );
    let staging = channel_of(&server, "alice", "alice-pw", "staging").await;
    declare_queue(&staging, "lim.1", FieldTable::default())
        .await
        .expect("redeclaring an existing queue is not a new one");
}

#[tokio::test]
async fn queue_operations_are_checked_where_rabbitmq_checks_them() {
    let server = start_with_export().await;
    let alice = channel_of(&server, "alice", "alice-pw", "/").await;
    declare_queue(&alice, "zed", FieldTable::default())
        .await
        .unwrap();

    declare_queue(&bob(&server).await, "bob.q", FieldTable::default())
        .await
        .expect("configure ^bob\\.");
    assert_refused_to_bob(
        declare_queue(&bob(&server).await, "other", FieldTable::default()).await,
        "queue",
        "other",
    );
    // A passive declare checks existence only.
    bob(&server)
        .await
        .queue_declare("zed".into(), declare_options(true), FieldTable::default())
        .await
        .expect("passive declares need no permission");
    assert_refused_to_bob(
        declare_queue(&bob(&server).await, "zed", FieldTable::default()).await,
        "queue",
        "zed",
    );
    assert_refused_to_bob(
        bob(&server)
            .await
            .queue_purge("zed".into(), QueuePurgeOptions::default())
            .await,
        "queue",
        "zed",
    );
    assert_refused_to_bob(
        bob(&server)
            .await
            .basic_get("zed".into(), BasicGetOptions::default())
            .await,
        "queue",
        "zed",
    );
    assert_refused_to_bob(
        bob(&server)
            .await
            .basic_consume(
                "zed".into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await,
        "queue",
        "zed",
    );
    // Permission comes before existence: a missing queue is 403, not 404.
    for queue in ["zed", "nosuch"] {
        assert_refused_to_bob(
            bob(&server)
                .await
                .queue_delete(queue.into(), QueueDeleteOptions::default())
                .await,
            "queue",
            queue,
        );
    }
    // A server-named queue is checked under the name it would get.
    let (code, text) =
        amqp_error(declare_queue(&bob(&server).await, "", FieldTable::default()).await);
    assert_eq!(code, 403);
    assert!(
        text.starts_with("ACCESS_REFUSED - access to queue 'amq.gen-")
            && text.ends_with("' in vhost '/' refused for user 'bob'"),
        "{text}"
    );
    // Dead-lettering to an exchange bob cannot write to.
    let dead_lettering = table(&[("x-dead-letter-exchange", text_value("orders"))]);
    assert_refused_to_bob(
        declare_queue(&bob(&server).await, "bob.dl", dead_lettering).await,
        "exchange",
        "orders",
    );
    // queue.bind: write on the queue, read on the exchange.
    assert_refused_to_bob(
        bob(&server)
            .await
            .queue_bind(
                "bob.q".into(),
                "orders".into(),
                "k".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await,
        "exchange",
        "orders",
    );
    assert_refused_to_bob(
        bob(&server)
            .await
            .queue_bind(
                "zed".into(),
                "amq.direct".into(),
                "k".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await,
        "queue",
        "zed",
    );
}

fn text_value(value: &str) -> AMQPValue {
    AMQPValue::LongString(value.into())
}

#[tokio::test]
async fn exchange_operations_and_publishes_are_checked_where_rabbitmq_checks_them() {
    let server = start_with_export().await;
    let declare = |channel: Channel, name: &'static str, arguments: FieldTable| async move {
        channel
            .exchange_declare(
                name.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                arguments,
            )
            .await
    };
    declare(bob(&server).await, "bob.x", FieldTable::default())
        .await
        .expect("configure ^bob\\.");
    assert_refused_to_bob(
        declare(bob(&server).await, "other.x", FieldTable::default()).await,
        "exchange",
        "other.x",
    );
    bob(&server)
        .await
        .exchange_declare(
            "orders".into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("passive declares need no permission");
    assert_refused_to_bob(
        bob(&server)
            .await
            .exchange_delete("orders".into(), ExchangeDeleteOptions::default())
            .await,
        "exchange",
        "orders",
    );
    let alternate = table(&[("alternate-exchange", text_value("orders"))]);
    assert_refused_to_bob(
        declare(bob(&server).await, "bob.ae", alternate).await,
        "exchange",
        "orders",
    );
    assert_refused_to_bob(
        bob(&server)
            .await
            .exchange_bind(
                "bob.x".into(),
                "orders".into(),
                "k".into(),
                ExchangeBindOptions::default(),
                FieldTable::default(),
            )
            .await,
        "exchange",
        "orders",
    );

    // Publishing: write on the exchange, the default one as amq.default,
    // checked before the exchange is looked up.
    declare_queue(&bob(&server).await, "bob.q", FieldTable::default())
        .await
        .unwrap();
    publish_confirmed(&bob(&server).await, "", "bob.q", BasicProperties::default())
        .await
        .expect("write ^(bob\\.|amq\\.default$)");
    // bob's topic permissions on amq.topic come after the exchange's own,
    // which he lacks.
    for exchange in ["orders", "nosuchx", "amq.topic"] {
        assert_refused_to_bob(
            publish_confirmed(
                &bob(&server).await,
                exchange,
                "k",
                BasicProperties::default(),
            )
            .await,
            "exchange",
            exchange,
        );
    }
    // user_id must be the user's own.
    assert_eq!(
        amqp_error(
            publish_confirmed(
                &bob(&server).await,
                "",
                "bob.q",
                BasicProperties::default().with_user_id("alice".into())
            )
            .await
        ),
        (
            406,
            "PRECONDITION_FAILED - user_id property set to 'alice' but authenticated user was 'bob'"
                .to_owned()
        )
    );
    publish_confirmed(
        &bob(&server).await,
        "",
        "bob.q",
        BasicProperties::default().with_user_id("bob".into()),
    )
    .await
    .expect("bob may say he is bob");
}

#[tokio::test]
async fn first_start_creates_the_configured_default_user_vhost_and_permissions() {
    let server = TestServer::start_with(|config| {
        config.default_user = "admin".into();
        config.default_pass = "s3cret".into();
        config.default_vhost = "prod".into();
        config.default_permissions.configure = "^app\\.".into();
    })
    .await;
    assert!(login(&server, "guest", "guest", "/").await.is_err());
    let channel = channel_of(&server, "admin", "s3cret", "prod").await;
    channel
        .queue_declare(
            "app.jobs".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("configure ^app\\.");
    assert_eq!(
        amqp_error(declare_queue(&channel, "other", FieldTable::default()).await),
        refused("queue", "other", "prod", "admin")
    );
    // Restarted, the node keeps what the metadata log holds: the defaults
    // are not created again, and the queue is still there.
    let server = server.restart().await;
    let channel = channel_of(&server, "admin", "s3cret", "prod").await;
    channel
        .queue_declare(
            "app.jobs".into(),
            declare_options(true),
            FieldTable::default(),
        )
        .await
        .expect("the queue survived the restart");
}

#[tokio::test]
async fn failed_logins_slow_down_the_next_attempts_from_the_same_address() {
    let server = start_with_export().await;
    for _ in 0..3 {
        assert!(login(&server, "alice", "wrong", "/").await.is_err());
    }
    // After three failures the address's attempts are a second apart,
    // even the right password's (a lower bound: sleeps last at least that).
    let throttle = &server.running().broker.login_throttle;
    assert_eq!(throttle.tracked_addresses(), 1);
    let started = Instant::now();
    login(&server, "alice", "alice-pw", "/")
        .await
        .expect("the right password still gets in");
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "the attempt was held back: {:?}",
        started.elapsed()
    );
    // A success clears the address's record.
    assert_eq!(throttle.tracked_addresses(), 0);
}

/// Topic permissions, after the exchange's own: the routing key of a
/// publish must match `write`, a binding's key `read`; `{username}` stands
/// for the user.
#[tokio::test]
async fn topic_permissions_restrict_routing_keys_on_topic_exchanges() {
    let definitions = std::env::temp_dir().join(format!(
        "sluice-topic-permissions-{}.json",
        std::process::id()
    ));
    std::fs::write(
        &definitions,
        r#"{
          "users": [{"name": "dave", "password_hash": "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR",
                     "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []}],
          "vhosts": [{"name": "/"}],
          "permissions": [{"user": "dave", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
          "topic_permissions": [{"user": "dave", "vhost": "/", "exchange": "amq.topic",
                                 "write": "^{username}\\.", "read": "^{username}\\."}]
        }"#,
    )
    .unwrap();
    let server =
        TestServer::start_with(|config| config.load_definitions = Some(definitions.clone())).await;
    std::fs::remove_file(&definitions).unwrap();
    let dave = || channel_of(&server, "dave", "test12", "/");
    publish_confirmed(
        &dave().await,
        "amq.topic",
        "dave.orders",
        BasicProperties::default(),
    )
    .await
    .expect("the key matches ^dave\\.");
    assert_eq!(
        amqp_error(
            publish_confirmed(&dave().await, "amq.topic", "other.x", BasicProperties::default()).await
        ),
        (
            403,
            "ACCESS_REFUSED - access to topic 'other.x' in exchange 'amq.topic' in vhost '/' refused for user 'dave'"
                .to_owned()
        )
    );
    // Other exchanges are not restricted.
    publish_confirmed(
        &dave().await,
        "amq.direct",
        "other.x",
        BasicProperties::default(),
    )
    .await
    .expect("no topic permissions on amq.direct");
    let channel = dave().await;
    declare_queue(&channel, "dave.q", FieldTable::default())
        .await
        .unwrap();
    let bind = |channel: Channel, key: &'static str| async move {
        channel
            .queue_bind(
                "dave.q".into(),
                "amq.topic".into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
    };
    bind(dave().await, "dave.#").await.expect("the key matches");
    assert_eq!(
        amqp_error(bind(dave().await, "other.#").await),
        (
            403,
            "ACCESS_REFUSED - access to topic 'other.#' in exchange 'amq.topic' in vhost '/' refused for user 'dave'"
                .to_owned()
        )
    );
}

/// max-connections counts the connections of every node of a cluster, as
/// RabbitMQ counts them: staging allows 5 (the RabbitMQ export's limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_counts_the_connections_of_every_node() {
    let cluster = support::cluster::TestCluster::start("connection-limit", 3, |_, _, config| {
        config.load_definitions = Some(exported_definitions());
    })
    .await;
    let uri = |node: usize| {
        format!(
            "amqp://alice:alice-pw@{}/staging",
            cluster.servers[node].local_address
        )
    };
    let mut open = Vec::new();
    for node in [0, 0, 1, 1, 2] {
        let connection = Connection::connect(&uri(node), ConnectionProperties::default())
            .await
            .expect("under the limit");
        open.push(connection);
    }
    // Once the nodes have told each other their counts, none admits a sixth.
    for server in &cluster.servers {
        eventually("every node knows the other nodes' connections", || {
            server
                .broker
                .vhost("staging")
                .is_some_and(|vhost| vhost.connection_count() + vhost.connections_elsewhere() == 5)
        })
        .await;
    }
    for node in 0..3 {
        assert_eq!(
            amqp_error(Connection::connect(&uri(node), ConnectionProperties::default()).await),
            (
                530,
                "NOT_ALLOWED - access to vhost 'staging' refused for user 'alice': connection limit (5) is reached"
                    .to_owned()
            )
        );
    }
    drop(open);
    cluster.stop().await;
}
