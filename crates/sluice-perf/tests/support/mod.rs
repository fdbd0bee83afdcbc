//! What the tests of `sluice perf` share: a scratch directory and a Sluice server in the
//! test's process.

use std::path::{Path, PathBuf};

use sluice_server::config::Config;

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!(
            "sluice-perf-test-{name}-{}-{}",
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

pub async fn start_server(data_dir: &Path) -> sluice_server::RunningServer {
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data_dir.to_owned(),
        ..Config::default()
    };
    sluice_server::start(config).await.expect("server starts")
}
