//! The node-wide bound on bytes in flight to consumers: deliveries encoded
//! into connections' output buffers and not yet written to their sockets.
//!
//! Each connection's buffer has its own bound (`OUTBOX_DELIVERY_BYTES_MAX`),
//! but a thousand slow consumers at that bound would hold a gigabyte. Past
//! the node-wide total, a buffer takes deliveries only up to
//! `OUTBOX_DELIVERY_FLOOR_BYTES`: every consumer still gets its share, and
//! the total stays within the bound plus that small floor per connection.
//! A delivery refused here stays in its queue, which costs nothing extra.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct InFlightBytes {
    total: AtomicU64,
    max: u64,
}

impl InFlightBytes {
    pub fn new(max: u64) -> Arc<Self> {
        Arc::new(InFlightBytes {
            total: AtomicU64::new(0),
            max,
        })
    }

    pub fn add(&self, bytes: usize) {
        self.total.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn remove(&self, bytes: usize) {
        self.total.fetch_sub(bytes as u64, Ordering::Relaxed);
    }

    /// Bytes buffered for writing across all connections.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    pub fn is_over(&self) -> bool {
        self.total() > self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_bytes_are_counted_in_and_out() {
        let in_flight = InFlightBytes::new(1000);
        in_flight.add(600);
        in_flight.add(400);
        assert!(!in_flight.is_over(), "at the bound is within it");
        in_flight.add(1);
        assert!(in_flight.is_over());
        in_flight.remove(401);
        assert_eq!(in_flight.total(), 600);
        assert!(!in_flight.is_over());
    }
}
