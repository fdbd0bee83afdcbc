//! The ready messages a queue holds in memory, in the order it delivers
//! them: offset order for an ordinary queue, and for a priority queue
//! (`x-max-priority`) highest priority first, offset order within one.

use std::collections::VecDeque;

use crate::message::QueuedMessage;

/// Ready messages in delivery order. Every operation is one `match` on the
/// kind: a queue without `x-max-priority` pays that branch and nothing
/// more.
#[derive(Debug)]
pub enum ReadyMessages {
    /// Offset order.
    Fifo(VecDeque<QueuedMessage>),
    /// One deque per priority level.
    Priority(PriorityLevels),
}

impl Default for ReadyMessages {
    fn default() -> Self {
        ReadyMessages::Fifo(VecDeque::new())
    }
}

/// The ready messages of a priority queue: one deque per level, each in
/// offset order.
#[derive(Debug)]
pub struct PriorityLevels {
    /// Indexed by level, 0 to the queue's `x-max-priority`.
    levels: Vec<VecDeque<QueuedMessage>>,
    len: usize,
    /// No level above this one holds a message; 0 when empty.
    top: usize,
}

impl PriorityLevels {
    /// The level of a message, as RabbitMQ 3.10's `rabbit_priority_queue`
    /// files it: its `priority` property, 0 when it has none, and the
    /// highest level for a priority above it.
    fn level_of(&self, entry: &QueuedMessage) -> usize {
        let priority = entry.message.properties.priority().unwrap_or(0) as usize;
        priority.min(self.levels.len() - 1)
    }

    fn lower_top(&mut self) {
        while self.top > 0 && self.levels[self.top].is_empty() {
            self.top -= 1;
        }
    }

    fn debug_validate(&self) {
        debug_assert_eq!(
            self.len,
            self.levels.iter().map(VecDeque::len).sum::<usize>()
        );
        debug_assert!(self.levels[self.top + 1..].iter().all(VecDeque::is_empty));
    }
}

impl ReadyMessages {
    /// Ready messages for a queue declared with `x-max-priority` set to
    /// `max_priority`. None, and 0 (a single level, delivered in offset
    /// order anyway), make an ordinary queue.
    pub fn new(max_priority: Option<u8>) -> Self {
        match max_priority {
            None | Some(0) => ReadyMessages::default(),
            Some(max) => ReadyMessages::Priority(PriorityLevels {
                levels: (0..=max).map(|_| VecDeque::new()).collect(),
                len: 0,
                top: 0,
            }),
        }
    }

    pub fn is_priority(&self) -> bool {
        matches!(self, ReadyMessages::Priority(_))
    }

