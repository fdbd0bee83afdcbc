//! The message body layout, PerfTest's: a big-endian `i32` sequence number, then a
//! big-endian `i64` timestamp, then padding up to `--size`. PerfTest writes
//! `System.nanoTime()` there (or `System.currentTimeMillis()` with `--use-millis`); Sluice
//! writes nanoseconds of a process-local monotonic clock (or Unix milliseconds with
//! `--use-millis`), so latency is publish-to-delivery time as PerfTest measures it, and a
//! PerfTest consumer run with `--use-millis` can read a `sluice perf --use-millis` producer's
//! messages and vice versa. Bodies shorter than [`HEADER_LEN`] carry no timestamp.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Sequence (4 bytes) + timestamp (8 bytes), PerfTest's default `--size` too.
pub const HEADER_LEN: usize = 12;

/// Which clock the timestamp comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// Nanoseconds of a monotonic clock shared by this process only.
    MonotonicNanos,
    /// Milliseconds since the Unix epoch: comparable across processes on synchronised hosts.
    UnixMillis,
}

fn process_epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Clock {
    /// The current time in this clock's unit.
    pub fn now(self) -> i64 {
        match self {
            Clock::MonotonicNanos => process_epoch().elapsed().as_nanos() as i64,
            Clock::UnixMillis => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_millis() as i64),
        }
    }

    /// Microseconds from `stamp` (read from a body) to now; `None` if the stamp is in the
    /// future (another clock, or a corrupt body).
    pub fn elapsed_us(self, stamp: i64) -> Option<u64> {
        let elapsed = self.now().checked_sub(stamp)?;
        let elapsed = u64::try_from(elapsed).ok()?;
        Some(match self {
            Clock::MonotonicNanos => elapsed / 1_000,
            Clock::UnixMillis => elapsed.saturating_mul(1_000),
        })
    }
}

/// A zeroed body of `size` bytes.
pub fn new_body(size: usize) -> Vec<u8> {
    // Touch the epoch now, so the first timestamp is not taken before it exists.
    let _ = process_epoch();
    vec![0; size]
}

/// Writes the sequence number and timestamp into the first bytes of `body`, if it is long
/// enough to hold them.
pub fn stamp(body: &mut [u8], sequence: u32, timestamp: i64) {
    if body.len() >= HEADER_LEN {
        body[0..4].copy_from_slice(&sequence.to_be_bytes());
        body[4..12].copy_from_slice(&timestamp.to_be_bytes());
    }
}

/// The timestamp written by [`stamp`], if the body has one.
pub fn timestamp(body: &[u8]) -> Option<i64> {
    let bytes: [u8; 8] = body.get(4..HEADER_LEN)?.try_into().ok()?;
    Some(i64::from_be_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_layout_is_perftest_s() {
        let mut body = new_body(20);
        stamp(&mut body, 7, 0x0102_0304_0506_0708);
        assert_eq!(&body[..4], &[0, 0, 0, 7]);
        assert_eq!(&body[4..12], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&body[12..], &[0; 8]);
        assert_eq!(timestamp(&body), Some(0x0102_0304_0506_0708));
    }

    #[test]
    fn body_too_short_has_no_timestamp() {
        let mut body = new_body(11);
        stamp(&mut body, 1, 99);
        assert_eq!(body, vec![0; 11]);
        assert_eq!(timestamp(&body), None);
    }

    #[test]
    fn body_clock_elapsed_is_in_microseconds() {
        let clock = Clock::MonotonicNanos;
        let then = clock.now() - 2_000_000; // 2 ms ago
        let elapsed = clock.elapsed_us(then).unwrap();
        assert!(elapsed >= 2_000, "{elapsed}");
        assert_eq!(clock.elapsed_us(clock.now() + 1_000_000_000), None);
        let millis = Clock::UnixMillis;
        assert!(millis.elapsed_us(millis.now() - 3).unwrap() >= 3_000);
    }
}
