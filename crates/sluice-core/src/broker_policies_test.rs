//! Policies and parameters applied to a broker as the metadata log applies
//! them, and what they do to the queues and exchanges that exist.

use std::sync::Arc;

use amq_protocol::types::{AMQPValue, FieldTable};
use bytes::Bytes;

use crate::broker::{Broker, BrokerSettings};
use crate::definitions::QueueDefinition;
use crate::message::Message;
use crate::metadata::{BindingChange, MetadataCommand, MetadataReply, NodeIdentity};
use crate::policy::PolicyJson;
use crate::queue::Queue;
use crate::vhost::{PublishScratch, VirtualHost};

const NODE: &str = "a@h:1";

fn broker() -> Broker {
    Broker::new(&BrokerSettings {
        defaults: Default::default(),
        loopback_users: Vec::new(),
        node: NodeIdentity::new(NODE),
        node_number: 0,
        queue_locator: Default::default(),
    })
}

/// Applies commands one after the other, as the log would, each at the
/// next index; the replies.
struct Log<'a> {
    broker: &'a Broker,
    index: u64,
}

impl Log<'_> {
    fn apply(&mut self, command: MetadataCommand) -> MetadataReply {
        self.index += 1;
        self.broker.apply_metadata(self.index, command)
    }

    fn done(&mut self, command: MetadataCommand) {
        assert_eq!(self.apply(command), MetadataReply::Done);
    }
}

fn policy(
    name: &str,
    pattern: &str,
    apply_to: &str,
    priority: i64,
    definition: &str,
) -> PolicyJson {
    PolicyJson {
        vhost: "/".into(),
        name: name.into(),
        pattern: pattern.into(),
        apply_to: apply_to.into(),
        priority,
        definition: serde_json::from_str(definition).unwrap(),
    }
}

fn set(policy: PolicyJson) -> MetadataCommand {
    MetadataCommand::SetPolicy { policy }
}

fn clear(name: &str) -> MetadataCommand {
    MetadataCommand::ClearPolicy {
        vhost: "/".into(),
        name: name.into(),
    }
}

fn declare_queue(name: &str, arguments: FieldTable) -> MetadataCommand {
    MetadataCommand::DeclareQueue {
        vhost: "/".into(),
        queue: QueueDefinition {
            name: name.into(),
            store_id: None,
            durable: true,
            auto_delete: false,
            arguments,
            exclusive_owner: None,
            home: Some(NODE.into()),
            home_incarnation: 1,
            declared_at: 0,
            members: Vec::new(),
            member_ids: Default::default(),
        },
        connection: 0,
    }
}

fn declare_fanout(name: &str) -> MetadataCommand {
    MetadataCommand::DeclareExchange {
        vhost: "/".into(),
        name: name.into(),
        kind: "fanout".into(),
        durable: true,
        auto_delete: false,
        internal: false,
        arguments: FieldTable::default(),
    }
}

fn bind(exchange: &str, queue: &str) -> MetadataCommand {
    MetadataCommand::Bind(BindingChange {
        vhost: "/".into(),
        source: exchange.into(),
        destination: queue.into(),
        destination_is_queue: true,
        routing_key: String::new(),
        arguments: FieldTable::default(),
        connection: 0,
    })
}

fn vhost(broker: &Broker) -> Arc<VirtualHost> {
    broker.vhost("/").unwrap()
}

fn queue(broker: &Broker, name: &str) -> Arc<dyn Queue> {
    vhost(broker).queue(name, 0).unwrap()
}

/// Publishes `body` to `exchange` with routing key `key`.
fn publish(broker: &Broker, exchange: &str, key: &str, body: &str) -> bool {
    let message = Arc::new(Message {
        exchange: Bytes::copy_from_slice(exchange.as_bytes()),
        routing_key: Bytes::copy_from_slice(key.as_bytes()),
        // No property set: two bytes of flags, all clear.
        properties: sluice_wire::content::RawProperties::new(Bytes::from_static(&[0, 0])).unwrap(),
        body: Bytes::copy_from_slice(body.as_bytes()),
    });
    let mut congested = Vec::new();
    vhost(broker)
        .publish(
            exchange.as_bytes(),
            message,
            &mut PublishScratch::default(),
            &mut congested,
        )
        .unwrap()
        .routed
}

fn bodies(queue: &Arc<dyn Queue>) -> Vec<String> {
    let mut bodies = Vec::new();
    while let Some((entry, _)) = queue.get(true) {
        bodies.push(String::from_utf8_lossy(&entry.message.body).into_owned());
    }
    bodies
}

