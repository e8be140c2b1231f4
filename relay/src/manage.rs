//! `POST /`: relay management (NIP-86 and this relay's methods, docs/protocol.md,
//! "Management"). NIP-98 authenticates the caller; the community's admins
//! may call every method, a workflow's owner the ones on its own
//! workflows' runs and deliveries ([`Method::open_to_owners`]). Every
//! answer is `{"result"}` or `{"error": "<code>: <text>"}`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use protocol::nip86::{self, Call, DeliveryQuery, List, Method};
use serde_json::{json, Value};

use crate::admin::manage::{Actor, InfoField, Notice};
use crate::http::{limited, status_of, Authed};
use crate::refusal::CallError;
use crate::state::AppState;

/// An answer: the HTTP status and the body.
type Answered = Result<Value, (StatusCode, String)>;

fn reply(answered: Answered) -> Response {
    match answered {
        Ok(result) => Json(nip86::Response { result, error: None }).into_response(),
        Err((status, error)) => {
            let body = nip86::Response {
                result: Value::Null,
                error: Some(error),
            };
            (status, Json(body)).into_response()
        }
    }
}

fn failed(e: CallError) -> (StatusCode, String) {
    match e {
        CallError::Refused(r) => (status_of(&r), format!("{}: {r}", r.code())),
        CallError::Store(e) => {
            tracing::error!(error = %e, "management call failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "storage_unavailable: the database is unavailable; try again".into(),
            )
        }
    }
}

/// Whether the request says it is a management call.
pub fn is_rpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(nip86::CONTENT_TYPE))
}

/// `POST /`.
pub async fn handle(State(state): State<Arc<AppState>>, headers: HeaderMap, auth: Authed) -> Response {
    if !is_rpc(&headers) {
        let why = format!("invalid: Content-Type must be {}", nip86::CONTENT_TYPE);
        return reply(Err((StatusCode::UNSUPPORTED_MEDIA_TYPE, why)));
    }
    if let Some(r) = limited(&state, &auth.tenant, &auth.pubkey) {
        return r;
    }
    let call = serde_json::from_slice::<nip86::Request>(&auth.body)
        .map_err(|e| format!("invalid: the body is not {{\"method\", \"params\"}}: {e}"))
        .and_then(|req| Call::parse(&req));
    let call = match call {
        Ok(c) => c,
        Err(why) => return reply(Err((StatusCode::BAD_REQUEST, why))),
    };
    let community = &auth.tenant.community;
    let admin = state.cfg.is_admin(&community.id, &auth.pubkey.to_hex());
    if !admin && !call.method().open_to_owners() {
        let why = format!(
            "restricted: {} is for this community's admins",
            call.method().as_str()
        );
        return reply(Err((StatusCode::FORBIDDEN, why)));
    }
    let actor = Actor {
        pubkey: &auth.pubkey,
        admin,
    };
    reply(apply(&state, &auth, actor, call).await)
}

/// Carries out a checked call for `actor`.
async fn apply(state: &AppState, auth: &Authed, actor: Actor<'_>, call: Call) -> Answered {
    let community = &auth.tenant.community;
    let (id, keys) = (community.id.as_str(), &community.keys);
    match call {
        Call::SupportedMethods => supported(state, id, actor).await,
        Call::Add { list, value, reason } => {
            let r = state
                .store
                .add_to_list(id, keys, list, &value, &reason, actor.pubkey)
                .await;
            announce(state, id, r.map_err(failed)?);
            Ok(json!(true))
        }
        Call::Show(list) => show(state, id, list).await,
        Call::ChangeName(text) => change(state, auth, InfoField::Name, &text).await,
        Call::ChangeDescription(text) => change(state, auth, InfoField::Description, &text).await,
        Call::ListDeliveries(q) => list_deliveries(state, id, actor, q).await,
        Call::RetryDelivery(d) => on_delivery(state, auth, actor, &d, true).await,
        Call::CancelDelivery(d) => on_delivery(state, auth, actor, &d, false).await,
        Call::CancelRun(run) => {
            let changed = cancel_run(state, auth, actor, run).await?;
            state.kick.kick();
            Ok(json!(changed))
        }
        Call::PauseWorkflow(w) => pause(state, auth, actor, w, true).await,
        Call::ResumeWorkflow(w) => pause(state, auth, actor, w, false).await,
        Call::RetryDeliveries(ids) => {
            admin_or_owner(state, id, actor).await?;
            bulk(state, ids, |d| act_on_delivery(state, auth, actor, d, true)).await
        }
        Call::CancelDeliveries(ids) => {
            admin_or_owner(state, id, actor).await?;
            bulk(state, ids, |d| act_on_delivery(state, auth, actor, d, false)).await
        }
        Call::CancelRuns(ids) => {
            admin_or_owner(state, id, actor).await?;
            bulk(state, ids, |r| cancel_run(state, auth, actor, r)).await
        }
        Call::RerunRun(run, o) => {
            let rerun = rerun_run(state, auth, actor, run, o.definition).await?;
            state.kick.kick();
            Ok(json!(rerun))
        }
        Call::RerunRuns(ids, o) => {
            admin_or_owner(state, id, actor).await?;
            bulk(state, ids, |r| rerun_run(state, auth, actor, r, o.definition)).await
        }
        Call::SetMentions(scope, on) => {
            admin_or_owner(state, id, actor).await?;
            let (setting, notice) = state
                .store
                .set_mentions(id, keys, actor, &scope, on)
                .await
                .map_err(failed)?;
            if let Some(n) = notice {
                announce(state, id, n);
            }
            Ok(json!(setting))
        }
        Call::ListMentions => {
            admin_or_owner(state, id, actor).await?;
            let owner = (!actor.admin).then_some(actor.pubkey);
            let rows = state.store.list_mentions(id, owner).await;
            Ok(json!(rows.map_err(|e| failed(e.into()))?))
        }
    }
}

