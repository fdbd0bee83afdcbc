//! Starts a real Sluice server on a free loopback port for a test.
#![allow(dead_code)]

use std::net::SocketAddr;

use sluice_server::config::Config;
use sluice_server::RunningServer;

pub mod alarm;
pub mod cluster;
pub mod raw;

pub struct TestServer {
    pub server: Option<RunningServer>,
    pub address: SocketAddr,
    data_dir: std::path::PathBuf,
    _temporary_dir: tempdir::TempDir,
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

/// A server on a free loopback port, its data in `data_dir`.
fn test_config(data_dir: &tempdir::TempDir) -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data_dir.0.clone(),
        ..Config::default()
    }
}

/// Starts a server as [`TestServer::start_with`] would, expecting it to
/// refuse: the error and its causes, as one line.
pub async fn start_error(adjust: impl FnOnce(&mut Config)) -> String {
    let data_dir = tempdir::TempDir::new();
    let mut config = test_config(&data_dir);
    adjust(&mut config);
    let error = match sluice_server::start(config).await {
        Ok(_) => panic!("the server must not start"),
        Err(error) => error,
    };
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// Starts a server on 127.0.0.1 with a free port, after `adjust` edits
    /// the default configuration.
    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> Self {
        let data_dir = tempdir::TempDir::new();
        let mut config = test_config(&data_dir);
        adjust(&mut config);
        let config_data_dir = config.data_dir.clone();
        let server = sluice_server::start(config).await.expect("server starts");
        let address = server.local_address;
        TestServer {
            server: Some(server),
            address,
            data_dir: config_data_dir,
            _temporary_dir: data_dir,
        }
    }

    /// The data directory this server was started on.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    /// A queue of the default vhost, looked up directly in the broker.
    pub fn queue(&self, name: &str) -> std::sync::Arc<dyn sluice_core::queue::Queue> {
        let server = self.server.as_ref().expect("the server runs");
        server
            .broker
            .vhost("/")
            .expect("the default vhost exists")
            .queues()
            .into_iter()
            .find(|queue| &**queue.name() == name)
            .unwrap_or_else(|| panic!("no queue '{name}'"))
    }

    /// The running server, for what only the process can see: alarms, connections.
    pub fn running(&self) -> &RunningServer {
        self.server.as_ref().expect("the server is running")
    }

    pub fn uri(&self) -> String {
        format!("amqp://guest:guest@{}/%2f", self.address)
    }

    /// Stops this server and starts another on the same data directory:
    /// it recovers what the first left there.
    pub async fn restart(self) -> Self {
        let TestServer {
            server,
            data_dir,
            _temporary_dir,
            ..
        } = self;
        if let Some(server) = server {
            server.stop().await;
        }
        let mut restarted = Self::start_with(|config| config.data_dir = data_dir).await;
        // Removed with the restarted server (its own fresh one goes now).
        restarted._temporary_dir = _temporary_dir;
        restarted
    }

    pub async fn stop(mut self) {
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
    }
}
