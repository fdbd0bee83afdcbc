//! A classic queue: ready messages in offset order (a window of them in
//! memory, the rest paged out to its journal), the consumers it delivers
//! to, and the count of messages out for delivery.
//!
//! There is no queue task. Whoever changes a queue (a publisher routing to it,
//! an ack freeing prefetch room, a consumer arriving) takes its lock and
//! dispatches inline, so a message goes from the publisher's reader straight
//! into the consumer's output buffer with no task hop in between.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use amq_protocol::types::{AMQPValue, FieldTable};

use crate::arguments::{as_strict_integer, MAX_PRIORITY_MAX};
use crate::consumer::{ConnectionId, Consumer};
use crate::dead_letter::{DeadLetter, DeadLetterTarget, DeathReason};
use crate::error::{AmqpError, AmqpResult};
use crate::expiry::{deadline_of_wall_ms, now_us, wall_ms_of, QueueExpiry, NEVER};
use crate::message::Message;
use crate::pager::QueueStorage;
use crate::paging::{PagedMessage, ResidentBytes};
use crate::queue_journal::{read_message, Durability, QueueJournal, RecoveredQueue};
use crate::queue_limits::{Overflow, QueueLimits};
use crate::queue_timer::QueueTimer;
use crate::ready::ReadyMessages;
use crate::vhost::VirtualHost;
use sluice_store::group_commit::Location;

/// The queue argument that turns single active consumer on.
const SINGLE_ACTIVE_CONSUMER_ARGUMENT: &str = "x-single-active-consumer";

/// Paged references a drained queue keeps room for (24 bytes each).
const PAGED_CAPACITY_KEPT: usize = 4096;

/// How long compaction waits for its moved copies to be synced before it
/// leaves the old segments for a later pass.
const COMPACTION_SYNC_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// A message in a queue, or out with a consumer. `offset` orders messages
/// within their queue: requeued messages go back to where they were.
#[derive(Clone, Debug)]
pub struct QueuedMessage {
    pub offset: u64,
    pub message: Arc<Message>,
    pub redelivered: bool,
    /// The journal segment holding this message, when it is persisted.
    pub segment: Option<u64>,
    /// When it expires ([`crate::expiry::now_us`]'s clock), [`NEVER`] for
    /// most messages. Travels with a delivery, so a requeued message keeps
    /// its original expiry.
    pub expires_at_us: u64,
}

impl QueuedMessage {
    /// A paged message back in memory, read from its journal record.
    fn read_back(paged: PagedMessage, message: Message, expires_at_us: u64) -> Self {
        QueuedMessage {
            offset: paged.offset,
            message: Arc::new(message),
            redelivered: paged.redelivered(),
            segment: Some(paged.segment()),
            expires_at_us,
        }
    }
}

/// What a queue was declared with; compared on redeclaration.
#[derive(Clone, Debug)]
pub struct QueueOptions {
    pub durable: bool,
    pub exclusive_owner: Option<ConnectionId>,
    pub auto_delete: bool,
    pub arguments: FieldTable,
}

/// What became of a message offered to a queue.
#[derive(Clone)]
pub enum PublishOutcome {
    /// In the queue; persisted when a durability ticket comes with it, and
    /// safe to confirm once that ticket is synced.
    Enqueued(Option<Durability>),
    /// The queue is full and its overflow is reject-publish: publishers
    /// with confirms get a nack.
    Rejected,
}

/// A queue with consumers is congested once its backlog has grown by more
/// than this many messages above its lowest point since consumers came: its
/// consumers are not keeping up, and publishers into it are paused (their
/// sockets are not read) until it drains back by half of this. At 100k msg/s
/// this is about 10 ms of backlog, and half of it still covers a publisher's
/// pause and resume many times over; for a slow consumer it is a buffer for
/// bursts. Measured with PerfTest (1 KB, confirms 100, prefetch 100): 4096
/// gave p50/p99 latency of 25/61 ms, 1024 gave 9/18 ms at the same
/// throughput.
///
/// Growth is measured from the low point, not from zero, so a deep queue
/// that consumers are draining faster than it fills never pauses its
/// publishers. Queues without consumers never pause publishers for flow:
/// they are buffers, paged to disk, bounded by the disk alarm.
pub const FLOW_BACKLOG_MESSAGES: usize = 1024;

/// The same bound in body bytes, for large messages.
pub const FLOW_BACKLOG_BYTES: u64 = 16 * 1024 * 1024;

/// A queue without consumers, or any queue while the node's read-ahead
/// budget is spent, keeps this fraction of its read-ahead window in memory
/// (256 messages or 1 MiB by default) and pages the rest.
pub const CONSUMERLESS_WINDOW_DIVISOR: usize = 8;

/// The read-ahead window a queue may hold in memory now, in messages and
/// body bytes. A queue nobody consumes from keeps only a sliver: hundreds of
/// such queues filling at once would otherwise hold hundreds of windows (the
/// pager fills the whole window once consumers come). Every queue keeps only
/// the sliver while all queues together hold the node's read-ahead budget.
fn resident_window(storage: &QueueStorage, has_consumers: bool) -> (usize, u64) {
    let settings = &storage.settings;
    let node_over = storage.resident.bytes() > settings.resident_total_max;
    let divisor = if has_consumers && !node_over {
        1
    } else {
        CONSUMERLESS_WINDOW_DIVISOR
    };
    (
        settings.resident_messages_max / divisor,
        settings.resident_bytes_max / divisor as u64,
    )
}

/// A priority queue (`x-max-priority`) keeps every ready message in memory:
/// it does not page, because a message paged in arrival order could be
/// due before resident ones of lower priority. Its depth is bounded here
/// instead: past this many ready messages, or
/// [`PRIORITY_QUEUE_READY_BYTES_MAX`] of bodies, it counts as congested,
/// consumers or not, so publishers into it are paused (their sockets not
/// read) until it drains back by half. At about 100 bytes of bookkeeping
/// per message plus its body, that is some 300 MiB of memory at most.
pub const PRIORITY_QUEUE_READY_MESSAGES_MAX: usize = 256 * 1024;

/// The same bound in body bytes.
pub const PRIORITY_QUEUE_READY_BYTES_MAX: u64 = 256 * 1024 * 1024;

pub struct Queue {
    pub name: Arc<str>,
    pub vhost: Arc<str>,
    pub options: QueueOptions,
    pub limits: QueueLimits,
    /// The journal directory of a durable queue.
    pub store_id: Option<String>,
    /// Where the queue pages and journals messages; None keeps everything
    /// in memory (a node without a data directory).
    pub storage: Option<Arc<QueueStorage>>,
    state: Mutex<QueueState>,
    deleted: AtomicBool,
    /// Set while the backlog is over the flow bound and consumers exist.
    congested: AtomicBool,
    /// Woken when the queue stops being congested.
    uncongested: tokio::sync::Notify,
    /// `x-message-ttl` and `x-expires`, from the effective arguments.
    pub expiry: QueueExpiry,
    /// `x-dead-letter-exchange` and `x-dead-letter-routing-key`.
    pub dead_letter: Option<DeadLetterTarget>,
    /// The vhost, for dead-lettering and for deleting the queue when it
    /// expires; weak, as the vhost holds its queues.
    pub virtual_host: Weak<VirtualHost>,
    /// `x-single-active-consumer`: only `consumers[0]` receives messages.
    /// A queue argument only, never a policy key, as in RabbitMQ 3.10.
    pub single_active_consumer: bool,
}

