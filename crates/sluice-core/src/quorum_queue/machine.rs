//! A quorum queue's state: a pure, deterministic machine that every member
//! applies to the same log in the same order, as RabbitMQ's `rabbit_fifo`.
//! It holds no bodies (a message is the index of the entry that enqueued
//! it) and does no I/O; time is the log's, carried in each entry.
//!
//! Messages wait in `ready` (index order) or in `returned` (messages that
//! went back after a delivery, served first, in the order they came back).
//! A consumer holds what it was given until it settles, returns or
//! discards it, within its prefetch. Consumers are served by priority, and
//! round-robin within one priority; with single active consumer, only the
//! earliest consumer still subscribed is served.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::command::{
    Command, ConsumerId, ConsumerSpec, DeadLetterReason, DeliveryId, Effect, MessageRef, Overflow,
    QueueConfig, Reply,
};

/// Where a connection id keeps the number of its node (see
/// `Broker::next_connection_id`).
pub const NODE_SHIFT: u32 = 48;

/// What becomes of a settled message.
enum Fate {
    /// Acked (or never to come back): gone.
    Gone,
    /// Back among the ready messages.
    Requeued,
    /// Out, to be dead-lettered for a reason.
    Dropped(DeadLetterReason, MessageRef),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct ConsumerState {
    spec: ConsumerSpec,
    checked_out: BTreeMap<DeliveryId, MessageRef>,
    next_delivery: DeliveryId,
    cancelled: bool,
    /// When it subscribed (the order single active consumer goes by).
    joined: u64,
    /// When it was last given a message (round-robin goes by it).
    last_served: u64,
}

impl ConsumerState {
    fn has_credit(&self) -> bool {
        !self.cancelled
            && (self.spec.no_ack
                || self.spec.prefetch == 0
                || self.checked_out.len() < self.spec.prefetch as usize)
    }
}

/// Counts at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MachineStats {
    pub messages_ready: u64,
    pub ready_bytes: u64,
    pub messages_unacknowledged: u64,
    pub consumers: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueMachine {
    config: QueueConfig,
    ready: VecDeque<MessageRef>,
    returned: VecDeque<MessageRef>,
    ready_bytes: u64,
    #[serde(with = "as_pairs")]
    consumers: BTreeMap<ConsumerId, ConsumerState>,
    /// The last sequence number taken from each publisher that numbers
    /// its messages.
    publishers: BTreeMap<u64, u64>,
    /// Indexes of the messages still in the queue (ready, returned or
    /// held): the oldest is the release cursor.
    live: BTreeSet<u64>,
    /// Counts consumers subscribing and messages handed out, for the
    /// orders above.
    clock: u64,
    /// Delivery ids of basic.get, unique for the queue's life: a getter's
    /// holder comes and goes, and a settlement proposed twice must not
    /// match a later get.
    #[serde(default)]
    next_dequeue: DeliveryId,
    /// Indexes that left the queue since [`QueueMachine::take_released`]
    /// was last asked: the member drops their bodies.
    #[serde(skip)]
    released: Vec<u64>,
    last_index: u64,
    now_ms: u64,
    /// When the queue was last used (log time): subscribed to, read with
    /// basic.get, redeclared, or left by its last consumer.
    #[serde(default)]
    used_at_ms: u64,
    /// At-least-once dead-lettering: messages dead-lettered and not yet
    /// safe in their targets, oldest first, with why.
    #[serde(default)]
    dead_lettered: VecDeque<(DeadLetterReason, MessageRef)>,
    #[serde(default)]
    dead_lettered_bytes: u64,
    /// The policy generation `config` came with (see [`Command::SetConfig`]);
    /// 0 for the rules of the queue's declaration.
    #[serde(default)]
    config_generation: u64,
}

impl QueueMachine {
    pub fn new(config: QueueConfig) -> Self {
        QueueMachine {
            config,
            ready: VecDeque::new(),
            returned: VecDeque::new(),
            ready_bytes: 0,
            consumers: BTreeMap::new(),
            publishers: BTreeMap::new(),
            live: BTreeSet::new(),
            clock: 0,
            next_dequeue: 0,
            released: Vec::new(),
            last_index: 0,
            now_ms: 0,
            used_at_ms: 0,
            dead_lettered: VecDeque::new(),
            dead_lettered_bytes: 0,
            config_generation: 0,
        }
    }

    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// The rules changed (a policy): they apply from here on, unless
    /// rules of a later policy change came first. What the new rules say
    /// of the messages already in (a lower limit, an expired head) follows
    /// at the end of the entry, as after any command.
    pub fn set_config(&mut self, config: QueueConfig, generation: u64) {
        if generation > self.config_generation {
            self.config = config;
            self.config_generation = generation;
        }
    }

