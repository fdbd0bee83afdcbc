//! Operations on a queue wherever it lives: a classic queue of this node
//! answers at once; a queue of another node, or a quorum queue (whose
//! reads go through its log), answers through the asynchronous path the
//! channels use for them ([`Queue::forwarded`]).

use std::sync::Arc;

use sluice_core::error::{AmqpError, AmqpResult};
use sluice_core::message::QueuedMessage;
use sluice_core::queue::forwarding::Settlement;
use sluice_core::queue::{ConnectionId, MessageId, Queue, QueueStats};
use sluice_core::queue_type::QueueType;

use super::ManagementState;

/// The connection id the API acts as: no connection owns it, so another
/// connection's exclusive queue refuses it, as RabbitMQ's API is refused.
const NO_CONNECTION: ConnectionId = 0;

/// The queue `name` of `vhost` to look at, RabbitMQ's 404 when there is
/// none.
pub fn find(state: &ManagementState, vhost: &str, name: &str) -> AmqpResult<Arc<dyn Queue>> {
    let missing = || AmqpError::not_found(format!("no queue '{name}' in vhost '{vhost}'"));
    let vhost = state.broker.vhost(vhost).ok_or_else(missing)?;
    vhost
        .queues()
        .into_iter()
        .find(|queue| queue.name().as_ref() == name)
        .ok_or_else(missing)
}

/// The queue's counts as this node holds them, without asking another:
/// a classic queue of this node, or a quorum queue this node holds a
/// member of (its applied state).
pub fn stats_here(queue: &Arc<dyn Queue>) -> Option<QueueStats> {
    let held_here = match queue.queue_type() {
        QueueType::Quorum => queue.home_node().is_none(),
        _ => queue.forwarded().is_none(),
    };
    held_here.then(|| queue.stats())
}

/// The queue `name` of `vhost` to act on (get, purge, delete): as
/// [`find`], and RESOURCE_LOCKED for another connection's exclusive queue.
pub fn find_for_use(
    state: &ManagementState,
    vhost: &str,
    name: &str,
) -> AmqpResult<Arc<dyn Queue>> {
    let queue = find(state, vhost, name)?;
    queue.check_access(NO_CONNECTION)?;
    Ok(queue)
}

pub async fn stats(queue: &Arc<dyn Queue>) -> AmqpResult<QueueStats> {
    match queue.forwarded() {
        Some((home, key)) => home.stats(key).await,
        None => Ok(queue.stats()),
    }
}

/// One message, taken unacknowledged, and how many are left.
pub async fn get(queue: &Arc<dyn Queue>) -> AmqpResult<Option<(QueuedMessage, u32)>> {
    if let Some(error) = queue.unavailable() {
        return Err(error);
    }
    match queue.forwarded() {
        Some((home, key)) => home.get(key, false).await,
        None => Ok(queue.get(false)),
    }
}

pub fn settle(queue: &Arc<dyn Queue>, settlement: Settlement, messages: &[MessageId]) {
    if messages.is_empty() {
        return;
    }
    match queue.forwarded() {
        Some((home, key)) => home.settle(&key, settlement, messages),
        None => match settlement {
            Settlement::Ack => queue.settle(messages),
            Settlement::Reject => queue.reject(messages),
            Settlement::Requeue => queue.requeue(messages),
        },
    }
}

pub async fn purge(queue: &Arc<dyn Queue>) -> AmqpResult<u32> {
    if let Some(error) = queue.unavailable() {
        return Err(error);
    }
    match queue.forwarded() {
        Some((home, key)) => home.purge(key).await,
        None => Ok(queue.purge()),
    }
}
