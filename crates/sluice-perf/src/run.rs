//! One run: declare the topology, open every consumer then every producer (each on its own
//! connection, a bounded number of handshakes at a time), start them together, sample the
//! shared [`Stats`] once a second until `--time` (or the message limits, or Ctrl-C), stop
//! them together and close everything.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::ClientConnection;
use crate::consumer::Consumer;
use crate::publisher::Publisher;
use crate::rate_limiter::RateLimiter;
use crate::report::{Display, Summary};
use crate::stats::{Sample, Sampler, Stats};
use crate::topology;
use crate::workload::Workload;
use crate::PerfError;

/// Connections being opened at once while a run sets up. Hundreds of simultaneous
/// handshakes overflow a broker's accept backlog and time out; 32 keeps both ends busy.
const CONNECT_CONCURRENCY_MAX: usize = 32;

/// How often a line is printed and a sample taken (PerfTest's default `--interval`).
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// How long stopping waits for tasks and connection closes before giving up on them (a
/// blocked connection may never finish a publish).
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A final partial interval shorter than this is left out of the per-second series (its
/// rates would be noise); its messages still count in the summary.
const PARTIAL_SAMPLE_MIN: Duration = Duration::from_millis(500);

/// How a run shows itself.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Run name in reports ("run", or the sweep point).
    pub label: String,
    /// A live progress bar instead of plain lines.
    pub live: bool,
    /// Delete the named queues afterwards (sweeps do, so runs start empty).
    pub delete_queues: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            label: "run".into(),
            live: false,
            delete_queues: false,
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub summary: Summary,
    pub samples: Vec<Sample>,
    /// Whether the run was cut short by Ctrl-C.
    pub interrupted: bool,
}

/// Opens `count` clients with `open`, at most [`CONNECT_CONCURRENCY_MAX`] at a time.
async fn open_all<T, F, Fut>(count: u32, open: F) -> Result<Vec<T>, PerfError>
where
    T: Send + 'static,
    F: Fn(u32) -> Fut,
    Fut: Future<Output = Result<T, PerfError>> + Send + 'static,
{
    let semaphore = Arc::new(Semaphore::new(CONNECT_CONCURRENCY_MAX));
    let mut tasks = JoinSet::new();
    for index in 0..count {
        let semaphore = semaphore.clone();
        let opening = open(index);
        tasks.spawn(async move {
            let _permit = semaphore.acquire_owned().await;
            opening.await
        });
    }
    let mut opened = Vec::with_capacity(count as usize);
    while let Some(result) = tasks.join_next().await {
        match result {
            Ok(Ok(client)) => opened.push(client),
            Ok(Err(err)) => return Err(err),
            Err(join) => return Err(PerfError::Task(join.to_string())),
        }
    }
    Ok(opened)
}

/// Runs `workload` once.
///
/// # Errors
/// [`PerfError::Amqp`] if setting up fails (broker unreachable, a declaration refused).
/// Errors while running (a connection closed by the broker) end the run early and are
/// listed in the summary instead.
pub async fn run(workload: &Workload, options: &RunOptions) -> Result<RunResult, PerfError> {
    let display = Display::new(options.live, workload.time, &options.label);
    let workload = Arc::new(workload.clone());
    let stats = Arc::new(Stats::default());

    // One setup connection per URI: each queue is declared through the next, as
    // PerfTest's consumers (spread over the URIs) declare theirs.
    let mut setups = Vec::with_capacity(workload.uris.len());
    for uri in &workload.uris {
        setups.push(
            topology::connect(uri, workload.connection_options(), "sluice-perf setup").await?,
        );
    }
    topology::declare(&mut setups, &workload).await?;
    let brokers: Vec<String> = workload
        .uris
        .iter()
        .map(|uri| topology::redact(uri))
        .collect();
    display.note(&format!(
        "{}: {}: opening {} consumer and {} producer connections to {}",
        options.label,
        workload.describe(),
        workload.consumers,
        workload.producers,
        brokers.join(", ")
    ));
    let (consumers, publishers) = open_clients(&workload, &stats).await?;
    let (stop_sender, stop) = watch::channel(false);
    let start = Instant::now();
    let started_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64());
    let mut tasks = Tasks::spawn(&workload, consumers, publishers, start, &stop);
    let mut sampler = Sampler::default();
    let (samples, interrupted) = tasks
        .sample_until_done(&workload, &stats, &mut sampler, &display, start)
        .await;
    let _ = stop_sender.send(true);
    let elapsed = start.elapsed();
    let mut samples = samples;
    let last = sampler.sample(&stats, elapsed);
    if last.interval_s >= PARTIAL_SAMPLE_MIN.as_secs_f64() {
        display.sample(&last, workload.confirm.is_some());
        samples.push(last);
    }
    display.finish();

    // Collect the tasks (each hands its connection back) and close every connection.
    let mut connections = setups;
    connections.extend(tasks.collect().await);
    let mut errors = tasks.errors;
    if options.delete_queues {
        if let Err(err) = topology::delete_queues(&mut connections[0], &workload).await {
            errors.push(err.to_string());
        }
    }
    close_all(connections).await;
    errors.sort();
    errors.dedup();
    Ok(RunResult {
        summary: summarize(
            &workload,
            options,
            &sampler,
            started_unix_s,
            elapsed,
            errors,
        ),
        samples,
        interrupted,
    })
}

