//! The node: its virtual hosts and users.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::access::{AccessControl, FirstStartDefaults, LoginError, LoginThrottle};
use crate::definitions::{DefinitionStore, VhostDefinitions};
use crate::metadata::MetadataCommand;
use crate::metadata::{MetadataProposer, NodeIdentity};
use crate::queue::ConnectionId;
use crate::queue_location::QueueLocator;
use crate::reply_to::ReplyRegistry;
use crate::vhost::{RecoveryError, VhostServices, VirtualHost};

pub struct BrokerSettings {
    /// What the cluster's first start creates (`default_user` and the like).
    pub defaults: FirstStartDefaults,
    /// Users who may connect only from a loopback address, like RabbitMQ's
    /// `loopback_users` (guest by default).
    pub loopback_users: Vec<String>,
    /// This node, as the metadata names it.
    pub node: NodeIdentity,
    /// This node's place in its cluster's sorted member list (0 for a
    /// cluster of one): the top bits of its connection ids, so that a
    /// connection id names one connection in the whole cluster (exclusive
    /// queues are checked against it on every node).
    pub node_number: u16,
    /// Where new classic queues live unless their declaration says
    /// (`queue_leader_locator`).
    pub queue_locator: QueueLocator,
}

pub struct Broker {
    vhosts: RwLock<HashMap<String, Arc<VirtualHost>>>,
    store: Option<Arc<DefinitionStore>>,
    node: NodeIdentity,
    /// Where metadata changes are proposed, once the metadata log is up.
    pub metadata: Arc<MetadataProposer>,
    /// Between [`Self::begin_start`] and [`Self::finish_start`].
    starting: std::sync::atomic::AtomicBool,
    /// Users, permissions and vhost limits, as the metadata log holds them.
    pub access: AccessControl,
    /// Failed logins slow down the next ones from the same address.
    pub login_throttle: LoginThrottle,
    defaults: FirstStartDefaults,
    loopback_users: Vec<String>,
    next_connection_id: AtomicU64,
    /// Counts the policy changes applied, in log order: the same number
    /// on every node once they applied the same changes, and kept in
    /// snapshots. A quorum queue's members propose their new rules under
    /// it, so that its log keeps the newest whichever member's proposal
    /// comes last (see `QueueMachine::set_config`).
    policy_generation: Arc<AtomicU64>,
    /// Global runtime parameters, by name.
    pub(crate) global_parameters: RwLock<BTreeMap<String, serde_json::Value>>,
    /// Direct reply-to consumers, by the token in their reply names.
    pub reply_to: Arc<ReplyRegistry>,
    queue_locator: QueueLocator,
}

impl Broker {
    /// A node with the default vhost and user, as RabbitMQ creates them on
    /// first start, keeping everything in memory.
    pub fn new(settings: &BrokerSettings) -> Self {
        Self::open(settings, None)
    }

    /// A node whose durable queues journal in `store`. Its exchanges,
    /// queues and bindings come from the metadata log, which the caller
    /// replays into it (see [`crate::metadata`]).
    pub fn open(settings: &BrokerSettings, store: Option<Arc<DefinitionStore>>) -> Self {
        let broker = Broker {
            vhosts: RwLock::new(HashMap::new()),
            store,
            node: settings.node.clone(),
            metadata: Arc::default(),
            starting: std::sync::atomic::AtomicBool::new(false),
            access: AccessControl::default(),
            login_throttle: LoginThrottle::default(),
            defaults: settings.defaults.clone(),
            loopback_users: settings.loopback_users.clone(),
            next_connection_id: AtomicU64::new((u64::from(settings.node_number) << 48) + 1),
            policy_generation: Arc::default(),
            global_parameters: RwLock::default(),
            reply_to: Arc::new(ReplyRegistry::default()),
            queue_locator: settings.queue_locator,
        };
        if broker.store.is_none() {
            // Nothing to replay: seeded here, as a first start.
            let seed = broker.seed_command(true);
            broker.apply_metadata(0, seed);
        }
        broker
    }

    /// What this node proposes as it starts: the default vhost, user and
    /// permissions, created only if the cluster never had them. A node
    /// given users or vhosts by a definitions file creates none
    /// (`with_defaults` false), as RabbitMQ seeds nothing then.
    pub fn seed_command(&self, with_defaults: bool) -> MetadataCommand {
        MetadataCommand::SeedAccess {
            defaults: with_defaults.then(|| self.defaults.to_access()),
        }
    }

    /// This node, as the metadata names it.
    pub fn node(&self) -> &NodeIdentity {
        &self.node
    }

    /// The node starts: queues the metadata log brings back wait to start
    /// their timers until [`Self::finish_start`].
    pub fn begin_start(&self) {
        self.starting.store(true, Ordering::Release);
        for vhost in self.vhosts() {
            vhost.begin_start();
        }
    }

