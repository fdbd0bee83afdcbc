//! Declaration arguments: equivalence on redeclaration and RabbitMQ's way of
//! printing them in errors.

use amq_protocol::types::{AMQPValue, FieldTable};

use crate::error::AmqpError;

/// Queue arguments RabbitMQ compares on redeclaration; any other argument
/// may differ between declarations without error.
pub const QUEUE_EQUIVALENCE_KEYS: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-single-active-consumer",
    "x-queue-type",
    "x-quorum-initial-group-size",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-queue-leader-locator",
    "x-queue-master-locator",
];

/// Exchange arguments RabbitMQ compares on redeclaration.
pub const EXCHANGE_EQUIVALENCE_KEYS: &[&str] = &["alternate-exchange"];

/// RabbitMQ's name for the type of a field value, as printed in
/// inequivalent-argument errors.
pub fn type_name(value: &AMQPValue) -> &'static str {
    match value {
        AMQPValue::Boolean(_) => "bool",
        AMQPValue::ShortShortInt(_) => "byte",
        AMQPValue::ShortShortUInt(_) => "unsignedbyte",
        AMQPValue::ShortInt(_) => "short",
        AMQPValue::ShortUInt(_) => "unsignedshort",
        AMQPValue::LongInt(_) => "signedint",
        AMQPValue::LongUInt(_) => "unsignedint",
        AMQPValue::LongLongInt(_) => "long",
        AMQPValue::Float(_) => "float",
        AMQPValue::Double(_) => "double",
        AMQPValue::DecimalValue(_) => "decimal",
        // RabbitMQ reads every string in a table as a longstr.
        AMQPValue::ShortString(_) | AMQPValue::LongString(_) => "longstr",
        AMQPValue::FieldArray(_) => "array",
        AMQPValue::Timestamp(_) => "timestamp",
        AMQPValue::FieldTable(_) => "table",
        AMQPValue::ByteArray(_) => "binary",
        AMQPValue::Void => "void",
    }
}

/// A value as RabbitMQ prints it: strings as text, numbers as numbers.
pub fn display_value(value: &AMQPValue) -> String {
    match value {
        AMQPValue::Boolean(value) => value.to_string(),
        AMQPValue::ShortShortInt(value) => value.to_string(),
        AMQPValue::ShortShortUInt(value) => value.to_string(),
        AMQPValue::ShortInt(value) => value.to_string(),
        AMQPValue::ShortUInt(value) => value.to_string(),
        AMQPValue::LongInt(value) => value.to_string(),
        AMQPValue::LongUInt(value) => value.to_string(),
        AMQPValue::LongLongInt(value) => value.to_string(),
        AMQPValue::Float(value) => value.to_string(),
        AMQPValue::Double(value) => value.to_string(),
        AMQPValue::Timestamp(value) => value.to_string(),
        AMQPValue::ShortString(value) => value.as_str().to_owned(),
        AMQPValue::LongString(value) => String::from_utf8_lossy(value.as_bytes()).into_owned(),
        other => format!("{other:?}"),
    }
}

fn describe(value: Option<&AMQPValue>) -> String {
    match value {
        None => "none".to_owned(),
        Some(value) => format!(
            "the value '{}' of type '{}'",
            display_value(value),
            type_name(value)
        ),
    }
}

/// The integer in a numeric argument of any integer type.
pub fn as_integer(value: &AMQPValue) -> Option<i64> {
    match value {
        AMQPValue::ShortShortInt(value) => Some(*value as i64),
        AMQPValue::ShortShortUInt(value) => Some(*value as i64),
        AMQPValue::ShortInt(value) => Some(*value as i64),
        AMQPValue::ShortUInt(value) => Some(*value as i64),
        AMQPValue::LongInt(value) => Some(*value as i64),
        AMQPValue::LongUInt(value) => Some(*value as i64),
        AMQPValue::LongLongInt(value) => Some(*value),
        AMQPValue::Timestamp(value) => i64::try_from(*value).ok(),
        _ => None,
    }
}

/// Two argument values are equivalent when equal, or when both are integers
/// of equal value (clients pick integer widths freely).
fn equivalent(left: Option<&AMQPValue>, right: Option<&AMQPValue>) -> bool {
    match (left, right) {
        (Some(left), Some(right)) => match (as_integer(left), as_integer(right)) {
            (Some(left), Some(right)) => left == right,
            _ => left == right,
        },
        (None, None) => true,
        _ => false,
    }
}

/// Checks a redeclaration's arguments against the existing ones, for the keys
/// RabbitMQ compares. `what` is e.g. `queue 'q' in vhost '/'`.
pub fn check_equivalence(
    keys: &[&str],
    received: &FieldTable,
    current: &FieldTable,
    what: &str,
) -> Result<(), AmqpError> {
    for key in keys {
        let received_value = received.inner().get(*key);
        let current_value = current.inner().get(*key);
        if !equivalent(received_value, current_value) {
            return Err(AmqpError::precondition_failed(format!(
                "inequivalent arg '{key}' for {what}: received {} but current is {}",
                describe(received_value),
                describe(current_value)
            )));
        }
    }
    Ok(())
}

/// The error for a differing declaration flag (durable, auto_delete, ...).
pub fn inequivalent_flag(flag: &str, what: &str, received: bool, current: bool) -> AmqpError {
    AmqpError::precondition_failed(format!(
        "inequivalent arg '{flag}' for {what}: received '{received}' but current is '{current}'"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_equivalence_uses_rabbitmq_wording() {
        let mut received = FieldTable::default();
        received.insert("x-max-length".into(), AMQPValue::LongInt(10));
        let error = check_equivalence(
            QUEUE_EQUIVALENCE_KEYS,
            &received,
            &FieldTable::default(),
            "queue 'q' in vhost '/'",
        )
        .unwrap_err();
        assert_eq!(
            error.reply_text(),
            "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received the value '10' of type 'signedint' but current is none"
        );
    }

    #[test]
    fn arguments_integer_widths_are_equivalent_and_unknown_keys_ignored() {
        let mut received = FieldTable::default();
        received.insert("x-message-ttl".into(), AMQPValue::LongLongInt(500));
        received.insert("custom".into(), AMQPValue::Boolean(true));
        let mut current = FieldTable::default();
        current.insert("x-message-ttl".into(), AMQPValue::ShortInt(500));
        assert!(
            check_equivalence(QUEUE_EQUIVALENCE_KEYS, &received, &current, "queue 'q'").is_ok()
        );
    }
}
