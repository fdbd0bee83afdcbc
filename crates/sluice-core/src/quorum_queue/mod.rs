//! Quorum queues: Raft-replicated queues.
//!
//! - [`command`]: the log's entries, and what applying one yields.
//! - [`machine`]: the state and its rules (FIFO with returns first,
//!   prefetch, priorities, single active consumer, delivery limit, TTL by
//!   log time, length limits, publisher deduplication, the release cursor).
//! - [`entry`]: the log's entries: batches of messages and commands.
//! - `proposer`: one member's proposals, in order, batched per round trip.
//! - `member`: what one member holds: machine, bodies, local consumers.
//! - `body_window`: the bodies a member keeps in memory, within bounds.
//! - `dead_lettering`: at-least-once dead-lettering, on the leader.
//! - [`queue`]: the [`crate::queue::Queue`] over all of it.
//! - [`replication`]: what the queue asks of the node's consensus.

mod body_window;
pub mod command;
mod dead_lettering;
pub mod entry;
pub mod machine;
mod member;
mod proposer;
pub mod queue;
pub mod replication;

pub use queue::{QuorumQueue, QuorumQueueSpec};

#[cfg(test)]
mod tests;
