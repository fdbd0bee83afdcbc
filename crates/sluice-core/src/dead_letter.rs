//! Dead-lettering: the copy of a message a queue republishes to its
//! dead-letter exchange when the message is rejected, expires or is dropped
//! for length, with the `x-death` history RabbitMQ 3.10 writes
//! (`rabbit_dead_letter:make_msg/5`), and its cycle detection
//! (`detect_cycles/3`).
//!
//! A queue collects what it dead-letters under its lock and hands it to
//! the vhost (its `QueueHost::dead_letter`) after releasing it: routing
//! publishes into other queues, possibly the same one.
//!
//! Field tables are encoded with their keys sorted (amq-protocol keeps them
//! in a `BTreeMap`). RabbitMQ sorts a merged x-death entry too, but writes
//! a new one as `count, reason, queue, time, exchange, routing-keys`;
//! clients read tables by key, so only the byte order differs.

use std::collections::BTreeMap;
use std::sync::Arc;

use amq_protocol::protocol::basic::AMQPProperties;
use amq_protocol::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use bytes::Bytes;
use sluice_wire::content::RawProperties;

use crate::arguments::as_text;
use crate::message::Message;
use crate::sender_selected::{header_routes, text_bytes};

/// Why a message was dead-lettered: the `reason` of its `x-death` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeathReason {
    /// basic.reject or basic.nack with requeue=false.
    Rejected,
    /// Its TTL ran out at the head of the queue.
    Expired,
    /// Dropped by `x-max-length`/`x-max-length-bytes`: the oldest under
    /// drop-head, the new one under reject-publish-dlx.
    Maxlen,
    /// Returned more often than a quorum queue's `x-delivery-limit`.
    DeliveryLimit,
}

impl DeathReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeathReason::Rejected => "rejected",
            DeathReason::Expired => "expired",
            DeathReason::Maxlen => "maxlen",
            DeathReason::DeliveryLimit => "delivery_limit",
        }
    }
}

/// A message leaving a queue for its dead-letter exchange.
pub struct DeadLetter {
    pub message: Arc<Message>,
    pub reason: DeathReason,
}

/// Where a queue dead-letters: `x-dead-letter-exchange` and
/// `x-dead-letter-routing-key` from its effective arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterTarget {
    /// May be empty: the default exchange, routing by queue name.
    pub exchange: Arc<str>,
    /// Replaces the message's routing keys (and drops its CC header).
    pub routing_key: Option<Bytes>,
}

impl DeadLetterTarget {
    pub fn from_arguments(arguments: &FieldTable) -> Option<Self> {
        let exchange = arguments
            .inner()
            .get("x-dead-letter-exchange")
            .and_then(as_text)?;
        let routing_key = arguments
            .inner()
            .get("x-dead-letter-routing-key")
            .and_then(as_text)
            .map(Bytes::from);
        Some(DeadLetterTarget {
            exchange: Arc::from(exchange),
            routing_key,
        })
    }
}

/// A dead-lettered copy, ready to route.
pub struct DeadLettered {
    pub message: Message,
    /// The keys to route it with from the dead-letter exchange, first one
    /// the message's routing key.
    pub routing_keys: Vec<Bytes>,
    /// Its headers, for a headers exchange and for cycle detection.
    pub headers: FieldTable,
}

fn long_string(bytes: &[u8]) -> AMQPValue {
    AMQPValue::LongString(LongString::from(bytes.to_vec()))
}

fn entry_text<'a>(entry: &'a FieldTable, key: &str) -> Option<&'a [u8]> {
    entry.inner().get(key).and_then(text_bytes)
}

