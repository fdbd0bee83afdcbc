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

/// A batch's first byte in the format [`Batch::encode`] writes: a plain
/// binary layout, since every member decodes every batch and a message's
/// bytes are most of it. Batches written as CBOR (by earlier versions, and
/// still in logs) never start with it: they start with a map's header.
const BATCH_FORMAT: u8 = 0;
const ITEM_PUBLISH: u8 = 1;
const ITEM_MACHINE: u8 = 2;

impl Batch {
    /// `BATCH_FORMAT time_ms:u64 items:u32`, then per item its tag and
    /// either `member:u64 number:u64 ttl:(0 | 1 u64) length:u32 message`
    /// or `length:u32 command-as-CBOR`.
    pub fn encode(&self) -> Bytes {
        let size = 13
            + self
                .items
                .iter()
                .map(|item| match item {
                    Item::Publish { message, .. } => 30 + message.len(),
                    Item::Machine(_) => 64,
                })
                .sum::<usize>();
        let mut out = BytesMut::with_capacity(size);
        out.put_u8(BATCH_FORMAT);
        out.put_u64(self.time_ms);
        out.put_u32(self.items.len() as u32);
        for item in &self.items {
            match item {
                Item::Publish {
                    publisher,
                    ttl_ms,
                    message,
                } => {
                    out.put_u8(ITEM_PUBLISH);
                    out.put_u64(publisher.0);
                    out.put_u64(publisher.1);
                    match ttl_ms {
                        None => out.put_u8(0),
                        Some(ttl) => {
                            out.put_u8(1);
                            out.put_u64(*ttl);
                        }
                    }
                    out.put_u32(message.len() as u32);
                    out.put_slice(message);
                }
                Item::Machine(command) => {
                    // Encoded in place, its length written over once known.
                    out.put_u8(ITEM_MACHINE);
                    let length_at = out.len();
                    out.put_u32(0);
                    ciborium::into_writer(command, (&mut out).writer())
                        .expect("encoding into memory cannot fail");
                    let length = (out.len() - length_at - 4) as u32;
                    out[length_at..length_at + 4].copy_from_slice(&length.to_be_bytes());
                }
            }
        }
        out.freeze()
    }

    /// Reads a batch in either format.
    ///
    /// # Errors
    /// Bytes that are no batch.
    pub fn decode(bytes: &[u8]) -> Result<Batch, String> {
        if bytes.first() != Some(&BATCH_FORMAT) {
            return decode(bytes);
        }
        let truncated = || "a truncated quorum queue entry".to_owned();
        let mut bytes = &bytes[1..];
        if bytes.remaining() < 12 {
            return Err(truncated());
        }
        let time_ms = bytes.get_u64();
        let count = bytes.get_u32() as usize;
        // Each item takes at least 5 bytes: no allocation beyond the input.
        let mut items = Vec::with_capacity(count.min(bytes.remaining() / 5));
        for _ in 0..count {
            if !bytes.has_remaining() {
                return Err(truncated());
            }
            let item = match bytes.get_u8() {
                ITEM_PUBLISH => {
                    if bytes.remaining() < 17 {
                        return Err(truncated());
                    }
                    let publisher = (bytes.get_u64(), bytes.get_u64());
                    let ttl_ms = match bytes.get_u8() {
                        0 => None,
                        _ if bytes.remaining() >= 8 => Some(bytes.get_u64()),
                        _ => return Err(truncated()),
                    };
                    Item::Publish {
                        publisher,
                        ttl_ms,
                        message: take_sized(&mut bytes).ok_or_else(truncated)?.to_vec(),
                    }
                }
                ITEM_MACHINE => {
                    Item::Machine(decode(take_sized(&mut bytes).ok_or_else(truncated)?)?)
                }
                other => return Err(format!("unknown quorum queue entry item {other}")),
            };
            items.push(item);
        }
        Ok(Batch { time_ms, items })
    }
}

/// The bytes after a `u32` length, and the rest after them.
fn take_sized<'a>(bytes: &mut &'a [u8]) -> Option<&'a [u8]> {
    if bytes.remaining() < 4 {
        return None;
    }
    let length = bytes.get_u32() as usize;
    let taken = bytes.get(..length)?;
    *bytes = &bytes[length..];
    Some(taken)
}

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
        let encoded = batch.encode();
        assert_eq!(encoded[0], BATCH_FORMAT);
        // Every prefix of it is refused, never misread.
        for cut in 0..encoded.len() {
            assert!(Batch::decode(&encoded[..cut]).is_err(), "cut at {cut}");
        }
        // A batch written as CBOR still reads.
        for decoded in [
            Batch::decode(&encoded).unwrap(),
            Batch::decode(&encode(&batch)).unwrap(),
        ] {
            check_round_trip(&decoded, &message);
        }
        assert!(decode_message(vec![0, 0, 0, 9, 1]).is_none());
    }

    fn check_round_trip(decoded: &Batch, message: &Message) {
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
    }
}
