//! A method that changes the metadata (a declaration, a deletion, a
//! binding) is answered only once the metadata log applied it on this
//! node. The channel hands its proposal to the connection, which waits for
//! it before it reads the next frame, then lets the channel finish: reply,
//! or fail with the error every node computed.

use std::sync::{Arc, Mutex};

use sluice_core::error::{AmqpError, AmqpResult};
use sluice_core::metadata::{MetadataCommand, Proposal};
use sluice_core::queue::forwarding::RemoteReply;
use sluice_wire::reply_code::ReplyCode;

use super::Channel;
use crate::connection_context::ConnectionContext;

/// What the channel does once its proposal is settled: with the proposal's
/// outcome, reply or fail.
pub type AfterChange =
    Box<dyn FnOnce(&mut Channel, &ConnectionContext, AmqpResult<()>) -> AmqpResult<()> + Send>;

/// A proposal under way and what follows it. Behind a mutex only so that
/// the connection holding it stays `Sync` (the proposal's future need not
/// be); it is taken apart before it is awaited, never locked twice.
pub struct PendingChange(std::sync::Mutex<(Proposal, AfterChange)>);

impl PendingChange {
    pub fn new(proposal: Proposal, then: AfterChange) -> Self {
        PendingChange(std::sync::Mutex::new((proposal, then)))
    }

    /// The proposal to await, and what the channel does with its outcome.
    pub fn into_parts(self) -> (Proposal, AfterChange) {
        self.0
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Channel {
    /// Proposes `command`; `then` finishes the method once it is applied
    /// (or refused). The connection waits for it before anything else.
    pub(super) fn propose(
        &mut self,
        context: &ConnectionContext,
        command: MetadataCommand,
        then: impl FnOnce(&mut Channel, &ConnectionContext, AmqpResult<()>) -> AmqpResult<()>
            + Send
            + 'static,
    ) {
        debug_assert!(self.pending_change.is_none(), "one change at a time");
        self.pending_change = Some(PendingChange::new(
            context.broker.metadata.propose(command),
            Box::new(then),
        ));
    }

    /// Waits for another node's answer to a forwarded request (a consume,
    /// basic.get, purge or counts of a queue homed there) the way a
    /// metadata change is waited for; `then` finishes the method with it.
    pub(super) fn await_remote<T: Send + 'static>(
        &mut self,
        reply: RemoteReply<T>,
        then: impl FnOnce(&mut Channel, &ConnectionContext, AmqpResult<T>) -> AmqpResult<()>
            + Send
            + 'static,
    ) {
        debug_assert!(self.pending_change.is_none(), "one wait at a time");
        let answer = Arc::new(Mutex::new(None));
        let filled = Arc::clone(&answer);
        let waited: Proposal = Box::pin(async move {
            let result = reply.await;
            *filled
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(result);
            Ok(())
        });
        self.pending_change = Some(PendingChange::new(
            waited,
            Box::new(move |channel, context, _| {
                let result = answer
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .take()
                    .unwrap_or_else(|| {
                        Err(AmqpError::new(
                            ReplyCode::InternalError,
                            "a forwarded request ended without an answer",
                        ))
                    });
                then(channel, context, result)
            }),
        ));
    }

    /// The change the last method started, for the connection to wait on.
    pub fn take_pending_change(&mut self) -> Option<PendingChange> {
        self.pending_change.take()
    }
}
