//! Three servers linked as one cluster in the test's process, each on its
//! own ports and data directory.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use sluice_cluster::node_name::NodeName;
use sluice_server::cluster_config::ClusterConfig;
use sluice_server::config::Config;
use sluice_server::server::start_with_cluster_listener;
use sluice_server::RunningServer;
use tokio::net::TcpListener;

/// The secret every node started in a test process shares: nodes read it
/// from the environment as they start, so a test process has one.
pub const COOKIE: &str = "test cluster secret";

pub struct TestCluster {
    /// The nodes that started, in order.
    pub servers: Vec<RunningServer>,
    pub names: Vec<NodeName>,
    dirs: Vec<PathBuf>,
}

impl TestCluster {
    /// Starts three nodes after `adjust` edits each one's configuration
    /// (given the node's index and name), and waits for the first
    /// `expected` of them: a node its peers refuse never starts.
    pub async fn start(
        test: &str,
        expected: usize,
        adjust: impl Fn(usize, &NodeName, &mut Config),
    ) -> Self {
        // Every node of this process shares the secret.
        std::env::set_var("SLUICE_COOKIE", COOKIE);
        let mut listeners = Vec::new();
        let mut names: Vec<NodeName> = Vec::new();
        for index in 1..=3 {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let name = format!("sluice{index}@{}", listener.local_addr().unwrap());
            names.push(name.parse().unwrap());
            listeners.push(listener);
        }
        let members: BTreeMap<u32, NodeName> = (1..=3).zip(names.iter().cloned()).collect();
        let mut starting = Vec::new();
        let mut dirs = Vec::new();
        for (index, (listener, name)) in listeners.into_iter().zip(&names).enumerate() {
            // The port too: tests of one process may share a test name.
            let data_dir = std::env::temp_dir().join(format!(
                "sluice-{test}-{}-{}-{}",
                name.name(),
                listener.local_addr().unwrap().port(),
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&data_dir);
            dirs.push(data_dir.clone());
            let mut config = Config {
                listen: "127.0.0.1:0".parse().unwrap(),
                data_dir,
                cluster: ClusterConfig {
                    node_name: Some(name.clone()),
                    peer_discovery_backend: Some("classic_config".to_owned()),
                    classic_config_nodes: members.clone(),
                    link_heartbeat_timeout: Duration::from_secs(1),
                    ..ClusterConfig::default()
                },
                ..Config::default()
            };
            adjust(index, name, &mut config);
            starting.push(tokio::spawn(start_with_cluster_listener(
                config,
                Some(listener),
            )));
        }
        let mut servers = Vec::new();
        for started in starting.into_iter().take(expected) {
            servers.push(started.await.unwrap().expect("the node starts"));
        }
        TestCluster {
            servers,
            names,
            dirs,
        }
    }

    pub async fn stop(self) {
        for server in self.servers {
            server.stop().await;
        }
        for dir in self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
