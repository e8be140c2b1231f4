//! Workflows: definitions, triggers, durable runs and the `send_message`
//! step, each change inside one transaction.
//!
//! The step transaction is the heart of delivery: it stores the relay-signed
//! kind 9, the step's message record, one delivery row per managed-agent
//! recipient (unique per run, step and target; foreign key to the exact
//! event) and the run's advance, or none of them. A replay finds the step's
//! message record and reuses the event; rows it already made are kept
//! (`ON CONFLICT DO NOTHING`), so nothing is duplicated.

use nostr::prelude::{Event, EventBuilder, FinalizeEvent, Keys, Kind, PublicKey, Tag, Timestamp};
use protocol::api::{CauseKind, CauseView, DeliveryStatus, RunStatus, RunView};
use protocol::template::{self, Template};
use protocol::workflow::{self, Cause, Definition, MessageBinding, Step, Trigger, Validated};
use serde_json::{json, Value};

use super::db::{named, Pool, Row, Tx, Q};
use super::events::{self, created_at_of, Deleted};
use super::refusal::{unless_refused, Answer, Refusal};
use super::{InsertOutcome, StoreError};
use crate::admission;
use crate::config::{DeliveryConfig, Limits};
use crate::faults;

/// A delivery row made by a step, for its wake hint.
#[derive(Debug, Clone)]
pub struct NewDelivery {
    pub id: String,
    pub target: PublicKey,
    pub channel: String,
    pub definition_event_id: String,
    pub run_id: String,
    pub step_id: String,
    pub message_event_id: String,
}

/// What one step execution produced.
#[derive(Debug, Default)]
pub struct StepOutcome {
    /// Events to announce after commit (the message when newly made).
    pub published: Vec<(Event, String)>,
    /// Delivery rows made by this execution (wake each).
    pub new_deliveries: Vec<NewDelivery>,
    /// Whether the run has more steps to execute.
    pub more: bool,
}

/// Delivery rows in one insert, at most (19 binds a row: within both
/// backends' bind limits).
const MAX_ROWS_PER_INSERT: usize = 500;

/// A new random id (128 bits, hex).
pub fn new_id() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

struct WorkflowRow {
    id: String,
    channel: String,
    owner: [u8; 32],
    definition_event_id: [u8; 32],
    enabled: bool,
    deleted: bool,
}

fn workflow_row(r: &Row) -> Result<WorkflowRow, StoreError> {
    Ok(WorkflowRow {
        id: r.text("id")?,
        channel: r.text("channel")?,
        owner: r.id32("owner")?,
        definition_event_id: r.id32("definition_event_id")?,
        enabled: r.bool("enabled")?,
        deleted: r.bool("deleted")?,
    })
}

const WORKFLOW_COLS: &str = "id, channel, owner, definition_event_id, enabled, deleted";

async fn load_workflow(
    tx: &mut Tx<'_>,
    community: &str,
    id: &str,
) -> Result<Option<WorkflowRow>, StoreError> {
    let q = Q::new(format!(
        "SELECT {WORKFLOW_COLS} FROM workflows WHERE community_id = $1 AND id = $2"
    ))
    .bind(community)
    .bind(id);
    tx.one(q).await?.as_ref().map(workflow_row).transpose()
}

/// Loads the definition a revision id names (superseded revisions included).
async fn load_definition(
    tx: &mut Tx<'_>,
    community: &str,
    event_id: &[u8; 32],
) -> Result<Option<Definition>, StoreError> {
    let row = tx
        .one(
            Q::new("SELECT raw FROM events WHERE community_id = $1 AND id = $2")
                .bind(community)
                .bind(*event_id),
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let event: Event = serde_json::from_str(&row.text(0)?)
        .map_err(|e| StoreError::Corrupt(format!("stored definition: {e}")))?;
    Ok(workflow::parse(&event.content).ok())
}

/// What recording a definition revision came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Upsert {
    Recorded,
    /// The revision must be refused (the caller rolls back): the client's
    /// answer.
    Refused(String),
}

