//! The keys that make a node part of a cluster, as RabbitMQ names them:
//!
//! ```text
//! node_name = sluice1@127.0.0.1:25681
//! cluster_formation.peer_discovery_backend = classic_config
//! cluster_formation.classic_config.nodes.1 = sluice1@127.0.0.1:25681
//! cluster_formation.classic_config.nodes.2 = sluice2@127.0.0.1:25682
//! cluster_formation.classic_config.nodes.3 = sluice3@127.0.0.1:25683
//! ```
//!
//! `node_name` is `NAME@HOST:PORT`, HOST:PORT being the node's inter-node
//! listener (RabbitMQ's names carry no port). A node with no
//! `cluster_formation` keys is a cluster of one.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_cluster::link::HEARTBEAT_TIMEOUT_DEFAULT;
use sluice_cluster::node_name::NodeName;

/// Keys handled here, for the parser's typo suggestions.
pub const CLUSTER_KEYS: &[&str] = &[
    "node_name",
    "cluster_formation.peer_discovery_backend",
    "cluster_formation.classic_config.nodes.1",
    "cluster_link.heartbeat_timeout",
    "cluster_link.ssl",
    "cluster_link.ssl_options.cacertfile",
    "cluster_link.ssl_options.certfile",
    "cluster_link.ssl_options.keyfile",
];

/// The peer discovery backends Sluice has: RabbitMQ's static list, under
/// its two names.
const CLASSIC_CONFIG_NAMES: &[&str] = &["classic_config", "rabbit_peer_discovery_classic_config"];

/// A cluster of more nodes than this is refused: every node links to every
/// other, and the metadata group replicates to all of them.
pub const CLUSTER_NODES_MAX: usize = 64;

/// The heartbeat timeout's bounds, in milliseconds: below 100 ms a busy
/// machine's scheduling alone would break links; past a minute a hung node
/// goes unnoticed for longer than anyone waits for a failover.
const HEARTBEAT_TIMEOUT_MS_RANGE: std::ops::RangeInclusive<u64> = 100..=60_000;

#[derive(Clone, Debug, PartialEq)]
pub struct ClusterConfig {
    /// This node (`node_name`, or `--node-name`).
    pub node_name: Option<NodeName>,
    /// `cluster_formation.peer_discovery_backend`, as written.
    pub peer_discovery_backend: Option<String>,
    /// `cluster_formation.classic_config.nodes.N`, by N.
    pub classic_config_nodes: BTreeMap<u32, NodeName>,
    /// A peer that sends nothing for this long is down
    /// (`cluster_link.heartbeat_timeout`, milliseconds; default 5000).
    pub link_heartbeat_timeout: Duration,
    /// TLS between the nodes (`cluster_link.ssl` and
    /// `cluster_link.ssl_options.*`, Sluice keys: RabbitMQ sets inter-node
    /// TLS in Erlang's distribution options instead).
    pub link_tls: LinkTlsConfig,
}

/// `cluster_link.ssl = true` and the files both ends of every link use:
/// this node's certificate and key, and the authority that signed every
/// node's certificate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkTlsConfig {
    pub enabled: bool,
    pub cacertfile: Option<std::path::PathBuf>,
    pub certfile: Option<std::path::PathBuf>,
    pub keyfile: Option<std::path::PathBuf>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            node_name: None,
            peer_discovery_backend: None,
            classic_config_nodes: BTreeMap::new(),
            link_heartbeat_timeout: HEARTBEAT_TIMEOUT_DEFAULT,
            link_tls: LinkTlsConfig::default(),
        }
    }
}

/// This node and every member, itself included, sorted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership {
    pub node: NodeName,
    pub members: Vec<NodeName>,
}

/// Applies one cluster key. None for a key that is not one of these, else
/// the reason the value is unusable.
pub fn apply(config: &mut ClusterConfig, key: &str, value: &str) -> Option<Result<(), String>> {
    let node = |value: &str| {
        value.parse::<NodeName>().map_err(|error| {
            format!("{error}; expected NAME@HOST:PORT, e.g. sluice1@127.0.0.1:25681")
        })
    };
    let result = match key {
        "node_name" => node(value).map(|name| config.node_name = Some(name)),
        "cluster_formation.peer_discovery_backend" => {
            if CLASSIC_CONFIG_NAMES.contains(&value) {
                config.peer_discovery_backend = Some(value.to_owned());
                Ok(())
            } else {
                Err(
                    "expected 'classic_config', the only peer discovery backend Sluice has"
                        .to_owned(),
                )
            }
        }
        "cluster_link.heartbeat_timeout" => value
            .parse::<u64>()
            .ok()
            .filter(|ms| HEARTBEAT_TIMEOUT_MS_RANGE.contains(ms))
            .map(|ms| config.link_heartbeat_timeout = Duration::from_millis(ms))
            .ok_or_else(|| {
                format!(
                    "expected milliseconds from {} to {}",
                    HEARTBEAT_TIMEOUT_MS_RANGE.start(),
                    HEARTBEAT_TIMEOUT_MS_RANGE.end()
                )
            }),
        "cluster_link.ssl" => match value {
            "true" | "false" => {
                config.link_tls.enabled = value == "true";
                Ok(())
            }
            _ => Err("expected 'true' or 'false'".to_owned()),
        },
        "cluster_link.ssl_options.cacertfile" => {
            config.link_tls.cacertfile = Some(value.into());
            Ok(())
        }
        "cluster_link.ssl_options.certfile" => {
            config.link_tls.certfile = Some(value.into());
            Ok(())
        }
        "cluster_link.ssl_options.keyfile" => {
            config.link_tls.keyfile = Some(value.into());
            Ok(())
        }
        _ => {
            let index = key.strip_prefix("cluster_formation.classic_config.nodes.")?;
            let Ok(index) = index.parse::<u32>() else {
                return Some(Err(
                    "expected a node number after 'nodes.', e.g. nodes.1".to_owned()
                ));
            };
            node(value).map(|name| {
                config.classic_config_nodes.insert(index, name);
            })
        }
    };
    Some(result)
}

