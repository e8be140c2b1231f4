//! The delivery calls and the sweeper: each loads the row, asks the state
//! machine (`machine::transition`, docs/protocol.md "The state machine") what to do, and
//! applies it in SQL whose conditions re-check the state it leaves.
//!
//! Every terminal failure or expiry posts one relay-signed notice in the
//! channel, in the transaction that makes the transition (so exactly once).

use nostr::prelude::{Event, Keys, PublicKey, Tag};
use protocol::api::{
    ClaimedDelivery, DeliveryStatus as Status, DeliveryView, OperationRequest, Outcome, RenewRequest,
};
use serde_json::Value;
use std::sync::LazyLock;

use crate::persistence::db::{named, Dialect, Row, Tx, Q};
use crate::events::rules as events;
use crate::events::rules::{author_lock_key};
use crate::delivery::machine;
use crate::delivery::machine::{Claimable, Event as On, Failure, Transition, CLAIM_RULE};
use crate::events::InsertOutcome;
use crate::persistence::StoreError;
use crate::config::DeliveryConfig;
use crate::faults;

pub use crate::refusal::{Answer, Refusal};
pub use protocol::api::{ClaimRequest, Expected, FinishRequest};

const COLS: &str = "id, workflow_id, run_id, step_id, target_pubkey, channel, definition_event_id, \
    message_event_id, status, attempt, max_attempts, claim_token, claim_expires_at, records_operations, \
    next_attempt_at, expires_at, trigger_context, execution_trace, failure_code, failure_message, \
    reply_event_id, finished_token, finished_outcome, finished_status, created_at, updated_at, awaited";

/// A delivery row.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: String,
    pub workflow_id: String,
    pub run_id: String,
    pub step_id: String,
    pub target: [u8; 32],
    pub channel: String,
    pub definition_event_id: [u8; 32],
    pub message_event_id: [u8; 32],
    pub status: Status,
    pub attempt: i64,
    pub max_attempts: i64,
    pub claim_token: Option<String>,
    pub claim_expires_at: Option<i64>,
    pub records_operations: bool,
    pub next_attempt_at: i64,
    pub expires_at: i64,
    pub trigger_context: String,
    pub execution_trace: String,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub reply_event_id: Option<Vec<u8>>,
    pub finished_token: Option<String>,
    pub finished_outcome: Option<Outcome>,
    pub finished_status: Option<Status>,
    pub created_at: i64,
    pub updated_at: i64,
    /// A row of an `ask_agent` step: its end wakes the waiting run.
    pub awaited: bool,
}

fn delivery(r: &Row) -> Result<Delivery, StoreError> {
    let status = |c| -> Result<Option<Status>, StoreError> {
        r.opt_text(c)?.map(|s| named(&s, Status::parse)).transpose()
    };
    Ok(Delivery {
        id: r.text("id")?,
        workflow_id: r.text("workflow_id")?,
        run_id: r.text("run_id")?,
        step_id: r.text("step_id")?,
        target: r.id32("target_pubkey")?,
        channel: r.text("channel")?,
        definition_event_id: r.id32("definition_event_id")?,
        message_event_id: r.id32("message_event_id")?,
        status: named(&r.text("status")?, Status::parse)?,
        attempt: r.int("attempt")?,
        max_attempts: r.int("max_attempts")?,
        claim_token: r.opt_text("claim_token")?,
        claim_expires_at: r.opt_int("claim_expires_at")?,
        records_operations: r.bool("records_operations")?,
        next_attempt_at: r.int("next_attempt_at")?,
        expires_at: r.int("expires_at")?,
        trigger_context: r.text("trigger_context")?,
        execution_trace: r.text("execution_trace")?,
        failure_code: r.opt_text("failure_code")?,
        failure_message: r.opt_text("failure_message")?,
        reply_event_id: r.opt_blob("reply_event_id")?,
        finished_token: r.opt_text("finished_token")?,
        finished_outcome: r
            .opt_text("finished_outcome")?
            .map(|o| named(&o, Outcome::parse))
            .transpose()?,
        finished_status: status("finished_status")?,
        created_at: r.int("created_at")?,
        updated_at: r.int("updated_at")?,
        awaited: r.bool("awaited")?,
    })
}

