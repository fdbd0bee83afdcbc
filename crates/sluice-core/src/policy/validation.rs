//! A policy checked as RabbitMQ 3.10.8 checks it (`rabbit_policy:validate`,
//! `rabbit_policies:validate_policy0`), with its error texts, so that a
//! client of the management API, or a person, sees the same words.
//!
//! RabbitMQ collects the errors of a policy's fields (definition first,
//! then `apply-to`, `pattern`), and of a definition only the first key in
//! key order that is wrong, or else the keys no validator knows. Its texts
//! print values as Erlang terms (`~p`): see [`erlang_term`].

use super::{ApplyTo, PolicyDefinition};
use crate::arguments::EXPIRY_MS_MAX;

/// Keys RabbitMQ 3.10.8 (with its usual plugins) accepts in a policy and
/// Sluice keeps without acting on them: mirroring is replaced by quorum
/// queues, streams and federation are not implemented, and classic queues
/// have one storage version. A RabbitMQ export that uses them loads as is.
const KEYS_KEPT_NOT_ACTED_ON: &[&str] = &[
    "federation-upstream",
    "federation-upstream-set",
    "ha-mode",
    "ha-params",
    "ha-promote-on-failure",
    "ha-promote-on-shutdown",
    "ha-sync-batch-size",
    "ha-sync-mode",
    "initial-cluster-size",
    "max-age",
    "max-in-memory-bytes",
    "max-in-memory-length",
    "queue-leader-locator",
    "queue-master-locator",
    "queue-version",
    "stream-max-segment-size-bytes",
];

/// RabbitMQ's `?MAX_STREAM_MAX_SEGMENT_SIZE`.
const STREAM_SEGMENT_SIZE_MAX: u64 = 3_000_000_000;

/// The whole text RabbitMQ gives for a refused parameter or policy
/// (`rabbit_runtime_parameters:format_error`): a heading, a blank line,
/// then one line per error.
pub fn validation_failed_text(reasons: &[String]) -> String {
    let mut text = String::from("Validation failed\n\n");
    for reason in reasons {
        text.push_str(reason);
        text.push('\n');
    }
    text
}

/// Checks `apply-to`, `pattern` and `definition`; the errors in
/// RabbitMQ's order and words, or the parsed parts.
pub(super) fn validate(
    pattern: &str,
    apply_to: &str,
    definition: &serde_json::Map<String, serde_json::Value>,
) -> Result<(regex::Regex, ApplyTo, PolicyDefinition), Vec<String>> {
    let mut reasons = Vec::new();
    let parsed_definition = parse_definition(definition).map_err(|reason| reasons.push(reason));
    let parsed_apply_to = match apply_to {
        "queues" => Ok(ApplyTo::Queues),
        "exchanges" => Ok(ApplyTo::Exchanges),
        "all" => Ok(ApplyTo::All),
        other => {
            reasons.push(format!(
                "apply-to '{other}' unrecognised; should be 'queues', 'exchanges' or 'all'"
            ));
            Err(())
        }
    };
    let parsed_pattern = regex::Regex::new(pattern).map_err(|problem| {
        reasons.push(format!(
            "pattern should be regular expression but is invalid: {}",
            one_line(&problem.to_string())
        ))
    });
    match (parsed_pattern, parsed_apply_to, parsed_definition) {
        (Ok(pattern), Ok(apply_to), Ok(definition)) => Ok((pattern, apply_to, definition)),
        _ => Err(reasons),
    }
}

/// The regex crate explains an error over several lines, with a caret
/// under the place; a reply has one line per error.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.chars().all(|c| c == '^' || c == ' '))
        .collect::<Vec<_>>()
        .join(" ")
}

fn parse_definition(
    definition: &serde_json::Map<String, serde_json::Value>,
) -> Result<PolicyDefinition, String> {
    if definition.is_empty() {
        return Err("no policy provided".to_owned());
    }
    let mut parsed = PolicyDefinition::default();
    let mut unknown = Vec::new();
    // A serde_json map iterates in key order, as RabbitMQ's sorted
    // proplist of the decoded JSON object does.
    for (key, value) in definition {
        if !parse_key(&mut parsed, key, value)? {
            unknown.push(format!("{{<<\"{key}\">>,{}}}", erlang_term(value)));
        }
    }
    if !unknown.is_empty() {
        return Err(format!(
            "[{}] are not recognised policy settings",
            unknown.join(",")
        ));
    }
    Ok(parsed)
}

/// Reads one key into `definition`; false for a key RabbitMQ does not
/// know.
fn parse_key(
    definition: &mut PolicyDefinition,
    key: &str,
    value: &serde_json::Value,
) -> Result<bool, String> {
    let invalid = |what: &str| format!("{} is not a valid {what}", erlang_term(value));
    let integer = |minimum: u64, what: &str| -> Result<u64, String> {
        value
            .as_u64()
            .filter(|number| *number >= minimum)
            .ok_or_else(|| invalid(what))
    };
    let text = |what: &str| -> Result<String, String> {
        value
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| invalid(what))
    };
    let one_of = |allowed: &[&str], what: &str| -> Result<String, String> {
        match value.as_str() {
            Some(text) if allowed.contains(&text) => Ok(text.to_owned()),
            _ => Err(invalid(what)),
        }
    };
    match key {
        "alternate-exchange" => {
            definition.alternate_exchange = Some(text("alternate exchange name")?)
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
                "dead letter strategy",
            )?)
        }
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
                "overflow value",
            )?)
        }
        "delivery-limit" => definition.delivery_limit = Some(integer(0, "delivery limit")?),
        "queue-mode" => {
            definition.queue_mode = Some(one_of(&["default", "lazy"], "queue-mode value")?)
        }
        other => return check_kept_key(other, value),
    }
    Ok(true)
}

