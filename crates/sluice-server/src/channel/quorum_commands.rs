//! A channel's commands in flight to each quorum queue it publishes into,
//! held to `quorum_commands_soft_limit` as RabbitMQ's `rabbit_fifo_client`
//! holds them: a publish that leaves a queue with that many of this
//! channel's messages not yet applied makes the channel slow, and its
//! connection stops reading until they are fewer again. The limit is soft:
//! the messages already read are still published, one batch may pass it.
//!
//! Without it a single fast publisher fills the queue member's whole
//! backlog and every other publisher into that queue pauses with it; with
//! it each publisher waits on its own messages.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use sluice_core::confirm::{ConfirmStatus, ForwardedConfirm};

/// The default `quorum_commands_soft_limit`: 128, where RabbitMQ's is 32.
/// Ra pipelines a publisher's commands, each its own log entry; a Sluice
/// member proposes one entry at a time and gathers what arrives meanwhile
/// into the next, so a publisher's limit is also what it can put in one
/// round. Measured on 3 nodes (publisher on node 2, consumer on node 3,
/// persistent 1 KB): with 32 a publisher with 100 confirms in flight fell
/// from 13.0k to 7.6k msg/s; a publisher without confirms carried 8.6k msg/s
/// at 32, 14.0k at 64, 19.5k at 128 with its consumer keeping up, and at 256
/// ran ahead of its consumer (latency past 3 s) as it did with no limit
/// (29.7k sent, 2.2k consumed, 355 MiB on the publisher's node).
pub const QUORUM_COMMANDS_SOFT_LIMIT_DEFAULT: u32 = 128;

pub struct QuorumCommands {
    soft_limit: usize,
    /// By queue name (a channel publishes in one vhost). A queue deleted
    /// and declared again under its name refused what it had not applied,
    /// so nothing of the old one holds up the new one.
    ///
    /// Each in publish order: a queue applies one publisher's messages in
    /// the order it sent them, so the settled ones are at the front.
    in_flight: HashMap<Arc<str>, VecDeque<Arc<ForwardedConfirm>>>,
}

impl QuorumCommands {
    pub fn new(soft_limit: u32) -> Self {
        QuorumCommands {
            soft_limit: soft_limit.max(1) as usize,
            in_flight: HashMap::new(),
        }
    }

    /// A message went to `queue`, which will say `confirm` once it applied
    /// it (or refuse it). Whether `queue` now has the soft limit's worth in
    /// flight.
    pub fn record(&mut self, queue: &Arc<str>, confirm: Arc<ForwardedConfirm>) -> bool {
        match self.in_flight.get_mut(queue) {
            Some(commands) => {
                forget_settled(commands);
                commands.push_back(confirm);
                commands.len() >= self.soft_limit
            }
            None => {
                self.in_flight
                    .insert(Arc::clone(queue), VecDeque::from([confirm]));
                self.soft_limit == 1
            }
        }
    }

    /// Whether some queue has `quorum_commands_soft_limit` or more of this
    /// channel's messages not applied yet. Forgets those that were, and the
    /// queues with none left.
    pub fn is_slow(&mut self) -> bool {
        if self.in_flight.is_empty() {
            return false;
        }
        let soft_limit = self.soft_limit;
        let mut slow = false;
        self.in_flight.retain(|_, commands| {
            forget_settled(commands);
            slow |= commands.len() >= soft_limit;
            !commands.is_empty()
        });
        slow
    }

    /// Messages not known to be applied yet, over all queues.
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.in_flight.values().map(VecDeque::len).sum()
    }
}

/// Drops the messages at the front the queue has given its word on.
fn forget_settled(commands: &mut VecDeque<Arc<ForwardedConfirm>>) {
    while commands
        .front()
        .is_some_and(|confirm| confirm.status() != ConfirmStatus::Pending)
    {
        commands.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    #[test]
    fn slow_at_the_limit_for_one_queue_and_not_below() {
        let mut commands = QuorumCommands::new(3);
        let first = queue("first");
        let second = queue("second");
        let confirms: Vec<Arc<ForwardedConfirm>> = (0..3)
            .map(|_| Arc::new(ForwardedConfirm::default()))
            .collect();
        commands.record(&first, Arc::clone(&confirms[0]));
        commands.record(&first, Arc::clone(&confirms[1]));
        // Two to one queue and one to another: no queue is at three.
        assert!(!commands.record(&second, Arc::new(ForwardedConfirm::default())));
        assert!(!commands.is_slow());
        assert!(commands.record(&first, Arc::clone(&confirms[2])));
        assert!(commands.is_slow());
        // Applied (or refused) messages leave the count.
        confirms[0].confirm();
        assert!(!commands.is_slow());
        assert_eq!(commands.in_flight(), 3);
        confirms[1].refuse();
        confirms[2].confirm();
        assert!(!commands.is_slow());
        assert_eq!(commands.in_flight(), 1);
    }

    #[test]
    fn a_queue_with_nothing_in_flight_is_forgotten() {
        let mut commands = QuorumCommands::new(1);
        let confirm = Arc::new(ForwardedConfirm::default());
        commands.record(&queue("only"), Arc::clone(&confirm));
        assert!(commands.is_slow());
        confirm.confirm();
        assert!(!commands.is_slow());
        assert!(commands.in_flight.is_empty());
    }
}
