//! The `sluice perf` command line: RabbitMQ PerfTest's long flags with PerfTest's meanings
//! (and its one-letter short flags, `-h` for the URI included, so a PerfTest command line
//! carries over), plus Sluice's own: `--output`, `--scenario`, `--scale`, `--sweep`.
//!
//! Workload flags are `Option`s so that [`PerfArgs::workload`] can tell a flag the user gave
//! from one a scenario file sets: the command line wins over the scenario, the scenario over
//! PerfTest's defaults.

use std::path::PathBuf;

use clap::ArgAction;

use crate::scenario::Scenario;
use crate::sweep::SweepPoint;
use crate::workload::{Flag, QueueArgument, Workload};
use crate::PerfError;

/// Load generator for AMQP 0-9-1 brokers (Sluice, RabbitMQ, ...), with PerfTest's flags.
///
/// Latency is publish-to-delivery time, carried in the first 12 bytes of each body as
/// PerfTest does. One line per second goes to stdout (a live display on a terminal); a
/// summary at the end. `--output DIR` also writes summary.json, per-second.csv and PNG
/// charts. `--scenario FILE` (see bench/scenarios/) runs one of the seed workloads,
/// sweeping the in-flight limit. As in PerfTest, `-h` is the URI; help is `--help`.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(disable_help_flag = true)]
pub struct PerfArgs {
    /// Print help
    #[arg(long, action = ArgAction::Help)]
    pub help: Option<bool>,

    /// Broker URI [default: amqp://localhost]
    #[arg(short = 'h', long, value_name = "URI")]
    pub uri: Option<String>,

    /// Broker URIs separated by commas, e.g. every node of a cluster: connections take
    /// them in turn, and each named queue is declared through the next one (so a
    /// cluster's queue leaders spread as PerfTest's consumers spread them); wins over -h
    #[arg(short = 'H', long, value_name = "URIS")]
    pub uris: Option<String>,

    /// Number of producers, each with its own connection [default: 1]
    #[arg(short = 'x', long, value_name = "N")]
    pub producers: Option<u32>,

    /// Number of consumers, each with its own connection [default: 1]
    #[arg(short = 'y', long, value_name = "N")]
    pub consumers: Option<u32>,

    /// Queue name; without it (and without a pattern) each consumer gets its own
    /// server-named queue bound with the routing key
    #[arg(short = 'u', long, value_name = "NAME")]
    pub queue: Option<String>,

    /// Queue name pattern with %d for a number, e.g. 'perf-test-%d': producers and
    /// consumers are spread over the queues round-robin
    #[arg(long, value_name = "PATTERN")]
    pub queue_pattern: Option<String>,

    /// First number of the queue pattern [default: 1]
    #[arg(long, value_name = "N")]
    pub queue_pattern_from: Option<u32>,

    /// Last number of the queue pattern (inclusive)
    #[arg(long, value_name = "N")]
    pub queue_pattern_to: Option<u32>,

    /// Exchange to publish to; "" is the default exchange [default: direct]
    #[arg(short = 'e', long, value_name = "NAME")]
    pub exchange: Option<String>,

    /// Exchange type [default: direct]
    #[arg(short = 't', long = "type", value_name = "TYPE")]
    pub exchange_type: Option<String>,

    /// Routing key [default: the queue's name with named queues, else a random key]
    #[arg(short = 'k', long, value_name = "KEY")]
    pub routing_key: Option<String>,

    /// Message size in bytes [default: 12]
    #[arg(short = 's', long, value_name = "BYTES")]
    pub size: Option<usize>,

    /// Rate limit per producer, messages/s [default: unlimited]
    #[arg(short = 'r', long, value_name = "MSG_PER_S")]
    pub rate: Option<f64>,

    /// Rate limit per consumer, messages/s [default: unlimited]
    #[arg(short = 'R', long, value_name = "MSG_PER_S")]
    pub consumer_rate: Option<f64>,

    /// Use publisher confirms with at most N unconfirmed messages per producer (0: no
    /// limit) [default: no confirms]
    #[arg(short = 'c', long, value_name = "N")]
    pub confirm: Option<u64>,

    /// Consumer prefetch (basic.qos), 0 for none [default: 0]
    #[arg(short = 'q', long, value_name = "N")]
    pub qos: Option<u16>,

    /// Ack every N messages with multiple=true [default: every message]
    #[arg(short = 'A', long, value_name = "N")]
    pub multi_ack_every: Option<u32>,

    /// Consume with automatic acknowledgement (no acks)
    #[arg(short = 'a', long)]
    pub autoack: bool,

    /// Message flag: persistent or mandatory; repeatable. 'persistent' also declares the
    /// queues durable, as PerfTest does
    #[arg(short = 'f', long = "flag", value_name = "FLAG", value_parser = parse_flag)]
    pub flags: Vec<Flag>,

