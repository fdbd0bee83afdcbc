//! The link handshake: both nodes prove they know the cookie without
//! sending it, and each checks it reached the node it meant to.
//!
//! ```text
//! dialer   → Hello     magic, dialer's name, the name it dials, nonce_d
//! acceptor → Challenge nonce_a, HMAC(cookie, "acceptor" names nonce_d nonce_a)
//! dialer   → Proof     HMAC(cookie, "dialer" names nonce_d nonce_a)
//! acceptor → Welcome
//! ```
//!
//! Either side that finds the other's proof wrong sends Refuse with the
//! reason and closes; the other reads it, so both log why. The proofs are
//! HMAC-SHA256, checked in constant time (`ring::hmac::verify`); fresh
//! nonces on both sides mean a recorded handshake cannot be replayed.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use ring::hmac;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::frame::{encode_frame, split_frame, Frame, FrameError, FrameKind, LINK_CHANNEL};
use crate::cookie::Cookie;
use crate::node_name::{NodeName, NODE_NAME_BYTES_MAX};

/// The first bytes of a Hello: the protocol and its version.
const MAGIC: &[u8] = b"SLUICE-LINK/1";

const NONCE_BYTES: usize = 32;

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("the peer's cookie differs from this node's")]
    CookieMismatch,
    #[error("the peer refused the link: {0}")]
    Refused(String),
    #[error("the peer is {found}, not {expected}")]
    WrongNode { expected: String, found: String },
    #[error("{0} is not a member of this cluster")]
    UnknownNode(String),
    #[error("not a Sluice link handshake: {0}")]
    Protocol(String),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The TLS handshake failed: no certificate, one the cluster's
    /// authority did not sign, or a peer that does not speak TLS.
    #[error("TLS: {0}")]
    Tls(std::io::Error),
}

/// What each side knows of the handshake once it succeeded.
pub struct Handshaken {
    /// The node at the other end.
    pub peer: NodeName,
    /// Bytes read past the handshake: the start of the link's traffic.
    pub buffer: BytesMut,
}

/// What a proof signs: the role, then both names and both nonces, each
/// with its length, so no two different handshakes sign the same bytes.
fn proof_message(role: &[u8], names: (&NodeName, &NodeName), nonces: (&[u8], &[u8])) -> Vec<u8> {
    let mut message = role.to_vec();
    for part in [
        names.0.as_str().as_bytes(),
        names.1.as_str().as_bytes(),
        nonces.0,
        nonces.1,
    ] {
        message.extend_from_slice(&(part.len() as u32).to_be_bytes());
        message.extend_from_slice(part);
    }
    message
}

fn proof(
    cookie: &Cookie,
    role: &[u8],
    names: (&NodeName, &NodeName),
    nonces: (&[u8], &[u8]),
) -> hmac::Tag {
    let key = hmac::Key::new(hmac::HMAC_SHA256, cookie.as_bytes());
    hmac::sign(&key, &proof_message(role, names, nonces))
}

/// Checks a peer's proof in constant time.
fn verify(
    cookie: &Cookie,
    role: &[u8],
    names: (&NodeName, &NodeName),
    nonces: (&[u8], &[u8]),
    tag: &[u8],
) -> bool {
    let key = hmac::Key::new(hmac::HMAC_SHA256, cookie.as_bytes());
    hmac::verify(&key, &proof_message(role, names, nonces), tag).is_ok()
}

fn nonce() -> [u8; NONCE_BYTES] {
    rand::random()
}

async fn write_frame<S: AsyncWrite + Unpin>(
    stream: &mut S,
    kind: FrameKind,
    payload: &[u8],
) -> std::io::Result<()> {
    let mut out = BytesMut::new();
    encode_frame(&mut out, LINK_CHANNEL, kind, payload);
    stream.write_all(&out).await
}

