//! What nodes send each other about queues: operations a client's node
//! forwards to a queue's home node, and what comes back.
//!
//! Each node sends each peer one ordered stream of records on
//! [`FORWARD_CHANNEL`]: a record is a 4-byte length and an operation. The
//! stream is cut into link frames wherever a frame is full, so many small
//! operations share a frame and a large message spans several; the
//! receiver joins the frames back into the stream. Message bodies and
//! properties are carried as they are, and arrive as slices of the frame
//! that carried them.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use sluice_core::message::Message;
use sluice_core::queue::forwarding::{ConsumerKey, QueueKey, Settlement};
use sluice_wire::content::RawProperties;

/// The link channel that carries forwarded queue operations.
pub const FORWARD_CHANNEL: u16 = 2;

/// The largest record accepted: a message of the largest size a client may
/// publish (`max_message_size` is at most 512 MiB) with room for its
/// envelope. A longer length means a corrupt stream.
pub const RECORD_BYTES_MAX: usize = 512 * 1024 * 1024 + 64 * 1024;

/// One forwarded operation or its answer.
#[derive(Debug)]
pub enum Op {
    // From the client's node to the queue's home node.
    /// A message for one or more queues of the home node; answered in
    /// order by [`Op::Answers`].
    Publish {
        targets: Vec<QueueKey>,
        message: Arc<Message>,
    },
    Consume(ConsumeRequest),
    Cancel {
        consumer: u64,
    },
    /// The client's node took this many more deliveries off the link.
    Credit {
        consumer: u64,
        amount: u32,
    },
    Settle {
        key: QueueKey,
        settlement: Settlement,
        messages: Vec<u64>,
    },
    /// Consumers of quorum queue `key` whose member on the client's node
    /// left the queue's members: gone, what they held to go back.
    ConsumersGone {
        key: QueueKey,
        gone: Vec<ConsumerKey>,
    },
    Get {
        request: u64,
        key: QueueKey,
        no_ack: bool,
    },
    Purge {
        request: u64,
        key: QueueKey,
    },
    Stats {
        request: u64,
        key: QueueKey,
    },

    // From the home node back.
    /// Every publish up to and including the `through`-th of this link is
    /// answered: confirmed, except those in `refused`.
    Answers {
        through: u64,
        refused: Vec<u64>,
    },
    ConsumeOk {
        consumer: u64,
    },
    /// A consume or request refused with an AMQP reply.
    Failed {
        request: u64,
        code: u16,
        text: String,
    },
    Deliver {
        consumer: u64,
        message_id: u64,
        redelivered: bool,
        message: Arc<Message>,
    },
    /// The queue cancelled the consumer (it was deleted).
    Cancelled {
        consumer: u64,
    },
    GetOk {
        request: u64,
        message_id: u64,
        redelivered: bool,
        remaining: u32,
        message: Arc<Message>,
    },
    GetEmpty {
        request: u64,
    },
    Purged {
        request: u64,
        count: u32,
    },
    Counted {
        request: u64,
        messages: u32,
        consumers: u32,
    },
}

/// A remote basic.consume, with what the home node needs to make the
/// consumer its queue sees.
#[derive(Debug)]
pub struct ConsumeRequest {
    pub consumer: u64,
    pub key: QueueKey,
    pub tag: Arc<str>,
    pub connection_id: u64,
    pub channel_id: u16,
    pub no_ack: bool,
    pub exclusive: bool,
    pub priority: i32,
    pub prefetch_count: u32,
}

