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
