//! Outbound webhook calls of `call_webhook` steps, and the owners' sealed
//! secrets they sign with.
//!
//! A call is recorded (state `sending`, with a deadline) in the step's
//! transaction, before anything is sent; the engine sends it after commit
//! and records the answer in another transaction, which checks the
//! attempt it answers is still the one in flight and wakes the run; the
//! step then ends with the answer as recorded. A call still `sending`
//! after its deadline was interrupted (the process died mid-call): it is
//! sent again, same `Idempotency-Key`, only when the step says `retry`.
//! The store never sees a secret in clear: it keeps what the secrets key
//! sealed, and hands the sealed bytes to the engine with the call.

use protocol::api::{CallPhase, CallView, RunError};
use protocol::workflow::HttpMethod;
use serde_json::Value;

use crate::persistence::db::{Row, Tx, Q};
use crate::persistence::StoreError;

/// A call to send now (after the commit that recorded it).
#[derive(Debug, Clone)]
pub struct OutCall {
    pub workflow_id: String,
    /// Hex pubkey of the workflow's owner (whose share of the slots the
    /// call takes).
    pub owner: String,
    pub run_id: String,
    pub step_id: String,
    pub attempt: i64,
    pub url: String,
    pub method: HttpMethod,
    pub body: String,
    pub idempotency_key: String,
    /// The named secret, sealed, to sign the body with.
    pub secret: Option<SealedSecret>,
    pub timeout_secs: u64,
    /// The attempt's span in the run's trace, sent as `traceparent`.
    pub traceparent: Option<String>,
}

/// A secret as stored: its name and the sealed bytes.
#[derive(Debug, Clone)]
pub struct SealedSecret {
    pub name: String,
    pub sealed: Vec<u8>,
}

/// What sending a call came to.
#[derive(Debug, Clone)]
pub enum CallResult {
    /// The server answered (any status); `body` is JSON when the answer
    /// was, else its text.
    Answered { status: u16, body: Value },
    /// No answer: refused before sending, unreachable, timed out, too large.
    Failed { code: String, message: String },
}

/// The answer to one attempt of a call.
#[derive(Debug, Clone)]
pub struct CallAnswer {
    pub step_id: String,
    pub attempt: i64,
    pub result: CallResult,
}

/// Where a step's call is.
#[derive(Debug, Clone)]
pub enum CallState {
    /// The attempt is in flight (or its process died with it).
    Sending,
    /// The attempt's result was recorded.
    Ended(CallResult),
    /// The attempt was given up after its deadline.
    Interrupted,
}

/// A step's call as recorded.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub attempt: i64,
    pub state: CallState,
    pub deadline: i64,
    pub url: String,
    pub body: String,
}

/// Records attempt `attempt` of a step's call as `sending` from `now`
/// until `deadline`.
#[allow(clippy::too_many_arguments)]
pub async fn record(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    step_id: &str,
    attempt: i64,
    url: &str,
    body: &str,
    (now, deadline): (i64, i64),
) -> Result<(), StoreError> {
    tx.exec(
        Q::new(
            "INSERT INTO workflow_webhook_calls (community_id, run_id, step_id, attempt, state, url, \
             request_body, recorded_at, deadline) VALUES ($1, $2, $3, $4, 'sending', $5, $6, $7, $8) \
             ON CONFLICT (community_id, run_id, step_id) DO UPDATE SET attempt = excluded.attempt, \
             state = 'sending', recorded_at = excluded.recorded_at, deadline = excluded.deadline, \
             status = NULL, answer = NULL, error_code = NULL, error = NULL, answered_at = NULL",
        )
        .bind(community)
        .bind(run_id)
        .bind(step_id)
        .bind(attempt)
        .bind(url)
        .bind(body)
        .bind(now)
        .bind(deadline),
    )
    .await?;
    Ok(())
}

/// The row of a step's call, every column.
async fn row(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    step_id: &str,
) -> Result<Option<Row>, StoreError> {
    tx.one(
        Q::new(
            "SELECT attempt, state, deadline, url, request_body, status, answer, error_code, error, \
             recorded_at, answered_at \
             FROM workflow_webhook_calls WHERE community_id = $1 AND run_id = $2 AND step_id = $3",
        )
        .bind(community)
        .bind(run_id)
        .bind(step_id),
    )
    .await
}

/// A call's `state` column.
fn phase(state: &str) -> Result<CallPhase, StoreError> {
    Ok(match state {
        "sending" => CallPhase::Sending,
        "answered" => CallPhase::Answered,
        "failed" => CallPhase::Failed,
        "interrupted" => CallPhase::Interrupted,
        other => {
            return Err(StoreError::Corrupt(format!(
                "webhook call: unknown state {other}"
            )))
        }
    })
}

