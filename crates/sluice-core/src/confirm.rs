//! Confirm tickets: what a publisher waits for before its confirm (or a
//! transaction before its commit-ok), gathered from every queue a message
//! was routed to. Each queue kind says when a message it took is safe:
//! a classic queue at once for a transient message and once its journal is
//! fsynced for a persistent one; a replicated queue once a majority of its
//! members have it. A message routed to several queues is confirmed when
//! all of them say so, and refused (nacked) when any refused it.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::queue_journal::Durability;

/// One queue's promise about one message, not kept yet.
#[derive(Clone)]
pub enum PendingSafety {
    /// Safe once the journal has synced past it.
    Journal(Durability),
    /// Safe once the home node of the queues it was forwarded to says so.
    Forwarded(Arc<ForwardedConfirm>),
}

impl PendingSafety {
    /// Where the message stands now.
    pub fn status(&self) -> ConfirmStatus {
        match self {
            // The failure is read first: a log does not sync once it failed,
            // and a message synced before the failure is safe on disk.
            PendingSafety::Journal(durability) if durability.is_lost() => ConfirmStatus::Refused,
            PendingSafety::Journal(durability) if durability.is_synced() => {
                ConfirmStatus::Confirmed
            }
            PendingSafety::Journal(_) => ConfirmStatus::Pending,
            PendingSafety::Forwarded(confirm) => confirm.status(),
        }
    }
}

/// Where a ticket stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfirmStatus {
    /// Every target queue has the message safe: basic.ack.
    Confirmed,
    /// Some target queue has not said yet.
    Pending,
    /// Some target queue refused the message or lost it: basic.nack.
    Refused,
}

/// What one publish (or one transaction) waits for. A transient message,
/// or one routed nowhere, is confirmed at once and allocates nothing.
#[derive(Clone, Default)]
pub struct ConfirmTicket {
    pending: Vec<PendingSafety>,
    refused: bool,
}

impl ConfirmTicket {
    /// A target queue will say later.
    pub fn wait_for(&mut self, safety: PendingSafety) {
        self.pending.push(safety);
    }

    /// A target queue refused the message (`reject-publish`, a journal
    /// that failed).
    pub fn refuse(&mut self) {
        self.refused = true;
    }

    /// Adds another publish's waits: a transaction commits once all its
    /// messages are safe.
    pub fn merge(&mut self, other: ConfirmTicket) {
        self.pending.extend(other.pending);
        self.refused |= other.refused;
    }

    /// Confirmed without waiting for anything: the common case, decided
    /// without looking at any queue.
    pub fn is_immediate(&self) -> bool {
        self.pending.is_empty() && !self.refused
    }

    pub fn status(&self) -> ConfirmStatus {
        if self.refused {
            return ConfirmStatus::Refused;
        }
        let mut status = ConfirmStatus::Confirmed;
        for safety in &self.pending {
            match safety.status() {
                ConfirmStatus::Refused => return ConfirmStatus::Refused,
                ConfirmStatus::Pending => status = ConfirmStatus::Pending,
                ConfirmStatus::Confirmed => {}
            }
        }
        status
    }
}

/// The home node's word on one forwarded publish, set once.
#[derive(Default)]
pub struct ForwardedConfirm(AtomicU8);

const PENDING: u8 = 0;
const CONFIRMED: u8 = 1;
const REFUSED: u8 = 2;

impl ForwardedConfirm {
    pub fn confirm(&self) {
        let _ = self
            .0
            .compare_exchange(PENDING, CONFIRMED, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Refused by the home node, or lost with the link to it.
    pub fn refuse(&self) {
        let _ = self
            .0
            .compare_exchange(PENDING, REFUSED, Ordering::AcqRel, Ordering::Acquire);
    }

    pub fn status(&self) -> ConfirmStatus {
        match self.0.load(Ordering::Acquire) {
            PENDING => ConfirmStatus::Pending,
            CONFIRMED => ConfirmStatus::Confirmed,
            _ => ConfirmStatus::Refused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confirm_ticket_without_waits_is_immediate_and_refusal_wins() {
        let mut ticket = ConfirmTicket::default();
        assert!(ticket.is_immediate());
        assert_eq!(ticket.status(), ConfirmStatus::Confirmed);
        let mut refused = ConfirmTicket::default();
        refused.refuse();
        ticket.merge(refused);
        assert!(!ticket.is_immediate());
        assert_eq!(ticket.status(), ConfirmStatus::Refused);
    }
}
