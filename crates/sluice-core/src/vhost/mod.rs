//! A virtual host: its exchanges, queues and the bindings between them.
//!
//! - `routing`: the walk from an exchange to the queues a message lands in.
//! - `publish`: the publish pipeline: route, enqueue into every target,
//!   and the confirm ticket.
//! - `queue_host`: what the vhost does for its queues: dead-letters, expiry.
//! - `recovery`: rebuilding the vhost from saved definitions at start.

mod publish;
mod queue_host;
mod recovery;
mod routing;
mod topology;

pub use publish::{PublishScratch, Published};
pub use recovery::RecoveryError;
pub use routing::{RouteScratch, ROUTING_EXCHANGE_HOPS_MAX};

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use amq_protocol::types::FieldTable;
use rand::Rng;

use crate::arguments::{
    check_equivalence, check_exchange_name_argument, check_queue_arguments, inequivalent_flag,
    EXCHANGE_EQUIVALENCE_KEYS, QUEUE_EQUIVALENCE_KEYS,
};
use crate::counters::{MessageCounts, ShardedCounters};
use crate::definitions::{
    BindingDefinition, DefinitionStore, ExchangeDefinition, QueueDefinition, VhostDefinitions,
};
use crate::error::{AmqpError, AmqpResult};
use crate::exchange::{Binding, Destination, ExchangeKind, RoutingTable};
use crate::policy::{
    effective_alternate_exchange, effective_queue_arguments, PolicyTarget, VhostPolicies,
};
use crate::queue::{same_queue, ConnectionId, Consumer, Queue, QueueHost, QueueOptions};
use crate::queue_factory::{create_queue, QueueSpec};
use crate::reply_to::ReplyRegistry;
use sluice_wire::reply_code::ReplyCode;
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
    /// Resolved once at creation, since policies are fixed at start.
    pub alternate_exchange: Option<Arc<str>>,
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
    /// Fixed at start: loaded from the definitions file.
    policies: VhostPolicies,
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
    /// What happened to messages in this vhost: publishes counted by the
    /// pipeline, deliveries, acks and confirms by the channels.
    counters: ShardedCounters,
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

impl VirtualHost {
    /// A vhost with the default exchange and the `amq.*` exchanges every
    /// RabbitMQ vhost has.
    pub fn new(name: &str) -> Arc<Self> {
        Self::with_store(
            name,
            None,
            VhostPolicies::default(),
            Arc::new(ReplyRegistry::default()),
        )
    }

