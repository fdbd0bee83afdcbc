//! Paging: every queue keeps at most a window of ready messages in memory
//! (its head); the rest wait on disk in the queue's journal as 24-byte
//! references, as RabbitMQ's lazy queues do. The pager (`crate::pager`)
//! reads the window full again as consumers drain it.
//!
//! A shallow queue (consumers keeping up) never reaches the window and never
//! touches the disk for paging: the cost is one comparison per publish.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sluice_store::group_commit::Location;

/// Storage settings a node's queues share.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreSettings {
    /// Journal segments roll over at this size. Large enough that rolling is
    /// rare; small enough that a segment holding a few live messages does
    /// not pin much disk before compaction moves them.
    pub segment_size_bytes: u64,
    /// Ready messages a queue keeps in memory before it pages the rest:
    /// the read-ahead window. The flow bound on a queue with consumers is
    /// 1024 messages, so a queue whose consumers keep up stays within it.
    pub resident_messages_max: usize,
    /// The same window in body bytes, for large messages.
    pub resident_bytes_max: u64,
    /// Bytes a queue's journal may hold in memory, waiting for the sync
    /// thread to write them, before the queue pauses its publishers: the
    /// bound between a queue and the disk.
    pub unwritten_bytes_max: u64,
    /// Body bytes all queues together may hold in their read-ahead windows.
    /// Past it, queues page new messages and the pager reads ahead only
    /// what consumers are about to take: hundreds of queues with full
    /// windows would otherwise hold hundreds of windows.
    pub resident_total_max: u64,
    /// What a durable queue's recovery does about journal segments missing
    /// from the middle (`store.missing_segments`): refuse (the default),
    /// or go on without their messages.
    pub missing_segments: sluice_store::MissingSegments,
}

/// Segment positions must fit the 31 bits a paged reference has for them.
pub const SEGMENT_SIZE_BYTES_MAX: u64 = 1 << 30;

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            segment_size_bytes: 64 * 1024 * 1024,
            resident_messages_max: 2048,
            resident_bytes_max: 8 * 1024 * 1024,
            unwritten_bytes_max: 64 * 1024 * 1024,
            resident_total_max: 256 * 1024 * 1024,
            missing_segments: sluice_store::MissingSegments::Refuse,
        }
    }
}

impl StoreSettings {
    /// Ready messages read back per pass of the pager: enough to amortise
    /// the lock and the wake-ups, few enough that consumers get the first
    /// ones soon.
    pub fn read_batch_messages(&self) -> usize {
        (self.resident_messages_max / 4).clamp(1, 512)
    }
}

/// Body bytes of ready messages held in memory by every queue of the node,
/// against [`StoreSettings::resident_total_max`].
#[derive(Default)]
pub struct NodeResident {
    bytes: AtomicU64,
}

impl NodeResident {
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// A queue's resident body bytes, counted into the node's total as well.
#[derive(Default)]
pub struct ResidentBytes {
    bytes: u64,
    node: Option<Arc<NodeResident>>,
}

impl ResidentBytes {
    /// Starts counting into `node`, with what is resident already.
    pub fn count_into(&mut self, node: Arc<NodeResident>) {
        node.bytes.fetch_add(self.bytes, Ordering::Relaxed);
        if let Some(previous) = self.node.replace(node) {
            previous.bytes.fetch_sub(self.bytes, Ordering::Relaxed);
        }
    }

    pub fn get(&self) -> u64 {
        self.bytes
    }

    pub fn add(&mut self, bytes: u64) {
        self.bytes += bytes;
        if let Some(node) = &self.node {
            node.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    pub fn remove(&mut self, bytes: u64) {
        self.bytes -= bytes;
        if let Some(node) = &self.node {
            node.bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    pub fn clear(&mut self) {
        self.remove(self.bytes);
    }
}

impl Drop for ResidentBytes {
    fn drop(&mut self) {
        self.clear();
    }
}

const REDELIVERED: u32 = 1 << 31;

/// A ready message whose body is on disk only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedMessage {
    pub offset: u64,
    segment: u32,
    /// Byte position in the segment; the top bit marks a redelivery.
    position_and_redelivered: u32,
    length: u32,
    pub body_size: u32,
}

const _: () = assert!(std::mem::size_of::<PagedMessage>() == 24);
const _: () = assert!(SEGMENT_SIZE_BYTES_MAX <= REDELIVERED as u64);

impl PagedMessage {
    pub fn new(offset: u64, location: Location, body_size: usize, redelivered: bool) -> Self {
        debug_assert!(location.position < SEGMENT_SIZE_BYTES_MAX);
        let mut position_and_redelivered = location.position as u32;
        if redelivered {
            position_and_redelivered |= REDELIVERED;
        }
        PagedMessage {
            offset,
            segment: location.segment as u32,
            position_and_redelivered,
            length: location.length,
            body_size: body_size as u32,
        }
    }

    pub fn location(&self) -> Location {
        Location {
            segment: self.segment as u64,
            position: (self.position_and_redelivered & !REDELIVERED) as u64,
            length: self.length,
        }
    }

    pub fn segment(&self) -> u64 {
        self.segment as u64
    }

    pub fn redelivered(&self) -> bool {
        self.position_and_redelivered & REDELIVERED != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_bytes_count_into_the_node_and_leave_it_when_dropped() {
        let node = Arc::new(NodeResident::default());
        let mut first = ResidentBytes::default();
        first.add(100); // before it counts into the node: carried over
        first.count_into(Arc::clone(&node));
        let mut second = ResidentBytes::default();
        second.count_into(Arc::clone(&node));
        second.add(50);
        assert_eq!(node.bytes(), 150);
        first.remove(30);
        assert_eq!((first.get(), node.bytes()), (70, 120));
        second.clear();
        assert_eq!(node.bytes(), 70);
        drop(first);
        assert_eq!(node.bytes(), 0, "a deleted queue leaves nothing counted");
    }

    #[test]
    fn a_paged_message_keeps_its_location_and_flag() {
        let location = Location {
            segment: 7,
            position: (1 << 30) - 5,
            length: 1100,
        };
        for redelivered in [false, true] {
            let paged = PagedMessage::new(42, location, 1024, redelivered);
            assert_eq!(paged.location(), location);
            assert_eq!(paged.redelivered(), redelivered);
            assert_eq!(paged.body_size, 1024);
            assert_eq!(paged.segment(), 7);
        }
    }
}
