//! A delivery row as stored and shown: its columns, its decoding, what the
//! machine needs of it (`state`), loading it (locked on PostgreSQL), and
//! the listings and the detail view with attempts and operations.

use nostr::prelude::PublicKey;
use protocol::api::{
    ClaimedDelivery, DeliverySource, DeliveryStatus as Status, DeliveryView, Outcome, TurnPart,
};
use protocol::workflow::OutputSchema;
use serde_json::Value;

use crate::delivery::machine;
use crate::persistence::db::{named, Dialect, Row, Tx, Q};
use crate::persistence::StoreError;

pub use crate::refusal::{Answer, Refusal};
pub use protocol::api::{ClaimRequest, Expected, FinishRequest};

pub(crate) const COLS: &str =
    "id, workflow_id, run_id, step_id, target_pubkey, channel, definition_event_id, \
    message_event_id, status, attempt, max_attempts, claim_token, claim_expires_at, records_operations, \
    next_attempt_at, expires_at, trigger_context, execution_trace, failure_code, failure_message, \
    reply_event_id, finished_token, finished_outcome, finished_status, created_at, updated_at, awaited, \
    output_schema, revision, output_errors, priority, concurrency, source, conversation";

/// A delivery row.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: String,
    pub workflow_id: String,
    pub run_id: String,
    pub step_id: String,
    pub target: [u8; 32],
    pub channel: String,
    pub definition_event_id: [u8; 32],
    pub message_event_id: [u8; 32],
    pub status: Status,
    pub attempt: i64,
    pub max_attempts: i64,
    pub claim_token: Option<String>,
    pub claim_expires_at: Option<i64>,
    pub records_operations: bool,
    pub next_attempt_at: i64,
    pub expires_at: i64,
    pub trigger_context: String,
    pub execution_trace: String,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub reply_event_id: Option<Vec<u8>>,
    pub finished_token: Option<String>,
    pub finished_outcome: Option<Outcome>,
    pub finished_status: Option<Status>,
    pub created_at: i64,
    pub updated_at: i64,
    /// A row of an `ask_agent` step: its end wakes the waiting run.
    pub awaited: bool,
    /// The shape its answer must have (the step's `output`, as JSON).
    pub output_schema: Option<String>,
    /// Which revision of the step's message it is on (0: the step's own).
    pub revision: i64,
    /// Why its last answer was refused, until the step revises it.
    pub output_errors: Option<String>,
    /// Its place in its agent's backlog (the step's `priority`).
    pub priority: i64,
    /// Its workflow's cap on claimed rows (`concurrency`), if any.
    pub concurrency: Option<i64>,
    /// What made it: a workflow's step or a mention.
    pub source: DeliverySource,
    /// A mention's conversation (its channel, or `<channel>/<root>` in a
    /// thread): its rows are claimed together, one turn at a time; `""`
    /// for a workflow's.
    pub conversation: String,
}

pub(crate) fn delivery(r: &Row) -> Result<Delivery, StoreError> {
    let status = |c| -> Result<Option<Status>, StoreError> {
        r.opt_text(c)?.map(|s| named(&s, Status::parse)).transpose()
    };
    Ok(Delivery {
        id: r.text("id")?,
        workflow_id: r.text("workflow_id")?,
        run_id: r.text("run_id")?,
        step_id: r.text("step_id")?,
        target: r.id32("target_pubkey")?,
        channel: r.text("channel")?,
        definition_event_id: r.id32("definition_event_id")?,
        message_event_id: r.id32("message_event_id")?,
        status: named(&r.text("status")?, Status::parse)?,
        attempt: r.int("attempt")?,
        max_attempts: r.int("max_attempts")?,
        claim_token: r.opt_text("claim_token")?,
        claim_expires_at: r.opt_int("claim_expires_at")?,
        records_operations: r.bool("records_operations")?,
        next_attempt_at: r.int("next_attempt_at")?,
        expires_at: r.int("expires_at")?,
        trigger_context: r.text("trigger_context")?,
        execution_trace: r.text("execution_trace")?,
        failure_code: r.opt_text("failure_code")?,
        failure_message: r.opt_text("failure_message")?,
        reply_event_id: r.opt_blob("reply_event_id")?,
        finished_token: r.opt_text("finished_token")?,
        finished_outcome: r
            .opt_text("finished_outcome")?
            .map(|o| named(&o, Outcome::parse))
            .transpose()?,
        finished_status: status("finished_status")?,
        created_at: r.int("created_at")?,
        updated_at: r.int("updated_at")?,
        awaited: r.bool("awaited")?,
        output_schema: r.opt_text("output_schema")?,
        revision: r.int("revision")?,
        output_errors: r.opt_text("output_errors")?,
        priority: r.int("priority")?,
        concurrency: r.opt_int("concurrency")?,
        source: named(&r.text("source")?, DeliverySource::parse)?,
        conversation: r.text("conversation")?,
    })
}

