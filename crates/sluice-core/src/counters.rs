//! Counters of what happens to messages, kept where it happens: in each
//! queue, channel, connection and vhost, for the management API and
//! Prometheus to read (RabbitMQ's `message_stats`: publish, deliver_get,
//! redeliver, ack, confirm, return_unroutable, drop_unroutable).
//!
//! They cost one relaxed atomic add each on the message path, no lock. A
//! counter written by many threads at once (a vhost's, which every
//! publisher of the vhost adds to) is split in shards, one per thread in
//! use up to [`COUNTER_SHARDS`], each on its own cache line, so publishers
//! on different cores do not fight over one line; readers add the shards
//! up. Each count is exact on its own; counts read one after another are
//! not a consistent snapshot of each other.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Shards of a counter that many threads write. The runtime has a worker
/// thread per core; 16 covers machines up to 16 cores without sharing a
/// shard, and beyond that threads share them (still correct, a little
/// slower). Each shard is aligned to 128 bytes (two cache lines, against
/// the adjacent-line prefetcher) and holds 18 counters, so 256 bytes: 4 KiB
/// per counted vhost.
pub const COUNTER_SHARDS: usize = 16;

/// One count, added to with a relaxed atomic.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub fn add(&self, amount: u64) {
        if cfg!(feature = "uncounted") {
            return;
        }
        self.0.fetch_add(amount, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What happened to messages at one place. Each place counts the events
/// that happen there and leaves the others at zero: a queue has no
/// unroutable messages, a channel drops none by TTL.
#[derive(Debug, Default)]
pub struct MessageCounters {
    /// Received from publishers (a channel, a vhost) or taken in (a queue).
    pub published: Counter,
    pub published_bytes: Counter,
    /// Published messages that reached at least one queue.
    pub routed: Counter,
    /// Published with mandatory, reached no queue, sent back.
    pub returned_unroutable: Counter,
    /// Published without mandatory, reached no queue, dropped.
    pub dropped_unroutable: Counter,
    /// Of those received, on channels in confirm mode.
    pub received_confirm: Counter,
    /// Publisher confirms sent (basic.ack to a publisher).
    pub confirmed: Counter,
    /// Publishes refused (basic.nack to a publisher).
    pub refused: Counter,
    /// Sent to consumers or fetched with basic.get.
    pub delivered: Counter,
    /// Of those, fetched with basic.get.
    pub delivered_get: Counter,
    /// Of those fetched, with no_ack (acknowledged automatically).
    pub delivered_get_no_ack: Counter,
    /// Of those sent to consumers, to no_ack consumers.
    pub delivered_consume_no_ack: Counter,
    /// basic.get that found the queue empty.
    pub get_empty: Counter,
    pub delivered_bytes: Counter,
    /// Of those, sent again after a requeue or a restart.
    pub redelivered: Counter,
    /// Acknowledged by consumers.
    pub acked: Counter,
    /// Left a queue unconsumed: expired, over a length limit, rejected
    /// without requeue, purged.
    pub dropped: Counter,
}

/// How a message left for a client: RabbitMQ counts consumers' deliveries
/// and basic.get apart, each with manual or automatic acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveredBy {
    Consume { no_ack: bool },
    Get { no_ack: bool },
}

impl MessageCounts {
    /// Sent to consumers that acknowledge.
    pub fn consume_manual_ack(&self) -> u64 {
        self.delivered
            .saturating_sub(self.delivered_get)
            .saturating_sub(self.delivered_consume_no_ack)
    }

    /// Fetched with basic.get, to be acknowledged.
    pub fn get_manual_ack(&self) -> u64 {
        self.delivered_get.saturating_sub(self.delivered_get_no_ack)
    }
}

/// [`MessageCounters`] read at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MessageCounts {
    pub published: u64,
    pub published_bytes: u64,
    pub routed: u64,
    pub returned_unroutable: u64,
    pub dropped_unroutable: u64,
    pub received_confirm: u64,
    pub confirmed: u64,
    pub refused: u64,
    pub delivered: u64,
    pub delivered_get: u64,
    pub delivered_get_no_ack: u64,
    pub delivered_consume_no_ack: u64,
    pub get_empty: u64,
    pub delivered_bytes: u64,
    pub redelivered: u64,
    pub acked: u64,
    pub dropped: u64,
}

