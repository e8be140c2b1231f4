//! The `ask_agent` step: its timeout, when it is over (`decide`), its
//! rows and their replies, its output and its failure.

use nostr::prelude::Event;
use protocol::api::DeliveryStatus;
use protocol::workflow::{self, Wait};
use serde_json::{json, Value};

use super::step::{json_of, Failure, StepCtx};
use crate::persistence::db::{named, Tx, Q};
use crate::persistence::StoreError;
use crate::workflow::definitions::ACTIVE_ROWS;

/// An `ask_agent` step's timeout in seconds (its default when unset).
pub(crate) fn ask_timeout(timeout_secs: Option<u64>) -> i64 {
    i64::try_from(timeout_secs.unwrap_or(workflow::DEFAULT_ASK_TIMEOUT_SECS)).unwrap_or(i64::MAX)
}

/// How an `ask_agent` step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AskStatus {
    Delivered,
    Failed,
    TimedOut,
}

impl AskStatus {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AskStatus::Delivered => "delivered",
            AskStatus::Failed => "failed",
            AskStatus::TimedOut => "timed_out",
        }
    }
}

/// Whether an `ask_agent` step is over, given its rows' statuses:
/// `any` ends at the first delivered row, `all` when every row ended
/// (delivered only if all were); either ends failed when every row ended
/// without what it waits for, and timed out at its deadline. `None`: it
/// still waits.
pub(crate) fn decide(wait: Wait, rows: &[DeliveryStatus], past_deadline: bool) -> Option<AskStatus> {
    let delivered = rows.iter().filter(|s| **s == DeliveryStatus::Delivered).count();
    let ended = rows.iter().all(|s| s.is_terminal());
    match wait {
        Wait::Any if delivered > 0 => Some(AskStatus::Delivered),
        Wait::All if ended && delivered == rows.len() => Some(AskStatus::Delivered),
        _ if ended => Some(AskStatus::Failed),
        _ if past_deadline => Some(AskStatus::TimedOut),
        _ => None,
    }
}

/// One delivery row of the current step, with its reply.
pub(crate) struct StepRow {
    pub(crate) id: String,
    pub(crate) target: [u8; 32],
    pub(crate) status: DeliveryStatus,
    pub(crate) failure_code: Option<String>,
    /// The step's message (the same for every row of the step).
    pub(crate) message_event_id: [u8; 32],
    pub(crate) reply: Option<Event>,
}

/// The current step's delivery rows in the order they ended (then by id),
/// with their replies.
pub(crate) async fn step_rows(tx: &mut Tx<'_>, c: &StepCtx<'_>) -> Result<Vec<StepRow>, StoreError> {
    let rows = tx
        .all(
            Q::new(
                "SELECT d.id, d.target_pubkey, d.status, d.failure_code, d.message_event_id, e.raw \
                 FROM workflow_agent_deliveries d \
                 LEFT JOIN events e ON e.community_id = d.community_id AND e.id = d.reply_event_id \
                 WHERE d.community_id = $1 AND d.run_id = $2 AND d.step_id = $3 ORDER BY d.updated_at, d.id",
            )
            .bind(c.community)
            .bind(c.run_id)
            .bind(c.step().id()),
        )
        .await?;
    rows.iter()
        .map(|r| {
            let reply = r.opt_text("raw")?.map(|raw| json_of::<Event>(&raw)).transpose()?;
            Ok(StepRow {
                id: r.text("id")?,
                target: r.id32("target_pubkey")?,
                status: named(&r.text("status")?, DeliveryStatus::parse)?,
                failure_code: r.opt_text("failure_code")?,
                message_event_id: r.id32("message_event_id")?,
                reply,
            })
        })
        .collect()
}

/// Cancels the current step's open rows (an `any` step answered, or the
/// step timed out): their holders' finishes then answer 410.
pub(crate) async fn cancel_open_rows(tx: &mut Tx<'_>, c: &StepCtx<'_>, code: &str) -> Result<(), StoreError> {
    let cancelled = tx.exec(
        Q::new(format!(
            "UPDATE workflow_agent_deliveries SET status = 'cancelled', failure_code = $4, claim_token = NULL, \
             updated_at = $5 WHERE community_id = $1 AND run_id = $2 AND step_id = $3 AND {ACTIVE_ROWS}"
        ))
        .bind(c.community)
        .bind(c.run_id)
        .bind(c.step().id())
        .bind(code)
        .bind(c.now),
    )
    .await?;
    crate::telemetry::count_transitions("cancelled", code, cancelled);
    Ok(())
}

/// An `ask_agent` step's output: its status, the first delivered reply's
/// text, and every row's reply.
pub(crate) fn ask_output(message_id: &str, status: AskStatus, rows: &[StepRow]) -> Value {
    let text = |r: &StepRow| r.reply.as_ref().map_or(String::new(), |e| e.content.clone());
    let reply = rows
        .iter()
        .find(|r| r.status == DeliveryStatus::Delivered && r.reply.is_some())
        .map(text)
        .unwrap_or_default();
    let replies: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"agent": hex::encode(r.target), "delivery_id": r.id, "status": r.status.as_str(),
                   "event_id": r.reply.as_ref().map(|e| e.id.to_hex()), "text": text(r)})
        })
        .collect();
    json!({"event_id": message_id, "status": status.as_str(), "reply": reply, "replies": replies})
}

/// Why an `ask_agent` step failed: the rows that did not deliver.
pub(crate) fn agent_failed(rows: &[StepRow]) -> Failure {
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| r.status != DeliveryStatus::Delivered)
        .map(|r| {
            format!(
                "{} {}",
                r.status.as_str(),
                r.failure_code.as_deref().unwrap_or("-")
            )
        })
        .collect();
    Failure::new(
        "agent_failed",
        format!(
            "{} of {} deliveries did not deliver ({})",
            failed.len(),
            rows.len(),
            failed.join(", ")
        ),
    )
}
