//! Every option of RabbitMQ PerfTest 2.22.1, so that a PerfTest command line runs as it is:
//! PerfTest's short options have one to five letters (`-x`, `-ad`, `-qpf`), which a standard
//! parser reads as clusters of one-letter flags, so they are rewritten to their long forms
//! first; options `sluice perf` has no use for are taken off the command line (with their
//! value) and named in one warning each, with the reason.

/// What `sluice perf` does with a PerfTest option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Handling {
    /// Implemented, under PerfTest's long name.
    Implemented,
    /// Accepted and ignored, for this reason.
    Ignored(&'static str),
}

use Handling::{Ignored, Implemented};

const STREAMS: Handling = Ignored("streams are not supported");

/// PerfTest 2.22.1's options: short name, long name, whether it takes a value.
const OPTIONS: &[(&str, &str, bool, Handling)] = &[
    ("a", "autoack", false, Implemented),
    ("A", "multi-ack-every", true, Implemented),
    ("ad", "auto-delete", true, Implemented),
    (
        "b",
        "heartbeat",
        true,
        Ignored("connections use the broker's heartbeat"),
    ),
    ("B", "body", true, Ignored("bodies are generated")),
    ("bc", "body-count", true, Ignored("bodies are generated")),
    (
        "bfc",
        "body-field-count",
        true,
        Ignored("bodies are generated"),
    ),
    ("c", "confirm", true, Implemented),
    ("C", "pmessages", true, Implemented),
    (
        "ca",
        "consumer-args",
        true,
        Ignored("consumer arguments are not sent"),
    ),
    (
        "cri",
        "connection-recovery-interval",
        true,
        Ignored("connections are not recovered; a run ends with the broker's error"),
    ),
    (
        "csd",
        "consumer-start-delay",
        true,
        Ignored("consumers start at once"),
    ),
    (
        "ct",
        "confirm-timeout",
        true,
        Ignored("a producer waits for its confirms as long as the run lasts"),
    ),
    (
        "ctp",
        "consumers-thread-pools",
        true,
        Ignored("consumers run as tasks, not on thread pools"),
    ),
    ("d", "id", true, Ignored("the run is named by its workload")),
    ("D", "cmessages", true, Implemented),
    (
        "dcr",
        "disable-connection-recovery",
        false,
        Ignored("connections are not recovered anyway"),
    ),
    ("e", "exchange", true, Implemented),
    (
        "E",
        "exclusive",
        false,
        Ignored("consumers' queues are not declared exclusive"),
    ),
    (
        "ei",
        "expected-instances",
        true,
        Ignored("instances are not synchronised"),
    ),
    (
        "em",
        "exposed-metrics",
        true,
        Ignored("metrics are not exposed; --output writes them"),
    ),
    (
        "env",
        "environment-variables",
        false,
        Ignored("options are read from the command line only"),
    ),
    (
        "ew",
        "exit-when",
        true,
        Ignored("a run ends at --time or the message limits"),
    ),
    ("f", "flag", true, Implemented),
    ("h", "uri", true, Implemented),
    ("H", "uris", true, Implemented),
    (
        "hst",
        "heartbeat-sender-threads",
        true,
        Ignored("there are no sender threads to size"),
    ),
    (
        "i",
        "interval",
        true,
        Ignored("samples are taken every second"),
    ),
    (
        "isn",
        "instance-sync-namespace",
        true,
        Ignored("instances are not synchronised"),
    ),
    (
        "ist",
        "instance-sync-timeout",
        true,
        Ignored("instances are not synchronised"),
    ),
    ("jb", "json-body", false, Ignored("bodies are generated")),
    ("k", "routing-key", true, Implemented),
    (
        "K",
        "random-routing-key",
        false,
        Ignored("the routing key is the queue's, or -k"),
    ),
    (
        "L",
        "consumer-latency",
        true,
        Ignored("consumers do not simulate work"),
    ),
    (
        "ll",
        "leader-locator",
        true,
        Ignored("give x-queue-leader-locator with --queue-args"),
    ),
    (
        "m",
        "ptxsize",
        true,
        Ignored("producers do not use transactions"),
    ),
    ("M", "framemax", true, Implemented),
    ("ma", "max-age", true, STREAMS),
    (
        "mf",
        "metrics-format",
        true,
        Ignored("metrics are not exposed; --output writes them"),
    ),
    (
        "mh",
        "metrics-help",
        false,
        Ignored("metrics are not exposed; --output writes them"),
    ),
    (
        "mlb",
        "max-length-bytes",
        true,
        Ignored("give x-max-length-bytes with --queue-args"),
    ),
    (
        "mp",
        "message-properties",
        true,
        Ignored("message properties are not set"),
    ),
    ("ms", "use-millis", false, Implemented),
    (
        "n",
        "ctxsize",
        true,
        Ignored("consumers do not use transactions"),
    ),
    ("na", "nack", false, Ignored("consumers ack")),
    (
        "niot",
        "nio-threads",
        true,
        Ignored("there is no NIO thread pool"),
    ),
    (
        "niotp",
        "nio-thread-pool",
        true,
        Ignored("there is no NIO thread pool"),
    ),
    (
        "o",
        "output-file",
        true,
        Ignored("use --output DIR for per-second CSV, a summary and charts"),
    ),
    (
        "o2gr",
        "oauth2-grant-type",
        true,
        Ignored("OAuth2 is not supported"),
    ),
    (
        "o2id",
        "oauth2-client-id",
        true,
        Ignored("OAuth2 is not supported"),
    ),
    (
        "o2p",
        "oauth2-parameters",
        true,
        Ignored("OAuth2 is not supported"),
    ),
    (
        "o2sec",
        "oauth2-client-secret",
        true,
        Ignored("OAuth2 is not supported"),
    ),
    (
        "o2uri",
        "oauth2-token-endpoint",
        true,
        Ignored("OAuth2 is not supported"),
    ),
    ("p", "predeclared", false, Implemented),
    (
        "P",
        "publishing-interval",
        true,
        Ignored("producers publish as fast as -r allows"),
    ),
    (
        "pi",
        "polling-interval",
        true,
        Ignored("consumers subscribe rather than poll"),
    ),
    (
        "po",
        "polling",
        false,
        Ignored("consumers subscribe rather than poll"),
    ),
    (
        "prsd",
        "producer-random-start-delay",
        true,
        Ignored("producers start at once"),
    ),
    (
        "pst",
        "producer-scheduler-threads",
        true,
        Ignored("there are no scheduler threads"),
    ),
    ("q", "qos", true, Implemented),
    (
        "Q",
        "global-qos",
        true,
        Ignored("prefetch is per consumer (-q)"),
    ),
    ("qa", "queue-args", true, Implemented),
    (
        "qf",
        "queue-file",
        true,
        Ignored("name queues with -u or --queue-pattern"),
    ),
    ("qp", "queue-pattern", true, Implemented),
    ("qpf", "queue-pattern-from", true, Implemented),
    ("qpt", "queue-pattern-to", true, Implemented),
    ("qq", "quorum-queue", false, Implemented),
    ("r", "rate", true, Implemented),
    ("R", "consumer-rate", true, Implemented),
    ("re", "requeue", true, Ignored("consumers ack")),
    (
        "rkcs",
        "routing-key-cache-size",
        true,
        Ignored("the routing key is the queue's, or -k"),
    ),
    ("S", "slow-start", false, Ignored("consumers start at once")),
    ("s", "size", true, Implemented),
    (
        "sb",
        "skip-binding-queues",
        false,
        Ignored("queues are bound to the exchange"),
    ),
    ("sco", "stream-consumer-offset", true, STREAMS),
    ("se", "sasl-external", false, Ignored("PLAIN is used")),
    ("smssb", "stream-max-segment-size-bytes", true, STREAMS),
    (
        "sni",
        "server-name-indication",
        true,
        Ignored("TLS is not supported"),
    ),
    ("sq", "stream-queue", false, STREAMS),
    (
        "sst",
        "servers-startup-timeout",
        true,
        Ignored("the broker is connected to at once"),
    ),
    (
        "st",
        "shutdown-timeout",
        true,
        Ignored("connections close at once at the end"),
    ),
    (
        "sul",
        "servers-up-limit",
        true,
        Ignored("the broker is connected to at once"),
    ),
    ("t", "type", true, Implemented),
    (
        "T",
        "body-content-type",
        true,
        Ignored("message properties are not set"),
    ),
    (
        "tnd",
        "tcp-no-delay",
        true,
        Ignored("TCP_NODELAY is always on"),
    ),
    ("trbs", "tcp-receive-buffer-size", true, Implemented),
    ("tsbs", "tcp-send-buffer-size", true, Implemented),
    ("u", "queue", true, Implemented),
    (
        "udsc",
        "use-default-ssl-context",
        false,
        Ignored("TLS is not supported"),
    ),
    ("v", "version", false, Ignored("see sluice --version")),
    ("", "verbose", false, Ignored("AMQP frames are not printed")),
    (
        "",
        "verbose-full",
        false,
        Ignored("AMQP frames are not printed"),
    ),
    (
        "vl",
        "variable-latency",
        true,
        Ignored("consumers do not simulate work"),
    ),
    (
        "vr",
        "variable-rate",
        true,
        Ignored("the rate is fixed (-r)"),
    ),
    (
        "vs",
        "variable-size",
        true,
        Ignored("the size is fixed (-s)"),
    ),
    ("x", "producers", true, Implemented),
    (
        "X",
        "producer-channel-count",
        true,
        Ignored("one channel per producer connection"),
    ),
    ("y", "consumers", true, Implemented),
    (
        "Y",
        "consumer-channel-count",
        true,
        Ignored("one channel per consumer connection"),
    ),
    ("z", "time", true, Implemented),
];

