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
use std::sync::{Arc, Mutex, MutexGuard};

use amq_protocol::types::FieldTable;

use crate::consumer::{ConnectionId, Consumer};
use crate::error::{AmqpError, AmqpResult};
use crate::message::Message;
use crate::pager::QueueStorage;
use crate::paging::PagedMessage;
use crate::queue_journal::{read_message, Durability, QueueJournal, RecoveredQueue};
use crate::queue_limits::{Overflow, QueueLimits};
use sluice_store::group_commit::Location;

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
}

#[derive(Default)]
struct QueueState {
    /// The head of the ready messages, in memory.
    ready: VecDeque<QueuedMessage>,
    /// The rest of them, bodies on disk, all after those in `ready`.
    paged: VecDeque<PagedMessage>,
    /// Body bytes of every ready message, paged or not.
    ready_bytes: u64,
    /// Body bytes of the ready messages in memory.
    resident_bytes: u64,
    next_offset: u64,
    /// Delivered to consumers or fetched with basic.get, not yet settled.
    unacked: u64,
    /// Sorted by priority, highest first; registration order within one.
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
    /// The backlog's lowest point (messages, bytes) since consumers came:
    /// flow control measures growth from here.
    flow_floor: (u64, u64),
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

    fn take_resident(&mut self) -> Option<QueuedMessage> {
        let entry = self.ready.pop_front()?;
        let body_size = entry.message.body_size() as u64;
        self.ready_bytes -= body_size;
        self.resident_bytes -= body_size;
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
}

impl Queue {
    pub fn new(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        limits: QueueLimits,
    ) -> Self {
        Queue {
            name,
            vhost,
            options,
            limits,
            store_id: None,
            storage: None,
            state: Mutex::new(QueueState::default()),
            deleted: AtomicBool::new(false),
            congested: AtomicBool::new(false),
            uncongested: tokio::sync::Notify::new(),
        }
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
        if !self.is_congested() {
            let flow_over = !state.consumers.is_empty()
                && (backlog.0 > floor.0 + FLOW_BACKLOG_MESSAGES as u64
                    || backlog.1 > floor.1 + FLOW_BACKLOG_BYTES);
            let store_over = unwritten > unwritten_max;
            if (flow_over || store_over) && !self.is_deleted() {
                self.congested.store(true, Ordering::Release);
                if store_over {
                    self.request_written_signal(state);
                }
            }
        } else {
            let flow_drained = state.consumers.is_empty()
                || (backlog.0 <= floor.0 + FLOW_BACKLOG_MESSAGES as u64 / 2
                    && backlog.1 <= floor.1 + FLOW_BACKLOG_BYTES / 2);
            let store_drained = unwritten <= unwritten_max / 2;
            if (flow_drained && store_drained) || self.is_deleted() {
                self.congested.store(false, Ordering::Release);
                self.uncongested.notify_waiters();
            } else if !store_drained {
                self.request_written_signal(state);
            }
        }
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
            state.paged = recovered.messages.into();
            state.next_offset = recovered.next_offset;
            state.journal = Some(recovered.journal);
        }
        queue
    }

