//! The node's metadata as one value, for the metadata log's snapshots, and
//! the node brought to such a value.

use crate::broker::Broker;
use crate::definitions::Definitions;

impl Broker {
    /// Every vhost's exchanges, queues and bindings, and who may use them.
    pub fn metadata_snapshot(&self) -> Definitions {
        let mut definitions = Definitions::default();
        for vhost in self.vhosts() {
            definitions
                .vhosts
                .insert(vhost.name.to_string(), vhost.definitions());
        }
        definitions.access = self.access.snapshot();
        definitions.global_parameters = self.global_parameter_list();
        definitions.policy_generation = self.policy_generation();
        definitions
    }

    /// Makes the node's metadata exactly `definitions`: a node restarting
    /// from a snapshot, or one that fell behind and was sent one. A vhost
    /// the snapshot does not have was deleted meanwhile.
    pub fn restore_metadata(&self, definitions: &Definitions) {
        // First: the queues restored below propose their rules under it.
        self.restore_policy_generation(definitions.policy_generation);
        self.restore_global_parameters(&definitions.global_parameters);
        for (name, vhost_definitions) in &definitions.vhosts {
            self.add_vhost(name).restore(vhost_definitions);
        }
        for vhost in self.vhosts() {
            if !definitions.vhosts.contains_key(&*vhost.name) {
                self.remove_vhost(&vhost.name);
            }
        }
        self.access.restore(&definitions.access);
    }
}

#[cfg(test)]
mod tests {
    use amq_protocol::types::FieldTable;

    use crate::access::{PermissionDefinition, UserDefinition, VhostLimit, VhostLimits};
    use crate::broker::{Broker, BrokerSettings};
    use crate::definitions::QueueDefinition;
    use crate::metadata::{BindingChange, MetadataCommand, MetadataReply, NodeIdentity};

    fn node(name: &str) -> Broker {
        Broker::new(&BrokerSettings {
            defaults: Default::default(),
            loopback_users: Vec::new(),
            node: NodeIdentity::new(name),
            node_number: 0,
            queue_locator: Default::default(),
        })
    }

    fn queue(name: &str, home: &str, durable: bool) -> MetadataCommand {
        MetadataCommand::DeclareQueue {
            vhost: "/".into(),
            queue: queue_definition(name, home, durable),
            connection: 0,
        }
    }

    fn queue_definition(name: &str, home: &str, durable: bool) -> QueueDefinition {
        QueueDefinition {
            name: name.into(),
            store_id: None,
            durable,
            auto_delete: false,
            arguments: FieldTable::default(),
            exclusive_owner: None,
            home: Some(home.into()),
            home_incarnation: 7,
            declared_at: 0,
            members: Vec::new(),
            member_ids: Default::default(),
        }
    }

    fn bind(source: &str, queue: &str, key: &str) -> MetadataCommand {
        MetadataCommand::Bind(BindingChange {
            vhost: "/".into(),
            source: source.into(),
            destination: queue.into(),
            destination_is_queue: true,
            routing_key: key.into(),
            arguments: FieldTable::default(),
            connection: 0,
        })
    }

    /// What a sequence of changes, some of them refused, does to any node.
    fn history() -> Vec<MetadataCommand> {
        vec![
            MetadataCommand::DeclareExchange {
                vhost: "/".into(),
                name: "orders".into(),
                kind: "topic".into(),
                durable: true,
                auto_delete: false,
                internal: false,
                arguments: FieldTable::default(),
            },
            queue("eu", "a@h:1", true),
            queue("us", "b@h:2", false),
            queue("eu", "a@h:1", false),
            bind("orders", "eu", "eu.#"),
            bind("orders", "us", "us.#"),
            bind("missing", "us", "x"),
            MetadataCommand::DeleteQueue {
                vhost: "/".into(),
                name: "us".into(),
                declared_at: None,
            },
            queue("us", "a@h:1", true),
            MetadataCommand::NodeDown {
                node: "b@h:2".into(),
            },
            MetadataCommand::PutVhost {
                name: "staging".into(),
            },
            MetadataCommand::PutUser {
                user: UserDefinition::with_password("bob", "pw", Vec::new()),
            },
            permissions("bob", "staging"),
            permissions("bob", "missing"),
            MetadataCommand::DeclareQueue {
                vhost: "staging".into(),
                queue: queue_definition("jobs", "a@h:1", true),
                connection: 0,
            },
            MetadataCommand::DeleteVhost {
                name: "staging".into(),
            },
            MetadataCommand::DeclareQueue {
                vhost: "staging".into(),
                queue: queue_definition("late", "a@h:1", true),
                connection: 0,
            },
        ]
    }

    fn permissions(user: &str, vhost: &str) -> MetadataCommand {
        MetadataCommand::SetPermissions {
            permissions: PermissionDefinition {
                user: user.into(),
                vhost: vhost.into(),
                configure: ".*".into(),
                write: ".*".into(),
                read: ".*".into(),
            },
        }
    }

