//! The vhost's topology version: a number that moves on whenever its
//! exchanges, queues or bindings change, so that a publisher may keep the
//! route it computed for a message and reuse it for the next one with the
//! same exchange and routing key while the number stands still. A
//! publisher then takes no lock of the vhost's tables at all: the version
//! is one shared read, where the exchange table, the routing table and the
//! queue table would be three read locks, each a write to a cache line that
//! every publisher on every core shares.
//!
//! Every write to the tables goes through [`TopologyWrite`], which moves
//! the version on when the change is complete and visible: a route
//! computed while a change was under way is cached under the version read
//! before it, which is stale by then, so it is computed again.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};

/// The version counter.
#[derive(Default)]
pub(super) struct TopologyVersion(AtomicU64);

impl TopologyVersion {
    /// The current version: read before a route is computed, and compared
    /// before a cached one is used.
    pub(super) fn current(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Wraps a write guard of a topology table.
    pub(super) fn write<G: DerefMut>(&self, guard: G) -> TopologyWrite<'_, G> {
        TopologyWrite {
            guard: Some(guard),
            version: self,
        }
    }
}

/// A write lock on one of the vhost's tables; releasing it moves the
/// topology version on.
pub(super) struct TopologyWrite<'a, G: DerefMut> {
    guard: Option<G>,
    version: &'a TopologyVersion,
}

impl<G: DerefMut> Deref for TopologyWrite<'_, G> {
    type Target = G::Target;

    fn deref(&self) -> &Self::Target {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl<G: DerefMut> DerefMut for TopologyWrite<'_, G> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.guard.as_mut().expect("held until dropped")
    }
}

impl<G: DerefMut> Drop for TopologyWrite<'_, G> {
    fn drop(&mut self) {
        // The change is released first, then announced: a publisher that
        // sees the new version sees the change.
        drop(self.guard.take());
        self.version.0.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::RwLock;

    #[test]
    fn topology_write_moves_the_version_on_once_released() {
        let version = TopologyVersion::default();
        let table = RwLock::new(Vec::<u32>::new());
        let before = version.current();
        {
            let mut guard = version.write(table.write().unwrap());
            guard.push(1);
            assert_eq!(
                version.current(),
                before,
                "not before the change is released"
            );
        }
        assert_eq!(version.current(), before + 1);
        assert_eq!(*table.read().unwrap(), vec![1]);
    }
}
