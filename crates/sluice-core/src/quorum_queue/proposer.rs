//! A member's proposals to its queue's log, in order and batched: what
//! channels hand the queue (publishes, consumers, settlements) waits here
//! while the previous entry is being committed, then goes as one entry.
//! Under load the batch grows with the commit time (one round trip and one
//! fdatasync per entry), bounded by [`ENTRY_ITEMS_MAX`] and
//! [`ENTRY_BYTES_MAX`], as Ra's WAL batch is by `wal_max_batch_size`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use super::command::{Command, Reply};
use super::entry::{decode, Batch, BatchReply, Item};
use super::replication::ReplicatedLog;
use crate::confirm::ForwardedConfirm;

/// Items in one entry.
pub const ENTRY_ITEMS_MAX: usize = 4096;
/// Bytes of messages in one entry (one message may pass it alone).
pub const ENTRY_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Messages waiting for an entry before publishers into the queue pause:
/// what one member holds for its queue beyond the entry in flight.
pub const BACKLOG_MESSAGES_MAX: usize = 8192;
pub const BACKLOG_BYTES_MAX: usize = 32 * 1024 * 1024;
/// How long an entry is proposed again across leader changes and a lost
/// majority before its publishes are nacked.
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);
const RETRY_DELAY: Duration = Duration::from_millis(100);

/// Who waits for an item's reply.
pub enum Waiter {
    Nobody,
    /// A publisher's confirm: confirmed once enqueued, refused otherwise.
    Confirm(Arc<ForwardedConfirm>),
    Reply(oneshot::Sender<Result<Reply, String>>),
}

impl Waiter {
    fn answer(self, reply: Result<Reply, String>) {
        match self {
            Waiter::Nobody => {}
            Waiter::Confirm(confirm) => match reply {
                Ok(Reply::Enqueued) => confirm.confirm(),
                _ => confirm.refuse(),
            },
            Waiter::Reply(sender) => {
                let _ = sender.send(reply);
            }
        }
    }
}

#[derive(Default)]
struct Backlog {
    items: Vec<(Item, Waiter)>,
    message_bytes: usize,
    next_sequence: u64,
}

/// One member's queue of proposals.
pub struct Proposer {
    /// Names this member's publishes in the log (see [`Item::Publish`]).
    id: u64,
    backlog: Mutex<Backlog>,
    wake: Notify,
    /// Wakes publishers paused on a full backlog.
    pub drained: Notify,
    stopped: AtomicBool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Proposer {
    pub fn new() -> Arc<Proposer> {
        Arc::new(Proposer {
            id: rand::random(),
            backlog: Mutex::new(Backlog {
                next_sequence: 1,
                ..Backlog::default()
            }),
            wake: Notify::new(),
            drained: Notify::new(),
            stopped: AtomicBool::new(false),
        })
    }

    /// Queues a published message (encoded), numbered in publish order.
    pub fn publish(&self, message: Vec<u8>, ttl_ms: Option<u64>, waiter: Waiter) {
        let mut backlog = lock(&self.backlog);
        let sequence = backlog.next_sequence;
        backlog.next_sequence += 1;
        backlog.message_bytes += message.len();
        backlog.items.push((
            Item::Publish {
                publisher: (self.id, sequence),
                ttl_ms,
                message,
            },
            waiter,
        ));
        drop(backlog);
        self.wake.notify_one();
    }

    /// Queues anything else. A settlement right behind another of the same
    /// kind for the same consumer joins it: a consumer acking one message
    /// at a time costs one item per entry, not one per ack.
    pub fn submit(&self, item: Item, waiter: Waiter) {
        let mut backlog = lock(&self.backlog);
        if let (Item::Machine(command), Waiter::Nobody) = (&item, &waiter) {
            if let Some((Item::Machine(last), Waiter::Nobody)) = backlog.items.last_mut() {
                if join_settlements(last, command) {
                    return;
                }
            }
        }
        backlog.items.push((item, waiter));
        drop(backlog);
        self.wake.notify_one();
    }

    /// Whether publishers should pause until the backlog drains.
    pub fn is_full(&self) -> bool {
        let backlog = lock(&self.backlog);
        backlog.items.len() >= BACKLOG_MESSAGES_MAX || backlog.message_bytes >= BACKLOG_BYTES_MAX
    }

    /// Whether it stopped (the queue was deleted, or this member stops).
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Stops proposing; what waits is refused.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        let items = std::mem::take(&mut lock(&self.backlog).items);
        for (_, waiter) in items {
            waiter.answer(Err("the queue was deleted".to_owned()));
        }
        self.wake.notify_one();
        self.drained.notify_waiters();
    }

