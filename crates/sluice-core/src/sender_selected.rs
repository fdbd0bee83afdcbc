//! Sender-selected distribution: a publisher may list more routing keys in the `CC` and
//! `BCC` headers (arrays of strings), and the message is routed with each of them as well as
//! with its routing key, one copy per queue. `BCC` is removed before the message is routed,
//! so no consumer (and no `basic.return`) shows who else received it. RabbitMQ's
//! `rabbit_basic:header_routes/1` and `strip_header/2`; dead-lettering routes with the same
//! keys.

use std::collections::BTreeMap;

use amq_protocol::types::{AMQPValue, FieldTable, ShortString};
use bytes::Bytes;
use sluice_wire::content::RawProperties;

use crate::arguments::type_name;
use crate::error::AmqpError;

/// The headers whose values are routing keys, in the order they are routed.
const ROUTING_HEADERS: [&str; 2] = ["CC", BCC];

/// The header naming routing keys that are stripped before delivery.
const BCC: &str = "BCC";

/// Whether the encoded properties may hold a `CC` or `BCC` header: a scan of the bytes for
/// the keys as a field table encodes them (length octet, then the name), so a message whose
/// headers carry neither is never decoded for them. A match inside some other value only
/// costs that decode. A key is always followed by its value's type octet, so windows of
/// `BCC`'s length also see every `CC`.
pub fn may_have_header_routes(properties: &RawProperties) -> bool {
    const CC_KEY: &[u8] = b"\x02CC";
    const BCC_KEY: &[u8] = b"\x03BCC";
    properties.has_headers()
        && properties
            .as_bytes()
            .windows(BCC_KEY.len())
            .any(|window| window == BCC_KEY || window[..CC_KEY.len()] == *CC_KEY)
}

/// The CC and BCC routing keys in a message's headers, in that order. Array entries that
/// are not strings are skipped; a `CC` or `BCC` that is not an array makes the message
/// invalid, and the publish is refused with RabbitMQ's PRECONDITION_FAILED text.
pub fn header_routes(headers: &BTreeMap<ShortString, AMQPValue>) -> Result<Vec<Bytes>, AmqpError> {
    let mut routes = Vec::new();
    for key in ROUTING_HEADERS {
        match headers.get(key) {
            None => {}
            Some(AMQPValue::FieldArray(array)) => routes.extend(
                array
                    .as_slice()
                    .iter()
                    .filter_map(text_bytes)
                    .map(Bytes::copy_from_slice),
            ),
            Some(other) => {
                return Err(AmqpError::precondition_failed(format!(
                    "invalid message: {{unacceptable_type_in_header,\"{key}\",{}}}",
                    type_name(other)
                )));
            }
        }
    }
    Ok(routes)
}

/// Refuses a message whose `CC` or `BCC` is not an array, as routing it would: for a
/// publish held by a transaction, which RabbitMQ refuses at `basic.publish`, not at
/// `tx.commit` when part of the transaction is applied already.
pub fn check_header_routes(properties: &RawProperties) -> Result<(), AmqpError> {
    if !may_have_header_routes(properties) {
        return Ok(());
    }
    if let Some(headers) = properties
        .decode()
        .ok()
        .and_then(|decoded| decoded.headers().clone())
    {
        header_routes(headers.inner())?;
    }
    Ok(())
}

/// The bytes of a string value, long or short.
pub(crate) fn text_bytes(value: &AMQPValue) -> Option<&[u8]> {
    match value {
        AMQPValue::LongString(text) => Some(text.as_bytes()),
        AMQPValue::ShortString(text) => Some(text.as_str().as_bytes()),
        _ => None,
    }
}

/// The headers without `BCC`, or None when there is none to remove.
pub fn without_bcc(headers: &FieldTable) -> Option<FieldTable> {
    if !headers.inner().contains_key(BCC) {
        return None;
    }
    let mut kept = headers.inner().clone();
    kept.remove(BCC);
    Some(FieldTable::from(kept))
}

#[cfg(test)]
mod tests {
    use amq_protocol::types::{FieldArray, LongString};

    use super::*;

    fn strings(values: &[&str]) -> AMQPValue {
        AMQPValue::FieldArray(FieldArray::from(
            values
                .iter()
                .map(|value| AMQPValue::LongString(LongString::from(value.as_bytes().to_vec())))
                .collect::<Vec<_>>(),
        ))
    }

    #[test]
    fn cc_then_bcc_keys_are_routes_and_bcc_is_stripped() {
        let mut headers = BTreeMap::new();
        headers.insert("BCC".into(), strings(&["hidden"]));
        headers.insert("CC".into(), strings(&["a", "b"]));
        headers.insert("other".into(), AMQPValue::LongLongInt(7));
        assert_eq!(header_routes(&headers).unwrap(), ["a", "b", "hidden"]);
        let table = FieldTable::from(headers);
        let stripped = without_bcc(&table).expect("BCC is present");
        assert!(!stripped.inner().contains_key("BCC"));
        assert!(stripped.inner().contains_key("CC"));
        assert!(stripped.inner().contains_key("other"));
        assert_eq!(without_bcc(&stripped), None);
    }

    #[test]
    fn only_headers_naming_cc_or_bcc_are_worth_decoding() {
        let encoded = |entries: Vec<(&str, AMQPValue)>| {
            let mut headers = FieldTable::default();
            for (key, value) in entries {
                headers.insert(key.into(), value);
            }
            RawProperties::from_properties(
                &amq_protocol::protocol::BasicProperties::default().with_headers(headers),
            )
        };
        assert!(may_have_header_routes(&encoded(vec![(
            "CC",
            strings(&["a"])
        )])));
        // BCC is stripped whatever its type.
        assert!(may_have_header_routes(&encoded(vec![(
            "BCC",
            AMQPValue::LongLongInt(1)
        )])));
        assert!(!may_have_header_routes(&encoded(vec![(
            "trace-id",
            strings(&["abc"])
        )])));
        // A CC that is not an array is looked at too: it is refused.
        assert!(may_have_header_routes(&encoded(vec![(
            "CC",
            AMQPValue::LongString(LongString::from(b"a".to_vec()))
        )])));
        assert!(!may_have_header_routes(&encoded(vec![(
            "ACCOUNT",
            AMQPValue::LongString(LongString::from(b"a".to_vec()))
        )])));
        assert!(!may_have_header_routes(&RawProperties::from_properties(
            &amq_protocol::protocol::BasicProperties::default()
        )));
    }

    #[test]
    fn array_entries_that_are_not_strings_are_skipped() {
        let mut headers = BTreeMap::new();
        headers.insert(
            "BCC".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![
                AMQPValue::LongLongInt(1),
                AMQPValue::LongString(LongString::from(b"kept".to_vec())),
            ])),
        );
        assert_eq!(header_routes(&headers).unwrap(), ["kept"]);
    }

    #[test]
    fn a_cc_or_bcc_that_is_not_an_array_is_refused_as_in_rabbitmq() {
        let mut headers = BTreeMap::new();
        headers.insert(
            "CC".into(),
            AMQPValue::LongString(LongString::from(b"not-an-array".to_vec())),
        );
        let error = header_routes(&headers).unwrap_err();
        assert_eq!(
            error.to_string(),
            "PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,\"CC\",longstr}"
        );
        headers.clear();
        headers.insert("BCC".into(), AMQPValue::LongInt(3));
        assert_eq!(
            header_routes(&headers).unwrap_err().text,
            "invalid message: {unacceptable_type_in_header,\"BCC\",signedint}"
        );
    }
}
