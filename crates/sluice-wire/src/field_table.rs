//! A nesting check for field tables, run before `amq-protocol` parses one.
//!
//! `amq-protocol` parses nested tables and arrays by recursion. A level of
//! nesting costs the sender 5 bytes and the parser several hundred bytes of
//! stack, so about 10 KB of arrays inside arrays overflows a 2 MiB thread
//! stack (tokio's default) and aborts the whole broker. This walks the same
//! bytes with a loop and an explicit, bounded stack, and refuses nesting
//! deeper than [`FIELD_TABLE_DEPTH_MAX`] before the recursive parser sees it.
//!
//! The walk follows `amq-protocol`'s grammar and value types (RabbitMQ's
//! dialect). Where the bytes are malformed it stops and answers "within the
//! limit": the parser then rejects them at the same place, having recursed no
//! deeper than the walk did.

/// Tables and arrays may nest this deep (the outermost table is depth 1).
/// Real arguments and headers nest two or three levels; 64 leaves room for
/// any reasonable use while keeping the parser's recursion far from the end
/// of a 2 MiB stack even in a debug build.
pub const FIELD_TABLE_DEPTH_MAX: usize = 64;

/// Whether the field table at the start of `bytes` (its 4-byte length first)
/// nests no deeper than [`FIELD_TABLE_DEPTH_MAX`]. Returns the bytes after the
/// table, or `None` when it nests too deep. Malformed bytes count as within
/// the limit and return an empty rest (see the module documentation).
pub(crate) fn check_table(bytes: &[u8]) -> Option<&[u8]> {
    let Some((length, _)) = read_length(bytes, 0) else {
        return Some(&[]);
    };
    let end = 4 + length;
    if end > bytes.len() {
        return Some(&[]);
    }
    // One entry per open table or array: where it ends, and whether its
    // entries carry a key (tables) or not (arrays).
    let mut open: [(usize, bool); FIELD_TABLE_DEPTH_MAX] = [(0, false); FIELD_TABLE_DEPTH_MAX];
    open[0] = (end, true);
    let mut depth = 1;
    let mut at = 4;
    while depth > 0 {
        let (container_end, keyed) = open[depth - 1];
        if at >= container_end {
            depth -= 1;
            continue;
        }
        if keyed {
            let key_length = bytes[at] as usize;
            at += 1 + key_length;
            if at >= container_end {
                return Some(&bytes[end..]);
            }
        }
        let value_type = bytes[at];
        at += 1;
        let skip = match value_type {
            b'V' => 0,
            b't' | b'b' | b'B' => 1,
            b's' | b'U' | b'u' => 2,
            b'I' | b'i' | b'f' => 4,
            b'D' => 5,
            b'L' | b'l' | b'd' | b'T' => 8,
            b'S' | b'x' => match read_length(bytes, at) {
                Some((length, _)) => 4 + length,
                None => return Some(&bytes[end..]),
            },
            b'F' | b'A' => {
                let Some((length, _)) = read_length(bytes, at) else {
                    return Some(&bytes[end..]);
                };
                let inner_end = at + 4 + length;
                if inner_end > container_end {
                    return Some(&bytes[end..]);
                }
                if depth == FIELD_TABLE_DEPTH_MAX {
                    return None;
                }
                open[depth] = (inner_end, value_type == b'F');
                depth += 1;
                4
            }
            // An unknown type: the parser stops here too.
            _ => return Some(&bytes[end..]),
        };
        at += skip;
    }
    Some(&bytes[end..])
}

/// A big-endian u32 length at `at`, if four bytes are there.
fn read_length(bytes: &[u8], at: usize) -> Option<(usize, usize)> {
    let field = bytes.get(at..at.checked_add(4)?)?;
    let length = u32::from_be_bytes([field[0], field[1], field[2], field[3]]) as usize;
    Some((length, at + 4))
}

/// A method argument, as far as finding its field tables needs.
#[derive(Clone, Copy)]
enum Argument {
    /// Fixed-size: reserved shorts, octets, packed bits.
    Octets(usize),
    ShortString,
    Table,
}

/// The arguments up to and including the last field table, for every method
/// `amq-protocol` parses that carries one.
fn table_layout(class_id: u16, method_id: u16) -> &'static [Argument] {
    use Argument::{Octets, ShortString, Table};
    match (class_id, method_id) {
        // connection.start: version-major, version-minor, server-properties.
        (10, 10) => &[Octets(2), Table],
        // connection.start-ok: client-properties first.
        (10, 11) => &[Table],
        // exchange.declare: reserved, exchange, type, bits, arguments.
        (40, 10) => &[Octets(2), ShortString, ShortString, Octets(1), Table],
        // exchange.bind and exchange.unbind: reserved, destination, source,
        // routing-key, bits, arguments.
        (40, 30) | (40, 40) => &[
            Octets(2),
            ShortString,
            ShortString,
            ShortString,
            Octets(1),
            Table,
        ],
        // queue.declare: reserved, queue, bits, arguments.
        (50, 10) => &[Octets(2), ShortString, Octets(1), Table],
        // queue.bind: reserved, queue, exchange, routing-key, bits, arguments.
        (50, 20) => &[
            Octets(2),
            ShortString,
            ShortString,
            ShortString,
            Octets(1),
            Table,
        ],
        // queue.unbind: as queue.bind, without bits.
        (50, 50) => &[Octets(2), ShortString, ShortString, ShortString, Table],
        // basic.consume: reserved, queue, consumer-tag, bits, arguments.
        (60, 20) => &[Octets(2), ShortString, ShortString, Octets(1), Table],
        _ => &[],
    }
}