/// Adds this death to the `x-death` header as RabbitMQ 3.10 does: the
/// entry for the same queue and reason has its count incremented (and
/// keeps its other fields) and moves to the front; otherwise a new entry
/// with count 1 goes in front. The first death also sets the
/// `x-first-death-*` headers. A header of another type is replaced.
fn add_death(
    headers: &mut BTreeMap<ShortString, AMQPValue>,
    info: FieldTable,
    queue: &str,
    reason: &str,
) {
    let previous = headers.remove("x-death");
    let mut deaths: Vec<AMQPValue> = match previous {
        Some(AMQPValue::FieldArray(array)) => array.as_slice().to_vec(),
        Some(other) => {
            tracing::warn!(header = ?other, "a message has an invalid x-death header; it is reset");
            Vec::new()
        }
        None => {
            let exchange = entry_text(&info, "exchange").unwrap_or_default();
            headers.insert(
                "x-first-death-reason".into(),
                long_string(reason.as_bytes()),
            );
            headers.insert("x-first-death-queue".into(), long_string(queue.as_bytes()));
            headers.insert("x-first-death-exchange".into(), long_string(exchange));
            Vec::new()
        }
    };
    let matching = deaths.iter().position(|death| match death {
        AMQPValue::FieldTable(entry) => {
            entry_text(entry, "queue") == Some(queue.as_bytes())
                && entry_text(entry, "reason") == Some(reason.as_bytes())
        }
        _ => false,
    });
    let entry = match matching {
        Some(index) => {
            let AMQPValue::FieldTable(existing) = deaths.remove(index) else {
                unreachable!("the matching death is a table");
            };
            let mut entry: BTreeMap<ShortString, AMQPValue> = existing.inner().clone();
            let count = match entry.get("count") {
                Some(AMQPValue::LongLongInt(count)) => count + 1,
                Some(other) => crate::arguments::as_strict_integer(other).unwrap_or(0) + 1,
                None => 1,
            };
            entry.insert("count".into(), AMQPValue::LongLongInt(count));
            FieldTable::from(entry)
        }
        None => {
            let mut entry: BTreeMap<ShortString, AMQPValue> = info.inner().clone();
            entry.insert("count".into(), AMQPValue::LongLongInt(1));
            FieldTable::from(entry)
        }
    };
    deaths.insert(0, AMQPValue::FieldTable(entry));
    headers.insert(
        "x-death".into(),
        AMQPValue::FieldArray(FieldArray::from(deaths)),
    );
}

/// Builds the dead-lettered copy of `message`, which died in `queue` for
/// `reason`, bound for `target`. `time_s` is the wall-clock time in seconds
/// (the `time` of the x-death entry, an AMQP timestamp).
pub fn dead_lettered(
    message: &Message,
    reason: DeathReason,
    queue: &str,
    target: &DeadLetterTarget,
    time_s: u64,
) -> DeadLettered {
    // The properties were validated on publish, so decoding cannot fail;
    // should it, the copy still goes, with only the x-death headers.
    let properties = message.properties.decode().unwrap_or_default();
    let mut headers: BTreeMap<ShortString, AMQPValue> = properties
        .headers()
        .as_ref()
        .map(|headers| headers.inner().clone())
        .unwrap_or_default();
    // A CC or BCC that is not an array was refused on publish.
    let cc_and_bcc = header_routes(&headers).unwrap_or_default();
    let mut death_keys = Vec::with_capacity(1 + cc_and_bcc.len());
    death_keys.push(long_string(&message.routing_key));
    death_keys.extend(cc_and_bcc.iter().map(|key| long_string(key)));
    let mut info = FieldTable::default();
    info.insert("reason".into(), long_string(reason.as_str().as_bytes()));
    info.insert("queue".into(), long_string(queue.as_bytes()));
    info.insert("time".into(), AMQPValue::Timestamp(time_s));
    info.insert("exchange".into(), long_string(&message.exchange));
    info.insert(
        "routing-keys".into(),
        AMQPValue::FieldArray(FieldArray::from(death_keys)),
    );
    if let Some(expiration) = properties.expiration() {
        info.insert(
            "original-expiration".into(),
            long_string(expiration.as_str().as_bytes()),
        );
    }
    add_death(&mut headers, info, queue, reason.as_str());
    let routing_keys = match &target.routing_key {
        Some(key) => {
            headers.remove("CC");
            vec![key.clone()]
        }
        None => {
            let mut keys = Vec::with_capacity(1 + cc_and_bcc.len());
            keys.push(message.routing_key.clone());
            keys.extend(cc_and_bcc);
            keys
        }
    };
    let headers = FieldTable::from(headers);
    let properties = copy_without_expiration(&properties).with_headers(headers.clone());
    DeadLettered {
        message: Message {
            exchange: Bytes::copy_from_slice(target.exchange.as_bytes()),
            routing_key: routing_keys[0].clone(),
            properties: RawProperties::from_properties(&properties),
            body: message.body.clone(),
        },
        routing_keys,
        headers,
    }
}

