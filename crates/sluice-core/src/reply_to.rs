//! Direct reply-to: the `amq.rabbitmq.reply-to` pseudo-queue of RabbitMQ.
//!
//! An RPC client consumes from `amq.rabbitmq.reply-to` (no-ack) and
//! publishes requests with that name as their reply-to property; the broker
//! rewrites it to `amq.rabbitmq.reply-to.TOKEN`, a name for that channel's
//! reply consumer. A reply published to the default exchange with that name
//! as routing key goes straight to the consumer, with no queue in between.
//!
//! The token is random and long enough not to be guessed, so knowing one
//! is the only way to send to a client's channel; it maps to the consumer
//! in the broker's [`ReplyRegistry`]. The registry holds one entry per
//! channel with a reply consumer, so it is bounded by the open channels
//! (`channel_max` per connection); an entry goes when its consumer is
//! cancelled or its channel closes.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use rand::Rng;

use crate::message::Message;

/// The pseudo-queue a reply consumer consumes from and requests name.
pub const REPLY_TO_QUEUE: &str = "amq.rabbitmq.reply-to";

/// The prefix of the names the broker gives reply consumers.
pub const REPLY_TO_PREFIX: &str = "amq.rabbitmq.reply-to.";

/// Random bytes in a token: 192 bits, as unguessable as RabbitMQ's
/// `rabbit_guid:gen_secure` keys (128 bits) with room to spare.
const TOKEN_RANDOM_BYTES: usize = 24;

/// Where replies for one channel's reply consumer are written.
pub trait ReplySink: Send + Sync {
    /// Delivers a reply to the consumer `consumer_tag` (no-ack). Returns
    /// false when the channel cannot take it (closed, or its output buffer
    /// full): the reply is dropped, as RabbitMQ drops replies whose client
    /// went away.
    fn deliver_reply(&self, consumer_tag: &str, message: &Arc<Message>) -> bool;
}

struct ReplyConsumer {
    consumer_tag: Arc<str>,
    sink: Arc<dyn ReplySink>,
}

/// The reply consumers of the node, by token.
#[derive(Default)]
pub struct ReplyRegistry {
    consumers: RwLock<HashMap<Box<str>, ReplyConsumer>>,
}

impl ReplyRegistry {
    /// Registers a channel's reply consumer; returns its token.
    pub fn register(&self, consumer_tag: Arc<str>, sink: Arc<dyn ReplySink>) -> Box<str> {
        let mut consumers = self
            .consumers
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        loop {
            let token = new_token();
            if !consumers.contains_key(&token) {
                consumers.insert(token.clone(), ReplyConsumer { consumer_tag, sink });
                return token;
            }
        }
    }

    pub fn unregister(&self, token: &str) {
        self.consumers
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(token);
    }

    /// Whether a token names a live reply consumer.
    pub fn contains(&self, token: &[u8]) -> bool {
        let Ok(token) = std::str::from_utf8(token) else {
            return false;
        };
        self.consumers
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .contains_key(token)
    }

    /// Delivers a reply to the consumer a token names. Returns whether it
    /// was delivered; an unknown token (its channel is gone) drops it.
    pub fn deliver(&self, token: &[u8], message: &Arc<Message>) -> bool {
        let Ok(token) = std::str::from_utf8(token) else {
            return false;
        };
        let consumer = {
            let consumers = self
                .consumers
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            match consumers.get(token) {
                Some(consumer) => (
                    Arc::clone(&consumer.consumer_tag),
                    Arc::clone(&consumer.sink),
                ),
                None => return false,
            }
        };
        // Delivered outside the registry's lock: the sink takes the
        // channel's locks.
        consumer.1.deliver_reply(&consumer.0, message)
    }
}

/// The part of `amq.rabbitmq.reply-to.TOKEN` after the prefix, if `name`
/// has that form.
pub fn token_of(name: &[u8]) -> Option<&[u8]> {
    name.strip_prefix(REPLY_TO_PREFIX.as_bytes())
}

/// URL-safe base64 of random bytes, so the name is a valid routing key.
fn new_token() -> Box<str> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut random = rand::rng();
    let bytes: [u8; TOKEN_RANDOM_BYTES] = random.random();
    let mut token = String::with_capacity(TOKEN_RANDOM_BYTES * 4 / 3);
    for chunk in bytes.chunks(3) {
        let word = (chunk[0] as u32) << 16 | (chunk[1] as u32) << 8 | chunk[2] as u32;
        for shift in [18, 12, 6, 0] {
            token.push(ALPHABET[(word >> shift) as usize & 63] as char);
        }
    }
    token.into_boxed_str()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl ReplySink for Recorder {
        fn deliver_reply(&self, consumer_tag: &str, message: &Arc<Message>) -> bool {
            self.0.lock().unwrap().push(format!(
                "{consumer_tag}:{}",
                String::from_utf8_lossy(&message.body)
            ));
            true
        }
    }

    fn message(body: &'static str) -> Arc<Message> {
        Arc::new(Message {
            exchange: bytes::Bytes::new(),
            routing_key: bytes::Bytes::new(),
            properties: Default::default(),
            body: bytes::Bytes::from_static(body.as_bytes()),
        })
    }

    #[test]
    fn reply_to_registry_delivers_by_token_until_unregistered() {
        let registry = ReplyRegistry::default();
        let recorder = Arc::new(Recorder::default());
        let token = registry.register(Arc::from("ctag"), recorder.clone());
        let other = registry.register(Arc::from("other"), recorder.clone());
        assert_ne!(token, other);
        assert_eq!(token.len(), 32);
        assert!(token
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_'));
        assert!(registry.deliver(token.as_bytes(), &message("one")));
        assert!(!registry.deliver(b"guessed", &message("lost")));
        registry.unregister(&token);
        assert!(!registry.contains(token.as_bytes()));
        assert!(!registry.deliver(token.as_bytes(), &message("late")));
        assert_eq!(*recorder.0.lock().unwrap(), vec!["ctag:one".to_owned()]);
        let name = format!("{REPLY_TO_PREFIX}{other}");
        assert_eq!(token_of(name.as_bytes()), Some(other.as_bytes()));
        assert_eq!(token_of(b"amq.rabbitmq.reply-to"), None);
    }
}
