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

use nostr::prelude::{Event, EventBuilder, Keys, Kind, PublicKey, Tag, Timestamp};
use protocol::api::{
    CauseKind, CauseView, DeliveryStatus, RunError, RunStatus, RunView, StepStatus, StepView,
};
use protocol::approval::{self, Decision};
use protocol::condition::{Condition, StepShape};
use protocol::template::{self, Template};
use protocol::workflow::{self, Action, Cause, Definition, MessageBinding, OnFailure, Step, Wait};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::workflow::approvals;
use crate::persistence::db::{named, Pool, Row, Tx, Q};
use crate::events::rules as events;
use crate::events::rules::{created_at_of};
use crate::workflow::outcalls;
use crate::workflow::outcalls::{CallAnswer, CallResult, OutCall};
use crate::refusal::{Answer, Refusal};
use crate::workflow::definitions::{load_definition, load_workflow, new_id, ACTIVE_ROWS};
use crate::events::InsertOutcome;
use crate::persistence::StoreError;
use crate::admission;
use crate::config::{DeliveryConfig, Limits};
use crate::faults;

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

/// What one step execution produced.
#[derive(Debug, Default)]
pub struct StepOutcome {
    /// Events to announce after commit (the message when newly made).
    pub published: Vec<(Event, String)>,
    /// Delivery rows made by this execution (wake each).
    pub new_deliveries: Vec<NewDelivery>,
    /// Webhook calls recorded by this execution: send each after commit.
    pub calls: Vec<OutCall>,
    /// Whether the run has a step to execute now.
    pub more: bool,
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

/// Delivery rows in one insert, at most (20 binds a row: within both
/// backends' bind limits).
const MAX_ROWS_PER_INSERT: usize = 500;

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
}

fn done() -> StepStatus {
    StepStatus::Done
}

struct RunRow {
    workflow_id: String,
    definition_event_id: [u8; 32],
    channel: String,
    owner: PublicKey,
    cause: Cause,
    status: RunStatus,
    current_step: i64,
    trigger_context: Value,
    trace: Vec<TraceEntry>,
    step_started_at: Option<i64>,
    wake_at: Option<i64>,
}

impl RunRow {
    fn trace_json(&self) -> Value {
        serde_json::to_value(&self.trace).unwrap_or(Value::Array(Vec::new()))
    }

    /// The context templates and conditions see.
    fn context(&self) -> Value {
        template::context(&self.trigger_context, &self.trace_json())
    }
}

fn json_of<T: for<'de> Deserialize<'de>>(s: &str) -> Result<T, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt(format!("run json: {e}")))
}

async fn load_run(tx: &mut Tx<'_>, community: &str, run_id: &str) -> Result<Option<RunRow>, StoreError> {
    let row = tx
        .one(
            Q::new(
                "SELECT workflow_id, definition_event_id, channel, owner, cause_type, cause_id, status, \
                 current_step, trigger_context, trace, step_started_at, wake_at \
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
    }))
}

/// Why a step or a run did not succeed: a stable code and a text.
#[derive(Debug, Clone)]
struct Failure {
    code: String,
    message: String,
}

impl Failure {
    fn new(code: impl Into<String>, message: impl Into<String>) -> Failure {
        Failure {
            code: code.into(),
            message: message.into(),
        }
    }

    fn at(&self, step: Option<&str>) -> RunError {
        RunError {
            code: self.code.clone(),
            message: self.message.clone(),
            step: step.map(str::to_string),
        }
    }
}

/// Ends a run other than by its steps (cancelled, its definition gone).
async fn end_run(
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

/// What a step's message is bound to.
struct Binding<'a> {
    run: &'a RunRow,
    run_id: &'a str,
    step_id: &'a str,
    definition_hex: &'a str,
    reply_in_thread: bool,
    /// Its `p` tags (the owner first).
    recipients: Vec<PublicKey>,
    /// Tags after the workflow message's own (an approval request's mark).
    extra_tags: Vec<Tag>,
}

