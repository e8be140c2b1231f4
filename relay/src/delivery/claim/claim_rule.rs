//! The claim rule said once: every status, every way a row can be due
//! or not, every cap and every state of a mention's conversation, through
//! the machine (with the counts it loads) and through the claim paths on a
//! real SQLite file.

use super::{
    claim_by_name, claim_first, claim_named, claim_together, machine, Grant, NamedClaim, On, Transition,
};
use crate::config::DeliveryConfig;
use crate::persistence::db::{Tx, Q};
use crate::persistence::sqlite;
use crate::persistence::OpenMode;
use nostr::prelude::{Keys, PublicKey};
use protocol::api::DeliveryStatus as Status;
use protocol::api::Expected;

const NOW: i64 = 1_000_000;
const LEASE: i64 = 30;
const ALL: [Status; 6] = [
    Status::Pending,
    Status::Claimed,
    Status::Delivered,
    Status::Failed,
    Status::Expired,
    Status::Cancelled,
];

/// One row to claim: its status and times, and whether the claimer is
/// its target.
#[derive(Debug, Clone, Copy)]
struct Case {
    status: Status,
    is_target: bool,
    next_attempt_at: i64,
    expires_at: i64,
    revising: bool,
    caps: Caps,
    talk: Talk,
}

/// The case's row's conversation, and what else of it is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Talk {
    /// A workflow's row: no conversation.
    Alone,
    /// A mention with nothing else open in its conversation.
    Quiet,
    /// Another row of its conversation is claimed (a turn holds it).
    Held,
    /// Another row of it is pending, not yet due (its debounce), and the
    /// case's row is fresh.
    Speaking,
    /// As `Speaking`, but the case's row has waited its longest
    /// (`mention_max_wait_secs`): the conversation is taken anyway.
    SpeakingLong,
}

/// The clock less the longest wait of a mention ([`Grant`]'s).
const WAITED_SINCE: i64 = NOW - 10;

/// The caps a case's row is under, and whether one claimed row of the
/// same workflow and agent is held already.
#[derive(Debug, Clone, Copy)]
struct Caps {
    workflow: Option<i64>,
    agent: Option<i64>,
    held: bool,
}

