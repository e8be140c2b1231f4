//! What every step of a run shares: the run as loaded, the step's
//! context (`StepCtx`), what a step kind does (`RunStep`, one file per
//! kind beside this one), what a step decides for the run (`Next`), its
//! failure, its trace entry and what one execution produced.

use nostr::prelude::{Event, Keys, PublicKey};
use protocol::api::{CauseKind, RunError, RunStatus, StepStatus};
use protocol::condition::{Condition, ConditionError, StepShape};
use protocol::template::{self};
use protocol::workflow::{Action, Cause, Definition, OnFailure, Step, StepKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::{DeliveryConfig, Limits};
use crate::persistence::db::{named, Tx, Q};
use crate::persistence::StoreError;
use crate::spans::RunSpan;
use crate::workflow::outcalls::OutCall;

/// A delivery row made by a step, for its wake hint.
#[derive(Debug, Clone)]
pub struct NewDelivery {
    pub id: String,
    pub target: PublicKey,
    pub channel: String,
    pub definition_event_id: String,
    pub run_id: String,
    pub step_id: String,
    pub message_event_id: String,
}

/// What one step execution leaves for after its commit.
#[derive(Debug, Default)]
pub struct StepOutcome {
    /// Events stored by this execution: announce each.
    pub published: Vec<(Event, String)>,
    /// Delivery rows made by this execution: wake each.
    pub new_deliveries: Vec<NewDelivery>,
    /// Work recorded by this execution to be done outside any transaction.
    pub errands: Vec<Errand>,
    /// Whether the run has a step to execute now.
    pub more: bool,
    /// Spans of the run's trace that this execution ended (a step, the
    /// run): emitted after commit.
    pub spans: Vec<RunSpan>,
}

/// Work a step recorded, done by the engine after commit outside any
/// transaction. Each records its own result and wakes the run (a row of
/// `workflow_run_wakes`), which then resumes the step from what was
/// recorded; an errand lost with its process is found by its step's
/// deadline.
#[derive(Debug)]
pub enum Errand {
    /// Send an outbound HTTP call (`call_webhook`).
    Call(OutCall),
}

/// What the run interpreter (`runs`) asks of a step kind: each kind's file
/// implements it for the kind's definition in `protocol::workflow`.
pub(crate) trait RunStep: StepKind {
    /// The step begins (its condition held), in the run's transaction: it
    /// ends, fails, or begins waiting.
    async fn start(
        &self,
        tx: &mut Tx<'_>,
        c: &StepCtx<'_>,
        out: &mut StepOutcome,
    ) -> Result<Next, StoreError>;

    /// The waiting step is looked at again: its `wake_at` passed, or a wake
    /// came (a delivery, a decision or an errand ended).
    async fn resume(
        &self,
        tx: &mut Tx<'_>,
        c: &StepCtx<'_>,
        out: &mut StepOutcome,
    ) -> Result<Next, StoreError> {
        let _ = (tx, c, out);
        Err(StoreError::Corrupt(format!(
            "a {} step does not wait",
            c.step().action().as_str()
        )))
    }
}

/// What executing a step needs besides the run.
#[derive(Debug, Clone, Copy)]
pub struct Env<'a> {
    pub deliveries: &'a DeliveryConfig,
    pub limits: &'a Limits,
    /// How long past its own timeout a webhook call may stay unanswered
    /// before it counts as interrupted (its process died mid-call).
    pub call_grace_secs: u64,
}

/// One finished step in a run's trace (the stored JSON; templates and
/// conditions read `step` and `output`, agents too, from a delivery's
/// snapshot). Entries written before steps had a status read as done.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TraceEntry {
    pub step: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    #[serde(default = "done")]
    pub status: StepStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    #[serde(default)]
    pub output: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
    /// An entry a rerun copied from its origin: the run the step ran in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_from: Option<String>,
}

fn done() -> StepStatus {
    StepStatus::Done
}

pub(crate) struct RunRow {
    pub(crate) workflow_id: String,
    pub(crate) definition_event_id: [u8; 32],
    pub(crate) channel: String,
    pub(crate) owner: PublicKey,
    pub(crate) cause: Cause,
    pub(crate) status: RunStatus,
    pub(crate) current_step: i64,
    pub(crate) trigger_context: Value,
    pub(crate) trace: Vec<TraceEntry>,
    pub(crate) step_started_at: Option<i64>,
    pub(crate) wake_at: Option<i64>,
    pub(crate) created_at: i64,
}

impl RunRow {
    pub(crate) fn trace_json(&self) -> Value {
        serde_json::to_value(&self.trace).unwrap_or(Value::Array(Vec::new()))
    }

