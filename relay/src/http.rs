//! HTTP surface: host resolution, the WebSocket upgrade, NIP-11 and CORS.

use std::sync::Arc;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tower_http::cors::{AllowHeaders, Any, CorsLayer};

use crate::community::Community;
use crate::state::AppState;
use crate::store::api::HttpAuthUse;

/// Supported NIPs, as advertised in NIP-11.
pub const SUPPORTED_NIPS: &[u16] = &[1, 9, 11, 29, 40, 42, 45, 70, 98];

/// Builds the router.
pub fn router(state: Arc<AppState>) -> Router {
    let cors = CorsLayer::new()
        .allow_origin(Any)
        .allow_methods(Any)
        .allow_headers(AllowHeaders::mirror_request());
    Router::new()
        .route("/", get(root))
        .route("/me", get(me))
        .merge(crate::api::routes())
        .layer(cors)
        .with_state(state)
}

/// A JSON error answer: `{"error": code, "message": text}`.
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": code, "message": message.into()}))).into_response()
}

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
        now: crate::state::unix_now(),
    };
    let event = protocol::nip98::verify(header, &req)
        .map_err(|e| error(StatusCode::UNAUTHORIZED, e.code(), e.to_string()))?;
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

/// How long an auth event is remembered: past the window in which it could
/// still be accepted.
fn spend_of(event: &nostr::prelude::Event) -> HttpAuthUse {
    HttpAuthUse {
        event_id: event.id.to_bytes(),
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
            .use_http_auth(&tenant.community.id, &spend.event_id, spend.keep_until)
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

/// `GET /me`: who the caller is in this community (NIP-98).
async fn me(State(state): State<Arc<AppState>>, auth: Authed) -> Response {
    if let Some(r) = crate::api::limited(&state, &auth.tenant, &auth.pubkey) {
        return r;
    }
    let community = &auth.tenant.community.id;
    let owner = state.store.agent_owner(community, &auth.pubkey).await;
    let channels = state.store.channels_of(community, &auth.pubkey).await;
    match (owner, channels) {
        (Ok(owner), Ok(channels)) => Json(json!({
            "pubkey": auth.pubkey.to_hex(),
            "community": community,
            "agent_owner": owner.map(|o| o.to_hex()),
            "channels": channels,
        }))
        .into_response(),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "reading /me failed");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "storage_unavailable",
                "try again",
            )
        }
    }
}

async fn root(
    State(state): State<Arc<AppState>>,
    tenant: Tenant,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    if let Ok(ws) = ws {
        if state.shutdown.is_cancelled() {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the relay is shutting down",
            );
        }
        let hard_cap = state.cfg.limits.max_message_bytes.saturating_mul(2);
        let tracker = state.tracker.clone();
        return ws
            .max_message_size(hard_cap)
            .max_frame_size(hard_cap)
            // tungstenite's default (128 KiB, allocated up front) made an idle
            // connection cost about 140 KiB.
            .read_buffer_size(state.cfg.limits.ws_read_buffer_bytes)
            .on_upgrade(move |socket| {
                tracker.track_future(crate::ws::run(socket, state, tenant.community, tenant.host))
            });
    }
    let wants_nip11 = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/nostr+json"));
    if wants_nip11 {
        let mut resp = Json(relay_info(&state, &tenant.community)).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/nostr+json"),
        );
        return resp;
    }
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "This is a Nostr relay. Connect with a Nostr client over WebSocket, or ask for NIP-11 with Accept: application/nostr+json.\n",
    )
        .into_response()
}

/// The NIP-11 document of a community.
pub fn relay_info(state: &AppState, community: &Community) -> serde_json::Value {
    let l = &state.cfg.limits;
    let pubkey = community.keys.public_key().to_hex();
    json!({
        "name": state.cfg.name,
        "description": state.cfg.description,
        "pubkey": pubkey,
        "self": pubkey,
        "supported_nips": SUPPORTED_NIPS,
        "software": "https://github.com/nostr-relay-agent-delivery/relay",
        "version": env!("CARGO_PKG_VERSION"),
        "community": community.id,
        "limitation": {
            "max_message_length": l.max_message_bytes,
            "max_subscriptions": l.max_subscriptions,
            "max_filters": l.max_filters,
            "max_limit": l.max_limit,
            "default_limit": l.max_limit,
            "max_subid_length": protocol::message::MAX_SUBSCRIPTION_ID_CHARS,
            "max_event_tags": l.max_tags_per_event,
            "max_content_length": l.max_event_bytes,
            "created_at_upper_limit": l.max_future_secs,
            "auth_required": false,
            "payment_required": false,
            "restricted_writes": false,
            "max_event_bytes": l.max_event_bytes,
            "max_tag_value_bytes": l.max_tag_value_bytes,
            "max_filter_values": l.max_filter_values,
            "events_per_second": l.events_per_second,
            "events_burst": l.events_burst,
            "max_outbound_bytes": l.max_outbound_bytes,
            "max_outbound_bytes_total": l.max_outbound_bytes_total,
            "max_req_bytes": l.max_req_bytes,
            "max_connections_per_ip": l.max_connections_per_ip,
            "auth_max_age_secs": l.auth_max_age_secs,
            "p_gated_kinds": state.cfg.p_gated_kinds,
        },
    })
}
