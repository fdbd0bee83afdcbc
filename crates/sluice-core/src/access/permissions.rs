//! A user's permissions in one vhost: configure, write and read regular
//! expressions over resource names, matched where RabbitMQ matches them
//! (anywhere in the name, an empty expression matching nothing).

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::error::AmqpError;

/// `set_permissions` as the metadata log carries it and definitions spell it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionDefinition {
    pub user: String,
    pub vhost: String,
    pub configure: String,
    pub write: String,
    pub read: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Permission {
    /// Declare, delete (and, for queues, nothing else).
    Configure,
    /// Publish to an exchange, bind to a queue or exchange.
    Write,
    /// Consume, get, purge, bind from an exchange.
    Read,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResourceKind {
    Exchange,
    Queue,
}

impl ResourceKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Exchange => "exchange",
            Self::Queue => "queue",
        }
    }
}

/// The compiled expressions of one [`PermissionDefinition`].
#[derive(Debug)]
pub struct VhostPermissions {
    configure: Regex,
    write: Regex,
    read: Regex,
}

impl VhostPermissions {
    /// Every expression must compile; the error names the first that does not.
    pub fn compile(definition: &PermissionDefinition) -> Result<Self, AmqpError> {
        Ok(Self {
            configure: compile(&definition.configure)?,
            write: compile(&definition.write)?,
            read: compile(&definition.read)?,
        })
    }

    /// Whether `permission` on the resource `name` is granted. The default
    /// exchange is matched under RabbitMQ's name for it, `amq.default`.
    pub fn allows(&self, permission: Permission, kind: ResourceKind, name: &str) -> bool {
        let name = if kind == ResourceKind::Exchange && name.is_empty() {
            "amq.default"
        } else {
            name
        };
        let expression = match permission {
            Permission::Configure => &self.configure,
            Permission::Write => &self.write,
            Permission::Read => &self.read,
        };
        expression.is_match(name)
    }
}

/// An empty expression grants nothing (RabbitMQ reads it as `^$`).
fn compile(expression: &str) -> Result<Regex, AmqpError> {
    let expression = if expression.is_empty() {
        "^$"
    } else {
        expression
    };
    Regex::new(expression).map_err(|error| {
        AmqpError::precondition_failed(format!(
            "invalid regular expression '{expression}': {error}"
        ))
    })
}

/// RabbitMQ's 403 for a refused resource access.
pub fn access_refused(kind: ResourceKind, name: &str, vhost: &str, user: &str) -> AmqpError {
    let name = if kind == ResourceKind::Exchange && name.is_empty() {
        "amq.default"
    } else {
        name
    };
    AmqpError::access_refused(format!(
        "access to {} '{name}' in vhost '{vhost}' refused for user '{user}'",
        kind.as_str()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permissions(configure: &str, write: &str, read: &str) -> VhostPermissions {
        VhostPermissions::compile(&PermissionDefinition {
            user: "u".into(),
            vhost: "/".into(),
            configure: configure.into(),
            write: write.into(),
            read: read.into(),
        })
        .unwrap()
    }

    #[test]
    fn permissions_match_anywhere_in_the_name_as_rabbitmq_does() {
        let granted = permissions("^app\\.", "orders", "");
        assert!(granted.allows(Permission::Configure, ResourceKind::Queue, "app.jobs"));
        assert!(!granted.allows(Permission::Configure, ResourceKind::Queue, "my.app.jobs"));
        // Unanchored: "orders" anywhere.
        assert!(granted.allows(Permission::Write, ResourceKind::Exchange, "eu.orders.x"));
        assert!(!granted.allows(Permission::Write, ResourceKind::Exchange, "invoices"));
        // Empty grants nothing, not even the empty name.
        assert!(!granted.allows(Permission::Read, ResourceKind::Queue, "orders"));
    }

    #[test]
    fn permissions_see_the_default_exchange_as_amq_default() {
        let granted = permissions("", "^amq\\.default$", "");
        assert!(granted.allows(Permission::Write, ResourceKind::Exchange, ""));
        assert!(!granted.allows(Permission::Write, ResourceKind::Queue, ""));
        let refused = access_refused(ResourceKind::Exchange, "", "/", "bob");
        assert_eq!(
            refused.text,
            "access to exchange 'amq.default' in vhost '/' refused for user 'bob'"
        );
        assert_eq!(refused.code.code(), 403);
    }

    #[test]
    fn permissions_refuse_an_expression_that_does_not_compile() {
        let error = VhostPermissions::compile(&PermissionDefinition {
            user: "u".into(),
            vhost: "/".into(),
            configure: "(".into(),
            write: ".*".into(),
            read: ".*".into(),
        })
        .unwrap_err();
        assert_eq!(error.code.code(), 406);
        assert!(
            error.text.contains("invalid regular expression '('"),
            "{}",
            error.text
        );
    }
}
