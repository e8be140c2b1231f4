//! The workflow engine of one relay process: advances runs, fires
//! schedules, sweeps deliveries, and sends wake hints after each commit.
//!
//! Every process runs one engine; they may all work on the same runs and
//! rows at once (PostgreSQL): each step and each transition is one
//! transaction that re-checks the state it changes, so the work collapses
//! to one effect. A run started here is advanced at once (`kick`); the
//! periodic pass picks up everything else, including runs interrupted by a
//! crash, which resume at their current step.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use nostr::prelude::{Event, EventBuilder, Keys, Kind, Timestamp};

use crate::clock::unix_now;
use crate::spans::RunSpan;
use crate::state::AppState;
use crate::workflow::outcalls::{CallAnswer, OutCall};
use crate::workflow::step::{Env, Errand, NewDelivery};

/// How long the engine's list of communities is used before it is read
/// again. Communities are added from the CLI while the relay runs; a pass
/// runs after every trigger, and reading the list on each (communities and
/// their hosts, in a transaction of its own) was measured as one statement
/// in twenty, and a transaction per trigger, under load on PostgreSQL. A
/// new community's first run waits at most this long for the engine to
/// know it.
const COMMUNITIES_REFRESH: Duration = Duration::from_secs(1);

/// Signing keys of every community (see [`COMMUNITIES_REFRESH`]).
struct Communities {
    keys: HashMap<String, Keys>,
    read_at: Option<tokio::time::Instant>,
}

