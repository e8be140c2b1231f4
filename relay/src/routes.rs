//! The routes: the WebSocket upgrade and NIP-11 at `/`, `GET /me`, and
//! the HTTP API (`crate::api`), with CORS. The top of the HTTP side: it
//! assembles what the layers below provide.

use std::sync::Arc;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tower_http::cors::{AllowHeaders, Any, CorsLayer};

use crate::community::Community;
use crate::http::{error, limited, Authed, Tenant};
use crate::state::AppState;

/// Supported NIPs, as advertised in NIP-11.
pub const SUPPORTED_NIPS: &[u16] = &[1, 4, 9, 11, 17, 29, 40, 42, 45, 50, 59, 65, 70, 77, 86, 94, 98];

/// Builds the router.
pub fn router(state: Arc<AppState>) -> Router {
    let cors = CorsLayer::new()
        .allow_origin(Any)
        .allow_methods(Any)
        .allow_headers(AllowHeaders::mirror_request());
    Router::new()
        .route("/", get(root).post(crate::manage::handle))
        .route("/me", get(me))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(crate::api::routes())
        .merge(crate::ui::routes())
        .layer(axum::middleware::from_fn(access_log))
        .layer(cors)
        .with_state(state)
}

/// One line per HTTP call (target `access`, so `access=off` silences it):
/// method, path, status, duration and the NIP-98 caller when there was one.
async fn access_log(mut req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let caller = crate::http::Caller::default();
    req.extensions_mut().insert(caller.clone());
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    tracing::info!(
        target: "access",
        %method,
        path,
        status = resp.status().as_u16(),
        duration_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        caller = caller.0.get().map_or("-", String::as_str),
        "http"
    );
    resp
}

/// `GET /healthz`: 200 while the process serves, on any host, with the
/// version and commit it was built from.
async fn healthz() -> Response {
    Json(protocol::api::Health {
        status: "ok".into(),
        reason: None,
        version: Some(env!("CARGO_PKG_VERSION").into()),
        commit: Some(env!("RELAY_COMMIT").into()),
    })
    .into_response()
}

/// How long the database may take to answer `/readyz`.
const READY_DB_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /readyz`: 200 when the database answers, both store writers take
/// work and the workflow engine began a pass lately; else 503 with the
/// first reason. On any host (load balancers and orchestrators ask it).
async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let reason = match unready(&state).await {
        None => {
            return Json(protocol::api::Health {
                status: "ok".into(),
                reason: None,
                version: None,
                commit: None,
            })
            .into_response()
        }
        Some(r) => r,
    };
    let body = protocol::api::Health {
        status: "unready".into(),
        reason: Some(reason),
        version: None,
        commit: None,
    };
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// Why the relay is not ready, if it is not.
async fn unready(state: &AppState) -> Option<String> {
    if state.shutdown.is_cancelled() {
        return Some("shutting down".into());
    }
    if !state.store.writers_alive() {
        return Some("a store writer stopped".into());
    }
    // A pass begins at least every run or sweep interval; one that takes
    // far longer than that is stuck (or the engine is gone).
    let every_ms = state
        .cfg
        .workflows
        .run_poll_interval_ms
        .min(state.cfg.deliveries.sweep_interval_ms);
    let stale_ms = every_ms.saturating_mul(10).max(30_000);
    let beat = state.engine_beat.load(std::sync::atomic::Ordering::Relaxed);
    if beat == 0 || crate::clock::unix_now_ms().saturating_sub(beat) > stale_ms {
        return Some("the workflow engine is not running".into());
    }
    match tokio::time::timeout(READY_DB_TIMEOUT, state.store.ping()).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(format!("database: {e}")),
        Err(_) => Some(format!(
            "database: no answer within {} s",
            READY_DB_TIMEOUT.as_secs()
        )),
    }
}

/// `GET /me`: who the caller is in this community (NIP-98).
async fn me(State(state): State<Arc<AppState>>, auth: Authed) -> Response {
    if let Some(r) = limited(&state, &auth.tenant, &auth.pubkey) {
        return r;
    }
    let community = &auth.tenant.community.id;
    let owner = state.store.agent_owner(community, &auth.pubkey).await;
    let channels = state.store.channels_of(community, &auth.pubkey).await;
    match (owner, channels) {
        (Ok(owner), Ok(channels)) => Json(protocol::api::Me {
            pubkey: auth.pubkey.to_hex(),
            community: community.clone(),
            agent_owner: owner.map(|o| o.to_hex()),
            channels,
        })
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
                let task = crate::ws::run(socket, state, tenant.community, tenant.host);
                debug_assert!(
                    std::mem::size_of_val(&task) <= crate::ws::TASK_MAX_BYTES,
                    "a connection's task is {} bytes: box the large await added to it",
                    std::mem::size_of_val(&task)
                );
                tracker.track_future(task)
            });
    }
    let wants_nip11 = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/nostr+json"));
    if wants_nip11 {
        let moderation = state.moderation.get(&tenant.community).await;
        let mut resp = Json(relay_info(&state, &tenant.community, &moderation)).into_response();
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

/// The NIP-11 document of a community (its name and description as its
/// admins set them, else as configured).
pub fn relay_info(
    state: &AppState,
    community: &Community,
    moderation: &crate::admin::manage::Moderation,
) -> serde_json::Value {
    let l = &state.cfg.limits;
    let access = state.cfg.access(&community.id);
    let pubkey = community.keys.public_key().to_hex();
    json!({
        "name": moderation.name.as_deref().unwrap_or(&state.cfg.name),
        "description": moderation.description.as_deref().unwrap_or(&state.cfg.description),
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
            "auth_required": access.auth_required_for_reads || access.auth_required_for_writes,
            "payment_required": false,
            "restricted_writes": access.auth_required_for_writes || access.writers_allowlist,
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
