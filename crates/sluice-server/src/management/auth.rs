//! Who calls the management API: HTTP basic authentication against the
//! broker's users, and the tags that decide what each may see and do, as
//! in RabbitMQ's management plugin:
//!
//! - `administrator`: everything;
//! - `monitoring`: sees every vhost, connection and channel, and the node;
//! - `policymaker`: as `management`, plus policies and parameters;
//! - `management`: sees and changes what is in the vhosts it has
//!   permissions in, and its own connections and channels;
//! - any other user is refused the API altogether.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use sluice_core::access::{Attempt, Permission, ResourceKind};

use super::error::ApiError;
use super::ManagementState;

/// The tags that let a user into the management API at all.
const MANAGEMENT_TAGS: &[&str] = &["management", "policymaker", "monitoring", "administrator"];

/// An authenticated caller.
#[derive(Clone)]
pub struct Caller {
    pub user: String,
    pub tags: Vec<String>,
    state: Arc<ManagementState>,
}

impl Caller {
    fn has(&self, tag: &str) -> bool {
        self.tags.iter().any(|held| held == tag)
    }

    pub fn is_administrator(&self) -> bool {
        self.has("administrator")
    }

    /// Sees everything on the node (administrator or monitoring).
    pub fn is_monitor(&self) -> bool {
        self.is_administrator() || self.has("monitoring")
    }

    /// May change policies and parameters.
    pub fn is_policymaker(&self) -> bool {
        self.is_administrator() || self.has("policymaker")
    }

    /// Refuses what only administrators may do.
    pub fn require_administrator(&self) -> Result<(), ApiError> {
        if self.is_administrator() {
            Ok(())
        } else {
            Err(ApiError::not_allowed("Not administrator user"))
        }
    }

    pub fn require_monitor(&self) -> Result<(), ApiError> {
        if self.is_monitor() {
            Ok(())
        } else {
            Err(ApiError::not_allowed("Not monitor user"))
        }
    }

    pub fn require_policymaker(&self) -> Result<(), ApiError> {
        if self.is_policymaker() {
            Ok(())
        } else {
            Err(ApiError::not_allowed(
                "User not authorised to access object",
            ))
        }
    }

    /// Whether the caller sees the queues, exchanges, bindings and policies
    /// of `vhost`: administrators see every vhost's, others (monitoring
    /// users too, as in RabbitMQ) those of the vhosts they hold
    /// permissions in.
    pub fn sees_vhost(&self, vhost: &str) -> bool {
        self.is_administrator() || self.may_use_vhost(vhost)
    }

    /// Whether the caller sees `vhost` itself (in the vhost list, its
    /// limits, its connections): monitors see every vhost.
    pub fn lists_vhost(&self, vhost: &str) -> bool {
        self.is_monitor() || self.may_use_vhost(vhost)
    }

    /// Whether the caller holds permissions in `vhost` (what changing
    /// anything in it takes, administrators included, as in RabbitMQ).
    pub fn may_use_vhost(&self, vhost: &str) -> bool {
        self.state
            .broker
            .access
            .permissions(&self.user, vhost)
            .is_some()
    }

    /// Refuses a vhost the caller may not act in, or that does not exist:
    /// administrators may act in any; anything they do there through AMQP
    /// is still checked against their permissions, as in RabbitMQ.
    pub fn require_vhost(&self, vhost: &str) -> Result<(), ApiError> {
        if self.state.broker.vhost(vhost).is_none() {
            return Err(ApiError::vhost_not_found());
        }
        if self.sees_vhost(vhost) {
            Ok(())
        } else {
            Err(ApiError::not_allowed(
                "User not authorised to access virtual host",
            ))
        }
    }

    /// Refuses a vhost whose objects the caller may not look at.
    pub fn require_visible_vhost(&self, vhost: &str) -> Result<(), ApiError> {
        self.require_vhost_where(vhost, self.sees_vhost(vhost))
    }

