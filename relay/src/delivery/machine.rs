//! The delivery state machine (docs/protocol.md, "The state machine") as one pure
//! function: given a row's state, what happens to it and the database
//! clock, [`transition`] decides the transition or the refusal. The SQL in
//! `deliveries.rs` applies what it decides (and its statements re-check the
//! state they leave, so that concurrent writers cannot both win).
//!
//! ```text
//! pending --claim--> claimed --finish delivered--> delivered
//!   (a mention's claim takes every due row of its conversation: a turn)
//!                      |  --finish retry (attempts left)--> pending (backoff)
//!                      |  --finish failed / retry (none left) / lease lapsed--> failed
//!                      |  --lease lapsed, recorded no write, attempts left--> pending
//! pending --lifetime over--> expired
//! pending|claimed --channel deleted / workflow disabled--> cancelled
//! pending|claimed --canceldelivery (operator or owner)--> cancelled
//! claimed --finish delivered, answer does not fit the output--> pending (revising)
//! pending (revising) --the step revises: revisions left--> pending (reissued)
//!                    --the step revises: none left--> failed (output_invalid)
//! failed|expired|cancelled --retrydelivery--> pending (fresh budget and lifetime)
//! ```
//!
//! A stale holder is fenced: every renew, operation and finish must come
//! from the target, with the current token, while the row is `claimed` and
//! its lease has not ended.

use protocol::api::{DeliveryStatus as Status, Outcome};

use crate::refusal::Refusal;

/// What the machine needs of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State<'a> {
    pub status: Status,
    pub attempt: i64,
    pub max_attempts: i64,
    pub claim_token: Option<&'a str>,
    pub claim_expires_at: Option<i64>,
    pub next_attempt_at: i64,
    pub expires_at: i64,
    /// The claim said it records its operations (a lapsed lease with no
    /// recorded write may then be redelivered).
    pub records_operations: bool,
    /// Its answer was refused (it did not fit the step's output) and the
    /// step has not revised it yet: not claimable until then.
    pub revising: bool,
    /// The claimed rows a claim of it would join, and their caps.
    pub in_flight: InFlight,
    /// Another row of its conversation (its agent's, a mention's) is
    /// claimed, or pending but not yet due (the debounce: the conversation
    /// is still speaking). Loaded only where a claim is decided from the
    /// row; always `false` for a row with no conversation.
    pub conversation_busy: bool,
}

/// The claimed rows of a row's workflow and of its agent (in its
/// community), with the caps a claim must stay under: the workflow's
/// `concurrency` and the relay's `deliveries.agent_concurrency` (`None`:
/// no cap). Loaded only where a claim is decided from the row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InFlight {
    pub workflow: i64,
    pub workflow_cap: Option<i64>,
    pub agent: i64,
    pub agent_cap: Option<i64>,
}

/// What happens to a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// A claim of this row by `caller` for `lease_secs`.
    Claim { is_target: bool, lease_secs: i64 },
    /// A holder's call that changes nothing but must be fenced (recording
    /// an operation).
    Hold { is_target: bool, token: &'a str },
    Renew {
        is_target: bool,
        token: &'a str,
        lease_secs: i64,
    },
    /// `backoff_secs`: the wait before the next attempt after a retry of
    /// this attempt; `fits`: the reply fits the step's output (or it has
    /// none).
    Finish {
        is_target: bool,
        token: &'a str,
        outcome: Outcome,
        backoff_secs: i64,
        fits: bool,
    },
    /// The step looks at a row whose answer was refused: `left`, it may
    /// ask again (revisions remain).
    Revision { left: bool },
    /// The sweeper found the lease ended; `wrote`: the attempt recorded a
    /// write.
    LeaseLapsed { wrote: bool },
    /// The sweeper found the row's lifetime over.
    LifetimeOver,
    /// The channel was deleted or the workflow disabled.
    Cancel,
    /// An admin or the workflow's owner cancels the row (`canceldelivery`).
    OperatorCancel,
    /// An admin or the workflow's owner re-drives an ended row
    /// (`retrydelivery`): `max_attempts` more attempts within a new
    /// lifetime of `lifetime_secs`.
    Redrive { max_attempts: i64, lifetime_secs: i64 },
}

/// Why a delivery failed for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Retry asked for with no attempt left.
    AttemptsExhausted,
    /// The lease ended and redelivery was not known to be safe.
    LeaseExpired,
    /// The agent said so (its code).
    Agent,
    /// Its answers did not fit the step's output, and no revision is left.
    OutputInvalid,
}