    #[test]
    fn metadata_nodes_applying_the_same_log_agree_on_state_and_replies() {
        let (first, second) = (node("a@h:1"), node("b@h:2"));
        // One seed for both, as a cluster's log carries one.
        second.restore_metadata(&first.metadata_snapshot());
        for (index, command) in history().into_iter().enumerate() {
            let index = index as u64 + 1;
            let one = first.apply_metadata(index, command.clone());
            let other = second.apply_metadata(index, command);
            assert_eq!(one, other, "entry {index}");
        }
        let snapshot = first.metadata_snapshot();
        assert_eq!(snapshot, second.metadata_snapshot());
        let vhost = &snapshot.vhosts["/"];
        let names: Vec<&str> = vhost
            .queues
            .iter()
            .map(|queue| queue.name.as_str())
            .collect();
        assert_eq!(names, ["eu", "us"]);
        assert_eq!(
            vhost.queues[1].declared_at, 9,
            "the second 'us' is a new queue"
        );
        assert_eq!(
            vhost.bindings.len(),
            1,
            "the deleted queue's binding went with it"
        );
        assert!(
            !snapshot.vhosts.contains_key("staging"),
            "deleted with its queue"
        );
        let users: Vec<&str> = snapshot
            .access
            .users
            .iter()
            .map(|user| user.name.as_str())
            .collect();
        assert_eq!(users, ["bob", "guest"]);
        assert_eq!(
            snapshot.access.permissions.len(),
            1,
            "guest's on '/'; bob's went with 'staging'"
        );
    }

    #[test]
    fn metadata_changes_in_a_missing_vhost_are_refused() {
        let broker = node("a@h:1");
        let refused = |reply: MetadataReply| match reply {
            MetadataReply::Refused { code, text } => (code, text),
            MetadataReply::Done => panic!("refused"),
        };
        assert_eq!(
            refused(broker.apply_metadata(1, permissions("guest", "nope"))),
            (404, "vhost 'nope' does not exist".to_owned())
        );
        let declare = MetadataCommand::DeclareQueue {
            vhost: "nope".into(),
            queue: queue_definition("q", "a@h:1", true),
            connection: 0,
        };
        assert_eq!(
            refused(broker.apply_metadata(2, declare)),
            (530, "vhost nope not found".to_owned())
        );
        assert!(broker.vhost("nope").is_none());
    }

    #[test]
    fn metadata_max_queues_refuses_new_queues_only() {
        let broker = node("a@h:1");
        let limits = MetadataCommand::SetVhostLimits {
            vhost: "/".into(),
            limits: VhostLimits {
                max_connections: None,
                max_queues: Some(1),
            },
        };
        assert_eq!(broker.apply_metadata(1, limits), MetadataReply::Done);
        assert_eq!(
            broker.apply_metadata(2, queue("one", "a@h:1", true)),
            MetadataReply::Done
        );
        assert_eq!(
            broker.apply_metadata(3, queue("one", "a@h:1", true)),
            MetadataReply::Done,
            "a redeclaration is not a new queue"
        );
        assert_eq!(
            broker.apply_metadata(4, queue("two", "a@h:1", true)),
            MetadataReply::Refused {
                code: 406,
                text: "cannot declare queue 'two': queue limit in vhost '/' (1) is reached".into()
            }
        );
    }

    #[test]
    fn metadata_vhost_limit_changes_made_together_both_hold() {
        let broker = node("a@h:1");
        // Two administrators change different limits at once: both
        // commands are made before either is applied.
        let limit = |limit, value| MetadataCommand::SetVhostLimit {
            vhost: "/".into(),
            limit,
            value,
        };
        let connections = limit(VhostLimit::MaxConnections, Some(10));
        let queues = limit(VhostLimit::MaxQueues, Some(3));
        assert_eq!(broker.apply_metadata(1, connections), MetadataReply::Done);
        assert_eq!(broker.apply_metadata(2, queues), MetadataReply::Done);
        assert_eq!(
            broker.access.vhost_limits("/"),
            VhostLimits {
                max_connections: Some(10),
                max_queues: Some(3),
            }
        );
        let cleared = limit(VhostLimit::MaxConnections, None);
        assert_eq!(broker.apply_metadata(3, cleared), MetadataReply::Done);
        assert_eq!(broker.access.vhost_limits("/").max_queues, Some(3));
        assert_eq!(broker.access.vhost_limits("/").max_connections, None);
        let elsewhere = MetadataCommand::SetVhostLimit {
            vhost: "nope".into(),
            limit: VhostLimit::MaxQueues,
            value: Some(1),
        };
        assert!(matches!(
            broker.apply_metadata(4, elsewhere),
            MetadataReply::Refused { .. }
        ));
        // As the log carries it.
        let encoded = serde_json::to_value(limit(VhostLimit::MaxQueues, Some(3))).unwrap();
        assert_eq!(
            encoded,
            serde_json::json!({"op": "set_vhost_limit", "vhost": "/", "limit": "max-queues", "value": 3})
        );
    }

    #[test]
    fn metadata_refused_changes_are_refused_alike_with_rabbitmq_text() {
        let broker = node("a@h:1");
        let history = history();
        broker.apply_metadata(1, history[1].clone());
        let reply = broker.apply_metadata(2, history[3].clone());
        let MetadataReply::Refused { code, text } = reply else {
            panic!("an inequivalent redeclaration is refused");
        };
        assert_eq!(code, 406);
        assert!(
            text.contains("inequivalent arg 'durable' for queue 'eu'"),
            "{text}"
        );
    }

    #[test]
    fn metadata_a_node_restored_from_a_snapshot_matches_the_one_that_wrote_it() {
        let written = node("a@h:1");
        for (index, command) in history().into_iter().enumerate() {
            written.apply_metadata(index as u64 + 1, command);
        }
        let snapshot = written.metadata_snapshot();
        // A node that saw something else entirely is brought to it too.
        let lagging = node("b@h:2");
        lagging.apply_metadata(1, queue("stale", "b@h:2", true));
        lagging.restore_metadata(&snapshot);
        assert_eq!(lagging.metadata_snapshot(), snapshot);
        let fresh = node("c@h:3");
        fresh.restore_metadata(&snapshot);
        assert_eq!(fresh.metadata_snapshot(), snapshot);
    }
}
