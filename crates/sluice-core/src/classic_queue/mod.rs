//! A classic queue: ready messages in offset order (a window of them in
//! memory, the rest paged out to its journal), the consumers it delivers
//! to, and the messages out with them until they are settled.
//!
//! There is no queue task. Whoever changes a queue (a publisher routing to it,
//! an ack freeing prefetch room, a consumer arriving) takes its lock and
//! dispatches inline, so a message goes from the publisher's reader straight
//! into the consumer's output buffer with no task hop in between.
//!
//! - `state`: what the lock guards; `unacked`: messages out with consumers.
//! - `publish`: a message entering; `dispatch`: messages leaving for
//!   consumers and basic.get; `settle`: acks, rejects, requeues, purge and
//!   deletion; `consumers`: registration and single active consumer.
//! - `flow`: congestion; `timers`: TTL and `x-expires`; `read_ahead` and
//!   `compaction`: the pager's work.
//! - `rules`: limits, TTL, expiry and dead-lettering, from the effective
//!   arguments, and a policy change applied to a live queue.

mod compaction;
mod consumers;
mod dispatch;
mod flow;
mod publish;
mod read_ahead;
mod rules;
mod settle;
mod state;
mod timers;
mod unacked;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use amq_protocol::types::AMQPValue;

use crate::arguments::{as_strict_integer, MAX_PRIORITY_MAX};
use crate::counters::MessageCounts;
use crate::dead_letter::{DeadLetter, DeadLetterTarget};
use crate::error::AmqpResult;
use crate::expiry::{deadline_of_wall_ms, QueueExpiry, NEVER};
use crate::message::{Message, QueuedMessage};
use crate::pager::{PagerWork, QueueStorage};
use crate::queue::{
    ConnectionId, Consumer, ConsumerRemoved, MessageId, PublishOutcome, Queue, QueueHost,
    QueueOptions, QueueStats,
};
use crate::queue_journal::RecoveredQueue;
use crate::queue_limits::QueueLimits;
use crate::queue_timer::TimedWork;
use crate::queue_type::QueueType;
use crate::ready::ReadyMessages;
use rules::QueueRules;
use state::QueueState;

/// The queue argument that turns single active consumer on.
const SINGLE_ACTIVE_CONSUMER_ARGUMENT: &str = "x-single-active-consumer";

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

/// What a classic queue is made from.
pub struct ClassicQueueSpec {
    pub name: Arc<str>,
    pub vhost: Arc<str>,
    pub options: QueueOptions,
    /// `x-max-length`, `x-max-length-bytes` and `x-overflow`, from the
    /// effective arguments (declared, merged with the policy); a policy
    /// change replaces these and the two below (see `rules`).
    pub limits: QueueLimits,
    /// `x-message-ttl` and `x-expires`, from the effective arguments.
    pub expiry: QueueExpiry,
    /// `x-dead-letter-exchange` and `x-dead-letter-routing-key`.
    pub dead_letter: Option<DeadLetterTarget>,
    /// The vhost, which routes dead-letters and deletes the queue when it
    /// expires; weak, as the vhost holds its queues.
    pub host: Weak<dyn QueueHost>,
    /// The journal directory of a durable queue.
    pub store_id: Option<String>,
    /// Where the queue pages and journals messages; None keeps everything
    /// in memory (a node without a data directory).
    pub storage: Option<Arc<QueueStorage>>,
    /// A durable queue's journal, and the messages recovered from it, paged
    /// until consumers need them.
    pub recovered: Option<RecoveredQueue>,
}

pub struct ClassicQueue {
    name: Arc<str>,
    vhost: Arc<str>,
    options: QueueOptions,
    store_id: Option<String>,
    storage: Option<Arc<QueueStorage>>,
    state: Mutex<QueueState>,
    deleted: AtomicBool,
    /// Set while the backlog is over the flow bound and consumers exist.
    congested: AtomicBool,
    /// Woken when the queue stops being congested.
    uncongested: tokio::sync::Notify,
    host: Weak<dyn QueueHost>,
    /// `x-single-active-consumer`: only `consumers[0]` receives messages.
    /// A queue argument only, never a policy key, as in RabbitMQ 3.10.
    single_active_consumer: bool,
    /// This queue, for the work that outlives a call: the pager's and the
    /// timer's, deliveries and the sync thread's signals.
    this: Weak<ClassicQueue>,
}

