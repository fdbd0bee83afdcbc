//! A vhost's message counts: its open channels' added up when read, plus
//! what the closed ones counted, as RabbitMQ's management agent adds up
//! channel stats. Nothing here is on the message path: a channel registers
//! when it opens and retires when it closes; readers (the management API,
//! Prometheus) walk the open ones.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::counters::MessageCounts;

/// A place whose counts belong to a vhost: a channel.
pub trait CountedChannel: Send + Sync {
    fn counts(&self) -> MessageCounts;
}

/// The channels of a vhost that count, and what closed ones counted.
#[derive(Default)]
pub struct VhostCounts {
    state: Mutex<CountsState>,
}

#[derive(Default)]
struct CountsState {
    next_key: u64,
    open: HashMap<u64, Weak<dyn CountedChannel>>,
    /// Closed channels' counts, and counts from outside any channel.
    retired: MessageCounts,
}

/// A channel's place among its vhost's counted channels: give it back with
/// [`VhostCounts::retire`] when the channel closes.
#[derive(Debug)]
pub struct CountedKey(u64);

impl VhostCounts {
    fn lock(&self) -> MutexGuard<'_, CountsState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An opened channel, counted from now on. Bounded by the channels the
    /// vhost's connections may open.
    pub fn register(&self, channel: &Arc<dyn CountedChannel>) -> CountedKey {
        let mut state = self.lock();
        let key = state.next_key;
        state.next_key += 1;
        state.open.insert(key, Arc::downgrade(channel));
        CountedKey(key)
    }

    /// A channel closes: what it counted stays in the vhost's totals. Under
    /// the same lock as readers, so a reader counts the channel once,
    /// either open or retired.
    pub fn retire(&self, key: CountedKey) {
        let mut state = self.lock();
        if let Some(channel) = state.open.remove(&key.0).and_then(|weak| weak.upgrade()) {
            state.retired += channel.counts();
        }
    }

    /// Counts from outside any channel: the management API's publishes.
    pub fn add(&self, counts: MessageCounts) {
        self.lock().retired += counts;
    }

    /// The vhost's totals now.
    pub fn counts(&self) -> MessageCounts {
        let state = self.lock();
        let mut total = state.retired;
        for channel in state.open.values().filter_map(Weak::upgrade) {
            total += channel.counts();
        }
        total
    }
}

#[cfg(all(test, not(feature = "uncounted")))]
mod tests {
    use super::*;

    struct Channel(Mutex<MessageCounts>);

    impl CountedChannel for Channel {
        fn counts(&self) -> MessageCounts {
            *self.0.lock().unwrap()
        }
    }

    fn channel() -> Arc<Channel> {
        Arc::new(Channel(Mutex::new(MessageCounts::default())))
    }

    fn publish(channel: &Channel, messages: u64) {
        channel
            .0
            .lock()
            .unwrap()
            .add(|counts| &mut counts.published, messages);
    }

    #[test]
    fn totals_add_open_channels_to_what_closed_ones_counted() {
        let vhost = VhostCounts::default();
        let first = channel();
        let second = channel();
        let first_key = vhost.register(&(Arc::clone(&first) as Arc<dyn CountedChannel>));
        let second_key = vhost.register(&(Arc::clone(&second) as Arc<dyn CountedChannel>));
        publish(&first, 3);
        publish(&second, 4);
        assert_eq!(vhost.counts().published, 7);

        vhost.retire(first_key);
        drop(first);
        publish(&second, 1);
        assert_eq!(vhost.counts().published, 8);

        vhost.add(MessageCounts {
            published: 2,
            ..MessageCounts::default()
        });
        vhost.retire(second_key);
        assert_eq!(vhost.counts().published, 10);
        // A retired channel counting on is no longer the vhost's.
        publish(&second, 5);
        assert_eq!(vhost.counts().published, 10);
    }
}
