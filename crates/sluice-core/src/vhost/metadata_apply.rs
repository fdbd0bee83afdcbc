//! The vhost as the metadata log changes it: queues declared and deleted
//! as every node applies them, the vhost written out as definitions for a
//! snapshot, and brought to a snapshot's definitions.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{read, server_generated_name, Exchange, ExchangeSpec, QueueDeclaration, VirtualHost};
use crate::arguments::{as_integer, as_text};
use crate::arguments::{check_exchange_name_argument, check_queue_arguments};
use crate::definitions::{
    BindingDefinition, ExchangeDefinition, QueueDefinition, VhostDefinitions,
};
use crate::error::{AmqpError, AmqpResult};
use crate::exchange::{Binding, Destination, ExchangeKind};
use crate::queue::{ConnectionId, Queue, QueueOptions};
use crate::queue_factory::create_queue;
use crate::queue_location::QueueLocator;
use crate::queue_type::QueueType;
use crate::quorum_members::{positional_ids, Membership, SharedMembership};
use amq_protocol::types::FieldTable;

/// `x-quorum-initial-group-size` when not given.
const QUORUM_GROUP_SIZE_DEFAULT: usize = 3;

/// What RabbitMQ refuses of a quorum queue's declaration, in its order and
/// words (`rabbit_quorum_queue:declare`).
fn check_quorum_declaration(definition: &QueueDefinition, what: &str) -> AmqpResult<()> {
    for key in ["x-max-priority", "x-queue-mode"] {
        if definition.arguments.inner().contains_key(key) {
            return Err(AmqpError::precondition_failed(format!(
                "invalid arg '{key}' for {what}"
            )));
        }
    }
    if definition
        .arguments
        .inner()
        .get("x-overflow")
        .and_then(as_text)
        .as_deref()
        == Some("reject-publish-dlx")
    {
        return Err(AmqpError::precondition_failed(format!(
            "invalid arg 'x-overflow' with value 'reject-publish-dlx' for {what}"
        )));
    }
    let property = if definition.auto_delete {
        Some("auto-delete")
    } else if definition.exclusive_owner.is_some() {
        Some("exclusive-owner")
    } else if !definition.durable {
        Some("non-durable")
    } else {
        None
    };
    match property {
        Some(property) => Err(AmqpError::precondition_failed(format!(
            "invalid property '{property}' for {what}"
        ))),
        None => Ok(()),
    }
}
use crate::remote_queue::{RemoteQueue, Unreachable};

/// A durable queue of this node that could not be brought back at start.
#[derive(Debug, thiserror::Error)]
#[error("cannot recover queue '{queue}' in vhost '{vhost}': {reason}; the node does not start rather than drop a durable queue: fix the cause and start it again")]
pub struct RecoveryError {
    pub queue: String,
    pub vhost: String,
    pub reason: String,
}

impl VirtualHost {
    /// What a queue.declare that must create a queue proposes: the name
    /// (a server-generated one for ""), flags, and this node as its home.
    pub fn new_queue_definition(
        &self,
        declaration: &QueueDeclaration<'_>,
        connection_id: ConnectionId,
    ) -> QueueDefinition {
        let name = if declaration.name.is_empty() {
            server_generated_name()
        } else {
            declaration.name.to_owned()
        };
        let home = self.home_for_new_queue(declaration);
        let members = match QueueType::of_arguments(&declaration.arguments) {
            Some(QueueType::Quorum) => self.quorum_members(&home, &declaration.arguments),
            _ => Vec::new(),
        };
        QueueDefinition {
            name,
            store_id: None,
            // An exclusive queue dies with its connection, so it is never
            // durable, whatever was asked: RabbitMQ stores it as transient.
            durable: declaration.durable && !declaration.exclusive,
            auto_delete: declaration.auto_delete,
            arguments: declaration.arguments.clone(),
            exclusive_owner: declaration.exclusive.then_some(connection_id),
            home: Some(home),
            home_incarnation: self.node.incarnation,
            declared_at: 0,
            // Recorded, so that they stay what they are as members change.
            member_ids: positional_ids(&members),
            members,
        }
    }

