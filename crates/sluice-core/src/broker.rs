//! The node: its virtual hosts and users.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::definitions::{DefinitionStore, Definitions};
use crate::policy::{Policy, VhostPolicies};
use crate::queue::ConnectionId;
use crate::reply_to::ReplyRegistry;
use crate::vhost::{RecoveryError, VirtualHost};

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
}

pub struct Broker {
    vhosts: RwLock<HashMap<String, Arc<VirtualHost>>>,
    store: Option<Arc<DefinitionStore>>,
    users: RwLock<HashMap<String, User>>,
    next_connection_id: AtomicU64,
    /// Policies by vhost, handed to each vhost when it is created.
    policies: HashMap<String, VhostPolicies>,
    /// Direct reply-to consumers, by the token in their reply names.
    pub reply_to: Arc<ReplyRegistry>,
}

impl Broker {
    /// A node with the default vhost and user, as RabbitMQ creates them on
    /// first start.
    pub fn new(settings: &BrokerSettings) -> Self {
        Self::open(settings, None).expect("a node without storage recovers nothing")
    }

    /// A node whose durable state lives in `store`: the vhosts saved there
    /// come back with their durable exchanges, queues, messages and bindings.
    ///
    /// # Errors
    /// A durable queue that cannot be recovered (see [`VirtualHost::recover`]).
    pub fn open(
        settings: &BrokerSettings,
        store: Option<(Arc<DefinitionStore>, Definitions)>,
    ) -> Result<Self, RecoveryError> {
        let (store, definitions) = match store {
            Some((store, definitions)) => (Some(store), definitions),
            None => (None, Definitions::default()),
        };
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
            users: RwLock::new(HashMap::new()),
            next_connection_id: AtomicU64::new(1),
            policies: by_vhost
                .into_iter()
                .map(|(vhost, policies)| (vhost, VhostPolicies::new(policies)))
                .collect(),
            reply_to: Arc::new(ReplyRegistry::default()),
        };
        for (name, vhost_definitions) in &definitions.vhosts {
            broker.add_vhost(name).recover(vhost_definitions)?;
        }
        broker.add_vhost(&settings.default_vhost);
        broker.add_user(
            &settings.default_user,
            &settings.default_pass,
            settings.loopback_users.contains(&settings.default_user),
        );
        Ok(broker)
    }

    pub fn add_vhost(&self, name: &str) -> Arc<VirtualHost> {
        let mut vhosts = self
            .vhosts
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(vhosts.entry(name.to_owned()).or_insert_with(|| {
            let policies = self.policies.get(name).cloned().unwrap_or_default();
            VirtualHost::with_store(
                name,
                self.store.clone(),
                policies,
                Arc::clone(&self.reply_to),
            )
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