    /// A vhost whose durable definitions and messages live in `store`, with
    /// the policies that apply to its objects, delivering direct replies
    /// through the node's `reply_to` registry.
    pub fn with_store(
        name: &str,
        store: Option<Arc<DefinitionStore>>,
        policies: VhostPolicies,
        reply_to: Arc<ReplyRegistry>,
    ) -> Arc<Self> {
        let vhost = Arc::new_cyclic(|this| VirtualHost {
            name: Arc::from(name),
            policies,
            exchanges: RwLock::new(HashMap::new()),
            queues: RwLock::new(HashMap::new()),
            store,
            this: this.clone(),
            dead_letter_warnings: Mutex::new(HashSet::new()),
            reply_to,
            topology: TopologyVersion::default(),
            counters: ShardedCounters::default(),
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

    /// Where channels count what happens to this vhost's messages.
    pub fn counters(&self) -> &ShardedCounters {
        &self.counters
    }

    /// What happened to this vhost's messages so far.
    pub fn counts(&self) -> MessageCounts {
        self.counters.counts()
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
            let policy = self.policies.matching(PolicyTarget::Exchange, spec.name);
            effective_alternate_exchange(&spec.arguments, policy.map(|policy| &**policy))
        };
        Exchange {
            name: Arc::from(spec.name),
            kind: spec.kind,
            durable: spec.durable,
            auto_delete: spec.auto_delete,
            internal: spec.internal,
            arguments: spec.arguments,
            alternate_exchange,
            routing: RwLock::new(RoutingTable::new(spec.kind)),
        }
    }

    /// A queue's effective arguments: what it was declared with, merged with
    /// the policy that applies to its name (see [`crate::policy`]). Queue
    /// behaviour (limits, TTL, dead-lettering) reads these, never the
    /// declared arguments alone; equivalence checks and saved definitions
    /// use the declared ones.
    pub fn effective_queue_arguments(&self, queue_name: &str, declared: &FieldTable) -> FieldTable {
        let policy = self.policies.matching(PolicyTarget::Queue, queue_name);
        effective_queue_arguments(declared, policy.map(|policy| &**policy))
    }

    /// The name of the policy that applies to a queue, if any.
    pub fn queue_policy_name(&self, queue_name: &str) -> Option<&str> {
        self.policies
            .matching(PolicyTarget::Queue, queue_name)
            .map(|policy| policy.name.as_str())
    }

    pub fn policies(&self) -> &VhostPolicies {
        &self.policies
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

    pub fn declare_exchange(&self, declaration: ExchangeDeclaration<'_>) -> AmqpResult<()> {
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
            return Ok(());
        }
        let kind = ExchangeKind::parse(declaration.kind).ok_or_else(|| {
            AmqpError::command_invalid(format!("unknown exchange type '{}'", declaration.kind))
        })?;
        if name.is_empty() {
            return Err(AmqpError::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        // As in RabbitMQ, an existing `amq.*` exchange is redeclared like any
        // other (equivalence checked below); only creating one is refused.
        if name.starts_with("amq.") && self.exchange(name).is_err() {
            return Err(AmqpError::access_refused(format!(
                "exchange name '{name}' contains reserved prefix 'amq.*'"
            )));
        }
        let mut exchanges = self.exchanges_mut();
        if let Some(existing) = exchanges.get(name) {
            return self.check_exchange_equivalence(existing, &declaration, kind);
        }
        // As RabbitMQ, only a new exchange has its alternate checked.
        check_exchange_name_argument(
            &declaration.arguments,
            "alternate-exchange",
            &self.describe_exchange(name),
        )?;
        let exchange = self.new_exchange(ExchangeSpec {
            name,
            kind,
            durable: declaration.durable,
            auto_delete: declaration.auto_delete,
            internal: declaration.internal,
            arguments: declaration.arguments,
        });
        let durable = exchange.durable;
        exchanges.insert(Arc::clone(&exchange.name), Arc::new(exchange));
        drop(exchanges);
        if durable {
            self.persist();
        }
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

    pub fn delete_exchange(&self, name: &str, if_unused: bool) -> AmqpResult<()> {
        if name.is_empty() {
            return Err(AmqpError::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        if name.starts_with("amq.") {
            return Err(AmqpError::access_refused(format!(
                "deletion of system {} not allowed",
                self.describe_exchange(name)
            )));
        }
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
        drop(exchanges);
        if exchange.durable {
            self.persist();
        }
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

    /// Declares a queue. Returns it and whether it was created.
    pub fn declare_queue(
        &self,
        declaration: QueueDeclaration<'_>,
        connection_id: ConnectionId,
    ) -> AmqpResult<(Arc<dyn Queue>, bool)> {
        if declaration.passive {
            let queue = self.queue(declaration.name, connection_id)?;
            queue.touch();
            return Ok((queue, false));
        }
        if declaration.name.starts_with("amq.") {
            return Err(AmqpError::access_refused(format!(
                "queue name '{}' contains reserved prefix 'amq.*'",
                declaration.name
            )));
        }
        let mut queues = self.queues_mut();
        if !declaration.name.is_empty() {
            if let Some(existing) = queues.get(declaration.name) {
                self.check_queue_equivalence(existing, &declaration, connection_id)?;
                existing.touch();
                return Ok((Arc::clone(existing), false));
            }
        }
        let name: Arc<str> = if declaration.name.is_empty() {
            loop {
                let candidate = server_generated_name();
                if !queues.contains_key(candidate.as_str()) {
                    break Arc::from(candidate);
                }
            }
        } else {
            Arc::from(declaration.name)
        };
        // Only a queue about to be created has its arguments validated, as
        // in RabbitMQ: a redeclaration is compared for equivalence instead.
        let what = self.describe_queue(&name);
        check_exchange_name_argument(&declaration.arguments, "x-dead-letter-exchange", &what)?;
        check_queue_arguments(&declaration.arguments, &what)?;
        let effective = self.effective_queue_arguments(&name, &declaration.arguments);
        let options = QueueOptions {
            // An exclusive queue dies with its connection, so it is never
            // durable, whatever was asked: RabbitMQ stores it as transient.
            durable: declaration.durable && !declaration.exclusive,
            exclusive_owner: declaration.exclusive.then_some(connection_id),
            auto_delete: declaration.auto_delete,
            arguments: declaration.arguments,
        };
        let queue = create_queue(self.queue_spec(Arc::clone(&name), options, &effective, None))
            .map_err(|error| {
                AmqpError::new(
                    ReplyCode::InternalError,
                    format!("cannot create {what}: {error}"),
                )
            })?;
        queue.start_timers();
        queues.insert(name, Arc::clone(&queue));
        drop(queues);
        if queue.store_id().is_some() {
            self.persist();
        }
        Ok((queue, true))
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
        let queue = match self.queue(name, connection_id) {
            Ok(queue) => queue,
            Err(error) if error.code == sluice_wire::reply_code::ReplyCode::NotFound => {
                return Ok((0, Vec::new()))
            }
            Err(error) => return Err(error),
        };
        // Emptiness first, then use, as RabbitMQ's queue process checks.
        if if_empty && queue.message_count() > 0 {
            return Err(AmqpError::precondition_failed(format!(
                "{} not empty",
                self.describe_queue(name)
            )));
        }
        if if_unused && queue.consumer_count() > 0 {
            return Err(AmqpError::precondition_failed(format!(
                "{} in use",
                self.describe_queue(name)
            )));
        }
        Ok(self.remove_queue(&queue))
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
        drop(exchanges);
        if queue.store_id().is_some() {
            self.persist();
        }
        (dropped, consumers)
    }

    /// Deletes the exclusive queues of a connection that closed; returns
    /// their consumers (of that same connection) for bookkeeping.
    pub fn remove_exclusive_queues(&self, connection_id: ConnectionId) {
        let owned: Vec<Arc<dyn Queue>> = read(&self.queues)
            .values()
            .filter(|queue| queue.options().exclusive_owner == Some(connection_id))
            .cloned()
            .collect();
        for queue in owned {
            self.remove_queue(&queue);
        }
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
        let added = result.map_err(AmqpError::precondition_failed)?;
        if added && exchange.durable {
            self.persist();
        }
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
        if exchange.durable {
            self.persist();
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

impl VirtualHost {
    /// What of this vhost survives a restart: durable exchanges other than
    /// the standard ones, journaled queues, and bindings between durable ends.
    pub fn durable_definitions(&self) -> VhostDefinitions {
        let exchanges = read(&self.exchanges);
        let queues = read(&self.queues);
        let mut definitions = VhostDefinitions::default();
        for exchange in exchanges.values() {
            if exchange.durable && !exchange.is_default() && !exchange.name.starts_with("amq.") {
                definitions.exchanges.push(ExchangeDefinition {
                    name: exchange.name.to_string(),
                    kind: exchange.kind.as_str().to_owned(),
                    auto_delete: exchange.auto_delete,
                    internal: exchange.internal,
                    arguments: exchange.arguments.clone(),
                });
            }
        }
        for queue in queues.values() {
            if let Some(store_id) = queue.store_id() {
                definitions.queues.push(QueueDefinition {
                    name: queue.name().to_string(),
                    store_id: store_id.to_owned(),
                    auto_delete: queue.options().auto_delete,
                    arguments: queue.options().arguments.clone(),
                });
            }
        }
        for exchange in exchanges.values().filter(|exchange| exchange.durable) {
            for binding in exchange.bindings() {
                let (destination_type, durable) = match &binding.destination {
                    Destination::Queue(name) => (
                        "queue",
                        queues
                            .get(name)
                            .is_some_and(|queue| queue.store_id().is_some()),
                    ),
                    Destination::Exchange(name) => (
                        "exchange",
                        exchanges.get(name).is_some_and(|other| other.durable),
                    ),
                };
                if durable {
                    definitions.bindings.push(BindingDefinition {
                        source: exchange.name.to_string(),
                        destination: binding.destination.name().to_owned(),
                        destination_type: destination_type.to_owned(),
                        routing_key: binding.routing_key,
                        arguments: binding.arguments,
                    });
                }
            }
        }
        // A stable order, so an unchanged vhost is recognised and not rewritten.
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

    fn persist(&self) {
        if let Some(store) = &self.store {
            store.save_vhost(&self.name, || self.durable_definitions());
        }
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
