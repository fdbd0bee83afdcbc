//! The bounds on messages held by open transactions: a channel in tx mode
//! keeps its publishes in memory until commit, where no queue pages them to
//! disk and no consumer takes them. One transaction may hold
//! `TX_UNCOMMITTED_BYTES_MAX`; all of the node's together a share of the
//! memory watermark. Past either, the publish that crosses it closes its
//! channel with 406 PRECONDITION_FAILED, which drops what the transaction
//! held. Refusing, rather than waiting for room, keeps one client that
//! never commits from stalling the others: a connection waiting for room
//! could not send the commit that makes room.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sluice_core::error::{AmqpError, AmqpResult};

use crate::limits::TX_UNCOMMITTED_BYTES_MAX;

/// The node's uncommitted bytes across all transactions.
pub struct UncommittedBytes {
    total: AtomicU64,
    max: u64,
}

impl UncommittedBytes {
    pub fn new(max: u64) -> Arc<Self> {
        Arc::new(UncommittedBytes {
            total: AtomicU64::new(0),
            max,
        })
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Acquire)
    }
}

/// What one transaction holds, given back to the node when committed,
/// rolled back or dropped with its channel.
pub struct HeldByTransaction {
    node: Arc<UncommittedBytes>,
    bytes: u64,
}

impl HeldByTransaction {
    pub fn new(node: &Arc<UncommittedBytes>) -> Self {
        HeldByTransaction {
            node: Arc::clone(node),
            bytes: 0,
        }
    }

    /// Counts a publish of `bytes` more, or refuses it past a bound.
    pub fn hold(&mut self, bytes: u64) -> AmqpResult<()> {
        if self.bytes + bytes > TX_UNCOMMITTED_BYTES_MAX as u64 {
            return Err(AmqpError::precondition_failed(format!(
                "transaction holds more than {TX_UNCOMMITTED_BYTES_MAX} bytes of uncommitted messages"
            )));
        }
        let before = self.node.total.fetch_add(bytes, Ordering::AcqRel);
        if before + bytes > self.node.max {
            self.node.total.fetch_sub(bytes, Ordering::AcqRel);
            return Err(AmqpError::precondition_failed(format!(
                "transactions on this node hold more than {} bytes of uncommitted messages",
                self.node.max
            )));
        }
        self.bytes += bytes;
        Ok(())
    }

    /// The transaction ended: what it held is the node's no more.
    pub fn release(&mut self) {
        self.node
            .total
            .fetch_sub(std::mem::take(&mut self.bytes), Ordering::AcqRel);
    }
}

impl Drop for HeldByTransaction {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_wire::reply_code::ReplyCode;

    #[test]
    fn uncommitted_bytes_are_bounded_per_transaction_and_per_node() {
        let node = UncommittedBytes::new(1000);
        let mut first = HeldByTransaction::new(&node);
        let mut second = HeldByTransaction::new(&node);
        first.hold(600).unwrap();
        second.hold(300).unwrap();
        let refused = second.hold(200).unwrap_err();
        assert_eq!(refused.code, ReplyCode::PreconditionFailed);
        assert_eq!(
            refused.text,
            "transactions on this node hold more than 1000 bytes of uncommitted messages"
        );
        // A refused publish counts for nothing.
        assert_eq!(node.total(), 900);
        first.release();
        assert_eq!(node.total(), 300);
        second.hold(200).unwrap();
        drop(second);
        assert_eq!(node.total(), 0);

        let big = UncommittedBytes::new(u64::MAX / 2);
        let mut one = HeldByTransaction::new(&big);
        let refused = one.hold(TX_UNCOMMITTED_BYTES_MAX as u64 + 1).unwrap_err();
        assert!(refused.text.starts_with("transaction holds more than"));
    }
}
