//! `sluice perf` takes a PerfTest command line as it is: multi-letter
//! short options (`-ad`, `-qpf`), `-p` for queues that exist already, and
//! PerfTest's options it has no use for (`-o`, `--id`), each named in a
//! warning instead of refused.

mod support;

use std::process::Command;

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use support::{connect, free_port};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perf_cli_runs_a_perftest_command_line_against_a_predeclared_queue() {
    let dir = support::fresh_dir("perf-cli");
    let port = free_port();
    let mut server = support::server_command(port, &dir, None).spawn().unwrap();
    // A queue declared otherwise than PerfTest would (not auto-delete, with
    // an argument): only -p lets the run use it.
    let connection = connect(port).await;
    let channel = connection.create_channel().await.unwrap();
    let mut arguments = FieldTable::default();
    arguments.insert("x-max-length".into(), AMQPValue::LongInt(1_000_000));
    channel
        .queue_declare("pre".into(), QueueDeclareOptions::default(), arguments)
        .await
        .unwrap();

    let perf = |extra: &[&str]| {
        let uri = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
        let mut arguments = vec![
            "perf",
            "-h",
            &uri,
            "-x",
            "1",
            "-y",
            "1",
            "-u",
            "pre",
            "-ad",
            "false",
            "-s",
            "100",
            "-C",
            "300",
            "-D",
            "300",
            "-z",
            "20",
            "-o",
            "out.csv",
            "--id",
            "cli-test",
            "--no-progress",
        ];
        arguments.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(arguments)
            .output()
            .unwrap()
    };
    let with_p = perf(&["-p"]);
    let stderr = String::from_utf8_lossy(&with_p.stderr);
    assert!(with_p.status.success(), "{stderr}");
    assert!(
        stderr.contains("PerfTest option -o/--output-file is accepted but does nothing here"),
        "{stderr}"
    );
    assert!(stderr.contains("-d/--id"), "{stderr}");
    // The run used the queue as it was, and its consumer took all it sent.
    let queue = support::declare_passive(&channel, "pre").await.unwrap();
    assert_eq!(queue.message_count(), 0);

    // Without -p the queue is declared PerfTest's way, and the broker
    // refuses the different arguments.
    let without_p = perf(&[]);
    assert!(!without_p.status.success());
    assert!(
        String::from_utf8_lossy(&without_p.stderr).contains("PRECONDITION_FAILED"),
        "{}",
        String::from_utf8_lossy(&without_p.stderr)
    );
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
