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
