//! A queue's journal: a segment log holding its persistent messages, the
//! messages it paged out, and acks; and the recovery that rebuilds a durable
//! queue from it.
//!
//! Records:
//! - a message (`offset`, exchange, routing key, raw properties, body): a
//!   persistent message entering a durable queue (`MESSAGE`), or any
//!   message written only to page it out of memory (`PAGED`, never
//!   recovered: transient messages are gone after a restart);
//! - a persistent message that expires (`MESSAGE_EXPIRING`): the same with
//!   its deadline as wall-clock time after the offset, so that its TTL keeps
//!   counting while the node is down, as in RabbitMQ;
//! - the same, moved forward by compaction (`MOVED`, `MOVED_PAGED`,
//!   `MOVED_EXPIRING`);
//! - a list of offsets of messages that left the queue for good (acked,
//!   dropped, purged).
//!
//! Recovery replays them: a persistent message written and never acked
//! comes back, marked redelivered, as a reference to its record; the body
//! stays on disk until the queue reads it back.
//!
//! Segments are reclaimed whole, oldest first: a segment can go once every
//! message in it has left the queue and every older segment is gone (its
//! ack records then refer only to messages that no longer exist). When a
//! few old messages pin a run of otherwise dead segments, compaction moves
//! them to the head of the log, and the run goes.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use sluice_store::group_commit::{Location, Sequence};
use sluice_store::log::{RecordView, SegmentLog};
use sluice_store::record::RECORD_HEADER_SIZE;
use sluice_store::{GroupCommit, LogBuffer, StoreError};
use sluice_wire::content::RawProperties;

use crate::message::Message;
use crate::paging::{PagedMessage, StoreSettings};
use crate::segment_liveness::SegmentLiveness;

const KIND_MESSAGE: u8 = 1;
const KIND_ACKS: u8 = 2;
const KIND_PAGED: u8 = 3;
const KIND_MOVED: u8 = 4;
const KIND_MOVED_PAGED: u8 = 5;
const KIND_MESSAGE_EXPIRING: u8 = 6;
const KIND_MOVED_EXPIRING: u8 = 7;

/// Whether a record of this kind holds a message.
fn is_message(kind: u8) -> bool {
    matches!(
        kind,
        KIND_MESSAGE
            | KIND_PAGED
            | KIND_MOVED
            | KIND_MOVED_PAGED
            | KIND_MESSAGE_EXPIRING
            | KIND_MOVED_EXPIRING
    )
}

/// Whether a message record of this kind carries its deadline.
fn is_expiring(kind: u8) -> bool {
    matches!(kind, KIND_MESSAGE_EXPIRING | KIND_MOVED_EXPIRING)
}

/// Whether a message record of this kind is recovered after a restart.
fn is_persistent(kind: u8) -> bool {
    matches!(
        kind,
        KIND_MESSAGE | KIND_MOVED | KIND_MESSAGE_EXPIRING | KIND_MOVED_EXPIRING
    )
}

/// The kind of a message record's copy moved forward by compaction.
fn moved_kind(kind: u8) -> u8 {
    match kind {
        KIND_MESSAGE | KIND_MOVED => KIND_MOVED,
        KIND_MESSAGE_EXPIRING | KIND_MOVED_EXPIRING => KIND_MOVED_EXPIRING,
        _ => KIND_MOVED_PAGED,
    }
}

/// Offsets per ack record: a purge of millions of messages is written as
/// many records of at most 512 KiB, never one that outgrows a segment.
const ACKS_PER_RECORD_MAX: usize = 64 * 1024;

/// Compaction runs when the oldest segments make a run at least this long
/// that is sparse as a whole (at most one live message in sixteen records):
/// the run's dead bytes are then most of this many segments, and moving its
/// few live messages costs a sixteenth of the run at most. A deep queue
/// drained in order never qualifies: past its oldest segment, everything is
/// live.
pub const COMPACTION_RUN_SEGMENTS_MIN: u64 = 4;

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

    /// Whether the message will never be durable: its log failed before
    /// syncing it. One synced before a later failure is safe on disk. The
    /// failure is read first: a log does not sync once it has failed.
    pub fn is_lost(&self) -> bool {
        self.log.is_lost(self.sequence)
    }
}

