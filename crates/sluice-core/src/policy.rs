//! Policies: settings applied to queues and exchanges by a name pattern,
//! in RabbitMQ's definitions format, and the effective arguments they give.
//!
//! A policy matches an object when its regular expression finds a match
//! anywhere in the object's name (as RabbitMQ's `re:run` does) and its
//! `apply-to` covers the object's kind. Of the policies that match, the one
//! with the highest priority applies, and only that one; among equal
//! priorities the one listed first wins.
//!
//! Policies are fixed when the node starts (loaded from the file named by
//! `load_definitions`), so an object's policy is resolved once, when it is
//! created, and nothing on the message path consults them.

use std::sync::Arc;

use amq_protocol::types::{AMQPValue, FieldTable};
use serde::Deserialize;

use crate::arguments::{as_strict_integer, as_text, EXPIRY_MS_MAX};

/// Which objects a policy applies to (`apply-to`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyTo {
    Queues,
    Exchanges,
    All,
}

/// The kind of object a policy is matched against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyTarget {
    Queue,
    Exchange,
}

/// The policy keys Sluice acts on, validated as RabbitMQ's
/// `rabbit_policies:validate_policy0` does. `max-priority` and
/// `single-active-consumer` are not policy keys in RabbitMQ 3.10: they can
/// only be set by queue arguments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyDefinition {
    pub message_ttl: Option<u64>,
    pub expires: Option<u64>,
    pub max_length: Option<u64>,
    pub max_length_bytes: Option<u64>,
    pub overflow: Option<String>,
    pub dead_letter_exchange: Option<String>,
    pub dead_letter_routing_key: Option<String>,
    /// Quorum queues: `at-most-once` or `at-least-once`.
    pub dead_letter_strategy: Option<String>,
    /// Quorum queues: returns before a message is dead-lettered.
    pub delivery_limit: Option<u64>,
    pub queue_mode: Option<String>,
    pub alternate_exchange: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Policy {
    pub vhost: String,
    pub name: String,
    pub pattern: regex::Regex,
    pub apply_to: ApplyTo,
    pub priority: i64,
    pub definition: PolicyDefinition,
}

/// A policy as RabbitMQ's definitions JSON writes it.
#[derive(Clone, Debug, Deserialize)]
pub struct PolicyJson {
    pub vhost: String,
    pub name: String,
    pub pattern: String,
    #[serde(rename = "apply-to", default = "apply_to_all")]
    pub apply_to: String,
    #[serde(default)]
    pub priority: i64,
    pub definition: serde_json::Map<String, serde_json::Value>,
}

fn apply_to_all() -> String {
    "all".to_owned()
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("policy '{name}' in vhost '{vhost}': {reason}")]
pub struct PolicyError {
    pub vhost: String,
    pub name: String,
    pub reason: String,
}

impl Policy {
    /// Validates a policy read from a definitions file. Keys Sluice does not
    /// act on (`ha-mode`, `federation-upstream`, ...) are skipped with a
    /// warning, so that a RabbitMQ export loads as a whole.
    ///
    /// # Errors
    /// A bad pattern, `apply-to` or value, in RabbitMQ's words where it has them.
    pub fn from_json(json: &PolicyJson) -> Result<Self, PolicyError> {
        let error = |reason: String| PolicyError {
            vhost: json.vhost.clone(),
            name: json.name.clone(),
            reason,
        };
        let pattern = regex::Regex::new(&json.pattern)
            .map_err(|problem| error(format!("invalid pattern '{}': {problem}", json.pattern)))?;
        let apply_to = match json.apply_to.as_str() {
            "queues" => ApplyTo::Queues,
            "exchanges" => ApplyTo::Exchanges,
            "all" => ApplyTo::All,
            other => {
                return Err(error(format!(
                    "'{other}' is not a valid apply-to value (queues, exchanges or all)"
                )))
            }
        };
        let mut definition = PolicyDefinition::default();
        for (key, value) in &json.definition {
            parse_key(&mut definition, key, value).map_err(error)?;
        }
        Ok(Policy {
            vhost: json.vhost.clone(),
            name: json.name.clone(),
            pattern,
            apply_to,
            priority: json.priority,
            definition,
        })
    }

