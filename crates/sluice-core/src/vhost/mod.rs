//! A virtual host: its exchanges, queues and the bindings between them.
//!
//! - `routing`: the walk from an exchange to the queues a message lands in.
//! - `publish`: the publish pipeline: route, enqueue into every target,
//!   and the confirm ticket.
//! - `queue_host`: what the vhost does for its queues: dead-letters, expiry.
//! - `metadata_apply`: the vhost as the metadata log changes it, and as
//!   definitions for its snapshots.
//! - `policy_apply`: its policies and runtime parameters, and the
//!   effective settings policies give its queues and exchanges.

mod connection_slot;
pub mod counts;
mod metadata_apply;
mod policy_apply;
mod publish;
mod queue_host;
mod quorum_members_apply;
mod routing;
mod topology;

pub use connection_slot::VhostConnectionSlot;
pub use metadata_apply::RecoveryError;
pub use publish::{PublishScratch, Published};
pub use routing::{RouteScratch, ROUTING_EXCHANGE_HOPS_MAX};

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use amq_protocol::types::FieldTable;
use rand::Rng;

use crate::arguments::{
    check_equivalence, check_exchange_name_argument, check_queue_arguments, inequivalent_flag,
    EXCHANGE_EQUIVALENCE_KEYS, QUEUE_EQUIVALENCE_KEYS,
};
use crate::counters::MessageCounts;
use crate::definitions::DefinitionStore;
use crate::error::{AmqpError, AmqpResult};
use crate::exchange::{Binding, Destination, ExchangeKind, RoutingTable};
use crate::metadata::{MetadataCommand, MetadataProposer, NodeIdentity, Proposal};
use crate::policy::{
    effective_alternate_exchange, effective_queue_arguments, Policy, PolicyTarget, VhostPolicies,
};
use crate::queue::{same_queue, ConnectionId, Consumer, Queue, QueueHost, QueueOptions};
use crate::queue_factory::QueueSpec;
use crate::queue_location::QueueLocator;
use crate::reply_to::ReplyRegistry;
use counts::VhostCounts;
use topology::{TopologyVersion, TopologyWrite};

pub struct Exchange {
    pub name: Arc<str>,
    pub kind: ExchangeKind,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
    /// Where messages this exchange routes nowhere go instead: the
    /// `alternate-exchange` argument, else the exchange's policy's key.
    /// Worked out when the exchange is made and again when a policy
    /// changes; read only for a message routed nowhere.
    alternate_exchange: RwLock<Option<Arc<str>>>,
    routing: RwLock<RoutingTable>,
}

/// What an exchange is created from.
struct ExchangeSpec<'a> {
    name: &'a str,
    kind: ExchangeKind,
    durable: bool,
    auto_delete: bool,
    internal: bool,
    arguments: FieldTable,
}

impl Exchange {
    fn routing(&self) -> RwLockReadGuard<'_, RoutingTable> {
        self.routing
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn routing_mut(&self) -> RwLockWriteGuard<'_, RoutingTable> {
        self.routing
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn is_default(&self) -> bool {
        self.name.is_empty()
    }

    pub fn bindings(&self) -> Vec<Binding> {
        self.routing().bindings().cloned().collect()
    }

    /// Where messages this exchange routes nowhere go instead, now.
    pub fn alternate_exchange(&self) -> Option<Arc<str>> {
        read(&self.alternate_exchange).clone()
    }
}

/// exchange.declare as the vhost sees it.
pub struct ExchangeDeclaration<'a> {
    pub name: &'a str,
    pub kind: &'a str,
    pub passive: bool,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
}

/// queue.declare as the vhost sees it.
pub struct QueueDeclaration<'a> {
    /// Empty asks for a server-named queue.
    pub name: &'a str,
    pub passive: bool,
    pub durable: bool,
    pub exclusive: bool,
    pub auto_delete: bool,
    pub arguments: FieldTable,
}

