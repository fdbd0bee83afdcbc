//! A quorum queue's members as every node applies their changes from the
//! metadata log, and as snapshots carry them. The node applying is not a
//! member, so its queue is a stand-in and no group runs.

use std::collections::BTreeMap;
use std::sync::Arc;

use amq_protocol::types::{AMQPValue, FieldTable};

use crate::broker::{Broker, BrokerSettings};
use crate::definitions::{Definitions, QueueDefinition};
use crate::metadata::{MetadataCommand, MetadataReply, NodeIdentity, NodeLiveness};
use crate::queue::Queue;
use crate::quorum_members::ADDED_MEMBER_ID_BASE;

const LOCAL: &str = "n0@h:1";

struct AllUp;

impl NodeLiveness for AllUp {
    fn is_up(&self, _node: &str) -> bool {
        true
    }

    fn members(&self) -> Vec<String> {
        ["n0@h:1", "n1@h:1", "n2@h:1", "n3@h:1"]
            .map(str::to_owned)
            .to_vec()
    }
}

fn broker() -> Broker {
    let broker = Broker::new(&BrokerSettings {
        defaults: Default::default(),
        loopback_users: Vec::new(),
        node: NodeIdentity::new(LOCAL),
        node_number: 0,
        queue_locator: Default::default(),
    });
    broker.metadata.install_liveness(Arc::new(AllUp));
    broker
}

fn quorum_arguments() -> FieldTable {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    arguments
}

/// A quorum queue on n1 and n2 as a version without member ids declared
/// it.
fn legacy_definition(name: &str) -> QueueDefinition {
    QueueDefinition {
        name: name.into(),
        store_id: None,
        durable: true,
        auto_delete: false,
        arguments: quorum_arguments(),
        exclusive_owner: None,
        home: Some("n2@h:1".into()),
        home_incarnation: 1,
        declared_at: 0,
        members: vec!["n2@h:1".into(), "n1@h:1".into()],
        member_ids: BTreeMap::new(),
    }
}

fn queue(broker: &Broker, name: &str) -> Arc<dyn Queue> {
    broker
        .vhost("/")
        .unwrap()
        .queues()
        .into_iter()
        .find(|queue| &**queue.name() == name)
        .unwrap()
}

fn change(add: bool, name: &str, node: &str) -> MetadataCommand {
    let (vhost, name, node) = ("/".to_owned(), name.to_owned(), node.to_owned());
    let declared_at = 10;
    if add {
        MetadataCommand::AddQueueMember {
            vhost,
            name,
            declared_at,
            node,
        }
    } else {
        MetadataCommand::RemoveQueueMember {
            vhost,
            name,
            declared_at,
            node,
        }
    }
}

fn ids(queue: &Arc<dyn Queue>) -> Vec<(String, u64)> {
    queue.options().members.get().ids.into_iter().collect()
}

fn declare(broker: &Broker, definition: QueueDefinition) {
    let declared = broker.apply_metadata(
        10,
        MetadataCommand::DeclareQueue {
            vhost: "/".into(),
            queue: definition,
            connection: 0,
        },
    );
    assert_eq!(declared, MetadataReply::Done);
}

#[test]
fn quorum_membership_changes_keep_every_id_and_give_new_members_fresh_ones() {
    let broker = broker();
    declare(&broker, legacy_definition("q"));
    let q = queue(&broker, "q");
    // Positional: n1 sorts first.
    assert_eq!(
        ids(&q),
        [("n1@h:1".to_owned(), 1), ("n2@h:1".to_owned(), 2)]
    );

    assert_eq!(
        broker.apply_metadata(20, change(true, "q", "n3@h:1")),
        MetadataReply::Done
    );
    let q = queue(&broker, "q");
    assert_eq!(
        q.options().members.members(),
        ["n2@h:1", "n1@h:1", "n3@h:1"]
    );
    assert_eq!(
        ids(&q),
        [
            ("n1@h:1".to_owned(), 1),
            ("n2@h:1".to_owned(), 2),
            ("n3@h:1".to_owned(), ADDED_MEMBER_ID_BASE + 20)
        ]
    );
    // Already a member: nothing changes, as in RabbitMQ.
    assert_eq!(
        broker.apply_metadata(21, change(true, "q", "n3@h:1")),
        MetadataReply::Done
    );
    assert_eq!(ids(&queue(&broker, "q")).len(), 3);

    // The home goes: nodes without a member reach the queue through the
    // first member left.
    assert_eq!(
        broker.apply_metadata(22, change(false, "q", "n2@h:1")),
        MetadataReply::Done
    );
    let q = queue(&broker, "q");
    assert_eq!(q.options().members.members(), ["n1@h:1", "n3@h:1"]);
    assert_eq!(
        q.home_node().map(|home| home.to_string()),
        Some("n1@h:1".to_owned())
    );
    assert_eq!(ids(&q)[0], ("n1@h:1".to_owned(), 1));

    // Added back, a member is a new one.
    assert_eq!(
        broker.apply_metadata(23, change(true, "q", "n2@h:1")),
        MetadataReply::Done
    );
    assert_eq!(
        queue(&broker, "q").options().members.get().id_of("n2@h:1"),
        Some(ADDED_MEMBER_ID_BASE + 23)
    );
}