#[test]
fn policies_a_lower_max_length_set_later_drops_the_oldest_of_a_live_queue() {
    let broker = broker();
    let mut log = Log {
        broker: &broker,
        index: 0,
    };
    log.done(declare_queue("jobs.1", FieldTable::default()));
    log.done(declare_queue("other", FieldTable::default()));
    for number in 1..=10 {
        publish(&broker, "", "jobs.1", &number.to_string());
        publish(&broker, "", "other", &number.to_string());
    }
    assert_eq!(queue(&broker, "jobs.1").message_count(), 10);
    log.done(set(policy(
        "bounded",
        "^jobs\\.",
        "queues",
        0,
        r#"{"max-length": 4}"#,
    )));
    // The oldest six went at once (drop-head, RabbitMQ's default).
    assert_eq!(bodies(&queue(&broker, "jobs.1")), ["7", "8", "9", "10"]);
    assert_eq!(queue(&broker, "other").message_count(), 10, "not matched");
    assert_eq!(
        broker.queue_policy("/", "jobs.1").map(|policy| policy.name),
        Some("bounded".to_owned())
    );
    // A later publish is held to the limit as well.
    for number in 11..=16 {
        publish(&broker, "", "jobs.1", &number.to_string());
    }
    assert_eq!(queue(&broker, "jobs.1").message_count(), 4);
    // Cleared: no limit any more.
    log.done(clear("bounded"));
    for number in 17..=26 {
        publish(&broker, "", "jobs.1", &number.to_string());
    }
    assert_eq!(queue(&broker, "jobs.1").message_count(), 14);
    assert_eq!(broker.queue_policy("/", "jobs.1"), None);
}

#[test]
fn policies_dead_letter_the_excess_to_the_policys_exchange() {
    let broker = broker();
    let mut log = Log {
        broker: &broker,
        index: 0,
    };
    log.done(declare_queue("work", FieldTable::default()));
    log.done(declare_queue("graveyard", FieldTable::default()));
    log.done(declare_fanout("dlx"));
    log.done(bind("dlx", "graveyard"));
    for number in 1..=10 {
        publish(&broker, "", "work", &number.to_string());
    }
    log.done(set(policy(
        "limit",
        "^work$",
        "queues",
        0,
        r#"{"max-length": 7, "dead-letter-exchange": "dlx"}"#,
    )));
    assert_eq!(queue(&broker, "work").message_count(), 7);
    assert_eq!(bodies(&queue(&broker, "graveyard")), ["1", "2", "3"]);
    // The declared argument wins for a numeric limit only when smaller.
    let mut own = FieldTable::default();
    own.insert("x-max-length".into(), AMQPValue::LongInt(2));
    log.done(declare_queue("work.own", own));
    log.done(set(policy(
        "loose",
        "^work\\.own$",
        "queues",
        0,
        r#"{"max-length": 5}"#,
    )));
    for number in 1..=4 {
        publish(&broker, "", "work.own", &number.to_string());
    }
    assert_eq!(bodies(&queue(&broker, "work.own")), ["3", "4"]);
}

#[test]
fn policies_message_ttl_applies_to_messages_from_the_change_on() {
    let broker = broker();
    let mut log = Log {
        broker: &broker,
        index: 0,
    };
    log.done(declare_queue("events", FieldTable::default()));
    publish(&broker, "", "events", "before");
    // A TTL of 0: a message no consumer waits for expires on arrival.
    log.done(set(policy(
        "fleeting",
        "^events$",
        "queues",
        0,
        r#"{"message-ttl": 0}"#,
    )));
    publish(&broker, "", "events", "during");
    assert_eq!(
        bodies(&queue(&broker, "events")),
        ["before"],
        "the message published before the TTL keeps its deadline (none)"
    );
    publish(&broker, "", "events", "during");
    log.done(clear("fleeting"));
    publish(&broker, "", "events", "after");
    assert_eq!(bodies(&queue(&broker, "events")), ["after"]);
}

#[test]
fn policies_give_existing_exchanges_their_alternate_exchange() {
    let broker = broker();
    let mut log = Log {
        broker: &broker,
        index: 0,
    };
    log.done(declare_fanout("unrouted"));
    log.done(declare_queue("leftovers", FieldTable::default()));
    log.done(bind("unrouted", "leftovers"));
    log.done(MetadataCommand::DeclareExchange {
        vhost: "/".into(),
        name: "orders".into(),
        kind: "direct".into(),
        durable: true,
        auto_delete: false,
        internal: false,
        arguments: FieldTable::default(),
    });
    assert!(!publish(&broker, "orders", "nowhere", "1"));
    log.done(set(policy(
        "ae",
        "^orders$",
        "exchanges",
        0,
        r#"{"alternate-exchange": "unrouted"}"#,
    )));
    assert!(publish(&broker, "orders", "nowhere", "2"));
    assert_eq!(
        broker
            .exchange_policy("/", "orders")
            .map(|policy| policy.name),
        Some("ae".to_owned())
    );
    log.done(clear("ae"));
    assert!(!publish(&broker, "orders", "nowhere", "3"));
    assert_eq!(bodies(&queue(&broker, "leftovers")), ["2"]);
}

