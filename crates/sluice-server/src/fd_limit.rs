//! The process's file descriptors. Client sockets, queue journals' segment
//! files, the metadata log and the cluster's links all draw on the same
//! limit; running out shows up as EMFILE wherever it happens to strike. At
//! start the soft limit is raised to the hard one, and client connections
//! are held to what is left once the rest has its share.

/// The share of descriptors kept for everything but client connections.
const RESERVED_FRACTION: u64 = 4;
/// At least this many are kept for them, whatever the limit.
const RESERVED_MIN: u64 = 64;

/// Raises the soft limit on open files to the hard one, as RabbitMQ's
/// packaging advises; returns the limit in force and the one before.
pub fn raise_open_files_limit() -> std::io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit write or read only the struct given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    Ok((limit.rlim_cur, before))
}

/// Descriptors the process has open and may open: what RabbitMQ reports
/// as `fd_used` and `fd_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileDescriptors {
    pub used: u64,
    pub total: u64,
}

/// The process's descriptors now.
pub fn file_descriptors() -> std::io::Result<FileDescriptors> {
    // Listing the directory opens one more, which the count leaves out.
    let used = std::fs::read_dir("/proc/self/fd")?
        .count()
        .saturating_sub(1) as u64;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(FileDescriptors {
        used,
        total: limit.rlim_cur,
    })
}

/// The client connections a limit of `open_files` leaves room for.
pub fn connection_budget(open_files: u64) -> usize {
    let reserved = (open_files / RESERVED_FRACTION).max(RESERVED_MIN);
    usize::try_from(open_files.saturating_sub(reserved)).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_limit_leaves_a_share_for_files_and_links() {
        assert_eq!(connection_budget(1024), 768);
        assert_eq!(connection_budget(100), 36);
        assert_eq!(connection_budget(10), 0);
        assert_eq!(connection_budget(1 << 20), 786_432);
    }

    #[test]
    fn fd_limit_is_raised_to_the_hard_limit() {
        let (now, before) = raise_open_files_limit().unwrap();
        assert!(now >= before);
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes only the struct given.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        assert_eq!(limit.rlim_cur, limit.rlim_max);
    }
}