/// Opens every consumer's and producer's connection, consumers first so
/// that no message is published before its consumer is there.
async fn open_clients(
    workload: &Arc<Workload>,
    stats: &Arc<Stats>,
) -> Result<(Vec<Consumer>, Vec<Publisher>), PerfError> {
    let names = Arc::new(workload.queue_names());
    let run_key = Arc::new(format!(
        "sluice-perf-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos())
    ));
    let consumers = open_all(workload.consumers, |index| {
        let (workload, names, run_key, stats) = (
            workload.clone(),
            names.clone(),
            run_key.clone(),
            stats.clone(),
        );
        async move {
            let connection = topology::connect(
                workload.uri(index as usize),
                workload.connection_options(),
                &format!("sluice-perf consumer {index}"),
            )
            .await?;
            let queue = workload.consumer_queue(index, &names);
            Consumer::open(connection, &workload, queue, &run_key, stats).await
        }
    })
    .await?;
    let publishers = open_all(workload.producers, |index| {
        let (workload, names, run_key, stats) = (
            workload.clone(),
            names.clone(),
            run_key.clone(),
            stats.clone(),
        );
        async move {
            let connection = topology::connect(
                workload.uri(workload.consumers as usize + index as usize),
                workload.connection_options(),
                &format!("sluice-perf producer {index}"),
            )
            .await?;
            let key = workload.producer_routing_key(index, &names, &run_key);
            Publisher::open(connection, &workload, key, stats).await
        }
    })
    .await?;
    Ok((consumers, publishers))
}

/// The running producers and consumers, and what those that ended handed
/// back.
struct Tasks {
    producers: JoinSet<Result<Publisher, PerfError>>,
    consumers: JoinSet<Result<Consumer, PerfError>>,
    finished_publishers: Vec<Publisher>,
    finished_consumers: Vec<Consumer>,
    errors: Vec<String>,
}

impl Tasks {
    /// Starts every client, each on its own schedule, staggered across the
    /// rate's interval.
    fn spawn(
        workload: &Workload,
        consumers: Vec<Consumer>,
        publishers: Vec<Publisher>,
        start: Instant,
        stop: &watch::Receiver<bool>,
    ) -> Tasks {
        let consumer_rate = workload.consumer_rate.unwrap_or(0.0);
        let consumer_count = consumers.len();
        let mut consumer_tasks = JoinSet::new();
        for (index, consumer) in consumers.into_iter().enumerate() {
            let limiter = RateLimiter::staggered(consumer_rate, start, index, consumer_count);
            consumer_tasks.spawn(consumer.run(limiter, stop.clone()));
        }
        let producer_rate = workload.rate.unwrap_or(0.0);
        let producer_count = publishers.len();
        let mut producer_tasks = JoinSet::new();
        for (index, publisher) in publishers.into_iter().enumerate() {
            let limiter = RateLimiter::staggered(producer_rate, start, index, producer_count);
            producer_tasks.spawn(publisher.run(limiter, stop.clone()));
        }
        Tasks {
            producers: producer_tasks,
            consumers: consumer_tasks,
            finished_publishers: Vec::new(),
            finished_consumers: Vec::new(),
            errors: Vec::new(),
        }
    }

