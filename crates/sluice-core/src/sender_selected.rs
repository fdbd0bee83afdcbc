//! Sender-selected distribution: a publisher may list more routing keys in the `CC` and
//! `BCC` headers (arrays of strings), and the message is routed with each of them as well as
//! with its routing key, one copy per queue. `BCC` is removed before the message is stored,
//! so no consumer learns who else received it. RabbitMQ's `rabbit_basic:header_routes/1`
//! and `strip_bcc/1`; dead-lettering routes with the same keys.

use std::collections::BTreeMap;

use amq_protocol::types::{AMQPValue, FieldTable, ShortString};
use bytes::Bytes;
use sluice_wire::content::RawProperties;

/// The header naming routing keys that are stripped before delivery.
const BCC: &str = "BCC";

/// Whether the encoded properties may hold a `CC` array or a `BCC` header: a scan of the
/// bytes for the keys as a field table encodes them (length octet, name, and for `CC` the
/// array tag), so a message whose headers carry neither is never decoded for them. A match
/// inside some other value only costs that decode.
pub fn may_have_header_routes(properties: &RawProperties) -> bool {
    const CC_ARRAY: &[u8] = b"\x02CCA";
    const BCC_KEY: &[u8] = b"\x03BCC";
    properties.has_headers()
        && properties
            .as_bytes()
            .windows(CC_ARRAY.len())
            .any(|window| window == CC_ARRAY || window[..BCC_KEY.len()] == *BCC_KEY)
}

/// The CC and BCC routing keys in a message's headers, in that order. Values that are not
/// arrays, and array entries that are not strings, are ignored, as in RabbitMQ.
pub fn header_routes(headers: &BTreeMap<ShortString, AMQPValue>) -> Vec<Bytes> {
    let mut routes = Vec::new();
    for key in ["CC", BCC] {
        if let Some(AMQPValue::FieldArray(array)) = headers.get(key) {
            routes.extend(
                array
                    .as_slice()
                    .iter()
                    .filter_map(text_bytes)
                    .map(Bytes::copy_from_slice),
            );
        }
    }
    routes
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
        assert_eq!(header_routes(&headers), ["a", "b", "hidden"]);
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
        // A CC that is not an array routes nowhere, so it needs no decode.
        assert!(!may_have_header_routes(&encoded(vec![(
            "CC",
            AMQPValue::LongString(LongString::from(b"a".to_vec()))
        )])));
        assert!(!may_have_header_routes(&RawProperties::from_properties(
            &amq_protocol::protocol::BasicProperties::default()
        )));
    }

    #[test]
    fn values_that_are_not_string_arrays_route_nowhere() {
        let mut headers = BTreeMap::new();
        headers.insert(
            "CC".into(),
            AMQPValue::LongString(LongString::from(b"not-an-array".to_vec())),
        );
        headers.insert(
            "BCC".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongLongInt(1)])),
        );
        assert!(header_routes(&headers).is_empty());
    }
}