/// Records a definition revision that was just stored in `tx`.
pub async fn upsert_definition(
    tx: &mut Tx<'_>,
    community: &str,
    event: &Event,
    v: &Validated,
) -> Result<Upsert, StoreError> {
    let now = tx.now().await?;
    let existing = load_workflow(tx, community, &v.workflow_id).await?;
    let trigger = v.definition.trigger.name();
    let (interval, cron, timezone) = match &v.definition.trigger {
        Trigger::Schedule {
            interval_secs,
            cron,
            timezone,
        } => (
            interval_secs.map(|s| i64::try_from(s).unwrap_or(i64::MAX)),
            cron.clone(),
            timezone.clone(),
        ),
        _ => (None, None, None),
    };
    match existing {
        Some(w) if w.owner != event.pubkey.to_bytes() => {
            return Ok(Upsert::Refused(format!(
                "restricted: workflow id {} belongs to another owner",
                v.workflow_id
            )))
        }
        Some(w) if w.channel != v.channel => {
            return Ok(Upsert::Refused(format!(
                "invalid: workflow {} belongs to channel {}",
                v.workflow_id, w.channel
            )))
        }
        Some(w) => {
            let was_live = w.enabled && !w.deleted;
            tx.exec(
                Q::new(
                    "UPDATE workflows SET definition_event_id = $3, trigger = $4, interval_secs = $5, enabled = $6, \
                     cron = $9, timezone = $10, \
                     deleted = FALSE, updated_at = $7, enabled_at = CASE WHEN $8 THEN enabled_at ELSE $7 END \
                     WHERE community_id = $1 AND id = $2",
                )
                .bind(community)
                .bind(v.workflow_id.as_str())
                .bind(event.id.to_bytes())
                .bind(trigger)
                .bind(interval)
                .bind(v.definition.enabled)
                .bind(now)
                .bind(was_live)
                .bind(cron.clone())
                .bind(timezone.clone()),
            )
            .await?;
            if !v.definition.enabled {
                cancel_workflow(tx, community, &v.workflow_id).await?;
            }
        }
        None => {
            tx.exec(
                Q::new(
                    "INSERT INTO workflows (community_id, id, channel, owner, definition_event_id, trigger, \
                     interval_secs, enabled, enabled_at, updated_at, cron, timezone) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10, $11)",
                )
                .bind(community)
                .bind(v.workflow_id.as_str())
                .bind(v.channel.as_str())
                .bind(event.pubkey.to_bytes())
                .bind(event.id.to_bytes())
                .bind(trigger)
                .bind(interval)
                .bind(v.definition.enabled)
                .bind(now)
                .bind(cron)
                .bind(timezone),
            )
            .await?;
        }
    }
    Ok(Upsert::Recorded)
}

/// Stores an event under the event rules (`events::insert`) and, for a
/// stored deletion, runs the workflows' reaction: a deleted definition
/// (by id or by address) deletes its workflow and cancels its runs and
/// open deliveries, in the same transaction.
pub async fn insert_event(
    tx: &mut Tx<'_>,
    community: &str,
    event: &Event,
    raw: &str,
    channel: Option<&str>,
) -> Result<InsertOutcome, StoreError> {
    let inserted = events::insert(tx, community, event, raw, channel).await?;
    on_deleted(tx, community, &event.pubkey, &inserted.deleted).await?;
    Ok(inserted.outcome)
}

/// The workflows' reaction to what a deletion by `author` named.
async fn on_deleted(
    tx: &mut Tx<'_>,
    community: &str,
    author: &PublicKey,
    deleted: &Deleted,
) -> Result<(), StoreError> {
    for id in &deleted.ids {
        on_definition_deleted(tx, community, author, Some(*id), None).await?;
    }
    for (kind, d) in &deleted.addresses {
        if *kind == workflow::DEFINITION_KIND {
            on_definition_deleted(tx, community, author, None, Some(d)).await?;
        }
    }
    Ok(())
}

/// A NIP-09 deletion by `author` of a definition (by id or by address):
/// the workflow stops firing and its pending work is cancelled.
async fn on_definition_deleted(
    tx: &mut Tx<'_>,
    community: &str,
    author: &PublicKey,
    by_id: Option<[u8; 32]>,
    by_workflow_id: Option<&str>,
) -> Result<(), StoreError> {
    let q = match (by_id, by_workflow_id) {
        (Some(id), _) => Q::new(
            "SELECT id FROM workflows WHERE community_id = $1 AND owner = $2 AND definition_event_id = $3",
        )
        .bind(community)
        .bind(author.to_bytes())
        .bind(id),
        (None, Some(w)) => {
            Q::new("SELECT id FROM workflows WHERE community_id = $1 AND owner = $2 AND id = $3")
                .bind(community)
                .bind(author.to_bytes())
                .bind(w)
        }
        (None, None) => return Ok(()),
    };
    for row in tx.all(q).await? {
        let id = row.text(0)?;
        tx.exec(
            Q::new("UPDATE workflows SET deleted = TRUE WHERE community_id = $1 AND id = $2")
                .bind(community)
                .bind(id.as_str()),
        )
        .await?;
        cancel_workflow(tx, community, &id).await?;
    }
    Ok(())
}

/// The deliveries still open (pending or claimed), written as an OR so that
/// each arm reads its own partial index (`deliveries_due` or
/// `deliveries_pending_expiry`, and `deliveries_claimed`; a bitmap OR on
/// PostgreSQL): the cancellations touch only open rows, without an index of
/// their own (migration 0005 on PostgreSQL, 0007 on SQLite, says why).
/// These are the states the machine cancels (`machine::Event::Cancel`;
/// the test below holds the two together).
const ACTIVE_ROWS: &str = "(status = 'pending' OR status = 'claimed')";

/// Cancels a workflow's running runs and open deliveries.
pub async fn cancel_workflow(tx: &mut Tx<'_>, community: &str, workflow_id: &str) -> Result<(), StoreError> {
    let now = tx.now().await?;
    tx.exec(
        Q::new(
            "UPDATE workflow_runs SET status = 'cancelled', error = 'workflow disabled or deleted', \
             error_code = 'workflow_disabled', updated_at = $3 \
             WHERE community_id = $1 AND workflow_id = $2 AND status = 'running'",
        )
        .bind(community)
        .bind(workflow_id)
        .bind(now),
    )
    .await?;
    tx.exec(
        Q::new(format!(
            "UPDATE workflow_agent_deliveries SET status = 'cancelled', failure_code = 'workflow_disabled', \
             claim_token = NULL, updated_at = $3 \
             WHERE community_id = $1 AND workflow_id = $2 AND {ACTIVE_ROWS}"
        ))
        .bind(community)
        .bind(workflow_id)
        .bind(now),
    )
    .await?;
    Ok(())
}