    /// A new quorum queue's members: its home first (it stands for leader
    /// first), then nodes that are up, then the others, up to
    /// `x-quorum-initial-group-size` (3 by default, as in RabbitMQ, and at
    /// most the cluster's size).
    fn quorum_members(&self, home: &str, arguments: &FieldTable) -> Vec<String> {
        let size = arguments
            .inner()
            .get("x-quorum-initial-group-size")
            .and_then(as_integer)
            .map_or(QUORUM_GROUP_SIZE_DEFAULT, |size| {
                size.clamp(1, 1000) as usize
            });
        let local = self.node.name.to_string();
        let running = self.metadata.running_nodes(&local);
        let mut others: Vec<String> = self
            .metadata
            .cluster_nodes(&local)
            .into_iter()
            .filter(|node| node != home)
            .collect();
        others.sort_by_key(|node| !running.contains(node));
        let mut members = vec![home.to_owned()];
        members.extend(others.into_iter().take(size.saturating_sub(1)));
        members
    }

    /// Where a queue about to be declared through this node lives: by its
    /// `x-queue-leader-locator`, else the node's locator (see
    /// [`crate::queue_location`]). An exclusive queue lives with its
    /// connection, always. `balanced` counts the queues of this vhost.
    fn home_for_new_queue(&self, declaration: &QueueDeclaration<'_>) -> String {
        let local = self.node.name.to_string();
        if declaration.exclusive {
            return local;
        }
        let locator = declaration
            .arguments
            .inner()
            .get("x-queue-leader-locator")
            .and_then(QueueLocator::of_argument)
            .unwrap_or(self.queue_locator);
        if locator == QueueLocator::ClientLocal {
            return local;
        }
        let mut running: Vec<(String, usize)> = self
            .metadata
            .running_nodes(&local)
            .into_iter()
            .map(|node| (node, 0))
            .collect();
        for queue in read(&self.queues).values() {
            let home = queue.home_node().map_or(local.as_str(), |home| &**home);
            if let Some((_, count)) = running.iter_mut().find(|(node, _)| node == home) {
                *count += 1;
            }
        }
        locator.choose(&local, &running, |count| rand::random_range(0..count))
    }

    /// Creates the queue `definition` describes, or checks an existing one
    /// of that name for equivalence (another node's declaration may have
    /// come first). Returns the queue and whether it was created. A queue
    /// homed elsewhere, or one of this node whose journal cannot be
    /// opened, is kept as a [`RemoteQueue`]: the metadata must not differ
    /// between nodes because of one node's disk.
    pub fn apply_declare_queue(
        &self,
        definition: &QueueDefinition,
        connection_id: ConnectionId,
    ) -> AmqpResult<(Arc<dyn Queue>, bool)> {
        let mut queues = self.queues_mut();
        if let Some(existing) = queues.get(definition.name.as_str()) {
            let declaration = QueueDeclaration {
                name: &definition.name,
                passive: false,
                durable: definition.durable,
                exclusive: definition.exclusive_owner.is_some(),
                auto_delete: definition.auto_delete,
                arguments: definition.arguments.clone(),
            };
            self.check_queue_equivalence(existing, &declaration, connection_id)?;
            existing.touch();
            return Ok((Arc::clone(existing), false));
        }
        // Only a queue about to be created has its arguments validated, as
        // in RabbitMQ: a redeclaration is compared for equivalence instead.
        let what = self.describe_queue(&definition.name);
        check_exchange_name_argument(&definition.arguments, "x-dead-letter-exchange", &what)?;
        check_queue_arguments(&definition.arguments, &what)?;
        if QueueType::of_arguments(&definition.arguments) == Some(QueueType::Quorum) {
            check_quorum_declaration(definition, &what)?;
        }
        let queue = self.materialize_queue(definition);
        self.start_timers_when_ready(&queue);
        queues.insert(Arc::clone(queue.name()), Arc::clone(&queue));
        Ok((queue, true))
    }

