//! Content headers, with their property bytes kept raw.
//!
//! A broker forwards properties untouched, so they stay as the bytes the
//! publisher sent. The few a broker acts on (delivery mode, priority,
//! expiration) are read by [`RawProperties`] without decoding the rest;
//! headers are decoded through `amq-protocol` only when a headers exchange
//! routes on them.

use amq_protocol::protocol::basic::{gen_properties, parse_properties, AMQPProperties};
use bytes::{Buf, Bytes};

use crate::field_table;

/// class-id, weight, body-size: the part of a content header before the
/// property flags.
pub const CONTENT_HEADER_PREFIX_SIZE: usize = 12;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContentHeader {
    pub class_id: u16,
    pub body_size: u64,
    pub properties: RawProperties,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ContentError {
    #[error("content header of {0} bytes is too short")]
    Truncated(usize),
    #[error("cannot decode message properties")]
    MalformedProperties,
}

/// Reads a content header frame payload; the properties are sliced, not copied.
pub fn decode_content_header(payload: &Bytes) -> Result<ContentHeader, ContentError> {
    if payload.len() < CONTENT_HEADER_PREFIX_SIZE + 2 {
        return Err(ContentError::Truncated(payload.len()));
    }
    let mut prefix = &payload[..CONTENT_HEADER_PREFIX_SIZE];
    let class_id = prefix.get_u16();
    let _weight = prefix.get_u16();
    let body_size = prefix.get_u64();
    let properties = RawProperties::new(payload.slice(CONTENT_HEADER_PREFIX_SIZE..))?;
    Ok(ContentHeader {
        class_id,
        body_size,
        properties,
    })
}

/// Property flag bits in the order of the basic class's property list.
mod flag {
    pub const CONTENT_TYPE: u16 = 1 << 15;
    pub const CONTENT_ENCODING: u16 = 1 << 14;
    pub const HEADERS: u16 = 1 << 13;
    pub const DELIVERY_MODE: u16 = 1 << 12;
    pub const PRIORITY: u16 = 1 << 11;
    pub const CORRELATION_ID: u16 = 1 << 10;
    pub const REPLY_TO: u16 = 1 << 9;
    pub const EXPIRATION: u16 = 1 << 8;
    pub const USER_ID: u16 = 1 << 4;
    /// The lowest bit says another flags word follows; basic has only 14
    /// properties, so a set continuation bit is malformed.
    pub const CONTINUATION: u16 = 1;
}

/// The property flags and property list of a basic content header, as sent.
/// Construction checks that the list parses, so consumers never receive a
/// header their client cannot read.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RawProperties {
    bytes: Bytes,
    delivery_mode: Option<u8>,
    priority: Option<u8>,
    expiration: Option<Bytes>,
}

impl RawProperties {
    /// Validates and indexes raw property bytes (flags then list).
    pub fn new(bytes: Bytes) -> Result<Self, ContentError> {
        if bytes.len() < 2 {
            return Err(ContentError::MalformedProperties);
        }
        let flags = u16::from_be_bytes([bytes[0], bytes[1]]);
        if flags & flag::CONTINUATION != 0 {
            return Err(ContentError::MalformedProperties);
        }
        let mut properties = RawProperties {
            bytes: bytes.clone(),
            ..RawProperties::default()
        };
        if flags == 0 {
            return if bytes.len() == 2 {
                Ok(properties)
            } else {
                Err(ContentError::MalformedProperties)
            };
        }
        // Everything after the fields we index is checked by the full parser;
        // a header with only the common fields never pays for it.
        let needs_full_check =
            flags & !(flag::CONTENT_TYPE | flag::DELIVERY_MODE | flag::PRIORITY) != 0;
        let mut cursor = bytes.slice(2..);
        let malformed = || ContentError::MalformedProperties;
        if flags & flag::CONTENT_TYPE != 0 {
            let content_type = skip_short_string(&mut cursor).ok_or_else(malformed)?;
            // The full parser (and every client) wants short strings in UTF-8;
            // without this check a header on the fast path could pass here and
            // fail in `decode` or in the consumer's client.
            if !needs_full_check && std::str::from_utf8(&content_type).is_err() {
                return Err(ContentError::MalformedProperties);
            }
        }
        if flags & flag::CONTENT_ENCODING != 0 {
            skip_short_string(&mut cursor).ok_or_else(malformed)?;
        }
        if flags & flag::HEADERS != 0 {
            // The full parser below recurses into nested tables: bound the
            // nesting first so that hostile headers cannot overflow the stack.
            if field_table::check_table(&cursor).is_none() {
                return Err(ContentError::MalformedProperties);
            }
            skip_long_bytes(&mut cursor).ok_or_else(malformed)?;
        }
        if flags & flag::DELIVERY_MODE != 0 {
            properties.delivery_mode = Some(take_octet(&mut cursor).ok_or_else(malformed)?);
        }
        if flags & flag::PRIORITY != 0 {
            properties.priority = Some(take_octet(&mut cursor).ok_or_else(malformed)?);
        }
        if flags & flag::CORRELATION_ID != 0 {
            skip_short_string(&mut cursor).ok_or_else(malformed)?;
        }
        if flags & flag::REPLY_TO != 0 {
            skip_short_string(&mut cursor).ok_or_else(malformed)?;
        }
        if flags & flag::EXPIRATION != 0 {
            properties.expiration = Some(skip_short_string(&mut cursor).ok_or_else(malformed)?);
        }
        if needs_full_check {
            match parse_properties(&bytes[..]) {
                Ok(([], _)) => {}
                _ => return Err(ContentError::MalformedProperties),
            }
        } else if !cursor.is_empty() {
            return Err(ContentError::MalformedProperties);
        }
        Ok(properties)
    }

