//! Claims: the one statement per claim that the machine's claim rule
//! (`machine::CLAIM_RULE`) is written into, clause by clause, and the
//! named claim the machine decides from the loaded row.
//!
//! Its one write is its last statement (the call writer runs it without a
//! savepoint on SQLite: `store/group.rs`).

use nostr::prelude::PublicKey;
use std::sync::LazyLock;

use crate::config::DeliveryConfig;
use crate::delivery::machine;
use crate::delivery::machine::{Claimable, Event as On, Transition, CLAIM_RULE};
use crate::faults;
use crate::persistence::db::{Dialect, Tx, Q};
use crate::persistence::StoreError;

use super::rows::{delivery, load, Delivery, COLS};
pub use crate::refusal::{Answer, Refusal};
pub use protocol::api::{ClaimRequest, Expected, FinishRequest};

pub(crate) fn lease_of(req_lease: Option<u64>, cfg: &DeliveryConfig) -> Result<i64, Refusal> {
    let lease = req_lease.unwrap_or(cfg.default_lease_secs);
    if lease == 0 || lease > cfg.max_lease_secs {
        return Err(Refusal::BadLease {
            max_secs: cfg.max_lease_secs,
        });
    }
    Ok(i64::try_from(lease).unwrap_or(i64::MAX))
}

/// The status test of a statement that addresses one row by its key. It is
/// written `IS NOT DISTINCT FROM` rather than `=` (the column is NOT NULL, so
/// both mean the same) because PostgreSQL cannot prove a partial index's
/// predicate from it, and every partial index of the table is on `status`:
/// the row is then read by its key. With `=`, statistics gathered while no
/// delivery was pending make `deliveries_pending_expiry` look empty, and a
/// connection's cached plan then walks every pending row for each claim
/// (measured in a burst of 10,000 deliveries: 334 blocks a claim, 0.46 ms,
/// against 4 blocks by the key; docs/performance.md, "Plans that depend on a
/// quiet moment's statistics").
pub(crate) const IS_PENDING: &str = "status IS NOT DISTINCT FROM 'pending'";
/// See [`IS_PENDING`].
pub(crate) const IS_CLAIMED: &str = "status IS NOT DISTINCT FROM 'claimed'";

/// Where a claim statement binds the values the claim rule compares.
struct ClaimBinds {
    caller: &'static str,
    now: &'static str,
    lease_end: &'static str,
}

/// How a claim statement reaches its row: by its key (the status test that
/// no partial index's predicate follows from, [`IS_PENDING`]), or through
/// the index of pending rows.
#[derive(Clone, Copy)]
enum Reach {
    ByKey,
    ByPendingIndex,
}

/// The `WHERE` conditions of [`CLAIM_RULE`], clause by clause: the claim
/// statements' only statement of the rule the machine decides with.
fn claim_sql(b: &ClaimBinds, reach: Reach) -> String {
    let clause = |c: Claimable| match c {
        Claimable::Target => format!("target_pubkey = {}", b.caller),
        Claimable::Pending => match reach {
            Reach::ByKey => IS_PENDING.to_string(),
            Reach::ByPendingIndex => "status = 'pending'".to_string(),
        },
        Claimable::Due => format!("next_attempt_at <= {}", b.now),
        Claimable::LeaseFits => format!("expires_at >= {}", b.lease_end),
        Claimable::NotRevising => "output_errors IS NULL".to_string(),
    };
    CLAIM_RULE.map(clause).join(" AND ")
}

/// The claim of a named row whose bindings are as a wake said: `$1`
/// community, `$2` id, the grant `$3`..`$6`, `$7` caller, `$8`..`$12` the
/// expected run, step, channel, definition and message.
static CLAIM_AS_EXPECTED: LazyLock<String> = LazyLock::new(|| {
    let rule = claim_sql(
        &ClaimBinds {
            caller: "$7",
            now: "$6",
            lease_end: "$4",
        },
        Reach::ByKey,
    );
    format!(
        "UPDATE workflow_agent_deliveries {CLAIM_SET} WHERE community_id = $1 AND id = $2 AND {rule} \
         AND run_id = $8 AND step_id = $9 AND channel = $10 AND definition_event_id = $11 \
         AND message_event_id = $12 RETURNING {COLS}"
    )
});

/// The claim of the caller's oldest claimable row: `$1` community, `$2`
/// caller, the grant `$3`..`$6`; `{skip}` is where PostgreSQL skips rows
/// another claim holds.
fn claim_oldest_sql(skip: &str) -> String {
    let rule = claim_sql(
        &ClaimBinds {
            caller: "$2",
            now: "$6",
            lease_end: "$4",
        },
        Reach::ByPendingIndex,
    );
    format!(
        "UPDATE workflow_agent_deliveries {CLAIM_SET} WHERE community_id = $1 AND {IS_PENDING} AND id = (\
         SELECT id FROM workflow_agent_deliveries WHERE community_id = $1 AND {rule} \
         ORDER BY next_attempt_at, created_at, id LIMIT 1{skip}) RETURNING {COLS}"
    )
}