#[test]
fn policies_and_parameters_are_refused_with_rabbitmq_text() {
    let broker = broker();
    let mut log = Log {
        broker: &broker,
        index: 0,
    };
    let refused = |reply| match reply {
        MetadataReply::Refused { code, text } => (code, text),
        MetadataReply::Done => panic!("refused"),
    };
    assert_eq!(
        refused(log.apply(set(policy("p", ".*", "all", 0, r#"{"max-length": -1}"#)))),
        (
            406,
            "Validation failed\n\n-1 is not a valid maximum length\n".to_owned()
        )
    );
    let mut elsewhere = policy("p", ".*", "all", 0, r#"{"max-length": 1}"#);
    elsewhere.vhost = "nope".into();
    assert_eq!(
        refused(log.apply(set(elsewhere))),
        (404, "vhost 'nope' does not exist".to_owned())
    );
    assert_eq!(
        refused(log.apply(clear("never-set"))),
        (404, "Parameter does not exist".to_owned())
    );
    let parameter = |component: &str| MetadataCommand::SetParameter {
        component: component.into(),
        vhost: "/".into(),
        name: "upstream".into(),
        value: serde_json::json!({"uri": "amqp://elsewhere"}),
    };
    assert_eq!(
        refused(log.apply(parameter("colour"))),
        (
            406,
            "Validation failed\n\ncomponent colour not found\n".to_owned()
        )
    );
    assert!(broker.policies().is_empty());
    log.done(parameter("federation-upstream"));
    log.done(MetadataCommand::SetParameter {
        component: "vhost-limits".into(),
        vhost: "/".into(),
        name: "limits".into(),
        value: serde_json::json!({"max-queues": 3}),
    });
    assert_eq!(broker.access.vhost_limits("/").max_queues, Some(3));
    let components: Vec<String> = broker
        .parameters()
        .into_iter()
        .map(|parameter| parameter.component)
        .collect();
    assert_eq!(components, ["federation-upstream", "vhost-limits"]);
    log.done(MetadataCommand::SetGlobalParameter {
        name: "cluster_name".into(),
        value: serde_json::json!("east"),
    });
    assert_eq!(
        broker
            .global_parameter("cluster_name")
            .map(|parameter| parameter.value),
        Some(serde_json::json!("east"))
    );
    log.done(MetadataCommand::ClearGlobalParameter {
        name: "cluster_name".into(),
    });
    assert!(broker.global_parameters().is_empty());
}

#[test]
fn policies_and_parameters_travel_in_snapshots_and_go_with_their_vhost() {
    let written = broker();
    let mut log = Log {
        broker: &written,
        index: 0,
    };
    log.done(declare_queue("q1", FieldTable::default()));
    log.done(MetadataCommand::PutVhost {
        name: "staging".into(),
    });
    let given = policy(
        "bounded",
        "^q",
        "queues",
        3,
        r#"{"max-length": 2, "ha-mode": "all"}"#,
    );
    log.done(set(given.clone()));
    let mut staged = given.clone();
    staged.vhost = "staging".into();
    log.done(set(staged));
    log.done(MetadataCommand::SetParameter {
        component: "shovel".into(),
        vhost: "staging".into(),
        name: "move".into(),
        value: serde_json::json!({"src-uri": "amqp://"}),
    });
    log.done(MetadataCommand::SetGlobalParameter {
        name: "cluster_name".into(),
        value: serde_json::json!("east"),
    });
    let snapshot = written.metadata_snapshot();
    // A node that had a queue full before the policy reached it: restored,
    // the queue takes the policy.
    let lagging = broker();
    lagging.apply_metadata(1, declare_queue("q1", FieldTable::default()));
    for number in 1..=5 {
        publish(&lagging, "", "q1", &number.to_string());
    }
    lagging.restore_metadata(&snapshot);
    assert_eq!(lagging.metadata_snapshot(), snapshot);
    assert_eq!(lagging.policy("/", "bounded"), Some(given.clone()));
    assert_eq!(lagging.policy_generation(), written.policy_generation());
    assert_eq!(lagging.vhost_parameters("staging").unwrap().len(), 1);
    assert_eq!(lagging.global_parameters().len(), 1);
    // The queue it had takes the policy it missed.
    assert_eq!(queue(&lagging, "q1").message_count(), 2);
    // Exported exactly as given.
    assert_eq!(written.policies()[0], given);
    // A snapshot written before policies were in the log still reads.
    let mut old: serde_json::Value = serde_json::to_value(&snapshot).unwrap();
    old.as_object_mut().unwrap().remove("global_parameters");
    old.as_object_mut().unwrap().remove("policy_generation");
    for vhost in old["vhosts"].as_object_mut().unwrap().values_mut() {
        vhost.as_object_mut().unwrap().remove("policies");
        vhost.as_object_mut().unwrap().remove("parameters");
    }
    let old: crate::definitions::Definitions = serde_json::from_value(old).unwrap();
    assert!(old.vhosts["/"].policies.is_empty());
    // Deleting a vhost drops its policies and parameters.
    log.done(MetadataCommand::DeleteVhost {
        name: "staging".into(),
    });
    assert_eq!(written.vhost_policies("staging"), None);
    assert_eq!(written.policies(), [given]);
    log.done(MetadataCommand::PutVhost {
        name: "staging".into(),
    });
    assert_eq!(written.vhost_policies("staging"), Some(Vec::new()));
    assert!(written.vhost_parameters("staging").unwrap().is_empty());
}