#[derive(Default)]
struct QueueState {
    /// The head of the ready messages, in memory, in delivery order:
    /// priority first in a priority queue, then offset.
    ready: ReadyMessages,
    /// The rest of them, bodies on disk, all after those in `ready`.
    paged: VecDeque<PagedMessage>,
    /// Body bytes of every ready message, paged or not.
    ready_bytes: u64,
    /// Body bytes of the ready messages in memory.
    resident_bytes: ResidentBytes,
    next_offset: u64,
    /// Delivered to consumers or fetched with basic.get, not yet settled.
    unacked: u64,
    /// Sorted by priority, highest first; registration order within one.
    /// In a single-active-consumer queue, the active consumer first and
    /// the waiting ones after it in registration order, priorities aside.
    consumers: Vec<Arc<Consumer>>,
    /// Rotates deliveries among consumers of equal priority.
    round_robin: usize,
    /// Auto-delete queues go when their last consumer goes, but only once
    /// they have had one (RabbitMQ semantics).
    had_consumer: bool,
    /// Durable queues journal their persistent messages; any queue pages
    /// into one (a non-durable queue's is created when it first pages).
    journal: Option<QueueJournal>,
    /// The pager has this queue in its work list.
    pager_requested: bool,
    /// The sync thread tells this queue when its journal's buffer is written.
    written_signal_set: bool,
    /// Waiting for the node's write budget to drain (see
    /// `request_budget_signal`).
    budget_signal_requested: bool,
    /// The backlog's lowest point (messages, bytes) since consumers came:
    /// flow control measures growth from here.
    flow_floor: (u64, u64),
    /// Deadlines of the paged messages, one for each entry of `paged`, or
    /// empty while no paged message has one. Kept beside `paged` rather
    /// than in [`PagedMessage`], so a queue without TTL pays nothing for
    /// them, and the head's deadline is known without reading its body.
    paged_deadlines: VecDeque<u64>,
    /// Some ready message may have a deadline: the head is checked before
    /// it is delivered. Always set in a queue with a message TTL; in any
    /// other, from the first message with an expiration until it empties.
    deadlines: bool,
    /// The message being published: its TTL starts once it was offered to
    /// the consumers waiting, so a TTL of 0 still reaches one that waits.
    publishing: Option<u64>,
    /// The queue timer's earliest pending wake-up for this queue; 0 when
    /// none is pending.
    timer_at_us: u64,
    /// For `x-expires`: when the queue was last used (created, redeclared,
    /// read with basic.get, or left by its last consumer).
    used_at_us: u64,
    /// Messages to dead-letter once the lock is released.
    dead_letters: Vec<DeadLetter>,
}

impl QueueState {
    fn ready_count(&self) -> usize {
        self.ready.len() + self.paged.len()
    }

    /// Moves the flow floor down to the backlog when the queue drained
    /// below it.
    fn lower_flow_floor(&mut self) {
        let backlog = self.ready_count() as u64;
        self.flow_floor = (
            self.flow_floor.0.min(backlog),
            self.flow_floor.1.min(self.ready_bytes),
        );
    }

    /// Appends a paged reference, with its deadline when it has one.
    fn push_paged(&mut self, paged: PagedMessage, expires_at_us: u64) {
        self.paged.push_back(paged);
        if expires_at_us != NEVER || !self.paged_deadlines.is_empty() {
            // The messages paged before this one had no deadline.
            let missing = self.paged.len() - 1 - self.paged_deadlines.len();
            self.paged_deadlines
                .extend(std::iter::repeat_n(NEVER, missing));
            self.paged_deadlines.push_back(expires_at_us);
        }
    }

    /// Takes the oldest paged reference and its deadline.
    fn pop_paged(&mut self) -> Option<(PagedMessage, u64)> {
        let paged = self.paged.pop_front()?;
        let expires_at_us = self.paged_deadlines.pop_front().unwrap_or(NEVER);
        Some((paged, expires_at_us))
    }

    /// The deadline of the oldest paged message.
    fn paged_head_deadline(&self) -> u64 {
        self.paged_deadlines.front().copied().unwrap_or(NEVER)
    }

    /// The deadline of the head of the queue.
    fn head_deadline(&self) -> u64 {
        match self.ready.front() {
            Some(head) => head.expires_at_us,
            None => self.paged_head_deadline(),
        }
    }

    fn take_resident(&mut self) -> Option<QueuedMessage> {
        let entry = self.ready.pop_front()?;
        let body_size = entry.message.body_size() as u64;
        self.ready_bytes -= body_size;
        self.resident_bytes.remove(body_size);
        Some(entry)
    }

    /// Paged messages that left the queue for good.
    fn forget_paged<'a>(&mut self, messages: impl IntoIterator<Item = &'a PagedMessage>) {
        if let Some(journal) = self.journal.as_mut() {
            journal.append_acks(
                messages
                    .into_iter()
                    .map(|paged| (paged.offset, paged.segment())),
            );
        }
    }

    /// Messages that left the queue for good are acked in the journal.
    /// The iterator is always consumed, journal or not.
    fn forget<'a>(&mut self, messages: impl IntoIterator<Item = &'a QueuedMessage>) {
        let Some(journal) = self.journal.as_mut() else {
            messages.into_iter().for_each(drop);
            return;
        };
        journal.append_acks(
            messages
                .into_iter()
                .filter_map(|entry| entry.segment.map(|segment| (entry.offset, segment))),
        );
    }
}

/// The outcome of removing a consumer.
pub struct ConsumerRemoved {
    pub consumer: Arc<Consumer>,
    /// True when this was the last consumer of an auto-delete queue: the
    /// caller deletes the queue.
    pub queue_now_unused: bool,
    /// A single-active-consumer queue lost its active consumer and another
    /// took over: the caller dispatches once the removed consumer's unacked
    /// messages, if they are to be requeued, are back, so that the new
    /// active consumer receives them first and in order.
    pub active_consumer_changed: bool,
}

impl Queue {
    pub fn new(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        limits: QueueLimits,
    ) -> Self {
        let max_priority = options
            .arguments
            .inner()
            .get("x-max-priority")
            .and_then(as_strict_integer)
            .map(|max| max.clamp(0, MAX_PRIORITY_MAX) as u8);
        let single_active_consumer = matches!(
            options
                .arguments
                .inner()
                .get(SINGLE_ACTIVE_CONSUMER_ARGUMENT),
            Some(AMQPValue::Boolean(true))
        );
        Queue {
            name,
            vhost,
            options,
            limits,
            store_id: None,
            storage: None,
            state: Mutex::new(QueueState {
                ready: ReadyMessages::new(max_priority),
                ..QueueState::default()
            }),
            deleted: AtomicBool::new(false),
            congested: AtomicBool::new(false),
            uncongested: tokio::sync::Notify::new(),
            expiry: QueueExpiry::default(),
            dead_letter: None,
            virtual_host: Weak::new(),
            single_active_consumer,
        }
    }