/// What a journal's replay found, record by record: every message record
/// in log order and every acked offset. Live is "written and never acked",
/// decided once at the end by sorting. Kept as flat vectors, not a map: 24
/// bytes a message, and a sorted log sorts in linear time.
#[derive(Default)]
struct Replayed {
    native: Vec<PagedMessage>,
    moved: Vec<PagedMessage>,
    /// (offset, wall-clock deadline in ms) of the messages that expire.
    deadlines: Vec<(u64, u64)>,
    acked: Vec<u64>,
    records_by_segment: BTreeMap<u64, u64>,
    next_offset: u64,
    corrupt: usize,
}

impl Replayed {
    fn take(&mut self, found: RecordView<'_>) {
        let kind = found.kind;
        let payload = found.payload;
        match kind {
            _ if is_message(kind) => {
                let Some((offset, body_size, deadline)) = peek_message(kind, payload) else {
                    self.corrupt += 1;
                    return;
                };
                self.next_offset = u64::max(self.next_offset, offset + 1);
                *self.records_by_segment.entry(found.segment).or_insert(0) += 1;
                let location = Location {
                    segment: found.segment,
                    position: found.position,
                    length: (RECORD_HEADER_SIZE + 1 + payload.len()) as u32,
                };
                let message = PagedMessage::new(offset, location, body_size, true);
                match kind {
                    KIND_MESSAGE | KIND_MESSAGE_EXPIRING => self.native.push(message),
                    KIND_MOVED | KIND_MOVED_EXPIRING => self.moved.push(message),
                    // Paged transient messages do not outlive the process.
                    _ => {}
                }
                // A moved copy carries the same deadline as the original.
                if let Some(deadline) = deadline {
                    self.deadlines.push((offset, deadline));
                }
            }
            KIND_ACKS => {
                let mut offsets = payload;
                while offsets.len() >= 8 {
                    let offset = offsets.get_u64();
                    // The messages acked may be gone with their segments,
                    // but their offsets must not be handed out again: this
                    // ack would take the new message with it at the next
                    // recovery.
                    self.next_offset = u64::max(self.next_offset, offset + 1);
                    self.acked.push(offset);
                }
            }
            _ => self.corrupt += 1,
        }
    }
}

pub struct QueueJournal {
    log: Arc<LogBuffer>,
    group: Arc<GroupCommit>,
    /// False for the paging file of a non-durable queue: nothing in it is
    /// ever recovered, so acks are not written.
    durable: bool,
    /// Which messages each segment still holds, oldest segment first.
    liveness: BTreeMap<u64, SegmentLiveness>,
    /// Where compaction moved live messages to, by offset.
    relocated: HashMap<u64, Location>,
    /// Segments emptied by compaction are deleted only once the moved
    /// copies are durable.
    reclaim_after: Option<Sequence>,
    /// Copies moved by a compaction died with a failed write: the old
    /// segments they were moved from stay for the rest of the run (the
    /// originals are read instead), and recovery sorts it out at restart.
    reclaim_disabled: bool,
    /// A run of sparse segments is waiting for compaction.
    compaction_wanted: bool,
    /// Where the last message was written in offset order (not moved).
    last_native_segment: u64,
}

/// A queue rebuilt from its journal.
pub struct RecoveredQueue {
    pub journal: QueueJournal,
    /// Messages never acked, in offset order, bodies on disk.
    pub messages: Vec<PagedMessage>,
    /// The saved deadlines (offset, wall-clock milliseconds) of those that
    /// expire, in offset order: apart from the references, since most
    /// messages never expire.
    pub deadlines: Vec<(u64, u64)>,
    pub next_offset: u64,
}