    /// The policy generation of the rules in force.
    pub fn config_generation(&self) -> u64 {
        self.config_generation
    }

    pub fn stats(&self) -> MachineStats {
        MachineStats {
            messages_ready: (self.ready.len() + self.returned.len()) as u64,
            ready_bytes: self.ready_bytes,
            messages_unacknowledged: self
                .consumers
                .values()
                .map(|consumer| consumer.checked_out.len() as u64)
                .sum(),
            consumers: self
                .consumers
                .values()
                .filter(|consumer| !consumer.cancelled)
                .count() as u32,
        }
    }

    /// The oldest log index still needed: every entry before it may be
    /// dropped from the log (its message is gone).
    pub fn release_cursor(&self) -> u64 {
        self.oldest_live().unwrap_or(self.last_index + 1)
    }

    /// Up to `limit` messages waiting for at-least-once dead-lettering,
    /// oldest first.
    pub fn dead_lettered(&self, limit: usize) -> Vec<(DeadLetterReason, MessageRef)> {
        self.dead_lettered.iter().take(limit).copied().collect()
    }

    pub fn has_dead_lettered(&self) -> bool {
        !self.dead_lettered.is_empty()
    }

    /// The index of the oldest message still in the queue.
    pub fn oldest_live(&self) -> Option<u64> {
        self.live.first().copied()
    }

    /// Messages still in the queue: ready, returned or held.
    pub fn live_count(&self) -> u64 {
        self.live.len() as u64
    }

    /// When the message at the head expires (log time), if it does: the
    /// leader proposes a tick then, so that an idle queue's messages
    /// expire (and are dead-lettered) on time.
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.peek_next().and_then(|head| head.expires_at_ms)
    }

    /// When the queue, unused since, reaches its `x-expires` (log time);
    /// None while it has consumers or has no `x-expires`.
    pub fn expires_at_ms(&self) -> Option<u64> {
        let expires = self.config.expires_ms?;
        let subscribed = self.consumers.values().any(|consumer| !consumer.cancelled);
        (!subscribed).then(|| self.used_at_ms.saturating_add(expires))
    }

