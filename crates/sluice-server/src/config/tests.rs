//! Tests of the configuration file parser.

use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Config::default())
}

fn error(text: &str) -> String {
    parse(text)
        .expect_err("config should be rejected")
        .to_string()
}

#[test]
fn defaults_are_rabbitmq_defaults() {
    let config = Config::default();
    assert_eq!(config.listen, "0.0.0.0:5672".parse().unwrap());
    assert_eq!(config.data_dir, PathBuf::from("./sluice-data"));
    assert_eq!(config.default_user, "guest");
    assert_eq!(config.default_pass, "guest");
    assert_eq!(config.default_vhost, "/");
    assert_eq!(config.loopback_users, vec!["guest".to_owned()]);
    assert_eq!(config.heartbeat_secs, 60);
    assert_eq!(config.frame_max, 131_072);
    assert_eq!(config.channel_max, 2047);
    assert_eq!(config.max_message_size, 134_217_728);
    assert_eq!(config.handshake_timeout_ms, 10_000);
    assert_eq!(config.log_level, "info");
    assert_eq!(config.load_definitions, None);
    assert_eq!(
        config.vm_memory_high_watermark(),
        MemoryWatermark::Relative(0.6)
    );
    assert_eq!(
        config.disk_free_limit(),
        DiskFreeLimit::Absolute(50_000_000)
    );
    assert!(config.warnings().is_empty());
}

#[test]
fn load_definitions_names_a_file() {
    let config = parse("load_definitions = /etc/sluice/definitions.json").unwrap();
    assert_eq!(
        config.load_definitions,
        Some(PathBuf::from("/etc/sluice/definitions.json"))
    );
}

#[test]
fn empty_text_and_comments_keep_base() {
    let text = "\n# a comment\n   \n\t# indented comment\n";
    assert_eq!(parse(text).unwrap(), Config::default());
    let base = Config {
        heartbeat_secs: 5,
        ..Config::default()
    };
    assert_eq!(Config::parse("", base.clone()).unwrap(), base);
}

#[test]
fn trailing_comment_and_whitespace() {
    let config = parse("  heartbeat   =  30   # seconds\r\n").unwrap();
    assert_eq!(config.heartbeat_secs, 30);
}

#[test]
fn hash_inside_value_is_kept() {
    let config = parse("default_pass = s3cr#t # the password").unwrap();
    assert_eq!(config.default_pass, "s3cr#t");
}

#[test]
fn later_line_wins() {
    let config = parse("heartbeat = 10\nheartbeat = 20").unwrap();
    assert_eq!(config.heartbeat_secs, 20);
}

#[test]
fn listener_forms() {
    let cases = [
        ("5672", "0.0.0.0:5672"),
        ("0.0.0.0:5672", "0.0.0.0:5672"),
        ("127.0.0.1:5673", "127.0.0.1:5673"),
        (":::5672", "[::]:5672"),
        ("::1:5672", "[::1]:5672"),
        ("[::1]:5674", "[::1]:5674"),
        ("0", "0.0.0.0:0"),
    ];
    for (value, expected) in cases {
        let config = parse(&format!("listeners.tcp.default = {value}")).unwrap();
        assert_eq!(config.listen, expected.parse().unwrap(), "{value}");
    }
}

#[test]
fn listener_invalid() {
    for value in [
        "abc",
        "127.0.0.1",
        "127.0.0.1:99999",
        "localhost:5672",
        "1.2.3:5672",
    ] {
        let message = error(&format!("\nlisteners.tcp.default = {value}"));
        assert!(
            message.starts_with(&format!(
                "line 2: invalid value '{value}' for 'listeners.tcp.default'"
            )),
            "{message}"
        );
    }
}

#[test]
fn listener_other_names_point_to_default() {
    assert_eq!(
        error("listeners.tcp.1 = 5672"),
        "line 1: unknown key 'listeners.tcp.1' (did you mean 'listeners.tcp.default'?)"
    );
}

#[test]
fn data_dir() {
    let config = parse("data_dir = /var/lib/sluice").unwrap();
    assert_eq!(config.data_dir, PathBuf::from("/var/lib/sluice"));
}

#[test]
fn default_user_pass_vhost() {
    let config =
        parse("default_user = admin\ndefault_pass = p@ss word\ndefault_vhost = prod").unwrap();
    assert_eq!(config.default_user, "admin");
    assert_eq!(config.default_pass, "p@ss word");
    assert_eq!(config.default_vhost, "prod");
}