/// Pauses the workflows `departed` owns in `channel` (removed by an admin,
/// or left): they stop firing, their running runs and open deliveries are
/// cancelled, and the channel sees one relay-signed notice per workflow
/// (tag `["workflow-paused", <workflow id>, "owner_not_member"]`). The
/// owner resumes one by publishing its definition again once a member.
/// Returns the notices, to announce after commit.
pub async fn pause_for_departed(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    channel: &str,
    departed: &PublicKey,
    now: i64,
) -> Result<Vec<(Event, String)>, StoreError> {
    let rows = tx
        .all(
            Q::new(
                "SELECT id FROM workflows WHERE community_id = $1 AND channel = $2 AND owner = $3 \
                 AND enabled AND NOT deleted ORDER BY id",
            )
            .bind(community)
            .bind(channel)
            .bind(departed.to_bytes()),
        )
        .await?;
    let mut notices = Vec::with_capacity(rows.len());
    for row in rows {
        let id = row.text(0)?;
        tx.exec(
            Q::new(
                "UPDATE workflows SET enabled = FALSE, updated_at = $3 WHERE community_id = $1 AND id = $2",
            )
            .bind(community)
            .bind(id.as_str())
            .bind(now),
        )
        .await?;
        cancel_workflow(tx, community, &id).await?;
        let text = format!(
            "Workflow {id} is paused: its owner {} is no longer a member of this channel",
            departed.to_hex()
        );
        let tags = vec![
            Tag::custom("workflow-paused", [id.as_str(), Refusal::OwnerNotMember.code()]),
            Tag::custom("workflow-owner", [departed.to_hex()]),
        ];
        notices.push(super::notices::post(tx, community, keys, channel, text, tags, now).await?);
    }
    Ok(notices)
}

/// Cancels everything of a deleted channel.
pub async fn cancel_channel(tx: &mut Tx<'_>, community: &str, channel: &str) -> Result<(), StoreError> {
    let now = tx.now().await?;
    tx.exec(
        Q::new(
            "UPDATE workflows SET deleted = TRUE, updated_at = $3 WHERE community_id = $1 AND channel = $2",
        )
        .bind(community)
        .bind(channel)
        .bind(now),
    )
    .await?;
    tx.exec(
        Q::new(
            "UPDATE workflow_runs SET status = 'cancelled', error = 'channel deleted', \
             error_code = 'channel_deleted', updated_at = $3 \
             WHERE community_id = $1 AND channel = $2 AND status = 'running'",
        )
        .bind(community)
        .bind(channel)
        .bind(now),
    )
    .await?;
    tx.exec(
        Q::new(format!(
            "UPDATE workflow_agent_deliveries SET status = 'cancelled', failure_code = 'channel_deleted', \
             claim_token = NULL, updated_at = $3 \
             WHERE community_id = $1 AND channel = $2 AND {ACTIVE_ROWS}"
        ))
        .bind(community)
        .bind(channel)
        .bind(now),
    )
    .await?;
    Ok(())
}

