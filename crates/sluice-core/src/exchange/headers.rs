//! Headers exchange: a message goes to the destinations whose binding
//! arguments match its headers property, as RabbitMQ's
//! `rabbit_exchange_type_headers` decides:
//!
//! - `x-match` picks the mode: `all` (the default when absent), `any`,
//!   `all-with-x`, `any-with-x`. It must be a longstr naming one of those.
//! - `x-match` itself never takes part in matching. Other arguments starting
//!   with `x-` take part only in the `*-with-x` modes.
//! - An argument whose value is void matches when the header is present,
//!   whatever its value; any other argument matches when the header is present
//!   with an equal value.
//! - `all` holds when every argument matches, so a binding with no arguments
//!   left matches every message, with or without headers. `any` holds when
//!   at least one argument matches, so such a binding matches nothing.
//!
//! Values compare like Erlang's `==`, as RabbitMQ compares them: across
//! integer widths and signedness, integers against floats by value, and
//! longstr against byte array by content; the AMQP type tag does not count.

use std::fmt::Write as _;

use amq_protocol::types::{AMQPValue, FieldTable, ShortString};

use super::{deduplicate_tail, Destination};

const MATCH_ARGUMENT: &str = "x-match";
const EXTENSION_PREFIX: &str = "x-";

/// What one headers binding asks of a message, parsed once at bind time so the
/// per-message path does no string comparisons on `x-match`.
#[derive(Debug, PartialEq)]
pub(super) struct HeadersSpec {
    /// `all` / `all-with-x` when true, `any` / `any-with-x` when false.
    require_all: bool,
    /// Header name and the value it must have; `None` when mere presence
    /// suffices (a void value in the binding).
    conditions: Vec<(ShortString, Option<AMQPValue>)>,
}

impl HeadersSpec {
    /// Parses and validates a binding's arguments.
    ///
    /// # Errors
    /// RabbitMQ's message for an invalid `x-match`: a longstr that is not one
    /// of the four modes, or a value of another type.
    pub(super) fn parse(arguments: &FieldTable) -> Result<Self, String> {
        let (require_all, include_extensions) = match arguments.inner().get(MATCH_ARGUMENT) {
            None => (true, false),
            Some(AMQPValue::LongString(text)) => parse_mode(text.as_bytes())?,
            // Never decoded from the wire (there `s` is a short int), but code
            // building arguments by hand may use it for a string.
            Some(AMQPValue::ShortString(text)) => parse_mode(text.as_str().as_bytes())?,
            Some(other) => {
                return Err(format!(
                    "Invalid x-match field type {} (value {}); expected longstr",
                    crate::arguments::type_name(other),
                    erlang_term(other)
                ));
            }
        };
        let conditions = arguments
            .into_iter()
            .filter(|(name, _)| name.as_str() != MATCH_ARGUMENT)
            .filter(|(name, _)| include_extensions || !name.as_str().starts_with(EXTENSION_PREFIX))
            .map(|(name, value)| {
                let required_value = match value {
                    AMQPValue::Void => None,
                    other => Some(other.clone()),
                };
                (name.clone(), required_value)
            })
            .collect();
        Ok(HeadersSpec {
            require_all,
            conditions,
        })
    }

    pub(super) fn matches(&self, headers: Option<&FieldTable>) -> bool {
        let condition_holds = |(name, required_value): &(ShortString, Option<AMQPValue>)| {
            let present = headers.and_then(|table| table.inner().get(name.as_str()));
            match (present, required_value) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(value), Some(required)) => values_equal(required, value),
            }
        };
        if self.require_all {
            self.conditions.iter().all(condition_holds)
        } else {
            self.conditions.iter().any(condition_holds)
        }
    }
}

/// Returns (require_all, include_extensions) for an `x-match` string.
fn parse_mode(text: &[u8]) -> Result<(bool, bool), String> {
    match text {
        b"all" => Ok((true, false)),
        b"any" => Ok((false, false)),
        b"all-with-x" => Ok((true, true)),
        b"any-with-x" => Ok((false, true)),
        other => Err(format!(
            "Invalid x-match field value {}; expected all, any, all-with-x, or any-with-x",
            erlang_binary(other)
        )),
    }
}

