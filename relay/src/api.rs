//! The HTTP API (docs/protocol.md, "Owner calls" and
//! "Deliveries"): deliveries for agents,
//! workflow calls for owners, webhooks. Every call but the webhook is NIP-98
//! authenticated ([`Authed`]); every answer is JSON; every refusal is
//! `{"error": code, "message": …}` with the status the contract names.

use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use protocol::api::{
    ClaimAnswer, ClaimRequest, DeliveriesPage, DeliveryStatus, FinishAnswer, FinishRequest, OperationAnswer,
    OperationRequest, RenewAnswer, RenewRequest, RunStarted, RunsPage, WebhookSecret,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::http::{error, limited, not_answered, unavailable, Authed, AuthedCall, Tenant};
use crate::refusal::Answer;
use crate::state::AppState;

/// The API routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/deliveries", get(list_deliveries))
        .route("/deliveries/claim", post(claim))
        .route("/deliveries/{id}", get(show_delivery))
        .route("/deliveries/{id}/renew", post(renew))
        .route("/deliveries/{id}/operations", post(operation))
        .route("/deliveries/{id}/finish", post(finish))
        .route("/workflows/{id}/webhook-secret", post(webhook_secret))
        .route("/workflows/{id}/secrets/{name}", put(set_secret))
        .route("/workflows/{id}/runs", post(manual_run).get(list_runs))
        .route("/runs/{id}", get(show_run))
        .route("/hooks/{id}", post(webhook))
}

/// Turns a store result into a response: the answer `ok` makes of it.
fn answer<T, A: Serialize>(r: Answer<T>, ok: impl FnOnce(T) -> A) -> Response {
    match r {
        Ok(v) => Json(ok(v)).into_response(),
        Err(e) => not_answered(e),
    }
}

/// A body that is not the call's type: 400 with its code.
struct BadBody {
    code: &'static str,
    message: String,
}

impl IntoResponse for BadBody {
    fn into_response(self) -> Response {
        error(StatusCode::BAD_REQUEST, self.code, self.message)
    }
}

/// Parses a JSON body (an empty body is `{}`) into its `protocol::api`
/// type. A field of the contract's enums with an unknown name is refused
/// with that field's code (`bad_outcome`, `bad_effect`), anything else
/// malformed with `malformed`.
fn body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, BadBody> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let code = match e.path().to_string().as_str() {
            "outcome" => "bad_outcome",
            "effect" => "bad_effect",
            _ => "malformed",
        };
        BadBody {
            code,
            message: e.inner().to_string(),
        }
    })
}

