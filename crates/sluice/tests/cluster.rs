//! Real `sluice server` processes started as a cluster exactly as the
//! README shows (`node_name` and `cluster_formation.*` in each node's file),
//! linked to each other, under SIGSTOP, SIGKILL and a restart, and refusing
//! a node with another cookie. What they do is read from their logs, as an
//! operator would.

mod support;

use std::process::Command;
use std::time::Duration;

use support::cluster::{cluster, HEARTBEAT_TIMEOUT_MS};

const START: Duration = Duration::from_secs(30);

#[test]
fn cluster_nodes_link_notice_a_hung_or_killed_node_and_take_it_back() {
    let mut nodes = cluster("links", &["secret", "secret", "secret"]);
    // In any order: the third first.
    for index in [2, 0, 1] {
        nodes[index].start();
    }
    for node in &nodes {
        for peer in nodes.iter().filter(|peer| peer.name != node.name) {
            node.wait_for_log(&["link up", &peer.name], START);
        }
    }

    // A node that hangs, as if partitioned: the others see it down within
    // a few heartbeat timeouts, and take it back when it resumes.
    for node in &nodes {
        node.mark();
    }
    nodes[2].signal(libc::SIGSTOP);
    for node in &nodes[..2] {
        let noticed = node.wait_for_log(&["link down", &nodes[2].name], START);
        assert!(
            noticed < Duration::from_millis(HEARTBEAT_TIMEOUT_MS * 4),
            "{} noticed the hung node after {noticed:?}",
            node.name
        );
    }
    for node in &nodes[..2] {
        node.mark();
    }
    nodes[2].signal(libc::SIGCONT);
    for node in &nodes[..2] {
        node.wait_for_log(&["link up", &nodes[2].name], START);
    }

    // A node killed and restarted with its data dir links again.
    nodes[0].mark();
    nodes[1].kill();
    nodes[0].wait_for_log(&["link down", &nodes[1].name], START);
    nodes[1].start();
    for peer in [&nodes[0], &nodes[2]] {
        nodes[1].wait_for_log(&["link up", &peer.name], START);
    }
}

#[test]
fn cluster_nodes_with_different_cookies_refuse_each_other_and_both_log_why() {
    let mut nodes = cluster("cookies", &["one secret", "another secret"]);
    nodes[0].start();
    nodes[1].start();
    for node in &nodes {
        node.wait_for_log(&["cookie"], START);
    }
}

#[test]
fn cluster_node_not_in_its_member_list_does_not_start() {
    let nodes = cluster("stranger", &["secret", "secret"]);
    let config = nodes[0].config.clone();
    let text = std::fs::read_to_string(&config).unwrap();
    let stranger = text.replace(
        &format!("node_name = {}", nodes[0].name),
        "node_name = stranger@127.0.0.1:1",
    );
    std::fs::write(&config, stranger).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&nodes[0].data_dir)
        .arg("--config")
        .arg(&config)
        .env("SLUICE_COOKIE", "secret")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "node_name 'stranger@127.0.0.1:1' is not one of cluster_formation.classic_config.nodes"
        ),
        "{stderr}"
    );
}
