//! What a run measures: counters shared by every producer and consumer task, latency
//! histograms (HdrHistogram, microseconds), and the per-interval [`Sample`]s and whole-run
//! totals the reporter derives from them.
//!
//! Tasks record into [`Stats`] directly: counters are atomics, and each histogram sits behind
//! a mutex that is held for one `record` (tens of nanoseconds), so hundreds of tasks on a
//! couple of worker threads rarely contend. Once per interval the reporter swaps the interval
//! histograms out ([`Stats::sample`]), which makes every per-second percentile exact for its
//! second, and merges them into the run's totals.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies above an hour are recorded as an hour: a message that old means the run is
/// broken, and the bound keeps the histogram small (about 30 KiB at 3 significant digits).
pub const LATENCY_US_MAX: u64 = 3_600_000_000;

/// Significant decimal digits kept by the histograms: 0.1 % resolution.
const LATENCY_SIGNIFICANT_DIGITS: u8 = 3;

pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, LATENCY_SIGNIFICANT_DIGITS)
        .expect("constant histogram bounds are valid")
}

/// Latency percentiles in microseconds, as `summary.json` and the CSV carry them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Percentiles {
    pub min: u64,
    pub p50: u64,
    pub p75: u64,
    pub p95: u64,
    pub p99: u64,
    pub max: u64,
}

impl Percentiles {
    /// The percentiles of `histogram`, or `None` if it holds no value.
    pub fn of(histogram: &Histogram<u64>) -> Option<Percentiles> {
        if histogram.is_empty() {
            return None;
        }
        let at = |quantile: f64| histogram.value_at_quantile(quantile);
        Some(Percentiles {
            min: histogram.min(),
            p50: at(0.50),
            p75: at(0.75),
            p95: at(0.95),
            p99: at(0.99),
            // HdrHistogram reports the highest value equivalent to the recorded maximum;
            // clamp so that max is never below p99 because of bucket rounding.
            max: histogram.max().max(at(0.99)),
        })
    }

    /// `min <= p50 <= p75 <= p95 <= p99 <= max`.
    pub fn is_ordered(&self) -> bool {
        self.min <= self.p50
            && self.p50 <= self.p75
            && self.p75 <= self.p95
            && self.p95 <= self.p99
            && self.p99 <= self.max
    }
}

/// The counters and histograms every task of a run records into.
#[derive(Debug)]
pub struct Stats {
    published: AtomicU64,
    confirmed: AtomicU64,
    nacked: AtomicU64,
    returned: AtomicU64,
    consumed: AtomicU64,
    consumer_latency_us: Mutex<Histogram<u64>>,
    confirm_latency_us: Mutex<Histogram<u64>>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            published: AtomicU64::new(0),
            confirmed: AtomicU64::new(0),
            nacked: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            consumed: AtomicU64::new(0),
            consumer_latency_us: Mutex::new(new_histogram()),
            confirm_latency_us: Mutex::new(new_histogram()),
        }
    }
}

fn lock(histogram: &Mutex<Histogram<u64>>) -> std::sync::MutexGuard<'_, Histogram<u64>> {
    // A panicking recorder cannot leave a histogram half-updated in a way that matters.
    histogram
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Cumulative counter values at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub published: u64,
    pub confirmed: u64,
    pub nacked: u64,
    pub returned: u64,
    pub consumed: u64,
}

impl Counts {
    fn minus(self, earlier: Counts) -> Counts {
        Counts {
            published: self.published - earlier.published,
            confirmed: self.confirmed - earlier.confirmed,
            nacked: self.nacked - earlier.nacked,
            returned: self.returned - earlier.returned,
            consumed: self.consumed - earlier.consumed,
        }
    }
}

impl Stats {
    pub fn on_published(&self) {
        self.published.fetch_add(1, Ordering::Relaxed);
    }