    /// What triggered the workflow: the run's own cause, or for a rerun
    /// its origin's (kept in the trigger context), so that a rerun's
    /// messages carry the tags and thread of the run it reruns.
    pub(crate) fn trigger_cause(&self) -> Cause {
        if self.cause.kind != CauseKind::Rerun {
            return self.cause.clone();
        }
        serde_json::from_value(self.trigger_context["cause"].clone()).unwrap_or_else(|_| self.cause.clone())
    }

    /// The context templates and conditions see.
    pub(crate) fn context(&self) -> Value {
        template::context(&self.trigger_context, &self.trace_json())
    }
}

pub(crate) fn json_of<T: for<'de> Deserialize<'de>>(s: &str) -> Result<T, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt(format!("run json: {e}")))
}

pub(crate) async fn load_run(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
) -> Result<Option<RunRow>, StoreError> {
    let row = tx
        .one(
            Q::new(
                "SELECT workflow_id, definition_event_id, channel, owner, cause_type, cause_id, status, \
                 current_step, trigger_context, trace, step_started_at, wake_at, created_at \
                 FROM workflow_runs WHERE community_id = $1 AND id = $2",
            )
            .bind(community)
            .bind(run_id),
        )
        .await?;
    let Some(r) = row else { return Ok(None) };
    Ok(Some(RunRow {
        workflow_id: r.text("workflow_id")?,
        definition_event_id: r.id32("definition_event_id")?,
        channel: r.text("channel")?,
        owner: PublicKey::from_slice(&r.blob("owner")?).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        cause: Cause {
            kind: named(&r.text("cause_type")?, CauseKind::parse)?,
            id: r.text("cause_id")?,
        },
        status: named(&r.text("status")?, RunStatus::parse)?,
        current_step: r.int("current_step")?,
        trigger_context: json_of(&r.text("trigger_context")?)?,
        trace: json_of(&r.text("trace")?)?,
        step_started_at: r.opt_int("step_started_at")?,
        wake_at: r.opt_int("wake_at")?,
        created_at: r.int("created_at")?,
    }))
}

/// Why a step or a run did not succeed: a stable code and a text.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) code: String,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: impl Into<String>, message: impl Into<String>) -> Failure {
        Failure {
            code: code.into(),
            message: message.into(),
        }
    }

    pub(crate) fn at(&self, step: Option<&str>) -> RunError {
        RunError {
            code: self.code.clone(),
            message: self.message.clone(),
            step: step.map(str::to_string),
        }
    }
}

/// Ends a run other than by its steps (cancelled, its definition gone).
pub(crate) async fn end_run(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    status: RunStatus,
    error: Option<Failure>,
) -> Result<(), StoreError> {
    let now = tx.now().await?;
    let (code, message) = error.map_or((None, None), |f| (Some(f.code), Some(f.message)));
    tx.exec(
        Q::new(
            "UPDATE workflow_runs SET status = $3, error = $4, error_code = $5, wake_at = NULL, updated_at = $6 \
             WHERE community_id = $1 AND id = $2",
        )
        .bind(community)
        .bind(run_id)
        .bind(status.as_str())
        .bind(message)
        .bind(code)
        .bind(now),
    )
    .await?;
    Ok(())
}

/// What a step execution decided for the run.
pub(crate) enum Next {
    /// The step began waiting, until `wake_at` at most.
    Wait { wake_at: i64 },
    /// The step still waits (a wake came before it is over): its
    /// `wake_at`, set when it began waiting, stands.
    StillWaiting,
    /// The step still waits, until a new `wake_at` (a webhook call sent
    /// again after an interruption).
    Rewait { wake_at: i64 },
    /// The step ended (done, skipped, or failed with `continue`): on to
    /// the next one.
    Advance(TraceEntry),
    /// The step failed and so does the run.
    Fail(TraceEntry, Failure),
}

/// What every step execution needs.
pub(crate) struct StepCtx<'a> {
    pub(crate) community: &'a str,
    pub(crate) keys: &'a Keys,
    pub(crate) run_id: &'a str,
    pub(crate) run: &'a RunRow,
    pub(crate) def: &'a Definition,
    pub(crate) index: usize,
    pub(crate) now: i64,
    pub(crate) env: &'a Env<'a>,
}