    /// The next entry's items: the oldest waiting, within the bounds.
    fn take_batch(&self) -> Vec<(Item, Waiter)> {
        let mut backlog = lock(&self.backlog);
        let mut bytes = 0;
        let mut count = 0;
        for (item, _) in &backlog.items {
            let size = match item {
                Item::Publish { message, .. } => message.len(),
                Item::Machine(_) => 64,
            };
            if count > 0 && (count == ENTRY_ITEMS_MAX || bytes + size > ENTRY_BYTES_MAX) {
                break;
            }
            bytes += size;
            count += 1;
        }
        let rest = backlog.items.split_off(count);
        let batch = std::mem::replace(&mut backlog.items, rest);
        let message_bytes: usize = batch
            .iter()
            .map(|(item, _)| match item {
                Item::Publish { message, .. } => message.len(),
                Item::Machine(_) => 0,
            })
            .sum();
        backlog.message_bytes -= message_bytes;
        batch
    }

    /// Proposes entries until stopped: one at a time, in order, each
    /// proposed again until committed or given up on.
    pub async fn run(self: Arc<Self>, log: Arc<dyn ReplicatedLog>) {
        loop {
            let woken = self.wake.notified();
            if self.stopped.load(Ordering::Acquire) {
                return;
            }
            let batch = self.take_batch();
            if batch.is_empty() {
                woken.await;
                continue;
            }
            let (items, waiters): (Vec<Item>, Vec<Waiter>) = batch.into_iter().unzip();
            // basic.get reads the body this member holds once it applied
            // the entry; everything else needs only the leader's word.
            let applied_here = items
                .iter()
                .any(|item| matches!(item, Item::Machine(Command::Dequeue { .. })));
            let entry = Batch {
                time_ms: wall_ms(),
                items,
            }
            .encode();
            let started = Instant::now();
            let outcome = loop {
                match log.propose(entry.clone(), applied_here).await {
                    Ok(reply) => break decode::<BatchReply>(&reply),
                    Err(error)
                        if started.elapsed() < GIVE_UP_AFTER
                            && !self.stopped.load(Ordering::Acquire) =>
                    {
                        tracing::debug!(%error, "quorum queue entry not committed; proposing it again");
                        tokio::time::sleep(RETRY_DELAY).await;
                    }
                    Err(error) => break Err(error),
                }
            };
            match outcome {
                Ok(replies) => {
                    let mut replies = replies.into_iter();
                    for waiter in waiters {
                        let reply = replies
                            .next()
                            .ok_or_else(|| "no reply for the item".to_owned());
                        waiter.answer(reply);
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "quorum queue entry given up on: its publishes are nacked");
                    for waiter in waiters {
                        waiter.answer(Err(error.clone()));
                    }
                }
            }
            log.confirms_due();
            if !self.is_full() {
                self.drained.notify_waiters();
            }
        }
    }
}

/// Adds `next`'s deliveries to `last` when both settle the same way for
/// the same consumer; whether it did.
fn join_settlements(last: &mut Command, next: &Command) -> bool {
    match (last, next) {
        (
            Command::Settle {
                consumer,
                deliveries,
            },
            Command::Settle {
                consumer: next_consumer,
                deliveries: more,
            },
        )
        | (
            Command::Return {
                consumer,
                deliveries,
            },
            Command::Return {
                consumer: next_consumer,
                deliveries: more,
            },
        )
        | (
            Command::Release {
                consumer,
                deliveries,
            },
            Command::Release {
                consumer: next_consumer,
                deliveries: more,
            },
        )
        | (
            Command::Discard {
                consumer,
                deliveries,
            },
            Command::Discard {
                consumer: next_consumer,
                deliveries: more,
            },
        ) if consumer == next_consumer => {
            deliveries.extend_from_slice(more);
            true
        }
        _ => false,
    }
}

/// Milliseconds since the Unix epoch: the queue's log time.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quorum_queue::command::ConsumerId;

    fn consumer(tag: &str) -> ConsumerId {
        ConsumerId {
            connection: 1,
            channel: 1,
            tag: tag.to_owned(),
        }
    }

    #[test]
    fn quorum_proposer_joins_settlements_of_one_consumer_in_a_row() {
        let proposer = Proposer::new();
        let settle = |tag: &str, delivery| {
            Item::Machine(Command::Settle {
                consumer: consumer(tag),
                deliveries: vec![delivery],
            })
        };
        proposer.submit(settle("a", 1), Waiter::Nobody);
        proposer.submit(settle("a", 2), Waiter::Nobody);
        proposer.submit(settle("b", 3), Waiter::Nobody);
        proposer.submit(
            Item::Machine(Command::Return {
                consumer: consumer("b"),
                deliveries: vec![4],
            }),
            Waiter::Nobody,
        );
        proposer.submit(settle("b", 5), Waiter::Nobody);
        let batch: Vec<Item> = proposer
            .take_batch()
            .into_iter()
            .map(|(item, _)| item)
            .collect();
        let shapes: Vec<String> = batch
            .iter()
            .map(|item| match item {
                Item::Machine(Command::Settle {
                    consumer,
                    deliveries,
                }) => {
                    format!("settle {} {deliveries:?}", consumer.tag)
                }
                Item::Machine(Command::Return {
                    consumer,
                    deliveries,
                }) => {
                    format!("return {} {deliveries:?}", consumer.tag)
                }
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            shapes,
            [
                "settle a [1, 2]",
                "settle b [3]",
                "return b [4]",
                "settle b [5]"
            ]
        );
    }
}
