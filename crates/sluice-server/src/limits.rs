//! Every bound the server puts on a buffer, queue or loop, with the reason.

/// Bytes offered to one socket read, at most. Large enough that one read
/// picks up dozens of 1 KB publishes; the buffer is shared by the message
/// bodies sliced out of it, so it is allocated afresh once they hold on to it.
pub const READ_BUFFER_MAX_BYTES: usize = 64 * 1024;

/// Bytes offered to one socket read at first, and the floor the size shrinks
/// back to on a quiet connection: a thousand mostly idle publishers should
/// not pin 64 KiB each.
pub const READ_BUFFER_MIN_BYTES: usize = 4 * 1024;

/// Output buffers larger than this are not kept for reuse after a write, so
/// one burst does not leave a large buffer behind for the connection's life.
pub const OUTBOX_RETAINED_BYTES_MAX: usize = 256 * 1024;

/// Deliveries stop going into a connection's output buffer past this size,
/// until the writer has drained it. It bounds the memory a slow consumer can
/// pin (beyond its prefetch) and keeps write batches large under load.
pub const OUTBOX_DELIVERY_BYTES_MAX: usize = 1024 * 1024;

/// Past the node-wide bound on bytes in flight to consumers
/// (`delivery_buffer_total_max`), a connection's buffer still takes
/// deliveries up to this size: each consumer keeps a share, so one burst
/// cannot starve the rest, and the total grows by at most this much per
/// connection beyond the bound.
pub const OUTBOX_DELIVERY_FLOOR_BYTES: usize = 64 * 1024;

/// The reader stops reading a client's frames while its output buffer holds
/// more than this: a client that publishes but never reads its socket (and
/// so never takes its confirms or replies) is slowed down instead of growing
/// the buffer without bound.
pub const OUTBOX_READER_PAUSE_BYTES: usize = 4 * 1024 * 1024;

/// A channel in tx mode buffers publishes until commit; past this many bytes
/// of uncommitted bodies the channel is closed with PRECONDITION_FAILED.
pub const TX_UNCOMMITTED_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Bodies under way (announced by their content header, not yet whole) may
/// hold this share of the memory watermark across the node: room for
/// several large messages at once, with most of the watermark left for
/// queues (see `bodies_under_way`).
pub const BODIES_UNDER_WAY_WATERMARK_DIVISOR: u64 = 4;

/// A closing connection's unacked messages go back to each queue in slices
/// of at most this many (see `requeue_in_slices`). Each slice is one merge
/// into the queue's ready messages, a few milliseconds under its lock.
pub const REQUEUE_SLICE_MAX: usize = 65_536;

/// Open transactions across the node may hold this share of the memory
/// watermark in uncommitted messages (see `uncommitted`).
pub const TX_UNCOMMITTED_WATERMARK_DIVISOR: u64 = 4;

/// A peer that does not answer our connection.close within this time is
/// disconnected anyway.
pub const CLOSE_OK_TIMEOUT_MS: u64 = 3_000;

const _: () = assert!(OUTBOX_DELIVERY_BYTES_MAX < OUTBOX_READER_PAUSE_BYTES);
const _: () = assert!(OUTBOX_DELIVERY_FLOOR_BYTES < OUTBOX_DELIVERY_BYTES_MAX);
const _: () = assert!(READ_BUFFER_MIN_BYTES < READ_BUFFER_MAX_BYTES);
