//! Rerun of an ended run from the step it ended at (docs/workflows.md,
//! "Rerun"): a new run of the same workflow whose cause is its origin
//! (`rerun`, the origin's id; unique per workflow and cause, so a rerun
//! asked again makes nothing new), with the origin's trigger context and
//! the trace of the steps before kept (each entry naming the run it ran
//! in), starting at the step where the origin failed or was cancelled,
//! with the definition revision the origin ran with or the workflow's
//! latest. Every step from there runs again as in a new run: new
//! messages, deliveries, approval requests and webhook calls (a new
//! `Idempotency-Key`, the run id being new).

use protocol::api::{CauseKind, RunStatus};
use protocol::nip86::RerunDefinition;
use protocol::workflow::{Cause, Definition};

use super::definitions::load_definition;
use super::step::{load_run, RunRow};
use super::triggers::{insert_run, run_of_cause, startable, NewRun};
use crate::persistence::db::Tx;
use crate::persistence::StoreError;
use crate::refusal::{Answer, Refusal};

/// What a rerun request did.
#[derive(Debug, Clone)]
pub struct Rerun {
    /// The rerun (made by this request, or by an earlier one).
    pub run_id: String,
    /// The step it starts at.
    pub from_step: String,
    /// Whether this request made it.
    pub created: bool,
    pub workflow_id: String,
    pub channel: String,
}

/// Reruns `origin_id` from the step it ended at, unless it was rerun
/// before (then that rerun is the answer, `created` false). Refused for a
/// run that has not failed or been cancelled, a workflow that may not
/// start runs now, a definition no longer stored, and a latest definition
/// whose steps up to the rerun's first are not the origin's.
pub async fn rerun(
    tx: &mut Tx<'_>,
    community: &str,
    origin_id: &str,
    which: RerunDefinition,
) -> Answer<Rerun> {
    let origin = load_run(tx, community, origin_id)
        .await?
        .ok_or(Refusal::UnknownRun)?;
    if !matches!(origin.status, RunStatus::Failed | RunStatus::Cancelled) {
        return Err(Refusal::NotRerunnable(origin.status).into());
    }
    let ran = load_definition(tx, community, &origin.definition_event_id)
        .await?
        .ok_or(Refusal::DefinitionMissing)?;
    let from = usize::try_from(origin.current_step).unwrap_or(usize::MAX);
    let from_step = ran
        .steps
        .get(from)
        .ok_or_else(|| StoreError::Corrupt(format!("run {origin_id} ended past its last step")))?
        .id()
        .to_string();
    let cause = Cause {
        kind: CauseKind::Rerun,
        id: origin_id.to_string(),
    };
    let answer = |run_id: String, created: bool| Rerun {
        run_id,
        from_step: from_step.clone(),
        created,
        workflow_id: origin.workflow_id.clone(),
        channel: origin.channel.clone(),
    };
    if let Some(existing) = run_of_cause(tx, community, &origin.workflow_id, &cause).await? {
        return Ok(answer(existing, false));
    }
    let w = startable(tx, community, &origin.workflow_id).await?;
    let definition_event_id = match which {
        RerunDefinition::Kept => origin.definition_event_id,
        RerunDefinition::Latest => w.definition_event_id,
    };
    if definition_event_id != origin.definition_event_id {
        let latest = load_definition(tx, community, &definition_event_id)
            .await?
            .ok_or(Refusal::DefinitionMissing)?;
        same_steps_until(&ran, &latest, from).map_err(Refusal::DefinitionChanged)?;
    }
    let run = NewRun {
        cause: &cause,
        definition_event_id,
        current_step: origin.current_step,
        trace: kept_trace(&origin, origin_id, from)?,
        trigger_context: origin.trigger_context.clone(),
    };
    let (run_id, created) = insert_run(tx, community, &w, run).await?;
    Ok(answer(run_id, created))
}

/// The run that reruns `run_id`, if any.
pub(crate) async fn rerun_by(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: &str,
    run_id: &str,
) -> Result<Option<String>, StoreError> {
    let cause = Cause {
        kind: CauseKind::Rerun,
        id: run_id.to_string(),
    };
    run_of_cause(tx, community, workflow_id, &cause).await
}

/// Whether `latest` keeps the steps of `ran` up to and including `from`
/// (the same ids and actions, in the same order): the kept outputs are
/// then where the latest definition's templates and conditions read them.
/// `Err` says where they differ.
fn same_steps_until(ran: &Definition, latest: &Definition, from: usize) -> Result<(), String> {
    for (i, step) in ran.steps.iter().enumerate().take(from.saturating_add(1)) {
        let same = latest
            .steps
            .get(i)
            .is_some_and(|s| s.id() == step.id() && s.action() == step.action());
        if !same {
            return Err(format!(
                "the latest definition does not keep step {} ({} {}) where the run had it; \
                 rerun with the definition the run ran with",
                i + 1,
                step.id(),
                step.action().as_str()
            ));
        }
    }
    Ok(())
}

/// The origin's trace entries of the steps before `from`, each naming
/// the run it ran in, as stored JSON text.
fn kept_trace(origin: &RunRow, origin_id: &str, from: usize) -> Result<String, StoreError> {
    let kept: Vec<_> = origin
        .trace
        .iter()
        .take(from)
        .cloned()
        .map(|mut e| {
            e.kept_from.get_or_insert_with(|| origin_id.to_string());
            e
        })
        .collect();
    serde_json::to_string(&kept).map_err(|e| StoreError::Corrupt(format!("trace: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn def(steps: serde_json::Value) -> Definition {
        let content = json!({"name": "w", "trigger": {"on": "manual"}, "steps": steps});
        protocol::workflow::parse(&content.to_string()).unwrap()
    }

    #[test]
    fn the_latest_definition_must_keep_the_steps_before() {
        let ran = def(json!([
            {"id": "a", "action": "send_message", "text": "x"},
            {"id": "b", "action": "delay", "secs": 1},
            {"id": "c", "action": "send_message", "text": "y"}
        ]));
        let changed_after = def(json!([
            {"id": "a", "action": "send_message", "text": "x2"},
            {"id": "b", "action": "delay", "secs": 5},
            {"id": "d", "action": "send_message", "text": "z"}
        ]));
        assert!(same_steps_until(&ran, &changed_after, 1).is_ok());
        assert!(same_steps_until(&ran, &changed_after, 2).is_err());
        let renamed = def(json!([
            {"id": "a2", "action": "send_message", "text": "x"},
            {"id": "b", "action": "delay", "secs": 1}
        ]));
        let err = same_steps_until(&ran, &renamed, 1).unwrap_err();
        assert!(err.contains("step 1 (a send_message)"), "{err}");
        let other_action = def(json!([
            {"id": "a", "action": "delay", "secs": 1},
            {"id": "b", "action": "delay", "secs": 1}
        ]));
        assert!(same_steps_until(&ran, &other_action, 0).is_err());
        let shorter = def(json!([{"id": "a", "action": "send_message", "text": "x"}]));
        assert!(same_steps_until(&ran, &shorter, 1).is_err());
    }
}
