//! Sender-selected distribution: a publisher may list more routing keys in the `CC` and
//! `BCC` headers (arrays of strings), and the message is routed with each of them as well as
//! with its routing key, one copy per queue. `BCC` is removed before the message is stored,
//! so no consumer learns who else received it. RabbitMQ's `rabbit_basic:header_routes/1`
//! and `strip_bcc/1`; dead-lettering routes with the same keys.

use std::collections::BTreeMap;

use amq_protocol::types::{AMQPValue, FieldTable, ShortString};
use bytes::Bytes;

/// The header naming routing keys that are stripped before delivery.
const BCC: &str = "BCC";

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