async fn read_frame<S: AsyncRead + Unpin>(
    stream: &mut S,
    buffer: &mut BytesMut,
) -> Result<Frame, HandshakeError> {
    loop {
        if let Some(frame) = split_frame(buffer)? {
            if frame.kind == FrameKind::Refuse {
                return Err(HandshakeError::Refused(
                    String::from_utf8_lossy(&frame.payload).into_owned(),
                ));
            }
            return Ok(frame);
        }
        if stream.read_buf(buffer).await? == 0 {
            return Err(HandshakeError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
    }
}

async fn expect<S: AsyncRead + Unpin>(
    stream: &mut S,
    buffer: &mut BytesMut,
    kind: FrameKind,
) -> Result<Bytes, HandshakeError> {
    let frame = read_frame(stream, buffer).await?;
    if frame.kind != kind {
        return Err(HandshakeError::Protocol(format!(
            "expected {kind:?}, got {:?}",
            frame.kind
        )));
    }
    Ok(frame.payload)
}

/// Refuses the link, telling the peer why, and returns the error.
async fn refuse<S: AsyncWrite + Unpin>(stream: &mut S, error: HandshakeError) -> HandshakeError {
    let _ = write_frame(stream, FrameKind::Refuse, error.to_string().as_bytes()).await;
    let _ = stream.shutdown().await;
    error
}

fn put_text(out: &mut BytesMut, text: &str) {
    out.put_u16(text.len() as u16);
    out.put_slice(text.as_bytes());
}

fn get_text(payload: &mut Bytes) -> Result<String, HandshakeError> {
    let short = || HandshakeError::Protocol("truncated hello".to_owned());
    if payload.remaining() < 2 {
        return Err(short());
    }
    let length = payload.get_u16() as usize;
    if length > NODE_NAME_BYTES_MAX || payload.remaining() < length {
        return Err(short());
    }
    let text = payload.split_to(length);
    String::from_utf8(text.to_vec())
        .map_err(|_| HandshakeError::Protocol("a node name that is not UTF-8".to_owned()))
}

fn get_name(payload: &mut Bytes) -> Result<NodeName, HandshakeError> {
    let text = get_text(payload)?;
    text.parse()
        .map_err(|_| HandshakeError::Protocol(format!("invalid node name '{text}'")))
}

/// The dialling side: `local` dials `expected`.
///
/// # Errors
/// A refusal (with the peer's reason), a cookie mismatch, the wrong node
/// at the address, or an I/O error.
pub async fn dial<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    local: &NodeName,
    expected: &NodeName,
    cookie: &Cookie,
) -> Result<Handshaken, HandshakeError> {
    let nonce_d = nonce();
    let mut hello = BytesMut::new();
    hello.put_slice(MAGIC);
    put_text(&mut hello, local.as_str());
    put_text(&mut hello, expected.as_str());
    hello.put_slice(&nonce_d);
    write_frame(stream, FrameKind::Hello, &hello).await?;
    let mut buffer = BytesMut::new();
    let challenge = expect(stream, &mut buffer, FrameKind::Challenge).await?;
    if challenge.len() < NONCE_BYTES {
        return Err(HandshakeError::Protocol("truncated challenge".to_owned()));
    }
    let (nonce_a, tag_a) = challenge.split_at(NONCE_BYTES);
    let names = (local, expected);
    if !verify(cookie, b"acceptor", names, (&nonce_d, nonce_a), tag_a) {
        return Err(refuse(stream, HandshakeError::CookieMismatch).await);
    }
    let tag_d = proof(cookie, b"dialer", names, (&nonce_d, nonce_a));
    write_frame(stream, FrameKind::Proof, tag_d.as_ref()).await?;
    expect(stream, &mut buffer, FrameKind::Welcome).await?;
    Ok(Handshaken {
        peer: expected.clone(),
        buffer,
    })
}

/// The accepting side, `local`, taking a link from one of `members`.
///
/// # Errors
/// As [`dial`]; also a dialer that is not a member, or that meant to reach
/// another node.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    local: &NodeName,
    members: &[NodeName],
    cookie: &Cookie,
) -> Result<Handshaken, HandshakeError> {
    let mut buffer = BytesMut::new();
    let mut hello = expect(stream, &mut buffer, FrameKind::Hello).await?;
    if !hello.starts_with(MAGIC) {
        return Err(HandshakeError::Protocol("no magic".to_owned()));
    }
    hello.advance(MAGIC.len());
    let dialer = get_name(&mut hello)?;
    let dialled = get_text(&mut hello)?;
    if hello.remaining() != NONCE_BYTES {
        return Err(HandshakeError::Protocol("truncated hello".to_owned()));
    }
    let nonce_d = hello;
    if dialled != local.as_str() {
        let error = HandshakeError::WrongNode {
            expected: dialled,
            found: local.to_string(),
        };
        return Err(refuse(stream, error).await);
    }
    if !members.contains(&dialer) {
        return Err(refuse(stream, HandshakeError::UnknownNode(dialer.to_string())).await);
    }
    let nonce_a = nonce();
    let names = (&dialer, local);
    let tag_a = proof(cookie, b"acceptor", names, (&nonce_d, &nonce_a));
    let mut challenge = BytesMut::new();
    challenge.put_slice(&nonce_a);
    challenge.put_slice(tag_a.as_ref());
    write_frame(stream, FrameKind::Challenge, &challenge).await?;
    let tag_d = expect(stream, &mut buffer, FrameKind::Proof).await?;
    if !verify(cookie, b"dialer", names, (&nonce_d, &nonce_a), &tag_d) {
        return Err(refuse(stream, HandshakeError::CookieMismatch).await);
    }
    write_frame(stream, FrameKind::Welcome, b"").await?;
    Ok(Handshaken {
        peer: dialer,
        buffer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> NodeName {
        text.parse().unwrap()
    }

    async fn pair(
        dialer_cookie: &str,
        acceptor_cookie: &str,
    ) -> (
        Result<Handshaken, HandshakeError>,
        Result<Handshaken, HandshakeError>,
    ) {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let one = name("one@127.0.0.1:1");
        let two = name("two@127.0.0.1:2");
        let members = vec![one.clone(), two.clone()];
        let dialer_cookie = Cookie::new(dialer_cookie);
        let acceptor_cookie = Cookie::new(acceptor_cookie);
        tokio::join!(
            dial(&mut a, &one, &two, &dialer_cookie),
            accept(&mut b, &two, &members, &acceptor_cookie)
        )
    }

    #[tokio::test]
    async fn handshake_with_the_same_cookie_names_each_peer() {
        let (dialled, accepted) = pair("secret", "secret").await;
        assert_eq!(dialled.unwrap().peer.as_str(), "two@127.0.0.1:2");
        assert_eq!(accepted.unwrap().peer.as_str(), "one@127.0.0.1:1");
    }

    #[tokio::test]
    async fn handshake_with_different_cookies_fails_on_both_sides_saying_why() {
        let (dialled, accepted) = pair("secret", "other").await;
        assert!(
            matches!(dialled, Err(HandshakeError::CookieMismatch)),
            "{:?}",
            dialled.err()
        );
        match accepted {
            Err(HandshakeError::Refused(reason)) => assert!(reason.contains("cookie"), "{reason}"),
            other => panic!("expected a refusal, got {:?}", other.err()),
        }
    }
}
