//! The metadata changes, as the log carries them, and their replies.

use amq_protocol::types::FieldTable;
use serde::{Deserialize, Serialize};

use crate::access::{
    DefaultAccess, PermissionDefinition, TopicPermissionDefinition, UserDefinition, VhostLimit,
    VhostLimits,
};
use crate::definitions::{Definitions, QueueDefinition};
use crate::error::{AmqpError, AmqpResult};
use crate::policy::PolicyJson;
use crate::queue::ConnectionId;
use sluice_wire::reply_code::ReplyCode;

/// One change to the metadata. Everything a node needs to apply it is in
/// it, so that every node reaches the same state and the same reply.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum MetadataCommand {
    DeclareExchange {
        vhost: String,
        name: String,
        kind: String,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: FieldTable,
    },
    DeleteExchange {
        vhost: String,
        name: String,
        if_unused: bool,
    },
    /// `queue.home` names the node that holds its messages;
    /// `queue.declared_at` and `queue.store_id` are given by the log
    /// index the command lands at.
    DeclareQueue {
        vhost: String,
        queue: QueueDefinition,
        /// Who declares it, for the exclusive-access check.
        connection: ConnectionId,
    },
    /// Deletes the queue `name` declared at `declared_at` (any when None):
    /// a deletion decided before a newer queue took the name leaves the
    /// newer one alone.
    DeleteQueue {
        vhost: String,
        name: String,
        declared_at: Option<u64>,
    },
    /// Adds `node` to the members of the quorum queue `name` declared at
    /// `declared_at`, under the id [`ADDED_MEMBER_ID_BASE`] plus the log
    /// index of this command: an id no member ever had. Applied before the
    /// queue's group takes the member in, so that `node` starts its member
    /// for the leader to bring up to date (see
    /// [`crate::quorum_membership`]).
    ///
    /// [`ADDED_MEMBER_ID_BASE`]: crate::quorum_members::ADDED_MEMBER_ID_BASE
    AddQueueMember {
        vhost: String,
        name: String,
        declared_at: u64,
        node: String,
    },
    /// Removes `node` from the queue's members, after its group let it
    /// go: `node` stops its member and erases its files.
    RemoveQueueMember {
        vhost: String,
        name: String,
        declared_at: u64,
        node: String,
    },
    Bind(BindingChange),
    Unbind(BindingChange),
    /// A node (re)started: its non-durable queues of earlier runs are gone
    /// with the connections and memory that held them. A cluster of one
    /// restarting is the whole cluster restarting: its non-durable
    /// exchanges are gone too (`whole_cluster`), as in RabbitMQ, where they
    /// live in memory on every node.
    NodeStarted {
        node: String,
        incarnation: u64,
        whole_cluster: bool,
    },
    /// A node is down (its links to the leader broke): its non-durable
    /// queues are gone, as in RabbitMQ, with their owners and messages.
    NodeDown {
        node: String,
    },
    /// Definitions a single-node version of Sluice saved, taken over by
    /// `node`: declared where missing.
    TakeOver {
        node: String,
        definitions: Definitions,
    },
    /// Proposed by every node as it starts; only the first applied acts:
    /// the cluster's first start creates the default vhost, user and
    /// permissions (`defaults`), as RabbitMQ does on an empty database.
    /// None when a definitions file brings users or vhosts instead.
    SeedAccess {
        defaults: Option<DefaultAccess>,
    },
    PutVhost {
        name: String,
    },
    /// Deletes the vhost with its exchanges, queues, bindings, permissions
    /// and limits.
    DeleteVhost {
        name: String,
    },
    /// Creates the user or replaces its password hash and tags.
    PutUser {
        user: UserDefinition,
    },
    DeleteUser {
        name: String,
    },
    SetPermissions {
        permissions: PermissionDefinition,
    },
    ClearPermissions {
        user: String,
        vhost: String,
    },
    /// Replaces both of a vhost's limits (definitions, the `vhost-limits`
    /// parameter).
    SetVhostLimits {
        vhost: String,
        limits: VhostLimits,
    },
    /// Sets one limit (None: clears it) and leaves the other as it is when
    /// the command is applied, not as it was when the command was made:
    /// two changes to different limits made at once both hold.
    SetVhostLimit {
        vhost: String,
        limit: VhostLimit,
        value: Option<u64>,
    },
    SetTopicPermissions {
        permissions: TopicPermissionDefinition,
    },
    /// For one exchange, or every exchange when None.
    ClearTopicPermissions {
        user: String,
        vhost: String,
        exchange: Option<String>,
    },
    /// Creates or replaces a policy (`rabbit_policy:set`). Every queue and
    /// exchange of the vhost takes its new effective settings as the
    /// change is applied, on every node.
    SetPolicy {
        policy: PolicyJson,
    },
    ClearPolicy {
        vhost: String,
        name: String,
    },
    /// Creates or replaces a vhost's runtime parameter
    /// (`rabbit_runtime_parameters:set`).
    SetParameter {
        component: String,
        vhost: String,
        name: String,
        value: serde_json::Value,
    },
    ClearParameter {
        component: String,
        vhost: String,
        name: String,
    },
    SetGlobalParameter {
        name: String,
        value: serde_json::Value,
    },
    ClearGlobalParameter {
        name: String,
    },
}

/// queue.bind, exchange.bind and their unbinds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BindingChange {
    pub vhost: String,
    pub source: String,
    pub destination: String,
    pub destination_is_queue: bool,
    pub routing_key: String,
    pub arguments: FieldTable,
    /// Who binds, for the exclusive-access check on a queue.
    pub connection: ConnectionId,
}

/// What every node computes for a command: success, or the AMQP error the
/// client that proposed it gets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetadataReply {
    Done,
    Refused { code: u16, text: String },
}

impl MetadataReply {
    pub fn from_result(result: AmqpResult<()>) -> Self {
        match result {
            Ok(()) => MetadataReply::Done,
            Err(error) => MetadataReply::Refused {
                code: error.code.code(),
                text: error.text,
            },
        }
    }

    pub fn into_result(self) -> AmqpResult<()> {
        match self {
            MetadataReply::Done => Ok(()),
            MetadataReply::Refused { code, text } => Err(AmqpError::new(
                ReplyCode::from_code(code).unwrap_or(ReplyCode::InternalError),
                text,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_carry_the_amqp_error_through_the_log() {
        let refused = MetadataReply::from_result(Err(AmqpError::precondition_failed("no")));
        let bytes = serde_json::to_vec(&refused).unwrap();
        let back: MetadataReply = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            back.into_result(),
            Err(AmqpError::precondition_failed("no"))
        );
        assert_eq!(MetadataReply::from_result(Ok(())).into_result(), Ok(()));
    }

    #[test]
    fn commands_survive_their_encoding() {
        let mut arguments = FieldTable::default();
        arguments.insert("x-max-length".into(), 10i64.into());
        let command = MetadataCommand::DeclareExchange {
            vhost: "/".into(),
            name: "x".into(),
            kind: "topic".into(),
            durable: true,
            auto_delete: false,
            internal: false,
            arguments,
        };
        let bytes = serde_json::to_vec(&command).unwrap();
        let back: MetadataCommand = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(format!("{back:?}"), format!("{command:?}"));
    }
}
