//! A quorum queue as one member holds it: the [`Queue`] channels use, over
//! the queue's replicated log. Everything a channel does becomes an item of
//! the member's next entry (see [`super::proposer`]); what the committed
//! entries do is applied here, on every member alike, and each member
//! delivers to the consumers that read through its node. Confirms go out
//! once the entry holding the message is committed (a majority of members
//! fsynced it) and applied here.
//!
//! Operations that wait for the log (consume, basic.get, purge) go through
//! [`Queue::forwarded`], the channel's asynchronous path, as operations on
//! a queue of another node do.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, Weak};
use std::time::Duration;

use amq_protocol::types::FieldTable;
use bytes::Bytes;
use tokio::sync::oneshot;

use super::body_window::BodyWindow;
use super::command::{
    Command, ConsumerId, ConsumerSpec, DeadLetterReason, DeliveryId, Effect, Overflow, QueueConfig,
    Reply,
};
use super::dead_lettering::death_reason;
use super::entry::{encode, encode_message, Batch, BatchReply, Item, ITEM_BITS};
use super::machine::{QueueMachine, NODE_SHIFT};
use super::member::{
    message_id, split_message_id, with_delivery_count, LocalConsumer, Member, Parked, GET_SLOT,
};
use super::proposer::{wall_ms, Proposer, Waiter};
use super::replication::{GroupSpec, QuorumGroups, ReplicatedLog, ReplicatedMachine};
use crate::arguments::{as_strict_integer, as_text, parse_expiration};
use crate::confirm::{ForwardedConfirm, PendingSafety};
use crate::counters::{DeliveredBy, MessageCounters, MessageCounts};
use crate::dead_letter::{DeadLetter, DeadLetterTarget};
use crate::error::{AmqpError, AmqpResult};
use crate::expiry::NEVER;
use crate::message::{Message, QueuedMessage};
use crate::paging::NodeResident;
use crate::queue::forwarding::{ConsumerKey, ForwardHome, QueueKey, RemoteReply, Settlement};
use crate::queue::{
    ConnectionId, Consumer, ConsumerRemoved, MessageId, PublishOutcome, Queue, QueueHost,
    QueueOptions, QueueStats,
};
use crate::queue_type::QueueType;
use crate::quorum_members::Membership;
use sluice_wire::reply_code::ReplyCode;

/// Bodies read back from the log per pass: enough that a consumer
/// catching up reads whole entries at a time, few enough that it gets the
/// first ones soon.
const READ_BATCH_MESSAGES: usize = 512;

/// The wait before reading again after the log could not be read.
const READ_RETRY_DELAY: Duration = Duration::from_secs(1);

/// Deliveries the machine may hand a consumer with no prefetch limit, or
/// one that needs no acks (its deliveries are settled as its channel takes
/// them): what a member may hold for it while its channel is busy.
pub const UNLIMITED_CREDIT: u32 = 2000;

/// Below this prefetch a consumer's credit is its prefetch exactly: work
/// queues with a prefetch of 1 rely on a busy consumer getting nothing
/// more while another is idle.
const EXACT_CREDIT_BELOW: u32 = 10;

/// The machine's credit for a consumer: twice its prefetch, so that the
/// member holds the next deliveries while the settlements of the last ones
/// are committed, and hands them over as soon as the client acks instead of
/// a commit round trip later.
pub fn machine_credit(consumer: &Consumer) -> u32 {
    match consumer.prefetch_count {
        0 => UNLIMITED_CREDIT,
        prefetch if prefetch < EXACT_CREDIT_BELOW => prefetch,
        prefetch => prefetch.saturating_mul(2).min(UNLIMITED_CREDIT),
    }
}

/// Deliveries a member settles or returns itself, once it let go of the
/// queue's lock.
#[derive(Default)]
struct Undelivered {
    settled: Vec<(ConsumerId, u64)>,
    returned: Vec<(ConsumerId, u64)>,
    /// Some delivery waits for its body to be read back.
    unread: bool,
}

/// What a quorum queue is made from.
pub struct QuorumQueueSpec {
    pub name: Arc<str>,
    pub vhost: Arc<str>,
    pub options: QueueOptions,
    pub effective_arguments: FieldTable,
    /// The node's count of policy changes the effective arguments come
    /// from (see [`Command::SetConfig`]).
    pub policy_generation: u64,
    pub host: Weak<dyn QueueHost>,
    pub store_id: String,
    /// Where this member keeps the queue's log.
    pub dir: PathBuf,
    pub members: Membership,
    pub preferred_leader: String,
    /// This node's number (the top bits of its connection ids).
    pub node_number: u16,
    /// Body bytes of undelivered messages this member keeps in memory.
    pub window_bytes_max: u64,
    /// What the windows of all queues of the node hold, and its bound.
    pub node_window: Option<(Arc<NodeResident>, u64)>,
}

