//! What one member holds of its quorum queue: the queue machine as the log
//! left it, a window of the bodies of messages not delivered yet (the log
//! holds them all), and the consumers that read through this node, with
//! the deliveries their channels had no room for yet.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use amq_protocol::types::{AMQPValue, FieldTable};
use serde::{Deserialize, Serialize};
use sluice_wire::content::RawProperties;

use super::body_window::BodyWindow;
use super::command::{ConsumerId, DeliveryId};
use super::entry::ITEM_BITS;
use super::machine::QueueMachine;
use crate::message::{Message, QueuedMessage};
use crate::queue::{Consumer, MessageId};

/// A delivery's [`MessageId`] holds its consumer's slot above these bits
/// and the machine's delivery id below them.
pub const DELIVERY_BITS: u32 = 40;
const DELIVERY_MASK: u64 = (1 << DELIVERY_BITS) - 1;
/// The slot of this member's basic.get holder.
pub const GET_SLOT: u32 = 0;
/// Recent basic.get results kept for their proposer to pick up.
const RECENT_GETS_MAX: usize = 256;

/// Messages enqueued between two states kept for a snapshot, at least: a
/// state is kept once as many messages came as it holds, so that keeping
/// states costs the queue a constant share of its work however deep it is
/// (RabbitMQ's release cursor interval grows the same way).
const KEEP_FOR_SNAPSHOT_EVERY_MIN: u64 = 4096;

pub fn message_id(slot: u32, delivery: DeliveryId) -> MessageId {
    (u64::from(slot) << DELIVERY_BITS) | (delivery & DELIVERY_MASK)
}

pub fn split_message_id(id: MessageId) -> (u32, DeliveryId) {
    ((id >> DELIVERY_BITS) as u32, id & DELIVERY_MASK)
}

/// A consumer reading through this node.
pub struct LocalConsumer {
    pub consumer: Arc<Consumer>,
    pub slot: u32,
    /// Deliveries the machine gave it that its channel could not take yet,
    /// bounded by the credit the machine was given (see
    /// [`super::queue::machine_credit`]).
    pub parked: VecDeque<(DeliveryId, Parked)>,
    /// Writes consume-ok: run when its checkout is applied, before any
    /// delivery.
    pub announce: Option<Box<dyn FnOnce() + Send>>,
    /// Its checkout is applied: the machine knows it.
    pub checked_out: bool,
}

/// A delivery waiting for its channel.
pub enum Parked {
    Ready(QueuedMessage),
    /// Its body is being read back from the log.
    Unread {
        index: u64,
        delivery_count: u32,
    },
}

/// The state a snapshot holds: the machine, no bodies (they stay in the
/// log, from the snapshot's point on).
#[derive(Deserialize)]
struct MemberSnapshot {
    machine: QueueMachine,
}

/// [`MemberSnapshot`] as it is written: borrowing the machine, which can
/// hold millions of messages, rather than copying it first.
#[derive(Serialize)]
struct MemberSnapshotRef<'a> {
    machine: &'a QueueMachine,
}

pub struct Member {
    pub machine: QueueMachine,
    /// Bodies of messages not delivered yet, by the index that names them
    /// in the machine, as many as the window holds.
    pub bodies: BodyWindow,
    /// Bodies of the entry being applied that the window had no room for:
    /// a consumer waiting for them gets them without a read.
    pub fresh: HashMap<u64, Arc<Message>>,
    /// Messages enqueued since the state was last kept for a snapshot.
    enqueued_since_kept: u64,
    pub consumers: HashMap<ConsumerId, LocalConsumer>,
    /// Slot → consumer, for settling by [`MessageId`]: kept after a cancel
    /// while the machine still knows the consumer (it holds deliveries).
    pub slots: HashMap<u32, ConsumerId>,
    /// Cancelled here, their slots freed once the machine forgets them.
    pub retired: HashMap<ConsumerId, u32>,
    next_slot: u32,
    pub recent_gets: VecDeque<(DeliveryId, Arc<Message>)>,
}

impl Member {
    pub fn new(machine: QueueMachine, get_holder: ConsumerId, bodies: BodyWindow) -> Member {
        let mut slots = HashMap::new();
        slots.insert(GET_SLOT, get_holder);
        Member {
            machine,
            bodies,
            fresh: HashMap::new(),
            enqueued_since_kept: 0,
            consumers: HashMap::new(),
            slots,
            retired: HashMap::new(),
            next_slot: GET_SLOT + 1,
            recent_gets: VecDeque::new(),
        }
    }

    pub fn allocate_slot(&mut self, consumer: &ConsumerId) -> u32 {
        loop {
            let slot = self.next_slot;
            self.next_slot = self.next_slot.checked_add(1).unwrap_or(GET_SLOT + 1);
            if let std::collections::hash_map::Entry::Vacant(vacant) = self.slots.entry(slot) {
                vacant.insert(consumer.clone());
                return slot;
            }
        }
    }