/// The keys Sluice keeps without acting on, checked as RabbitMQ checks
/// the simple ones; false for a key nobody knows.
fn check_kept_key(key: &str, value: &serde_json::Value) -> Result<bool, String> {
    if !KEYS_KEPT_NOT_ACTED_ON.contains(&key) {
        return Ok(false);
    }
    let invalid = |what: &str| Err(format!("{} is not a valid {what}", erlang_term(value)));
    let non_negative = value.as_u64().is_some();
    match key {
        "max-in-memory-length" | "max-in-memory-bytes" if !non_negative => {
            invalid("maximum memory in bytes")
        }
        "initial-cluster-size" if !non_negative => invalid("cluster size"),
        "queue-version" if !matches!(value.as_u64(), Some(1 | 2)) => invalid("queue-version value"),
        "queue-leader-locator"
            if !matches!(
                value.as_str(),
                Some("client-local" | "balanced" | "random" | "least-leaders")
            ) =>
        {
            invalid("queue leader locator value")
        }
        "stream-max-segment-size-bytes"
            if value
                .as_u64()
                .is_none_or(|size| size > STREAM_SEGMENT_SIZE_MAX) =>
        {
            invalid("segment size")
        }
        _ => Ok(true),
    }
}

/// A JSON value as Erlang's `~p` prints the term RabbitMQ decodes it to:
/// strings are binaries (`<<"text">>`), objects are maps.
pub fn erlang_term(value: &serde_json::Value) -> String {
    use serde_json::Value;
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(flag) => flag.to_string(),
        Value::Number(number) => number.to_string(),
        Value::String(text) => format!("<<{}>>", serde_json::Value::String(text.clone())),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(erlang_term).collect();
            format!("[{}]", items.join(","))
        }
        Value::Object(map) => {
            let pairs: Vec<String> = map
                .iter()
                .map(|(key, value)| {
                    format!(
                        "{} => {}",
                        erlang_term(&Value::String(key.clone())),
                        erlang_term(value)
                    )
                })
                .collect();
            format!("#{{{}}}", pairs.join(","))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn definition(json: &str) -> serde_json::Map<String, serde_json::Value> {
        serde_json::from_str(json).unwrap()
    }

    fn reasons(pattern: &str, apply_to: &str, json: &str) -> Vec<String> {
        validate(pattern, apply_to, &definition(json)).unwrap_err()
    }

    #[test]
    fn policy_validation_speaks_rabbitmq() {
        assert_eq!(
            reasons(".*", "all", r#"{"max-length": -1}"#),
            ["-1 is not a valid maximum length"]
        );
        assert_eq!(
            reasons(".*", "all", r#"{"overflow": "explode"}"#),
            ["<<\"explode\">> is not a valid overflow value"]
        );
        assert_eq!(
            reasons(".*", "all", r#"{"message-ttl": 1.5}"#),
            ["1.5 is not a valid message TTL"]
        );
        assert_eq!(reasons(".*", "all", "{}"), ["no policy provided"]);
        assert_eq!(
            reasons(".*", "all", r#"{"colour": "blue", "max-length": 1}"#),
            ["[{<<\"colour\">>,<<\"blue\">>}] are not recognised policy settings"]
        );
        // Every field's error, the definition's first.
        let all = reasons("(", "topics", r#"{"expires": 0}"#);
        assert_eq!(all[0], "0 is not a valid queue expiry");
        assert_eq!(
            all[1],
            "apply-to 'topics' unrecognised; should be 'queues', 'exchanges' or 'all'"
        );
        assert!(
            all[2].starts_with("pattern should be regular expression but is invalid: "),
            "{}",
            all[2]
        );
        assert!(!all[2].contains('\n'));
        assert_eq!(
            validation_failed_text(&all[..1]),
            "Validation failed\n\n0 is not a valid queue expiry\n"
        );
    }

    #[test]
    fn policy_validation_keeps_keys_it_does_not_act_on() {
        assert!(validate(".*", "all", &definition(r#"{"ha-mode": "all"}"#)).is_ok());
        assert_eq!(
            reasons(".*", "all", r#"{"queue-version": 3}"#),
            ["3 is not a valid queue-version value"]
        );
    }

    #[test]
    fn policy_values_print_as_erlang_terms() {
        let value: serde_json::Value =
            serde_json::from_str(r#"{"b": [1, true, null], "a": "x\"y"}"#).unwrap();
        assert_eq!(
            erlang_term(&value),
            r#"#{<<"a">> => <<"x\"y">>,<<"b">> => [1,true,null]}"#
        );
    }
}
