//! What every HTTP handler shares: the tenant (Host -> community, fail
//! closed), NIP-98 authentication, bounded body reads, JSON errors and the
//! API rate limit.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::community::Community;
use crate::refusal::{CallError, Refusal};
use crate::state::AppState;
use crate::store::api::HttpAuthUse;
use crate::store::StoreError;

/// A JSON error answer: `{"error": code, "message": text}`.
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = protocol::api::ErrorBody {
        error: code.to_string(),
        message: message.into(),
    };
    (status, Json(body)).into_response()
}

/// Who made an HTTP call, for the access log: the router puts an empty
/// one in every request, and NIP-98 verification fills it.
#[derive(Clone, Default)]
pub struct Caller(pub Arc<std::sync::OnceLock<String>>);

/// The community named by the request's `Host` header (fails closed).
pub struct Tenant {
    pub community: Arc<Community>,
    /// Normalised request host.
    pub host: String,
}

impl FromRequestParts<Arc<AppState>> for Tenant {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Response> {
        let raw = parts
            .headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        match state.communities.resolve(raw).await {
            Ok(Some((community, host))) => Ok(Tenant { community, host }),
            Ok(None) => Err(error(
                StatusCode::NOT_FOUND,
                "unknown_host",
                format!("no community is served at host {raw:?}"),
            )),
            Err(e) => {
                tracing::error!(error = %e, "community lookup failed");
                Err(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "storage_unavailable",
                    "community lookup failed; try again",
                ))
            }
        }
    }
}

/// A request authenticated with NIP-98, with its body read (bounded by
/// `limits.max_http_body_bytes`). Every check that fails answers 401 with
/// `{"error": "<check>", "message": …}`; each auth event is accepted once:
/// it is recorded as used before the handler runs.
pub struct Authed {
    pub tenant: Tenant,
    pub pubkey: nostr::prelude::PublicKey,
    /// Hex id of the (single-use) auth event.
    pub event_id: String,
    pub body: axum::body::Bytes,
}

/// A NIP-98 request whose auth event is spent by the one store call it
/// authorises (the delivery calls), in that call's transaction: one group
/// commit per request instead of two, which is half of an agent's waits
/// for the write lock. The record is kept even when the call is refused;
/// a replay is answered 401 `auth_replayed` by the store call.
pub struct AuthedCall {
    pub tenant: Tenant,
    pub pubkey: nostr::prelude::PublicKey,
    pub body: axum::body::Bytes,
    /// The auth event to record as used; the store call requires it.
    pub spend: HttpAuthUse,
}

/// Verifies a request's NIP-98 header against its method, URL and body;
/// returns the tenant, the auth event and the body.
async fn nip98(
    req: axum::extract::Request,
    state: &Arc<AppState>,
) -> Result<(Tenant, nostr::prelude::Event, axum::body::Bytes), Response> {
    let (mut parts, body) = req.into_parts();
    let tenant = Tenant::from_request_parts(&mut parts, state).await?;
    let body = read_body(state, body, state.cfg.limits.max_http_body_bytes).await?;
    let scheme = if tenant.community.is_secure() {
        "https"
    } else {
        "http"
    };
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let url = format!("{scheme}://{}{path}", tenant.host);
    let header = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    // Checked here, not on the rayon pool: see `crate::verify`.
    let req = protocol::nip98::Request {
        method: parts.method.as_str(),
        url: &url,
        body: &body,
        now: crate::clock::unix_now(),
    };
    let event = match protocol::nip98::verify(header, &req) {
        // A management call (NIP-86, `POST /`) may name the relay by its
        // WebSocket URL, as Nostr clients know it.
        Err(protocol::nip98::Nip98Error::UrlMismatch { .. }) if path == "/" => {
            let ws_url = tenant.community.websocket_url(&tenant.host);
            let req = protocol::nip98::Request { url: &ws_url, ..req };
            protocol::nip98::verify(header, &req)
        }
        other => other,
    }
    .map_err(|e| error(StatusCode::UNAUTHORIZED, e.code(), e.to_string()))?;
    if let Some(caller) = parts.extensions.get::<Caller>() {
        let _ = caller.0.set(event.pubkey.to_hex());
    }
    let moderation = state.moderation.get(&tenant.community).await;
    if moderation.bans.pubkeys.contains(&event.pubkey.to_bytes()) {
        return Err(error(
            StatusCode::FORBIDDEN,
            "banned",
            "this pubkey is banned in this community",
        ));
    }
    Ok((tenant, event, body))
}

