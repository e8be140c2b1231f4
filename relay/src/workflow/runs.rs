//! Durable runs: each step of a run is one transaction that re-checks
//! where the run is, does the step's work, and moves the run on, or none
//! of it.
//!
//! A step that posts (`send_message`, `ask_agent`) stores the
//! relay-signed kind 9, the step's message record and one delivery row
//! per managed-agent recipient (unique per run, step and target; foreign
//! key to the exact event). A replay finds the message record and reuses
//! the event; rows it already made are kept (`ON CONFLICT DO NOTHING`).
//!
//! A step that waits (`ask_agent`, `delay`) leaves the run `waiting` with
//! `wake_at`, when the engine looks at it again: the delay's end, or the
//! ask's timeout. A finish that ends one of an `ask_agent` step's rows
//! records a wake for the run in the finish's own transaction (`poke`: a
//! row of `workflow_run_wakes`; it never touches the run's row, which
//! call writers side by side would wait on in cycles), so the engine
//! resumes the run from committed state: the
//! replies are the rows' committed replies, read once under the run's
//! lock when the step ends, and the step ends once, because ending it
//! moves the run off `waiting` in the same transaction.

use nostr::prelude::Keys;
use protocol::api::{DeliveryStatus, RunStatus, StepStatus};
use protocol::workflow::{Definition, OnFailure, Step};
use serde_json::{json, Value};

use super::ask_agent::{
    agent_failed, ask_output, ask_timeout, cancel_open_rows, decide, step_rows, AskStatus,
};
use super::call_webhook::{resume_call, start_call};
use super::message::{post, recipients_of, Rows};
use super::request_approval::{approval_timeout, resume_approval};
use super::step::{
    condition_holds, end_run, load_run, with_entry, Env, Failure, Next, RunRow, StepCtx, StepOutcome,
};
use crate::faults;
use crate::persistence::db::{Tx, Q};
use crate::persistence::StoreError;
use crate::workflow::approvals;
use crate::workflow::definitions::{load_definition, load_workflow};
use crate::workflow::outcalls::CallAnswer;

/// Takes a run's wakes (the engine is looking at it now); returns how many
/// there were. Deleted before the step's rows are read: a wake committed
/// after this statement stays for the next look, and one committed before
/// it came with its row's end, which the read then sees.
async fn take_wakes(tx: &mut Tx<'_>, community: &str, run_id: &str) -> Result<u64, StoreError> {
    tx.exec(
        Q::new("DELETE FROM workflow_run_wakes WHERE community_id = $1 AND run_id = $2")
            .bind(community)
            .bind(run_id),
    )
    .await
}

/// Executes the current step of a run, if the run is due, inside `tx`:
/// a running run starts its step, a waiting one whose `wake_at` passed
/// looks at what it waits for; either way the run's new position is
/// written in the same transaction.
pub async fn execute_step(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    run_id: &str,
    env: &Env<'_>,
    answer: Option<&CallAnswer>,
) -> Result<StepOutcome, StoreError> {
    let mut out = StepOutcome::default();
    // Concurrent executions of one run (several processes) serialise here;
    // the second sees the step already done.
    tx.lock(&format!("{community}:run:{run_id}")).await?;
    let now = tx.now().await?;
    let Some((run, def)) = due_run(tx, community, run_id, now, answer.is_some()).await? else {
        return Ok(out);
    };
    let index = usize::try_from(run.current_step).unwrap_or(usize::MAX);
    if index >= def.steps.len() {
        end_run(tx, community, run_id, RunStatus::Completed, None).await?;
        return Ok(out);
    }
    let c = StepCtx {
        community,
        keys,
        run_id,
        run: &run,
        def: &def,
        index,
        now,
        env,
    };
    let next = match run.status {
        RunStatus::Waiting => resume(tx, &c, answer, &mut out).await?,
        _ => start(tx, &c, &mut out).await?,
    };
    out.more = record(tx, &c, next).await?;
    faults::check("step:before_commit")?;
    Ok(out)
}