impl Delivery {
    /// What the state machine needs of this row.
    pub fn state(&self) -> machine::State<'_> {
        machine::State {
            status: self.status,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            claim_token: self.claim_token.as_deref(),
            claim_expires_at: self.claim_expires_at,
            next_attempt_at: self.next_attempt_at,
            expires_at: self.expires_at,
            records_operations: self.records_operations,
            revising: self.output_errors.is_some(),
            in_flight: machine::InFlight::default(),
            conversation_busy: false,
        }
    }

    /// The shape its answer must have, if any (a stored schema that no
    /// longer reads is handed out as none: the agent, which compares it
    /// with the definition's, then refuses the delivery).
    pub fn output(&self) -> Option<OutputSchema> {
        self.output_schema
            .as_deref()
            .and_then(|json| serde_json::from_str(json).ok())
    }

    /// Its span in its run's trace: `delivery:<id>` under its step's
    /// (`protocol::trace`).
    pub fn span(&self, community: &str) -> protocol::trace::TraceParent {
        let trace = protocol::trace::run_trace_id(community, &self.run_id);
        protocol::trace::step_span(&trace, &self.step_id)
            .expect("a derived trace id is valid")
            .child(&format!("delivery:{}", self.id))
    }

    /// Whether `caller` is the row's target.
    pub(crate) fn for_caller(&self, caller: &PublicKey) -> bool {
        self.target == caller.to_bytes()
    }

    /// The claim answer (docs/protocol.md, "Deliveries"); `None` for a row that
    /// is not claimed (it has no token).
    pub fn claim_view(&self, community: &str) -> Option<ClaimedDelivery> {
        Some(ClaimedDelivery {
            id: self.id.clone(),
            workflow_id: self.workflow_id.clone(),
            run_id: self.run_id.clone(),
            step_id: self.step_id.clone(),
            definition_event_id: hex::encode(self.definition_event_id),
            message_event_id: hex::encode(self.message_event_id),
            channel: self.channel.clone(),
            target_pubkey: hex::encode(self.target),
            attempt: u32::try_from(self.attempt).unwrap_or(u32::MAX),
            claim_token: self.claim_token.clone()?,
            claim_expires_at: self.claim_expires_at?,
            expires_at: self.expires_at,
            trigger_context: serde_json::from_str::<Value>(&self.trigger_context).unwrap_or(Value::Null),
            execution_trace: serde_json::from_str::<Value>(&self.execution_trace).unwrap_or(Value::Null),
            output: self.output(),
            revision: u32::try_from(self.revision).unwrap_or(u32::MAX),
            traceparent: Some(self.span(community).header()),
            source: self.source,
            conversation: self.conversation.clone(),
            turn: Vec::new(),
        })
    }

    /// How the claim answer names this row when another row's claim took
    /// it into its turn.
    pub fn turn_part(&self) -> TurnPart {
        TurnPart {
            id: self.id.clone(),
            run_id: self.run_id.clone(),
            definition_event_id: hex::encode(self.definition_event_id),
            message_event_id: hex::encode(self.message_event_id),
            attempt: u32::try_from(self.attempt).unwrap_or(u32::MAX),
            expires_at: self.expires_at,
            trigger_context: serde_json::from_str::<Value>(&self.trigger_context).unwrap_or(Value::Null),
        }
    }

    /// The listing view (no token, no private snapshot).
    pub fn list_view(&self) -> DeliveryView {
        DeliveryView {
            id: self.id.clone(),
            source: self.source,
            workflow_id: self.workflow_id.clone(),
            run_id: self.run_id.clone(),
            step_id: self.step_id.clone(),
            channel: self.channel.clone(),
            target_pubkey: hex::encode(self.target),
            definition_event_id: hex::encode(self.definition_event_id),
            message_event_id: hex::encode(self.message_event_id),
            status: self.status,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            next_attempt_at: self.next_attempt_at,
            claim_expires_at: self.claim_expires_at,
            expires_at: self.expires_at,
            failure_code: self.failure_code.clone(),
            failure_message: self.failure_message.clone(),
            reply_event_id: self.reply_event_id.as_ref().map(hex::encode),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

/// What the pending rows made for one message share (a step's or a
/// mention's); each row adds its id and target.
pub(crate) struct NewRows<'a> {
    pub workflow_id: &'a str,
    pub run_id: &'a str,
    pub step_id: &'a str,
    pub channel: &'a str,
    pub definition_event_id: [u8; 32],
    pub message_event_id: [u8; 32],
    pub message_created_at: i64,
    pub max_attempts: i64,
    /// Due at (a mention's: after its conversation's debounce).
    pub next_attempt_at: i64,
    pub expires_at: i64,
    pub trigger_context: &'a str,
    pub execution_trace: &'a str,
    pub awaited: bool,
    pub output_schema: Option<String>,
    pub priority: i64,
    pub concurrency: Option<i64>,
    pub source: DeliverySource,
    pub conversation: &'a str,
}

/// Inserts one pending row per (target, new id) in one statement; returns
/// the targets whose row is new (the request key, one row per run, step
/// and target: a message stored again makes none).
pub(crate) async fn insert_pending(
    tx: &mut Tx<'_>,
    community: &str,
    shared: &NewRows<'_>,
    rows: &[([u8; 32], String)],
    now: i64,
) -> Result<Vec<[u8; 32]>, StoreError> {
    use crate::persistence::sql::Bind;
    const COLS: usize = 25;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = Q::new(
        "INSERT INTO workflow_agent_deliveries (community_id, id, workflow_id, run_id, step_id, \
         target_pubkey, channel, definition_event_id, message_event_id, message_created_at, status, \
         attempt, max_attempts, next_attempt_at, expires_at, trigger_context, execution_trace, \
         created_at, updated_at, awaited, output_schema, priority, concurrency, source, conversation) VALUES ",
    );
    let d = tx.dialect();
    for (k, (target, id)) in rows.iter().enumerate() {
        d.push_values_row(&mut q.sql, k, COLS);
        q = q
            .bind(community)
            .bind(id.as_str())
            .bind(shared.workflow_id)
            .bind(shared.run_id)
            .bind(shared.step_id)
            .bind(*target)
            .bind(shared.channel)
            .bind(shared.definition_event_id)
            .bind(shared.message_event_id)
            .bind(shared.message_created_at)
            .bind(Status::Pending.as_str())
            .bind(0_i64)
            .bind(shared.max_attempts)
            .bind(shared.next_attempt_at)
            .bind(shared.expires_at)
            .bind(shared.trigger_context)
            .bind(shared.execution_trace)
            .bind(now)
            .bind(now)
            .bind(shared.awaited)
            .bind(Bind::OptText(shared.output_schema.clone()))
            .bind(shared.priority)
            .bind(Bind::OptInt(shared.concurrency))
            .bind(shared.source.as_str())
            .bind(shared.conversation);
    }
    debug_assert_eq!(q.binds.len(), rows.len() * COLS);
    q.sql.push_str(
        " ON CONFLICT (community_id, run_id, step_id, target_pubkey) DO NOTHING RETURNING target_pubkey",
    );
    tx.all(q).await?.iter().map(|r| r.id32(0)).collect()
}

pub(crate) async fn load(tx: &mut Tx<'_>, community: &str, id: &str) -> Result<Option<Delivery>, StoreError> {
    Ok(load_with_membership(tx, community, id).await?.map(|(d, _)| d))
}

/// A row (locked on PostgreSQL) and whether its target is a member of its
/// channel, in one statement: a finish needs both. (A finish's reply is
/// stored under its author's lock, which its call batch took up front:
/// `Call::lock_keys`.)
pub(crate) async fn load_with_membership(
    tx: &mut Tx<'_>,
    community: &str,
    id: &str,
) -> Result<Option<(Delivery, bool)>, StoreError> {
    let row_lock = if tx.dialect() == Dialect::Postgres {
        " FOR UPDATE"
    } else {
        ""
    };
    let q = Q::new(format!(
        "SELECT {COLS}, EXISTS (SELECT 1 FROM channel_members m WHERE m.community_id = d.community_id \
         AND m.channel_id = d.channel AND m.pubkey = d.target_pubkey) AS member \
         FROM workflow_agent_deliveries d WHERE d.community_id = $1 AND d.id = $2{row_lock}"
    ))
    .bind(community)
    .bind(id);
    match tx.one(q).await? {
        Some(row) => Ok(Some((delivery(&row)?, row.bool("member")?))),
        None => Ok(None),
    }
}

/// Which deliveries a listing shows (every field narrows it).
#[derive(Debug, Default, Clone)]
pub struct ListFilter {
    pub target: Option<PublicKey>,
    pub status: Option<Status>,
    pub workflow: Option<String>,
    pub run: Option<String>,
    /// Only the workflows this pubkey owns.
    pub owner: Option<PublicKey>,
    /// Only rows created before this unix second, or (with `before_id`)
    /// at it with a smaller id: the page after the row (`before`, `before_id`).
    pub before: Option<i64>,
    pub before_id: Option<String>,
}

/// Deliveries, newest first.
pub async fn list(
    tx: &mut Tx<'_>,
    community: &str,
    f: &ListFilter,
    limit: u32,
) -> Result<Vec<Delivery>, StoreError> {
    let d = tx.dialect();
    let mut q = Q::new(format!(
        "SELECT {COLS} FROM workflow_agent_deliveries WHERE community_id = "
    ))
    .arg(d, community);
    if let Some(t) = &f.target {
        q = q.and(d, "target_pubkey =", t.to_bytes());
    }
    if let Some(s) = f.status {
        q = q.and(d, "status =", s.as_str());
    }
    if let Some(w) = &f.workflow {
        q = q.and(d, "workflow_id =", w.as_str());
    }
    if let Some(r) = &f.run {
        q = q.and(d, "run_id =", r.as_str());
    }
    if let Some(o) = &f.owner {
        q = q
            .push_text(" AND workflow_id IN (SELECT w.id FROM workflows w WHERE w.community_id = ")
            .arg(d, community)
            .and(d, "w.owner =", o.to_bytes())
            .push_text(")");
    }
    if let Some(b) = f.before {
        q = q.before_key(d, b, f.before_id.as_deref());
    }
    let q = q
        .push_text(" ORDER BY created_at DESC, id DESC LIMIT ")
        .arg(d, i64::from(limit));
    tx.all(q).await?.iter().map(delivery).collect()
}

/// Operations recorded for a delivery, in order: (attempt, name, effect).
pub async fn operations(
    tx: &mut Tx<'_>,
    community: &str,
    id: &str,
) -> Result<Vec<(i64, String, String)>, StoreError> {
    let rows = tx
        .all(
            Q::new(
                "SELECT attempt, name, effect FROM delivery_operations WHERE community_id = $1 AND delivery_id = $2 \
                 ORDER BY attempt, seq",
            )
            .bind(community)
            .bind(id),
        )
        .await?;
    rows.iter()
        .map(|r| Ok((r.int("attempt")?, r.text("name")?, r.text("effect")?)))
        .collect()
}

/// One delivery by id with its attempts and operations.
pub async fn show(
    tx: &mut Tx<'_>,
    community: &str,
    id: &str,
) -> Result<Option<(Delivery, protocol::api::DeliveryDetail)>, StoreError> {
    let Some(d) = load(tx, community, id).await? else {
        return Ok(None);
    };
    let operations = operations(tx, community, id)
        .await?
        .into_iter()
        .map(|(attempt, name, effect)| protocol::api::OperationView {
            attempt,
            name,
            effect,
        })
        .collect();
    let attempts = attempts(tx, community, id).await?;
    let detail = protocol::api::DeliveryDetail {
        delivery: d.list_view(),
        attempts,
        operations,
    };
    Ok(Some((d, detail)))
}

/// Every attempt of a delivery, first first.
pub(crate) async fn attempts(
    tx: &mut Tx<'_>,
    community: &str,
    id: &str,
) -> Result<Vec<protocol::api::AttemptView>, StoreError> {
    let rows = tx
        .all(
            Q::new(
                "SELECT attempt, claimed_at, finished_at, outcome, failure_code, failure_message \
                 FROM delivery_attempts WHERE community_id = $1 AND delivery_id = $2 ORDER BY attempt",
            )
            .bind(community)
            .bind(id),
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(protocol::api::AttemptView {
                attempt: r.int("attempt")?,
                claimed_at: r.int("claimed_at")?,
                finished_at: r.opt_int("finished_at")?,
                outcome: r.opt_text("outcome")?,
                failure_code: r.opt_text("failure_code")?,
                failure_message: r.opt_text("failure_message")?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{delivery, Status, COLS};
    use crate::persistence::db::{Row, Val};

    /// A stored row's values, by column.
    fn value(col: &str) -> Val {
        match col {
            "target_pubkey" | "definition_event_id" | "message_event_id" => Val::Blob(vec![7; 32]),
            "status" => Val::Text("claimed".into()),
            "source" => Val::Text("mention".into()),
            "attempt" | "max_attempts" | "next_attempt_at" | "expires_at" | "created_at" | "updated_at"
            | "claim_expires_at" | "revision" | "priority" | "concurrency" => Val::Int(col.len() as i64),
            "records_operations" | "awaited" => Val::Bool(true),
            "reply_event_id" | "finished_token" | "finished_outcome" | "finished_status" | "failure_code"
            | "failure_message" => Val::Null,
            other => Val::Text(format!("{other}-value")),
        }
    }

    #[test]
    fn rows_are_decoded_by_name_in_any_column_order() {
        let cols: Vec<&str> = COLS.split(',').map(str::trim).collect();
        let in_order = Row::from_parts(&cols, cols.iter().map(|c| value(c)).collect());
        let reversed: Vec<&str> = cols.iter().rev().copied().collect();
        let backwards = Row::from_parts(&reversed, reversed.iter().map(|c| value(c)).collect());
        let (a, b) = (
            delivery(&in_order).expect("decodes"),
            delivery(&backwards).expect("decodes"),
        );
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_eq!(
            (a.id.as_str(), a.status, a.attempt),
            ("id-value", Status::Claimed, 7)
        );
        assert!(a.records_operations && a.finished_status.is_none());
        // A column the select list lacks is an error, not another column's value.
        let short = Row::from_parts(&cols[1..], cols[1..].iter().map(|c| value(c)).collect());
        assert!(delivery(&short).is_err());
    }
}