    pub fn applies_to(&self, target: PolicyTarget, name: &str) -> bool {
        let kind_matches = matches!(
            (self.apply_to, target),
            (ApplyTo::All, _)
                | (ApplyTo::Queues, PolicyTarget::Queue)
                | (ApplyTo::Exchanges, PolicyTarget::Exchange)
        );
        kind_matches && self.pattern.is_match(name)
    }
}

fn parse_key(
    definition: &mut PolicyDefinition,
    key: &str,
    value: &serde_json::Value,
) -> Result<(), String> {
    let integer = |minimum: u64, what: &str| -> Result<u64, String> {
        value
            .as_u64()
            .filter(|number| *number >= minimum)
            .ok_or_else(|| format!("{value} is not a valid {what}"))
    };
    let text = |what: &str| -> Result<String, String> {
        value
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("{value} is not a valid {what}"))
    };
    let one_of = |allowed: &[&str], what: &str| -> Result<String, String> {
        match value.as_str() {
            Some(text) if allowed.contains(&text) => Ok(text.to_owned()),
            _ => Err(format!("{value} is not a valid {what} value")),
        }
    };
    match key {
        "message-ttl" => {
            definition.message_ttl = Some(integer(0, "message TTL")?.min(EXPIRY_MS_MAX));
        }
        "expires" => definition.expires = Some(integer(1, "queue expiry")?.min(EXPIRY_MS_MAX)),
        "max-length" => definition.max_length = Some(integer(0, "maximum length")?),
        "max-length-bytes" => {
            definition.max_length_bytes = Some(integer(0, "maximum length in bytes")?)
        }
        "overflow" => {
            definition.overflow = Some(one_of(
                &["drop-head", "reject-publish", "reject-publish-dlx"],
                "overflow",
            )?)
        }
        "dead-letter-exchange" => {
            definition.dead_letter_exchange = Some(text("dead letter exchange name")?)
        }
        "dead-letter-routing-key" => {
            definition.dead_letter_routing_key = Some(text("dead letter routing key")?)
        }
        "dead-letter-strategy" => {
            definition.dead_letter_strategy = Some(one_of(
                &["at-most-once", "at-least-once"],
                "dead-letter-strategy",
            )?)
        }
        "delivery-limit" => definition.delivery_limit = Some(integer(0, "delivery limit")?),
        "queue-mode" => definition.queue_mode = Some(one_of(&["default", "lazy"], "queue-mode")?),
        "alternate-exchange" => {
            definition.alternate_exchange = Some(text("alternate exchange name")?)
        }
        other => tracing::warn!(key = other, "ignoring a policy key Sluice does not act on"),
    }
    Ok(())
}

/// The policies of one vhost, highest priority first.
#[derive(Clone, Debug, Default)]
pub struct VhostPolicies {
    policies: Vec<Arc<Policy>>,
}

impl VhostPolicies {
    pub fn new(mut policies: Vec<Policy>) -> Self {
        // A stable sort keeps file order among equal priorities.
        policies.sort_by_key(|policy| std::cmp::Reverse(policy.priority));
        VhostPolicies {
            policies: policies.into_iter().map(Arc::new).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.policies.iter()
    }

    /// The policy that applies to the named object, if any.
    pub fn matching(&self, target: PolicyTarget, name: &str) -> Option<&Arc<Policy>> {
        self.policies
            .iter()
            .find(|policy| policy.applies_to(target, name))
    }
}

/// Numeric limits where RabbitMQ takes the smaller of the policy's value and
/// the queue argument's (`res_min` in `rabbit_amqqueue_process`); for every
/// other key the queue argument wins over the policy (`res_arg`).
const SMALLER_WINS: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-max-length",
    "x-max-length-bytes",
    "x-delivery-limit",
];

