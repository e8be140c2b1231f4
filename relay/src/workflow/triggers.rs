//! What starts a run: a message or a reaction in the workflow's channel,
//! a schedule's slot (once per slot, whatever the number of relay
//! processes), each run created only while the owner is a channel member
//! (unique per workflow and cause).

use nostr::prelude::{Event, PublicKey};
use protocol::api::CauseKind;
use protocol::workflow::{self, Cause};
use serde_json::{json, Value};

use super::definitions::{
    is_member, load_definition, load_workflow, new_id, workflow_row, WorkflowRow, WORKFLOW_COLS,
};
use crate::events::rules as events;
use crate::persistence::db::{Tx, Q};
use crate::persistence::StoreError;
use crate::refusal::{unless_refused, Answer, CallError, Refusal};

/// Creates a run for a cause unless that cause already made one (unique per
/// community, workflow and cause), only while the workflow is live and its
/// owner a member of its channel. Returns the run id and whether it is new.
pub async fn create_run(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: &str,
    cause: &Cause,
    mut trigger_context: Value,
) -> Answer<(String, bool)> {
    let w = startable(tx, community, workflow_id).await?;
    trigger_context["cause"] = json!(cause);
    trigger_context["channel"] = json!(w.channel);
    let run = NewRun {
        cause,
        definition_event_id: w.definition_event_id,
        current_step: 0,
        trace: "[]".into(),
        trigger_context,
    };
    Ok(insert_run(tx, community, &w, run).await?)
}

/// The workflow, if a run of it may start now: live, not paused, its
/// owner a member of its channel.
pub(crate) async fn startable(tx: &mut Tx<'_>, community: &str, workflow_id: &str) -> Answer<WorkflowRow> {
    let w = load_workflow(tx, community, workflow_id)
        .await?
        .ok_or(Refusal::UnknownWorkflow)?;
    if !w.enabled || w.deleted {
        return Err(Refusal::WorkflowDisabled.into());
    }
    if w.paused {
        return Err(Refusal::WorkflowPaused.into());
    }
    // A run would read and post into a channel the owner may no longer see.
    if !is_member(tx, community, &w.channel, &w.owner).await? {
        return Err(Refusal::OwnerNotMember.into());
    }
    Ok(w)
}

/// A run about to be inserted: a new one starts at step 0 with an empty
/// trace; a rerun where its origin ended, with the steps before kept.
pub(crate) struct NewRun<'a> {
    pub(crate) cause: &'a Cause,
    pub(crate) definition_event_id: [u8; 32],
    pub(crate) current_step: i64,
    /// The trace as stored (JSON text).
    pub(crate) trace: String,
    pub(crate) trigger_context: Value,
}

/// Inserts a running run of `w` unless its cause already made one;
/// returns the run's id and whether this call made it.
pub(crate) async fn insert_run(
    tx: &mut Tx<'_>,
    community: &str,
    w: &WorkflowRow,
    run: NewRun<'_>,
) -> Result<(String, bool), StoreError> {
    let now = tx.now().await?;
    let id = new_id();
    let inserted = tx
        .exec(
            Q::new(
                "INSERT INTO workflow_runs (community_id, id, workflow_id, definition_event_id, channel, owner, \
                 cause_type, cause_id, status, current_step, trigger_context, trace, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'running', $9, $10, $11, $12, $12) \
                 ON CONFLICT (community_id, workflow_id, cause_type, cause_id) DO NOTHING",
            )
            .bind(community)
            .bind(id.as_str())
            .bind(w.id.as_str())
            .bind(run.definition_event_id)
            .bind(w.channel.as_str())
            .bind(w.owner)
            .bind(run.cause.kind.as_str())
            .bind(run.cause.id.as_str())
            .bind(run.current_step)
            .bind(run.trigger_context.to_string())
            .bind(run.trace)
            .bind(now),
        )
        .await?;
    if inserted == 1 {
        return Ok((id, true));
    }
    let existing = run_of_cause(tx, community, &w.id, run.cause)
        .await?
        .ok_or_else(|| StoreError::Corrupt("run vanished".into()))?;
    Ok((existing, false))
}

