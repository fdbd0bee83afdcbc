//! Connections whose user or vhost was deleted are closed, on every node,
//! as RabbitMQ's connection tracking closes them: 320 CONNECTION_FORCED
//! with "user 'u' is deleted" or "vhost 'v' is deleted".
//!
//! The deletion is a metadata change applied on every node; each node
//! closes its own connections. The task looks when the access control's
//! generation moves (any change to users, vhosts or permissions), which
//! it reads twice a second: an atomic load, nothing more, while nothing
//! changes. It acts once the generation has stood still for a look, so
//! that a snapshot being installed (which empties and refills the tables)
//! is never mistaken for a deletion.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::broker::Broker;
use tokio::sync::watch;

use crate::connection_registry::ConnectionRegistry;

/// How often the generation is looked at.
const LOOK_INTERVAL: Duration = Duration::from_millis(500);

/// Starts the task; it ends with the shutdown signal.
pub fn start(
    broker: Arc<Broker>,
    connections: Arc<ConnectionRegistry>,
    mut shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        let mut seen = broker.access.generation();
        let mut changed = false;
        let mut ticks = tokio::time::interval(LOOK_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            let generation = broker.access.generation();
            if generation != seen {
                seen = generation;
                changed = true;
                continue;
            }
            if std::mem::take(&mut changed) {
                close_orphans(&broker, &connections);
            }
        }
    });
}

fn close_orphans(broker: &Broker, connections: &ConnectionRegistry) {
    for connection in connections.snapshots() {
        let identity = &connection.identity;
        let reason = if broker.vhost(&identity.vhost).is_none() {
            format!("vhost '{}' is deleted", identity.vhost)
        } else if !broker.access.user_exists(&identity.user) {
            format!("user '{}' is deleted", identity.user)
        } else {
            continue;
        };
        tracing::info!(user = %identity.user, vhost = %identity.vhost, %reason, "closing a connection");
        connections.force_close(connection.connection_id, &reason);
    }
}