/// The communities' signing keys, read again when older than
/// [`COMMUNITIES_REFRESH`].
async fn communities(state: &AppState, cache: &mut Communities) -> Vec<(String, Keys)> {
    let fresh = cache.read_at.is_some_and(|at| at.elapsed() < COMMUNITIES_REFRESH);
    if !fresh {
        read_communities(state, &mut cache.keys).await;
        cache.read_at = Some(tokio::time::Instant::now());
    }
    cache.keys.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

async fn read_communities(state: &AppState, cache: &mut HashMap<String, Keys>) {
    match state.store.list_communities().await {
        Ok(list) => {
            for c in list {
                if let std::collections::hash_map::Entry::Vacant(v) = cache.entry(c.id.clone()) {
                    match crate::keys::load(&c, state.cfg.keys_dir.as_deref()) {
                        Ok(keys) => {
                            v.insert(keys);
                        }
                        Err(e) => tracing::error!(error = %e, "community not served by the engine"),
                    }
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "listing communities failed"),
    }
}

/// Announces events of a committed transaction to live subscribers here.
fn announce(state: &AppState, community: &str, published: Vec<(Event, String)>) {
    for (ev, raw) in published {
        state.publish(community, Arc::new(ev), Arc::from(raw));
    }
}

/// Sends the wake hints (kind 24620) of a step's new delivery rows: each
/// to this process's subscribers as soon as it is signed, then all of them
/// to the other processes (PostgreSQL) in one transaction, so that the
/// last agent of a step with many recipients does not wait for a
/// round trip per earlier wake. A wake is only an accelerator: agents also
/// poll, so a lost wake costs latency, never work.
async fn wake_all(state: &AppState, community: &str, keys: &Keys, new: &[NewDelivery]) {
    let started = std::time::Instant::now();
    let mut raws = Vec::with_capacity(new.len());
    for d in new {
        if let Some(raw) = wake(state, community, keys, d) {
            raws.push(raw);
        }
    }
    tracing::debug!(
        wakes = raws.len(),
        elapsed_us = started.elapsed().as_micros() as u64,
        "wakes signed and sent here"
    );
    if let Err(e) = state.store.publish_ephemeral(community, &raws).await {
        tracing::warn!(error = %e, "wakes not forwarded to other relay processes");
    }
}

/// Wakes the target of a delivery made pending again (`retrydelivery`).
pub async fn wake_delivery(
    state: &AppState,
    community: &str,
    keys: &Keys,
    d: &crate::delivery::rows::Delivery,
) {
    let Ok(target) = nostr::prelude::PublicKey::from_slice(&d.target) else {
        return;
    };
    let new = NewDelivery {
        id: d.id.clone(),
        target,
        channel: d.channel.clone(),
        definition_event_id: hex::encode(d.definition_event_id),
        run_id: d.run_id.clone(),
        step_id: d.step_id.clone(),
        message_event_id: hex::encode(d.message_event_id),
    };
    wake_all(state, community, keys, &[new]).await;
}

/// Wakes `agent` for the row it would claim next, after one of its rows
/// under a cap left `claimed` (a wake for a row the cap still holds back
/// only costs the agent a claim that finds nothing). Rows of the same
/// workflow for other agents are found by those agents' polls.
pub async fn wake_next(state: &AppState, community: &str, keys: &Keys, agent: &nostr::prelude::PublicKey) {
    match state
        .store
        .next_claimable(community, agent, &state.cfg.deliveries)
        .await
    {
        Ok(Some(d)) => wake_delivery(state, community, keys, &d).await,
        Ok(None) => {}
        Err(e) => tracing::warn!(community, error = %e, "looking for the next row under a cap failed"),
    }
}

/// Signs one wake hint and publishes it here; returns its JSON.
fn wake(state: &AppState, community: &str, keys: &Keys, d: &NewDelivery) -> Option<String> {
    let tags = protocol::workflow::wake_tags(
        &d.target,
        &d.channel,
        &d.id,
        &d.definition_event_id,
        &d.run_id,
        &d.step_id,
        &d.message_event_id,
    );
    let ev = protocol::sign::sign(
        EventBuilder::new(Kind::from_u16(protocol::kinds::WAKE_HINT), "")
            .tags(tags)
            .custom_created_at(Timestamp::from_secs(unix_now())),
        keys,
    );
    let raw = serde_json::to_string(&ev).ok()?;
    if let Err(e) = crate::faults::check("wake:before_send") {
        tracing::warn!(error = %e, "wake not sent");
        return None;
    }
    state.publish(community, Arc::new(ev), Arc::from(raw.as_str()));
    Some(raw)
}

/// What every step execution of this process is given.
fn env(state: &AppState) -> Env<'_> {
    Env {
        deliveries: &state.cfg.deliveries,
        limits: &state.cfg.limits,
        call_grace_secs: state.cfg.webhooks.call_grace_secs,
    }
}

/// Sends a step's webhook call on a task of its own (a call may take up
/// to a minute; the engine's pass does not wait for it), records its answer
/// in the run, and kicks the engine so the run goes on. If this process
/// dies before the answer is recorded, the call's deadline makes the run
/// count it as interrupted.
fn spawn_call(state: &Arc<AppState>, community: &str, keys: &Keys, call: OutCall) {
    let (state, community, keys) = (state.clone(), community.to_string(), keys.clone());
    tokio::spawn(async move {
        let allow = state.cfg.webhook_allow_hosts(&community);
        // Test-only: die after the call was recorded, before it is sent.
        if crate::faults::check("webhook:before_send").is_err() {
            return;
        }
        let sent_at = crate::clock::unix_now() as i64;
        let result = state
            .outcaller
            .send(&community, allow, &state.secrets, &call)
            .await;
        state.spans.emit(call_span(&call, &result, sent_at));
        if let crate::workflow::outcalls::CallResult::Failed { code, message } = &result {
            tracing::warn!(
                community,
                run_id = call.run_id,
                step = call.step_id,
                code,
                message,
                "webhook call failed"
            );
        }
        if crate::faults::check("webhook:after_send").is_err() {
            return;
        }
        let answer = CallAnswer {
            step_id: call.step_id.clone(),
            attempt: call.attempt,
            result,
        };
        if record_answer(&state, &community, &call.run_id, &answer).await {
            // Test-only: die with the answer recorded, before the run goes on.
            if crate::faults::check("webhook:after_answer").is_err() {
                return;
            }
            advance(&state, &community, &keys, &call.run_id).await;
        }
    });
}

/// The span of one call attempt (the `traceparent` it sent), under its
/// step's.
fn call_span(
    call: &OutCall,
    result: &crate::workflow::outcalls::CallResult,
    sent_at: i64,
) -> Option<RunSpan> {
    use crate::workflow::outcalls::CallResult;
    let ids = protocol::trace::TraceParent::parse(call.traceparent.as_deref()?)?;
    let step = protocol::trace::step_span(&ids.trace_hex(), &call.step_id)?;
    let mut span = RunSpan::new(
        format!("call {}", call.step_id),
        ids,
        Some(step),
        sent_at,
        crate::clock::unix_now() as i64,
    )
    .with("http.request.method", call.method.as_str())
    .with("url.full", call.url.clone())
    .with("workflow.run_id", call.run_id.clone())
    .with("workflow.call.attempt", call.attempt.to_string());
    span.client = true;
    match result {
        CallResult::Answered { status, .. } => {
            span = span.with("http.response.status_code", status.to_string());
            if !(200..300).contains(status) {
                span.error = Some(format!("http_{status}"));
            }
        }
        CallResult::Failed { code, .. } => span.error = Some(code.clone()),
    }
    Some(span)
}

/// Records a call's answer and wakes its run, trying again (bounded)
/// while the store fails; returns whether the answer was taken. An answer
/// lost here makes the run count the call as interrupted at its deadline
/// (sent again only with `retry`).
async fn record_answer(state: &AppState, community: &str, run_id: &str, answer: &CallAnswer) -> bool {
    const TRIES: u32 = 5;
    for i in 0..TRIES {
        match state.store.record_call_answer(community, run_id, answer).await {
            Ok(taken) => return taken,
            Err(e) => {
                tracing::warn!(community, run_id, error = %e, try_n = i + 1, "recording a webhook answer failed");
                tokio::time::sleep(Duration::from_millis(200 << i)).await;
            }
        }
    }
    false
}

/// Advances one run as far as it goes now; returns whether a step
/// committed.
async fn advance(state: &Arc<AppState>, community: &str, keys: &Keys, run_id: &str) -> bool {
    // Bounded: a run has at most MAX_STEPS steps.
    for _ in 0..=protocol::workflow::MAX_STEPS {
        let started = std::time::Instant::now();
        let step = state
            .store
            .execute_run_step(community, keys, run_id, &env(state))
            .await;
        tracing::debug!(
            run_id,
            elapsed_us = started.elapsed().as_micros() as u64,
            "run step"
        );
        match step {
            Ok(out) => {
                state.spans.emit(out.spans);
                announce(state, community, out.published);
                wake_all(state, community, keys, &out.new_deliveries).await;
                for errand in out.errands {
                    match errand {
                        Errand::Call(call) => spawn_call(state, community, keys, call),
                    }
                }
                if !out.more {
                    return true;
                }
            }
            Err(e) => {
                tracing::warn!(community, run_id, error = %e, "workflow step failed; will retry");
                return false;
            }
        }
    }
    true
}

/// One pass over every community: schedules, a round of runs, sweep.
/// Returns whether a community had more due runs than its round took (the
/// engine then passes again at once).
async fn pass(state: &Arc<AppState>, keys: &mut Communities, schedules_due: bool, sweep_due: bool) -> bool {
    let all = communities(state, keys).await;
    if schedules_due {
        for (community, _) in &all {
            match state.store.fire_schedules(community).await {
                Ok(_) => {
                    metrics::counter!(crate::telemetry::SCHEDULE_PASSES, "community" => community.clone())
                        .increment(1)
                }
                Err(e) => tracing::warn!(community, error = %e, "schedules failed"),
            }
        }
    }
    let more = run_round(state, &all).await;
    if sweep_due {
        for (community, k) in &all {
            match state
                .store
                .sweep_deliveries(community, k, &state.cfg.deliveries)
                .await
            {
                Ok(notices) => announce(state, community, notices),
                Err(e) => tracing::warn!(community, error = %e, "delivery sweep failed"),
            }
        }
    }
    more
}

/// Advances one round of due runs: each community's share (`weight` x
/// `concurrent_runs`, at most `run_batch`) of its oldest due runs
/// (`views::due_runs`), served in weighted turns (`shares::weighted_turns`);
/// when a community had more, the next round follows at once. A community
/// with a backlog of thousands thus takes its share of each round, and
/// another's new run waits for one round, not for the backlog. Every run
/// of a round ends (as far as it goes) before the next round begins, and a
/// round takes the oldest due runs first, so a run due before another was
/// created is advanced no later (the tests' barrier relies on it:
/// `tests::workflow::Fixture::barrier`). Returns whether a community had
/// more due than its share and the round got on (a round whose every
/// step failed does not ask for another at once).
async fn run_round(state: &Arc<AppState>, all: &[(String, Keys)]) -> bool {
    let wf = &state.cfg.workflows;
    let mut lines = Vec::with_capacity(all.len());
    let mut more = false;
    for (i, (community, _)) in all.iter().enumerate() {
        let weight = state.cfg.weight(community);
        let share = weight
            .saturating_mul(wf.concurrent_runs.max(1) as u32)
            .clamp(1, wf.run_batch.max(1));
        // One more than the share: whether there is more is then known.
        match state.store.due_runs(community, share + 1).await {
            Ok(mut runs) => {
                more |= runs.len() > share as usize;
                runs.truncate(share as usize);
                lines.push((weight, runs.into_iter().map(|run| (i, run)).collect::<Vec<_>>()));
            }
            Err(e) => tracing::warn!(community, error = %e, "listing runs failed"),
        }
    }
    // Side by side: a step waits on the database for most of its time, and
    // runs that arrive together (several clients, a schedule, a restart's
    // backlog) would wait for each other. A run is advanced by one task of
    // the round, so its own steps stay in order.
    let got_on = std::sync::atomic::AtomicBool::new(false);
    futures_util::stream::iter(crate::shares::weighted_turns(lines))
        .for_each_concurrent(wf.concurrent_runs, |(i, run)| {
            let ((community, k), got_on) = (&all[i], &got_on);
            async move {
                if advance(state, community, k, &run).await {
                    got_on.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
        })
        .await;
    more && got_on.into_inner()
}

/// Runs the engine until shutdown. The first pass (at start-up) sweeps
/// every nonterminal state and resumes interrupted runs.
pub async fn run(state: Arc<AppState>) {
    let wf = state.cfg.workflows.clone();
    let run_every = Duration::from_millis(wf.run_poll_interval_ms.max(10));
    let schedule_every = Duration::from_millis(wf.schedule_poll_interval_ms.max(100));
    let sweep_every = Duration::from_millis(state.cfg.deliveries.sweep_interval_ms.max(10));
    let mut keys = Communities {
        keys: HashMap::new(),
        read_at: None,
    };
    let mut last_schedule = tokio::time::Instant::now() - schedule_every;
    let mut last_sweep = tokio::time::Instant::now() - sweep_every;
    loop {
        let now = tokio::time::Instant::now();
        let schedules_due = now.duration_since(last_schedule) >= schedule_every;
        let sweep_due = now.duration_since(last_sweep) >= sweep_every;
        if schedules_due {
            last_schedule = now;
        }
        if sweep_due {
            last_sweep = now;
        }
        state
            .engine_beat
            .store(crate::clock::unix_now_ms(), std::sync::atomic::Ordering::Relaxed);
        let more = pass(&state, &mut keys, schedules_due, sweep_due).await;
        // The heartbeat an operator alerts on: `time() - it` grows when the
        // engine is stuck or gone.
        let done_ms = crate::clock::unix_now_ms();
        metrics::gauge!(crate::telemetry::ENGINE_LAST_TICK).set(done_ms as f64 / 1000.0);
        if more {
            // A backlog: the next round at once (after a yield, so the
            // rest of the process is not starved by a long backlog).
            tokio::task::yield_now().await;
            if state.shutdown.is_cancelled() {
                return;
            }
            continue;
        }
        let nap = run_every.min(sweep_every);
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = state.kick.kicked() => {}
            _ = tokio::time::sleep(nap) => {}
        }
    }
}
