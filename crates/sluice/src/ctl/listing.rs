//! The `list_*` commands: which API listing each reads, the columns it
//! offers under rabbitmqctl's names, and which it shows by default.
//!
//! A column is a field of the API's objects, found by a path
//! (`consumers`' `queue_name` is `queue.name`); where rabbitmqctl names a
//! process id (`channel_pid`), Sluice offers the object's name instead.

use serde_json::Value;

use super::client::Subject;
use super::error::{CtlError, CtlResult};
use super::Context;

/// Where a column's value comes from.
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// A field of the API's object, by its path.
    Field(&'static [&'static str]),
    /// The same for every row (a binding's source is always an exchange).
    Constant(&'static str),
}

#[derive(Clone, Copy, Debug)]
pub struct Column {
    pub name: &'static str,
    pub source: Source,
}

impl Column {
    fn value(&self, object: &Value) -> Value {
        match self.source {
            Source::Field(path) => {
                // An empty path: the field named as the column.
                let path = if path.is_empty() {
                    std::slice::from_ref(&self.name)
                } else {
                    path
                };
                path.iter()
                    .try_fold(object, |value, key| value.get(key))
                    .cloned()
                    .unwrap_or(Value::Null)
            }
            Source::Constant(text) => Value::from(text),
        }
    }
}

/// A column that is the API's field of the same name.
const fn same(name: &'static str) -> Column {
    Column {
        name,
        source: Source::Field(&[]),
    }
}

/// A column read from another path.
const fn at(name: &'static str, path: &'static [&'static str]) -> Column {
    Column {
        name,
        source: Source::Field(path),
    }
}

/// What one `list_*` command can show.
pub struct Catalogue {
    pub columns: &'static [Column],
    pub default: &'static [&'static str],
}

pub const QUEUES: Catalogue = Catalogue {
    columns: &[
        same("name"),
        same("vhost"),
        same("type"),
        same("durable"),
        same("auto_delete"),
        same("exclusive"),
        same("arguments"),
        same("policy"),
        same("state"),
        same("node"),
        same("leader"),
        same("members"),
        same("online"),
        same("messages"),
        same("messages_ready"),
        same("messages_unacknowledged"),
        same("messages_paged_out"),
        same("message_bytes_ready"),
        same("consumers"),
    ],
    default: &["name", "messages"],
};

pub const EXCHANGES: Catalogue = Catalogue {
    columns: &[
        same("name"),
        same("vhost"),
        same("type"),
        same("durable"),
        same("auto_delete"),
        same("internal"),
        same("arguments"),
        same("policy"),
    ],
    default: &["name", "type"],
};

pub const BINDINGS: Catalogue = Catalogue {
    columns: &[
        at("source_name", &["source"]),
        Column {
            name: "source_kind",
            source: Source::Constant("exchange"),
        },
        at("destination_name", &["destination"]),
        at("destination_kind", &["destination_type"]),
        same("routing_key"),
        same("arguments"),
        same("vhost"),
    ],
    default: &[
        "source_name",
        "source_kind",
        "destination_name",
        "destination_kind",
        "routing_key",
        "arguments",
    ],
};

pub const CONNECTIONS: Catalogue = Catalogue {
    columns: &[
        same("name"),
        same("user"),
        same("vhost"),
        same("host"),
        same("port"),
        same("peer_host"),
        same("peer_port"),
        same("state"),
        same("channels"),
        same("protocol"),
        same("auth_mechanism"),
        same("ssl"),
        same("timeout"),
        same("frame_max"),
        same("channel_max"),
        same("client_properties"),
        same("connected_at"),
        same("recv_oct"),
        same("send_oct"),
        same("node"),
        same("type"),
    ],
    default: &["user", "peer_host", "peer_port", "state"],
};

pub const CHANNELS: Catalogue = Catalogue {
    columns: &[
        same("name"),
        at("connection", &["connection_details", "name"]),
        same("number"),
        same("user"),
        same("vhost"),
        same("state"),
        same("consumer_count"),
        same("messages_unacknowledged"),
        same("prefetch_count"),
        same("global_prefetch_count"),
        same("confirm"),
        same("transactional"),
        same("node"),
    ],
    default: &["name", "user", "consumer_count", "messages_unacknowledged"],
};

pub const CONSUMERS: Catalogue = Catalogue {
    columns: &[
        at("queue_name", &["queue", "name"]),
        at("channel_name", &["channel_details", "name"]),
        at("connection_name", &["channel_details", "connection_name"]),
        same("consumer_tag"),
        same("ack_required"),
        same("prefetch_count"),
        same("exclusive"),
        same("active"),
        same("activity_status"),
        same("arguments"),
    ],
    default: &[
        "queue_name",
        "channel_name",
        "consumer_tag",
        "ack_required",
        "prefetch_count",
        "active",
        "activity_status",
        "arguments",
    ],
};