    pub fn on_confirm(&self, acked: bool, latency_us: u64) {
        if acked {
            self.confirmed.fetch_add(1, Ordering::Relaxed);
        } else {
            self.nacked.fetch_add(1, Ordering::Relaxed);
        }
        lock(&self.confirm_latency_us).saturating_record(latency_us.max(1));
    }

    pub fn on_returned(&self) {
        self.returned.fetch_add(1, Ordering::Relaxed);
    }

    /// A delivery; `latency_us` is `None` when the body carries no timestamp.
    pub fn on_consumed(&self, latency_us: Option<u64>) {
        self.consumed.fetch_add(1, Ordering::Relaxed);
        if let Some(latency_us) = latency_us {
            lock(&self.consumer_latency_us).saturating_record(latency_us.max(1));
        }
    }

    pub fn counts(&self) -> Counts {
        Counts {
            published: self.published.load(Ordering::Relaxed),
            confirmed: self.confirmed.load(Ordering::Relaxed),
            nacked: self.nacked.load(Ordering::Relaxed),
            returned: self.returned.load(Ordering::Relaxed),
            consumed: self.consumed.load(Ordering::Relaxed),
        }
    }

    /// Takes the latencies recorded since the last call, leaving empty histograms behind.
    fn take_latencies(&self) -> (Histogram<u64>, Histogram<u64>) {
        let consumer = std::mem::replace(&mut *lock(&self.consumer_latency_us), new_histogram());
        let confirm = std::mem::replace(&mut *lock(&self.confirm_latency_us), new_histogram());
        (consumer, confirm)
    }
}

/// One reporting interval (normally a second) of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the run started, at the end of this interval.
    pub time_s: f64,
    /// Length of the interval in seconds (the divisor of the rates).
    pub interval_s: f64,
    pub published_rate: f64,
    pub confirmed_rate: f64,
    pub nacked_rate: f64,
    pub returned_rate: f64,
    pub consumed_rate: f64,
    pub consumer_latency_us: Option<Percentiles>,
    pub confirm_latency_us: Option<Percentiles>,
}

/// Turns the shared [`Stats`] into per-interval samples and whole-run totals.
#[derive(Debug)]
pub struct Sampler {
    last_counts: Counts,
    last_time: Duration,
    consumer_total: Histogram<u64>,
    confirm_total: Histogram<u64>,
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler {
            last_counts: Counts::default(),
            last_time: Duration::ZERO,
            consumer_total: new_histogram(),
            confirm_total: new_histogram(),
        }
    }
}

impl Sampler {
    /// The sample for the interval that ends at `elapsed` (time since the run started).
    pub fn sample(&mut self, stats: &Stats, elapsed: Duration) -> Sample {
        let counts = stats.counts();
        let (consumer, confirm) = stats.take_latencies();
        let delta = counts.minus(self.last_counts);
        // An interval is never shorter than a millisecond, so the rates stay finite.
        let interval_s = elapsed
            .saturating_sub(self.last_time)
            .as_secs_f64()
            .max(0.001);
        self.last_counts = counts;
        self.last_time = elapsed;
        self.consumer_total
            .add(&consumer)
            .expect("histograms share their bounds");
        self.confirm_total
            .add(&confirm)
            .expect("histograms share their bounds");
        let rate = |count: u64| count as f64 / interval_s;
        Sample {
            time_s: elapsed.as_secs_f64(),
            interval_s,
            published_rate: rate(delta.published),
            confirmed_rate: rate(delta.confirmed),
            nacked_rate: rate(delta.nacked),
            returned_rate: rate(delta.returned),
            consumed_rate: rate(delta.consumed),
            consumer_latency_us: Percentiles::of(&consumer),
            confirm_latency_us: Percentiles::of(&confirm),
        }
    }

    /// Counts as of the last sample.
    pub fn counts(&self) -> Counts {
        self.last_counts
    }

    /// Latency percentiles over every sample taken so far.
    pub fn consumer_latency_total(&self) -> Option<Percentiles> {
        Percentiles::of(&self.consumer_total)
    }