/// A message record found by scanning a segment for compaction.
pub struct FoundMessage {
    offset: u64,
    location: Location,
    kind: u8,
    payload: Bytes,
}

impl FoundMessage {
    /// Copies the record out of the scanned segment's buffer, so that the
    /// few records kept do not hold the whole segment in memory.
    pub fn detach(self) -> Self {
        FoundMessage {
            payload: Bytes::copy_from_slice(&self.payload),
            ..self
        }
    }
}

/// The bytes before a message record's properties: the offset, the
/// deadline when it has one, the exchange and the routing key.
fn message_head(offset: u64, wall_deadline_ms: Option<u64>, message: &Message) -> Vec<u8> {
    let mut head =
        Vec::with_capacity(16 + 2 + message.exchange.len() + message.routing_key.len() + 4);
    head.extend_from_slice(&offset.to_be_bytes());
    if let Some(deadline) = wall_deadline_ms {
        head.extend_from_slice(&deadline.to_be_bytes());
    }
    head.push(message.exchange.len() as u8);
    head.extend_from_slice(&message.exchange);
    head.push(message.routing_key.len() as u8);
    head.extend_from_slice(&message.routing_key);
    head.extend_from_slice(&(message.properties.as_bytes().len() as u32).to_be_bytes());
    head
}

/// Where the exchange name starts in a message record of this kind.
fn exchange_at(kind: u8) -> usize {
    if is_expiring(kind) {
        16
    } else {
        8
    }
}

/// The offset of a message record, the size of its body, and its saved
/// deadline if it has one.
fn peek_message(kind: u8, payload: &[u8]) -> Option<(u64, usize, Option<u64>)> {
    let offset = u64::from_be_bytes(payload.get(..8)?.try_into().ok()?);
    let deadline = if is_expiring(kind) {
        Some(u64::from_be_bytes(payload.get(8..16)?.try_into().ok()?))
    } else {
        None
    };
    let exchange_at = exchange_at(kind);
    let exchange_length = *payload.get(exchange_at)? as usize;
    let routing_key_at = exchange_at + 1 + exchange_length;
    let routing_key_length = *payload.get(routing_key_at)? as usize;
    let properties_at = routing_key_at + 1 + routing_key_length;
    let properties_length = u32::from_be_bytes(
        payload
            .get(properties_at..properties_at + 4)?
            .try_into()
            .ok()?,
    ) as usize;
    let body_at = properties_at + 4 + properties_length;
    let body_size = payload.len().checked_sub(body_at)?;
    Some((offset, body_size, deadline))
}

fn decode_message(kind: u8, mut payload: Bytes) -> Option<(u64, Message)> {
    let exchange_at = exchange_at(kind);
    if payload.len() < exchange_at + 1 {
        return None;
    }
    let offset = payload.get_u64();
    payload.advance(exchange_at - 8);
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

fn invalid_record(what: &str) -> StoreError {
    StoreError::io(
        "reading a message back",
        std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned()),
    )
}

/// Reads the message at `location` back from `log`. Runs off the queue's
/// lock: the pager reads this way while publishers keep appending.
pub fn read_message(log: &LogBuffer, location: Location) -> Result<Message, StoreError> {
    let record = log.read(location)?;
    if !is_message(record.kind) {
        return Err(invalid_record("the record is not a message"));
    }
    decode_message(record.kind, record.payload)
        .map(|(_, message)| message)
        .ok_or_else(|| invalid_record("the message record does not decode"))
}

