//! A step's message and its deliveries: rendered and signed under the
//! admission rule, stored once (a replay reuses it), and one delivery row
//! per recipient that is a managed agent and a member.

use nostr::prelude::{Event, EventBuilder, Keys, Kind, PublicKey, Tag, Timestamp};
use protocol::api::{CauseKind, DeliverySource};
use protocol::template::Template;
use protocol::workflow::{self, MessageBinding};

use super::step::{json_of, Failure, NewDelivery, RunRow, StepCtx, StepOutcome};
use crate::admission;
use crate::config::{DeliveryConfig, Limits};
use crate::delivery::rows::{insert_pending, NewRows};
use crate::events::rules as events;
use crate::events::rules::created_at_of;
use crate::events::InsertOutcome;
use crate::faults;
use crate::persistence::db::{Tx, Q};
use crate::persistence::StoreError;
use crate::workflow::definitions::new_id;

/// Delivery rows in one insert, at most (23 binds a row: within both
/// backends' bind limits).
const MAX_ROWS_PER_INSERT: usize = 500;

/// What a step's message is bound to.
struct Binding<'a> {
    pub(crate) run: &'a RunRow,
    pub(crate) run_id: &'a str,
    pub(crate) step_id: &'a str,
    pub(crate) definition_hex: &'a str,
    pub(crate) reply_in_thread: bool,
    /// Its `p` tags (the owner first).
    pub(crate) recipients: Vec<PublicKey>,
    /// Tags after the workflow message's own (an approval request's mark).
    pub(crate) extra_tags: Vec<Tag>,
    /// The shape its rows' answers must have (JSON), if the step has one.
    pub(crate) output: Option<String>,
    /// Its rows' place in their agents' backlogs (the step's `priority`).
    pub(crate) priority: i64,
    /// The workflow's cap on its claimed rows (`concurrency`), if any.
    pub(crate) concurrency: Option<i64>,
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
) -> Result<Result<(Event, String), Failure>, StoreError> {
    let too_large = |bytes: String| {
        Failure::new(
            "message_too_large",
            format!(
                "the message would be {bytes} bytes; max_event_bytes is {}",
                limits.max_event_bytes
            ),
        )
    };
    let rendered = match template.render_bounded(&b.run.context(), limits.max_event_bytes) {
        Ok(text) => text,
        Err(e) => return Ok(Err(too_large(format!("at least {}", e.at_least)))),
    };
    let cause = b.run.trigger_cause();
    let reply_to = (b.reply_in_thread && cause.kind == CauseKind::Event).then_some(cause.id.as_str());
    let tags = workflow::message_tags(&MessageBinding {
        channel: &b.run.channel,
        definition_event_id: b.definition_hex,
        step_id: b.step_id,
        run_id: b.run_id,
        owner: &b.run.owner,
        cause: &cause,
        recipients: &b.recipients,
        reply_to,
    });
    let tags = tags.into_iter().chain(b.extra_tags.iter().cloned());
    sign_admitted(keys, rendered, tags, now, limits, too_large)
}

/// Signs a relay kind 9 and holds it to the admission rule every client's
/// event meets.
pub(crate) fn sign_admitted(
    keys: &Keys,
    text: String,
    tags: impl IntoIterator<Item = Tag>,
    now: i64,
    limits: &Limits,
    too_large: impl Fn(String) -> Failure,
) -> Result<Result<(Event, String), Failure>, StoreError> {
    let ev = protocol::sign::sign(
        EventBuilder::new(Kind::from_u16(workflow::MESSAGE_KIND), text)
            .tags(tags)
            .custom_created_at(Timestamp::from_secs(u64::try_from(now).unwrap_or(0))),
        keys,
    );
    let raw = serde_json::to_string(&ev).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let rules = admission::Rules {
        limits,
        community_key: &keys.public_key(),
        now: u64::try_from(now).unwrap_or(0),
        bans: None,
    };
    Ok(match admission::check(&ev, raw.len(), &rules) {
        Ok(()) => Ok((ev, raw)),
        Err(admission::Refusal::TooLarge { bytes, .. }) => Err(too_large(bytes.to_string())),
        Err(r) => Err(Failure::new("message_refused", r.to_string())),
    })
}

/// Which delivery rows a step's message makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rows {
    /// None (an approval request is for people).
    None,
    /// One per managed-agent recipient.
    Plain,
    /// As `Plain`, and each wakes the run when it ends.
    Awaited,
}

/// Whom a step's message names and how: its `p` recipients (the owner
/// first), tags after the workflow message's own, and whether it replies in
/// thread.
pub(crate) struct Addressed {
    pub(crate) to: Vec<PublicKey>,
    pub(crate) extra_tags: Vec<Tag>,
    pub(crate) in_thread: bool,
}

impl Addressed {
    /// A message to the owner and the agents its template mentions.
    pub(crate) fn mentions(c: &StepCtx<'_>, template: &Template, in_thread: bool) -> Addressed {
        Addressed {
            to: workflow::recipients(&c.run.owner, template),
            extra_tags: Vec::new(),
            in_thread,
        }
    }
}

