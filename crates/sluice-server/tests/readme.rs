//! The configuration examples in the README are what the server accepts.

use sluice_server::config::Config;

const README: &str = include_str!("../../../README.md");

/// The `ini` code blocks of the README, in order.
fn ini_blocks() -> Vec<&'static str> {
    README
        .split("```ini\n")
        .skip(1)
        .map(|rest| rest.split("```").next().expect("a closed block"))
        .collect()
}

#[test]
fn readme_every_config_example_parses() {
    let blocks = ini_blocks();
    assert!(
        blocks.len() >= 2,
        "the README has its config and cluster examples"
    );
    for block in &blocks {
        if let Err(error) = Config::parse(block, Config::default()) {
            panic!("a README example is refused: {error}\n{block}");
        }
    }
}

#[test]
fn readme_cluster_example_is_a_three_node_cluster() {
    let cluster = ini_blocks()
        .into_iter()
        .find(|block| block.contains("cluster_formation.classic_config.nodes.3"))
        .expect("the README shows a cluster");
    let config = Config::parse(cluster, Config::default()).unwrap();
    let membership = config.cluster.membership().unwrap().expect("a cluster");
    assert_eq!(membership.node.as_str(), "sluice1@127.0.0.1:25681");
    assert_eq!(membership.members.len(), 3);
}
