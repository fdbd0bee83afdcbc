//! `sluice perf`: a load generator for AMQP 0-9-1 brokers with RabbitMQ PerfTest's flags.
//! Every producer and consumer has its own connection and is one tokio task that reads and
//! writes that connection's socket itself ([`client`]); latency is carried in the message
//! body as PerfTest does and recorded in HdrHistograms.
//!
//! What lives where:
//! - `args.rs`: the command line ([`PerfArgs`]), PerfTest's flags plus `--output`,
//!   `--scenario`, `--scale`, `--sweep`.
//! - `workload.rs`: [`Workload`], one run's resolved settings and the topology they imply.
//! - `scenario.rs`: scenario files (`bench/scenarios/*.toml`) and `--scale`.
//! - `client.rs`: the AMQP client of one connection, read and written by its own task.
//! - `topology.rs`: connecting, declaring exchange/queues/bindings, deleting queues.
//! - `body.rs`: the body layout (sequence + timestamp, PerfTest's) and the clocks.
//! - `rate_limiter.rs`: the per-task send schedule behind `--rate` / `--consumer-rate`.
//! - `inflight.rs`: the publisher's in-flight window behind `--confirm`.
//! - `publisher.rs`, `consumer.rs`: one producer / one consumer task.
//! - `stats.rs`: shared counters, latency histograms, per-second samples, percentiles.
//! - `run.rs`: one run from set-up to close.
//! - `report.rs`: per-second lines, live display, summary, `summary.json`, CSV.
//! - `chart.rs`: PNG charts (plotters, embedded font).
//! - `sweep.rs`: in-flight sweeps and their side-by-side charts.

pub mod args;
pub mod body;
pub mod chart;
pub mod client;
pub mod consumer;
pub mod inflight;
pub mod perftest_flags;
pub mod publisher;
pub mod rate_limiter;
pub mod report;
pub mod run;
pub mod scenario;
pub mod stats;
pub mod sweep;
pub mod topology;
pub mod workload;

use std::io::IsTerminal as _;
use std::path::PathBuf;

pub use args::PerfArgs;
pub use report::Summary;
pub use run::{RunOptions, RunResult};
pub use workload::Workload;

/// What can stop `sluice perf`.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// Flags that contradict each other or are out of range.
    #[error("{0}")]
    Args(String),
    #[error("scenario {}: {text}", path.display())]
    Scenario { path: PathBuf, text: String },
    /// The broker refused something or went away.
    #[error("{context}: {source}")]
    Amqp {
        context: String,
        source: client::ClientError,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("chart {}: {text}", path.display())]
    Chart { path: PathBuf, text: String },
    /// A producer or consumer task panicked or was cancelled.
    #[error("task failed: {0}")]
    Task(String),
    /// A run finished with errors (listed in its summary).
    #[error("{0}")]
    Run(String),
}

impl PerfError {
    /// A `map_err` adapter that adds what was being done to a client error.
    pub fn amqp(context: impl Into<String>) -> impl FnOnce(client::ClientError) -> PerfError {
        let context = context.into();
        move |source| PerfError::Amqp { context, source }
    }
}

/// Runs `sluice perf` with its own tokio runtime (multi-threaded: one worker per core).
///
/// # Errors
/// Whatever [`execute`] returns, or a runtime that cannot start.
pub fn main(args: PerfArgs) -> Result<(), PerfError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|err| PerfError::Task(format!("starting the tokio runtime: {err}")))?;
    runtime.block_on(execute(args)).map(|_| ())
}

/// Runs what `args` ask for: one run, or a sweep with `--sweep` or a scenario.
///
/// # Errors
/// [`PerfError`] for bad arguments, an unreachable broker, unwritable output, or a run
/// that ended with errors (after its results were written).
pub async fn execute(args: PerfArgs) -> Result<Vec<RunResult>, PerfError> {
    let scenario = match &args.scenario {
        Some(path) => Some(scenario::Scenario::load(path)?),
        None => None,
    };
    let workload = args.workload(scenario.as_ref())?;
    let live = !args.no_progress && std::io::stdout().is_terminal();
    let sweep_points = match (&args.sweep, &scenario) {
        (Some(points), _) => Some(points.clone()),
        (None, Some(scenario)) => Some(scenario.sweep_points().map_err(PerfError::Args)?),
        (None, None) => None,
    };
    let results = match sweep_points {
        Some(points) => sweep::sweep(&workload, &points, args.output.as_deref(), live).await?,
        None => {
            let result = run::run(
                &workload,
                &RunOptions {
                    live,
                    ..RunOptions::default()
                },
            )
            .await?;
            println!("{}", report::summary_text(&result.summary));
            if let Some(dir) = &args.output {
                report::write_run(dir, &result.summary, &result.samples)?;
                println!("results in {}", dir.display());
            }
            vec![result]
        }
    };
    let failed: Vec<&str> = results
        .iter()
        .flat_map(|r| r.summary.errors.iter().map(String::as_str))
        .collect();
    if !failed.is_empty() {
        return Err(PerfError::Run(format!(
            "the run ended with errors: {}",
            failed.join("; ")
        )));
    }
    Ok(results)
}