/// The properties without `expiration`, so the copy does not expire again
/// in the queues it lands in (RabbitMQ removes it since 3.1.2).
fn copy_without_expiration(properties: &AMQPProperties) -> AMQPProperties {
    let mut copy = AMQPProperties::default();
    if let Some(value) = properties.content_type() {
        copy = copy.with_content_type(value.clone());
    }
    if let Some(value) = properties.content_encoding() {
        copy = copy.with_content_encoding(value.clone());
    }
    if let Some(value) = properties.delivery_mode() {
        copy = copy.with_delivery_mode(*value);
    }
    if let Some(value) = properties.priority() {
        copy = copy.with_priority(*value);
    }
    if let Some(value) = properties.correlation_id() {
        copy = copy.with_correlation_id(value.clone());
    }
    if let Some(value) = properties.reply_to() {
        copy = copy.with_reply_to(value.clone());
    }
    if let Some(value) = properties.message_id() {
        copy = copy.with_message_id(value.clone());
    }
    if let Some(value) = properties.timestamp() {
        copy = copy.with_timestamp(*value);
    }
    if let Some(value) = properties.kind() {
        copy = copy.with_type(value.clone());
    }
    if let Some(value) = properties.user_id() {
        copy = copy.with_user_id(value.clone());
    }
    if let Some(value) = properties.app_id() {
        copy = copy.with_app_id(value.clone());
    }
    if let Some(value) = properties.cluster_id() {
        copy = copy.with_cluster_id(value.clone());
    }
    copy
}

