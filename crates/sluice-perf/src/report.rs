//! What a person sees: a line per interval (plain, or above a live progress bar on a
//! terminal), a summary at the end, and with `--output DIR`: `summary.json`,
//! `per-second.csv` and the charts of [`crate::chart`].

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use crate::chart;
use crate::stats::{Percentiles, Sample};
use crate::workload::Workload;
use crate::PerfError;

/// A run's totals: what `summary.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// The run's name within a sweep ("no confirms", "in-flight 10% (100)"), else "run".
    pub label: String,
    pub description: String,
    /// When the clients started, in seconds since the Unix epoch: lets a harness that
    /// samples the broker's CPU and memory tell the runs of a sweep apart.
    pub started_unix_s: f64,
    pub elapsed_s: f64,
    pub published: u64,
    pub confirmed: u64,
    pub nacked: u64,
    pub returned: u64,
    pub consumed: u64,
    /// Messages per second over the whole run.
    pub published_rate: f64,
    pub confirmed_rate: f64,
    pub consumed_rate: f64,
    /// Publish-to-delivery latency; `null` if nothing carrying a timestamp was consumed.
    pub consumer_latency_us: Option<Percentiles>,
    /// Publish-to-confirm latency; `null` without confirms.
    pub confirm_latency_us: Option<Percentiles>,
    /// Task errors (a closed connection, a refused publish), empty when all went well.
    pub errors: Vec<String>,
    pub workload: Workload,
}

fn percentiles_text(percentiles: &Option<Percentiles>) -> String {
    match percentiles {
        Some(p) => format!("{}/{}/{}/{}/{} µs", p.p50, p.p75, p.p95, p.p99, p.max),
        None => "-".to_owned(),
    }
}

/// One interval as a line, PerfTest-like:
/// `time 3.0 s, sent: 1000 msg/s, confirmed: …, received: 1000 msg/s, consumer latency
/// p50/p75/p95/p99/max: 310/402/655/1187/2451 µs, confirm latency …`.
pub fn sample_line(sample: &Sample, confirms: bool) -> String {
    let mut line = format!(
        "time {:.1} s, sent: {:.0} msg/s",
        sample.time_s, sample.published_rate
    );
    if confirms {
        let _ = write!(line, ", confirmed: {:.0} msg/s", sample.confirmed_rate);
        if sample.nacked_rate > 0.0 {
            let _ = write!(line, ", nacked: {:.0} msg/s", sample.nacked_rate);
        }
    }
    if sample.returned_rate > 0.0 {
        let _ = write!(line, ", returned: {:.0} msg/s", sample.returned_rate);
    }
    let _ = write!(
        line,
        ", received: {:.0} msg/s, consumer latency p50/p75/p95/p99/max: {}",
        sample.consumed_rate,
        percentiles_text(&sample.consumer_latency_us)
    );
    if confirms {
        let _ = write!(
            line,
            ", confirm latency: {}",
            percentiles_text(&sample.confirm_latency_us)
        );
    }
    line
}

/// The end-of-run summary, PerfTest's wording where it has one.
pub fn summary_text(summary: &Summary) -> String {
    let mut text = String::new();
    let _ = writeln!(text, "{}: {}", summary.label, summary.description);
    let _ = writeln!(
        text,
        "  elapsed {:.1} s: published {}, confirmed {}, nacked {}, returned {}, consumed {}",
        summary.elapsed_s,
        summary.published,
        summary.confirmed,
        summary.nacked,
        summary.returned,
        summary.consumed
    );
    let _ = writeln!(
        text,
        "  sending rate avg: {:.0} msg/s",
        summary.published_rate
    );
    if summary.workload.confirm.is_some() {
        let _ = writeln!(
            text,
            "  confirm rate avg: {:.0} msg/s",
            summary.confirmed_rate
        );
    }
    let _ = writeln!(
        text,
        "  receiving rate avg: {:.0} msg/s",
        summary.consumed_rate
    );
    let _ = writeln!(
        text,
        "  consumer latency p50/p75/p95/p99/max: {}",
        percentiles_text(&summary.consumer_latency_us)
    );
    if summary.workload.confirm.is_some() {
        let _ = writeln!(
            text,
            "  confirm latency p50/p75/p95/p99/max: {}",
            percentiles_text(&summary.confirm_latency_us)
        );
    }
    for error in &summary.errors {
        let _ = writeln!(text, "  error: {error}");
    }
    text
}

/// Where per-interval lines go: stdout, or above a live progress bar on a terminal.
pub struct Display {
    bar: Option<ProgressBar>,
}