/// Renders and signs a step's message, under the same admission rule as
/// every event a client sends (the relay's own events obey the limits it
/// sets for others): `Err` is why the run fails, `message_too_large` when
/// the rendered text (rendering stops at `max_event_bytes`) or the signed
/// event is over `max_event_bytes`.
fn sign_message(
    keys: &Keys,
    b: &Binding<'_>,
    template: &Template,
    now: i64,
    limits: &Limits,
) -> Result<Result<(Event, String), Failure>, StoreError> {
    let too_large = |bytes: String| {
        Failure::new(
            "message_too_large",
            format!(
                "the message would be {bytes} bytes; max_event_bytes is {}",
                limits.max_event_bytes
            ),
        )
    };
    let rendered = match template.render_bounded(&b.run.context(), limits.max_event_bytes) {
        Ok(text) => text,
        Err(e) => return Ok(Err(too_large(format!("at least {}", e.at_least)))),
    };
    let reply_to =
        (b.reply_in_thread && b.run.cause.kind == CauseKind::Event).then_some(b.run.cause.id.as_str());
    let tags = workflow::message_tags(&MessageBinding {
        channel: &b.run.channel,
        definition_event_id: b.definition_hex,
        step_id: b.step_id,
        run_id: b.run_id,
        owner: &b.run.owner,
        cause: &b.run.cause,
        recipients: &b.recipients,
        reply_to,
    });
    let tags = tags.into_iter().chain(b.extra_tags.iter().cloned());
    sign_admitted(keys, rendered, tags, now, limits, too_large)
}

/// Signs a relay kind 9 and holds it to the admission rule every client's
/// event meets.
fn sign_admitted(
    keys: &Keys,
    text: String,
    tags: impl IntoIterator<Item = Tag>,
    now: i64,
    limits: &Limits,
    too_large: impl Fn(String) -> Failure,
) -> Result<Result<(Event, String), Failure>, StoreError> {
    let ev = protocol::sign::sign(
        EventBuilder::new(Kind::from_u16(workflow::MESSAGE_KIND), text)
            .tags(tags)
            .custom_created_at(Timestamp::from_secs(u64::try_from(now).unwrap_or(0))),
        keys,
    );
    let raw = serde_json::to_string(&ev).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let rules = admission::Rules {
        limits,
        community_key: &keys.public_key(),
        now: u64::try_from(now).unwrap_or(0),
        bans: None,
    };
    Ok(match admission::check(&ev, raw.len(), &rules) {
        Ok(()) => Ok((ev, raw)),
        Err(admission::Refusal::TooLarge { bytes, .. }) => Err(too_large(bytes.to_string())),
        Err(r) => Err(Failure::new("message_refused", r.to_string())),
    })
}

/// What a step execution decided for the run.
enum Next {
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
struct StepCtx<'a> {
    community: &'a str,
    keys: &'a Keys,
    run_id: &'a str,
    run: &'a RunRow,
    def: &'a Definition,
    index: usize,
    now: i64,
    env: &'a Env<'a>,
}

impl StepCtx<'_> {
    fn step(&self) -> &Step {
        &self.def.steps[self.index]
    }

    /// A trace entry for the current step ending now.
    fn entry(&self, status: StepStatus, output: Value, error: Option<&Failure>) -> TraceEntry {
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
        }
    }

    /// The step failed: the run fails with it, or goes on (`continue`).
    fn failed(&self, output: Value, why: Failure, on_failure: OnFailure) -> Next {
        let entry = self.entry(StepStatus::Failed, output, Some(&why));
        match on_failure {
            OnFailure::Fail => Next::Fail(entry, why),
            OnFailure::Continue => Next::Advance(entry),
        }
    }
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

/// An approval step's timeout in seconds (its default when unset).
fn approval_timeout(timeout_secs: Option<u64>) -> i64 {
    i64::try_from(timeout_secs.unwrap_or(workflow::DEFAULT_APPROVAL_TIMEOUT_SECS)).unwrap_or(i64::MAX)
}

/// Renders a `call_webhook` step's body and records the call's first
/// attempt (sent by the engine after commit): the run waits for the answer
/// until the call's timeout and grace have passed.
async fn start_call(tx: &mut Tx<'_>, c: &StepCtx<'_>, out: &mut StepOutcome) -> Result<Next, StoreError> {
    let Step::CallWebhook { url, body, .. } = c.step() else {
        return Err(StoreError::Corrupt("start_call on another action".into()));
    };
    let body = match protocol::webhook::render_body(body.as_ref(), &c.run.context()) {
        Ok(body) => body,
        Err(e) => {
            return Ok(c.failed(
                Value::Null,
                Failure::new("body_invalid", e.to_string()),
                OnFailure::Fail,
            ))
        }
    };
    Ok(match send_call(tx, c, out, 1, url, &body).await? {
        Ok(deadline) => Next::Wait { wake_at: deadline },
        Err(why) => c.failed(Value::Null, why, OnFailure::Fail),
    })
}