/// Whether routing a copy that died for a reason other than `rejected`
/// back into `queue` closes a cycle RabbitMQ drops (`is_cycle/2`): the
/// queue appears in the copy's `x-death` (newest first) and no death from
/// the newest up to and including that one was a rejection. A cycle
/// through a consumer's reject is the application's choice and goes on.
pub fn is_cycle(queue: &str, headers: &FieldTable) -> bool {
    let Some(AMQPValue::FieldArray(deaths)) = headers.inner().get("x-death") else {
        return false;
    };
    for death in deaths.as_slice() {
        let AMQPValue::FieldTable(entry) = death else {
            // Something a client put there: not a fully automatic cycle.
            return false;
        };
        if entry_text(entry, "reason") == Some(DeathReason::Rejected.as_str().as_bytes()) {
            return false;
        }
        if entry_text(entry, "queue") == Some(queue.as_bytes()) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(properties: AMQPProperties) -> Message {
        Message {
            exchange: Bytes::from_static(b"orders"),
            routing_key: Bytes::from_static(b"new"),
            properties: RawProperties::from_properties(&properties),
            body: Bytes::from_static(b"body"),
        }
    }

    fn deaths(headers: &FieldTable) -> Vec<FieldTable> {
        match headers.inner().get("x-death") {
            Some(AMQPValue::FieldArray(array)) => array
                .as_slice()
                .iter()
                .map(|value| match value {
                    AMQPValue::FieldTable(table) => table.clone(),
                    other => panic!("not a table: {other:?}"),
                })
                .collect(),
            other => panic!("no x-death: {other:?}"),
        }
    }

    #[test]
    fn dead_letter_first_death_writes_x_death_and_first_death_headers() {
        let target = DeadLetterTarget {
            exchange: Arc::from("dlx"),
            routing_key: None,
        };
        let mut headers = FieldTable::default();
        headers.insert(
            "CC".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![long_string(b"copy")])),
        );
        let original = message(
            AMQPProperties::default()
                .with_expiration("60000".into())
                .with_headers(headers),
        );
        let copy = dead_lettered(
            &original,
            DeathReason::Expired,
            "work",
            &target,
            1_700_000_000,
        );
        assert_eq!(
            copy.routing_keys,
            vec![Bytes::from("new"), Bytes::from("copy")]
        );
        assert_eq!(&copy.message.exchange[..], b"dlx");
        let properties = copy.message.properties.decode().unwrap();
        assert_eq!(properties.expiration(), &None);
        let entries = deaths(&copy.headers);
        assert_eq!(entries.len(), 1);
        let entry = entries[0].inner();
        assert_eq!(entry.get("count"), Some(&AMQPValue::LongLongInt(1)));
        assert_eq!(entry.get("reason"), Some(&long_string(b"expired")));
        assert_eq!(entry.get("queue"), Some(&long_string(b"work")));
        assert_eq!(entry.get("exchange"), Some(&long_string(b"orders")));
        assert_eq!(
            entry.get("time"),
            Some(&AMQPValue::Timestamp(1_700_000_000))
        );
        assert_eq!(
            entry.get("original-expiration"),
            Some(&long_string(b"60000"))
        );
        assert_eq!(
            entry.get("routing-keys"),
            Some(&AMQPValue::FieldArray(FieldArray::from(vec![
                long_string(b"new"),
                long_string(b"copy")
            ])))
        );
        assert_eq!(
            copy.headers.inner().get("x-first-death-reason"),
            Some(&long_string(b"expired"))
        );
        assert_eq!(
            copy.headers.inner().get("x-first-death-exchange"),
            Some(&long_string(b"orders"))
        );
    }

    #[test]
    fn dead_letter_same_queue_and_reason_increments_the_count() {
        let target = DeadLetterTarget {
            exchange: Arc::from(""),
            routing_key: Some(Bytes::from_static(b"work")),
        };
        let first = dead_lettered(
            &message(AMQPProperties::default()),
            DeathReason::Rejected,
            "work",
            &target,
            1,
        );
        let second = dead_lettered(&first.message, DeathReason::Expired, "retry", &target, 2);
        let third = dead_lettered(&second.message, DeathReason::Rejected, "work", &target, 3);
        let entries = deaths(&third.headers);
        assert_eq!(entries.len(), 2);
        // The merged entry moved to the front, count 2, its first time kept.
        assert_eq!(entries[0].inner().get("queue"), Some(&long_string(b"work")));
        assert_eq!(
            entries[0].inner().get("count"),
            Some(&AMQPValue::LongLongInt(2))
        );
        assert_eq!(
            entries[0].inner().get("time"),
            Some(&AMQPValue::Timestamp(1))
        );
        assert_eq!(
            entries[1].inner().get("queue"),
            Some(&long_string(b"retry"))
        );
        // The first death's headers stay those of the first death.
        assert_eq!(
            third.headers.inner().get("x-first-death-queue"),
            Some(&long_string(b"work"))
        );
        assert_eq!(third.routing_keys, vec![Bytes::from("work")]);
    }

    #[test]
    fn dead_letter_cycles_without_a_rejection_are_detected() {
        let target = DeadLetterTarget {
            exchange: Arc::from(""),
            routing_key: None,
        };
        let expired = dead_lettered(
            &message(AMQPProperties::default()),
            DeathReason::Expired,
            "a",
            &target,
            1,
        );
        assert!(is_cycle("a", &expired.headers));
        assert!(!is_cycle("b", &expired.headers));
        let then_rejected = dead_lettered(&expired.message, DeathReason::Rejected, "b", &target, 2);
        let expired_again = dead_lettered(
            &then_rejected.message,
            DeathReason::Expired,
            "c",
            &target,
            3,
        );
        // c -> b (rejected) -> a: the rejection breaks the cycle back to a.
        assert!(!is_cycle("a", &expired_again.headers));
        assert!(is_cycle("c", &expired_again.headers));
    }
}
