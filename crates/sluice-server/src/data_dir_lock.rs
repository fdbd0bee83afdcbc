//! One server per data directory. Two servers on one directory would both
//! append to the same journals and rewrite the same definitions, and lose
//! what the other confirmed. The first to start holds an advisory lock on
//! a file in the directory for as long as it runs; a second one exits at
//! once, naming the directory and the process that holds it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The lock file, in the data directory. It holds the holder's process id,
/// for the message a second server prints.
pub const LOCK_FILE: &str = ".lock";

/// The lock, held until dropped (or the process ends, which releases it
/// even after SIGKILL).
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

#[derive(Debug, thiserror::Error)]
pub enum DataDirLockError {
    #[error("data directory {} is in use by another sluice server ({holder}); each server needs a data directory of its own", dir.display())]
    InUse { dir: PathBuf, holder: String },
    #[error("cannot lock the data directory {}: {error}", dir.display())]
    Io { dir: PathBuf, error: std::io::Error },
}

impl DataDirLock {
    /// Locks `data_dir` (created when missing) for this process.
    ///
    /// # Errors
    /// The directory is locked by another server, or cannot be locked.
    pub fn acquire(data_dir: &Path) -> Result<DataDirLock, DataDirLockError> {
        let io = |error| DataDirLockError::Io {
            dir: data_dir.to_owned(),
            error,
        };
        std::fs::create_dir_all(data_dir).map_err(io)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(data_dir.join(LOCK_FILE))
            .map_err(io)?;
        // SAFETY: flock on a descriptor this function owns.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::WouldBlock {
                return Err(io(error));
            }
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => "a process that has not written its id yet".to_owned(),
                pid => format!("pid {pid}"),
            };
            return Err(DataDirLockError::InUse {
                dir: data_dir.to_owned(),
                holder,
            });
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        write!(file, "{}", std::process::id()).map_err(io)?;
        Ok(DataDirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_dir_lock_is_exclusive_until_dropped() {
        let dir = std::env::temp_dir().join(format!("sluice-lock-{}", std::process::id()));
        let first = DataDirLock::acquire(&dir).unwrap();
        let second = DataDirLock::acquire(&dir).unwrap_err().to_string();
        assert!(second.contains(&dir.display().to_string()), "{second}");
        assert!(
            second.contains(&format!("pid {}", std::process::id())),
            "{second}"
        );
        drop(first);
        DataDirLock::acquire(&dir).expect("free again");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