static CLAIM_OLDEST_SQLITE: LazyLock<String> = LazyLock::new(|| claim_oldest_sql(""));
static CLAIM_OLDEST_POSTGRES: LazyLock<String> =
    LazyLock::new(|| claim_oldest_sql(" FOR UPDATE SKIP LOCKED"));

/// Claims a delivery: the one named (with its expected bindings), or the
/// oldest due one of the caller. `Ok(None)` is "nothing to claim" (no change).
///
/// Its one write is its last statement, and every refusal comes before it
/// (the call writer runs it without a savepoint on SQLite: `group.rs`).
pub async fn claim(
    tx: &mut Tx<'_>,
    community: &str,
    caller: &PublicKey,
    req: &ClaimRequest,
    cfg: &DeliveryConfig,
) -> Answer<Option<Delivery>> {
    let lease = lease_of(req.lease_seconds, cfg)?;
    let now = tx.now().await?;
    // Test-only: a claim that fails in the database (see `group::run_batch`).
    faults::check("claim:error")?;
    let grant = Grant {
        token: hex::encode(rand::random::<[u8; 32]>()),
        claim_expires_at: now + lease,
        records_operations: req.records_operations.unwrap_or(false),
        now,
    };
    let Some(id) = &req.delivery_id else {
        return Ok(claim_oldest(tx, community, caller, &grant).await?);
    };
    if let Some(d) = claim_as_expected(tx, community, caller, id, req.expected.as_ref(), &grant).await? {
        return Ok(Some(d));
    }
    claim_named(tx, community, caller, id, req.expected.as_ref(), lease, &grant).await
}

/// What a claim grants: the new token and lease.
struct Grant {
    token: String,
    claim_expires_at: i64,
    records_operations: bool,
    /// The database clock.
    now: i64,
}

/// The `SET` of a claim; its binds are `$3`..`$6` ([`Grant::bind`]).
const CLAIM_SET: &str = "SET status = 'claimed', attempt = attempt + 1, claim_token = $3, \
                         claim_expires_at = $4, records_operations = $5, updated_at = $6";

impl Grant {
    fn bind(&self, q: Q) -> Q {
        q.bind(self.token.as_str())
            .bind(self.claim_expires_at)
            .bind(self.records_operations)
            .bind(self.now)
    }
}

/// The usual case, in one statement: the named row is the caller's, due,
/// bound as the wake said, and the lease ends within its lifetime. `None`
/// when any of that does not hold (sorted out by [`claim_named`]).
async fn claim_as_expected(
    tx: &mut Tx<'_>,
    community: &str,
    caller: &PublicKey,
    id: &str,
    expected: Option<&Expected>,
    grant: &Grant,
) -> Result<Option<Delivery>, StoreError> {
    let Some(e) = expected else {
        return Ok(None);
    };
    let (Ok(def), Ok(msg)) = (
        hex::decode(&e.definition_event_id),
        hex::decode(&e.message_event_id),
    ) else {
        return Ok(None);
    };
    let q = Q::new(CLAIM_AS_EXPECTED.as_str()).bind(community).bind(id);
    let q = grant
        .bind(q)
        .bind(caller.to_bytes())
        .bind(e.run_id.as_str())
        .bind(e.step_id.as_str())
        .bind(e.channel.as_str())
        .bind(def)
        .bind(msg);
    tx.one(q).await?.as_ref().map(delivery).transpose()
}

/// A named claim, from the loaded row: the machine decides, and the
/// expected bindings must match.
async fn claim_named(
    tx: &mut Tx<'_>,
    community: &str,
    caller: &PublicKey,
    id: &str,
    expected: Option<&Expected>,
    lease: i64,
    grant: &Grant,
) -> Answer<Option<Delivery>> {
    let d = load(tx, community, id).await?.ok_or(Refusal::NoDelivery)?;
    let asked = On::Claim {
        is_target: d.for_caller(caller),
        lease_secs: lease,
    };
    // Another agent's, or cancelled: refused before anything of the row is
    // compared (the caller learns nothing of its bindings).
    let decided = machine::transition(&d.state(), asked, grant.now);
    if let Err(r @ (Refusal::NotTarget | Refusal::Cancelled)) = decided {
        return Err(r.into());
    }
    if expected.is_some_and(|e| !d.bound_as(e)) {
        return Ok(None);
    }
    match decided? {
        Transition::NotDue => return Ok(None),
        t => debug_assert!(matches!(t, Transition::Claim { .. }), "{t:?}"),
    }
    let q = Q::new(format!(
        "UPDATE workflow_agent_deliveries {CLAIM_SET} WHERE community_id = $1 AND id = $2 AND {IS_PENDING} \
         RETURNING {COLS}"
    ))
    .bind(community)
    .bind(id);
    Ok(tx.one(grant.bind(q)).await?.as_ref().map(delivery).transpose()?)
}