    pub fn from_properties(properties: &AMQPProperties) -> Self {
        let bytes = cookie_factory::gen_simple(gen_properties(properties), Vec::new())
            .expect("writing into a Vec cannot fail");
        RawProperties::new(Bytes::from(bytes)).expect("amq-protocol writes valid properties")
    }

    /// The bytes as received: flags, then the property list.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }

    pub fn flags(&self) -> u16 {
        u16::from_be_bytes([self.bytes[0], self.bytes[1]])
    }

    /// 2 is persistent; anything else (or none) is transient.
    pub fn delivery_mode(&self) -> Option<u8> {
        self.delivery_mode
    }

    pub fn is_persistent(&self) -> bool {
        self.delivery_mode == Some(2)
    }

    pub fn priority(&self) -> Option<u8> {
        self.priority
    }

    /// The expiration property, a decimal number of milliseconds as a string.
    pub fn expiration(&self) -> Option<&Bytes> {
        self.expiration.as_ref()
    }

    pub fn has_headers(&self) -> bool {
        self.flags() & flag::HEADERS != 0
    }

    pub fn has_user_id(&self) -> bool {
        self.flags() & flag::USER_ID != 0
    }

    pub fn has_reply_to(&self) -> bool {
        self.flags() & flag::REPLY_TO != 0
    }

    /// The reply-to property, found by skipping the fields before it; not
    /// indexed by [`RawProperties::new`], since only direct reply-to reads
    /// it and a publish without it never pays for it.
    pub fn reply_to(&self) -> Option<Bytes> {
        let flags = self.flags();
        if flags & flag::REPLY_TO == 0 {
            return None;
        }
        let mut cursor = self.bytes.slice(2..);
        if flags & flag::CONTENT_TYPE != 0 {
            skip_short_string(&mut cursor)?;
        }
        if flags & flag::CONTENT_ENCODING != 0 {
            skip_short_string(&mut cursor)?;
        }
        if flags & flag::HEADERS != 0 {
            skip_long_bytes(&mut cursor)?;
        }
        if flags & flag::DELIVERY_MODE != 0 {
            take_octet(&mut cursor)?;
        }
        if flags & flag::PRIORITY != 0 {
            take_octet(&mut cursor)?;
        }
        if flags & flag::CORRELATION_ID != 0 {
            skip_short_string(&mut cursor)?;
        }
        skip_short_string(&mut cursor)
    }

    /// Decodes every property. Cannot fail after [`RawProperties::new`]
    /// accepted the bytes, but returns the error rather than panic.
    pub fn decode(&self) -> Result<AMQPProperties, ContentError> {
        match parse_properties(&self.bytes[..]) {
            Ok((_, properties)) => Ok(properties),
            Err(_) => Err(ContentError::MalformedProperties),
        }
    }
}

fn take_octet(cursor: &mut Bytes) -> Option<u8> {
    if cursor.is_empty() {
        return None;
    }
    Some(cursor.get_u8())
}

fn skip_short_string(cursor: &mut Bytes) -> Option<Bytes> {
    let length = *cursor.first()? as usize;
    if cursor.len() < 1 + length {
        return None;
    }
    cursor.advance(1);
    Some(cursor.split_to(length))
}

