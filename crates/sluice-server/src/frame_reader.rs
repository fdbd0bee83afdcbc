//! Reading frames off a socket into one growing buffer.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use sluice_wire::frame::{split_frame, Frame, FrameError};
use tokio::io::AsyncReadExt;

use crate::client_stream::ClientReadHalf;
use crate::connection_registry::ConnectionStats;
use crate::limits::{READ_BUFFER_MAX_BYTES, READ_BUFFER_MIN_BYTES};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("connection closed by peer")]
    Closed,
    #[error("socket read failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("no data from peer for {0:?}")]
    Timeout(Duration),
}

pub struct FrameReader {
    socket: ClientReadHalf,
    buffer: BytesMut,
    /// How much room the next read gets: doubles while reads fill what they
    /// are offered, halves while they use little of it.
    read_size: usize,
    /// The last read took all the room it was offered: the socket likely
    /// has more waiting.
    last_read_full: bool,
    pub frame_max: u32,
    /// Counts the bytes read once the connection is registered.
    stats: Option<Arc<ConnectionStats>>,
}

impl FrameReader {
    pub fn new(socket: ClientReadHalf, frame_max: u32) -> Self {
        FrameReader {
            socket,
            buffer: BytesMut::new(),
            read_size: READ_BUFFER_MIN_BYTES,
            last_read_full: false,
            frame_max,
            stats: None,
        }
    }

    /// Counts every byte read from now on into `stats`.
    pub fn count_into(&mut self, stats: Arc<ConnectionStats>) {
        self.stats = Some(stats);
    }

    /// Reads more bytes, waiting at most `timeout` when one is given.
    pub async fn fill(&mut self, timeout: Option<Duration>) -> Result<usize, ReadError> {
        if self.buffer.capacity() - self.buffer.len() < self.read_size / 2 {
            self.buffer.reserve(self.read_size);
        }
        let offered = self.buffer.capacity() - self.buffer.len();
        let read = self.socket.read_buf(&mut self.buffer);
        let count = match timeout {
            Some(limit) => tokio::time::timeout(limit, read)
                .await
                .map_err(|_| ReadError::Timeout(limit))??,
            None => read.await?,
        };
        if count == 0 {
            return Err(ReadError::Closed);
        }
        if let Some(stats) = &self.stats {
            stats.received_bytes.add(count as u64);
        }
        self.read_size = next_read_size(self.read_size, offered, count);
        self.last_read_full = count >= offered;
        Ok(count)
    }

    /// Whether the last read filled all the room it had.
    pub fn last_read_was_full(&self) -> bool {
        self.last_read_full
    }

    /// The next whole frame already buffered, if any.
    pub fn next_buffered(&mut self) -> Result<Option<Frame>, FrameError> {
        split_frame(&mut self.buffer, self.frame_max)
    }

    /// Waits for the next frame.
    pub async fn next_frame(
        &mut self,
        timeout: Option<Duration>,
    ) -> Result<Frame, HandshakeReadError> {
        loop {
            if let Some(frame) = self.next_buffered()? {
                return Ok(frame);
            }
            self.fill(timeout).await?;
        }
    }

    /// Reads exactly `count` raw bytes (the protocol header).
    pub async fn read_raw(
        &mut self,
        count: usize,
        timeout: Option<Duration>,
    ) -> Result<BytesMut, ReadError> {
        while self.buffer.len() < count {
            self.fill(timeout).await?;
        }
        Ok(self.buffer.split_to(count))
    }
}

/// Grows the read size while reads fill the room they get and shrinks it
/// while they use a small part, within the read buffer bounds.
fn next_read_size(read_size: usize, offered: usize, count: usize) -> usize {
    if count >= offered {
        (read_size * 2).min(READ_BUFFER_MAX_BYTES)
    } else if count < read_size / 4 {
        (read_size / 2).max(READ_BUFFER_MIN_BYTES)
    } else {
        read_size
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HandshakeReadError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Frame(#[from] FrameError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_reader_read_size_adapts_within_bounds() {
        let mut size = READ_BUFFER_MIN_BYTES;
        for _ in 0..10 {
            size = next_read_size(size, size, size);
        }
        assert_eq!(size, READ_BUFFER_MAX_BYTES);
        size = next_read_size(size, size, size / 2);
        assert_eq!(
            size, READ_BUFFER_MAX_BYTES,
            "a half-full read keeps the size"
        );
        for _ in 0..10 {
            size = next_read_size(size, size, 100);
        }
        assert_eq!(size, READ_BUFFER_MIN_BYTES);
    }
}
