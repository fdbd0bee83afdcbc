//! Declaration arguments: validation of a new queue's arguments, equivalence
//! on redeclaration, and RabbitMQ's way of printing them in errors.
//!
//! Validation follows RabbitMQ 3.10's `rabbit_amqqueue:check_declare_arguments`:
//! the same keys in the same order, and the same error terms after
//! `invalid arg 'KEY' for queue 'Q' in vhost 'V': `, so that a client (or a
//! person) matching on RabbitMQ's texts sees the same thing here.

use amq_protocol::types::{AMQPValue, FieldTable};

use crate::error::{AmqpError, AmqpResult};
use crate::queue_type::QueueType;

/// The longest TTL or expiry RabbitMQ accepts, in milliseconds: the limit
/// of Erlang's timers, which RabbitMQ checks even where it does not use one.
pub const EXPIRY_MS_MAX: u64 = 4_294_967_295;

/// The highest `x-max-priority` RabbitMQ accepts (`?MAX_SUPPORTED_PRIORITY`).
pub const MAX_PRIORITY_MAX: i64 = 255;

const OVERFLOW_MODES: &[&str] = &["drop-head", "reject-publish", "reject-publish-dlx"];
const DEAD_LETTER_STRATEGIES: &[&str] = &["at-most-once", "at-least-once"];
const QUEUE_MODES: &[&str] = &["default", "lazy"];

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

/// The integer in an argument whose type RabbitMQ counts as an integer
/// (`?INTEGER_ARG_TYPES`): every signed and unsigned width, but not a
/// timestamp.
pub fn as_strict_integer(value: &AMQPValue) -> Option<i64> {
    match value {
        AMQPValue::Timestamp(_) => None,
        other => as_integer(other),
    }
}

/// The text of a string argument (RabbitMQ reads both string kinds as longstr).
pub fn as_text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(text) => Some(String::from_utf8_lossy(text.as_bytes()).into_owned()),
        AMQPValue::ShortString(text) => Some(text.as_str().to_owned()),
        _ => None,
    }
}

/// Why an argument was refused, printed as RabbitMQ prints the Erlang term
/// (`~p`) after `invalid arg 'KEY' for ...: `.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgumentError {
    /// `"expected integer, got TYPE"` (a string, so quoted).
    ExpectedInteger(&'static str),
    /// `{unacceptable_type,TYPE}`
    UnacceptableType(&'static str),
    /// `{value_negative,N}`
    ValueNegative(i64),
    /// `{value_zero,0}`
    ValueZero,
    /// `{value_too_big,N}`
    ValueTooBig(i64),
    /// `{max_value_exceeded,N}`
    MaxValueExceeded(i64),
    /// `routing_key_but_no_dlx_defined`
    RoutingKeyButNoDlx,
    /// `invalid_overflow`
    InvalidOverflow,
    /// `invalid_dlx_strategy`
    InvalidDeadLetterStrategy,
    /// `"unsupported queue mode 'MODE'"`
    UnsupportedQueueMode(String),
    /// `"unsupported queue type 'TYPE'"`
    UnsupportedQueueType(String),
    /// A queue type RabbitMQ knows but this node cannot create yet.
    QueueTypeNotSupportedHere(String),
    /// `"unsupported queue leader locator 'NAME'"`
    UnsupportedLeaderLocator(String),
}

impl std::fmt::Display for ArgumentError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArgumentError::ExpectedInteger(kind) => {
                write!(formatter, "\"expected integer, got {kind}\"")
            }
            ArgumentError::UnacceptableType(kind) => {
                write!(formatter, "{{unacceptable_type,{kind}}}")
            }
            ArgumentError::ValueNegative(value) => write!(formatter, "{{value_negative,{value}}}"),
            ArgumentError::ValueZero => write!(formatter, "{{value_zero,0}}"),
            ArgumentError::ValueTooBig(value) => write!(formatter, "{{value_too_big,{value}}}"),
            ArgumentError::MaxValueExceeded(value) => {
                write!(formatter, "{{max_value_exceeded,{value}}}")
            }
            ArgumentError::RoutingKeyButNoDlx => {
                write!(formatter, "routing_key_but_no_dlx_defined")
            }
            ArgumentError::InvalidOverflow => write!(formatter, "invalid_overflow"),
            ArgumentError::InvalidDeadLetterStrategy => write!(formatter, "invalid_dlx_strategy"),
            ArgumentError::UnsupportedQueueMode(mode) => {
                write!(formatter, "\"unsupported queue mode '{mode}'\"")
            }
            ArgumentError::UnsupportedQueueType(kind) => {
                write!(formatter, "\"unsupported queue type '{kind}'\"")
            }
            ArgumentError::UnsupportedLeaderLocator(name) => {
                write!(formatter, "\"unsupported queue leader locator '{name}'\"")
            }
            ArgumentError::QueueTypeNotSupportedHere(kind) => write!(
                formatter,
                "queue type '{kind}' is not supported by this node (supported: {})",
                QueueType::supported_names().join(", ")
            ),
        }
    }
}

