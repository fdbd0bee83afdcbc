//! The thresholds of the memory and disk alarms, in the two forms rabbitmq.conf and
//! `rabbitmqctl` accept for each: a memory watermark relative to the memory available or
//! absolute, and a free-disk limit absolute or relative to the memory available.

/// The memory watermark when the configuration names none, as a fraction of the memory
/// available. RabbitMQ 3.10 used 0.4; RabbitMQ 4.0 moved to 0.6, which Sluice follows: the
/// broker's memory is mostly message bodies it can shed by delivering them, not a garbage
/// collector that may briefly need twice its heap.
pub const VM_MEMORY_HIGH_WATERMARK_RELATIVE_DEFAULT: f64 = 0.6;

/// The free-disk limit when the configuration names none: RabbitMQ's default of 50 MB.
pub const DISK_FREE_LIMIT_DEFAULT_BYTES: u64 = 50_000_000;

/// Where the memory alarm goes off (`vm_memory_high_watermark.*`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MemoryWatermark {
    /// A fraction of the memory available, from 0.0 to 1.0. 0.0 sets the alarm at once,
    /// which blocks every publisher, as in RabbitMQ.
    Relative(f64),
    /// A number of bytes. More than the memory available means all of it, as RabbitMQ's
    /// `vm_memory_monitor` does.
    Absolute(u64),
}

impl Default for MemoryWatermark {
    fn default() -> Self {
        MemoryWatermark::Relative(VM_MEMORY_HIGH_WATERMARK_RELATIVE_DEFAULT)
    }
}

impl MemoryWatermark {
    /// The watermark in bytes when `total_memory_bytes` are available.
    pub fn bytes(&self, total_memory_bytes: u64) -> u64 {
        match *self {
            MemoryWatermark::Relative(fraction) => (total_memory_bytes as f64 * fraction) as u64,
            MemoryWatermark::Absolute(bytes) => bytes.min(total_memory_bytes),
        }
    }

    /// # Errors
    /// [`LimitError::MemoryFraction`] for a relative watermark outside 0.0 to 1.0 (or NaN).
    pub fn validate(&self) -> Result<(), LimitError> {
        match *self {
            MemoryWatermark::Relative(fraction) if !(0.0..=1.0).contains(&fraction) => {
                Err(LimitError::MemoryFraction(fraction))
            }
            _ => Ok(()),
        }
    }
}

/// Where the disk alarm goes off (`disk_free_limit.*`): free space below this blocks
/// publishers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DiskFreeLimit {
    /// A number of bytes.
    Absolute(u64),
    /// A multiple of the memory available (RabbitMQ's `{mem_relative, N}`): 1.0 leaves room
    /// to write out everything the broker holds in memory.
    MemoryRelative(f64),
}

impl Default for DiskFreeLimit {
    fn default() -> Self {
        DiskFreeLimit::Absolute(DISK_FREE_LIMIT_DEFAULT_BYTES)
    }
}

impl DiskFreeLimit {
    /// The limit in bytes when `total_memory_bytes` are available.
    pub fn bytes(&self, total_memory_bytes: u64) -> u64 {
        match *self {
            DiskFreeLimit::Absolute(bytes) => bytes,
            // `as` saturates: a huge multiple means "always alarmed", not a wrapped number.
            DiskFreeLimit::MemoryRelative(multiple) => {
                (total_memory_bytes as f64 * multiple).round() as u64
            }
        }
    }

    /// # Errors
    /// [`LimitError::DiskMultiple`] for a relative limit that is negative, infinite or NaN.
    pub fn validate(&self) -> Result<(), LimitError> {
        match *self {
            DiskFreeLimit::MemoryRelative(multiple)
                if !(multiple.is_finite() && multiple >= 0.0) =>
            {
                Err(LimitError::DiskMultiple(multiple))
            }
            _ => Ok(()),
        }
    }
}

/// A threshold that cannot be used.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum LimitError {
    #[error("a relative memory watermark must be a fraction from 0.0 to 1.0, not {0}")]
    MemoryFraction(f64),
    #[error("a relative disk free limit must be a non-negative multiple of the memory available, not {0}")]
    DiskMultiple(f64),
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn resource_limit_memory_watermark_bytes() {
        assert_eq!(MemoryWatermark::Relative(0.5).bytes(8 * GIB), 4 * GIB);
        assert_eq!(MemoryWatermark::Relative(0.0).bytes(8 * GIB), 0);
        assert_eq!(MemoryWatermark::Absolute(GIB).bytes(8 * GIB), GIB);
        // More than there is means all of it.
        assert_eq!(MemoryWatermark::Absolute(16 * GIB).bytes(8 * GIB), 8 * GIB);
        assert_eq!(
            MemoryWatermark::default(),
            MemoryWatermark::Relative(VM_MEMORY_HIGH_WATERMARK_RELATIVE_DEFAULT)
        );
    }

    #[test]
    fn resource_limit_disk_free_limit_bytes() {
        assert_eq!(
            DiskFreeLimit::Absolute(50_000_000).bytes(8 * GIB),
            50_000_000
        );
        assert_eq!(DiskFreeLimit::MemoryRelative(1.5).bytes(8 * GIB), 12 * GIB);
        assert_eq!(DiskFreeLimit::MemoryRelative(1e30).bytes(8 * GIB), u64::MAX);
        assert_eq!(
            DiskFreeLimit::default(),
            DiskFreeLimit::Absolute(DISK_FREE_LIMIT_DEFAULT_BYTES)
        );
    }

    #[test]
    fn resource_limit_validation() {
        assert!(MemoryWatermark::Relative(1.0).validate().is_ok());
        assert!(MemoryWatermark::Absolute(u64::MAX).validate().is_ok());
        for fraction in [-0.1, 1.01, f64::NAN] {
            assert!(MemoryWatermark::Relative(fraction).validate().is_err());
        }
        assert!(DiskFreeLimit::MemoryRelative(2.0).validate().is_ok());
        for multiple in [-1.0, f64::INFINITY, f64::NAN] {
            assert!(DiskFreeLimit::MemoryRelative(multiple).validate().is_err());
        }
        assert_eq!(
            MemoryWatermark::Relative(2.0)
                .validate()
                .unwrap_err()
                .to_string(),
            "a relative memory watermark must be a fraction from 0.0 to 1.0, not 2"
        );
    }
}
