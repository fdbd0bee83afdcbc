//! A connection's output buffer and the task that writes it to the socket.
//!
//! Everything a connection sends (replies, confirms, deliveries from any
//! queue on any thread) is appended to one buffer under a short lock; the
//! writer task swaps it out and writes it with one syscall. Under load many
//! frames share a write, so the per-message cost of the syscall shrinks.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::BytesMut;
use sluice_wire::encode::encode_heartbeat;
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

use crate::client_stream::ClientWriteHalf;
use crate::connection_registry::ConnectionStats;
use crate::in_flight::InFlightBytes;
use crate::limits::{
    OUTBOX_DELIVERY_BYTES_MAX, OUTBOX_DELIVERY_FLOOR_BYTES, OUTBOX_READER_PAUSE_BYTES,
    OUTBOX_RETAINED_BYTES_MAX,
};

thread_local! {
    /// Outboxes appended to during the current wake batch on this thread.
    static DEFERRED_WAKES: RefCell<Option<Vec<Arc<Outbox>>>> = const { RefCell::new(None) };
}

/// While it lives, appends on this thread wake their writers once, when it
/// is dropped, instead of once per frame. A reader opens one around the
/// frames of one socket read: the deliveries and confirms they cause then
/// leave in one write per connection, not one write per message. It must
/// not live across an `.await` (the task could move to another thread).
/// Not `Send`: holding one across an `.await` in a spawned task does not
/// compile.
pub struct WakeBatch(std::marker::PhantomData<*const ()>);

impl WakeBatch {
    pub fn begin() -> Self {
        DEFERRED_WAKES.with(|deferred| {
            deferred.borrow_mut().get_or_insert_with(Vec::new);
        });
        WakeBatch(std::marker::PhantomData)
    }
}

impl Drop for WakeBatch {
    fn drop(&mut self) {
        let outboxes = DEFERRED_WAKES.with(|deferred| deferred.borrow_mut().take());
        for outbox in outboxes.into_iter().flatten() {
            outbox.has_data.notify_one();
        }
    }
}

pub struct Outbox {
    buffer: Mutex<BytesMut>,
    /// Wakes the writer when there is something to write.
    has_data: Notify,
    /// Wakes the reader (paused on a full buffer) and the delivery resumer
    /// when the writer has drained the buffer.
    drained: Notify,
    /// A delivery was refused because the buffer was full; once drained, the
    /// connection asks its queues to dispatch again.
    deliveries_refused: AtomicBool,
    /// The writer should flush what is left and stop.
    closing: AtomicBool,
    /// The socket failed: nothing more can be written.
    broken: AtomicBool,
    /// Every byte appended counts here until it is written or dropped.
    in_flight: Arc<InFlightBytes>,
    /// Counts the bytes written.
    stats: Arc<ConnectionStats>,
}

impl Drop for Outbox {
    fn drop(&mut self) {
        // What was never written leaves the count with the buffer.
        let unwritten = self.buffer.get_mut().map_or_else(
            |poisoned| poisoned.into_inner().len(),
            |buffer| buffer.len(),
        );
        self.in_flight.remove(unwritten);
    }
}

