//! What makes nodes one broker.
//!
//! - [`node_name`]: `NAME@HOST:PORT`, a node and its inter-node listener.
//! - [`cookie`]: the secret every node of a cluster shares.
//! - [`link`]: the authenticated, multiplexed TCP link between two nodes,
//!   with heartbeats, bounded buffers and reconnection.
//! - [`consensus`]: Raft groups over those links, on `openraft`.

pub mod consensus;
pub mod cookie;
pub mod link;
pub mod node_name;
