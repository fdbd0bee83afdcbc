//! The delivery side of a channel: what queues call into, from any thread,
//! to hand a message to one of the channel's consumers.
//!
//! It owns the channel's delivery tags, the record of which queue holds
//! each unacknowledged message (the queue holds the message), and enforces
//! prefetch (per consumer and per channel).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::BytesMut;

use sluice_core::counters::{DeliveredBy, MessageCounters, MessageCounts};
use sluice_core::error::{AmqpError, AmqpResult};
use sluice_core::message::{Message, QueuedMessage};
use sluice_core::queue::{Consumer, DeliverySink, MessageId, Queue};
use sluice_core::reply_to::ReplySink;
use sluice_core::vhost::counts::CountedChannel;
use sluice_core::vhost::VirtualHost;
use sluice_wire::encode::{encode_content, encode_deliver, encode_get_ok};

use crate::outbox::Outbox;

/// A message delivered on this channel and not yet acknowledged: which
/// queue holds it, and its id there.
pub struct Unacked {
    pub delivery_tag: u64,
    pub queue: Arc<dyn Queue>,
    pub message_id: MessageId,
    /// None for a message fetched with basic.get.
    pub consumer: Option<Arc<Consumer>>,
    /// When it was sent, for `consumer_timeout`.
    pub delivered_at: Instant,
}

struct DeliveryState {
    next_delivery_tag: u64,
    /// Ordered by delivery tag, which only grows.
    unacked: VecDeque<Unacked>,
    /// basic.qos with global=true: unacked messages across the channel; 0 is
    /// unlimited.
    channel_prefetch: u32,
    /// A delivery was refused because the channel-wide prefetch was
    /// reached: the next settle frees room some other queue of the channel
    /// may be waiting for. Without it, a settle asks only the queues it
    /// settled to deliver.
    refused_for_channel_prefetch: bool,
    closed: bool,
    /// Consumers the queue cancelled (queue deleted); the channel forgets
    /// their tags when it next handles a method.
    cancelled_by_queue: Vec<Arc<str>>,
    /// The channel's deliveries, counted under this lock, which every
    /// delivery takes anyway.
    counts: MessageCounts,
    /// While the channel's own queue.delete is under way: the cancels its
    /// consumers get, written only after delete-ok, in RabbitMQ's order.
    held_cancels: Option<Vec<Arc<str>>>,
}

pub struct ChannelDeliveries {
    pub channel_id: u16,
    frame_max: u32,
    /// The client advertised consumer_cancel_notify: it understands a
    /// basic.cancel sent by the broker.
    cancel_notify: bool,
    outbox: Arc<Outbox>,
    state: Mutex<DeliveryState>,
    /// What the channel counted on its publishing side (publishes,
    /// confirms, acks), handed over once per read batch; its deliveries
    /// are counted in `state`.
    counters: MessageCounters,
    /// The vhost, whose totals count this channel.
    vhost: Arc<VirtualHost>,
}

impl ChannelDeliveries {
    pub fn new(
        channel_id: u16,
        frame_max: u32,
        cancel_notify: bool,
        outbox: Arc<Outbox>,
        vhost: Arc<VirtualHost>,
    ) -> Self {
        ChannelDeliveries {
            channel_id,
            frame_max,
            cancel_notify,
            outbox,
            counters: MessageCounters::default(),
            vhost,
            state: Mutex::new(DeliveryState {
                next_delivery_tag: 1,
                unacked: VecDeque::new(),
                channel_prefetch: 0,
                refused_for_channel_prefetch: false,
                closed: false,
                cancelled_by_queue: Vec::new(),
                held_cancels: None,
                counts: MessageCounts::default(),
            }),
        }
    }

    /// Where the channel hands over what its publishing side counted.
    pub fn counters(&self) -> &MessageCounters {
        &self.counters
    }

    pub fn vhost(&self) -> &Arc<VirtualHost> {
        &self.vhost
    }