/// The headers bindings of one exchange. Every binding must be tried against
/// every message (the match depends on the message's headers as a whole), so a
/// flat vector is the fastest structure to scan.
#[derive(Default)]
pub(super) struct HeadersMatcher {
    bindings: Vec<(Destination, HeadersSpec)>,
}

impl HeadersMatcher {
    pub(super) fn add(&mut self, destination: Destination, spec: HeadersSpec) {
        self.bindings.push((destination, spec));
    }

    /// Removes one binding of `destination` with this spec. Bindings with equal
    /// specs match identically, so which of several equal ones goes is
    /// irrelevant.
    pub(super) fn remove(&mut self, destination: &Destination, spec: &HeadersSpec) {
        let found = self
            .bindings
            .iter()
            .position(|(existing_destination, existing_spec)| {
                existing_destination == destination && existing_spec == spec
            });
        if let Some(position) = found {
            self.bindings.swap_remove(position);
        }
    }

    pub(super) fn remove_destination(&mut self, destination: &Destination) {
        self.bindings
            .retain(|(existing_destination, _)| existing_destination != destination);
    }

    pub(super) fn route(&self, headers: Option<&FieldTable>, out: &mut Vec<Destination>) {
        let start = out.len();
        for (destination, spec) in &self.bindings {
            if spec.matches(headers) {
                out.push(destination.clone());
            }
        }
        // One destination may have several matching bindings (different
        // arguments); RabbitMQ delivers one copy.
        deduplicate_tail(out, start);
    }
}

/// A value reduced to what Erlang's `==` compares.
enum Comparable<'value> {
    Integer(i128),
    Float(f64),
    Bytes(&'value [u8]),
    Boolean(bool),
    /// Decimal, void, array, table: compared structurally, type tags included
    /// (in RabbitMQ nested values keep their tags).
    Structured(&'value AMQPValue),
}

fn comparable(value: &AMQPValue) -> Comparable<'_> {
    match value {
        AMQPValue::Boolean(flag) => Comparable::Boolean(*flag),
        AMQPValue::ShortShortInt(number) => Comparable::Integer(i128::from(*number)),
        AMQPValue::ShortShortUInt(number) => Comparable::Integer(i128::from(*number)),
        AMQPValue::ShortInt(number) => Comparable::Integer(i128::from(*number)),
        AMQPValue::ShortUInt(number) => Comparable::Integer(i128::from(*number)),
        AMQPValue::LongInt(number) => Comparable::Integer(i128::from(*number)),
        AMQPValue::LongUInt(number) => Comparable::Integer(i128::from(*number)),
        AMQPValue::LongLongInt(number) => Comparable::Integer(i128::from(*number)),
        AMQPValue::Timestamp(number) => Comparable::Integer(i128::from(*number)),
        AMQPValue::Float(number) => Comparable::Float(f64::from(*number)),
        AMQPValue::Double(number) => Comparable::Float(*number),
        AMQPValue::LongString(text) => Comparable::Bytes(text.as_bytes()),
        AMQPValue::ShortString(text) => Comparable::Bytes(text.as_str().as_bytes()),
        AMQPValue::ByteArray(bytes) => Comparable::Bytes(bytes.as_slice()),
        AMQPValue::DecimalValue(_)
        | AMQPValue::Void
        | AMQPValue::FieldArray(_)
        | AMQPValue::FieldTable(_) => Comparable::Structured(value),
    }
}

fn values_equal(left: &AMQPValue, right: &AMQPValue) -> bool {
    match (comparable(left), comparable(right)) {
        (Comparable::Integer(left), Comparable::Integer(right)) => left == right,
        (Comparable::Float(left), Comparable::Float(right)) => left == right,
        // i128 to f64 rounds only beyond 2^53, far past any header value that
        // could equal a float exactly anyway.
        (Comparable::Integer(integer), Comparable::Float(float))
        | (Comparable::Float(float), Comparable::Integer(integer)) => integer as f64 == float,
        (Comparable::Bytes(left), Comparable::Bytes(right)) => left == right,
        (Comparable::Boolean(left), Comparable::Boolean(right)) => left == right,
        (Comparable::Structured(left), Comparable::Structured(right)) => left == right,
        _ => false,
    }
}

