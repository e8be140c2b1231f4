//! Runs as the engine and people see them: the runs due now, where a run
//! is, cancel and reopen by management, and the run listings and views.

use protocol::api::{CauseKind, CauseView, RunError, RunStatus, RunView, SkipView, StepStatus, StepView};
use protocol::workflow::{Action, Definition, Step};
use serde_json::Value;

use super::step::{end_run, load_run, Failure, TraceEntry};
use crate::delivery::cancel::{cancel_open, Open};
use crate::persistence::db::{named, Pool, Row, Tx, Q};
use crate::persistence::StoreError;
use crate::refusal::{Answer, Refusal};
use crate::workflow::definitions::load_definition;

/// A run (`r`) whose workflow is not paused: a paused workflow's runs
/// wait, wherever they are, until it is resumed.
const NOT_PAUSED: &str = "NOT EXISTS (SELECT 1 FROM workflows w WHERE w.community_id = r.community_id \
     AND w.id = r.workflow_id AND w.paused)";

/// Up to `limit` runs with a step to execute now, oldest (by creation)
/// first, whatever made them due: running, waiting with `wake_at` passed
/// (by the database's clock), or woken by a finish. One order for all
/// three means a run due before another was created is taken no later
/// than it (the engine's rounds take a prefix of this list, and the tests'
/// barrier relies on it: `tests::workflow::Fixture::barrier`).
/// Single statements, so they need no transaction (the engine asks after
/// every trigger; a read transaction around them was two round trips more
/// each time).
pub async fn due_runs(pool: &Pool, community: &str, limit: u32) -> Result<Vec<String>, StoreError> {
    let now = pool.dialect().now();
    let sources = [
        format!(
            "SELECT id, created_at FROM workflow_runs r WHERE community_id = $1 AND status = 'running' \
             AND {NOT_PAUSED} ORDER BY created_at, id LIMIT $2"
        ),
        format!(
            "SELECT id, created_at FROM workflow_runs r WHERE community_id = $1 AND status = 'waiting' \
             AND wake_at <= {now} AND {NOT_PAUSED} ORDER BY created_at, id LIMIT $2"
        ),
    ];
    let mut due: Vec<(i64, String)> = Vec::new();
    for sql in sources {
        let rows = pool
            .all(Q::new(sql).bind(community).bind(i64::from(limit)))
            .await?;
        for r in &rows {
            due.push((r.int(1)?, r.text(0)?));
        }
    }
    due.extend(woken_runs(pool, community).await?);
    due.sort();
    due.dedup_by(|a, b| a.1 == b.1);
    due.truncate(limit as usize);
    Ok(due.into_iter().map(|(_, id)| id).collect())
}

/// Most runs with a finish's wake that one listing reads (the wakes are
/// bounded by the open deliveries of waiting steps).
const MAX_WOKEN: i64 = 1_000;

/// The runs a finish woke, with their creation times: read from the
/// wakes table first (mostly empty; a join driven from the runs was
/// planned as a walk of every run on PostgreSQL, 880 blocks a round),
/// then the runs by key.
async fn woken_runs(pool: &Pool, community: &str) -> Result<Vec<(i64, String)>, StoreError> {
    let woken = pool
        .all(
            Q::new(format!(
                "SELECT DISTINCT run_id FROM workflow_run_wakes k WHERE community_id = $1 AND NOT EXISTS \
                 (SELECT 1 FROM workflow_runs r WHERE r.community_id = k.community_id AND r.id = k.run_id \
                 AND NOT {NOT_PAUSED}) LIMIT $2"
            ))
            .bind(community)
            .bind(MAX_WOKEN),
        )
        .await?;
    if woken.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<String> = woken.iter().map(|r| r.text(0)).collect::<Result<_, _>>()?;
    let d = pool.dialect();
    let q = Q::new("SELECT id, created_at FROM workflow_runs WHERE community_id = ")
        .arg(d, community)
        .push_text(" AND id IN ")
        .in_list(d, ids);
    pool.all(q)
        .await?
        .iter()
        .map(|r| Ok((r.int(1)?, r.text(0)?)))
        .collect()
}