    /// The queue object for a definition: the queue itself on its home
    /// node, a stand-in elsewhere.
    pub(super) fn materialize_queue(&self, definition: &QueueDefinition) -> Arc<dyn Queue> {
        let name: Arc<str> = Arc::from(definition.name.as_str());
        let options = QueueOptions {
            durable: definition.durable,
            exclusive_owner: definition.exclusive_owner,
            auto_delete: definition.auto_delete,
            arguments: definition.arguments.clone(),
            declared_at: definition.declared_at,
            home_incarnation: definition.home_incarnation,
            members: SharedMembership::new(quorum_membership_of(definition)),
        };
        // A quorum queue is held by each of its members; a node that is
        // not one reaches it through its home.
        let held_elsewhere = match &definition.home {
            _ if !definition.members.is_empty() => !definition
                .members
                .iter()
                .any(|member| **member == *self.node.name),
            Some(home) => **home != *self.node.name,
            None => false,
        };
        let home: Arc<str> = match &definition.home {
            Some(home) if held_elsewhere => Arc::from(home.as_str()),
            _ => {
                let effective = self.effective_queue_arguments(&name, &definition.arguments);
                let spec = self.queue_spec(
                    Arc::clone(&name),
                    options.clone(),
                    &effective,
                    definition.store_id.clone(),
                );
                match create_queue(spec) {
                    Ok(queue) => {
                        if definition.durable && queue.message_count() > 0 {
                            tracing::info!(queue = %name, vhost = %self.name, messages = queue.message_count(), "recovered queue");
                        }
                        return queue;
                    }
                    Err(error) => {
                        tracing::error!(queue = %name, vhost = %self.name, store_id = ?definition.store_id, %error, "queue unavailable on its home node");
                        return Arc::new(RemoteQueue::new(
                            name,
                            Arc::clone(&self.name),
                            options,
                            Arc::clone(&self.node.name),
                            definition.store_id.clone(),
                            Unreachable::LocalStorage(format!("cannot create it: {error}")),
                        ));
                    }
                }
            }
        };
        Arc::new(
            RemoteQueue::new(
                name,
                Arc::clone(&self.name),
                options,
                home,
                definition.store_id.clone(),
                Unreachable::OtherNode(Arc::clone(&self.metadata)),
            )
            .served_by_members(&definition.members),
        )
    }

    /// Deletes the queue `name` (only the one declared at `declared_at`,
    /// when given) with its bindings; its consumers on this node are told
    /// with basic.cancel.
    pub fn apply_delete_queue(&self, name: &str, declared_at: Option<u64>) {
        let Some(queue) = read(&self.queues).get(name).cloned() else {
            return;
        };
        if declared_at.is_some_and(|at| at != queue.options().declared_at) {
            return;
        }
        let (_, consumers) = self.remove_queue(&queue);
        for consumer in consumers {
            consumer.sink.cancelled_by_queue(&consumer);
        }
    }

    /// Deletes the non-durable queues `node` held in runs before
    /// `incarnation`: their messages and owners went with that run.
    pub fn remove_stale_queues(&self, node: &str, incarnation: u64) {
        let stale: Vec<Arc<dyn Queue>> = read(&self.queues)
            .values()
            .filter(|queue| {
                let options = queue.options();
                !options.durable
                    && options.home_incarnation != incarnation
                    && self.home_of(queue.as_ref()) == node
            })
            .cloned()
            .collect();
        for queue in stale {
            tracing::info!(queue = %queue.name(), vhost = %self.name, node, "deleting a non-durable queue of an earlier run of its node");
            self.apply_delete_queue(queue.name(), Some(queue.options().declared_at));
        }
    }