impl StepCtx<'_> {
    pub(crate) fn step(&self) -> &Step {
        &self.def.steps[self.index]
    }

    /// The spans a step's end closes: the step's, and the run's when it
    /// was the run's last (`ended`: the run's status then, if it ended).
    pub(crate) fn ended_spans(&self, entry: &TraceEntry, ended: Option<RunStatus>) -> Vec<RunSpan> {
        let step = self.step_span();
        let run =
            protocol::trace::TraceParent::of_run(&step.trace_hex()).expect("a derived trace id is valid");
        let failed = |e: &Option<RunError>| e.as_ref().map(|e| e.code.clone());
        let start = entry.started_at.unwrap_or(self.now);
        let mut step_span = RunSpan::new(format!("step {}", entry.step), step, Some(run), start, self.now)
            .with("workflow.id", self.run.workflow_id.clone())
            .with("workflow.run_id", self.run_id)
            .with("workflow.step.status", entry.status.as_str());
        if let Some(action) = entry.action {
            step_span = step_span.with("workflow.step.action", action.as_str());
        }
        step_span.error = failed(&entry.error);
        let mut spans = vec![step_span];
        if let Some(status) = ended {
            let mut run_span = RunSpan::new(
                format!("run {}", self.run.workflow_id),
                run,
                None,
                self.run.created_at,
                self.now,
            )
            .with("workflow.id", self.run.workflow_id.clone())
            .with("workflow.run_id", self.run_id)
            .with("workflow.run.status", status.as_str());
            if status != RunStatus::Completed {
                run_span.error = failed(&entry.error).or_else(|| Some(status.as_str().to_string()));
            }
            spans.push(run_span);
        }
        spans
    }

    /// The current step's span in the run's trace (`protocol::trace`).
    pub(crate) fn step_span(&self) -> protocol::trace::TraceParent {
        let trace = protocol::trace::run_trace_id(self.community, self.run_id);
        protocol::trace::step_span(&trace, self.step().id()).expect("a derived trace id is valid")
    }

    /// A trace entry for the current step ending now.
    pub(crate) fn entry(&self, status: StepStatus, output: Value, error: Option<&Failure>) -> TraceEntry {
        let started = if self.run.status == RunStatus::Waiting {
            self.run.step_started_at
        } else {
            Some(self.now)
        };
        TraceEntry {
            step: self.step().id().to_string(),
            action: Some(self.step().action()),
            status,
            started_at: started,
            finished_at: Some(self.now),
            output,
            error: error.map(|f| f.at(None)),
            kept_from: None,
        }
    }

    /// The step ended done with its kind's output: on to the next step.
    pub(crate) fn done<K: StepKind>(&self, _kind: &K, output: &K::Output) -> Next {
        Next::Advance(self.entry(StepStatus::Done, output_json(output), None))
    }

    /// The step failed (with its kind's output, when it has one): the run
    /// fails with it, or goes on (`continue`).
    pub(crate) fn failed<K: StepKind>(
        &self,
        _kind: &K,
        output: Option<&K::Output>,
        why: Failure,
        on_failure: OnFailure,
    ) -> Next {
        self.failed_with(output.map_or(Value::Null, output_json), why, on_failure)
    }

    /// As [`StepCtx::failed`], with an output of any shape.
    pub(crate) fn failed_with(&self, output: Value, why: Failure, on_failure: OnFailure) -> Next {
        let entry = self.entry(StepStatus::Failed, output, Some(&why));
        match on_failure {
            OnFailure::Fail => Next::Fail(entry, why),
            OnFailure::Continue => Next::Advance(entry),
        }
    }
}

/// A step's output as the trace stores it.
fn output_json<O: Serialize>(output: &O) -> Value {
    serde_json::to_value(output).unwrap_or(Value::Null)
}

/// Whether the step's condition holds (true without one). Checked at
/// publish; an error here is the evaluator's (`condition_error`).
pub(crate) fn condition_holds(c: &StepCtx<'_>) -> Result<bool, Failure> {
    let Some((_, compiled)) = compiled_condition(c.def, c.index) else {
        return Ok(true);
    };
    let cond = compiled.map_err(|e| Failure::new("condition_error", e.to_string()))?;
    cond.eval(&c.run.context())
        .map_err(|e| Failure::new("condition_error", e))
}

/// Step `index`'s condition (its source) compiled against the steps
/// before it, the only ones it may read; `None` when it has none.
pub(crate) fn compiled_condition(
    def: &Definition,
    index: usize,
) -> Option<(&str, Result<Condition, ConditionError>)> {
    let src = def.steps.get(index)?.condition()?;
    let earlier: Vec<StepShape<'_>> = def.steps[..index].iter().map(Step::shape).collect();
    Some((src, Condition::compile(src, &earlier)))
}

/// The run's trace with `entry` added, as stored.
pub(crate) fn with_entry(run: &RunRow, entry: TraceEntry) -> String {
    let mut trace = run.trace.clone();
    trace.push(entry);
    serde_json::to_string(&trace).unwrap_or_else(|_| "[]".into())
}
