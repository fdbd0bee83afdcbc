//! The bodies a member keeps in memory: those of messages not delivered
//! yet, as many as fit the queue's window and the node's total (the same
//! bounds as a classic queue's read-ahead window). Every body is in the
//! queue's log as well; what the window has no room for is read back from
//! there when a consumer gets to it.

use std::collections::HashMap;
use std::sync::Arc;

use crate::message::Message;
use crate::paging::{NodeResident, ResidentBytes};

pub struct BodyWindow {
    bodies: HashMap<u64, Arc<Message>>,
    resident: ResidentBytes,
    node: Option<Arc<NodeResident>>,
    bytes_max: u64,
    node_bytes_max: u64,
}

impl BodyWindow {
    /// A window of `bytes_max`, counted into `node` against
    /// `node_bytes_max` too.
    pub fn new(bytes_max: u64, node: Option<(Arc<NodeResident>, u64)>) -> BodyWindow {
        let mut resident = ResidentBytes::default();
        let (node, node_bytes_max) = match node {
            Some((node, node_bytes_max)) => {
                resident.count_into(Arc::clone(&node));
                (Some(node), node_bytes_max)
            }
            None => (None, u64::MAX),
        };
        BodyWindow {
            bodies: HashMap::new(),
            resident,
            node,
            bytes_max,
            node_bytes_max,
        }
    }

    /// Keeps the body of the message at `index` if there is room; whether
    /// it did.
    pub fn keep(&mut self, index: u64, message: &Arc<Message>) -> bool {
        let size = message.body_size() as u64;
        let node_full = self
            .node
            .as_ref()
            .is_some_and(|node| node.bytes() + size > self.node_bytes_max);
        if self.resident.get() + size > self.bytes_max || node_full {
            return false;
        }
        if let Some(replaced) = self.bodies.insert(index, Arc::clone(message)) {
            self.resident.remove(replaced.body_size() as u64);
        }
        self.resident.add(size);
        true
    }

    pub fn get(&self, index: u64) -> Option<&Arc<Message>> {
        self.bodies.get(&index)
    }

    /// Takes the body out: the message was delivered, or left the queue.
    pub fn take(&mut self, index: u64) -> Option<Arc<Message>> {
        let message = self.bodies.remove(&index)?;
        self.resident.remove(message.body_size() as u64);
        Some(message)
    }

    pub fn clear(&mut self) {
        self.bodies.clear();
        self.resident.clear();
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.bodies.len()
    }

    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.resident.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use sluice_wire::content::RawProperties;

    fn message(size: usize) -> Arc<Message> {
        Arc::new(Message {
            exchange: Bytes::new(),
            routing_key: Bytes::from_static(b"q"),
            properties: RawProperties::default(),
            body: Bytes::from(vec![7u8; size]),
        })
    }

    #[test]
    fn the_window_keeps_bodies_within_its_own_and_the_node_bound() {
        let node = Arc::new(NodeResident::default());
        let mut first = BodyWindow::new(300, Some((Arc::clone(&node), 500)));
        let mut second = BodyWindow::new(300, Some((Arc::clone(&node), 500)));
        assert!(first.keep(1, &message(200)));
        assert!(!first.keep(2, &message(200)), "over the queue's bound");
        assert!(first.keep(3, &message(100)));
        assert!(second.keep(1, &message(200)));
        assert!(!second.keep(2, &message(100)), "over the node's bound");
        assert_eq!(node.bytes(), 500);
        assert_eq!(first.take(1).map(|body| body.body_size()), Some(200));
        assert!(first.take(1).is_none());
        assert!(second.keep(2, &message(100)));
        first.clear();
        assert_eq!((first.len(), first.bytes()), (0, 0));
        drop(second);
        assert_eq!(node.bytes(), 0, "a dropped window gives its bytes back");
    }
}
