//! Queue length limits (`x-max-length`, `x-max-length-bytes`, `x-overflow`),
//! read from the queue's effective arguments when it is created and again
//! when a policy changes them: the declaration's, merged with its policy's
//! (see [`crate::policy`]). The arguments were validated by
//! [`crate::arguments::check_queue_arguments`] (and policy values when the
//! policy was set), so reading cannot fail.

use amq_protocol::types::FieldTable;

use crate::arguments::{as_strict_integer, as_text};

/// What a full queue does with a new message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Overflow {
    /// Drop the oldest ready messages to make room (RabbitMQ's default).
    #[default]
    DropHead,
    /// Refuse the new message: nacked to confirming publishers.
    RejectPublish,
    /// As reject-publish, and the refused message is dead-lettered
    /// (reason `maxlen`) when the queue has a dead-letter exchange.
    RejectPublishDlx,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueLimits {
    pub max_length: Option<u64>,
    pub max_length_bytes: Option<u64>,
    pub overflow: Overflow,
}

impl QueueLimits {
    /// Reads the limits from a queue's effective arguments. A value that is
    /// not valid (only possible in definitions written by hand) means no
    /// limit, as validation would have refused it at declaration.
    pub fn from_arguments(arguments: &FieldTable) -> Self {
        let non_negative = |key: &str| {
            arguments
                .inner()
                .get(key)
                .and_then(as_strict_integer)
                .and_then(|number| u64::try_from(number).ok())
        };
        let overflow = match arguments
            .inner()
            .get("x-overflow")
            .and_then(as_text)
            .as_deref()
        {
            Some("reject-publish") => Overflow::RejectPublish,
            Some("reject-publish-dlx") => Overflow::RejectPublishDlx,
            _ => Overflow::DropHead,
        };
        QueueLimits {
            max_length: non_negative("x-max-length"),
            max_length_bytes: non_negative("x-max-length-bytes"),
            overflow,
        }
    }

    pub fn is_limited(&self) -> bool {
        self.max_length.is_some() || self.max_length_bytes.is_some()
    }

    /// Whether a queue holding `length` ready messages of `bytes` body bytes
    /// is over its limits.
    pub fn exceeded(&self, length: u64, bytes: u64) -> bool {
        self.max_length.is_some_and(|max| length > max)
            || self.max_length_bytes.is_some_and(|max| bytes > max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use amq_protocol::types::AMQPValue;

    #[test]
    fn queue_limits_read_effective_arguments() {
        let mut arguments = FieldTable::default();
        arguments.insert("x-max-length".into(), AMQPValue::LongInt(2));
        arguments.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        let limits = QueueLimits::from_arguments(&arguments);
        assert_eq!(limits.max_length, Some(2));
        assert_eq!(limits.max_length_bytes, None);
        assert_eq!(limits.overflow, Overflow::RejectPublish);
        assert!(limits.exceeded(3, 0));
        assert!(!limits.exceeded(2, 0));
        assert_eq!(
            QueueLimits::from_arguments(&FieldTable::default()),
            QueueLimits::default()
        );
    }
}