pub struct QuorumQueue {
    name: Arc<str>,
    vhost: Arc<str>,
    options: QueueOptions,
    store_id: String,
    key: QueueKey,
    host: Weak<dyn QueueHost>,
    /// Where the leader routes what the queue dead-letters: from the
    /// effective arguments, replaced when a policy changes them.
    dead_letter: RwLock<Option<DeadLetterTarget>>,
    /// The rules this member last asked the log for (its policy's, merged
    /// with the declaration's): a policy change that leaves them as they
    /// are proposes nothing.
    policy_config: Mutex<QueueConfig>,
    this: Weak<QuorumQueue>,
    member: Mutex<Member>,
    log: OnceLock<Arc<dyn ReplicatedLog>>,
    proposer: Arc<Proposer>,
    deleted: AtomicBool,
    counters: MessageCounters,
    node_number: u16,
    /// The log time a tick is due at, when one is scheduled.
    tick_at: Mutex<Option<u64>>,
    /// Bodies of parked deliveries are being read back from the log.
    reading: AtomicBool,
    /// The at-least-once dead-lettering task runs.
    dead_lettering: AtomicBool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The queue's rules from its effective arguments.
pub fn queue_config(arguments: &FieldTable) -> QueueConfig {
    let number = |key: &str| {
        arguments
            .inner()
            .get(key)
            .and_then(as_strict_integer)
            .and_then(|number| u64::try_from(number).ok())
    };
    QueueConfig {
        max_length: number("x-max-length"),
        max_length_bytes: number("x-max-length-bytes"),
        overflow: overflow_of(arguments),
        delivery_limit: number("x-delivery-limit")
            .map(|limit| limit.min(u64::from(u32::MAX)) as u32),
        message_ttl_ms: number("x-message-ttl"),
        expires_ms: number("x-expires").filter(|expires| *expires > 0),
        single_active_consumer: matches!(
            arguments.inner().get("x-single-active-consumer"),
            Some(amq_protocol::types::AMQPValue::Boolean(true))
        ),
        dead_letter_at_least_once: wants_at_least_once(arguments)
            && arguments.inner().contains_key("x-dead-letter-exchange")
            && overflow_of(arguments) == Overflow::RejectPublish,
    }
}

fn overflow_of(arguments: &FieldTable) -> Overflow {
    match arguments
        .inner()
        .get("x-overflow")
        .and_then(as_text)
        .as_deref()
    {
        Some("reject-publish") => Overflow::RejectPublish,
        _ => Overflow::DropHead,
    }
}

fn wants_at_least_once(arguments: &FieldTable) -> bool {
    arguments
        .inner()
        .get("x-dead-letter-strategy")
        .and_then(as_text)
        .as_deref()
        == Some("at-least-once")
}

/// The machine as the log applies it: through to the queue.
struct Applier {
    queue: Weak<QuorumQueue>,
}

impl ReplicatedMachine for Applier {
    fn apply(&mut self, index: u64, command: &[u8]) -> Bytes {
        match self.queue.upgrade() {
            Some(queue) => queue.apply_entry(index, command),
            None => encode(&BatchReply::new()),
        }
    }

    fn snapshot(&self) -> Bytes {
        self.queue
            .upgrade()
            .map(|queue| lock(&queue.member).snapshot())
            .unwrap_or_default()
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        match self.queue.upgrade() {
            Some(queue) => lock(&queue.member).restore(snapshot),
            None => Ok(()),
        }
    }

    fn first_needed(&self) -> Option<u64> {
        self.queue
            .upgrade()
            .and_then(|queue| lock(&queue.member).first_needed())
    }

    fn keep_for_snapshot(&mut self) -> bool {
        self.queue
            .upgrade()
            .is_some_and(|queue| lock(&queue.member).keep_for_snapshot())
    }
}

/// Bodies read back from the log, and the indexes of messages whose entry
/// the log no longer holds.
pub(super) type ReadBack = (HashMap<u64, Arc<Message>>, Vec<u64>);

/// Reads the bodies of the messages at `indexes` back from `log`, one read
/// per entry.
///
/// # Errors
/// The log could not be read.
fn read_bodies(log: &dyn ReplicatedLog, indexes: &[u64]) -> Result<ReadBack, String> {
    let mut by_entry: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for index in indexes {
        by_entry
            .entry(index >> ITEM_BITS)
            .or_default()
            .insert(*index);
    }
    let mut read = HashMap::with_capacity(indexes.len());
    let mut missing = Vec::new();
    for (entry_index, wanted) in by_entry {
        let mut batch = match log.read_entry(entry_index)? {
            Some(bytes) => Some(Batch::decode(&bytes)?),
            None => None,
        };
        for index in wanted {
            let position = (index & ((1 << ITEM_BITS) - 1)) as usize;
            // Each index comes once (a set): its bytes are taken, not copied.
            let body = batch
                .as_mut()
                .and_then(|batch| match batch.items.get_mut(position) {
                    Some(Item::Publish { message, .. }) => {
                        super::entry::decode_message(std::mem::take(message))
                    }
                    _ => None,
                });
            match body {
                Some(body) => {
                    read.insert(index, body);
                }
                None => missing.push(index),
            }
        }
    }
    Ok((read, missing))
}

impl QuorumQueue {
    /// Makes this member of the queue and starts its group (or reopens it,
    /// replaying its log).
    pub fn create(spec: QuorumQueueSpec, groups: &Arc<dyn QuorumGroups>) -> Arc<QuorumQueue> {
        let config = queue_config(&spec.effective_arguments);
        // The log starts from the declaration's rules on every member,
        // whenever it was made: a policy's come through the log (below),
        // so that every member applies each entry under the same rules.
        let declared_config = queue_config(&spec.options.arguments);
        if wants_at_least_once(&spec.effective_arguments)
            && !config.dead_letter_at_least_once
            && spec
                .effective_arguments
                .inner()
                .contains_key("x-dead-letter-exchange")
        {
            tracing::warn!(queue = %spec.name, vhost = %spec.vhost, "falling back to dead-letter-strategy at-most-once because the configured dead-letter-strategy at-least-once is incompatible with the effective overflow strategy drop-head; set overflow to reject-publish to enable it");
        }
        let get_holder = ConsumerId {
            // Never a real connection: the low bits of a node's ids do not
            // reach this.
            connection: (u64::from(spec.node_number) << NODE_SHIFT) | ((1 << NODE_SHIFT) - 1),
            channel: 0,
            tag: "basic.get".to_owned(),
        };
        let restarts = groups.ran_here_before(&spec.dir, &spec.members.by_id());
        let queue = Arc::new_cyclic(|this| QuorumQueue {
            key: QueueKey {
                vhost: Arc::clone(&spec.vhost),
                name: Arc::clone(&spec.name),
                declared_at: spec.options.declared_at,
            },
            name: spec.name,
            vhost: spec.vhost,
            dead_letter: RwLock::new(DeadLetterTarget::from_arguments(&spec.effective_arguments)),
            policy_config: Mutex::new(declared_config.clone()),
            options: spec.options,
            store_id: spec.store_id,
            host: spec.host,
            this: this.clone(),
            member: Mutex::new(Member::new(
                QueueMachine::new(declared_config),
                get_holder,
                BodyWindow::new(spec.window_bytes_max, spec.node_window),
            )),
            log: OnceLock::new(),
            proposer: Proposer::new(),
            deleted: AtomicBool::new(false),
            counters: MessageCounters::default(),
            node_number: spec.node_number,
            tick_at: Mutex::new(None),
            reading: AtomicBool::new(false),
            dead_lettering: AtomicBool::new(false),
        });
        let log = groups.open(
            GroupSpec {
                group: queue.options.declared_at,
                label: format!("queue '{}' in vhost '{}'", queue.name, queue.vhost),
                dir: spec.dir,
                joins: spec.members.joined(&groups.local_node()),
                members: spec.members.by_id(),
                preferred_leader: spec.preferred_leader,
            },
            Box::new(Applier {
                queue: Arc::downgrade(&queue),
            }),
        );
        let _ = queue.log.set(Arc::clone(&log));
        // First in this member's first entry: ahead of anything published
        // through it.
        queue.propose_config(config, spec.policy_generation);
        tokio::spawn(Arc::clone(&queue.proposer).run(log));
        // What consumers of this node's previous run held (it crashed, or
        // stopped before their channels settled) goes back to the queue.
        // A member new here (declared now, or joining) had no previous run:
        // this node's consumers of a queue it joins read through another
        // member and keep what they hold.
        if restarts {
            queue.node_down(queue.node_number);
        }
        queue
    }

