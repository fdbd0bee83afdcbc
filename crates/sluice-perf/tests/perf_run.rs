//! `sluice perf` against a real Sluice server in this process: a few seconds of load, then
//! the written summary must be consistent. No assertions on speed.

use std::path::Path;

use clap::Parser;
use serde_json::Value;
use sluice_perf::PerfArgs;

mod support;
use support::{start_server, TempDir};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    perf: PerfArgs,
}

fn args(list: &[&str]) -> PerfArgs {
    Cli::try_parse_from(std::iter::once("perf").chain(list.iter().copied()))
        .unwrap()
        .perf
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn assert_ordered(latency: &Value) {
    let at = |key: &str| {
        latency[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} in {latency}"))
    };
    let values = [
        at("min"),
        at("p50"),
        at("p75"),
        at("p95"),
        at("p99"),
        at("max"),
    ];
    assert!(values.windows(2).all(|w| w[0] <= w[1]), "{latency}");
    assert!(values[0] > 0, "{latency}");
}

fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    assert_eq!(&bytes[1..4], b"PNG", "{}", path.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perf_run_summary_is_consistent() {
    let data = TempDir::new("data");
    let output = TempDir::new("out");
    let server = start_server(&data.0).await;
    let uri = format!("amqp://guest:guest@{}", server.local_address);
    let out = output.0.to_str().unwrap();
    // Rate-limited well below what the server carries, so consumers keep up and the
    // published and consumed counts can be compared.
    let results = sluice_perf::execute(args(&[
        "--uri",
        &uri,
        "--producers",
        "2",
        "--consumers",
        "2",
        "--rate",
        "300",
        "--size",
        "200",
        "--confirm",
        "30",
        "--qos",
        "30",
        "--queue-pattern",
        "perf-test-%d",
        "--queue-pattern-to",
        "2",
        "--time",
        "3",
        "--output",
        out,
        "--no-progress",
    ]))
    .await
    .expect("perf runs without errors");
    server.stop().await;

    assert_eq!(results.len(), 1);
    let summary = read_json(&output.0.join("summary.json"));
    let published = summary["published"].as_u64().unwrap();
    let confirmed = summary["confirmed"].as_u64().unwrap();
    let consumed = summary["consumed"].as_u64().unwrap();
    assert!(published > 100, "{summary}");
    // Stopping cuts off what is in flight: at most a window per producer.
    assert!(published - confirmed <= 2 * 30, "{summary}");
    // Consumers stop when producers do: what they had not received yet is
    // lost to the count, a tenth of the run at most even on a loaded machine.
    assert!(
        published.abs_diff(consumed) <= 2 * 30 + published / 10,
        "{summary}"
    );
    for rate in ["published_rate", "confirmed_rate", "consumed_rate"] {
        assert!(summary[rate].as_f64().unwrap() > 0.0, "{rate}: {summary}");
    }
    assert_ordered(&summary["consumer_latency_us"]);
    assert_ordered(&summary["confirm_latency_us"]);

    let csv = std::fs::read_to_string(output.0.join("per-second.csv")).unwrap();
    let rows = csv.lines().count() - 1;
    assert!((2..=4).contains(&rows), "{rows} rows:\n{csv}");
    for chart in [
        "throughput.png",
        "consumer-latency.png",
        "confirm-latency.png",
    ] {
        assert_png(&output.0.join(chart));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perf_sweep_runs_each_point_and_draws_the_charts() {
    let data = TempDir::new("data");
    let output = TempDir::new("out");
    let server = start_server(&data.0).await;
    let uri = format!("amqp://guest:guest@{}", server.local_address);
    let out = output.0.to_str().unwrap();
    // PerfTest's default topology: one server-named queue per consumer.
    let results = sluice_perf::execute(args(&[
        "--uri",
        &uri,
        "--producers",
        "1",
        "--consumers",
        "1",
        "--rate",
        "200",
        "--qos",
        "20",
        "--multi-ack-every",
        "5",
        "--sweep",
        "none,10",
        "--time",
        "2",
        "--output",
        out,
        "--no-progress",
    ]))
    .await
    .expect("sweep runs without errors");
    server.stop().await;

    assert_eq!(results.len(), 2);
    let sweep = read_json(&output.0.join("sweep.json"));
    let runs = sweep.as_array().unwrap();
    assert_eq!(runs[0]["label"], "no confirms");
    assert_eq!(runs[1]["label"], "in-flight 10% (20)");
    assert!(runs[0]["confirm_latency_us"].is_null());
    assert_ordered(&runs[1]["confirm_latency_us"]);
    for run in runs {
        assert!(run["consumed"].as_u64().unwrap() > 0, "{run}");
        assert_ordered(&run["consumer_latency_us"]);
    }
    assert!(output.0.join("01-no-confirms/summary.json").exists());
    assert!(output.0.join("02-inflight-10pct/summary.json").exists());
    for chart in [
        "published",
        "consumed",
        "consumer-latency-p99",
        "confirm-latency-p99",
    ] {
        assert_png(&output.0.join(format!("sweep-{chart}.png")));
    }
}

/// Multiple acks must reach the broker in the order they were made: an older one arriving
/// after a newer one names a tag already settled, and the broker closes the channel with
/// 406. Unthrottled, with an ack every two deliveries, so many acks are in flight at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiple_acks_reach_the_broker_in_order() {
    let data = TempDir::new("data");
    let server = start_server(&data.0).await;
    let uri = format!("amqp://guest:guest@{}", server.local_address);
    let results = sluice_perf::execute(args(&[
        "--uri",
        &uri,
        "--producers",
        "2",
        "--consumers",
        "4",
        "--qos",
        "20",
        "--multi-ack-every",
        "2",
        "--time",
        "2",
        "--no-progress",
    ]))
    .await
    .expect("no ack is refused");
    server.stop().await;
    assert!(
        results[0].summary.consumed > 1000,
        "{:?}",
        results[0].summary
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_propose_a_frame_that_fits_the_message() {
    let data = TempDir::new("data");
    let server = start_server(&data.0).await;
    let uri = format!("amqp://guest:guest@{}", server.local_address);
    let negotiated = |uri: String, frame_max: u32| async move {
        let options = sluice_perf::client::SocketOptions {
            frame_max,
            send_buffer: 0,
            receive_buffer: 0,
        };
        let connection = sluice_perf::topology::connect(&uri, options, "frame test")
            .await
            .expect("connects");
        let frame_max = connection.frame_max();
        connection.close().await;
        frame_max
    };
    let fitted = args(&["--size", "1000"])
        .workload(None)
        .unwrap()
        .frame_max();
    assert_eq!(negotiated(uri.clone(), fitted).await, 4096);
    // The URI's own frame_max wins; 0 takes the broker's (Sluice's default, 128 KiB).
    assert_eq!(
        negotiated(format!("{uri}?frame_max=16384"), fitted).await,
        16384
    );
    assert_eq!(negotiated(uri.clone(), 0).await, 131_072);
    server.stop().await;
}