pub struct VirtualHost {
    pub name: Arc<str>,
    /// As the metadata log set them; read when an object is made or a
    /// policy changes, never per message.
    policies: RwLock<VhostPolicies>,
    /// Runtime parameters by component and name (`vhost-limits` aside:
    /// the access control keeps those).
    parameters: RwLock<ParameterTable>,
    /// The node's count of policy changes (see
    /// [`crate::broker::Broker::policy_generation`]).
    policy_generation: Arc<std::sync::atomic::AtomicU64>,
    exchanges: RwLock<ExchangeTable>,
    queues: RwLock<QueueTable>,
    /// Where durable definitions and queue journals go; None keeps
    /// everything in memory.
    store: Option<Arc<DefinitionStore>>,
    /// This vhost, handed to its queues as their [`QueueHost`]: it routes
    /// what they dead-letter and deletes them when they expire.
    this: Weak<VirtualHost>,
    /// Dead-letter warnings already logged, by queue and kind.
    dead_letter_warnings: Mutex<HashSet<String>>,
    /// Direct reply-to consumers of the node: a reply published to the
    /// default exchange under a reply name reaches one of them.
    reply_to: Arc<ReplyRegistry>,
    /// Moves on with every change to exchanges, queues or bindings, so
    /// that publishers' cached routes are computed again.
    topology: TopologyVersion,
    /// What happened to messages in this vhost: its channels' counts.
    counts: VhostCounts,
    /// This node: the home of the queues declared through it.
    node: NodeIdentity,
    /// Where changes the vhost decides itself (an expired queue, an
    /// exclusive queue whose connection closed) are proposed.
    metadata: Arc<MetadataProposer>,
    queue_locator: QueueLocator,
    /// While the node starts, queues made by replaying the metadata log
    /// wait here to start their timers until every binding is back: a
    /// message that expired while the node was down is due at once, and
    /// its dead-letter exchange must route it.
    deferred_timers: Mutex<Option<Vec<Arc<dyn Queue>>>>,
    /// Connections open on this node, for `max-connections`.
    open_connections: std::sync::atomic::AtomicU64,
    /// Connections open on the cluster's other nodes, as they reported.
    connections_elsewhere: std::sync::atomic::AtomicU64,
}

/// What a vhost shares with the rest of its node.
#[derive(Clone)]
pub struct VhostServices {
    /// Where durable queues journal; None keeps everything in memory.
    pub store: Option<Arc<DefinitionStore>>,
    /// Direct reply-to consumers of the node.
    pub reply_to: Arc<ReplyRegistry>,
    pub node: NodeIdentity,
    pub metadata: Arc<MetadataProposer>,
    /// Where new classic queues live unless their declaration says.
    pub queue_locator: QueueLocator,
    /// The node's count of policy changes, shared by its vhosts.
    pub policy_generation: Arc<std::sync::atomic::AtomicU64>,
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

type ExchangeTable = HashMap<Arc<str>, Arc<Exchange>>;
type QueueTable = HashMap<Arc<str>, Arc<dyn Queue>>;
type ParameterTable = std::collections::BTreeMap<(String, String), serde_json::Value>;

impl VirtualHost {
    /// A vhost with the default exchange and the `amq.*` exchanges every
    /// RabbitMQ vhost has.
    pub fn new(name: &str) -> Arc<Self> {
        Self::with_services(
            name,
            VhostServices {
                store: None,
                reply_to: Arc::new(ReplyRegistry::default()),
                node: NodeIdentity::new(NodeIdentity::STANDALONE),
                metadata: Arc::default(),
                queue_locator: QueueLocator::default(),
                policy_generation: Arc::default(),
            },
        )
    }

    /// A vhost of a node, without policies until the metadata log sets
    /// some.
    pub fn with_services(name: &str, services: VhostServices) -> Arc<Self> {
        let vhost = Arc::new_cyclic(|this| VirtualHost {
            name: Arc::from(name),
            policies: RwLock::default(),
            parameters: RwLock::default(),
            policy_generation: services.policy_generation,
            exchanges: RwLock::new(HashMap::new()),
            queues: RwLock::new(HashMap::new()),
            store: services.store,
            this: this.clone(),
            dead_letter_warnings: Mutex::new(HashSet::new()),
            reply_to: services.reply_to,
            topology: TopologyVersion::default(),
            counts: VhostCounts::default(),
            node: services.node,
            metadata: services.metadata,
            queue_locator: services.queue_locator,
            deferred_timers: Mutex::new(None),
            open_connections: Default::default(),
            connections_elsewhere: Default::default(),
        });
        let standard = [
            ("", ExchangeKind::Direct),
            ("amq.direct", ExchangeKind::Direct),
            ("amq.fanout", ExchangeKind::Fanout),
            ("amq.topic", ExchangeKind::Topic),
            ("amq.headers", ExchangeKind::Headers),
            ("amq.match", ExchangeKind::Headers),
        ];
        {
            let mut exchanges = write(&vhost.exchanges);
            for (name, kind) in standard {
                let exchange = vhost.new_exchange(ExchangeSpec {
                    name,
                    kind,
                    durable: true,
                    auto_delete: false,
                    internal: false,
                    arguments: FieldTable::default(),
                });
                exchanges.insert(Arc::clone(&exchange.name), Arc::new(exchange));
            }
        }
        vhost
    }

