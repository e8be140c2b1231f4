//! The `request_approval` step: posts the request (for people: no
//! deliveries) and records it, then waits for its decision (or
//! `timed_out`), which the relay posts threaded under the request.

use nostr::prelude::{Event, PublicKey};
use protocol::approval::{self, Decision};
use protocol::workflow::{ApprovalOutput, RequestApproval};

use super::message::{post, recipients_of, sign_admitted, Addressed, Rows};
use super::step::{Failure, Next, RunStep, StepCtx, StepOutcome};
use crate::events::rules as events;
use crate::events::InsertOutcome;
use crate::faults;
use crate::persistence::db::Tx;
use crate::persistence::StoreError;
use crate::workflow::approvals;

impl RunStep for RequestApproval {
    async fn start(&self, tx: &mut Tx<'_>, c: &StepCtx<'_>, out: &mut StepOutcome) -> Result<Next, StoreError> {
        let request = match post(tx, c, out, Rows::None, |_| addressed(self, c)).await? {
            Ok(message) => message,
            Err(why) => return Ok(c.failed(self, None, why, protocol::workflow::OnFailure::Fail)),
        };
        let approvers = recipients_of(&request);
        // The deadline `resume` applies: the step starts now.
        let deadline = c.now.saturating_add(self.timeout());
        approvals::record_request(
            tx,
            c.community,
            c.run_id,
            &self.id,
            &c.run.channel,
            &request,
            &approvers,
            deadline,
        )
        .await?;
        Ok(Next::Wait { wake_at: deadline })
    }

    /// Ends with the decision, or `timed_out` once the deadline passed with
    /// none (unless an approver decided first); the relay posts the
    /// decision threaded under the request.
    async fn resume(&self, tx: &mut Tx<'_>, c: &StepCtx<'_>, out: &mut StepOutcome) -> Result<Next, StoreError> {
        let timeout = self.timeout();
        let deadline = c.run.step_started_at.unwrap_or(c.now).saturating_add(timeout);
        let step_id = self.id.as_str();
        let mut decided = approvals::decided(tx, c.community, c.run_id, step_id).await?;
        if decided.is_none() && c.now >= deadline {
            approvals::time_out(tx, c.community, c.run_id, step_id, c.now).await?;
            decided = approvals::decided(tx, c.community, c.run_id, step_id).await?;
        }
        let Some(d) = decided else {
            return Ok(Next::StillWaiting);
        };
        faults::check("approval:before_end")?;
        out.published.push(post_decision(tx, c, &d, timeout).await?);
        let output = ApprovalOutput {
            decision: d.decision,
            by: d.by.clone(),
            event_id: d.event_id.clone(),
        };
        Ok(match d.decision {
            Decision::Approved => c.done(self, &output),
            Decision::Denied => {
                let why = Failure::new("denied", format!("denied by {}", d.by));
                c.failed(self, Some(&output), why, self.on_deny)
            }
            Decision::TimedOut => {
                let why = Failure::new("step_timeout", format!("no decision within {timeout} s"));
                c.failed(self, Some(&output), why, self.on_deny)
            }
        })
    }
}

/// The request names the owner and the approvers, each once, and carries
/// the request mark; it is for people (no thread, no rows).
fn addressed(step: &RequestApproval, c: &StepCtx<'_>) -> Addressed {
    let mut to = vec![c.run.owner];
    for pk in step.approvers.iter().filter_map(|a| PublicKey::from_hex(a).ok()) {
        if !to.contains(&pk) {
            to.push(pk);
        }
    }
    Addressed {
        to,
        extra_tags: vec![approval::request_tag()],
        in_thread: false,
    }
}

/// Stores the relay's kind 9 naming an approval's decision, threaded under
/// the request (announced after commit with the step's other events).
async fn post_decision(
    tx: &mut Tx<'_>,
    c: &StepCtx<'_>,
    d: &approvals::Decided,
    timeout: i64,
) -> Result<(Event, String), StoreError> {
    let who = |hex: &str| {
        PublicKey::from_hex(hex)
            .ok()
            .and_then(|pk| nostr::prelude::ToBech32::to_bech32(&pk).ok())
            .map_or_else(|| hex.to_string(), |npub| format!("nostr:{npub}"))
    };
    let text = match d.decision {
        Decision::Approved => format!("Approved by {}", who(&d.by)),
        Decision::Denied => format!("Denied by {}", who(&d.by)),
        Decision::TimedOut => format!("No decision within {timeout} s: the request timed out"),
    };
    let tags = approval::decision_tags(
        &c.run.channel,
        &d.request_event_id,
        c.run_id,
        c.step().id(),
        d.decision,
    );
    let too_large = |bytes: String| Failure::new("message_too_large", bytes);
    let (ev, raw) = match sign_admitted(c.keys, text, tags, c.now, c.env.limits, too_large)? {
        Ok(signed) => signed,
        Err(why) => {
            return Err(StoreError::Corrupt(format!(
                "decision message refused: {}",
                why.message
            )))
        }
    };
    match events::insert(tx, c.community, &ev, &raw, Some(&c.run.channel))
        .await?
        .of_no_deletion()
    {
        InsertOutcome::Stored | InsertOutcome::Duplicate => {}
        InsertOutcome::Rejected(why) => {
            return Err(StoreError::Corrupt(format!("decision message refused: {why}")))
        }
    }
    Ok((ev, raw))
}
