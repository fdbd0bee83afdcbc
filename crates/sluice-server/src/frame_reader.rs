//! Reading frames off a socket into one growing buffer.

use std::time::Duration;

use bytes::BytesMut;
use sluice_wire::frame::{split_frame, Frame, FrameError};
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;

use crate::limits::READ_BUFFER_BYTES;

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
    socket: OwnedReadHalf,
    buffer: BytesMut,
    pub frame_max: u32,
}

impl FrameReader {
    pub fn new(socket: OwnedReadHalf, frame_max: u32) -> Self {
        FrameReader {
            socket,
            buffer: BytesMut::with_capacity(READ_BUFFER_BYTES),
            frame_max,
        }
    }

    /// Reads more bytes, waiting at most `timeout` when one is given.
    pub async fn fill(&mut self, timeout: Option<Duration>) -> Result<usize, ReadError> {
        if self.buffer.capacity() - self.buffer.len() < READ_BUFFER_BYTES / 8 {
            self.buffer.reserve(READ_BUFFER_BYTES);
        }
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
        Ok(count)
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

#[derive(Debug, thiserror::Error)]
pub enum HandshakeReadError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Frame(#[from] FrameError),
}