pub const USERS: Catalogue = Catalogue {
    columns: &[at("user", &["name"]), same("tags")],
    default: &["user", "tags"],
};

pub const VHOSTS: Catalogue = Catalogue {
    columns: &[
        same("name"),
        same("description"),
        same("tags"),
        same("tracing"),
        same("default_queue_type"),
        same("cluster_state"),
    ],
    default: &["name"],
};

pub const PERMISSIONS: Catalogue = Catalogue {
    columns: &[same("user"), same("configure"), same("write"), same("read")],
    default: &["user", "configure", "write", "read"],
};

pub const USER_PERMISSIONS: Catalogue = Catalogue {
    columns: &[
        same("vhost"),
        same("configure"),
        same("write"),
        same("read"),
    ],
    default: &["vhost", "configure", "write", "read"],
};

pub const POLICIES: Catalogue = Catalogue {
    columns: &[
        same("vhost"),
        same("name"),
        same("pattern"),
        same("apply-to"),
        same("definition"),
        same("priority"),
    ],
    default: &[
        "vhost",
        "name",
        "pattern",
        "apply-to",
        "definition",
        "priority",
    ],
};

impl Catalogue {
    /// The columns `requested` (rabbitmqctl takes them as separate words
    /// or comma-separated), or the defaults when none are.
    ///
    /// # Errors
    /// [`CtlError::Usage`] naming the unknown ones and listing the others.
    pub fn select(&self, requested: &[String]) -> CtlResult<Vec<Column>> {
        let names: Vec<&str> = requested
            .iter()
            .flat_map(|word| word.split(','))
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .collect();
        let names = if names.is_empty() {
            self.default.to_vec()
        } else {
            names
        };
        let find = |name: &str| self.columns.iter().find(|column| column.name == name);
        let unknown: Vec<&str> = names
            .iter()
            .copied()
            .filter(|name| find(name).is_none())
            .collect();
        if !unknown.is_empty() {
            let allowed: Vec<&str> = self.columns.iter().map(|column| column.name).collect();
            return Err(CtlError::Usage(format!(
                "info key(s) {} are not supported; allowed info keys are: {}",
                unknown.join(", "),
                allowed.join(", ")
            )));
        }
        Ok(names
            .iter()
            .map(|name| *find(name).expect("checked above"))
            .collect())
    }
}

/// Prints the listing at `path` with the `requested` columns of
/// `catalogue`, after `banner`.
///
/// # Errors
/// An unknown column (before anything is asked of the node), and the
/// node's refusals.
pub fn list(
    context: &Context,
    catalogue: &Catalogue,
    path: &str,
    subject: &Subject,
    banner: &str,
    requested: &[String],
) -> CtlResult<()> {
    let columns = catalogue.select(requested)?;
    context.output.banner(banner);
    let listed = context.client.get(path, subject)?;
    let Value::Array(objects) = listed else {
        return Err(CtlError::Unexpected(format!("{path} is not a list")));
    };
    let rows: Vec<Vec<Value>> = objects
        .iter()
        .map(|object| columns.iter().map(|column| column.value(object)).collect())
        .collect();
    let names: Vec<&str> = columns.iter().map(|column| column.name).collect();
    context.output.rows(&names, &rows);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn columns_are_read_by_name_or_path() {
        let columns = CONSUMERS
            .select(&["queue_name,consumer_tag".to_owned()])
            .unwrap();
        let consumer = json!({"queue": {"name": "q", "vhost": "/"}, "consumer_tag": "c1"});
        let values: Vec<Value> = columns.iter().map(|c| c.value(&consumer)).collect();
        assert_eq!(values, vec![json!("q"), json!("c1")]);
        let binding = json!({"source": "x", "destination": "q"});
        let kind = BINDINGS.select(&["source_kind".to_owned()]).unwrap();
        assert_eq!(kind[0].value(&binding), json!("exchange"));
    }

    #[test]
    fn defaults_are_rabbitmqctl_ones_and_unknown_columns_are_refused() {
        let names: Vec<&str> = QUEUES.select(&[]).unwrap().iter().map(|c| c.name).collect();
        assert_eq!(names, ["name", "messages"]);
        let error = QUEUES
            .select(&["name".to_owned(), "pid".to_owned()])
            .unwrap_err();
        assert!(error
            .to_string()
            .starts_with("info key(s) pid are not supported"));
        for catalogue in [
            &QUEUES,
            &EXCHANGES,
            &BINDINGS,
            &CONNECTIONS,
            &CHANNELS,
            &CONSUMERS,
            &USERS,
            &VHOSTS,
            &PERMISSIONS,
            &USER_PERMISSIONS,
            &POLICIES,
        ] {
            catalogue.select(&[]).expect("the defaults are columns");
        }
    }
}
