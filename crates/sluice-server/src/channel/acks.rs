//! basic.ack, nack, reject and recover: delivery tags back to the queues
//! that hold the messages, settled by id.

use std::collections::HashMap;
use std::sync::Arc;

use sluice_core::error::{AmqpError, AmqpResult};
use sluice_core::queue::{same_queue, MessageId, Queue};
use sluice_wire::method::{Ack, Nack, Reject};

use super::{Channel, TxOperation};
use crate::delivery::Unacked;
use crate::limits::REQUEUE_SLICE_MAX;

impl Channel {
    pub fn handle_ack(&mut self, ack: Ack) -> AmqpResult<()> {
        self.settle(ack.delivery_tag, ack.multiple, None)
    }

    pub fn handle_nack(&mut self, nack: Nack) -> AmqpResult<()> {
        self.settle(nack.delivery_tag, nack.multiple, Some(nack.requeue))
    }

    pub fn handle_reject(&mut self, reject: Reject) -> AmqpResult<()> {
        self.settle(reject.delivery_tag, false, Some(reject.requeue))
    }

    /// basic.ack (`requeue` None), nack and reject (`requeue` Some).
    pub(super) fn settle(
        &mut self,
        delivery_tag: u64,
        multiple: bool,
        requeue: Option<bool>,
    ) -> AmqpResult<()> {
        if let Some(transaction) = self.tx.as_mut() {
            let mut settled = Vec::new();
            self.deliveries.take(delivery_tag, multiple, &mut settled)?;
            transaction
                .operations
                .push(TxOperation::Settle { settled, requeue });
            return Ok(());
        }
        let mut settled = std::mem::take(&mut self.settled_scratch);
        let result = self.deliveries.settle(delivery_tag, multiple, &mut settled);
        if let Ok(others_wait) = result {
            self.finish_settle(&mut settled, requeue, others_wait);
        }
        settled.clear();
        self.settled_scratch = settled;
        result.map(drop)
    }

    /// Hands settled messages to their queues: acked, requeued, or rejected
    /// (dead-lettered where the queue says so); then lets this channel's
    /// queues deliver into the prefetch room freed. Leaves `settled` empty
    /// or to be cleared.
    pub(super) fn finish_settle(
        &mut self,
        settled: &mut Vec<Unacked>,
        requeue: Option<bool>,
        others_wait: bool,
    ) {
        if requeue.is_none() {
            self.unflushed
                .add(|counts| &mut counts.acked, settled.len() as u64);
        }
        let mut dispatched = std::mem::take(&mut self.dispatched_scratch);
        if requeue == Some(true) {
            for entry in settled.iter() {
                if !dispatched
                    .iter()
                    .any(|queue| same_queue(queue, &entry.queue))
                {
                    dispatched.push(Arc::clone(&entry.queue));
                }
            }
            requeue_by_queue(settled.drain(..));
        } else {
            // nack and reject without requeue dead-letter where the
            // queue has a dead-letter exchange.
            let rejected = requeue == Some(false);
            settle_by_queue(
                settled,
                rejected,
                &mut dispatched,
                &mut self.message_ids_scratch,
            );
        }
        // Settling and requeueing dispatch on their own queues. The other
        // queues of this channel's consumers are asked only when one of
        // them was refused for the channel-wide prefetch (`others_wait`),
        // which this freed room under: an ack touches only the queues it
        // settles.
        for entry in self.consumers.values().filter(|_| others_wait) {
            if !dispatched
                .iter()
                .any(|queue| same_queue(queue, &entry.queue))
            {
                entry.queue.dispatch();
            }
        }
        dispatched.clear();
        self.dispatched_scratch = dispatched;
    }

    pub(super) fn recover(&mut self, requeue: bool) -> AmqpResult<()> {
        if !requeue {
            return Err(AmqpError::not_implemented("requeue=false"));
        }
        requeue_by_queue(self.deliveries.take_all_unacked());
        self.dispatch_consumer_queues();
        Ok(())
    }
}

/// Acked (or rejected) messages, settled by id with one call (one lock)
/// per run of the same queue. `ids` is a buffer the channel reuses.
pub(super) fn settle_by_queue(
    acked: &[Unacked],
    rejected: bool,
    settled_queues: &mut Vec<Arc<dyn Queue>>,
    ids: &mut Vec<MessageId>,
) {
    let mut start = 0;
    while start < acked.len() {
        let queue = &acked[start].queue;
        ids.clear();
        ids.extend(
            acked[start..]
                .iter()
                .take_while(|entry| same_queue(&entry.queue, queue))
                .map(|entry| entry.message_id),
        );
        if rejected {
            queue.reject(ids);
        } else {
            queue.settle(ids);
        }
        if !settled_queues.iter().any(|known| same_queue(known, queue)) {
            settled_queues.push(Arc::clone(queue));
        }
        start += ids.len();
    }
    ids.clear();
}

/// Requeued messages, handed back per queue in their original order.
pub(super) fn requeue_by_queue(requeued: impl IntoIterator<Item = Unacked>) {
    for (queue, ids) in group_by_queue(requeued) {
        queue.requeue(&ids);
    }
}

/// Messages a closing connection held, handed back per queue, oldest first,
/// in slices of at most [`REQUEUE_SLICE_MAX`]: between two, the queue's lock
/// is free for its other clients, and after every [`REQUEUE_SLICE_MAX`]
/// across queues the task yields to other connections. A million of them
/// take a fraction of a second and stall no one.
pub async fn requeue_in_slices(requeued: Vec<Unacked>) {
    let mut since_yield = 0;
    for (queue, mut ids) in group_by_queue(requeued) {
        ids.sort_unstable();
        for slice in ids.chunks(REQUEUE_SLICE_MAX) {
            if since_yield + slice.len() > REQUEUE_SLICE_MAX {
                tokio::task::yield_now().await;
                since_yield = 0;
            }
            queue.requeue(slice);
            since_yield += slice.len();
        }
    }
}

fn group_by_queue(
    requeued: impl IntoIterator<Item = Unacked>,
) -> Vec<(Arc<dyn Queue>, Vec<MessageId>)> {
    let mut by_queue: HashMap<*const (), (Arc<dyn Queue>, Vec<MessageId>)> = HashMap::new();
    for entry in requeued {
        by_queue
            .entry(Arc::as_ptr(&entry.queue) as *const ())
            .or_insert_with(|| (Arc::clone(&entry.queue), Vec::new()))
            .1
            .push(entry.message_id);
    }
    by_queue.into_values().collect()
}