/// Posts the step's message (once: a replay reuses it), addressed as
/// `address` says from its template, and its delivery rows, as `rows`
/// says.
pub(crate) async fn post(
    tx: &mut Tx<'_>,
    c: &StepCtx<'_>,
    out: &mut StepOutcome,
    rows: Rows,
    address: impl FnOnce(&Template) -> Addressed,
) -> Result<Result<Event, Failure>, StoreError> {
    let text = c.step().text().expect("a step that posts has a text");
    let Ok(template) = Template::parse(text) else {
        return Ok(Err(Failure::new(
            "template_invalid",
            "step template no longer parses",
        )));
    };
    let addressed = address(&template);
    let binding = Binding {
        run: c.run,
        run_id: c.run_id,
        step_id: c.step().id(),
        definition_hex: &hex::encode(c.run.definition_event_id),
        reply_in_thread: addressed.in_thread,
        recipients: addressed.to,
        extra_tags: addressed.extra_tags,
        output: c.step().output().map(|o| o.to_value().to_string()),
        priority: i64::from(c.step().priority()),
        concurrency: c.def.concurrency.map(i64::from),
    };
    let limits = c.env.limits;
    let message = match step_message(tx, c.community, c.keys, &binding, &template, c.now, limits).await? {
        Made::Found(message) => message,
        Made::New(message, raw) => {
            out.published.push((message.clone(), raw));
            message
        }
        Made::Refused(why) => return Ok(Err(why)),
    };
    if rows != Rows::None {
        let awaited = rows == Rows::Awaited;
        let cfg = c.env.deliveries;
        out.new_deliveries =
            insert_deliveries(tx, c.community, &binding, &message, cfg, c.now, awaited).await?;
        faults::check("step:after_rows")?;
    }
    Ok(Ok(message))
}

/// A step's message: found (a replay), new (to announce), or refused
/// (the step fails with that error).
enum Made {
    Found(Event),
    New(Event, String),
    Refused(Failure),
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
    if let Some(message) = stored_message(tx, community, b.run_id, b.step_id).await? {
        return Ok(Made::Found(message));
    }
    let (ev, raw) = match sign_message(keys, b, template, now, limits)? {
        Ok(signed) => signed,
        Err(why) => return Ok(Made::Refused(why)),
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

/// The message a step of a run posted, once it has.
pub(crate) async fn stored_message(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    step_id: &str,
) -> Result<Option<Event>, StoreError> {
    let row = tx
        .one(
            Q::new(
                "SELECT e.raw FROM workflow_step_messages m JOIN events e \
                 ON e.community_id = m.community_id AND e.id = m.event_id \
                 WHERE m.community_id = $1 AND m.run_id = $2 AND m.step_id = $3",
            )
            .bind(community)
            .bind(run_id)
            .bind(step_id),
        )
        .await?;
    row.map(|r| json_of(&r.text(0)?)).transpose()
}

/// The message's `p` recipients, each once, in order.
pub(crate) fn recipients_of(message: &Event) -> Vec<PublicKey> {
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
    awaited: bool,
) -> Result<Vec<NewDelivery>, StoreError> {
    let mut made = Vec::new();
    for chunk in recipients_of(message).chunks(MAX_ROWS_PER_INSERT) {
        let targets = chunk.iter().map(|t| t.to_bytes());
        let eligible = eligible_agents(tx, community, &b.run.channel, targets, false).await?;
        let rows: Vec<(&PublicKey, String)> = chunk
            .iter()
            .filter(|t| eligible.contains(&t.to_bytes()))
            .map(|t| (t, new_id()))
            .collect();
        if rows.is_empty() {
            continue;
        }
        let inserted = insert_rows(tx, community, b, message, &rows, cfg, now, awaited).await?;
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

/// Of `candidates`, the registered agents that are members of `channel`
/// (with `taking_mentions`, only those whose owner turned mentions on
/// there or in every channel: `channels::mentions`).
pub(crate) async fn eligible_agents(
    tx: &mut Tx<'_>,
    community: &str,
    channel: &str,
    candidates: impl IntoIterator<Item = [u8; 32]>,
    taking_mentions: bool,
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
    q = q.in_list(d, candidates);
    if taking_mentions {
        q.sql.push_str(
            " AND EXISTS (SELECT 1 FROM agent_mentions o WHERE o.community_id = a.community_id \
             AND o.agent_pubkey = a.pubkey AND o.channel IN ('', m.channel_id))",
        );
    }
    tx.all(q).await?.iter().map(|r| r.id32(0)).collect()
}

/// Inserts `rows` (target, new id) as pending deliveries of the step's
/// message; returns the targets whose row is new.
#[allow(clippy::too_many_arguments)]
async fn insert_rows(
    tx: &mut Tx<'_>,
    community: &str,
    b: &Binding<'_>,
    message: &Event,
    rows: &[(&PublicKey, String)],
    cfg: &DeliveryConfig,
    now: i64,
    awaited: bool,
) -> Result<Vec<[u8; 32]>, StoreError> {
    let (context, trace) = (b.run.trigger_context.to_string(), b.run.trace_json().to_string());
    let shared = NewRows {
        workflow_id: b.run.workflow_id.as_str(),
        run_id: b.run_id,
        step_id: b.step_id,
        channel: b.run.channel.as_str(),
        definition_event_id: b.run.definition_event_id,
        message_event_id: message.id.to_bytes(),
        message_created_at: created_at_of(message),
        max_attempts: i64::from(cfg.max_attempts),
        next_attempt_at: now,
        expires_at: now.saturating_add(i64::try_from(cfg.lifetime_secs).unwrap_or(i64::MAX)),
        trigger_context: &context,
        execution_trace: &trace,
        awaited,
        output_schema: b.output.clone(),
        priority: b.priority,
        concurrency: b.concurrency,
        source: DeliverySource::Workflow,
        conversation: "",
    };
    let rows: Vec<([u8; 32], String)> = rows.iter().map(|(t, id)| (t.to_bytes(), id.clone())).collect();
    insert_pending(tx, community, &shared, &rows, now).await
}
