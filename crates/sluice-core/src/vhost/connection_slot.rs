//! A vhost's open connections, counted for its `max-connections` limit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::VirtualHost;

/// One connection's place in its vhost's count, given back when dropped.
pub struct VhostConnectionSlot {
    vhost: Arc<VirtualHost>,
}

impl Drop for VhostConnectionSlot {
    fn drop(&mut self) {
        self.vhost.open_connections.fetch_sub(1, Ordering::AcqRel);
    }
}

impl VirtualHost {
    /// A place for one more connection, unless `limit` connections are
    /// open already, here and on the cluster's other nodes as they last
    /// reported.
    pub fn open_connection(self: &Arc<Self>, limit: Option<u64>) -> Option<VhostConnectionSlot> {
        let counter: &AtomicU64 = &self.open_connections;
        let before = counter.fetch_add(1, Ordering::AcqRel)
            + self.connections_elsewhere.load(Ordering::Acquire);
        if limit.is_some_and(|limit| before >= limit) {
            counter.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(VhostConnectionSlot {
            vhost: Arc::clone(self),
        })
    }

    /// Connections open on this node.
    pub fn connection_count(&self) -> u64 {
        self.open_connections.load(Ordering::Acquire)
    }

    /// Connections on the cluster's other nodes, as they last reported.
    pub fn connections_elsewhere(&self) -> u64 {
        self.connections_elsewhere.load(Ordering::Acquire)
    }

    /// What the other nodes of the cluster last reported for this vhost.
    pub fn set_connections_elsewhere(&self, count: u64) {
        self.connections_elsewhere.store(count, Ordering::Release);
    }
}
