//! The node's metadata log: the metadata Raft group (see
//! `sluice_cluster::consensus`) with the broker as its state machine.
//! Commands and replies travel as JSON: metadata changes are few and small,
//! and a log anyone can read back is worth the bytes.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sluice_cluster::consensus::{ProposeError, RaftGroup, StateMachine};
use sluice_core::broker::Broker;
use sluice_core::definitions::Definitions;
use sluice_core::error::AmqpError;
use sluice_core::metadata::{MetadataCommand, MetadataLog, MetadataReply, Proposal};
use sluice_wire::reply_code::ReplyCode;

/// The metadata group's id among the node's Raft groups.
pub const METADATA_GROUP: u64 = 0;

/// How long a metadata change waits for a majority before the client is
/// told it failed: long enough to ride out a leader election, short enough
/// that a client whose cluster lost its majority hears so instead of
/// hanging.
pub const METADATA_CHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// The broker as the metadata group's state machine.
pub struct MetadataStateMachine {
    pub broker: Arc<Broker>,
}

impl StateMachine for MetadataStateMachine {
    fn apply(&mut self, index: u64, command: &[u8]) -> Bytes {
        let reply = match serde_json::from_slice::<MetadataCommand>(command) {
            Ok(command) => {
                let broker = &self.broker;
                // A bug in one change must not stop the log: every node
                // hits it alike, and refuses that one change alike.
                std::panic::catch_unwind(AssertUnwindSafe(|| broker.apply_metadata(index, command)))
                    .unwrap_or_else(|_| {
                        tracing::error!(index, "applying a metadata change panicked");
                        refused("applying the change failed on this node")
                    })
            }
            Err(error) => {
                tracing::error!(index, %error, "undecodable metadata change");
                refused("the change could not be decoded")
            }
        };
        Bytes::from(serde_json::to_vec(&reply).expect("a reply encodes"))
    }

    fn snapshot(&self) -> Bytes {
        Bytes::from(
            serde_json::to_vec(&self.broker.metadata_snapshot()).expect("definitions encode"),
        )
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let definitions: Definitions =
            serde_json::from_slice(snapshot).map_err(|error| error.to_string())?;
        self.broker.restore_metadata(&definitions);
        Ok(())
    }
}

fn refused(text: &str) -> MetadataReply {
    MetadataReply::Refused {
        code: ReplyCode::InternalError.code(),
        text: text.to_owned(),
    }
}

/// Proposals through the metadata group.
pub struct RaftMetadataLog {
    pub group: Arc<RaftGroup>,
    pub timeout: Duration,
    /// The group has other members.
    pub replicated: bool,
}

fn not_committed(error: ProposeError) -> AmqpError {
    match error {
        ProposeError::Timeout(limit) => AmqpError::new(
            ReplyCode::InternalError,
            format!(
                "metadata change not committed: no majority of the cluster answered within {}s",
                limit.as_secs()
            ),
        ),
        error => AmqpError::new(
            ReplyCode::InternalError,
            format!("metadata change failed: {error}"),
        ),
    }
}

impl MetadataLog for RaftMetadataLog {
    fn propose(&self, command: MetadataCommand) -> Proposal {
        let group = Arc::clone(&self.group);
        let timeout = self.timeout;
        Box::pin(async move {
            let bytes = serde_json::to_vec(&command).expect("a metadata change encodes");
            match group.propose(Bytes::from(bytes), timeout).await {
                Ok(reply) => serde_json::from_slice::<MetadataReply>(&reply)
                    .map_err(|error| {
                        AmqpError::new(
                            ReplyCode::InternalError,
                            format!("undecodable reply from the metadata log: {error}"),
                        )
                    })?
                    .into_result(),
                Err(error) => Err(not_committed(error)),
            }
        })
    }

    fn sync(&self) -> Proposal {
        let group = Arc::clone(&self.group);
        let timeout = self.timeout;
        Box::pin(async move {
            group.sync(timeout).await.map_err(|error| match error {
                ProposeError::Timeout(limit) => AmqpError::new(
                    ReplyCode::InternalError,
                    format!(
                        "metadata not readable: no majority of the cluster answered within {}s",
                        limit.as_secs()
                    ),
                ),
                error => not_committed(error),
            })
        })
    }

    fn is_replicated(&self) -> bool {
        self.replicated
    }

    fn applied_index(&self) -> u64 {
        self.group.applied_index()
    }

    fn wait_applied(&self, index: u64) -> Proposal {
        let group = Arc::clone(&self.group);
        let timeout = self.timeout;
        Box::pin(async move {
            group
                .wait_applied(index, timeout)
                .await
                .map_err(not_committed)
        })
    }
}