/// The caller's oldest due row (rows another claim holds are skipped on
/// PostgreSQL).
async fn claim_oldest(
    tx: &mut Tx<'_>,
    community: &str,
    caller: &PublicKey,
    grant: &Grant,
) -> Result<Option<Delivery>, StoreError> {
    let sql = match tx.dialect() {
        Dialect::Postgres => CLAIM_OLDEST_POSTGRES.as_str(),
        Dialect::Sqlite => CLAIM_OLDEST_SQLITE.as_str(),
    };
    let q = Q::new(sql).bind(community).bind(caller.to_bytes());
    tx.one(grant.bind(q)).await?.as_ref().map(delivery).transpose()
}

impl Delivery {
    /// Whether the row is bound as a wake said (`expected`).
    fn bound_as(&self, e: &Expected) -> bool {
        e.run_id == self.run_id
            && e.step_id == self.step_id
            && e.channel == self.channel
            && e.definition_event_id
                .eq_ignore_ascii_case(&hex::encode(self.definition_event_id))
            && e.message_event_id
                .eq_ignore_ascii_case(&hex::encode(self.message_event_id))
    }
}

#[cfg(test)]
mod claim_rule {
    //! The claim rule said once: every status and every way a row can be
    //! due or not, through the machine and through both claim statements
    //! on a real SQLite file.
    use super::{claim_as_expected, claim_oldest, machine, Grant, On, Transition};
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
    }

    fn cases() -> Vec<Case> {
        let mut out = Vec::new();
        for status in ALL {
            for is_target in [true, false] {
                for next_attempt_at in [NOW - 1, NOW, NOW + 1] {
                    for expires_at in [NOW - 1, NOW, NOW + LEASE - 1, NOW + LEASE, NOW + 1_000] {
                        for revising in [false, true] {
                            out.push(Case {
                                status,
                                is_target,
                                next_attempt_at,
                                expires_at,
                                revising,
                            });
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
             trigger_context, execution_trace, created_at, updated_at, output_errors) \
             VALUES ($1, 'd', 'w', 'r', 's', $2, 'ch', $3, $4, 1, $5, 1, 3, $6, $7, $8, $9, '{}', '[]', 1, 1, $10)",
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
        .bind(crate::persistence::sql::Bind::OptText(c.revising.then(|| "refused".to_string())));
        tx.exec(q).await.expect("insert");
    }

    fn grant() -> Grant {
        Grant {
            token: "new".into(),
            claim_expires_at: NOW + LEASE,
            records_operations: true,
            now: NOW,
        }
    }

    #[tokio::test]
    async fn the_machine_and_both_claim_statements_agree_on_every_row() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("claims.db").display());
        let opened = sqlite::open(&url, &Default::default(), OpenMode::Create)
            .await
            .expect("open");
        // The rows stand alone: no run, message or definition behind them.
        opened
            .writer
            .exec(&Q::new("PRAGMA foreign_keys = OFF"))
            .await
            .unwrap();
        let mut tx = Tx::SqliteWrite(opened.writer.begin().await.unwrap());
        let (caller, other) = (Keys::generate().public_key(), Keys::generate().public_key());
        let expected = Expected {
            run_id: "r".into(),
            step_id: "s".into(),
            definition_event_id: hex::encode([1u8; 32]),
            message_event_id: hex::encode([2u8; 32]),
            channel: "ch".into(),
        };
        let mut claimed = 0;
        for (i, case) in cases().iter().enumerate() {
            let decided = machine_claims(case);
            let target = if case.is_target { caller } else { other };
            let (named, oldest) = (format!("named{i}"), format!("oldest{i}"));
            insert(&mut tx, &named, &target, case).await;
            insert(&mut tx, &oldest, &target, case).await;
            let by_id = claim_as_expected(&mut tx, &named, &caller, "d", Some(&expected), &grant())
                .await
                .expect("claim by id");
            let by_age = claim_oldest(&mut tx, &oldest, &caller, &grant())
                .await
                .expect("claim oldest");
            for (path, got) in [("by id", by_id), ("oldest", by_age)] {
                let got = got.map(|d| Transition::Claim {
                    attempt: d.attempt,
                    claim_expires_at: d.claim_expires_at.expect("a lease"),
                });
                assert_eq!(got, decided, "{path}: {case:?}");
            }
            claimed += usize::from(decided.is_some());
        }
        // Due, alive with room for the lease, pending, the caller's: 2 x 2.
        assert_eq!(claimed, 4);
    }
}
