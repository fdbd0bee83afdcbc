//! The management web UI: a few static files (HTML, CSS and plain
//! JavaScript, no build step) compiled into the binary and served by the
//! management listener at `/` and `/ui/...`. The pages call the same
//! `/api` endpoints as any other client, with the user's basic
//! credentials; nothing here authenticates or reads the broker.
//!
//! The files live in `ui/` beside this module: `index.html`, `app.css`,
//! `app.js` (the session, routing and monitoring pages) and `admin.js`
//! (users, vhosts, policies, definitions). Their paths are fixed, so
//! browsers revalidate them (`no-cache`) with an `ETag` that is a hash of
//! the file, computed at compile time: a new binary with a changed file is
//! fetched again, an unchanged one answers 304.

use std::sync::Arc;

use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, ETAG, IF_NONE_MATCH,
    X_CONTENT_TYPE_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::ManagementState;

/// One embedded file and how it is served.
struct Asset {
    body: &'static [u8],
    content_type: &'static str,
    /// A quoted strong validator: the file's FNV-1a hash.
    etag: &'static str,
}

/// FNV-1a, 64 bits: enough to tell two versions of a file apart, and
/// computable in a `const`.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    let mut index = 0;
    while index < bytes.len() {
        hash ^= bytes[index] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        index += 1;
    }
    hash
}

/// `"` + 16 hex digits + `"`.
const ETAG_LENGTH: usize = 18;

const fn etag_bytes(bytes: &[u8]) -> [u8; ETAG_LENGTH] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hash = fnv1a(bytes);
    let mut tag = [b'"'; ETAG_LENGTH];
    let mut digit = 0;
    while digit < 16 {
        tag[1 + digit] = HEX[((hash >> (60 - 4 * digit)) & 0xf) as usize];
        digit += 1;
    }
    tag
}

/// Declares an embedded file with its content type and its ETag, both
/// fixed at compile time.
macro_rules! asset {
    ($name:ident, $file:literal, $content_type:literal) => {
        static $name: Asset = {
            const BODY: &[u8] = include_bytes!(concat!("ui/", $file));
            const TAG: [u8; ETAG_LENGTH] = etag_bytes(BODY);
            Asset {
                body: BODY,
                content_type: $content_type,
                etag: match std::str::from_utf8(&TAG) {
                    Ok(tag) => tag,
                    Err(_) => panic!("an ETag is ASCII"),
                },
            }
        };
    };
}

asset!(INDEX_HTML, "index.html", "text/html; charset=utf-8");
asset!(APP_JS, "app.js", "text/javascript; charset=utf-8");
asset!(ADMIN_JS, "admin.js", "text/javascript; charset=utf-8");
asset!(APP_CSS, "app.css", "text/css; charset=utf-8");

/// The page may load its own script, style and the API, and nothing else:
/// no inline script, no other origin, no framing.
const CONTENT_SECURITY_POLICY_VALUE: &str = "default-src 'self'; img-src 'self' data:; \
     frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

pub fn routes() -> Router<Arc<ManagementState>> {
    Router::new()
        .route("/", get(|headers: HeaderMap| serve(&INDEX_HTML, headers)))
        .route(
            "/ui/app.js",
            get(|headers: HeaderMap| serve(&APP_JS, headers)),
        )
        .route(
            "/ui/admin.js",
            get(|headers: HeaderMap| serve(&ADMIN_JS, headers)),
        )
        .route(
            "/ui/app.css",
            get(|headers: HeaderMap| serve(&APP_CSS, headers)),
        )
}

async fn serve(asset: &'static Asset, request: HeaderMap) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    headers.insert(ETAG, HeaderValue::from_static(asset.etag));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY_VALUE),
    );
    if matches_etag(&request, asset.etag) {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    (StatusCode::OK, headers, asset.body).into_response()
}

/// Whether `If-None-Match` names the file's current version.
fn matches_etag(request: &HeaderMap, etag: &str) -> bool {
    request
        .get_all(IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|tag| tag.trim().trim_start_matches("W/"))
        .any(|tag| tag == etag || tag == "*")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_are_quoted_hex_and_differ_between_files() {
        for asset in [&INDEX_HTML, &APP_JS, &ADMIN_JS, &APP_CSS] {
            assert_eq!(asset.etag.len(), ETAG_LENGTH);
            assert!(asset.etag.starts_with('"') && asset.etag.ends_with('"'));
            assert!(asset.etag[1..17].bytes().all(|b| b.is_ascii_hexdigit()));
        }
        assert_ne!(INDEX_HTML.etag, APP_JS.etag);
        assert_ne!(APP_JS.etag, ADMIN_JS.etag);
        assert_ne!(APP_JS.etag, APP_CSS.etag);
    }

    #[test]
    fn fnv1a_matches_the_reference_values() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn if_none_match_lists_and_weak_tags_match() {
        let mut request = HeaderMap::new();
        request.insert(IF_NONE_MATCH, HeaderValue::from_static("\"x\", W/\"y\""));
        assert!(matches_etag(&request, "\"y\""));
        assert!(!matches_etag(&request, "\"z\""));
        assert!(!matches_etag(&HeaderMap::new(), "\"y\""));
    }
}
