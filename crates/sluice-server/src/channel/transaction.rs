//! tx.select, commit and rollback: publishes and settles held until
//! commit, and the commit-ok once every message of it is safe.

use amq_protocol::protocol::{tx, AMQPClass};
use sluice_core::confirm::ConfirmStatus;
use sluice_core::error::{AmqpError, AmqpResult};

use super::{Channel, Transaction, TxOperation};
use crate::connection_context::ConnectionContext;
use crate::delivery::Unacked;
use crate::uncommitted::HeldByTransaction;

impl Channel {
    pub(super) fn handle_tx_method(
        &mut self,
        context: &ConnectionContext,
        method: tx::AMQPMethod,
    ) -> AmqpResult<()> {
        match method {
            tx::AMQPMethod::Select(_) => {
                if self.confirms.is_some() {
                    return Err(AmqpError::precondition_failed(
                        "cannot switch from confirm to tx mode",
                    ));
                }
                self.tx.get_or_insert_with(|| Transaction {
                    operations: Vec::new(),
                    held: HeldByTransaction::new(&context.uncommitted),
                });
                self.status.set_transactional();
                self.reply(
                    context,
                    AMQPClass::Tx(tx::AMQPMethod::SelectOk(tx::SelectOk {})),
                );
            }
            tx::AMQPMethod::Commit(_) => {
                let Some(transaction) = self.tx.as_mut() else {
                    return Err(AmqpError::precondition_failed(
                        "channel is not transactional",
                    ));
                };
                let operations = std::mem::take(&mut transaction.operations);
                transaction.held.release();
                // Leave tx mode while applying, so the operations take effect
                // instead of being buffered again.
                let transaction = self.tx.take();
                self.committing.get_or_insert_with(Default::default).replies += 1;
                let result = self.apply_transaction(context, operations);
                self.tx = transaction;
                if result.is_err() {
                    // The channel closes with the error: no commit-ok is owed.
                    self.committing = None;
                }
                result?;
                // Commit-ok now if nothing waits for the disk, else once the
                // sync round has it (the connection flushes this channel).
                self.settle_commit(context)?;
            }
            tx::AMQPMethod::Rollback(_) => {
                let Some(transaction) = self.tx.as_mut() else {
                    return Err(AmqpError::precondition_failed(
                        "channel is not transactional",
                    ));
                };
                let operations = std::mem::take(&mut transaction.operations);
                transaction.held.release();
                self.restore_held_acks(operations);
                self.reply(
                    context,
                    AMQPClass::Tx(tx::AMQPMethod::RollbackOk(tx::RollbackOk {})),
                );
            }
            other => {
                return Err(AmqpError::command_invalid(format!(
                    "unexpected method tx.{}",
                    AMQPClass::Tx(other).get_amqp_method_id()
                )))
            }
        }
        Ok(())
    }

    pub(super) fn apply_transaction(
        &mut self,
        context: &ConnectionContext,
        operations: Vec<TxOperation>,
    ) -> AmqpResult<()> {
        for operation in operations {
            match operation {
                TxOperation::Publish(message, publish) => {
                    self.route_and_enqueue(context, message, &publish)?
                }
                TxOperation::Settle {
                    mut settled,
                    requeue,
                } => {
                    self.deliveries.release_held(&settled);
                    let others_wait = self.deliveries.take_channel_prefetch_refusal();
                    self.finish_settle(&mut settled, requeue, others_wait);
                }
            }
        }
        Ok(())
    }

    /// The messages a transaction's acks, nacks and rejects took are
    /// unacked again (rollback, or the channel closing).
    pub(super) fn restore_held_acks(&mut self, operations: Vec<TxOperation>) {
        let held: Vec<Unacked> = operations
            .into_iter()
            .flat_map(|operation| match operation {
                TxOperation::Settle { settled, .. } => settled,
                TxOperation::Publish(..) => Vec::new(),
            })
            .collect();
        if !held.is_empty() {
            self.deliveries.restore(held);
        }
    }

    /// Sends the commit-ok of an applied transaction once every persistent
    /// message in it is on disk; RabbitMQ's "partial tx completion" when a
    /// queue refused one or its journal failed.
    pub(super) fn settle_commit(&mut self, context: &ConnectionContext) -> AmqpResult<()> {
        let Some(commit) = &self.committing else {
            return Ok(());
        };
        match commit.ticket.status() {
            ConfirmStatus::Refused => {
                self.committing = None;
                return Err(AmqpError::precondition_failed("partial tx completion"));
            }
            ConfirmStatus::Pending => return Ok(()),
            ConfirmStatus::Confirmed => {}
        }
        let replies = commit.replies;
        self.committing = None;
        for _ in 0..replies {
            self.reply(
                context,
                AMQPClass::Tx(tx::AMQPMethod::CommitOk(tx::CommitOk {})),
            );
        }
        Ok(())
    }
}
