//! One link that passed its handshake: a writer that batches what senders
//! queued and sends heartbeats when there is nothing else, and a reader
//! that hands each data frame to its channel's subscriber and declares the
//! peer gone when nothing at all arrived for the heartbeat timeout.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use super::frame::{encode_frame, split_frame, FrameError, FrameKind, LINK_CHANNEL};
use super::subscribers::Subscribers;
use crate::node_name::NodeName;

/// Bytes queued for one peer and not yet written to its socket. Past it,
/// senders wait: a slow or hung peer costs its senders time, not the node
/// memory. 8 MiB is a few milliseconds of a fast link's traffic.
pub const LINK_SEND_BUFFER_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Frames queued for one peer, whatever their size: the same bound for many
/// tiny frames.
pub const LINK_SEND_QUEUE_FRAMES: usize = 4096;

/// What the writer gathers from the queue into one socket write.
const WRITE_BATCH_BYTES: usize = 256 * 1024;

/// Room the reader makes in its buffer before a read when less than
/// [`READ_ROOM_MIN`] is left. Frames leave the buffer as they are split
/// off, and a buffer left with no room reads 64 bytes at a time (then only
/// the rest of the frame it has begun): three or more reads per write the
/// peer made, where one will do.
const READ_BYTES: usize = 64 * 1024;
const READ_ROOM_MIN: usize = 8 * 1024;

const _: () = assert!(super::frame::FRAME_PAYLOAD_BYTES_MAX <= LINK_SEND_BUFFER_BYTES_MAX);

/// A frame waiting for the writer, holding its share of the send budget
/// until it is written.
struct Outgoing {
    channel: u16,
    payload: Bytes,
    _budget: OwnedSemaphorePermit,
}

/// Why a link ended.
#[derive(Debug, thiserror::Error)]
pub enum LinkDown {
    #[error("nothing received for {0:?}: the peer is dead or hung")]
    Silent(Duration),
    #[error("the peer closed the connection")]
    Closed,
    #[error("the peer sent a bad frame: {0}")]
    Frame(#[from] FrameError),
    #[error("the peer refused the link: {0}")]
    Refused(String),
    #[error("the peer sent a {0:?} frame after the handshake")]
    Unexpected(FrameKind),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("the node is shutting down")]
    Shutdown,
}

/// The sending side of an up link; cloned by everyone who sends to it.
#[derive(Clone)]
pub struct LinkSender {
    queue: mpsc::Sender<Outgoing>,
    budget: Arc<Semaphore>,
}

impl LinkSender {
    /// Queues `payload` for `channel`, waiting while the peer's send buffer
    /// is full. False when the link went down meanwhile.
    pub async fn send(&self, channel: u16, payload: Bytes) -> bool {
        let cost = payload.len().max(1) as u32;
        let Ok(budget) = Arc::clone(&self.budget).acquire_many_owned(cost).await else {
            return false;
        };
        self.queue
            .send(Outgoing {
                channel,
                payload,
                _budget: budget,
            })
            .await
            .is_ok()
    }
}

/// The receiving end of a new link's send queue, for [`run`].
pub struct LinkQueue(mpsc::Receiver<Outgoing>);

/// A send queue for a link about to run.
pub fn send_queue() -> (LinkSender, LinkQueue) {
    let (queue, receiver) = mpsc::channel(LINK_SEND_QUEUE_FRAMES);
    let sender = LinkSender {
        queue,
        budget: Arc::new(Semaphore::new(LINK_SEND_BUFFER_BYTES_MAX)),
    };
    (sender, LinkQueue(receiver))
}

/// Runs a link until it goes down: the peer is silent past
/// `heartbeat_timeout`, closes, fails, or `stop` resolves.
pub async fn run(
    (read_half, write_half): (impl AsyncRead + Unpin, impl AsyncWrite + Unpin),
    buffer: BytesMut,
    queue: LinkQueue,
    (peer, generation, subscribers): (&NodeName, u64, &Subscribers),
    heartbeat_timeout: Duration,
    stop: impl std::future::Future<Output = ()>,
) -> LinkDown {
    let interval = heartbeat_timeout / 4;
    tokio::select! {
        down = read_loop(read_half, buffer, (peer, generation), subscribers, heartbeat_timeout) => down,
        down = write_loop(write_half, queue, interval) => down,
        () = stop => LinkDown::Shutdown,
    }
}

