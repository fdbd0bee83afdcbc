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

use crate::resource_limit::{
    DiskFreeLimit, LimitError, MemoryWatermark, DISK_FREE_LIMIT_DEFAULT_BYTES,
};

/// How often memory and disk are sampled, at most, in milliseconds: near a limit.
/// Sampling costs one read of `/proc/self/status` and one `statvfs`. It has to be short
/// enough that publishers cannot fill the disk between two samples: see
/// [`DISK_FILL_RATE_MAX_BYTES_PER_SEC`]. Far from both limits the monitor samples less
/// often (see [`next_check_in`]), so that an idle node costs next to nothing.
pub const ALARM_CHECK_INTERVAL_MS: u64 = 25;

/// The longest wait between two samples, however far the limits are.
pub const ALARM_CHECK_INTERVAL_MAX: Duration = Duration::from_secs(1);

/// [`ALARM_CHECK_INTERVAL_MS`] as a duration.
pub const ALARM_CHECK_INTERVAL: Duration = Duration::from_millis(ALARM_CHECK_INTERVAL_MS);

/// The fastest the broker can fill its disk: what a fast NVMe drive writes sequentially,
/// which is also about what a 25 Gbit/s network brings in. Between two samples publishers
/// can write at most this rate times [`ALARM_CHECK_INTERVAL_MS`], 50 MB, which the default
/// free-disk limit still covers (checked below). RabbitMQ instead adapts its disk check
/// interval to the free space left, assuming 250 MB/s and checking at most every 100 ms
/// (`rabbit_disk_monitor`): 25 MB between checks.
pub const DISK_FILL_RATE_MAX_BYTES_PER_SEC: u64 = 2_000_000_000;

const _: () = assert!(
    DISK_FILL_RATE_MAX_BYTES_PER_SEC / 1000 * ALARM_CHECK_INTERVAL_MS
        <= DISK_FREE_LIMIT_DEFAULT_BYTES
);

/// The memory alarm clears once resident memory is below this fraction of
/// the watermark.
pub const MEMORY_CLEAR_FRACTION: f64 = 0.9;

/// The disk alarm clears once free space is this much above the limit.
pub const DISK_CLEAR_MARGIN_FRACTION: f64 = 0.1;

/// The memory assumed when the system does not say, as RabbitMQ's `vm_memory_monitor` does
/// for an unknown OS: 1 GiB.
pub const TOTAL_MEMORY_UNKNOWN_BYTES: u64 = 1 << 30;

const BYTES_PER_MIB: u64 = 1 << 20;
const BYTES_PER_MB: u64 = 1_000_000;

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

/// What the monitor samples. `None` when the system would not say; the alarm keeps its
/// state until it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readings {
    pub resident_bytes: Option<u64>,
    pub free_disk_bytes: Option<u64>,
}

impl Readings {
    /// This process's resident memory and the free space where `data_dir` lives, now.
    pub fn sample(data_dir: &Path) -> Self {
        Readings {
            resident_bytes: resident_bytes(),
            free_disk_bytes: free_disk_bytes(data_dir),
        }
    }
}

/// The alarm thresholds in force: as configured, and in bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AlarmLimits {
    pub memory_watermark: MemoryWatermark,
    pub disk_free_limit: DiskFreeLimit,
    /// The memory both relative forms are relative to, when the limits were last set.
    pub total_memory_bytes: u64,
    pub memory_watermark_bytes: u64,
    pub disk_free_limit_bytes: u64,
}

impl AlarmLimits {
    /// # Errors
    /// As [`MemoryWatermark::validate`] and [`DiskFreeLimit::validate`].
    pub fn new(
        memory_watermark: MemoryWatermark,
        disk_free_limit: DiskFreeLimit,
        total_memory_bytes: u64,
    ) -> Result<Self, LimitError> {
        memory_watermark.validate()?;
        disk_free_limit.validate()?;
        Ok(AlarmLimits {
            memory_watermark,
            disk_free_limit,
            total_memory_bytes,
            memory_watermark_bytes: memory_watermark.bytes(total_memory_bytes),
            disk_free_limit_bytes: disk_free_limit.bytes(total_memory_bytes),
        })
    }
}

