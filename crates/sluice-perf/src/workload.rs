//! [`Workload`]: one run's settings after flags, scenario and defaults are merged, and the
//! topology they imply (queue names, which producer publishes where, which consumer reads
//! what).

use serde::Serialize;

use crate::client::SocketOptions;
use crate::PerfError;

/// PerfTest's `--flag` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Flag {
    /// delivery-mode 2; also makes PerfTest (and us) declare the queues durable.
    Persistent,
    /// basic.publish mandatory: unroutable messages come back as basic.return.
    Mandatory,
}

/// One `--queue-args` entry. PerfTest sends values that parse as integers as longs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum QueueArgument {
    Int(String, i64),
    Text(String, String),
}

impl QueueArgument {
    pub fn parse(key: &str, value: &str) -> QueueArgument {
        match value.parse::<i64>() {
            Ok(number) => QueueArgument::Int(key.to_owned(), number),
            Err(_) => QueueArgument::Text(key.to_owned(), value.to_owned()),
        }
    }

    pub fn key(&self) -> &str {
        match self {
            QueueArgument::Int(key, _) | QueueArgument::Text(key, _) => key,
        }
    }
}

/// Everything one run needs to know.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Workload {
    /// Brokers to connect to, never empty: PerfTest's `-H` gives several (the nodes of a
    /// cluster), and connections take them in turn.
    pub uris: Vec<String>,
    pub producers: u32,
    pub consumers: u32,
    pub queue: Option<String>,
    pub queue_pattern: Option<String>,
    pub queue_pattern_from: u32,
    pub queue_pattern_to: Option<u32>,
    pub exchange: String,
    pub exchange_type: String,
    pub routing_key: Option<String>,
    pub size: usize,
    /// Per producer, messages/s; `None`: unlimited.
    pub rate: Option<f64>,
    pub consumer_rate: Option<f64>,
    /// In-flight limit with confirms; `None`: no confirms; `Some(0)`: confirms, no limit.
    pub confirm: Option<u64>,
    pub qos: Option<u16>,
    pub multi_ack_every: Option<u32>,
    pub autoack: bool,
    pub flags: Vec<Flag>,
    pub quorum_queue: bool,
    pub queue_args: Option<Vec<QueueArgument>>,
    pub auto_delete: Option<bool>,
    pub pmessages: Option<u64>,
    pub cmessages: Option<u64>,
    /// Seconds; `None`: until the message limits are reached or Ctrl-C.
    pub time: Option<f64>,
    pub use_millis: bool,
    /// Frame size to propose (PerfTest's `--framemax`); `None`: one that fits a message,
    /// see [`Workload::frame_max`].
    pub framemax: Option<u32>,
    /// SO_SNDBUF and SO_RCVBUF of every connection's socket, as PerfTest's
    /// `--tcp-send-buffer-size` and `--tcp-receive-buffer-size` (both 65536 by default);
    /// 0 leaves the size to the kernel's autotuning.
    pub tcp_send_buffer_size: u32,
    pub tcp_receive_buffer_size: u32,
    /// PerfTest's `--predeclared`: queues that exist are used as they are.
    pub predeclared: bool,
}

impl Default for Workload {
    /// PerfTest's defaults.
    fn default() -> Self {
        Workload {
            uris: vec!["amqp://localhost".into()],
            producers: 1,
            consumers: 1,
            queue: None,
            queue_pattern: None,
            queue_pattern_from: 1,
            queue_pattern_to: None,
            exchange: "direct".into(),
            exchange_type: "direct".into(),
            routing_key: None,
            size: 12,
            rate: None,
            consumer_rate: None,
            confirm: None,
            qos: None,
            multi_ack_every: None,
            autoack: false,
            flags: Vec::new(),
            quorum_queue: false,
            queue_args: None,
            auto_delete: None,
            pmessages: None,
            cmessages: None,
            time: None,
            use_millis: false,
            framemax: None,
            tcp_send_buffer_size: PERFTEST_SOCKET_BUFFER,
            tcp_receive_buffer_size: PERFTEST_SOCKET_BUFFER,
            predeclared: false,
        }
    }
}

/// The pattern's `%d`, as in PerfTest (which uses `String.format`).
const PATTERN_NUMBER: &str = "%d";

/// Queue names longer than AMQP's short-string limit cannot be declared.
const QUEUE_NAME_LEN_MAX: usize = 255;

/// PerfTest's socket buffer sizes (its `-tsbs` and `-trbs` defaults).
const PERFTEST_SOCKET_BUFFER: u32 = 65_536;

