//! RabbitMQ's definitions JSON (what `rabbitmqctl export_definitions` and
//! the management UI write), loaded at start from the file the
//! `load_definitions` key names.
//!
//! Sluice reads its `vhosts`, `users`, `permissions`, `topic_permissions`,
//! `parameters` (vhost limits among them), `global_parameters`,
//! `policies`, `exchanges`, `queues` and `bindings` sections; the others
//! are named in the log. Everything it reads becomes metadata changes,
//! proposed once the node has caught up with the log, as a client or the
//! management API would make them: policies before the objects they shape,
//! though a policy set later reaches existing objects too.

use std::path::{Path, PathBuf};

use amq_protocol::types::{AMQPValue, FieldArray, FieldTable, ShortString};
use serde::Deserialize;
use sluice_wire::FIELD_TABLE_DEPTH_MAX;

use crate::access::{
    HashingAlgorithm, PasswordHash, PermissionDefinition, TopicPermissionDefinition,
    TopicPermissions, UserDefinition, VhostLimits, VhostPermissions,
};
use crate::definitions::QueueDefinition;
use crate::metadata::{BindingChange, MetadataCommand, NodeIdentity};
use crate::policy::{Policy, PolicyError, PolicyJson};
use crate::runtime_parameters::{GlobalParameterJson, ParameterJson, VHOST_LIMITS_COMPONENT};

/// The sections of a definitions file Sluice reads.
#[derive(Debug, Default, Deserialize)]
pub struct DefinitionsFile {
    #[serde(default)]
    pub vhosts: Vec<VhostJson>,
    #[serde(default)]
    pub users: Vec<UserJson>,
    #[serde(default)]
    pub permissions: Vec<PermissionDefinition>,
    #[serde(default)]
    pub topic_permissions: Vec<TopicPermissionDefinition>,
    /// Runtime parameters; those of component `vhost-limits` are the
    /// vhosts' limits.
    #[serde(default)]
    pub parameters: Vec<ParameterJson>,
    #[serde(default)]
    pub global_parameters: Vec<GlobalParameterJson>,
    #[serde(default)]
    pub policies: Vec<PolicyJson>,
    #[serde(default)]
    pub exchanges: Vec<ExchangeJson>,
    #[serde(default)]
    pub queues: Vec<QueueJson>,
    #[serde(default)]
    pub bindings: Vec<BindingJson>,
    /// Every other section, only to name it in the log.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Deserialize)]
pub struct VhostJson {
    pub name: String,
}

#[derive(Debug, Deserialize)]
pub struct UserJson {
    pub name: String,
    #[serde(default)]
    pub password_hash: String,
    /// Absent in exports of RabbitMQ before 3.6, whose hashes are MD5.
    #[serde(default)]
    pub hashing_algorithm: Option<String>,
    #[serde(default)]
    pub tags: UserTags,
}

/// A list since RabbitMQ 3.9, a comma-separated string before.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum UserTags {
    List(Vec<String>),
    Text(String),
}

impl Default for UserTags {
    fn default() -> Self {
        Self::List(Vec::new())
    }
}

impl UserTags {
    fn to_vec(&self) -> Vec<String> {
        match self {
            Self::List(tags) => tags.clone(),
            Self::Text(text) => text
                .split(',')
                .map(str::trim)
                .filter(|tag| !tag.is_empty())
                .map(str::to_owned)
                .collect(),
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct ExchangeJson {
    pub name: String,
    pub vhost: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default = "yes")]
    pub durable: bool,
    #[serde(default)]
    pub auto_delete: bool,
    #[serde(default)]
    pub internal: bool,
    #[serde(default)]
    pub arguments: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Deserialize)]
pub struct QueueJson {
    pub name: String,
    pub vhost: String,
    #[serde(default = "yes")]
    pub durable: bool,
    #[serde(default)]
    pub auto_delete: bool,
    #[serde(default)]
    pub arguments: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Deserialize)]