#[test]
fn default_user_tags_replace_the_list_and_permissions_are_regexes() {
    let config = parse("").unwrap();
    assert_eq!(config.default_user_tags, ["administrator"]);
    assert_eq!(config.default_permissions.configure, ".*");
    let config = parse(
        "default_user_tags.monitoring = true\ndefault_user_tags.policymaker = true\n\
         default_user_tags.policymaker = false\ndefault_permissions.configure = ^app\\.\n\
         default_permissions.write = ^$",
    )
    .unwrap();
    assert_eq!(config.default_user_tags, ["monitoring"]);
    assert_eq!(config.default_permissions.configure, "^app\\.");
    assert_eq!(config.default_permissions.write, "^$");
    assert_eq!(config.default_permissions.read, ".*");
    assert!(error("default_user_tags.administrator = yes").contains("expected 'true' or 'false'"));
}

#[test]
fn loopback_users_replace_the_list() {
    let config = parse("loopback_users.alice = true\nloopback_users.bob = false").unwrap();
    assert_eq!(config.loopback_users, vec!["alice".to_owned()]);

    let config = parse("loopback_users.guest = false").unwrap();
    assert!(config.loopback_users.is_empty());

    let config = parse("loopback_users.guest = true\nloopback_users.ops = true").unwrap();
    assert_eq!(
        config.loopback_users,
        vec!["guest".to_owned(), "ops".to_owned()]
    );
}

#[test]
fn loopback_users_none_wins_wherever_it_is() {
    let config = parse("loopback_users = none\nloopback_users.alice = true").unwrap();
    assert!(config.loopback_users.is_empty());
    let config = parse("loopback_users.alice = true\nloopback_users = none").unwrap();
    assert!(config.loopback_users.is_empty());
}

#[test]
fn loopback_users_invalid() {
    assert_eq!(
        error("loopback_users.guest = yes"),
        "line 1: invalid value 'yes' for 'loopback_users.guest': expected 'true' or 'false'"
    );
    assert!(error("loopback_users = guest").starts_with("line 1: invalid value 'guest'"));
}

#[test]
fn heartbeat() {
    assert_eq!(parse("heartbeat = 0").unwrap().heartbeat_secs, 0);
    assert_eq!(parse("heartbeat = 580").unwrap().heartbeat_secs, 580);
    assert_eq!(
        error("# c\n\n\n\nheartbeat = abc"),
        "line 5: invalid value 'abc' for 'heartbeat': expected a number of seconds from 0 (disabled) to 65535"
    );
    assert!(error("heartbeat = 65536").starts_with("line 1: invalid value '65536'"));
    assert!(error("heartbeat = -1").starts_with("line 1: invalid value '-1'"));
}

#[test]
fn frame_max() {
    assert_eq!(parse("frame_max = 4096").unwrap().frame_max, 4096);
    assert_eq!(parse("frame_max = 1048576").unwrap().frame_max, 1_048_576);
    assert_eq!(parse("frame_max = 256KB").unwrap().frame_max, 262_144);
    assert_eq!(parse("frame_max = 1MB").unwrap().frame_max, 1_048_576);
    assert_eq!(
        parse("frame_max = 2147483647").unwrap().frame_max,
        FRAME_MAX_MAX
    );
    for value in ["0", "4095", "2147483648", "4GB", "big", "+8192"] {
        let message = error(&format!("frame_max = {value}"));
        assert!(
            message.starts_with(&format!("line 1: invalid value '{value}' for 'frame_max'")),
            "{message}"
        );
    }
}

#[test]
fn channel_max() {
    assert_eq!(parse("channel_max = 128").unwrap().channel_max, 128);
    assert_eq!(parse("channel_max = 0").unwrap().channel_max, u16::MAX);
    assert!(error("channel_max = 70000").starts_with("line 1: invalid value '70000'"));
}

#[test]
fn credit_flow_default_credit_takes_a_number_or_rabbitmqs_pair() {
    assert_eq!(Config::default().credit_flow_default_credit, 400);
    for (value, credit) in [("200", 200), ("{400, 200}", 400), ("{1000,500}", 1000)] {
        let line = format!("credit_flow_default_credit = {value}");
        assert_eq!(parse(&line).unwrap().credit_flow_default_credit, credit);
    }
    for value in ["0", "{200, 400}", "{400}", "lots", "200000"] {
        let message = error(&format!("credit_flow_default_credit = {value}"));
        assert!(message.contains("expected an initial credit"), "{message}");
    }
}

