//! One server per data directory: a second `sluice server` on a directory
//! in use exits at once, naming the directory and the process holding it,
//! and the first keeps serving.

mod support;

use std::process::{Command, Stdio};

use support::{connect, free_port};

#[tokio::test]
async fn data_dir_second_server_on_a_directory_in_use_exits_naming_the_holder() {
    let data_dir = std::env::temp_dir().join(format!("sluice-data-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let first_port = free_port();
    let mut first = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "server",
            "--listen",
            &format!("127.0.0.1:{first_port}"),
            "--data-dir",
        ])
        .arg(&data_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let connection = connect(first_port).await;

    let second = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data_dir)
        .output()
        .unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains(&data_dir.display().to_string()), "{stderr}");
    assert!(stderr.contains(&format!("pid {}", first.id())), "{stderr}");

    let channel = connection
        .create_channel()
        .await
        .expect("the first still serves");
    channel
        .queue_declare("still-here".into(), Default::default(), Default::default())
        .await
        .unwrap();
    let _ = first.kill();
    let _ = first.wait();
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// A journal segment lost from the middle of a durable queue's journal
/// stops the start, naming it, instead of losing its messages without a
/// word; `store.missing_segments = skip` starts without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_dir_segment_missing_from_a_journal_stops_the_start_unless_skipped() {
    use lapin::options::BasicPublishOptions;
    use lapin::BasicProperties;

    let dir = support::fresh_dir("missing-segment");
    let data_dir = dir.join("data");
    let config = dir.join("sluice.conf");
    std::fs::write(&config, "store.segment_size = 1MiB\n").unwrap();
    let port = free_port();
    let start = |config: &std::path::Path| {
        support::server_command(port, &data_dir, Some(config))
            .spawn()
            .unwrap()
    };
    let mut server = start(&config);
    let connection = connect(port).await;
    let channel = support::durable_queue_with_confirms(&connection, "ledger").await;
    // 40 × 100 KiB: four 1 MiB segments.
    let body = vec![7u8; 100 * 1024];
    for _ in 0..40 {
        channel
            .basic_publish(
                "".into(),
                "ledger".into(),
                BasicPublishOptions::default(),
                &body,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    drop(connection);
    assert!(support::stop(&mut server).success());

    let queues = data_dir.join("queues");
    let journal = std::fs::read_dir(&queues)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.is_dir())
        .expect("the queue's journal directory");
    let mut segments: Vec<std::path::PathBuf> = std::fs::read_dir(&journal)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    segments.sort();
    assert!(segments.len() >= 3, "{segments:?}");
    std::fs::remove_file(&segments[1]).unwrap();

    let refused = support::server_command(port, &data_dir, Some(&config))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
        .wait_with_output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("missing segment file"), "{stderr}");
    assert!(stderr.contains("ledger"), "{stderr}");

    std::fs::write(
        &config,
        "store.segment_size = 1MiB\nstore.missing_segments = skip\n",
    )
    .unwrap();
    let mut server = start(&config);
    let connection = connect(port).await;
    let channel = connection.create_channel().await.unwrap();
    let queue = support::declare_passive(&channel, "ledger").await.unwrap();
    assert!(
        queue.message_count() > 0 && queue.message_count() < 40,
        "the other segments' messages are there: {}",
        queue.message_count()
    );
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