pub struct BindingJson {
    pub source: String,
    pub vhost: String,
    pub destination: String,
    pub destination_type: String,
    #[serde(default)]
    pub routing_key: String,
    #[serde(default)]
    pub arguments: serde_json::Map<String, serde_json::Value>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, thiserror::Error)]
pub enum DefinitionsFileError {
    #[error("cannot read definitions file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("definitions file {} is not valid definitions JSON", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("definitions file {}: {what}", path.display())]
    Entry { path: PathBuf, what: String },
    #[error("definitions file {}", path.display())]
    Policy {
        path: PathBuf,
        #[source]
        source: PolicyError,
    },
}

/// A definitions file, read and its policies, users and permissions
/// validated.
#[derive(Debug)]
pub struct LoadedDefinitions {
    pub file: DefinitionsFile,
    /// The users as the metadata log carries them.
    pub users: Vec<UserDefinition>,
    pub vhost_limits: Vec<(String, VhostLimits)>,
}

impl LoadedDefinitions {
    /// Whether the file brings users or vhosts of its own: then the node
    /// creates no default ones, as RabbitMQ.
    pub fn brings_access(&self) -> bool {
        !self.file.users.is_empty() || !self.file.vhosts.is_empty()
    }

    /// The metadata changes that make this file's vhosts, users,
    /// permissions, limits, runtime parameters and policies, then declare
    /// its exchanges, queues and bindings, in that order. The caller proposes them one by one and
    /// logs what fails, so one bad entry does not keep the rest from
    /// loading.
    pub fn metadata_commands(&self, node: &NodeIdentity) -> Vec<MetadataCommand> {
        let mut commands: Vec<MetadataCommand> = self
            .file
            .vhosts
            .iter()
            .map(|vhost| MetadataCommand::PutVhost {
                name: vhost.name.clone(),
            })
            .collect();
        commands.extend(
            self.users
                .iter()
                .map(|user| MetadataCommand::PutUser { user: user.clone() }),
        );
        commands.extend(self.file.permissions.iter().map(|permissions| {
            MetadataCommand::SetPermissions {
                permissions: permissions.clone(),
            }
        }));
        commands.extend(self.file.topic_permissions.iter().map(|permissions| {
            MetadataCommand::SetTopicPermissions {
                permissions: permissions.clone(),
            }
        }));
        commands.extend(self.vhost_limits.iter().map(|(vhost, limits)| {
            MetadataCommand::SetVhostLimits {
                vhost: vhost.clone(),
                limits: *limits,
            }
        }));
        commands.extend(
            self.file
                .parameters
                .iter()
                .filter(|parameter| parameter.component != VHOST_LIMITS_COMPONENT)
                .map(|parameter| MetadataCommand::SetParameter {
                    component: parameter.component.clone(),
                    vhost: parameter.vhost.clone(),
                    name: parameter.name.clone(),
                    value: parameter.value.clone(),
                }),
        );
        commands.extend(self.file.global_parameters.iter().map(|parameter| {
            MetadataCommand::SetGlobalParameter {
                name: parameter.name.clone(),
                value: parameter.value.clone(),
            }
        }));
        commands.extend(
            self.file
                .policies
                .iter()
                .map(|policy| MetadataCommand::SetPolicy {
                    policy: policy.clone(),
                }),
        );
        commands.extend(self.file.metadata_commands(node));
        commands
    }
}

/// A user entry as the metadata log carries it, its hash checked.
fn user_definition(user: &UserJson) -> Result<UserDefinition, String> {
    let hashing_algorithm = HashingAlgorithm::from_definitions(user.hashing_algorithm.as_deref())
        .map_err(|error| format!("user '{}': {error}", user.name))?;
    PasswordHash::from_base64(&user.password_hash)
        .map_err(|error| format!("user '{}': {error}", user.name))?;
    Ok(UserDefinition {
        name: user.name.clone(),
        password_hash: user.password_hash.clone(),
        hashing_algorithm,
        tags: user.tags.to_vec(),
    })
}