/// Reads a request body of at most `limit` bytes within
/// `limits.body_read_timeout_ms` (413 and 408 otherwise, as JSON): a body
/// sent a byte at a time must not hold the request open.
pub async fn read_body(
    state: &AppState,
    body: axum::body::Body,
    limit: usize,
) -> Result<axum::body::Bytes, Response> {
    let timeout = std::time::Duration::from_millis(state.cfg.limits.body_read_timeout_ms);
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("request body exceeds {limit} bytes"),
        )),
        Err(_) => Err(error(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "the request body did not arrive within {} ms",
                timeout.as_millis()
            ),
        )),
    }
}

/// How an auth event is remembered: by its signature, so that the same
/// header sent again is a replay while two signings of one request (the
/// same id when made in the same second) are two requests (BIP-340
/// signatures are not malleable: no one without the key makes another
/// valid one for an id); and until past the window in which it could
/// still be accepted.
fn spend_of(event: &nostr::prelude::Event) -> HttpAuthUse {
    use sha2::Digest;
    HttpAuthUse {
        key: sha2::Sha256::digest(event.sig.as_bytes()).into(),
        keep_until: i64::try_from(event.created_at.as_secs() + 2 * protocol::nip98::MAX_SKEW_SECS)
            .unwrap_or(i64::MAX),
    }
}

/// The answer to a replayed auth event.
fn replayed() -> Response {
    let e = protocol::nip98::Nip98Error::Replayed;
    error(StatusCode::UNAUTHORIZED, e.code(), e.to_string())
}

impl axum::extract::FromRequest<Arc<AppState>> for Authed {
    type Rejection = Response;

    async fn from_request(req: axum::extract::Request, state: &Arc<AppState>) -> Result<Self, Response> {
        let (tenant, event, body) = nip98(req, state).await?;
        let spend = spend_of(&event);
        match state
            .store
            .use_http_auth(&tenant.community.id, &spend.key, spend.keep_until)
            .await
        {
            Ok(true) => Ok(Authed {
                tenant,
                pubkey: event.pubkey,
                event_id: event.id.to_hex(),
                body,
            }),
            Ok(false) => Err(replayed()),
            Err(e) => {
                tracing::error!(error = %e, "recording NIP-98 auth failed");
                Err(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "storage_unavailable",
                    "try again",
                ))
            }
        }
    }
}

impl axum::extract::FromRequest<Arc<AppState>> for AuthedCall {
    type Rejection = Response;

    async fn from_request(req: axum::extract::Request, state: &Arc<AppState>) -> Result<Self, Response> {
        let (tenant, event, body) = nip98(req, state).await?;
        Ok(AuthedCall {
            tenant,
            pubkey: event.pubkey,
            body,
            spend: spend_of(&event),
        })
    }
}

/// Per (community, pubkey) rate limit of the HTTP API: `Some(429)` when
/// the caller is over it.
pub fn limited(state: &AppState, tenant: &Tenant, caller: &nostr::prelude::PublicKey) -> Option<Response> {
    let key = format!("{}:{}", tenant.community.id, caller.to_hex());
    (!state.api_limits.try_take(&key)).then(|| {
        error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many requests; slow down",
        )
    })
}

