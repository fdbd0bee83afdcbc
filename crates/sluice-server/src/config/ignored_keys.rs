//! Keys RabbitMQ 3.10 documents for `rabbitmq.conf` that Sluice accepts
//! without acting on them, each with the reason it gives in its one
//! warning. A configuration file from a real deployment starts as it is;
//! only keys RabbitMQ itself would reject (typos) stop the start.
//!
//! An entry ending in `.` covers every key under it (`ssl_options.ciphers.`
//! covers `ssl_options.ciphers.1`).

/// Key (or prefix) → why it does not apply.
const IGNORED: &[(&str, &str)] = &[
    // Not there yet: their issues bring them.
    // TLS options of Erlang's ssl that rustls has no counterpart for.
    (
        "ssl_options.ciphers.",
        "rustls offers its own modern cipher suites (AES-GCM, ChaCha20-Poly1305) only",
    ),
    (
        "ssl_options.honor_cipher_order",
        "rustls prefers the server's cipher suite order",
    ),
    (
        "ssl_options.honor_ecc_order",
        "rustls prefers the server's curve order",
    ),
    (
        "ssl_options.client_renegotiation",
        "rustls never renegotiates",
    ),
    (
        "ssl_options.secure_renegotiate",
        "rustls never renegotiates",
    ),
    (
        "ssl_options.reuse_sessions",
        "sessions are resumed from a bounded in-memory cache",
    ),
    (
        "ssl_options.depth",
        "the certificate chain is checked by webpki with its own bound",
    ),
    (
        "ssl_options.dhfile",
        "rustls uses elliptic-curve key exchange only",
    ),
    (
        "ssl_options.log_alert",
        "failed TLS handshakes are logged at info",
    ),
    (
        "ssl_handshake_timeout",
        "the TLS handshake has handshake_timeout, as the AMQP handshake after it",
    ),
    (
        "num_acceptors.ssl",
        "one task accepts connections; no acceptor pool to size",
    ),
    (
        "management.",
        "Sluice's management API takes management.tcp.port and management.tcp.ip only",
    ),
    (
        "management_agent.",
        "Sluice's management API has no separate agent",
    ),
    (
        "management_db_cache_multiplier",
        "Sluice's management API reads the broker directly and caches nothing",
    ),
    (
        "prometheus.",
        "Sluice's Prometheus endpoint takes prometheus.tcp.port, .tcp.ip, .path and .return_per_object_metrics only",
    ),
    (
        "collect_statistics",
        "the management API samples its rates every 5 seconds",
    ),
    (
        "collect_statistics_interval",
        "the management API samples its rates every 5 seconds",
    ),
    (
        "auth_mechanisms.",
        "Sluice offers PLAIN and AMQPLAIN, and EXTERNAL on TLS connections with a verified client certificate",
    ),
    (
        "auth_backends.",
        "Sluice authenticates against its own users",
    ),
    (
        "password_hashing_module",
        "passwords are not stored hashed yet",
    ),
    ("stomp.", "Sluice speaks AMQP 0-9-1 only"),
    ("mqtt.", "Sluice speaks AMQP 0-9-1 only"),
    ("web_stomp.", "Sluice speaks AMQP 0-9-1 only"),
    ("web_mqtt.", "Sluice speaks AMQP 0-9-1 only"),
    ("stream.", "streams are not supported"),
    ("federation.", "federation is not supported"),
    ("shovel.", "shovels are not supported"),
    // Erlang runtime and distribution settings, which have no counterpart.
    (
        "num_acceptors.tcp",
        "one task accepts connections; no acceptor pool to size",
    ),
    ("reverse_dns_lookups", "peers are logged by address"),
    (
        "vm_memory_calculation_strategy",
        "resident memory is read from /proc/self/status",
    ),
    (
        "vm_memory_high_watermark_paging_ratio",
        "classic queues page by their own read-ahead window, not by a memory ratio",
    ),
    (
        "total_memory_available_override_value",
        "the memory watermark is relative to the machine's memory or absolute",
    ),
    (
        "memory_monitor_interval",
        "memory is sampled as often as the headroom left requires",
    ),
    ("background_gc_enabled", "there is no garbage collector"),
    (
        "background_gc_target_interval",
        "there is no garbage collector",
    ),
    ("hipe_compile", "there is no Erlang code to compile"),
    ("delegate_count", "there are no delegate processes"),
    (
        "channel_operation_timeout",
        "channel operations wait on the metadata log, bounded by its own 10 s",
    ),
    (
        "mnesia_table_loading_retry_timeout",
        "metadata is a Raft log, not Mnesia",
    ),
    (
        "mnesia_table_loading_retry_limit",
        "metadata is a Raft log, not Mnesia",
    ),
    (
        "distribution.",
        "nodes link over Sluice's own authenticated TCP link",
    ),
    (
        "cluster_keepalive_interval",
        "links have their own heartbeats: cluster_link.heartbeat_timeout",
    ),
    (
        "cluster_partition_handling",
        "a partition is settled by the Raft majority: the minority side refuses metadata changes",
    ),
    (
        "cluster_name",
        "the cluster name is reported as sluice@HOST",
    ),
    (
        "mirroring_sync_batch_size",
        "classic mirrored queues do not exist in Sluice",
    ),
    ("queue_master_locator", "use queue_leader_locator"),
    (
        "classic_queue.default_version",
        "Sluice has one classic queue implementation",
    ),
    (
        "lazy_queue_explicit_gc_run_operation_threshold",
        "there is no garbage collector",
    ),
    (
        "queue_index_embed_msgs_below",
        "classic queues journal messages whole",
    ),
    (
        "raft.",
        "a quorum queue's log batches by commit round trip (up to 4,096 items or 4 MiB an entry) and sizes its own segments",
    ),
    ("proxy_protocol", "the PROXY protocol is not supported"),
    (
        "log.file.rotation.",
        "rotate the file with logrotate's copytruncate",
    ),
    ("log.syslog", "log to the console or a file"),
    ("log.syslog.", "log to the console or a file"),
    ("log.exchange", "logging to an exchange is not supported"),
    ("log.exchange.", "logging to an exchange is not supported"),
    ("log.console.formatter", "lines are plain text"),
    ("log.file.formatter", "lines are plain text"),
    (
        "log.connection.level",
        "one level applies to every category",
    ),
    ("log.channel.level", "one level applies to every category"),
    ("log.queue.level", "one level applies to every category"),
    ("log.mirroring.level", "one level applies to every category"),
    (
        "log.federation.level",
        "one level applies to every category",
    ),
    ("log.upgrade.level", "one level applies to every category"),
    ("log.ra.level", "one level applies to every category"),
    ("log.default.level", "one level applies to every category"),
    (
        "cluster_formation.node_cleanup.",
        "a node that leaves is removed by an operator",
    ),
    (
        "cluster_formation.randomized_startup_delay_range.",
        "nodes may start in any order, at once",
    ),
    (
        "cluster_formation.discovery_retry_limit",
        "a node waits for its peers until a majority is up",
    ),
    (
        "cluster_formation.discovery_retry_interval",
        "links redial with their own backoff",
    ),
    ("cluster_formation.node_type", "every node is a disc node"),
];

/// Why `key` does nothing in Sluice, when RabbitMQ documents it.
pub fn reason(key: &str) -> Option<&'static str> {
    IGNORED
        .iter()
        .find(|(known, _)| {
            if known.ends_with('.') {
                key.starts_with(known)
            } else {
                key == *known
            }
        })
        .map(|(_, reason)| *reason)
}