impl Failure {
    /// The notice's code (the agent's own for [`Failure::Agent`]).
    pub fn code(self) -> Option<&'static str> {
        match self {
            Failure::AttemptsExhausted => Some("attempts_exhausted"),
            Failure::LeaseExpired => Some("lease_expired"),
            Failure::OutputInvalid => Some("output_invalid"),
            Failure::Agent => None,
        }
    }
}

/// What the store does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// A claim found nothing to claim: no change (the answer is `null`).
    NotDue,
    /// `pending -> claimed`, attempt + 1.
    Claim { attempt: i64, claim_expires_at: i64 },
    /// A fenced call may go ahead; no change of state.
    Hold,
    /// The lease now ends at `claim_expires_at`.
    Renew { claim_expires_at: i64 },
    /// `claimed -> delivered`.
    Deliver,
    /// `claimed -> pending`, due again at `next_attempt_at`.
    Backoff { next_attempt_at: i64 },
    /// `claimed -> pending` at once (nothing was done).
    Redeliver,
    /// `claimed -> pending`, revising: the answer did not fit the step's
    /// output; the step then reissues or fails the row.
    Revise,
    /// `pending (revising) -> pending`, due now, with the step's revision
    /// message as its message.
    Reissue,
    /// `-> failed` (terminal, with a notice).
    Fail(Failure),
    /// `pending -> expired` (terminal, with a notice).
    Expire,
    /// `-> cancelled` (terminal).
    Cancel,
    /// `failed|expired|cancelled -> pending`, due now, attempts up to
    /// `max_attempts`, alive until `expires_at`.
    Redrive { max_attempts: i64, expires_at: i64 },
    /// The event does not apply to the row's state (the sweeper or a
    /// cancellation found it changed meanwhile): no change.
    Stays,
}

/// Decides what `event` does to a row in state `s` at `now` (unix
/// seconds by the database clock).
pub fn transition(s: &State<'_>, event: Event<'_>, now: i64) -> Result<Transition, Refusal> {
    match event {
        Event::Claim {
            is_target,
            lease_secs,
        } => claim(s, is_target, lease_secs, now),
        Event::Hold { is_target, token } => fence(s, is_target, token, now).map(|()| Transition::Hold),
        Event::Renew {
            is_target,
            token,
            lease_secs,
        } => {
            fence(s, is_target, token, now)?;
            within_lifetime(s, now, lease_secs)?;
            Ok(Transition::Renew {
                claim_expires_at: now + lease_secs,
            })
        }
        Event::Finish {
            is_target,
            token,
            outcome,
            backoff_secs,
            fits,
        } => {
            fence(s, is_target, token, now)?;
            Ok(match outcome {
                Outcome::Delivered if !fits => Transition::Revise,
                _ => finish(s, outcome, backoff_secs, now),
            })
        }
        Event::Revision { left } => Ok(match (s.status, s.revising) {
            (Status::Pending, true) if left => Transition::Reissue,
            (Status::Pending, true) => Transition::Fail(Failure::OutputInvalid),
            _ => Transition::Stays,
        }),
        Event::LeaseLapsed { wrote } => Ok(lapse(s, wrote, now)),
        Event::LifetimeOver => Ok(if s.status == Status::Pending && s.expires_at <= now {
            Transition::Expire
        } else {
            Transition::Stays
        }),
        Event::Cancel => Ok(if matches!(s.status, Status::Pending | Status::Claimed) {
            Transition::Cancel
        } else {
            Transition::Stays
        }),
        Event::OperatorCancel => match s.status {
            Status::Pending | Status::Claimed => Ok(Transition::Cancel),
            ended => Err(Refusal::AlreadyEnded(ended)),
        },
        Event::Redrive {
            max_attempts,
            lifetime_secs,
        } => match s.status {
            Status::Failed | Status::Expired | Status::Cancelled => Ok(Transition::Redrive {
                max_attempts: s.attempt.saturating_add(max_attempts),
                expires_at: now.saturating_add(lifetime_secs),
            }),
            other => Err(Refusal::NotRetryable(other)),
        },
    }
}

/// The fence of a holder's call (renew, operation, finish).
fn fence(s: &State<'_>, is_target: bool, token: &str, now: i64) -> Result<(), Refusal> {
    if !is_target {
        return Err(Refusal::NotTarget);
    }
    if s.status == Status::Cancelled {
        return Err(Refusal::Cancelled);
    }
    if s.claim_token != Some(token) {
        return Err(Refusal::StaleToken);
    }
    if s.status != Status::Claimed {
        return Err(Refusal::NotClaimed(s.status));
    }
    if s.claim_expires_at.is_none_or(|t| t <= now) {
        return Err(Refusal::LeaseExpired);
    }
    Ok(())
}