    /// Where what the queue dead-letters goes now.
    fn dead_letter_target(&self) -> Option<DeadLetterTarget> {
        self.dead_letter
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Asks the log for new rules, unless they are the ones this member
    /// asked for last. Every member of the queue does so for a policy
    /// change; the machine applies the first of them and skips the rest
    /// (see [`Command::SetConfig`]).
    fn propose_config(&self, config: QueueConfig, generation: u64) {
        {
            let mut last = lock(&self.policy_config);
            if *last == config {
                return;
            }
            *last = config.clone();
        }
        self.proposer.submit(
            Item::Machine(Command::SetConfig { config, generation }),
            Waiter::Nobody,
        );
    }

    fn arc(&self) -> Arc<QuorumQueue> {
        self.this.upgrade().expect("a queue in use is alive")
    }

    fn is_leader(&self) -> bool {
        self.log.get().is_some_and(|log| log.is_leader())
    }

    /// The members of the queue's group, as the metadata has them now.
    pub fn members(&self) -> Vec<String> {
        self.options.members.members()
    }

    /// The leader this member knows of.
    pub fn leader(&self) -> Option<String> {
        self.log.get().and_then(|log| log.leader())
    }

    fn not_found(&self) -> AmqpError {
        AmqpError::not_found(format!(
            "no queue '{}' in vhost '{}'",
            self.name, self.vhost
        ))
    }

    /// Applies the committed entry at `index`: every member runs this for
    /// every entry, in order.
    fn apply_entry(&self, index: u64, bytes: &[u8]) -> Bytes {
        let batch = match Batch::decode(bytes) {
            Ok(batch) => batch,
            Err(error) => {
                tracing::error!(queue = %self.name, vhost = %self.vhost, index, %error, "undecodable quorum queue entry");
                return encode(&BatchReply::new());
            }
        };
        let leader = self.is_leader();
        let mut dead_letters = Vec::new();
        let mut undelivered = Undelivered::default();
        let mut replies = Vec::with_capacity(batch.items.len());
        let mut member = lock(&self.member);
        for (position, item) in batch.items.into_iter().enumerate() {
            let at = (index << ITEM_BITS) | position as u64;
            let reply = match item {
                Item::Publish {
                    publisher,
                    ttl_ms,
                    message,
                } => match super::entry::decode_message(message) {
                    None => Reply::Rejected,
                    Some(message) => {
                        let size = message.body.len() as u32;
                        member.hold_body(at, message);
                        let command = Command::Enqueue {
                            publisher: Some(publisher),
                            size,
                            ttl_ms,
                        };
                        let (reply, effects) = member.machine.apply(at, batch.time_ms, command);
                        self.act(
                            &mut member,
                            effects,
                            leader,
                            &mut dead_letters,
                            &mut undelivered,
                        );
                        if !member.machine.is_live(at) {
                            member.take_body(at);
                        }
                        reply
                    }
                },
                Item::Machine(command) => {
                    let touched = match &command {
                        Command::Checkout { consumer, .. } => {
                            if let Some(local) = member.consumers.get_mut(consumer) {
                                local.checked_out = true;
                                if let Some(announce) = local.announce.take() {
                                    announce();
                                }
                            }
                            None
                        }
                        Command::NodeDown { node } if *node == self.node_number => {
                            // The others took this node for dead: its
                            // consumers are gone from the queue, and their
                            // clients hear so. Those whose checkout comes
                            // later in the log are not affected.
                            let gone: Vec<ConsumerId> = member
                                .consumers
                                .iter()
                                .filter(|(_, local)| local.checked_out)
                                .map(|(id, _)| id.clone())
                                .collect();
                            for id in gone {
                                if let Some(local) = member.consumers.remove(&id) {
                                    local.consumer.sink.cancelled_by_queue(&local.consumer);
                                }
                            }
                            None
                        }
                        Command::ConsumerDown { consumer } => {
                            // Not one this member lets go of (see
                            // `retire`), unless it subscribed here again
                            // in between: it is gone all the same.
                            let subscribed = member
                                .consumers
                                .get(consumer)
                                .is_some_and(|local| local.checked_out);
                            if subscribed {
                                if let Some(local) = member.consumers.remove(consumer) {
                                    local.consumer.sink.cancelled_by_queue(&local.consumer);
                                }
                            }
                            None
                        }
                        Command::Cancel { consumer }
                        | Command::Settle { consumer, .. }
                        | Command::Return { consumer, .. }
                        | Command::Release { consumer, .. }
                        | Command::Discard { consumer, .. } => Some(consumer.clone()),
                        _ => None,
                    };
                    let (reply, effects) = member.machine.apply(at, batch.time_ms, command);
                    if let Reply::Dequeued(Some((delivery, message, _))) = &reply {
                        let body = member
                            .take_body(message.index)
                            .or_else(|| self.read_body(message.index));
                        if let Some(body) = body {
                            let body = with_delivery_count(&body, message.delivery_count);
                            member.remember_get(*delivery, body);
                        }
                    }
                    self.act(
                        &mut member,
                        effects,
                        leader,
                        &mut dead_letters,
                        &mut undelivered,
                    );
                    if let Some(consumer) = touched {
                        member.forget_if_gone(&consumer);
                    }
                    reply
                }
            };
            for released in member.machine.take_released() {
                member.take_body(released);
            }
            replies.push(reply);
        }
        member.fresh.clear();
        let next_expiry = member.machine.next_expiry_ms();
        let expires_at = member.machine.expires_at_ms();
        let expired = member.machine.is_expired(batch.time_ms);
        let dead_lettered = member.machine.has_dead_lettered();
        drop(member);
        if dead_lettered {
            self.start_dead_lettering();
        }
        if leader {
            for at in [next_expiry, expires_at].into_iter().flatten() {
                self.tick_at(at);
            }
            if expired {
                // Unused for its x-expires: the vhost deletes it (once:
                // the deletion names the queue's declaration).
                if let (Some(host), Some(queue)) = (self.host.upgrade(), self.this.upgrade()) {
                    host.expire(&(queue as Arc<dyn Queue>));
                }
            }
        }
        let unread = std::mem::take(&mut undelivered.unread);
        self.settle_undelivered(undelivered);
        if unread {
            self.read_parked();
        }
        if !dead_letters.is_empty() {
            let target = self.dead_letter_target();
            if let (Some(host), Some(target)) = (self.host.upgrade(), target) {
                host.dead_letter(&self.name, &target, dead_letters);
            }
        }
        encode(&replies)
    }

    /// Proposes a tick at log time `at_ms` (the head message's expiry),
    /// unless one is due by then already.
    fn tick_at(&self, at_ms: u64) {
        {
            let mut scheduled = lock(&self.tick_at);
            if scheduled.is_some_and(|scheduled| scheduled <= at_ms) {
                return;
            }
            *scheduled = Some(at_ms);
        }
        let queue = self.this.clone();
        let wait = Duration::from_millis(at_ms.saturating_sub(wall_ms()) + 1);
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let Some(queue) = queue.upgrade() else {
                return;
            };
            {
                let mut scheduled = lock(&queue.tick_at);
                if *scheduled == Some(at_ms) {
                    *scheduled = None;
                }
            }
            if !queue.is_deleted() {
                queue
                    .proposer
                    .submit(Item::Machine(Command::Tick), Waiter::Nobody);
            }
        });
    }

