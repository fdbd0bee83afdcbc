//! What one member holds of its quorum queue: the queue machine as the log
//! left it, the bodies of the messages in the queue, and the consumers
//! that read through this node, with the deliveries their channels had no
//! room for yet.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use amq_protocol::types::{AMQPValue, FieldTable};
use serde::{Deserialize, Serialize};
use sluice_wire::content::RawProperties;

use super::command::{ConsumerId, DeliveryId};
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
    pub parked: VecDeque<(DeliveryId, QueuedMessage)>,
    /// Writes consume-ok: run when its checkout is applied, before any
    /// delivery.
    pub announce: Option<Box<dyn FnOnce() + Send>>,
    /// Its checkout is applied: the machine knows it.
    pub checked_out: bool,
}

#[derive(Serialize, Deserialize)]
struct MemberSnapshot {
    machine: QueueMachine,
    bodies: Vec<(u64, serde_bytes::ByteBuf)>,
}

pub struct Member {
    pub machine: QueueMachine,
    /// The bodies of the messages in the queue, by the index that names
    /// them in the machine.
    pub bodies: HashMap<u64, Arc<Message>>,
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
    pub fn new(machine: QueueMachine, get_holder: ConsumerId) -> Member {
        let mut slots = HashMap::new();
        slots.insert(GET_SLOT, get_holder);
        Member {
            machine,
            bodies: HashMap::new(),
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

    pub fn snapshot(&self) -> bytes::Bytes {
        let snapshot = MemberSnapshot {
            machine: self.machine.clone(),
            bodies: self
                .bodies
                .iter()
                .map(|(index, message)| {
                    (
                        *index,
                        serde_bytes::ByteBuf::from(super::entry::encode_message(message)),
                    )
                })
                .collect(),
        };
        super::entry::encode(&snapshot)
    }

    /// # Errors
    /// The snapshot cannot be decoded.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), String> {
        let snapshot: MemberSnapshot = super::entry::decode(bytes)?;
        let mut bodies = HashMap::with_capacity(snapshot.bodies.len());
        for (index, bytes) in snapshot.bodies {
            let message = super::entry::decode_message(bytes.into_vec())
                .ok_or_else(|| format!("message {index} of the snapshot is malformed"))?;
            bodies.insert(index, message);
        }
        self.machine = snapshot.machine;
        self.bodies = bodies;
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
