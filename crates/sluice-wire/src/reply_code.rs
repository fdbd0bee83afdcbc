//! AMQP 0-9-1 reply codes, as RabbitMQ sends them.

/// A reply code from the AMQP 0-9-1 specification. Codes below 400 are
/// informational; the rest close the channel (soft errors) or the whole
/// connection (hard errors), see [`ReplyCode::is_hard_error`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ReplyCode {
    Success = 200,
    ContentTooLarge = 311,
    NoRoute = 312,
    NoConsumers = 313,
    ConnectionForced = 320,
    InvalidPath = 402,
    AccessRefused = 403,
    NotFound = 404,
    ResourceLocked = 405,
    PreconditionFailed = 406,
    FrameError = 501,
    SyntaxError = 502,
    CommandInvalid = 503,
    ChannelError = 504,
    UnexpectedFrame = 505,
    ResourceError = 506,
    NotAllowed = 530,
    NotImplemented = 540,
    InternalError = 541,
}

impl ReplyCode {
    const ALL: [ReplyCode; 19] = [
        ReplyCode::Success,
        ReplyCode::ContentTooLarge,
        ReplyCode::NoRoute,
        ReplyCode::NoConsumers,
        ReplyCode::ConnectionForced,
        ReplyCode::InvalidPath,
        ReplyCode::AccessRefused,
        ReplyCode::NotFound,
        ReplyCode::ResourceLocked,
        ReplyCode::PreconditionFailed,
        ReplyCode::FrameError,
        ReplyCode::SyntaxError,
        ReplyCode::CommandInvalid,
        ReplyCode::ChannelError,
        ReplyCode::UnexpectedFrame,
        ReplyCode::ResourceError,
        ReplyCode::NotAllowed,
        ReplyCode::NotImplemented,
        ReplyCode::InternalError,
    ];

    pub fn code(self) -> u16 {
        self as u16
    }

    /// The reply code with this number, if the specification has one.
    pub fn from_code(code: u16) -> Option<ReplyCode> {
        Self::ALL.into_iter().find(|reply| reply.code() == code)
    }

    /// The name RabbitMQ puts at the front of the reply text, e.g.
    /// `NOT_FOUND - no queue 'q' in vhost '/'`.
    pub fn name(self) -> &'static str {
        match self {
            ReplyCode::Success => "OK",
            ReplyCode::ContentTooLarge => "CONTENT_TOO_LARGE",
            ReplyCode::NoRoute => "NO_ROUTE",
            ReplyCode::NoConsumers => "NO_CONSUMERS",
            ReplyCode::ConnectionForced => "CONNECTION_FORCED",
            ReplyCode::InvalidPath => "INVALID_PATH",
            ReplyCode::AccessRefused => "ACCESS_REFUSED",
            ReplyCode::NotFound => "NOT_FOUND",
            ReplyCode::ResourceLocked => "RESOURCE_LOCKED",
            ReplyCode::PreconditionFailed => "PRECONDITION_FAILED",
            ReplyCode::FrameError => "FRAME_ERROR",
            ReplyCode::SyntaxError => "SYNTAX_ERROR",
            ReplyCode::CommandInvalid => "COMMAND_INVALID",
            ReplyCode::ChannelError => "CHANNEL_ERROR",
            ReplyCode::UnexpectedFrame => "UNEXPECTED_FRAME",
            ReplyCode::ResourceError => "RESOURCE_ERROR",
            ReplyCode::NotAllowed => "NOT_ALLOWED",
            ReplyCode::NotImplemented => "NOT_IMPLEMENTED",
            ReplyCode::InternalError => "INTERNAL_ERROR",
        }
    }

    /// Hard errors close the connection; soft errors close only the channel.
    pub fn is_hard_error(self) -> bool {
        matches!(
            self,
            ReplyCode::ConnectionForced
                | ReplyCode::InvalidPath
                | ReplyCode::FrameError
                | ReplyCode::SyntaxError
                | ReplyCode::CommandInvalid
                | ReplyCode::ChannelError
                | ReplyCode::UnexpectedFrame
                | ReplyCode::ResourceError
                | ReplyCode::NotAllowed
                | ReplyCode::NotImplemented
                | ReplyCode::InternalError
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_code_classes_follow_the_specification() {
        assert_eq!(ReplyCode::NotFound.code(), 404);
        assert!(!ReplyCode::PreconditionFailed.is_hard_error());
        assert!(!ReplyCode::AccessRefused.is_hard_error());
        assert!(ReplyCode::FrameError.is_hard_error());
        assert!(ReplyCode::NotAllowed.is_hard_error());
        assert_eq!(ReplyCode::ResourceLocked.name(), "RESOURCE_LOCKED");
    }

    #[test]
    fn every_reply_code_comes_back_from_its_number() {
        for reply in ReplyCode::ALL {
            assert_eq!(ReplyCode::from_code(reply.code()), Some(reply));
        }
        assert_eq!(ReplyCode::from_code(999), None);
    }
}
