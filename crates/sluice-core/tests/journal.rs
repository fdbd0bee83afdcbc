//! The queue journal on real files: appends, acks, segment roll-over and
//! reclaim, compaction, and recovery — including a randomised comparison of
//! recovery against a model of what must come back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_core::message::Message;
use sluice_core::paging::StoreSettings;
use sluice_core::queue_journal::{read_message, QueueJournal};
use sluice_store::group_commit::{Location, Sequence};
use sluice_store::{GroupCommit, LogBuffer};
use sluice_wire::content::RawProperties;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sluice-journal-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn settings(segment_size_bytes: u64) -> StoreSettings {
    StoreSettings {
        segment_size_bytes,
        ..StoreSettings::default()
    }
}

/// A persistent message whose body names its offset.
fn message(offset: u64, body_size: usize) -> Message {
    let mut body = format!("message {offset} ").into_bytes();
    body.resize(body_size.max(body.len()), b'.');
    Message {
        exchange: Bytes::from_static(b"amq.direct"),
        routing_key: Bytes::from_static(b"key"),
        // Property flags with delivery-mode set, then delivery-mode 2.
        properties: RawProperties::new(Bytes::from_static(&[0x10, 0x00, 0x02])).unwrap(),
        body: Bytes::from(body),
    }
}

fn segment_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|extension| extension == "seg")
        })
        .count()
}

