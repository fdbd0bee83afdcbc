//! The AMQP 0-9-1 server.
//!
//! - [`alarm`]: memory and disk alarms that block publishers, and their monitor.
//! - [`resource_limit`]: the alarm thresholds, relative or absolute.
//! - [`cluster_alarms`]: an alarm on any node of the cluster blocks publishers on all.
//! - [`config`]: the rabbitmq.conf-style configuration file and its defaults.
//! - [`cluster_config`]: `node_name` and `cluster_formation.*`: the node's cluster.
//! - [`server`]: the TCP listener and shutdown.
//! - [`metadata_log`]: the metadata Raft group, with the broker as its state machine.
//! - [`node_monitor`]: a node that goes down loses its non-durable queues.
//! - [`connection`]: one client connection's reader task and frame handling.
//! - [`connection_registry`]: the open connections and their flow-control state.
//! - [`handshake`]: protocol header, authentication, tuning, vhost.
//! - [`channel`]: a channel's methods: publish, consume, declare, tx, confirms.
//! - [`delivery`]: what queues call to deliver to a channel's consumers.
//! - [`outbox`]: a connection's output buffer and its writer task.
//! - [`frame_reader`]: frames off the socket.
//! - [`client_stream`]: a client's socket, plain or TLS, as the halves a connection uses.
//! - [`tls`]: the amqps listener: `ssl_options.*`, handshakes, certificate logins.
//! - [`data_dir_lock`]: one server per data directory.
//! - [`fd_limit`]: the file-descriptor limit, raised, and the connections it allows.
//! - [`limits`]: every bound on a buffer or queue, in one place.

pub mod access_check;
pub mod alarm;
pub mod bodies_under_way;
pub mod channel;
pub mod client_stream;
pub mod close_signal;
pub mod cluster_alarms;
pub mod cluster_config;
pub mod cluster_connection_counts;
pub mod config;
pub mod connection;
pub mod connection_context;
pub mod connection_registry;
pub mod data_dir_lock;
pub mod deleted_owners;
pub mod delivery;
pub mod fd_limit;
pub mod forwarding;
pub mod frame_reader;
pub mod handshake;
pub mod http_listener;
pub mod in_flight;
pub mod limits;
pub mod management;
pub mod metadata_log;
pub mod node_monitor;
pub mod outbox;
#[cfg(test)]
mod panic_failpoint;
pub mod prometheus;
pub mod quorum_groups;
pub mod quorum_hibernation;
pub mod resource_limit;
pub mod server;
pub mod settings;
pub mod store_config;
pub mod tcp_listen_options;
pub mod tls;
pub mod uncommitted;

pub use server::{run, start, RunningServer, ServerError};