/// The run and its definition, if it has a step to execute now (with
/// `answered`, a webhook call's answer: only a waiting run takes one). A
/// run that cannot go on (its workflow disabled, its definition gone) is
/// ended here.
async fn due_run(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    now: i64,
    answered: bool,
) -> Result<Option<(RunRow, Definition)>, StoreError> {
    let Some(run) = load_run(tx, community, run_id).await? else {
        return Ok(None);
    };
    let workflow = load_workflow(tx, community, &run.workflow_id).await?;
    if workflow.as_ref().is_some_and(|w| w.paused) {
        // Held, wakes included, until the workflow is resumed.
        return Ok(None);
    }
    // Whatever the run's state: a wake left for a run that moved on would
    // list it again on every pass.
    let woken = take_wakes(tx, community, run_id).await? > 0;
    let due = match run.status {
        RunStatus::Running => !answered,
        RunStatus::Waiting => answered || woken || run.wake_at.is_some_and(|w| w <= now),
        _ => false,
    };
    if !due {
        return Ok(None);
    }
    let live = workflow.is_some_and(|w| w.enabled && !w.deleted);
    if !live {
        let why = Failure::new("workflow_disabled", "workflow disabled or deleted");
        end_run(tx, community, run_id, RunStatus::Cancelled, Some(why)).await?;
        return Ok(None);
    }
    match load_definition(tx, community, &run.definition_event_id).await? {
        Some(def) => Ok(Some((run, def))),
        None => {
            let why = Failure::new("definition_missing", "definition revision is no longer stored");
            end_run(tx, community, run_id, RunStatus::Failed, Some(why)).await?;
            Ok(None)
        }
    }
}

/// Starts the current step of a running run: its condition, then its action.
async fn start(tx: &mut Tx<'_>, c: &StepCtx<'_>, out: &mut StepOutcome) -> Result<Next, StoreError> {
    match condition_holds(c) {
        Ok(true) => {}
        Ok(false) => {
            return Ok(Next::Advance(c.entry(
                StepStatus::Skipped,
                json!({"skipped": true}),
                None,
            )))
        }
        Err(why) => return Ok(c.failed(Value::Null, why, OnFailure::Fail)),
    }
    match c.step() {
        Step::Delay { secs, .. } => Ok(Next::Wait {
            wake_at: c.now.saturating_add(i64::try_from(*secs).unwrap_or(i64::MAX)),
        }),
        Step::SendMessage { .. } => {
            let message = match post(tx, c, out, Rows::Plain).await? {
                Ok(message) => message,
                Err(why) => return Ok(c.failed(Value::Null, why, OnFailure::Fail)),
            };
            let output = json!({"event_id": message.id.to_hex(), "text": message.content});
            Ok(Next::Advance(c.entry(StepStatus::Done, output, None)))
        }
        Step::AskAgent {
            timeout_secs,
            on_failure,
            ..
        } => {
            let message = match post(tx, c, out, Rows::Awaited).await? {
                Ok(message) => message,
                Err(why) => return Ok(c.failed(Value::Null, why, *on_failure)),
            };
            if step_rows(tx, c).await?.is_empty() {
                let output = ask_output(&message.id.to_hex(), AskStatus::Failed, &[]);
                let why = Failure::new(
                    "no_agent",
                    "no recipient of the step is a managed agent in the channel",
                );
                return Ok(c.failed(output, why, *on_failure));
            }
            Ok(Next::Wait {
                wake_at: c.now.saturating_add(ask_timeout(*timeout_secs)),
            })
        }
        Step::RequestApproval { timeout_secs, .. } => {
            let request = match post(tx, c, out, Rows::None).await? {
                Ok(message) => message,
                Err(why) => return Ok(c.failed(Value::Null, why, OnFailure::Fail)),
            };
            let approvers = recipients_of(&request);
            // The deadline `resume_approval` applies: the step starts now.
            let deadline = c.now.saturating_add(approval_timeout(*timeout_secs));
            approvals::record_request(
                tx,
                c.community,
                c.run_id,
                c.step().id(),
                &c.run.channel,
                &request,
                &approvers,
                deadline,
            )
            .await?;
            Ok(Next::Wait { wake_at: deadline })
        }
        Step::CallWebhook { .. } => start_call(tx, c, out).await,
    }
}