    fn lock(&self) -> MutexGuard<'_, DeliveryState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn set_channel_prefetch(&self, prefetch_count: u32) {
        self.lock().channel_prefetch = prefetch_count;
    }

    /// basic.qos global=true's prefetch, for the management API.
    pub fn channel_prefetch(&self) -> u32 {
        self.lock().channel_prefetch
    }

    /// Deliveries not yet settled, for the management API.
    pub fn unacked_count(&self) -> usize {
        self.lock().unacked.len()
    }

    /// The channel deletes a queue: basic.cancel for its consumers waits for
    /// [`Self::release_cancels`], after delete-ok.
    pub fn hold_cancels(&self) {
        self.lock().held_cancels.get_or_insert_with(Vec::new);
    }

    /// Writes the basic.cancels held since [`Self::hold_cancels`].
    pub fn release_cancels(&self) {
        let held = self.lock().held_cancels.take().unwrap_or_default();
        for tag in held {
            self.write_cancel(&tag);
        }
    }

    /// basic.cancel from the server, for a client that takes them.
    fn write_cancel(&self, tag: &str) {
        if !self.cancel_notify {
            return;
        }
        let cancel = amq_protocol::protocol::AMQPClass::Basic(
            amq_protocol::protocol::basic::AMQPMethod::Cancel(
                amq_protocol::protocol::basic::Cancel {
                    consumer_tag: tag.into(),
                    nowait: true,
                },
            ),
        );
        self.outbox
            .append(|out| sluice_wire::encode::encode_control(out, self.channel_id, &cancel));
    }

    pub fn take_cancelled_by_queue(&self) -> Vec<Arc<str>> {
        std::mem::take(&mut self.lock().cancelled_by_queue)
    }

    /// Stops deliveries and hands back every unacked message, oldest first.
    pub fn close(&self) -> Vec<Unacked> {
        let mut state = self.lock();
        state.closed = true;
        let unacked: Vec<Unacked> = state.unacked.drain(..).collect();
        drop(state);
        release_prefetch(&unacked);
        unacked
    }

    /// Hands back every unacked message (basic.recover), keeping the channel open.
    pub fn take_all_unacked(&self) -> Vec<Unacked> {
        let unacked: Vec<Unacked> = self.lock().unacked.drain(..).collect();
        release_prefetch(&unacked);
        unacked
    }

    /// When the oldest unacknowledged delivery of the channel was sent.
    /// Deliveries are kept in tag order, which is the order they were sent
    /// (a rolled-back transaction puts its acks back in that order too).
    pub fn oldest_unacked_since(&self) -> Option<Instant> {
        self.lock()
            .unacked
            .front()
            .map(|unacked| unacked.delivered_at)
    }

    /// Whether a delivery was refused for the channel-wide prefetch since
    /// the last call: the caller then lets every queue of the channel's
    /// consumers deliver into the room a settle freed.
    pub fn take_channel_prefetch_refusal(&self) -> bool {
        std::mem::take(&mut self.lock().refused_for_channel_prefetch)
    }

    fn channel_has_room(state: &DeliveryState) -> bool {
        state.channel_prefetch == 0 || state.unacked.len() < state.channel_prefetch as usize
    }

    /// Writes a basic.get-ok for `entry` and, unless no_ack, records it.
    pub fn deliver_get(
        &self,
        queue: &Arc<dyn Queue>,
        entry: QueuedMessage,
        message_count: u32,
        no_ack: bool,
    ) {
        let mut state = self.lock();
        let delivery_tag = state.next_delivery_tag;
        state.next_delivery_tag += 1;
        state.counts.count_delivery(
            entry.message.body_size(),
            entry.redelivered,
            DeliveredBy::Get { no_ack },
        );
        let message = &entry.message;
        self.outbox.append(|out| {
            encode_get_ok(
                out,
                self.channel_id,
                delivery_tag,
                entry.redelivered,
                &message.exchange,
                &message.routing_key,
                message_count,
            );
            encode_content(
                out,
                self.channel_id,
                &message.properties,
                &message.body,
                self.frame_max,
            );
        });
        if !no_ack {
            state.unacked.push_back(Unacked {
                delivery_tag,
                queue: Arc::clone(queue),
                message_id: entry.offset,
                consumer: None,
                delivered_at: Instant::now(),
            });
        }
    }

    /// Takes the unacked messages a basic.ack, nack or reject settles and
    /// appends them to `into` (a buffer the channel reuses, so an ack does
    /// not allocate). `multiple` settles every message up to and including
    /// `delivery_tag`; tag 0 with multiple means all. Returns whether a
    /// delivery was refused for the channel-wide prefetch since the last
    /// settle (see [`Self::take_channel_prefetch_refusal`]), read under
    /// the same lock.
    pub fn settle(
        &self,
        delivery_tag: u64,
        multiple: bool,
        into: &mut Vec<Unacked>,
    ) -> AmqpResult<bool> {
        let start = into.len();
        let refused = {
            let mut state = self.lock();
            Self::take_locked(&mut state, delivery_tag, multiple, into)?;
            std::mem::take(&mut state.refused_for_channel_prefetch)
        };
        release_prefetch(&into[start..]);
        Ok(refused)
    }

    /// Takes what [`Self::settle`] would, but the consumers' prefetch stays
    /// used: a transaction holds the acks until it commits
    /// ([`Self::release_held`]) or rolls back ([`Self::restore`]).
    pub fn take(
        &self,
        delivery_tag: u64,
        multiple: bool,
        into: &mut Vec<Unacked>,
    ) -> AmqpResult<()> {
        Self::take_locked(&mut self.lock(), delivery_tag, multiple, into)
    }

    fn take_locked(
        state: &mut DeliveryState,
        delivery_tag: u64,
        multiple: bool,
        into: &mut Vec<Unacked>,
    ) -> AmqpResult<()> {
        if multiple {
            let count = if delivery_tag == 0 {
                state.unacked.len()
            } else {
                state
                    .unacked
                    .partition_point(|unacked| unacked.delivery_tag <= delivery_tag)
            };
            // As in RabbitMQ, the tag itself must be outstanding: a multiple
            // ack of a tag already settled, or never issued, is an error.
            let tag_outstanding =
                count > 0 && state.unacked[count - 1].delivery_tag == delivery_tag;
            if delivery_tag != 0 && !tag_outstanding {
                return Err(unknown_delivery_tag(delivery_tag));
            }
            into.extend(state.unacked.drain(..count));
        } else {
            let index = state
                .unacked
                .binary_search_by_key(&delivery_tag, |unacked| unacked.delivery_tag)
                .map_err(|_| unknown_delivery_tag(delivery_tag))?;
            into.extend(state.unacked.remove(index));
        }
        Ok(())
    }

    /// A committed transaction's acks free their consumers' prefetch.
    pub fn release_held(&self, held: &[Unacked]) {
        release_prefetch(held);
    }

    /// A rolled-back transaction's acks: the messages are unacked again,
    /// in delivery-tag order.
    pub fn restore(&self, held: Vec<Unacked>) {
        let mut state = self.lock();
        for unacked in held {
            let position = state
                .unacked
                .partition_point(|existing| existing.delivery_tag < unacked.delivery_tag);
            state.unacked.insert(position, unacked);
        }
    }
}

