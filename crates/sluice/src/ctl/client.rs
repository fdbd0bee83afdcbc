//! A small blocking client of one node's management API: it builds URLs
//! with percent-encoded path segments, sends basic credentials, bounds
//! every answer, and turns the API's error statuses into [`CtlError`]s
//! that name what the request was about.

use std::io::ErrorKind;
use std::time::Duration;

use base64::Engine as _;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::Value;

use super::error::{CtlError, CtlResult};

/// `management.tcp.port`'s default, where a node serves the API.
pub const MANAGEMENT_PORT_DEFAULT: u16 = 15672;

/// The largest answer read: a definitions export of a deployment with a
/// hundred thousand queues is some tens of MiB, so this leaves room while
/// keeping a misdirected request (a file server, a stream) from filling
/// memory.
const RESPONSE_BYTES_MAX: u64 = 256 * 1024 * 1024;

/// Everything but RFC 3986's unreserved characters is encoded, so that a
/// vhost "/" becomes "%2F" and a connection name's spaces and '>' survive.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `/api/` followed by `segments`, each percent-encoded.
pub fn api_path(segments: &[&str]) -> String {
    let mut path = String::from("/api");
    for segment in segments {
        path.push('/');
        path.extend(utf8_percent_encode(segment, PATH_SEGMENT));
    }
    path
}

/// The API's base URL from `-n`: `http://HOST:PORT` as it is, `HOST:PORT`,
/// `HOST` (on port 15672), or rabbitmqctl's `NAME@HOST` (the host's API on
/// port 15672).
///
/// # Errors
/// [`CtlError::Usage`] for a scheme other than http, a port that is not a
/// number, or `NAME@HOST:PORT` (a Sluice node name, whose port is the
/// inter-node one, not the API's).
pub fn base_url(node: &str) -> CtlResult<String> {
    let node = node.trim();
    if let Some(rest) = node.strip_prefix("http://") {
        return Ok(format!("http://{}", rest.trim_end_matches('/')));
    }
    if node.contains("://") {
        return Err(CtlError::Usage(format!(
            "'{node}' is not an http:// URL; the management API is plain HTTP"
        )));
    }
    let (host, port) = match node.split_once('@') {
        Some((_, host)) if host.contains(':') && !host.starts_with('[') => {
            return Err(CtlError::Usage(format!(
                "'{node}' is a node name, whose port is the inter-node one; \
                 give the management API as HOST:PORT"
            )))
        }
        Some((_, host)) => (host, None),
        None => split_host_port(node)?,
    };
    if host.is_empty() {
        return Err(CtlError::Usage(format!("'{node}' names no host")));
    }
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    Ok(format!(
        "http://{host}:{}",
        port.unwrap_or(MANAGEMENT_PORT_DEFAULT)
    ))
}

/// `HOST:PORT`, `[V6]:PORT`, `[V6]`, or `HOST`; a bare IPv6 address has
/// no port.
fn split_host_port(node: &str) -> CtlResult<(&str, Option<u16>)> {
    let (host, port) = if node.starts_with('[') {
        match node.split_once(']') {
            Some((host, rest)) => (&node[..host.len() + 1], rest.strip_prefix(':')),
            None => return Err(CtlError::Usage(format!("'{node}' lacks its ']'"))),
        }
    } else if node.matches(':').count() == 1 {
        let (host, port) = node.split_once(':').expect("one colon");
        (host, Some(port))
    } else {
        (node, None)
    };
    let port = port
        .map(|port| {
            port.parse::<u16>()
                .map_err(|_| CtlError::Usage(format!("'{port}' in '{node}' is not a port")))
        })
        .transpose()?;
    Ok((host, port))
}

/// What a request is about, to say what is missing when the node answers
/// 404 (its own body says only "Not Found").
#[derive(Clone, Debug)]
pub enum Subject {
    /// The node itself: its overview, checks, node-wide listings.
    Node,
    Vhost(String),
    User(String),
    Connection(String),
    /// An object in a vhost (a queue, a policy, permissions): when it is
    /// missing, the vhost may be what is.
    InVhost {
        vhost: String,
        what: String,
    },
}

impl Subject {
    pub fn queue(vhost: &str, name: &str) -> Subject {
        Subject::InVhost {
            vhost: vhost.to_owned(),
            what: format!("queue '{name}' in vhost '{vhost}'"),
        }
    }