/// Whether every field table among a method's `arguments` (the payload after
/// class and method ids) nests within [`FIELD_TABLE_DEPTH_MAX`].
pub(crate) fn method_tables_within_limit(class_id: u16, method_id: u16, arguments: &[u8]) -> bool {
    let mut rest = arguments;
    for argument in table_layout(class_id, method_id) {
        rest = match *argument {
            Argument::Octets(count) => match rest.get(count..) {
                Some(rest) => rest,
                None => return true,
            },
            Argument::ShortString => match rest
                .first()
                .and_then(|length| rest.get(1 + *length as usize..))
            {
                Some(rest) => rest,
                None => return true,
            },
            Argument::Table => match check_table(rest) {
                Some(rest) => rest,
                None => return false,
            },
        };
    }
    true
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A table holding one entry, key "k", whose value is `depth - 1` arrays
    /// nested inside each other: `depth` levels in all.
    pub(crate) fn nested_table(depth: usize) -> Vec<u8> {
        let mut value = vec![b'A', 0, 0, 0, 0];
        for _ in 2..depth {
            let mut outer = vec![b'A'];
            outer.extend_from_slice(&(value.len() as u32).to_be_bytes());
            outer.extend_from_slice(&value);
            value = outer;
        }
        let mut table = Vec::new();
        table.extend_from_slice(&(2 + value.len() as u32).to_be_bytes());
        table.extend_from_slice(&[1, b'k']);
        table.extend_from_slice(&value);
        table
    }

    #[test]
    fn field_table_depth_limit_is_exact() {
        let mut bytes = nested_table(FIELD_TABLE_DEPTH_MAX);
        bytes.push(0xAB);
        assert_eq!(check_table(&bytes), Some(&[0xAB][..]));
        assert_eq!(check_table(&nested_table(FIELD_TABLE_DEPTH_MAX + 1)), None);
        assert_eq!(check_table(&nested_table(20_000)), None);
    }

    #[test]
    fn field_table_walks_every_value_type() {
        use amq_protocol::types::{
            generation::gen_field_table, AMQPValue, DecimalValue, FieldArray, FieldTable,
        };
        let mut inner = FieldTable::default();
        inner.insert("x".into(), AMQPValue::LongString("y".into()));
        let mut table = FieldTable::default();
        table.insert("t".into(), AMQPValue::Boolean(true));
        table.insert("b".into(), AMQPValue::ShortShortInt(-1));
        table.insert("B".into(), AMQPValue::ShortShortUInt(1));
        table.insert("s".into(), AMQPValue::ShortInt(-2));
        table.insert("u".into(), AMQPValue::ShortUInt(2));
        table.insert("I".into(), AMQPValue::LongInt(-3));
        table.insert("i".into(), AMQPValue::LongUInt(3));
        table.insert("l".into(), AMQPValue::LongLongInt(-4));
        table.insert("f".into(), AMQPValue::Float(1.5));
        table.insert("d".into(), AMQPValue::Double(2.5));
        table.insert(
            "D".into(),
            AMQPValue::DecimalValue(DecimalValue { scale: 1, value: 5 }),
        );
        table.insert("S".into(), AMQPValue::LongString("long".into()));
        table.insert("T".into(), AMQPValue::Timestamp(6));
        table.insert("x".into(), AMQPValue::ByteArray(vec![1, 2, 3].into()));
        table.insert("V".into(), AMQPValue::Void);
        table.insert("F".into(), AMQPValue::FieldTable(inner.clone()));
        table.insert(
            "A".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(inner)])),
        );
        let mut bytes = cookie_factory::gen_simple(gen_field_table(&table), Vec::new()).unwrap();
        bytes.extend_from_slice(b"rest");
        assert_eq!(check_table(&bytes), Some(&b"rest"[..]));
    }

    #[test]
    fn field_table_malformed_counts_as_within_limit() {
        assert_eq!(check_table(&[0, 0]), Some(&[][..]));
        assert_eq!(check_table(&[0, 0, 0, 9, 1]), Some(&[][..]));
        assert!(check_table(&[0, 0, 0, 3, 1, b'k', b'?']).is_some());
        assert!(check_table(&[0, 0, 0, 7, 1, b'k', b'F', 0, 0, 0, 99]).is_some());
    }
}