const CAPS: [Caps; 5] = [
    Caps {
        workflow: None,
        agent: None,
        held: false,
    },
    Caps {
        workflow: None,
        agent: None,
        held: true,
    },
    Caps {
        workflow: Some(1),
        agent: None,
        held: true,
    },
    Caps {
        workflow: None,
        agent: Some(1),
        held: true,
    },
    Caps {
        workflow: Some(2),
        agent: Some(2),
        held: true,
    },
];

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for status in ALL {
        for is_target in [true, false] {
            for next_attempt_at in [NOW - 1, NOW, NOW + 1] {
                for expires_at in [NOW - 1, NOW, NOW + LEASE - 1, NOW + LEASE, NOW + 1_000] {
                    for revising in [false, true] {
                        for (k, caps) in CAPS.into_iter().enumerate() {
                            // Conversations under no cap: a mention has none.
                            let talks: &[Talk] = if k == 0 {
                                &[
                                    Talk::Alone,
                                    Talk::Quiet,
                                    Talk::Held,
                                    Talk::Speaking,
                                    Talk::SpeakingLong,
                                ]
                            } else {
                                &[Talk::Alone]
                            };
                            for &talk in talks {
                                out.push(Case {
                                    status,
                                    is_target,
                                    next_attempt_at,
                                    expires_at,
                                    revising,
                                    caps,
                                    talk,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

fn machine_claims(c: &Case) -> Option<Transition> {
    let state = machine::State {
        status: c.status,
        attempt: 1,
        max_attempts: 3,
        claim_token: (c.status == Status::Claimed).then_some("held"),
        claim_expires_at: (c.status == Status::Claimed).then_some(NOW + 5),
        next_attempt_at: c.next_attempt_at,
        expires_at: c.expires_at,
        records_operations: false,
        revising: c.revising,
        in_flight: machine::InFlight {
            workflow: i64::from(c.caps.held),
            workflow_cap: c.caps.workflow,
            agent: i64::from(c.caps.held),
            agent_cap: c.caps.agent,
        },
        conversation_busy: matches!(c.talk, Talk::Held | Talk::Speaking),
    };
    let asked = On::Claim {
        is_target: c.is_target,
        lease_secs: LEASE,
    };
    match machine::transition(&state, asked, NOW) {
        Ok(t @ Transition::Claim { .. }) => Some(t),
        _ => None,
    }
}

async fn insert(tx: &mut Tx<'_>, community: &str, target: &PublicKey, c: &Case) {
    let q = Q::new(
        "INSERT INTO workflow_agent_deliveries (community_id, id, workflow_id, run_id, step_id, \
         target_pubkey, channel, definition_event_id, message_event_id, message_created_at, status, \
         attempt, max_attempts, claim_token, claim_expires_at, next_attempt_at, expires_at, \
         trigger_context, execution_trace, created_at, updated_at, output_errors, concurrency, conversation) \
         VALUES ($1, 'd', 'w', 'r', 's', $2, 'ch', $3, $4, 1, $5, 1, 3, $6, $7, $8, $9, '{}', '[]', $13, 1, $10, $11, $12)",
    )
    .bind(community)
    .bind(target.to_bytes())
    .bind(vec![1u8; 32])
    .bind(vec![2u8; 32])
    .bind(c.status.as_str())
    .bind(crate::persistence::sql::Bind::OptText((c.status == Status::Claimed).then(|| "held".to_string())))
    .bind((c.status == Status::Claimed).then_some(NOW + 5))
    .bind(c.next_attempt_at)
    .bind(c.expires_at)
    .bind(crate::persistence::sql::Bind::OptText(c.revising.then(|| "refused".to_string())))
    .bind(crate::persistence::sql::Bind::OptInt(c.caps.workflow))
    .bind(if c.talk == Talk::Alone { "" } else { "ch" })
    // Stored long ago, but while its conversation speaks on: now.
    .bind(if c.talk == Talk::Speaking { NOW } else { WAITED_SINCE - 1 });
    tx.exec(q).await.expect("insert");
    if matches!(c.talk, Talk::Held | Talk::Speaking | Talk::SpeakingLong) {
        let (status, token, due) = match c.talk {
            Talk::Held => ("claimed", Some("other".to_string()), NOW - 5),
            _ => ("pending", None, NOW + 5),
        };
        let q = Q::new(
            "INSERT INTO workflow_agent_deliveries (community_id, id, workflow_id, run_id, step_id, \
             target_pubkey, channel, definition_event_id, message_event_id, message_created_at, status, \
             attempt, max_attempts, claim_token, claim_expires_at, next_attempt_at, expires_at, \
             trigger_context, execution_trace, created_at, updated_at, conversation) \
             VALUES ($1, 'talk', '', 'r', 'talk', $2, 'ch', $3, $4, 1, $5, 1, 3, $6, $7, $8, $9, \
             '{}', '[]', $10, 0, 'ch')",
        )
        .bind(community)
        .bind(target.to_bytes())
        .bind(vec![1u8; 32])
        .bind(vec![4u8; 32])
        .bind(status)
        .bind(crate::persistence::sql::Bind::OptText(token))
        .bind((c.talk == Talk::Held).then_some(NOW + 5))
        .bind(due)
        .bind(NOW + 1_000)
        // Said just now: the conversation speaks on.
        .bind(NOW);
        tx.exec(q).await.expect("insert the conversation's other row");
    }
    if c.caps.held {
        let q = Q::new(
            "INSERT INTO workflow_agent_deliveries (community_id, id, workflow_id, run_id, step_id, \
             target_pubkey, channel, definition_event_id, message_event_id, message_created_at, status, \
             attempt, max_attempts, claim_token, claim_expires_at, next_attempt_at, expires_at, \
             trigger_context, execution_trace, created_at, updated_at) \
             VALUES ($1, 'held', 'w', 'r', 'held', $2, 'ch', $3, $4, 1, 'claimed', 1, 3, 'other', $5, 0, $6, \
             '{}', '[]', 0, 0)",
        )
        .bind(community)
        .bind(target.to_bytes())
        .bind(vec![1u8; 32])
        .bind(vec![3u8; 32])
        .bind(NOW + 5)
        .bind(NOW + 1_000);
        tx.exec(q).await.expect("insert the held row");
    }
}

/// The relay's settings a case's claim is made under: its agent cap, and
/// [`WAITED_SINCE`] (as [`grant`]).
fn config(c: &Case) -> DeliveryConfig {
    DeliveryConfig {
        agent_concurrency: c.caps.agent.map_or(0, |cap| cap as u32),
        mention_max_wait_secs: (NOW - WAITED_SINCE) as u32,
        max_lease_secs: LEASE as u64,
        ..Default::default()
    }
}

fn grant(c: &Case) -> Grant {
    Grant {
        token: "new".into(),
        claim_expires_at: NOW + LEASE,
        records_operations: true,
        now: NOW,
        agent_cap: c.caps.agent,
        waited_since: WAITED_SINCE,
    }
}

/// A fresh SQLite store whose rows stand alone: no run, message or
/// definition behind them (its directory is kept with it).
async fn store() -> (tempfile::TempDir, sqlite::Opened) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("claims.db").display());
    let opened = sqlite::open(&url, &Default::default(), OpenMode::Create)
        .await
        .expect("open");
    opened
        .writer
        .exec(&Q::new("PRAGMA foreign_keys = OFF"))
        .await
        .unwrap();
    (dir, opened)
}

/// The bindings every inserted row has, as its wake would say them.
fn expected() -> Expected {
    Expected {
        run_id: "r".into(),
        step_id: "s".into(),
        definition_event_id: hex::encode([1u8; 32]),
        message_event_id: hex::encode([2u8; 32]),
        channel: "ch".into(),
    }
}

/// The claim by name of row `d` of `community`, as its wake said, on its
/// own (`None` too when refused).
async fn by_name(tx: &mut Tx<'_>, community: &str, caller: &PublicKey, case: &Case) -> Option<super::Turn> {
    claim_by_name(tx, community, caller, "d", Some(&expected()), LEASE, &grant(case))
        .await
        .unwrap_or(None)
}

#[tokio::test]
async fn the_machine_and_both_claim_statements_agree_on_every_row() {
    let (_dir, opened) = store().await;
    let mut tx = Tx::SqliteWrite(opened.writer.begin().await.unwrap());
    let (caller, other) = (Keys::generate().public_key(), Keys::generate().public_key());
    let expected = expected();
    let mut claimed = 0;
    for (i, case) in cases().iter().enumerate() {
        let decided = machine_claims(case);
        let target = if case.is_target { caller } else { other };
        let (named, oldest, loaded) = (format!("named{i}"), format!("oldest{i}"), format!("loaded{i}"));
        let joint = format!("joint{i}");
        insert(&mut tx, &joint, &target, case).await;
        insert(&mut tx, &named, &target, case).await;
        insert(&mut tx, &oldest, &target, case).await;
        insert(&mut tx, &loaded, &target, case).await;
        // A batch's statement of claims by name, then (for what it left)
        // the claim on its own, as the call writer makes them.
        let req = protocol::api::ClaimRequest {
            delivery_id: Some("d".into()),
            expected: Some(expected.clone()),
            lease_seconds: Some(LEASE as u64),
            records_operations: Some(true),
        };
        let one = [NamedClaim {
            community: &joint,
            caller: &caller,
            req: &req,
        }];
        let together = claim_together(&mut tx, &one, &config(case), NOW)
            .await
            .expect("claims together")
            .pop()
            .flatten();
        let alone = case.caps.workflow.is_none() && case.talk == Talk::Alone;
        assert_eq!(
            together.is_some(),
            decided.is_some() && alone,
            "together: {case:?}"
        );
        let by_joint = match together {
            Some(turn) => Some(turn),
            None => by_name(&mut tx, &joint, &caller, case).await,
        };
        let by_id = by_name(&mut tx, &named, &caller, case).await;
        let by_age = claim_first(&mut tx, &oldest, &caller, LEASE, &grant(case))
            .await
            .expect("claim oldest");
        // The machine's own path, with the counts it loads.
        let by_machine = claim_named(&mut tx, &loaded, &caller, "d", None, LEASE, &grant(case))
            .await
            .unwrap_or(None);
        let paths = [
            ("together", by_joint),
            ("by id", by_id),
            ("oldest", by_age),
            ("loaded", by_machine),
        ];
        for (path, got) in paths {
            if let Some(turn) = &got {
                assert!(turn.joined.is_empty(), "{path}: nothing else is due in {case:?}");
            }
            let got = got.map(|t| t.lead).map(|d| Transition::Claim {
                attempt: d.attempt,
                claim_expires_at: d.claim_expires_at.expect("a lease"),
            });
            assert_eq!(got, decided, "{path}: {case:?}");
        }
        claimed += usize::from(decided.is_some());
    }
    // Due, alive with room for the lease, pending, the caller's: 2 x 2,
    // under no cap, or under caps with room (3 of the 5 cap cases), and
    // a mention alone in its conversation or that waited its longest.
    assert_eq!(claimed, 4 * 3 + 4 * 2);
}

#[tokio::test]
async fn one_statement_claims_each_callers_row_and_leaves_the_rest() {
    let (_dir, opened) = store().await;
    let mut tx = Tx::SqliteWrite(opened.writer.begin().await.unwrap());
    let due = Case {
        status: Status::Pending,
        is_target: true,
        next_attempt_at: NOW,
        expires_at: NOW + 1_000,
        revising: false,
        caps: CAPS[0],
        talk: Talk::Alone,
    };
    let callers: Vec<PublicKey> = (0..4).map(|_| Keys::generate().public_key()).collect();
    // A community each; the third caller's row is not due; the fourth
    // caller names the first one's row.
    let places = ["a", "b", "c", "a"];
    for (k, (pk, community)) in callers.iter().zip(places).enumerate() {
        let case = Case {
            next_attempt_at: if k == 2 { NOW + 1 } else { NOW },
            ..due
        };
        if k < 3 {
            insert(&mut tx, community, pk, &case).await;
        }
    }
    let expected = expected();
    let req = protocol::api::ClaimRequest {
        delivery_id: Some("d".into()),
        expected: Some(expected),
        lease_seconds: Some(LEASE as u64),
        records_operations: None,
    };
    let claims: Vec<NamedClaim<'_>> = callers
        .iter()
        .zip(places)
        .map(|(caller, community)| NamedClaim {
            community,
            caller,
            req: &req,
        })
        .collect();
    let got = claim_together(&mut tx, &claims, &config(&due), NOW)
        .await
        .expect("claims together");
    let leads: Vec<Option<&super::Delivery>> = got.iter().map(|t| t.as_ref().map(|t| &t.lead)).collect();
    assert!(leads[0].is_some_and(|d| d.target == callers[0].to_bytes()));
    assert!(leads[1].is_some_and(|d| d.target == callers[1].to_bytes()));
    assert!(leads[2].is_none(), "not due");
    assert!(leads[3].is_none(), "another agent's row");
    let (a, b) = (leads[0].unwrap(), leads[1].unwrap());
    assert_ne!(a.claim_token, b.claim_token, "a token each");
    assert_eq!(a.claim_expires_at, Some(NOW + LEASE));
    // Claimed: a second statement takes neither again.
    let again = claim_together(&mut tx, &claims[..2], &config(&due), NOW)
        .await
        .expect("claims together");
    assert!(again.iter().all(Option::is_none));
}
