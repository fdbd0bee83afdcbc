//! Resource alarms: the memory high watermark and the free-disk limit.
//!
//! A monitor task samples the broker's resident memory and the free space of
//! the data directory's file system. While either is past its limit, every
//! connection that publishes is blocked (told with `connection.blocked` when
//! it advertised the capability) and its socket is not read; consumers,
//! acks and connections that only consume carry on, which is what brings
//! memory back down. Each alarm clears only some way below its limit, so a
//! broker hovering at the limit does not flap.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;

/// How often memory and disk are sampled. At 1 GB/s of publishing, 25 ms is
/// 25 MB, half of the default 50 MB free-disk limit.
pub const ALARM_CHECK_INTERVAL: Duration = Duration::from_millis(25);

/// The memory alarm clears once resident memory is below this fraction of
/// the watermark.
pub const MEMORY_CLEAR_FRACTION: f64 = 0.9;

/// The disk alarm clears once free space is this much above the limit.
pub const DISK_CLEAR_MARGIN_FRACTION: f64 = 0.1;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Alarms {
    pub memory: bool,
    pub disk: bool,
}

impl Alarms {
    pub fn any(&self) -> bool {
        self.memory || self.disk
    }

    /// The reason `connection.blocked` carries, in RabbitMQ's words.
    pub fn reason(&self) -> &'static str {
        match (self.memory, self.disk) {
            (true, true) => "low on memory and disk",
            (true, false) => "low on memory",
            (false, true) => "low on disk",
            (false, false) => "",
        }
    }
}

/// The memory alarm's next state: set above the watermark, cleared only
/// below [`MEMORY_CLEAR_FRACTION`] of it.
pub fn next_memory_alarm(active: bool, resident_bytes: u64, watermark_bytes: u64) -> bool {
    if active {
        resident_bytes as f64 >= watermark_bytes as f64 * MEMORY_CLEAR_FRACTION
    } else {
        resident_bytes > watermark_bytes
    }
}

/// The disk alarm's next state: set below the limit, cleared only once free
/// space is [`DISK_CLEAR_MARGIN_FRACTION`] above it.
pub fn next_disk_alarm(active: bool, free_bytes: u64, limit_bytes: u64) -> bool {
    if active {
        (free_bytes as f64) < limit_bytes as f64 * (1.0 + DISK_CLEAR_MARGIN_FRACTION)
    } else {
        free_bytes < limit_bytes
    }
}

/// The memory the watermark is relative to: the cgroup's limit when there
/// is one, else the machine's RAM.
pub fn total_memory_bytes() -> Option<u64> {
    let cgroup_limit = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok());
    let ram = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("MemTotal:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .map(|kib| kib * 1024)
        });
    match (cgroup_limit, ram) {
        (Some(limit), Some(ram)) => Some(limit.min(ram)),
        (limit, ram) => limit.or(ram),
    }
}

/// This process's resident memory.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib * 1024)
}

/// Free space for unprivileged writers on the file system holding `path`.
pub fn free_disk_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stats` a valid, writable
    // statvfs that the call fills in.
    let result = unsafe { libc::statvfs(path.as_ptr(), &mut stats) };
    (result == 0).then(|| stats.f_bavail as u64 * stats.f_frsize as u64)
}

pub struct AlarmSettings {
    pub memory_watermark_bytes: u64,
    pub disk_free_limit_bytes: u64,
    pub data_dir: PathBuf,
}

/// Samples memory and disk until the sender has no receivers left, logging
/// every change with the figures behind it.
pub async fn monitor(settings: AlarmSettings, alarms: watch::Sender<Alarms>) {
    let mut current = Alarms::default();
    let mut interval = tokio::time::interval(ALARM_CHECK_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let mut next = current;
        if let Some(resident) = resident_bytes() {
            next.memory =
                next_memory_alarm(current.memory, resident, settings.memory_watermark_bytes);
            if next.memory != current.memory {
                if next.memory {
                    tracing::warn!(
                        resident,
                        watermark = settings.memory_watermark_bytes,
                        "memory alarm set: publishers are blocked"
                    );
                } else {
                    tracing::info!(
                        resident,
                        watermark = settings.memory_watermark_bytes,
                        "memory alarm cleared"
                    );
                }
            }
        }
        if let Some(free) = free_disk_bytes(&settings.data_dir) {
            next.disk = next_disk_alarm(current.disk, free, settings.disk_free_limit_bytes);
            if next.disk != current.disk {
                if next.disk {
                    tracing::warn!(
                        free,
                        limit = settings.disk_free_limit_bytes,
                        "disk alarm set: publishers are blocked"
                    );
                } else {
                    tracing::info!(
                        free,
                        limit = settings.disk_free_limit_bytes,
                        "disk alarm cleared"
                    );
                }
            }
        }
        if next != current {
            current = next;
            if alarms.send(current).is_err() {
                return;
            }
        }
        if alarms.is_closed() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarm_memory_hysteresis_does_not_flap() {
        let watermark = 1000;
        assert!(!next_memory_alarm(false, 1000, watermark));
        assert!(next_memory_alarm(false, 1001, watermark));
        // Hovering just under the watermark keeps it set.
        assert!(next_memory_alarm(true, 950, watermark));
        assert!(next_memory_alarm(true, 900, watermark));
        assert!(!next_memory_alarm(true, 899, watermark));
    }

    #[test]
    fn alarm_disk_hysteresis_does_not_flap() {
        let limit = 1000;
        assert!(next_disk_alarm(false, 999, limit));
        assert!(!next_disk_alarm(false, 1000, limit));
        assert!(next_disk_alarm(true, 1050, limit));
        assert!(!next_disk_alarm(true, 1100, limit));
    }

    #[test]
    fn alarm_readings_work_on_this_machine() {
        assert!(resident_bytes().unwrap() > 0);
        assert!(total_memory_bytes().unwrap() > resident_bytes().unwrap());
        assert!(free_disk_bytes(Path::new("/")).is_some());
        assert_eq!(
            Alarms {
                memory: true,
                disk: false
            }
            .reason(),
            "low on memory"
        );
    }
}
