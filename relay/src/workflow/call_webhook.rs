//! The `call_webhook` step: the call recorded before it is sent (attempt,
//! deadline) and handed to the engine as an errand; the engine records
//! the answer to the attempt in flight and wakes the run (`outcalls`);
//! the step then ends with what was recorded.

use protocol::workflow::{CallWebhook, OnFailure, WebhookOutput};

use super::step::{Errand, Failure, Next, RunStep, StepCtx, StepOutcome};
use crate::faults;
use crate::persistence::db::Tx;
use crate::persistence::StoreError;
use crate::workflow::outcalls;
use crate::workflow::outcalls::{CallResult, CallState, OutCall};

impl RunStep for CallWebhook {
    /// Renders the body and records the call's first attempt: the run
    /// waits for the answer until the call's timeout and grace have passed.
    async fn start(&self, tx: &mut Tx<'_>, c: &StepCtx<'_>, out: &mut StepOutcome) -> Result<Next, StoreError> {
        let body = match protocol::webhook::render_body(self.body.as_ref(), &c.run.context()) {
            Ok(body) => body,
            Err(e) => {
                let why = Failure::new("body_invalid", e.to_string());
                return Ok(c.failed(self, None, why, OnFailure::Fail));
            }
        };
        Ok(match send_call(self, tx, c, out, 1, &self.url, &body).await? {
            Ok(deadline) => Next::Wait { wake_at: deadline },
            Err(why) => c.failed(self, None, why, OnFailure::Fail),
        })
    }

    /// Ends with the recorded answer; or, past the call's deadline with
    /// none (its process died), sends it again when the step says `retry`,
    /// else fails the run `interrupted`.
    async fn resume(&self, tx: &mut Tx<'_>, c: &StepCtx<'_>, out: &mut StepOutcome) -> Result<Next, StoreError> {
        let Some(r) = outcalls::load(tx, c.community, c.run_id, &self.id).await? else {
            return Err(StoreError::Corrupt("a waiting call_webhook step has no call".into()));
        };
        match r.state {
            CallState::Ended(result) => return Ok(call_ended(self, c, &result)),
            CallState::Interrupted => {
                return Err(StoreError::Corrupt("a waiting call_webhook step's call was interrupted".into()))
            }
            CallState::Sending if c.now < r.deadline => return Ok(Next::StillWaiting),
            CallState::Sending => {}
        }
        faults::check("webhook:before_interrupted")?;
        if self.retry {
            return Ok(
                match send_call(self, tx, c, out, r.attempt + 1, &r.url, &r.body).await? {
                    Ok(deadline) => Next::Rewait { wake_at: deadline },
                    Err(why) => c.failed(self, None, why, OnFailure::Fail),
                },
            );
        }
        outcalls::interrupt(tx, c.community, c.run_id, &self.id, c.now).await?;
        let why = Failure::new(
            "interrupted",
            "the relay stopped while the call was in flight; it may or may not have been received, and the step does not retry",
        );
        Ok(c.failed(self, None, why, OnFailure::Fail))
    }
}

/// Records attempt `attempt` of the step's call (until its deadline, which
/// it returns) and hands it to the engine with the sealed secret it signs
/// with; `Err` when that secret is not set.
async fn send_call(
    step: &CallWebhook,
    tx: &mut Tx<'_>,
    c: &StepCtx<'_>,
    out: &mut StepOutcome,
    attempt: i64,
    url: &str,
    body: &str,
) -> Result<Result<i64, Failure>, StoreError> {
    let sealed = match &step.secret {
        Some(name) => match outcalls::secret(tx, c.community, &c.run.workflow_id, name).await? {
            Some(sealed) => Some(sealed),
            None => {
                let why = format!("the workflow has no secret named {name}");
                return Ok(Err(Failure::new("secret_missing", why)));
            }
        },
        None => None,
    };
    let timeout = step.timeout();
    let wait = i64::try_from(timeout.saturating_add(c.env.call_grace_secs)).unwrap_or(i64::MAX);
    let deadline = c.now.saturating_add(wait);
    let times = (c.now, deadline);
    outcalls::record(tx, c.community, c.run_id, &step.id, attempt, url, body, times).await?;
    out.errands.push(Errand::Call(OutCall {
        workflow_id: c.run.workflow_id.clone(),
        owner: c.run.owner.to_hex(),
        run_id: c.run_id.to_string(),
        step_id: step.id.clone(),
        attempt,
        url: url.to_string(),
        method: step.method,
        body: body.to_string(),
        idempotency_key: protocol::webhook::idempotency_key(c.run_id, &step.id),
        secret: sealed,
        timeout_secs: timeout,
        traceparent: Some(c.step_span().child(&format!("call:{attempt}")).header()),
    }));
    faults::check("webhook:after_record")?;
    Ok(Ok(deadline))
}

/// What a call's result does to the run: a 2xx answer is the step's
/// output; any other status fails the run `http_<status>`, and no answer
/// fails it with the reason's code.
fn call_ended(step: &CallWebhook, c: &StepCtx<'_>, result: &CallResult) -> Next {
    match result {
        CallResult::Answered { status, body } => {
            let output = WebhookOutput {
                status: *status,
                body: body.clone(),
            };
            if (200..300).contains(status) {
                c.done(step, &output)
            } else {
                let why = Failure::new(format!("http_{status}"), format!("the server answered {status}"));
                c.failed(step, Some(&output), why, OnFailure::Fail)
            }
        }
        CallResult::Failed { code, message } => {
            let why = Failure::new(code.clone(), message.clone());
            c.failed(step, None, why, OnFailure::Fail)
        }
    }
}