/// A value printed as Erlang's `~tp` prints RabbitMQ's representation of it,
/// so error messages read the same as RabbitMQ's.
fn erlang_term(value: &AMQPValue) -> String {
    match value {
        AMQPValue::Boolean(flag) => flag.to_string(),
        AMQPValue::ShortShortInt(number) => number.to_string(),
        AMQPValue::ShortShortUInt(number) => number.to_string(),
        AMQPValue::ShortInt(number) => number.to_string(),
        AMQPValue::ShortUInt(number) => number.to_string(),
        AMQPValue::LongInt(number) => number.to_string(),
        AMQPValue::LongUInt(number) => number.to_string(),
        AMQPValue::LongLongInt(number) => number.to_string(),
        AMQPValue::Timestamp(number) => number.to_string(),
        AMQPValue::Float(number) => format!("{number:?}"),
        AMQPValue::Double(number) => format!("{number:?}"),
        AMQPValue::DecimalValue(decimal) => format!("{{{},{}}}", decimal.scale, decimal.value),
        AMQPValue::LongString(text) => erlang_binary(text.as_bytes()),
        AMQPValue::ShortString(text) => erlang_binary(text.as_str().as_bytes()),
        AMQPValue::ByteArray(bytes) => erlang_binary(bytes.as_slice()),
        AMQPValue::Void => "undefined".to_owned(),
        AMQPValue::FieldArray(items) => {
            let items: Vec<String> = items
                .as_slice()
                .iter()
                .map(|item| {
                    format!(
                        "{{{},{}}}",
                        crate::arguments::type_name(item),
                        erlang_term(item)
                    )
                })
                .collect();
            format!("[{}]", items.join(","))
        }
        AMQPValue::FieldTable(table) => {
            let entries: Vec<String> = table
                .into_iter()
                .map(|(name, item)| {
                    format!(
                        "{{{},{},{}}}",
                        erlang_binary(name.as_str().as_bytes()),
                        crate::arguments::type_name(item),
                        erlang_term(item)
                    )
                })
                .collect();
            format!("[{}]", entries.join(","))
        }
    }
}