    /// Frees the slot of a cancelled consumer the machine has forgotten.
    pub fn forget_if_gone(&mut self, consumer: &ConsumerId) {
        if self.machine.has_consumer(consumer) {
            return;
        }
        if let Some(slot) = self.retired.remove(consumer) {
            self.slots.remove(&slot);
        }
    }

    pub fn remember_get(&mut self, delivery: DeliveryId, message: Arc<Message>) {
        if self.recent_gets.len() == RECENT_GETS_MAX {
            self.recent_gets.pop_front();
        }
        self.recent_gets.push_back((delivery, message));
    }

    pub fn take_get(&mut self, delivery: DeliveryId) -> Option<Arc<Message>> {
        let position = self
            .recent_gets
            .iter()
            .position(|(known, _)| *known == delivery)?;
        self.recent_gets
            .remove(position)
            .map(|(_, message)| message)
    }

    /// The body of the message at `index`, if memory has it.
    pub fn body(&self, index: u64) -> Option<Arc<Message>> {
        self.bodies
            .get(index)
            .or_else(|| self.fresh.get(&index))
            .cloned()
    }

    /// Takes the body of a message that left the queue or was delivered.
    pub fn take_body(&mut self, index: u64) -> Option<Arc<Message>> {
        let fresh = self.fresh.remove(&index);
        self.bodies.take(index).or(fresh)
    }

    /// Holds the body of a message just enqueued: in the window if it has
    /// room, else only while its entry is applied.
    pub fn hold_body(&mut self, index: u64, message: Arc<Message>) {
        self.enqueued_since_kept += 1;
        if !self.bodies.keep(index, &message) {
            self.fresh.insert(index, message);
        }
    }

    /// The first log index whose entry holds a message still in the queue.
    pub fn first_needed(&self) -> Option<u64> {
        self.machine.oldest_live().map(|oldest| oldest >> ITEM_BITS)
    }

    /// See [`KEEP_FOR_SNAPSHOT_EVERY_MIN`].
    pub fn keep_for_snapshot(&mut self) -> bool {
        let due = self.machine.live_count().max(KEEP_FOR_SNAPSHOT_EVERY_MIN);
        if self.enqueued_since_kept < due {
            return false;
        }
        self.enqueued_since_kept = 0;
        true
    }

    /// Up to `limit` indexes of parked deliveries whose bodies are to be
    /// read, front first.
    pub fn unread(&self, limit: usize) -> Vec<u64> {
        self.consumers
            .values()
            .flat_map(|local| local.parked.iter())
            .filter_map(|(_, parked)| match parked {
                Parked::Unread { index, .. } => Some(*index),
                Parked::Ready(_) => None,
            })
            .take(limit)
            .collect()
    }

    /// Fills parked deliveries with the bodies read back. Deliveries
    /// whose entry the log no longer holds (`missing`) are taken out and
    /// returned, for the caller to discard.
    pub fn fill_parked(
        &mut self,
        read: &HashMap<u64, Arc<Message>>,
        missing: &[u64],
    ) -> Vec<(ConsumerId, DeliveryId)> {
        let mut lost = Vec::new();
        for (id, local) in &mut self.consumers {
            let slot = local.slot;
            local.parked.retain_mut(|(delivery, parked)| {
                let Parked::Unread {
                    index,
                    delivery_count,
                } = *parked
                else {
                    return true;
                };
                if let Some(body) = read.get(&index) {
                    *parked = Parked::Ready(QueuedMessage {
                        offset: message_id(slot, *delivery),
                        message: with_delivery_count(body, delivery_count),
                        redelivered: delivery_count > 0,
                        segment: None,
                        expires_at_us: crate::expiry::NEVER,
                    });
                    true
                } else if missing.contains(&index) {
                    lost.push((id.clone(), *delivery));
                    false
                } else {
                    true
                }
            });
        }
        lost
    }

    pub fn snapshot(&self) -> bytes::Bytes {
        super::entry::encode(&MemberSnapshotRef {
            machine: &self.machine,
        })
    }

    /// # Errors
    /// The snapshot cannot be decoded.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), String> {
        let snapshot: MemberSnapshot = super::entry::decode(bytes)?;
        self.machine = snapshot.machine;
        self.bodies.clear();
        self.fresh.clear();
        Ok(())
    }
}

/// The message as a consumer gets it after `delivery_count` returns: with
/// RabbitMQ's `x-delivery-count` header.
pub fn with_delivery_count(message: &Arc<Message>, delivery_count: u32) -> Arc<Message> {
    if delivery_count == 0 {
        return Arc::clone(message);
    }
    let Ok(properties) = message.properties.decode() else {
        return Arc::clone(message);
    };
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert(
        "x-delivery-count".into(),
        AMQPValue::LongLongInt(i64::from(delivery_count)),
    );
    let properties = properties.with_headers(FieldTable::from(headers.inner().clone()));
    Arc::new(Message {
        exchange: message.exchange.clone(),
        routing_key: message.routing_key.clone(),
        properties: RawProperties::from_properties(&properties),
        body: message.body.clone(),
    })
}