impl ClassicQueue {
    pub fn create(spec: ClassicQueueSpec) -> Arc<Self> {
        let arguments = spec.options.arguments.inner();
        let max_priority = arguments
            .get("x-max-priority")
            .and_then(as_strict_integer)
            .map(|max| max.clamp(0, MAX_PRIORITY_MAX) as u8);
        let single_active_consumer = matches!(
            arguments.get(SINGLE_ACTIVE_CONSUMER_ARGUMENT),
            Some(AMQPValue::Boolean(true))
        );
        let mut state = QueueState {
            ready: ReadyMessages::new(max_priority),
            rules: QueueRules {
                limits: spec.limits,
                expiry: spec.expiry,
                dead_letter: spec.dead_letter,
            },
            ..QueueState::default()
        };
        if let Some(storage) = &spec.storage {
            state
                .resident_bytes
                .count_into(Arc::clone(&storage.resident));
        }
        if let Some(recovered) = spec.recovered {
            state.adopt_recovered(recovered);
        }
        Arc::new_cyclic(|this| ClassicQueue {
            name: spec.name,
            vhost: spec.vhost,
            options: spec.options,
            store_id: spec.store_id,
            storage: spec.storage,
            state: Mutex::new(state),
            deleted: AtomicBool::new(false),
            congested: AtomicBool::new(false),
            uncongested: tokio::sync::Notify::new(),
            host: spec.host,
            single_active_consumer,
            this: this.clone(),
        })
    }

    /// This queue as an `Arc`. Every `&self` of a classic queue comes from
    /// an `Arc` (it is only ever created in one), so the upgrade holds.
    fn arc(&self) -> Arc<Self> {
        self.this
            .upgrade()
            .expect("a classic queue in use is held by an Arc")
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A panic while holding the lock leaves counts possibly off by one,
        // never memory unsafe; keep serving rather than poison every user.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Releases the lock, then hands the host what was collected under it:
    /// dead-lettering publishes into another queue (or this one), which
    /// must not happen with this queue's lock held.
    fn unlock(&self, mut state: MutexGuard<'_, QueueState>) {
        if state.dead_letters.is_empty() {
            return;
        }
        let dead_letters = std::mem::take(&mut state.dead_letters);
        let target = state.rules.dead_letter.clone();
        drop(state);
        self.send_dead_letters(target, dead_letters);
    }

    /// Hands dead letters to the host, for the target the queue had when
    /// they were dropped.
    fn send_dead_letters(&self, target: Option<DeadLetterTarget>, dead_letters: Vec<DeadLetter>) {
        let (Some(target), Some(host)) = (target, self.host.upgrade()) else {
            return;
        };
        host.dead_letter(&self.name, &target, dead_letters);
    }

    fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    fn is_congested(&self) -> bool {
        self.congested.load(Ordering::Acquire)
    }

    /// Ready messages whose bodies are on disk only.
    pub fn paged_count(&self) -> u32 {
        self.lock().paged.len() as u32
    }
}

impl QueueState {
    /// Takes over a durable queue's journal and the messages recovered
    /// from it, all paged, each with its saved deadline.
    fn adopt_recovered(&mut self, recovered: RecoveredQueue) {
        self.ready_bytes = recovered
            .messages
            .iter()
            .map(|paged| paged.body_size as u64)
            .sum();
        if !recovered.deadlines.is_empty() {
            let mut deadlines = recovered.deadlines.iter().peekable();
            self.paged_deadlines = recovered
                .messages
                .iter()
                .map(|paged| {
                    deadlines
                        .next_if(|(offset, _)| *offset == paged.offset)
                        .map_or(NEVER, |(_, wall_ms)| deadline_of_wall_ms(*wall_ms))
                })
                .collect();
        }
        self.paged = recovered.messages.into();
        self.next_offset = recovered.next_offset;
        self.journal = Some(recovered.journal);
    }
}

impl Queue for ClassicQueue {
    fn name(&self) -> &Arc<str> {
        &self.name
    }