impl MessageCounters {
    pub fn counts(&self) -> MessageCounts {
        MessageCounts {
            published: self.published.get(),
            published_bytes: self.published_bytes.get(),
            routed: self.routed.get(),
            returned_unroutable: self.returned_unroutable.get(),
            dropped_unroutable: self.dropped_unroutable.get(),
            received_confirm: self.received_confirm.get(),
            confirmed: self.confirmed.get(),
            refused: self.refused.get(),
            delivered: self.delivered.get(),
            delivered_get: self.delivered_get.get(),
            delivered_get_no_ack: self.delivered_get_no_ack.get(),
            delivered_consume_no_ack: self.delivered_consume_no_ack.get(),
            get_empty: self.get_empty.get(),
            delivered_bytes: self.delivered_bytes.get(),
            redelivered: self.redelivered.get(),
            acked: self.acked.get(),
            dropped: self.dropped.get(),
        }
    }

    /// A message sent to a consumer or fetched, `how`.
    #[inline]
    pub fn count_delivery(&self, body_bytes: usize, redelivered: bool, how: DeliveredBy) {
        self.delivered.add(1);
        self.delivered_bytes.add(body_bytes as u64);
        if redelivered {
            self.redelivered.add(1);
        }
        match how {
            DeliveredBy::Consume { no_ack: false } => {}
            DeliveredBy::Consume { no_ack: true } => self.delivered_consume_no_ack.add(1),
            DeliveredBy::Get { no_ack } => {
                self.delivered_get.add(1);
                if no_ack {
                    self.delivered_get_no_ack.add(1);
                }
            }
        }
    }

    /// A message received from a publisher.
    #[inline]
    pub fn count_publish(&self, body_bytes: usize) {
        self.published.add(1);
        self.published_bytes.add(body_bytes as u64);
    }
}

impl std::ops::AddAssign for MessageCounts {
    fn add_assign(&mut self, other: MessageCounts) {
        self.published += other.published;
        self.published_bytes += other.published_bytes;
        self.routed += other.routed;
        self.returned_unroutable += other.returned_unroutable;
        self.dropped_unroutable += other.dropped_unroutable;
        self.received_confirm += other.received_confirm;
        self.confirmed += other.confirmed;
        self.refused += other.refused;
        self.delivered += other.delivered;
        self.delivered_get += other.delivered_get;
        self.delivered_get_no_ack += other.delivered_get_no_ack;
        self.delivered_consume_no_ack += other.delivered_consume_no_ack;
        self.get_empty += other.get_empty;
        self.delivered_bytes += other.delivered_bytes;
        self.redelivered += other.redelivered;
        self.acked += other.acked;
        self.dropped += other.dropped;
    }
}

/// One shard on a cache line of its own.
#[derive(Default)]
#[repr(align(128))]
struct Shard(MessageCounters);

/// [`MessageCounters`] that many threads add to at once (see the module
/// doc).
pub struct ShardedCounters {
    shards: Box<[Shard]>,
}

impl Default for ShardedCounters {
    fn default() -> Self {
        ShardedCounters {
            shards: (0..COUNTER_SHARDS).map(|_| Shard::default()).collect(),
        }
    }
}

impl ShardedCounters {
    /// The calling thread's shard, to count into.
    #[inline]
    pub fn local(&self) -> &MessageCounters {
        if cfg!(feature = "uncounted") {
            return &self.shards[0].0;
        }
        &self.shards[thread_shard()].0
    }

    /// The shards added up.
    pub fn counts(&self) -> MessageCounts {
        let mut total = MessageCounts::default();
        for shard in self.shards.iter() {
            total += shard.0.counts();
        }
        total
    }
}

/// This thread's shard index: threads take the next one as they first
/// count, round robin.
fn thread_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % COUNTER_SHARDS;
    }
    SHARD.with(|shard| *shard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharded_counters_add_up_what_every_thread_counted() {
        let counters = std::sync::Arc::new(ShardedCounters::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let counters = std::sync::Arc::clone(&counters);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        counters.local().count_publish(10);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let counts = counters.counts();
        assert_eq!(counts.published, 4000);
        assert_eq!(counts.published_bytes, 40_000);
        assert_eq!(counts.delivered, 0);
    }
}