/// Settled messages no longer count against their consumers' prefetch.
fn release_prefetch(settled: &[Unacked]) {
    for unacked in settled {
        if let Some(consumer) = &unacked.consumer {
            consumer.unacked.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl ChannelDeliveries {
    /// basic.deliver and the message's content frames, as one delivery.
    fn encode_delivery(
        &self,
        out: &mut BytesMut,
        consumer_tag: &[u8],
        delivery_tag: u64,
        redelivered: bool,
        message: &Message,
    ) {
        encode_deliver(
            out,
            self.channel_id,
            consumer_tag,
            delivery_tag,
            redelivered,
            &message.exchange,
            &message.routing_key,
        );
        encode_content(
            out,
            self.channel_id,
            &message.properties,
            &message.body,
            self.frame_max,
        );
    }
}

fn unknown_delivery_tag(delivery_tag: u64) -> AmqpError {
    AmqpError::precondition_failed(format!("unknown delivery tag {delivery_tag}"))
}

impl CountedChannel for ChannelDeliveries {
    /// Both sides of the channel: what its publishing side handed over,
    /// and its deliveries.
    fn counts(&self) -> MessageCounts {
        let mut counts = self.counters.counts();
        counts += self.lock().counts;
        counts
    }
}

impl DeliverySink for ChannelDeliveries {
    fn deliver(
        &self,
        consumer: &Arc<Consumer>,
        queue: &dyn Fn() -> Arc<dyn Queue>,
        entry: &QueuedMessage,
    ) -> bool {
        let mut state = self.lock();
        if state.closed {
            return false;
        }
        if !consumer.no_ack && !Self::channel_has_room(&state) {
            state.refused_for_channel_prefetch = true;
            return false;
        }
        let delivery_tag = state.next_delivery_tag;
        let written = self.outbox.append_delivery(|out| {
            self.encode_delivery(
                out,
                consumer.tag.as_bytes(),
                delivery_tag,
                entry.redelivered,
                &entry.message,
            )
        });
        if !written {
            return false;
        }
        state.next_delivery_tag += 1;
        state.counts.count_delivery(
            entry.message.body_size(),
            entry.redelivered,
            DeliveredBy::Consume {
                no_ack: consumer.no_ack,
            },
        );
        if !consumer.no_ack {
            consumer.unacked.fetch_add(1, Ordering::AcqRel);
            state.unacked.push_back(Unacked {
                delivery_tag,
                queue: queue(),
                message_id: entry.offset,
                consumer: Some(Arc::clone(consumer)),
                delivered_at: Instant::now(),
            });
        }
        true
    }

    fn cancelled_by_queue(&self, consumer: &Arc<Consumer>) {
        let mut state = self.lock();
        if state.closed {
            return;
        }
        state.cancelled_by_queue.push(Arc::clone(&consumer.tag));
        if let Some(held) = &mut state.held_cancels {
            held.push(Arc::clone(&consumer.tag));
            return;
        }
        drop(state);
        self.write_cancel(&consumer.tag);
    }
}

impl ReplySink for ChannelDeliveries {
    /// A direct reply: no queue, no ack, so no unacked record and no
    /// prefetch. A consumer whose output buffer is full (it is not reading
    /// its socket) loses the reply rather than grow the buffer without
    /// bound; RabbitMQ's replies are just as transient.
    fn deliver_reply(&self, consumer_tag: &str, message: &Arc<Message>) -> bool {
        let mut state = self.lock();
        if state.closed {
            return false;
        }
        let delivery_tag = state.next_delivery_tag;
        let written = self.outbox.append_delivery(|out| {
            self.encode_delivery(out, consumer_tag.as_bytes(), delivery_tag, false, message)
        });
        if written {
            state.next_delivery_tag += 1;
            // Reply consumers never acknowledge.
            state.counts.count_delivery(
                message.body_size(),
                false,
                DeliveredBy::Consume { no_ack: true },
            );
        } else {
            tracing::debug!(
                channel = self.channel_id,
                "dropped a direct reply: output buffer full"
            );
        }
        written
    }
}