/// Whether `owner` is a member of `channel` now.
pub async fn is_member(
    tx: &mut Tx<'_>,
    community: &str,
    channel: &str,
    owner: &[u8; 32],
) -> Result<bool, StoreError> {
    tx.exists(
        Q::new("SELECT 1 FROM channel_members WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3")
            .bind(community)
            .bind(channel)
            .bind(*owner),
    )
    .await
}

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
    let w = load_workflow(tx, community, workflow_id)
        .await?
        .ok_or(Refusal::UnknownWorkflow)?;
    if !w.enabled || w.deleted {
        return Err(Refusal::WorkflowDisabled.into());
    }
    // A run would read and post into a channel the owner may no longer see.
    if !is_member(tx, community, &w.channel, &w.owner).await? {
        return Err(Refusal::OwnerNotMember.into());
    }
    trigger_context["cause"] = json!(cause);
    trigger_context["channel"] = json!(w.channel);
    let now = tx.now().await?;
    let id = new_id();
    let inserted = tx
        .exec(
            Q::new(
                "INSERT INTO workflow_runs (community_id, id, workflow_id, definition_event_id, channel, owner, \
                 cause_type, cause_id, status, current_step, trigger_context, trace, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'running', 0, $9, '[]', $10, $10) \
                 ON CONFLICT (community_id, workflow_id, cause_type, cause_id) DO NOTHING",
            )
            .bind(community)
            .bind(id.as_str())
            .bind(workflow_id)
            .bind(w.definition_event_id)
            .bind(w.channel.as_str())
            .bind(w.owner)
            .bind(cause.kind.as_str())
            .bind(cause.id.as_str())
            .bind(trigger_context.to_string())
            .bind(now),
        )
        .await?;
    if inserted == 1 {
        return Ok((id, true));
    }
    let existing = tx
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
        .await?
        .ok_or_else(|| StoreError::Corrupt("run vanished".into()))?;
    Ok((existing.text(0)?, false))
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
    // Only workflows whose owner is a member now (`create_run` checks it
    // again, for every trigger).
    let rows = tx
        .all(
            Q::new(format!(
                "SELECT {WORKFLOW_COLS} FROM workflows w WHERE community_id = $1 AND channel = $2 \
                 AND trigger = 'message_posted' AND enabled AND NOT deleted AND EXISTS (SELECT 1 FROM \
                 channel_members m WHERE m.community_id = w.community_id AND m.channel_id = w.channel \
                 AND m.pubkey = w.owner) ORDER BY id"
            ))
            .bind(community)
            .bind(channel),
        )
        .await?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let author_is_agent = tx
        .exists(
            Q::new("SELECT 1 FROM agents WHERE community_id = $1 AND pubkey = $2")
                .bind(community)
                .bind(event.pubkey.to_bytes()),
        )
        .await?;
    let mut runs = Vec::new();
    for row in &rows {
        let w = workflow_row(row)?;
        let Some(def) = load_definition(tx, community, &w.definition_event_id).await? else {
            continue;
        };
        let Trigger::MessagePosted { filter } = &def.trigger else {
            continue;
        };
        if !filter.matches(&event.content, &event.pubkey, author_is_agent) {
            continue;
        }
        let cause = Cause {
            kind: CauseKind::Event,
            id: event.id.to_hex(),
        };
        let ctx =
            json!({"text": event.content, "author": event.pubkey.to_hex(), "event_id": event.id.to_hex()});
        if let Some((run, true)) = unless_refused(create_run(tx, community, &w.id, &cause, ctx).await)? {
            runs.push(run);
        }
    }
    Ok(runs)
}

struct RunRow {
    workflow_id: String,
    definition_event_id: [u8; 32],
    channel: String,
    owner: PublicKey,
    cause: Cause,
    status: RunStatus,
    current_step: i64,
    trigger_context: Value,
    trace: Value,
}

async fn load_run(tx: &mut Tx<'_>, community: &str, run_id: &str) -> Result<Option<RunRow>, StoreError> {
    let row = tx
        .one(
            Q::new(
                "SELECT workflow_id, definition_event_id, channel, owner, cause_type, cause_id, status, \
                 current_step, trigger_context, trace FROM workflow_runs WHERE community_id = $1 AND id = $2",
            )
            .bind(community)
            .bind(run_id),
        )
        .await?;
    let Some(r) = row else { return Ok(None) };
    let json =
        |s: String| serde_json::from_str(&s).map_err(|e| StoreError::Corrupt(format!("run json: {e}")));
    Ok(Some(RunRow {
        workflow_id: r.text("workflow_id")?,
        definition_event_id: r.id32("definition_event_id")?,
        channel: r.text("channel")?,
        owner: PublicKey::from_slice(&r.blob("owner")?).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        cause: Cause {
            kind: named(&r.text("cause_type")?, CauseKind::parse)?,
            id: r.text("cause_id")?,
        },
        status: named(&r.text("status")?, RunStatus::parse)?,
        current_step: r.int("current_step")?,
        trigger_context: json(r.text("trigger_context")?)?,
        trace: json(r.text("trace")?)?,
    }))
}

/// Why a run ended other than by completing: a stable code and a text.
type RunError = (&'static str, String);

async fn end_run(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    status: RunStatus,
    error: Option<RunError>,
) -> Result<(), StoreError> {
    let now = tx.now().await?;
    let (code, message) = error.map_or((None, None), |(c, m)| (Some(c.to_string()), Some(m)));
    tx.exec(
        Q::new(
            "UPDATE workflow_runs SET status = $3, error = $4, error_code = $5, updated_at = $6 \
             WHERE community_id = $1 AND id = $2",
        )
        .bind(community)
        .bind(run_id)
        .bind(status.as_str())
        .bind(message)
        .bind(code)
        .bind(now),
    )
    .await?;
    Ok(())
}

/// What a step's message is bound to.
struct Binding<'a> {
    run: &'a RunRow,
    run_id: &'a str,
    step_id: &'a str,
    definition_hex: &'a str,
    reply_in_thread: bool,
}

