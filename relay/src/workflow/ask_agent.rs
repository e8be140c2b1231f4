//! The `ask_agent` step: posts its message with one awaited delivery per
//! managed-agent recipient, then waits until it is over (`decide`); its
//! rows and their replies, its output and its failure.

use nostr::prelude::Event;
use protocol::api::DeliveryStatus;
use protocol::workflow::{AskAgent, AskOutput, AskReply, AskStatus, Wait};

use super::message::{post, stored_message, Addressed, Rows};
use super::revision::revise_refused;
use super::step::{json_of, Failure, Next, RunStep, StepCtx, StepOutcome};
use crate::faults;
use crate::persistence::db::{named, Tx, Q};
use crate::persistence::StoreError;
use crate::delivery::cancel::{cancel_open, Open};

impl RunStep for AskAgent {
    async fn start(&self, tx: &mut Tx<'_>, c: &StepCtx<'_>, out: &mut StepOutcome) -> Result<Next, StoreError> {
        let message = match post(tx, c, out, Rows::Awaited, |t| Addressed::mentions(c, t, self.reply_in_thread)).await? {
            Ok(message) => message,
            Err(why) => return Ok(c.failed(self, None, why, self.on_failure)),
        };
        if step_rows(tx, c).await?.is_empty() {
            let output = output_of(self, &message.id.to_hex(), AskStatus::Failed, &[]);
            let why = Failure::new(
                "no_agent",
                "no recipient of the step is a managed agent in the channel",
            );
            return Ok(c.failed(self, Some(&output), why, self.on_failure));
        }
        Ok(Next::Wait {
            wake_at: c.now.saturating_add(self.timeout()),
        })
    }

    async fn resume(&self, tx: &mut Tx<'_>, c: &StepCtx<'_>, out: &mut StepOutcome) -> Result<Next, StoreError> {
        let deadline = c.run.step_started_at.unwrap_or(c.now).saturating_add(self.timeout());
        // Answers refused since it last looked: asked again, or failed.
        if c.now < deadline {
            revise_refused(tx, c, self, out).await?;
        }
        let rows = step_rows(tx, c).await?;
        let statuses: Vec<DeliveryStatus> = rows.iter().map(|r| r.status).collect();
        let Some(status) = decide(self.wait, &statuses, c.now >= deadline) else {
            return Ok(Next::StillWaiting);
        };
        // Test-only: die in the transaction that ends the step (after
        // the finish that woke it committed, before the run moves on).
        faults::check("ask:before_end")?;
        let cancel_code = if status == AskStatus::TimedOut {
            "step_timeout"
        } else {
            "step_done"
        };
        let rows = if statuses.iter().any(|s| !s.is_terminal()) {
            cancel_open_rows(tx, c, cancel_code).await?;
            // Read again: a finish may have ended a row meanwhile.
            step_rows(tx, c).await?
        } else {
            rows
        };
        // A waiting ask posted its message (and has rows: none fails it
        // at once, `no_agent`).
        let message = stored_message(tx, c.community, c.run_id, &self.id).await?;
        let message_id = message
            .map(|m| m.id.to_hex())
            .ok_or_else(|| StoreError::Corrupt("a waiting ask_agent step has no message".into()))?;
        let output = output_of(self, &message_id, status, &rows);
        Ok(match status {
            AskStatus::Delivered => c.done(self, &output),
            AskStatus::Failed => c.failed(self, Some(&output), agent_failed(&rows), self.on_failure),
            AskStatus::TimedOut => {
                let why = Failure::new("step_timeout", format!("no answer within {} s", self.timeout()));
                c.failed(self, Some(&output), why, self.on_failure)
            }
        })
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
    pub(crate) reply: Option<Event>,
}

/// The current step's delivery rows in the order they ended (then by id),
/// with their replies.
pub(crate) async fn step_rows(tx: &mut Tx<'_>, c: &StepCtx<'_>) -> Result<Vec<StepRow>, StoreError> {
    let rows = tx
        .all(
            Q::new(
                "SELECT d.id, d.target_pubkey, d.status, d.failure_code, e.raw \
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
                reply,
            })
        })
        .collect()
}

/// Cancels the current step's open rows (an `any` step answered, or the
/// step timed out): their holders' finishes then answer 410.
async fn cancel_open_rows(tx: &mut Tx<'_>, c: &StepCtx<'_>, code: &str) -> Result<(), StoreError> {
    let step = Open::Step {
        run: c.run_id,
        step: c.step().id(),
    };
    cancel_open(tx, c.community, step, code, c.now).await?;
    Ok(())
}

/// The step's output: its status, the first delivered reply's text (and,
/// with an `output`, its properties), and every row's reply.
fn output_of(ask: &AskAgent, message_id: &str, status: AskStatus, rows: &[StepRow]) -> AskOutput {
    let mut output = ask_output(message_id, status, rows);
    if let Some(schema) = &ask.output {
        output.fields = schema.answer_fields(&output.reply);
    }
    output
}

/// An `ask_agent` step's output without its answer's properties.
fn ask_output(message_id: &str, status: AskStatus, rows: &[StepRow]) -> AskOutput {
    let text = |r: &StepRow| r.reply.as_ref().map_or(String::new(), |e| e.content.clone());
    let reply = rows
        .iter()
        .find(|r| r.status == DeliveryStatus::Delivered && r.reply.is_some())
        .map(text)
        .unwrap_or_default();
    let replies = rows
        .iter()
        .map(|r| AskReply {
            agent: hex::encode(r.target),
            delivery_id: r.id.clone(),
            status: r.status,
            event_id: r.reply.as_ref().map(|e| e.id.to_hex()),
            text: text(r),
        })
        .collect();
    AskOutput {
        event_id: message_id.to_string(),
        status,
        reply,
        replies,
        fields: serde_json::Map::new(),
    }
}

/// Why an `ask_agent` step failed: the rows that did not deliver.
fn agent_failed(rows: &[StepRow]) -> Failure {
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

#[cfg(test)]
mod tests {
    use super::*;
    use DeliveryStatus::*;

    #[test]
    fn an_ask_ends_as_its_wait_says() {
        let all = Wait::All;
        let any = Wait::Any;
        assert_eq!(decide(all, &[Delivered, Claimed], false), None);
        assert_eq!(
            decide(all, &[Delivered, Delivered], false),
            Some(AskStatus::Delivered)
        );
        assert_eq!(decide(all, &[Delivered, Failed], false), Some(AskStatus::Failed));
        assert_eq!(
            decide(all, &[Delivered, Pending], true),
            Some(AskStatus::TimedOut)
        );
        assert_eq!(
            decide(any, &[Pending, Delivered], false),
            Some(AskStatus::Delivered)
        );
        assert_eq!(decide(any, &[Failed, Claimed], false), None);
        assert_eq!(decide(any, &[Failed, Expired], false), Some(AskStatus::Failed));
        assert_eq!(decide(any, &[Failed, Claimed], true), Some(AskStatus::TimedOut));
        // What ended before the deadline counts, even when looked at after it.
        assert_eq!(
            decide(any, &[Delivered, Claimed], true),
            Some(AskStatus::Delivered)
        );
        assert_eq!(decide(all, &[Cancelled], false), Some(AskStatus::Failed));
    }
}
