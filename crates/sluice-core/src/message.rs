//! A published message as the broker holds it.

use bytes::Bytes;
use sluice_wire::content::RawProperties;

/// A message: where it was published, its properties as raw bytes and its
/// body, both usually slices of the buffer the publisher's frames were read
/// into. Shared by every queue it was routed to.
#[derive(Clone, Debug)]
pub struct Message {
    pub exchange: Bytes,
    pub routing_key: Bytes,
    pub properties: RawProperties,
    pub body: Bytes,
}

impl Message {
    /// Bytes this message holds: what queue length limits and memory
    /// accounting count (RabbitMQ counts the body only for
    /// `x-max-length-bytes`; this is the body size).
    pub fn body_size(&self) -> usize {
        self.body.len()
    }
}

/// A message in a queue, or out with a consumer. `offset` orders messages
/// within their queue, and is the id a channel settles it by: requeued
/// messages go back to where they were.
#[derive(Clone, Debug)]
pub struct QueuedMessage {
    pub offset: u64,
    pub message: std::sync::Arc<Message>,
    pub redelivered: bool,
    /// The journal segment holding this message, when it is persisted.
    pub segment: Option<u64>,
    /// When it expires (`expiry::now_us`'s clock), `expiry::NEVER` for
    /// most messages. Stays with the message while it is out with a
    /// consumer, so a requeued message keeps its original expiry.
    pub expires_at_us: u64,
}
