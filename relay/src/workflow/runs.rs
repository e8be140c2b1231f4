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
use protocol::api::{RunStatus, StepStatus};
use protocol::workflow::{Definition, OnFailure, Step};
use serde_json::{json, Value};

use super::step::{
    condition_holds, end_run, load_run, with_entry, Env, Failure, Next, RunRow, RunStep, StepCtx, StepOutcome,
};
use crate::faults;
use crate::persistence::db::{Tx, Q};
use crate::persistence::StoreError;
use crate::workflow::definitions::{load_definition, load_workflow};

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
/// a running run starts its step, a waiting one that was woken or whose
/// `wake_at` passed looks at what it waits for; either way the run's new
/// position is written in the same transaction.
pub async fn execute_step(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    run_id: &str,
    env: &Env<'_>,
) -> Result<StepOutcome, StoreError> {
    let mut out = StepOutcome::default();
    // Concurrent executions of one run (several processes) serialise here;
    // the second sees the step already done.
    tx.lock(&format!("{community}:run:{run_id}")).await?;
    let now = tx.now().await?;
    let Some((run, def)) = due_run(tx, community, run_id, now).await? else {
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
        RunStatus::Waiting => resume_kind(tx, &c, &mut out).await?,
        _ => start(tx, &c, &mut out).await?,
    };
    out.more = record(tx, &c, next, &mut out).await?;
    faults::check("step:before_commit")?;
    Ok(out)
}

/// The run and its definition, if it has a step to execute now. A run
/// that cannot go on (its workflow disabled, its definition gone) is ended
/// here.
async fn due_run(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    now: i64,
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
        RunStatus::Running => true,
        RunStatus::Waiting => woken || run.wake_at.is_some_and(|w| w <= now),
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

/// Starts the current step of a running run: its condition, then its kind.
async fn start(tx: &mut Tx<'_>, c: &StepCtx<'_>, out: &mut StepOutcome) -> Result<Next, StoreError> {
    match condition_holds(c) {
        Ok(true) => start_kind(tx, c, out).await,
        Ok(false) => Ok(Next::Advance(c.entry(
            StepStatus::Skipped,
            json!({"skipped": true}),
            None,
        ))),
        Err(why) => Ok(c.failed_with(Value::Null, why, OnFailure::Fail)),
    }
}

/// `start_kind` and `resume_kind`: the current step's own `start` or
/// `resume` (`RunStep`, in the kind's file), for every kind of
/// `protocol::step_kinds!`.
macro_rules! dispatch {
    ($($file:ident: $Kind:ident,)*) => {
        async fn start_kind(tx: &mut Tx<'_>, c: &StepCtx<'_>, out: &mut StepOutcome) -> Result<Next, StoreError> {
            match c.step() {
                $(Step::$Kind(step) => step.start(tx, c, out).await,)*
            }
        }

        async fn resume_kind(tx: &mut Tx<'_>, c: &StepCtx<'_>, out: &mut StepOutcome) -> Result<Next, StoreError> {
            match c.step() {
                $(Step::$Kind(step) => step.resume(tx, c, out).await,)*
            }
        }
    };
}

protocol::step_kinds!(dispatch);

/// Writes what the step decided. Returns whether the run has a step to
/// execute now.
async fn record(
    tx: &mut Tx<'_>,
    c: &StepCtx<'_>,
    next: Next,
    out: &mut StepOutcome,
) -> Result<bool, StoreError> {
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
            let next = c.run.current_step + 1;
            let more = usize::try_from(next).is_ok_and(|n| n < c.def.steps.len());
            out.spans = c.ended_spans(&entry, (!more).then_some(RunStatus::Completed));
            let trace = with_entry(c.run, entry);
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
            out.spans = c.ended_spans(&entry, Some(RunStatus::Failed));
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
