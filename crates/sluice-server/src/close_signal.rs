//! Why a connection is told to close by someone other than its client: the
//! node shutting down, or an operator (the management API, or a user or
//! vhost deleted under the connection). Either way the client hears 320
//! CONNECTION_FORCED, with RabbitMQ's text for a shutdown and the
//! operator's reason otherwise.

use std::sync::Arc;

use sluice_core::error::AmqpError;
use sluice_wire::reply_code::ReplyCode;
use tokio::sync::watch;

/// What a shutdown closes connections with, in RabbitMQ's words.
const SHUTDOWN_TEXT: &str = "broker forced connection closure with reason 'shutdown'";

/// A connection's two sources of close requests.
pub struct CloseSignal {
    shutdown: watch::Receiver<bool>,
    /// None while the connection's registry entry is gone (it never is
    /// while the connection runs): then only shutdown is listened to.
    forced: Option<watch::Receiver<Option<Arc<str>>>>,
}

impl CloseSignal {
    pub fn new(shutdown: watch::Receiver<bool>, forced: watch::Receiver<Option<Arc<str>>>) -> Self {
        CloseSignal {
            shutdown,
            forced: Some(forced),
        }
    }

    /// Whether the node is shutting down (not merely this connection
    /// closed by an operator).
    pub fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Resolves at the next request to close, with what to close with.
    /// Cancel-safe, and resolves once per request, as `changed` does: a
    /// select that loses to another branch hears the request next time.
    /// A server handle dropped without a shutdown counts as one.
    pub async fn requested(&mut self) -> AmqpError {
        loop {
            let forced = async {
                match &mut self.forced {
                    Some(forced) => forced.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.shutdown.changed() => return shutdown_error(),
                still_open = forced => {
                    if !still_open {
                        self.forced = None;
                        continue;
                    }
                    let reason = self.forced.as_mut().and_then(|forced| forced.borrow_and_update().clone());
                    if let Some(reason) = reason {
                        return AmqpError::new(ReplyCode::ConnectionForced, reason.as_ref());
                    }
                }
            }
        }
    }
}

fn shutdown_error() -> AmqpError {
    AmqpError::new(ReplyCode::ConnectionForced, SHUTDOWN_TEXT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn close_signal_carries_the_operators_reason_once() {
        let (_shutdown, shutdown_receiver) = watch::channel(false);
        let (forced, forced_receiver) = watch::channel(None);
        let mut signal = CloseSignal::new(shutdown_receiver, forced_receiver);
        forced.send_replace(Some(Arc::from("bye")));
        let error = signal.requested().await;
        assert_eq!(error.code, ReplyCode::ConnectionForced);
        assert_eq!(error.text, "bye");
        assert!(!signal.shutting_down());
        let again = tokio::time::timeout(std::time::Duration::from_millis(20), signal.requested());
        assert!(again.await.is_err(), "heard once");
    }

    #[tokio::test]
    async fn close_signal_hears_shutdown() {
        let (shutdown, shutdown_receiver) = watch::channel(false);
        let (_forced, forced_receiver) = watch::channel(None);
        let mut signal = CloseSignal::new(shutdown_receiver, forced_receiver);
        shutdown.send_replace(true);
        assert_eq!(signal.requested().await.text, SHUTDOWN_TEXT);
        assert!(signal.shutting_down());
    }
}
