//! Topic permissions: per user, vhost and topic exchange, write and read
//! expressions over routing keys, checked on publishes to that exchange
//! and on bindings from it, after the exchange's own permission. A user
//! with none for an exchange is not restricted by routing key.

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::error::AmqpError;

/// `set_topic_permissions` as the metadata log carries it and definitions
/// spell it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicPermissionDefinition {
    pub user: String,
    pub vhost: String,
    pub exchange: String,
    pub write: String,
    pub read: String,
}

#[derive(Debug)]
pub struct TopicPermissions {
    write: Regex,
    read: Regex,
}

impl TopicPermissions {
    /// `{username}` and `{vhost}` in the expressions stand for the user and
    /// vhost, substituted as they are (RabbitMQ does not escape them).
    pub fn compile(definition: &TopicPermissionDefinition) -> Result<Self, AmqpError> {
        let compile = |expression: &str| {
            let expression = if expression.is_empty() {
                "^$"
            } else {
                expression
            };
            let expanded = expression
                .replace("{username}", &definition.user)
                .replace("{vhost}", &definition.vhost);
            Regex::new(&expanded).map_err(|error| {
                AmqpError::precondition_failed(format!(
                    "invalid regular expression '{expression}': {error}"
                ))
            })
        };
        Ok(Self {
            write: compile(&definition.write)?,
            read: compile(&definition.read)?,
        })
    }

    /// Whether `routing_key` may be published with (`write`) or bound
    /// with (not `write`, i.e. read).
    pub fn allows(&self, write: bool, routing_key: &str) -> bool {
        if write {
            self.write.is_match(routing_key)
        } else {
            self.read.is_match(routing_key)
        }
    }
}

/// RabbitMQ's 403 for a refused routing key.
pub fn topic_access_refused(
    routing_key: &str,
    exchange: &str,
    vhost: &str,
    user: &str,
) -> AmqpError {
    AmqpError::access_refused(format!(
        "access to topic '{routing_key}' in exchange '{exchange}' in vhost '{vhost}' refused for user '{user}'"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_permissions_expand_the_user_and_vhost() {
        let permissions = TopicPermissions::compile(&TopicPermissionDefinition {
            user: "bob".into(),
            vhost: "/".into(),
            exchange: "amq.topic".into(),
            write: "^{username}\\.".into(),
            read: "".into(),
        })
        .unwrap();
        assert!(permissions.allows(true, "bob.orders"));
        assert!(!permissions.allows(true, "alice.orders"));
        assert!(
            !permissions.allows(false, "bob.orders"),
            "empty grants nothing"
        );
        assert_eq!(
            topic_access_refused("other.x", "amq.topic", "/", "bob").text,
            "access to topic 'other.x' in exchange 'amq.topic' in vhost '/' refused for user 'bob'"
        );
    }
}
