//! Scenario files (`bench/scenarios/*.toml`): a named workload and the in-flight sweep to
//! run it with, e.g. seed 001's benchmark #1:
//!
//! ```toml
//! name = "seed-1"
//! description = "20 publishers × 1000 msg/s, 10 queues, 20 consumers, 1 kB"
//! producers = 20
//! consumers = 20
//! queues = 10
//! rate = 1000
//! size = 1000
//! qos = 1000
//! time = 60
//! sweep = "none,1,2,5,10,20,100,200"
//! ```
//!
//! `--scale F` multiplies producers, consumers and queues (rounded, at least 1) and keeps
//! the per-producer rate, prefetch and in-flight percentages, so a scaled run keeps the
//! shape of the seed's workload at a load a smaller machine can carry.

use std::path::Path;

use serde::Deserialize;

use crate::sweep::SweepPoint;
use crate::workload::{Flag, QueueArgument, Workload};
use crate::PerfError;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub producers: u32,
    pub consumers: u32,
    /// Number of named queues, `<queue_prefix>1` … `<queue_prefix>N`.
    pub queues: u32,
    /// Queue name prefix [default: "<name>-q-"].
    #[serde(default)]
    pub queue_prefix: Option<String>,
    /// Per producer, messages/s.
    pub rate: f64,
    pub size: usize,
    #[serde(default)]
    pub qos: Option<u16>,
    #[serde(default)]
    pub multi_ack_every: Option<u32>,
    #[serde(default)]
    pub quorum_queue: bool,
    #[serde(default)]
    pub persistent: bool,
    /// Seconds per run.
    pub time: f64,
    /// In-flight limits in percent of `rate`, and "none": "none,1,2,5,10,20,100,200".
    pub sweep: String,
}

impl Scenario {
    /// Reads and checks a scenario file.
    ///
    /// # Errors
    /// [`PerfError::Scenario`] naming the file, for I/O and syntax errors.
    pub fn load(path: &Path) -> Result<Scenario, PerfError> {
        let error = |text: String| PerfError::Scenario {
            path: path.to_owned(),
            text,
        };
        let text = std::fs::read_to_string(path).map_err(|err| error(err.to_string()))?;
        let scenario: Scenario = toml::from_str(&text).map_err(|err| error(err.to_string()))?;
        scenario.sweep_points().map_err(error)?;
        if scenario.queues == 0 {
            return Err(error("queues must be at least 1".into()));
        }
        Ok(scenario)
    }

    pub fn sweep_points(&self) -> Result<Vec<SweepPoint>, String> {
        self.sweep
            .split(',')
            .map(str::trim)
            .filter(|point| !point.is_empty())
            .map(str::parse)
            .collect()
    }

    /// The scenario's workload with client and queue counts multiplied by `scale`.
    ///
    /// # Errors
    /// [`PerfError::Args`] if `scale` is not a positive number.
    pub fn workload(&self, scale: f64) -> Result<Workload, PerfError> {
        if !(scale.is_finite() && scale > 0.0) {
            return Err(PerfError::Args(format!(
                "--scale {scale} is not a positive number"
            )));
        }
        let scaled = |count: u32| ((f64::from(count) * scale).round() as u32).max(1);
        let queues = scaled(self.queues);
        let prefix = self
            .queue_prefix
            .clone()
            .unwrap_or_else(|| format!("{}-q-", self.name));
        let mut flags = Vec::new();
        if self.persistent {
            flags.push(Flag::Persistent);
        }
        Ok(Workload {
            producers: scaled(self.producers),
            consumers: scaled(self.consumers),
            queue_pattern: Some(format!("{prefix}%d")),
            queue_pattern_from: 1,
            queue_pattern_to: Some(queues),
            rate: Some(self.rate),
            size: self.size,
            qos: self.qos,
            multi_ack_every: self.multi_ack_every,
            quorum_queue: self.quorum_queue,
            flags,
            time: Some(self.time),
            // Named queues outlive a run in a sweep only if they are not auto-delete; the
            // sweep deletes them itself, so keep PerfTest's default.
            queue_args: None::<Vec<QueueArgument>>,
            ..Workload::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed_5() -> Scenario {
        toml::from_str(
            r#"
            name = "seed-5"
            producers = 1000
            consumers = 1000
            queues = 200
            rate = 100
            size = 1000
            qos = 100
            time = 60
            sweep = "none, 2, 5, 10, 20, 50, 100, 200"
            "#,
        )
        .unwrap()
    }

    #[test]
    fn scenario_scales_clients_and_queues_not_rates() {
        let workload = seed_5().workload(0.1).unwrap();
        assert_eq!((workload.producers, workload.consumers), (100, 100));
        assert_eq!(workload.queue_names().len(), 20);
        assert_eq!(workload.queue_names()[0], "seed-5-q-1");
        assert_eq!(workload.rate, Some(100.0));
        assert_eq!(workload.qos, Some(100));
        // Tiny scales keep at least one of each.
        let tiny = seed_5().workload(0.0001).unwrap();
        assert_eq!(
            (tiny.producers, tiny.consumers, tiny.queue_names().len()),
            (1, 1, 1)
        );
        assert!(seed_5().workload(0.0).is_err());
    }

    #[test]
    fn scenario_sweep_points_parse() {
        let points = seed_5().sweep_points().unwrap();
        assert_eq!(points.len(), 8);
        assert_eq!(points[0], SweepPoint::NoConfirms);
        assert_eq!(points[7], SweepPoint::Percent(200.0));
    }

    #[test]
    fn scenario_files_in_bench_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/scenarios");
        let mut count = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|ext| ext == "toml") {
                let scenario = Scenario::load(&path).unwrap();
                scenario.workload(0.1).unwrap().validate().unwrap();
                count += 1;
            }
        }
        assert_eq!(count, 5, "the seed's five workloads");
    }
}