#[test]
fn quorum_commands_soft_limit_takes_a_positive_count() {
    assert_eq!(Config::default().quorum_commands_soft_limit, 128);
    let config = parse("quorum_commands_soft_limit = 256").unwrap();
    assert_eq!(config.quorum_commands_soft_limit, 256);
    for value in ["0", "-1", "many"] {
        let message = error(&format!("quorum_commands_soft_limit = {value}"));
        assert!(
            message.contains("expected a number of messages from 1"),
            "{message}"
        );
    }
}

#[test]
fn delivery_buffer_total_max_takes_a_size() {
    assert_eq!(Config::default().delivery_buffer_total_max, 64 << 20);
    let config = parse("delivery_buffer_total_max = 16MiB").unwrap();
    assert_eq!(config.delivery_buffer_total_max, 16 << 20);
    let message = error("delivery_buffer_total_max = 0");
    assert!(
        message.contains("expected a positive number of bytes"),
        "{message}"
    );
}

#[test]
fn max_message_size() {
    assert_eq!(
        parse("max_message_size = 1024").unwrap().max_message_size,
        1024
    );
    assert_eq!(
        parse("max_message_size = 536870912")
            .unwrap()
            .max_message_size,
        MESSAGE_SIZE_MAX
    );
    for value in ["0", "536870913", "1MB"] {
        let message = error(&format!("max_message_size = {value}"));
        assert!(
            message.starts_with(&format!("line 1: invalid value '{value}'")),
            "{message}"
        );
    }
}

#[test]
fn consumer_timeout() {
    assert_eq!(Config::default().consumer_timeout_ms, Some(1_800_000));
    assert_eq!(
        parse("consumer_timeout = 60000")
            .unwrap()
            .consumer_timeout_ms,
        Some(60_000)
    );
    assert_eq!(
        parse("consumer_timeout = false")
            .unwrap()
            .consumer_timeout_ms,
        None
    );
    assert!(error("consumer_timeout = 0")
        .starts_with("line 1: invalid value '0' for 'consumer_timeout'"));
}

#[test]
fn queue_leader_locator() {
    use sluice_core::queue_location::QueueLocator;
    assert_eq!(
        Config::default().queue_leader_locator,
        QueueLocator::ClientLocal
    );
    assert_eq!(
        parse("queue_leader_locator = balanced")
            .unwrap()
            .queue_leader_locator,
        QueueLocator::Balanced
    );
    assert!(error("queue_leader_locator = nearest")
        .starts_with("line 1: invalid value 'nearest' for 'queue_leader_locator'"));
}

#[test]
fn connection_max() {
    assert_eq!(Config::default().connection_max, None);
    assert_eq!(
        parse("connection_max = 500").unwrap().connection_max,
        Some(500)
    );
    assert_eq!(
        parse("connection_max = infinity").unwrap().connection_max,
        None
    );
    assert!(error("connection_max = lots")
        .starts_with("line 1: invalid value 'lots' for 'connection_max'"));
}

#[test]
fn handshake_timeout() {
    assert_eq!(
        parse("handshake_timeout = 3000")
            .unwrap()
            .handshake_timeout_ms,
        3000
    );
    assert!(error("handshake_timeout = 0").starts_with("line 1: invalid value '0'"));
    assert!(error("handshake_timeout = infinity").starts_with("line 1: invalid value"));
}

#[test]
fn log_level() {
    for (level, filter) in [
        ("debug", "debug"),
        ("info", "info,openraft=warn"),
        ("notice", "info,openraft=warn"),
        ("warning", "warn"),
        ("error", "error"),
        ("critical", "error"),
        ("alert", "error"),
        ("emergency", "error"),
        ("none", "off"),
    ] {
        let config = parse(&format!("log.console.level = {level}")).unwrap();
        assert_eq!(config.log_level, level);
        assert_eq!(config.log_filter(), filter);
    }
    assert!(error("log.console.level = loud").starts_with(
        "line 1: invalid value 'loud' for 'log.console.level': expected one of debug, info"
    ));
}

