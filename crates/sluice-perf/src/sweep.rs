//! Sweeps, as in seed 001: the same workload once without confirms and once per in-flight
//! limit, each limit a percentage of the per-producer rate (1 %, 2 %, 5 %, 10 %, 20 %,
//! 100 %, 200 %). Each run gets its own directory of results; the sweep adds one chart per
//! metric with every run side by side on one time axis (`sweep-*.png`), `sweep.json` with
//! every summary, and `sweep.csv` with every sample.

use std::fmt::Write as _;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use crate::chart::{self, Scale, Series};
use crate::report::{self, Summary};
use crate::run::{self, RunOptions, RunResult};
use crate::stats::Sample;
use crate::workload::Workload;
use crate::PerfError;

/// Quiet time between two runs, so one run's tail (closing connections, deleting queues)
/// does not show in the next one's first second. Also the gap between runs in the charts.
pub const SWEEP_PAUSE: Duration = Duration::from_secs(2);

/// One run of a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum SweepPoint {
    NoConfirms,
    /// In-flight limit in percent of the per-producer rate.
    Percent(f64),
}

impl FromStr for SweepPoint {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if matches!(text, "none" | "no-confirms") {
            return Ok(SweepPoint::NoConfirms);
        }
        match text.trim_end_matches('%').parse::<f64>() {
            Ok(percent) if percent.is_finite() && percent > 0.0 => Ok(SweepPoint::Percent(percent)),
            _ => Err(format!(
                "'{text}' is not a sweep point; expected 'none' or a percentage such as 10"
            )),
        }
    }
}

impl SweepPoint {
    /// The in-flight limit at `rate` messages/s per producer: at least 1.
    pub fn in_flight(&self, rate: f64) -> Option<u64> {
        match self {
            SweepPoint::NoConfirms => None,
            SweepPoint::Percent(percent) => Some(((rate * percent / 100.0).round() as u64).max(1)),
        }
    }

    /// "no confirms", "in-flight 10% (100)".
    pub fn label(&self, rate: f64) -> String {
        match (self, self.in_flight(rate)) {
            (SweepPoint::Percent(percent), Some(limit)) => {
                format!("in-flight {percent}% ({limit})")
            }
            _ => "no confirms".to_owned(),
        }
    }

    /// A directory name: "no-confirms", "inflight-10pct".
    pub fn slug(&self) -> String {
        match self {
            SweepPoint::NoConfirms => "no-confirms".to_owned(),
            SweepPoint::Percent(percent) => format!("inflight-{percent}pct"),
        }
    }
}

/// Runs `base` once per point.
///
/// # Errors
/// [`PerfError::Args`] without `--rate` or `--time`; any error a run's set-up or writing
/// its results returns.
pub async fn sweep(
    base: &Workload,
    points: &[SweepPoint],
    output: Option<&Path>,
    live: bool,
) -> Result<Vec<RunResult>, PerfError> {
    let Some(rate) = base.rate.filter(|rate| *rate > 0.0) else {
        return Err(PerfError::Args(
            "a sweep needs --rate: in-flight limits are percentages of it".into(),
        ));
    };
    if base.time.is_none() {
        return Err(PerfError::Args(
            "a sweep needs --time (seconds per run)".into(),
        ));
    }
    if let Some(dir) = output {
        report::create_dir(dir)?;
    }
    let mut results: Vec<RunResult> = Vec::new();
    for (index, point) in points.iter().enumerate() {
        if index > 0 {
            tokio::time::sleep(SWEEP_PAUSE).await;
        }
        let workload = Workload {
            confirm: point.in_flight(rate),
            ..base.clone()
        };
        let options = RunOptions {
            label: point.label(rate),
            live,
            delete_queues: true,
        };
        let result = run::run(&workload, &options).await?;
        println!("{}", report::summary_text(&result.summary));
        if let Some(dir) = output {
            let run_dir = dir.join(format!("{:02}-{}", index + 1, point.slug()));
            report::write_run(&run_dir, &result.summary, &result.samples)?;
        }
        let stop = result.interrupted;
        results.push(result);
        if stop {
            break;
        }
    }
    println!("{}", table(&results));
    if let Some(dir) = output {
        write_sweep(dir, base, &results)?;
        println!("sweep results in {}", dir.display());
    }
    Ok(results)
}

/// One line per run: the figures the seed compares.
pub fn table(results: &[RunResult]) -> String {
    let mut text = String::from(
        "run                         published/s  consumed/s  latency p50/p95/p99 ms      confirm p99 ms\n",
    );
    let ms = |us: u64| us as f64 / 1000.0;
    for result in results {
        let s = &result.summary;
        let latency = s.consumer_latency_us.map_or("-".to_owned(), |p| {
            format!("{:.1}/{:.1}/{:.1}", ms(p.p50), ms(p.p95), ms(p.p99))
        });
        let confirm = s
            .confirm_latency_us
            .map_or("-".to_owned(), |p| format!("{:.1}", ms(p.p99)));
        let _ = writeln!(
            text,
            "{:<27} {:>11.0} {:>11.0}  {:<27} {:>14}",
            s.label, s.published_rate, s.consumed_rate, latency, confirm
        );
    }
    text
}