/// A step's recorded call, if any.
pub async fn load(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    step_id: &str,
) -> Result<Option<Recorded>, StoreError> {
    let Some(r) = row(tx, community, run_id, step_id).await? else {
        return Ok(None);
    };
    let corrupt = |what: &str| StoreError::Corrupt(format!("webhook call: {what}"));
    let state = match phase(&r.text("state")?)? {
        CallPhase::Sending => CallState::Sending,
        CallPhase::Interrupted => CallState::Interrupted,
        CallPhase::Answered => {
            let status = r.opt_int("status")?.and_then(|s| u16::try_from(s).ok());
            let answer = r.opt_text("answer")?;
            let body = answer.map(|a| serde_json::from_str(&a)).transpose();
            match (status, body) {
                (Some(status), Ok(Some(body))) => CallState::Ended(CallResult::Answered { status, body }),
                _ => return Err(corrupt("an answered call without its status or answer")),
            }
        }
        CallPhase::Failed => CallState::Ended(CallResult::Failed {
            code: r.opt_text("error_code")?.unwrap_or_default(),
            message: r.opt_text("error")?.unwrap_or_default(),
        }),
    };
    Ok(Some(Recorded {
        attempt: r.int("attempt")?,
        state,
        deadline: r.int("deadline")?,
        url: r.text("url")?,
        body: r.text("request_body")?,
    }))
}

/// A step's call as the dashboard shows it: the latest attempt's request
/// and what came back (`None`: the step sent none).
pub async fn view(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    step_id: &str,
    method: HttpMethod,
) -> Result<Option<CallView>, StoreError> {
    let Some(r) = row(tx, community, run_id, step_id).await? else {
        return Ok(None);
    };
    let phase = phase(&r.text("state")?)?;
    let request = r.text("request_body")?;
    let error = r.opt_text("error_code")?.map(|code| RunError {
        code,
        message: r.opt_text("error").ok().flatten().unwrap_or_default(),
        step: Some(step_id.to_string()),
    });
    Ok(Some(CallView {
        attempt: r.int("attempt")?,
        phase,
        method: method.as_str().to_string(),
        url: r.text("url")?,
        request_bytes: request.len() as u64,
        request,
        sent_at: r.int("recorded_at")?,
        answered_at: r.opt_int("answered_at")?,
        status: r.opt_int("status")?.and_then(|s| u16::try_from(s).ok()),
        answer_bytes: r.opt_text("answer")?.map(|a| a.len() as u64),
        error,
    }))
}

/// Records what attempt `answer.attempt` of a step's call came to, if that
/// attempt is still the one in flight; returns whether it was. An answer
/// to an attempt given up or sent again changes nothing.
pub async fn answer(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    answer: &CallAnswer,
    now: i64,
) -> Result<bool, StoreError> {
    let (state, status, body, code, error) = match &answer.result {
        CallResult::Answered { status, body } => (
            "answered",
            Some(i64::from(*status)),
            Some(body.to_string()),
            None,
            None,
        ),
        CallResult::Failed { code, message } => {
            ("failed", None, None, Some(code.clone()), Some(message.clone()))
        }
    };
    let changed = tx
        .exec(
            Q::new(
                "UPDATE workflow_webhook_calls SET state = $5, status = $6, answer = $7, error_code = $8, \
                 error = $9, answered_at = $10 WHERE community_id = $1 AND run_id = $2 AND step_id = $3 \
                 AND attempt = $4 AND state = 'sending'",
            )
            .bind(community)
            .bind(run_id)
            .bind(answer.step_id.as_str())
            .bind(answer.attempt)
            .bind(state)
            .bind(status)
            .bind(body)
            .bind(code)
            .bind(error)
            .bind(now),
        )
        .await?;
    Ok(changed == 1)
}

/// Gives up the step's call in flight (its deadline passed with no
/// answer and the step does not retry).
pub async fn interrupt(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    step_id: &str,
    now: i64,
) -> Result<(), StoreError> {
    tx.exec(
        Q::new(
            "UPDATE workflow_webhook_calls SET state = 'interrupted', error_code = 'interrupted', \
             answered_at = $4 WHERE community_id = $1 AND run_id = $2 AND step_id = $3",
        )
        .bind(community)
        .bind(run_id)
        .bind(step_id)
        .bind(now),
    )
    .await?;
    Ok(())
}

/// A workflow's secret, sealed, if it is set.
pub async fn secret(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: &str,
    name: &str,
) -> Result<Option<SealedSecret>, StoreError> {
    let row = tx
        .one(
            Q::new("SELECT sealed FROM workflow_secrets WHERE community_id = $1 AND workflow_id = $2 AND name = $3")
                .bind(community)
                .bind(workflow_id)
                .bind(name),
        )
        .await?;
    row.map(|r| {
        Ok(SealedSecret {
            name: name.to_string(),
            sealed: r.blob(0)?,
        })
    })
    .transpose()
}

/// Sets (or replaces: rotation) a workflow's secret, sealed by the caller.
pub async fn set_secret(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: &str,
    name: &str,
    sealed: &[u8],
) -> Result<i64, StoreError> {
    let now = tx.now().await?;
    tx.exec(
        Q::new(
            "INSERT INTO workflow_secrets (community_id, workflow_id, name, sealed, updated_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (community_id, workflow_id, name) \
             DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at",
        )
        .bind(community)
        .bind(workflow_id)
        .bind(name)
        .bind(sealed.to_vec())
        .bind(now),
    )
    .await?;
    Ok(now)
}