    /// Samples every second until the run's time is up, every client is
    /// done, one failed, or Ctrl-C. Returns the samples and whether it was
    /// interrupted.
    async fn sample_until_done(
        &mut self,
        workload: &Workload,
        stats: &Stats,
        sampler: &mut Sampler,
        display: &Display,
        start: Instant,
    ) -> (Vec<Sample>, bool) {
        let mut samples = Vec::new();
        let mut ticker = tokio::time::interval_at(start + SAMPLE_INTERVAL, SAMPLE_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let deadline = workload
            .time
            .map(|seconds| start + Duration::from_secs_f64(seconds));
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        let confirms = workload.confirm.is_some();
        loop {
            tokio::select! {
                biased;
                _ = ticker.tick() => {
                    let sample = sampler.sample(stats, start.elapsed());
                    display.sample(&sample, confirms);
                    samples.push(sample);
                }
                _ = sleep_until_some(deadline) => break,
                Some(joined) = self.producers.join_next(), if !self.producers.is_empty() => {
                    match flatten(joined) {
                        Ok(publisher) => self.finished_publishers.push(publisher),
                        Err(err) => { self.errors.push(err.to_string()); break; }
                    }
                }
                Some(joined) = self.consumers.join_next(), if !self.consumers.is_empty() => {
                    match flatten(joined) {
                        Ok(consumer) => self.finished_consumers.push(consumer),
                        Err(err) => { self.errors.push(err.to_string()); break; }
                    }
                }
                _ = &mut ctrl_c => return (samples, true),
            }
            if self.producers.is_empty() && self.consumers.is_empty() {
                break;
            }
        }
        (samples, false)
    }

    /// Waits for every client to stop (aborting those that do not within
    /// [`STOP_TIMEOUT`]) and returns their connections.
    async fn collect(&mut self) -> Vec<ClientConnection> {
        let (producers, consumers) = (&mut self.producers, &mut self.consumers);
        let (publishers, finished_consumers, errors) = (
            &mut self.finished_publishers,
            &mut self.finished_consumers,
            &mut self.errors,
        );
        let collect = async {
            while let Some(joined) = producers.join_next().await {
                match flatten(joined) {
                    Ok(publisher) => publishers.push(publisher),
                    Err(err) => errors.push(err.to_string()),
                }
            }
            while let Some(joined) = consumers.join_next().await {
                match flatten(joined) {
                    Ok(consumer) => finished_consumers.push(consumer),
                    Err(err) => errors.push(err.to_string()),
                }
            }
        };
        if tokio::time::timeout(STOP_TIMEOUT, collect).await.is_err() {
            self.errors.push(format!(
                "{} tasks did not stop within {STOP_TIMEOUT:?}",
                self.producers.len() + self.consumers.len()
            ));
            self.producers.abort_all();
            self.consumers.abort_all();
        }
        let mut connections: Vec<ClientConnection> = self
            .finished_publishers
            .drain(..)
            .map(|p| p.connection)
            .collect();
        connections.extend(self.finished_consumers.drain(..).map(|c| c.connection));
        connections
    }
}

/// The run's totals and rates.
fn summarize(
    workload: &Workload,
    options: &RunOptions,
    sampler: &Sampler,
    started_unix_s: f64,
    elapsed: Duration,
    errors: Vec<String>,
) -> Summary {
    let counts = sampler.counts();
    let elapsed_s = elapsed.as_secs_f64().max(0.001);
    Summary {
        label: options.label.clone(),
        description: workload.describe(),
        started_unix_s,
        elapsed_s,
        published: counts.published,
        confirmed: counts.confirmed,
        nacked: counts.nacked,
        returned: counts.returned,
        consumed: counts.consumed,
        published_rate: counts.published as f64 / elapsed_s,
        confirmed_rate: counts.confirmed as f64 / elapsed_s,
        consumed_rate: counts.consumed as f64 / elapsed_s,
        consumer_latency_us: sampler.consumer_latency_total(),
        confirm_latency_us: sampler.confirm_latency_total(),
        errors,
        workload: workload.clone(),
    }
}

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn flatten<T>(
    joined: Result<Result<T, PerfError>, tokio::task::JoinError>,
) -> Result<T, PerfError> {
    joined.map_err(|join| PerfError::Task(join.to_string()))?
}

/// Closes connections concurrently, giving up after [`STOP_TIMEOUT`].
async fn close_all(connections: Vec<ClientConnection>) {
    let mut closing = JoinSet::new();
    for connection in connections {
        closing.spawn(async move {
            connection.close().await;
        });
    }
    let _ = tokio::time::timeout(STOP_TIMEOUT, async {
        while closing.join_next().await.is_some() {}
    })
    .await;
}
