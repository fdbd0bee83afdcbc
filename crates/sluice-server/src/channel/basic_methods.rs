//! basic.qos, consume, cancel, get and recover, and the channel's
//! consumers.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use amq_protocol::protocol::{basic, AMQPClass};
use sluice_core::access::{Permission, ResourceKind};
use sluice_core::arguments::{as_integer, check_consume_arguments};
use sluice_core::error::{AmqpError, AmqpResult};
use sluice_core::queue::forwarding::{ForwardHome, QueueKey};
use sluice_core::queue::{Consumer, Queue};
use sluice_core::reply_to::REPLY_TO_QUEUE;
use sluice_wire::encode::encode_control;

use super::{Channel, ChannelConsumer, ReplyConsumer};
use crate::connection_context::ConnectionContext;
use crate::connection_registry::ConsumerStatus;

impl Channel {
    pub(super) fn handle_basic_method(
        &mut self,
        context: &ConnectionContext,
        method: basic::AMQPMethod,
    ) -> AmqpResult<()> {
        match method {
            basic::AMQPMethod::Qos(qos) => {
                if qos.global {
                    self.deliveries
                        .set_channel_prefetch(qos.prefetch_count as u32);
                } else {
                    self.consumer_prefetch = qos.prefetch_count as u32;
                    self.status.set_consumer_prefetch(self.consumer_prefetch);
                }
                self.reply(
                    context,
                    AMQPClass::Basic(basic::AMQPMethod::QosOk(basic::QosOk {})),
                );
                self.dispatch_consumer_queues();
            }
            basic::AMQPMethod::Consume(consume) => self.consume(context, consume)?,
            basic::AMQPMethod::Cancel(cancel) => self.cancel(context, cancel),
            basic::AMQPMethod::Get(get) => self.get(context, get)?,
            basic::AMQPMethod::Recover(recover) => {
                if !recover.requeue {
                    return Err(AmqpError::not_implemented("requeue=false"));
                }
                // recover-ok goes before the redeliveries, as in RabbitMQ:
                // clients such as lapin drop deliveries they hold when
                // recover-ok arrives, expecting the redeliveries after it.
                self.reply(
                    context,
                    AMQPClass::Basic(basic::AMQPMethod::RecoverOk(basic::RecoverOk {})),
                );
                self.recover(true)?;
            }
            basic::AMQPMethod::RecoverAsync(recover) => self.recover(recover.requeue)?,
            other => {
                return Err(AmqpError::command_invalid(format!(
                    "unexpected method basic.{}",
                    AMQPClass::Basic(other).get_amqp_method_id()
                )))
            }
        }
        Ok(())
    }

    /// basic.cancel: of the reply-to consumer or of a queue's. Cancelling
    /// an unknown tag succeeds, as in RabbitMQ.
    fn cancel(&mut self, context: &ConnectionContext, cancel: basic::Cancel) {
        let tag = cancel.consumer_tag.as_str();
        let mut unused = None;
        if self
            .reply_consumer
            .as_ref()
            .is_some_and(|consumer| consumer.tag.as_ref() == tag)
        {
            self.cancel_reply_consumer(context);
        } else if let Some(cancelled) = self.remove_consumer(context, tag) {
            if let Some(queue) = cancelled.new_active {
                // Its unacked messages stay with the channel (basic.cancel
                // does not requeue them): the new active consumer takes
                // the ready ones now.
                queue.dispatch();
            }
            unused = cancelled.unused;
        }
        let nowait = cancel.nowait;
        let reply = move |channel: &mut Channel, context: &ConnectionContext| {
            if !nowait {
                channel.reply(
                    context,
                    AMQPClass::Basic(basic::AMQPMethod::CancelOk(basic::CancelOk {
                        consumer_tag: cancel.consumer_tag,
                    })),
                );
            }
        };
        match unused {
            // The auto-delete queue it leaves unused is gone before
            // cancel-ok, as the queue itself answers it in RabbitMQ.
            Some(queue) => {
                let command = context.vhost.deletion_of(&queue);
                self.propose(context, command, move |channel, context, deleted| {
                    if let Err(error) = deleted {
                        tracing::warn!(%error, "an unused auto-delete queue was not deleted");
                    }
                    reply(channel, context);
                    Ok(())
                });
            }
            None => reply(self, context),
        }
    }

