//! The machine's table tests: every edge, the stale-holder fences, the
//! operator's edges and the lease arithmetic.

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
        conversation_busy: false,
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
        (
            "claim while its conversation holds a turn or waits out its debounce",
            with(pending(), |s| s.conversation_busy = true),
            claim_as(true),
            Ok(T::NotDue),
        ),
        (
            "a busy conversation does not hide a row from another agent's claim",
            with(pending(), |s| s.conversation_busy = true),
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