    /// The channels that count what happens to this vhost's messages.
    pub fn counted_channels(&self) -> &VhostCounts {
        &self.counts
    }

    /// What happened to this vhost's messages so far.
    pub fn counts(&self) -> MessageCounts {
        self.counts.counts()
    }

    /// The exchange table, to change it: the topology version moves on
    /// when the guard is released.
    fn exchanges_mut(&self) -> TopologyWrite<'_, RwLockWriteGuard<'_, ExchangeTable>> {
        self.topology.write(write(&self.exchanges))
    }

    /// The queue table, to change it (see [`Self::exchanges_mut`]).
    fn queues_mut(&self) -> TopologyWrite<'_, RwLockWriteGuard<'_, QueueTable>> {
        self.topology.write(write(&self.queues))
    }

    fn new_exchange(&self, spec: ExchangeSpec<'_>) -> Exchange {
        // The default exchange routes by queue name only: RabbitMQ never
        // gives it an alternate.
        let alternate_exchange = if spec.name.is_empty() {
            None
        } else {
            let policy = self.exchange_policy(spec.name);
            effective_alternate_exchange(&spec.arguments, policy.as_deref())
        };
        Exchange {
            name: Arc::from(spec.name),
            kind: spec.kind,
            durable: spec.durable,
            auto_delete: spec.auto_delete,
            internal: spec.internal,
            arguments: spec.arguments,
            alternate_exchange: RwLock::new(alternate_exchange),
            routing: RwLock::new(RoutingTable::new(spec.kind)),
        }
    }

    /// A queue's effective arguments: what it was declared with, merged with
    /// the policy that applies to its name (see [`crate::policy`]). Queue
    /// behaviour (limits, TTL, dead-lettering) reads these, never the
    /// declared arguments alone; equivalence checks and saved definitions
    /// use the declared ones.
    pub fn effective_queue_arguments(&self, queue_name: &str, declared: &FieldTable) -> FieldTable {
        effective_queue_arguments(declared, self.queue_policy(queue_name).as_deref())
    }

    /// The policy that applies to the named queue now, if any.
    pub fn queue_policy(&self, queue_name: &str) -> Option<Arc<Policy>> {
        read(&self.policies)
            .matching(PolicyTarget::Queue, queue_name)
            .cloned()
    }

    /// The policy that applies to the named exchange now, if any.
    pub fn exchange_policy(&self, exchange_name: &str) -> Option<Arc<Policy>> {
        read(&self.policies)
            .matching(PolicyTarget::Exchange, exchange_name)
            .cloned()
    }

    fn describe_exchange(&self, name: &str) -> String {
        format!("exchange '{}' in vhost '{}'", name, self.name)
    }

    fn describe_queue(&self, name: &str) -> String {
        format!("queue '{}' in vhost '{}'", name, self.name)
    }

    fn no_exchange(&self, name: &str) -> AmqpError {
        AmqpError::not_found(format!("no {}", self.describe_exchange(name)))
    }

    fn no_queue(&self, name: &str) -> AmqpError {
        AmqpError::not_found(format!("no {}", self.describe_queue(name)))
    }

    pub fn exchange(&self, name: &str) -> AmqpResult<Arc<Exchange>> {
        read(&self.exchanges)
            .get(name)
            .cloned()
            .ok_or_else(|| self.no_exchange(name))
    }

    /// The exchange named by a publish, whose name arrives as raw bytes.
    pub fn exchange_for_publish(&self, name: &[u8]) -> AmqpResult<Arc<Exchange>> {
        let name = std::str::from_utf8(name)
            .map_err(|_| self.no_exchange(&String::from_utf8_lossy(name)))?;
        let exchange = self.exchange(name)?;
        if exchange.internal {
            return Err(AmqpError::access_refused(format!(
                "cannot publish to internal {}",
                self.describe_exchange(name)
            )));
        }
        Ok(exchange)
    }

    pub fn exchanges(&self) -> Vec<Arc<Exchange>> {
        read(&self.exchanges).values().cloned().collect()
    }

