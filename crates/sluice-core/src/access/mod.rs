//! Who may do what: users and their password hashes, each user's
//! permissions per vhost, and vhost limits. The metadata log holds them,
//! so every node of a cluster lets in the same users and refuses the same
//! operations; this is the node's applied copy.

mod login_throttle;
mod password;
mod permissions;
mod topic_permissions;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde::{Deserialize, Serialize};

use crate::error::{AmqpError, AmqpResult};
pub use login_throttle::{Attempt, LoginThrottle, LOGIN_THROTTLE_ADDRESSES_MAX};
pub use password::{HashingAlgorithm, PasswordHash};
pub use permissions::{
    access_refused, Permission, PermissionDefinition, ResourceKind, VhostPermissions,
};
pub use topic_permissions::{topic_access_refused, TopicPermissionDefinition, TopicPermissions};

/// A user as the metadata log carries it and definitions spell it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserDefinition {
    pub name: String,
    /// Base64 of salt and digest; empty for a passwordless user.
    pub password_hash: String,
    pub hashing_algorithm: HashingAlgorithm,
    /// `administrator`, `monitoring`, `management`, `impersonator`, ...
    pub tags: Vec<String>,
}

impl UserDefinition {
    /// A user with `password` hashed the default way.
    pub fn with_password(name: &str, password: &str, tags: Vec<String>) -> Self {
        let algorithm = HashingAlgorithm::default();
        Self {
            name: name.to_owned(),
            password_hash: PasswordHash::new(algorithm, password).to_base64(),
            hashing_algorithm: algorithm,
            tags,
        }
    }
}

/// A vhost's `max-connections` and `max-queues`; None is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VhostLimits {
    pub max_connections: Option<u64>,
    pub max_queues: Option<u64>,
}

/// One of a vhost's limits, by the name RabbitMQ gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VhostLimit {
    MaxConnections,
    MaxQueues,
}

impl VhostLimit {
    /// The limit called `name` (`max-connections`, `max-queues`); None for
    /// any other name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "max-connections" => Some(VhostLimit::MaxConnections),
            "max-queues" => Some(VhostLimit::MaxQueues),
            _ => None,
        }
    }
}

impl VhostLimits {
    /// Sets `limit` to `value` (None: no limit), leaving the other.
    pub fn set(&mut self, limit: VhostLimit, value: Option<u64>) {
        match limit {
            VhostLimit::MaxConnections => self.max_connections = value,
            VhostLimit::MaxQueues => self.max_queues = value,
        }
    }
}

/// What a node creates when the cluster first starts, as RabbitMQ does:
/// the default vhost, the default user, and the user's permissions there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefaultAccess {
    pub vhost: String,
    pub user: UserDefinition,
    pub permissions: PermissionDefinition,
}

/// The `default_*` settings: what the cluster's first start creates.
#[derive(Clone, Debug)]
pub struct FirstStartDefaults {
    pub user: String,
    pub pass: String,
    pub vhost: String,
    pub user_tags: Vec<String>,
    pub configure: String,
    pub write: String,
    pub read: String,
}

impl Default for FirstStartDefaults {
    /// RabbitMQ's: `guest`/`guest`, an administrator, with every permission
    /// on `/`.
    fn default() -> Self {
        Self {
            user: "guest".into(),
            pass: "guest".into(),
            vhost: "/".into(),
            user_tags: vec!["administrator".into()],
            configure: ".*".into(),
            write: ".*".into(),
            read: ".*".into(),
        }
    }
}

impl FirstStartDefaults {
    /// The seed, its password hashed (with a fresh salt: the proposer
    /// hashes, so that every node applies the same hash).
    pub fn to_access(&self) -> DefaultAccess {
        DefaultAccess {
            vhost: self.vhost.clone(),
            user: UserDefinition::with_password(&self.user, &self.pass, self.user_tags.clone()),
            permissions: PermissionDefinition {
                user: self.user.clone(),
                vhost: self.vhost.clone(),
                configure: self.configure.clone(),
                write: self.write.clone(),
                read: self.read.clone(),
            },
        }
    }
}

