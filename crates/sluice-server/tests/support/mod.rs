//! Starts a real Sluice server on a free loopback port for a test.
#![allow(dead_code)]

use std::net::SocketAddr;

use sluice_server::config::Config;
use sluice_server::RunningServer;

pub mod raw;

pub struct TestServer {
    pub server: Option<RunningServer>,
    pub address: SocketAddr,
    _data_dir: tempdir::TempDir,
}

mod tempdir {
    /// A directory removed when dropped.
    pub struct TempDir(pub std::path::PathBuf);
    impl TempDir {
        pub fn new() -> Self {
            let path = std::env::temp_dir().join(format!(
                "sluice-test-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            ));
            std::fs::create_dir_all(&path).unwrap();
            TempDir(path)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// Starts a server on 127.0.0.1 with a free port, after `adjust` edits
    /// the default configuration.
    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> Self {
        let data_dir = tempdir::TempDir::new();
        let mut config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: data_dir.0.clone(),
            ..Config::default()
        };
        adjust(&mut config);
        let server = sluice_server::start(config).await.expect("server starts");
        let address = server.local_address;
        TestServer {
            server: Some(server),
            address,
            _data_dir: data_dir,
        }
    }

    pub fn uri(&self) -> String {
        format!("amqp://guest:guest@{}/%2f", self.address)
    }

    pub async fn stop(mut self) {
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
    }
}