    pub fn is_durable_store(&self) -> bool {
        self.lock()
            .journal
            .as_ref()
            .is_some_and(|journal| journal.is_durable())
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
                return PublishOutcome::Rejected;
            }
        }
        let offset = state.next_offset;
        state.next_offset += 1;
        let mut durability = None;
        let mut written_at = None;
        if message.properties.is_persistent() {
            if let Some(journal) = state
                .journal
                .as_mut()
                .filter(|journal| journal.is_durable())
            {
                match journal.append_message(offset, &message) {
                    Some((location, ticket)) => {
                        written_at = Some(location);
                        durability = Some(ticket);
                    }
                    // The journal failed: the message cannot be made durable.
                    None => return PublishOutcome::Rejected,
                }
            }
        }
        state.ready_bytes += body_size;
        let paged = self
            .page_out_location(&mut state, offset, &message, written_at)
            .map(|location| PagedMessage::new(offset, location, message.body_size(), false));
        match paged {
            Some(paged) => state.paged.push_back(paged),
            None => {
                state.resident_bytes += body_size;
                state.ready.push_back(QueuedMessage {
                    offset,
                    message,
                    redelivered: false,
                    segment: written_at.map(|location| location.segment),
                });
                self.dispatch_locked(&mut state);
            }
        }
        if self.limits.is_limited() && self.limits.overflow == Overflow::DropHead {
            self.drop_head_over_limits(&mut state);
        }
        self.update_congestion(&mut state);
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
        let window_full = state.ready.len() >= storage.settings.resident_messages_max
            || state.resident_bytes + message.body_size() as u64
                > storage.settings.resident_bytes_max;
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

    /// Drops the oldest ready messages until the queue is within its limits.
    fn drop_head_over_limits(&self, state: &mut QueueState) {
        while self
            .limits
            .exceeded(state.ready_count() as u64, state.ready_bytes)
        {
            if let Some(dropped) = state.take_resident() {
                state.forget([&dropped]);
            } else if let Some(dropped) = state.paged.pop_front() {
                state.ready_bytes -= dropped.body_size as u64;
                state.forget_paged([&dropped]);
            } else {
                break;
            }
        }
    }

    /// Delivers ready messages to consumers with room. Sinks call this after
    /// refusing a delivery, once they have room again.
    pub fn dispatch(self: &Arc<Self>) {
        let mut state = self.lock();
        self.dispatch_locked(&mut state);
    }

    fn dispatch_locked(self: &Arc<Self>, state: &mut QueueState) {
        while !state.ready.is_empty() && !state.consumers.is_empty() {
            if !self.deliver_one(state) {
                break;
            }
        }
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
    fn read_ahead_if_low(self: &Arc<Self>, state: &mut QueueState) {
        let Some(storage) = self.storage.as_ref() else {
            return;
        };
        let low = state.ready.len() < storage.settings.resident_messages_max / 2
            && state.resident_bytes < storage.settings.resident_bytes_max / 2;
        if low && !state.consumers.is_empty() {
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

    /// Offers the head message to the highest-priority consumers first,
    /// round-robin within a priority. Returns false when nobody could take it.
    fn deliver_one(self: &Arc<Self>, state: &mut QueueState) -> bool {
        let consumer_count = state.consumers.len();
        let mut group_start = 0;
        while group_start < consumer_count {
            let priority = state.consumers[group_start].priority;
            let group_len = state.consumers[group_start..]
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
                        state.resident_bytes -= body_size;
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
        let entry = loop {
            if let Some(entry) = state.take_resident() {
                break entry;
            }
            let paged = state.paged.pop_front()?;
            state.ready_bytes -= paged.body_size as u64;
            match self.read_paged(&state, &paged) {
                Some(message) => {
                    break QueuedMessage {
                        offset: paged.offset,
                        message: Arc::new(message),
                        redelivered: paged.redelivered(),
                        segment: Some(paged.segment()),
                    }
                }
                None => state.forget_paged([&paged]),
            }
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
        Some((entry, remaining))
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
                let room = settings
                    .resident_messages_max
                    .saturating_sub(state.ready.len())
                    .min(settings.read_batch_messages());
                let Some(journal) = state.journal.as_ref() else {
                    return;
                };
                if room == 0
                    || state.paged.is_empty()
                    || state.consumers.is_empty()
                    || self.is_deleted()
                    || state.resident_bytes >= settings.resident_bytes_max
                {
                    return;
                }
                let mut bytes = state.resident_bytes;
                let batch: Vec<(PagedMessage, Location)> = state
                    .paged
                    .iter()
                    .take(room)
                    .take_while(|paged| {
                        bytes += paged.body_size as u64;
                        bytes <= settings.resident_bytes_max || bytes == paged.body_size as u64
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
                state.paged.pop_front();
                match message {
                    Ok(message) => {
                        state.resident_bytes += paged.body_size as u64;
                        state.ready.push_back(QueuedMessage {
                            offset: paged.offset,
                            message: Arc::new(message),
                            redelivered: paged.redelivered(),
                            segment: Some(paged.segment()),
                        });
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
            while !state.ready.is_empty() && !state.consumers.is_empty() {
                if !self.deliver_one(&mut state) {
                    break;
                }
            }
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
        let mut state = self.lock();
        let mut count = 0;
        state.forget(messages.into_iter().inspect(|_| count += 1));
        state.unacked = state.unacked.saturating_sub(count);
        self.dispatch_locked(&mut state);
        let wants_compaction = state
            .journal
            .as_ref()
            .is_some_and(|journal| journal.wants_compaction());
        if wants_compaction {
            self.request_pager(&mut state);
        }
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
            let body_size = entry.message.body_size() as u64;
            state.ready_bytes += body_size;
            state.resident_bytes += body_size;
            // Requeues are usually of the oldest messages: search from the
            // front. Every paged message is newer than a delivered one.
            let position = state
                .ready
                .partition_point(|queued| queued.offset < entry.offset);
            state.ready.insert(position, entry);
        }
        self.dispatch_locked(&mut state);
    }

    pub fn add_consumer(self: &Arc<Self>, consumer: Arc<Consumer>) -> AmqpResult<()> {
        let mut state = self.lock();
        if self.is_deleted() {
            return Err(AmqpError::not_found(format!(
                "no queue '{}' in vhost '{}'",
                self.name, self.vhost
            )));
        }
        let exclusive_in_use = consumer.exclusive && !state.consumers.is_empty()
            || state.consumers.iter().any(|existing| existing.exclusive);
        if exclusive_in_use {
            return Err(AmqpError::access_refused(format!(
                "queue '{}' in vhost '{}' in exclusive use",
                self.name, self.vhost
            )));
        }
        if state.consumers.is_empty() {
            // Flow measures the backlog's growth from where it is now.
            state.flow_floor = (state.ready_count() as u64, state.ready_bytes);
        }
        let position = state
            .consumers
            .partition_point(|existing| existing.priority >= consumer.priority);
        state.consumers.insert(position, consumer);
        state.had_consumer = true;
        // No dispatch here: the caller sends consume-ok first, then calls
        // dispatch, so deliveries never overtake the consume-ok.
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
        self.update_congestion(&mut state);
        let queue_now_unused = self.options.auto_delete
            && state.had_consumer
            && state.consumers.is_empty()
            && !self.is_deleted();
        Some(ConsumerRemoved {
            consumer,
            queue_now_unused,
        })
    }

    /// Drops every ready message; messages out with consumers stay out.
    pub fn purge(self: &Arc<Self>) -> u32 {
        let mut state = self.lock();
        let purged = state.ready_count() as u32;
        let ready = std::mem::take(&mut state.ready);
        state.forget(&ready);
        let paged = std::mem::take(&mut state.paged);
        state.forget_paged(&paged);
        state.ready_bytes = 0;
        state.resident_bytes = 0;
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

    /// Segments in the queue's journal holding live messages.
    pub fn journal_segment_count(&self) -> usize {
        self.lock()
            .journal
            .as_ref()
            .map_or(0, |journal| journal.segment_count())
    }

    /// Marks the queue deleted and empties it. Returns the consumers, whom
    /// the caller notifies with basic.cancel, and the number of ready
    /// messages dropped.
    pub fn mark_deleted(self: &Arc<Self>) -> (Vec<Arc<Consumer>>, u32) {
        let mut state = self.lock();
        self.deleted.store(true, Ordering::Release);
        let dropped = state.ready_count() as u32;
        state.ready.clear();
        state.paged.clear();
        state.ready_bytes = 0;
        state.resident_bytes = 0;
        if let Some(journal) = state.journal.take() {
            journal.destroy();
        }
        self.update_congestion(&mut state);
        (std::mem::take(&mut state.consumers), dropped)
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
