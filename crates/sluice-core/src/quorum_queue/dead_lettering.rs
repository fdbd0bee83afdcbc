//! At-least-once dead-lettering (`x-dead-letter-strategy: at-least-once`),
//! as RabbitMQ's `rabbit_fifo_dlx` worker does it: a dead-lettered message
//! stays in the queue (and in its log) until the leader has republished it
//! to the dead-letter exchange and every queue it reached has it safe (a
//! publisher confirm's worth); only then is it settled through the log. A
//! message routed nowhere, or refused by a target, stays and is tried again
//! later; a leader change may publish some twice, never lose one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::command::DeadLetterReason;
use super::queue::QuorumQueue;
use crate::confirm::ConfirmStatus;
use crate::dead_letter::{DeadLetter, DeathReason};
use crate::queue::{PublishOutcome, Queue};

/// Messages republished per round.
const BATCH_MESSAGES: usize = 256;
/// A member that does not lead looks again this often: it takes over when
/// it is elected.
const FOLLOWER_POLL: Duration = Duration::from_secs(1);
/// How often the targets' confirms are looked at while they are awaited.
const CONFIRM_POLL: Duration = Duration::from_millis(5);
/// How long targets may take to confirm before the round is tried again
/// (RabbitMQ's `dead_letter_worker_publisher_confirm_timeout`).
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(180);
/// The wait before trying a round again that could not be routed or was
/// refused; it doubles up to the maximum while that goes on.
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

pub fn death_reason(reason: DeadLetterReason) -> DeathReason {
    match reason {
        DeadLetterReason::Expired => DeathReason::Expired,
        DeadLetterReason::Rejected => DeathReason::Rejected,
        DeadLetterReason::MaxLen => DeathReason::Maxlen,
        DeadLetterReason::DeliveryLimit => DeathReason::DeliveryLimit,
    }
}

/// Why a round did not settle its messages.
enum RoundFailed {
    /// Some message reached no queue.
    Unrouted,
    /// A target refused a copy, lost it, or did not confirm in time.
    Refused,
}

/// Runs while the queue holds messages to dead-letter, on every member;
/// only the leader's republishes.
pub async fn run(queue: Arc<QuorumQueue>) {
    let mut retry = RETRY_MIN;
    loop {
        if queue.is_stopped() {
            return;
        }
        let pending = queue.pending_dead_letters(BATCH_MESSAGES);
        if pending.is_empty() {
            if queue.stop_dead_lettering() {
                return;
            }
            continue;
        }
        if !queue.leads() {
            tokio::time::sleep(FOLLOWER_POLL).await;
            continue;
        }
        match round(&queue, pending).await {
            Ok(()) => retry = RETRY_MIN,
            Err(failed) => {
                if matches!(failed, RoundFailed::Unrouted) && retry == RETRY_MIN {
                    tracing::warn!(queue = %queue.name(), "dead-lettered messages reach no queue; they stay in the queue and are tried again (at-least-once dead-lettering)");
                }
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }
}

/// Republishes `pending`, waits for every target's confirm, and settles
/// them through the log.
async fn round(
    queue: &Arc<QuorumQueue>,
    pending: Vec<(DeadLetterReason, u64, Option<Arc<crate::message::Message>>)>,
) -> Result<(), RoundFailed> {
    let unread: Vec<u64> = pending
        .iter()
        .filter(|(_, _, body)| body.is_none())
        .map(|(_, index, _)| *index)
        .collect();
    let mut read = HashMap::new();
    if !unread.is_empty() {
        let reader = Arc::clone(queue);
        match tokio::task::spawn_blocking(move || reader.read_bodies(&unread)).await {
            Ok(Ok((bodies, _missing))) => read = bodies,
            Ok(Err(error)) => {
                tracing::warn!(queue = %queue.name(), %error, "could not read dead-lettered messages back from the log; retrying");
                return Err(RoundFailed::Refused);
            }
            Err(_) => return Err(RoundFailed::Refused),
        }
    }
    let indexes: Vec<u64> = pending.iter().map(|(_, index, _)| *index).collect();
    let mut dead_letters = Vec::with_capacity(pending.len());
    for (reason, index, body) in pending {
        // A body the log no longer holds cannot be republished: it is
        // settled with the rest (and was reported when it was missed).
        if let Some(message) = body.or_else(|| read.remove(&index)) {
            dead_letters.push(DeadLetter {
                message,
                reason: death_reason(reason),
            });
        }
    }
    if !dead_letters.is_empty() {
        let outcomes = queue
            .republish_dead_letters(dead_letters)
            .ok_or(RoundFailed::Unrouted)?;
        wait_for_confirms(outcomes).await?;
    }
    match queue.settle_dead_letters(indexes).await {
        Ok(()) => Ok(()),
        // Not settled (a leader change): the next leader republishes.
        Err(_) => Err(RoundFailed::Refused),
    }
}

/// Waits until every target has its copy safe.
async fn wait_for_confirms(outcomes: Vec<PublishOutcome>) -> Result<(), RoundFailed> {
    let deadline = Instant::now() + CONFIRM_TIMEOUT;
    let mut waiting = Vec::new();
    for outcome in outcomes {
        match outcome {
            PublishOutcome::Enqueued => {}
            PublishOutcome::Pending(safety) => waiting.push(safety),
            PublishOutcome::Rejected | PublishOutcome::Unavailable => {
                return Err(RoundFailed::Refused)
            }
        }
    }
    loop {
        let mut pending = false;
        for safety in &waiting {
            match safety.status() {
                ConfirmStatus::Confirmed => {}
                ConfirmStatus::Pending => pending = true,
                ConfirmStatus::Refused => return Err(RoundFailed::Refused),
            }
        }
        if !pending {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(RoundFailed::Refused);
        }
        tokio::time::sleep(CONFIRM_POLL).await;
    }
}
