//! The secret nodes share, like Erlang's cookie: `SLUICE_COOKIE` in the
//! environment, else the file `$HOME/.sluice.cookie`, created with random
//! content and mode 0400 on first start. Nodes with different secrets
//! refuse each other's links.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The environment variable that carries the cookie.
pub const COOKIE_ENV: &str = "SLUICE_COOKIE";

/// The cookie file's name in the home directory.
pub const COOKIE_FILE: &str = ".sluice.cookie";

/// Random characters in a new cookie: 20 upper-case letters as Erlang
/// makes them, about 94 bits.
const COOKIE_NEW_CHARS: usize = 20;

/// A cookie longer than this is refused: it is read whole into memory.
pub const COOKIE_BYTES_MAX: usize = 4096;

/// The shared secret. Its bytes never appear in logs or on the wire: the
/// link proves knowledge of it with an HMAC.
#[derive(Clone)]
pub struct Cookie(Vec<u8>);

impl std::fmt::Debug for Cookie {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Cookie(..)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CookieError {
    #[error("{COOKIE_ENV} is empty")]
    EmptyEnv,
    #[error("cookie file {0} is empty")]
    EmptyFile(PathBuf),
    #[error("cookie in {0} is longer than {COOKIE_BYTES_MAX} bytes")]
    TooLong(String),
    #[error("no home directory (HOME is not set) for {COOKIE_FILE}; set {COOKIE_ENV}")]
    NoHome,
    #[error("cookie file {path} must be accessible by its owner only (mode {mode:o})")]
    Permissions { path: PathBuf, mode: u32 },
    #[error("cookie file {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl Cookie {
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        Cookie(secret.into())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The node's cookie: `SLUICE_COOKIE`, else `$HOME/.sluice.cookie`.
    ///
    /// # Errors
    /// An empty or oversized cookie, no home directory, a cookie file
    /// others may read (as Erlang refuses one), or an I/O error.
    pub fn load() -> Result<Cookie, CookieError> {
        if let Some(value) = std::env::var_os(COOKIE_ENV) {
            let bytes = value.into_encoded_bytes();
            if bytes.is_empty() {
                return Err(CookieError::EmptyEnv);
            }
            if bytes.len() > COOKIE_BYTES_MAX {
                return Err(CookieError::TooLong(COOKIE_ENV.to_owned()));
            }
            return Ok(Cookie(bytes));
        }
        let home = std::env::var_os("HOME").ok_or(CookieError::NoHome)?;
        Cookie::load_file(&Path::new(&home).join(COOKIE_FILE))
    }

    /// The cookie in `path`, created with random content and mode 0400
    /// when missing. Trailing white space is not part of it.
    pub fn load_file(path: &Path) -> Result<Cookie, CookieError> {
        let io = |error| CookieError::Io {
            path: path.to_owned(),
            error,
        };
        match std::fs::metadata(path) {
            Ok(metadata) => {
                let mode = metadata.permissions().mode() & 0o777;
                if mode & 0o077 != 0 {
                    return Err(CookieError::Permissions {
                        path: path.to_owned(),
                        mode,
                    });
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                create_cookie_file(path).map_err(io)?;
            }
            Err(error) => return Err(io(error)),
        }
        let bytes = std::fs::read(path).map_err(io)?;
        if bytes.len() > COOKIE_BYTES_MAX {
            return Err(CookieError::TooLong(path.display().to_string()));
        }
        let secret = bytes.trim_ascii_end();
        if secret.is_empty() {
            return Err(CookieError::EmptyFile(path.to_owned()));
        }
        Ok(Cookie(secret.to_vec()))
    }
}

/// Writes a new random cookie, readable by its owner only. `create_new`
/// means two nodes starting at once under one home do not overwrite each
/// other's: the second one reads what the first wrote.
fn create_cookie_file(path: &Path) -> std::io::Result<()> {
    use rand::Rng;
    let mut random = rand::rng();
    let secret: String = (0..COOKIE_NEW_CHARS)
        .map(|_| random.random_range(b'A'..=b'Z') as char)
        .collect();
    let mut file = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(path)
    {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(error) => return Err(error),
    };
    file.write_all(secret.as_bytes())?;
    file.sync_all()?;
    tracing::info!(path = %path.display(), "created a new cookie file");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_path(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("sluice-cookie-{}-{}", std::process::id(), name));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(COOKIE_FILE)
    }

    #[test]
    fn cookie_file_is_created_once_owner_read_only_and_reread() {
        let path = temp_path("create");
        let first = Cookie::load_file(&path).unwrap();
        assert_eq!(first.as_bytes().len(), COOKIE_NEW_CHARS);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o400);
        let again = Cookie::load_file(&path).unwrap();
        assert_eq!(first.as_bytes(), again.as_bytes());
        assert_eq!(format!("{first:?}"), "Cookie(..)");
    }

    #[test]
    fn cookie_file_others_may_read_is_refused() {
        let path = temp_path("open");
        std::fs::write(&path, "SECRET\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            Cookie::load_file(&path),
            Err(CookieError::Permissions { mode: 0o644, .. })
        ));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Cookie::load_file(&path).unwrap().as_bytes(), b"SECRET");
    }
}