    /// Whether the queue went unused for its `x-expires` by log time
    /// `now_ms`.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms().is_some_and(|at| at <= now_ms)
    }

    /// Whether the message enqueued at `index` is still in the queue.
    pub fn is_live(&self, index: u64) -> bool {
        self.live.contains(&index)
    }

    /// Whether `consumer` is still known: subscribed, or cancelled and
    /// holding deliveries.
    pub fn has_consumer(&self, consumer: &ConsumerId) -> bool {
        self.consumers.contains_key(consumer)
    }

    /// The indexes of the messages that left the queue since the last call.
    pub fn take_released(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.released)
    }

    /// A message leaves the queue for good.
    fn release(&mut self, index: u64) {
        if self.live.remove(&index) {
            self.released.push(index);
        }
    }

    /// The consumer that gets messages in a single-active-consumer queue.
    pub fn active_consumer(&self) -> Option<&ConsumerId> {
        self.consumers
            .iter()
            .filter(|(_, consumer)| !consumer.cancelled)
            .min_by_key(|(_, consumer)| consumer.joined)
            .map(|(id, _)| id)
    }

    /// Applies the entry at `index`, written at log time `time_ms`.
    pub fn apply(&mut self, index: u64, time_ms: u64, command: Command) -> (Reply, Vec<Effect>) {
        self.last_index = self.last_index.max(index);
        self.now_ms = self.now_ms.max(time_ms);
        if self.used_at_ms == 0 {
            // Its first entry: the x-expires countdown starts at creation.
            self.used_at_ms = self.now_ms;
        }
        let mut effects = Vec::new();
        // Subscribing, cancelling and basic.get use the queue (a cancel
        // starts the countdown from the last consumer's leaving).
        let uses = matches!(
            command,
            Command::Checkout { .. } | Command::Cancel { .. } | Command::Dequeue { .. }
        );
        let reply = match command {
            Command::Enqueue {
                publisher,
                size,
                ttl_ms,
            } => self.enqueue(index, publisher, size, ttl_ms),
            Command::Checkout { consumer, spec } => {
                self.clock += 1;
                let joined = self.clock;
                let state = self
                    .consumers
                    .entry(consumer)
                    .or_insert_with(|| ConsumerState {
                        spec: spec.clone(),
                        checked_out: BTreeMap::new(),
                        next_delivery: 0,
                        cancelled: false,
                        joined,
                        last_served: 0,
                    });
                state.spec = spec;
                state.cancelled = false;
                Reply::Ok
            }
            Command::Cancel { consumer } => match self.consumers.get_mut(&consumer) {
                Some(state) => {
                    state.cancelled = true;
                    if state.checked_out.is_empty() {
                        self.consumers.remove(&consumer);
                    }
                    Reply::Ok
                }
                None => Reply::Unknown,
            },
            Command::Settle {
                consumer,
                deliveries,
            } => self.settle(&consumer, &deliveries, |_, _| Fate::Gone, &mut effects),
            Command::Return {
                consumer,
                deliveries,
            } => self.settle(
                &consumer,
                &deliveries,
                |machine, message| machine.put_back(message),
                &mut effects,
            ),
            Command::Release {
                consumer,
                deliveries,
            } => self.settle(
                &consumer,
                &deliveries,
                |machine, message| {
                    machine.ready_bytes += u64::from(message.size);
                    machine.returned.push_back(message);
                    Fate::Requeued
                },
                &mut effects,
            ),
            Command::Discard {
                consumer,
                deliveries,
            } => self.settle(
                &consumer,
                &deliveries,
                |_, message| Fate::Dropped(DeadLetterReason::Rejected, message),
                &mut effects,
            ),
            Command::ConnectionDown { connection } => {
                self.remove_consumers(|consumer| consumer.connection == connection, &mut effects);
                self.publishers
                    .retain(|publisher, _| publisher >> 16 != connection);
                Reply::Ok
            }
            Command::ConsumerDown { consumer } => {
                self.remove_consumers(|known| *known == consumer, &mut effects);
                Reply::Ok
            }
            Command::NodeDown { node } => {
                self.remove_consumers(
                    |consumer| consumer.connection >> NODE_SHIFT == u64::from(node),
                    &mut effects,
                );
                Reply::Ok
            }
            Command::Dequeue { consumer, settled } => self.dequeue(consumer, settled, &mut effects),
            Command::Purge => {
                let purged = (self.ready.len() + self.returned.len()) as u64;
                let mut purged_messages = std::mem::take(&mut self.ready);
                purged_messages.extend(self.returned.drain(..));
                for message in purged_messages {
                    self.release(message.index);
                }
                self.ready_bytes = 0;
                Reply::Purged(purged)
            }
            Command::Tick => Reply::Ok,
            Command::DeadLettered { indexes } => {
                let indexes: HashSet<u64> = indexes.into_iter().collect();
                let mut safe = Vec::new();
                self.dead_lettered.retain(|(_, message)| {
                    let done = indexes.contains(&message.index);
                    if done {
                        safe.push(*message);
                    }
                    !done
                });
                for message in safe {
                    self.dead_lettered_bytes -= u64::from(message.size);
                    self.release(message.index);
                }
                Reply::Ok
            }
            Command::Touch => {
                self.used_at_ms = self.now_ms;
                Reply::Ok
            }
            Command::SetConfig { config, generation } => {
                self.set_config(config, generation);
                Reply::Ok
            }
        };
        if uses {
            self.used_at_ms = self.now_ms;
        }
        self.expire_head(&mut effects);
        self.serve(&mut effects);
        self.drop_over_limit(&mut effects);
        (reply, effects)
    }

    /// Removes the consumers `gone` picks; what they held comes back.
    fn remove_consumers(&mut self, gone: impl Fn(&ConsumerId) -> bool, effects: &mut Vec<Effect>) {
        let gone: Vec<ConsumerId> = self
            .consumers
            .keys()
            .filter(|id| gone(id))
            .cloned()
            .collect();
        for consumer in gone {
            if let Some(state) = self.consumers.remove(&consumer) {
                for message in state.checked_out.into_values() {
                    if let Fate::Dropped(reason, message) = self.put_back(message) {
                        self.drop_message(reason, message, effects);
                    }
                }
            }
        }
    }

    /// basic.get: the head (expired heads go first), held by `consumer`,
    /// a holder that is never served, unless `settled`.
    fn dequeue(&mut self, consumer: ConsumerId, settled: bool, effects: &mut Vec<Effect>) -> Reply {
        self.expire_head(effects);
        let Some(message) = self.take_next() else {
            return Reply::Dequeued(None);
        };
        let remaining = (self.ready.len() + self.returned.len()) as u64;
        let delivery = self.next_dequeue;
        self.next_dequeue += 1;
        if settled {
            self.release(message.index);
        } else {
            self.clock += 1;
            let joined = self.clock;
            let holder = self
                .consumers
                .entry(consumer)
                .or_insert_with(|| ConsumerState {
                    spec: ConsumerSpec {
                        prefetch: 0,
                        no_ack: false,
                        priority: 0,
                    },
                    checked_out: BTreeMap::new(),
                    next_delivery: 0,
                    cancelled: true,
                    joined,
                    last_served: 0,
                });
            holder.checked_out.insert(delivery, message);
        }
        Reply::Dequeued(Some((delivery, message, remaining)))
    }

    /// `drop-head`: past a length limit, the oldest ready messages go
    /// (after consumers took what they could), whether the queue grew by
    /// an enqueue or by messages coming back.
    fn drop_over_limit(&mut self, effects: &mut Vec<Effect>) {
        if self.config.overflow != Overflow::DropHead {
            return;
        }
        while self.over_limit_with(0, 0) {
            let Some(head) = self.take_next() else {
                break;
            };
            self.drop_message(DeadLetterReason::MaxLen, head, effects);
        }
    }

    fn enqueue(
        &mut self,
        index: u64,
        publisher: Option<(u64, u64)>,
        size: u32,
        ttl_ms: Option<u64>,
    ) -> Reply {
        if let Some((publisher, sequence)) = publisher {
            let last = self.publishers.entry(publisher).or_insert(0);
            if sequence <= *last {
                return Reply::Enqueued;
            }
            *last = sequence;
        }
        if self.config.overflow == Overflow::RejectPublish && self.over_limit_with(1, size) {
            return Reply::Rejected;
        }
        let ttl = match (self.config.message_ttl_ms, ttl_ms) {
            (Some(queue), Some(message)) => Some(queue.min(message)),
            (queue, message) => queue.or(message),
        };
        let message = MessageRef {
            index,
            size,
            expires_at_ms: ttl.map(|ttl| self.now_ms.saturating_add(ttl)),
            delivery_count: 0,
        };
        self.live.insert(index);
        self.ready_bytes += u64::from(size);
        self.ready.push_back(message);
        Reply::Enqueued
    }

    /// Whether `extra` more messages of `bytes` would put the ready
    /// messages (and those waiting to be dead-lettered, as in RabbitMQ)
    /// past a limit.
    fn over_limit_with(&self, extra: u64, bytes: u32) -> bool {
        let count =
            (self.ready.len() + self.returned.len() + self.dead_lettered.len()) as u64 + extra;
        let size = self.ready_bytes + self.dead_lettered_bytes + u64::from(bytes);
        self.config.max_length.is_some_and(|max| count > max)
            || self.config.max_length_bytes.is_some_and(|max| size > max)
    }

    /// Settles `deliveries` of `consumer`; `fate` says what becomes of each
    /// message.
    fn settle(
        &mut self,
        consumer: &ConsumerId,
        deliveries: &[DeliveryId],
        fate: impl Fn(&mut Self, MessageRef) -> Fate,
        effects: &mut Vec<Effect>,
    ) -> Reply {
        let Some(state) = self.consumers.get_mut(consumer) else {
            return Reply::Unknown;
        };
        let mut taken = Vec::with_capacity(deliveries.len());
        let mut unknown = false;
        for delivery in deliveries {
            match state.checked_out.remove(delivery) {
                Some(message) => taken.push(message),
                None => unknown = true,
            }
        }
        if state.cancelled && state.checked_out.is_empty() {
            self.consumers.remove(consumer);
        }
        for message in taken {
            match fate(self, message) {
                Fate::Gone => {
                    self.release(message.index);
                }
                Fate::Requeued => {}
                Fate::Dropped(reason, message) => self.drop_message(reason, message, effects),
            }
        }
        if unknown {
            Reply::Unknown
        } else {
            Reply::Ok
        }
    }

    /// A delivered message comes back: counted, and queued again unless it
    /// passed the delivery limit.
    fn put_back(&mut self, mut message: MessageRef) -> Fate {
        message.delivery_count = message.delivery_count.saturating_add(1);
        if self
            .config
            .delivery_limit
            .is_some_and(|limit| message.delivery_count > limit)
        {
            return Fate::Dropped(DeadLetterReason::DeliveryLimit, message);
        }
        self.ready_bytes += u64::from(message.size);
        self.returned.push_back(message);
        Fate::Requeued
    }

    /// A message leaves the queue other than by an ack: at once (the
    /// member dead-letters it at most once), or, with at-least-once
    /// dead-lettering, once its targets have it
    /// ([`Command::DeadLettered`]).
    fn drop_message(
        &mut self,
        reason: DeadLetterReason,
        message: MessageRef,
        effects: &mut Vec<Effect>,
    ) {
        if self.config.dead_letter_at_least_once {
            self.dead_lettered_bytes += u64::from(message.size);
            self.dead_lettered.push_back((reason, message));
            return;
        }
        self.release(message.index);
        effects.push(Effect::DeadLetter { reason, message });
    }

    /// The next message to deliver: returned ones first.
    fn take_next(&mut self) -> Option<MessageRef> {
        let message = self
            .returned
            .pop_front()
            .or_else(|| self.ready.pop_front())?;
        self.ready_bytes -= u64::from(message.size);
        Some(message)
    }

    fn peek_next(&self) -> Option<&MessageRef> {
        self.returned.front().or_else(|| self.ready.front())
    }

    /// Expired messages at the head leave, as in RabbitMQ: a message is
    /// judged when it reaches the head.
    fn expire_head(&mut self, effects: &mut Vec<Effect>) {
        while let Some(head) = self.peek_next() {
            if head.expires_at_ms.is_none_or(|at| at > self.now_ms) {
                break;
            }
            let head = self.take_next().expect("peeked");
            self.drop_message(DeadLetterReason::Expired, head, effects);
        }
    }

    /// The consumer to give the next message to, if any can take one.
    fn next_consumer(&self) -> Option<ConsumerId> {
        if self.config.single_active_consumer {
            let active = self.active_consumer()?;
            return self.consumers[active].has_credit().then(|| active.clone());
        }
        self.consumers
            .iter()
            .filter(|(_, consumer)| consumer.has_credit())
            .min_by_key(|(_, consumer)| {
                (
                    std::cmp::Reverse(consumer.spec.priority),
                    consumer.last_served,
                    consumer.joined,
                )
            })
            .map(|(id, _)| id.clone())
    }

    /// Hands ready messages to consumers with credit.
    fn serve(&mut self, effects: &mut Vec<Effect>) {
        while self.peek_next().is_some() {
            let Some(id) = self.next_consumer() else {
                return;
            };
            let message = self.take_next().expect("peeked");
            self.clock += 1;
            let clock = self.clock;
            let state = self.consumers.get_mut(&id).expect("chosen above");
            let delivery = state.next_delivery;
            state.next_delivery += 1;
            state.last_served = clock;
            if state.spec.no_ack {
                self.release(message.index);
            } else {
                state.checked_out.insert(delivery, message);
            }
            effects.push(Effect::Deliver {
                consumer: id,
                delivery,
                message,
            });
        }
    }
}

/// A map whose keys are not strings, serialized as a list of pairs (JSON
/// and most text formats allow only string keys).
mod as_pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<K: Serialize, V: Serialize, S: Serializer>(
        map: &BTreeMap<K, V>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(map.iter())
    }

    pub fn deserialize<'de, K, V, D>(deserializer: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        Ok(Vec::<(K, V)>::deserialize(deserializer)?
            .into_iter()
            .collect())
    }
}