/// The HTTP status of a refusal: the one place where a domain refusal of
/// the store becomes HTTP (the statuses docs/protocol.md names).
pub fn status_of(r: &Refusal) -> StatusCode {
    use Refusal as R;
    match r {
        R::NoDelivery | R::UnknownWorkflow | R::UnknownRun | R::UnknownAgent | R::UnknownChannel => {
            StatusCode::NOT_FOUND
        }
        R::NotTarget
        | R::AgentNotMember
        | R::NotOwner
        | R::NotAgentOwner
        | R::OwnerLeft
        | R::OwnerNotMember => StatusCode::FORBIDDEN,
        R::Cancelled => StatusCode::GONE,
        R::StaleToken
        | R::NotClaimed(_)
        | R::LeaseExpired
        | R::LeaseExceedsLifetime { .. }
        | R::WorkflowDisabled
        | R::WrongTrigger(_)
        | R::WorkflowPaused
        | R::NotRetryable(_)
        | R::AlreadyEnded(_)
        | R::RunEnded(_)
        | R::ListFull(_)
        | R::NotRerunnable(_)
        | R::DefinitionChanged(_) => StatusCode::CONFLICT,
        R::DefinitionMissing => StatusCode::GONE,
        R::BadLease { .. } | R::BadName | R::BadReply(_) | R::TurnTooLong => StatusCode::BAD_REQUEST,
        R::TooManyOperations => StatusCode::TOO_MANY_REQUESTS,
        R::Replayed(_) => StatusCode::UNAUTHORIZED,
    }
}

pub fn refused(r: Refusal) -> Response {
    error(status_of(&r), r.code(), r.to_string())
}

pub fn unavailable(e: &StoreError) -> Response {
    tracing::error!(error = %e, "API storage call failed");
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "storage_unavailable",
        "the database is unavailable; try again",
    )
}

/// The response of a call that did not give its answer.
pub fn not_answered(e: CallError) -> Response {
    match e {
        CallError::Refused(r) => refused(r),
        CallError::Store(e) => unavailable(&e),
    }
}

/// The caller's address: the connection's peer, or, when the peer is one
/// of `trusted` (a reverse proxy), the last address in `X-Forwarded-For`
/// that is not itself a trusted proxy (each proxy appends the address it
/// was reached from, so only the right-hand entries are vouched for).
pub fn client_address(
    peer: std::net::IpAddr,
    headers: &HeaderMap,
    trusted: &[std::net::IpAddr],
) -> std::net::IpAddr {
    let peer = peer.to_canonical();
    if !trusted.contains(&peer) {
        return peer;
    }
    let forwarded = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim);
    let mut last = peer;
    for entry in forwarded.collect::<Vec<_>>().into_iter().rev().take(16) {
        match entry.parse::<std::net::IpAddr>() {
            Ok(ip) if trusted.contains(&ip.to_canonical()) => last = ip.to_canonical(),
            Ok(ip) => return ip.to_canonical(),
            Err(_) => return last,
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_address_trusts_only_listed_proxies() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "1.1.1.1, 2.2.2.2, 10.0.0.2".parse().unwrap());
        let proxies = [ip("10.0.0.1"), ip("10.0.0.2")];
        // From a listed proxy: the right-most address no proxy vouches for.
        assert_eq!(client_address(ip("10.0.0.1"), &h, &proxies), ip("2.2.2.2"));
        // From anyone else: the header is ignored.
        assert_eq!(client_address(ip("3.3.3.3"), &h, &proxies), ip("3.3.3.3"));
        assert_eq!(client_address(ip("10.0.0.1"), &h, &[]), ip("10.0.0.1"));
        // Garbage stops the walk at the last vouched-for address.
        h.insert("x-forwarded-for", "junk, 10.0.0.2".parse().unwrap());
        assert_eq!(client_address(ip("10.0.0.1"), &h, &proxies), ip("10.0.0.2"));
        // An IPv4-mapped peer is the IPv4 address.
        assert_eq!(
            client_address(ip("::ffff:3.3.3.3"), &HeaderMap::new(), &[]),
            ip("3.3.3.3")
        );
    }
}