    /// Deletes the non-durable queues of a node that went down. Applied
    /// alike everywhere, the node itself included when it was only cut off
    /// and comes back: its consumers of them hear basic.cancel.
    pub fn remove_queues_of_dead_node(&self, node: &str) {
        if let Some(number) = self.metadata.node_number_of(node) {
            let queues: Vec<Arc<dyn Queue>> = read(&self.queues).values().cloned().collect();
            for queue in queues {
                queue.node_down(number);
            }
        }
        let gone: Vec<Arc<dyn Queue>> = read(&self.queues)
            .values()
            .filter(|queue| !queue.options().durable && self.home_of(queue.as_ref()) == node)
            .cloned()
            .collect();
        for queue in gone {
            tracing::info!(queue = %queue.name(), vhost = %self.name, node, "deleting a non-durable queue of a node that went down");
            self.apply_delete_queue(queue.name(), Some(queue.options().declared_at));
        }
    }

    /// Deletes every non-durable exchange, with the bindings from and to
    /// it: the whole cluster restarted.
    pub fn remove_transient_exchanges(&self) {
        let mut exchanges = self.exchanges_mut();
        let transient: Vec<Arc<str>> = exchanges
            .values()
            .filter(|exchange| !exchange.durable)
            .map(|exchange| Arc::clone(&exchange.name))
            .collect();
        for name in transient {
            exchanges.remove(&name);
            let emptied = Self::remove_destination_locked(&exchanges, &Destination::Exchange(name));
            Self::delete_auto_delete_exchanges(&mut exchanges, emptied);
        }
    }

    pub(super) fn home_of<'a>(&'a self, queue: &'a dyn Queue) -> &'a str {
        queue.home_node().unwrap_or(&self.node.name)
    }

    /// Queues of this node that are durable and could not be opened.
    pub fn unrecoverable_queues(&self) -> Vec<RecoveryError> {
        read(&self.queues)
            .values()
            .filter(|queue| {
                queue.options().durable && self.home_of(queue.as_ref()) == &*self.node.name
            })
            .filter_map(|queue| {
                queue.unavailable().map(|error| RecoveryError {
                    queue: queue.name().to_string(),
                    vhost: self.name.to_string(),
                    reason: error.text,
                })
            })
            .collect()
    }

    /// The whole vhost as definitions: every exchange but the standard
    /// ones, every queue, every binding.
    pub fn definitions(&self) -> VhostDefinitions {
        let exchanges = read(&self.exchanges);
        let queues = read(&self.queues);
        let mut definitions = VhostDefinitions::default();
        for exchange in exchanges.values() {
            if !is_standard_exchange(&exchange.name) {
                definitions.exchanges.push(ExchangeDefinition {
                    name: exchange.name.to_string(),
                    kind: exchange.kind.as_str().to_owned(),
                    durable: exchange.durable,
                    auto_delete: exchange.auto_delete,
                    internal: exchange.internal,
                    arguments: exchange.arguments.clone(),
                });
            }
            for binding in exchange.bindings() {
                definitions.bindings.push(BindingDefinition {
                    source: exchange.name.to_string(),
                    destination: binding.destination.name().to_owned(),
                    destination_type: match binding.destination {
                        Destination::Queue(_) => "queue",
                        Destination::Exchange(_) => "exchange",
                    }
                    .to_owned(),
                    routing_key: binding.routing_key,
                    arguments: binding.arguments,
                });
            }
        }
        for queue in queues.values() {
            let options = queue.options();
            let membership = options.members.get();
            definitions.queues.push(QueueDefinition {
                name: queue.name().to_string(),
                store_id: queue.store_id().map(str::to_owned),
                durable: options.durable,
                auto_delete: options.auto_delete,
                arguments: options.arguments.clone(),
                exclusive_owner: options.exclusive_owner,
                home: Some(self.home_of(queue.as_ref()).to_owned()),
                home_incarnation: options.home_incarnation,
                declared_at: options.declared_at,
                members: membership.members,
                member_ids: membership.ids,
            });
        }
        definitions.policies = self.policy_list();
        definitions.parameters = self.parameter_list();
        // A stable order: the same metadata gives the same snapshot.
        definitions.exchanges.sort_by(|a, b| a.name.cmp(&b.name));
        definitions.queues.sort_by(|a, b| a.name.cmp(&b.name));
        definitions.bindings.sort_by(|a, b| {
            (&a.source, &a.destination, &a.routing_key).cmp(&(
                &b.source,
                &b.destination,
                &b.routing_key,
            ))
        });
        definitions
    }

