//! Rows of JSON values printed as rabbitmqctl prints them: an aligned
//! table under a header row, or a JSON array with one object per row.

use serde_json::Value;

/// Spaces between two columns of a table.
const COLUMN_GAP: usize = 2;

/// A value as one table cell: text as it is, lists in brackets as
/// rabbitmqctl shows tags and members (`[administrator, monitoring]`),
/// objects (arguments, definitions) as compact JSON. Line breaks are
/// escaped so that every row stays one line.
pub fn cell_text(value: &Value) -> String {
    let text = match value {
        Value::Null => String::new(),
        Value::String(text) => text.clone(),
        Value::Bool(_) | Value::Number(_) | Value::Object(_) => value.to_string(),
        Value::Array(items) => {
            let items: Vec<String> = items
                .iter()
                .map(|item| match item {
                    Value::Array(_) | Value::Object(_) => item.to_string(),
                    _ => cell_text(item),
                })
                .collect();
            format!("[{}]", items.join(", "))
        }
    };
    text.replace('\n', "\\n").replace('\t', "\\t")
}

/// An aligned table: every column as wide as its widest cell, the last
/// one not padded, each line ending in a newline. No rows and no header
/// gives an empty string.
pub fn render_table(header: Option<&[&str]>, rows: &[Vec<Value>]) -> String {
    let mut lines: Vec<Vec<String>> = Vec::with_capacity(rows.len() + 1);
    if let Some(header) = header {
        lines.push(header.iter().map(|name| (*name).to_owned()).collect());
    }
    lines.extend(rows.iter().map(|row| row.iter().map(cell_text).collect()));
    let columns = lines.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|column| {
            lines
                .iter()
                .filter_map(|line| line.get(column))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in &lines {
        let mut text = String::new();
        for (column, cell) in line.iter().enumerate() {
            text.push_str(cell);
            if column + 1 < line.len() {
                let padding = widths[column] - cell.chars().count() + COLUMN_GAP;
                text.extend(std::iter::repeat_n(' ', padding));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

/// A JSON array with one object per row, its keys in column order (as
/// asked for, not sorted), one row per line.
pub fn render_json_rows(columns: &[&str], rows: &[Vec<Value>]) -> String {
    if rows.is_empty() {
        return "[]\n".to_owned();
    }
    let objects: Vec<String> = rows
        .iter()
        .map(|row| json_object(columns.iter().copied().zip(row.iter())))
        .collect();
    format!("[\n{}\n]\n", objects.join(",\n"))
}

/// A JSON object of `fields`, in their order.
pub fn json_object<'a>(fields: impl Iterator<Item = (&'a str, &'a Value)>) -> String {
    let members: Vec<String> = fields
        .map(|(key, value)| format!("{}:{value}", Value::from(key)))
        .collect();
    format!("{{{}}}", members.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn columns_align_under_the_header() {
        let rows = vec![vec![json!("orders"), json!(12)], vec![json!("a"), json!(0)]];
        assert_eq!(
            render_table(Some(&["name", "messages"]), &rows),
            "name    messages\norders  12\na       0\n"
        );
        assert_eq!(render_table(None, &rows[1..]), "a  0\n");
        assert_eq!(render_table(None, &[]), "");
    }

    #[test]
    fn cells_show_lists_and_objects_on_one_line() {
        assert_eq!(
            cell_text(&json!(["administrator", "x"])),
            "[administrator, x]"
        );
        assert_eq!(
            cell_text(&json!({"x-max-length": 10})),
            r#"{"x-max-length":10}"#
        );
        assert_eq!(cell_text(&json!(null)), "");
        assert_eq!(cell_text(&json!(true)), "true");
        assert_eq!(cell_text(&json!("two\nlines")), "two\\nlines");
    }

    #[test]
    fn json_rows_keep_the_column_order() {
        let rows = vec![vec![json!("q"), json!(3)]];
        assert_eq!(
            render_json_rows(&["name", "messages"], &rows),
            "[\n{\"name\":\"q\",\"messages\":3}\n]\n"
        );
        assert_eq!(render_json_rows(&["name"], &[]), "[]\n");
    }
}
