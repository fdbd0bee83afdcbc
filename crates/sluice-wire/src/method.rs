//! Decoding method frames.
//!
//! The four methods a busy broker sees per message (basic.publish, ack, nack,
//! reject) are decoded by hand, their strings kept as slices of the frame.
//! Everything else goes through `amq-protocol`'s generated parser.

use amq_protocol::protocol::{parse_class, AMQPClass};
use bytes::{Buf, Bytes};

use crate::field_table::method_tables_within_limit;

pub const CLASS_BASIC: u16 = 60;
pub const METHOD_BASIC_PUBLISH: u16 = 40;
pub const METHOD_BASIC_ACK: u16 = 80;
pub const METHOD_BASIC_REJECT: u16 = 90;
pub const METHOD_BASIC_NACK: u16 = 120;

/// basic.publish, its names borrowed from the frame. Names are bytes: AMQP
/// short strings are not required to be UTF-8 and routing keys are matched
/// byte for byte.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publish {
    pub exchange: Bytes,
    pub routing_key: Bytes,
    pub mandatory: bool,
    pub immediate: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    pub delivery_tag: u64,
    pub multiple: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nack {
    pub delivery_tag: u64,
    pub multiple: bool,
    pub requeue: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reject {
    pub delivery_tag: u64,
    pub requeue: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Method {
    Publish(Publish),
    Ack(Ack),
    Nack(Nack),
    Reject(Reject),
    /// Any other method, decoded by `amq-protocol`.
    Control(AMQPClass),
}

/// A method frame that cannot be decoded. RabbitMQ answers both with a
/// connection error: 501 FRAME_ERROR for bytes that do not parse, 540
/// NOT_IMPLEMENTED for a class or method it does not know.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MethodError {
    #[error("cannot decode method frame for class {class_id} method {method_id}")]
    Malformed { class_id: u16, method_id: u16 },
    #[error("unknown class {class_id} method {method_id}")]
    Unknown { class_id: u16, method_id: u16 },
    #[error("method frame of {0} bytes is too short")]
    Truncated(usize),
}

/// Decodes one method frame payload.
pub fn decode_method(payload: &Bytes) -> Result<Method, MethodError> {
    if payload.len() < 4 {
        return Err(MethodError::Truncated(payload.len()));
    }
    let class_id = u16::from_be_bytes([payload[0], payload[1]]);
    let method_id = u16::from_be_bytes([payload[2], payload[3]]);
    let malformed = MethodError::Malformed {
        class_id,
        method_id,
    };
    if class_id == CLASS_BASIC {
        let mut arguments = payload.slice(4..);
        let hot = match method_id {
            METHOD_BASIC_PUBLISH => decode_publish(&mut arguments).map(Method::Publish),
            METHOD_BASIC_ACK => decode_tag_and_bits(&mut arguments).map(|(delivery_tag, bits)| {
                Method::Ack(Ack {
                    delivery_tag,
                    multiple: bits & 1 != 0,
                })
            }),
            METHOD_BASIC_REJECT => {
                decode_tag_and_bits(&mut arguments).map(|(delivery_tag, bits)| {
                    Method::Reject(Reject {
                        delivery_tag,
                        requeue: bits & 1 != 0,
                    })
                })
            }
            METHOD_BASIC_NACK => decode_tag_and_bits(&mut arguments).map(|(delivery_tag, bits)| {
                Method::Nack(Nack {
                    delivery_tag,
                    multiple: bits & 1 != 0,
                    requeue: bits & 2 != 0,
                })
            }),
            _ => None,
        };
        match hot {
            Some(method) => return Ok(method),
            None if matches!(
                method_id,
                METHOD_BASIC_PUBLISH | METHOD_BASIC_ACK | METHOD_BASIC_REJECT | METHOD_BASIC_NACK
            ) =>
            {
                return Err(malformed)
            }
            None => {}
        }
    }
    // amq-protocol parses nested field tables by recursion; refuse deep
    // nesting before it can overflow the stack.
    if !method_tables_within_limit(class_id, method_id, &payload[4..]) {
        return Err(malformed);
    }
    match parse_class(&payload[..]) {
        Ok((_, class)) => Ok(Method::Control(class)),
        Err(_) if is_known(class_id, method_id) => Err(malformed),
        Err(_) => Err(MethodError::Unknown {
            class_id,
            method_id,
        }),
    }
}

fn decode_short_string(arguments: &mut Bytes) -> Option<Bytes> {
    let length = *arguments.first()? as usize;
    if arguments.len() < 1 + length {
        return None;
    }
    arguments.advance(1);
    Some(arguments.split_to(length))
}

fn decode_publish(arguments: &mut Bytes) -> Option<Publish> {
    if arguments.len() < 2 {
        return None;
    }
    arguments.advance(2); // reserved-1 (the old access ticket)
    let exchange = decode_short_string(arguments)?;
    let routing_key = decode_short_string(arguments)?;
    let bits = *arguments.first()?;
    Some(Publish {
        exchange,
        routing_key,
        mandatory: bits & 1 != 0,
        immediate: bits & 2 != 0,
    })
}

fn decode_tag_and_bits(arguments: &mut Bytes) -> Option<(u64, u8)> {
    if arguments.len() < 9 {
        return None;
    }
    let delivery_tag = arguments.get_u64();
    Some((delivery_tag, arguments.get_u8()))
}

/// The class and method ids of AMQP 0-9-1 with RabbitMQ's extensions, so that
/// a known method with bad arguments is told apart from an unknown one.
fn is_known(class_id: u16, method_id: u16) -> bool {
    match class_id {
        10 => matches!(
            method_id,
            10 | 11 | 20 | 21 | 30 | 31 | 40 | 41 | 50 | 51 | 60 | 61 | 70 | 71
        ),
        20 => matches!(method_id, 10 | 11 | 20 | 21 | 40 | 41),
        30 => matches!(method_id, 10 | 11),
        40 => matches!(method_id, 10 | 11 | 20 | 21 | 30 | 31 | 40 | 51),
        50 => matches!(method_id, 10 | 11 | 20 | 21 | 30 | 31 | 40 | 41 | 50 | 51),
        60 => matches!(
            method_id,
            10 | 11
                | 20
                | 21
                | 30
                | 31
                | 40
                | 50
                | 60
                | 70
                | 71
                | 72
                | 80
                | 90
                | 100
                | 110
                | 111
                | 120
        ),
        85 => matches!(method_id, 10 | 11),
        90 => matches!(method_id, 10 | 11 | 20 | 21 | 30 | 31),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::encode_control;
    use amq_protocol::protocol::{basic, queue};
    use bytes::BytesMut;

    fn method_payload(class: &AMQPClass) -> Bytes {
        let mut out = BytesMut::new();
        encode_control(&mut out, 1, class);
        // Strip the 7-byte frame header and the end octet.
        let mut payload = out.split_off(7);
        payload.truncate(payload.len() - 1);
        payload.freeze()
    }

    #[test]
    fn method_publish_decodes_by_hand_like_amq_protocol() {
        let class = AMQPClass::Basic(basic::AMQPMethod::Publish(basic::Publish {
            exchange: "amq.topic".into(),
            routing_key: "a.b.c".into(),
            mandatory: true,
            immediate: false,
        }));
        let payload = method_payload(&class);
        let Method::Publish(publish) = decode_method(&payload).unwrap() else {
            panic!("not a publish");
        };
        assert_eq!(&publish.exchange[..], b"amq.topic");
        assert_eq!(&publish.routing_key[..], b"a.b.c");
        assert!(publish.mandatory);
        assert!(!publish.immediate);
    }

    #[test]
    fn method_ack_nack_reject_decode() {
        let payload = method_payload(&AMQPClass::Basic(basic::AMQPMethod::Nack(basic::Nack {
            delivery_tag: 42,
            multiple: true,
            requeue: false,
        })));
        assert_eq!(
            decode_method(&payload).unwrap(),
            Method::Nack(Nack {
                delivery_tag: 42,
                multiple: true,
                requeue: false
            })
        );
        let payload = method_payload(&AMQPClass::Basic(basic::AMQPMethod::Ack(basic::Ack {
            delivery_tag: 7,
            multiple: false,
        })));
        assert_eq!(
            decode_method(&payload).unwrap(),
            Method::Ack(Ack {
                delivery_tag: 7,
                multiple: false
            })
        );
        let payload = method_payload(&AMQPClass::Basic(basic::AMQPMethod::Reject(
            basic::Reject {
                delivery_tag: 9,
                requeue: true,
            },
        )));
        assert_eq!(
            decode_method(&payload).unwrap(),
            Method::Reject(Reject {
                delivery_tag: 9,
                requeue: true
            })
        );
    }

    #[test]
    fn method_control_goes_through_amq_protocol() {
        let class = AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
            queue: "q".into(),
            passive: false,
            durable: true,
            exclusive: false,
            auto_delete: false,
            nowait: false,
            arguments: Default::default(),
        }));
        assert_eq!(
            decode_method(&method_payload(&class)).unwrap(),
            Method::Control(class)
        );
    }

    #[test]
    fn method_rejects_deeply_nested_arguments() {
        use crate::field_table::{tests::nested_table, FIELD_TABLE_DEPTH_MAX};
        // queue.declare "q" whose arguments nest 20 000 levels deep once
        // overflowed the stack inside amq-protocol and aborted the process.
        let declare = |depth: usize| {
            let mut payload = vec![0, 50, 0, 10, 0, 0, 1, b'q', 0];
            payload.extend(nested_table(depth));
            Bytes::from(payload)
        };
        assert!(matches!(
            decode_method(&declare(FIELD_TABLE_DEPTH_MAX)),
            Ok(Method::Control(_))
        ));
        for depth in [FIELD_TABLE_DEPTH_MAX + 1, 20_000] {
            assert_eq!(
                decode_method(&declare(depth)),
                Err(MethodError::Malformed {
                    class_id: 50,
                    method_id: 10
                })
            );
        }
        // connection.start-ok, whose client-properties table comes first.
        let mut payload = vec![0, 10, 0, 11];
        payload.extend(nested_table(20_000));
        assert!(matches!(
            decode_method(&Bytes::from(payload)),
            Err(MethodError::Malformed { .. })
        ));
    }

    #[test]
    fn method_errors_tell_malformed_from_unknown() {
        assert_eq!(
            decode_method(&Bytes::from_static(&[0, 60])),
            Err(MethodError::Truncated(2))
        );
        assert!(matches!(
            decode_method(&Bytes::from_static(&[0, 60, 0, 40, 0, 0, 5, b'a'])),
            Err(MethodError::Malformed { .. })
        ));
        assert!(matches!(
            decode_method(&Bytes::from_static(&[0, 50, 0, 10, 0])),
            Err(MethodError::Malformed { .. })
        ));
        assert!(matches!(
            decode_method(&Bytes::from_static(&[0, 99, 0, 10])),
            Err(MethodError::Unknown { .. })
        ));
    }
}