/// The whole of it as one value, for metadata snapshots.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessDefinitions {
    /// Whether the defaults were created (or deliberately not): a metadata
    /// log from before users were kept in it is seeded once on upgrade.
    pub seeded: bool,
    pub users: Vec<UserDefinition>,
    pub permissions: Vec<PermissionDefinition>,
    pub vhost_limits: BTreeMap<String, VhostLimits>,
    #[serde(default)]
    pub topic_permissions: Vec<TopicPermissionDefinition>,
}

/// Why a login was refused. The client only ever hears RabbitMQ's generic
/// ACCESS_REFUSED; the reason goes to the log.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LoginError {
    #[error("user '{0}' - invalid credentials")]
    InvalidCredentials(String),
    #[error("user '{0}' can only connect via localhost")]
    LoopbackOnly(String),
    #[error("too many failed logins from this address: refused without checking")]
    Throttled,
}

struct User {
    definition: UserDefinition,
    password: PasswordHash,
}

#[derive(Default)]
struct AccessState {
    seeded: bool,
    users: HashMap<String, User>,
    /// By user, then vhost (looked up without building a key).
    permissions: HashMap<String, HashMap<String, Compiled<PermissionDefinition, VhostPermissions>>>,
    vhost_limits: BTreeMap<String, VhostLimits>,
    /// By (user, vhost, exchange).
    topic_permissions:
        BTreeMap<(String, String, String), Compiled<TopicPermissionDefinition, TopicPermissions>>,
}

/// Permissions as defined, for snapshots, and compiled, for checks.
struct Compiled<Definition, Expressions> {
    definition: Definition,
    compiled: Arc<Expressions>,
}

/// The state locked for a change. The generation moves on when the change
/// is done, before the lock is released: a channel that read the old
/// generation may have cached what it saw before the change, and looks
/// again; one that reads the new generation reads the changed state.
struct AccessWrite<'a> {
    state: RwLockWriteGuard<'a, AccessState>,
    generation: &'a AtomicU64,
}

impl std::ops::Deref for AccessWrite<'_> {
    type Target = AccessState;

    fn deref(&self) -> &AccessState {
        &self.state
    }
}

impl std::ops::DerefMut for AccessWrite<'_> {
    fn deref_mut(&mut self) -> &mut AccessState {
        &mut self.state
    }
}

impl Drop for AccessWrite<'_> {
    fn drop(&mut self) {
        self.generation.fetch_add(1, Ordering::Release);
    }
}

#[derive(Default)]
pub struct AccessControl {
    state: RwLock<AccessState>,
    /// Moves on with every change, so that what a channel remembers of
    /// its user's permissions is looked up again.
    generation: AtomicU64,
}