    pub fn confirm_latency_total(&self) -> Option<Percentiles> {
        Percentiles::of(&self.confirm_total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_percentiles_of_a_uniform_distribution() {
        let mut histogram = new_histogram();
        for value in 1..=10_000 {
            histogram.record(value).unwrap();
        }
        let p = Percentiles::of(&histogram).unwrap();
        // Within HdrHistogram's 0.1 % resolution of the exact order statistics.
        let close = |got: u64, want: u64| got.abs_diff(want) <= want / 1000 + 1;
        assert!(close(p.p50, 5_000), "{p:?}");
        assert!(close(p.p75, 7_500), "{p:?}");
        assert!(close(p.p95, 9_500), "{p:?}");
        assert!(close(p.p99, 9_900), "{p:?}");
        assert!(close(p.max, 10_000), "{p:?}");
        assert_eq!(p.min, 1);
        assert!(p.is_ordered());
    }

    #[test]
    fn stats_percentiles_of_a_skewed_distribution() {
        // 98 fast messages and 2 slow ones: p95 is fast, p99 and max are slow.
        let mut histogram = new_histogram();
        for _ in 0..98 {
            histogram.record(100).unwrap();
        }
        histogram.record(50_000).unwrap();
        histogram.record(90_000).unwrap();
        let p = Percentiles::of(&histogram).unwrap();
        assert_eq!((p.p50, p.p75, p.p95), (100, 100, 100));
        assert!(p.p99.abs_diff(50_000) <= 50, "{p:?}");
        assert!(p.max.abs_diff(90_000) <= 90, "{p:?}");
        assert!(p.is_ordered());
    }

    #[test]
    fn stats_percentiles_of_nothing_is_none() {
        assert_eq!(Percentiles::of(&new_histogram()), None);
    }

    #[test]
    fn stats_latency_beyond_the_bound_is_clamped() {
        let stats = Stats::default();
        stats.on_consumed(Some(u64::MAX));
        stats.on_consumed(Some(0));
        let mut sampler = Sampler::default();
        let sample = sampler.sample(&stats, Duration::from_secs(1));
        let p = sample.consumer_latency_us.unwrap();
        assert_eq!(p.min, 1);
        assert!(p.max >= LATENCY_US_MAX && p.max <= LATENCY_US_MAX + LATENCY_US_MAX / 1000);
    }

    #[test]
    fn stats_sampler_rates_are_per_interval_and_totals_merge() {
        let stats = Stats::default();
        let mut sampler = Sampler::default();
        for _ in 0..100 {
            stats.on_published();
            stats.on_confirm(true, 10);
            stats.on_consumed(Some(1_000));
        }
        stats.on_confirm(false, 20);
        let first = sampler.sample(&stats, Duration::from_millis(500));
        assert_eq!(first.published_rate, 200.0);
        assert_eq!(first.confirmed_rate, 200.0);
        assert_eq!(first.nacked_rate, 2.0);
        assert_eq!(first.consumer_latency_us.unwrap().p50, 1_000);

        for _ in 0..50 {
            stats.on_published();
            stats.on_consumed(Some(3_000));
        }
        stats.on_consumed(None);
        let second = sampler.sample(&stats, Duration::from_millis(1500));
        assert_eq!(second.interval_s, 1.0);
        assert_eq!(second.published_rate, 50.0);
        assert_eq!(second.consumed_rate, 51.0);
        assert_eq!(second.confirm_latency_us, None);
        let p = second.consumer_latency_us.unwrap();
        assert!(p.p50.abs_diff(3_000) <= 3, "{p:?}");

        // The run's totals cover both intervals: 100 at 1 ms, 50 at 3 ms.
        let total = sampler.consumer_latency_total().unwrap();
        assert_eq!(total.p50, 1_000);
        assert!(total.p75.abs_diff(3_000) <= 3, "{total:?}");
        assert_eq!(sampler.counts().consumed, 151);
        assert_eq!(sampler.confirm_latency_total().unwrap().max, 20);
    }
}
