//! A durable queue's journal: its persistent messages and their acks, in a
//! segment log, and the recovery that rebuilds the queue from it.
//!
//! Records: a message (`offset`, exchange, routing key, raw properties,
//! body) when a persistent message enters the queue; a list of offsets when
//! messages leave it for good (acked, dropped, purged). Recovery replays
//! both: what was written and never acked comes back, marked redelivered.
//!
//! Segments are reclaimed whole, oldest first: a segment can go once every
//! message in it has left the queue and every older segment is gone (its
//! ack records then refer only to messages that no longer exist).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use sluice_store::group_commit::{Location, Sequence};
use sluice_store::log::SegmentLog;
use sluice_store::{GroupCommit, LogBuffer, StoreError};
use sluice_wire::content::RawProperties;

use crate::message::Message;
use crate::queue::QueuedMessage;

const KIND_MESSAGE: u8 = 1;
const KIND_ACKS: u8 = 2;

/// Segment files of a queue's journal roll over at this size. Large enough
/// that rolling is rare, small enough that a segment with a few live
/// messages does not pin much disk.
pub const JOURNAL_SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// A persistent message is durable once its log has synced past this.
#[derive(Clone)]
pub struct Durability {
    pub log: Arc<LogBuffer>,
    pub sequence: Sequence,
}

impl Durability {
    pub fn is_synced(&self) -> bool {
        self.log.is_synced(self.sequence)
    }

    pub fn has_failed(&self) -> bool {
        self.log.has_failed()
    }
}

pub struct QueueJournal {
    log: Arc<LogBuffer>,
    group: Arc<GroupCommit>,
    /// Messages still in the queue, per segment, oldest segment first.
    live_by_segment: BTreeMap<u64, u64>,
}

/// A queue rebuilt from its journal.
pub struct RecoveredQueue {
    pub journal: QueueJournal,
    /// Messages never acked, in offset order.
    pub messages: Vec<QueuedMessage>,
    pub next_offset: u64,
}

fn encode_message(offset: u64, message: &Message) -> [Vec<u8>; 1] {
    let mut head =
        Vec::with_capacity(8 + 2 + message.exchange.len() + message.routing_key.len() + 4);
    head.extend_from_slice(&offset.to_be_bytes());
    head.push(message.exchange.len() as u8);
    head.extend_from_slice(&message.exchange);
    head.push(message.routing_key.len() as u8);
    head.extend_from_slice(&message.routing_key);
    head.extend_from_slice(&(message.properties.as_bytes().len() as u32).to_be_bytes());
    [head]
}

fn decode_message(mut payload: Bytes) -> Option<(u64, Message)> {
    if payload.len() < 9 {
        return None;
    }
    let offset = payload.get_u64();
    let short = |payload: &mut Bytes| -> Option<Bytes> {
        let length = *payload.first()? as usize;
        if payload.len() < 1 + length {
            return None;
        }
        payload.advance(1);
        Some(payload.split_to(length))
    };
    let exchange = short(&mut payload)?;
    let routing_key = short(&mut payload)?;
    if payload.len() < 4 {
        return None;
    }
    let properties_length = payload.get_u32() as usize;
    if payload.len() < properties_length {
        return None;
    }
    let properties = RawProperties::new(payload.split_to(properties_length)).ok()?;
    Some((
        offset,
        Message {
            exchange,
            routing_key,
            properties,
            body: payload,
        },
    ))
}

impl QueueJournal {
    /// Opens (or creates) the journal in `dir` and replays it.
    pub fn recover(dir: &Path, group: Arc<GroupCommit>) -> Result<RecoveredQueue, StoreError> {
        let (log, records) = SegmentLog::recover(dir)?;
        let mut messages: HashMap<u64, (u64, Message)> = HashMap::new();
        let mut next_offset = 0;
        let mut corrupt = 0usize;
        for found in records {
            match found.record.kind {
                KIND_MESSAGE => match decode_message(found.record.payload) {
                    Some((offset, message)) => {
                        next_offset = next_offset.max(offset + 1);
                        messages.insert(offset, (found.segment, message));
                    }
                    None => corrupt += 1,
                },
                KIND_ACKS => {
                    let mut payload = found.record.payload;
                    while payload.len() >= 8 {
                        messages.remove(&payload.get_u64());
                    }
                }
                _ => corrupt += 1,
            }
        }
        if corrupt > 0 {
            tracing::warn!(dir = %dir.display(), corrupt, "skipped journal records that do not decode");
        }
        let log = LogBuffer::new(log, JOURNAL_SEGMENT_BYTES);
        let mut live_by_segment = BTreeMap::new();
        let mut recovered: Vec<QueuedMessage> = messages
            .into_iter()
            .map(|(offset, (segment, message))| {
                *live_by_segment.entry(segment).or_insert(0) += 1;
                QueuedMessage {
                    offset,
                    message: Arc::new(message),
                    // It may have been delivered before the restart.
                    redelivered: true,
                    segment: Some(segment),
                }
            })
            .collect();
        recovered.sort_unstable_by_key(|entry| entry.offset);
        let mut journal = QueueJournal {
            log,
            group,
            live_by_segment,
        };
        journal.reclaim(true);
        Ok(RecoveredQueue {
            journal,
            messages: recovered,
            next_offset,
        })
    }

    /// Appends a persistent message; returns its segment and what to wait
    /// for before confirming it. None when the journal has failed.
    pub fn append_message(&mut self, offset: u64, message: &Message) -> Option<(u64, Durability)> {
        let [head] = encode_message(offset, message);
        let (location, sequence): (Location, Sequence) = self.log.append(
            &self.group,
            KIND_MESSAGE,
            &[&head, message.properties.as_bytes(), &message.body],
        )?;
        *self.live_by_segment.entry(location.segment).or_insert(0) += 1;
        Some((
            location.segment,
            Durability {
                log: Arc::clone(&self.log),
                sequence,
            },
        ))
    }

    /// Records that these messages left the queue for good. Acks need no
    /// fsync of their own: losing one in a crash only means a redelivery.
    /// Takes (offset, segment) pairs of persisted messages.
    pub fn append_acks(&mut self, messages: impl IntoIterator<Item = (u64, u64)>) {
        let mut offsets = Vec::new();
        for (offset, segment) in messages {
            offsets.extend_from_slice(&offset.to_be_bytes());
            if let Some(live) = self.live_by_segment.get_mut(&segment) {
                *live = live.saturating_sub(1);
            }
        }
        if offsets.is_empty() {
            return;
        }
        let _ = self
            .log
            .append_unsynced(&self.group, KIND_ACKS, &[&offsets]);
        self.reclaim(false);
    }

    /// Deletes the oldest segments once nothing in them is live. Touches the
    /// files only when a segment died (or `always`, at recovery): the log's
    /// lock is also held by the sync thread across an fsync, and an ack must
    /// not wait for that.
    fn reclaim(&mut self, always: bool) {
        let head = self.log.head_segment();
        let mut first_needed = head;
        let mut died = false;
        while let Some((&segment, &live)) = self.live_by_segment.first_key_value() {
            if live > 0 || segment >= head {
                first_needed = segment.min(head);
                break;
            }
            self.live_by_segment.remove(&segment);
            died = true;
        }
        if !died && !always {
            return;
        }
        if let Err(error) = self.log.remove_segments_before(first_needed) {
            tracing::warn!(%error, "could not delete a fully acked journal segment");
        }
    }

    /// The queue was deleted: its journal goes with it.
    pub fn destroy(&self) {
        if let Err(error) = self.log.destroy() {
            tracing::warn!(%error, "could not delete a deleted queue's journal");
        }
    }
}