    /// Does what applying an entry asked of this member: deliveries to the
    /// consumers reading through it, and (on the leader only, so once)
    /// messages to dead-letter.
    fn act(
        &self,
        member: &mut Member,
        effects: Vec<Effect>,
        leader: bool,
        dead_letters: &mut Vec<DeadLetter>,
        undelivered: &mut Undelivered,
    ) {
        for effect in effects {
            match effect {
                Effect::Deliver {
                    consumer,
                    delivery,
                    message,
                } => {
                    // Delivered, on this member or another: the window
                    // keeps room for what is not. Should it come back,
                    // its body is read from the log.
                    let body = member.take_body(message.index);
                    let Some(local) = member.consumers.get_mut(&consumer) else {
                        // Cancelled here while the entry was on its way:
                        // what it was given goes back.
                        if member.retired.contains_key(&consumer) {
                            undelivered.returned.push((consumer, delivery));
                        }
                        continue;
                    };
                    let Some(body) = body else {
                        local.parked.push_back((
                            delivery,
                            Parked::Unread {
                                index: message.index,
                                delivery_count: message.delivery_count,
                            },
                        ));
                        undelivered.unread = true;
                        continue;
                    };
                    let entry = QueuedMessage {
                        offset: message_id(local.slot, delivery),
                        message: with_delivery_count(&body, message.delivery_count),
                        redelivered: message.delivery_count > 0,
                        segment: None,
                        expires_at_us: NEVER,
                    };
                    if local.parked.is_empty() && self.hand_over(&local.consumer, &entry) {
                        if local.consumer.no_ack {
                            undelivered.settled.push((consumer, delivery));
                        }
                    } else {
                        local.parked.push_back((delivery, Parked::Ready(entry)));
                    }
                }
                Effect::DeadLetter { reason, message } => {
                    self.counters.dropped.add(1);
                    if !leader || self.dead_letter_target().is_none() {
                        continue;
                    }
                    let body = member
                        .body(message.index)
                        .or_else(|| self.read_body(message.index));
                    if let Some(body) = body {
                        dead_letters.push(DeadLetter {
                            message: body,
                            reason: death_reason(reason),
                        });
                    }
                }
            }
        }
    }

    /// Offers a delivery to its consumer's channel.
    fn hand_over(&self, consumer: &Arc<Consumer>, entry: &QueuedMessage) -> bool {
        if !consumer.has_prefetch_room() {
            return false;
        }
        let handle = || self.arc() as Arc<dyn Queue>;
        let taken = consumer.sink.deliver(consumer, &handle, entry);
        if taken {
            self.counters.count_delivery(
                entry.message.body_size(),
                entry.redelivered,
                DeliveredBy::Consume {
                    no_ack: consumer.no_ack,
                },
            );
        }
        taken
    }