    /// basic.get: get-ok with the head message, or get-empty.
    fn get(&mut self, context: &ConnectionContext, get: basic::Get) -> AmqpResult<()> {
        let name = self.queue_name(get.queue.as_str())?;
        context.check_access(Permission::Read, ResourceKind::Queue, &name)?;
        let queue = context.vhost.queue(&name, context.connection_id)?;
        if let Some(error) = queue.unavailable() {
            return Err(error);
        }
        if let Some((home, key)) = queue.forwarded() {
            let no_ack = get.no_ack;
            self.await_remote(home.get(key, no_ack), move |channel, context, got| {
                match got? {
                    Some((entry, message_count)) => {
                        channel
                            .deliveries
                            .deliver_get(&queue, entry, message_count, no_ack)
                    }
                    None => channel.get_empty(context, &queue),
                }
                Ok(())
            });
            return Ok(());
        }
        match queue.get(get.no_ack) {
            Some((entry, message_count)) => {
                self.deliveries
                    .deliver_get(&queue, entry, message_count, get.no_ack)
            }
            None => self.get_empty(context, &queue),
        }
        Ok(())
    }

    /// basic.get-empty, counted where RabbitMQ counts it: the channel, the
    /// vhost and the queue.
    fn get_empty(&mut self, context: &ConnectionContext, queue: &Arc<dyn Queue>) {
        self.unflushed.add(|counts| &mut counts.get_empty, 1);
        queue.count_get_empty();
        self.reply(
            context,
            AMQPClass::Basic(basic::AMQPMethod::GetEmpty(basic::GetEmpty {})),
        );
    }

    /// The tag a consumer gets: the one asked for, or a fresh
    /// `amq.ctag-…` one that no consumer of this channel has.
    fn consumer_tag(&mut self, context: &ConnectionContext, requested: &str) -> Arc<str> {
        if !requested.is_empty() {
            return Arc::from(requested);
        }
        loop {
            let candidate = format!(
                "amq.ctag-{}-{}",
                context.connection_id, self.next_consumer_tag
            );
            self.next_consumer_tag += 1;
            if !self.consumers.contains_key(candidate.as_str()) {
                break Arc::from(candidate);
            }
        }
    }

