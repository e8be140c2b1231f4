//! The delivery state machine (docs/protocol.md, "The state machine") as one pure
//! function: given a row's state, what happens to it and the database
//! clock, [`transition`] decides the transition or the refusal. The SQL in
//! `deliveries.rs` applies what it decides (and its statements re-check the
//! state they leave, so that concurrent writers cannot both win).
//!
//! ```text
//! pending --claim--> claimed --finish delivered--> delivered
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
}

/// The claim rule, in the order the machine tests it.
pub const CLAIM_RULE: [Claimable; 7] = [
    Claimable::Target,
    Claimable::Pending,
    Claimable::Due,
    Claimable::LeaseFits,
    Claimable::NotRevising,
    Claimable::WorkflowRoom,
    Claimable::AgentRoom,
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
mod tests {
    use super::*;

    const NOW: i64 = 1_000;

    /// A row claimed with token "t", attempt 1 of 3, lease to NOW + 30,
    /// lifetime to NOW + 100.
    fn claimed() -> State<'static> {
        State {
            status: Status::Claimed,
            attempt: 1,
            max_attempts: 3,
            claim_token: Some("t"),
            claim_expires_at: Some(NOW + 30),
            next_attempt_at: NOW - 10,
            expires_at: NOW + 100,
            records_operations: false,
            revising: false,
            in_flight: InFlight::default(),
        }
    }

    fn pending() -> State<'static> {
        State {
            status: Status::Pending,
            attempt: 0,
            claim_token: None,
            claim_expires_at: None,
            ..claimed()
        }
    }

    fn with(s: State<'static>, f: impl FnOnce(&mut State<'static>)) -> State<'static> {
        let mut s = s;
        f(&mut s);
        s
    }

    /// A claim for a 30 s lease.
    fn claim_as(is_target: bool) -> Event<'static> {
        Event::Claim {
            is_target,
            lease_secs: 30,
        }
    }

    fn finish(outcome: Outcome) -> Event<'static> {
        Event::Finish {
            is_target: true,
            token: "t",
            outcome,
            backoff_secs: 5,
            fits: true,
        }
    }

    #[test]
    fn every_edge_of_the_machine() {
        use Transition as T;
        let lapsed = with(claimed(), |s| s.claim_expires_at = Some(NOW));
        let table: Vec<(&str, State<'static>, Event<'static>, Result<Transition, Refusal>)> = vec![
            // pending -> claimed
            (
                "claim",
                pending(),
                claim_as(true),
                Ok(T::Claim {
                    attempt: 1,
                    claim_expires_at: NOW + 30,
                }),
            ),
            (
                "claim in backoff",
                with(pending(), |s| s.next_attempt_at = NOW + 1),
                claim_as(true),
                Ok(T::NotDue),
            ),
            (
                "claim after lifetime",
                with(pending(), |s| s.expires_at = NOW),
                claim_as(true),
                Ok(T::NotDue),
            ),
            ("claim of a claimed row", claimed(), claim_as(true), Ok(T::NotDue)),
            (
                "claim of a delivered row",
                with(claimed(), |s| s.status = Status::Delivered),
                claim_as(true),
                Ok(T::NotDue),
            ),
            (
                "claim past the lifetime",
                pending(),
                Event::Claim {
                    is_target: true,
                    lease_secs: 101,
                },
                Err(Refusal::LeaseExceedsLifetime {
                    expires_at: NOW + 100,
                }),
            ),
            (
                "claim by another",
                pending(),
                claim_as(false),
                Err(Refusal::NotTarget),
            ),
            (
                "claim of a cancelled row",
                with(pending(), |s| s.status = Status::Cancelled),
                claim_as(true),
                Err(Refusal::Cancelled),
            ),
            // claimed -> delivered / pending / failed
            (
                "finish delivered",
                claimed(),
                finish(Outcome::Delivered),
                Ok(T::Deliver),
            ),
            (
                "finish retry",
                claimed(),
                finish(Outcome::Retry),
                Ok(T::Backoff {
                    next_attempt_at: NOW + 5,
                }),
            ),
            (
                "finish retry, last attempt",
                with(claimed(), |s| s.attempt = 3),
                finish(Outcome::Retry),
                Ok(T::Fail(Failure::AttemptsExhausted)),
            ),
            (
                "finish failed",
                claimed(),
                finish(Outcome::Failed),
                Ok(T::Fail(Failure::Agent)),
            ),
            // answers that do not fit the step's output
            (
                "finish delivered, the answer does not fit",
                claimed(),
                Event::Finish {
                    is_target: true,
                    token: "t",
                    outcome: Outcome::Delivered,
                    backoff_secs: 5,
                    fits: false,
                },
                Ok(T::Revise),
            ),
            (
                "finish failed says nothing of an answer",
                claimed(),
                Event::Finish {
                    is_target: true,
                    token: "t",
                    outcome: Outcome::Failed,
                    backoff_secs: 5,
                    fits: false,
                },
                Ok(T::Fail(Failure::Agent)),
            ),
            (
                "revision, some left",
                with(pending(), |s| s.revising = true),
                Event::Revision { left: true },
                Ok(T::Reissue),
            ),
            (
                "revision, none left",
                with(pending(), |s| s.revising = true),
                Event::Revision { left: false },
                Ok(T::Fail(Failure::OutputInvalid)),
            ),
            (
                "revision of a row already reissued",
                pending(),
                Event::Revision { left: true },
                Ok(T::Stays),
            ),
            (
                "revision of a cancelled row",
                with(pending(), |s| {
                    s.revising = true;
                    s.status = Status::Cancelled
                }),
                Event::Revision { left: true },
                Ok(T::Stays),
            ),
            (
                "claim of a row waiting for its revision",
                with(pending(), |s| s.revising = true),
                claim_as(true),
                Ok(T::NotDue),
            ),
            (
                "claim while its workflow holds its cap",
                with(pending(), |s| {
                    s.in_flight.workflow = 2;
                    s.in_flight.workflow_cap = Some(2)
                }),
                claim_as(true),
                Ok(T::NotDue),
            ),
            (
                "claim with room under its workflow's cap",
                with(pending(), |s| {
                    s.in_flight.workflow = 1;
                    s.in_flight.workflow_cap = Some(2)
                }),
                claim_as(true),
                Ok(T::Claim {
                    attempt: 1,
                    claim_expires_at: NOW + 30,
                }),
            ),
            (
                "claim while its agent holds its cap",
                with(pending(), |s| {
                    s.in_flight.agent = 3;
                    s.in_flight.agent_cap = Some(3)
                }),
                claim_as(true),
                Ok(T::NotDue),
            ),
            (
                "a cap does not hide a row from another agent's claim",
                with(pending(), |s| {
                    s.in_flight.agent = 3;
                    s.in_flight.agent_cap = Some(3)
                }),
                claim_as(false),
                Err(Refusal::NotTarget),
            ),
            // lapsed leases
            (
                "lapsed, wrote nothing, recorded",
                with(lapsed.clone(), |s| s.records_operations = true),
                Event::LeaseLapsed { wrote: false },
                Ok(T::Redeliver),
            ),
            (
                "lapsed, did not record",
                lapsed.clone(),
                Event::LeaseLapsed { wrote: false },
                Ok(T::Fail(Failure::LeaseExpired)),
            ),
            (
                "lapsed, wrote",
                with(lapsed.clone(), |s| s.records_operations = true),
                Event::LeaseLapsed { wrote: true },
                Ok(T::Fail(Failure::LeaseExpired)),
            ),
            (
                "lapsed, no attempt left",
                with(lapsed.clone(), |s| {
                    s.records_operations = true;
                    s.attempt = 3
                }),
                Event::LeaseLapsed { wrote: false },
                Ok(T::Fail(Failure::LeaseExpired)),
            ),
            (
                "lapsed, lifetime over",
                with(lapsed.clone(), |s| {
                    s.records_operations = true;
                    s.expires_at = NOW
                }),
                Event::LeaseLapsed { wrote: false },
                Ok(T::Fail(Failure::LeaseExpired)),
            ),
            (
                "lease not over yet",
                claimed(),
                Event::LeaseLapsed { wrote: false },
                Ok(T::Stays),
            ),
            (
                "lapse of a delivered row",
                with(lapsed.clone(), |s| s.status = Status::Delivered),
                Event::LeaseLapsed { wrote: false },
                Ok(T::Stays),
            ),
            // pending -> expired
            (
                "lifetime over",
                with(pending(), |s| s.expires_at = NOW),
                Event::LifetimeOver,
                Ok(T::Expire),
            ),
            ("lifetime not over", pending(), Event::LifetimeOver, Ok(T::Stays)),
            (
                "lifetime over, claimed",
                with(claimed(), |s| s.expires_at = NOW),
                Event::LifetimeOver,
                Ok(T::Stays),
            ),
            // pending|claimed -> cancelled
            ("cancel pending", pending(), Event::Cancel, Ok(T::Cancel)),
            ("cancel claimed", claimed(), Event::Cancel, Ok(T::Cancel)),
            (
                "cancel delivered",
                with(claimed(), |s| s.status = Status::Delivered),
                Event::Cancel,
                Ok(T::Stays),
            ),
            // renew
            (
                "renew",
                claimed(),
                Event::Renew {
                    is_target: true,
                    token: "t",
                    lease_secs: 60,
                },
                Ok(T::Renew {
                    claim_expires_at: NOW + 60,
                }),
            ),
            (
                "renew past the lifetime",
                claimed(),
                Event::Renew {
                    is_target: true,
                    token: "t",
                    lease_secs: 101,
                },
                Err(Refusal::LeaseExceedsLifetime {
                    expires_at: NOW + 100,
                }),
            ),
            (
                "hold",
                claimed(),
                Event::Hold {
                    is_target: true,
                    token: "t",
                },
                Ok(T::Hold),
            ),
        ];
        for (what, state, event, want) in table {
            assert_eq!(transition(&state, event, NOW), want, "{what}");
        }
    }

    #[test]
    fn stale_holders_are_fenced_in_order() {
        let holder_calls = |is_target: bool, token: &'static str| -> [Event<'static>; 3] {
            [
                Event::Hold { is_target, token },
                Event::Renew {
                    is_target,
                    token,
                    lease_secs: 10,
                },
                Event::Finish {
                    is_target,
                    token,
                    outcome: Outcome::Delivered,
                    backoff_secs: 5,
                    fits: true,
                },
            ]
        };
        let cases: Vec<(&str, State<'static>, bool, &'static str, Refusal)> = vec![
            ("another agent", claimed(), false, "t", Refusal::NotTarget),
            (
                "cancelled",
                with(claimed(), |s| s.status = Status::Cancelled),
                true,
                "t",
                Refusal::Cancelled,
            ),
            ("an old token", claimed(), true, "old", Refusal::StaleToken),
            (
                "no longer claimed",
                with(claimed(), |s| s.status = Status::Pending),
                true,
                "t",
                Refusal::NotClaimed(Status::Pending),
            ),
            (
                "finished",
                with(claimed(), |s| s.status = Status::Delivered),
                true,
                "t",
                Refusal::NotClaimed(Status::Delivered),
            ),
            (
                "lease over",
                with(claimed(), |s| s.claim_expires_at = Some(NOW)),
                true,
                "t",
                Refusal::LeaseExpired,
            ),
            (
                "lease unknown",
                with(claimed(), |s| s.claim_expires_at = None),
                true,
                "t",
                Refusal::LeaseExpired,
            ),
            // The target is checked before anything else: another agent
            // learns nothing of the row's state.
            (
                "another agent, cancelled",
                with(claimed(), |s| s.status = Status::Cancelled),
                false,
                "t",
                Refusal::NotTarget,
            ),
        ];
        for (what, state, is_target, token, refusal) in cases {
            for event in holder_calls(is_target, token) {
                assert_eq!(
                    transition(&state, event, NOW),
                    Err(refusal.clone()),
                    "{what}: {event:?}"
                );
            }
        }
    }

    #[test]
    fn operator_edges() {
        let redrive = Event::Redrive {
            max_attempts: 3,
            lifetime_secs: 600,
        };
        for ended in [Status::Failed, Status::Expired, Status::Cancelled] {
            let s = with(claimed(), |s| s.status = ended);
            assert_eq!(
                transition(&s, redrive, NOW),
                Ok(Transition::Redrive {
                    max_attempts: 4,
                    expires_at: NOW + 600
                }),
                "{ended}"
            );
            assert_eq!(
                transition(&s, Event::OperatorCancel, NOW),
                Err(Refusal::AlreadyEnded(ended))
            );
        }
        for open in [Status::Pending, Status::Claimed] {
            let s = with(claimed(), |s| s.status = open);
            assert_eq!(transition(&s, redrive, NOW), Err(Refusal::NotRetryable(open)));
            assert_eq!(transition(&s, Event::OperatorCancel, NOW), Ok(Transition::Cancel));
        }
        let delivered = with(claimed(), |s| s.status = Status::Delivered);
        assert_eq!(
            transition(&delivered, redrive, NOW),
            Err(Refusal::NotRetryable(Status::Delivered))
        );
    }

    #[test]
    fn lease_arithmetic() {
        // A lease may end exactly at the row's expiry, not a second later.
        let s = pending();
        let at_expiry = Event::Claim {
            is_target: true,
            lease_secs: 100,
        };
        assert!(
            matches!(transition(&s, at_expiry, NOW), Ok(Transition::Claim { claim_expires_at, .. }) if claim_expires_at == NOW + 100)
        );
        let past = Event::Claim {
            is_target: true,
            lease_secs: 101,
        };
        assert!(transition(&s, past, NOW).is_err());
        // A lease that ends now has ended; one that ends in a second has not.
        let ending = with(claimed(), |s| s.claim_expires_at = Some(NOW + 1));
        assert_eq!(
            transition(
                &ending,
                Event::Hold {
                    is_target: true,
                    token: "t"
                },
                NOW
            ),
            Ok(Transition::Hold)
        );
        let ended = with(claimed(), |s| s.claim_expires_at = Some(NOW));
        assert_eq!(
            transition(
                &ended,
                Event::Hold {
                    is_target: true,
                    token: "t"
                },
                NOW
            ),
            Err(Refusal::LeaseExpired)
        );
        // Backoff never overflows.
        let far = Event::Finish {
            is_target: true,
            token: "t",
            outcome: Outcome::Retry,
            backoff_secs: i64::MAX,
            fits: true,
        };
        assert_eq!(
            transition(&claimed(), far, NOW),
            Ok(Transition::Backoff {
                next_attempt_at: i64::MAX
            })
        );
    }
}
