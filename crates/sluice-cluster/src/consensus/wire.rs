//! What nodes send each other for consensus. A message is CBOR; one too
//! large for a link frame (a snapshot, a batch of large entries) goes as
//! several fragments, reassembled by the receiver within a bound.

use std::collections::HashMap;

use bytes::{BufMut, Bytes, BytesMut};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};

use super::log_store::entry_size_hint;
use super::membership::MemberChange;
use super::types::{SnapshotMeta, TypeConfig, Vote};
use crate::link::FRAME_PAYLOAD_BYTES_MAX;

#[derive(Serialize, Deserialize)]
pub enum Message {
    Request {
        group: u64,
        id: u64,
        request: Request,
    },
    Response {
        id: u64,
        response: Response,
    },
}

impl Message {
    /// Room for its encoding: the entries, snapshot or proposal it carries
    /// and what surrounds them.
    pub fn size_hint(&self) -> usize {
        let carried = match self {
            Message::Request { request, .. } => match request {
                Request::Append(append) => append.entries.iter().map(entry_size_hint).sum(),
                Request::Snapshot { data, .. } => data.len(),
                Request::Propose(proposal) => proposal.len(),
                Request::Vote(_) | Request::ReadIndex | Request::ChangeMembership(_) => 0,
            },
            Message::Response { response, .. } => match response {
                Response::Proposed(Ok((reply, _))) => reply.len(),
                _ => 0,
            },
        };
        256 + carried
    }
}

#[derive(Serialize, Deserialize)]
pub enum Request {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<TypeConfig>),
    Snapshot {
        vote: Vote,
        meta: SnapshotMeta,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// A member that is not the leader hands a proposal to the leader.
    Propose(#[serde(with = "serde_bytes")] Vec<u8>),
    /// How far a member must apply to have seen every change committed
    /// before now (a read barrier).
    ReadIndex,
    /// A change to the group's members, for its leader to make.
    ChangeMembership(MemberChange),
}

#[derive(Serialize, Deserialize)]
pub enum Response {
    Append(Result<AppendEntriesResponse<TypeConfig>, String>),
    Vote(Result<VoteResponse<TypeConfig>, String>),
    Snapshot(Result<SnapshotResponse<TypeConfig>, String>),
    /// The reply and the index the proposal landed at.
    Proposed(Result<(serde_bytes::ByteBuf, u64), ProposeRefusal>),
    /// The index to apply through; an error when not the leader.
    ReadIndex(Result<u64, ProposeRefusal>),
    /// The change is committed; an error when not the leader.
    MembershipChanged(Result<(), ProposeRefusal>),
    /// The receiver has no such group.
    NoGroup,
}

#[derive(Serialize, Deserialize)]
pub enum ProposeRefusal {
    /// Not (or no longer) the leader: ask again.
    NotLeader,
    Failed(String),
}

/// A fragment's first byte: whether more of its message follow.
const WHOLE: u8 = 0;
const MORE: u8 = 1;
const LAST: u8 = 2;
const FRAGMENT_HEADER_BYTES: usize = 1 + 8;

/// Bytes a node holds of one peer's messages still arriving in fragments:
/// past this the partial messages are dropped (their requests time out).
pub const REASSEMBLY_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Cuts an encoded message into link frame payloads, each with the header
/// that lets the receiver put them back together.
pub fn fragments(message_id: u64, encoded: &[u8]) -> Vec<Bytes> {
    let room = FRAME_PAYLOAD_BYTES_MAX - FRAGMENT_HEADER_BYTES;
    let pieces: Vec<&[u8]> = if encoded.is_empty() {
        vec![encoded]
    } else {
        encoded.chunks(room).collect()
    };
    let count = pieces.len();
    pieces
        .into_iter()
        .enumerate()
        .map(|(index, piece)| {
            let flag = match (count, index + 1 == count) {
                (1, _) => WHOLE,
                (_, true) => LAST,
                _ => MORE,
            };
            let mut payload = BytesMut::with_capacity(FRAGMENT_HEADER_BYTES + piece.len());
            payload.put_u8(flag);
            payload.put_u64(message_id);
            payload.put_slice(piece);
            payload.freeze()
        })
        .collect()
}

/// Puts one peer's fragments back together.
#[derive(Default)]
pub struct Reassembly {
    partial: HashMap<u64, Vec<u8>>,
    bytes: usize,
}

impl Reassembly {
    /// Takes one frame payload; returns a message once it is whole.
    pub fn accept(&mut self, payload: &[u8]) -> Option<Vec<u8>> {
        if payload.len() < FRAGMENT_HEADER_BYTES {
            tracing::warn!("a consensus frame too short for its header");
            return None;
        }
        let flag = payload[0];
        let message_id = u64::from_be_bytes(payload[1..9].try_into().expect("8 bytes"));
        let body = &payload[FRAGMENT_HEADER_BYTES..];
        match flag {
            WHOLE => Some(body.to_vec()),
            MORE | LAST => {
                if self.bytes + body.len() > REASSEMBLY_BYTES_MAX {
                    tracing::warn!(
                        "consensus messages arriving in pieces passed {REASSEMBLY_BYTES_MAX} bytes; dropping them"
                    );
                    self.partial.clear();
                    self.bytes = 0;
                    return None;
                }
                self.bytes += body.len();
                self.partial
                    .entry(message_id)
                    .or_default()
                    .extend_from_slice(body);
                if flag == LAST {
                    let whole = self.partial.remove(&message_id).unwrap_or_default();
                    self.bytes -= whole.len();
                    Some(whole)
                } else {
                    None
                }
            }
            other => {
                tracing::warn!(flag = other, "a consensus frame with an unknown flag");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_messages_of_any_size_come_back_whole() {
        for size in [
            0,
            10,
            FRAME_PAYLOAD_BYTES_MAX,
            3 * FRAME_PAYLOAD_BYTES_MAX + 17,
        ] {
            let message: Vec<u8> = (0..size).map(|index| index as u8).collect();
            let pieces = fragments(7, &message);
            assert!(pieces
                .iter()
                .all(|piece| piece.len() <= FRAME_PAYLOAD_BYTES_MAX));
            let mut reassembly = Reassembly::default();
            let mut whole = None;
            for (index, piece) in pieces.iter().enumerate() {
                let out = reassembly.accept(piece);
                assert_eq!(out.is_some(), index + 1 == pieces.len());
                whole = out.or(whole);
            }
            assert_eq!(whole.unwrap(), message);
            assert_eq!(reassembly.bytes, 0);
        }
    }

    #[test]
    fn wire_interleaved_messages_are_kept_apart() {
        let first: Vec<u8> = vec![1; 2 * FRAME_PAYLOAD_BYTES_MAX];
        let second: Vec<u8> = vec![2; 2 * FRAME_PAYLOAD_BYTES_MAX];
        let (a, b) = (fragments(1, &first), fragments(2, &second));
        let mut reassembly = Reassembly::default();
        let mut done = Vec::new();
        for (x, y) in a.iter().zip(&b) {
            done.extend(reassembly.accept(x));
            done.extend(reassembly.accept(y));
        }
        assert_eq!(done, [first, second]);
    }
}