/// Records attempt `attempt` of the step's call (until its deadline, which
/// it returns) and hands it to the engine with the sealed secret it signs
/// with; `Err` when that secret is not set.
async fn send_call(
    tx: &mut Tx<'_>,
    c: &StepCtx<'_>,
    out: &mut StepOutcome,
    attempt: i64,
    url: &str,
    body: &str,
) -> Result<Result<i64, Failure>, StoreError> {
    let Step::CallWebhook {
        method,
        secret,
        timeout_secs,
        ..
    } = c.step()
    else {
        return Err(StoreError::Corrupt("send_call on another action".into()));
    };
    let sealed = match secret {
        Some(name) => match outcalls::secret(tx, c.community, &c.run.workflow_id, name).await? {
            Some(sealed) => Some(sealed),
            None => {
                let why = format!("the workflow has no secret named {name}");
                return Ok(Err(Failure::new("secret_missing", why)));
            }
        },
        None => None,
    };
    let timeout = timeout_secs.unwrap_or(workflow::DEFAULT_WEBHOOK_TIMEOUT_SECS);
    let wait = i64::try_from(timeout.saturating_add(c.env.call_grace_secs)).unwrap_or(i64::MAX);
    let deadline = c.now.saturating_add(wait);
    let step_id = c.step().id();
    let times = (c.now, deadline);
    outcalls::record(tx, c.community, c.run_id, step_id, attempt, url, body, times).await?;
    out.calls.push(OutCall {
        workflow_id: c.run.workflow_id.clone(),
        owner: c.run.owner.to_hex(),
        run_id: c.run_id.to_string(),
        step_id: step_id.to_string(),
        attempt,
        url: url.to_string(),
        method: *method,
        body: body.to_string(),
        idempotency_key: protocol::webhook::idempotency_key(c.run_id, step_id),
        secret: sealed,
        timeout_secs: timeout,
    });
    faults::check("webhook:after_record")?;
    Ok(Ok(deadline))
}

/// An `ask_agent` step's timeout in seconds (its default when unset).
fn ask_timeout(timeout_secs: Option<u64>) -> i64 {
    i64::try_from(timeout_secs.unwrap_or(workflow::DEFAULT_ASK_TIMEOUT_SECS)).unwrap_or(i64::MAX)
}

/// Whether the step's condition holds (true without one). Checked at
/// publish; an error here is the evaluator's (`condition_error`).
fn condition_holds(c: &StepCtx<'_>) -> Result<bool, Failure> {
    let Some(src) = c.step().condition() else {
        return Ok(true);
    };
    let earlier: Vec<StepShape<'_>> = c.def.steps[..c.index].iter().map(Step::shape).collect();
    let cond =
        Condition::compile(src, &earlier).map_err(|e| Failure::new("condition_error", e.to_string()))?;
    cond.eval(&c.run.context())
        .map_err(|e| Failure::new("condition_error", e))
}

/// Which delivery rows a step's message makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rows {
    /// None (an approval request is for people).
    None,
    /// One per managed-agent recipient.
    Plain,
    /// As `Plain`, and each wakes the run when it ends.
    Awaited,
}

/// The `p` recipients and extra tags of the current step's message: an
/// approval request names the owner and its approvers and carries the
/// request mark; other messages name the owner and the template's mentions.
fn addressees(c: &StepCtx<'_>, template: &Template) -> (Vec<PublicKey>, Vec<Tag>, bool) {
    match c.step() {
        Step::RequestApproval { approvers, .. } => {
            let mut to = vec![c.run.owner];
            for pk in approvers.iter().filter_map(|a| PublicKey::from_hex(a).ok()) {
                if !to.contains(&pk) {
                    to.push(pk);
                }
            }
            (to, vec![approval::request_tag()], false)
        }
        step => (
            workflow::recipients(&c.run.owner, template),
            Vec::new(),
            step.message().is_some_and(|(_, in_thread)| in_thread),
        ),
    }
}

