//! AMQP field values as the management API writes them in JSON, as
//! RabbitMQ's `rabbit_mgmt_format` does: numbers as numbers, strings and
//! byte arrays as strings, tables as objects, arrays as arrays.

use amq_protocol::types::{AMQPValue, FieldTable};
use serde_json::{Map, Value};

pub fn table_to_json(table: &FieldTable) -> Value {
    let mut map = Map::new();
    for (key, value) in table.inner() {
        map.insert(key.as_str().to_owned(), value_to_json(value));
    }
    Value::Object(map)
}

pub fn value_to_json(value: &AMQPValue) -> Value {
    match value {
        AMQPValue::Boolean(flag) => Value::Bool(*flag),
        AMQPValue::ShortShortInt(number) => (*number).into(),
        AMQPValue::ShortShortUInt(number) => (*number).into(),
        AMQPValue::ShortInt(number) => (*number).into(),
        AMQPValue::ShortUInt(number) => (*number).into(),
        AMQPValue::LongInt(number) => (*number).into(),
        AMQPValue::LongUInt(number) => (*number).into(),
        AMQPValue::LongLongInt(number) => (*number).into(),
        AMQPValue::Float(number) => (*number as f64).into(),
        AMQPValue::Double(number) => (*number).into(),
        AMQPValue::DecimalValue(decimal) => {
            (decimal.value as f64 / 10f64.powi(decimal.scale as i32)).into()
        }
        AMQPValue::ShortString(text) => text.as_str().into(),
        AMQPValue::LongString(text) => String::from_utf8_lossy(text.as_bytes()).into(),
        AMQPValue::ByteArray(bytes) => String::from_utf8_lossy(bytes.as_slice()).into(),
        AMQPValue::FieldArray(array) => {
            Value::Array(array.as_slice().iter().map(value_to_json).collect())
        }
        AMQPValue::Timestamp(seconds) => (*seconds).into(),
        AMQPValue::FieldTable(table) => table_to_json(table),
        AMQPValue::Void => Value::Null,
    }
}

/// Definitions (policies, parameters) as the API lists them: their
/// serialized form, which is RabbitMQ's definitions JSON.
pub fn to_json<T: serde::Serialize>(items: Vec<T>) -> Vec<Value> {
    items
        .into_iter()
        .map(|item| serde_json::to_value(item).expect("definitions always encode"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::definitions_import::json_to_table;

    #[test]
    fn arguments_round_trip_through_json() {
        let json = serde_json::json!({
            "x-max-length": 10,
            "x-queue-type": "quorum",
            "x-single-active-consumer": true,
            "nested": {"list": [1, "two"]}
        });
        let table = json_to_table(json.as_object().unwrap()).unwrap();
        assert_eq!(table_to_json(&table), json);
    }

    #[test]
    fn arguments_a_client_cannot_send_over_amqp_are_refused_not_panicked_on() {
        let long_key = serde_json::json!({ "k".repeat(256): 1 });
        assert!(json_to_table(long_key.as_object().unwrap()).is_err());
        let mut deep = serde_json::json!(1);
        for _ in 0..100 {
            deep = serde_json::json!({ "a": deep });
        }
        assert!(json_to_table(deep.as_object().unwrap()).is_err());
        let mut fine = serde_json::json!(1);
        for _ in 0..10 {
            fine = serde_json::json!({ "a": [fine] });
        }
        assert!(json_to_table(fine.as_object().unwrap()).is_ok());
    }
}
