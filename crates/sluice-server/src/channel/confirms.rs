//! Publisher confirms: sequence numbers, and basic.ack (or nack) written
//! once the confirm tickets of a run of publishes complete.

use sluice_core::confirm::ConfirmStatus;
use sluice_core::counters::MessageCounts;
use sluice_core::error::AmqpResult;
use sluice_wire::encode::encode_confirm;

use super::{Channel, Confirms};
use crate::connection_context::ConnectionContext;

impl Channel {
    /// Whether confirms or a commit-ok wait for a sync round.
    pub fn has_waiting_confirms(&self) -> bool {
        self.committing.is_some()
            || self
                .confirms
                .as_ref()
                .is_some_and(|confirms| !confirms.waiting.is_empty())
    }

    /// Writes the confirms accumulated while handling a batch of frames: one
    /// basic.ack with multiple for a run of publishes; and the commit-ok of
    /// a committed transaction once its messages are on disk. An error is a
    /// transaction that could not be completed: it closes the channel.
    pub fn flush_confirms(&mut self, context: &ConnectionContext) -> AmqpResult<()> {
        self.settle_commit(context)?;
        let channel_id = self.id;
        let Some(confirms) = self.confirms.as_mut() else {
            return Ok(());
        };
        let counts = &mut self.unflushed;
        let write_acks = |confirms: &mut Confirms, counts: &mut MessageCounts| {
            if confirms.confirmed_through == confirms.sent_through {
                return;
            }
            let confirmed = confirms.confirmed_through - confirms.sent_through;
            counts.add(|counts| &mut counts.confirmed, confirmed);
            let multiple = confirmed > 1;
            let delivery_tag = confirms.confirmed_through;
            confirms.sent_through = confirms.confirmed_through;
            context
                .outbox
                .append(|out| encode_confirm(out, channel_id, delivery_tag, multiple, true));
        };
        while let Some(front) = confirms.waiting.front() {
            let status = front.ticket.status();
            if status == ConfirmStatus::Refused {
                // Acks for earlier publishes go out first, so that a
                // multiple ack never covers this nack.
                let sequence = front.sequence;
                write_acks(confirms, counts);
                context
                    .outbox
                    .append(|out| encode_confirm(out, channel_id, sequence, false, false));
                counts.add(|counts| &mut counts.refused, 1);
                confirms.confirmed_through = sequence;
                confirms.sent_through = sequence;
            } else if status == ConfirmStatus::Confirmed {
                confirms.confirmed_through = front.sequence;
            } else {
                break;
            }
            confirms.waiting.pop_front();
        }
        write_acks(confirms, counts);
        Ok(())
    }
}
