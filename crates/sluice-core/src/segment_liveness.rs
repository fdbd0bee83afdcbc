//! Which messages of a journal segment are still in their queue: one bit per
//! queue offset, so a segment of a million messages costs 128 KiB to track,
//! and the live ones can be listed when the segment is compacted.

/// A segment's span of offsets is bounded so its bitmap stays small even
/// when only a few of the offsets published in its lifetime were written to
/// it (a durable queue of mostly transient messages): the journal starts a
/// new segment when an append would pass this span. 16 Mi offsets is a
/// 2 MiB bitmap.
pub const SEGMENT_OFFSET_SPAN_MAX: u64 = 16 * 1024 * 1024;

#[derive(Default, Debug)]
pub struct SegmentLiveness {
    /// Offset of bit 0 of `bits`, a multiple of 64.
    first_offset: u64,
    bits: Vec<u64>,
    /// Messages in this segment still in their queue, counting those moved
    /// into it by compaction (which the bitmap does not hold).
    live: u64,
    /// Message records ever written to this segment.
    records: u64,
}

impl SegmentLiveness {
    /// A message written natively at `offset` is in the queue.
    pub fn mark_live(&mut self, offset: u64) {
        self.records += 1;
        if self.bits.is_empty() {
            self.first_offset = offset & !63;
        }
        if offset < self.first_offset {
            // Only at recovery, when a segment's records are out of order.
            let new_first = offset & !63;
            let extra_words = ((self.first_offset - new_first) / 64) as usize;
            self.bits.splice(0..0, std::iter::repeat_n(0, extra_words));
            self.first_offset = new_first;
        }
        let index = (offset - self.first_offset) as usize;
        let word = index / 64;
        if word >= self.bits.len() {
            self.bits.resize(word + 1, 0);
        }
        let mask = 1u64 << (index % 64);
        if self.bits[word] & mask == 0 {
            self.bits[word] |= mask;
            self.live += 1;
        }
    }

    /// The message at `offset` left the queue; false when it was not live here.
    pub fn mark_dead(&mut self, offset: u64) -> bool {
        let Some(index) = offset.checked_sub(self.first_offset) else {
            return false;
        };
        let word = (index / 64) as usize;
        let mask = 1u64 << (index % 64);
        match self.bits.get_mut(word) {
            Some(bits) if *bits & mask != 0 => {
                *bits &= !mask;
                self.live -= 1;
                true
            }
            _ => false,
        }
    }

    pub fn is_live(&self, offset: u64) -> bool {
        let Some(index) = offset.checked_sub(self.first_offset) else {
            return false;
        };
        self.bits
            .get((index / 64) as usize)
            .is_some_and(|bits| bits & (1u64 << (index % 64)) != 0)
    }

    /// A message moved here by compaction; its liveness is kept by offset
    /// in the journal's relocation map, not in the bitmap.
    pub fn add_moved_in(&mut self) {
        self.records += 1;
        self.live += 1;
    }

    /// A message moved here by compaction left the queue.
    pub fn remove_moved_in(&mut self) {
        self.live = self.live.saturating_sub(1);
    }

    /// At recovery: message records found in the segment, live or not.
    pub fn set_records(&mut self, records: u64) {
        self.records = records.max(self.live);
    }

    pub fn live(&self) -> u64 {
        self.live
    }

    /// Message records ever written to this segment.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Whether an append at `offset` would stretch the bitmap past its bound.
    pub fn would_exceed_span(&self, offset: u64) -> bool {
        !self.bits.is_empty() && offset.saturating_sub(self.first_offset) >= SEGMENT_OFFSET_SPAN_MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_follow_marks_and_counts_stay_exact() {
        let mut liveness = SegmentLiveness::default();
        for offset in 100..300 {
            liveness.mark_live(offset);
        }
        assert_eq!(liveness.live(), 200);
        assert!(liveness.is_live(100) && liveness.is_live(299));
        assert!(!liveness.is_live(99) && !liveness.is_live(300));
        assert!(liveness.mark_dead(150));
        assert!(
            !liveness.mark_dead(150),
            "a second ack of one offset counts once"
        );
        assert!(
            !liveness.mark_dead(5),
            "an offset before the segment is not in it"
        );
        assert!(!liveness.mark_dead(100_000));
        assert_eq!(liveness.live(), 199);
        // Out of order (recovery): the bitmap grows at the front.
        liveness.mark_live(3);
        assert!(liveness.is_live(3) && liveness.is_live(299));
        assert_eq!(liveness.live(), 200);
    }

    #[test]
    fn records_count_every_message_written_and_live_only_the_rest() {
        let mut liveness = SegmentLiveness::default();
        for offset in 0..32 {
            liveness.mark_live(offset);
        }
        for offset in 0..30 {
            liveness.mark_dead(offset);
        }
        assert_eq!((liveness.live(), liveness.records()), (2, 32));
        liveness.add_moved_in();
        assert_eq!((liveness.live(), liveness.records()), (3, 33));
        liveness.set_records(40);
        assert_eq!(liveness.records(), 40);
        assert!(liveness.would_exceed_span(SEGMENT_OFFSET_SPAN_MAX));
        assert!(!liveness.would_exceed_span(SEGMENT_OFFSET_SPAN_MAX - 1));
    }
}