    /// Declare quorum queues: durable, x-queue-type=quorum, not auto-delete, persistent
    /// messages (PerfTest's shortcut)
    #[arg(long)]
    pub quorum_queue: bool,

    /// Queue arguments, e.g. 'x-max-length=1000,x-queue-type=quorum'; numbers are sent as
    /// integers
    #[arg(long, value_name = "K=V,...")]
    pub queue_args: Option<String>,

    /// Use queues that exist as they are, whatever they were declared with (PerfTest's
    /// -p); declare only the missing ones
    #[arg(long)]
    pub predeclared: bool,

    /// Declare queues auto-delete [default: true]
    #[arg(long, value_name = "BOOL")]
    pub auto_delete: Option<bool>,

    /// Stop each producer after N messages
    #[arg(short = 'C', long, value_name = "N")]
    pub pmessages: Option<u64>,

    /// Stop each consumer after N messages
    #[arg(short = 'D', long, value_name = "N")]
    pub cmessages: Option<u64>,

    /// Run time in seconds [default: until Ctrl-C, or per sweep run: the scenario's]
    #[arg(short = 'z', long, value_name = "SECONDS")]
    pub time: Option<f64>,

    /// Write the timestamp as Unix milliseconds (PerfTest's --use-millis) so that producers
    /// and consumers in different processes can measure latency
    #[arg(long)]
    pub use_millis: bool,

    /// Frame size to propose (frame_max), 0 for the broker's [default: the message size plus
    /// 8, at least 4096 and at most 131072]
    #[arg(short = 'M', long, value_name = "BYTES")]
    pub framemax: Option<u32>,

    /// SO_SNDBUF of each connection's socket, 0 for the kernel's autotuning [default: 65536,
    /// as PerfTest]
    #[arg(long, value_name = "BYTES")]
    pub tcp_send_buffer_size: Option<u32>,

    /// SO_RCVBUF of each connection's socket, 0 for the kernel's autotuning [default: 65536,
    /// as PerfTest]
    #[arg(long, value_name = "BYTES")]
    pub tcp_receive_buffer_size: Option<u32>,

    /// Write summary.json, per-second.csv and PNG charts into DIR (created if missing)
    #[arg(long, value_name = "DIR")]
    pub output: Option<PathBuf>,

    /// Scenario file (bench/scenarios/*.toml): the workload and its sweep; flags override it
    #[arg(long, value_name = "FILE")]
    pub scenario: Option<PathBuf>,

    /// Multiply the scenario's producers, consumers and queues by F (e.g. 0.1 for a
    /// 2-core machine); per-producer rates, prefetch and in-flight limits stay [default: 1]
    #[arg(long, value_name = "F")]
    pub scale: Option<f64>,

    /// Run the workload once per in-flight limit, given in percent of --rate, plus 'none'
    /// for no confirms, e.g. 'none,1,2,5,10,20,100,200'; draws one chart per metric with
    /// every run [default: the scenario's sweep, if any]
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_sweep_point)]
    pub sweep: Option<Vec<SweepPoint>>,

    /// Plain per-second lines even on a terminal (no live display)
    #[arg(long)]
    pub no_progress: bool,
}

fn parse_flag(text: &str) -> Result<Flag, String> {
    match text.to_ascii_lowercase().as_str() {
        "persistent" => Ok(Flag::Persistent),
        "mandatory" => Ok(Flag::Mandatory),
        _ => Err(format!(
            "'{text}' is not a flag; expected 'persistent' or 'mandatory'"
        )),
    }
}

/// Parses PerfTest's `--queue-args` syntax: `key=value` pairs separated by commas.
pub fn parse_queue_arguments(text: &str) -> Result<Vec<QueueArgument>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("'{pair}' is not key=value"))?;
            Ok(QueueArgument::parse(key.trim(), value.trim()))
        })
        .collect()
}

fn parse_sweep_point(text: &str) -> Result<SweepPoint, String> {
    text.parse()
}