/// A lease must end by the row's expiry.
fn within_lifetime(s: &State<'_>, now: i64, lease_secs: i64) -> Result<(), Refusal> {
    if now.saturating_add(lease_secs) > s.expires_at {
        return Err(Refusal::LeaseExceedsLifetime {
            expires_at: s.expires_at,
        });
    }
    Ok(())
}

/// One clause of the claim rule. A row is claimable by a caller at `now`
/// for a lease ending at `lease_end` when every clause of [`CLAIM_RULE`]
/// holds. The machine decides a claim with it, and the claim statements'
/// `WHERE` is made from the same clauses (`deliveries::claim_sql`), so the
/// two cannot say different things.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimable {
    /// The caller is the row's target.
    Target,
    /// The row is `pending`.
    Pending,
    /// Its backoff is over: `next_attempt_at <= now`.
    Due,
    /// The lease ends within the row's lifetime: `expires_at >= lease_end`.
    LeaseFits,
    /// No refused answer waits for its revision: `output_errors IS NULL`.
    NotRevising,
    /// Its workflow holds fewer claimed rows than its `concurrency`.
    WorkflowRoom,
    /// Its agent holds fewer claimed rows in the community than the
    /// relay's `agent_concurrency`.
    AgentRoom,
    /// It has no conversation, or no other row of its conversation is
    /// claimed (one turn at a time) or waits out its debounce (a turn
    /// takes the conversation once it is quiet).
    ConversationFree,
}

/// The claim rule, in the order the machine tests it.
pub const CLAIM_RULE: [Claimable; 8] = [
    Claimable::Target,
    Claimable::Pending,
    Claimable::Due,
    Claimable::LeaseFits,
    Claimable::NotRevising,
    Claimable::WorkflowRoom,
    Claimable::AgentRoom,
    Claimable::ConversationFree,
];

impl Claimable {
    /// Whether the clause holds of row `s`.
    pub fn holds(self, s: &State<'_>, is_target: bool, now: i64, lease_end: i64) -> bool {
        match self {
            Claimable::Target => is_target,
            Claimable::Pending => s.status == Status::Pending,
            Claimable::Due => s.next_attempt_at <= now,
            Claimable::LeaseFits => s.expires_at >= lease_end,
            Claimable::NotRevising => !s.revising,
            Claimable::WorkflowRoom => s
                .in_flight
                .workflow_cap
                .is_none_or(|cap| s.in_flight.workflow < cap),
            Claimable::AgentRoom => s.in_flight.agent_cap.is_none_or(|cap| s.in_flight.agent < cap),
            Claimable::ConversationFree => !s.conversation_busy,
        }
    }
}

/// A claim: refused to anyone but the target and for a cancelled row;
/// granted when [`CLAIM_RULE`] holds; refused when only the lease does not
/// fit a row that is still alive; else nothing to claim.
fn claim(s: &State<'_>, is_target: bool, lease_secs: i64, now: i64) -> Result<Transition, Refusal> {
    if !is_target {
        return Err(Refusal::NotTarget);
    }
    if s.status == Status::Cancelled {
        return Err(Refusal::Cancelled);
    }
    let lease_end = now.saturating_add(lease_secs);
    match CLAIM_RULE
        .into_iter()
        .find(|c| !c.holds(s, is_target, now, lease_end))
    {
        None => Ok(Transition::Claim {
            attempt: s.attempt + 1,
            claim_expires_at: lease_end,
        }),
        Some(Claimable::LeaseFits) if s.expires_at > now => Err(Refusal::LeaseExceedsLifetime {
            expires_at: s.expires_at,
        }),
        Some(_) => Ok(Transition::NotDue),
    }
}

fn finish(s: &State<'_>, outcome: Outcome, backoff_secs: i64, now: i64) -> Transition {
    match outcome {
        Outcome::Delivered => Transition::Deliver,
        Outcome::Retry if s.attempt < s.max_attempts => Transition::Backoff {
            next_attempt_at: now.saturating_add(backoff_secs),
        },
        Outcome::Retry => Transition::Fail(Failure::AttemptsExhausted),
        Outcome::Failed => Transition::Fail(Failure::Agent),
    }
}

/// A lapsed lease: redelivered only when nothing can have been done (the
/// claim records its operations and recorded no write) and attempts and
/// lifetime remain.
fn lapse(s: &State<'_>, wrote: bool, now: i64) -> Transition {
    if s.status != Status::Claimed || s.claim_expires_at.is_some_and(|t| t > now) {
        return Transition::Stays;
    }
    if s.records_operations && !wrote && s.attempt < s.max_attempts && s.expires_at > now {
        Transition::Redeliver
    } else {
        Transition::Fail(Failure::LeaseExpired)
    }
}

#[cfg(test)]
mod tests;
