//! The broker core: what a node knows and does. Its only I/O is through
//! `sluice-store` (journals of durable queues, definitions).
//!
//! - [`broker`]: the node's vhosts and users, and authentication.
//! - [`broker_policies`]: policies and runtime parameters as the metadata
//!   log sets them, and as the management API reads them.
//! - [`vhost`]: one virtual host: exchanges, queues, bindings, the routing walk.
//! - [`exchange`]: binding tables and matchers for each exchange kind.
//! - [`queue`]: the queue interface every kind implements, consumers and
//!   the sink they receive through.
//! - [`queue_type`]: the kinds `x-queue-type` names.
//! - [`queue_factory`]: the queue of the kind a declaration asks for.
//! - [`classic_queue`]: a classic queue, dispatching to consumers inline.
//! - [`ready`]: a queue's ready messages in memory, by priority in a priority queue.
//! - [`metadata`]: the cluster's exchanges, queues and bindings as a log of
//!   changes every node applies in order.
//! - [`metadata_apply`]: a change of that log applied to the node.
//! - [`quorum_members`]: a quorum queue's members and their Raft ids.
//! - [`quorum_membership`]: adding and removing a quorum queue's members.
//! - [`metadata_snapshot`]: the node's metadata as one value, and back.
//! - [`definitions`]: exchanges, queues and bindings as data (snapshots,
//!   the single-node `definitions.json` a node takes over).
//! - [`remote_queue`]: a queue known from the metadata and held elsewhere.
//! - [`counters`]: what happened to messages, counted where it happens.
//! - [`confirm`]: confirm tickets, complete when every target queue has a
//!   message safe.
//! - [`queue_journal`]: a queue's persistent and paged messages and acks on disk.
//! - [`paging`]: the in-memory window of a queue and its paged references.
//! - [`pager`]: the thread that reads paged messages back and compacts journals.
//! - [`segment_liveness`]: which messages of a journal segment are still live.
//! - [`definitions_import`]: RabbitMQ's definitions JSON, loaded at start.
//! - [`queue_limits`]: x-max-length, x-max-length-bytes and x-overflow.
//! - [`expiry`]: message TTL and queue expiry settings, and their clock.
//! - [`queue_timer`]: the thread that wakes queues at their deadlines.
//! - [`dead_letter`]: dead-lettered copies, their x-death history, cycles.
//! - [`message`]: a published message as queues hold it.
//! - [`arguments`]: declaration arguments: validation, equivalence, printing.
//! - [`policy`]: policies by name pattern, their validation, and the
//!   effective arguments they give.
//! - [`runtime_parameters`]: runtime parameters, per vhost and global.
//! - [`reply_to`]: direct reply-to consumers and their tokens.
//! - [`error`]: errors carrying the AMQP reply a client expects.

pub mod access;
pub mod arguments;
pub mod broker;
pub mod broker_policies;
pub mod classic_queue;
pub mod confirm;
pub mod counters;
pub mod dead_letter;
pub mod definitions;
pub mod definitions_import;
pub mod error;
pub mod exchange;
pub mod expiry;
pub mod message;
pub mod metadata;
pub mod metadata_apply;
pub mod metadata_snapshot;
pub mod pager;
pub mod paging;
pub mod policy;
pub mod queue;
pub mod queue_factory;
pub mod queue_journal;
pub mod queue_limits;
pub mod queue_location;
pub mod queue_timer;
pub mod queue_type;
pub mod quorum_members;
pub mod quorum_membership;
pub mod quorum_queue;
pub mod ready;
pub mod remote_queue;
pub mod reply_to;
pub mod runtime_parameters;
pub mod segment_liveness;
pub mod sender_selected;
pub mod vhost;
