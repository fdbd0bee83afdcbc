//! Who receives each channel's frames.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::node_name::NodeName;

/// Frames a channel's subscriber may have waiting. Past it, the link's
/// reader waits for the subscriber, and TCP carries the wait back to the
/// sending node: back pressure end to end.
pub const CHANNEL_QUEUE_FRAMES: usize = 1024;

/// A data frame from a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    pub from: NodeName,
    /// Which of the links to `from` carried it (see
    /// [`super::Links::generation`]): a frame of a link that since went
    /// down belongs to a conversation that ended with it.
    pub link: u64,
    pub channel: u16,
    pub payload: Bytes,
}

#[derive(Default)]
pub struct Subscribers {
    /// At most one subscriber per channel number: 65536 entries at most.
    channels: Mutex<HashMap<u16, mpsc::Sender<Received>>>,
}

impl Subscribers {
    /// Registers the receiver of `channel`'s frames, replacing any earlier
    /// one.
    pub fn subscribe(&self, channel: u16) -> mpsc::Receiver<Received> {
        let (sender, receiver) = mpsc::channel(CHANNEL_QUEUE_FRAMES);
        self.channels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(channel, sender);
        receiver
    }

    /// Hands a frame to its channel's subscriber, waiting while it is
    /// behind. A frame for a channel nobody subscribed to is dropped: the
    /// peer runs a layer this node does not (yet) have.
    pub async fn deliver(&self, from: &NodeName, link: u64, channel: u16, payload: Bytes) {
        let sender = self
            .channels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&channel)
            .cloned();
        let Some(sender) = sender else {
            tracing::debug!(peer = %from, channel, "dropped a frame for a channel nobody receives");
            return;
        };
        let _ = sender
            .send(Received {
                from: from.clone(),
                link,
                channel,
                payload,
            })
            .await;
    }
}