#[test]
fn quorum_membership_refusals_use_rabbitmq_reasons() {
    let broker = broker();
    let mut single = legacy_definition("one");
    single.members = vec!["n1@h:1".into()];
    declare(&broker, single);
    let refused = |command| match broker.apply_metadata(30, command) {
        MetadataReply::Refused { text, .. } => text,
        MetadataReply::Done => panic!("applied"),
    };
    assert!(refused(change(false, "one", "n1@h:1")).starts_with("last_node"));
    assert_eq!(
        refused(change(true, "gone", "n2@h:1")),
        "no queue 'gone' in vhost '/'"
    );

    let mut classic = legacy_definition("classic");
    classic.arguments = FieldTable::default();
    classic.members = Vec::new();
    classic.home = Some(LOCAL.into());
    declare(&broker, classic);
    assert_eq!(
        refused(change(true, "classic", "n2@h:1")),
        "Cannot add members to a classic queue"
    );
    // A member not there to remove: nothing to do.
    assert_eq!(
        broker.apply_metadata(31, change(false, "one", "n3@h:1")),
        MetadataReply::Done
    );
}

#[test]
fn quorum_membership_survives_a_snapshot_and_an_old_one_still_reads() {
    let broker = broker();
    declare(&broker, legacy_definition("q"));
    assert_eq!(
        broker.apply_metadata(40, change(true, "q", "n3@h:1")),
        MetadataReply::Done
    );
    let snapshot = serde_json::to_vec(&broker.metadata_snapshot()).unwrap();

    let restored = self::broker();
    let definitions: Definitions = serde_json::from_slice(&snapshot).unwrap();
    restored.restore_metadata(&definitions);
    assert_eq!(ids(&queue(&restored, "q")), ids(&queue(&broker, "q")));

    // A lagging node holding the queue as it was declared is brought to
    // the snapshot's members.
    let lagging = self::broker();
    declare(&lagging, legacy_definition("q"));
    lagging.restore_metadata(&definitions);
    assert_eq!(ids(&queue(&lagging, "q")), ids(&queue(&broker, "q")));

    // A snapshot written before ids were kept has none: positional.
    let mut old = serde_json::to_value(&definitions).unwrap();
    let text = old.to_string();
    assert!(text.contains("member_ids"));
    strip_member_ids(&mut old);
    let old: Definitions = serde_json::from_value(old).unwrap();
    let from_old = self::broker();
    from_old.restore_metadata(&old);
    let q = queue(&from_old, "q");
    assert_eq!(q.options().members.get().id_of("n1@h:1"), Some(1));
    assert_eq!(q.options().members.get().id_of("n3@h:1"), Some(3));
}

fn strip_member_ids(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.remove("member_ids");
            map.values_mut().for_each(strip_member_ids);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_member_ids),
        _ => {}
    }
}

#[test]
fn quorum_membership_of_an_imported_queue_is_its_home_on_every_node() {
    let broker = broker();
    let mut imported = legacy_definition("imported");
    imported.members = Vec::new();
    imported.home = Some("n1@h:1".into());
    declare(&broker, imported);
    let q = queue(&broker, "imported");
    assert_eq!(ids(&q), [("n1@h:1".to_owned(), 1)]);
    assert_eq!(
        broker.apply_metadata(50, change(true, "imported", "n2@h:1")),
        MetadataReply::Done
    );
    assert_eq!(
        queue(&broker, "imported").options().members.members(),
        ["n1@h:1", "n2@h:1"]
    );
}