impl Delivery {
    /// What the state machine needs of this row.
    pub fn state(&self) -> machine::State<'_> {
        machine::State {
            status: self.status,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            claim_token: self.claim_token.as_deref(),
            claim_expires_at: self.claim_expires_at,
            next_attempt_at: self.next_attempt_at,
            expires_at: self.expires_at,
            records_operations: self.records_operations,
        }
    }

    /// Whether `caller` is the row's target.
    pub(crate) fn for_caller(&self, caller: &PublicKey) -> bool {
        self.target == caller.to_bytes()
    }

    /// The claim answer (docs/protocol.md, "Deliveries"); `None` for a row that
    /// is not claimed (it has no token).
    pub fn claim_view(&self) -> Option<ClaimedDelivery> {
        Some(ClaimedDelivery {
            id: self.id.clone(),
            workflow_id: self.workflow_id.clone(),
            run_id: self.run_id.clone(),
            step_id: self.step_id.clone(),
            definition_event_id: hex::encode(self.definition_event_id),
            message_event_id: hex::encode(self.message_event_id),
            channel: self.channel.clone(),
            target_pubkey: hex::encode(self.target),
            attempt: u32::try_from(self.attempt).unwrap_or(u32::MAX),
            claim_token: self.claim_token.clone()?,
            claim_expires_at: self.claim_expires_at?,
            expires_at: self.expires_at,
            trigger_context: serde_json::from_str::<Value>(&self.trigger_context).unwrap_or(Value::Null),
            execution_trace: serde_json::from_str::<Value>(&self.execution_trace).unwrap_or(Value::Null),
        })
    }

    /// The listing view (no token, no private snapshot).
    pub fn list_view(&self) -> DeliveryView {
        DeliveryView {
            id: self.id.clone(),
            workflow_id: self.workflow_id.clone(),
            run_id: self.run_id.clone(),
            step_id: self.step_id.clone(),
            channel: self.channel.clone(),
            target_pubkey: hex::encode(self.target),
            definition_event_id: hex::encode(self.definition_event_id),
            message_event_id: hex::encode(self.message_event_id),
            status: self.status,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            next_attempt_at: self.next_attempt_at,
            claim_expires_at: self.claim_expires_at,
            expires_at: self.expires_at,
            failure_code: self.failure_code.clone(),
            failure_message: self.failure_message.clone(),
            reply_event_id: self.reply_event_id.as_ref().map(hex::encode),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

pub(crate) async fn load(tx: &mut Tx<'_>, community: &str, id: &str) -> Result<Option<Delivery>, StoreError> {
    Ok(load_with_membership(tx, community, id).await?.map(|(d, _)| d))
}

/// A row (locked on PostgreSQL) and whether its target is a member of its
/// channel, in one statement: a finish needs both. (A finish's reply is
/// stored under its author's lock, which its call batch took up front:
/// `Call::lock_keys`.)
async fn load_with_membership(
    tx: &mut Tx<'_>,
    community: &str,
    id: &str,
) -> Result<Option<(Delivery, bool)>, StoreError> {
    let row_lock = if tx.dialect() == Dialect::Postgres {
        " FOR UPDATE"
    } else {
        ""
    };
    let q = Q::new(format!(
        "SELECT {COLS}, EXISTS (SELECT 1 FROM channel_members m WHERE m.community_id = d.community_id \
         AND m.channel_id = d.channel AND m.pubkey = d.target_pubkey) AS member \
         FROM workflow_agent_deliveries d WHERE d.community_id = $1 AND d.id = $2{row_lock}"
    ))
    .bind(community)
    .bind(id);
    match tx.one(q).await? {
        Some(row) => Ok(Some((delivery(&row)?, row.bool("member")?))),
        None => Ok(None),
    }
}

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

fn lease_of(req_lease: Option<u64>, cfg: &DeliveryConfig) -> Result<i64, Refusal> {
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
const IS_PENDING: &str = "status IS NOT DISTINCT FROM 'pending'";
/// See [`IS_PENDING`].
const IS_CLAIMED: &str = "status IS NOT DISTINCT FROM 'claimed'";

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

/// Extends a lease. Its one write is its last statement, after every
/// refusal (see [`claim`]).
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
/// one write is its last statement, after every refusal (see [`claim`]).
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

/// Operations recorded for a delivery, in order: (attempt, name, effect).
pub async fn operations(
    tx: &mut Tx<'_>,
    community: &str,
    id: &str,
) -> Result<Vec<(i64, String, String)>, StoreError> {
    let rows = tx
        .all(
            Q::new(
                "SELECT attempt, name, effect FROM delivery_operations WHERE community_id = $1 AND delivery_id = $2 \
                 ORDER BY attempt, seq",
            )
            .bind(community)
            .bind(id),
        )
        .await?;
    rows.iter()
        .map(|r| Ok((r.int("attempt")?, r.text("name")?, r.text("effect")?)))
        .collect()
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
    let text = format!(
        "Workflow {} could not be delivered to agent {target} (delivery {}, step {}): {code}",
        d.workflow_id, d.id, d.step_id
    );
    let tags = vec![
        Tag::custom("workflow-delivery-failed", [d.id.as_str(), code]),
        Tag::custom("e", [hex::encode(d.message_event_id)]),
        Tag::custom("workflow-run", [d.run_id.as_str()]),
    ];
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
             claim_token = NULL, updated_at = $6 WHERE community_id = $1 AND id = $2",
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
    let now = tx.now().await?;
    let Some((d, member)) = load_with_membership(tx, community, id).await? else {
        return Err(Refusal::NoDelivery.into());
    };
    if !d.for_caller(caller) {
        return Err(Refusal::NotTarget.into());
    }
    if let Some(status) = d.finished_as(req) {
        return Ok(Finished {
            status,
            published: Vec::new(),
            woke_run: false,
        });
    }
    let asked = On::Finish {
        is_target: true,
        token: &req.claim_token,
        outcome: req.outcome,
        backoff_secs: backoff_after(cfg, d.attempt),
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
    let applied = apply(tx, community, keys, &d, decided, agent_failure(req), now).await?;
    published.extend(applied.notice);
    let status = applied.status;
    record_finish(tx, community, id, req, status, reply_id, now).await?;
    faults::check("finish:after_status")?;
    Ok(Finished {
        status,
        published,
        woke_run: applied.poked,
    })
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
async fn apply(
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

/// One of a waiting run's current-step deliveries ended (called in the
/// transaction that ends it): the run's wake row, taken by the engine
/// (`workflow::runs`) when it looks at the run. One wake
/// row per delivery (a delivery ends once), so two finishes never write
/// the same row.
pub async fn poke(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    delivery_id: &str,
) -> Result<(), StoreError> {
    tx.exec(
        Q::new(
            "INSERT INTO workflow_run_wakes (community_id, run_id, delivery_id) VALUES ($1, $2, $3) \
             ON CONFLICT DO NOTHING",
        )
        .bind(community)
        .bind(run_id)
        .bind(delivery_id),
    )
    .await?;
    Ok(())
}

/// What [`apply`] did: the row's new status, its notice, and whether it
/// woke a waiting run.
struct Applied {
    status: Status,
    notice: Option<(Event, String)>,
    poked: bool,
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
fn counted(to: Status, code: &str) {
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
        .bind(agent.1.clone()),
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

/// Expires unclaimed rows past their lifetime and ends lapsed leases.
/// Returns notices to announce. Safe in several processes at once: every
/// transition re-checks the state it leaves.
pub async fn sweep(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    cfg: &DeliveryConfig,
) -> Result<Vec<(Event, String)>, StoreError> {
    // The community key first: every transition below may sign a notice
    // with it, and a finish batch takes it before the rows it waits for
    // (`Call::lock_keys`); taken after this sweep's rows, the two could
    // each hold what the other waits for.
    tx.lock(&author_lock_key(community, &keys.public_key())).await?;
    let now = tx.now().await?;
    let batch = i64::from(cfg.sweep_batch);
    let mut published = Vec::new();
    for d in due(tx, community, "status = 'pending' AND expires_at", now, batch).await? {
        let decided = sweep_decision(&d, On::LifetimeOver, now);
        published.extend(
            apply(tx, community, keys, &d, decided, ("", None), now)
                .await?
                .notice,
        );
        faults::check("sweep:after_transition")?;
    }
    for d in due(
        tx,
        community,
        "status = 'claimed' AND claim_expires_at",
        now,
        batch,
    )
    .await?
    {
        let wrote = wrote_in_attempt(tx, community, &d).await?;
        let decided = sweep_decision(&d, On::LeaseLapsed { wrote }, now);
        published.extend(
            apply(tx, community, keys, &d, decided, ("", None), now)
                .await?
                .notice,
        );
        faults::check("sweep:after_transition")?;
    }
    Ok(published)
}

/// The machine's decision on a sweeper's event, which is never refused
/// (only a caller's calls are fenced).
fn sweep_decision(d: &Delivery, event: On<'_>, now: i64) -> Transition {
    machine::transition(&d.state(), event, now).expect("the sweeper's events are not fenced")
}

/// Up to `batch` rows in a state whose deadline column (`state_and_deadline`
/// ends with it) is at or before `now`, oldest deadline first; on
/// PostgreSQL rows another sweeper holds are skipped.
async fn due(
    tx: &mut Tx<'_>,
    community: &str,
    state_and_deadline: &str,
    now: i64,
    batch: i64,
) -> Result<Vec<Delivery>, StoreError> {
    let lock = if tx.dialect() == Dialect::Postgres {
        " FOR UPDATE SKIP LOCKED"
    } else {
        ""
    };
    let deadline = state_and_deadline.rsplit(' ').next().unwrap_or_default();
    let rows = tx
        .all(
            Q::new(format!(
                "SELECT {COLS} FROM workflow_agent_deliveries WHERE community_id = $1 AND {state_and_deadline} <= $2 \
                 ORDER BY {deadline} LIMIT $3{lock}"
            ))
            .bind(community)
            .bind(now)
            .bind(batch),
        )
        .await?;
    rows.iter().map(delivery).collect()
}

/// Whether the row's current attempt recorded a write.
async fn wrote_in_attempt(tx: &mut Tx<'_>, community: &str, d: &Delivery) -> Result<bool, StoreError> {
    tx.exists(
        Q::new(
            "SELECT 1 FROM delivery_operations WHERE community_id = $1 AND delivery_id = $2 \
             AND attempt = $3 AND effect = 'write'",
        )
        .bind(community)
        .bind(d.id.as_str())
        .bind(d.attempt),
    )
    .await
}

/// Which deliveries a listing shows (every field narrows it).
#[derive(Debug, Default, Clone)]
pub struct ListFilter {
    pub target: Option<PublicKey>,
    pub status: Option<Status>,
    pub workflow: Option<String>,
    pub run: Option<String>,
    /// Only the workflows this pubkey owns.
    pub owner: Option<PublicKey>,
    /// Only rows created before this unix second.
    pub before: Option<i64>,
}

/// Deliveries, newest first.
pub async fn list(
    tx: &mut Tx<'_>,
    community: &str,
    f: &ListFilter,
    limit: u32,
) -> Result<Vec<Delivery>, StoreError> {
    let d = tx.dialect();
    let mut q = Q::new(format!(
        "SELECT {COLS} FROM workflow_agent_deliveries WHERE community_id = "
    ))
    .arg(d, community);
    if let Some(t) = &f.target {
        q = q.and(d, "target_pubkey =", t.to_bytes());
    }
    if let Some(s) = f.status {
        q = q.and(d, "status =", s.as_str());
    }
    if let Some(w) = &f.workflow {
        q = q.and(d, "workflow_id =", w.as_str());
    }
    if let Some(r) = &f.run {
        q = q.and(d, "run_id =", r.as_str());
    }
    if let Some(o) = &f.owner {
        q = q
            .push_text(" AND workflow_id IN (SELECT w.id FROM workflows w WHERE w.community_id = ")
            .arg(d, community)
            .and(d, "w.owner =", o.to_bytes())
            .push_text(")");
    }
    if let Some(b) = f.before {
        q = q.and(d, "created_at <", b);
    }
    let q = q
        .push_text(" ORDER BY created_at DESC, id DESC LIMIT ")
        .arg(d, i64::from(limit));
    tx.all(q).await?.iter().map(delivery).collect()
}

/// What an admin or the workflow's owner does to a row: `canceldelivery`
/// ([`On::OperatorCancel`]) or `retrydelivery` ([`On::Redrive`]), as the
/// machine decides; `why` is the cancelled row's failure message. Returns
/// the row's new status.
pub(crate) async fn operate(
    tx: &mut Tx<'_>,
    community: &str,
    d: &Delivery,
    event: On<'_>,
    now: i64,
    why: &str,
) -> Answer<Status> {
    let q = match machine::transition(&d.state(), event, now)? {
        Transition::Cancel => Q::new(
            "UPDATE workflow_agent_deliveries SET status = 'cancelled', failure_code = 'cancelled_by_operator', \
             failure_message = $4, claim_token = NULL, updated_at = $5 \
             WHERE community_id = $1 AND id = $2 AND status = $3",
        )
        .bind(community)
        .bind(d.id.as_str())
        .bind(d.status.as_str())
        .bind(why)
        .bind(now),
        Transition::Redrive {
            max_attempts,
            expires_at,
        } => Q::new(
            "UPDATE workflow_agent_deliveries SET status = 'pending', claim_token = NULL, \
             claim_expires_at = NULL, next_attempt_at = $5, expires_at = $6, max_attempts = $4, \
             failure_code = NULL, failure_message = NULL, updated_at = $5 \
             WHERE community_id = $1 AND id = $2 AND status = $3",
        )
        .bind(community)
        .bind(d.id.as_str())
        .bind(d.status.as_str())
        .bind(max_attempts)
        .bind(now)
        .bind(expires_at),
        other => return Err(StoreError::Corrupt(format!("not an operator's transition: {other:?}")).into()),
    };
    // The row was loaded locked (PostgreSQL) or under the write lock (SQLite).
    if tx.exec(q).await? != 1 {
        return Err(StoreError::Corrupt(format!("delivery {} changed under its lock", d.id)).into());
    }
    let (status, code) = match event {
        On::Redrive { .. } => (Status::Pending, "retried_by_operator"),
        _ => (Status::Cancelled, "cancelled_by_operator"),
    };
    counted(status, code);
    Ok(status)
}

/// One delivery by id with its attempts and operations.
pub async fn show(
    tx: &mut Tx<'_>,
    community: &str,
    id: &str,
) -> Result<Option<(Delivery, protocol::api::DeliveryDetail)>, StoreError> {
    let Some(d) = load(tx, community, id).await? else {
        return Ok(None);
    };
    let operations = operations(tx, community, id)
        .await?
        .into_iter()
        .map(|(attempt, name, effect)| protocol::api::OperationView {
            attempt,
            name,
            effect,
        })
        .collect();
    let attempts = attempts(tx, community, id).await?;
    let detail = protocol::api::DeliveryDetail {
        delivery: d.list_view(),
        attempts,
        operations,
    };
    Ok(Some((d, detail)))
}

/// Every attempt of a delivery, first first.
async fn attempts(
    tx: &mut Tx<'_>,
    community: &str,
    id: &str,
) -> Result<Vec<protocol::api::AttemptView>, StoreError> {
    let rows = tx
        .all(
            Q::new(
                "SELECT attempt, claimed_at, finished_at, outcome, failure_code, failure_message \
                 FROM delivery_attempts WHERE community_id = $1 AND delivery_id = $2 ORDER BY attempt",
            )
            .bind(community)
            .bind(id),
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(protocol::api::AttemptView {
                attempt: r.int("attempt")?,
                claimed_at: r.int("claimed_at")?,
                finished_at: r.opt_int("finished_at")?,
                outcome: r.opt_text("outcome")?,
                failure_code: r.opt_text("failure_code")?,
                failure_message: r.opt_text("failure_message")?,
            })
        })
        .collect()
}

#[cfg(test)]
mod claim_rule {
    //! The claim rule said once: every status and every way a row can be
    //! due or not, through the machine and through both claim statements
    //! on a real SQLite file.
    use crate::persistence::db::{Tx, Q};
    use crate::persistence::sqlite;
    use crate::persistence::OpenMode;
    use super::{claim_as_expected, claim_oldest, machine, Grant, On, Status, Transition};
    use nostr::prelude::{Keys, PublicKey};
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
    }

    fn cases() -> Vec<Case> {
        let mut out = Vec::new();
        for status in ALL {
            for is_target in [true, false] {
                for next_attempt_at in [NOW - 1, NOW, NOW + 1] {
                    for expires_at in [NOW - 1, NOW, NOW + LEASE - 1, NOW + LEASE, NOW + 1_000] {
                        out.push(Case {
                            status,
                            is_target,
                            next_attempt_at,
                            expires_at,
                        });
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
             trigger_context, execution_trace, created_at, updated_at) \
             VALUES ($1, 'd', 'w', 'r', 's', $2, 'ch', $3, $4, 1, $5, 1, 3, $6, $7, $8, $9, '{}', '[]', 1, 1)",
        )
        .bind(community)
        .bind(target.to_bytes())
        .bind(vec![1u8; 32])
        .bind(vec![2u8; 32])
        .bind(c.status.as_str())
        .bind(crate::persistence::sql::Bind::OptText((c.status == Status::Claimed).then(|| "held".to_string())))
        .bind((c.status == Status::Claimed).then_some(NOW + 5))
        .bind(c.next_attempt_at)
        .bind(c.expires_at);
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

#[cfg(test)]
mod tests {
    use crate::persistence::db::{Row, Val};
    use super::{delivery, Status, COLS};

    /// A stored row's values, by column.
    fn value(col: &str) -> Val {
        match col {
            "target_pubkey" | "definition_event_id" | "message_event_id" => Val::Blob(vec![7; 32]),
            "status" => Val::Text("claimed".into()),
            "attempt" | "max_attempts" | "next_attempt_at" | "expires_at" | "created_at" | "updated_at"
            | "claim_expires_at" => Val::Int(col.len() as i64),
            "records_operations" | "awaited" => Val::Bool(true),
            "reply_event_id" | "finished_token" | "finished_outcome" | "finished_status" | "failure_code"
            | "failure_message" => Val::Null,
            other => Val::Text(format!("{other}-value")),
        }
    }

    #[test]
    fn rows_are_decoded_by_name_in_any_column_order() {
        let cols: Vec<&str> = COLS.split(',').map(str::trim).collect();
        let in_order = Row::from_parts(&cols, cols.iter().map(|c| value(c)).collect());
        let reversed: Vec<&str> = cols.iter().rev().copied().collect();
        let backwards = Row::from_parts(&reversed, reversed.iter().map(|c| value(c)).collect());
        let (a, b) = (
            delivery(&in_order).expect("decodes"),
            delivery(&backwards).expect("decodes"),
        );
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_eq!(
            (a.id.as_str(), a.status, a.attempt),
            ("id-value", Status::Claimed, 7)
        );
        assert!(a.records_operations && a.finished_status.is_none());
        // A column the select list lacks is an error, not another column's value.
        let short = Row::from_parts(&cols[1..], cols[1..].iter().map(|c| value(c)).collect());
        assert!(delivery(&short).is_err());
    }
}