/// A binary as `~tp` prints it: `<<"text">>` when printable ASCII,
/// `<<"text"/utf8>>` when printable Unicode, `<<1,2,3>>` otherwise.
fn erlang_binary(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "<<>>".to_owned();
    }
    let printable = std::str::from_utf8(bytes).ok().filter(|text| {
        text.chars()
            .all(|c| !c.is_control() || "\n\r\t\u{b}\u{8}\u{c}\u{1b}".contains(c))
    });
    match printable {
        Some(text) => {
            let mut escaped = String::with_capacity(text.len());
            for c in text.chars() {
                match c {
                    '"' => escaped.push_str("\\\""),
                    '\\' => escaped.push_str("\\\\"),
                    '\n' => escaped.push_str("\\n"),
                    '\r' => escaped.push_str("\\r"),
                    '\t' => escaped.push_str("\\t"),
                    '\u{b}' => escaped.push_str("\\v"),
                    '\u{8}' => escaped.push_str("\\b"),
                    '\u{c}' => escaped.push_str("\\f"),
                    '\u{1b}' => escaped.push_str("\\e"),
                    other => escaped.push(other),
                }
            }
            let suffix = if text.is_ascii() { "" } else { "/utf8" };
            format!("<<\"{escaped}\"{suffix}>>")
        }
        None => {
            let mut listed = String::from("<<");
            for (index, byte) in bytes.iter().enumerate() {
                if index > 0 {
                    listed.push(',');
                }
                // Writing to a String cannot fail.
                let _ = write!(listed, "{byte}");
            }
            listed.push_str(">>");
            listed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::tests::queue;
    use crate::exchange::{Binding, ExchangeKind, RoutingTable};
    use amq_protocol::types::{ByteArray, DecimalValue, FieldArray, LongString};

    fn text(value: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(value))
    }

    fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
        let mut table = FieldTable::default();
        for (name, value) in entries {
            table.insert((*name).into(), value.clone());
        }
        table
    }

    fn headers_binding(destination: &str, arguments: &[(&str, AMQPValue)]) -> Binding {
        Binding {
            destination: queue(destination),
            routing_key: String::new(),
            arguments: table(arguments),
        }
    }

    /// Whether one binding with `arguments` matches a message with `headers`.
    fn matches(arguments: &[(&str, AMQPValue)], headers: Option<&[(&str, AMQPValue)]>) -> bool {
        let mut routing_table = RoutingTable::new(ExchangeKind::Headers);
        routing_table
            .bind(headers_binding("q", arguments))
            .expect("valid binding");
        let headers = headers.map(table);
        let mut out = Vec::new();
        routing_table.route(b"ignored", headers.as_ref(), &mut out);
        !out.is_empty()
    }

    #[test]
    fn all_is_the_default_and_needs_every_argument() {
        let arguments = [("a", text("1")), ("b", text("2"))];
        assert!(matches(
            &arguments,
            Some(&[("a", text("1")), ("b", text("2"))])
        ));
        assert!(matches(
            &arguments,
            Some(&[("a", text("1")), ("b", text("2")), ("c", text("3"))])
        ));
        assert!(!matches(&arguments, Some(&[("a", text("1"))])));
        assert!(!matches(
            &arguments,
            Some(&[("a", text("1")), ("b", text("9"))])
        ));
        let explicit = [("x-match", text("all")), ("a", text("1")), ("b", text("2"))];
        assert!(matches(
            &explicit,
            Some(&[("a", text("1")), ("b", text("2"))])
        ));
        assert!(!matches(&explicit, Some(&[("b", text("2"))])));
    }

    #[test]
    fn any_needs_one_argument() {
        let arguments = [("x-match", text("any")), ("a", text("1")), ("b", text("2"))];
        assert!(matches(&arguments, Some(&[("a", text("1"))])));
        assert!(matches(
            &arguments,
            Some(&[("a", text("0")), ("b", text("2"))])
        ));
        assert!(!matches(
            &arguments,
            Some(&[("a", text("0")), ("b", text("0"))])
        ));
        assert!(!matches(&arguments, Some(&[("c", text("1"))])));
        assert!(!matches(&arguments, Some(&[])));
    }

    #[test]
    fn routing_key_is_ignored() {
        let mut routing_table = RoutingTable::new(ExchangeKind::Headers);
        let mut keyed = headers_binding("q", &[("a", text("1"))]);
        keyed.routing_key = "some.key".to_owned();
        routing_table.bind(keyed).expect("valid binding");
        let headers = table(&[("a", text("1"))]);
        let mut out = Vec::new();
        routing_table.route(b"other.key", Some(&headers), &mut out);
        assert_eq!(out, vec![queue("q")]);
    }

    #[test]
    fn message_without_headers() {
        // `all` with nothing left to check matches everything.
        assert!(matches(&[], None));
        assert!(matches(&[("x-match", text("all"))], None));
        assert!(matches(
            &[("x-match", text("all")), ("x-other", text("1"))],
            None
        ));
        assert!(!matches(&[("a", text("1"))], None));
        // `any` with nothing to check matches nothing.
        assert!(!matches(&[("x-match", text("any"))], None));
        assert!(!matches(
            &[("x-match", text("any"))],
            Some(&[("a", text("1"))])
        ));
        assert!(!matches(
            &[("x-match", text("any")), ("a", text("1"))],
            None
        ));
        // An empty headers table behaves like none.
        assert!(matches(&[], Some(&[])));
        assert!(!matches(&[("a", text("1"))], Some(&[])));
    }

    #[test]
    fn x_arguments_are_ignored_unless_with_x() {
        let all = [
            ("x-match", text("all")),
            ("x-tenant", text("t1")),
            ("a", text("1")),
        ];
        assert!(matches(&all, Some(&[("a", text("1"))])));
        assert!(matches(
            &all,
            Some(&[("a", text("1")), ("x-tenant", text("t2"))])
        ));
        let any = [("x-match", text("any")), ("x-tenant", text("t1"))];
        assert!(!matches(&any, Some(&[("x-tenant", text("t1"))])));
    }

    #[test]
    fn with_x_modes_count_x_arguments_but_not_x_match() {
        let all = [
            ("x-match", text("all-with-x")),
            ("x-tenant", text("t1")),
            ("a", text("1")),
        ];
        assert!(matches(
            &all,
            Some(&[("a", text("1")), ("x-tenant", text("t1"))])
        ));
        assert!(!matches(&all, Some(&[("a", text("1"))])));
        assert!(!matches(
            &all,
            Some(&[("a", text("1")), ("x-tenant", text("t2"))])
        ));
        // `x-match` is not itself a condition, even in the message.
        assert!(matches(&[("x-match", text("all-with-x"))], None));

        let any = [
            ("x-match", text("any-with-x")),
            ("x-tenant", text("t1")),
            ("a", text("1")),
        ];
        assert!(matches(&any, Some(&[("x-tenant", text("t1"))])));
        assert!(matches(&any, Some(&[("a", text("1"))])));
        assert!(!matches(&any, Some(&[("x-tenant", text("t2"))])));
        assert!(!matches(
            &[("x-match", text("any-with-x"))],
            Some(&[("x-match", text("any-with-x"))])
        ));
    }

    #[test]
    fn void_argument_matches_presence() {
        let all = [("a", AMQPValue::Void)];
        assert!(matches(&all, Some(&[("a", text("anything"))])));
        assert!(matches(&all, Some(&[("a", AMQPValue::LongInt(7))])));
        assert!(matches(&all, Some(&[("a", AMQPValue::Void)])));
        assert!(!matches(&all, Some(&[("b", text("1"))])));
        assert!(!matches(&all, None));
        let any = [
            ("x-match", text("any")),
            ("a", AMQPValue::Void),
            ("b", text("2")),
        ];
        assert!(matches(&any, Some(&[("a", text("x"))])));
        assert!(!matches(&any, Some(&[("b", text("3"))])));
        // A void header does not equal a non-void argument.
        assert!(!matches(
            &[("a", text("1"))],
            Some(&[("a", AMQPValue::Void)])
        ));
    }

    #[test]
    fn values_compare_across_types_like_erlang() {
        let one = [("n", AMQPValue::LongInt(1))];
        assert!(matches(&one, Some(&[("n", AMQPValue::ShortShortUInt(1))])));
        assert!(matches(&one, Some(&[("n", AMQPValue::LongLongInt(1))])));
        assert!(matches(&one, Some(&[("n", AMQPValue::Timestamp(1))])));
        assert!(matches(&one, Some(&[("n", AMQPValue::Double(1.0))])));
        assert!(!matches(&one, Some(&[("n", AMQPValue::Double(1.5))])));
        assert!(!matches(&one, Some(&[("n", AMQPValue::Boolean(true))])));
        assert!(!matches(&one, Some(&[("n", text("1"))])));
        let negative = [("n", AMQPValue::ShortInt(-1))];
        assert!(!matches(
            &negative,
            Some(&[("n", AMQPValue::Timestamp(u64::MAX))])
        ));

        let bytes = [("s", text("abc"))];
        assert!(matches(
            &bytes,
            Some(&[("s", AMQPValue::ByteArray(ByteArray::from(&b"abc"[..])))])
        ));
        assert!(!matches(&bytes, Some(&[("s", text("ABC"))])));

        let flag = [("f", AMQPValue::Boolean(true))];
        assert!(matches(&flag, Some(&[("f", AMQPValue::Boolean(true))])));
        assert!(!matches(&flag, Some(&[("f", AMQPValue::Boolean(false))])));

        let decimal = AMQPValue::DecimalValue(DecimalValue {
            scale: 2,
            value: 150,
        });
        assert!(matches(&[("d", decimal.clone())], Some(&[("d", decimal)])));
        let array = AMQPValue::FieldArray(FieldArray::from(vec![text("x")]));
        assert!(matches(&[("l", array.clone())], Some(&[("l", array)])));
    }

    #[test]
    fn invalid_x_match_value_is_rejected_with_rabbitmq_wording() {
        let mut routing_table = RoutingTable::new(ExchangeKind::Headers);
        let result = routing_table.bind(headers_binding("q", &[("x-match", text("foo"))]));
        assert_eq!(
            result,
            Err("Invalid x-match field value <<\"foo\">>; expected all, any, all-with-x, or any-with-x"
                .to_owned())
        );
        // Modes are case-sensitive, as in RabbitMQ.
        assert!(routing_table
            .bind(headers_binding("q", &[("x-match", text("ALL"))]))
            .is_err());
        assert!(routing_table.is_empty());
    }

    #[test]
    fn invalid_x_match_type_is_rejected_with_rabbitmq_wording() {
        let mut routing_table = RoutingTable::new(ExchangeKind::Headers);
        let result =
            routing_table.bind(headers_binding("q", &[("x-match", AMQPValue::LongInt(1))]));
        assert_eq!(
            result,
            Err("Invalid x-match field type signedint (value 1); expected longstr".to_owned())
        );
        let result = routing_table.bind(headers_binding(
            "q",
            &[("x-match", AMQPValue::Boolean(true))],
        ));
        assert_eq!(
            result,
            Err("Invalid x-match field type bool (value true); expected longstr".to_owned())
        );
        assert!(routing_table.is_empty());
    }

    #[test]
    fn erlang_binary_formats_like_tp() {
        assert_eq!(erlang_binary(b""), "<<>>");
        assert_eq!(erlang_binary(b"a\"b\\"), "<<\"a\\\"b\\\\\">>");
        assert_eq!(erlang_binary("é".as_bytes()), "<<\"é\"/utf8>>");
        assert_eq!(erlang_binary(&[0, 255]), "<<0,255>>");
    }

    #[test]
    fn other_kinds_accept_any_x_match() {
        for kind in [
            ExchangeKind::Direct,
            ExchangeKind::Fanout,
            ExchangeKind::Topic,
        ] {
            let mut routing_table = RoutingTable::new(kind);
            let result = routing_table.bind(headers_binding("q", &[("x-match", text("foo"))]));
            assert_eq!(result, Ok(true), "{kind:?}");
        }
    }

    #[test]
    fn destination_with_two_matching_bindings_appears_once() {
        let mut routing_table = RoutingTable::new(ExchangeKind::Headers);
        routing_table
            .bind(headers_binding("q", &[("a", text("1"))]))
            .expect("valid binding");
        routing_table
            .bind(headers_binding("q", &[("b", text("2"))]))
            .expect("valid binding");
        routing_table
            .bind(headers_binding("r", &[("b", text("2"))]))
            .expect("valid binding");
        let headers = table(&[("a", text("1")), ("b", text("2"))]);
        let mut out = Vec::new();
        routing_table.route(b"", Some(&headers), &mut out);
        out.sort_by(crate::exchange::destination_order);
        assert_eq!(out, vec![queue("q"), queue("r")]);
    }

    #[test]
    fn unbind_removes_only_that_binding() {
        let mut routing_table = RoutingTable::new(ExchangeKind::Headers);
        let first = headers_binding("q", &[("a", text("1"))]);
        let second = headers_binding("q", &[("x-match", text("any")), ("b", text("2"))]);
        routing_table.bind(first.clone()).expect("valid binding");
        routing_table.bind(second.clone()).expect("valid binding");
        assert_eq!(routing_table.bind(first.clone()), Ok(false));
        assert!(routing_table.unbind(&first));
        let route = |routing_table: &RoutingTable, headers: &FieldTable| {
            let mut out = Vec::new();
            routing_table.route(b"", Some(headers), &mut out);
            out
        };
        assert!(route(&routing_table, &table(&[("a", text("1"))])).is_empty());
        assert_eq!(
            route(&routing_table, &table(&[("b", text("2"))])),
            vec![queue("q")]
        );
        assert!(routing_table.unbind(&second));
        assert!(route(&routing_table, &table(&[("b", text("2"))])).is_empty());
        assert!(routing_table.is_empty());
    }
}