impl PerfArgs {
    /// The workload to run: flags, then the scenario (scaled), then PerfTest's defaults.
    ///
    /// # Errors
    /// [`PerfError::Args`] for contradictory or out-of-range flags.
    pub fn workload(&self, scenario: Option<&Scenario>) -> Result<Workload, PerfError> {
        let mut workload = match scenario {
            Some(scenario) => scenario.workload(self.scale.unwrap_or(1.0))?,
            None => Workload::default(),
        };
        if let Some(uri) = &self.uri {
            workload.uris = vec![uri.clone()];
        }
        if let Some(uris) = &self.uris {
            workload.uris = uris
                .split(',')
                .map(str::trim)
                .filter(|uri| !uri.is_empty())
                .map(str::to_owned)
                .collect();
            if workload.uris.is_empty() {
                return Err(PerfError::Args("-H/--uris names no URI".into()));
            }
        }
        macro_rules! take {
            ($($field:ident),*) => {$(
                if let Some(value) = &self.$field {
                    workload.$field = value.clone().into();
                }
            )*};
        }
        take!(
            producers,
            consumers,
            exchange,
            exchange_type,
            routing_key,
            size,
            pmessages,
            cmessages,
            time
        );
        take!(
            rate,
            consumer_rate,
            confirm,
            qos,
            multi_ack_every,
            auto_delete,
            framemax
        );
        take!(tcp_send_buffer_size, tcp_receive_buffer_size);
        if let Some(text) = &self.queue_args {
            workload.queue_args = Some(
                parse_queue_arguments(text)
                    .map_err(|err| PerfError::Args(format!("--queue-args: {err}")))?,
            );
        }
        if let Some(queue) = &self.queue {
            workload.queue = Some(queue.clone());
            workload.queue_pattern = None;
        }
        if let Some(pattern) = &self.queue_pattern {
            workload.queue = None;
            workload.queue_pattern = Some(pattern.clone());
        }
        if let Some(from) = self.queue_pattern_from {
            workload.queue_pattern_from = from;
        }
        if let Some(to) = self.queue_pattern_to {
            workload.queue_pattern_to = Some(to);
        }
        workload.autoack |= self.autoack;
        workload.quorum_queue |= self.quorum_queue;
        workload.use_millis |= self.use_millis;
        workload.predeclared |= self.predeclared;
        for flag in &self.flags {
            if !workload.flags.contains(flag) {
                workload.flags.push(*flag);
            }
        }
        workload.validate()?;
        Ok(workload)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        perf: PerfArgs,
    }

    fn parse(args: &[&str]) -> PerfArgs {
        Cli::try_parse_from(std::iter::once("perf").chain(args.iter().copied()))
            .unwrap()
            .perf
    }

    #[test]
    fn args_perftest_short_flags_carry_over() {
        let args = parse(&[
            "-h",
            "amqp://u:p@host:5673",
            "-x",
            "2",
            "-y",
            "3",
            "-s",
            "1000",
            "-c",
            "100",
            "-q",
            "50",
            "-A",
            "10",
            "-f",
            "persistent",
            "-f",
            "mandatory",
            "-z",
            "10",
            "-r",
            "500",
        ]);
        let workload = args.workload(None).unwrap();
        assert_eq!(workload.uris, vec!["amqp://u:p@host:5673"]);
        assert_eq!((workload.producers, workload.consumers), (2, 3));
        assert_eq!(workload.size, 1000);
        assert_eq!(workload.confirm, Some(100));
        assert_eq!(workload.qos, Some(50));
        assert_eq!(workload.multi_ack_every, Some(10));
        assert_eq!(workload.flags, vec![Flag::Persistent, Flag::Mandatory]);
        assert_eq!(workload.time, Some(10.0));
        assert_eq!(workload.rate, Some(500.0));
    }

    #[test]
    fn args_long_flags_and_queue_pattern() {
        let args = parse(&[
            "--uri",
            "amqp://localhost",
            "--producers",
            "50",
            "--consumers",
            "50",
            "--rate",
            "100",
            "--queue-pattern",
            "q-%d",
            "--queue-pattern-from",
            "1",
            "--queue-pattern-to",
            "10",
            "--queue-args",
            "x-max-length=10,x-queue-type=quorum",
            "--auto-delete",
            "false",
            "--sweep",
            "none,1,200",
        ]);
        let workload = args.workload(None).unwrap();
        assert_eq!(workload.queue_names().len(), 10);
        assert_eq!(workload.queue_names()[9], "q-10");
        assert_eq!(workload.auto_delete, Some(false));
        assert_eq!(
            args.sweep.unwrap(),
            vec![
                SweepPoint::NoConfirms,
                SweepPoint::Percent(1.0),
                SweepPoint::Percent(200.0)
            ]
        );
        assert_eq!(
            workload.queue_args.unwrap(),
            vec![
                QueueArgument::Int("x-max-length".into(), 10),
                QueueArgument::Text("x-queue-type".into(), "quorum".into())
            ]
        );
    }

    #[test]
    fn args_several_uris_are_taken_in_turn() {
        let args = parse(&[
            "-h",
            "amqp://ignored",
            "-H",
            "amqp://a:1, amqp://b:2,amqp://c:3",
        ]);
        let workload = args.workload(None).unwrap();
        assert_eq!(workload.uris.len(), 3);
        assert_eq!(workload.uri(0), "amqp://a:1");
        assert_eq!(workload.uri(4), "amqp://b:2");
        assert_eq!(workload.uri(5), "amqp://c:3");
        assert!(parse(&["-H", " , "]).workload(None).is_err());
    }

    #[test]
    fn args_reject_bad_values() {
        assert!(parse_flag("immediate").is_err());
        assert!(parse_queue_arguments("x-max-length").is_err());
        assert!(parse_sweep_point("ten").is_err());
        let args = parse(&["--queue-pattern", "q-%d"]);
        assert!(
            args.workload(None).is_err(),
            "a pattern needs --queue-pattern-to"
        );
    }
}