/// AMQP 0-9-1's `FRAME-MIN-SIZE`, and the largest frame proposed unless asked: RabbitMQ's
/// and Sluice's default `frame_max`.
const FRAME_MIN: u32 = 4096;
const FRAME_DEFAULT_MAX: u32 = 131_072;

/// A body frame's header and end octet.
const FRAME_OVERHEAD: usize = 8;

impl Workload {
    /// The URI of the `index`-th connection opened: the URIs in turn, as PerfTest spreads
    /// its connections over `-H`.
    pub fn uri(&self, index: usize) -> &str {
        &self.uris[index % self.uris.len()]
    }

    /// How each connection is set up.
    pub fn connection_options(&self) -> SocketOptions {
        SocketOptions {
            frame_max: self.frame_max(),
            send_buffer: self.tcp_send_buffer_size,
            receive_buffer: self.tcp_receive_buffer_size,
        }
    }

    /// The frame size each connection proposes: `--framemax` if given (0: the broker's), else
    /// the smallest that carries a whole message body in one frame, between 4 KiB and
    /// 128 KiB (see [`crate::topology::connect`] for why not simply the broker's).
    pub fn frame_max(&self) -> u32 {
        self.framemax.unwrap_or_else(|| {
            let fits = u32::try_from(self.size.saturating_add(FRAME_OVERHEAD)).unwrap_or(u32::MAX);
            fits.clamp(FRAME_MIN, FRAME_DEFAULT_MAX)
        })
    }

    /// Checks what the flags cannot express on their own.
    ///
    /// # Errors
    /// [`PerfError::Args`] naming the flag to fix.
    pub fn validate(&self) -> Result<(), PerfError> {
        let fail = |text: String| Err(PerfError::Args(text));
        if let Some(frame_max) = self.framemax.filter(|&size| size > 0 && size < FRAME_MIN) {
            return fail(format!(
                "--framemax {frame_max} is below AMQP's minimum frame of {FRAME_MIN} bytes \
                 (0 takes the broker's)"
            ));
        }
        if let Some(pattern) = &self.queue_pattern {
            if !pattern.contains(PATTERN_NUMBER) {
                return fail(format!("--queue-pattern '{pattern}' has no %d"));
            }
            let Some(to) = self.queue_pattern_to else {
                return fail("--queue-pattern needs --queue-pattern-to".into());
            };
            if to < self.queue_pattern_from {
                return fail(format!(
                    "--queue-pattern-to {to} is below --queue-pattern-from {}",
                    self.queue_pattern_from
                ));
            }
        }
        if self
            .queue_names()
            .iter()
            .any(|name| name.len() > QUEUE_NAME_LEN_MAX)
        {
            return fail("queue names are limited to 255 bytes".into());
        }
        if self.producers == 0 && self.consumers == 0 {
            return fail("nothing to do: --producers and --consumers are both 0".into());
        }
        if let Some(time) = self.time {
            if !(time.is_finite() && time > 0.0) {
                return fail(format!("--time {time} is not a positive number of seconds"));
            }
        }
        if self.exchange.is_empty() && self.named_queues() && self.routing_key.is_some() {
            return fail("with the default exchange (-e '') the routing key is the queue name; drop --routing-key".into());
        }
        Ok(())
    }

    /// Whether queues are named (`--queue` or a pattern) rather than one server-named queue
    /// per consumer.
    pub fn named_queues(&self) -> bool {
        self.queue.is_some() || self.queue_pattern.is_some()
    }

    /// The named queues, in pattern order; empty with server-named queues.
    pub fn queue_names(&self) -> Vec<String> {
        if let Some(queue) = &self.queue {
            return vec![queue.clone()];
        }
        match (&self.queue_pattern, self.queue_pattern_to) {
            (Some(pattern), Some(to)) => (self.queue_pattern_from..=to)
                .map(|number| pattern.replacen(PATTERN_NUMBER, &number.to_string(), 1))
                .collect(),
            _ => Vec::new(),
        }
    }

    pub fn persistent(&self) -> bool {
        self.quorum_queue || self.flags.contains(&Flag::Persistent)
    }

    pub fn mandatory(&self) -> bool {
        self.flags.contains(&Flag::Mandatory)
    }

    /// PerfTest declares queues durable when messages are persistent.
    pub fn durable_queues(&self) -> bool {
        self.persistent()
    }

    /// PerfTest's default is auto-delete; quorum queues cannot be auto-delete.
    pub fn auto_delete_queues(&self) -> bool {
        self.auto_delete.unwrap_or(!self.quorum_queue)
    }