/// The alarms as the monitor last set them, and the hysteresis that moves them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AlarmState {
    pub alarms: Alarms,
}

impl AlarmState {
    /// Applies one sample, logging each alarm that is set or cleared with the figures
    /// behind it, and returns the alarms now in effect.
    pub fn update(&mut self, readings: Readings, limits: &AlarmLimits) -> Alarms {
        if let Some(resident) = readings.resident_bytes {
            let watermark = limits.memory_watermark_bytes;
            let memory = next_memory_alarm(self.alarms.memory, resident, watermark);
            if memory && !self.alarms.memory {
                tracing::warn!(
                    resident_bytes = resident,
                    watermark_bytes = watermark,
                    "memory resource limit alarm set: {} MiB used, limit {} MiB. Publishers will be blocked until this alarm clears",
                    resident / BYTES_PER_MIB,
                    watermark / BYTES_PER_MIB,
                );
            } else if !memory && self.alarms.memory {
                tracing::info!(
                    resident_bytes = resident,
                    watermark_bytes = watermark,
                    "memory resource limit alarm cleared: {} MiB used, below {:.0}% of the {} MiB limit",
                    resident / BYTES_PER_MIB,
                    MEMORY_CLEAR_FRACTION * 100.0,
                    watermark / BYTES_PER_MIB,
                );
            }
            self.alarms.memory = memory;
        }
        if let Some(free) = readings.free_disk_bytes {
            let limit = limits.disk_free_limit_bytes;
            let disk = next_disk_alarm(self.alarms.disk, free, limit);
            if disk && !self.alarms.disk {
                tracing::warn!(
                    free_bytes = free,
                    limit_bytes = limit,
                    "disk resource limit alarm set: {} MB free, limit {} MB. Publishers will be blocked until this alarm clears",
                    free / BYTES_PER_MB,
                    limit / BYTES_PER_MB,
                );
            } else if !disk && self.alarms.disk {
                tracing::info!(
                    free_bytes = free,
                    limit_bytes = limit,
                    "disk resource limit alarm cleared: {} MB free, at least {:.0}% above the {} MB limit",
                    free / BYTES_PER_MB,
                    DISK_CLEAR_MARGIN_FRACTION * 100.0,
                    limit / BYTES_PER_MB,
                );
            }
            self.alarms.disk = disk;
        }
        self.alarms
    }
}

/// The running alarm monitor: the alarms it raises, and the thresholds it checks, which
/// can be changed while it runs (RabbitMQ's `rabbitmqctl set_vm_memory_high_watermark`
/// and `set_disk_free_limit`). The monitor task stops when this is dropped.
pub struct AlarmMonitor {
    limits: watch::Sender<AlarmLimits>,
    alarms: watch::Receiver<Alarms>,
}

impl AlarmMonitor {
    /// Starts sampling every [`ALARM_CHECK_INTERVAL`] on the current tokio runtime.
    ///
    /// # Errors
    /// [`LimitError`] if a threshold is out of range; nothing is started then.
    pub fn start(
        memory_watermark: MemoryWatermark,
        disk_free_limit: DiskFreeLimit,
        data_dir: PathBuf,
    ) -> Result<Self, LimitError> {
        let limits = AlarmLimits::new(memory_watermark, disk_free_limit, total_memory())?;
        log_memory_watermark(&limits);
        log_disk_free_limit(&limits);
        let (limits, limits_receiver) = watch::channel(limits);
        let (alarms_sender, alarms) = watch::channel(Alarms::default());
        tokio::spawn(monitor(data_dir, limits_receiver, alarms_sender));
        Ok(AlarmMonitor { limits, alarms })
    }