fn skip_long_bytes(cursor: &mut Bytes) -> Option<Bytes> {
    if cursor.len() < 4 {
        return None;
    }
    let length = u32::from_be_bytes([cursor[0], cursor[1], cursor[2], cursor[3]]) as usize;
    if cursor.len() < 4 + length {
        return None;
    }
    cursor.advance(4);
    Some(cursor.split_to(length))
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::types::{AMQPValue, FieldTable};

    #[test]
    fn content_properties_index_common_fields() {
        let mut headers = FieldTable::default();
        headers.insert("k".into(), AMQPValue::LongString("v".into()));
        let properties = AMQPProperties::default()
            .with_content_type("text/plain".into())
            .with_headers(headers.clone())
            .with_delivery_mode(2)
            .with_priority(5)
            .with_expiration("60000".into())
            .with_message_id("m1".into());
        let raw = RawProperties::from_properties(&properties);
        assert!(raw.is_persistent());
        assert_eq!(raw.priority(), Some(5));
        assert_eq!(&raw.expiration().unwrap()[..], b"60000");
        assert!(raw.has_headers());
        assert!(!raw.has_reply_to());
        assert_eq!(raw.reply_to(), None);
        let with_reply_to = RawProperties::from_properties(
            &properties
                .clone()
                .with_correlation_id("c1".into())
                .with_reply_to("amq.rabbitmq.reply-to".into()),
        );
        assert!(with_reply_to.has_reply_to());
        assert_eq!(
            &with_reply_to.reply_to().unwrap()[..],
            b"amq.rabbitmq.reply-to"
        );
        assert_eq!(raw.decode().unwrap().headers(), &Some(headers));
    }

    #[test]
    fn content_properties_empty_and_malformed() {
        let empty = RawProperties::new(Bytes::from_static(&[0, 0])).unwrap();
        assert_eq!(empty.delivery_mode(), None);
        assert!(RawProperties::new(Bytes::from_static(&[0, 0, 1])).is_err());
        assert!(RawProperties::new(Bytes::from_static(&[0, 1])).is_err());
        // delivery-mode flag set but no octet follows.
        assert!(RawProperties::new(Bytes::from_static(&[0x10, 0])).is_err());
        // headers flag with a table length past the end.
        assert!(RawProperties::new(Bytes::from_static(&[0x20, 0, 0, 0, 0, 9])).is_err());
    }

    #[test]
    fn content_properties_reject_non_utf8_content_type() {
        // Only content-type and delivery-mode: the fast path, which once
        // accepted bytes that `decode` (and clients) then refused.
        let bytes = Bytes::from_static(&[0x90, 0, 1, 0xff, 2]);
        assert_eq!(
            RawProperties::new(bytes),
            Err(ContentError::MalformedProperties)
        );
        let raw = RawProperties::new(Bytes::from_static(&[0x90, 0, 2, b'o', b'k', 2])).unwrap();
        assert!(raw.decode().is_ok());
    }

    #[test]
    fn content_properties_reject_deeply_nested_headers() {
        // 20 000 levels of arrays in 100 KB of headers once overflowed the
        // stack inside amq-protocol's recursive parser and aborted the process.
        for depth in [crate::field_table::FIELD_TABLE_DEPTH_MAX + 1, 20_000] {
            let mut bytes = vec![0x20, 0];
            bytes.extend(crate::field_table::tests::nested_table(depth));
            assert_eq!(
                RawProperties::new(Bytes::from(bytes)),
                Err(ContentError::MalformedProperties)
            );
        }
        let mut bytes = vec![0x20, 0];
        bytes.extend(crate::field_table::tests::nested_table(
            crate::field_table::FIELD_TABLE_DEPTH_MAX,
        ));
        assert!(RawProperties::new(Bytes::from(bytes))
            .unwrap()
            .decode()
            .is_ok());
    }

    #[test]
    fn content_header_decodes_prefix() {
        let mut payload = vec![0, 60, 0, 0];
        payload.extend_from_slice(&1234u64.to_be_bytes());
        payload.extend_from_slice(&[0x10, 0, 2]);
        let header = decode_content_header(&Bytes::from(payload)).unwrap();
        assert_eq!(header.class_id, 60);
        assert_eq!(header.body_size, 1234);
        assert!(header.properties.is_persistent());
        assert!(decode_content_header(&Bytes::from_static(&[0, 60])).is_err());
    }
}