/// A bulk call (by an admin or a workflow owner: anyone else is refused
/// before any id): each id acted on as its single call would be, one
/// transaction and one notice each, in order; an id refused is reported
/// with its error and the rest go on. The engine is woken once, after.
async fn bulk<T, F, Fut>(state: &AppState, ids: Vec<String>, act: F) -> Answered
where
    T: serde::Serialize,
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<T, (StatusCode, String)>>,
{
    debug_assert!(ids.len() <= nip86::MAX_BULK_IDS);
    let mut answer = nip86::BulkChanged {
        changed: Vec::with_capacity(ids.len()),
        refused: Vec::new(),
    };
    for id in ids {
        match act(id.clone()).await {
            Ok(changed) => answer.changed.push(changed),
            Err((_, error)) => answer.refused.push(nip86::BulkRefused { id, error }),
        }
    }
    state.kick.kick();
    Ok(json!(answer))
}

/// `cancelrun` on one run: the run and its open deliveries, and the notice.
async fn cancel_run(
    state: &AppState,
    auth: &Authed,
    actor: Actor<'_>,
    run: String,
) -> Result<nip86::RunChanged, (StatusCode, String)> {
    let community = &auth.tenant.community;
    let notice = state
        .store
        .cancel_run(&community.id, &community.keys, actor, &run)
        .await
        .map_err(failed)?;
    announce(state, &community.id, notice);
    Ok(nip86::RunChanged {
        id: run,
        status: protocol::api::RunStatus::Cancelled,
    })
}

/// `rerunrun` on one run: the rerun, and its notice when it is new.
async fn rerun_run(
    state: &AppState,
    auth: &Authed,
    actor: Actor<'_>,
    run: String,
    which: nip86::RerunDefinition,
) -> Result<nip86::RunRerun, (StatusCode, String)> {
    let community = &auth.tenant.community;
    let (answer, notice) = state
        .store
        .rerun_run(&community.id, &community.keys, actor, &run, which)
        .await
        .map_err(failed)?;
    if let Some(notice) = notice {
        announce(state, &community.id, notice);
    }
    Ok(answer)
}

/// Publishes a committed notice to this process's subscribers (which also
/// makes this process forget its cached moderation at once).
fn announce(state: &AppState, community: &str, (event, raw): Notice) {
    state.publish(community, Arc::new(event), Arc::from(raw));
}

/// Refuses a caller that is neither an admin nor the owner of a workflow
/// or a managed agent here (the calls on one run, delivery, workflow or
/// agent check its owner).
async fn admin_or_owner(
    state: &AppState,
    community: &str,
    actor: Actor<'_>,
) -> Result<(), (StatusCode, String)> {
    let store = &state.store;
    let owner = actor.admin
        || store
            .owns_workflow(community, actor.pubkey)
            .await
            .map_err(|e| failed(e.into()))?
        || store
            .owns_agent(community, actor.pubkey)
            .await
            .map_err(|e| failed(e.into()))?;
    if !owner {
        let why =
            "restricted: only this community's admins and the owners of its workflows and agents manage it";
        return Err((StatusCode::FORBIDDEN, why.into()));
    }
    Ok(())
}

