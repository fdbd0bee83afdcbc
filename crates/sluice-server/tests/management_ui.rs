//! The management web UI's static files, fetched over real HTTP from the
//! management listener: status codes, content types, caching headers, and
//! the page naming its assets. (interop/ui/check drives the pages in a
//! real browser.)

mod support;

use support::TestServer;

async fn start() -> TestServer {
    TestServer::start_with(|config| {
        config.management.listener.ip = "127.0.0.1".parse().unwrap();
        config.management.listener.port = 0;
        config.management.listener.configured = true;
    })
    .await
}

/// A response's status, the headers the UI's tests read, and its body.
struct Fetched {
    status: u16,
    content_type: Option<String>,
    cache_control: Option<String>,
    etag: Option<String>,
    nosniff: Option<String>,
    content_security_policy: Option<String>,
    body: String,
}

/// GETs `path` without credentials, with `If-None-Match` when given.
async fn fetch(server: &TestServer, path: &str, if_none_match: Option<&str>) -> Fetched {
    let address = server.running().management_address.expect("the API is on");
    let url = format!("http://{address}{path}");
    let if_none_match = if_none_match.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut request = agent.get(&url);
        if let Some(tag) = &if_none_match {
            request = request.header("if-none-match", tag);
        }
        let mut response = request.call().expect("the listener answers");
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let (content_type, cache_control) = (header("content-type"), header("cache-control"));
        let (etag, nosniff) = (header("etag"), header("x-content-type-options"));
        let content_security_policy = header("content-security-policy");
        Fetched {
            status: response.status().as_u16(),
            content_type,
            cache_control,
            etag,
            nosniff,
            content_security_policy,
            body: response.body_mut().read_to_string().unwrap_or_default(),
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn ui_serves_the_page_and_its_assets_with_their_types() {
    let server = start().await;
    let page = fetch(&server, "/", None).await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.content_type.as_deref(),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(page.cache_control.as_deref(), Some("no-cache"));
    assert!(
        page.body.contains(r#"<script src="/ui/app.js""#),
        "{}",
        page.body
    );
    assert!(page.body.contains(r#"<script src="/ui/admin.js""#));
    // The admin pages' links, shown by the script to the tags that may use them.
    assert!(page
        .body
        .contains(r##"<a href="#/users" data-tags="administrator" hidden>"##));
    assert!(page
        .body
        .contains(r##"<a href="#/policies" data-tags="administrator policymaker" hidden>"##));
    assert!(page
        .body
        .contains(r#"<link rel="stylesheet" href="/ui/app.css">"#));
    assert!(page.body.contains(r#"id="login-form""#));

    for (path, content_type, sample) in [
        (
            "/ui/app.js",
            "text/javascript; charset=utf-8",
            "'/api' + path",
        ),
        (
            "/ui/admin.js",
            "text/javascript; charset=utf-8",
            "api('POST', '/definitions'",
        ),
        (
            "/ui/app.css",
            "text/css; charset=utf-8",
            "canvas#rates-chart",
        ),
    ] {
        let asset = fetch(&server, path, None).await;
        assert_eq!(asset.status, 200, "{path}");
        assert_eq!(asset.content_type.as_deref(), Some(content_type), "{path}");
        assert_eq!(asset.cache_control.as_deref(), Some("no-cache"), "{path}");
        assert_eq!(asset.nosniff.as_deref(), Some("nosniff"), "{path}");
        assert!(asset.body.contains(sample), "{path} holds {sample}");
    }
    server.stop().await;
}

/// The page runs only its own files: no inline script or handler, which
/// the policy would block anyway, and no markup made from strings.
#[tokio::test]
async fn ui_keeps_a_strict_content_security_policy() {
    let server = start().await;
    for path in ["/", "/ui/app.js", "/ui/admin.js", "/ui/app.css"] {
        let policy = fetch(&server, path, None).await.content_security_policy;
        let policy = policy.unwrap_or_else(|| panic!("{path} has a policy"));
        assert!(
            policy.starts_with("default-src 'self';"),
            "{path}: {policy}"
        );
        assert!(!policy.contains("unsafe"), "{path}: {policy}");
    }
    let page = fetch(&server, "/", None).await.body;
    assert_eq!(page.matches("<script").count(), 2, "{page}");
    assert_eq!(page.matches("<script src=").count(), 2, "{page}");
    let handler = page.match_indices(" on").any(|(at, _)| {
        let rest = &page[at + 3..];
        let name_length = rest.bytes().take_while(u8::is_ascii_lowercase).count();
        name_length > 0 && rest[name_length..].starts_with('=')
    });
    assert!(!handler, "an onsomething= handler attribute: {page}");
    for path in ["/ui/app.js", "/ui/admin.js"] {
        let script = fetch(&server, path, None).await.body;
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!script.contains(sink), "{path} uses {sink}");
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn ui_assets_revalidate_with_their_etag() {
    let server = start().await;
    for path in ["/ui/app.js", "/ui/admin.js"] {
        let first = fetch(&server, path, None).await;
        let etag = first.etag.expect("an ETag");
        let again = fetch(&server, path, Some(&etag)).await;
        assert_eq!(again.status, 304, "{path}");
        assert!(again.body.is_empty(), "{path}");
        assert_eq!(again.etag.as_deref(), Some(etag.as_str()), "{path}");
        let stale = fetch(&server, path, Some("\"0000000000000000\"")).await;
        assert_eq!(stale.status, 200, "{path}");
        assert_eq!(stale.body, first.body, "{path}");
    }
    server.stop().await;
}

#[tokio::test]
async fn ui_unknown_paths_are_not_found() {
    let server = start().await;
    for path in [
        "/ui/missing.js",
        "/index.php",
        "/ui/",
        "/ui/app.js/x",
        "/ui/admin.js/x",
    ] {
        assert_eq!(fetch(&server, path, None).await.status, 404, "{path}");
    }
    // The API still answers for itself: a 401 without credentials.
    assert_eq!(fetch(&server, "/api/overview", None).await.status, 401);
    server.stop().await;
}
