//! Message TTL (`x-message-ttl`, the `expiration` property) and queue
//! expiry (`x-expires`): the settings a queue reads from its effective
//! arguments, and the clock their deadlines are measured on.
//!
//! Deadlines are microseconds on a monotonic clock that starts with the
//! process, so that a wall-clock step never expires messages early or late.
//! [`NEVER`] marks a message without one: comparing it with the clock needs
//! no special case.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use amq_protocol::types::FieldTable;

use crate::arguments::{as_strict_integer, parse_expiration};
use crate::message::Message;

/// The deadline of a message that never expires.
pub const NEVER: u64 = u64::MAX;

const MICROS_PER_MILLI: u64 = 1000;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Now, in microseconds on the deadline clock.
pub fn now_us() -> u64 {
    epoch().elapsed().as_micros() as u64
}

/// Milliseconds since the Unix epoch, the clock a deadline is saved in:
/// the deadline clock starts again with each process.
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// A deadline as the wall-clock time it falls at, to save with a message.
pub fn wall_ms_of(deadline_us: u64) -> u64 {
    let remaining_ms = deadline_us
        .saturating_sub(now_us())
        .div_ceil(MICROS_PER_MILLI);
    wall_ms().saturating_add(remaining_ms)
}

/// A saved wall-clock deadline on this process's deadline clock: one that
/// passed while the node was down is due now.
pub fn deadline_of_wall_ms(wall_deadline_ms: u64) -> u64 {
    let remaining_ms = wall_deadline_ms.saturating_sub(wall_ms());
    now_us()
        .saturating_add(remaining_ms.saturating_mul(MICROS_PER_MILLI))
        .min(NEVER - 1)
}

/// The instant a deadline falls at, for timers.
pub fn instant_of(deadline_us: u64) -> Instant {
    epoch() + Duration::from_micros(deadline_us)
}

/// What a queue does with time, read from its effective arguments when it
/// is made and when a policy changes them (declared merged with policy;
/// validated, so reading cannot fail).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueExpiry {
    /// `x-message-ttl`: how long a message may wait in the queue.
    pub message_ttl_us: Option<u64>,
    /// `x-expires`: how long the queue may go unused before it is deleted.
    pub expires_us: Option<u64>,
}

impl QueueExpiry {
    pub fn from_arguments(arguments: &FieldTable) -> Self {
        let milliseconds = |key: &str| {
            arguments
                .inner()
                .get(key)
                .and_then(as_strict_integer)
                .and_then(|number| u64::try_from(number).ok())
                .map(|number| number.saturating_mul(MICROS_PER_MILLI))
        };
        QueueExpiry {
            message_ttl_us: milliseconds("x-message-ttl"),
            expires_us: milliseconds("x-expires").filter(|expires| *expires > 0),
        }
    }

    /// Whether messages in this queue can expire without carrying an
    /// expiration of their own.
    pub fn has_message_ttl(&self) -> bool {
        self.message_ttl_us.is_some()
    }

    /// When a message entering the queue now expires: the lower of the
    /// queue's TTL and the message's own expiration, as RabbitMQ takes it.
    /// Only called for a queue with a TTL or a message with an expiration.
    pub fn deadline_of(&self, message: &Message, now_us: u64) -> u64 {
        let own = message
            .properties
            .expiration()
            .and_then(|text| std::str::from_utf8(text).ok())
            .and_then(|text| parse_expiration(text).ok())
            .map(|milliseconds| milliseconds.saturating_mul(MICROS_PER_MILLI));
        let ttl = match (self.message_ttl_us, own) {
            (Some(queue), Some(own)) => queue.min(own),
            (Some(ttl), None) | (None, Some(ttl)) => ttl,
            (None, None) => return NEVER,
        };
        now_us.saturating_add(ttl).min(NEVER - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use amq_protocol::protocol::basic::AMQPProperties;
    use amq_protocol::types::AMQPValue;
    use bytes::Bytes;
    use sluice_wire::content::RawProperties;

    fn message_expiring_in(expiration: Option<&str>) -> Message {
        let mut properties = AMQPProperties::default();
        if let Some(expiration) = expiration {
            properties = properties.with_expiration(expiration.into());
        }
        Message {
            exchange: Bytes::new(),
            routing_key: Bytes::new(),
            properties: RawProperties::from_properties(&properties),
            body: Bytes::new(),
        }
    }

    #[test]
    fn expiry_deadlines_saved_as_wall_clock_time_come_back_on_the_deadline_clock() {
        let now = now_us();
        let in_a_minute = now + 60_000 * MICROS_PER_MILLI;
        let back = deadline_of_wall_ms(wall_ms_of(in_a_minute));
        // Saved in whole milliseconds; the two clocks are read apart, and a
        // loaded machine may run something else in between.
        let slack = 500 * MICROS_PER_MILLI;
        assert!(back >= in_a_minute - slack, "{back} vs {in_a_minute}");
        assert!(back <= in_a_minute + slack, "{back} vs {in_a_minute}");
        // A deadline that passed while the node was down is due at once.
        let passed = deadline_of_wall_ms(wall_ms() - 10_000);
        assert!(passed <= now_us());
    }

    #[test]
    fn expiry_the_lower_of_queue_ttl_and_expiration_applies() {
        let mut arguments = FieldTable::default();
        arguments.insert("x-message-ttl".into(), AMQPValue::LongInt(100));
        arguments.insert("x-expires".into(), AMQPValue::LongLongInt(2000));
        let expiry = QueueExpiry::from_arguments(&arguments);
        assert_eq!(expiry.message_ttl_us, Some(100_000));
        assert_eq!(expiry.expires_us, Some(2_000_000));
        let now = 5;
        assert_eq!(expiry.deadline_of(&message_expiring_in(None), now), 100_005);
        assert_eq!(
            expiry.deadline_of(&message_expiring_in(Some("20")), now),
            20_005
        );
        assert_eq!(
            expiry.deadline_of(&message_expiring_in(Some("500")), now),
            100_005
        );
        let untimed = QueueExpiry::default();
        assert_eq!(untimed.deadline_of(&message_expiring_in(None), now), NEVER);
        assert_eq!(
            untimed.deadline_of(&message_expiring_in(Some("0")), now),
            now
        );
    }
}