/// A queue's effective arguments: its declared arguments, completed and
/// overridden by its policy's keys under their `x-` names, resolved as
/// RabbitMQ resolves them.
pub fn effective_queue_arguments(declared: &FieldTable, policy: Option<&Policy>) -> FieldTable {
    let Some(policy) = policy else {
        return declared.clone();
    };
    let definition = &policy.definition;
    let mut effective = declared.clone();
    let numbers = [
        ("x-message-ttl", definition.message_ttl),
        ("x-expires", definition.expires),
        ("x-max-length", definition.max_length),
        ("x-max-length-bytes", definition.max_length_bytes),
        ("x-delivery-limit", definition.delivery_limit),
    ];
    for (key, value) in numbers {
        let Some(value) = value else { continue };
        let value = i64::try_from(value).unwrap_or(i64::MAX);
        let resolved = match declared.inner().get(key).and_then(as_strict_integer) {
            Some(declared) if SMALLER_WINS.contains(&key) => declared.min(value),
            Some(declared) => declared,
            None => value,
        };
        effective.insert(key.into(), AMQPValue::LongLongInt(resolved));
    }
    let texts = [
        ("x-overflow", &definition.overflow),
        ("x-dead-letter-exchange", &definition.dead_letter_exchange),
        (
            "x-dead-letter-routing-key",
            &definition.dead_letter_routing_key,
        ),
        ("x-dead-letter-strategy", &definition.dead_letter_strategy),
        ("x-queue-mode", &definition.queue_mode),
    ];
    for (key, value) in texts {
        if let Some(value) = value {
            if !declared.inner().contains_key(key) {
                effective.insert(key.into(), AMQPValue::LongString(value.as_str().into()));
            }
        }
    }
    effective
}