#[test]
fn vm_memory_high_watermark_relative() {
    for (value, fraction) in [("0.4", 0.4), ("0", 0.0), ("1", 1.0), ("1.0", 1.0)] {
        let config = parse(&format!("vm_memory_high_watermark.relative = {value}")).unwrap();
        assert_eq!(
            config.vm_memory_high_watermark(),
            MemoryWatermark::Relative(fraction),
            "{value}"
        );
    }
    assert_eq!(
        error("vm_memory_high_watermark.relative = 1.5"),
        "line 1: invalid value '1.5' for 'vm_memory_high_watermark.relative': expected a fraction of the memory available from 0.0 to 1.0, e.g. 0.6"
    );
    for value in ["-0.1", "forty", "NaN", "40%"] {
        let message = error(&format!("vm_memory_high_watermark.relative = {value}"));
        assert!(
            message.starts_with(&format!(
                "line 1: invalid value '{value}' for 'vm_memory_high_watermark.relative'"
            )),
            "{message}"
        );
    }
}

#[test]
fn vm_memory_high_watermark_absolute() {
    let cases = [
        ("1073741824", 1 << 30),
        ("1024MiB", 1 << 30),
        ("1024M", 1 << 30),
        ("1Gi", 1 << 30),
        ("1G", 1 << 30),
        ("2GB", 2_000_000_000),
        ("2gb", 2_000_000_000),
        ("0", 0),
    ];
    for (value, bytes) in cases {
        let config = parse(&format!("vm_memory_high_watermark.absolute = {value}")).unwrap();
        assert_eq!(
            config.vm_memory_high_watermark(),
            MemoryWatermark::Absolute(bytes),
            "{value}"
        );
    }
    assert_eq!(
        error("\nvm_memory_high_watermark.absolute = 2 GB"),
        "line 2: invalid value '2 GB' for 'vm_memory_high_watermark.absolute': expected a number of bytes with an optional unit: 50000000, 50MB, 500MiB, 500Mi, 2GB, 2GiB, 2Gi, 1TB"
    );
    for value in ["0.5", "1.5GB", "-1", "2XB", "GB", "99999999999999999999"] {
        let message = error(&format!("vm_memory_high_watermark.absolute = {value}"));
        assert!(
            message.starts_with(&format!(
                "line 1: invalid value '{value}' for 'vm_memory_high_watermark.absolute'"
            )),
            "{message}"
        );
    }
}

#[test]
fn vm_memory_high_watermark_absolute_wins_over_relative() {
    // Whichever line comes first, as in RabbitMQ's schema translation.
    for text in [
        "vm_memory_high_watermark.relative = 0.5\nvm_memory_high_watermark.absolute = 2GB",
        "vm_memory_high_watermark.absolute = 2GB\nvm_memory_high_watermark.relative = 0.5",
    ] {
        let config = parse(text).unwrap();
        assert_eq!(
            config.vm_memory_high_watermark(),
            MemoryWatermark::Absolute(2_000_000_000)
        );
        assert_eq!(config.warnings().len(), 1);
        assert!(config.warnings()[0].contains("vm_memory_high_watermark.absolute has precedence"));
    }
}

#[test]
fn disk_free_limit_relative() {
    for (value, multiple) in [("1.0", 1.0), ("1.5", 1.5), ("2", 2.0), ("0", 0.0)] {
        let config = parse(&format!("disk_free_limit.relative = {value}")).unwrap();
        assert_eq!(
            config.disk_free_limit(),
            DiskFreeLimit::MemoryRelative(multiple),
            "{value}"
        );
    }
    assert_eq!(
        error("disk_free_limit.relative = -1"),
        "line 1: invalid value '-1' for 'disk_free_limit.relative': expected a non-negative multiple of the memory available, e.g. 1.5"
    );
    for value in ["inf", "NaN", "two", "50MB"] {
        let message = error(&format!("disk_free_limit.relative = {value}"));
        assert!(
            message.starts_with(&format!(
                "line 1: invalid value '{value}' for 'disk_free_limit.relative'"
            )),
            "{message}"
        );
    }
}

#[test]
fn disk_free_limit_absolute_wins_over_relative() {
    let config = parse("disk_free_limit.absolute = 1GB\ndisk_free_limit.relative = 2.0").unwrap();
    assert_eq!(
        config.disk_free_limit(),
        DiskFreeLimit::Absolute(1_000_000_000)
    );
    assert!(config.warnings()[0].contains("disk_free_limit.absolute has precedence"));
}