/// Posts the step's message (once: a replay reuses it) and its delivery
/// rows, as `rows` says.
async fn post(
    tx: &mut Tx<'_>,
    c: &StepCtx<'_>,
    out: &mut StepOutcome,
    rows: Rows,
) -> Result<Result<Event, Failure>, StoreError> {
    let text = c.step().text().expect("a step that posts has a text");
    let Ok(template) = Template::parse(text) else {
        return Ok(Err(Failure::new(
            "template_invalid",
            "step template no longer parses",
        )));
    };
    let (recipients, extra_tags, reply_in_thread) = addressees(c, &template);
    let binding = Binding {
        run: c.run,
        run_id: c.run_id,
        step_id: c.step().id(),
        definition_hex: &hex::encode(c.run.definition_event_id),
        reply_in_thread,
        recipients,
        extra_tags,
    };
    let limits = c.env.limits;
    let message = match step_message(tx, c.community, c.keys, &binding, &template, c.now, limits).await? {
        Made::Found(message) => message,
        Made::New(message, raw) => {
            out.published.push((message.clone(), raw));
            message
        }
        Made::Refused(why) => return Ok(Err(why)),
    };
    if rows != Rows::None {
        let awaited = rows == Rows::Awaited;
        let cfg = c.env.deliveries;
        out.new_deliveries =
            insert_deliveries(tx, c.community, &binding, &message, cfg, c.now, awaited).await?;
        faults::check("step:after_rows")?;
    }
    Ok(Ok(message))
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

/// A waiting approval step: ends with its decision, or `timed_out` once
/// its deadline passed with none (unless an approver decided first); the
/// relay posts the decision threaded under the request.
async fn resume_approval(
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

/// A waiting `call_webhook` step: takes the answer to the attempt in
/// flight; or, past the call's deadline with none (its process died), sends
/// it again when the step says `retry`, else fails the run `interrupted`.
async fn resume_call(
    tx: &mut Tx<'_>,
    c: &StepCtx<'_>,
    answer: Option<&CallAnswer>,
    out: &mut StepOutcome,
) -> Result<Next, StoreError> {
    let Step::CallWebhook { retry, .. } = c.step() else {
        return Err(StoreError::Corrupt("resume_call on another action".into()));
    };
    let step_id = c.step().id();
    let Some(r) = outcalls::load(tx, c.community, c.run_id, step_id).await? else {
        return Err(StoreError::Corrupt(
            "a waiting call_webhook step has no call".into(),
        ));
    };
    let in_flight = r.state == "sending";
    if let Some(a) = answer {
        // An answer to an attempt no longer in flight changes nothing.
        if !in_flight || a.step_id != step_id || a.attempt != r.attempt {
            return Ok(Next::StillWaiting);
        }
        outcalls::end(tx, c.community, c.run_id, step_id, Some(&a.result), c.now).await?;
        return Ok(call_ended(c, &a.result));
    }
    if !in_flight || c.now < r.deadline {
        return Ok(Next::StillWaiting);
    }
    faults::check("webhook:before_interrupted")?;
    if *retry {
        return Ok(
            match send_call(tx, c, out, r.attempt + 1, &r.url, &r.body).await? {
                Ok(deadline) => Next::Rewait { wake_at: deadline },
                Err(why) => c.failed(Value::Null, why, OnFailure::Fail),
            },
        );
    }
    outcalls::end(tx, c.community, c.run_id, step_id, None, c.now).await?;
    let why = Failure::new(
        "interrupted",
        "the relay stopped while the call was in flight; it may or may not have been received, and the step does not retry",
    );
    Ok(c.failed(Value::Null, why, OnFailure::Fail))
}

/// What a call's result does to the run: a 2xx answer is the step's
/// output; any other status fails the run `http_<status>`, and no answer
/// fails it with the reason's code.
fn call_ended(c: &StepCtx<'_>, result: &CallResult) -> Next {
    match result {
        CallResult::Answered { status, body } => {
            let output = json!({"status": status, "body": body});
            if (200..300).contains(status) {
                Next::Advance(c.entry(StepStatus::Done, output, None))
            } else {
                let why = Failure::new(format!("http_{status}"), format!("the server answered {status}"));
                c.failed(output, why, OnFailure::Fail)
            }
        }
        CallResult::Failed { code, message } => c.failed(
            Value::Null,
            Failure::new(code.clone(), message.clone()),
            OnFailure::Fail,
        ),
    }
}

/// How an `ask_agent` step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AskStatus {
    Delivered,
    Failed,
    TimedOut,
}

impl AskStatus {
    fn as_str(self) -> &'static str {
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
fn decide(wait: Wait, rows: &[DeliveryStatus], past_deadline: bool) -> Option<AskStatus> {
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
struct StepRow {
    id: String,
    target: [u8; 32],
    status: DeliveryStatus,
    failure_code: Option<String>,
    /// The step's message (the same for every row of the step).
    message_event_id: [u8; 32],
    reply: Option<Event>,
}

/// The current step's delivery rows in the order they ended (then by id),
/// with their replies.
async fn step_rows(tx: &mut Tx<'_>, c: &StepCtx<'_>) -> Result<Vec<StepRow>, StoreError> {
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
async fn cancel_open_rows(tx: &mut Tx<'_>, c: &StepCtx<'_>, code: &str) -> Result<(), StoreError> {
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
fn ask_output(message_id: &str, status: AskStatus, rows: &[StepRow]) -> Value {
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

/// The run's trace with `entry` added, as stored.
fn with_entry(run: &RunRow, entry: TraceEntry) -> String {
    let mut trace = run.trace.clone();
    trace.push(entry);
    serde_json::to_string(&trace).unwrap_or_else(|_| "[]".into())
}

/// A step's message: found (a replay), new (to announce), or refused
/// (the step fails with that error).
enum Made {
    Found(Event),
    New(Event, String),
    Refused(Failure),
}

/// The step's message: the one stored by an earlier execution, else
/// rendered, signed and stored now, with its record.
async fn step_message(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    b: &Binding<'_>,
    template: &Template,
    now: i64,
    limits: &Limits,
) -> Result<Made, StoreError> {
    let existing = tx
        .one(
            Q::new(
                "SELECT e.raw FROM workflow_step_messages m JOIN events e \
                 ON e.community_id = m.community_id AND e.id = m.event_id \
                 WHERE m.community_id = $1 AND m.run_id = $2 AND m.step_id = $3",
            )
            .bind(community)
            .bind(b.run_id)
            .bind(b.step_id),
        )
        .await?;
    if let Some(row) = existing {
        return Ok(Made::Found(json_of(&row.text(0)?)?));
    }
    let (ev, raw) = match sign_message(keys, b, template, now, limits)? {
        Ok(signed) => signed,
        Err(why) => return Ok(Made::Refused(why)),
    };
    match events::insert(tx, community, &ev, &raw, Some(&b.run.channel))
        .await?
        .of_no_deletion()
    {
        InsertOutcome::Stored | InsertOutcome::Duplicate => {}
        InsertOutcome::Rejected(why) => {
            return Err(StoreError::Corrupt(format!("workflow message refused: {why}")))
        }
    }
    tx.exec(
        Q::new(
            "INSERT INTO workflow_step_messages (community_id, run_id, step_id, event_id, event_created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(community)
        .bind(b.run_id)
        .bind(b.step_id)
        .bind(ev.id.to_bytes())
        .bind(now),
    )
    .await?;
    faults::check("step:after_event")?;
    Ok(Made::New(ev, raw))
}

/// The message's `p` recipients, each once, in order.
fn recipients_of(message: &Event) -> Vec<PublicKey> {
    let mut targets: Vec<PublicKey> = Vec::new();
    for p in workflow::tag_values(message, "p") {
        if let Ok(t) = PublicKey::from_hex(p) {
            if !targets.contains(&t) {
                targets.push(t);
            }
        }
    }
    targets
}

/// One delivery row per recipient that is a managed agent and a member:
/// per chunk, one query for who qualifies and one multi-row insert (a
/// replay inserts nothing new: the rows are unique on run, step and
/// target). Returns the rows made now (to wake).
async fn insert_deliveries(
    tx: &mut Tx<'_>,
    community: &str,
    b: &Binding<'_>,
    message: &Event,
    cfg: &DeliveryConfig,
    now: i64,
    awaited: bool,
) -> Result<Vec<NewDelivery>, StoreError> {
    let mut made = Vec::new();
    for chunk in recipients_of(message).chunks(MAX_ROWS_PER_INSERT) {
        let eligible = eligible_agents(tx, community, &b.run.channel, chunk).await?;
        let rows: Vec<(&PublicKey, String)> = chunk
            .iter()
            .filter(|t| eligible.contains(&t.to_bytes()))
            .map(|t| (t, new_id()))
            .collect();
        if rows.is_empty() {
            continue;
        }
        let inserted = insert_rows(tx, community, b, message, &rows, cfg, now, awaited).await?;
        for (target, id) in rows {
            if inserted.contains(&target.to_bytes()) {
                made.push(NewDelivery {
                    id,
                    target: *target,
                    channel: b.run.channel.clone(),
                    definition_event_id: b.definition_hex.to_string(),
                    run_id: b.run_id.to_string(),
                    step_id: b.step_id.to_string(),
                    message_event_id: message.id.to_hex(),
                });
            }
        }
    }
    Ok(made)
}

/// Of `candidates`, the registered agents that are members of `channel`.
async fn eligible_agents(
    tx: &mut Tx<'_>,
    community: &str,
    channel: &str,
    candidates: &[PublicKey],
) -> Result<Vec<[u8; 32]>, StoreError> {
    let d = tx.dialect();
    let mut q = Q::new(
        "SELECT a.pubkey FROM agents a JOIN channel_members m ON m.community_id = a.community_id \
         AND m.pubkey = a.pubkey WHERE a.community_id = ",
    )
    .arg(d, community);
    q.sql.push_str(" AND m.channel_id = ");
    q = q.arg(d, channel);
    q.sql.push_str(" AND a.pubkey IN ");
    q = q.in_list(d, candidates.iter().map(|t| t.to_bytes()));
    tx.all(q).await?.iter().map(|r| r.id32(0)).collect()
}

/// Inserts `rows` (target, new id) as pending deliveries of the step's
/// message; returns the targets whose row is new.
#[allow(clippy::too_many_arguments)]
async fn insert_rows(
    tx: &mut Tx<'_>,
    community: &str,
    b: &Binding<'_>,
    message: &Event,
    rows: &[(&PublicKey, String)],
    cfg: &DeliveryConfig,
    now: i64,
    awaited: bool,
) -> Result<Vec<[u8; 32]>, StoreError> {
    const COLS: usize = 20;
    let mut q = Q::new(
        "INSERT INTO workflow_agent_deliveries (community_id, id, workflow_id, run_id, step_id, \
         target_pubkey, channel, definition_event_id, message_event_id, message_created_at, status, \
         attempt, max_attempts, next_attempt_at, expires_at, trigger_context, execution_trace, \
         created_at, updated_at, awaited) VALUES ",
    );
    let expires = now.saturating_add(i64::try_from(cfg.lifetime_secs).unwrap_or(i64::MAX));
    let (context, trace) = (b.run.trigger_context.to_string(), b.run.trace_json().to_string());
    let d = tx.dialect();
    for (k, (target, id)) in rows.iter().enumerate() {
        d.push_values_row(&mut q.sql, k, COLS);
        q = q
            .bind(community)
            .bind(id.as_str())
            .bind(b.run.workflow_id.as_str())
            .bind(b.run_id)
            .bind(b.step_id)
            .bind(target.to_bytes())
            .bind(b.run.channel.as_str())
            .bind(b.run.definition_event_id)
            .bind(message.id.to_bytes())
            .bind(created_at_of(message))
            .bind(DeliveryStatus::Pending.as_str())
            .bind(0_i64)
            .bind(i64::from(cfg.max_attempts))
            .bind(now)
            .bind(expires)
            .bind(context.as_str())
            .bind(trace.as_str())
            .bind(now)
            .bind(now)
            .bind(awaited);
    }
    debug_assert_eq!(q.binds.len(), rows.len() * COLS);
    q.sql.push_str(
        " ON CONFLICT (community_id, run_id, step_id, target_pubkey) DO NOTHING RETURNING target_pubkey",
    );
    tx.all(q).await?.iter().map(|r| r.id32(0)).collect()
}

/// A run (`r`) whose workflow is not paused: a paused workflow's runs
/// wait, wherever they are, until it is resumed.
const NOT_PAUSED: &str = "NOT EXISTS (SELECT 1 FROM workflows w WHERE w.community_id = r.community_id \
     AND w.id = r.workflow_id AND w.paused)";

/// Runs with a step to execute now, oldest first: the running ones, the
/// waiting ones whose `wake_at` passed (by the database's clock), then
/// the ones a finish woke.
/// Single statements, so they need no transaction (the engine asks after
/// every trigger; a read transaction around them was two round trips more
/// each time).
pub async fn due_runs(pool: &Pool, community: &str, limit: u32) -> Result<Vec<String>, StoreError> {
    let running = pool
        .all(
            Q::new(format!(
                "SELECT id FROM workflow_runs r WHERE community_id = $1 AND status = 'running' \
                 AND {NOT_PAUSED} ORDER BY created_at, id LIMIT $2"
            ))
            .bind(community)
            .bind(i64::from(limit)),
        )
        .await?;
    let mut ids: Vec<String> = running.iter().map(|r| r.text(0)).collect::<Result<_, _>>()?;
    let room = limit.saturating_sub(u32::try_from(ids.len()).unwrap_or(u32::MAX));
    if room == 0 {
        return Ok(ids);
    }
    let now = pool.dialect().now();
    let waiting = pool
        .all(
            Q::new(format!(
                "SELECT id FROM workflow_runs r WHERE community_id = $1 AND status = 'waiting' \
                 AND wake_at <= {now} AND {NOT_PAUSED} ORDER BY wake_at, id LIMIT $2"
            ))
            .bind(community)
            .bind(i64::from(room)),
        )
        .await?;
    for r in &waiting {
        ids.push(r.text(0)?);
    }
    let room = limit.saturating_sub(u32::try_from(ids.len()).unwrap_or(u32::MAX));
    if room == 0 {
        return Ok(ids);
    }
    let woken = pool
        .all(
            Q::new(format!(
                "SELECT DISTINCT run_id FROM workflow_run_wakes k WHERE community_id = $1 AND NOT EXISTS \
                 (SELECT 1 FROM workflow_runs r WHERE r.community_id = k.community_id AND r.id = k.run_id \
                 AND NOT {NOT_PAUSED}) LIMIT $2"
            ))
            .bind(community)
            .bind(i64::from(room)),
        )
        .await?;
    for r in &woken {
        let id = r.text(0)?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(ids)
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
    let cancelled = tx
        .exec(
            Q::new(format!(
                "UPDATE workflow_agent_deliveries SET status = 'cancelled', failure_code = 'run_cancelled', \
             claim_token = NULL, updated_at = $3 WHERE community_id = $1 AND run_id = $2 AND {ACTIVE_ROWS}"
            ))
            .bind(community)
            .bind(run_id)
            .bind(now),
        )
        .await?;
    crate::telemetry::count_transitions("cancelled", "run_cancelled", cancelled);
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
        Some(s @ Step::AskAgent { timeout_secs, .. }) if s.id() == step_id => ask_timeout(*timeout_secs),
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

/// A page of a workflow's runs, newest first.
pub async fn list_runs(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: Option<&str>,
    before: Option<i64>,
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
        q = q.and(d, "created_at <", b);
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
    })
}

/// Where a run is, for its step views.
struct Current<'a> {
    index: usize,
    run: RunStatus,
    started_at: Option<i64>,
    error: Option<&'a RunError>,
}

/// Every step of the definition: ended ones from the trace, the current
/// one from the run, the rest pending. Without the definition (no longer
/// stored), only the trace.
fn step_views(def: Option<&Definition>, trace: &[TraceEntry], at: &Current<'_>) -> Vec<StepView> {
    let ended = |e: &TraceEntry| StepView {
        id: e.step.clone(),
        action: e.action.map_or("send_message", Action::as_str).to_string(),
        status: e.status,
        started_at: e.started_at,
        finished_at: e.finished_at,
        output: Some(e.output.clone()),
        error: e.error.clone(),
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
            }
        })
        .collect()
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
    let mut run = run_view(&r, &r.text("trace")?, def.as_ref())?;
    run.trigger_context =
        Some(serde_json::from_str::<Value>(&r.text("trigger_context")?).unwrap_or(Value::Null));
    run.channel = Some(r.text("channel")?);
    Ok(Some(run))
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