/// The PerfTest option an argument names (`-qpf` or `--queue-pattern-from`), if any.
fn option_named(argument: &str) -> Option<&'static (&'static str, &'static str, bool, Handling)> {
    if let Some(long) = argument.strip_prefix("--") {
        let long = long.split_once('=').map_or(long, |(name, _)| name);
        return OPTIONS.iter().find(|(_, name, _, _)| *name == long);
    }
    let short = argument.strip_prefix('-')?;
    OPTIONS
        .iter()
        .find(|(name, _, _, _)| !name.is_empty() && *name == short)
}

/// Rewrites a `sluice perf` command line: PerfTest's short options become their long
/// forms, and options `sluice perf` does not implement go, with their values. Returns the
/// arguments to parse and one warning per option dropped.
pub fn normalize(arguments: &[String]) -> (Vec<String>, Vec<String>) {
    let mut kept = Vec::with_capacity(arguments.len());
    let mut warnings = Vec::new();
    let mut rest = arguments.iter();
    while let Some(argument) = rest.next() {
        let Some(&(short, long, takes_value, handling)) = option_named(argument) else {
            kept.push(argument.clone());
            continue;
        };
        match handling {
            Implemented => {
                if argument.starts_with("--") {
                    kept.push(argument.clone());
                } else {
                    kept.push(format!("--{long}"));
                }
            }
            Ignored(reason) => {
                if takes_value && !argument.contains('=') {
                    rest.next();
                }
                let named = if short.is_empty() {
                    format!("--{long}")
                } else {
                    format!("-{short}/--{long}")
                };
                let warning =
                    format!("PerfTest option {named} is accepted but does nothing here: {reason}");
                if !warnings.contains(&warning) {
                    warnings.push(warning);
                }
            }
        }
    }
    (kept, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(arguments: &[&str]) -> Vec<String> {
        arguments
            .iter()
            .map(|argument| (*argument).to_owned())
            .collect()
    }

    #[test]
    fn perftest_options_become_long_and_unused_ones_go_with_their_values() {
        let (kept, warnings) = normalize(&strings(&[
            "-x",
            "2",
            "-ad",
            "false",
            "-qpf",
            "3",
            "-p",
            "-o",
            "out.csv",
            "--id",
            "run-1",
            "-H",
            "amqp://a,amqp://b",
            "--queue",
            "q",
            "-ms",
            "--verbose",
        ]));
        assert_eq!(
            kept,
            strings(&[
                "--producers",
                "2",
                "--auto-delete",
                "false",
                "--queue-pattern-from",
                "3",
                "--predeclared",
                "--uris",
                "amqp://a,amqp://b",
                "--queue",
                "q",
                "--use-millis",
            ])
        );
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings[0].starts_with("PerfTest option -o/--output-file is accepted"));
        assert!(warnings[1].contains("-d/--id"));
    }

    #[test]
    fn perftest_option_table_has_no_name_twice() {
        for (index, (short, long, _, _)) in OPTIONS.iter().enumerate() {
            for (other_short, other_long, _, _) in &OPTIONS[index + 1..] {
                assert!(short.is_empty() || short != other_short, "-{short}");
                assert_ne!(long, other_long);
            }
        }
    }
}