    /// Starts what the queue does with time, once it is shared: the
    /// `x-expires` countdown, and the TTL of recovered messages. Those
    /// journaled with their deadline keep it, so one that passed while the
    /// node was down is due now; those journaled without one (the queue got
    /// its TTL later) count the queue's TTL from recovery: late, never early.
    pub fn start_timers(self: &Arc<Self>) {
        let mut state = self.lock();
        let now = now_us();
        state.used_at_us = now;
        if let Some(ttl) = self.expiry.message_ttl_us {
            state.deadlines = true;
            if !state.paged.is_empty() {
                let fallback = now.saturating_add(ttl).min(NEVER - 1);
                if state.paged_deadlines.is_empty() {
                    let count = state.paged.len();
                    state.paged_deadlines = std::iter::repeat_n(fallback, count).collect();
                } else {
                    for deadline in state.paged_deadlines.iter_mut() {
                        if *deadline == NEVER {
                            *deadline = fallback;
                        }
                    }
                }
            }
        }
        if !state.paged_deadlines.is_empty() {
            state.deadlines = true;
            let head_deadline = state.head_deadline();
            self.schedule_timer(&mut state, head_deadline);
        }
        if let Some(expires) = self.expiry.expires_us {
            self.schedule_timer(&mut state, now.saturating_add(expires));
        }
    }

    /// Asks the queue timer to call [`Queue::run_timer`] at `at_us`, unless
    /// an earlier call is pending already: a later one would find the head
    /// changed anyway, and reschedules then.
    fn schedule_timer(self: &Arc<Self>, state: &mut QueueState, at_us: u64) {
        if at_us == NEVER || self.is_deleted() {
            return;
        }
        if state.timer_at_us != 0 && state.timer_at_us <= at_us {
            return;
        }
        state.timer_at_us = at_us;
        QueueTimer::schedule(Arc::downgrade(self), at_us);
    }

    /// The queue timer's call: expires what is due at the head and deletes
    /// the queue when it has gone unused for its `x-expires`.
    pub(crate) fn run_timer(self: &Arc<Self>, at_us: u64) {
        let mut state = self.lock();
        if state.timer_at_us != 0 && state.timer_at_us <= at_us {
            state.timer_at_us = 0;
        }
        if self.is_deleted() {
            return;
        }
        if state.deadlines {
            self.dispatch_locked(&mut state);
            self.update_congestion(&mut state);
        }
        let mut expired = false;
        if let Some(expires) = self.expiry.expires_us {
            if state.consumers.is_empty() {
                let due = state.used_at_us.saturating_add(expires);
                if due <= now_us() {
                    expired = true;
                } else {
                    self.schedule_timer(&mut state, due);
                }
            }
        }
        self.unlock(state);
        if expired {
            if let Some(vhost) = self.virtual_host.upgrade() {
                vhost.expire_queue(self);
            }
        }
    }

    /// Whether the queue went unused for its `x-expires`: no consumers,
    /// and no basic.get or redeclaration for that long.
    pub fn is_unused_for_expiry(&self) -> bool {
        let Some(expires) = self.expiry.expires_us else {
            return false;
        };
        let state = self.lock();
        state.consumers.is_empty() && state.used_at_us.saturating_add(expires) <= now_us()
    }

    /// The queue was used (redeclared, or read with basic.get): its
    /// `x-expires` countdown starts again.
    pub fn touch(&self) {
        if self.expiry.expires_us.is_some() {
            self.lock().used_at_us = now_us();
        }
    }

    /// Releases the lock, then dead-letters what was collected under it:
    /// publishing into another queue (or this one) must not happen with
    /// this queue's lock held.
    fn unlock(self: &Arc<Self>, mut state: MutexGuard<'_, QueueState>) {
        if state.dead_letters.is_empty() {
            return;
        }
        let dead_letters = std::mem::take(&mut state.dead_letters);
        drop(state);
        self.send_dead_letters(dead_letters);
    }

    fn send_dead_letters(&self, dead_letters: Vec<DeadLetter>) {
        let (Some(target), Some(vhost)) = (self.dead_letter.as_ref(), self.virtual_host.upgrade())
        else {
            return;
        };
        vhost.dead_letter(&self.name, target, dead_letters);
    }

    /// Removes the expired messages at the head, and only there: a message
    /// deeper in the queue waits until it reaches the head, as in
    /// RabbitMQ, so this never scans the queue. Bounded by the queue's
    /// length, as RabbitMQ's `drop_expired_msgs`. A paged head is dropped
    /// without reading it, unless it is to be dead-lettered.
    fn expire_head(&self, state: &mut QueueState) {
        let now = now_us();
        loop {
            if let Some(head) = state.ready.front() {
                if head.expires_at_us > now || state.publishing == Some(head.offset) {
                    break;
                }
                let Some(entry) = state.take_resident() else {
                    break;
                };
                state.forget([&entry]);
                if self.dead_letter.is_some() {
                    state.dead_letters.push(DeadLetter {
                        message: entry.message,
                        reason: DeathReason::Expired,
                    });
                }
            } else if state.paged_head_deadline() <= now {
                if !self.discard_paged_head(state, DeathReason::Expired) {
                    break;
                }
            } else {
                break;
            }
        }
        if state.ready_count() == 0 && !self.expiry.has_message_ttl() {
            state.deadlines = false;
        }
    }

    /// Gives the queue the node's storage: paging, and its share of the
    /// node's read-ahead budget.
    pub fn attach_storage(&mut self, storage: Option<Arc<QueueStorage>>) {
        if let Some(storage) = &storage {
            let state = self
                .state
                .get_mut()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            state
                .resident_bytes
                .count_into(Arc::clone(&storage.resident));
        }
        self.storage = storage;
    }

    /// Whether publishers into this queue should pause: it has consumers
    /// and they are not keeping up.
    pub fn is_congested(&self) -> bool {
        self.congested.load(Ordering::Acquire)
    }