mod tag {
    pub const PUBLISH: u8 = 1;
    pub const CONSUME: u8 = 2;
    pub const CANCEL: u8 = 3;
    pub const CREDIT: u8 = 4;
    pub const SETTLE: u8 = 5;
    pub const GET: u8 = 6;
    pub const PURGE: u8 = 7;
    pub const STATS: u8 = 8;
    pub const CONSUMERS_GONE: u8 = 9;
    pub const ANSWERS: u8 = 20;
    pub const CONSUME_OK: u8 = 21;
    pub const FAILED: u8 = 22;
    pub const DELIVER: u8 = 23;
    pub const CANCELLED: u8 = 24;
    pub const GET_OK: u8 = 25;
    pub const GET_EMPTY: u8 = 26;
    pub const PURGED: u8 = 27;
    pub const COUNTED: u8 = 28;
}

#[derive(Debug, thiserror::Error)]
#[error("malformed forwarded operation: {0}")]
pub struct WireError(&'static str);

fn put_bytes(out: &mut BytesMut, bytes: &[u8]) {
    out.put_u32(bytes.len() as u32);
    out.put_slice(bytes);
}

fn put_key(out: &mut BytesMut, key: &QueueKey) {
    put_bytes(out, key.vhost.as_bytes());
    put_bytes(out, key.name.as_bytes());
    out.put_u64(key.declared_at);
}

fn put_message(out: &mut BytesMut, message: &Message) {
    put_bytes(out, &message.exchange);
    put_bytes(out, &message.routing_key);
    put_bytes(out, message.properties.as_bytes());
    put_bytes(out, &message.body);
}

fn put_ids(out: &mut BytesMut, ids: &[u64]) {
    out.put_u32(ids.len() as u32);
    for id in ids {
        out.put_u64(*id);
    }
}

fn settlement_byte(settlement: Settlement) -> u8 {
    match settlement {
        Settlement::Ack => 0,
        Settlement::Reject => 1,
        Settlement::Requeue => 2,
    }
}

impl Op {
    /// Appends the operation as one record: its length, then itself.
    pub fn encode(&self, out: &mut BytesMut) {
        let start = out.len();
        out.put_u32(0);
        self.encode_body(out);
        let length = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&length.to_be_bytes());
    }

    fn encode_body(&self, out: &mut BytesMut) {
        match self {
            Op::Publish { targets, message } => {
                out.put_u8(tag::PUBLISH);
                out.put_u32(targets.len() as u32);
                for key in targets {
                    put_key(out, key);
                }
                put_message(out, message);
            }
            Op::Consume(request) => {
                out.put_u8(tag::CONSUME);
                out.put_u64(request.consumer);
                put_key(out, &request.key);
                put_bytes(out, request.tag.as_bytes());
                out.put_u64(request.connection_id);
                out.put_u16(request.channel_id);
                out.put_u8(u8::from(request.no_ack) | (u8::from(request.exclusive) << 1));
                out.put_i32(request.priority);
                out.put_u32(request.prefetch_count);
            }
            Op::Cancel { consumer } => {
                out.put_u8(tag::CANCEL);
                out.put_u64(*consumer);
            }
            Op::Credit { consumer, amount } => {
                out.put_u8(tag::CREDIT);
                out.put_u64(*consumer);
                out.put_u32(*amount);
            }
            Op::Settle {
                key,
                settlement,
                messages,
            } => {
                out.put_u8(tag::SETTLE);
                put_key(out, key);
                out.put_u8(settlement_byte(*settlement));
                put_ids(out, messages);
            }
            Op::ConsumersGone { key, gone } => {
                out.put_u8(tag::CONSUMERS_GONE);
                put_key(out, key);
                out.put_u32(gone.len() as u32);
                for consumer in gone {
                    out.put_u64(consumer.connection_id);
                    out.put_u16(consumer.channel_id);
                    put_bytes(out, consumer.tag.as_bytes());
                }
            }
            Op::Get {
                request,
                key,
                no_ack,
            } => {
                out.put_u8(tag::GET);
                out.put_u64(*request);
                put_key(out, key);
                out.put_u8(u8::from(*no_ack));
            }
            Op::Purge { request, key } => {
                out.put_u8(tag::PURGE);
                out.put_u64(*request);
                put_key(out, key);
            }
            Op::Stats { request, key } => {
                out.put_u8(tag::STATS);
                out.put_u64(*request);
                put_key(out, key);
            }
            Op::Answers { through, refused } => {
                out.put_u8(tag::ANSWERS);
                out.put_u64(*through);
                put_ids(out, refused);
            }
            Op::ConsumeOk { consumer } => {
                out.put_u8(tag::CONSUME_OK);
                out.put_u64(*consumer);
            }
            Op::Failed {
                request,
                code,
                text,
            } => {
                out.put_u8(tag::FAILED);
                out.put_u64(*request);
                out.put_u16(*code);
                put_bytes(out, text.as_bytes());
            }
            Op::Deliver {
                consumer,
                message_id,
                redelivered,
                message,
            } => {
                out.put_u8(tag::DELIVER);
                out.put_u64(*consumer);
                out.put_u64(*message_id);
                out.put_u8(u8::from(*redelivered));
                put_message(out, message);
            }
            Op::Cancelled { consumer } => {
                out.put_u8(tag::CANCELLED);
                out.put_u64(*consumer);
            }
            Op::GetOk {
                request,
                message_id,
                redelivered,
                remaining,
                message,
            } => {
                out.put_u8(tag::GET_OK);
                out.put_u64(*request);
                out.put_u64(*message_id);
                out.put_u8(u8::from(*redelivered));
                out.put_u32(*remaining);
                put_message(out, message);
            }
            Op::GetEmpty { request } => {
                out.put_u8(tag::GET_EMPTY);
                out.put_u64(*request);
            }
            Op::Purged { request, count } => {
                out.put_u8(tag::PURGED);
                out.put_u64(*request);
                out.put_u32(*count);
            }
            Op::Counted {
                request,
                messages,
                consumers,
            } => {
                out.put_u8(tag::COUNTED);
                out.put_u64(*request);
                out.put_u32(*messages);
                out.put_u32(*consumers);
            }
        }
    }

    /// Decodes one record's operation (the length already taken off).
    /// Bodies and properties are slices of `record`.
    pub fn decode(mut record: Bytes) -> Result<Op, WireError> {
        let mut reader = Reader(&mut record);
        let op = match reader.u8()? {
            tag::PUBLISH => {
                let count = reader.u32()? as usize;
                let mut targets = Vec::with_capacity(count.min(1024));
                for _ in 0..count {
                    targets.push(reader.key()?);
                }
                Op::Publish {
                    targets,
                    message: reader.message()?,
                }
            }
            tag::CONSUME => {
                let consumer = reader.u64()?;
                let key = reader.key()?;
                let tag = Arc::from(reader.string()?.as_str());
                let connection_id = reader.u64()?;
                let channel_id = reader.u16()?;
                let flags = reader.u8()?;
                Op::Consume(ConsumeRequest {
                    consumer,
                    key,
                    tag,
                    connection_id,
                    channel_id,
                    no_ack: flags & 1 != 0,
                    exclusive: flags & 2 != 0,
                    priority: reader.u32()? as i32,
                    prefetch_count: reader.u32()?,
                })
            }
            tag::CANCEL => Op::Cancel {
                consumer: reader.u64()?,
            },
            tag::CREDIT => Op::Credit {
                consumer: reader.u64()?,
                amount: reader.u32()?,
            },
            tag::SETTLE => {
                let key = reader.key()?;
                let settlement = match reader.u8()? {
                    0 => Settlement::Ack,
                    1 => Settlement::Reject,
                    2 => Settlement::Requeue,
                    _ => return Err(WireError("unknown settlement")),
                };
                Op::Settle {
                    key,
                    settlement,
                    messages: reader.ids()?,
                }
            }
            tag::CONSUMERS_GONE => {
                let key = reader.key()?;
                let count = reader.u32()? as usize;
                let mut gone = Vec::with_capacity(count.min(1024));
                for _ in 0..count {
                    gone.push(ConsumerKey {
                        connection_id: reader.u64()?,
                        channel_id: reader.u16()?,
                        tag: Arc::from(reader.string()?.as_str()),
                    });
                }
                Op::ConsumersGone { key, gone }
            }
            tag::GET => Op::Get {
                request: reader.u64()?,
                key: reader.key()?,
                no_ack: reader.u8()? != 0,
            },
            tag::PURGE => Op::Purge {
                request: reader.u64()?,
                key: reader.key()?,
            },
            tag::STATS => Op::Stats {
                request: reader.u64()?,
                key: reader.key()?,
            },
            tag::ANSWERS => Op::Answers {
                through: reader.u64()?,
                refused: reader.ids()?,
            },
            tag::CONSUME_OK => Op::ConsumeOk {
                consumer: reader.u64()?,
            },
            tag::FAILED => Op::Failed {
                request: reader.u64()?,
                code: reader.u16()?,
                text: reader.string()?,
            },
            tag::DELIVER => Op::Deliver {
                consumer: reader.u64()?,
                message_id: reader.u64()?,
                redelivered: reader.u8()? != 0,
                message: reader.message()?,
            },
            tag::CANCELLED => Op::Cancelled {
                consumer: reader.u64()?,
            },
            tag::GET_OK => Op::GetOk {
                request: reader.u64()?,
                message_id: reader.u64()?,
                redelivered: reader.u8()? != 0,
                remaining: reader.u32()?,
                message: reader.message()?,
            },
            tag::GET_EMPTY => Op::GetEmpty {
                request: reader.u64()?,
            },
            tag::PURGED => Op::Purged {
                request: reader.u64()?,
                count: reader.u32()?,
            },
            tag::COUNTED => Op::Counted {
                request: reader.u64()?,
                messages: reader.u32()?,
                consumers: reader.u32()?,
            },
            _ => return Err(WireError("unknown operation")),
        };
        if reader.0.has_remaining() {
            return Err(WireError("trailing bytes"));
        }
        Ok(op)
    }
}

