//! What every channel of a connection shares: the connection's identity,
//! vhost, negotiated limits and output buffer.

use std::sync::Arc;

use sluice_core::broker::Broker;
use sluice_core::queue::ConnectionId;
use sluice_core::vhost::{VhostConnectionSlot, VirtualHost};

use crate::bodies_under_way::BodiesUnderWay;
use crate::connection_registry::ConnectionStats;
use crate::outbox::Outbox;
use crate::uncommitted::UncommittedBytes;

/// Capabilities the client announced in connection.start-ok.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClientCapabilities {
    pub consumer_cancel_notify: bool,
    pub authentication_failure_close: bool,
    pub connection_blocked: bool,
}

pub struct ConnectionContext {
    pub connection_id: ConnectionId,
    pub broker: Arc<Broker>,
    pub vhost: Arc<VirtualHost>,
    /// Who logged in: whose permissions every operation is checked against.
    pub user: Arc<str>,
    /// The connection's place in its vhost's `max-connections`, held while
    /// it is open.
    pub vhost_slot: VhostConnectionSlot,
    pub outbox: Arc<Outbox>,
    pub frame_max: u32,
    pub channel_max: u16,
    pub max_message_size: u32,
    /// `quorum_commands_soft_limit`: a channel's messages in flight to one
    /// quorum queue past which its connection stops reading.
    pub quorum_commands_soft_limit: u32,
    pub client_capabilities: ClientCapabilities,
    /// The connection's byte counts and its channels' message counters.
    pub stats: Arc<ConnectionStats>,
    /// The node's bound on message bodies under way.
    pub bodies_under_way: Arc<BodiesUnderWay>,
    /// The node's bound on messages held by open transactions.
    pub uncommitted: Arc<UncommittedBytes>,
}
