//! Runtime parameters, as RabbitMQ's `rabbit_runtime_parameters` keeps
//! them: per vhost, a JSON value by component and name
//! (`rabbitmqctl set_parameter`), and global ones by name
//! (`set_global_parameter`). They live in the metadata log
//! (`SetParameter`, `SetGlobalParameter` and their clears) and in its
//! snapshots.
//!
//! Of the components, Sluice acts on `vhost-limits` (the same limits
//! `SetVhostLimits` sets: they are kept once, with the users and
//! permissions) and keeps those of RabbitMQ's usual plugins (federation,
//! shovels) without acting on them, so that a RabbitMQ export loads and
//! exports again as it was. A component nobody registers is refused with
//! RabbitMQ's text, as RabbitMQ refuses it.

use serde::{Deserialize, Serialize};

use crate::access::VhostLimits;
use crate::policy::{erlang_term, validation_failed_text};

/// The component whose parameter holds a vhost's limits.
pub const VHOST_LIMITS_COMPONENT: &str = "vhost-limits";

/// The name RabbitMQ gives the vhost-limits parameter.
pub const VHOST_LIMITS_NAME: &str = "limits";

/// Components RabbitMQ's usual plugins register; kept, not acted on.
const COMPONENTS_KEPT_NOT_ACTED_ON: &[&str] =
    &["federation-upstream", "federation-upstream-set", "shovel"];

/// Parameters one vhost may hold, and global parameters the cluster may
/// hold: every one is in each metadata snapshot. RabbitMQ has no such
/// bound; real deployments hold a few.
pub const PARAMETERS_PER_VHOST_MAX: usize = 1024;
pub const GLOBAL_PARAMETERS_MAX: usize = 1024;

/// A vhost's runtime parameter, as definitions JSON and
/// `GET /api/parameters` show it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParameterJson {
    pub vhost: String,
    pub component: String,
    pub name: String,
    pub value: serde_json::Value,
}

/// A global runtime parameter, as definitions JSON and
/// `GET /api/global-parameters` show it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GlobalParameterJson {
    pub name: String,
    pub value: serde_json::Value,
}

/// Why a parameter was refused, in RabbitMQ's words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("parameter '{name}' of component '{component}' in vhost '{vhost}': {}", reasons.join("; "))]
pub struct ParameterError {
    pub component: String,
    pub vhost: String,
    pub name: String,
    pub reasons: Vec<String>,
}

impl ParameterError {
    /// The whole text RabbitMQ answers with, as the management API returns
    /// it.
    pub fn rabbitmq_text(&self) -> String {
        match self.reasons.as_slice() {
            // Said as it is, not as a validation failure.
            [only] if only.starts_with("policies may not") => only.clone(),
            reasons => validation_failed_text(reasons),
        }
    }
}

/// Checks a vhost's parameter as RabbitMQ would before it is set: what the
/// HTTP API calls before proposing, and every node again as it applies it.
///
/// # Errors
/// A component nobody registers, a policy (set through `SetPolicy`
/// instead), or a `vhost-limits` value RabbitMQ would refuse.
pub fn validate_parameter(parameter: &ParameterJson) -> Result<(), ParameterError> {
    let refuse = |reasons: Vec<String>| ParameterError {
        component: parameter.component.clone(),
        vhost: parameter.vhost.clone(),
        name: parameter.name.clone(),
        reasons,
    };
    match parameter.component.as_str() {
        "policy" | "operator_policy" => Err(refuse(vec![
            "policies may not be set using this method".to_owned(),
        ])),
        VHOST_LIMITS_COMPONENT => vhost_limits_of(&parameter.name, &parameter.value)
            .map(drop)
            .map_err(refuse),
        component if COMPONENTS_KEPT_NOT_ACTED_ON.contains(&component) => Ok(()),
        component => Err(refuse(vec![format!("component {component} not found")])),
    }
}

/// A `vhost-limits` value, checked as `rabbit_vhost_limit:validate` does:
/// `max-connections` and `max-queues`, integers, a negative one meaning no
/// limit.
///
/// # Errors
/// RabbitMQ's reasons.
pub fn vhost_limits_of(name: &str, value: &serde_json::Value) -> Result<VhostLimits, Vec<String>> {
    let Some(map) = value.as_object() else {
        return Err(vec![format!(
            "parse error while reading {name}: {}",
            erlang_term(value)
        )]);
    };
    let mut reasons = Vec::new();
    let mut limit = |key: &str| match map.get(key) {
        None => None,
        Some(number) => match number.as_i64() {
            Some(negative) if negative < 0 => None,
            Some(limit) => Some(limit as u64),
            None => {
                reasons.push(format!(
                    "{key} should be a number, actually was {}",
                    erlang_term(number)
                ));
                None
            }
        },
    };
    let limits = VhostLimits {
        max_connections: limit("max-connections"),
        max_queues: limit("max-queues"),
    };
    let unknown: Vec<String> = map
        .iter()
        .filter(|(key, _)| !matches!(key.as_str(), "max-connections" | "max-queues"))
        .map(|(key, value)| format!("{{<<\"{key}\">>,{}}}", erlang_term(value)))
        .collect();
    if !unknown.is_empty() {
        reasons.push(format!(
            "Unrecognised terms [{}] in {name}",
            unknown.join(",")
        ));
    }
    if reasons.is_empty() {
        Ok(limits)
    } else {
        Err(reasons)
    }
}

/// Limits as the `vhost-limits` parameter's value; None without any.
pub fn vhost_limits_value(limits: &VhostLimits) -> Option<serde_json::Value> {
    let mut value = serde_json::Map::new();
    if let Some(max) = limits.max_connections {
        value.insert("max-connections".into(), max.into());
    }
    if let Some(max) = limits.max_queues {
        value.insert("max-queues".into(), max.into());
    }
    (!value.is_empty()).then_some(serde_json::Value::Object(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parameter(component: &str, value: &str) -> ParameterJson {
        ParameterJson {
            vhost: "/".into(),
            component: component.into(),
            name: "limits".into(),
            value: serde_json::from_str(value).unwrap(),
        }
    }

    #[test]
    fn parameters_are_validated_like_rabbitmq() {
        let refused = |component, value| {
            validate_parameter(&parameter(component, value))
                .unwrap_err()
                .rabbitmq_text()
        };
        assert_eq!(
            refused("colour", "{}"),
            "Validation failed\n\ncomponent colour not found\n"
        );
        assert_eq!(
            refused("policy", "{}"),
            "policies may not be set using this method"
        );
        assert_eq!(
            refused("vhost-limits", r#"{"max-queues": "many"}"#),
            "Validation failed\n\nmax-queues should be a number, actually was <<\"many\">>\n"
        );
        assert_eq!(
            refused("vhost-limits", r#"{"max-channels": 1}"#),
            "Validation failed\n\nUnrecognised terms [{<<\"max-channels\">>,1}] in limits\n"
        );
        assert!(
            validate_parameter(&parameter("federation-upstream", r#"{"uri": "amqp://"}"#)).is_ok()
        );
        assert_eq!(
            vhost_limits_of(
                "limits",
                &serde_json::json!({"max-queues": 3, "max-connections": -1})
            ),
            Ok(VhostLimits {
                max_connections: None,
                max_queues: Some(3)
            })
        );
    }
}