    /// Replaces the memory watermark and checks it at once. A relative watermark is taken
    /// against the memory available now, as RabbitMQ re-reads it on this command too.
    /// Returns the new watermark in bytes.
    ///
    /// # Errors
    /// [`LimitError::MemoryFraction`] for a fraction outside 0.0 to 1.0; nothing changes.
    pub fn set_vm_memory_high_watermark(
        &self,
        memory_watermark: MemoryWatermark,
    ) -> Result<u64, LimitError> {
        let current = self.limits();
        let limits = AlarmLimits::new(memory_watermark, current.disk_free_limit, total_memory())?;
        log_memory_watermark(&limits);
        self.limits.send_replace(limits);
        Ok(limits.memory_watermark_bytes)
    }

    /// Replaces the free-disk limit and checks it at once. Returns the new limit in bytes.
    ///
    /// # Errors
    /// [`LimitError::DiskMultiple`] for a negative or non-finite multiple; nothing changes.
    pub fn set_disk_free_limit(&self, disk_free_limit: DiskFreeLimit) -> Result<u64, LimitError> {
        let current = self.limits();
        let limits = AlarmLimits::new(current.memory_watermark, disk_free_limit, total_memory())?;
        log_disk_free_limit(&limits);
        self.limits.send_replace(limits);
        Ok(limits.disk_free_limit_bytes)
    }

    /// The thresholds in force.
    pub fn limits(&self) -> AlarmLimits {
        *self.limits.borrow()
    }

    /// The thresholds, as they change.
    pub fn watch_limits(&self) -> watch::Receiver<AlarmLimits> {
        self.limits.subscribe()
    }

    /// The alarms in effect.
    pub fn alarms(&self) -> Alarms {
        *self.alarms.borrow()
    }

    /// A receiver that sees every change of the alarms, for a connection to wait on.
    pub fn subscribe(&self) -> watch::Receiver<Alarms> {
        self.alarms.clone()
    }
}

fn total_memory() -> u64 {
    total_memory_bytes().unwrap_or_else(|| {
        tracing::warn!(
            "unknown total memory size, assuming {} MiB",
            TOTAL_MEMORY_UNKNOWN_BYTES / BYTES_PER_MIB
        );
        TOTAL_MEMORY_UNKNOWN_BYTES
    })
}

fn log_memory_watermark(limits: &AlarmLimits) {
    tracing::info!(
        "memory high watermark set to {} MiB ({} bytes) of {} MiB ({} bytes) total",
        limits.memory_watermark_bytes / BYTES_PER_MIB,
        limits.memory_watermark_bytes,
        limits.total_memory_bytes / BYTES_PER_MIB,
        limits.total_memory_bytes,
    );
}

fn log_disk_free_limit(limits: &AlarmLimits) {
    tracing::info!(
        "disk free limit set to {} MB ({} bytes)",
        limits.disk_free_limit_bytes / BYTES_PER_MB,
        limits.disk_free_limit_bytes,
    );
}

/// From this fraction of the watermark up, free heap memory is returned to
/// the system before the alarm is decided: below the alarm's clearing point
/// (0.9), so a set alarm is not held up by memory nobody uses.
const MEMORY_TRIM_FRACTION: f64 = 0.8;

/// Free heap memory is returned at most this often: often enough that the
/// alarm clears soon after memory is freed, rarely enough that the trim's own
/// cost (a walk over the allocator's free lists) does not matter.
const MEMORY_TRIM_INTERVAL: Duration = Duration::from_secs(1);

/// Returns the allocator's free memory to the system (glibc's `malloc_trim`).
pub(crate) fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free pages of the allocator's own
    // arenas; it touches no memory the program holds.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// When to sample again: no later than the fastest broker could use up the headroom left
/// under either limit (memory and disk filling at [`DISK_FILL_RATE_MAX_BYTES_PER_SEC`]),
/// between [`ALARM_CHECK_INTERVAL`] and [`ALARM_CHECK_INTERVAL_MAX`]. As RabbitMQ's disk
/// monitor adapts its interval to the space left. A reading the system would not give
/// counts as no headroom.
pub fn next_check_in(readings: Readings, limits: &AlarmLimits) -> Duration {
    let memory_headroom = readings.resident_bytes.map_or(0, |resident| {
        limits.memory_watermark_bytes.saturating_sub(resident)
    });
    let disk_headroom = readings
        .free_disk_bytes
        .map_or(0, |free| free.saturating_sub(limits.disk_free_limit_bytes));
    let headroom = memory_headroom.min(disk_headroom);
    let until_full =
        Duration::from_secs_f64(headroom as f64 / DISK_FILL_RATE_MAX_BYTES_PER_SEC as f64);
    until_full.clamp(ALARM_CHECK_INTERVAL, ALARM_CHECK_INTERVAL_MAX)
}