    /// Hands parked deliveries to the channels of `only` (all when None)
    /// while they have room.
    fn hand_parked(&self, only: Option<&[ConsumerId]>) {
        let mut undelivered = Undelivered::default();
        {
            let mut member = lock(&self.member);
            for (id, local) in &mut member.consumers {
                if only.is_some_and(|only| !only.contains(id)) {
                    continue;
                }
                while let Some((delivery, parked)) = local.parked.front() {
                    let Parked::Ready(entry) = parked else {
                        // Its body is on its way: the ones after it wait.
                        break;
                    };
                    if !self.hand_over(&local.consumer, entry) {
                        break;
                    }
                    if local.consumer.no_ack {
                        undelivered.settled.push((id.clone(), *delivery));
                    }
                    local.parked.pop_front();
                }
            }
        }
        self.settle_undelivered(undelivered);
    }

    fn start_dead_lettering(&self) {
        if !self.dead_lettering.swap(true, Ordering::AcqRel) {
            tokio::spawn(super::dead_lettering::run(self.arc()));
        }
    }

    /// The dead-lettering task found nothing to do: whether it stops (it
    /// goes on when something came meanwhile and no other task started).
    pub(super) fn stop_dead_lettering(&self) -> bool {
        self.dead_lettering.store(false, Ordering::Release);
        let more = lock(&self.member).machine.has_dead_lettered();
        !more || self.dead_lettering.swap(true, Ordering::AcqRel)
    }

    /// Deleted, or this member stopped: background work ends.
    pub(super) fn is_stopped(&self) -> bool {
        self.is_deleted()
            || self.proposer.is_stopped()
            || self.log.get().is_some_and(|log| log.is_stopped())
    }

    pub(super) fn leads(&self) -> bool {
        self.is_leader()
    }

    /// Up to `limit` messages waiting for at-least-once dead-lettering:
    /// why, their index, and their body when memory has it.
    pub(super) fn pending_dead_letters(
        &self,
        limit: usize,
    ) -> Vec<(DeadLetterReason, u64, Option<Arc<Message>>)> {
        let member = lock(&self.member);
        member
            .machine
            .dead_lettered(limit)
            .into_iter()
            .map(|(reason, message)| (reason, message.index, member.body(message.index)))
            .collect()
    }

    /// Reads bodies back from the log (blocking: off the runtime).
    pub(super) fn read_bodies(&self, indexes: &[u64]) -> Result<ReadBack, String> {
        let log = self
            .log
            .get()
            .ok_or_else(|| "the queue's log is not open".to_owned())?;
        read_bodies(log.as_ref(), indexes)
    }

    /// Routes dead letters to the dead-letter exchange; each target's word
    /// on its copy, or None when some reached no queue.
    pub(super) fn republish_dead_letters(
        &self,
        dead_letters: Vec<DeadLetter>,
    ) -> Option<Vec<crate::queue::PublishOutcome>> {
        let host = self.host.upgrade()?;
        let target = self.dead_letter_target()?;
        host.dead_letter_tracked(&self.name, &target, dead_letters)
    }

