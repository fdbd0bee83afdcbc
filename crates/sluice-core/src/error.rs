//! The errors a client can cause, carrying the AMQP reply RabbitMQ would send.

use amq_protocol::types::ShortString;
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

    /// The reply text as sent on the wire, e.g. `NOT_FOUND - no queue 'q' in vhost '/'`,
    /// cut to fit the protocol's short string as RabbitMQ cuts it
    /// (`amqp_exception_explanation`): past 255 bytes, the first 252 and `...`. Texts
    /// quote names clients chose, up to 255 bytes each, so they can be longer.
    pub fn reply_text(&self) -> ShortString {
        ShortString::try_new(fit_reply_text(self.to_string()))
            .expect("the text was cut to a short string's length")
    }
}

pub type AmqpResult<T> = Result<T, AmqpError>;

/// A reply-text's longest length in bytes: an AMQP short string.
pub const REPLY_TEXT_BYTES_MAX: usize = 255;

/// What is kept of a longer text before the `...`.
const REPLY_TEXT_KEPT_BYTES: usize = REPLY_TEXT_BYTES_MAX - 3;

/// `text` cut to [`REPLY_TEXT_BYTES_MAX`] bytes, at a character boundary.
pub fn fit_reply_text(mut text: String) -> String {
    if text.len() <= REPLY_TEXT_BYTES_MAX {
        return text;
    }
    let mut end = REPLY_TEXT_KEPT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str("...");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_text_longer_than_a_short_string_is_cut_with_an_ellipsis() {
        let short = AmqpError::not_found("no queue 'q' in vhost '/'");
        assert_eq!(
            short.reply_text().as_str(),
            "NOT_FOUND - no queue 'q' in vhost '/'"
        );
        let name = "é".repeat(200);
        let long = AmqpError::precondition_failed(format!("inequivalent arg for queue '{name}'"));
        let text = long.reply_text();
        assert!(text.as_str().len() <= REPLY_TEXT_BYTES_MAX);
        assert!(text.as_str().len() >= REPLY_TEXT_BYTES_MAX - 4);
        assert!(text
            .as_str()
            .starts_with("PRECONDITION_FAILED - inequivalent arg"));
        assert!(text.as_str().ends_with("..."));
    }
}