/// The workflow and channel of a run, and where it is.
pub async fn place_of(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
) -> Result<Option<(String, String, RunStatus)>, StoreError> {
    Ok(load_run(tx, community, run_id)
        .await?
        .map(|r| (r.workflow_id, r.channel, r.status)))
}

/// `cancelrun`: a run that has not ended is cancelled (`error_code`
/// `cancelled`, `why` its message) with its open deliveries (their
/// holders' finishes then answer 410).
pub async fn cancel_by(tx: &mut Tx<'_>, community: &str, run_id: &str, why: &str) -> Answer<()> {
    tx.lock(&format!("{community}:run:{run_id}")).await?;
    let run = load_run(tx, community, run_id)
        .await?
        .ok_or(Refusal::UnknownRun)?;
    if !matches!(run.status, RunStatus::Running | RunStatus::Waiting) {
        return Err(Refusal::RunEnded(run.status).into());
    }
    let now = tx.now().await?;
    end_run(
        tx,
        community,
        run_id,
        RunStatus::Cancelled,
        Some(Failure::new("cancelled", why)),
    )
    .await?;
    cancel_open(tx, community, Open::Run(run_id), "run_cancelled", now).await?;
    Ok(())
}

/// After `retrydelivery` of a row of `step_id`: a run that failed at that
/// `ask_agent` step waits there again, its timeout counted from now (the
/// failed entry leaves the trace; the step's new end takes its place).
/// Returns whether the run was reopened.
pub async fn reopen_at(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    step_id: &str,
) -> Result<bool, StoreError> {
    tx.lock(&format!("{community}:run:{run_id}")).await?;
    let Some(mut run) = load_run(tx, community, run_id).await? else {
        return Ok(false);
    };
    if run.status != RunStatus::Failed {
        return Ok(false);
    }
    let Some(def) = load_definition(tx, community, &run.definition_event_id).await? else {
        return Ok(false);
    };
    let step = usize::try_from(run.current_step)
        .ok()
        .and_then(|i| def.steps.get(i));
    let timeout = match step {
        Some(Step::AskAgent(ask)) if ask.id == step_id => ask.timeout(),
        _ => return Ok(false),
    };
    if run.trace.last().is_some_and(|e| e.step == step_id) {
        run.trace.pop();
    }
    let trace = serde_json::to_string(&run.trace).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let now = tx.now().await?;
    tx.exec(
        Q::new(
            "UPDATE workflow_runs SET status = 'waiting', error = NULL, error_code = NULL, error_step = NULL, \
             trace = $3, step_started_at = $4, wake_at = $5, updated_at = $4 WHERE community_id = $1 AND id = $2",
        )
        .bind(community)
        .bind(run_id)
        .bind(trace)
        .bind(now)
        .bind(now.saturating_add(timeout)),
    )
    .await?;
    Ok(true)
}

/// Bytes of run traces one page of runs carries, at most (past the first
/// run): a trace holds up to `MAX_STEPS` outputs of up to
/// `max_event_bytes` each (more for an `ask_agent` step with many
/// replies), and a page of 100 such runs would be hundreds of MB.
pub const MAX_RUNS_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// A page of runs, newest first; `cut` when it stopped at
/// [`MAX_RUNS_PAGE_BYTES`] before its limit.
#[derive(Debug, Default)]
pub struct RunList {
    pub runs: Vec<RunView>,
    pub cut: bool,
}

const VIEW_COLS: &str = "id, workflow_id, status, current_step, cause_type, cause_id, error, error_code, \
    error_step, created_at, updated_at, trace, definition_event_id, step_started_at, wake_at";

/// Where a page of runs begins: before `created_at`, or at it with an id
/// before `id` (runs are listed by creation time, then id, both
/// descending, so that runs made in the same second are never skipped).
#[derive(Debug, Clone, Copy)]
pub struct Before<'a> {
    pub created_at: i64,
    pub id: Option<&'a str>,
}