    /// Brings the vhost to `definitions`: what is not in them goes, what
    /// is missing comes, bindings become exactly theirs. A node restarting
    /// from a snapshot, or a lagging one handed one, goes through here.
    pub fn restore(&self, definitions: &VhostDefinitions) {
        // Policies first: the objects made here take theirs as they are
        // made; those that were there already take theirs after.
        self.restore_policies(&definitions.policies);
        self.restore_parameters(&definitions.parameters);
        self.restore_queues(&definitions.queues);
        self.restore_exchanges(&definitions.exchanges);
        self.restore_bindings(&definitions.bindings);
        self.apply_policies();
    }

    fn restore_queues(&self, wanted: &[QueueDefinition]) {
        let wanted_ids: HashSet<(&str, u64)> = wanted
            .iter()
            .map(|queue| (queue.name.as_str(), queue.declared_at))
            .collect();
        let current: Vec<Arc<dyn Queue>> = read(&self.queues).values().cloned().collect();
        for queue in &current {
            if !wanted_ids.contains(&(&**queue.name(), queue.options().declared_at)) {
                self.apply_delete_queue(queue.name(), Some(queue.options().declared_at));
            }
        }
        for definition in wanted {
            let present = read(&self.queues)
                .get(definition.name.as_str())
                .filter(|queue| queue.options().declared_at == definition.declared_at)
                .cloned();
            if let Some(queue) = &present {
                // Its members may have changed in the entries the snapshot
                // stands for.
                let wanted = Membership::of(&definition.members, &definition.member_ids);
                if !definition.members.is_empty() && queue.options().members.get() != wanted {
                    self.change_queue_members(queue, wanted);
                }
            }
            if present.is_none() {
                let queue = self.materialize_queue(definition);
                self.start_timers_when_ready(&queue);
                self.queues_mut().insert(Arc::clone(queue.name()), queue);
            }
        }
    }

    fn restore_exchanges(&self, wanted: &[ExchangeDefinition]) {
        let wanted_names: HashSet<&str> = wanted
            .iter()
            .map(|exchange| exchange.name.as_str())
            .collect();
        let mut exchanges = self.exchanges_mut();
        exchanges.retain(|name, _| is_standard_exchange(name) || wanted_names.contains(&**name));
        for definition in wanted {
            let Some(exchange) = self.exchange_of(definition) else {
                continue;
            };
            let same = exchanges
                .get(definition.name.as_str())
                .is_some_and(|existing| {
                    existing.kind == exchange.kind
                        && existing.durable == exchange.durable
                        && existing.auto_delete == exchange.auto_delete
                        && existing.internal == exchange.internal
                        && existing.arguments == exchange.arguments
                });
            if !same {
                exchanges.insert(Arc::clone(&exchange.name), Arc::new(exchange));
            }
        }
    }

    /// The exchange a definition describes; None (logged) for a kind this
    /// node does not know.
    fn exchange_of(&self, definition: &ExchangeDefinition) -> Option<Exchange> {
        let Some(kind) = ExchangeKind::parse(&definition.kind) else {
            tracing::error!(exchange = %definition.name, kind = %definition.kind, "skipping an exchange of unknown type");
            return None;
        };
        Some(self.new_exchange(ExchangeSpec {
            name: &definition.name,
            kind,
            durable: definition.durable,
            auto_delete: definition.auto_delete,
            internal: definition.internal,
            arguments: definition.arguments.clone(),
        }))
    }

