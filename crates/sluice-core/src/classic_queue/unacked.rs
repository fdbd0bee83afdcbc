//! The messages a classic queue delivered and has not had settled, by
//! offset: channels settle, requeue and reject them by that id.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::message::QueuedMessage;

/// Hashes a queue offset. Offsets are unique and mostly consecutive, so a
/// multiplication spreads them over the table's buckets and its control
/// bits alike (Fibonacci hashing); SipHash's protection against chosen
/// keys buys nothing for numbers the queue hands out itself.
#[derive(Default)]
pub(super) struct OffsetHasher(u64);

/// 2^64 divided by the golden ratio.
const FIBONACCI_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for OffsetHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*byte)).wrapping_mul(FIBONACCI_MULTIPLIER);
        }
    }

    fn write_u64(&mut self, offset: u64) {
        self.0 = offset.wrapping_mul(FIBONACCI_MULTIPLIER);
    }
}

/// Messages out with consumers. Bounded by the consumers' prefetch, and
/// for consumers without prefetch by what their channels can buffer.
#[derive(Default)]
pub(super) struct Unacked {
    messages: HashMap<u64, QueuedMessage, BuildHasherDefault<OffsetHasher>>,
}

impl Unacked {
    pub(super) fn insert(&mut self, entry: QueuedMessage) {
        self.messages.insert(entry.offset, entry);
    }

    /// The message with this offset, if it is still out: a channel may
    /// settle a message of a queue that was purged or deleted since.
    pub(super) fn remove(&mut self, offset: u64) -> Option<QueuedMessage> {
        self.messages.remove(&offset)
    }

    pub(super) fn len(&self) -> usize {
        self.messages.len()
    }

    pub(super) fn clear(&mut self) {
        self.messages.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use sluice_wire::content::RawProperties;

    use super::*;
    use crate::message::Message;

    fn entry(offset: u64) -> QueuedMessage {
        QueuedMessage {
            offset,
            message: Arc::new(Message {
                exchange: Bytes::new(),
                routing_key: Bytes::new(),
                properties: RawProperties::default(),
                body: Bytes::from_static(b"x"),
            }),
            redelivered: false,
            segment: None,
            expires_at_us: 0,
        }
    }

    #[test]
    fn unacked_messages_are_taken_back_once_by_offset() {
        let mut unacked = Unacked::default();
        for offset in [7, 3, 1_000_000, 4] {
            unacked.insert(entry(offset));
        }
        assert_eq!(unacked.len(), 4);
        assert_eq!(unacked.remove(3).map(|entry| entry.offset), Some(3));
        assert!(unacked.remove(3).is_none(), "settled twice");
        assert!(unacked.remove(5).is_none(), "never delivered");
        assert_eq!(unacked.len(), 3);
        unacked.clear();
        assert_eq!(unacked.len(), 0);
    }
}
