//! The delivery calls and the sweeper: each loads the row, asks the state
//! machine (`machine::transition`, docs/protocol.md "The state machine") what to do, and
//! applies it in SQL whose conditions re-check the state it leaves.
//!
//! Every terminal failure or expiry posts one relay-signed notice in the
//! channel, in the transaction that makes the transition (so exactly once).

use nostr::prelude::{Event, Keys, PublicKey, Tag};
use protocol::api::{
    DeliverySource, DeliveryStatus as Status, OperationRequest, Outcome, RenewRequest, MAX_TURN_DELIVERIES,
};

use crate::config::DeliveryConfig;
use crate::delivery::machine;
use crate::delivery::machine::{Event as On, Failure, Transition};
use crate::events::rules as events;
use crate::events::InsertOutcome;
use crate::faults;
use crate::persistence::db::{Tx, Q};
use crate::persistence::StoreError;
use crate::spans::RunSpan;

use super::claim::{lease_of, IS_CLAIMED};
use super::rows::{load, load_with_membership, Delivery};
pub use crate::refusal::{Answer, Refusal};
pub use protocol::api::{ClaimRequest, Expected, FinishRequest};

/// Loads a row for a holder's call and asks the machine about `event`
/// (a fenced call); the refusal says which part failed.
async fn fenced<'e>(
    tx: &mut Tx<'_>,
    community: &str,
    id: &str,
    now: i64,
    event: impl FnOnce(bool) -> On<'e>,
    caller: &PublicKey,
) -> Answer<(Delivery, Transition)> {
    let d = load(tx, community, id).await?.ok_or(Refusal::NoDelivery)?;
    let decided = machine::transition(&d.state(), event(d.for_caller(caller)), now)?;
    Ok((d, decided))
}

/// Extends a lease. Its one write is its last statement, after every
/// refusal (see [`claim`](super::claim::claim)).
pub async fn renew(
    tx: &mut Tx<'_>,
    community: &str,
    caller: &PublicKey,
    id: &str,
    req: &RenewRequest,
    cfg: &DeliveryConfig,
) -> Answer<i64> {
    let lease = lease_of(req.lease_seconds, cfg)?;
    let token = req.claim_token.as_str();
    let now = tx.now().await?;
    let renew = |is_target| On::Renew {
        is_target,
        token,
        lease_secs: lease,
    };
    let claim_expires_at = match fenced(tx, community, id, now, renew, caller).await? {
        (_, Transition::Renew { claim_expires_at }) => claim_expires_at,
        (_, other) => unreachable!("a renew decides a renew, not {other:?}"),
    };
    tx.exec(
        Q::new(format!(
            "UPDATE workflow_agent_deliveries SET claim_expires_at = $3, updated_at = $4 \
             WHERE community_id = $1 AND id = $2 AND {IS_CLAIMED} AND claim_token = $5"
        ))
        .bind(community)
        .bind(id)
        .bind(claim_expires_at)
        .bind(now)
        .bind(token),
    )
    .await?;
    Ok(claim_expires_at)
}

