//! What can go wrong in `sluice ctl`, and the exit status each failure
//! gives: rabbitmqctl's, which are BSD's `sysexits.h` codes, so scripts
//! written for rabbitmqctl read them the same way.

use std::process::ExitCode;

/// The exit statuses `sluice ctl` uses, with rabbitmqctl's meanings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// The command line is wrong: an unknown command, option or column.
    Usage = 64,
    /// An argument or input file is wrong (not JSON), or names a vhost or
    /// other object that does not exist.
    DataError = 65,
    /// The user named does not exist.
    NoUser = 67,
    /// The node cannot be reached, or a health check failed.
    Unavailable = 69,
    /// The node refused the operation or answered something unexpected.
    Software = 70,
    /// The node did not answer in time.
    TemporaryFailure = 75,
    /// The node refused the credentials, or the user lacks the tag the
    /// operation needs. RabbitMQ's CLI, which authenticates with the Erlang
    /// cookie, has no such case; this is the `sysexits.h` code for it.
    NoPermission = 77,
}

impl From<ExitStatus> for ExitCode {
    fn from(status: ExitStatus) -> Self {
        ExitCode::from(status as u8)
    }
}

/// One failure, printed as one line: `Error: <message>`.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("{0}")]
    Usage(String),

    /// A local input that cannot be used: a file that cannot be read, text
    /// that is not JSON.
    #[error("{0}")]
    Input(String),

    #[error("unable to reach the node at {url}: {reason}")]
    Unreachable { url: String, reason: String },

    #[error("the node at {url} did not answer within {seconds} s")]
    TimedOut { url: String, seconds: u64 },

    /// 401 at login: wrong user name or password.
    #[error("the node refused the credentials of user '{user}': {reason}")]
    CredentialsRefused { user: String, reason: String },

    /// 401 after login: the user lacks a tag or access to a vhost.
    #[error("user '{user}' is not allowed to do this: {reason}")]
    NotAllowed { user: String, reason: String },

    /// 404, naming what the request was about.
    #[error("{what} does not exist")]
    NotFound { what: String, is_user: bool },

    /// The node refused the operation (400 and the like): its reason.
    #[error("{0}")]
    Refused(String),

    /// Something that exists already where the command creates it.
    #[error("{0} already exists")]
    AlreadyExists(String),

    /// A health check the node answered with a failure.
    #[error("{0}")]
    CheckFailed(String),

    /// A 404 for a path itself rather than for an object: an endpoint this
    /// node does not have.
    #[error("the node does not serve {method} {path} (404); it may be older than this command")]
    NotServed { method: String, path: String },

    /// A status or body no version of the API gives.
    #[error("unexpected answer from the node: {0}")]
    Unexpected(String),
}

impl CtlError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            CtlError::Usage(_) => ExitStatus::Usage,
            CtlError::Input(_) => ExitStatus::DataError,
            CtlError::Unreachable { .. } | CtlError::CheckFailed(_) => ExitStatus::Unavailable,
            CtlError::TimedOut { .. } => ExitStatus::TemporaryFailure,
            CtlError::CredentialsRefused { .. } | CtlError::NotAllowed { .. } => {
                ExitStatus::NoPermission
            }
            CtlError::NotFound { is_user: true, .. } => ExitStatus::NoUser,
            CtlError::NotFound { is_user: false, .. } => ExitStatus::DataError,
            CtlError::Refused(_)
            | CtlError::AlreadyExists(_)
            | CtlError::NotServed { .. }
            | CtlError::Unexpected(_) => ExitStatus::Software,
        }
    }
}

pub type CtlResult<T> = Result<T, CtlError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_are_rabbitmqctl_ones() {
        let unreachable = CtlError::Unreachable {
            url: "http://127.0.0.1:15672".into(),
            reason: "connection refused".into(),
        };
        assert_eq!(unreachable.exit_status() as u8, 69);
        assert_eq!(
            unreachable.to_string(),
            "unable to reach the node at http://127.0.0.1:15672: connection refused"
        );
        let missing_user = CtlError::NotFound {
            what: "user 'bob'".into(),
            is_user: true,
        };
        assert_eq!(missing_user.exit_status() as u8, 67);
        assert_eq!(CtlError::Usage(String::new()).exit_status() as u8, 64);
        assert_eq!(CtlError::Refused(String::new()).exit_status() as u8, 70);
    }
}