impl AccessControl {
    fn read(&self) -> RwLockReadGuard<'_, AccessState> {
        self.state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> AccessWrite<'_> {
        AccessWrite {
            state: self
                .state
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
            generation: &self.generation,
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn is_seeded(&self) -> bool {
        self.read().seeded
    }

    /// Marks the defaults created; false when they already were.
    pub fn mark_seeded(&self) -> bool {
        let mut state = self.write();
        !std::mem::replace(&mut state.seeded, true)
    }

    pub fn put_user(&self, definition: UserDefinition) -> AmqpResult<()> {
        let password = PasswordHash::from_base64(&definition.password_hash)
            .map_err(AmqpError::precondition_failed)?;
        self.write().users.insert(
            definition.name.clone(),
            User {
                definition,
                password,
            },
        );
        Ok(())
    }

    pub fn user_exists(&self, name: &str) -> bool {
        self.read().users.contains_key(name)
    }

    /// Deletes the user and its permissions everywhere.
    pub fn delete_user(&self, name: &str) -> AmqpResult<()> {
        let mut state = self.write();
        if state.users.remove(name).is_none() {
            return Err(no_such_user(name));
        }
        state.permissions.remove(name);
        state
            .topic_permissions
            .retain(|(user, _, _), _| user != name);
        Ok(())
    }

    pub fn set_topic_permissions(&self, definition: TopicPermissionDefinition) -> AmqpResult<()> {
        let compiled = Arc::new(TopicPermissions::compile(&definition)?);
        let mut state = self.write();
        if !state.users.contains_key(&definition.user) {
            return Err(no_such_user(&definition.user));
        }
        let key = (
            definition.user.clone(),
            definition.vhost.clone(),
            definition.exchange.clone(),
        );
        state.topic_permissions.insert(
            key,
            Compiled {
                definition,
                compiled,
            },
        );
        Ok(())
    }

    /// Clears `user`'s topic permissions in `vhost` for `exchange`, or for
    /// every exchange.
    pub fn clear_topic_permissions(&self, user: &str, vhost: &str, exchange: Option<&str>) {
        self.write().topic_permissions.retain(|(of, on, at), _| {
            !(of == user && on == vhost && exchange.is_none_or(|exchange| exchange == at))
        });
    }

    /// `user`'s topic permissions on `exchange` in `vhost`; None leaves
    /// routing keys unrestricted.
    pub fn topic_permissions(
        &self,
        user: &str,
        vhost: &str,
        exchange: &str,
    ) -> Option<Arc<TopicPermissions>> {
        let state = self.read();
        if state.topic_permissions.is_empty() {
            return None;
        }
        state
            .topic_permissions
            .get(&(user.to_owned(), vhost.to_owned(), exchange.to_owned()))
            .map(|entry| Arc::clone(&entry.compiled))
    }

    /// Sets `definition.user`'s permissions in `definition.vhost`, which
    /// the caller has checked exists.
    pub fn set_permissions(&self, definition: PermissionDefinition) -> AmqpResult<()> {
        let compiled = Arc::new(VhostPermissions::compile(&definition)?);
        let mut state = self.write();
        if !state.users.contains_key(&definition.user) {
            return Err(no_such_user(&definition.user));
        }
        let (user, vhost) = (definition.user.clone(), definition.vhost.clone());
        state.permissions.entry(user).or_default().insert(
            vhost,
            Compiled {
                definition,
                compiled,
            },
        );
        Ok(())
    }

    pub fn clear_permissions(&self, user: &str, vhost: &str) {
        let mut state = self.write();
        if let Some(by_vhost) = state.permissions.get_mut(user) {
            by_vhost.remove(vhost);
        }
    }

    /// A vhost is gone: so are every user's permissions in it, and its limits.
    pub fn forget_vhost(&self, vhost: &str) {
        let mut state = self.write();
        for by_vhost in state.permissions.values_mut() {
            by_vhost.remove(vhost);
        }
        state.topic_permissions.retain(|(_, of, _), _| of != vhost);
        state.vhost_limits.remove(vhost);
    }

    pub fn set_vhost_limits(&self, vhost: &str, limits: VhostLimits) {
        let mut state = self.write();
        if limits == VhostLimits::default() {
            state.vhost_limits.remove(vhost);
        } else {
            state.vhost_limits.insert(vhost.to_owned(), limits);
        }
    }

    /// Sets one of `vhost`'s limits against its limits as they are now,
    /// under the one write lock: a change to the other limit made meanwhile
    /// is kept.
    pub fn set_vhost_limit(&self, vhost: &str, limit: VhostLimit, value: Option<u64>) {
        let mut state = self.write();
        let mut limits = state.vhost_limits.get(vhost).copied().unwrap_or_default();
        limits.set(limit, value);
        if limits == VhostLimits::default() {
            state.vhost_limits.remove(vhost);
        } else {
            state.vhost_limits.insert(vhost.to_owned(), limits);
        }
    }

    pub fn vhost_limits(&self, vhost: &str) -> VhostLimits {
        self.read()
            .vhost_limits
            .get(vhost)
            .copied()
            .unwrap_or_default()
    }

    /// `user`'s permissions in `vhost`; None when it has none there, which
    /// is no access to the vhost at all.
    pub fn permissions(&self, user: &str, vhost: &str) -> Option<Arc<VhostPermissions>> {
        let state = self.read();
        let entry = state.permissions.get(user)?.get(vhost)?;
        Some(Arc::clone(&entry.compiled))
    }

    /// The user as defined (hash and tags); None for no such user.
    pub fn user(&self, name: &str) -> Option<UserDefinition> {
        self.read()
            .users
            .get(name)
            .map(|user| user.definition.clone())
    }

    pub fn has_tag(&self, user: &str, tag: &str) -> bool {
        self.read()
            .users
            .get(user)
            .is_some_and(|user| user.definition.tags.iter().any(|held| held == tag))
    }

    /// Checks a username and password presented from `peer`; users in
    /// `loopback_users` may log in only over a loopback address.
    pub fn login(
        &self,
        name: &str,
        password: &str,
        peer: IpAddr,
        loopback_users: &[String],
    ) -> Result<(), LoginError> {
        let state = self.read();
        let verified = state.users.get(name).is_some_and(|user| {
            user.password
                .verify(user.definition.hashing_algorithm, password)
        });
        if !verified {
            return Err(LoginError::InvalidCredentials(name.to_owned()));
        }
        check_loopback(name, peer, loopback_users)
    }

    /// A login vouched for by other means (a verified client certificate):
    /// the user must exist, and the loopback rule holds.
    pub fn login_without_password(
        &self,
        name: &str,
        peer: IpAddr,
        loopback_users: &[String],
    ) -> Result<(), LoginError> {
        if !self.user_exists(name) {
            return Err(LoginError::InvalidCredentials(name.to_owned()));
        }
        check_loopback(name, peer, loopback_users)
    }

    pub fn snapshot(&self) -> AccessDefinitions {
        let state = self.read();
        let mut users: Vec<UserDefinition> = state
            .users
            .values()
            .map(|user| user.definition.clone())
            .collect();
        users.sort_by(|left, right| left.name.cmp(&right.name));
        // Sorted, so that every node's snapshot of the same state is equal.
        let mut permissions: Vec<PermissionDefinition> = state
            .permissions
            .values()
            .flat_map(|by_vhost| by_vhost.values().map(|entry| entry.definition.clone()))
            .collect();
        permissions
            .sort_by(|left, right| (&left.user, &left.vhost).cmp(&(&right.user, &right.vhost)));
        AccessDefinitions {
            seeded: state.seeded,
            users,
            permissions,
            vhost_limits: state.vhost_limits.clone(),
            topic_permissions: state
                .topic_permissions
                .values()
                .map(|entry| entry.definition.clone())
                .collect(),
        }
    }

    /// Makes this exactly `definitions`. What a snapshot holds was valid
    /// when applied; anything that no longer parses is left out and logged
    /// rather than stopping the node.
    pub fn restore(&self, definitions: &AccessDefinitions) {
        // Built aside and put in place at once, with one move of the
        // generation: a reader never sees a half-restored table (a user
        // missing for a moment would look deleted, and its connections be
        // closed).
        let rebuilt = AccessControl::default();
        rebuilt.fill(definitions);
        let state = rebuilt
            .state
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *self.write() = state;
    }

    fn fill(&self, definitions: &AccessDefinitions) {
        self.write().seeded = definitions.seeded;
        for user in &definitions.users {
            if let Err(error) = self.put_user(user.clone()) {
                tracing::error!(user = %user.name, %error, "metadata snapshot: a user is left out");
            }
        }
        for permissions in &definitions.permissions {
            if let Err(error) = self.set_permissions(permissions.clone()) {
                tracing::error!(user = %permissions.user, vhost = %permissions.vhost, %error, "metadata snapshot: permissions are left out");
            }
        }
        for permissions in &definitions.topic_permissions {
            if let Err(error) = self.set_topic_permissions(permissions.clone()) {
                tracing::error!(user = %permissions.user, vhost = %permissions.vhost, %error, "metadata snapshot: topic permissions are left out");
            }
        }
        self.write().vhost_limits = definitions.vhost_limits.clone();
    }
}

fn no_such_user(name: &str) -> AmqpError {
    AmqpError::not_found(format!("user '{name}' does not exist"))
}

fn check_loopback(name: &str, peer: IpAddr, loopback_users: &[String]) -> Result<(), LoginError> {
    let loopback_only = loopback_users.iter().any(|user| user == name);
    if loopback_only && !peer.is_loopback() && !is_ipv4_mapped_loopback(peer) {
        return Err(LoginError::LoopbackOnly(name.to_owned()));
    }
    Ok(())
}

fn is_ipv4_mapped_loopback(peer: IpAddr) -> bool {
    match peer {
        IpAddr::V6(address) => address.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
        IpAddr::V4(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback() -> IpAddr {
        "127.0.0.1".parse().unwrap()
    }

    fn everything(user: &str, vhost: &str) -> PermissionDefinition {
        PermissionDefinition {
            user: user.into(),
            vhost: vhost.into(),
            configure: ".*".into(),
            write: ".*".into(),
            read: ".*".into(),
        }
    }

    #[test]
    fn access_login_checks_the_hash_and_the_loopback_rule() {
        let access = AccessControl::default();
        access
            .put_user(UserDefinition::with_password("guest", "guest", Vec::new()))
            .unwrap();
        let loopback_users = vec!["guest".to_owned()];
        assert!(access
            .login("guest", "guest", loopback(), &loopback_users)
            .is_ok());
        assert!(access
            .login(
                "guest",
                "guest",
                "::ffff:127.0.0.1".parse().unwrap(),
                &loopback_users
            )
            .is_ok());
        assert_eq!(
            access.login(
                "guest",
                "guest",
                "10.0.0.5".parse().unwrap(),
                &loopback_users
            ),
            Err(LoginError::LoopbackOnly("guest".into()))
        );
        assert!(access
            .login("guest", "guest", "10.0.0.5".parse().unwrap(), &[])
            .is_ok());
        assert_eq!(
            access.login("guest", "nope", loopback(), &loopback_users),
            Err(LoginError::InvalidCredentials("guest".into()))
        );
        assert_eq!(
            access.login("nobody", "x", loopback(), &[]),
            Err(LoginError::InvalidCredentials("nobody".into()))
        );
        assert!(access
            .login_without_password("guest", loopback(), &[])
            .is_ok());
        assert!(access
            .login_without_password("nobody", loopback(), &[])
            .is_err());
    }

    #[test]
    fn access_permissions_go_with_their_user_and_vhost() {
        let access = AccessControl::default();
        assert!(
            access.set_permissions(everything("bob", "/")).is_err(),
            "no such user yet"
        );
        access
            .put_user(UserDefinition::with_password("bob", "pw", Vec::new()))
            .unwrap();
        let before = access.generation();
        access.set_permissions(everything("bob", "/")).unwrap();
        access
            .set_permissions(everything("bob", "staging"))
            .unwrap();
        assert!(access.generation() > before, "a change is seen by channels");
        assert!(access.permissions("bob", "/").is_some());
        access.forget_vhost("staging");
        assert!(access.permissions("bob", "staging").is_none());
        access.delete_user("bob").unwrap();
        assert!(access.permissions("bob", "/").is_none());
        assert!(access.snapshot().permissions.is_empty());
        assert_eq!(access.delete_user("bob").unwrap_err().code.code(), 404);
    }

    #[test]
    fn access_restored_from_a_snapshot_is_the_same() {
        let access = AccessControl::default();
        access.mark_seeded();
        access
            .put_user(UserDefinition::with_password(
                "bob",
                "pw",
                vec!["monitoring".into()],
            ))
            .unwrap();
        access.set_permissions(everything("bob", "/")).unwrap();
        access.set_vhost_limits(
            "/",
            VhostLimits {
                max_connections: Some(5),
                max_queues: None,
            },
        );
        access
            .set_topic_permissions(TopicPermissionDefinition {
                user: "bob".into(),
                vhost: "/".into(),
                exchange: "amq.topic".into(),
                write: "^bob\\.".into(),
                read: ".*".into(),
            })
            .unwrap();
        let snapshot = access.snapshot();
        let restored = AccessControl::default();
        restored.restore(&snapshot);
        assert_eq!(restored.snapshot(), snapshot);
        assert!(restored.login("bob", "pw", loopback(), &[]).is_ok());
        assert!(restored.has_tag("bob", "monitoring"));
        assert_eq!(restored.vhost_limits("/").max_connections, Some(5));
        let topic = restored.topic_permissions("bob", "/", "amq.topic").unwrap();
        assert!(topic.allows(true, "bob.x") && !topic.allows(true, "eve.x"));
        assert!(restored.topic_permissions("bob", "/", "orders").is_none());
        restored.clear_topic_permissions("bob", "/", None);
        assert!(restored
            .topic_permissions("bob", "/", "amq.topic")
            .is_none());
        assert!(!restored.mark_seeded(), "seeded already");
    }
}