    fn vhost_name(&self) -> &Arc<str> {
        &self.vhost
    }

    fn queue_type(&self) -> QueueType {
        QueueType::Classic
    }

    fn options(&self) -> &QueueOptions {
        &self.options
    }

    fn store_id(&self) -> Option<&str> {
        self.store_id.as_deref()
    }

    fn publish(&self, message: Arc<Message>) -> PublishOutcome {
        self.publish_message(message)
    }

    fn dispatch(&self) {
        self.dispatch_now();
    }

    fn add_consumer(&self, consumer: Arc<Consumer>, announce: &mut dyn FnMut()) -> AmqpResult<()> {
        self.register_consumer(consumer, announce)
    }

    fn remove_consumer(
        &self,
        connection_id: ConnectionId,
        channel_id: u16,
        tag: &str,
    ) -> Option<ConsumerRemoved> {
        self.unregister_consumer(connection_id, channel_id, tag)
    }

    fn active_consumer_tag(&self) -> Option<Arc<str>> {
        self.active_consumer()
    }

    fn has_consumer_on(&self, connection_id: ConnectionId) -> bool {
        self.lock()
            .consumers
            .iter()
            .any(|consumer| consumer.connection_id == connection_id)
    }

    fn settle(&self, messages: &[MessageId]) {
        self.settle_with(messages, None);
    }

    fn reject(&self, messages: &[MessageId]) {
        self.settle_with(messages, Some(crate::dead_letter::DeathReason::Rejected));
    }

    fn requeue(&self, messages: &[MessageId]) {
        self.requeue_messages(messages);
    }

    fn get(&self, no_ack: bool) -> Option<(QueuedMessage, u32)> {
        self.get_head(no_ack)
    }

    fn purge(&self) -> u32 {
        self.purge_ready()
    }

    fn delete(&self) -> (Vec<Arc<Consumer>>, u32) {
        self.mark_deleted()
    }

    fn is_deleted(&self) -> bool {
        ClassicQueue::is_deleted(self)
    }

    fn stats(&self) -> QueueStats {
        let state = self.lock();
        QueueStats {
            messages_ready: state.ready_count() as u32,
            messages_paged: state.paged.len() as u32,
            messages_unacknowledged: state.unacked.len() as u64,
            ready_bytes: state.ready_bytes,
            consumers: state.consumers.len() as u32,
        }
    }

    fn counts(&self) -> MessageCounts {
        self.lock().counts
    }

    fn count_get_empty(&self) {
        self.lock().counts.add(|counts| &mut counts.get_empty, 1);
    }

    fn message_count(&self) -> u32 {
        self.lock().ready_count() as u32
    }

    fn consumer_count(&self) -> u32 {
        self.lock().consumers.len() as u32
    }

    fn touch(&self) {
        self.touch_used();
    }

    fn is_unused_for_expiry(&self) -> bool {
        self.unused_for_expiry()
    }

    fn start_timers(&self) {
        self.start_timed_work();
    }

    fn apply_policy(
        &self,
        effective_arguments: &amq_protocol::types::FieldTable,
        _generation: u64,
    ) {
        self.change_rules(QueueRules::from_arguments(effective_arguments));
    }

    fn is_congested(&self) -> bool {
        ClassicQueue::is_congested(self)
    }

    fn uncongested(&self) -> tokio::sync::futures::Notified<'_> {
        self.uncongested.notified()
    }
}

impl PagerWork for ClassicQueue {
    fn run_pager_work(&self) {
        self.pager_work();
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl TimedWork for ClassicQueue {
    fn run_timer(&self, at_us: u64) {
        self.timer_work(at_us);
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Debug for ClassicQueue {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ClassicQueue")
            .field("name", &self.name)
            .field("vhost", &self.vhost)
            .field("options", &self.options)
            .finish()
    }
}