/// Looks again at the current step of a waiting run (with a webhook
/// call's answer, when that is what woke it).
async fn resume(
    tx: &mut Tx<'_>,
    c: &StepCtx<'_>,
    answer: Option<&CallAnswer>,
    out: &mut StepOutcome,
) -> Result<Next, StoreError> {
    match c.step() {
        Step::CallWebhook { .. } => return resume_call(tx, c, answer, out).await,
        Step::RequestApproval { .. } => return resume_approval(tx, c, out).await,
        _ if answer.is_some() => return Ok(Next::StillWaiting),
        _ => {}
    }
    let started = c.run.step_started_at.unwrap_or(c.now);
    match c.step() {
        Step::Delay { secs, .. } => {
            let until = started.saturating_add(i64::try_from(*secs).unwrap_or(i64::MAX));
            if c.now < until {
                return Ok(Next::StillWaiting);
            }
            faults::check("delay:before_fire")?;
            Ok(Next::Advance(c.entry(
                StepStatus::Done,
                json!({"until": until}),
                None,
            )))
        }
        Step::AskAgent {
            wait,
            timeout_secs,
            on_failure,
            ..
        } => {
            let timeout = ask_timeout(*timeout_secs);
            let deadline = started.saturating_add(timeout);
            let rows = step_rows(tx, c).await?;
            let statuses: Vec<DeliveryStatus> = rows.iter().map(|r| r.status).collect();
            let Some(status) = decide(*wait, &statuses, c.now >= deadline) else {
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
            // A waiting ask has rows (none fails it at once, `no_agent`).
            let message_id = rows
                .first()
                .map(|r| hex::encode(r.message_event_id))
                .ok_or_else(|| StoreError::Corrupt("a waiting ask_agent step has no deliveries".into()))?;
            let output = ask_output(&message_id, status, &rows);
            Ok(match status {
                AskStatus::Delivered => Next::Advance(c.entry(StepStatus::Done, output, None)),
                AskStatus::Failed => c.failed(output, agent_failed(&rows), *on_failure),
                AskStatus::TimedOut => {
                    let why = Failure::new("step_timeout", format!("no answer within {timeout} s"));
                    c.failed(output, why, *on_failure)
                }
            })
        }
        Step::SendMessage { .. } | Step::RequestApproval { .. } | Step::CallWebhook { .. } => {
            Err(StoreError::Corrupt("this step does not wait here".into()))
        }
    }
}

/// Writes what the step decided. Returns whether the run has a step to
/// execute now.
async fn record(tx: &mut Tx<'_>, c: &StepCtx<'_>, next: Next) -> Result<bool, StoreError> {
    let base = |sql: &str| {
        Q::new(sql.to_string())
            .bind(c.community)
            .bind(c.run_id)
            .bind(c.now)
    };
    match next {
        Next::Wait { wake_at } => {
            tx.exec(
                base(
                    "UPDATE workflow_runs SET status = 'waiting', step_started_at = $3, wake_at = $4, \
                     updated_at = $3 WHERE community_id = $1 AND id = $2",
                )
                .bind(wake_at),
            )
            .await?;
            Ok(false)
        }
        Next::StillWaiting => Ok(false),
        Next::Rewait { wake_at } => {
            tx.exec(
                base("UPDATE workflow_runs SET wake_at = $4, updated_at = $3 WHERE community_id = $1 AND id = $2")
                    .bind(wake_at),
            )
            .await?;
            Ok(false)
        }
        Next::Advance(entry) => {
            let trace = with_entry(c.run, entry);
            let next = c.run.current_step + 1;
            let more = usize::try_from(next).is_ok_and(|n| n < c.def.steps.len());
            let status = if more {
                RunStatus::Running
            } else {
                RunStatus::Completed
            };
            tx.exec(
                base(
                    "UPDATE workflow_runs SET current_step = $4, trace = $5, status = $6, wake_at = NULL, \
                     step_started_at = NULL, updated_at = $3 WHERE community_id = $1 AND id = $2",
                )
                .bind(next)
                .bind(trace)
                .bind(status.as_str()),
            )
            .await?;
            Ok(more)
        }
        Next::Fail(entry, why) => {
            let step = entry.step.clone();
            let trace = with_entry(c.run, entry);
            tx.exec(
                base(
                    "UPDATE workflow_runs SET status = 'failed', trace = $4, error = $5, error_code = $6, \
                     error_step = $7, wake_at = NULL, updated_at = $3 WHERE community_id = $1 AND id = $2",
                )
                .bind(trace)
                .bind(why.message)
                .bind(why.code)
                .bind(step),
            )
            .await?;
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::step::TraceEntry;
    use crate::workflow::views::{step_views, Current};
    use protocol::workflow::Wait;
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

    #[test]
    fn old_trace_entries_read_as_done() {
        let old: Vec<TraceEntry> =
            serde_json::from_value(json!([{"step": "a", "output": {"event_id": "e", "text": "t"}}])).unwrap();
        assert_eq!(old[0].status, StepStatus::Done);
        let views = step_views(
            None,
            &old,
            &Current {
                index: 1,
                run: RunStatus::Completed,
                started_at: None,
                error: None,
            },
        );
        assert_eq!(views[0].action, "send_message");
        assert_eq!(views[0].output.as_ref().unwrap()["event_id"], "e");
    }
}
