//! Quorum queues: Raft-replicated queues. This much is the queue's state
//! machine, which every member applies to the queue's log:
//!
//! - [`command`]: the log's entries, and what applying one yields.
//! - [`machine`]: the state and its rules (FIFO with returns first,
//!   prefetch, priorities, single active consumer, delivery limit, TTL by
//!   log time, length limits, publisher deduplication, the release cursor).

pub mod command;
pub mod machine;

#[cfg(test)]
mod tests;
