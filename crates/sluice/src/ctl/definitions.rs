//! `export_definitions` and `import_definitions`: RabbitMQ's definitions
//! JSON, through `/api/definitions`, to and from a file or `-`.

use std::io::Read as _;

use serde_json::Value;

use super::client::Subject;
use super::error::{CtlError, CtlResult};
use super::Context;

/// The largest definitions file taken: the management API's request body
/// limit (RabbitMQ's `management.http.max_body_size` default, 20 MiB); a
/// larger one would be refused after being sent whole.
const DEFINITIONS_BYTES_MAX: u64 = 20 * 1024 * 1024;

/// Standard input or output, as a file name.
const STANDARD_STREAM: &str = "-";

/// Writes the node's definitions as the node gave them, unchanged.
pub fn export_definitions(context: &Context, file: &str) -> CtlResult<()> {
    let answer = context
        .client
        .expect_success("GET", "/api/definitions", None, &Subject::Node)?;
    answer.json()?;
    if file == STANDARD_STREAM {
        context.output.raw(&answer.text);
        if !answer.text.ends_with('\n') {
            context.output.raw("\n");
        }
        return Ok(());
    }
    context.output.banner(&format!(
        "Exporting definitions in JSON to a file at \"{file}\" ..."
    ));
    std::fs::write(file, &answer.text)
        .map_err(|error| CtlError::Input(format!("cannot write {file}: {error}")))
}

pub fn import_definitions(context: &Context, file: &str) -> CtlResult<()> {
    let text = read_definitions(file)?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(_)) => {}
        Ok(_) => {
            return Err(CtlError::Input(format!(
                "{file} does not hold a JSON object of definitions"
            )))
        }
        Err(error) => return Err(CtlError::Input(format!("{file} is not JSON: {error}"))),
    }
    let source = if file == STANDARD_STREAM {
        "standard input".to_owned()
    } else {
        format!("a file at \"{file}\"")
    };
    context
        .output
        .banner(&format!("Importing definitions in JSON from {source} ..."));
    context
        .client
        .expect_success("POST", "/api/definitions", Some(text), &Subject::Node)
        .map(drop)
}

/// The file's text (standard input's for `-`), at most
/// [`DEFINITIONS_BYTES_MAX`] bytes.
fn read_definitions(file: &str) -> CtlResult<String> {
    let unreadable =
        |error: std::io::Error| CtlError::Input(format!("cannot read {file}: {error}"));
    let mut text = String::new();
    let read = if file == STANDARD_STREAM {
        std::io::stdin()
            .lock()
            .take(DEFINITIONS_BYTES_MAX + 1)
            .read_to_string(&mut text)
    } else {
        std::fs::File::open(file).and_then(|opened| {
            opened
                .take(DEFINITIONS_BYTES_MAX + 1)
                .read_to_string(&mut text)
        })
    };
    read.map_err(unreadable)?;
    if text.len() as u64 > DEFINITIONS_BYTES_MAX {
        return Err(CtlError::Input(format!(
            "{file} is larger than the {} MiB the management API takes",
            DEFINITIONS_BYTES_MAX / (1024 * 1024)
        )));
    }
    Ok(text)
}