    /// What this node can answer to an exchange.declare without the
    /// metadata log: Ok(false) for a passive or equivalent declaration, a
    /// refusal, or Ok(true) when the exchange must be created.
    pub fn check_exchange_declaration(
        &self,
        declaration: &ExchangeDeclaration<'_>,
    ) -> AmqpResult<bool> {
        let name = declaration.name;
        if declaration.passive {
            // Refused even though it exists, as RabbitMQ's passive declare
            // checks the default exchange before it looks the name up.
            if name.is_empty() {
                return Err(AmqpError::access_refused(
                    "operation not permitted on the default exchange",
                ));
            }
            self.exchange(name)?;
            return Ok(false);
        }
        let kind = ExchangeKind::parse(declaration.kind).ok_or_else(|| {
            AmqpError::command_invalid(format!("unknown exchange type '{}'", declaration.kind))
        })?;
        if name.is_empty() {
            return Err(AmqpError::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        match read(&self.exchanges).get(name) {
            Some(existing) => {
                self.check_exchange_equivalence(existing, declaration, kind)?;
                Ok(false)
            }
            // As in RabbitMQ, an existing `amq.*` exchange is redeclared like
            // any other (equivalence checked above); only creating one is
            // refused.
            None if name.starts_with("amq.") => Err(AmqpError::access_refused(format!(
                "exchange name '{name}' contains reserved prefix 'amq.*'"
            ))),
            // As RabbitMQ, only a new exchange has its alternate checked.
            None => {
                check_exchange_name_argument(
                    &declaration.arguments,
                    "alternate-exchange",
                    &self.describe_exchange(name),
                )?;
                Ok(true)
            }
        }
    }

    pub fn declare_exchange(&self, declaration: ExchangeDeclaration<'_>) -> AmqpResult<()> {
        if !self.check_exchange_declaration(&declaration)? {
            return Ok(());
        }
        let kind = ExchangeKind::parse(declaration.kind).ok_or_else(|| {
            AmqpError::command_invalid(format!("unknown exchange type '{}'", declaration.kind))
        })?;
        let mut exchanges = self.exchanges_mut();
        if let Some(existing) = exchanges.get(declaration.name) {
            return self.check_exchange_equivalence(existing, &declaration, kind);
        }
        let exchange = self.new_exchange(ExchangeSpec {
            name: declaration.name,
            kind,
            durable: declaration.durable,
            auto_delete: declaration.auto_delete,
            internal: declaration.internal,
            arguments: declaration.arguments,
        });
        exchanges.insert(Arc::clone(&exchange.name), Arc::new(exchange));
        Ok(())
    }

    /// A redeclaration of `existing`: equivalent, or 406 naming the first
    /// difference, in RabbitMQ's order (type, flags, then arguments).
    fn check_exchange_equivalence(
        &self,
        existing: &Exchange,
        declaration: &ExchangeDeclaration<'_>,
        kind: ExchangeKind,
    ) -> AmqpResult<()> {
        let what = self.describe_exchange(&existing.name);
        if existing.kind != kind {
            return Err(AmqpError::precondition_failed(format!(
                "inequivalent arg 'type' for {what}: received '{}' but current is '{}'",
                kind.as_str(),
                existing.kind.as_str()
            )));
        }
        let flags = [
            ("durable", declaration.durable, existing.durable),
            ("auto_delete", declaration.auto_delete, existing.auto_delete),
            ("internal", declaration.internal, existing.internal),
        ];
        for (flag, received, current) in flags {
            if received != current {
                return Err(inequivalent_flag(flag, &what, received, current));
            }
        }
        check_equivalence(
            EXCHANGE_EQUIVALENCE_KEYS,
            &declaration.arguments,
            &existing.arguments,
            &what,
        )
    }

    /// What this node can answer to an exchange.delete without the metadata
    /// log: a refusal, Ok(false) when there is nothing to delete, Ok(true)
    /// when the deletion must go through the log.
    pub fn check_exchange_deletion(&self, name: &str, if_unused: bool) -> AmqpResult<bool> {
        Self::check_deletable_exchange(name, || self.describe_exchange(name))?;
        let Some(exchange) = read(&self.exchanges).get(name).cloned() else {
            return Ok(false);
        };
        if if_unused && !exchange.routing().is_empty() {
            return Err(AmqpError::precondition_failed(format!(
                "{} in use",
                self.describe_exchange(name)
            )));
        }
        Ok(true)
    }

    fn check_deletable_exchange(name: &str, describe: impl FnOnce() -> String) -> AmqpResult<()> {
        if name.is_empty() {
            return Err(AmqpError::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        if name.starts_with("amq.") {
            return Err(AmqpError::access_refused(format!(
                "deletion of system {} not allowed",
                describe()
            )));
        }
        Ok(())
    }

    pub fn delete_exchange(&self, name: &str, if_unused: bool) -> AmqpResult<()> {
        Self::check_deletable_exchange(name, || self.describe_exchange(name))?;
        let mut exchanges = self.exchanges_mut();
        let Some(exchange) = exchanges.get(name).cloned() else {
            return Ok(()); // deleting a missing exchange succeeds, as in RabbitMQ 3.x
        };
        let destination = Destination::Exchange(Arc::clone(&exchange.name));
        // RabbitMQ counts only bindings with this exchange as their source:
        // one that is merely bound to another exchange is unused.
        if if_unused && !exchange.routing().is_empty() {
            return Err(AmqpError::precondition_failed(format!(
                "{} in use",
                self.describe_exchange(name)
            )));
        }
        exchanges.remove(name);
        let emptied = Self::remove_destination_locked(&exchanges, &destination);
        Self::delete_auto_delete_exchanges(&mut exchanges, emptied);
        Ok(())
    }

    /// Removes bindings to `destination` from every exchange and returns the
    /// auto-delete exchanges left without bindings.
    fn remove_destination_locked(
        exchanges: &HashMap<Arc<str>, Arc<Exchange>>,
        destination: &Destination,
    ) -> Vec<Arc<str>> {
        let mut emptied = Vec::new();
        for exchange in exchanges.values() {
            let mut routing = exchange.routing_mut();
            if routing.remove_destination(destination) > 0
                && exchange.auto_delete
                && routing.is_empty()
            {
                emptied.push(Arc::clone(&exchange.name));
            }
        }
        emptied
    }

    /// Auto-delete exchanges go when their last binding goes; deleting one
    /// may empty another that was bound to it, so this repeats.
    fn delete_auto_delete_exchanges(
        exchanges: &mut HashMap<Arc<str>, Arc<Exchange>>,
        mut emptied: Vec<Arc<str>>,
    ) {
        while let Some(name) = emptied.pop() {
            if exchanges.remove(&name).is_some() {
                let destination = Destination::Exchange(name);
                emptied.extend(Self::remove_destination_locked(exchanges, &destination));
            }
        }
    }

    /// Declares a queue directly, outside the metadata log (a node's
    /// channels propose instead: see [`Self::check_queue_declaration`]).
    /// Returns it and whether it was created.
    pub fn declare_queue(
        &self,
        declaration: QueueDeclaration<'_>,
        connection_id: ConnectionId,
    ) -> AmqpResult<(Arc<dyn Queue>, bool)> {
        if let Some(existing) = self.check_queue_declaration(&declaration, connection_id)? {
            return Ok((existing, false));
        }
        let definition = self.new_queue_definition(&declaration, connection_id);
        self.apply_declare_queue(&definition, connection_id)
    }

    /// The queue `name` when its deletion is decided but not yet applied:
    /// an auto-delete queue whose last consumer left, marked deleted on
    /// the spot and taken out of the vhost only when the metadata log
    /// applies its deletion.
    pub fn queue_being_deleted(&self, name: &str) -> Option<Arc<dyn Queue>> {
        read(&self.queues)
            .get(name)
            .filter(|queue| queue.is_deleted())
            .cloned()
    }

    /// What this node can answer to a queue.declare without the metadata
    /// log: the queue of a passive or equivalent declaration (Some), a
    /// refusal, or None when the queue must be created.
    pub fn check_queue_declaration(
        &self,
        declaration: &QueueDeclaration<'_>,
        connection_id: ConnectionId,
    ) -> AmqpResult<Option<Arc<dyn Queue>>> {
        if declaration.passive {
            let queue = self.queue(declaration.name, connection_id)?;
            // Decided for deletion (an auto-delete queue whose last
            // consumer left), it is gone for clients already, as its
            // consumes are; the metadata log only has to catch up.
            if queue.is_deleted() {
                return Err(self.no_queue(declaration.name));
            }
            queue.touch();
            return Ok(Some(queue));
        }
        if declaration.name.starts_with("amq.") {
            return Err(AmqpError::access_refused(format!(
                "queue name '{}' contains reserved prefix 'amq.*'",
                declaration.name
            )));
        }
        if declaration.name.is_empty() {
            return Ok(None);
        }
        let existing = read(&self.queues).get(declaration.name).cloned();
        match existing {
            Some(existing) => {
                self.check_queue_equivalence(&existing, declaration, connection_id)?;
                existing.touch();
                Ok(Some(existing))
            }
            None => {
                let what = self.describe_queue(declaration.name);
                check_exchange_name_argument(
                    &declaration.arguments,
                    "x-dead-letter-exchange",
                    &what,
                )?;
                check_queue_arguments(&declaration.arguments, &what)?;
                Ok(None)
            }
        }
    }

    /// Starts a queue's timers, or keeps them for [`Self::finish_start`]
    /// while the node replays its metadata.
    fn start_timers_when_ready(&self, queue: &Arc<dyn Queue>) {
        let mut deferred = self
            .deferred_timers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match deferred.as_mut() {
            Some(waiting) => waiting.push(Arc::clone(queue)),
            None => queue.start_timers(),
        }
    }

    /// The node starts: queues made from now on wait for
    /// [`Self::finish_start`] to start their timers.
    pub fn begin_start(&self) {
        *self
            .deferred_timers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Vec::new());
    }

    /// The node has replayed its metadata: every binding is back, so the
    /// queues' timers start.
    pub fn finish_start(&self) {
        let waiting = self
            .deferred_timers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
            .unwrap_or_default();
        for queue in waiting {
            if !queue.is_deleted() {
                queue.start_timers();
            }
        }
    }

    /// A redeclaration of `existing`: equivalent, or the error RabbitMQ's
    /// `assert_equivalence` gives, in its order: access, exclusivity, the
    /// flags, then the arguments.
    fn check_queue_equivalence(
        &self,
        existing: &Arc<dyn Queue>,
        declaration: &QueueDeclaration<'_>,
        connection_id: ConnectionId,
    ) -> AmqpResult<()> {
        existing.check_access(connection_id)?;
        let what = self.describe_queue(declaration.name);
        // RabbitMQ's `assert_equivalence` order: exclusivity, then
        // the flags, then the arguments.
        if existing.is_exclusive() != declaration.exclusive {
            return Err(existing_exclusive_mismatch(existing));
        }
        let durable = declaration.durable && !declaration.exclusive;
        let existing_options = existing.options();
        if existing_options.durable != durable {
            return Err(inequivalent_flag(
                "durable",
                &what,
                durable,
                existing_options.durable,
            ));
        }
        if existing_options.auto_delete != declaration.auto_delete {
            return Err(inequivalent_flag(
                "auto_delete",
                &what,
                declaration.auto_delete,
                existing_options.auto_delete,
            ));
        }
        check_equivalence(
            QUEUE_EQUIVALENCE_KEYS,
            &declaration.arguments,
            &existing_options.arguments,
            &what,
        )?;
        Ok(())
    }

    pub fn has_queue(&self, name: &str) -> bool {
        read(&self.queues).contains_key(name)
    }

    /// Queues of every node and kind, as `max-queues` counts them.
    pub fn queue_count(&self) -> usize {
        read(&self.queues).len()
    }

    /// Looks a queue up for use by `connection_id`: 404 when missing, 405
    /// when another connection's exclusive queue.
    pub fn queue(&self, name: &str, connection_id: ConnectionId) -> AmqpResult<Arc<dyn Queue>> {
        let queue = read(&self.queues)
            .get(name)
            .cloned()
            .ok_or_else(|| self.no_queue(name))?;
        queue.check_access(connection_id)?;
        Ok(queue)
    }

    /// The queue `name` declared at `declared_at`, when it lives on this
    /// node: what an operation forwarded from another node acts on.
    pub fn home_queue(&self, name: &str, declared_at: u64) -> Option<Arc<dyn Queue>> {
        read(&self.queues)
            .get(name)
            .filter(|queue| {
                queue.options().declared_at == declared_at
                    && queue.home_node().is_none()
                    && queue.unavailable().is_none()
            })
            .cloned()
    }

    pub fn queues(&self) -> Vec<Arc<dyn Queue>> {
        read(&self.queues).values().cloned().collect()
    }

    /// Deletes a queue; returns the number of ready messages it held and its
    /// consumers, whom the caller tells with basic.cancel.
    pub fn delete_queue(
        &self,
        name: &str,
        if_unused: bool,
        if_empty: bool,
        connection_id: ConnectionId,
    ) -> AmqpResult<(u32, Vec<Arc<Consumer>>)> {
        match self.check_queue_deletion(name, if_unused, if_empty, connection_id)? {
            Some(queue) => Ok(self.remove_queue(&queue)),
            None => Ok((0, Vec::new())),
        }
    }

    /// What a queue.delete needs before it goes through the metadata log:
    /// the queue (None when there is none: the deletion succeeds), usable
    /// by `connection_id`, empty and unused when asked.
    pub fn check_queue_deletion(
        &self,
        name: &str,
        if_unused: bool,
        if_empty: bool,
        connection_id: ConnectionId,
    ) -> AmqpResult<Option<Arc<dyn Queue>>> {
        let queue = match self.queue(name, connection_id) {
            Ok(queue) => queue,
            Err(error) if error.code == sluice_wire::reply_code::ReplyCode::NotFound => {
                return Ok(None)
            }
            Err(error) => return Err(error),
        };
        self.check_queue_deletable(&queue, queue.stats(), if_unused, if_empty)?;
        Ok(Some(queue))
    }

    /// queue.delete's if-empty and if-unused, on `stats` (a queue homed
    /// elsewhere is counted by its home node).
    ///
    /// # Errors
    /// 406 PRECONDITION_FAILED with RabbitMQ's texts.
    pub fn check_queue_deletable(
        &self,
        queue: &Arc<dyn Queue>,
        stats: crate::queue::QueueStats,
        if_unused: bool,
        if_empty: bool,
    ) -> AmqpResult<()> {
        // Emptiness first, then use, as RabbitMQ's queue process checks.
        if if_empty && stats.messages_ready > 0 {
            return Err(AmqpError::precondition_failed(format!(
                "{} not empty",
                self.describe_queue(queue.name())
            )));
        }
        if if_unused && stats.consumers > 0 {
            return Err(AmqpError::precondition_failed(format!(
                "{} in use",
                self.describe_queue(queue.name())
            )));
        }
        Ok(())
    }

    /// Removes a queue and its bindings unconditionally (auto-delete,
    /// exclusive owner gone, queue.delete).
    pub fn remove_queue(&self, queue: &Arc<dyn Queue>) -> (u32, Vec<Arc<Consumer>>) {
        {
            let mut queues = self.queues_mut();
            match queues.get(queue.name()) {
                Some(current) if same_queue(current, queue) => {
                    queues.remove(queue.name());
                }
                _ => return (0, Vec::new()),
            }
        }
        let (consumers, dropped) = queue.delete();
        let mut exchanges = self.exchanges_mut();
        let emptied = Self::remove_destination_locked(
            &exchanges,
            &Destination::Queue(Arc::clone(queue.name())),
        );
        Self::delete_auto_delete_exchanges(&mut exchanges, emptied);
        (dropped, consumers)
    }

    /// Proposes deleting the exclusive queues of a connection that closed.
    pub fn remove_exclusive_queues(&self, connection_id: ConnectionId) -> Proposal {
        let owned: Vec<Arc<dyn Queue>> = read(&self.queues)
            .values()
            .filter(|queue| queue.options().exclusive_owner == Some(connection_id))
            .cloned()
            .collect();
        let deletions: Vec<Proposal> = owned
            .iter()
            .filter_map(|queue| self.propose_deletion_of(queue))
            .collect();
        // All proposed at once; done when the last is applied.
        Box::pin(async move {
            for deletion in deletions {
                deletion.await?;
            }
            Ok(())
        })
    }

    /// Proposes deleting `queue`, that very queue and not a later one of
    /// its name, without waiting: what the vhost decides by itself (an
    /// owner gone, a queue expired or unused) goes through the metadata
    /// log like a client's queue.delete.
    pub fn propose_queue_deletion(&self, queue: &Arc<dyn Queue>) {
        drop(self.propose_deletion_of(queue));
    }

    /// As [`Self::propose_queue_deletion`], with what says when the deletion
    /// is applied on this node; None when it already is.
    fn propose_deletion_of(&self, queue: &Arc<dyn Queue>) -> Option<Proposal> {
        if !self.metadata.is_installed() {
            // A vhost outside any node (the core's own tests) applies its
            // changes itself.
            self.apply_delete_queue(queue.name(), Some(queue.options().declared_at));
            return None;
        }
        Some(self.metadata.propose_detached(self.deletion_of(queue)))
    }

    /// The metadata change that deletes `queue`, that very queue and not a
    /// later one of its name.
    pub fn deletion_of(&self, queue: &Arc<dyn Queue>) -> MetadataCommand {
        MetadataCommand::DeleteQueue {
            vhost: self.name.to_string(),
            name: queue.name().to_string(),
            declared_at: Some(queue.options().declared_at),
        }
    }

    /// Where this vhost proposes metadata changes.
    pub fn metadata(&self) -> &Arc<MetadataProposer> {
        &self.metadata
    }

    /// This node, as the metadata names it.
    pub fn node(&self) -> &NodeIdentity {
        &self.node
    }

    /// What the queue factory needs to make the queue `name` of this vhost.
    fn queue_spec<'a>(
        &'a self,
        name: Arc<str>,
        options: QueueOptions,
        effective_arguments: &'a FieldTable,
        store_id: Option<String>,
    ) -> QueueSpec<'a> {
        let host: Weak<dyn QueueHost> = self.this.clone();
        QueueSpec {
            name,
            vhost: Arc::clone(&self.name),
            options,
            effective_arguments,
            host,
            store: self.store.as_deref(),
            store_id,
            quorum_groups: self.metadata.quorum_groups(),
            policy_generation: self
                .policy_generation
                .load(std::sync::atomic::Ordering::Acquire),
        }
    }

    fn binding_source(&self, name: &str) -> AmqpResult<Arc<Exchange>> {
        if name.is_empty() {
            return Err(AmqpError::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        self.exchange(name)
    }

    /// What a binding change needs before it goes through the metadata
    /// log: neither end the default exchange, both ends there, the queue
    /// usable by `connection_id`.
    pub fn check_binding(
        &self,
        source: &str,
        destination: Destination,
        connection_id: ConnectionId,
    ) -> AmqpResult<()> {
        check_not_default_exchange(source, &destination)?;
        self.resolve_destination(destination, connection_id)?;
        self.binding_source(source)?;
        Ok(())
    }

    /// queue.bind and exchange.bind: `destination` must exist.
    pub fn bind(
        &self,
        source: &str,
        destination: Destination,
        routing_key: &str,
        arguments: FieldTable,
        connection_id: ConnectionId,
    ) -> AmqpResult<()> {
        check_not_default_exchange(source, &destination)?;
        let destination = self.resolve_destination(destination, connection_id)?;
        let exchange = self.binding_source(source)?;
        let binding = Binding {
            destination,
            routing_key: routing_key.to_owned(),
            arguments,
        };
        let result = self.topology.write(exchange.routing_mut()).bind(binding);
        result.map_err(AmqpError::precondition_failed)?;
        Ok(())
    }

    /// queue.unbind and exchange.unbind. Unbinding what is not bound
    /// succeeds, as in RabbitMQ.
    pub fn unbind(
        &self,
        source: &str,
        destination: Destination,
        routing_key: &str,
        arguments: FieldTable,
        connection_id: ConnectionId,
    ) -> AmqpResult<()> {
        check_not_default_exchange(source, &destination)?;
        let destination = self.resolve_destination(destination, connection_id)?;
        let exchange = self.binding_source(source)?;
        let binding = Binding {
            destination,
            routing_key: routing_key.to_owned(),
            arguments,
        };
        let now_empty = {
            let mut routing = self.topology.write(exchange.routing_mut());
            routing.unbind(&binding) && routing.is_empty()
        };
        if now_empty && exchange.auto_delete {
            let mut exchanges = self.exchanges_mut();
            Self::delete_auto_delete_exchanges(&mut exchanges, vec![Arc::clone(&exchange.name)]);
        }
        Ok(())
    }

    /// Checks a binding destination exists, returning it with the vhost's
    /// shared name.
    fn resolve_destination(
        &self,
        destination: Destination,
        connection_id: ConnectionId,
    ) -> AmqpResult<Destination> {
        match destination {
            Destination::Queue(name) => Ok(Destination::Queue(Arc::clone(
                self.queue(&name, connection_id)?.name(),
            ))),
            Destination::Exchange(name) => Ok(Destination::Exchange(Arc::clone(
                &self.exchange(&name)?.name,
            ))),
        }
    }

    /// Every binding in the vhost, the default exchange's implicit ones
    /// excluded, as (source, binding).
    pub fn bindings(&self) -> Vec<(Arc<str>, Binding)> {
        let exchanges = read(&self.exchanges);
        let mut all = Vec::new();
        for exchange in exchanges.values() {
            for binding in exchange.bindings() {
                all.push((Arc::clone(&exchange.name), binding));
            }
        }
        all
    }
}

/// RabbitMQ refuses the default exchange as either end of a binding before
/// it looks either end up.
fn check_not_default_exchange(source: &str, destination: &Destination) -> AmqpResult<()> {
    let destination_is_default =
        matches!(destination, Destination::Exchange(name) if name.is_empty());
    if source.is_empty() || destination_is_default {
        return Err(AmqpError::access_refused(
            "operation not permitted on the default exchange",
        ));
    }
    Ok(())
}

fn existing_exclusive_mismatch(existing: &Arc<dyn Queue>) -> AmqpError {
    AmqpError::resource_locked(format!(
        "cannot obtain exclusive access to locked queue '{}' in vhost '{}'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.",
        existing.name(),
        existing.vhost_name()
    ))
}

/// `amq.gen-` and 22 URL-safe base64 characters, like RabbitMQ's names.
fn server_generated_name() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut random = rand::rng();
    let suffix: String = (0..22)
        .map(|_| ALPHABET[random.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("amq.gen-{suffix}")
}