/// The run a cause made of a workflow, if any.
pub(crate) async fn run_of_cause(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: &str,
    cause: &Cause,
) -> Result<Option<String>, StoreError> {
    let row = tx
        .one(
            Q::new(
                "SELECT id FROM workflow_runs WHERE community_id = $1 AND workflow_id = $2 \
                 AND cause_type = $3 AND cause_id = $4",
            )
            .bind(community)
            .bind(workflow_id)
            .bind(cause.kind.as_str())
            .bind(cause.id.as_str()),
        )
        .await?;
    row.map(|r| r.text(0)).transpose()
}

/// A kind 9 stored in a channel: starts every matching `message_posted`
/// workflow. Relay-signed messages never trigger workflows. Returns the new runs.
pub async fn on_message(
    tx: &mut Tx<'_>,
    community: &str,
    relay_pubkey: &PublicKey,
    event: &Event,
    channel: &str,
) -> Result<Vec<String>, StoreError> {
    if event.pubkey == *relay_pubkey || event.kind.as_u16() != workflow::MESSAGE_KIND {
        return Ok(Vec::new());
    }
    let ctx = json!({"text": event.content, "author": event.pubkey.to_hex(), "event_id": event.id.to_hex()});
    start_event_runs(tx, community, channel, "message_posted", event, ctx).await
}

/// Starts a run of every live workflow of `channel` with `trigger` whose
/// filter matches `event` (cause: the event), with `ctx` as its trigger.
async fn start_event_runs(
    tx: &mut Tx<'_>,
    community: &str,
    channel: &str,
    trigger: &str,
    event: &Event,
    ctx: Value,
) -> Result<Vec<String>, StoreError> {
    let rows = triggered_by(tx, community, channel, trigger).await?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let author_is_agent = is_agent(tx, community, &event.pubkey).await?;
    let cause = Cause {
        kind: CauseKind::Event,
        id: event.id.to_hex(),
    };
    let mut runs = Vec::new();
    for w in &rows {
        let Some(def) = load_definition(tx, community, &w.definition_event_id).await? else {
            continue;
        };
        if !def
            .trigger
            .matches_event(&event.content, &event.pubkey, author_is_agent)
        {
            continue;
        }
        match create_run(tx, community, &w.id, &cause, ctx.clone()).await {
            Ok((run, true)) => runs.push(run),
            Ok((_, false)) => {}
            // A paused workflow's trigger passes it by (docs/protocol.md,
            // "Management"); never unseen: counted, with why.
            Err(CallError::Refused(why)) => {
                crate::telemetry::count_trigger_refusal(trigger, why.code());
                tracing::debug!(community, workflow = %w.id, trigger, code = why.code(), "trigger matched, no run");
            }
            Err(CallError::Store(e)) => return Err(e),
        }
    }
    Ok(runs)
}

/// The live workflows of `channel` with `trigger`, whose owner is a member
/// now (`create_run` checks it again, for every trigger).
async fn triggered_by(
    tx: &mut Tx<'_>,
    community: &str,
    channel: &str,
    trigger: &str,
) -> Result<Vec<WorkflowRow>, StoreError> {
    let rows = tx
        .all(
            Q::new(format!(
                "SELECT {WORKFLOW_COLS} FROM workflows w WHERE community_id = $1 AND channel = $2 \
                 AND trigger = $3 AND enabled AND NOT deleted AND EXISTS (SELECT 1 FROM \
                 channel_members m WHERE m.community_id = w.community_id AND m.channel_id = w.channel \
                 AND m.pubkey = w.owner) ORDER BY id"
            ))
            .bind(community)
            .bind(channel)
            .bind(trigger),
        )
        .await?;
    rows.iter().map(workflow_row).collect()
}

