//! Where `sluice ctl` prints: standard output, in the `--formatter` asked
//! for, with rabbitmqctl's informational banners unless `--quiet`.
//!
//! As in rabbitmqctl, banners go only with the table formatter: JSON output
//! stays parseable as it is. A closed standard output (`| head`) ends the
//! printing quietly instead of panicking.

use std::io::Write as _;

use serde_json::Value;

use super::table::{cell_text, json_object, render_json_rows, render_table};

/// One named value of a report such as `status`.
pub struct Field {
    /// Its key in JSON output.
    pub key: &'static str,
    /// Its label in table output.
    pub label: &'static str,
    pub value: Value,
}

impl Field {
    pub fn new(key: &'static str, label: &'static str, value: Value) -> Field {
        Field { key, label, value }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Formatter {
    /// Aligned columns under a header row.
    Table,
    /// A JSON array of objects (listings) or one object.
    Json,
}

#[derive(Clone, Copy, Debug)]
pub struct Output {
    pub formatter: Formatter,
    pub quiet: bool,
    pub table_headers: bool,
}

impl Output {
    /// rabbitmqctl's line before a command's output, "Listing queues for
    /// vhost / ...".
    pub fn banner(&self, text: &str) {
        if !self.quiet && self.formatter == Formatter::Table {
            print_text(&format!("{text}\n"));
        }
    }

    /// A listing, one row per object, `columns` naming the values.
    pub fn rows(&self, columns: &[&str], rows: &[Vec<Value>]) {
        let text = match self.formatter {
            Formatter::Table => render_table(self.table_headers.then_some(columns), rows),
            Formatter::Json => render_json_rows(columns, rows),
        };
        print_text(&text);
    }

    /// Named values (a node's status): `Label: value` lines, or one object
    /// of the fields' keys.
    pub fn fields(&self, fields: &[Field]) {
        let text = match self.formatter {
            Formatter::Table => fields
                .iter()
                .map(|field| format!("{}: {}\n", field.label, cell_text(&field.value)))
                .collect(),
            Formatter::Json => format!(
                "{}\n",
                json_object(fields.iter().map(|field| (field.key, &field.value)))
            ),
        };
        print_text(&text);
    }

    /// The sentence a command ends with ("Queue was successfully deleted
    /// with 3 messages"); with JSON, `{"result":"ok","message":...}`.
    pub fn message(&self, text: &str) {
        match self.formatter {
            Formatter::Table => print_text(&format!("{text}\n")),
            Formatter::Json => {
                let fields = [
                    ("result", Value::from("ok")),
                    ("message", Value::from(text)),
                ];
                print_text(&format!(
                    "{}\n",
                    json_object(fields.iter().map(|(k, v)| (*k, v)))
                ));
            }
        }
    }

    /// Text as it is (an exported definitions file on `-`).
    pub fn raw(&self, text: &str) {
        print_text(text);
    }
}

fn print_text(text: &str) {
    let mut stdout = std::io::stdout().lock();
    // A reader that went away (`| head`) is not an error of the command.
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}
