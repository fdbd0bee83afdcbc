//! Policies: settings applied to queues and exchanges by a name pattern,
//! in RabbitMQ's definitions format, and the effective arguments they give.
//!
//! A policy matches an object when its regular expression finds a match
//! anywhere in the object's name (as RabbitMQ's `re:run` does) and its
//! `apply-to` covers the object's kind. Of the policies that match, the one
//! with the highest priority applies, and only that one; among equal
//! priorities the one whose name sorts first wins (RabbitMQ leaves that
//! order to its table; a name order is the same on every node).
//!
//! Policies live in the metadata log (`SetPolicy`, `ClearPolicy`): every
//! node applies a change at the same point, and the vhost then gives every
//! queue and exchange it holds its new effective settings (see
//! `vhost/policy_apply.rs`). An object keeps what was worked out for it, so
//! nothing on the message path consults policies.
//!
//! - `validation`: a policy checked as RabbitMQ checks it, with its texts.

mod validation;

pub use validation::{erlang_term, validation_failed_text};

use std::sync::Arc;

use amq_protocol::types::{AMQPValue, FieldTable};
use serde::{Deserialize, Serialize};

use crate::arguments::{as_strict_integer, as_text};

/// Policies one vhost may hold: every change matches each of them against
/// every queue and exchange of the vhost, so their number bounds that work.
/// RabbitMQ has no such bound; real deployments hold a few dozen.
pub const POLICIES_PER_VHOST_MAX: usize = 1024;

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

/// A validated policy: what it was given as ([`PolicyJson`], kept to be
/// listed and exported exactly so) and what was read from it.
#[derive(Clone, Debug)]
pub struct Policy {
    pub vhost: String,
    pub name: String,
    pub pattern: regex::Regex,
    pub apply_to: ApplyTo,
    pub priority: i64,
    pub definition: PolicyDefinition,
    pub source: PolicyJson,
}

/// A policy as RabbitMQ's definitions JSON writes it: the shape of
/// `GET /api/policies` and of a definitions file's `policies`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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

/// Why a policy was refused: RabbitMQ's reasons, one per wrong field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    pub vhost: String,
    pub name: String,
    pub reasons: Vec<String>,
}

impl PolicyError {
    /// The whole text RabbitMQ answers with (`Validation failed`, then
    /// each reason on its line): what the management API returns.
    pub fn rabbitmq_text(&self) -> String {
        validation_failed_text(&self.reasons)
    }
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "policy '{}' in vhost '{}': {}",
            self.name,
            self.vhost,
            self.reasons.join("; ")
        )
    }
}

impl std::error::Error for PolicyError {}

/// Checks a policy as RabbitMQ would before it is set: what the HTTP API
/// calls before proposing, and what every node calls again as it applies
/// the change (so that all of them reach the same answer).
///
/// # Errors
/// A bad pattern, `apply-to` or definition, in RabbitMQ's words.
pub fn validate_policy(json: &PolicyJson) -> Result<Policy, PolicyError> {
    Policy::from_json(json)
}

impl Policy {
    /// Validates a policy given in RabbitMQ's JSON shape. Keys RabbitMQ
    /// knows and Sluice does not act on (`ha-mode`, `federation-upstream`,
    /// ...) are kept, so that a RabbitMQ export loads as a whole; keys
    /// RabbitMQ does not know are refused, as RabbitMQ refuses them.
    ///
    /// # Errors
    /// A bad pattern, `apply-to` or value, in RabbitMQ's words.
    pub fn from_json(json: &PolicyJson) -> Result<Self, PolicyError> {
        let (pattern, apply_to, definition) =
            validation::validate(&json.pattern, &json.apply_to, &json.definition).map_err(
                |reasons| PolicyError {
                    vhost: json.vhost.clone(),
                    name: json.name.clone(),
                    reasons,
                },
            )?;
        Ok(Policy {
            vhost: json.vhost.clone(),
            name: json.name.clone(),
            pattern,
            apply_to,
            priority: json.priority,
            definition,
            source: json.clone(),
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

/// The policies of one vhost, highest priority first, then by name.
#[derive(Clone, Debug, Default)]
pub struct VhostPolicies {
    policies: Vec<Arc<Policy>>,
}

impl VhostPolicies {
    pub fn new(policies: Vec<Policy>) -> Self {
        let mut all = VhostPolicies::default();
        for policy in policies {
            all.put(policy);
        }
        all
    }

    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    pub fn len(&self) -> usize {
        self.policies.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.policies.iter()
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Policy>> {
        self.policies.iter().find(|policy| policy.name == name)
    }

    /// Adds the policy, or replaces the one of its name.
    pub fn put(&mut self, policy: Policy) {
        self.policies
            .retain(|existing| existing.name != policy.name);
        self.policies.push(Arc::new(policy));
        self.policies.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then_with(|| a.name.cmp(&b.name))
        });
    }

    /// Removes the named policy; None when there was none.
    pub fn remove(&mut self, name: &str) -> Option<Arc<Policy>> {
        let position = self
            .policies
            .iter()
            .position(|policy| policy.name == name)?;
        Some(self.policies.remove(position))
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
        assert!(Policy::from_json(&json(r#"{"colour": "blue"}"#)).is_err());
        let mut bad_pattern = json(r#"{"max-length": 1}"#);
        bad_pattern.pattern = "(".into();
        assert!(Policy::from_json(&bad_pattern).is_err());
        // The definition is kept as given, to be listed and exported so.
        let kept = Policy::from_json(&json(r#"{"max-length": 5, "ha-mode": "all"}"#)).unwrap();
        assert_eq!(kept.source, json(r#"{"max-length": 5, "ha-mode": "all"}"#));
    }

    #[test]
    fn policy_equal_priorities_go_by_name_and_a_name_is_replaced() {
        let mut policies = VhostPolicies::new(vec![
            policy("zeta", "^q", "queues", 1, r#"{"max-length": 1}"#),
            policy("alpha", "^q", "queues", 1, r#"{"max-length": 2}"#),
            policy("low", "^q", "queues", 0, r#"{"max-length": 3}"#),
        ]);
        let matched = |policies: &VhostPolicies| {
            policies
                .matching(PolicyTarget::Queue, "q1")
                .map(|policy| policy.name.clone())
        };
        assert_eq!(matched(&policies).as_deref(), Some("alpha"));
        // Redefined with a lower priority: replaced, not added.
        policies.put(policy("alpha", "^q", "queues", -1, r#"{"max-length": 2}"#));
        assert_eq!(policies.len(), 3);
        assert_eq!(matched(&policies).as_deref(), Some("zeta"));
        assert!(policies.remove("zeta").is_some());
        assert!(policies.remove("zeta").is_none());
        assert_eq!(matched(&policies).as_deref(), Some("low"));
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