    /// `--queue-args`, plus `x-queue-type=quorum` with `--quorum-queue`.
    pub fn queue_arguments(&self) -> Vec<QueueArgument> {
        let mut arguments = self.queue_args.clone().unwrap_or_default();
        if self.quorum_queue && !arguments.iter().any(|a| a.key() == "x-queue-type") {
            arguments.push(QueueArgument::Text("x-queue-type".into(), "quorum".into()));
        }
        arguments
    }

    /// The queue consumer `index` reads from (round-robin over the named queues).
    pub fn consumer_queue(&self, index: u32, names: &[String]) -> Option<String> {
        (!names.is_empty()).then(|| names[index as usize % names.len()].clone())
    }

    /// The routing key producer `index` publishes with. `run_key` is the run's random key,
    /// used with server-named queues when no `--routing-key` is given.
    pub fn producer_routing_key(&self, index: u32, names: &[String], run_key: &str) -> String {
        if let Some(key) = &self.routing_key {
            return key.clone();
        }
        if names.is_empty() {
            return run_key.to_owned();
        }
        names[index as usize % names.len()].clone()
    }

    /// The key a named queue is bound with.
    pub fn binding_key(&self, queue: &str) -> String {
        self.routing_key.clone().unwrap_or_else(|| queue.to_owned())
    }

    /// A one-line description for reports, e.g. "20 producers × 1000 msg/s, 10 queues, 20
    /// consumers, 1000 B, confirms 100, prefetch 1000".
    pub fn describe(&self) -> String {
        let mut text = plural(self.producers, "producer");
        if let Some(rate) = self.rate {
            text += &format!(" × {rate} msg/s");
        }
        let queues = self.queue_names().len();
        if queues > 0 {
            text += &format!(", {}", plural(queues as u32, "queue"));
        }
        text += &format!(", {}, {} B", plural(self.consumers, "consumer"), self.size);
        text += &match self.confirm {
            None => ", no confirms".to_owned(),
            Some(0) => ", confirms (no limit)".to_owned(),
            Some(limit) => format!(", confirms {limit}"),
        };
        if let Some(qos) = self.qos {
            text += &format!(", prefetch {qos}");
        }
        if let Some(every) = self.multi_ack_every {
            text += &format!(", multi-ack every {every}");
        }
        if self.autoack {
            text += ", autoack";
        }
        if self.quorum_queue {
            text += ", quorum queues";
        }
        if self.persistent() {
            text += ", persistent";
        }
        text
    }
}

/// "1 queue", "10 queues".
fn plural(count: u32, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_spreads_clients_over_queues() {
        let workload = Workload {
            queue_pattern: Some("q-%d".into()),
            queue_pattern_from: 3,
            queue_pattern_to: Some(5),
            ..Workload::default()
        };
        workload.validate().unwrap();
        let names = workload.queue_names();
        assert_eq!(names, ["q-3", "q-4", "q-5"]);
        assert_eq!(workload.consumer_queue(4, &names).unwrap(), "q-4");
        assert_eq!(workload.producer_routing_key(2, &names, "run"), "q-5");
        assert_eq!(workload.binding_key("q-3"), "q-3");
    }

    #[test]
    fn workload_frame_fits_the_message_unless_asked() {
        let sized = |size| Workload {
            size,
            ..Workload::default()
        };
        assert_eq!(sized(12).frame_max(), 4096);
        assert_eq!(sized(10_000).frame_max(), 10_008);
        assert_eq!(sized(4 << 20).frame_max(), 131_072);
        let asked = Workload {
            framemax: Some(0),
            ..sized(1000)
        };
        assert_eq!(asked.frame_max(), 0);
        asked.validate().unwrap();
        let too_small = Workload {
            framemax: Some(1024),
            ..sized(1000)
        };
        let err = too_small.validate().unwrap_err().to_string();
        assert!(err.contains("--framemax 1024 is below"), "{err}");
    }

    #[test]
    fn workload_server_named_queues_share_the_run_key() {
        let workload = Workload::default();
        assert!(workload.queue_names().is_empty());
        assert_eq!(workload.consumer_queue(0, &[]), None);
        assert_eq!(workload.producer_routing_key(7, &[], "run-key"), "run-key");
    }

    #[test]
    fn workload_quorum_queue_shortcut() {
        let workload = Workload {
            quorum_queue: true,
            ..Workload::default()
        };
        assert!(workload.durable_queues() && workload.persistent());
        assert!(!workload.auto_delete_queues());
        assert_eq!(
            workload.queue_arguments(),
            [QueueArgument::Text("x-queue-type".into(), "quorum".into())]
        );
    }
}