/// Renders and signs a step's message, under the same admission rule as
/// every event a client sends (the relay's own events obey the limits it
/// sets for others): `Err` is why the run fails, `message_too_large` when
/// the rendered text (rendering stops at `max_event_bytes`) or the signed
/// event is over `max_event_bytes`.
fn sign_message(
    keys: &Keys,
    b: &Binding<'_>,
    template: &Template,
    now: i64,
    limits: &Limits,
) -> Result<Signed, StoreError> {
    let too_large = |bytes: String| {
        (
            "message_too_large",
            format!(
                "step {}: the message would be {bytes} bytes; max_event_bytes is {}",
                b.step_id, limits.max_event_bytes
            ),
        )
    };
    let ctx = template::context(&b.run.trigger_context, &b.run.trace);
    let rendered = match template.render_bounded(&ctx, limits.max_event_bytes) {
        Ok(text) => text,
        Err(e) => return Ok(Signed::Refused(too_large(format!("at least {}", e.at_least)))),
    };
    let recipients = workflow::recipients(&b.run.owner, template);
    let reply_to =
        (b.reply_in_thread && b.run.cause.kind == CauseKind::Event).then_some(b.run.cause.id.as_str());
    let tags = workflow::message_tags(&MessageBinding {
        channel: &b.run.channel,
        definition_event_id: b.definition_hex,
        step_id: b.step_id,
        run_id: b.run_id,
        owner: &b.run.owner,
        cause: &b.run.cause,
        recipients: &recipients,
        reply_to,
    });
    let ev = EventBuilder::new(Kind::from_u16(workflow::MESSAGE_KIND), rendered)
        .tags(tags)
        .custom_created_at(Timestamp::from_secs(u64::try_from(now).unwrap_or(0)))
        .finalize(keys)
        .map_err(|e| StoreError::Corrupt(format!("signing workflow message: {e}")))?;
    let raw = serde_json::to_string(&ev).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let rules = admission::Rules {
        limits,
        community_key: &keys.public_key(),
        now: u64::try_from(now).unwrap_or(0),
    };
    Ok(match admission::check(&ev, raw.len(), &rules) {
        Ok(()) => Signed::Message(ev, raw),
        Err(admission::Refusal::TooLarge { bytes, .. }) => Signed::Refused(too_large(bytes.to_string())),
        Err(r) => Signed::Refused(("message_refused", format!("step {}: {r}", b.step_id))),
    })
}

/// A signed step message and its JSON, or why the run fails instead.
enum Signed {
    Message(Event, String),
    Refused(RunError),
}

/// Executes the current step of a run, if it is still running, inside `tx`:
/// its message (made once: a replay reuses it), its delivery rows, and
/// the run's next position.
pub async fn execute_step(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    run_id: &str,
    cfg: &DeliveryConfig,
    limits: &Limits,
) -> Result<StepOutcome, StoreError> {
    let mut out = StepOutcome::default();
    // Concurrent executions of one run (several processes) serialise here;
    // the second sees the step already done.
    tx.lock(&format!("{community}:run:{run_id}")).await?;
    let Some((run, steps)) = due_step(tx, community, run_id).await? else {
        return Ok(out);
    };
    let step = &steps.step;
    let now = tx.now().await?;
    let binding = Binding {
        run: &run,
        run_id,
        step_id: &step.id,
        definition_hex: &hex::encode(run.definition_event_id),
        reply_in_thread: step.reply_in_thread,
    };
    let message = match step_message(tx, community, keys, &binding, &step.template, now, limits).await? {
        Made::Found(message) => message,
        Made::New(message, raw) => {
            out.published.push((message.clone(), raw));
            message
        }
        Made::Refused(why) => {
            end_run(tx, community, run_id, RunStatus::Failed, Some(why)).await?;
            return Ok(out);
        }
    };
    out.new_deliveries = insert_deliveries(tx, community, &binding, &message, cfg, now).await?;
    faults::check("step:after_rows")?;
    out.more = advance(tx, community, &binding, &message, steps.count, now).await?;
    faults::check("step:before_commit")?;
    Ok(out)
}

/// The step a run is at, parsed.
struct DueStep {
    id: String,
    template: Template,
    reply_in_thread: bool,
}

/// A run's current step and how many steps its definition has.
struct Steps {
    step: DueStep,
    count: usize,
}

/// The run and its current step, if it has one to execute. A run that
/// cannot go on (its workflow disabled, its definition gone, its template
/// broken) or has no step left is ended here.
async fn due_step(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
) -> Result<Option<(RunRow, Steps)>, StoreError> {
    let Some(run) = load_run(tx, community, run_id).await? else {
        return Ok(None);
    };
    if run.status != RunStatus::Running {
        return Ok(None);
    }
    let live = load_workflow(tx, community, &run.workflow_id)
        .await?
        .is_some_and(|w| w.enabled && !w.deleted);
    let def = if live {
        load_definition(tx, community, &run.definition_event_id).await?
    } else {
        None
    };
    let step_index = usize::try_from(run.current_step).unwrap_or(usize::MAX);
    let (end, why) = match &def {
        _ if !live => (
            RunStatus::Cancelled,
            Some(("workflow_disabled", "workflow disabled or deleted")),
        ),
        None => (
            RunStatus::Failed,
            Some(("definition_missing", "definition revision is no longer stored")),
        ),
        Some(def) => match def.steps.get(step_index) {
            None => (RunStatus::Completed, None),
            Some(Step::SendMessage {
                id,
                text,
                reply_in_thread,
            }) => match Template::parse(text) {
                Ok(template) => {
                    let step = DueStep {
                        id: id.clone(),
                        template,
                        reply_in_thread: *reply_in_thread,
                    };
                    let count = def.steps.len();
                    return Ok(Some((run, Steps { step, count })));
                }
                Err(_) => (
                    RunStatus::Failed,
                    Some(("template_invalid", "step template no longer parses")),
                ),
            },
        },
    };
    let why = why.map(|(code, text)| (code, text.to_string()));
    end_run(tx, community, run_id, end, why).await?;
    Ok(None)
}