    /// Refuses a vhost the caller may not see listed (its connections,
    /// channels, limits).
    pub fn require_listed_vhost(&self, vhost: &str) -> Result<(), ApiError> {
        self.require_vhost_where(vhost, self.lists_vhost(vhost))
    }

    fn require_vhost_where(&self, vhost: &str, allowed: bool) -> Result<(), ApiError> {
        if self.state.broker.vhost(vhost).is_none() {
            return Err(ApiError::not_found());
        }
        if allowed {
            Ok(())
        } else {
            Err(ApiError::not_allowed(
                "User not authorised to access virtual host",
            ))
        }
    }

    /// Checks an AMQP permission of the caller's, as an operation through
    /// an AMQP channel would be checked (RabbitMQ's API acts through one).
    pub fn check_access(
        &self,
        vhost: &str,
        permission: Permission,
        kind: ResourceKind,
        name: &str,
    ) -> Result<(), ApiError> {
        let allowed = self
            .state
            .broker
            .access
            .permissions(&self.user, vhost)
            .is_some_and(|permissions| permissions.allows(permission, kind, name));
        if allowed {
            Ok(())
        } else {
            Err(ApiError::not_allowed("Access refused."))
        }
    }

    /// Whether the caller sees a connection (or its channels) of `user`:
    /// monitors see all, others their own.
    pub fn sees_user_connections(&self, user: &str) -> bool {
        self.is_monitor() || self.user == user
    }
}

impl FromRequestParts<Arc<ManagementState>> for Caller {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ManagementState>,
    ) -> Result<Self, Self::Rejection> {
        if parts.headers.get(AUTHORIZATION).is_none() {
            return Err(credentials_wanted());
        }
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(address)| address.ip())
            .ok_or_else(|| {
                ApiError::internal("the caller's address is not known").into_response()
            })?;
        // Failed logins slow an address down here as on the AMQP port, so
        // that the API is no faster way to guess a password.
        let throttle = &state.broker.login_throttle;
        match throttle.attempt(peer, Instant::now(), LOGIN_PATIENCE) {
            Attempt::After(wait) => tokio::time::sleep(wait).await,
            Attempt::Refuse => {
                return Err(ApiError::unauthorized("Login failed").into_response());
            }
        }
        let authenticated = Self::authenticate(parts, peer, state);
        match &authenticated {
            Err(error) if error.error == "not_authorized" => throttle.failed(peer, Instant::now()),
            _ => throttle.succeeded(peer),
        }
        authenticated.map_err(IntoResponse::into_response)
    }
}

/// How long a request waits for its turn among an address's throttled
/// logins before it is refused unchecked.
const LOGIN_PATIENCE: Duration = Duration::from_secs(10);

/// No credentials at all: RabbitMQ's bare 401, which makes a browser ask
/// for them.
fn credentials_wanted() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(WWW_AUTHENTICATE, "Basic realm=\"RabbitMQ Management\"")],
    )
        .into_response()
}

impl Caller {
    fn authenticate(
        parts: &Parts,
        peer: IpAddr,
        state: &Arc<ManagementState>,
    ) -> Result<Self, ApiError> {
        let (user, password) =
            basic_credentials(parts).ok_or_else(|| ApiError::unauthorized("Login failed"))?;
        if let Err(error) = state.broker.login(&user, &password, peer) {
            tracing::warn!(%peer, %user, %error, "management API login refused");
            return Err(ApiError::unauthorized("Login failed"));
        }
        let tags = state
            .broker
            .access
            .user(&user)
            .map(|definition| definition.tags)
            .unwrap_or_default();
        if !tags
            .iter()
            .any(|tag| MANAGEMENT_TAGS.contains(&tag.as_str()))
        {
            return Err(ApiError::not_allowed("Not management user"));
        }
        Ok(Caller {
            user,
            tags,
            state: Arc::clone(state),
        })
    }
}

/// `Authorization: Basic base64(user:password)`.
fn basic_credentials(parts: &Parts) -> Option<(String, String)> {
    let value = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}