type Check = fn(&AMQPValue, &FieldTable) -> Result<(), ArgumentError>;

/// queue.declare arguments RabbitMQ validates, in the order it checks them:
/// the first failing key is the one reported.
const DECLARE_CHECKS: &[(&str, Check)] = &[
    ("x-expires", check_expires),
    ("x-message-ttl", check_message_ttl),
    ("x-dead-letter-exchange", check_string),
    ("x-dead-letter-routing-key", check_dead_letter_routing_key),
    ("x-dead-letter-strategy", check_dead_letter_strategy),
    ("x-max-length", check_non_negative),
    ("x-max-length-bytes", check_non_negative),
    ("x-max-in-memory-length", check_non_negative),
    ("x-max-in-memory-bytes", check_non_negative),
    ("x-max-priority", check_max_priority),
    ("x-overflow", check_overflow),
    ("x-queue-mode", check_queue_mode),
    ("x-single-active-consumer", check_bool),
    ("x-queue-type", check_queue_type),
    ("x-quorum-initial-group-size", check_positive),
    ("x-queue-leader-locator", check_leader_locator),
];

/// basic.consume arguments RabbitMQ validates.
const CONSUME_CHECKS: &[(&str, Check)] = &[
    ("x-priority", check_integer),
    ("x-cancel-on-ha-failover", check_bool),
];

/// Validates the arguments of a queue about to be created. `what` is e.g.
/// `queue 'q' in vhost '/'`.
///
/// # Errors
/// 406 PRECONDITION_FAILED naming the first argument RabbitMQ would refuse.
pub fn check_queue_arguments(arguments: &FieldTable, what: &str) -> AmqpResult<()> {
    check_arguments(DECLARE_CHECKS, arguments, what)
}

/// Validates basic.consume arguments (`x-priority` must be an integer).
///
/// # Errors
/// 406 PRECONDITION_FAILED naming the argument.
pub fn check_consume_arguments(arguments: &FieldTable, what: &str) -> AmqpResult<()> {
    check_arguments(CONSUME_CHECKS, arguments, what)
}

fn check_arguments(checks: &[(&str, Check)], arguments: &FieldTable, what: &str) -> AmqpResult<()> {
    if arguments.inner().is_empty() {
        return Ok(());
    }
    for (key, check) in checks {
        if let Some(value) = arguments.inner().get(*key) {
            check(value, arguments).map_err(|error| {
                AmqpError::precondition_failed(format!("invalid arg '{key}' for {what}: {error}"))
            })?;
        }
    }
    Ok(())
}

/// RabbitMQ's `rabbit_misc:r_arg`: an argument naming an exchange
/// (`x-dead-letter-exchange`, `alternate-exchange`) must be a string, checked
/// before anything else is, with its own wording.
///
/// # Errors
/// 406 `invalid type 'TYPE' for arg 'KEY' in WHAT`.
pub fn check_exchange_name_argument(
    arguments: &FieldTable,
    key: &str,
    what: &str,
) -> AmqpResult<()> {
    match arguments.inner().get(key) {
        None | Some(AMQPValue::LongString(_)) | Some(AMQPValue::ShortString(_)) => Ok(()),
        Some(other) => Err(AmqpError::precondition_failed(format!(
            "invalid type '{}' for arg '{key}' in {what}",
            type_name(other)
        ))),
    }
}

fn check_integer(value: &AMQPValue, _: &FieldTable) -> Result<(), ArgumentError> {
    as_strict_integer(value)
        .map(|_| ())
        .ok_or(ArgumentError::ExpectedInteger(type_name(value)))
}

fn check_non_negative(value: &AMQPValue, _: &FieldTable) -> Result<(), ArgumentError> {
    match as_strict_integer(value) {
        Some(number) if number >= 0 => Ok(()),
        Some(number) => Err(ArgumentError::ValueNegative(number)),
        None => Err(ArgumentError::ExpectedInteger(type_name(value))),
    }
}