/// A step's message: found (a replay), new (to announce), or refused
/// (the run fails with that error).
enum Made {
    Found(Event),
    New(Event, String),
    Refused(RunError),
}

/// The step's message: the one stored by an earlier execution, else
/// rendered, signed and stored now, with its record.
async fn step_message(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    b: &Binding<'_>,
    template: &Template,
    now: i64,
    limits: &Limits,
) -> Result<Made, StoreError> {
    let existing = tx
        .one(
            Q::new(
                "SELECT e.raw FROM workflow_step_messages m JOIN events e \
                 ON e.community_id = m.community_id AND e.id = m.event_id \
                 WHERE m.community_id = $1 AND m.run_id = $2 AND m.step_id = $3",
            )
            .bind(community)
            .bind(b.run_id)
            .bind(b.step_id),
        )
        .await?;
    if let Some(row) = existing {
        let found = serde_json::from_str(&row.text(0)?).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        return Ok(Made::Found(found));
    }
    let (ev, raw) = match sign_message(keys, b, template, now, limits)? {
        Signed::Message(ev, raw) => (ev, raw),
        Signed::Refused(why) => return Ok(Made::Refused(why)),
    };
    match events::insert(tx, community, &ev, &raw, Some(&b.run.channel))
        .await?
        .of_no_deletion()
    {
        InsertOutcome::Stored | InsertOutcome::Duplicate => {}
        InsertOutcome::Rejected(why) => {
            return Err(StoreError::Corrupt(format!("workflow message refused: {why}")))
        }
    }
    tx.exec(
        Q::new(
            "INSERT INTO workflow_step_messages (community_id, run_id, step_id, event_id, event_created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(community)
        .bind(b.run_id)
        .bind(b.step_id)
        .bind(ev.id.to_bytes())
        .bind(now),
    )
    .await?;
    faults::check("step:after_event")?;
    Ok(Made::New(ev, raw))
}

/// The message's `p` recipients, each once, in order.
fn recipients_of(message: &Event) -> Vec<PublicKey> {
    let mut targets: Vec<PublicKey> = Vec::new();
    for p in workflow::tag_values(message, "p") {
        if let Ok(t) = PublicKey::from_hex(p) {
            if !targets.contains(&t) {
                targets.push(t);
            }
        }
    }
    targets
}

/// One delivery row per recipient that is a managed agent and a member:
/// per chunk, one query for who qualifies and one multi-row insert (a
/// replay inserts nothing new: the rows are unique on run, step and
/// target). Returns the rows made now (to wake).
async fn insert_deliveries(
    tx: &mut Tx<'_>,
    community: &str,
    b: &Binding<'_>,
    message: &Event,
    cfg: &DeliveryConfig,
    now: i64,
) -> Result<Vec<NewDelivery>, StoreError> {
    let mut made = Vec::new();
    for chunk in recipients_of(message).chunks(MAX_ROWS_PER_INSERT) {
        let eligible = eligible_agents(tx, community, &b.run.channel, chunk).await?;
        let rows: Vec<(&PublicKey, String)> = chunk
            .iter()
            .filter(|t| eligible.contains(&t.to_bytes()))
            .map(|t| (t, new_id()))
            .collect();
        if rows.is_empty() {
            continue;
        }
        let inserted = insert_rows(tx, community, b, message, &rows, cfg, now).await?;
        for (target, id) in rows {
            if inserted.contains(&target.to_bytes()) {
                made.push(NewDelivery {
                    id,
                    target: *target,
                    channel: b.run.channel.clone(),
                    definition_event_id: b.definition_hex.to_string(),
                    run_id: b.run_id.to_string(),
                    step_id: b.step_id.to_string(),
                    message_event_id: message.id.to_hex(),
                });
            }
        }
    }
    Ok(made)
}

/// Of `candidates`, the registered agents that are members of `channel`.
async fn eligible_agents(
    tx: &mut Tx<'_>,
    community: &str,
    channel: &str,
    candidates: &[PublicKey],
) -> Result<Vec<[u8; 32]>, StoreError> {
    let d = tx.dialect();
    let mut q = Q::new(
        "SELECT a.pubkey FROM agents a JOIN channel_members m ON m.community_id = a.community_id \
         AND m.pubkey = a.pubkey WHERE a.community_id = ",
    )
    .arg(d, community);
    q.sql.push_str(" AND m.channel_id = ");
    q = q.arg(d, channel);
    q.sql.push_str(" AND a.pubkey IN ");
    q = q.in_list(d, candidates.iter().map(|t| t.to_bytes()));
    tx.all(q).await?.iter().map(|r| r.id32(0)).collect()
}

/// Inserts `rows` (target, new id) as pending deliveries of the step's
/// message; returns the targets whose row is new.
async fn insert_rows(
    tx: &mut Tx<'_>,
    community: &str,
    b: &Binding<'_>,
    message: &Event,
    rows: &[(&PublicKey, String)],
    cfg: &DeliveryConfig,
    now: i64,
) -> Result<Vec<[u8; 32]>, StoreError> {
    const COLS: usize = 19;
    let mut q = Q::new(
        "INSERT INTO workflow_agent_deliveries (community_id, id, workflow_id, run_id, step_id, \
         target_pubkey, channel, definition_event_id, message_event_id, message_created_at, status, \
         attempt, max_attempts, next_attempt_at, expires_at, trigger_context, execution_trace, \
         created_at, updated_at) VALUES ",
    );
    let expires = now.saturating_add(i64::try_from(cfg.lifetime_secs).unwrap_or(i64::MAX));
    let (context, trace) = (b.run.trigger_context.to_string(), b.run.trace.to_string());
    let d = tx.dialect();
    for (k, (target, id)) in rows.iter().enumerate() {
        d.push_values_row(&mut q.sql, k, COLS);
        q = q
            .bind(community)
            .bind(id.as_str())
            .bind(b.run.workflow_id.as_str())
            .bind(b.run_id)
            .bind(b.step_id)
            .bind(target.to_bytes())
            .bind(b.run.channel.as_str())
            .bind(b.run.definition_event_id)
            .bind(message.id.to_bytes())
            .bind(created_at_of(message))
            .bind(DeliveryStatus::Pending.as_str())
            .bind(0_i64)
            .bind(i64::from(cfg.max_attempts))
            .bind(now)
            .bind(expires)
            .bind(context.as_str())
            .bind(trace.as_str())
            .bind(now)
            .bind(now);
    }
    debug_assert_eq!(q.binds.len(), rows.len() * COLS);
    q.sql.push_str(
        " ON CONFLICT (community_id, run_id, step_id, target_pubkey) DO NOTHING RETURNING target_pubkey",
    );
    tx.all(q).await?.iter().map(|r| r.id32(0)).collect()
}

/// Records the step's output in the trace and moves the run on (completed
/// after its last step). Returns whether steps remain.
async fn advance(
    tx: &mut Tx<'_>,
    community: &str,
    b: &Binding<'_>,
    message: &Event,
    step_count: usize,
    now: i64,
) -> Result<bool, StoreError> {
    let mut trace = b.run.trace.as_array().cloned().unwrap_or_default();
    trace.push(
        json!({"step": b.step_id, "output": {"event_id": message.id.to_hex(), "text": message.content}}),
    );
    let next = b.run.current_step + 1;
    let more = usize::try_from(next).is_ok_and(|n| n < step_count);
    let status = if more {
        RunStatus::Running
    } else {
        RunStatus::Completed
    };
    tx.exec(
        Q::new(
            "UPDATE workflow_runs SET current_step = $3, trace = $4, status = $5, updated_at = $6 \
             WHERE community_id = $1 AND id = $2",
        )
        .bind(community)
        .bind(b.run_id)
        .bind(next)
        .bind(Value::Array(trace).to_string())
        .bind(status.as_str())
        .bind(now),
    )
    .await?;
    Ok(more)
}

/// Runs that are still running, oldest first: one statement, so it needs
/// no transaction (the engine asks after every trigger; a read transaction
/// around it was two round trips more each time).
pub async fn running_runs(pool: &Pool, community: &str, limit: u32) -> Result<Vec<String>, StoreError> {
    let rows = pool
        .all(
            Q::new(
                "SELECT id FROM workflow_runs WHERE community_id = $1 AND status = 'running' \
                 ORDER BY created_at, id LIMIT $2",
            )
            .bind(community)
            .bind(i64::from(limit)),
        )
        .await?;
    rows.iter().map(|r| r.text(0)).collect()
}

/// Fires the current slot of every live schedule of a community (each slot
/// once, whatever the number of processes). Returns new run ids.
pub async fn fire_schedules(tx: &mut Tx<'_>, community: &str) -> Result<Vec<String>, StoreError> {
    let now = tx.now().await?;
    let rows = tx
        .all(
            Q::new(
                "SELECT id, interval_secs, cron, timezone, enabled_at FROM workflows WHERE community_id = $1 \
                 AND trigger = 'schedule' AND enabled AND NOT deleted",
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

/// Whether `caller` owns the workflow, and with `member`, is also a member
/// of its channel now (an owner who left, or was removed, no longer sees
/// its runs: they hold the channel's messages).
pub async fn owned(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: &str,
    caller: &PublicKey,
    member: bool,
) -> Answer<()> {
    let refused = match load_workflow(tx, community, workflow_id).await? {
        None => Refusal::UnknownWorkflow,
        Some(w) if w.owner != caller.to_bytes() => Refusal::NotOwner,
        Some(w) if member && !is_member(tx, community, &w.channel, &w.owner).await? => Refusal::OwnerLeft,
        Some(_) => return Ok(()),
    };
    Err(refused.into())
}

/// Stores the hash of a new webhook secret (rotating any previous one).
pub async fn set_webhook_secret(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: &str,
    hash_hex: &str,
) -> Result<(), StoreError> {
    tx.exec(
        Q::new("UPDATE workflows SET webhook_secret_hash = $3 WHERE community_id = $1 AND id = $2")
            .bind(community)
            .bind(workflow_id)
            .bind(hash_hex),
    )
    .await?;
    Ok(())
}

/// The webhook secret hash and trigger of a workflow.
pub async fn webhook_target(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: &str,
) -> Result<Option<(Option<String>, String, bool)>, StoreError> {
    let row = tx
        .one(
            Q::new(
                "SELECT webhook_secret_hash, trigger, enabled AND NOT deleted AS live FROM workflows \
                 WHERE community_id = $1 AND id = $2",
            )
            .bind(community)
            .bind(workflow_id),
        )
        .await?;
    row.map(|r| {
        Ok((
            r.opt_text("webhook_secret_hash")?,
            r.text("trigger")?,
            r.bool("live")?,
        ))
    })
    .transpose()
}

/// The trigger type of a workflow.
pub async fn trigger_of(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: &str,
) -> Result<Option<String>, StoreError> {
    let row = tx
        .one(
            Q::new("SELECT trigger FROM workflows WHERE community_id = $1 AND id = $2")
                .bind(community)
                .bind(workflow_id),
        )
        .await?;
    row.map(|r| r.text(0)).transpose()
}

/// Bytes of run traces one page of runs carries, at most (past the first
/// run): a trace holds up to `MAX_STEPS` messages of up to
/// `max_event_bytes` each, and a page of 100 such runs would be 400 MB.
pub const MAX_RUNS_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// A page of runs, newest first; `cut` when it stopped at
/// [`MAX_RUNS_PAGE_BYTES`] before its limit.
#[derive(Debug, Default)]
pub struct RunList {
    pub runs: Vec<RunView>,
    pub cut: bool,
}

/// A page of a workflow's runs, newest first.
pub async fn list_runs(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: Option<&str>,
    before: Option<i64>,
    limit: u32,
) -> Result<RunList, StoreError> {
    let mut q = Q::new(
        "SELECT id, workflow_id, status, current_step, cause_type, cause_id, error, created_at, updated_at, trace, \
         definition_event_id, error_code FROM workflow_runs WHERE community_id = ",
    )
    .arg(tx.dialect(), community);
    let d = tx.dialect();
    if let Some(w) = workflow_id {
        q = q.and(d, "workflow_id =", w);
    }
    if let Some(b) = before {
        q = q.and(d, "created_at <", b);
    }
    let q = q
        .push_text(" ORDER BY created_at DESC, id DESC LIMIT ")
        .arg(d, i64::from(limit));
    let rows = tx.all(q).await?;
    let mut page = RunList::default();
    let mut bytes = 0usize;
    for r in &rows {
        let trace = r.text("trace")?;
        if !page.runs.is_empty() && bytes + trace.len() > MAX_RUNS_PAGE_BYTES {
            page.cut = true;
            break;
        }
        bytes += trace.len();
        page.runs.push(run_view(r, &trace)?);
    }
    Ok(page)
}

/// One run as listed.
fn run_view(r: &Row, trace: &str) -> Result<RunView, StoreError> {
    Ok(RunView {
        id: r.text("id")?,
        workflow_id: r.text("workflow_id")?,
        status: named(&r.text("status")?, RunStatus::parse)?,
        current_step: r.int("current_step")?,
        cause: CauseView {
            kind: named(&r.text("cause_type")?, CauseKind::parse)?,
            id: r.text("cause_id")?,
        },
        error: r.opt_text("error")?,
        created_at: r.int("created_at")?,
        updated_at: r.int("updated_at")?,
        trace: serde_json::from_str::<Value>(trace).unwrap_or(Value::Null),
        definition_event_id: hex::encode(r.blob("definition_event_id")?),
        error_code: r.opt_text("error_code")?,
        trigger_context: None,
        channel: None,
    })
}

/// One run by id, with its trigger context and channel.
pub async fn show_run(tx: &mut Tx<'_>, community: &str, run_id: &str) -> Result<Option<RunView>, StoreError> {
    let row = tx
        .one(
            Q::new(
                "SELECT id, workflow_id, status, current_step, cause_type, cause_id, error, created_at, updated_at, \
                 trace, definition_event_id, error_code, trigger_context, channel FROM workflow_runs \
                 WHERE community_id = $1 AND id = $2",
            )
            .bind(community)
            .bind(run_id),
        )
        .await?;
    row.map(|r| {
        let mut run = run_view(&r, &r.text("trace")?)?;
        let context = r.text("trigger_context")?;
        run.trigger_context = Some(serde_json::from_str::<Value>(&context).unwrap_or(Value::Null));
        run.channel = Some(r.text("channel")?);
        Ok(run)
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use protocol::api::DeliveryStatus;

    use super::super::machine::{transition, Event, State, Transition};
    use super::ACTIVE_ROWS;

    #[test]
    fn bulk_cancellation_touches_the_states_the_machine_cancels() {
        for status in DeliveryStatus::ALL {
            let row = State {
                status: *status,
                attempt: 1,
                max_attempts: 3,
                claim_token: Some("t"),
                claim_expires_at: Some(10),
                next_attempt_at: 0,
                expires_at: 100,
                records_operations: false,
            };
            let cancels = transition(&row, Event::Cancel, 5) == Ok(Transition::Cancel);
            let touched = ACTIVE_ROWS.contains(&format!("'{}'", status.as_str()));
            assert_eq!(cancels, touched, "{status:?}");
        }
    }
}