impl Outbox {
    pub fn new(in_flight: Arc<InFlightBytes>, stats: Arc<ConnectionStats>) -> Arc<Self> {
        Arc::new(Outbox {
            in_flight,
            stats,
            buffer: Mutex::new(BytesMut::new()),
            has_data: Notify::new(),
            drained: Notify::new(),
            deliveries_refused: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            broken: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, BytesMut> {
        self.buffer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends frames written by `write` and wakes the writer.
    pub fn append(self: &Arc<Self>, write: impl FnOnce(&mut BytesMut)) {
        let mut buffer = self.lock();
        let before = buffer.len();
        write(&mut buffer);
        self.in_flight.add(buffer.len() - before);
        drop(buffer);
        self.wake_writer();
    }

    /// Appends a delivery unless the buffer is over its delivery bound, in
    /// which case the refusal is remembered so the connection resumes
    /// deliveries once the writer drains it.
    pub fn append_delivery(self: &Arc<Self>, write: impl FnOnce(&mut BytesMut)) -> bool {
        let mut buffer = self.lock();
        let before = buffer.len();
        let full = before >= OUTBOX_DELIVERY_BYTES_MAX
            || (before >= OUTBOX_DELIVERY_FLOOR_BYTES && self.in_flight.is_over());
        if full || self.broken.load(Ordering::Relaxed) {
            // Below the floor the buffer is empty or nearly: its writer is
            // about to drain it, and then resumes this connection's queues.
            self.deliveries_refused.store(true, Ordering::Release);
            return false;
        }
        write(&mut buffer);
        self.in_flight.add(buffer.len() - before);
        drop(buffer);
        self.wake_writer();
        true
    }

    /// Wakes the writer now, or at the end of the current wake batch when
    /// one is open on this thread.
    fn wake_writer(self: &Arc<Self>) {
        let deferred = DEFERRED_WAKES.with(|deferred| match deferred.borrow_mut().as_mut() {
            Some(outboxes) => {
                if !outboxes.iter().any(|known| Arc::ptr_eq(known, self)) {
                    outboxes.push(Arc::clone(self));
                }
                true
            }
            None => false,
        });
        if !deferred {
            self.has_data.notify_one();
        }
    }

    pub fn take_deliveries_refused(&self) -> bool {
        self.deliveries_refused.swap(false, Ordering::AcqRel)
    }

    /// Waits while the buffer is over the bound at which the reader pauses.
    pub async fn wait_below_reader_pause(&self) {
        loop {
            let drained = self.drained.notified();
            if self.lock().len() < OUTBOX_READER_PAUSE_BYTES || self.broken.load(Ordering::Acquire)
            {
                return;
            }
            drained.await;
        }
    }

    /// Resolves each time the writer finishes a write.
    pub fn drained(&self) -> tokio::sync::futures::Notified<'_> {
        self.drained.notified()
    }

    /// Asks the writer to write what is buffered and then stop.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
        self.has_data.notify_one();
    }

    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// The writer task: writes whatever is buffered, sends heartbeats when the
    /// connection has been quiet for half the heartbeat interval, and stops
    /// when closed or when the socket fails.
    pub async fn run_writer(
        self: Arc<Self>,
        mut socket: ClientWriteHalf,
        heartbeat: Option<Duration>,
        resume_deliveries: impl Fn() + Send,
    ) {
        let mut spare = BytesMut::new();
        loop {
            let woken = match heartbeat {
                Some(interval) => tokio::time::timeout(interval / 2, self.has_data.notified())
                    .await
                    .is_ok(),
                None => {
                    self.has_data.notified().await;
                    true
                }
            };
            let mut pending = {
                let mut buffer = self.lock();
                if !woken && buffer.is_empty() {
                    encode_heartbeat(&mut buffer);
                    self.in_flight.add(buffer.len());
                }
                std::mem::replace(&mut *buffer, spare)
            };
            // Counted until written: a slow socket holds these bytes.
            let written = pending.len();
            if !pending.is_empty() {
                // The flush costs nothing on TCP; TLS sends its records there.
                let result = match socket.write_all(&pending).await {
                    Ok(()) => socket.flush().await,
                    Err(error) => Err(error),
                };
                self.in_flight.remove(written);
                self.stats.sent_bytes.add(written as u64);
                if let Err(error) = result {
                    tracing::debug!(%error, "socket write failed");
                    self.broken.store(true, Ordering::Release);
                    self.drained.notify_waiters();
                    return;
                }
            }
            pending.clear();
            // One huge message must not keep a huge buffer alive for the
            // rest of the connection's life.
            spare = if pending.capacity() > OUTBOX_RETAINED_BYTES_MAX {
                BytesMut::new()
            } else {
                pending
            };
            self.drained.notify_waiters();
            if self.take_deliveries_refused() {
                resume_deliveries();
            }
            if self.closing.load(Ordering::Acquire) && self.lock().is_empty() {
                let _ = socket.shutdown().await;
                return;
            }
        }
    }
}