#[test]
fn disk_free_limit_units() {
    let cases = [
        ("50000000", 50_000_000),
        ("1000kB", 1_000_000),
        ("50MB", 50_000_000),
        ("50mb", 50_000_000),
        ("1GB", 1_000_000_000),
        ("2TB", 2_000_000_000_000),
        ("512k", 512 * 1024),
        ("512KiB", 512 * 1024),
        ("500M", 500 << 20),
        ("500MiB", 500 << 20),
        ("2G", 2 << 30),
        ("2GiB", 2 << 30),
        ("2gib", 2 << 30),
        ("1TiB", 1 << 40),
        ("1Ti", 1 << 40),
        ("1PiB", 1 << 50),
        ("1PB", 1_000_000_000_000_000),
    ];
    for (value, bytes) in cases {
        let config = parse(&format!("disk_free_limit.absolute = {value}")).unwrap();
        assert_eq!(
            config.disk_free_limit(),
            DiskFreeLimit::Absolute(bytes),
            "{value}"
        );
    }
    for value in ["MB", "50XB", "1.5GB", "-1", "50 MB"] {
        let message = error(&format!("disk_free_limit.absolute = {value}"));
        assert!(
            message.starts_with(&format!(
                "line 1: invalid value '{value}' for 'disk_free_limit.absolute'"
            )),
            "{message}"
        );
    }
}

#[test]
fn unknown_key_names_line_and_suggests() {
    assert_eq!(
        error("\n\nlistners.tcp.default = 5672"),
        "line 3: unknown key 'listners.tcp.default' (did you mean 'listeners.tcp.default'?)"
    );
    assert_eq!(
        error("credit_flow_default_credi = 400"),
        "line 1: unknown key 'credit_flow_default_credi' (did you mean 'credit_flow_default_credit'?)"
    );
}

#[test]
fn tcp_listen_options_are_read_and_checked() {
    let config = parse(
        "tcp_listen_options.backlog = 4096\ntcp_listen_options.recbuf = 64KiB\n\
         tcp_listen_options.nodelay = false",
    )
    .unwrap();
    assert_eq!(config.tcp_listen_options.backlog, 4096);
    assert_eq!(config.tcp_listen_options.recbuf, Some(65_536));
    assert_eq!(config.tcp_listen_options.sndbuf, None);
    assert!(!config.tcp_listen_options.nodelay);
    assert_eq!(
        error("tcp_listen_options.recbf = 65536"),
        "line 1: unknown key 'tcp_listen_options.recbf' (did you mean 'tcp_listen_options.recbuf'?)"
    );
    assert!(error("\ntcp_listen_options.sndbuf = 1k")
        .starts_with("line 2: invalid value '1k' for 'tcp_listen_options.sndbuf'"));
}

#[test]
fn syntax_errors_name_line() {
    assert_eq!(
        error("heartbeat = 1\nheartbeat 30"),
        "line 2: expected 'key = value', found 'heartbeat 30'"
    );
    assert_eq!(
        error("heartbeat ="),
        "line 1: expected 'key = value', found 'heartbeat ='"
    );
    assert_eq!(error("= 5"), "line 1: expected 'key = value', found '= 5'");
}

#[test]
fn first_error_is_reported() {
    assert!(error("heartbeat = x\nbogus = 1").starts_with("line 1:"));
}

