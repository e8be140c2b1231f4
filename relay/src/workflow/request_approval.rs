//! The `request_approval` step: its timeout, and its end with the
//! decision (or `timed_out`), posted by the relay under the request.

use nostr::prelude::{Event, PublicKey};
use protocol::api::StepStatus;
use protocol::approval::{self, Decision};
use protocol::workflow::{self, Step};
use serde_json::json;

use super::message::sign_admitted;
use super::step::{Failure, Next, StepCtx, StepOutcome};
use crate::events::rules as events;
use crate::events::InsertOutcome;
use crate::faults;
use crate::persistence::db::Tx;
use crate::persistence::StoreError;
use crate::workflow::approvals;

/// An approval step's timeout in seconds (its default when unset).
pub(crate) fn approval_timeout(timeout_secs: Option<u64>) -> i64 {
    i64::try_from(timeout_secs.unwrap_or(workflow::DEFAULT_APPROVAL_TIMEOUT_SECS)).unwrap_or(i64::MAX)
}

/// A waiting approval step: ends with its decision, or `timed_out` once
/// its deadline passed with none (unless an approver decided first); the
/// relay posts the decision threaded under the request.
pub(crate) async fn resume_approval(
    tx: &mut Tx<'_>,
    c: &StepCtx<'_>,
    out: &mut StepOutcome,
) -> Result<Next, StoreError> {
    let Step::RequestApproval {
        timeout_secs,
        on_deny,
        ..
    } = c.step()
    else {
        return Err(StoreError::Corrupt("resume_approval on another action".into()));
    };
    let timeout = approval_timeout(*timeout_secs);
    let deadline = c.run.step_started_at.unwrap_or(c.now).saturating_add(timeout);
    let step_id = c.step().id();
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
    let output = json!({"decision": d.decision.as_str(), "by": d.by, "event_id": d.event_id});
    Ok(match d.decision {
        Decision::Approved => Next::Advance(c.entry(StepStatus::Done, output, None)),
        Decision::Denied => {
            let why = Failure::new("denied", format!("denied by {}", d.by));
            c.failed(output, why, *on_deny)
        }
        Decision::TimedOut => {
            let why = Failure::new("step_timeout", format!("no decision within {timeout} s"));
            c.failed(output, why, *on_deny)
        }
    })
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