/// A page of a workflow's runs, newest first.
pub async fn list_runs(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: Option<&str>,
    before: Option<Before<'_>>,
    limit: u32,
) -> Result<RunList, StoreError> {
    let d = tx.dialect();
    let mut q = Q::new(format!(
        "SELECT {VIEW_COLS} FROM workflow_runs WHERE community_id = "
    ))
    .arg(d, community);
    if let Some(w) = workflow_id {
        q = q.and(d, "workflow_id =", w);
    }
    if let Some(b) = before {
        q = q.before_key(d, b.created_at, b.id);
    }
    let q = q
        .push_text(" ORDER BY created_at DESC, id DESC LIMIT ")
        .arg(d, i64::from(limit));
    let rows = tx.all(q).await?;
    let mut page = RunList::default();
    let mut bytes = 0usize;
    let mut definitions: Vec<([u8; 32], Option<Definition>)> = Vec::new();
    for r in &rows {
        let trace = r.text("trace")?;
        if !page.runs.is_empty() && bytes + trace.len() > MAX_RUNS_PAGE_BYTES {
            page.cut = true;
            break;
        }
        bytes += trace.len();
        let def_id = r.id32("definition_event_id")?;
        if !definitions.iter().any(|(id, _)| *id == def_id) {
            definitions.push((def_id, load_definition(tx, community, &def_id).await?));
        }
        let def = definitions
            .iter()
            .find(|(id, _)| *id == def_id)
            .and_then(|(_, d)| d.as_ref());
        page.runs.push(run_view(r, &trace, def)?);
    }
    Ok(page)
}

/// One run as listed: every step of its definition with where it is.
fn run_view(r: &Row, trace: &str, def: Option<&Definition>) -> Result<RunView, StoreError> {
    let status = named(&r.text("status")?, RunStatus::parse)?;
    let error = match (r.opt_text("error_code")?, r.opt_text("error")?) {
        (None, None) => None,
        (code, message) => Some(RunError {
            code: code.unwrap_or_else(|| "failed".into()),
            message: message.unwrap_or_default(),
            step: r.opt_text("error_step")?,
        }),
    };
    let trace: Vec<TraceEntry> = serde_json::from_str(trace).unwrap_or_default();
    let current = Current {
        index: usize::try_from(r.int("current_step")?).unwrap_or(usize::MAX),
        run: status,
        started_at: r.opt_int("step_started_at")?,
        error: error.as_ref(),
    };
    Ok(RunView {
        id: r.text("id")?,
        workflow_id: r.text("workflow_id")?,
        status,
        current_step: r.int("current_step")?,
        cause: CauseView {
            kind: named(&r.text("cause_type")?, CauseKind::parse)?,
            id: r.text("cause_id")?,
        },
        created_at: r.int("created_at")?,
        updated_at: r.int("updated_at")?,
        wake_at: r.opt_int("wake_at")?.filter(|_| status == RunStatus::Waiting),
        steps: step_views(def, &trace, &current),
        error,
        definition_event_id: hex::encode(r.blob("definition_event_id")?),
        trigger_context: None,
        channel: None,
        rerun_by: None,
        trace_id: None,
    })
}

/// Where a run is, for its step views.
pub(crate) struct Current<'a> {
    pub(crate) index: usize,
    pub(crate) run: RunStatus,
    pub(crate) started_at: Option<i64>,
    pub(crate) error: Option<&'a RunError>,
}