impl ClusterConfig {
    /// This node and its cluster's members; None for a cluster of one.
    ///
    /// # Errors
    /// A member list without `node_name`, a `node_name` not in the list,
    /// two members at one address, or more than [`CLUSTER_NODES_MAX`].
    pub fn membership(&self) -> Result<Option<Membership>, String> {
        if self.classic_config_nodes.is_empty() {
            return Ok(None);
        }
        let Some(node) = &self.node_name else {
            return Err("cluster_formation.classic_config.nodes is set but node_name is not: set it (or --node-name) to this node's entry".to_owned());
        };
        let mut members: Vec<NodeName> = self.classic_config_nodes.values().cloned().collect();
        members.sort();
        members.dedup();
        if members.len() > CLUSTER_NODES_MAX {
            return Err(format!("a cluster has at most {CLUSTER_NODES_MAX} nodes"));
        }
        if !members.contains(node) {
            return Err(format!(
                "node_name '{node}' is not one of cluster_formation.classic_config.nodes"
            ));
        }
        for (index, member) in members.iter().enumerate() {
            let twin = members[index + 1..].iter().find(|other| {
                other.host_port() == member.host_port() || other.name() == member.name()
            });
            if let Some(twin) = twin {
                return Err(format!(
                    "cluster members '{member}' and '{twin}' share a name or an address"
                ));
            }
        }
        Ok(Some(Membership {
            node: node.clone(),
            members,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configured(lines: &[(&str, &str)]) -> Result<ClusterConfig, String> {
        let mut config = ClusterConfig::default();
        for (key, value) in lines {
            apply(&mut config, key, value).expect("a cluster key")?;
        }
        Ok(config)
    }

    #[test]
    fn cluster_config_three_members_and_this_node() {
        let config = configured(&[
            ("node_name", "sluice2@127.0.0.1:25682"),
            ("cluster_formation.peer_discovery_backend", "classic_config"),
            (
                "cluster_formation.classic_config.nodes.1",
                "sluice1@127.0.0.1:25681",
            ),
            (
                "cluster_formation.classic_config.nodes.2",
                "sluice2@127.0.0.1:25682",
            ),
            (
                "cluster_formation.classic_config.nodes.3",
                "sluice3@127.0.0.1:25683",
            ),
        ])
        .unwrap();
        let membership = config.membership().unwrap().unwrap();
        assert_eq!(membership.node.as_str(), "sluice2@127.0.0.1:25682");
        assert_eq!(membership.members.len(), 3);
        assert_eq!(ClusterConfig::default().membership(), Ok(None));
    }

    #[test]
    fn cluster_config_link_tls_keys() {
        let config = configured(&[
            ("cluster_link.ssl", "true"),
            ("cluster_link.ssl_options.cacertfile", "/etc/sluice/ca.pem"),
            ("cluster_link.ssl_options.certfile", "/etc/sluice/node.pem"),
            (
                "cluster_link.ssl_options.keyfile",
                "/etc/sluice/node_key.pem",
            ),
        ])
        .unwrap();
        assert!(config.link_tls.enabled);
        assert_eq!(
            config.link_tls.certfile.as_deref(),
            Some(std::path::Path::new("/etc/sluice/node.pem"))
        );
        assert!(!ClusterConfig::default().link_tls.enabled);
        let refused = configured(&[("cluster_link.ssl", "yes")]);
        assert!(refused.unwrap_err().contains("'true' or 'false'"));
    }

    #[test]
    fn cluster_config_refusals_say_what_to_fix() {
        assert!(apply(&mut ClusterConfig::default(), "listeners.tcp.default", "1").is_none());
        let bad_backend = configured(&[("cluster_formation.peer_discovery_backend", "dns")]);
        assert!(bad_backend.unwrap_err().contains("classic_config"));
        let bad_name = configured(&[("node_name", "sluice1@127.0.0.1")]);
        assert!(bad_name.unwrap_err().contains("NAME@HOST:PORT"));
        let no_node = configured(&[("cluster_formation.classic_config.nodes.1", "a@h:1")]).unwrap();
        assert!(no_node.membership().unwrap_err().contains("node_name"));
        let stranger = configured(&[
            ("node_name", "z@h:9"),
            ("cluster_formation.classic_config.nodes.1", "a@h:1"),
        ])
        .unwrap();
        assert!(stranger.membership().unwrap_err().contains("not one of"));
        let twins = configured(&[
            ("node_name", "a@h:1"),
            ("cluster_formation.classic_config.nodes.1", "a@h:1"),
            ("cluster_formation.classic_config.nodes.2", "b@h:1"),
        ])
        .unwrap();
        assert!(twins.membership().unwrap_err().contains("share"));
        let timeout = configured(&[("cluster_link.heartbeat_timeout", "5")]);
        assert!(timeout.unwrap_err().contains("milliseconds"));
    }
}