/// The messages written and never acked, in offset order: each native
/// record, replaced by its moved copy when compaction made one, plus moved
/// copies whose original segment is gone; minus every acked offset. All
/// three inputs are sorted by offset, and `native` is filtered in place.
fn live_messages(
    mut native: Vec<PagedMessage>,
    moved: &[PagedMessage],
    acked: &[u64],
) -> Vec<PagedMessage> {
    let is_acked = {
        let mut acked = acked.iter().peekable();
        move |offset: u64| {
            while acked.next_if(|acked| **acked < offset).is_some() {}
            acked.peek().is_some_and(|acked| **acked == offset)
        }
    };
    if moved.is_empty() {
        let mut is_acked = is_acked;
        native.retain(|message| !is_acked(message.offset));
        return native;
    }
    let mut merged = Vec::with_capacity(native.len() + moved.len());
    let mut moved = moved.iter().peekable();
    for message in native {
        while let Some(copy) = moved.next_if(|copy| copy.offset < message.offset) {
            merged.push(*copy);
        }
        match moved.next_if(|copy| copy.offset == message.offset) {
            Some(copy) => merged.push(*copy),
            None => merged.push(message),
        }
    }
    merged.extend(moved.copied());
    let mut is_acked = is_acked;
    merged.retain(|message| !is_acked(message.offset));
    merged
}

/// The saved deadlines of the live messages: `deadlines` holds one entry
/// per message record that had one, live or not, moved copies included.
fn live_deadlines(mut deadlines: Vec<(u64, u64)>, live: &[PagedMessage]) -> Vec<(u64, u64)> {
    if deadlines.is_empty() {
        return deadlines;
    }
    deadlines.sort_unstable();
    deadlines.dedup_by_key(|(offset, _)| *offset);
    let mut live = live.iter().map(|message| message.offset).peekable();
    deadlines.retain(|(offset, _)| {
        while live.next_if(|live| live < offset).is_some() {}
        live.peek() == Some(offset)
    });
    deadlines
}

impl QueueJournal {
    fn new(log: Arc<LogBuffer>, group: Arc<GroupCommit>, durable: bool) -> Self {
        QueueJournal {
            group,
            durable,
            liveness: BTreeMap::new(),
            relocated: HashMap::new(),
            reclaim_after: None,
            reclaim_disabled: false,
            compaction_wanted: false,
            last_native_segment: log.head_segment(),
            log,
        }
    }

    /// Opens (or creates) a durable queue's journal in `dir` and replays it,
    /// one segment in memory at a time.
    pub fn recover(
        dir: &Path,
        group: Arc<GroupCommit>,
        settings: &StoreSettings,
    ) -> Result<RecoveredQueue, StoreError> {
        let mut replayed = Replayed::default();
        let log =
            SegmentLog::recover_with(dir, settings.missing_segments, |found| replayed.take(found))?;
        if replayed.corrupt > 0 {
            tracing::warn!(dir = %dir.display(), corrupt = replayed.corrupt, "skipped journal records that do not decode");
        }
        let Replayed {
            native,
            mut moved,
            deadlines,
            mut acked,
            records_by_segment,
            next_offset,
            ..
        } = replayed;
        // A message moved twice has two copies; the later one is current.
        moved.sort_by_key(|message| message.offset);
        moved.dedup_by(|later, earlier| {
            let same = later.offset == earlier.offset;
            if same {
                *earlier = *later;
            }
            same
        });
        acked.sort_unstable();
        acked.dedup();
        let mut native = native;
        native.sort_unstable_by_key(|message| message.offset);
        let messages = live_messages(native, &moved, &acked);
        let deadlines = live_deadlines(deadlines, &messages);
        let log = LogBuffer::with_preallocation(log, settings.segment_size_bytes);
        // A failed write (a full disk, no descriptors left) nacks what it
        // held; the queue takes messages again once the condition clears.
        log.retry_after_failures();
        let mut journal = QueueJournal::new(log, group, true);
        journal.count_live(&messages, &moved, records_by_segment);
        journal.reclaim(true);
        Ok(RecoveredQueue {
            journal,
            messages,
            deadlines,
            next_offset,
        })
    }