/// The methods the caller may call: all for an admin; for the owner of a
/// workflow here, those open to owners; anyone else is refused.
async fn supported(state: &AppState, community: &str, actor: Actor<'_>) -> Answered {
    admin_or_owner(state, community, actor).await?;
    let names: Vec<&str> = Method::ALL
        .iter()
        .filter(|m| actor.admin || m.open_to_owners())
        .map(|m| m.as_str())
        .collect();
    Ok(json!(names))
}

async fn show(state: &AppState, community: &str, list: List) -> Answered {
    let entries = state
        .store
        .list_entries(community, list)
        .await
        .map_err(|e| failed(e.into()))?;
    Ok(match list {
        List::BannedEvents => json!(entries
            .into_iter()
            .map(|(id, reason)| nip86::EventEntry {
                id: hex::encode(id),
                reason
            })
            .collect::<Vec<_>>()),
        _ => json!(entries
            .into_iter()
            .map(|(pk, reason)| nip86::PubkeyEntry {
                pubkey: hex::encode(pk),
                reason
            })
            .collect::<Vec<_>>()),
    })
}

async fn change(state: &AppState, auth: &Authed, field: InfoField, text: &str) -> Answered {
    let community = &auth.tenant.community;
    let notice = state
        .store
        .set_info(&community.id, &community.keys, field, text, &auth.pubkey)
        .await
        .map_err(|e| failed(e.into()))?;
    announce(state, &community.id, notice);
    Ok(json!(true))
}

/// Default rows of `listdeliveries`.
const DEFAULT_LIST_DELIVERIES: u32 = 100;

async fn list_deliveries(state: &AppState, community: &str, actor: Actor<'_>, q: DeliveryQuery) -> Answered {
    admin_or_owner(state, community, actor).await?;
    let now = i64::try_from(crate::clock::unix_now()).unwrap_or(i64::MAX);
    let target = q
        .target
        .as_deref()
        .map(nostr::prelude::PublicKey::from_hex)
        .transpose()
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("invalid: target: {e}")))?;
    let filter = crate::delivery::rows::ListFilter {
        status: q.status,
        workflow: q.workflow,
        run: q.run,
        target,
        owner: (!actor.admin).then_some(*actor.pubkey),
        before: q.older_than_secs.map(|s| {
            now.saturating_sub(i64::try_from(s).unwrap_or(i64::MAX))
                .saturating_add(1)
        }),
        before_id: None,
    };
    let limit = q.limit.unwrap_or(DEFAULT_LIST_DELIVERIES);
    let rows = state
        .store
        .list_deliveries(community, &filter, limit)
        .await
        .map_err(|e| failed(e.into()))?;
    let views: Vec<protocol::api::DeliveryView> = rows.iter().map(|d| d.list_view()).collect();
    Ok(json!(views))
}

async fn on_delivery(state: &AppState, auth: &Authed, actor: Actor<'_>, id: &str, retry: bool) -> Answered {
    let changed = act_on_delivery(state, auth, actor, id.to_string(), retry).await?;
    // A run reopened or woken by a cancelled row is looked at now.
    state.kick.kick();
    Ok(json!(changed))
}

/// `retrydelivery` or `canceldelivery` on one row, with its notice.
async fn act_on_delivery(
    state: &AppState,
    auth: &Authed,
    actor: Actor<'_>,
    id: String,
    retry: bool,
) -> Result<nip86::DeliveryChanged, (StatusCode, String)> {
    let community = &auth.tenant.community;
    let acted = state
        .store
        .act_on_delivery(
            &community.id,
            &community.keys,
            actor,
            &id,
            retry,
            &state.cfg.deliveries,
        )
        .await
        .map_err(failed)?;
    announce(state, &community.id, acted.notice);
    if retry {
        crate::engine::wake_delivery(state, &community.id, &community.keys, &acted.delivery).await;
    }
    Ok(nip86::DeliveryChanged {
        id,
        status: acted.status,
    })
}

async fn pause(
    state: &AppState,
    auth: &Authed,
    actor: Actor<'_>,
    workflow: String,
    paused: bool,
) -> Answered {
    let community = &auth.tenant.community;
    let notice = state
        .store
        .set_paused(&community.id, &community.keys, actor, &workflow, paused)
        .await
        .map_err(failed)?;
    if let Some(n) = notice {
        announce(state, &community.id, n);
    }
    if !paused {
        state.kick.kick();
    }
    Ok(json!(nip86::WorkflowChanged { id: workflow, paused }))
}