    /// Settles dead-lettered messages through the log.
    pub(super) async fn settle_dead_letters(&self, indexes: Vec<u64>) -> Result<(), String> {
        match self.request(Command::DeadLettered { indexes }).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(error),
            Err(_) => Err("the queue stopped".to_owned()),
        }
    }

    /// The body of the message at `index`, read back from the log now: for
    /// the rare paths (basic.get, dead-lettering) that cannot wait.
    fn read_body(&self, index: u64) -> Option<Arc<Message>> {
        match self.read_bodies(&[index]) {
            Ok((mut read, _)) => read.remove(&index),
            Err(error) => {
                tracing::error!(queue = %self.name, vhost = %self.vhost, index, %error, "could not read a message back from the quorum queue's log");
                None
            }
        }
    }

    /// Reads the bodies of parked deliveries back from the log, off the
    /// apply path and without the queue's lock, and hands them over: a
    /// consumer catching up on a deep queue does not hold up what is
    /// applied meanwhile (publishers' confirms). One reader at a time.
    fn read_parked(&self) {
        if self.reading.swap(true, Ordering::AcqRel) {
            return;
        }
        let queue = self.arc();
        tokio::spawn(async move {
            loop {
                let wanted = lock(&queue.member).unread(READ_BATCH_MESSAGES);
                if wanted.is_empty() {
                    queue.reading.store(false, Ordering::Release);
                    // Parked after the look and before the flag went down:
                    // nobody else started for them.
                    if lock(&queue.member).unread(1).is_empty()
                        || queue.reading.swap(true, Ordering::AcqRel)
                    {
                        return;
                    }
                    continue;
                }
                let reader = Arc::clone(&queue);
                let result = tokio::task::spawn_blocking(move || reader.read_bodies(&wanted)).await;
                match result {
                    Ok(Ok((read, missing))) => {
                        let lost = lock(&queue.member).fill_parked(&read, &missing);
                        if !lost.is_empty() {
                            tracing::error!(queue = %queue.name, vhost = %queue.vhost, messages = lost.len(), "messages whose entries the quorum queue's log no longer holds are dropped");
                            let mut by_consumer: HashMap<ConsumerId, Vec<DeliveryId>> =
                                HashMap::new();
                            for (consumer, delivery) in lost {
                                by_consumer.entry(consumer).or_default().push(delivery);
                            }
                            for (consumer, deliveries) in by_consumer {
                                let command = Command::Discard {
                                    consumer,
                                    deliveries,
                                };
                                queue
                                    .proposer
                                    .submit(Item::Machine(command), Waiter::Nobody);
                            }
                        }
                        queue.hand_parked(None);
                    }
                    Ok(Err(error)) => {
                        tracing::warn!(queue = %queue.name, vhost = %queue.vhost, %error, "could not read messages back from the quorum queue's log; retrying");
                        tokio::time::sleep(READ_RETRY_DELAY).await;
                    }
                    Err(_) => {
                        queue.reading.store(false, Ordering::Release);
                        return;
                    }
                }
                if queue.is_stopped() {
                    queue.reading.store(false, Ordering::Release);
                    return;
                }
            }
        });
    }

    /// Proposes what becomes of deliveries no channel will settle:
    /// deliveries to consumers that need no acks are settled once their
    /// channel took them (the machine gave them only the credit of
    /// [`UNLIMITED_CREDIT`]); deliveries to consumers cancelled meanwhile
    /// go back.
    fn settle_undelivered(&self, undelivered: Undelivered) {
        let group = |deliveries: Vec<(ConsumerId, u64)>| {
            let mut by_consumer: HashMap<ConsumerId, Vec<u64>> = HashMap::new();
            for (consumer, delivery) in deliveries {
                by_consumer.entry(consumer).or_default().push(delivery);
            }
            by_consumer
        };
        for (consumer, deliveries) in group(undelivered.settled) {
            let command = Command::Settle {
                consumer,
                deliveries,
            };
            self.proposer.submit(Item::Machine(command), Waiter::Nobody);
        }
        for (consumer, deliveries) in group(undelivered.returned) {
            let command = Command::Release {
                consumer,
                deliveries,
            };
            self.proposer.submit(Item::Machine(command), Waiter::Nobody);
        }
    }

    /// Proposes a settlement of deliveries by their ids.
    fn settle_ids(&self, messages: &[MessageId], settlement: Settlement) {
        let mut by_consumer: HashMap<ConsumerId, Vec<u64>> = HashMap::new();
        {
            let member = lock(&self.member);
            for id in messages {
                let (slot, delivery) = split_message_id(*id);
                if let Some(consumer) = member.slots.get(&slot) {
                    by_consumer
                        .entry(consumer.clone())
                        .or_default()
                        .push(delivery);
                }
            }
        }
        let settled: Vec<ConsumerId> = by_consumer.keys().cloned().collect();
        for (consumer, deliveries) in by_consumer {
            if settlement == Settlement::Ack {
                self.counters.acked.add(deliveries.len() as u64);
            }
            let command = match settlement {
                Settlement::Ack => Command::Settle {
                    consumer,
                    deliveries,
                },
                Settlement::Reject => Command::Discard {
                    consumer,
                    deliveries,
                },
                Settlement::Requeue => Command::Return {
                    consumer,
                    deliveries,
                },
            };
            self.proposer.submit(Item::Machine(command), Waiter::Nobody);
        }
        // The settled deliveries freed prefetch room: what waits here for
        // these consumers goes now, not a commit later.
        self.hand_parked(Some(&settled));
    }

    /// Proposes `command` and waits for its reply.
    fn request(&self, command: Command) -> oneshot::Receiver<Result<Reply, String>> {
        let (sender, receiver) = oneshot::channel();
        self.proposer
            .submit(Item::Machine(command), Waiter::Reply(sender));
        receiver
    }

    fn publish_message(&self, message: &Arc<Message>) -> PublishOutcome {
        if self.is_deleted() {
            return PublishOutcome::Rejected;
        }
        self.counters.count_publish(message.body_size());
        let ttl_ms = message
            .properties
            .expiration()
            .and_then(|expiration| std::str::from_utf8(expiration).ok())
            .and_then(|text| parse_expiration(text).ok());
        let confirm = Arc::new(ForwardedConfirm::default());
        self.proposer.publish(
            encode_message(message),
            ttl_ms,
            Waiter::Confirm(Arc::clone(&confirm)),
        );
        PublishOutcome::Pending(PendingSafety::Forwarded(confirm))
    }

    fn register(
        &self,
        consumer: &Arc<Consumer>,
        announce: Option<Box<dyn FnOnce() + Send>>,
    ) -> AmqpResult<ConsumerId> {
        if self.is_deleted() {
            return Err(self.not_found());
        }
        let id = ConsumerId {
            connection: consumer.connection_id,
            channel: consumer.channel_id,
            tag: consumer.tag.to_string(),
        };
        let mut member = lock(&self.member);
        let exclusive_in_use = member
            .consumers
            .values()
            .any(|local| local.consumer.exclusive)
            || (consumer.exclusive && member.machine.stats().consumers > 0);
        if exclusive_in_use {
            return Err(AmqpError::access_refused(format!(
                "queue '{}' in vhost '{}' in exclusive use",
                self.name, self.vhost
            )));
        }
        let slot = member.allocate_slot(&id);
        member.retired.remove(&id);
        member.consumers.insert(
            id.clone(),
            LocalConsumer {
                consumer: Arc::clone(consumer),
                slot,
                parked: std::collections::VecDeque::new(),
                announce,
                checked_out: false,
            },
        );
        Ok(id)
    }

    fn checkout(
        &self,
        id: ConsumerId,
        consumer: &Consumer,
    ) -> oneshot::Receiver<Result<Reply, String>> {
        self.request(Command::Checkout {
            consumer: id,
            spec: ConsumerSpec {
                prefetch: machine_credit(consumer),
                // Settled by this member once its channel takes it, so
                // the machine's credit bounds what waits here.
                no_ack: false,
                priority: consumer.priority,
            },
        })
    }
}

fn failed(error: String) -> AmqpError {
    AmqpError::new(
        ReplyCode::InternalError,
        format!("quorum queue operation failed: {error}"),
    )
}

impl ForwardHome for QuorumQueue {
    fn is_up(&self) -> bool {
        !self.is_deleted()
    }

    fn publish(&self, message: &Arc<Message>, _targets: Vec<QueueKey>) -> PublishOutcome {
        self.publish_message(message)
    }

    fn is_congested(&self) -> bool {
        self.proposer.is_full()
    }