/// Every step of the definition: ended ones from the trace, the current
/// one from the run, the rest pending. Without the definition (no longer
/// stored), only the trace.
pub(crate) fn step_views(def: Option<&Definition>, trace: &[TraceEntry], at: &Current<'_>) -> Vec<StepView> {
    let ended = |e: &TraceEntry| StepView {
        id: e.step.clone(),
        action: e.action.map_or("send_message", Action::as_str).to_string(),
        status: e.status,
        started_at: e.started_at,
        finished_at: e.finished_at,
        output: Some(e.output.clone()),
        error: e.error.clone(),
        approval: None,
        skipped: None,
        call: None,
        kept_from: e.kept_from.clone(),
    };
    let Some(def) = def else {
        return trace.iter().map(ended).collect();
    };
    def.steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if let Some(e) = trace.iter().find(|e| e.step == s.id()) {
                return ended(e);
            }
            let here = i == at.index;
            let status = match at.run {
                RunStatus::Running if here => StepStatus::Running,
                RunStatus::Waiting if here => StepStatus::Waiting,
                RunStatus::Cancelled | RunStatus::Failed if here => StepStatus::Failed,
                _ => StepStatus::Pending,
            };
            let in_flight = matches!(status, StepStatus::Running | StepStatus::Waiting);
            StepView {
                id: s.id().to_string(),
                action: s.action().as_str().to_string(),
                status,
                started_at: at
                    .started_at
                    .filter(|_| in_flight || status == StepStatus::Failed),
                finished_at: None,
                output: None,
                error: (status == StepStatus::Failed)
                    .then(|| at.error.cloned())
                    .flatten(),
                approval: None,
                skipped: None,
                call: None,
                kept_from: None,
            }
        })
        .collect()
}

/// Each skipped step's condition and the values it read in this run (the
/// outputs of earlier steps, which do not change once they ended, and
/// the trigger), so that the page says why without evaluating anything.
fn explain_skips(steps: &mut [StepView], def: &Definition, ctx: &Value) {
    for i in 0..def.steps.len() {
        let Some(view) = steps.get_mut(i).filter(|v| v.status == StepStatus::Skipped) else {
            continue;
        };
        let Some((src, compiled)) = super::step::compiled_condition(def, i) else {
            continue;
        };
        let inputs = compiled.map(|c| c.inputs(ctx)).unwrap_or_default();
        view.skipped = Some(SkipView {
            condition: src.to_string(),
            inputs,
        });
    }
}

/// One run by id, with its trigger context and channel.
pub async fn show_run(tx: &mut Tx<'_>, community: &str, run_id: &str) -> Result<Option<RunView>, StoreError> {
    let row = tx
        .one(
            Q::new(format!(
                "SELECT {VIEW_COLS}, trigger_context, channel FROM workflow_runs \
                 WHERE community_id = $1 AND id = $2"
            ))
            .bind(community)
            .bind(run_id),
        )
        .await?;
    let Some(r) = row else { return Ok(None) };
    let def = load_definition(tx, community, &r.id32("definition_event_id")?).await?;
    let trace = r.text("trace")?;
    let mut run = run_view(&r, &trace, def.as_ref())?;
    let trigger = serde_json::from_str::<Value>(&r.text("trigger_context")?).unwrap_or(Value::Null);
    if let Some(def) = &def {
        let trace = serde_json::from_str::<Value>(&trace).unwrap_or(Value::Array(Vec::new()));
        explain_skips(
            &mut run.steps,
            def,
            &protocol::template::context(&trigger, &trace),
        );
    }
    run.trigger_context = Some(trigger);
    run.channel = Some(r.text("channel")?);
    run.trace_id = Some(protocol::trace::run_trace_id(community, run_id));
    run.rerun_by = crate::workflow::rerun::rerun_by(tx, community, &run.workflow_id, run_id).await?;
    let waiting = run
        .steps
        .iter_mut()
        .find(|s| s.status == StepStatus::Waiting && s.action == Action::RequestApproval.as_str());
    if let Some(step) = waiting {
        step.approval = crate::workflow::approvals::waiting(tx, community, run_id, &step.id).await?;
    }
    for (view, step) in run.steps.iter_mut().zip(def.iter().flat_map(|d| d.steps.iter())) {
        if let Step::CallWebhook(hook) = step {
            // A step a rerun kept was called by the run it ran in.
            let caller = view.kept_from.clone().unwrap_or_else(|| run_id.to_string());
            view.call =
                crate::workflow::outcalls::view(tx, community, &caller, &view.id, hook.method).await?;
        }
    }
    Ok(Some(run))
}
