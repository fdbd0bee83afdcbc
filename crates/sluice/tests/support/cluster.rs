//! Real `sluice server` processes started as a cluster exactly as the
//! README shows (`node_name` and `cluster_formation.*` in each node's
//! file), on free ports, with their logs read as an operator would: start,
//! kill (SIGKILL), pause (SIGSTOP) and restart them on their data dirs.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::free_port;

/// Short, so that a hung node is noticed quickly in the test.
pub const HEARTBEAT_TIMEOUT_MS: u64 = 1000;

pub struct Node {
    pub name: String,
    pub config: PathBuf,
    pub data_dir: PathBuf,
    pub amqp_port: u16,
    pub cookie: String,
    process: Option<Child>,
    /// Lines of the node's log, read on a thread.
    log: Option<mpsc::Receiver<String>>,
    /// The lines read so far, and where the next wait starts looking.
    seen: std::cell::RefCell<(Vec<String>, usize)>,
}

impl Node {
    pub fn start(&mut self) {
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
    pub fn wait_for_log(&self, parts: &[&str], within: Duration) -> Duration {
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

    /// Whether a line containing every one of `parts` was logged since the
    /// last [`Node::mark`], as far as the log was read now.
    pub fn has_logged(&self, parts: &[&str]) -> bool {
        let mut seen = self.seen.borrow_mut();
        if let Some(log) = self.log.as_ref() {
            while let Ok(line) = log.try_recv() {
                seen.0.push(line);
            }
        }
        let (lines, cursor) = &*seen;
        lines[*cursor..]
            .iter()
            .any(|line| parts.iter().all(|part| line.contains(part)))
    }

    /// The lines logged since the last [`Node::mark`], as far as read now.
    pub fn logged_since_mark(&self) -> Vec<String> {
        self.has_logged(&[]);
        let seen = self.seen.borrow();
        seen.0[seen.1..].to_vec()
    }

    /// Later waits look only at lines logged from now on.
    pub fn mark(&self) {
        let mut seen = self.seen.borrow_mut();
        let log = self.log.as_ref().expect("the node was started");
        while let Ok(line) = log.try_recv() {
            seen.0.push(line);
        }
        seen.1 = seen.0.len();
    }

    /// Sends `signal`. SIGSTOP returns once every thread of the node has
    /// stopped: kill(2) only marks the stop, and on a loaded machine the
    /// node's workers may run on for milliseconds, taking what a test sends
    /// "after" the pause.
    pub fn signal(&self, signal: i32) {
        let pid = self.process.as_ref().expect("running").id() as i32;
        // SAFETY: kill(2) on a child this test owns.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        if signal == libc::SIGSTOP {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !all_threads_stopped(pid) {
                assert!(Instant::now() < deadline, "{} never stopped", self.name);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    pub fn kill(&mut self) {
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

/// Waits until every node listens for AMQP connections. A node binds its
/// AMQP and management listeners together once it has joined a majority,
/// and the nodes get there at different times: one serving says nothing of
/// the others. Panics with the node's log when one does not within a
/// minute.
pub async fn wait_until_every_node_serves(nodes: &[Node]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for node in nodes {
        while tokio::net::TcpStream::connect(("127.0.0.1", node.amqp_port))
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                panic!(
                    "{} does not listen on {} after a minute; it logged:\n{}",
                    node.name,
                    node.amqp_port,
                    node.logged_since_mark().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Nodes named `sluice1`, `sluice2`, … with config files as the README shows
/// them; `cookies` gives each node's cookie.
pub fn cluster(test: &str, cookies: &[&str]) -> Vec<Node> {
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

/// A connection to `node`, tried for a minute while the node starts;
/// panics with the node's log when it takes none.
pub async fn connect_to(node: &Node) -> lapin::Connection {
    let uri = format!("amqp://guest:guest@127.0.0.1:{}/%2f", node.amqp_port);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let attempt = tokio::time::timeout(
            Duration::from_secs(10),
            lapin::Connection::connect(&uri, lapin::ConnectionProperties::default()),
        )
        .await;
        let failure = match attempt {
            Ok(Ok(connection)) => return connection,
            Ok(Err(error)) => error.to_string(),
            Err(_) => "no handshake within 10 s".to_owned(),
        };
        if Instant::now() > deadline {
            panic!(
                "cannot connect to {}: {failure}; it logged:\n{}",
                node.name,
                node.logged_since_mark().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A connection to `node` and a channel on it.
pub async fn channel_on(node: &Node) -> (lapin::Connection, lapin::Channel) {
    let connection = connect_to(node).await;
    let channel = connection.create_channel().await.expect("channel opens");
    (connection, channel)
}

/// Whether every thread of process `pid` is stopped (state `T` in
/// `/proc/PID/task/TID/stat`).
fn all_threads_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // The state follows the command name, which is in parentheses
            // and may hold anything.
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
        })
    })
}