/// Whether `pubkey` is a registered managed agent.
pub(crate) async fn is_agent(
    tx: &mut Tx<'_>,
    community: &str,
    pubkey: &PublicKey,
) -> Result<bool, StoreError> {
    tx.exists(
        Q::new("SELECT 1 FROM agents WHERE community_id = $1 AND pubkey = $2")
            .bind(community)
            .bind(pubkey.to_bytes()),
    )
    .await
}

/// A reaction (kind 7) stored in `channel` on a message of the channel:
/// starts every matching `reaction_added` workflow. Reactions signed by the
/// relay never trigger workflows, and an agent's only when the filter says
/// so. Returns the new runs.
pub async fn on_reaction(
    tx: &mut Tx<'_>,
    community: &str,
    relay_pubkey: &PublicKey,
    event: &Event,
    channel: &str,
) -> Result<Vec<String>, StoreError> {
    if event.pubkey == *relay_pubkey {
        return Ok(Vec::new());
    }
    let Some(target) = protocol::approval::reacted_to(event).map(str::to_string) else {
        return Ok(Vec::new());
    };
    if !in_channel(tx, community, channel, &target).await? {
        return Ok(Vec::new());
    }
    let ctx = json!({"text": event.content, "author": event.pubkey.to_hex(), "event_id": target,
                     "reaction_id": event.id.to_hex()});
    start_event_runs(tx, community, channel, "reaction_added", event, ctx).await
}

/// Whether the event with hex id `id` is stored in `channel`.
async fn in_channel(tx: &mut Tx<'_>, community: &str, channel: &str, id: &str) -> Result<bool, StoreError> {
    let Some(bytes) = events::id_of_hex(id) else {
        return Ok(false);
    };
    tx.exists(
        Q::new("SELECT 1 FROM events WHERE community_id = $1 AND id = $2 AND channel = $3")
            .bind(community)
            .bind(bytes)
            .bind(channel),
    )
    .await
}

/// Fires the current slot of every live schedule of a community (each slot
/// once, whatever the number of processes). Returns new run ids.
pub async fn fire_schedules(tx: &mut Tx<'_>, community: &str) -> Result<Vec<String>, StoreError> {
    let now = tx.now().await?;
    let rows = tx
        .all(
            Q::new(
                "SELECT id, interval_secs, cron, timezone, enabled_at FROM workflows WHERE community_id = $1 \
                 AND trigger = 'schedule' AND enabled AND NOT deleted AND NOT paused",
            )
            .bind(community),
        )
        .await?;
    let mut runs = Vec::new();
    for r in rows {
        let (id, enabled_at) = (r.text("id")?, r.int("enabled_at")?);
        let schedule = (
            r.opt_int("interval_secs")?,
            r.opt_text("cron")?,
            r.opt_text("timezone")?,
        );
        // A schedule fires from its first full slot after it was enabled.
        let Some(slot) = slot_due(schedule, enabled_at, now) else {
            continue;
        };
        let cause = Cause {
            kind: CauseKind::Schedule,
            id: slot.to_string(),
        };
        if let Some((run, true)) =
            unless_refused(create_run(tx, community, &id, &cause, json!({"slot": slot})).await)?
        {
            runs.push(run);
        }
    }
    Ok(runs)
}

/// The slot a schedule fires at `now` (unix seconds), if any: every
/// `interval` seconds, or the latest slot of `cron` in `timezone`; never
/// one before `enabled_at`. Each slot fires once because its run is
/// unique per (workflow, slot) across processes; after downtime only the
/// latest missed one is asked for.
fn slot_due(
    (interval, cron, timezone): (Option<i64>, Option<String>, Option<String>),
    enabled_at: i64,
    now: i64,
) -> Option<i64> {
    let slot = match (interval, cron) {
        (Some(interval), _) if interval > 0 => now - now.rem_euclid(interval),
        (_, Some(expr)) => {
            // Checked at publish; a stored expression that no longer
            // parses (a newer parser) fires nothing rather than failing the pass.
            let cron = protocol::schedule::Cron::parse(&expr, timezone.as_deref()).ok()?;
            cron.due(enabled_at - 1, now)?
        }
        _ => return None,
    };
    (slot >= enabled_at).then_some(slot)
}
