//! A quorum queue's log entry: a batch of what one member proposed at
//! once, with the member's clock. One entry carries every message and
//! settlement the member gathered while its previous entry was being
//! committed, so the log grows by one entry per round trip, not per
//! message.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use sluice_wire::content::RawProperties;

use super::command::{Command, Reply};
use crate::message::Message;

/// Entries hold up to 2^16 items; an item's index in the machine is its
/// entry's index above these bits and its place in the entry below.
pub const ITEM_BITS: u32 = 16;

/// One entry of the queue's log.
#[derive(Debug, Serialize, Deserialize)]
pub struct Batch {
    /// The proposer's wall clock, milliseconds: the queue's time (TTL) is
    /// the log's, the same on every member.
    pub time_ms: u64,
    pub items: Vec<Item>,
}

/// One thing a batch does.
#[derive(Debug, Serialize, Deserialize)]
pub enum Item {
    /// A published message. `publisher` is the proposing member's id and
    /// the message's number there: a batch proposed again after a leader
    /// change does not enqueue it twice.
    Publish {
        publisher: (u64, u64),
        ttl_ms: Option<u64>,
        #[serde(with = "serde_bytes")]
        message: Vec<u8>,
    },
    /// Anything else the queue machine does.
    Machine(Command),
}

/// What applying a batch answered, item by item.
pub type BatchReply = Vec<Reply>;

pub fn encode<T: Serialize>(value: &T) -> Bytes {
    let mut bytes = Vec::new();
    ciborium::into_writer(value, &mut bytes).expect("encoding into memory cannot fail");
    Bytes::from(bytes)
}

pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    ciborium::from_reader(bytes).map_err(|error| error.to_string())
}

/// A message as a batch carries it: exchange, routing key, properties and
/// body, each after its length.
pub fn encode_message(message: &Message) -> Vec<u8> {
    let parts: [&[u8]; 4] = [
        &message.exchange,
        &message.routing_key,
        message.properties.as_bytes(),
        &message.body,
    ];
    let mut out = BytesMut::with_capacity(16 + parts.iter().map(|part| part.len()).sum::<usize>());
    for part in parts {
        out.put_u32(part.len() as u32);
        out.put_slice(part);
    }
    out.to_vec()
}

/// The message [`encode_message`] wrote; None for bytes it did not write.
pub fn decode_message(bytes: Vec<u8>) -> Option<Arc<Message>> {
    let mut bytes = Bytes::from(bytes);
    let mut part = || {
        if bytes.remaining() < 4 {
            return None;
        }
        let length = bytes.get_u32() as usize;
        (bytes.remaining() >= length).then(|| bytes.split_to(length))
    };
    let exchange = part()?;
    let routing_key = part()?;
    let properties = RawProperties::new(part()?).ok()?;
    let body = part()?;
    Some(Arc::new(Message {
        exchange,
        routing_key,
        properties,
        body,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_entry_messages_and_batches_round_trip() {
        let message = Message {
            exchange: Bytes::from_static(b"amq.direct"),
            routing_key: Bytes::from_static(b"key"),
            properties: RawProperties::new(Bytes::from_static(&[0, 0])).unwrap(),
            body: Bytes::from(vec![7u8; 1000]),
        };
        let batch = Batch {
            time_ms: 42,
            items: vec![
                Item::Publish {
                    publisher: (9, 1),
                    ttl_ms: Some(5),
                    message: encode_message(&message),
                },
                Item::Machine(Command::Purge),
            ],
        };
        let decoded: Batch = decode(&encode(&batch)).unwrap();
        assert_eq!(decoded.time_ms, 42);
        let Item::Publish {
            message: bytes,
            publisher,
            ttl_ms,
        } = &decoded.items[0]
        else {
            panic!("a publish first");
        };
        assert_eq!((*publisher, *ttl_ms), ((9, 1), Some(5)));
        let back = decode_message(bytes.clone()).unwrap();
        assert_eq!(back.exchange, message.exchange);
        assert_eq!(back.routing_key, message.routing_key);
        assert_eq!(back.body, message.body);
        assert!(matches!(decoded.items[1], Item::Machine(Command::Purge)));
        assert!(decode_message(vec![0, 0, 0, 9, 1]).is_none());
    }
}
