//! The `call_webhook` step: the call recorded before it is sent (attempt,
//! deadline), its answer taken only for the attempt in flight, and what
//! the answer does to the run.

use protocol::api::StepStatus;
use protocol::workflow::{self, OnFailure, Step};
use serde_json::{json, Value};

use super::step::{Failure, Next, StepCtx, StepOutcome};
use crate::faults;
use crate::persistence::db::Tx;
use crate::persistence::StoreError;
use crate::workflow::outcalls;
use crate::workflow::outcalls::{CallAnswer, CallResult, OutCall};

/// Renders a `call_webhook` step's body and records the call's first
/// attempt (sent by the engine after commit): the run waits for the answer
/// until the call's timeout and grace have passed.
pub(crate) async fn start_call(
    tx: &mut Tx<'_>,
    c: &StepCtx<'_>,
    out: &mut StepOutcome,
) -> Result<Next, StoreError> {
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

/// A waiting `call_webhook` step: takes the answer to the attempt in
/// flight; or, past the call's deadline with none (its process died), sends
/// it again when the step says `retry`, else fails the run `interrupted`.
pub(crate) async fn resume_call(
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