    fn restore_bindings(&self, wanted: &[BindingDefinition]) {
        let mut by_source: HashMap<&str, Vec<Binding>> = HashMap::new();
        for definition in wanted {
            let destination = match definition.destination_type.as_str() {
                "exchange" => Destination::Exchange(Arc::from(definition.destination.as_str())),
                _ => Destination::Queue(Arc::from(definition.destination.as_str())),
            };
            by_source
                .entry(&definition.source)
                .or_default()
                .push(Binding {
                    destination,
                    routing_key: definition.routing_key.clone(),
                    arguments: definition.arguments.clone(),
                });
        }
        let exchanges: Vec<_> = read(&self.exchanges).values().cloned().collect();
        for exchange in exchanges {
            let wanted = by_source.remove(&*exchange.name).unwrap_or_default();
            let mut routing = self.topology.write(exchange.routing_mut());
            let current: Vec<Binding> = routing.bindings().cloned().collect();
            for binding in current.iter().filter(|binding| !wanted.contains(binding)) {
                routing.unbind(binding);
            }
            for binding in wanted {
                if !current.contains(&binding) {
                    if let Err(error) = routing.bind(binding) {
                        tracing::error!(exchange = %exchange.name, %error, "skipping a binding");
                    }
                }
            }
        }
    }

    /// Declares what a single-node version saved where missing: its queues
    /// become `node`'s, with the journals they had.
    pub fn take_over(&self, definitions: &VhostDefinitions, node: &str) {
        for exchange in &definitions.exchanges {
            if self.exchange(&exchange.name).is_ok() {
                continue;
            }
            self.restore_exchange(exchange);
        }
        for definition in &definitions.queues {
            if read(&self.queues).contains_key(definition.name.as_str()) {
                continue;
            }
            let mut definition = definition.clone();
            definition.home = Some(node.to_owned());
            let queue = self.materialize_queue(&definition);
            self.start_timers_when_ready(&queue);
            self.queues_mut().insert(Arc::clone(queue.name()), queue);
        }
        for definition in &definitions.bindings {
            let destination = match definition.destination_type.as_str() {
                "exchange" => Destination::Exchange(Arc::from(definition.destination.as_str())),
                _ => Destination::Queue(Arc::from(definition.destination.as_str())),
            };
            if let Err(error) = self.bind(
                &definition.source,
                destination,
                &definition.routing_key,
                definition.arguments.clone(),
                0,
            ) {
                tracing::error!(source = %definition.source, destination = %definition.destination, %error, "skipping a binding");
            }
        }
    }

    fn restore_exchange(&self, definition: &ExchangeDefinition) {
        if let Some(exchange) = self.exchange_of(definition) {
            self.exchanges_mut()
                .insert(Arc::clone(&exchange.name), Arc::new(exchange));
        }
    }
}

/// A quorum queue's members as a definition gives them. One declared
/// without members (by a definitions import) has its home alone, on every
/// node alike, as its home's queue makes itself.
fn quorum_membership_of(definition: &QueueDefinition) -> Membership {
    let quorum = QueueType::of_arguments(&definition.arguments) == Some(QueueType::Quorum);
    match &definition.home {
        Some(home) if quorum && definition.members.is_empty() => {
            Membership::of(std::slice::from_ref(home), &definition.member_ids)
        }
        _ => Membership::of(&definition.members, &definition.member_ids),
    }
}

/// The default exchange and the `amq.*` ones every vhost has from birth:
/// never in definitions.
fn is_standard_exchange(name: &str) -> bool {
    name.is_empty() || name.starts_with("amq.")
}