    fn uncongested(&self) -> tokio::sync::futures::Notified<'_> {
        self.proposer.drained.notified()
    }

    fn consume(
        &self,
        _queue: Arc<dyn Queue>,
        _key: QueueKey,
        consumer: Arc<Consumer>,
        announce: Box<dyn FnOnce() + Send>,
    ) -> RemoteReply<()> {
        let id = match self.register(&consumer, Some(announce)) {
            Ok(id) => id,
            Err(error) => return Box::pin(std::future::ready(Err(error))),
        };
        let checked_out = self.checkout(id.clone(), &consumer);
        let queue = self.arc();
        Box::pin(async move {
            let error = match checked_out.await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(error)) => error,
                Err(_) => "the queue stopped".to_owned(),
            };
            lock(&queue.member).consumers.remove(&id);
            Err(failed(error))
        })
    }

    fn cancel(
        &self,
        _key: &QueueKey,
        connection_id: ConnectionId,
        channel_id: u16,
        tag: &str,
    ) -> Option<Arc<Consumer>> {
        self.remove_consumer(connection_id, channel_id, tag)
            .map(|removed| removed.consumer)
    }

    fn forget_queue(&self, _key: &QueueKey) -> Vec<Arc<Consumer>> {
        lock(&self.member)
            .consumers
            .drain()
            .map(|(_, local)| local.consumer)
            .collect()
    }

    fn has_consumer_on(&self, _key: &QueueKey, connection_id: ConnectionId) -> bool {
        Queue::has_consumer_on(self, connection_id)
    }

    fn dispatch(&self, _key: &QueueKey) {
        Queue::dispatch(self);
    }

    fn settle(&self, _key: &QueueKey, settlement: Settlement, messages: &[MessageId]) {
        self.settle_ids(messages, settlement);
    }

    fn consumers_gone(&self, _key: &QueueKey, gone: &[ConsumerKey]) {
        Queue::consumers_gone(self, gone);
    }

    fn get(&self, _key: QueueKey, no_ack: bool) -> RemoteReply<Option<(QueuedMessage, u32)>> {
        let holder = lock(&self.member).slots[&GET_SLOT].clone();
        let reply = self.request(Command::Dequeue {
            consumer: holder,
            settled: no_ack,
        });
        let queue = self.arc();
        Box::pin(async move {
            match reply.await {
                Ok(Ok(Reply::Dequeued(None))) => Ok(None),
                Ok(Ok(Reply::Dequeued(Some((delivery, message, remaining))))) => {
                    let body = lock(&queue.member)
                        .take_get(delivery)
                        .ok_or_else(|| failed("the message was not kept".to_owned()))?;
                    queue.counters.count_delivery(
                        body.body_size(),
                        message.delivery_count > 0,
                        DeliveredBy::Get { no_ack },
                    );
                    Ok(Some((
                        QueuedMessage {
                            offset: message_id(GET_SLOT, delivery),
                            message: body,
                            redelivered: message.delivery_count > 0,
                            segment: None,
                            expires_at_us: NEVER,
                        },
                        u32::try_from(remaining).unwrap_or(u32::MAX),
                    )))
                }
                Ok(Ok(other)) => Err(failed(format!("unexpected reply {other:?}"))),
                Ok(Err(error)) => Err(failed(error)),
                Err(_) => Err(queue.not_found()),
            }
        })
    }

    fn purge(&self, _key: QueueKey) -> RemoteReply<u32> {
        let reply = self.request(Command::Purge);
        Box::pin(async move {
            match reply.await {
                Ok(Ok(Reply::Purged(count))) => Ok(u32::try_from(count).unwrap_or(u32::MAX)),
                Ok(Ok(other)) => Err(failed(format!("unexpected reply {other:?}"))),
                Ok(Err(error)) => Err(failed(error)),
                Err(_) => Err(failed("the queue stopped".to_owned())),
            }
        })
    }

    fn stats(&self, _key: QueueKey) -> RemoteReply<QueueStats> {
        Box::pin(std::future::ready(Ok(Queue::stats(self))))
    }
}

impl Queue for QuorumQueue {
    fn name(&self) -> &Arc<str> {
        &self.name
    }

    fn vhost_name(&self) -> &Arc<str> {
        &self.vhost
    }

    fn queue_type(&self) -> QueueType {
        QueueType::Quorum
    }

    fn options(&self) -> &QueueOptions {
        &self.options
    }

    fn store_id(&self) -> Option<&str> {
        Some(&self.store_id)
    }

    fn forwarded(&self) -> Option<(Arc<dyn ForwardHome>, QueueKey)> {
        Some((self.arc() as Arc<dyn ForwardHome>, self.key.clone()))
    }

    fn leader(&self) -> Option<String> {
        QuorumQueue::leader(self)
    }

    fn publish(&self, message: Arc<Message>) -> PublishOutcome {
        self.publish_message(&message)
    }

    /// Hands parked deliveries to the channels that have room again.
    fn dispatch(&self) {
        self.hand_parked(None);
    }

    /// Subscribes at once (consume-ok now) for callers that cannot wait:
    /// deliveries follow once the checkout is committed.
    fn add_consumer(&self, consumer: Arc<Consumer>, announce: &mut dyn FnMut()) -> AmqpResult<()> {
        let id = self.register(&consumer, None)?;
        announce();
        drop(self.checkout(id, &consumer));
        Ok(())
    }

    fn remove_consumer(
        &self,
        connection_id: ConnectionId,
        channel_id: u16,
        tag: &str,
    ) -> Option<ConsumerRemoved> {
        let id = ConsumerId {
            connection: connection_id,
            channel: channel_id,
            tag: tag.to_owned(),
        };
        let local = {
            let mut member = lock(&self.member);
            let local = member.consumers.remove(&id)?;
            member.retired.insert(id.clone(), local.slot);
            local
        };
        // What its channel never got goes back first, then it stops.
        let parked: Vec<DeliveryId> = local.parked.iter().map(|(delivery, _)| *delivery).collect();
        if !parked.is_empty() {
            self.proposer.submit(
                Item::Machine(Command::Release {
                    consumer: id.clone(),
                    deliveries: parked,
                }),
                Waiter::Nobody,
            );
        }
        self.proposer.submit(
            Item::Machine(Command::Cancel { consumer: id }),
            Waiter::Nobody,
        );
        Some(ConsumerRemoved {
            consumer: local.consumer,
            queue_now_unused: false,
            active_consumer_changed: false,
        })
    }