    /// Resolves when the queue stops being congested; create it before
    /// checking [`Queue::is_congested`] so no wake-up is missed.
    pub fn uncongested(&self) -> tokio::sync::futures::Notified<'_> {
        self.uncongested.notified()
    }

    /// Whether a consumer of this queue reads through `connection_id`: that
    /// connection must never be paused for this queue, or it would stop
    /// reading the acks that drain it.
    pub fn has_consumer_on(&self, connection_id: ConnectionId) -> bool {
        self.lock()
            .consumers
            .iter()
            .any(|consumer| consumer.connection_id == connection_id)
    }

    /// Re-evaluates congestion after the backlog, the consumers or the
    /// journal's unwritten bytes changed. A queue is congested while its
    /// backlog grows faster than consumers drain it, or while the disk is
    /// behind with its journal.
    fn update_congestion(self: &Arc<Self>, state: &mut QueueState) {
        let backlog = (state.ready_count() as u64, state.ready_bytes);
        if state.consumers.is_empty() {
            state.flow_floor = backlog;
        } else {
            state.lower_flow_floor();
        }
        let floor = state.flow_floor;
        let unwritten = state
            .journal
            .as_ref()
            .map_or(0, |journal| journal.unwritten_bytes());
        let unwritten_max = self
            .storage
            .as_ref()
            .map_or(u64::MAX, |storage| storage.settings.unwritten_bytes_max);
        let group = self.storage.as_ref().map(|storage| &storage.group);
        let priority = state.ready.is_priority();
        if !self.is_congested() {
            let flow_over = !state.consumers.is_empty()
                && (backlog.0 > floor.0 + FLOW_BACKLOG_MESSAGES as u64
                    || backlog.1 > floor.1 + FLOW_BACKLOG_BYTES);
            // The node's journals together hold too much unwritten: every
            // queue adding to it pauses, not just the largest.
            let budget_over =
                unwritten > 0 && group.is_some_and(|group| group.is_over_write_budget());
            let store_over = unwritten > unwritten_max || budget_over;
            let memory_over = priority
                && (backlog.0 > PRIORITY_QUEUE_READY_MESSAGES_MAX as u64
                    || backlog.1 > PRIORITY_QUEUE_READY_BYTES_MAX);
            if (flow_over || store_over || memory_over) && !self.is_deleted() {
                self.congested.store(true, Ordering::Release);
                if unwritten > unwritten_max {
                    self.request_written_signal(state);
                }
                if budget_over {
                    self.request_budget_signal(state);
                }
            }
        } else {
            let flow_drained = state.consumers.is_empty()
                || (backlog.0 <= floor.0 + FLOW_BACKLOG_MESSAGES as u64 / 2
                    && backlog.1 <= floor.1 + FLOW_BACKLOG_BYTES / 2);
            let budget_drained = group.is_none_or(|group| group.is_write_budget_drained());
            let store_drained = unwritten <= unwritten_max / 2 && budget_drained;
            let memory_drained = !priority
                || (backlog.0 <= PRIORITY_QUEUE_READY_MESSAGES_MAX as u64 / 2
                    && backlog.1 <= PRIORITY_QUEUE_READY_BYTES_MAX / 2);
            if (flow_drained && store_drained && memory_drained) || self.is_deleted() {
                self.congested.store(false, Ordering::Release);
                self.uncongested.notify_waiters();
            } else {
                if unwritten > unwritten_max / 2 {
                    self.request_written_signal(state);
                }
                if !budget_drained {
                    self.request_budget_signal(state);
                }
            }
        }
    }

    /// Asks the sync thread to re-evaluate this queue's congestion once the
    /// node's unwritten total is back under half the write budget.
    fn request_budget_signal(self: &Arc<Self>, state: &mut QueueState) {
        let Some(storage) = self.storage.as_ref() else {
            return;
        };
        if state.budget_signal_requested {
            return;
        }
        state.budget_signal_requested = true;
        let queue = Arc::downgrade(self);
        storage.group.when_write_budget_drained(Box::new(move || {
            if let Some(queue) = queue.upgrade() {
                let mut state = queue.lock();
                state.budget_signal_requested = false;
                queue.update_congestion(&mut state);
            }
        }));
    }

    /// Asks the sync thread to tell this queue when it wrote the journal's
    /// buffer, so that publishers paused for the disk resume.
    fn request_written_signal(self: &Arc<Self>, state: &mut QueueState) {
        let Some(journal) = state.journal.as_ref() else {
            return;
        };
        if !state.written_signal_set {
            let queue = Arc::downgrade(self);
            journal.log().set_written_signal(Box::new(move || {
                if let Some(queue) = queue.upgrade() {
                    let mut state = queue.lock();
                    queue.update_congestion(&mut state);
                }
            }));
            state.written_signal_set = true;
        }
        journal.log().request_written_signal();
    }

    /// A durable queue: with a journal, and the messages recovered from it,
    /// paged until consumers need them.
    pub fn with_journal(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        limits: QueueLimits,
        recovered: RecoveredQueue,
    ) -> Self {
        let queue = Queue::new(name, vhost, options, limits);
        {
            let mut state = queue.lock();
            state.ready_bytes = recovered
                .messages
                .iter()
                .map(|paged| paged.body_size as u64)
                .sum();
            if !recovered.deadlines.is_empty() {
                let mut deadlines = recovered.deadlines.iter().peekable();
                state.paged_deadlines = recovered
                    .messages
                    .iter()
                    .map(|paged| {
                        deadlines
                            .next_if(|(offset, _)| *offset == paged.offset)
                            .map_or(NEVER, |(_, wall_ms)| deadline_of_wall_ms(*wall_ms))
                    })
                    .collect();
            }
            state.paged = recovered.messages.into();
            state.next_offset = recovered.next_offset;
            state.journal = Some(recovered.journal);
        }
        queue
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A panic while holding the lock leaves counts possibly off by one,
        // never memory unsafe; keep serving rather than poison every user.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    pub fn is_exclusive(&self) -> bool {
        self.options.exclusive_owner.is_some()
    }

    /// Exclusive queues are usable only by the connection that declared them.
    pub fn check_access(&self, connection_id: ConnectionId) -> AmqpResult<()> {
        match self.options.exclusive_owner {
            Some(owner) if owner != connection_id => Err(AmqpError::resource_locked(format!(
                "cannot obtain exclusive access to locked queue '{}' in vhost '{}'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.",
                self.name, self.vhost
            ))),
            _ => Ok(()),
        }
    }

    /// Appends a message and delivers what consumers can take.
    pub fn publish(self: &Arc<Self>, message: Arc<Message>) -> PublishOutcome {
        let mut state = self.lock();
        if self.is_deleted() {
            // Routed to a queue being deleted: lost with it, as in RabbitMQ.
            return PublishOutcome::Enqueued(None);
        }
        let body_size = message.body_size() as u64;
        if self.limits.is_limited() && self.limits.overflow != Overflow::DropHead {
            let length_after = state.ready_count() as u64 + 1;
            let bytes_after = state.ready_bytes + body_size;
            if self.limits.exceeded(length_after, bytes_after) {
                if self.limits.overflow == Overflow::RejectPublishDlx && self.dead_letter.is_some()
                {
                    drop(state);
                    self.send_dead_letters(vec![DeadLetter {
                        message,
                        reason: DeathReason::Maxlen,
                    }]);
                }
                return PublishOutcome::Rejected;
            }
        }
        let offset = state.next_offset;
        state.next_offset += 1;
        // One branch for a queue without TTL and a message without
        // expiration; the clock is read only past it.
        let expires_at_us =
            if self.expiry.has_message_ttl() || message.properties.expiration().is_some() {
                let deadline = self.expiry.deadline_of(&message, now_us());
                if deadline != NEVER {
                    state.deadlines = true;
                    state.publishing = Some(offset);
                }
                deadline
            } else {
                NEVER
            };
        let mut durability = None;
        let mut written_at = None;
        if message.properties.is_persistent() {
            if let Some(journal) = state
                .journal
                .as_mut()
                .filter(|journal| journal.is_durable())
            {
                // Saved as wall-clock time: the TTL keeps counting while
                // the node is down.
                let wall_deadline_ms = (expires_at_us != NEVER).then(|| wall_ms_of(expires_at_us));
                match journal.append_message(offset, &message, wall_deadline_ms) {
                    Some((location, ticket)) => {
                        written_at = Some(location);
                        durability = Some(ticket);
                    }
                    // The journal failed: the message cannot be made durable.
                    None => {
                        state.publishing = None;
                        return PublishOutcome::Rejected;
                    }
                }
            }
        }
        state.ready_bytes += body_size;
        let paged = self
            .page_out_location(&mut state, offset, &message, written_at)
            .map(|location| PagedMessage::new(offset, location, message.body_size(), false));
        match paged {
            Some(paged) => {
                state.push_paged(paged, expires_at_us);
                // A message bigger than the window pages even into an empty
                // queue: an idle consumer would otherwise never be offered
                // it, nor anything published behind it.
                self.read_ahead_if_low(&mut state);
            }
            None => {
                state.resident_bytes.add(body_size);
                state.ready.push_back(QueuedMessage {
                    offset,
                    message,
                    redelivered: false,
                    segment: written_at.map(|location| location.segment),
                    expires_at_us,
                });
                self.dispatch_locked(&mut state);
            }
        }
        if self.limits.is_limited() && self.limits.overflow == Overflow::DropHead {
            self.drop_head_over_limits(&mut state);
        }
        // Offered to the waiting consumers: from here its TTL applies. Left
        // set, it would keep this message from ever expiring once requeued.
        state.publishing = None;
        if state.deadlines {
            self.expire_head(&mut state);
            let head_deadline = state.head_deadline();
            self.schedule_timer(&mut state, head_deadline);
        }
        self.update_congestion(&mut state);
        self.unlock(state);
        PublishOutcome::Enqueued(durability)
    }

    /// Where a new message waits on disk when the in-memory window is full
    /// (or earlier messages are already paged: order is kept); None keeps
    /// it in memory. A persistent message of a durable queue is on disk
    /// already; others are written to the journal for the purpose.
    fn page_out_location(
        &self,
        state: &mut QueueState,
        offset: u64,
        message: &Message,
        written_at: Option<Location>,
    ) -> Option<Location> {
        let storage = self.storage.as_ref()?;
        if state.ready.is_priority() {
            // Priority queues do not page: see PRIORITY_QUEUE_READY_MESSAGES_MAX.
            return None;
        }
        let (window_messages, window_bytes) = resident_window(storage, !state.consumers.is_empty());
        let window_full = state.ready.len() >= window_messages
            || state.resident_bytes.get() + message.body_size() as u64 > window_bytes;
        if state.paged.is_empty() && !window_full {
            return None;
        }
        if written_at.is_some() {
            return written_at;
        }
        if state.journal.is_none() {
            let dir = storage
                .paging_dir
                .join(format!("{:016x}", rand::random::<u64>()));
            match QueueJournal::create_paging(&dir, Arc::clone(&storage.group), &storage.settings) {
                Ok(journal) => state.journal = Some(journal),
                Err(error) => {
                    tracing::warn!(queue = %self.name, %error, "cannot page messages out; keeping them in memory");
                    return None;
                }
            }
        }
        state.journal.as_mut()?.append_paged(offset, message)
    }

    /// Drops the oldest ready messages until the queue is within its
    /// limits, dead-lettering them (reason `maxlen`) when the queue has a
    /// dead-letter exchange.
    fn drop_head_over_limits(&self, state: &mut QueueState) {
        while self
            .limits
            .exceeded(state.ready_count() as u64, state.ready_bytes)
        {
            if let Some(dropped) = state.take_resident() {
                state.forget([&dropped]);
                if self.dead_letter.is_some() {
                    state.dead_letters.push(DeadLetter {
                        message: dropped.message,
                        reason: DeathReason::Maxlen,
                    });
                }
            } else if !self.discard_paged_head(state, DeathReason::Maxlen) {
                break;
            }
        }
    }

    /// Delivers ready messages to consumers with room. Sinks call this after
    /// refusing a delivery, once they have room again.
    pub fn dispatch(self: &Arc<Self>) {
        let mut state = self.lock();
        self.dispatch_locked(&mut state);
        self.unlock(state);
    }

    fn dispatch_locked(self: &Arc<Self>, state: &mut QueueState) {
        self.deliver_ready(state);
        if !state.paged.is_empty() {
            self.read_ahead_if_low(state);
        }
        state.lower_flow_floor();
        if self.is_congested() {
            self.update_congestion(state);
        }
    }

    /// Asks the pager to read paged messages back once the in-memory window
    /// is half empty and consumers wait for them.
    ///
    /// The window is the one [`Self::page_in`] fills (smaller while the
    /// node is over its read-ahead budget), and the head must be one it
    /// would read: asking for a read it refuses would keep the pager
    /// thread spinning on this queue.
    fn read_ahead_if_low(self: &Arc<Self>, state: &mut QueueState) {
        let Some(storage) = self.storage.as_ref() else {
            return;
        };
        if state.consumers.is_empty() {
            return;
        }
        let (window, bytes_max) = resident_window(storage, true);
        let resident = state.resident_bytes.get();
        let low = state.ready.len() < window / 2 && resident < bytes_max / 2;
        let head_fits = state
            .paged
            .front()
            .is_some_and(|head| resident == 0 || resident + head.body_size as u64 <= bytes_max);
        if low && head_fits {
            self.request_pager(state);
        }
    }

    fn request_pager(self: &Arc<Self>, state: &mut QueueState) {
        if state.pager_requested || self.is_deleted() {
            return;
        }
        if let Some(storage) = self.storage.as_ref() {
            state.pager_requested = true;
            storage.pager.request(Arc::clone(self));
        }
    }

    /// Delivers from the head while consumers take messages. Expired heads
    /// go first, so no consumer receives a message past its deadline; a
    /// queue without deadlines pays one branch per message for that.
    fn deliver_ready(self: &Arc<Self>, state: &mut QueueState) {
        if state.ready.is_priority() && !state.paged.is_empty() {
            // Recovered messages of a priority queue wait on disk in offset
            // order: deliver once all are read back, in priority order.
            // Meanwhile they still expire: the oldest is the head of its
            // priority level, and anything published since is resident.
            if state.deadlines {
                let now = now_us();
                while state.paged_head_deadline() <= now
                    && self.discard_paged_head(state, DeathReason::Expired)
                {}
            }
            if !state.paged.is_empty() {
                if !state.consumers.is_empty() {
                    self.request_pager(state);
                }
                if state.deadlines {
                    let paged_head_deadline = state.paged_head_deadline();
                    self.schedule_timer(state, paged_head_deadline);
                }
                return;
            }
        }
        let deadlines = state.deadlines;
        loop {
            if deadlines {
                self.expire_head(state);
            }
            if state.ready.is_empty() || state.consumers.is_empty() || !self.deliver_one(state) {
                break;
            }
        }
        if deadlines {
            let head_deadline = state.head_deadline();
            self.schedule_timer(state, head_deadline);
        }
    }

    /// Offers the head message to the highest-priority consumers first,
    /// round-robin within a priority. Returns false when nobody could take it.
    /// A single-active-consumer queue offers it to its active consumer only.
    fn deliver_one(self: &Arc<Self>, state: &mut QueueState) -> bool {
        let consumer_count = if self.single_active_consumer {
            state.consumers.len().min(1)
        } else {
            state.consumers.len()
        };
        let mut group_start = 0;
        while group_start < consumer_count {
            let priority = state.consumers[group_start].priority;
            let group_len = state.consumers[group_start..consumer_count]
                .iter()
                .take_while(|consumer| consumer.priority == priority)
                .count();
            for step in 0..group_len {
                let index = group_start + (state.round_robin + step) % group_len;
                if !state.consumers[index].has_prefetch_room() {
                    continue;
                }
                // The sink refuses (and hands the message back) when the
                // channel's prefetch, flow or output buffer has no room: one
                // lock of the channel and its outbox per delivery, no
                // separate check beforehand.
                let Some(entry) = state.ready.pop_front() else {
                    return false;
                };
                let body_size = entry.message.body_size() as u64;
                let persisted = entry.segment.map(|segment| (entry.offset, segment));
                let consumer = &state.consumers[index];
                let no_ack = consumer.no_ack;
                match consumer.sink.deliver(consumer, self, entry) {
                    Ok(()) => {
                        state.ready_bytes -= body_size;
                        state.resident_bytes.remove(body_size);
                        if !no_ack {
                            state.unacked += 1;
                        } else if let (Some(persisted), Some(journal)) =
                            (persisted, state.journal.as_mut())
                        {
                            // Sent without ack: settled as it leaves.
                            journal.append_acks([persisted]);
                        }
                        state.round_robin = state.round_robin.wrapping_add(step + 1);
                        return true;
                    }
                    Err(entry) => state.ready.push_front(entry),
                }
            }
            group_start += group_len;
        }
        false
    }

    /// basic.get: the head message and the count left behind it. A paged
    /// head is read from disk here, under the lock: basic.get answers now,
    /// and it is not the path that throughput depends on.
    pub fn get(self: &Arc<Self>, no_ack: bool) -> Option<(QueuedMessage, u32)> {
        let mut state = self.lock();
        if self.expiry.expires_us.is_some() {
            state.used_at_us = now_us();
        }
        if state.ready.is_priority() && !state.paged.is_empty() {
            self.read_back_recovered(&mut state);
        }
        if state.deadlines {
            self.expire_head(&mut state);
        }
        let entry = loop {
            if let Some(entry) = state.take_resident() {
                break Some(entry);
            }
            let Some((paged, expires_at_us)) = state.pop_paged() else {
                break None;
            };
            state.ready_bytes -= paged.body_size as u64;
            match self.read_paged(&state, &paged) {
                Some(message) => {
                    break Some(QueuedMessage::read_back(paged, message, expires_at_us))
                }
                None => state.forget_paged([&paged]),
            }
        };
        let Some(entry) = entry else {
            self.unlock(state);
            return None;
        };
        if !no_ack {
            state.unacked += 1;
        } else {
            state.forget([&entry]);
        }
        let remaining = state.ready_count() as u32;
        state.lower_flow_floor();
        if self.is_congested() {
            self.update_congestion(&mut state);
        }
        if state.deadlines {
            let head_deadline = state.head_deadline();
            self.schedule_timer(&mut state, head_deadline);
        }
        self.unlock(state);
        Some((entry, remaining))
    }

    /// Removes the paged head for good (expired, or over a length limit),
    /// dead-lettering it when the queue has a dead-letter exchange, which
    /// reads its body back. False when nothing is paged.
    fn discard_paged_head(&self, state: &mut QueueState, reason: DeathReason) -> bool {
        let Some((paged, _)) = state.pop_paged() else {
            return false;
        };
        state.ready_bytes -= paged.body_size as u64;
        if self.dead_letter.is_some() {
            if let Some(message) = self.read_paged(state, &paged) {
                state.dead_letters.push(DeadLetter {
                    message: Arc::new(message),
                    reason,
                });
            }
        }
        state.forget_paged([&paged]);
        true
    }

    /// Reads every paged message of a priority queue back into its level,
    /// under the lock: basic.get on a recovered priority queue answers with
    /// the highest priority, not the oldest message. A priority queue pages
    /// nothing itself, so these are messages recovered from its journal,
    /// which the pager would read back for consumers anyway.
    fn read_back_recovered(&self, state: &mut QueueState) {
        while let Some((paged, expires_at_us)) = state.pop_paged() {
            match self.read_paged(state, &paged) {
                Some(message) => {
                    state.resident_bytes.add(paged.body_size as u64);
                    state.ready.push_read_back(QueuedMessage::read_back(
                        paged,
                        message,
                        expires_at_us,
                    ));
                }
                None => {
                    state.ready_bytes -= paged.body_size as u64;
                    state.forget_paged([&paged]);
                }
            }
        }
    }

    /// Reads a paged message back; None (logged) when the disk fails it.
    fn read_paged(&self, state: &QueueState, paged: &PagedMessage) -> Option<Message> {
        let journal = state.journal.as_ref()?;
        let location = journal.resolve(paged.offset, paged.location());
        match read_message(journal.log(), location) {
            Ok(message) => Some(message),
            Err(error) => {
                tracing::error!(queue = %self.name, offset = paged.offset, %error, "a paged message cannot be read back; it is dropped");
                None
            }
        }
    }

    /// The pager's work for this queue: read paged messages back into the
    /// window while consumers wait for them, then compact the journal if a
    /// run of old segments is pinned by a few live messages.
    pub(crate) fn run_pager_work(self: &Arc<Self>) {
        self.page_in();
        self.compact();
        let mut state = self.lock();
        state.pager_requested = false;
        // Anything that came up while the pager worked is picked up here,
        // under the same lock that requests it.
        if !state.paged.is_empty() {
            self.read_ahead_if_low(&mut state);
        }
        let wants_compaction = state
            .journal
            .as_ref()
            .is_some_and(|journal| journal.wants_compaction());
        if wants_compaction && !state.pager_requested {
            self.request_pager(&mut state);
        }
    }

    fn page_in(self: &Arc<Self>) {
        let Some(storage) = self.storage.as_ref() else {
            return;
        };
        let settings = &storage.settings;
        loop {
            // Copy out what to read, under the lock.
            let (batch, log) = {
                let state = self.lock();
                // A priority queue reads all of its paged messages (recovered
                // ones: it never pages) back, window or not.
                let priority = state.ready.is_priority();
                let (window, bytes_max) = if priority {
                    (usize::MAX, u64::MAX)
                } else {
                    resident_window(storage, !state.consumers.is_empty())
                };
                let room = window
                    .saturating_sub(state.ready.len())
                    .min(settings.read_batch_messages());
                let Some(journal) = state.journal.as_ref() else {
                    return;
                };
                if room == 0
                    || state.paged.is_empty()
                    || state.consumers.is_empty()
                    || self.is_deleted()
                    || state.resident_bytes.get() >= bytes_max
                {
                    return;
                }
                let mut bytes = state.resident_bytes.get();
                let batch: Vec<(PagedMessage, Location)> = state
                    .paged
                    .iter()
                    .take(room)
                    .take_while(|paged| {
                        bytes += paged.body_size as u64;
                        bytes <= bytes_max || bytes == paged.body_size as u64
                    })
                    .map(|paged| (*paged, journal.resolve(paged.offset, paged.location())))
                    .collect();
                (batch, Arc::clone(journal.log()))
            };
            if batch.is_empty() {
                return;
            }
            // Read without it: publishers keep appending meanwhile.
            let read: Vec<_> = batch
                .iter()
                .map(|(_, location)| read_message(&log, *location))
                .collect();
            // Hand over what is still wanted: a purge or a basic.get may
            // have taken some of the batch meanwhile.
            let mut state = self.lock();
            for ((paged, _), message) in batch.iter().zip(read) {
                match state.paged.front() {
                    Some(front) if front.offset == paged.offset => {}
                    _ => continue,
                }
                let expires_at_us = state.pop_paged().map_or(NEVER, |(_, deadline)| deadline);
                match message {
                    Ok(message) => {
                        state.resident_bytes.add(paged.body_size as u64);
                        state.ready.push_read_back(QueuedMessage::read_back(
                            *paged,
                            message,
                            expires_at_us,
                        ));
                    }
                    Err(error) => {
                        tracing::error!(queue = %self.name, offset = paged.offset, %error, "a paged message cannot be read back; it is dropped");
                        state.ready_bytes -= paged.body_size as u64;
                        state.forget_paged([paged]);
                    }
                }
            }
            // A queue that was deep gives its reference memory back as it
            // drains.
            if state.paged.capacity() > PAGED_CAPACITY_KEPT
                && state.paged.capacity() > 4 * state.paged.len()
            {
                let keep = (2 * state.paged.len()).max(PAGED_CAPACITY_KEPT);
                state.paged.shrink_to(keep);
            }
            self.deliver_ready(&mut state);
            self.unlock(state);
        }
    }

    /// Moves the live messages out of a run of sparse old segments so the
    /// run can be deleted. Scanning happens off the lock; moving is a copy
    /// into the journal's buffer under it.
    fn compact(self: &Arc<Self>) {
        let (segments, log) = {
            let state = self.lock();
            let Some(journal) = state.journal.as_ref() else {
                return;
            };
            if !journal.wants_compaction() {
                return;
            }
            (journal.compaction_segments(), Arc::clone(journal.log()))
        };
        let mut moved = 0;
        for segment in segments {
            let found = match QueueJournal::scan_messages(&log, segment) {
                Ok(Some(found)) => found,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(queue = %self.name, segment, %error, "cannot scan a segment for compaction");
                    continue;
                }
            };
            let mut state = self.lock();
            let Some(journal) = state.journal.as_mut() else {
                return;
            };
            let live: Vec<_> = found
                .into_iter()
                .filter(|found| journal.is_live(found))
                .map(|found| found.detach())
                .collect();
            moved += journal.relocate(live);
        }
        let waits_for = self
            .lock()
            .journal
            .as_ref()
            .and_then(|journal| journal.reclaim_waits_for());
        if let Some(sequence) = waits_for {
            // The old copies go only once the moved ones are durable.
            let deadline = std::time::Instant::now() + COMPACTION_SYNC_WAIT_MAX;
            while !log.is_synced(sequence) && !log.has_failed() {
                if std::time::Instant::now() > deadline {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        if let Some(journal) = self.lock().journal.as_mut() {
            journal.reclaim(true);
        }
        if moved > 0 {
            tracing::info!(queue = %self.name, moved, "compacted the journal: moved live messages out of old segments");
        }
    }

    /// Consumers acked (or rejected without requeue) these messages. The
    /// ack freed prefetch room, so this also delivers what it can: one lock
    /// for both.
    pub fn settle<'a>(self: &Arc<Self>, messages: impl IntoIterator<Item = &'a QueuedMessage>) {
        self.settle_with(messages, None);
    }

    /// Consumers rejected these messages without requeue (basic.reject,
    /// basic.nack): settled, and dead-lettered with reason `rejected` when
    /// the queue has a dead-letter exchange.
    pub fn reject<'a>(self: &Arc<Self>, messages: impl IntoIterator<Item = &'a QueuedMessage>) {
        self.settle_with(messages, Some(DeathReason::Rejected));
    }

    fn settle_with<'a>(
        self: &Arc<Self>,
        messages: impl IntoIterator<Item = &'a QueuedMessage>,
        dead: Option<DeathReason>,
    ) {
        let mut state = self.lock();
        let mut count = 0;
        match dead.filter(|_| self.dead_letter.is_some()) {
            None => state.forget(messages.into_iter().inspect(|_| count += 1)),
            Some(reason) => {
                let mut dead_letters = std::mem::take(&mut state.dead_letters);
                state.forget(messages.into_iter().inspect(|entry| {
                    count += 1;
                    dead_letters.push(DeadLetter {
                        message: Arc::clone(&entry.message),
                        reason,
                    });
                }));
                state.dead_letters = dead_letters;
            }
        }
        state.unacked = state.unacked.saturating_sub(count);
        self.dispatch_locked(&mut state);
        let wants_compaction = state
            .journal
            .as_ref()
            .is_some_and(|journal| journal.wants_compaction());
        if wants_compaction {
            self.request_pager(&mut state);
        }
        self.unlock(state);
    }

    /// Puts messages back at their original positions, marked redelivered,
    /// and delivers them again.
    pub fn requeue(self: &Arc<Self>, entries: impl IntoIterator<Item = QueuedMessage>) {
        let mut state = self.lock();
        for mut entry in entries {
            state.unacked = state.unacked.saturating_sub(1);
            if self.is_deleted() {
                continue;
            }
            entry.redelivered = true;
            if entry.expires_at_us != NEVER {
                // It keeps the deadline it was published with.
                state.deadlines = true;
            }
            let body_size = entry.message.body_size() as u64;
            state.ready_bytes += body_size;
            state.resident_bytes.add(body_size);
            // Every paged message is newer than a delivered one.
            state.ready.insert_by_offset(entry);
        }
        // Requeued messages count against the limits again, as in
        // RabbitMQ's `requeue_and_run`: the oldest go (dead-lettered where
        // the queue says so) before anything is delivered.
        if self.limits.is_limited() && self.limits.overflow == Overflow::DropHead {
            self.drop_head_over_limits(&mut state);
        }
        self.dispatch_locked(&mut state);
        self.unlock(state);
    }

    /// Registers a consumer. `announce` runs under the queue's lock once the
    /// checks have passed and before the consumer can be given anything:
    /// the caller writes consume-ok there, so no delivery (from a publish,
    /// an ack or a timer on another thread) can overtake it, as the queue
    /// process itself sends consume-ok in RabbitMQ.
    pub fn add_consumer(
        self: &Arc<Self>,
        consumer: Arc<Consumer>,
        announce: impl FnOnce(),
    ) -> AmqpResult<()> {
        let mut state = self.lock();
        if self.is_deleted() {
            return Err(AmqpError::not_found(format!(
                "no queue '{}' in vhost '{}'",
                self.name, self.vhost
            )));
        }
        // RabbitMQ refuses an exclusive consumer on a single-active-consumer
        // queue whether or not it has consumers (`exclusive_consume_unavailable`).
        let exclusive_in_use = consumer.exclusive
            && (self.single_active_consumer || !state.consumers.is_empty())
            || state.consumers.iter().any(|existing| existing.exclusive);
        if exclusive_in_use {
            return Err(AmqpError::access_refused(format!(
                "queue '{}' in vhost '{}' in exclusive use",
                self.name, self.vhost
            )));
        }
        announce();
        if state.consumers.is_empty() {
            // Flow measures the backlog's growth from where it is now.
            state.flow_floor = (state.ready_count() as u64, state.ready_bytes);
        }
        if self.single_active_consumer {
            // The first consumer registered is the active one, whatever the
            // priorities (RabbitMQ 3.10's `basic_consume`); the others wait
            // in registration order.
            state.consumers.push(consumer);
        } else {
            let position = state
                .consumers
                .partition_point(|existing| existing.priority >= consumer.priority);
            state.consumers.insert(position, consumer);
        }
        state.had_consumer = true;
        // No dispatch here: the caller calls it once its own bookkeeping
        // of the consumer is done.
        Ok(())
    }

    pub fn remove_consumer(
        self: &Arc<Self>,
        connection_id: ConnectionId,
        channel_id: u16,
        tag: &str,
    ) -> Option<ConsumerRemoved> {
        let mut state = self.lock();
        let index = state.consumers.iter().position(|consumer| {
            consumer.connection_id == connection_id
                && consumer.channel_id == channel_id
                && &*consumer.tag == tag
        })?;
        let consumer = state.consumers.remove(index);
        let active_consumer_changed =
            self.single_active_consumer && index == 0 && !state.consumers.is_empty();
        if active_consumer_changed {
            Self::promote_next_active(&mut state.consumers);
        }
        self.update_congestion(&mut state);
        if let Some(expires) = self.expiry.expires_us {
            if state.consumers.is_empty() {
                // Unused from now: x-expires counts from the last consumer.
                state.used_at_us = now_us();
                let due = state.used_at_us.saturating_add(expires);
                self.schedule_timer(&mut state, due);
            }
        }
        let queue_now_unused = self.options.auto_delete
            && state.had_consumer
            && state.consumers.is_empty()
            && !self.is_deleted();
        if queue_now_unused {
            // Deleted from here, under the lock that adds consumers: a
            // consumer arriving from another connection before the caller
            // removes the queue finds it gone (404), as in RabbitMQ, whose
            // queue process decides this in one step, instead of joining a
            // queue about to be deleted and never hearing of it.
            self.deleted.store(true, Ordering::Release);
        }
        Some(ConsumerRemoved {
            consumer,
            queue_now_unused,
            active_consumer_changed,
        })
    }

    /// Makes the next consumer of a single-active-consumer queue active:
    /// the one with the highest priority, the earliest registered among
    /// equals, as RabbitMQ 3.10 picks it (`rabbit_queue_consumers:
    /// get_consumer`, the head of its consumer priority queue). Without
    /// priorities that is registration order. The others keep their order.
    fn promote_next_active(consumers: &mut Vec<Arc<Consumer>>) {
        let mut next = 0;
        for (index, consumer) in consumers.iter().enumerate() {
            if consumer.priority > consumers[next].priority {
                next = index;
            }
        }
        if next != 0 {
            let active = consumers.remove(next);
            consumers.insert(0, active);
        }
    }

    /// The tag of the consumer receiving messages in a single-active-consumer
    /// queue; None in other queues and while it has no consumer.
    pub fn active_consumer_tag(&self) -> Option<Arc<str>> {
        if !self.single_active_consumer {
            return None;
        }
        self.lock()
            .consumers
            .first()
            .map(|consumer| Arc::clone(&consumer.tag))
    }

    /// Drops every ready message; messages out with consumers stay out.
    pub fn purge(self: &Arc<Self>) -> u32 {
        let mut state = self.lock();
        let purged = state.ready_count() as u32;
        let ready = state.ready.take_all();
        state.forget(&ready);
        let paged = std::mem::take(&mut state.paged);
        state.forget_paged(&paged);
        state.paged_deadlines.clear();
        state.ready_bytes = 0;
        state.resident_bytes.clear();
        self.update_congestion(&mut state);
        purged
    }

    /// Ready messages, as queue.declare-ok and basic.get-ok count them.
    pub fn message_count(&self) -> u32 {
        self.lock().ready_count() as u32
    }

    /// Ready messages whose bodies are on disk only.
    pub fn paged_count(&self) -> u32 {
        self.lock().paged.len() as u32
    }

    pub fn consumer_count(&self) -> u32 {
        self.lock().consumers.len() as u32
    }

    pub fn unacked_count(&self) -> u64 {
        self.lock().unacked
    }

    pub fn ready_bytes(&self) -> u64 {
        self.lock().ready_bytes
    }

    /// Marks the queue deleted and empties it. Returns the consumers, whom
    /// the caller notifies with basic.cancel, and the number of ready
    /// messages dropped.
    pub fn mark_deleted(self: &Arc<Self>) -> (Vec<Arc<Consumer>>, u32) {
        let (consumers, dropped, journal) = self.clear_for_deletion();
        // Outside the queue's lock: destroying takes the log's locks, which
        // the sync thread may hold while it signals this queue, and removes
        // the journal's directory, which can be slow.
        if let Some(journal) = journal {
            journal.destroy();
        }
        (consumers, dropped)
    }

    fn clear_for_deletion(self: &Arc<Self>) -> (Vec<Arc<Consumer>>, u32, Option<QueueJournal>) {
        let mut state = self.lock();
        self.deleted.store(true, Ordering::Release);
        let dropped = state.ready_count() as u32;
        state.ready.clear();
        state.paged.clear();
        state.paged_deadlines.clear();
        state.dead_letters.clear();
        state.ready_bytes = 0;
        state.resident_bytes.clear();
        let journal = state.journal.take();
        self.update_congestion(&mut state);
        (std::mem::take(&mut state.consumers), dropped, journal)
    }
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Queue")
            .field("name", &self.name)
            .field("vhost", &self.vhost)
            .field("options", &self.options)
            .finish()
    }
}