async fn claim(State(state): State<Arc<AppState>>, auth: AuthedCall) -> Response {
    if let Some(r) = limited(&state, &auth.tenant, &auth.pubkey) {
        return r;
    }
    let req: ClaimRequest = match body(&auth.body) {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    let community = &auth.tenant.community.id;
    let keys = &auth.tenant.community.keys;
    let r = state
        .store
        .claim(community, keys, auth.spend, auth.pubkey, req)
        .await;
    let r = r.map(|(claimed, statuses)| {
        // A mention's sender is told (announced to other processes in
        // the claim's transaction).
        for (ev, raw) in statuses {
            state.publish(community, Arc::new(ev), Arc::from(raw));
        }
        claimed
    });
    if let Ok(Some(turn)) = &r {
        let d = &turn.lead;
        let span = d.span(community);
        let now = crate::clock::unix_now() as i64;
        let claim = span.child(&format!("claim:{}", d.attempt));
        state.spans.emit([crate::spans::RunSpan::new(
            format!("claim {}", d.id),
            claim,
            Some(span),
            now,
            now,
        )
        .with("workflow.delivery.attempt", d.attempt.to_string())]);
        let (to, code) = ("claimed", "");
        metrics::counter!(crate::telemetry::TRANSITIONS, "to" => to, "code" => code).increment(1);
        if d.attempt == 1 {
            let waited = (crate::clock::unix_now() as i64)
                .saturating_sub(d.created_at)
                .max(0);
            metrics::histogram!(crate::telemetry::DELIVERY_WAIT).record(waited as f64);
        }
    }
    answer(r, |turn| ClaimAnswer {
        delivery: turn.and_then(|t| {
            let mut view = t.lead.claim_view(community)?;
            view.turn = t.joined.iter().map(|d| d.turn_part()).collect();
            Some(view)
        }),
    })
}

async fn renew(State(state): State<Arc<AppState>>, Path(id): Path<String>, auth: AuthedCall) -> Response {
    if let Some(r) = limited(&state, &auth.tenant, &auth.pubkey) {
        return r;
    }
    let req: RenewRequest = match body(&auth.body) {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    let community = &auth.tenant.community.id;
    let r = state
        .store
        .renew(community, auth.spend, auth.pubkey, id, req)
        .await;
    answer(r, |t| RenewAnswer { claim_expires_at: t })
}

async fn operation(State(state): State<Arc<AppState>>, Path(id): Path<String>, auth: AuthedCall) -> Response {
    if let Some(r) = limited(&state, &auth.tenant, &auth.pubkey) {
        return r;
    }
    let req: OperationRequest = match body(&auth.body) {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    let community = &auth.tenant.community.id;
    let r = state
        .store
        .record_operation(community, auth.spend, auth.pubkey, id, req)
        .await;
    answer(r, |()| OperationAnswer { recorded: true })
}

async fn finish(State(state): State<Arc<AppState>>, Path(id): Path<String>, auth: AuthedCall) -> Response {
    if let Some(r) = limited(&state, &auth.tenant, &auth.pubkey) {
        return r;
    }
    let req: FinishRequest = match body(&auth.body) {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    if let Some(reply) = &req.reply {
        // The same admission as a client's EVENT: a reply is stored and
        // served like any other event.
        let moderation = state.moderation.get(&auth.tenant.community).await;
        let rules = crate::admission::Rules {
            limits: &state.cfg.limits,
            community_key: auth.tenant.community.pubkey(),
            now: crate::clock::unix_now(),
            bans: Some(&moderation.bans),
        };
        if let Err(refusal) = crate::admission::check(reply, reply.as_json().len(), &rules) {
            return error(StatusCode::BAD_REQUEST, "bad_reply", refusal.to_string());
        }
        if let Err(e) = crate::verify::verify_now(reply) {
            return error(StatusCode::BAD_REQUEST, "bad_reply", e.message());
        }
    }
    let community = auth.tenant.community.id.clone();
    let keys = auth.tenant.community.keys.clone();
    let r = state
        .store
        .finish(&community, auth.spend, &keys, auth.pubkey, id, req)
        .await;
    match r {
        Ok(f) => {
            // Test-only: die after the commit, before the agent hears of it.
            let _ = crate::faults::check("finish:after_commit");
            state.spans.emit(f.spans);

            for (ev, raw) in f.published {
                state.publish(&community, Arc::new(ev), Arc::from(raw));
            }
            // A woken run resumes now rather than at the next poll. A
            // reply is stored as an event and starts no run (triggers
            // fire on messages published to the relay), so it wakes no
            // engine pass: one per finish cost three statements.
            if f.woke_run {
                state.kick.kick();
            }
            if f.freed_slot {
                let (state, community, caller) = (state.clone(), community.clone(), auth.pubkey);
                tokio::spawn(
                    async move { crate::engine::wake_next(&state, &community, &keys, &caller).await },
                );
            }
            match f.refused_answer {
                // Committed: the row waits for the step's revision.
                Some(why) => error(StatusCode::UNPROCESSABLE_ENTITY, "output_invalid", why),
                None => Json(FinishAnswer { status: f.status }).into_response(),
            }
        }
        Err(e) => not_answered(e),
    }
}

#[derive(Deserialize)]
struct ListQuery {
    status: Option<String>,
    before: Option<i64>,
    /// With `before`: the last delivery id of the previous page.
    before_id: Option<String>,
    limit: Option<u32>,
}

async fn list_deliveries(
    State(state): State<Arc<AppState>>,
    Query(q): Query<ListQuery>,
    auth: Authed,
) -> Response {
    if let Some(r) = limited(&state, &auth.tenant, &auth.pubkey) {
        return r;
    }
    let status = match q.status.as_deref().map(|s| (s, DeliveryStatus::parse(s))) {
        None => None,
        Some((_, Some(s))) => Some(s),
        Some((s, None)) => {
            let names: Vec<&str> = DeliveryStatus::ALL.iter().map(|s| s.as_str()).collect();
            return error(
                StatusCode::BAD_REQUEST,
                "bad_status",
                format!("status {s:?} must be one of {names:?}"),
            );
        }
    };
    let limit = q
        .limit
        .unwrap_or(state.cfg.deliveries.max_page)
        .clamp(1, state.cfg.deliveries.max_page);
    if let Some(r) = bad_before_id(q.before_id.as_deref()) {
        return r;
    }
    let community = &auth.tenant.community.id;
    let filter = crate::delivery::rows::ListFilter {
        target: Some(auth.pubkey),
        status,
        before: q.before,
        before_id: q.before_id,
        ..Default::default()
    };
    let r = state.store.list_deliveries(community, &filter, limit).await;
    match r {
        Ok(rows) => {
            let last = (rows.len() == limit as usize).then(|| rows.last()).flatten();
            Json(DeliveriesPage {
                deliveries: rows.iter().map(|d| d.list_view()).collect(),
                next_before: last.map(|d| d.created_at),
                next_before_id: last.map(|d| d.id.clone()),
            })
            .into_response()
        }
        Err(e) => unavailable(&e),
    }
}

async fn webhook_secret(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    auth: Authed,
) -> Response {
    if let Some(r) = limited(&state, &auth.tenant, &auth.pubkey) {
        return r;
    }
    let secret = hex::encode(rand::random::<[u8; 32]>());
    let hash = hex::encode(Sha256::digest(secret.as_bytes()));
    let community = &auth.tenant.community.id;
    let r = state
        .store
        .set_webhook_secret(community, &id, &auth.pubkey, &hash)
        .await;
    answer(r, |()| WebhookSecret { secret })
}

/// `PUT /workflows/<id>/secrets/<name>` `{"value"}` (owner): seals the
/// value with the secrets key and stores it, replacing any earlier one
/// (rotation); the value is never shown again.
async fn set_secret(
    State(state): State<Arc<AppState>>,
    Path((id, name)): Path<(String, String)>,
    auth: Authed,
) -> Response {
    if let Some(r) = limited(&state, &auth.tenant, &auth.pubkey) {
        return r;
    }
    if !protocol::workflow::valid_id(&name) {
        return error(
            StatusCode::BAD_REQUEST,
            "malformed",
            "a secret name is [a-z0-9_-]{1,64}",
        );
    }
    let req: protocol::api::SecretRequest = match body(&auth.body) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    if req.value.is_empty() || req.value.len() > protocol::api::MAX_SECRET_BYTES {
        let why = format!("value must be 1 to {} bytes", protocol::api::MAX_SECRET_BYTES);
        return error(StatusCode::BAD_REQUEST, "malformed", why);
    }
    let community = &auth.tenant.community.id;
    let sealed = state.secrets.seal(req.value.as_bytes(), community, &id, &name);
    let r = state
        .store
        .set_secret(community, &id, &auth.pubkey, &name, &sealed)
        .await;
    answer(r, |updated_at| protocol::api::SecretStored { name, updated_at })
}

async fn manual_run(State(state): State<Arc<AppState>>, Path(id): Path<String>, auth: Authed) -> Response {
    if let Some(r) = limited(&state, &auth.tenant, &auth.pubkey) {
        return r;
    }
    let input: Value = match body(&auth.body) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    if !input.is_object() {
        return error(
            StatusCode::BAD_REQUEST,
            "malformed",
            "the body must be a JSON object",
        );
    }
    // The auth event is single use, so its id names this request exactly once.
    let cause = protocol::workflow::Cause {
        kind: protocol::api::CauseKind::Manual,
        id: auth.event_id.clone(),
    };
    let ctx = json!({"author": auth.pubkey.to_hex(), "body": input});
    let community = &auth.tenant.community.id;
    let r = state
        .store
        .start_run(community, &id, Some(&auth.pubkey), "manual", cause, ctx)
        .await;
    state.kick.kick();
    answer(r, |(run_id, _)| RunStarted { run_id })
}

#[derive(Deserialize)]
struct RunsQuery {
    before: Option<i64>,
    /// With `before`: the last run id of the previous page.
    before_id: Option<String>,
    limit: Option<u32>,
}

async fn list_runs(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<RunsQuery>,
    auth: Authed,
) -> Response {
    if let Some(r) = limited(&state, &auth.tenant, &auth.pubkey) {
        return r;
    }
    let limit = q.limit.unwrap_or(50).clamp(1, state.cfg.deliveries.max_page);
    if let Some(r) = bad_before_id(q.before_id.as_deref()) {
        return r;
    }
    let community = &auth.tenant.community.id;
    let before = q.before.map(|created_at| crate::workflow::views::Before {
        created_at,
        id: q.before_id.as_deref(),
    });
    let r = state
        .store
        .list_runs(community, Some(&id), unless_admin(&state, &auth), before, limit)
        .await;
    answer(r, |page| {
        let last = (page.runs.len() == limit as usize || page.cut)
            .then(|| page.runs.last())
            .flatten();
        RunsPage {
            next_before: last.map(|r| r.created_at),
            next_before_id: last.map(|r| r.id.clone()),
            runs: page.runs,
        }
    })
}

/// A page's `before_id` that is not an id this relay makes: 400.
fn bad_before_id(before_id: Option<&str>) -> Option<Response> {
    before_id.filter(|id| !protocol::workflow::valid_id(id)).map(|_| {
        error(
            StatusCode::BAD_REQUEST,
            "malformed",
            "before_id must match [a-z0-9_-]{1,64}",
        )
    })
}

/// The caller whose ownership a read checks: none for an admin of the
/// community (admins see the community's runs and deliveries).
fn unless_admin<'a>(state: &AppState, auth: &'a Authed) -> Option<&'a nostr::prelude::PublicKey> {
    let admin = state
        .cfg
        .is_admin(&auth.tenant.community.id, &auth.pubkey.to_hex());
    (!admin).then_some(&auth.pubkey)
}

/// `GET /deliveries/<id>`: the delivery with its attempts and operations,
/// for its target and its workflow's owner.
async fn show_delivery(State(state): State<Arc<AppState>>, Path(id): Path<String>, auth: Authed) -> Response {
    if let Some(r) = limited(&state, &auth.tenant, &auth.pubkey) {
        return r;
    }
    let community = &auth.tenant.community.id;
    let r = state
        .store
        .show_delivery(community, &id, unless_admin(&state, &auth))
        .await;
    answer(r, |detail| detail)
}

/// `GET /runs/<run id>`: one run with its steps, for its workflow's owner.
async fn show_run(State(state): State<Arc<AppState>>, Path(id): Path<String>, auth: Authed) -> Response {
    if let Some(r) = limited(&state, &auth.tenant, &auth.pubkey) {
        return r;
    }
    let community = &auth.tenant.community.id;
    let r = state
        .store
        .show_run(community, &id, unless_admin(&state, &auth))
        .await;
    answer(r, |run| run)
}

/// `POST /hooks/<id>` with `Authorization: Bearer <secret>`; the JSON body
/// is private trigger data. An `Idempotency-Key` header names the request
/// (the same key never starts a second run); without one, each call is new.
///
/// The secret is checked first (in constant time), before anything is
/// charged to the workflow: a flood with a wrong secret used to empty the
/// workflow's bucket and got the real caller 429 on every try. Failures
/// are limited per hook and caller address instead (the address a trusted
/// proxy forwards, `limits.trusted_proxies`), so a flood locks out only
/// its own address from that hook; behind an untrusted proxy, where every
/// caller shares one address, it stays within the one hook it hits.
async fn webhook(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    tenant: Tenant,
    headers: HeaderMap,
    body_stream: axum::body::Body,
) -> Response {
    let community = tenant.community.id.clone();
    let caller = crate::http::client_address(peer.ip(), &headers, &state.cfg.limits.trusted_proxies);
    // At most 64 characters of the id: the table holds 100,000 keys.
    let hook: String = id.chars().take(64).collect();
    let failures_key = format!("{community}:hook-failures:{hook}:{caller}");
    if !state.webhook_failures.has_tokens(&failures_key) {
        return error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many failed calls to this webhook from this address; slow down",
        );
    }
    let bytes =
        match crate::http::read_body(&state, body_stream, state.cfg.workflows.max_webhook_body_bytes).await {
            Ok(b) => b,
            Err(r) => return r,
        };
    let secret = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let target = match state.store.webhook_target(&community, &id).await {
        Ok(t) => t,
        Err(e) => return unavailable(&e),
    };
    // Unknown workflow and "no secret set" look the same as a wrong secret.
    let stored = match &target {
        Some((Some(hash), _, _)) => hash.as_str(),
        _ => "",
    };
    let given = secret
        .map(|s| hex::encode(Sha256::digest(s.as_bytes())))
        .unwrap_or_default();
    if stored.is_empty() || !constant_time_eq(given.as_bytes(), stored.as_bytes()) {
        state.webhook_failures.try_take(&failures_key);
        return error(
            StatusCode::UNAUTHORIZED,
            "bad_secret",
            "missing or wrong webhook secret",
        );
    }
    if !state.api_limits.try_take(&format!("{community}:hook:{id}")) {
        return error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many requests; slow down",
        );
    }
    let data: Value = match body(&bytes) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    if !data.is_object() {
        return error(
            StatusCode::BAD_REQUEST,
            "malformed",
            "the body must be a JSON object",
        );
    }
    let request_id = match headers.get("idempotency-key").and_then(|v| v.to_str().ok()) {
        Some(k) if !k.is_empty() && k.len() <= 200 => {
            format!("key:{}", hex::encode(Sha256::digest(k.as_bytes())))
        }
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "malformed",
                "Idempotency-Key must be 1 to 200 bytes",
            )
        }
        None => crate::workflow::definitions::new_id(),
    };
    let cause = protocol::workflow::Cause {
        kind: protocol::api::CauseKind::Webhook,
        id: request_id,
    };
    let r = state
        .store
        .start_run(&community, &id, None, "webhook", cause, json!({"body": data}))
        .await;
    state.kick.kick();
    answer(r, |(run_id, _)| RunStarted { run_id })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