/// Samples memory and disk as often as [`next_check_in`] says, and at once when the
/// limits change, until the [`AlarmMonitor`] is dropped.
async fn monitor(
    data_dir: PathBuf,
    mut limits: watch::Receiver<AlarmLimits>,
    alarms: watch::Sender<Alarms>,
) {
    let mut state = AlarmState::default();
    let mut next_check = Duration::ZERO;
    let mut last_trim: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(next_check) => {}
            changed = limits.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        let current_limits = *limits.borrow_and_update();
        let mut readings = Readings::sample(&data_dir);
        let near_watermark = readings.resident_bytes.is_some_and(|resident| {
            resident as f64 >= current_limits.memory_watermark_bytes as f64 * MEMORY_TRIM_FRACTION
        });
        if near_watermark && last_trim.is_none_or(|at| at.elapsed() >= MEMORY_TRIM_INTERVAL) {
            // Memory the broker freed (messages paged, drained or consumed)
            // stays resident in the allocator's free lists, and would set
            // the alarm, or keep it set, for memory nobody holds. Hand it
            // back first and look again, as RabbitMQ collects garbage
            // before it raises its alarm.
            return_free_memory();
            last_trim = Some(tokio::time::Instant::now());
            readings = Readings::sample(&data_dir);
        }
        next_check = next_check_in(readings, &current_limits);
        let next = state.update(readings, &current_limits);
        alarms.send_if_modified(|current| {
            let changed = *current != next;
            *current = next;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarm_checks_as_often_as_the_headroom_left_requires() {
        let limits = AlarmLimits::new(
            MemoryWatermark::Absolute(8_000_000_000),
            DiskFreeLimit::Absolute(50_000_000),
            16_000_000_000,
        )
        .unwrap();
        let idle = Readings {
            resident_bytes: Some(50_000_000),
            free_disk_bytes: Some(100_000_000_000),
        };
        assert_eq!(next_check_in(idle, &limits), ALARM_CHECK_INTERVAL_MAX);
        // 400 MB of disk left: 2 GB/s fills it in 200 ms.
        let filling = Readings {
            free_disk_bytes: Some(450_000_000),
            ..idle
        };
        let wait = next_check_in(filling, &limits);
        assert!(wait > Duration::from_millis(190) && wait < Duration::from_millis(210));
        // Over a limit, or unknown: as often as ever.
        for near in [
            Readings {
                resident_bytes: Some(9_000_000_000),
                ..idle
            },
            Readings {
                free_disk_bytes: None,
                ..idle
            },
        ] {
            assert_eq!(next_check_in(near, &limits), ALARM_CHECK_INTERVAL);
        }
    }

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

    fn limits(memory_watermark_bytes: u64, disk_free_limit_bytes: u64) -> AlarmLimits {
        AlarmLimits::new(
            MemoryWatermark::Absolute(memory_watermark_bytes),
            DiskFreeLimit::Absolute(disk_free_limit_bytes),
            u64::MAX,
        )
        .unwrap()
    }

    fn readings(resident_bytes: Option<u64>, free_disk_bytes: Option<u64>) -> Readings {
        Readings {
            resident_bytes,
            free_disk_bytes,
        }
    }

    #[test]
    fn alarm_state_memory_sets_holds_and_clears() {
        let limits = limits(1000, 0);
        let mut state = AlarmState::default();
        let expected = [
            (1000, false),
            (1001, true),
            (950, true),  // inside the band: still set
            (2000, true), // a sample the system could not give changes nothing
            (899, false),
            (950, false), // inside the band from below: still clear
        ];
        for (resident, memory) in expected {
            let alarms = state.update(readings(Some(resident), Some(1)), &limits);
            assert_eq!(alarms.memory, memory, "resident {resident}");
            assert!(!alarms.disk);
        }
        let alarms = state.update(readings(None, Some(1)), &limits);
        assert!(!alarms.memory, "no reading keeps the alarm as it was");
    }

    #[test]
    fn alarm_state_disk_sets_holds_and_clears() {
        let limits = limits(u64::MAX, 1000);
        let mut state = AlarmState::default();
        for (free, disk) in [(1000, false), (999, true), (1099, true), (1100, false)] {
            let alarms = state.update(readings(Some(1), Some(free)), &limits);
            assert_eq!(alarms.disk, disk, "free {free}");
        }
        state.update(readings(Some(1), Some(0)), &limits);
        assert!(state.update(readings(Some(1), None), &limits).disk);
    }

    #[test]
    fn alarm_limits_reject_bad_thresholds() {
        assert_eq!(
            AlarmLimits::new(MemoryWatermark::Relative(1.5), DiskFreeLimit::default(), 1),
            Err(LimitError::MemoryFraction(1.5))
        );
        assert_eq!(
            AlarmLimits::new(
                MemoryWatermark::default(),
                DiskFreeLimit::MemoryRelative(-1.0),
                1
            ),
            Err(LimitError::DiskMultiple(-1.0))
        );
        let limits = AlarmLimits::new(
            MemoryWatermark::Relative(0.5),
            DiskFreeLimit::MemoryRelative(2.0),
            1000,
        )
        .unwrap();
        assert_eq!(limits.memory_watermark_bytes, 500);
        assert_eq!(limits.disk_free_limit_bytes, 2000);
    }

    /// The monitor task on a paused clock: limit changes take effect without waiting for
    /// the next sample, and dropping the monitor stops the task.
    #[tokio::test(start_paused = true)]
    async fn alarm_monitor_follows_limit_changes() {
        let monitor = AlarmMonitor::start(
            MemoryWatermark::Relative(1.0),
            DiskFreeLimit::Absolute(0),
            std::env::temp_dir(),
        )
        .unwrap();
        let mut alarms = monitor.subscribe();
        // Several samples pass without an alarm: resident memory is far below all of it.
        tokio::time::sleep(ALARM_CHECK_INTERVAL * 4).await;
        assert_eq!(monitor.alarms(), Alarms::default());

        let started = tokio::time::Instant::now();
        assert_eq!(
            monitor.set_vm_memory_high_watermark(MemoryWatermark::Absolute(0)),
            Ok(0)
        );
        alarms.wait_for(|alarms| alarms.memory).await.unwrap();
        assert!(started.elapsed() < ALARM_CHECK_INTERVAL, "checked at once");
        assert_eq!(monitor.limits().memory_watermark_bytes, 0);

        // A watermark of all the memory there is clears it.
        let watermark = monitor
            .set_vm_memory_high_watermark(MemoryWatermark::Relative(1.0))
            .unwrap();
        assert_eq!(watermark, monitor.limits().total_memory_bytes);
        alarms.wait_for(|alarms| !alarms.memory).await.unwrap();

        // A disk limit above any disk sets the disk alarm; a zero limit clears it.
        monitor
            .set_disk_free_limit(DiskFreeLimit::Absolute(u64::MAX))
            .unwrap();
        alarms.wait_for(|alarms| alarms.disk).await.unwrap();
        assert_eq!(monitor.alarms().reason(), "low on disk");
        monitor
            .set_disk_free_limit(DiskFreeLimit::Absolute(0))
            .unwrap();
        alarms.wait_for(|alarms| !alarms.any()).await.unwrap();

        // A bad threshold changes nothing.
        assert!(monitor
            .set_vm_memory_high_watermark(MemoryWatermark::Relative(-1.0))
            .is_err());
        assert_eq!(monitor.limits().memory_watermark_bytes, watermark);

        drop(monitor);
        assert!(
            alarms.changed().await.is_err(),
            "the task stops with the monitor"
        );
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