/// An exchange's alternate exchange: its `alternate-exchange` argument,
/// else its policy's (`rabbit_policy:get_arg`: the argument wins).
pub fn effective_alternate_exchange(
    declared: &FieldTable,
    policy: Option<&Policy>,
) -> Option<Arc<str>> {
    if let Some(name) = declared.inner().get("alternate-exchange").and_then(as_text) {
        return Some(Arc::from(name));
    }
    policy
        .and_then(|policy| policy.definition.alternate_exchange.as_deref())
        .map(Arc::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(
        name: &str,
        pattern: &str,
        apply_to: &str,
        priority: i64,
        definition: &str,
    ) -> Policy {
        let json = PolicyJson {
            vhost: "/".into(),
            name: name.into(),
            pattern: pattern.into(),
            apply_to: apply_to.into(),
            priority,
            definition: serde_json::from_str(definition).unwrap(),
        };
        Policy::from_json(&json).unwrap()
    }

    #[test]
    fn policy_highest_priority_of_matching_kind_wins() {
        let policies = VhostPolicies::new(vec![
            policy("low", "^q\\.", "queues", 1, r#"{"max-length": 10}"#),
            policy("high", "^q\\.big", "all", 5, r#"{"max-length": 100}"#),
            policy(
                "exchanges",
                "^q\\.",
                "exchanges",
                9,
                r#"{"alternate-exchange": "ae"}"#,
            ),
        ]);
        let matched = |name| {
            policies
                .matching(PolicyTarget::Queue, name)
                .map(|policy| policy.name.clone())
        };
        assert_eq!(matched("q.small").as_deref(), Some("low"));
        assert_eq!(matched("q.big.one").as_deref(), Some("high"));
        assert_eq!(matched("other"), None);
        // The pattern is searched for, not anchored: "x.q.1" does not start with q.
        assert_eq!(matched("x.q.1"), None);
        let exchange = policies.matching(PolicyTarget::Exchange, "q.e").unwrap();
        assert_eq!(exchange.name, "exchanges");
    }

    #[test]
    fn policy_values_are_validated() {
        let json = |definition: &str| PolicyJson {
            vhost: "/".into(),
            name: "p".into(),
            pattern: ".*".into(),
            apply_to: "queues".into(),
            priority: 0,
            definition: serde_json::from_str(definition).unwrap(),
        };
        let error = Policy::from_json(&json(r#"{"max-length": -1}"#)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "policy 'p' in vhost '/': -1 is not a valid maximum length"
        );
        assert!(Policy::from_json(&json(r#"{"expires": 0}"#)).is_err());
        assert!(Policy::from_json(&json(r#"{"overflow": "explode"}"#)).is_err());
        assert!(Policy::from_json(&json(r#"{"dead-letter-strategy": "twice"}"#)).is_err());
        assert!(Policy::from_json(&json(r#"{"delivery-limit": -2}"#)).is_err());
        assert!(Policy::from_json(&json(r#"{"ha-mode": "all"}"#)).is_ok());
        let mut bad_pattern = json("{}");
        bad_pattern.pattern = "(".into();
        assert!(Policy::from_json(&bad_pattern).is_err());
    }

    #[test]
    fn policy_effective_arguments_resolve_like_rabbitmq() {
        let policy = policy(
            "p",
            ".*",
            "all",
            0,
            r#"{"max-length": 10, "message-ttl": 5000, "overflow": "reject-publish",
                "dead-letter-exchange": "dlx", "alternate-exchange": "ae"}"#,
        );
        let mut declared = FieldTable::default();
        declared.insert("x-max-length".into(), AMQPValue::LongInt(50));
        declared.insert("x-message-ttl".into(), AMQPValue::LongInt(1000));
        declared.insert(
            "x-overflow".into(),
            AMQPValue::LongString("drop-head".into()),
        );
        let effective = effective_queue_arguments(&declared, Some(&policy));
        let get = |key: &str| effective.inner().get(key).cloned();
        // Limits: the smaller wins; other keys: the argument wins.
        assert_eq!(get("x-max-length"), Some(AMQPValue::LongLongInt(10)));
        assert_eq!(get("x-message-ttl"), Some(AMQPValue::LongLongInt(1000)));
        assert_eq!(
            get("x-overflow"),
            Some(AMQPValue::LongString("drop-head".into()))
        );
        assert_eq!(
            get("x-dead-letter-exchange"),
            Some(AMQPValue::LongString("dlx".into()))
        );
        assert_eq!(
            effective_queue_arguments(&declared, None).inner(),
            declared.inner()
        );
        // The quorum queue keys: the smaller delivery limit, the declared
        // dead-letter strategy.
        let quorum = super::tests::policy(
            "q",
            ".*",
            "queues",
            0,
            r#"{"delivery-limit": 3, "dead-letter-strategy": "at-least-once"}"#,
        );
        let mut declared = FieldTable::default();
        declared.insert("x-delivery-limit".into(), AMQPValue::LongInt(5));
        let effective = effective_queue_arguments(&declared, Some(&quorum));
        assert_eq!(
            effective.inner().get("x-delivery-limit"),
            Some(&AMQPValue::LongLongInt(3))
        );
        assert_eq!(
            effective.inner().get("x-dead-letter-strategy"),
            Some(&AMQPValue::LongString("at-least-once".into()))
        );
        declared.insert(
            "x-dead-letter-strategy".into(),
            AMQPValue::LongString("at-most-once".into()),
        );
        let effective = effective_queue_arguments(&declared, Some(&quorum));
        assert_eq!(
            effective.inner().get("x-dead-letter-strategy"),
            Some(&AMQPValue::LongString("at-most-once".into()))
        );
        assert_eq!(
            effective_alternate_exchange(&FieldTable::default(), Some(&policy)).as_deref(),
            Some("ae")
        );
        let mut own = FieldTable::default();
        own.insert(
            "alternate-exchange".into(),
            AMQPValue::LongString("mine".into()),
        );
        assert_eq!(
            effective_alternate_exchange(&own, Some(&policy)).as_deref(),
            Some("mine")
        );
    }
}