struct Reader<'a>(&'a mut Bytes);

impl Reader<'_> {
    fn need(&self, bytes: usize) -> Result<(), WireError> {
        if self.0.remaining() < bytes {
            return Err(WireError("cut short"));
        }
        Ok(())
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        self.need(1)?;
        Ok(self.0.get_u8())
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        self.need(2)?;
        Ok(self.0.get_u16())
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        self.need(4)?;
        Ok(self.0.get_u32())
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        self.need(8)?;
        Ok(self.0.get_u64())
    }

    fn bytes(&mut self) -> Result<Bytes, WireError> {
        let length = self.u32()? as usize;
        self.need(length)?;
        Ok(self.0.split_to(length))
    }

    fn string(&mut self) -> Result<String, WireError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| WireError("text not UTF-8"))
    }

    fn key(&mut self) -> Result<QueueKey, WireError> {
        Ok(QueueKey {
            vhost: Arc::from(self.string()?.as_str()),
            name: Arc::from(self.string()?.as_str()),
            declared_at: self.u64()?,
        })
    }

    fn ids(&mut self) -> Result<Vec<u64>, WireError> {
        let count = self.u32()? as usize;
        self.need(count.saturating_mul(8))?;
        Ok((0..count).map(|_| self.0.get_u64()).collect())
    }

    fn message(&mut self) -> Result<Arc<Message>, WireError> {
        let exchange = self.bytes()?;
        let routing_key = self.bytes()?;
        let properties =
            RawProperties::new(self.bytes()?).map_err(|_| WireError("malformed properties"))?;
        let body = self.bytes()?;
        Ok(Arc::new(Message {
            exchange,
            routing_key,
            properties,
            body,
        }))
    }
}