#[test]
fn from_file_reads_and_reports_missing_file() {
    let path = std::env::temp_dir().join(format!("sluice-config-test-{}.conf", std::process::id()));
    std::fs::write(
        &path,
        "# test\nlisteners.tcp.default = 127.0.0.1:5673\nheartbeat = 15\n",
    )
    .unwrap();
    let config = Config::from_file(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(config.listen, "127.0.0.1:5673".parse().unwrap());
    assert_eq!(config.heartbeat_secs, 15);

    let message = Config::from_file(&path).unwrap_err().to_string();
    assert!(message.starts_with("cannot read config file "), "{message}");
    assert!(
        !message.contains("os error"),
        "the cause belongs in source(): {message}"
    );
}

#[test]
fn full_rabbitmq_style_file() {
    let text = "\
# Sluice example
listeners.tcp.default = 127.0.0.1:5673
data_dir = /tmp/sluice
default_user = admin
default_pass = admin
default_vhost = /
loopback_users = none
heartbeat = 30
frame_max = 131072
channel_max = 2047
max_message_size = 16777216
handshake_timeout = 5000
log.console.level = warning
vm_memory_high_watermark.relative = 0.5
disk_free_limit.absolute = 2GB
";
    let config = parse(text).unwrap();
    assert_eq!(config.listen, "127.0.0.1:5673".parse().unwrap());
    assert!(config.loopback_users.is_empty());
    assert_eq!(config.max_message_size, 16_777_216);
    assert_eq!(
        config.disk_free_limit(),
        DiskFreeLimit::Absolute(2_000_000_000)
    );
    assert_eq!(
        config.vm_memory_high_watermark(),
        MemoryWatermark::Relative(0.5)
    );
}

#[test]
fn deployment_file_starts_with_one_warning_per_key_that_does_not_apply() {
    // The kind of file a production RabbitMQ 3.10 runs with.
    let text = "\
listeners.tcp.default = 5672
listeners.ssl.default = 5671
ssl_options.cacertfile = /etc/rabbitmq/ca.pem
ssl_options.certfile = /etc/rabbitmq/cert.pem
ssl_options.verify = verify_peer
management.tcp.port = 15672
management.tcp.ip = 0.0.0.0
default_user_tags.administrator = true
default_permissions.configure = .*
cluster_partition_handling = pause_minority
log.console = true
log.console.level = info
log.file = false
log.file.level = warning
log.file.rotation.count = 5
consumer_timeout = 3600000
collect_statistics_interval = 10000
vm_memory_high_watermark_paging_ratio = 0.75
";
    let config = parse(text).unwrap();
    assert_eq!(config.consumer_timeout_ms, Some(3_600_000));
    assert!(config.log_console);
    assert_eq!(config.log_file, None);
    assert_eq!(config.log_file_level, "warning");
    let warnings = config.warnings();
    assert_eq!(config.management.listener.port, 15672);
    assert!(config.management.listener.configured);
    for key in [
        "cluster_partition_handling",
        "log.file.rotation.count",
        "collect_statistics_interval",
        "vm_memory_high_watermark_paging_ratio",
    ] {
        let naming: Vec<&String> = warnings
            .iter()
            .filter(|warning| warning.starts_with(&format!("'{key}'")))
            .collect();
        assert_eq!(naming.len(), 1, "one warning for {key}: {warnings:?}");
    }
    assert_eq!(warnings.len(), 4);
    // A typo still stops the start, with the suggestion.
    assert!(error("consumer_timout = 100").contains("consumer_timeout"));
    assert!(error("log.file = /tmp/x.log\nlog.fille.level = info").contains("line 2"));
}

#[test]
fn log_file_keys() {
    let config = parse("log.file = /var/log/sluice.log\nlog.console = false").unwrap();
    assert_eq!(
        config.log_file,
        Some(std::path::PathBuf::from("/var/log/sluice.log"))
    );
    assert!(!config.log_console);
    assert!(
        error("log.console = maybe").starts_with("line 1: invalid value 'maybe' for 'log.console'")
    );
    assert!(error("log.file.level = loud")
        .starts_with("line 1: invalid value 'loud' for 'log.file.level'"));
}

/// The README's configuration block lists every key the server knows, and
/// the server accepts it as it stands.
#[test]
fn readme_configuration_block_is_what_the_server_accepts() {
    let readme = include_str!("../../../../README.md");
    let block = readme
        .split("## Configuration")
        .nth(1)
        .and_then(|section| section.split("```ini\n").nth(1))
        .and_then(|block| block.split("```").next())
        .expect("the README's configuration block");
    let config = parse(block).unwrap();
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());
    for key in super::suggest::KNOWN_KEYS
        .iter()
        .chain(crate::store_config::STORE_KEYS)
        .chain(crate::tcp_listen_options::TCP_LISTEN_KEYS)
        .chain(crate::cluster_config::CLUSTER_KEYS)
        .chain(crate::tls::config::TLS_KEYS)
        .chain(crate::prometheus::config::PROMETHEUS_KEYS)
        .chain(crate::management::config::MANAGEMENT_KEYS)
    {
        assert!(block.contains(key), "the README's block lacks {key}");
    }
}