async fn read_loop(
    mut read_half: impl AsyncRead + Unpin,
    mut buffer: BytesMut,
    (peer, generation): (&NodeName, u64),
    subscribers: &Subscribers,
    heartbeat_timeout: Duration,
) -> LinkDown {
    loop {
        loop {
            let frame = match split_frame(&mut buffer) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(error) => return LinkDown::Frame(error),
            };
            match frame.kind {
                FrameKind::Data => {
                    subscribers
                        .deliver(peer, generation, frame.channel, frame.payload)
                        .await
                }
                FrameKind::Heartbeat => {}
                FrameKind::Refuse => {
                    return LinkDown::Refused(String::from_utf8_lossy(&frame.payload).into_owned())
                }
                other => return LinkDown::Unexpected(other),
            }
        }
        if buffer.capacity() - buffer.len() < READ_ROOM_MIN {
            buffer.reserve(READ_BYTES);
        }
        match tokio::time::timeout(heartbeat_timeout, read_half.read_buf(&mut buffer)).await {
            Err(_) => return LinkDown::Silent(heartbeat_timeout),
            Ok(Ok(0)) => return LinkDown::Closed,
            Ok(Ok(_)) => {}
            Ok(Err(error)) => return LinkDown::Io(error),
        }
    }
}

async fn write_loop(
    mut write_half: impl AsyncWrite + Unpin,
    queue: LinkQueue,
    interval: Duration,
) -> LinkDown {
    let mut queue = queue.0;
    let mut out = BytesMut::with_capacity(WRITE_BATCH_BYTES);
    let mut written: Vec<Outgoing> = Vec::new();
    loop {
        match tokio::time::timeout(interval, queue.recv()).await {
            Err(_) => encode_frame(&mut out, LINK_CHANNEL, FrameKind::Heartbeat, b""),
            // Every sender is gone: the node dropped the link.
            Ok(None) => return LinkDown::Shutdown,
            Ok(Some(first)) => {
                let mut next = Some(first);
                while let Some(outgoing) = next {
                    encode_frame(
                        &mut out,
                        outgoing.channel,
                        FrameKind::Data,
                        &outgoing.payload,
                    );
                    written.push(outgoing);
                    next = if out.len() < WRITE_BATCH_BYTES {
                        queue.try_recv().ok()
                    } else {
                        None
                    };
                }
            }
        }
        // Flushed: over TLS, written bytes wait in the session until then.
        if let Err(error) = write_half.write_all(&out).await {
            return LinkDown::Io(error);
        }
        if let Err(error) = write_half.flush().await {
            return LinkDown::Io(error);
        }
        out.clear();
        // Their budget is released only now: bytes count until written.
        written.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::io::ReadBuf;

    use super::*;

    /// A peer's bytes, all there at once, handed out as a socket would:
    /// as much as the reader has room for. Counts the reads.
    struct Socket {
        bytes: Bytes,
        reads: usize,
    }

    impl AsyncRead for Socket {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            out: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            self.reads += 1;
            let taken = out.remaining().min(self.bytes.len());
            let piece = self.bytes.split_to(taken);
            out.put_slice(&piece);
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn link_reader_takes_what_the_peer_wrote_in_few_reads() {
        const FRAMES: usize = 16;
        let payload = vec![7u8; 3 * 1024];
        let mut written = BytesMut::new();
        for _ in 0..FRAMES {
            encode_frame(&mut written, 1, FrameKind::Data, &payload);
        }
        let mut socket = Socket {
            bytes: written.freeze(),
            reads: 0,
        };
        let subscribers = Subscribers::default();
        let mut received = subscribers.subscribe(1);
        let peer: NodeName = "peer@127.0.0.1:25672".parse().unwrap();
        let down = read_loop(
            &mut socket,
            BytesMut::new(),
            (&peer, 1),
            &subscribers,
            Duration::from_secs(5),
        )
        .await;
        assert!(matches!(down, LinkDown::Closed), "{down:?}");
        for _ in 0..FRAMES {
            assert_eq!(received.try_recv().unwrap().payload, payload);
        }
        // 48 KiB of frames, then the read that finds the peer closed: a
        // reader left without room in its buffer reads them 64 bytes and
        // then the rest of a frame at a time, 33 reads.
        assert!(socket.reads <= 3, "{} reads", socket.reads);
    }
}