/// Joins one peer's frames back into its stream of records.
#[derive(Default)]
pub struct RecordStream {
    /// The start of a record whose end is in a later frame.
    partial: BytesMut,
}

impl RecordStream {
    /// Takes one frame's payload; hands every record it completes to
    /// `each`, in order.
    ///
    /// # Errors
    /// A record longer than [`RECORD_BYTES_MAX`]: the stream is corrupt.
    pub fn accept(&mut self, payload: Bytes, mut each: impl FnMut(Bytes)) -> Result<(), WireError> {
        let mut input = if self.partial.is_empty() {
            payload
        } else {
            self.partial.extend_from_slice(&payload);
            std::mem::take(&mut self.partial).freeze()
        };
        loop {
            if input.len() < 4 {
                break;
            }
            let length = u32::from_be_bytes(input[..4].try_into().expect("4 bytes")) as usize;
            if length > RECORD_BYTES_MAX {
                return Err(WireError("record over the size limit"));
            }
            if input.len() < 4 + length {
                break;
            }
            input.advance(4);
            each(input.split_to(length));
        }
        if !input.is_empty() {
            self.partial.extend_from_slice(&input);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> QueueKey {
        QueueKey {
            vhost: Arc::from("/"),
            name: Arc::from(name),
            declared_at: 42,
        }
    }

    fn message(body: usize) -> Arc<Message> {
        Arc::new(Message {
            exchange: Bytes::from_static(b"amq.direct"),
            routing_key: Bytes::from_static(b"rk"),
            properties: RawProperties::new(Bytes::from_static(&[0x10, 0x00, 0x02])).unwrap(),
            body: Bytes::from(vec![7u8; body]),
        })
    }

    #[test]
    fn forwarded_operations_survive_the_stream_cut_anywhere() {
        let ops = vec![
            Op::Publish {
                targets: vec![key("a"), key("b")],
                message: message(3000),
            },
            Op::Settle {
                key: key("a"),
                settlement: Settlement::Requeue,
                messages: vec![1, 5, 9],
            },
            Op::ConsumersGone {
                key: key("a"),
                gone: vec![
                    ConsumerKey {
                        connection_id: 1 << 48 | 7,
                        channel_id: 2,
                        tag: Arc::from("worker"),
                    },
                    ConsumerKey {
                        connection_id: 9,
                        channel_id: 65535,
                        tag: Arc::from(""),
                    },
                ],
            },
            Op::Failed {
                request: 3,
                code: 404,
                text: "no queue 'x'".into(),
            },
            Op::Deliver {
                consumer: 9,
                message_id: 77,
                redelivered: true,
                message: message(0),
            },
        ];
        let mut stream = BytesMut::new();
        for op in &ops {
            op.encode(&mut stream);
        }
        let stream = stream.freeze();
        for cut in [1, 3, 7, 100, 1000, stream.len()] {
            let mut records = RecordStream::default();
            let mut decoded = Vec::new();
            for piece in stream.chunks(cut) {
                records
                    .accept(Bytes::copy_from_slice(piece), |record| {
                        decoded.push(format!("{:?}", Op::decode(record).unwrap()))
                    })
                    .unwrap();
            }
            let expected: Vec<String> = ops.iter().map(|op| format!("{op:?}")).collect();
            assert_eq!(decoded, expected, "cut every {cut} bytes");
        }
    }

    #[test]
    fn forwarded_operation_cut_short_is_an_error_not_a_panic() {
        let mut out = BytesMut::new();
        Op::Publish {
            targets: vec![key("a")],
            message: message(10),
        }
        .encode(&mut out);
        let record = out.freeze().slice(4..);
        for end in 0..record.len() {
            assert!(Op::decode(record.slice(..end)).is_err());
        }
        let mut records = RecordStream::default();
        let mut huge = BytesMut::new();
        huge.put_u32(u32::MAX);
        assert!(records.accept(huge.freeze(), |_| {}).is_err());
    }
}
