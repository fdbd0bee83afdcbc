//! Queue length limits (`x-max-length`, `x-max-length-bytes`, `x-overflow`),
//! parsed and validated once at declaration.

use amq_protocol::types::{AMQPValue, FieldTable};

use crate::arguments::{as_integer, type_name};
use crate::error::{AmqpError, AmqpResult};

/// What a full queue does with a new message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Overflow {
    /// Drop the oldest ready messages to make room (RabbitMQ's default).
    #[default]
    DropHead,
    /// Refuse the new message: nacked to confirming publishers.
    RejectPublish,
    /// As reject-publish; dead-lettering of the refused message comes with
    /// dead-letter exchanges.
    RejectPublishDlx,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueLimits {
    pub max_length: Option<u64>,
    pub max_length_bytes: Option<u64>,
    pub overflow: Overflow,
}

impl QueueLimits {
    /// Reads the limits from declaration arguments; a wrong type or value is
    /// refused with 406 naming the argument, as RabbitMQ does.
    pub fn from_arguments(arguments: &FieldTable, what: &str) -> AmqpResult<Self> {
        let non_negative = |key: &str| -> AmqpResult<Option<u64>> {
            let Some(value) = arguments.inner().get(key) else {
                return Ok(None);
            };
            match as_integer(value) {
                Some(number) if number >= 0 => Ok(Some(number as u64)),
                Some(number) => Err(AmqpError::precondition_failed(format!(
                    "invalid arg '{key}' for {what}: {{value_negative,{number}}}"
                ))),
                None => Err(AmqpError::precondition_failed(format!(
                    "invalid arg '{key}' for {what}: {{unacceptable_type,{}}}",
                    type_name(value)
                ))),
            }
        };
        let overflow = match arguments.inner().get("x-overflow") {
            None => Overflow::DropHead,
            Some(value) => {
                let text = match value {
                    AMQPValue::LongString(text) => {
                        String::from_utf8_lossy(text.as_bytes()).into_owned()
                    }
                    AMQPValue::ShortString(text) => text.as_str().to_owned(),
                    other => {
                        return Err(AmqpError::precondition_failed(format!(
                            "invalid arg 'x-overflow' for {what}: {{unacceptable_type,{}}}",
                            type_name(other)
                        )))
                    }
                };
                match text.as_str() {
                    "drop-head" => Overflow::DropHead,
                    "reject-publish" => Overflow::RejectPublish,
                    "reject-publish-dlx" => Overflow::RejectPublishDlx,
                    _ => {
                        return Err(AmqpError::precondition_failed(format!(
                            "invalid arg 'x-overflow' for {what}: {{unacceptable_value,<<\"{text}\">>}}"
                        )))
                    }
                }
            }
        };
        Ok(QueueLimits {
            max_length: non_negative("x-max-length")?,
            max_length_bytes: non_negative("x-max-length-bytes")?,
            overflow,
        })
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

    #[test]
    fn queue_limits_parse_and_validate() {
        let mut arguments = FieldTable::default();
        arguments.insert("x-max-length".into(), AMQPValue::LongInt(2));
        arguments.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        let limits = QueueLimits::from_arguments(&arguments, "queue 'q'").unwrap();
        assert_eq!(limits.max_length, Some(2));
        assert_eq!(limits.overflow, Overflow::RejectPublish);
        assert!(limits.exceeded(3, 0));
        assert!(!limits.exceeded(2, 0));

        arguments.insert("x-max-length".into(), AMQPValue::LongInt(-1));
        let error = QueueLimits::from_arguments(&arguments, "queue 'q'").unwrap_err();
        assert!(error.text.contains("'x-max-length'"), "{}", error.text);
        arguments.insert("x-max-length".into(), AMQPValue::LongString("ten".into()));
        assert!(QueueLimits::from_arguments(&arguments, "queue 'q'").is_err());
        let mut arguments = FieldTable::default();
        arguments.insert("x-overflow".into(), AMQPValue::LongString("explode".into()));
        assert!(QueueLimits::from_arguments(&arguments, "queue 'q'").is_err());
    }
}
