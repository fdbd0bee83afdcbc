//! Counters of what happens to messages, kept where it happens: in each
//! queue, channel and vhost, for the management API and Prometheus to read
//! (RabbitMQ's `message_stats`: publish, deliver_get, redeliver, ack,
//! confirm, return_unroutable, drop_unroutable).
//!
//! Counting costs the message path no atomic operation. Each place counts
//! into plain integers ([`MessageCounts`]) that only one thread writes at a
//! time, because they sit where the message path already is alone: a
//! classic queue's counts under its state lock, a channel's deliveries
//! under its delivery lock, a channel's publishes in the connection task
//! that owns the channel. The last are handed to [`MessageCounters`],
//! which readers on other threads see, once per read batch, not per
//! message. A vhost keeps no counter of its own on the message path: its
//! counts are its channels' added up when read, as RabbitMQ's management
//! agent adds up channel stats (see [`crate::vhost::counts`]). Each count is
//! exact on its own; counts read one after another are not a consistent
//! snapshot of each other.

use std::sync::atomic::{AtomicU64, Ordering};

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

/// Declares the counts once: [`MessageCounts`] (plain, for the one writer
/// and for readers' results), [`MessageCounters`] (shared, atomic) and the
/// field-by-field operations between them.
macro_rules! message_counts {
    ($( $(#[$doc:meta])* $field:ident, )*) => {
        /// What happened to messages at one place, as plain integers: the
        /// counts of a place only one thread writes at a time, and any
        /// place's counts read at one moment. Each place counts the events
        /// that happen there and leaves the others at zero: a queue has no
        /// unroutable messages, a channel drops none by TTL.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct MessageCounts {
            $( $(#[$doc])* pub $field: u64, )*
        }

        /// [`MessageCounts`] that several threads add to and read: each
        /// count a relaxed atomic.
        #[derive(Debug, Default)]
        pub struct MessageCounters {
            $( $(#[$doc])* pub $field: Counter, )*
        }

        impl MessageCounters {
            pub fn counts(&self) -> MessageCounts {
                MessageCounts { $( $field: self.$field.get(), )* }
            }

            /// Adds `counts`, one atomic add per count that is not zero.
            pub fn add_counts(&self, counts: &MessageCounts) {
                $( if counts.$field != 0 { self.$field.add(counts.$field); } )*
            }
        }

        impl std::ops::AddAssign for MessageCounts {
            fn add_assign(&mut self, other: MessageCounts) {
                $( self.$field += other.$field; )*
            }
        }

        impl MessageCounts {
            pub fn is_zero(&self) -> bool {
                $( self.$field == 0 && )* true
            }
        }
    };
}

message_counts! {
    /// Received from publishers (a channel, a vhost) or taken in (a queue).
    published,
    published_bytes,
    /// Published messages that reached at least one queue.
    routed,
    /// Published with mandatory, reached no queue, sent back.
    returned_unroutable,
    /// Published without mandatory, reached no queue, dropped.
    dropped_unroutable,
    /// Of those received, on channels in confirm mode.
    received_confirm,
    /// Publisher confirms sent (basic.ack to a publisher).
    confirmed,
    /// Publishes refused (basic.nack to a publisher).
    refused,
    /// Sent to consumers or fetched with basic.get.
    delivered,
    /// Of those, fetched with basic.get.
    delivered_get,
    /// Of those fetched, with no_ack (acknowledged automatically).
    delivered_get_no_ack,
    /// Of those sent to consumers, to no_ack consumers.
    delivered_consume_no_ack,
    /// basic.get that found the queue empty.
    get_empty,
    delivered_bytes,
    /// Of those, sent again after a requeue or a restart.
    redelivered,
    /// Acknowledged by consumers.
    acked,
    /// Left a queue unconsumed: expired, over a length limit, rejected
    /// without requeue, purged.
    dropped,
}

/// How a message left for a client: RabbitMQ counts consumers' deliveries
/// and basic.get apart, each with manual or automatic acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveredBy {
    Consume { no_ack: bool },
    Get { no_ack: bool },
}

impl MessageCounts {
    /// False in the `uncounted` build, which measures what counting costs.
    #[inline]
    fn counting(&self) -> bool {
        !cfg!(feature = "uncounted")
    }

    /// A message received from a publisher.
    #[inline]
    pub fn count_publish(&mut self, body_bytes: usize) {
        if self.counting() {
            self.published += 1;
            self.published_bytes += body_bytes as u64;
        }
    }

    /// One message published, counted on its own.
    pub fn of_publish(body_bytes: usize, routed: bool, mandatory: bool) -> MessageCounts {
        let mut counts = MessageCounts::default();
        counts.count_publish(body_bytes);
        counts.count_routing(routed, mandatory);
        counts
    }

    /// Where a published message went: to queues, back to its publisher
    /// (mandatory), or nowhere.
    #[inline]
    pub fn count_routing(&mut self, routed: bool, mandatory: bool) {
        if !self.counting() {
            return;
        }
        match (routed, mandatory) {
            (true, _) => self.routed += 1,
            (false, true) => self.returned_unroutable += 1,
            (false, false) => self.dropped_unroutable += 1,
        }
    }

    /// A message sent to a consumer or fetched, `how`.
    #[inline]
    pub fn count_delivery(&mut self, body_bytes: usize, redelivered: bool, how: DeliveredBy) {
        if !self.counting() {
            return;
        }
        self.delivered += 1;
        self.delivered_bytes += body_bytes as u64;
        self.redelivered += u64::from(redelivered);
        match how {
            DeliveredBy::Consume { no_ack: false } => {}
            DeliveredBy::Consume { no_ack: true } => self.delivered_consume_no_ack += 1,
            DeliveredBy::Get { no_ack } => {
                self.delivered_get += 1;
                self.delivered_get_no_ack += u64::from(no_ack);
            }
        }
    }

    /// Adds `amount` to the count `field` picks:
    /// `counts.add(|counts| &mut counts.acked, 1)`.
    #[inline]
    pub fn add(&mut self, field: fn(&mut MessageCounts) -> &mut u64, amount: u64) {
        if self.counting() {
            *field(self) += amount;
        }
    }

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

impl MessageCounters {
    /// A message sent to a consumer or fetched, counted where several
    /// threads count (a quorum queue's members).
    pub fn count_delivery(&self, body_bytes: usize, redelivered: bool, how: DeliveredBy) {
        let mut counts = MessageCounts::default();
        counts.count_delivery(body_bytes, redelivered, how);
        self.add_counts(&counts);
    }

    /// A message received, counted where several threads count.
    pub fn count_publish(&self, body_bytes: usize) {
        let mut counts = MessageCounts::default();
        counts.count_publish(body_bytes);
        self.add_counts(&counts);
    }
}

/// Hands what the one writer counted since the last flush to the shared
/// counters, and starts again from zero.
pub fn flush_counts(counts: &mut MessageCounts, into: &MessageCounters) {
    if !counts.is_zero() {
        into.add_counts(counts);
        *counts = MessageCounts::default();
    }
}

#[cfg(all(test, not(feature = "uncounted")))]
mod tests {
    use super::*;

    #[test]
    fn a_flush_hands_over_what_was_counted_once() {
        let shared = MessageCounters::default();
        let mut counts = MessageCounts::default();
        counts.count_publish(10);
        counts.count_routing(false, true);
        counts.count_delivery(10, true, DeliveredBy::Get { no_ack: true });
        counts.add(|counts| &mut counts.acked, 3);
        flush_counts(&mut counts, &shared);
        assert!(counts.is_zero());
        flush_counts(&mut counts, &shared);
        let read = shared.counts();
        assert_eq!(read.published, 1);
        assert_eq!(read.published_bytes, 10);
        assert_eq!(read.returned_unroutable, 1);
        assert_eq!(read.routed, 0);
        assert_eq!(read.delivered, 1);
        assert_eq!(read.delivered_get, 1);
        assert_eq!(read.delivered_get_no_ack, 1);
        assert_eq!(read.redelivered, 1);
        assert_eq!(read.acked, 3);
        assert_eq!(read.get_manual_ack(), 0);
    }
}
