//! The dashboard: its page and assets at `/ui` (embedded in the binary,
//! no network needed), and the read-only calls it makes with NIP-98 (the
//! one auth rule of the API; the page signs each call with the user's
//! NIP-07 key). An admin of the community sees all of it, a workflow's
//! owner its own workflows, runs, deliveries and agents; anyone else is
//! refused 403 and the page shows only its sign-in.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use nostr::prelude::PublicKey;
use protocol::dashboard::{Overview, Role};

use crate::http::{error, limited, unavailable, Authed, Tenant};
use crate::state::AppState;

/// The page's files, embedded at build.
const INDEX_HTML: &str = include_str!("../assets/ui/index.html");
const APP_JS: &str = include_str!("../assets/ui/app.js");
const APP_CSS: &str = include_str!("../assets/ui/app.css");

/// The page may load only its own files and talk only to its own relay.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
    connect-src 'self' ws: wss:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/ui",
            get(|t: Tenant| asset(t, "text/html; charset=utf-8", INDEX_HTML)),
        )
        .route(
            "/ui/",
            get(|t: Tenant| asset(t, "text/html; charset=utf-8", INDEX_HTML)),
        )
        .route(
            "/ui/app.js",
            get(|t: Tenant| asset(t, "text/javascript; charset=utf-8", APP_JS)),
        )
        .route(
            "/ui/app.css",
            get(|t: Tenant| asset(t, "text/css; charset=utf-8", APP_CSS)),
        )
        .route("/overview", get(overview))
        .route("/workflows", get(workflows))
        .route("/workflows/{id}", get(workflow))
        .route("/agents", get(agents))
        .route("/channels", get(channels))
}

/// One of the page's files, for a host that serves a community: a host
/// that serves none is refused 404 (`unknown_host`) by [`Tenant`], as
/// NIP-11 and every API call are.
async fn asset(_served: Tenant, content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The caller's role, or the refusal a stranger gets.
async fn role(state: &AppState, auth: &Authed) -> Result<Role, Response> {
    if let Some(r) = limited(state, &auth.tenant, &auth.pubkey) {
        return Err(r);
    }
    let community = &auth.tenant.community.id;
    if state.cfg.is_admin(community, &auth.pubkey.to_hex()) {
        return Ok(Role::Admin);
    }
    match state.store.owns_workflow(community, &auth.pubkey).await {
        Ok(true) => Ok(Role::Owner),
        Ok(false) => Err(error(
            StatusCode::FORBIDDEN,
            "restricted",
            "only this community's admins and workflow owners see its dashboard",
        )),
        Err(e) => Err(unavailable(&e)),
    }
}

/// `None` for an admin (everything), the caller for an owner.
fn narrowed(role: Role, auth: &Authed) -> Option<&PublicKey> {
    (role == Role::Owner).then_some(&auth.pubkey)
}

async fn overview(State(state): State<Arc<AppState>>, auth: Authed) -> Response {
    let role = match role(&state, &auth).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let community = &auth.tenant.community.id;
    let now = i64::try_from(crate::clock::unix_now()).unwrap_or(i64::MAX);
    match state
        .store
        .dashboard_counts(community, narrowed(role, &auth), now)
        .await
    {
        Ok(c) => Json(Overview {
            role,
            pubkey: auth.pubkey.to_hex(),
            community: community.clone(),
            deliveries: c.deliveries,
            oldest_pending_secs: c.oldest_pending_secs,
            runs: c.runs,
            last_hour: c.last_hour,
        })
        .into_response(),
        Err(e) => unavailable(&e),
    }
}

async fn workflow(State(state): State<Arc<AppState>>, Path(id): Path<String>, auth: Authed) -> Response {
    let role = match role(&state, &auth).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let community = &auth.tenant.community.id;
    match state.store.dashboard_workflow(community, &id).await {
        Ok(Some(w)) if role == Role::Admin || w.summary.owner == auth.pubkey.to_hex() => {
            Json(w).into_response()
        }
        Ok(Some(_)) => error(
            StatusCode::FORBIDDEN,
            "not_owner",
            "only the workflow's owner may do this",
        ),
        Ok(None) => error(StatusCode::NOT_FOUND, "unknown_workflow", "no such workflow"),
        Err(e) => unavailable(&e),
    }
}

/// A list read for the caller: the community's for an admin, the
/// caller's own for an owner.
async fn narrowed_read<T, Fut>(
    state: Arc<AppState>,
    auth: &Authed,
    read: impl FnOnce(Arc<AppState>, String, Option<PublicKey>) -> Fut,
) -> Response
where
    T: serde::Serialize,
    Fut: std::future::Future<Output = Result<T, crate::store::StoreError>>,
{
    let role = match role(&state, auth).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let who = narrowed(role, auth).copied();
    match read(state, auth.tenant.community.id.clone(), who).await {
        Ok(list) => Json(list).into_response(),
        Err(e) => unavailable(&e),
    }
}

async fn workflows(State(state): State<Arc<AppState>>, auth: Authed) -> Response {
    narrowed_read(state, &auth, |s, c, who| async move {
        s.store.dashboard_workflows(&c, who.as_ref()).await
    })
    .await
}

async fn agents(State(state): State<Arc<AppState>>, auth: Authed) -> Response {
    narrowed_read(state, &auth, |s, c, who| async move {
        s.store.dashboard_agents(&c, who.as_ref()).await
    })
    .await
}

async fn channels(State(state): State<Arc<AppState>>, auth: Authed) -> Response {
    narrowed_read(state, &auth, |s, c, who| async move {
        s.store.dashboard_channels(&c, who.as_ref()).await
    })
    .await
}