/// Seconds from the sweep's start at which each run starts on the charts' shared axis.
fn run_offsets(results: &[RunResult]) -> Vec<f64> {
    let mut offset = 0.0;
    results
        .iter()
        .map(|result| {
            let start = offset;
            offset += result.summary.elapsed_s + SWEEP_PAUSE.as_secs_f64();
            start
        })
        .collect()
}

type Metric = fn(&Sample) -> Option<f64>;

/// The sweep charts: file name, title, y axis, scale, value.
const SWEEP_METRICS: [(&str, &str, &str, Scale, Metric); 7] = [
    (
        "sweep-published.png",
        "published",
        "messages / s",
        Scale::Linear,
        |s| Some(s.published_rate),
    ),
    (
        "sweep-confirmed.png",
        "confirmed",
        "messages / s",
        Scale::Linear,
        |s| Some(s.confirmed_rate),
    ),
    (
        "sweep-consumed.png",
        "consumed",
        "messages / s",
        Scale::Linear,
        |s| Some(s.consumed_rate),
    ),
    (
        "sweep-consumer-latency-p50.png",
        "consumer latency p50",
        "ms (log scale)",
        Scale::Log,
        |s| s.consumer_latency_us.map(|p| p.p50 as f64 / 1000.0),
    ),
    (
        "sweep-consumer-latency-p95.png",
        "consumer latency p95",
        "ms (log scale)",
        Scale::Log,
        |s| s.consumer_latency_us.map(|p| p.p95 as f64 / 1000.0),
    ),
    (
        "sweep-consumer-latency-p99.png",
        "consumer latency p99",
        "ms (log scale)",
        Scale::Log,
        |s| s.consumer_latency_us.map(|p| p.p99 as f64 / 1000.0),
    ),
    (
        "sweep-confirm-latency-p99.png",
        "confirm latency p99",
        "ms (log scale)",
        Scale::Log,
        |s| s.confirm_latency_us.map(|p| p.p99 as f64 / 1000.0),
    ),
];

fn write_sweep(dir: &Path, base: &Workload, results: &[RunResult]) -> Result<(), PerfError> {
    let summaries: Vec<&Summary> = results.iter().map(|r| &r.summary).collect();
    let json = serde_json::to_vec_pretty(&summaries).expect("summaries serialise");
    std::fs::write(dir.join("sweep.json"), json).map_err(|source| PerfError::Io {
        path: dir.join("sweep.json"),
        source,
    })?;
    let offsets = run_offsets(results);
    let mut csv = String::new();
    for (index, (result, offset)) in results.iter().zip(&offsets).enumerate() {
        let per_run = report::samples_csv(&result.samples);
        let mut lines = per_run.lines();
        let header = lines.next().unwrap_or_default();
        if index == 0 {
            let _ = writeln!(csv, "run,sweep_time_s,{header}");
        }
        for (line, sample) in lines.zip(&result.samples) {
            let _ = writeln!(
                csv,
                "\"{}\",{:.3},{line}",
                result.summary.label,
                offset + sample.time_s
            );
        }
    }
    std::fs::write(dir.join("sweep.csv"), csv).map_err(|source| PerfError::Io {
        path: dir.join("sweep.csv"),
        source,
    })?;
    for (file, name, y_description, scale, value) in SWEEP_METRICS {
        let series: Vec<Series> = results
            .iter()
            .zip(&offsets)
            .map(|(result, offset)| Series {
                label: result.summary.label.clone(),
                points: result
                    .samples
                    .iter()
                    .filter_map(|s| value(s).map(|v| (offset + s.time_s, v)))
                    .collect(),
            })
            .collect();
        if series.iter().all(|s| s.points.is_empty()) {
            continue;
        }
        let title = format!("{name} — {}", base.describe().replace(", no confirms", ""));
        chart::lines(&dir.join(file), &title, y_description, &series, scale)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_points_are_percentages_of_the_rate() {
        let point: SweepPoint = "10".parse().unwrap();
        assert_eq!(point.in_flight(1000.0), Some(100));
        assert_eq!(point.label(1000.0), "in-flight 10% (100)");
        assert_eq!(point.slug(), "inflight-10pct");
        // Seed benchmark #3: 6 % of 30 msg/s rounds to 2; 1 % of 30 is still 1.
        assert_eq!("6%".parse::<SweepPoint>().unwrap().in_flight(30.0), Some(2));
        assert_eq!("1".parse::<SweepPoint>().unwrap().in_flight(30.0), Some(1));
        assert_eq!("none".parse::<SweepPoint>().unwrap().in_flight(30.0), None);
        assert!("0".parse::<SweepPoint>().is_err());
    }
}