    pub fn len(&self) -> usize {
        match self {
            ReadyMessages::Fifo(ready) => ready.len(),
            ReadyMessages::Priority(levels) => levels.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next message to deliver.
    pub fn front(&self) -> Option<&QueuedMessage> {
        match self {
            ReadyMessages::Fifo(ready) => ready.front(),
            ReadyMessages::Priority(levels) => levels.levels[levels.top].front(),
        }
    }

    /// Takes the next message to deliver.
    pub fn pop_front(&mut self) -> Option<QueuedMessage> {
        match self {
            ReadyMessages::Fifo(ready) => ready.pop_front(),
            ReadyMessages::Priority(levels) => {
                let entry = levels.levels[levels.top].pop_front()?;
                levels.len -= 1;
                levels.lower_top();
                levels.debug_validate();
                Some(entry)
            }
        }
    }

    /// Puts back a message just taken with [`ReadyMessages::pop_front`].
    pub fn push_front(&mut self, entry: QueuedMessage) {
        match self {
            ReadyMessages::Fifo(ready) => ready.push_front(entry),
            ReadyMessages::Priority(levels) => {
                let level = levels.level_of(&entry);
                levels.levels[level].push_front(entry);
                levels.len += 1;
                levels.top = levels.top.max(level);
                levels.debug_validate();
            }
        }
    }

    /// Appends a message newer than every message of its level.
    pub fn push_back(&mut self, entry: QueuedMessage) {
        match self {
            ReadyMessages::Fifo(ready) => ready.push_back(entry),
            ReadyMessages::Priority(levels) => {
                let level = levels.level_of(&entry);
                levels.levels[level].push_back(entry);
                levels.len += 1;
                levels.top = levels.top.max(level);
                levels.debug_validate();
            }
        }
    }

    /// Adds a message read back from disk: after every resident message in
    /// an ordinary queue, where paged messages are all newer; at its offset
    /// within its level in a priority queue, where messages published since
    /// recovery are resident and newer.
    pub fn push_read_back(&mut self, entry: QueuedMessage) {
        match self {
            ReadyMessages::Fifo(ready) => ready.push_back(entry),
            ReadyMessages::Priority(_) => self.insert_by_offset(entry),
        }
    }

    /// Puts a requeued message back where its offset places it (within its
    /// level, in a priority queue). Requeues are usually of the oldest
    /// messages, so the search is a binary one from the front.
    pub fn insert_by_offset(&mut self, entry: QueuedMessage) {
        let ready = match self {
            ReadyMessages::Fifo(ready) => ready,
            ReadyMessages::Priority(levels) => {
                let level = levels.level_of(&entry);
                levels.len += 1;
                levels.top = levels.top.max(level);
                &mut levels.levels[level]
            }
        };
        let position = ready.partition_point(|queued| queued.offset < entry.offset);
        ready.insert(position, entry);
    }

    /// Puts many requeued messages back where their offsets place them,
    /// in O(n log n) for n of them plus one pass over the queue, where
    /// inserting them one by one was quadratic: a million unacked messages
    /// of a connection that died took the queue's lock for minutes.
    pub fn merge_requeued(&mut self, mut requeued: Vec<QueuedMessage>) {
        requeued.sort_unstable_by_key(|entry| entry.offset);
        match self {
            ReadyMessages::Fifo(ready) => merge_sorted(ready, requeued),
            ReadyMessages::Priority(levels) => {
                let mut by_level: Vec<Vec<QueuedMessage>> =
                    (0..levels.levels.len()).map(|_| Vec::new()).collect();
                for entry in requeued {
                    let level = levels.level_of(&entry);
                    by_level[level].push(entry);
                }
                for (level, entries) in by_level.into_iter().enumerate() {
                    if entries.is_empty() {
                        continue;
                    }
                    levels.len += entries.len();
                    levels.top = levels.top.max(level);
                    merge_sorted(&mut levels.levels[level], entries);
                }
                levels.debug_validate();
            }
        }
    }

    pub fn clear(&mut self) {
        match self {
            ReadyMessages::Fifo(ready) => ready.clear(),
            ReadyMessages::Priority(levels) => {
                levels.levels.iter_mut().for_each(VecDeque::clear);
                levels.len = 0;
                levels.top = 0;
            }
        }
    }

    /// Takes every message out, leaving the same kind of container empty.
    pub fn take_all(&mut self) -> Vec<QueuedMessage> {
        match self {
            ReadyMessages::Fifo(ready) => std::mem::take(ready).into(),
            ReadyMessages::Priority(levels) => {
                let mut all = Vec::with_capacity(levels.len);
                for level in levels.levels.iter_mut().rev() {
                    all.extend(level.drain(..));
                }
                levels.len = 0;
                levels.top = 0;
                all
            }
        }
    }
}

/// Merges `requeued`, sorted by offset, into `ready`, sorted by offset. The
/// common case, messages older than everything ready (a consumer's unacked
/// ones), goes to the front without touching the rest.
fn merge_sorted(ready: &mut VecDeque<QueuedMessage>, requeued: Vec<QueuedMessage>) {
    let Some(newest) = requeued.last().map(|entry| entry.offset) else {
        return;
    };
    if ready.front().is_none_or(|head| newest < head.offset) {
        ready.reserve(requeued.len());
        for entry in requeued.into_iter().rev() {
            ready.push_front(entry);
        }
        return;
    }
    let old = std::mem::take(ready);
    let mut merged = VecDeque::with_capacity(old.len() + requeued.len());
    let mut old = old.into_iter().peekable();
    let mut requeued = requeued.into_iter().peekable();
    while let (Some(waiting), Some(back)) = (old.peek(), requeued.peek()) {
        let next = if waiting.offset < back.offset {
            old.next()
        } else {
            requeued.next()
        };
        merged.extend(next);
    }
    merged.extend(old);
    merged.extend(requeued);
    *ready = merged;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use amq_protocol::protocol::basic::AMQPProperties;
    use bytes::Bytes;
    use sluice_wire::content::RawProperties;

    use super::*;
    use crate::expiry::NEVER;
    use crate::message::Message;

    fn entry(offset: u64, priority: Option<u8>) -> QueuedMessage {
        let mut properties = AMQPProperties::default();
        if let Some(priority) = priority {
            properties = properties.with_priority(priority);
        }
        QueuedMessage {
            offset,
            message: Arc::new(Message {
                exchange: Bytes::new(),
                routing_key: Bytes::from_static(b"q"),
                properties: RawProperties::from_properties(&properties),
                body: Bytes::from_static(b"body"),
            }),
            redelivered: false,
            segment: None,
            expires_at_us: NEVER,
        }
    }

    fn drain(ready: &mut ReadyMessages) -> Vec<u64> {
        std::iter::from_fn(|| ready.pop_front())
            .map(|entry| entry.offset)
            .collect()
    }

    #[test]
    fn ready_priority_levels_deliver_highest_first_and_fifo_within_one() {
        let mut ready = ReadyMessages::new(Some(5));
        for (offset, priority) in [
            (0, None),
            (1, Some(3)),
            (2, Some(1)),
            (3, Some(3)),
            (4, Some(0)),
        ] {
            ready.push_back(entry(offset, priority));
        }
        assert_eq!(ready.len(), 5);
        assert_eq!(drain(&mut ready), [1, 3, 2, 0, 4]);
        assert!(ready.is_empty());
    }

    #[test]
    fn ready_priority_above_the_max_counts_as_the_max() {
        let mut ready = ReadyMessages::new(Some(2));
        ready.push_back(entry(0, Some(2)));
        ready.push_back(entry(1, Some(200)));
        ready.push_back(entry(2, Some(1)));
        assert_eq!(drain(&mut ready), [0, 1, 2]);
    }

    #[test]
    fn ready_requeue_returns_to_its_level_in_offset_order() {
        let mut ready = ReadyMessages::new(Some(9));
        for offset in 0..4 {
            ready.push_back(entry(offset, Some(if offset % 2 == 0 { 9 } else { 1 })));
        }
        let first = ready.pop_front().unwrap();
        let second = ready.pop_front().unwrap();
        assert_eq!((first.offset, second.offset), (0, 2));
        ready.insert_by_offset(second);
        ready.insert_by_offset(first);
        let refused = ready.pop_front().unwrap();
        ready.push_front(refused);
        assert_eq!(drain(&mut ready), [0, 2, 1, 3]);
    }

    #[test]
    fn ready_without_max_priority_is_fifo() {
        let mut ready = ReadyMessages::new(None);
        assert!(!ready.is_priority());
        assert!(!ReadyMessages::new(Some(0)).is_priority());
        ready.push_back(entry(0, Some(1)));
        ready.push_back(entry(1, Some(9)));
        assert_eq!(ready.take_all().len(), 2);
        assert!(ready.is_empty());
    }

    /// Requeues in bulk, in any order and any mix with the ready messages,
    /// end in the order inserting them one at a time gives.
    #[test]
    fn ready_merge_requeued_matches_inserting_one_by_one() {
        use rand::seq::SliceRandom;
        let mut random = rand::rng();
        for max_priority in [None, Some(3)] {
            for round in 0..200 {
                let mut offsets: Vec<u64> = (0..40).collect();
                offsets.shuffle(&mut random);
                let split = round % 40;
                let (ready_part, requeued_part) = offsets.split_at(split);
                let priority_of = |offset: u64| max_priority.map(|_| (offset % 5) as u8);
                let fill = |ready: &mut ReadyMessages| {
                    let mut sorted = ready_part.to_vec();
                    sorted.sort_unstable();
                    for offset in sorted {
                        ready.push_back(entry(offset, priority_of(offset)));
                    }
                };
                let mut one_by_one = ReadyMessages::new(max_priority);
                fill(&mut one_by_one);
                for offset in requeued_part {
                    one_by_one.insert_by_offset(entry(*offset, priority_of(*offset)));
                }
                let mut merged = ReadyMessages::new(max_priority);
                fill(&mut merged);
                merged.merge_requeued(
                    requeued_part
                        .iter()
                        .map(|offset| entry(*offset, priority_of(*offset)))
                        .collect(),
                );
                assert_eq!(merged.len(), 40);
                assert_eq!(drain(&mut merged), drain(&mut one_by_one));
            }
        }
    }
}
