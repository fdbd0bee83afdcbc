//! `log.file` and `log.console`: a server configured to log to a file
//! writes its lines there (warnings about keys that do not apply among
//! them) and, with the console off, nothing to stderr.

mod support;

use support::{connect, free_port};

#[tokio::test]
async fn logging_to_a_file_with_the_console_off() {
    let dir = support::fresh_dir("logging");
    let log = dir.join("sluice.log");
    let config = dir.join("sluice.conf");
    std::fs::write(
        &config,
        format!(
            "log.file = {}\nlog.file.level = info\nlog.console = false\ncluster_partition_handling = pause_minority\n",
            log.display()
        ),
    )
    .unwrap();
    let port = free_port();
    let server = support::server_command(port, &dir.join("data"), Some(&config))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let connection = connect(port).await;
    connection.close(200, "bye".into()).await.unwrap();
    unsafe {
        libc::kill(server.id() as i32, libc::SIGTERM);
    }
    let output = server.wait_with_output().unwrap();
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.is_empty(), "nothing on the console: {stderr}");
    let written = std::fs::read_to_string(&log).unwrap();
    assert!(written.contains("starting sluice"), "{written}");
    assert!(
        written.contains("'cluster_partition_handling' is accepted but does nothing in Sluice"),
        "{written}"
    );
    assert!(written.contains("stopped"), "{written}");
    let _ = std::fs::remove_dir_all(&dir);
}
