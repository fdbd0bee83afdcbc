//! The AMQP 0-9-1 wire codec, with no async runtime in it.
//!
//! - [`frame`] splits a byte stream into frames without copying payloads.
//! - [`method`] decodes method frames: the hot methods (basic.publish, ack,
//!   nack, reject) by hand into borrowed [`bytes::Bytes`] slices, everything
//!   else through `amq-protocol`.
//! - [`content`] reads a content header while keeping its property bytes raw,
//!   and decodes properties only when routing needs one of them.
//! - [`encode`] writes frames: deliveries, returns and get-ok straight into an
//!   output buffer, control-plane methods through `amq-protocol`.
//! - `field_table` bounds how deep field tables nest before `amq-protocol`'s
//!   recursive parser sees them.
//! - [`reply_code`] names the reply codes sent in channel.close and
//!   connection.close.

pub mod content;
pub mod encode;
mod field_table;
pub mod frame;
pub mod method;
pub mod reply_code;

pub use amq_protocol;
pub use field_table::FIELD_TABLE_DEPTH_MAX;