    /// The metadata log is replayed: queues start their timers.
    ///
    /// # Errors
    /// A durable queue of this node that could not be opened: the node does
    /// not start rather than serve without it.
    pub fn finish_start(&self) -> Result<(), RecoveryError> {
        self.starting.store(false, Ordering::Release);
        let mut unrecoverable = Vec::new();
        for vhost in self.vhosts() {
            vhost.finish_start();
            unrecoverable.extend(vhost.unrecoverable_queues());
        }
        match unrecoverable.into_iter().next() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    pub fn add_vhost(&self, name: &str) -> Arc<VirtualHost> {
        let mut vhosts = self
            .vhosts
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(vhosts.entry(name.to_owned()).or_insert_with(|| {
            let vhost = VirtualHost::with_services(
                name,
                VhostServices {
                    store: self.store.clone(),
                    reply_to: Arc::clone(&self.reply_to),
                    node: self.node.clone(),
                    metadata: Arc::clone(&self.metadata),
                    queue_locator: self.queue_locator,
                    policy_generation: Arc::clone(&self.policy_generation),
                },
            );
            if self.starting.load(Ordering::Acquire) {
                vhost.begin_start();
            }
            vhost
        }))
    }

    /// Deletes the vhost: its queues (with what they hold on disk), its
    /// exchanges and bindings.
    pub fn remove_vhost(&self, name: &str) {
        let Some(vhost) = self.vhost(name) else {
            return;
        };
        vhost.restore(&VhostDefinitions::default());
        self.vhosts
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(name);
    }

    pub fn vhost(&self, name: &str) -> Option<Arc<VirtualHost>> {
        self.vhosts
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(name)
            .cloned()
    }

    pub fn vhosts(&self) -> Vec<Arc<VirtualHost>> {
        self.vhosts
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Checks a username and password presented from `peer`.
    pub fn login(&self, name: &str, password: &str, peer: IpAddr) -> Result<(), LoginError> {
        self.access
            .login(name, password, peer, &self.loopback_users)
    }

    /// Checks a user whose identity something other than a password
    /// vouched for (a verified TLS client certificate, for SASL EXTERNAL):
    /// the user must exist, and loopback-only users connect from loopback.
    pub fn login_without_password(&self, name: &str, peer: IpAddr) -> Result<(), LoginError> {
        self.access
            .login_without_password(name, peer, &self.loopback_users)
    }

    /// How many policy changes this node applied (see the field).
    pub fn policy_generation(&self) -> u64 {
        self.policy_generation.load(Ordering::Acquire)
    }

    /// The next policy change: its generation, for the queues it reaches.
    pub(crate) fn next_policy_generation(&self) -> u64 {
        self.policy_generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// A snapshot's count of policy changes.
    pub(crate) fn restore_policy_generation(&self, generation: u64) {
        self.policy_generation.store(generation, Ordering::Release);
    }

    pub fn next_connection_id(&self) -> ConnectionId {
        self.next_connection_id.fetch_add(1, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{Permission, ResourceKind};

    fn broker(defaults: FirstStartDefaults) -> Broker {
        Broker::new(&BrokerSettings {
            defaults,
            loopback_users: vec!["guest".into()],
            node: NodeIdentity::new(NodeIdentity::STANDALONE),
            node_number: 0,
            queue_locator: Default::default(),
        })
    }

    #[test]
    fn broker_first_start_creates_the_default_vhost_and_user() {
        let broker = broker(FirstStartDefaults::default());
        let loopback = "127.0.0.1".parse().unwrap();
        assert!(broker.login("guest", "guest", loopback).is_ok());
        assert_eq!(
            broker.login("guest", "guest", "10.0.0.5".parse().unwrap()),
            Err(LoginError::LoopbackOnly("guest".into()))
        );
        assert!(broker.vhost("/").is_some());
        assert!(broker.access.permissions("guest", "/").is_some());
        assert!(broker.access.has_tag("guest", "administrator"));
        // A node starting later proposes the seed again: nothing changes.
        broker.apply_metadata(1, broker.seed_command(true));
        assert!(broker.login("guest", "guest", loopback).is_ok());
    }

    #[test]
    fn broker_default_settings_shape_what_is_seeded() {
        let broker = broker(FirstStartDefaults {
            user: "admin".into(),
            pass: "s3cret".into(),
            vhost: "prod".into(),
            user_tags: Vec::new(),
            configure: "^$".into(),
            write: "amq\\.default".into(),
            read: ".*".into(),
        });
        let anywhere = "10.0.0.5".parse().unwrap();
        assert!(broker.login("admin", "s3cret", anywhere).is_ok());
        assert!(broker.login("guest", "guest", anywhere).is_err());
        assert!(broker.vhost("prod").is_some());
        assert!(broker.vhost("/").is_none());
        let permissions = broker.access.permissions("admin", "prod").unwrap();
        assert!(!permissions.allows(Permission::Configure, ResourceKind::Queue, "q"));
        assert!(permissions.allows(Permission::Write, ResourceKind::Exchange, ""));
    }
}