    fn description(&self) -> String {
        match self {
            Subject::Node => "the node's resource".to_owned(),
            Subject::Vhost(name) => format!("vhost '{name}'"),
            Subject::User(name) => format!("user '{name}'"),
            Subject::Connection(name) => format!("connection '{name}'"),
            Subject::InVhost { what, .. } => what.clone(),
        }
    }
}

/// One answer: the request it answers, its status and body text.
#[derive(Debug)]
pub struct Answer {
    pub method: String,
    pub path: String,
    pub status: u16,
    pub text: String,
}

impl Answer {
    pub fn json(&self) -> CtlResult<Value> {
        serde_json::from_str(&self.text)
            .map_err(|error| CtlError::Unexpected(format!("a body that is not JSON ({error})")))
    }
}

/// A client of one node, as one user.
pub struct Client {
    agent: ureq::Agent,
    base_url: String,
    user: String,
    authorization: String,
    timeout_seconds: u64,
}

impl Client {
    pub fn new(base_url: String, user: &str, password: &str, timeout_seconds: u64) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(timeout_seconds)))
            .user_agent(concat!("sluice-ctl/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        Client {
            agent,
            base_url,
            user: user.to_owned(),
            authorization: format!("Basic {token}"),
            timeout_seconds,
        }
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Sends one request and reads its answer, whatever its status.
    ///
    /// # Errors
    /// [`CtlError::Unreachable`] when no connection could be made,
    /// [`CtlError::TimedOut`] past `--timeout`, [`CtlError::Unexpected`]
    /// for a broken or oversized answer.
    pub fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        reason: Option<&str>,
    ) -> CtlResult<Answer> {
        let mut builder = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base_url))
            .header("authorization", &self.authorization)
            .header("accept", "application/json");
        if body.is_some() {
            builder = builder.header("content-type", "application/json");
        }
        if let Some(reason) = reason {
            builder = builder.header("x-reason", reason);
        }
        let request = builder
            .body(body.unwrap_or_default())
            .map_err(|error| CtlError::Usage(format!("cannot build the request: {error}")))?;
        let mut response = self
            .agent
            .run(request)
            .map_err(|error| self.transport_error(error))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(RESPONSE_BYTES_MAX)
            .read_to_string()
            .map_err(|error| self.transport_error(error))?;
        Ok(Answer {
            method: method.to_owned(),
            path: path.to_owned(),
            status,
            text,
        })
    }

    fn transport_error(&self, error: ureq::Error) -> CtlError {
        let unreachable = |reason: String| CtlError::Unreachable {
            url: self.base_url.clone(),
            reason,
        };
        match error {
            ureq::Error::Timeout(_) => CtlError::TimedOut {
                url: self.base_url.clone(),
                seconds: self.timeout_seconds,
            },
            ureq::Error::Io(error) => unreachable(match error.kind() {
                ErrorKind::ConnectionRefused => "connection refused".to_owned(),
                ErrorKind::ConnectionReset => "connection reset".to_owned(),
                ErrorKind::TimedOut => "timed out".to_owned(),
                _ => error.to_string(),
            }),
            ureq::Error::HostNotFound => unreachable("host not found".to_owned()),
            ureq::Error::ConnectionFailed => unreachable("connection failed".to_owned()),
            other => CtlError::Unexpected(other.to_string()),
        }
    }

    /// Sends a request and requires a 2xx answer.
    ///
    /// # Errors
    /// As [`Client::send`], and the API's refusals as
    /// [`Client::refusal`] words them.
    pub fn expect_success(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        subject: &Subject,
    ) -> CtlResult<Answer> {
        let answer = self.send(method, path, body, None)?;
        if (200..300).contains(&answer.status) {
            Ok(answer)
        } else {
            Err(self.refusal(&answer, subject))
        }
    }

    /// GET, as JSON.
    pub fn get(&self, path: &str, subject: &Subject) -> CtlResult<Value> {
        self.expect_success("GET", path, None, subject)?.json()
    }

    /// Whether GET `path` finds something (200) or not (404).
    pub fn exists(&self, path: &str, subject: &Subject) -> CtlResult<bool> {
        let answer = self.send("GET", path, None, None)?;
        match answer.status {
            404 => Ok(false),
            200..300 => Ok(true),
            _ => Err(self.refusal(&answer, subject)),
        }
    }

    pub fn put(&self, path: &str, body: &Value, subject: &Subject) -> CtlResult<()> {
        self.expect_success("PUT", path, Some(body.to_string()), subject)
            .map(drop)
    }

    pub fn delete(&self, path: &str, subject: &Subject) -> CtlResult<()> {
        self.expect_success("DELETE", path, None, subject).map(drop)
    }

    /// What a non-2xx answer means: credentials refused (401 at login),
    /// not allowed (401 after it), missing (404, naming `subject`, or its
    /// vhost when that is what is missing), or the API's reason.
    pub fn refusal(&self, answer: &Answer, subject: &Subject) -> CtlError {
        let body = answer.json().unwrap_or(Value::Null);
        let reason = reason_text(&body).unwrap_or_else(|| answer.text.trim().to_owned());
        match answer.status {
            401 if body["error"] == "not_authorized" => CtlError::CredentialsRefused {
                user: self.user.clone(),
                reason,
            },
            401 => CtlError::NotAllowed {
                user: self.user.clone(),
                reason,
            },
            404 => self.not_found(answer, subject),
            400..500 => CtlError::Refused(reason),
            status => CtlError::Unexpected(format!("status {status}: {reason}")),
        }
    }

    /// A 404 about `subject`. Where the subject lies in a vhost, the vhost
    /// is looked up: it may be what is missing. When it exists, a 404 for
    /// the vhost's own listing or for a PUT (which creates) cannot be about
    /// the object: the node does not serve that path at all.
    fn not_found(&self, answer: &Answer, subject: &Subject) -> CtlError {
        let vhost = match subject {
            Subject::Vhost(vhost) | Subject::InVhost { vhost, .. } => vhost,
            // The node's own paths name nothing that could be missing.
            Subject::Node => return not_served(answer),
            Subject::User(_) | Subject::Connection(_) => return missing(subject),
        };
        let vhost_subject = Subject::Vhost(vhost.clone());
        match self.exists(&api_path(&["vhosts", vhost]), &vhost_subject) {
            Ok(false) => missing(&vhost_subject),
            Ok(true) if matches!(subject, Subject::Vhost(_)) || answer.method == "PUT" => {
                not_served(answer)
            }
            _ => missing(subject),
        }
    }
}

