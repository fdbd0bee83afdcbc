//! Real `sluice server` processes started as a cluster exactly as the
//! README shows (`node_name` and `cluster_formation.*` in each node's file),
//! linked to each other, under SIGSTOP, SIGKILL and a restart, and refusing
//! a node with another cookie. What they do is read from their logs, as an
//! operator would.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::free_port;

/// Short, so that a hung node is noticed quickly in the test.
const HEARTBEAT_TIMEOUT_MS: u64 = 1000;

struct Node {
    name: String,
    config: PathBuf,
    data_dir: PathBuf,
    amqp_port: u16,
    cookie: String,
    process: Option<Child>,
    /// Lines of the node's log, read on a thread.
    log: Option<mpsc::Receiver<String>>,
    /// The lines read so far, and where the next wait starts looking.
    seen: std::cell::RefCell<(Vec<String>, usize)>,
}

impl Node {
    fn start(&mut self) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["server", "--listen"])
            .arg(format!("127.0.0.1:{}", self.amqp_port))
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--config")
            .arg(&self.config)
            .env("SLUICE_COOKIE", &self.cookie)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the sluice binary starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (lines, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    return;
                }
            }
        });
        self.process = Some(child);
        self.log = Some(log);
        let mut seen = self.seen.borrow_mut();
        seen.0.clear();
        seen.1 = 0;
    }

    /// Waits for a log line containing every one of `parts`, logged since
    /// the last [`Node::mark`]; returns how long it waited.
    fn wait_for_log(&self, parts: &[&str], within: Duration) -> Duration {
        let started = Instant::now();
        let matches = |line: &String| parts.iter().all(|part| line.contains(part));
        let log = self.log.as_ref().expect("the node was started");
        let mut seen = self.seen.borrow_mut();
        let (lines, cursor) = &mut *seen;
        if lines[*cursor..].iter().any(matches) {
            return Duration::ZERO;
        }
        loop {
            let left = within.saturating_sub(started.elapsed());
            match log.recv_timeout(left) {
                Ok(line) => {
                    let found = matches(&line);
                    lines.push(line);
                    if found {
                        return started.elapsed();
                    }
                }
                Err(_) => panic!(
                    "{} never logged {parts:?} within {within:?}; it logged:\n{}",
                    self.name,
                    lines.join("\n")
                ),
            }
        }
    }

    /// Later waits look only at lines logged from now on.
    fn mark(&self) {
        let mut seen = self.seen.borrow_mut();
        let log = self.log.as_ref().expect("the node was started");
        while let Ok(line) = log.try_recv() {
            seen.0.push(line);
        }
        seen.1 = seen.0.len();
    }

    fn signal(&self, signal: i32) {
        let pid = self.process.as_ref().expect("running").id() as i32;
        // SAFETY: kill(2) on a child this test owns.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.log = None;
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.process.is_some() {
            self.signal(libc::SIGCONT);
        }
        self.kill();
        let _ = std::fs::remove_dir_all(self.data_dir.parent().expect("a node directory"));
    }
}

/// Nodes named `sluice1`, `sluice2`, … with config files as the README shows
/// them; `cookies` gives each node's cookie.
fn cluster(test: &str, cookies: &[&str]) -> Vec<Node> {
    let link_ports: Vec<u16> = cookies.iter().map(|_| free_port()).collect();
    let names: Vec<String> = link_ports
        .iter()
        .enumerate()
        .map(|(index, port)| format!("sluice{}@127.0.0.1:{port}", index + 1))
        .collect();
    let members: String = names
        .iter()
        .enumerate()
        .map(|(index, name)| {
            format!(
                "cluster_formation.classic_config.nodes.{} = {name}\n",
                index + 1
            )
        })
        .collect();
    let base = std::env::temp_dir().join(format!("sluice-cluster-{test}-{}", std::process::id()));
    names
        .iter()
        .zip(cookies)
        .enumerate()
        .map(|(index, (name, cookie))| {
            let dir = base.join(format!("n{}", index + 1));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let config = dir.join("node.conf");
            write_config(&config, name, &members);
            Node {
                name: name.clone(),
                config,
                data_dir: dir.join("data"),
                amqp_port: free_port(),
                cookie: (*cookie).to_owned(),
                process: None,
                log: None,
                seen: Default::default(),
            }
        })
        .collect()
}

fn write_config(path: &Path, name: &str, members: &str) {
    let text = format!(
        "node_name = {name}\n\
         cluster_formation.peer_discovery_backend = classic_config\n\
         {members}\
         cluster_link.heartbeat_timeout = {HEARTBEAT_TIMEOUT_MS}\n"
    );
    std::fs::write(path, text).unwrap();
}

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
