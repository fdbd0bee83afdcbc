//! Queue kinds, as `x-queue-type` names them.

use amq_protocol::types::{AMQPValue, FieldTable};

/// The argument that chooses a queue's kind.
pub const QUEUE_TYPE_ARGUMENT: &str = "x-queue-type";

/// A kind of queue. RabbitMQ 3.10 knows these three; a node creates those
/// [`QueueType::is_supported`] says it can.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueType {
    /// One node's queue: messages in memory, paged to its journal.
    Classic,
    /// A Raft-replicated queue.
    Quorum,
    /// An append-only log read by offset.
    Stream,
}

impl QueueType {
    pub const ALL: [QueueType; 3] = [QueueType::Classic, QueueType::Quorum, QueueType::Stream];

    /// The kind a `x-queue-type` value names, as RabbitMQ spells it.
    pub fn parse(name: &str) -> Option<QueueType> {
        QueueType::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
            QueueType::Stream => "stream",
        }
    }

    /// Whether this node can create queues of this kind.
    pub fn is_supported(self) -> bool {
        matches!(self, QueueType::Classic | QueueType::Quorum)
    }

    /// The names of the kinds this node can create, for error texts.
    pub fn supported_names() -> Vec<&'static str> {
        QueueType::ALL
            .into_iter()
            .filter(|kind| kind.is_supported())
            .map(QueueType::as_str)
            .collect()
    }

    /// The kind a declaration's arguments ask for: classic when
    /// `x-queue-type` is absent, as in RabbitMQ 3.10; None for a value that
    /// names no kind (validation refuses it first).
    pub fn of_arguments(arguments: &FieldTable) -> Option<QueueType> {
        match arguments.inner().get(QUEUE_TYPE_ARGUMENT) {
            None => Some(QueueType::Classic),
            Some(value) => QueueType::of_value(value),
        }
    }

    /// The kind a string argument names; None for anything else.
    pub fn of_value(value: &AMQPValue) -> Option<QueueType> {
        match value {
            AMQPValue::LongString(name) => std::str::from_utf8(name.as_bytes())
                .ok()
                .and_then(QueueType::parse),
            AMQPValue::ShortString(name) => QueueType::parse(name.as_str()),
            _ => None,
        }
    }
}

impl std::fmt::Display for QueueType {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_type_names_round_trip_and_absence_means_classic() {
        for kind in QueueType::ALL {
            assert_eq!(QueueType::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(QueueType::parse("lazy"), None);
        assert_eq!(
            QueueType::of_arguments(&FieldTable::default()),
            Some(QueueType::Classic)
        );
        let mut quorum = FieldTable::default();
        quorum.insert(
            QUEUE_TYPE_ARGUMENT.into(),
            AMQPValue::LongString("quorum".into()),
        );
        assert_eq!(QueueType::of_arguments(&quorum), Some(QueueType::Quorum));
        assert_eq!(QueueType::supported_names(), vec!["classic", "quorum"]);
    }
}