fn check_positive(value: &AMQPValue, arguments: &FieldTable) -> Result<(), ArgumentError> {
    check_non_negative(value, arguments)?;
    if as_strict_integer(value) == Some(0) {
        return Err(ArgumentError::ValueZero);
    }
    Ok(())
}

/// `rabbit_misc:check_expiry`.
pub fn check_expiry(milliseconds: i64) -> Result<(), ArgumentError> {
    if milliseconds < 0 {
        Err(ArgumentError::ValueNegative(milliseconds))
    } else if milliseconds as u64 > EXPIRY_MS_MAX {
        Err(ArgumentError::ValueTooBig(milliseconds))
    } else {
        Ok(())
    }
}

fn check_expires(value: &AMQPValue, _: &FieldTable) -> Result<(), ArgumentError> {
    match as_strict_integer(value) {
        Some(0) => Err(ArgumentError::ValueZero),
        Some(number) => check_expiry(number),
        None => Err(ArgumentError::ExpectedInteger(type_name(value))),
    }
}

fn check_message_ttl(value: &AMQPValue, _: &FieldTable) -> Result<(), ArgumentError> {
    match as_strict_integer(value) {
        Some(number) => check_expiry(number),
        None => Err(ArgumentError::ExpectedInteger(type_name(value))),
    }
}

fn check_max_priority(value: &AMQPValue, arguments: &FieldTable) -> Result<(), ArgumentError> {
    check_non_negative(value, arguments)?;
    match as_strict_integer(value) {
        Some(number) if number > MAX_PRIORITY_MAX => Err(ArgumentError::MaxValueExceeded(number)),
        _ => Ok(()),
    }
}

fn check_string(value: &AMQPValue, _: &FieldTable) -> Result<(), ArgumentError> {
    as_text(value)
        .map(|_| ())
        .ok_or(ArgumentError::UnacceptableType(type_name(value)))
}

fn check_bool(value: &AMQPValue, _: &FieldTable) -> Result<(), ArgumentError> {
    match value {
        AMQPValue::Boolean(_) => Ok(()),
        other => Err(ArgumentError::UnacceptableType(type_name(other))),
    }
}

fn check_dead_letter_routing_key(
    value: &AMQPValue,
    arguments: &FieldTable,
) -> Result<(), ArgumentError> {
    check_string(value, arguments)?;
    if arguments.inner().contains_key("x-dead-letter-exchange") {
        Ok(())
    } else {
        Err(ArgumentError::RoutingKeyButNoDlx)
    }
}

fn check_overflow(value: &AMQPValue, _: &FieldTable) -> Result<(), ArgumentError> {
    let text = as_text(value).ok_or(ArgumentError::UnacceptableType(type_name(value)))?;
    if OVERFLOW_MODES.contains(&text.as_str()) {
        Ok(())
    } else {
        Err(ArgumentError::InvalidOverflow)
    }
}

fn check_dead_letter_strategy(value: &AMQPValue, _: &FieldTable) -> Result<(), ArgumentError> {
    let text = as_text(value).ok_or(ArgumentError::UnacceptableType(type_name(value)))?;
    if DEAD_LETTER_STRATEGIES.contains(&text.as_str()) {
        Ok(())
    } else {
        Err(ArgumentError::InvalidDeadLetterStrategy)
    }
}

fn check_queue_mode(value: &AMQPValue, _: &FieldTable) -> Result<(), ArgumentError> {
    let text = as_text(value).ok_or(ArgumentError::UnacceptableType(type_name(value)))?;
    if QUEUE_MODES.contains(&text.as_str()) {
        Ok(())
    } else {
        Err(ArgumentError::UnsupportedQueueMode(text))
    }
}

fn check_leader_locator(value: &AMQPValue, _: &FieldTable) -> Result<(), ArgumentError> {
    let text = as_text(value).ok_or(ArgumentError::UnacceptableType(type_name(value)))?;
    match crate::queue_location::QueueLocator::parse(&text) {
        Some(_) => Ok(()),
        None => Err(ArgumentError::UnsupportedLeaderLocator(text)),
    }
}