    /// Marks each segment's live messages and moved-in copies, and how many
    /// message records it holds, so that reclaim and compaction know which
    /// segments are done with.
    fn count_live(
        &mut self,
        messages: &[PagedMessage],
        moved: &[PagedMessage],
        records_by_segment: BTreeMap<u64, u64>,
    ) {
        let mut moved = moved.iter().peekable();
        for message in messages {
            let segment = self.liveness.entry(message.segment()).or_default();
            while moved.next_if(|copy| copy.offset < message.offset).is_some() {}
            if moved.next_if(|copy| *copy == message).is_some() {
                segment.add_moved_in();
                self.relocated.insert(message.offset, message.location());
            } else {
                segment.mark_live(message.offset);
            }
        }
        for (segment, records) in records_by_segment {
            if let Some(liveness) = self.liveness.get_mut(&segment) {
                liveness.set_records(records);
            }
        }
    }

    /// A new, empty paging file for a non-durable queue in `dir`, replacing
    /// anything left there.
    pub fn create_paging(
        dir: &Path,
        group: Arc<GroupCommit>,
        settings: &StoreSettings,
    ) -> Result<Self, StoreError> {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(StoreError::io(format!("clearing {}", dir.display()), error)),
        }
        let log = SegmentLog::recover(dir, |_| {})?;
        let log = LogBuffer::new(log, settings.segment_size_bytes);
        log.retry_after_failures();
        Ok(QueueJournal::new(log, group, false))
    }

    pub fn is_durable(&self) -> bool {
        self.durable
    }

    /// Appends a persistent message of a durable queue, with its deadline
    /// (wall-clock milliseconds) when it expires; returns where it lives and
    /// what to wait for before confirming it. None when the journal has
    /// failed.
    pub fn append_message(
        &mut self,
        offset: u64,
        message: &Message,
        wall_deadline_ms: Option<u64>,
    ) -> Option<(Location, Durability)> {
        let kind = if wall_deadline_ms.is_some() {
            KIND_MESSAGE_EXPIRING
        } else {
            KIND_MESSAGE
        };
        let (location, sequence) = self.append_native(kind, offset, wall_deadline_ms, message)?;
        Some((
            location,
            Durability {
                log: Arc::clone(&self.log),
                sequence,
            },
        ))
    }

    /// Writes a message only to page it out of memory: no fsync, and it is
    /// not recovered after a restart.
    pub fn append_paged(&mut self, offset: u64, message: &Message) -> Option<Location> {
        self.append_native(KIND_PAGED, offset, None, message)
            .map(|(location, _)| location)
    }

    fn append_native(
        &mut self,
        kind: u8,
        offset: u64,
        wall_deadline_ms: Option<u64>,
        message: &Message,
    ) -> Option<(Location, Sequence)> {
        // The segment of the previous native append stands in for the head
        // (no lock of the log per message). When the log has rolled since,
        // the head's bitmap is empty or younger, so a new segment started
        // here is at worst one more than needed, never one too few.
        if self
            .liveness
            .get(&self.last_native_segment)
            .is_some_and(|liveness| liveness.would_exceed_span(offset))
        {
            self.log.start_new_segment();
        }
        let head = message_head(offset, wall_deadline_ms, message);
        let parts: [&[u8]; 3] = [&head, message.properties.as_bytes(), &message.body];
        let (location, sequence) = if is_persistent(kind) {
            self.log.append(&self.group, kind, &parts)?
        } else {
            self.log.append_unsynced(&self.group, kind, &parts)?
        };
        self.liveness
            .entry(location.segment)
            .or_default()
            .mark_live(offset);
        self.last_native_segment = location.segment;
        Some((location, sequence))
    }

    /// Records that these messages left the queue for good. Acks need no
    /// fsync of their own: losing one in a crash only means a redelivery.
    /// Takes (offset, segment) pairs of messages written to this journal.
    pub fn append_acks(&mut self, messages: impl IntoIterator<Item = (u64, u64)>) {
        let mut offsets = Vec::new();
        let mut emptied = false;
        for (offset, segment) in messages {
            if self.durable {
                offsets.extend_from_slice(&offset.to_be_bytes());
                if offsets.len() >= ACKS_PER_RECORD_MAX * 8 {
                    self.write_acks(&offsets);
                    offsets.clear();
                }
            }
            let relocated = if self.relocated.is_empty() {
                None
            } else {
                self.relocated.remove(&offset)
            };
            emptied |= match relocated {
                Some(location) => {
                    self.liveness
                        .get_mut(&location.segment)
                        .is_some_and(|liveness| {
                            liveness.remove_moved_in();
                            liveness.live() == 0
                        })
                }
                None => self
                    .liveness
                    .get_mut(&segment)
                    .is_some_and(|liveness| liveness.mark_dead(offset) && liveness.live() == 0),
            };
        }
        if !offsets.is_empty() {
            self.write_acks(&offsets);
        }
        if emptied {
            self.reclaim(false);
        }
    }

    fn write_acks(&self, offsets: &[u8]) {
        let _ = self.log.append_unsynced(&self.group, KIND_ACKS, &[offsets]);
    }

    /// Where the message at `offset`, last known at `location`, is now.
    pub fn resolve(&self, offset: u64, location: Location) -> Location {
        if self.relocated.is_empty() {
            return location;
        }
        self.relocated.get(&offset).copied().unwrap_or(location)
    }

    /// The log, for reading messages back without the queue's lock.
    pub fn log(&self) -> &Arc<LogBuffer> {
        &self.log
    }

    /// Bytes appended and not yet written to the file.
    pub fn unwritten_bytes(&self) -> u64 {
        self.log.unwritten_bytes()
    }

    /// Deletes the oldest segments once nothing in them is live, and notes
    /// when a run of sparse segments is worth compacting. Touches the files
    /// only when a segment emptied (or `always`, at recovery): the log's
    /// lock is also held by the sync thread across an fsync, and an ack must
    /// not wait for that.
    pub fn reclaim(&mut self, mut always: bool) {
        if self.log.has_failed() || self.reclaim_disabled {
            // Copies moved by compaction may have died in the buffer with
            // the failure: the old segments stay, and recovery sorts it out.
            return;
        }
        if let Some(sequence) = self.reclaim_after {
            if self.log.is_lost(sequence) {
                tracing::warn!(dir = %self.log.dir().display(), "copies moved by compaction were lost with a failed write: this journal's old segments are kept until restart");
                self.reclaim_disabled = true;
                return;
            }
            if !self.log.is_synced(sequence) {
                return;
            }
            self.reclaim_after = None;
            always = true;
        }
        let head = self.log.head_segment();
        let mut first_needed = head;
        let mut died = false;
        while let Some((&segment, liveness)) = self.liveness.first_key_value() {
            if liveness.live() > 0 || segment >= head {
                first_needed = segment.min(head);
                break;
            }
            self.liveness.remove(&segment);
            died = true;
        }
        if died || always {
            if let Err(error) = self.log.remove_segments_before(first_needed) {
                tracing::warn!(%error, "could not delete a fully acked journal segment");
            }
        }
        self.compaction_wanted = !self.compaction_run(head).is_empty();
    }

    /// The live-holding segments of the oldest run of segments that is
    /// sparse as a whole (at most one live message in sixteen records),
    /// when the run is long enough to be worth compacting.
    fn compaction_run(&self, head: u64) -> Vec<u64> {
        let Some((&oldest, _)) = self.liveness.first_key_value() else {
            return Vec::new();
        };
        let (mut live, mut records) = (0, 0);
        let mut run_end = oldest;
        for (&segment, liveness) in self.liveness.range(oldest..head) {
            live += liveness.live();
            records += liveness.records();
            if live * 16 <= records {
                run_end = segment + 1;
            }
        }
        // Segments holding only acks have no entry; they count by id.
        if live * 16 <= records {
            run_end = head;
        }
        if run_end.saturating_sub(oldest) < COMPACTION_RUN_SEGMENTS_MIN {
            return Vec::new();
        }
        self.liveness
            .range(oldest..run_end)
            .filter(|(_, liveness)| liveness.live() > 0)
            .map(|(&segment, _)| segment)
            .collect()
    }

    /// Whether a run of sparse segments waits for compaction.
    pub fn wants_compaction(&self) -> bool {
        self.compaction_wanted && self.reclaim_after.is_none() && !self.reclaim_disabled
    }

    /// The segments to scan for compaction, and the log to scan them in.
    pub fn compaction_segments(&self) -> Vec<u64> {
        self.compaction_run(self.log.head_segment())
    }

    /// Scans one segment for its message records. Runs off the queue's
    /// lock; only the live ones are moved, which [`Self::relocate`] checks
    /// under it. None while the segment is still partly buffered.
    pub fn scan_messages(
        log: &LogBuffer,
        segment: u64,
    ) -> Result<Option<Vec<FoundMessage>>, StoreError> {
        let Some(records) = log.scan_segment(segment)? else {
            return Ok(None);
        };
        Ok(Some(
            records
                .into_iter()
                .filter(|(_, record)| is_message(record.kind))
                .filter_map(|(location, record)| {
                    let (offset, _, _) = peek_message(record.kind, &record.payload)?;
                    Some(FoundMessage {
                        offset,
                        location,
                        kind: record.kind,
                        payload: record.payload,
                    })
                })
                .collect(),
        ))
    }

    /// Whether a found record is still the live copy of its message.
    pub fn is_live(&self, found: &FoundMessage) -> bool {
        match self.relocated.get(&found.offset) {
            Some(location) => *location == found.location,
            None => self
                .liveness
                .get(&found.location.segment)
                .is_some_and(|liveness| liveness.is_live(found.offset)),
        }
    }

    /// Moves the still-live messages among `found` to the head of the log.
    /// Their old segments are deleted once the copies are durable. Returns
    /// how many moved.
    pub fn relocate(&mut self, found: Vec<FoundMessage>) -> usize {
        let mut moved = 0;
        let mut last_copy = 0;
        for message in found {
            if !self.is_live(&message) {
                continue;
            }
            let persistent = is_persistent(message.kind);
            let kind = moved_kind(message.kind);
            let appended = if persistent {
                self.log.append(&self.group, kind, &[&message.payload])
            } else {
                self.log
                    .append_unsynced(&self.group, kind, &[&message.payload])
            };
            let Some((location, sequence)) = appended else {
                break;
            };
            last_copy = last_copy.max(sequence);
            let old_segment = message.location.segment;
            if let Some(old) = self.liveness.get_mut(&old_segment) {
                if self.relocated.contains_key(&message.offset) {
                    old.remove_moved_in();
                } else {
                    old.mark_dead(message.offset);
                }
            }
            self.relocated.insert(message.offset, location);
            self.liveness
                .entry(location.segment)
                .or_default()
                .add_moved_in();
            moved += 1;
        }
        if moved > 0 {
            // An empty ack record that needs the disk: the round carrying it
            // fsyncs everything before it, the moved copies included, and the
            // old segments may go once it is synced.
            // Without it (the log failed meanwhile), the last copy's own
            // sequence says whether the copies survived.
            self.reclaim_after = Some(
                self.log
                    .append(&self.group, KIND_ACKS, &[&[]])
                    .map_or(last_copy, |(_, sequence)| sequence),
            );
        }
        self.compaction_wanted = false;
        moved
    }

    /// The sequence the moved copies wait for, if any.
    pub fn reclaim_waits_for(&self) -> Option<Sequence> {
        self.reclaim_after
    }

    /// The queue was deleted: its journal goes with it.
    pub fn destroy(&self) {
        if let Err(error) = self.log.destroy() {
            tracing::warn!(%error, "could not delete a deleted queue's journal");
        }
    }
}