fn wait_synced(log: &LogBuffer, sequence: Sequence) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log.is_synced(sequence) {
        assert!(Instant::now() < deadline, "the sync thread never synced");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Writes everything buffered by syncing one more persistent record.
fn flush(journal: &mut QueueJournal, offset: u64) -> Location {
    let (location, durability) = journal
        .append_message(offset, &message(offset, 10), None)
        .unwrap();
    wait_synced(&durability.log, durability.sequence);
    location
}

fn group() -> Arc<GroupCommit> {
    GroupCommit::start(Duration::ZERO, |_, _| {})
}

#[test]
fn persistent_messages_come_back_once_and_acked_or_paged_ones_do_not() {
    let dir = temp_dir("recover");
    let group = group();
    let recovered = QueueJournal::recover(&dir, Arc::clone(&group), &settings(1 << 20)).unwrap();
    let mut journal = recovered.journal;
    let mut segments = BTreeMap::new();
    for offset in 0..100 {
        let (location, _) = journal
            .append_message(offset, &message(offset, 100), None)
            .unwrap();
        segments.insert(offset, location.segment);
    }
    // Transient messages written only to page them out are not recovered.
    for offset in 100..120 {
        journal.append_paged(offset, &message(offset, 100)).unwrap();
    }
    journal.append_acks((0..40).map(|offset| (offset, segments[&offset])));
    flush(&mut journal, 120);
    drop(journal);

    let recovered = QueueJournal::recover(&dir, Arc::clone(&group), &settings(1 << 20)).unwrap();
    let offsets: Vec<u64> = recovered
        .messages
        .iter()
        .map(|paged| paged.offset)
        .collect();
    let expected: Vec<u64> = (40..100).chain([120]).collect();
    assert_eq!(offsets, expected);
    assert_eq!(recovered.next_offset, 121);
    for paged in &recovered.messages {
        assert!(paged.redelivered());
        let read = read_message(recovered.journal.log(), paged.location()).unwrap();
        assert!(read
            .body
            .starts_with(format!("message {} ", paged.offset).as_bytes()));
        assert_eq!(read.body.len(), paged.body_size as usize);
        assert!(read.properties.is_persistent());
    }
    // Dropping waits for a segment being zero-filled ahead, which
    // would otherwise race the removal below.
    drop(recovered);
    group.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn segments_roll_over_and_go_once_everything_in_them_is_acked() {
    let dir = temp_dir("reclaim");
    let group = group();
    let mut journal = QueueJournal::recover(&dir, Arc::clone(&group), &settings(4096))
        .unwrap()
        .journal;
    let mut written = Vec::new();
    for offset in 0..200 {
        let (location, _) = journal
            .append_message(offset, &message(offset, 200), None)
            .unwrap();
        written.push((offset, location.segment));
    }
    flush(&mut journal, 200);
    let before = segment_files(&dir);
    assert!(
        before > 10,
        "200 records of ~230 bytes span many 4 KiB segments: {before}"
    );
    journal.append_acks(written.iter().copied());
    flush(&mut journal, 201);
    journal.reclaim(true);
    let after = segment_files(&dir);
    assert!(
        after <= 2,
        "dead segments are deleted: {after} left of {before}"
    );
    // Dropping waits for a segment being zero-filled ahead, which
    // would otherwise race the removal below.
    drop(journal);
    group.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// When the segments holding acked messages are gone and only ack records
/// remain, recovery still hands out offsets past them: a new message under an
/// acked offset would be taken by the old ack at the next recovery.
#[test]
fn offsets_named_by_surviving_acks_are_not_reused() {
    let dir = temp_dir("acks-only");
    let group = group();
    let mut journal = QueueJournal::recover(&dir, Arc::clone(&group), &settings(4096))
        .unwrap()
        .journal;
    let mut written = Vec::new();
    for offset in 0..20 {
        let (location, _) = journal
            .append_message(offset, &message(offset, 100), None)
            .unwrap();
        written.push((offset, location.segment));
    }
    let last = flush(&mut journal, 20);
    written.push((20, last.segment));
    // The acks go to a segment of their own; the messages' segments are
    // then deleted.
    journal.log().start_new_segment();
    journal.append_acks(written.iter().copied());
    let deadline = Instant::now() + Duration::from_secs(10);
    while journal.unwritten_bytes() > 0 {
        assert!(Instant::now() < deadline, "the acks are never written");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(segment_files(&dir), 1, "only the acks' segment is left");
    drop(journal);
    let recovered = QueueJournal::recover(&dir, Arc::clone(&group), &settings(4096)).unwrap();
    assert!(recovered.messages.is_empty());
    assert_eq!(recovered.next_offset, 21);
    drop(recovered);
    group.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The compaction the pager runs, step by step.
fn compact(journal: &mut QueueJournal) -> usize {
    let log = Arc::clone(journal.log());
    let mut moved = 0;
    for segment in journal.compaction_segments() {
        // An old segment can still sit in the writer's buffer; the pager
        // skips it until the next round, and so does this.
        let Some(found) = QueueJournal::scan_messages(&log, segment).unwrap() else {
            continue;
        };
        let live: Vec<_> = found
            .into_iter()
            .filter(|found| journal.is_live(found))
            .map(|found| found.detach())
            .collect();
        moved += journal.relocate(live);
    }
    if let Some(sequence) = journal.reclaim_waits_for() {
        wait_synced(&log, sequence);
    }
    journal.reclaim(true);
    moved
}

#[test]
fn compaction_moves_a_few_pinning_messages_forward_and_frees_the_run() {
    let dir = temp_dir("compact");
    let group = group();
    let mut journal = QueueJournal::recover(&dir, Arc::clone(&group), &settings(4096))
        .unwrap()
        .journal;
    let mut locations = Vec::new();
    for offset in 0..300 {
        let (location, _) = journal
            .append_message(offset, &message(offset, 200), None)
            .unwrap();
        locations.push(location);
    }
    // Offsets 0 and 1 stay (a consumer holds them); everything else is acked.
    journal.append_acks((2..300).map(|offset| (offset, locations[offset as usize].segment)));
    flush(&mut journal, 300);
    journal.reclaim(false);
    let pinned = segment_files(&dir);
    assert!(
        pinned > 15,
        "two live messages pin the whole log: {pinned} segments"
    );
    assert!(journal.wants_compaction());

    assert_eq!(compact(&mut journal), 2);
    let after = segment_files(&dir);
    assert!(
        after <= 2,
        "the pinned run is deleted: {after} segments left of {pinned}"
    );
    assert!(!journal.wants_compaction());
    // The moved messages read back through their new locations.
    for offset in [0u64, 1] {
        let location = journal.resolve(offset, locations[offset as usize]);
        assert_ne!(location, locations[offset as usize]);
        let read = read_message(journal.log(), location).unwrap();
        assert!(read
            .body
            .starts_with(format!("message {offset} ").as_bytes()));
    }
    drop(journal);

    // And they survive a restart, once each; acking one then works.
    let recovered = QueueJournal::recover(&dir, Arc::clone(&group), &settings(4096)).unwrap();
    let offsets: Vec<u64> = recovered
        .messages
        .iter()
        .map(|paged| paged.offset)
        .collect();
    assert_eq!(offsets, vec![0, 1, 300]);
    let mut journal = recovered.journal;
    let first = recovered.messages[0];
    journal.append_acks([(first.offset, first.segment())]);
    flush(&mut journal, 301);
    drop(journal);
    let recovered = QueueJournal::recover(&dir, Arc::clone(&group), &settings(4096)).unwrap();
    let offsets: Vec<u64> = recovered
        .messages
        .iter()
        .map(|paged| paged.offset)
        .collect();
    assert_eq!(offsets, vec![1, 300, 301]);
    // Dropping waits for a segment being zero-filled ahead, which
    // would otherwise race the removal below.
    drop(recovered);
    group.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_crash_between_moving_and_deleting_leaves_one_copy_of_each_message() {
    let dir = temp_dir("compact-crash");
    let group = group();
    let mut journal = QueueJournal::recover(&dir, Arc::clone(&group), &settings(4096))
        .unwrap()
        .journal;
    let mut locations = Vec::new();
    for offset in 0..200 {
        let (location, _) = journal
            .append_message(offset, &message(offset, 200), None)
            .unwrap();
        locations.push(location);
    }
    journal.append_acks((1..200).map(|offset| (offset, locations[offset as usize].segment)));
    flush(&mut journal, 200);
    journal.reclaim(false);
    let log = Arc::clone(journal.log());
    let segment = journal.compaction_segments()[0];
    let found = QueueJournal::scan_messages(&log, segment).unwrap().unwrap();
    let live: Vec<_> = found
        .into_iter()
        .filter(|found| journal.is_live(found))
        .collect();
    assert_eq!(journal.relocate(live), 1);
    wait_synced(&log, journal.reclaim_waits_for().unwrap());
    // The process dies here: the moved copy is on disk, the old one too.
    drop(journal);
    let recovered = QueueJournal::recover(&dir, Arc::clone(&group), &settings(4096)).unwrap();
    let offsets: Vec<u64> = recovered
        .messages
        .iter()
        .map(|paged| paged.offset)
        .collect();
    assert_eq!(offsets, vec![0, 200]);
    let read = read_message(recovered.journal.log(), recovered.messages[0].location()).unwrap();
    assert!(read.body.starts_with(b"message 0 "));
    // Dropping waits for a segment being zero-filled ahead, which
    // would otherwise race the removal below.
    drop(recovered);
    group.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Random appends, acks, compactions and restarts, with a torn record at the
/// end of the log before each restart: what recovery returns must be
/// exactly the model's set of live persistent messages.
#[test]
fn recovery_matches_a_model_under_random_operations() {
    for seed in 0..24u64 {
        let mut random = StdRng::seed_from_u64(seed);
        let dir = temp_dir(&format!("model-{seed}"));
        let group = group();
        let segment_size = [2048u64, 4096, 16384][random.random_range(0..3)];
        let mut recovered =
            QueueJournal::recover(&dir, Arc::clone(&group), &settings(segment_size)).unwrap();
        // Live persistent messages: offset -> segment last known.
        let mut model: BTreeMap<u64, u64> = BTreeMap::new();
        // Saved deadlines of the live messages that have one.
        let mut deadlines: BTreeMap<u64, u64> = BTreeMap::new();
        let mut next_offset = 0u64;
        for _restart in 0..4 {
            let mut journal = recovered.journal;
            for _ in 0..random.random_range(50..300) {
                match random.random_range(0..10) {
                    0..=4 => {
                        let size = random.random_range(1..400);
                        // Some expire: their deadline comes back with them,
                        // moved by compaction or not.
                        let deadline = random
                            .random_bool(0.3)
                            .then(|| 1_800_000_000_000 + random.random_range(0..1_000_000));
                        let (location, _) = journal
                            .append_message(next_offset, &message(next_offset, size), deadline)
                            .unwrap();
                        model.insert(next_offset, location.segment);
                        if let Some(deadline) = deadline {
                            deadlines.insert(next_offset, deadline);
                        }
                        next_offset += 1;
                    }
                    5 => {
                        journal
                            .append_paged(next_offset, &message(next_offset, 50))
                            .unwrap();
                        next_offset += 1;
                    }
                    6..=8 if !model.is_empty() => {
                        // Acks mostly in order, sometimes out of it.
                        let index = if random.random_bool(0.7) {
                            0
                        } else {
                            random.random_range(0..model.len())
                        };
                        let offset = *model.keys().nth(index).unwrap();
                        let segment = model.remove(&offset).unwrap();
                        deadlines.remove(&offset);
                        journal.append_acks([(offset, segment)]);
                    }
                    _ => {
                        if journal.wants_compaction() {
                            compact(&mut journal);
                        }
                    }
                }
            }
            let location = flush(&mut journal, next_offset);
            model.insert(next_offset, location.segment);
            next_offset += 1;
            drop(journal);
            tear_the_tail(&dir, &mut random);
            recovered =
                QueueJournal::recover(&dir, Arc::clone(&group), &settings(segment_size)).unwrap();
            let offsets: Vec<u64> = recovered
                .messages
                .iter()
                .map(|paged| paged.offset)
                .collect();
            let expected: Vec<u64> = model.keys().copied().collect();
            assert_eq!(offsets, expected, "seed {seed}");
            let expected_deadlines: Vec<(u64, u64)> = deadlines
                .iter()
                .map(|(offset, deadline)| (*offset, *deadline))
                .collect();
            assert_eq!(recovered.deadlines, expected_deadlines, "seed {seed}");
            for paged in &recovered.messages {
                let read = read_message(recovered.journal.log(), paged.location()).unwrap();
                assert!(
                    read.body
                        .starts_with(format!("message {} ", paged.offset).as_bytes()),
                    "seed {seed}: offset {} read back another message",
                    paged.offset
                );
                model.insert(paged.offset, paged.segment());
            }
            assert!(recovered.next_offset >= next_offset);
            // Offsets go on from what recovery says, as a queue's do.
            next_offset = recovered.next_offset;
        }
        drop(recovered);
        group.stop();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Appends part of a record to the newest segment, as a crash mid-write does.
fn tear_the_tail(dir: &Path, random: &mut StdRng) {
    let newest = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "seg"))
        .max()
        .unwrap();
    let mut torn = vec![0u8; random.random_range(1..64)];
    random.fill(&mut torn[..]);
    // A plausible length, so the scan has to check the checksum or the end.
    if torn.len() >= 4 {
        torn[..4].copy_from_slice(&200u32.to_be_bytes());
    }
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(newest)
        .unwrap()
        .write_all(&torn)
        .unwrap();
}
