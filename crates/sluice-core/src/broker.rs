//! The node: its virtual hosts and users.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::definitions::DefinitionStore;
use crate::metadata::{MetadataProposer, NodeIdentity};
use crate::policy::{Policy, VhostPolicies};
use crate::queue::ConnectionId;
use crate::queue_location::QueueLocator;
use crate::reply_to::ReplyRegistry;
use crate::vhost::{RecoveryError, VhostServices, VirtualHost};

pub struct User {
    pub name: String,
    password: String,
    /// Users who may connect only from a loopback address, like RabbitMQ's
    /// `loopback_users` (guest by default).
    pub loopback_only: bool,
}

/// Why a login was refused. The client only ever hears RabbitMQ's generic
/// ACCESS_REFUSED; the reason goes to the log.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LoginError {
    #[error("user '{0}' does not exist")]
    UnknownUser(String),
    #[error("invalid credentials for user '{0}'")]
    WrongPassword(String),
    #[error("user '{0}' can only connect via localhost")]
    LoopbackOnly(String),
}

pub struct BrokerSettings {
    pub default_user: String,
    pub default_pass: String,
    pub default_vhost: String,
    pub loopback_users: Vec<String>,
    /// Policies from the definitions file, for every vhost.
    pub policies: Vec<Policy>,
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
    users: RwLock<HashMap<String, User>>,
    next_connection_id: AtomicU64,
    /// Policies by vhost, handed to each vhost when it is created.
    policies: HashMap<String, VhostPolicies>,
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
        let mut by_vhost: HashMap<String, Vec<Policy>> = HashMap::new();
        for policy in &settings.policies {
            by_vhost
                .entry(policy.vhost.clone())
                .or_default()
                .push(policy.clone());
        }
        let broker = Broker {
            vhosts: RwLock::new(HashMap::new()),
            store,
            node: settings.node.clone(),
            metadata: Arc::default(),
            starting: std::sync::atomic::AtomicBool::new(false),
            users: RwLock::new(HashMap::new()),
            next_connection_id: AtomicU64::new((u64::from(settings.node_number) << 48) + 1),
            policies: by_vhost
                .into_iter()
                .map(|(vhost, policies)| (vhost, VhostPolicies::new(policies)))
                .collect(),
            reply_to: Arc::new(ReplyRegistry::default()),
            queue_locator: settings.queue_locator,
        };
        broker.add_vhost(&settings.default_vhost);
        broker.add_user(
            &settings.default_user,
            &settings.default_pass,
            settings.loopback_users.contains(&settings.default_user),
        );
        broker
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
            let policies = self.policies.get(name).cloned().unwrap_or_default();
            let vhost = VirtualHost::with_services(
                name,
                policies,
                VhostServices {
                    store: self.store.clone(),
                    reply_to: Arc::clone(&self.reply_to),
                    node: self.node.clone(),
                    metadata: Arc::clone(&self.metadata),
                    queue_locator: self.queue_locator,
                },
            );
            if self.starting.load(Ordering::Acquire) {
                vhost.begin_start();
            }
            vhost
        }))
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

    pub fn add_user(&self, name: &str, password: &str, loopback_only: bool) {
        let user = User {
            name: name.to_owned(),
            password: password.to_owned(),
            loopback_only,
        };
        self.users
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(name.to_owned(), user);
    }

    /// Checks a username and password presented from `peer`.
    pub fn login(&self, name: &str, password: &str, peer: IpAddr) -> Result<(), LoginError> {
        let users = self
            .users
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let user = users
            .get(name)
            .ok_or_else(|| LoginError::UnknownUser(name.to_owned()))?;
        if !constant_time_equal(user.password.as_bytes(), password.as_bytes()) {
            return Err(LoginError::WrongPassword(name.to_owned()));
        }
        if user.loopback_only && !peer.is_loopback() && !is_ipv4_mapped_loopback(peer) {
            return Err(LoginError::LoopbackOnly(name.to_owned()));
        }
        Ok(())
    }

    /// Checks a user whose identity something other than a password
    /// vouched for (a verified TLS client certificate, for SASL EXTERNAL):
    /// the user must exist, and loopback-only users connect from loopback.
    pub fn login_without_password(&self, name: &str, peer: IpAddr) -> Result<(), LoginError> {
        let users = self
            .users
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let user = users
            .get(name)
            .ok_or_else(|| LoginError::UnknownUser(name.to_owned()))?;
        if user.loopback_only && !peer.is_loopback() && !is_ipv4_mapped_loopback(peer) {
            return Err(LoginError::LoopbackOnly(name.to_owned()));
        }
        Ok(())
    }

    pub fn next_connection_id(&self) -> ConnectionId {
        self.next_connection_id.fetch_add(1, Ordering::Relaxed)
    }
}

fn is_ipv4_mapped_loopback(peer: IpAddr) -> bool {
    match peer {
        IpAddr::V6(address) => address.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
        IpAddr::V4(_) => false,
    }
}

/// Compares passwords in time independent of where they differ.
fn constant_time_equal(left: &[u8], right: &[u8]) -> bool {
    if left.len() != right.len() {
        return false;
    }
    left.iter()
        .zip(right)
        .fold(0u8, |difference, (a, b)| difference | (a ^ b))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broker() -> Broker {
        Broker::new(&BrokerSettings {
            default_user: "guest".into(),
            default_pass: "guest".into(),
            default_vhost: "/".into(),
            loopback_users: vec!["guest".into()],
            policies: Vec::new(),
            node: NodeIdentity::new(NodeIdentity::STANDALONE),
            node_number: 0,
            queue_locator: Default::default(),
        })
    }

    #[test]
    fn broker_guest_only_from_loopback() {
        let broker = broker();
        assert!(broker
            .login("guest", "guest", "127.0.0.1".parse().unwrap())
            .is_ok());
        assert!(broker
            .login("guest", "guest", "::ffff:127.0.0.1".parse().unwrap())
            .is_ok());
        assert_eq!(
            broker.login("guest", "guest", "10.0.0.5".parse().unwrap()),
            Err(LoginError::LoopbackOnly("guest".into()))
        );
        assert_eq!(
            broker.login("guest", "nope", "127.0.0.1".parse().unwrap()),
            Err(LoginError::WrongPassword("guest".into()))
        );
        assert!(broker
            .login("nobody", "x", "127.0.0.1".parse().unwrap())
            .is_err());
        assert!(broker.vhost("/").is_some());
    }
}