fn not_served(answer: &Answer) -> CtlError {
    CtlError::NotServed {
        method: answer.method.clone(),
        path: answer.path.clone(),
    }
}

fn missing(subject: &Subject) -> CtlError {
    CtlError::NotFound {
        what: subject.description(),
        is_user: matches!(subject, Subject::User(_)),
    }
}

/// The API's `reason`, on one line: RabbitMQ's validation reasons span
/// several ("Validation failed\n\nno policy provided\n").
fn reason_text(body: &Value) -> Option<String> {
    let reason = match &body["reason"] {
        Value::String(text) => text.clone(),
        Value::Null => return None,
        other => other.to_string(),
    };
    let lines: Vec<&str> = reason
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    Some(lines.join(": "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(api_path(&["queues", "/", "a b"]), "/api/queues/%2F/a%20b");
        assert_eq!(
            api_path(&["connections", "127.0.0.1:5000 -> 127.0.0.1:5672"]),
            "/api/connections/127.0.0.1%3A5000%20-%3E%20127.0.0.1%3A5672"
        );
        assert_eq!(api_path(&["users", "ü.x~_-"]), "/api/users/%C3%BC.x~_-");
    }

    #[test]
    fn node_forms_give_the_api_url() {
        let url = |node: &str| base_url(node).unwrap();
        assert_eq!(url("127.0.0.1:15672"), "http://127.0.0.1:15672");
        assert_eq!(url("broker"), "http://broker:15672");
        assert_eq!(url("http://broker:8080/"), "http://broker:8080");
        assert_eq!(url("rabbit@broker"), "http://broker:15672");
        assert_eq!(url("[::1]:1234"), "http://[::1]:1234");
        assert_eq!(url("::1"), "http://[::1]:15672");
        assert!(base_url("https://broker").is_err());
        assert!(base_url("broker:http").is_err());
        assert!(base_url("sluice@broker:25672").is_err());
    }

    #[test]
    fn multi_line_reasons_become_one_line() {
        let body = serde_json::json!({
            "error": "bad_request",
            "reason": "Validation failed\n\nno policy provided\n"
        });
        assert_eq!(
            reason_text(&body).unwrap(),
            "Validation failed: no policy provided"
        );
        let term = serde_json::json!({"reason": ["not_int", "delivery_mode"]});
        assert_eq!(
            reason_text(&term).unwrap(),
            r#"["not_int","delivery_mode"]"#
        );
    }
}