    pub(super) fn consume(
        &mut self,
        context: &ConnectionContext,
        consume: basic::Consume,
    ) -> AmqpResult<()> {
        if consume.queue.as_str() == REPLY_TO_QUEUE {
            return self.consume_replies(context, consume);
        }
        // A reused tag is refused before the queue is looked up, as in
        // RabbitMQ.
        let tag = self.consumer_tag(context, consume.consumer_tag.as_str());
        if self.consumers.contains_key(&tag) {
            return Err(AmqpError::not_allowed(format!(
                "attempt to reuse consumer tag '{tag}'"
            )));
        }
        let name = self.queue_name(consume.queue.as_str())?;
        context.check_access(Permission::Read, ResourceKind::Queue, &name)?;
        let queue = context.vhost.queue(&name, context.connection_id)?;
        check_consume_arguments(
            &consume.arguments,
            &format!("queue '{}' in vhost '{}'", queue.name(), queue.vhost_name()),
        )?;
        // Validated as an integer; RabbitMQ accepts any width, so a priority
        // beyond i32 is clamped rather than refused.
        let priority = consume
            .arguments
            .inner()
            .get("x-priority")
            .and_then(as_integer)
            .map_or(0, |priority| {
                priority.clamp(i32::MIN as i64, i32::MAX as i64) as i32
            });
        let status = ConsumerStatus {
            queue: Arc::clone(queue.name()),
            ack_required: !consume.no_ack,
            exclusive: consume.exclusive,
            prefetch_count: self.consumer_prefetch,
            arguments: consume.arguments.clone(),
        };
        let consumer = Arc::new(Consumer {
            tag: Arc::clone(&tag),
            channel_id: self.id,
            connection_id: context.connection_id,
            no_ack: consume.no_ack,
            exclusive: consume.exclusive,
            priority,
            prefetch_count: self.consumer_prefetch,
            unacked: AtomicU32::new(0),
            sink: self.deliveries.clone(),
        });
        if let Some((home, key)) = queue.forwarded() {
            self.status.consumer_added(&tag, status);
            return self.consume_remote(context, (queue, home, key), consumer, consume.nowait);
        }
        queue.add_consumer(consumer, &mut || {
            if !consume.nowait {
                self.reply(
                    context,
                    AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(basic::ConsumeOk {
                        consumer_tag: tag.as_ref().into(),
                    })),
                );
            }
        })?;
        self.consumers.insert(
            Arc::clone(&tag),
            ChannelConsumer {
                queue: Arc::clone(&queue),
            },
        );
        self.status.consumer_added(&tag, status);
        queue.dispatch();
        Ok(())
    }

    /// basic.consume on a queue homed on another node: the consumer is the
    /// channel's at once (so that a channel closed meanwhile cancels it),
    /// and consume-ok is written when the home node accepts it, before any
    /// delivery.
    fn consume_remote(
        &mut self,
        context: &ConnectionContext,
        (queue, home, key): (Arc<dyn Queue>, Arc<dyn ForwardHome>, QueueKey),
        consumer: Arc<Consumer>,
        nowait: bool,
    ) -> AmqpResult<()> {
        let tag = Arc::clone(&consumer.tag);
        let outbox = Arc::clone(&context.outbox);
        let channel_id = self.id;
        let announce_tag = Arc::clone(&tag);
        let announce = Box::new(move || {
            if !nowait {
                let consume_ok = AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(basic::ConsumeOk {
                    consumer_tag: announce_tag.as_ref().into(),
                }));
                outbox.append(|out| encode_control(out, channel_id, &consume_ok));
            }
        });
        self.consumers.insert(
            Arc::clone(&tag),
            ChannelConsumer {
                queue: Arc::clone(&queue),
            },
        );
        let started = home.consume(queue, key, consumer, announce);
        self.await_remote(started, move |channel, _context, started| {
            if started.is_err() {
                channel.consumers.remove(&tag);
                channel.status.consumer_removed(&tag);
            }
            started
        });
        Ok(())
    }

    /// basic.consume on `amq.rabbitmq.reply-to`, with RabbitMQ's checks in
    /// RabbitMQ's order.
    pub(super) fn consume_replies(
        &mut self,
        context: &ConnectionContext,
        consume: basic::Consume,
    ) -> AmqpResult<()> {
        let requested = consume.consumer_tag.as_str();
        if self.consumers.contains_key(requested) {
            return Err(AmqpError::not_allowed(format!(
                "attempt to reuse consumer tag '{requested}'"
            )));
        }
        if !consume.no_ack {
            return Err(AmqpError::precondition_failed(
                "reply consumer cannot acknowledge",
            ));
        }
        if self.reply_consumer.is_some() {
            return Err(AmqpError::precondition_failed("reply consumer already set"));
        }
        let tag = self.consumer_tag(context, requested);
        let token = context
            .broker
            .reply_to
            .register(Arc::clone(&tag), self.deliveries.clone());
        self.reply_consumer = Some(ReplyConsumer {
            tag: Arc::clone(&tag),
            token,
        });
        if !consume.nowait {
            self.reply(
                context,
                AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(basic::ConsumeOk {
                    consumer_tag: tag.as_ref().into(),
                })),
            );
        }
        Ok(())
    }

    pub(super) fn cancel_reply_consumer(&mut self, context: &ConnectionContext) {
        if let Some(consumer) = self.reply_consumer.take() {
            context.broker.reply_to.unregister(&consumer.token);
        }
    }

    /// Removes a consumer from its queue. Returns the queue when it is a
    /// single-active-consumer queue whose active consumer this was: the
    /// caller dispatches it, after requeueing what is to be requeued. An
    /// auto-delete queue left without consumers is deleted, without waiting.
    pub(super) fn cancel_consumer(
        &mut self,
        context: &ConnectionContext,
        tag: &str,
    ) -> Option<Arc<dyn Queue>> {
        let cancelled = self.remove_consumer(context, tag)?;
        if let Some(unused) = &cancelled.unused {
            context.vhost.propose_queue_deletion(unused);
        }
        cancelled.new_active
    }

    /// Removes a consumer from its queue (an unknown tag is no error, as in
    /// RabbitMQ).
    fn remove_consumer(&mut self, context: &ConnectionContext, tag: &str) -> Option<Cancelled> {
        let entry = self.consumers.remove(tag)?;
        self.status.consumer_removed(tag);
        let removed = entry
            .queue
            .remove_consumer(context.connection_id, self.id, tag)?;
        Some(Cancelled {
            unused: removed.queue_now_unused.then(|| Arc::clone(&entry.queue)),
            new_active: removed.active_consumer_changed.then_some(entry.queue),
        })
    }
}

/// What cancelling a consumer left to do.
struct Cancelled {
    /// An auto-delete queue that lost its last consumer: to delete.
    unused: Option<Arc<dyn Queue>>,
    /// A single-active-consumer queue with a new active consumer: to
    /// dispatch.
    new_active: Option<Arc<dyn Queue>>,
}
