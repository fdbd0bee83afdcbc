//! A node's outgoing stream of forwarded operations to one peer, on one
//! link: operations are encoded into a buffer as they happen (from
//! connection tasks, from queues delivering), and one task per lane cuts
//! the buffer into link frames and sends them, in order.
//!
//! The buffer has no hard cap of its own; what fills it is bounded where it
//! starts: forwarded publishes by the in-flight bound of the client's node
//! (its publishers pause), deliveries by each remote consumer's credit and
//! by [`LANE_DELIVERY_BYTES_MAX`], settlements by the deliveries they
//! settle, requests by the channels waiting on them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::BytesMut;
use sluice_cluster::link::{Links, FRAME_PAYLOAD_BYTES_MAX};
use sluice_cluster::node_name::NodeName;
use tokio::sync::Notify;

use super::wire::{Op, FORWARD_CHANNEL};

/// Past this many buffered bytes, a queue delivering to a remote consumer
/// is refused until the lane drains, as a client connection's outbox
/// refuses deliveries past its bound.
pub const LANE_DELIVERY_BYTES_MAX: usize = 4 * 1024 * 1024;

pub struct Lane {
    pub peer: NodeName,
    /// The link generation this lane sends on (see [`Links::generation`]).
    pub link: u64,
    buffer: Mutex<BytesMut>,
    has_data: Notify,
    closed: AtomicBool,
    /// A delivery was refused for a full buffer: once it drains, the
    /// queues of the peer's consumers deliver again.
    deliveries_refused: AtomicBool,
}

impl Lane {
    /// A lane to `peer` on link `link`, with its sending task. `drained`
    /// runs after a send that follows a refused delivery.
    pub fn start(
        links: Arc<Links>,
        peer: NodeName,
        link: u64,
        drained: impl Fn() + Send + 'static,
    ) -> Arc<Lane> {
        let lane = Arc::new(Lane {
            peer,
            link,
            buffer: Mutex::new(BytesMut::new()),
            has_data: Notify::new(),
            closed: AtomicBool::new(false),
            deliveries_refused: AtomicBool::new(false),
        });
        tokio::spawn(Arc::clone(&lane).send_loop(links, drained));
        lane
    }

    fn lock(&self) -> MutexGuard<'_, BytesMut> {
        self.buffer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `op` for the peer. Dropped once the lane is closed: its link
    /// is gone, and with it every conversation it carried.
    pub fn send(&self, op: &Op) {
        if self.is_closed() {
            return;
        }
        op.encode(&mut self.lock());
        self.has_data.notify_one();
    }

    /// Queues a delivery unless the buffer is over
    /// [`LANE_DELIVERY_BYTES_MAX`]; false when refused.
    pub fn send_delivery(&self, op: &Op) -> bool {
        if self.is_closed() {
            return false;
        }
        let mut buffer = self.lock();
        if buffer.len() >= LANE_DELIVERY_BYTES_MAX {
            self.deliveries_refused.store(true, Ordering::Release);
            return false;
        }
        op.encode(&mut buffer);
        drop(buffer);
        self.has_data.notify_one();
        true
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Stops the lane; what it still buffers is dropped.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.lock().clear();
        self.has_data.notify_one();
    }

    async fn send_loop(self: Arc<Self>, links: Arc<Links>, drained: impl Fn()) {
        loop {
            self.has_data.notified().await;
            if self.is_closed() {
                return;
            }
            let mut pending = std::mem::take(&mut *self.lock());
            while !pending.is_empty() {
                let frame = pending
                    .split_to(pending.len().min(FRAME_PAYLOAD_BYTES_MAX))
                    .freeze();
                if links
                    .send_on(&self.peer, self.link, FORWARD_CHANNEL, frame)
                    .await
                    .is_err()
                {
                    // The link is gone: the node's watch of it resets
                    // everything that was under way on it.
                    self.close();
                    return;
                }
            }
            if self.deliveries_refused.swap(false, Ordering::AcqRel) {
                drained();
            }
        }
    }
}