/// Records an operation of the current attempt (before it is done). Its
/// one write is its last statement, after every refusal (see [`claim`](super::claim::claim)).
pub async fn record_operation(
    tx: &mut Tx<'_>,
    community: &str,
    caller: &PublicKey,
    id: &str,
    req: &OperationRequest,
    cfg: &DeliveryConfig,
) -> Answer<()> {
    let (token, name) = (req.claim_token.as_str(), req.name.as_str());
    if name.is_empty() || name.len() > 256 {
        return Err(Refusal::BadName.into());
    }
    let now = tx.now().await?;
    let hold = |is_target| On::Hold { is_target, token };
    let (d, _) = fenced(tx, community, id, now, hold, caller).await?;
    let count = tx
        .one(
            Q::new(
                "SELECT COUNT(*) FROM delivery_operations WHERE community_id = $1 AND delivery_id = $2 AND attempt = $3",
            )
            .bind(community)
            .bind(id)
            .bind(d.attempt),
        )
        .await?
        .map(|r| r.int(0))
        .transpose()?
        .unwrap_or(0);
    if count >= i64::from(cfg.max_operations_per_attempt) {
        return Err(Refusal::TooManyOperations.into());
    }
    tx.exec(
        Q::new(
            "INSERT INTO delivery_operations (community_id, delivery_id, attempt, seq, name, effect, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(community)
        .bind(id)
        .bind(d.attempt)
        .bind(count + 1)
        .bind(name)
        .bind(req.effect.as_str())
        .bind(now),
    )
    .await?;
    Ok(())
}

/// Signs and stores a visible failure notice for a delivery, in `tx`.
async fn notice(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    d: &Delivery,
    code: &str,
    now: i64,
) -> Result<(Event, String), StoreError> {
    let target = hex::encode(d.target);
    let text = match d.source {
        DeliverySource::Workflow => format!(
            "Workflow {} could not be delivered to agent {target} (delivery {}, step {}): {code}",
            d.workflow_id, d.id, d.step_id
        ),
        DeliverySource::Mention => format!(
            "Agent {target} could not answer this mention (delivery {}): {code}",
            d.id
        ),
    };
    let mut tags = vec![
        Tag::custom("workflow-delivery-failed", [d.id.as_str(), code]),
        Tag::custom("e", [hex::encode(d.message_event_id)]),
        Tag::custom("workflow-run", [d.run_id.as_str()]),
    ];
    // A mention's sender is told (its p-gated notifications show it).
    if d.source == DeliverySource::Mention {
        let context: serde_json::Value = serde_json::from_str(&d.trigger_context).unwrap_or_default();
        if let Some(author) = context["author"].as_str() {
            tags.push(Tag::custom("p", [author]));
        }
    }
    crate::events::notices::post(tx, community, keys, &d.channel, text, tags, now).await
}

/// Moves a row to a terminal failure (with its notice).
#[allow(clippy::too_many_arguments)]
async fn fail(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    d: &Delivery,
    status: Status,
    code: &str,
    message: Option<&str>,
    now: i64,
) -> Result<(Event, String), StoreError> {
    debug_assert!(status.is_terminal() && status != Status::Delivered);
    tx.exec(
        Q::new(
            "UPDATE workflow_agent_deliveries SET status = $3, failure_code = $4, failure_message = $5, \
             claim_token = NULL, output_errors = NULL, updated_at = $6 WHERE community_id = $1 AND id = $2",
        )
        .bind(community)
        .bind(d.id.as_str())
        .bind(status.as_str())
        .bind(code)
        .bind(message.map(str::to_string))
        .bind(now),
    )
    .await?;
    notice(tx, community, keys, d, code, now).await
}

/// What a finish did.
#[derive(Debug)]
pub struct Finished {
    pub status: Status,
    /// Events to announce (reply, notice).
    pub published: Vec<(Event, String)>,
    /// Whether it woke the run waiting for this delivery (the engine
    /// should look at it now).
    pub woke_run: bool,
    /// Why its answer was refused (it did not fit the step's output): the
    /// finish committed (the row waits for the step's revision) and is
    /// answered `output_invalid` with this text.
    pub refused_answer: Option<String>,
    /// Spans of the run's trace it ended: the finish, and the delivery
    /// once it is over.
    pub spans: Vec<RunSpan>,
    /// The row left `claimed` under a cap (its workflow's `concurrency`,
    /// or the relay's `agent_concurrency`): a row the cap held back may
    /// now be claimed, and is worth a wake.
    pub freed_slot: bool,
}

/// Checks a reply: a kind 9 by the target, in the delivery's channel, whose
/// author is still a member (`member`, read with the row). (Its id and
/// signature are checked by the caller, outside any transaction.)
fn check_reply(d: &Delivery, member: bool, reply: &Event) -> Result<(), Refusal> {
    let bad = |m: &str| Err(Refusal::BadReply(m.to_string()));
    if reply.kind.as_u16() != protocol::workflow::MESSAGE_KIND {
        return bad("reply must be a kind 9");
    }
    if reply.pubkey.to_bytes() != d.target {
        return bad("reply must be signed by the delivery's target");
    }
    if protocol::nip29::h_tag(reply) != Some(d.channel.as_str()) {
        return bad("reply must carry the delivery's channel as its h tag");
    }
    if !member {
        return Err(Refusal::AgentNotMember);
    }
    Ok(())
}

/// Finishes an attempt; the reply (if any) and the new status commit together.
#[allow(clippy::too_many_arguments)]
pub async fn finish(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    caller: &PublicKey,
    id: &str,
    req: &FinishRequest,
    cfg: &DeliveryConfig,
) -> Answer<Finished> {
    if req.turn.len() >= MAX_TURN_DELIVERIES {
        return Err(Refusal::TurnTooLong.into());
    }
    let now = tx.now().await?;
    let Some((d, member)) = load_with_membership(tx, community, id).await? else {
        return Err(Refusal::NoDelivery.into());
    };
    if !d.for_caller(caller) {
        return Err(Refusal::NotTarget.into());
    }
    if let Some(status) = d.finished_as(req) {
        // A delivered finish that did not deliver had its answer refused.
        let refused = (req.outcome == Outcome::Delivered && status != Status::Delivered)
            .then(|| "this answer was already refused: it does not fit the step's output".to_string());
        return Ok(Finished {
            status,
            published: Vec::new(),
            woke_run: false,
            refused_answer: refused,
            spans: Vec::new(),
            freed_slot: false,
        });
    }
    let misfit = misfit(&d, req);
    let asked = On::Finish {
        is_target: true,
        token: &req.claim_token,
        outcome: req.outcome,
        backoff_secs: backoff_after(cfg, d.attempt),
        fits: misfit.is_none(),
    };
    let decided = machine::transition(&d.state(), asked, now)?;
    let mut published = Vec::new();
    let reply_id = store_reply(tx, community, &d, member, req.reply.as_ref())
        .await?
        .map(|(id, announce)| {
            published.extend(announce);
            id
        });
    faults::check("finish:after_reply")?;
    let applied = match (decided, &misfit) {
        (Transition::Revise, Some(errors)) => refuse_answer(tx, community, &d, errors, now).await?,
        _ => apply(tx, community, keys, &d, decided, agent_failure(req), now).await?,
    };
    published.extend(applied.notice);
    let status = applied.status;
    record_finish(tx, community, id, req, status, reply_id, now).await?;
    let joined = finish_joined(tx, community, keys, caller, req, reply_id, cfg, now).await?;
    published.extend(joined.iter().flat_map(|(_, _, notice)| notice.clone()));
    faults::check("finish:after_status")?;
    let mut spans = finish_spans(community, &d, req.outcome, status, now);
    for (j, to, _) in &joined {
        spans.extend(finish_spans(community, j, req.outcome, *to, now));
    }
    Ok(Finished {
        status,
        published,
        woke_run: applied.poked,
        refused_answer: misfit.filter(|_| decided == Transition::Revise),
        spans,
        freed_slot: d.concurrency.is_some() || cfg.agent_cap().is_some(),
    })
}

/// The other rows of the finished row's turn (`req.turn`), finished with
/// the same outcome and reply: each as the machine decides for it, and
/// one no longer the caller's to finish (gone with its message,
/// cancelled, its lease over, or not of this claim: another token) left
/// as it is. Returns each finished row (as it was) with its new status
/// and its notice.
#[allow(clippy::too_many_arguments)]
async fn finish_joined(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    caller: &PublicKey,
    req: &FinishRequest,
    reply_id: Option<[u8; 32]>,
    cfg: &DeliveryConfig,
    now: i64,
) -> Result<Vec<(Delivery, Status, Option<(Event, String)>)>, StoreError> {
    let mut finished = Vec::with_capacity(req.turn.len());
    for id in &req.turn {
        let Some(d) = load(tx, community, id).await? else {
            continue;
        };
        if !d.for_caller(caller) || d.finished_as(req).is_some() {
            continue;
        }
        let asked = On::Finish {
            is_target: true,
            token: &req.claim_token,
            outcome: req.outcome,
            backoff_secs: backoff_after(cfg, d.attempt),
            fits: misfit(&d, req).is_none(),
        };
        // Fenced like the finished row; an answer a row's output refuses
        // is not this turn's to give (a turn is of mentions, which have none).
        match machine::transition(&d.state(), asked, now) {
            Ok(Transition::Revise) | Err(_) => continue,
            Ok(decided) => {
                let applied = apply(tx, community, keys, &d, decided, agent_failure(req), now).await?;
                record_finish(tx, community, id, req, applied.status, reply_id, now).await?;
                finished.push((d, applied.status, applied.notice));
            }
        }
    }
    Ok(finished)
}

/// The finish's span (under the delivery's), and the delivery's own when
/// it is over (under its step's).
fn finish_spans(community: &str, d: &Delivery, outcome: Outcome, status: Status, now: i64) -> Vec<RunSpan> {
    let span = d.span(community);
    let mut out = vec![RunSpan::new(
        format!("finish {}", d.id),
        span.child(&format!("finish:{}", d.attempt)),
        Some(span),
        now,
        now,
    )
    .with("workflow.delivery.outcome", outcome.as_str())
    .with("workflow.delivery.attempt", d.attempt.to_string())];
    if status.is_terminal() {
        let step = protocol::trace::step_span(&span.trace_hex(), &d.step_id);
        let mut whole = RunSpan::new(format!("delivery {}", d.id), span, step, d.created_at, now)
            .with("workflow.delivery.status", status.as_str())
            .with("workflow.delivery.agent", hex::encode(d.target));
        if status != Status::Delivered {
            whole.error = Some(status.as_str().to_string());
        }
        out.push(whole);
    }
    out
}

/// Why a delivered finish's answer does not fit the row's output schema
/// (one error a line), or `None` when it fits or the row has none.
fn misfit(d: &Delivery, req: &FinishRequest) -> Option<String> {
    if req.outcome != Outcome::Delivered {
        return None;
    }
    let schema = d.output()?;
    let Some(reply) = &req.reply else {
        return Some("the answer is missing: this step needs a reply that fits its output".into());
    };
    schema
        .check_answer(&reply.content)
        .err()
        .map(|errors| errors.join("\n"))
}

/// `claimed -> pending (revising)`: the answer did not fit; the attempt
/// ends `output_invalid` with the errors, which the row keeps until the
/// step revises it (and it is not claimable meanwhile). Wakes the run.
async fn refuse_answer(
    tx: &mut Tx<'_>,
    community: &str,
    d: &Delivery,
    errors: &str,
    now: i64,
) -> Result<Applied, StoreError> {
    tx.exec(
        Q::new(
            "UPDATE workflow_agent_deliveries SET status = 'pending', claim_token = NULL, \
             claim_expires_at = NULL, next_attempt_at = $3, output_errors = $4, updated_at = $3 \
             WHERE community_id = $1 AND id = $2",
        )
        .bind(community)
        .bind(d.id.as_str())
        .bind(now)
        .bind(errors),
    )
    .await?;
    end_attempt(
        tx,
        community,
        d,
        now,
        "output_invalid",
        Some("output_invalid".into()),
        Some(errors.into()),
    )
    .await?;
    counted(Status::Pending, "output_invalid");
    if d.awaited {
        poke(tx, community, &d.run_id, &d.id).await?;
    }
    Ok(Applied {
        status: Status::Pending,
        notice: None,
        poked: d.awaited,
    })
}

/// The step looks at a row whose answer was refused: with `revision`
/// (its new message, stored) the row is reissued on it, due now, with one
/// more attempt allowed; without (no revision left, or none could be
/// posted) it fails `output_invalid`, with its notice. Returns the new
/// status and the notice to announce.
pub(crate) async fn revise(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    d: &Delivery,
    revision: Option<&Event>,
    now: i64,
) -> Result<(Status, Option<(Event, String)>), StoreError> {
    let decided = machine::transition(
        &d.state(),
        On::Revision {
            left: revision.is_some(),
        },
        now,
    )
    .expect("a revision is not fenced");
    match (decided, revision) {
        (Transition::Reissue, Some(message)) => {
            tx.exec(
                Q::new(
                    "UPDATE workflow_agent_deliveries SET message_event_id = $3, message_created_at = $4, \
                     revision = revision + 1, output_errors = NULL, next_attempt_at = $5, \
                     max_attempts = max_attempts + 1, updated_at = $5 \
                     WHERE community_id = $1 AND id = $2 AND output_errors IS NOT NULL",
                )
                .bind(community)
                .bind(d.id.as_str())
                .bind(message.id.to_bytes())
                .bind(events::created_at_of(message))
                .bind(now),
            )
            .await?;
            counted(Status::Pending, "revised");
            Ok((Status::Pending, None))
        }
        (Transition::Fail(Failure::OutputInvalid), _) => {
            let errors = d.output_errors.as_deref();
            counted(Status::Failed, "output_invalid");
            let notice = fail(
                tx,
                community,
                keys,
                d,
                Status::Failed,
                "output_invalid",
                errors,
                now,
            )
            .await?;
            Ok((Status::Failed, Some(notice)))
        }
        _ => Ok((d.status, None)),
    }
}

impl Delivery {
    /// The status a finish already left, when `req` repeats it (same
    /// token, same outcome): the same answer again.
    fn finished_as(&self, req: &FinishRequest) -> Option<Status> {
        let same = self.finished_token.as_deref() == Some(req.claim_token.as_str())
            && self.finished_outcome == Some(req.outcome);
        same.then(|| self.finished_status.unwrap_or(self.status))
    }
}

/// The wait before the next attempt after a retry of `attempt`.
fn backoff_after(cfg: &DeliveryConfig, attempt: i64) -> i64 {
    let attempt = u32::try_from(attempt).unwrap_or(u32::MAX);
    i64::try_from(cfg.backoff_secs(attempt)).unwrap_or(i64::MAX)
}

/// The agent's failure code and message, bounded (64 bytes, 1,000
/// characters).
fn agent_failure(req: &FinishRequest) -> (&str, Option<String>) {
    let code = req
        .failure_code
        .as_deref()
        .filter(|c| !c.is_empty() && c.len() <= 64)
        .unwrap_or("agent_failed");
    let message = req
        .failure_message
        .as_deref()
        .map(|m| m.chars().take(1000).collect::<String>());
    (code, message)
}

/// Checks and stores a finish's reply: its id, and the event to announce
/// when it was new.
async fn store_reply(
    tx: &mut Tx<'_>,
    community: &str,
    d: &Delivery,
    member: bool,
    reply: Option<&Event>,
) -> Answer<Option<([u8; 32], Option<(Event, String)>)>> {
    let Some(reply) = reply else {
        return Ok(None);
    };
    check_reply(d, member, reply)?;
    let raw = serde_json::to_string(reply).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let inserted = events::insert(tx, community, reply, &raw, Some(&d.channel)).await?;
    let announce = match inserted.of_no_deletion() {
        InsertOutcome::Stored => Some((reply.clone(), raw)),
        InsertOutcome::Duplicate => None,
        InsertOutcome::Rejected(why) => return Err(Refusal::BadReply(why).into()),
    };
    Ok(Some((reply.id.to_bytes(), announce)))
}

/// Applies what the machine decided for a row, but the finish record: the
/// new status, and the notice of a terminal failure or expiry. A
/// `Deliver` is left to [`record_finish`], which writes it with the
/// finish in one statement. `agent`: the code and message of
/// [`Failure::Agent`].
pub(super) async fn apply(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    d: &Delivery,
    decided: Transition,
    agent: (&str, Option<String>),
    now: i64,
) -> Result<Applied, StoreError> {
    let (status, notice) = transition_row(tx, community, keys, d, decided, agent, now).await?;
    // The run waiting for this row looks again, from committed state.
    let ended = status.is_terminal() && status != d.status;
    let poked = d.awaited && ended;
    if poked {
        poke(tx, community, &d.run_id, &d.id).await?;
    }
    Ok(Applied {
        status,
        notice,
        poked,
    })
}

/// Something a waiting run's current step waits on ended (called in the
/// transaction that ends it: a delivery, a decision, a webhook call's
/// attempt): the run's wake row, taken by the engine (`workflow::runs`)
/// when it looks at the run. `wake` names what ended (a delivery id,
/// `approval:<reaction id>`, `call:<step>:<attempt>`), each once, so two
/// writers never write the same row.
pub async fn poke(tx: &mut Tx<'_>, community: &str, run_id: &str, wake: &str) -> Result<(), StoreError> {
    tx.exec(
        Q::new(
            "INSERT INTO workflow_run_wakes (community_id, run_id, delivery_id) VALUES ($1, $2, $3) \
             ON CONFLICT DO NOTHING",
        )
        .bind(community)
        .bind(run_id)
        .bind(wake),
    )
    .await?;
    Ok(())
}

/// What [`apply`] did: the row's new status, its notice, and whether it
/// woke a waiting run.
pub(super) struct Applied {
    pub(super) status: Status,
    pub(super) notice: Option<(Event, String)>,
    pub(super) poked: bool,
}

/// [`apply`] without the run's wake.
async fn transition_row(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    d: &Delivery,
    decided: Transition,
    agent: (&str, Option<String>),
    now: i64,
) -> Result<(Status, Option<(Event, String)>), StoreError> {
    let (status, code, message) = match decided {
        Transition::Deliver => {
            counted(Status::Delivered, "");
            return Ok((Status::Delivered, None));
        }
        Transition::Backoff { next_attempt_at } => {
            to_pending(tx, community, d, next_attempt_at, now, &agent).await?;
            return Ok((Status::Pending, None));
        }
        Transition::Redeliver => {
            to_pending(tx, community, d, now, now, &agent).await?;
            return Ok((Status::Pending, None));
        }
        Transition::Fail(Failure::Agent) => (Status::Failed, agent.0, agent.1),
        // Out of attempts after a retry: the agent's own message says why
        // the last attempt did not work (it used to be dropped).
        Transition::Fail(f) => (Status::Failed, f.code().unwrap_or("failed"), agent.1),
        Transition::Expire => (Status::Expired, "expired", None),
        Transition::Stays => return Ok((d.status, None)),
        other => unreachable!("not an ending of an attempt: {other:?}"),
    };
    counted(status, code);
    let notice = fail(tx, community, keys, d, status, code, message.as_deref(), now).await?;
    Ok((status, Some(notice)))
}

/// Counts a transition in `relay_delivery_transitions_total` (its code as
/// a bounded label).
pub(super) fn counted(to: Status, code: &str) {
    crate::telemetry::count_transitions(to.as_str(), code, 1);
}

/// `claimed -> pending`, due at `next_attempt_at`; the attempt ends with
/// its cause: the agent's `retry` (with its code and message), or
/// `lease_expired` (the sweeper, which passes no agent code).
async fn to_pending(
    tx: &mut Tx<'_>,
    community: &str,
    d: &Delivery,
    next_attempt_at: i64,
    now: i64,
    agent: &(&str, Option<String>),
) -> Result<(), StoreError> {
    tx.exec(
        Q::new(
            "UPDATE workflow_agent_deliveries SET status = 'pending', claim_token = NULL, \
             claim_expires_at = NULL, next_attempt_at = $3, updated_at = $4 \
             WHERE community_id = $1 AND id = $2",
        )
        .bind(community)
        .bind(d.id.as_str())
        .bind(next_attempt_at)
        .bind(now),
    )
    .await?;
    let (outcome, code) = match agent.0 {
        "" => ("lease_expired", None),
        code => ("retry", Some(code.to_string())),
    };
    counted(Status::Pending, if code.is_none() { "lease_expired" } else { "" });
    end_attempt(tx, community, d, now, outcome, code, agent.1.clone()).await
}

/// Ends the row's current attempt with a cause the row itself does not
/// keep (it goes back to `pending`): `retry`, `lease_expired` or
/// `output_invalid`.
async fn end_attempt(
    tx: &mut Tx<'_>,
    community: &str,
    d: &Delivery,
    now: i64,
    outcome: &str,
    code: Option<String>,
    message: Option<String>,
) -> Result<(), StoreError> {
    tx.exec(
        Q::new(
            "UPDATE delivery_attempts SET finished_at = $4, outcome = $5, failure_code = $6, failure_message = $7 \
             WHERE community_id = $1 AND delivery_id = $2 AND attempt = $3 AND finished_at IS NULL",
        )
        .bind(community)
        .bind(d.id.as_str())
        .bind(d.attempt)
        .bind(now)
        .bind(outcome)
        .bind(code)
        .bind(message.map(|m| m.chars().take(1024).collect::<String>())),
    )
    .await?;
    Ok(())
}

/// Records the finish (so a repeat gets the same answer) and, for a
/// delivered row, leaves `claimed` in the same statement.
async fn record_finish(
    tx: &mut Tx<'_>,
    community: &str,
    id: &str,
    req: &FinishRequest,
    status: Status,
    reply_id: Option<[u8; 32]>,
    now: i64,
) -> Result<(), StoreError> {
    let delivered = status == Status::Delivered;
    tx.exec(
        Q::new(
            "UPDATE workflow_agent_deliveries SET finished_token = $3, finished_outcome = $4, finished_status = $5, \
             reply_event_id = COALESCE($6, reply_event_id), \
             status = CASE WHEN $7 THEN 'delivered' ELSE status END, \
             claim_token = CASE WHEN $7 THEN NULL ELSE claim_token END, \
             updated_at = CASE WHEN $7 THEN $8 ELSE updated_at END \
             WHERE community_id = $1 AND id = $2",
        )
        .bind(community)
        .bind(id)
        .bind(req.claim_token.as_str())
        .bind(req.outcome.as_str())
        .bind(status.as_str())
        .bind(reply_id.map(|r| r.to_vec()))
        .bind(delivered)
        .bind(now),
    )
    .await?;
    Ok(())
}