/// `{"max-connections": N, "max-queues": N}`; a negative limit is none.
fn vhost_limits(value: &serde_json::Value) -> Result<VhostLimits, String> {
    let limit = |key: &str| -> Result<Option<u64>, String> {
        match value.get(key) {
            None => Ok(None),
            Some(limit) => match limit.as_i64() {
                Some(negative) if negative < 0 => Ok(None),
                Some(limit) => Ok(Some(limit as u64)),
                None => Err(format!("vhost limit '{key}' is not an integer: {limit}")),
            },
        }
    };
    Ok(VhostLimits {
        max_connections: limit("max-connections")?,
        max_queues: limit("max-queues")?,
    })
}

/// Reads and validates a definitions file.
///
/// # Errors
/// An unreadable file, JSON that is not RabbitMQ's definitions format, or a
/// policy RabbitMQ would refuse: the node should not start with a policy
/// silently missing.
pub fn load_definitions(path: &Path) -> Result<LoadedDefinitions, DefinitionsFileError> {
    let bytes = std::fs::read(path).map_err(|source| DefinitionsFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_definitions(&bytes, path)
}

/// Reads and validates definitions in RabbitMQ's JSON format from `bytes`
/// (a file's, or a management API import's); `path` names where they came
/// from in errors.
///
/// # Errors
/// As [`load_definitions`], but for reading.
pub fn parse_definitions(
    bytes: &[u8],
    path: &Path,
) -> Result<LoadedDefinitions, DefinitionsFileError> {
    let file: DefinitionsFile =
        serde_json::from_slice(bytes).map_err(|source| DefinitionsFileError::Parse {
            path: path.to_owned(),
            source,
        })?;
    // Checked here as well as where they are applied: a policy RabbitMQ
    // would refuse stops the node rather than go missing.
    for policy in &file.policies {
        Policy::from_json(policy).map_err(|source| DefinitionsFileError::Policy {
            path: path.to_owned(),
            source,
        })?;
    }
    let entry_error = |what: String| DefinitionsFileError::Entry {
        path: path.to_owned(),
        what,
    };
    let arguments = file
        .exchanges
        .iter()
        .map(|exchange| (&exchange.arguments, "exchange", &exchange.name))
        .chain(
            file.queues
                .iter()
                .map(|queue| (&queue.arguments, "queue", &queue.name)),
        )
        .chain(
            file.bindings
                .iter()
                .map(|binding| (&binding.arguments, "binding from", &binding.source)),
        );
    for (map, kind, name) in arguments {
        json_to_table(map)
            .map_err(|problem| entry_error(format!("arguments of {kind} '{name}': {problem}")))?;
    }
    let users = file
        .users
        .iter()
        .map(user_definition)
        .collect::<Result<Vec<_>, _>>()
        .map_err(entry_error)?;
    for permissions in &file.permissions {
        VhostPermissions::compile(permissions).map_err(|error| {
            entry_error(format!(
                "permissions of user '{}' in vhost '{}': {}",
                permissions.user, permissions.vhost, error.text
            ))
        })?;
    }
    for permissions in &file.topic_permissions {
        TopicPermissions::compile(permissions).map_err(|error| {
            entry_error(format!(
                "topic permissions of user '{}' in vhost '{}': {}",
                permissions.user, permissions.vhost, error.text
            ))
        })?;
    }
    let mut limits = Vec::new();
    for parameter in &file.parameters {
        if parameter.component == VHOST_LIMITS_COMPONENT {
            let parsed = vhost_limits(&parameter.value).map_err(|error| {
                entry_error(format!("limits of vhost '{}': {error}", parameter.vhost))
            })?;
            limits.push((parameter.vhost.clone(), parsed));
        }
    }
    for section in file.other.keys() {
        tracing::info!(section = %section, "definitions file: section not acted on");
    }
    tracing::info!(
        path = %path.display(),
        vhosts = file.vhosts.len(),
        users = users.len(),
        permissions = file.permissions.len(),
        policies = file.policies.len(),
        parameters = file.parameters.len(),
        global_parameters = file.global_parameters.len(),
        exchanges = file.exchanges.len(),
        queues = file.queues.len(),
        bindings = file.bindings.len(),
        "loaded definitions file"
    );
    Ok(LoadedDefinitions {
        file,
        users,
        vhost_limits: limits,
    })
}

/// JSON argument values as RabbitMQ's definitions import types them.
///
/// # Errors
/// A key longer than an AMQP short string (255 bytes), or tables nested
/// deeper than the wire takes ([`FIELD_TABLE_DEPTH_MAX`]): text from a
/// client or a file, refused rather than cut or panicked on.
pub fn json_to_table(
    map: &serde_json::Map<String, serde_json::Value>,
) -> Result<FieldTable, String> {
    table_at_depth(map, 1)
}

fn table_at_depth(
    map: &serde_json::Map<String, serde_json::Value>,
    depth: usize,
) -> Result<FieldTable, String> {
    if depth > FIELD_TABLE_DEPTH_MAX {
        return Err(format!(
            "tables nested deeper than {FIELD_TABLE_DEPTH_MAX} levels"
        ));
    }
    let mut table = FieldTable::default();
    for (key, value) in map {
        let name = ShortString::try_new(key.clone()).map_err(|_| {
            format!(
                "the table key '{}...' is longer than 255 bytes",
                key.chars().take(32).collect::<String>()
            )
        })?;
        table.insert(name, value_at_depth(value, depth)?);
    }
    Ok(table)
}

fn value_at_depth(value: &serde_json::Value, depth: usize) -> Result<AMQPValue, String> {
    use serde_json::Value;
    Ok(match value {
        Value::Null => AMQPValue::Void,
        Value::Bool(flag) => AMQPValue::Boolean(*flag),
        Value::Number(number) => match number.as_i64() {
            Some(integer) => AMQPValue::LongLongInt(integer),
            None => AMQPValue::Double(number.as_f64().unwrap_or_default()),
        },
        Value::String(text) => AMQPValue::LongString(text.as_str().into()),
        Value::Array(items) => {
            if depth + 1 > FIELD_TABLE_DEPTH_MAX {
                return Err(format!(
                    "tables nested deeper than {FIELD_TABLE_DEPTH_MAX} levels"
                ));
            }
            let mut array = FieldArray::default();
            for item in items {
                array.push(value_at_depth(item, depth + 1)?);
            }
            AMQPValue::FieldArray(array)
        }
        Value::Object(map) => AMQPValue::FieldTable(table_at_depth(map, depth + 1)?),
    })
}

/// Arguments of a file already read by [`parse_definitions`], which
/// refused any that do not convert.
fn checked_arguments(map: &serde_json::Map<String, serde_json::Value>) -> FieldTable {
    json_to_table(map).unwrap_or_default()
}

impl DefinitionsFile {
    /// The metadata changes that declare this file's exchanges, queues and
    /// bindings, in that order, as a client would: what exists already is
    /// checked for equivalence. Its queues live on `node`.
    fn metadata_commands(&self, node: &NodeIdentity) -> Vec<MetadataCommand> {
        let mut commands = Vec::new();
        for exchange in &self.exchanges {
            commands.push(MetadataCommand::DeclareExchange {
                vhost: exchange.vhost.clone(),
                name: exchange.name.clone(),
                kind: exchange.kind.clone(),
                durable: exchange.durable,
                auto_delete: exchange.auto_delete,
                internal: exchange.internal,
                arguments: checked_arguments(&exchange.arguments),
            });
        }
        for queue in &self.queues {
            commands.push(MetadataCommand::DeclareQueue {
                vhost: queue.vhost.clone(),
                queue: QueueDefinition {
                    name: queue.name.clone(),
                    store_id: None,
                    durable: queue.durable,
                    auto_delete: queue.auto_delete,
                    arguments: checked_arguments(&queue.arguments),
                    exclusive_owner: None,
                    home: Some(node.name.to_string()),
                    home_incarnation: node.incarnation,
                    declared_at: 0,
                    members: Vec::new(),
                    member_ids: Default::default(),
                },
                connection: 0,
            });
        }
        for binding in &self.bindings {
            commands.push(MetadataCommand::Bind(BindingChange {
                vhost: binding.vhost.clone(),
                source: binding.source.clone(),
                destination: binding.destination.clone(),
                destination_is_queue: binding.destination_type != "exchange",
                routing_key: binding.routing_key.clone(),
                arguments: checked_arguments(&binding.arguments),
                connection: 0,
            }));
        }
        commands
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_import_reads_rabbitmq_export_sections() {
        let text = r##"{
            "rabbit_version": "3.10.8",
            "users": [{"name": "bob", "password_hash": "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR",
                       "hashing_algorithm": "rabbit_password_hashing_sha256",
                       "tags": "monitoring, management", "limits": {}}],
            "topic_permissions": [],
            "policies": [{"vhost": "/", "name": "limit", "pattern": "^q\\.",
                          "apply-to": "queues", "priority": 1,
                          "definition": {"max-length": 10, "ha-mode": "all"}}],
            "exchanges": [{"name": "x", "vhost": "/", "type": "topic", "durable": true,
                           "auto_delete": false, "internal": false,
                           "arguments": {"alternate-exchange": "ae"}}],
            "queues": [{"name": "q.1", "vhost": "/", "durable": true, "auto_delete": false,
                        "arguments": {"x-max-length": 5, "x-queue-mode": "lazy"}}],
            "bindings": [{"source": "x", "vhost": "/", "destination": "q.1",
                          "destination_type": "queue", "routing_key": "#", "arguments": {}}]
        }"##;
        let file: DefinitionsFile = serde_json::from_str(text).unwrap();
        assert_eq!(file.policies.len(), 1);
        assert!(file.topic_permissions.is_empty());
        assert!(file.other.contains_key("rabbit_version"));
        let user = user_definition(&file.users[0]).unwrap();
        assert_eq!(
            user.tags,
            ["monitoring", "management"],
            "pre-3.9 tags as one string"
        );
        assert_eq!(user.hashing_algorithm, HashingAlgorithm::Sha256);
        let policy = Policy::from_json(&file.policies[0]).unwrap();
        assert_eq!(policy.definition.max_length, Some(10));
        let arguments = json_to_table(&file.queues[0].arguments).unwrap();
        assert_eq!(
            arguments.inner().get("x-max-length"),
            Some(&AMQPValue::LongLongInt(5))
        );
        assert_eq!(file.bindings[0].routing_key, "#");
        assert_eq!(file.exchanges[0].kind, "topic");
    }

    #[test]
    fn definitions_import_proposes_parameters_and_policies_before_objects() {
        let text = r##"{
            "vhosts": [{"name": "/"}],
            "parameters": [
                {"vhost": "/", "component": "vhost-limits", "name": "limits",
                 "value": {"max-queues": 3}},
                {"vhost": "/", "component": "federation-upstream", "name": "up",
                 "value": {"uri": "amqp://elsewhere"}}],
            "global_parameters": [{"name": "cluster_name", "value": "east"}],
            "policies": [{"vhost": "/", "name": "limit", "pattern": "^q",
                          "definition": {"max-length": 10}}],
            "queues": [{"name": "q.1", "vhost": "/", "arguments": {}}]
        }"##;
        let path = std::env::temp_dir().join(format!(
            "sluice-definitions-import-{}.json",
            std::process::id()
        ));
        std::fs::write(&path, text).unwrap();
        let loaded = load_definitions(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let operations: Vec<String> = loaded
            .metadata_commands(&NodeIdentity::new("a@h:1"))
            .iter()
            .map(|command| serde_json::to_value(command).unwrap()["op"].to_string())
            .collect();
        assert_eq!(
            operations,
            [
                "\"put_vhost\"",
                "\"set_vhost_limits\"",
                "\"set_parameter\"",
                "\"set_global_parameter\"",
                "\"set_policy\"",
                "\"declare_queue\""
            ]
        );
    }
}
