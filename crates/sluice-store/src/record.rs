//! A record as stored: `length:u32 checksum:u32 kind:u8 payload`.
//!
//! `length` counts kind and payload; `checksum` is CRC-32 (IEEE) of kind and
//! payload. A record is valid only when both check out, so a write torn by a
//! crash is recognised and dropped at recovery.

use bytes::{BufMut, Bytes, BytesMut};

/// Length and checksum.
pub const RECORD_HEADER_SIZE: usize = 8;

/// No record is larger than this: RabbitMQ's largest `max_message_size`
/// (512 MiB) plus room for the routing fields and properties. A length field
/// above it is corruption, not a reason to allocate.
pub const RECORD_SIZE_MAX: usize = 512 * 1024 * 1024 + 1024 * 1024;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub kind: u8,
    pub payload: Bytes,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    /// Fewer bytes than the header or the length announces: the end of the
    /// written data, or a write torn by a crash.
    #[error("record truncated: {available} bytes available, {needed} needed")]
    Truncated { available: usize, needed: usize },
    #[error("record length {0} is out of bounds")]
    BadLength(usize),
    #[error("record checksum mismatch: stored {stored:08x}, computed {computed:08x}")]
    BadChecksum { stored: u32, computed: u32 },
}

/// Appends one record to `out`.
///
/// # Panics
/// When the record would exceed [`RECORD_SIZE_MAX`]: callers bound message
/// sizes far below it.
pub fn encode_record(out: &mut BytesMut, kind: u8, payload_parts: &[&[u8]]) {
    let length = 1 + payload_parts.iter().map(|part| part.len()).sum::<usize>();
    assert!(
        length <= RECORD_SIZE_MAX,
        "record of {length} bytes exceeds the bound"
    );
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[kind]);
    for part in payload_parts {
        hasher.update(part);
    }
    out.reserve(RECORD_HEADER_SIZE + length);
    out.put_u32(length as u32);
    out.put_u32(hasher.finalize());
    out.put_u8(kind);
    for part in payload_parts {
        out.put_slice(part);
    }
}

/// Reads the record at the start of `bytes`; returns it and its total size.
pub fn decode_record(bytes: &Bytes) -> Result<(Record, usize), RecordError> {
    let (kind, payload, total) = decode_record_slice(bytes)?;
    let payload_start = total - payload.len();
    Ok((
        Record {
            kind,
            payload: bytes.slice(payload_start..total),
        },
        total,
    ))
}

/// Reads the record at the start of `bytes` without copying: its kind, its
/// payload and its total size.
pub fn decode_record_slice(bytes: &[u8]) -> Result<(u8, &[u8], usize), RecordError> {
    if bytes.len() < RECORD_HEADER_SIZE {
        return Err(RecordError::Truncated {
            available: bytes.len(),
            needed: RECORD_HEADER_SIZE,
        });
    }
    let length = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    if length == 0 || length > RECORD_SIZE_MAX {
        return Err(RecordError::BadLength(length));
    }
    let total = RECORD_HEADER_SIZE + length;
    if bytes.len() < total {
        return Err(RecordError::Truncated {
            available: bytes.len(),
            needed: total,
        });
    }
    let stored = u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let computed = crc32fast::hash(&bytes[RECORD_HEADER_SIZE..total]);
    if stored != computed {
        return Err(RecordError::BadChecksum { stored, computed });
    }
    Ok((
        bytes[RECORD_HEADER_SIZE],
        &bytes[RECORD_HEADER_SIZE + 1..total],
        total,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_corruption() {
        let mut out = BytesMut::new();
        encode_record(&mut out, 7, &[b"hello ", b"world"]);
        encode_record(&mut out, 1, &[]);
        let bytes = out.freeze();
        let (first, size) = decode_record(&bytes).unwrap();
        assert_eq!(first.kind, 7);
        assert_eq!(&first.payload[..], b"hello world");
        let (second, _) = decode_record(&bytes.slice(size..)).unwrap();
        assert_eq!(second.kind, 1);
        assert!(second.payload.is_empty());

        // A flipped byte anywhere in kind or payload fails the checksum.
        let mut flipped = BytesMut::from(&bytes[..]);
        flipped[RECORD_HEADER_SIZE + 3] ^= 0x40;
        assert!(matches!(
            decode_record(&flipped.freeze()),
            Err(RecordError::BadChecksum { .. })
        ));
        // A torn tail is reported as truncated.
        assert!(matches!(
            decode_record(&bytes.slice(..size - 1)),
            Err(RecordError::Truncated { .. })
        ));
        // A zero or absurd length is corruption.
        assert_eq!(
            decode_record(&Bytes::from_static(&[0; 12])),
            Err(RecordError::BadLength(0))
        );
        assert!(matches!(
            decode_record(&Bytes::from_static(&[
                0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0
            ])),
            Err(RecordError::BadLength(_))
        ));
    }
}