impl Display {
    /// A live bar (elapsed of `time`) when `live`, else plain lines.
    pub fn new(live: bool, time: Option<f64>, prefix: &str) -> Display {
        if !live {
            return Display { bar: None };
        }
        let bar = match time {
            Some(seconds) => {
                let bar = ProgressBar::new(seconds.ceil() as u64);
                bar.set_style(
                    ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} s  {msg}")
                        .expect("constant template")
                        .progress_chars("=> "),
                );
                bar
            }
            None => {
                let bar = ProgressBar::new_spinner();
                bar.set_style(
                    ProgressStyle::with_template("{prefix} {spinner} {elapsed}  {msg}")
                        .expect("constant template"),
                );
                bar
            }
        };
        bar.set_draw_target(ProgressDrawTarget::stdout());
        bar.set_prefix(prefix.to_owned());
        bar.enable_steady_tick(Duration::from_millis(200));
        Display { bar: Some(bar) }
    }

    pub fn sample(&self, sample: &Sample, confirms: bool) {
        let line = sample_line(sample, confirms);
        match &self.bar {
            Some(bar) => {
                bar.set_position(sample.time_s.round() as u64);
                bar.set_message(format!(
                    "sent {:.0}/s, received {:.0}/s, p99 {}",
                    sample.published_rate,
                    sample.consumed_rate,
                    sample
                        .consumer_latency_us
                        .map_or("-".to_owned(), |p| format!("{} µs", p.p99))
                ));
                bar.println(line);
            }
            None => {
                let mut stdout = std::io::stdout().lock();
                let _ = writeln!(stdout, "{line}");
                let _ = stdout.flush();
            }
        }
    }

    /// Messages that are not samples (connecting, errors).
    pub fn note(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// The per-interval series as CSV, one row per sample.
pub fn samples_csv(samples: &[Sample]) -> String {
    let mut csv = String::from(
        "time_s,interval_s,published_rate,confirmed_rate,nacked_rate,returned_rate,consumed_rate,\
         consumer_latency_p50_us,consumer_latency_p75_us,consumer_latency_p95_us,\
         consumer_latency_p99_us,consumer_latency_max_us,\
         confirm_latency_p50_us,confirm_latency_p75_us,confirm_latency_p95_us,\
         confirm_latency_p99_us,confirm_latency_max_us\n",
    );
    let cells = |p: &Option<Percentiles>| match p {
        Some(p) => format!("{},{},{},{},{}", p.p50, p.p75, p.p95, p.p99, p.max),
        None => ",,,,".to_owned(),
    };
    for s in samples {
        let _ = writeln!(
            csv,
            "{:.3},{:.3},{:.1},{:.1},{:.1},{:.1},{:.1},{},{}",
            s.time_s,
            s.interval_s,
            s.published_rate,
            s.confirmed_rate,
            s.nacked_rate,
            s.returned_rate,
            s.consumed_rate,
            cells(&s.consumer_latency_us),
            cells(&s.confirm_latency_us)
        );
    }
    csv
}

fn write_file(path: &Path, contents: &[u8]) -> Result<(), PerfError> {
    std::fs::write(path, contents).map_err(|source| PerfError::Io {
        path: path.to_owned(),
        source,
    })
}

pub fn create_dir(dir: &Path) -> Result<(), PerfError> {
    std::fs::create_dir_all(dir).map_err(|source| PerfError::Io {
        path: dir.to_owned(),
        source,
    })
}

/// Writes `summary.json`, `per-second.csv`, `throughput.png`, `consumer-latency.png` and,
/// with confirms, `confirm-latency.png` into `dir`.
///
/// # Errors
/// [`PerfError::Io`] or [`PerfError::Chart`] naming the file that could not be written.
pub fn write_run(dir: &Path, summary: &Summary, samples: &[Sample]) -> Result<(), PerfError> {
    create_dir(dir)?;
    let json = serde_json::to_vec_pretty(summary).expect("a summary serialises");
    write_file(&dir.join("summary.json"), &json)?;
    write_file(&dir.join("per-second.csv"), samples_csv(samples).as_bytes())?;
    let title = format!("{} — {}", summary.label, summary.description);
    chart::throughput(&dir.join("throughput.png"), &title, samples)?;
    chart::latency(
        &dir.join("consumer-latency.png"),
        &format!("consumer latency — {title}"),
        samples,
        |s| s.consumer_latency_us,
    )?;
    if summary.workload.confirm.is_some() {
        chart::latency(
            &dir.join("confirm-latency.png"),
            &format!("confirm latency — {title}"),
            samples,
            |s| s.confirm_latency_us,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(time_s: f64) -> Sample {
        Sample {
            time_s,
            interval_s: 1.0,
            published_rate: 1000.0,
            confirmed_rate: 990.0,
            nacked_rate: 0.0,
            returned_rate: 0.0,
            consumed_rate: 1000.0,
            consumer_latency_us: Some(Percentiles {
                min: 100,
                p50: 200,
                p75: 300,
                p95: 400,
                p99: 500,
                max: 600,
            }),
            confirm_latency_us: None,
        }
    }

    #[test]
    fn report_line_reads_like_perftest() {
        let line = sample_line(&sample(3.0), true);
        assert_eq!(
            line,
            "time 3.0 s, sent: 1000 msg/s, confirmed: 990 msg/s, received: 1000 msg/s, \
             consumer latency p50/p75/p95/p99/max: 200/300/400/500/600 µs, confirm latency: -"
        );
        assert!(!sample_line(&sample(3.0), false).contains("confirm"));
    }

    #[test]
    fn report_csv_has_a_row_per_sample_and_empty_cells_for_no_latency() {
        let csv = samples_csv(&[sample(1.0), sample(2.0)]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        let columns = lines[0].split(',').count();
        assert!(lines.iter().all(|line| line.split(',').count() == columns));
        assert!(lines[1].starts_with("1.000,1.000,1000.0,990.0,"));
        assert!(lines[1].ends_with("200,300,400,500,600,,,,,"));
    }
}