fn check_queue_type(value: &AMQPValue, _: &FieldTable) -> Result<(), ArgumentError> {
    let text = as_text(value).ok_or(ArgumentError::UnacceptableType(type_name(value)))?;
    match QueueType::parse(&text) {
        Some(kind) if kind.is_supported() => Ok(()),
        Some(_) => Err(ArgumentError::QueueTypeNotSupportedHere(text)),
        None => Err(ArgumentError::UnsupportedQueueType(text)),
    }
}

/// Checks a message's `expiration` property as RabbitMQ does at publish
/// (`rabbit_basic:parse_expiration`): an optionally signed decimal integer
/// of milliseconds and nothing else, within [`check_expiry`]'s range.
///
/// # Errors
/// 406 `invalid expiration 'TEXT': REASON`, a channel error.
pub fn check_expiration_property(expiration: &[u8]) -> AmqpResult<()> {
    let text = String::from_utf8_lossy(expiration);
    let reason = match parse_expiration(&text) {
        Ok(_) => return Ok(()),
        Err(reason) => reason,
    };
    Err(AmqpError::precondition_failed(format!(
        "invalid expiration '{text}': {reason}"
    )))
}

/// The expiration in milliseconds, or RabbitMQ's reason for refusing it,
/// printed as the Erlang term.
pub fn parse_expiration(text: &str) -> Result<u64, String> {
    // Erlang's string:to_integer: an optional sign, then digits; whatever
    // follows the digits is "leftover".
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let digits_end = unsigned
        .bytes()
        .position(|byte| !byte.is_ascii_digit())
        .unwrap_or(unsigned.len());
    if digits_end == 0 {
        return Err("no_integer".to_owned());
    }
    let (digits, leftover) = unsigned.split_at(digits_end);
    if !leftover.is_empty() {
        return Err(format!("{{leftover_string,{leftover:?}}}"));
    }
    // Erlang integers are unbounded: print the value without leading zeros,
    // however long.
    let trimmed = digits.trim_start_matches('0');
    let magnitude = if trimmed.is_empty() { "0" } else { trimmed };
    let printed = if negative && magnitude != "0" {
        format!("-{magnitude}")
    } else {
        magnitude.to_owned()
    };
    if negative && magnitude != "0" {
        return Err(format!("{{value_negative,{printed}}}"));
    }
    match magnitude.parse::<u64>() {
        Ok(value) if value <= EXPIRY_MS_MAX => Ok(value),
        _ => Err(format!("{{value_too_big,{printed}}}")),
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
            error.reply_text().as_str(),
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

    #[test]
    fn arguments_expiration_parses_like_erlang_to_integer() {
        assert_eq!(parse_expiration("60000"), Ok(60_000));
        assert_eq!(parse_expiration("+5"), Ok(5));
        assert_eq!(parse_expiration("-0"), Ok(0));
        assert_eq!(parse_expiration(""), Err("no_integer".to_owned()));
        assert_eq!(parse_expiration(" 5"), Err("no_integer".to_owned()));
        assert_eq!(
            parse_expiration("5 "),
            Err("{leftover_string,\" \"}".to_owned())
        );
        assert_eq!(
            parse_expiration("-007"),
            Err("{value_negative,-7}".to_owned())
        );
        assert_eq!(
            parse_expiration("0099999999999999999999"),
            Err("{value_too_big,99999999999999999999}".to_owned())
        );
        assert_eq!(parse_expiration("4294967295"), Ok(EXPIRY_MS_MAX));
    }

    #[test]
    fn arguments_declare_checks_report_the_first_key_in_rabbitmq_order() {
        let mut arguments = FieldTable::default();
        arguments.insert("x-max-priority".into(), AMQPValue::LongInt(300));
        arguments.insert("x-message-ttl".into(), AMQPValue::Timestamp(5));
        let error = check_queue_arguments(&arguments, "queue 'q' in vhost '/'").unwrap_err();
        assert_eq!(
            error.reply_text().as_str(),
            "PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue 'q' in vhost '/': \"expected integer, got timestamp\""
        );
        arguments.insert("x-message-ttl".into(), AMQPValue::LongInt(5));
        let error = check_queue_arguments(&arguments, "queue 'q' in vhost '/'").unwrap_err();
        assert!(
            error.text.ends_with("{max_value_exceeded,300}"),
            "{}",
            error.text
        );
        let mut stream = FieldTable::default();
        stream.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("stream".into()),
        );
        let error = check_queue_arguments(&stream, "queue 'q' in vhost '/'").unwrap_err();
        assert!(
            error.text.contains("not supported by this node"),
            "{}",
            error.text
        );
    }
}
