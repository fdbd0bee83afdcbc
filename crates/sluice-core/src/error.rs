//! The errors a client can cause, carrying the AMQP reply RabbitMQ would send.

use sluice_wire::reply_code::ReplyCode;

/// An error that becomes a channel.close or connection.close. The text is
/// what follows RabbitMQ's `CODE_NAME - ` prefix, in RabbitMQ's wording
/// where clients or people are known to match on it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} - {text}", code.name())]
pub struct AmqpError {
    pub code: ReplyCode,
    pub text: String,
}

impl AmqpError {
    pub fn new(code: ReplyCode, text: impl Into<String>) -> Self {
        AmqpError {
            code,
            text: text.into(),
        }
    }

    pub fn not_found(text: impl Into<String>) -> Self {
        Self::new(ReplyCode::NotFound, text)
    }

    pub fn access_refused(text: impl Into<String>) -> Self {
        Self::new(ReplyCode::AccessRefused, text)
    }

    pub fn resource_locked(text: impl Into<String>) -> Self {
        Self::new(ReplyCode::ResourceLocked, text)
    }

    pub fn precondition_failed(text: impl Into<String>) -> Self {
        Self::new(ReplyCode::PreconditionFailed, text)
    }

    pub fn not_allowed(text: impl Into<String>) -> Self {
        Self::new(ReplyCode::NotAllowed, text)
    }

    pub fn command_invalid(text: impl Into<String>) -> Self {
        Self::new(ReplyCode::CommandInvalid, text)
    }

    pub fn not_implemented(text: impl Into<String>) -> Self {
        Self::new(ReplyCode::NotImplemented, text)
    }

    pub fn channel_error(text: impl Into<String>) -> Self {
        Self::new(ReplyCode::ChannelError, text)
    }

    pub fn unexpected_frame(text: impl Into<String>) -> Self {
        Self::new(ReplyCode::UnexpectedFrame, text)
    }

    pub fn frame_error(text: impl Into<String>) -> Self {
        Self::new(ReplyCode::FrameError, text)
    }

    pub fn syntax_error(text: impl Into<String>) -> Self {
        Self::new(ReplyCode::SyntaxError, text)
    }

    /// The reply text as sent on the wire, e.g. `NOT_FOUND - no queue 'q' in vhost '/'`.
    pub fn reply_text(&self) -> String {
        self.to_string()
    }
}

pub type AmqpResult<T> = Result<T, AmqpError>;