    fn active_consumer_tag(&self) -> Option<Arc<str>> {
        let member = lock(&self.member);
        if !member.machine.config().single_active_consumer {
            return None;
        }
        member
            .machine
            .active_consumer()
            .map(|consumer| Arc::from(consumer.tag.as_str()))
    }

    fn has_consumer_on(&self, connection_id: ConnectionId) -> bool {
        lock(&self.member)
            .consumers
            .keys()
            .any(|consumer| consumer.connection == connection_id)
    }

    fn settle(&self, messages: &[MessageId]) {
        self.settle_ids(messages, Settlement::Ack);
    }

    fn reject(&self, messages: &[MessageId]) {
        self.settle_ids(messages, Settlement::Reject);
    }

    fn requeue(&self, messages: &[MessageId]) {
        self.settle_ids(messages, Settlement::Requeue);
    }

    /// Reached only through [`Queue::forwarded`]'s asynchronous path.
    fn get(&self, _no_ack: bool) -> Option<(QueuedMessage, u32)> {
        None
    }

    fn purge(&self) -> u32 {
        drop(self.request(Command::Purge));
        0
    }

    fn delete(&self) -> (Vec<Arc<Consumer>>, u32) {
        self.deleted.store(true, Ordering::Release);
        self.proposer.stop();
        if let Some(log) = self.log.get() {
            log.stop(true);
        }
        let mut member = lock(&self.member);
        let ready = member.machine.stats().messages_ready;
        let consumers = member
            .consumers
            .drain()
            .map(|(_, local)| local.consumer)
            .collect();
        member.bodies.clear();
        (consumers, u32::try_from(ready).unwrap_or(u32::MAX))
    }

    /// This node left the members: the member stops and erases its log as
    /// on delete. Its consumers (this node's channels, and peers' that
    /// read through it) hear basic.cancel, and since this member can no
    /// longer propose, `successor` asks the members that stay to return
    /// what they held: the consumers' channels keep their unacked
    /// messages, whose settlements now reach no member, and the messages
    /// go to other consumers, marked redelivered.
    fn retire(&self, successor: &Arc<dyn Queue>) -> (Vec<Arc<Consumer>>, u32) {
        let gone: Vec<ConsumerKey> = lock(&self.member)
            .consumers
            .keys()
            .map(|id| ConsumerKey {
                connection_id: id.connection,
                channel_id: id.channel,
                tag: Arc::from(id.tag.as_str()),
            })
            .collect();
        let deleted = self.delete();
        if !gone.is_empty() {
            tracing::info!(queue = %self.name, vhost = %self.vhost, consumers = gone.len(), "this node left the quorum queue's members: its consumers are cancelled and what they held goes back");
            successor.consumers_gone(&gone);
        }
        deleted
    }

    fn consumers_gone(&self, gone: &[ConsumerKey]) {
        for consumer in gone {
            self.proposer.submit(
                Item::Machine(Command::ConsumerDown {
                    consumer: ConsumerId {
                        connection: consumer.connection_id,
                        channel: consumer.channel_id,
                        tag: consumer.tag.to_string(),
                    },
                }),
                Waiter::Nobody,
            );
        }
    }

    fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    fn stats(&self) -> QueueStats {
        let stats = lock(&self.member).machine.stats();
        QueueStats {
            messages_ready: u32::try_from(stats.messages_ready).unwrap_or(u32::MAX),
            messages_paged: 0,
            messages_unacknowledged: stats.messages_unacknowledged,
            ready_bytes: stats.ready_bytes,
            consumers: stats.consumers,
        }
    }

    fn counts(&self) -> MessageCounts {
        self.counters.counts()
    }

    fn count_get_empty(&self) {
        self.counters.get_empty.add(1);
    }

    /// Redeclared: its `x-expires` countdown starts again, on every
    /// member.
    fn touch(&self) {
        if lock(&self.member).machine.config().expires_ms.is_some() {
            self.proposer
                .submit(Item::Machine(Command::Touch), Waiter::Nobody);
        }
    }

    fn is_unused_for_expiry(&self) -> bool {
        lock(&self.member).machine.is_expired(wall_ms())
    }

    /// A queue with `x-expires` that nobody uses is deleted even if
    /// nothing else happens to it: a tick comes due on its leader.
    fn start_timers(&self) {
        if lock(&self.member).machine.config().expires_ms.is_some() {
            self.proposer
                .submit(Item::Machine(Command::Tick), Waiter::Nobody);
        }
    }

    fn apply_policy(&self, effective_arguments: &FieldTable, generation: u64) {
        if self.is_deleted() {
            return;
        }
        *self
            .dead_letter
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) =
            DeadLetterTarget::from_arguments(effective_arguments);
        self.propose_config(queue_config(effective_arguments), generation);
    }

    fn node_down(&self, node_number: u16) {
        self.proposer.submit(
            Item::Machine(Command::NodeDown { node: node_number }),
            Waiter::Nobody,
        );
    }

    fn is_congested(&self) -> bool {
        self.proposer.is_full()
    }

    fn uncongested(&self) -> tokio::sync::futures::Notified<'_> {
        self.proposer.drained.notified()
    }
}

impl Drop for QuorumQueue {
    fn drop(&mut self) {
        self.proposer.stop();
        if let Some(log) = self.log.get() {
            if !self.deleted.load(Ordering::Acquire) {
                log.stop(false);
            }
        }
    }
}
