//! The delivery state machine (PROTOCOL.md section 8), fenced by the
//! database clock.
//!
//! ```text
//! pending --claim--> claimed --finish delivered--> delivered
//!                      |  --finish retry (attempts left)--> pending (backoff)
//!                      |  --finish failed / retry (none left) / lease lapsed--> failed
//!                      |  --lease lapsed, recorded no write, attempts left--> pending
//! pending --lifetime over--> expired
//! pending|claimed --channel deleted / workflow disabled--> cancelled
//! ```
//!
//! Every renew, operation and finish matches community, id, target, token,
//! `status = 'claimed'` and an unexpired lease. Every terminal failure or
//! expiry posts one relay-signed notice in the channel, in the transaction
//! that makes the transition (so exactly once).

use nostr::prelude::{Event, Keys, PublicKey, Tag};
use protocol::api::{ClaimedDelivery, DeliveryStatus as Status, DeliveryView, Effect, Outcome};
use serde_json::Value;

use super::db::{Dialect, Row, Tx, Q};
use super::sqlstore::insert_event_tx;
use super::{InsertOutcome, StoreError};
use crate::config::DeliveryConfig;
use crate::faults;

pub use super::refusal::{Answer, Refusal};
pub use protocol::api::{ClaimRequest, Expected, FinishRequest};

const COLS: &str = "id, workflow_id, run_id, step_id, target_pubkey, channel, definition_event_id, \
    message_event_id, status, attempt, max_attempts, claim_token, claim_expires_at, records_operations, \
    next_attempt_at, expires_at, trigger_context, execution_trace, failure_code, failure_message, \
    reply_event_id, finished_token, finished_outcome, finished_status, created_at, updated_at";

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
}

/// How many columns [`COLS`] names.
const COLS_N: usize = 26;

/// A stored name (status, outcome) as its type.
fn named<T>(s: &str, parse: fn(&str) -> Option<T>) -> Result<T, StoreError> {
    parse(s).ok_or_else(|| StoreError::Corrupt(format!("unknown stored name {s:?}")))
}

fn delivery(r: &Row) -> Result<Delivery, StoreError> {
    Ok(Delivery {
        id: r.text(0)?,
        workflow_id: r.text(1)?,
        run_id: r.text(2)?,
        step_id: r.text(3)?,
        target: r.id32(4)?,
        channel: r.text(5)?,
        definition_event_id: r.id32(6)?,
        message_event_id: r.id32(7)?,
        status: named(&r.text(8)?, Status::parse)?,
        attempt: r.int(9)?,
        max_attempts: r.int(10)?,
        claim_token: r.opt_text(11)?,
        claim_expires_at: r.opt_int(12)?,
        records_operations: r.bool(13)?,
        next_attempt_at: r.int(14)?,
        expires_at: r.int(15)?,
        trigger_context: r.text(16)?,
        execution_trace: r.text(17)?,
        failure_code: r.opt_text(18)?,
        failure_message: r.opt_text(19)?,
        reply_event_id: match r.0.get(20) {
            Some(super::db::Val::Blob(b)) => Some(b.clone()),
            _ => None,
        },
        finished_token: r.opt_text(21)?,
        finished_outcome: r.opt_text(22)?.map(|o| named(&o, Outcome::parse)).transpose()?,
        finished_status: r.opt_text(23)?.map(|s| named(&s, Status::parse)).transpose()?,
        created_at: r.int(24)?,
        updated_at: r.int(25)?,
    })
}

impl Delivery {
    /// The claim answer (PROTOCOL.md section 7); `None` for a row that
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

async fn load(tx: &mut Tx<'_>, community: &str, id: &str) -> Result<Option<Delivery>, StoreError> {
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
         AND m.channel_id = d.channel AND m.pubkey = d.target_pubkey) \
         FROM workflow_agent_deliveries d WHERE d.community_id = $1 AND d.id = $2{row_lock}"
    ))
    .bind(community)
    .bind(id);
    match tx.one(q).await? {
        Some(row) => Ok(Some((delivery(&row)?, row.bool(COLS_N)?))),
        None => Ok(None),
    }
}

/// Loads a row for a holder's call and checks the fence; the refusal says
/// which part failed.
async fn fenced(
    tx: &mut Tx<'_>,
    community: &str,
    id: &str,
    caller: &PublicKey,
    token: &str,
    now: i64,
) -> Result<Answer<Delivery>, StoreError> {
    let Some(d) = load(tx, community, id).await? else {
        return Ok(Err(Refusal::NoDelivery));
    };
    Ok(check_fence(d, caller, token, now))
}

fn check_fence(d: Delivery, caller: &PublicKey, token: &str, now: i64) -> Answer<Delivery> {
    if d.target != caller.to_bytes() {
        return Err(Refusal::NotTarget);
    }
    if d.status == Status::Cancelled {
        return Err(Refusal::Cancelled);
    }
    if d.claim_token.as_deref() != Some(token) {
        return Err(Refusal::StaleToken);
    }
    if d.status != Status::Claimed {
        return Err(Refusal::NotClaimed(d.status));
    }
    if d.claim_expires_at.is_none_or(|t| t <= now) {
        return Err(Refusal::LeaseExpired);
    }
    Ok(d)
}

fn lease_of(req_lease: Option<u64>, cfg: &DeliveryConfig) -> Answer<i64> {
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
/// against 4 blocks by the key; `docs/performance.md`, seventh pass).
const IS_PENDING: &str = "status IS NOT DISTINCT FROM 'pending'";
/// See [`IS_PENDING`].
const IS_CLAIMED: &str = "status IS NOT DISTINCT FROM 'claimed'";

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
) -> Result<Answer<Option<Delivery>>, StoreError> {
    let lease = match lease_of(req.lease_seconds, cfg) {
        Ok(l) => l,
        Err(r) => return Ok(Err(r)),
    };
    let now = tx.now().await?;
    // Test-only: a claim that fails in the database (see `group::run_batch`).
    faults::check("claim:error")?;
    let token = hex::encode(rand::random::<[u8; 32]>());
    let records = req.records_operations.unwrap_or(false);
    let set = "SET status = 'claimed', attempt = attempt + 1, claim_token = $3, claim_expires_at = $4, \
               records_operations = $5, updated_at = $6";
    let claimed = if let Some(id) = &req.delivery_id {
        // The usual case, in one statement: the row is the caller's, due,
        // bound as the wake said, and the lease ends within its lifetime.
        // Anything else is sorted out below, from the loaded row.
        if let Some(e) = &req.expected {
            if let (Ok(def), Ok(msg)) = (
                hex::decode(&e.definition_event_id),
                hex::decode(&e.message_event_id),
            ) {
                let q = Q::new(format!(
                    "UPDATE workflow_agent_deliveries {set} WHERE community_id = $1 AND id = $2 AND {IS_PENDING} \
                     AND target_pubkey = $7 AND next_attempt_at <= $6 AND expires_at >= $4 AND run_id = $8 \
                     AND step_id = $9 AND channel = $10 AND definition_event_id = $11 AND message_event_id = $12 \
                     RETURNING {COLS}"
                ))
                .bind(community)
                .bind(id.as_str())
                .bind(token.as_str())
                .bind(now + lease)
                .bind(records)
                .bind(now)
                .bind(caller.to_bytes())
                .bind(e.run_id.as_str())
                .bind(e.step_id.as_str())
                .bind(e.channel.as_str())
                .bind(def)
                .bind(msg);
                if let Some(row) = tx.one(q).await? {
                    return Ok(Ok(Some(delivery(&row)?)));
                }
            }
        }
        let Some(d) = load(tx, community, id).await? else {
            return Ok(Err(Refusal::NoDelivery));
        };
        if d.target != caller.to_bytes() {
            return Ok(Err(Refusal::NotTarget));
        }
        if d.status == Status::Cancelled {
            return Ok(Err(Refusal::Cancelled));
        }
        if let Some(e) = &req.expected {
            let matches = e.run_id == d.run_id
                && e.step_id == d.step_id
                && e.channel == d.channel
                && e.definition_event_id
                    .eq_ignore_ascii_case(&hex::encode(d.definition_event_id))
                && e.message_event_id
                    .eq_ignore_ascii_case(&hex::encode(d.message_event_id));
            if !matches {
                return Ok(Ok(None));
            }
        }
        if d.status != Status::Pending || d.next_attempt_at > now || d.expires_at <= now {
            return Ok(Ok(None));
        }
        if now + lease > d.expires_at {
            return Ok(Err(Refusal::LeaseExceedsLifetime {
                expires_at: d.expires_at,
            }));
        }
        let q = Q::new(format!(
            "UPDATE workflow_agent_deliveries {set} WHERE community_id = $1 AND id = $2 AND {IS_PENDING} \
             RETURNING {COLS}"
        ))
        .bind(community)
        .bind(id.as_str());
        tx.one(q.bind(token).bind(now + lease).bind(records).bind(now))
            .await?
    } else {
        let skip = if tx.dialect() == Dialect::Postgres {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        let q = Q::new(format!(
            "UPDATE workflow_agent_deliveries {set} WHERE community_id = $1 AND {IS_PENDING} AND id = (\
             SELECT id FROM workflow_agent_deliveries WHERE community_id = $1 AND target_pubkey = $2 \
             AND status = 'pending' AND next_attempt_at <= $6 AND expires_at >= $4 \
             ORDER BY next_attempt_at, created_at, id LIMIT 1{skip}) RETURNING {COLS}"
        ))
        .bind(community)
        .bind(caller.to_bytes());
        tx.one(q.bind(token).bind(now + lease).bind(records).bind(now))
            .await?
    };
    Ok(Ok(claimed.as_ref().map(delivery).transpose()?))
}

/// Extends a lease. Its one write is its last statement, after every
/// refusal (see [`claim`]).
pub async fn renew(
    tx: &mut Tx<'_>,
    community: &str,
    caller: &PublicKey,
    id: &str,
    token: &str,
    lease_seconds: Option<u64>,
    cfg: &DeliveryConfig,
) -> Result<Answer<i64>, StoreError> {
    let lease = match lease_of(lease_seconds, cfg) {
        Ok(l) => l,
        Err(r) => return Ok(Err(r)),
    };
    let now = tx.now().await?;
    let d = match fenced(tx, community, id, caller, token, now).await? {
        Ok(d) => d,
        Err(r) => return Ok(Err(r)),
    };
    if now + lease > d.expires_at {
        return Ok(Err(Refusal::LeaseExceedsLifetime {
            expires_at: d.expires_at,
        }));
    }
    tx.exec(
        Q::new(format!(
            "UPDATE workflow_agent_deliveries SET claim_expires_at = $3, updated_at = $4 \
             WHERE community_id = $1 AND id = $2 AND {IS_CLAIMED} AND claim_token = $5"
        ))
        .bind(community)
        .bind(id)
        .bind(now + lease)
        .bind(now)
        .bind(token),
    )
    .await?;
    Ok(Ok(now + lease))
}

/// Records an operation of the current attempt (before it is done). Its
/// one write is its last statement, after every refusal (see [`claim`]).
#[allow(clippy::too_many_arguments)]
pub async fn record_operation(
    tx: &mut Tx<'_>,
    community: &str,
    caller: &PublicKey,
    id: &str,
    token: &str,
    name: &str,
    effect: Effect,
    cfg: &DeliveryConfig,
) -> Result<Answer<()>, StoreError> {
    if name.is_empty() || name.len() > 256 {
        return Ok(Err(Refusal::BadName));
    }
    let now = tx.now().await?;
    let d = match fenced(tx, community, id, caller, token, now).await? {
        Ok(d) => d,
        Err(r) => return Ok(Err(r)),
    };
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
        return Ok(Err(Refusal::TooManyOperations));
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
        .bind(effect.as_str())
        .bind(now),
    )
    .await?;
    Ok(Ok(()))
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
        .map(|r| Ok((r.int(0)?, r.text(1)?, r.text(2)?)))
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
    super::notices::post(tx, community, keys, &d.channel, text, tags, now).await
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
}

/// Checks a reply: a kind 9 by the target, in the delivery's channel, whose
/// author is still a member (`member`, read with the row). (Its id and
/// signature are checked by the caller, outside any transaction.)
fn check_reply(d: &Delivery, member: bool, reply: &Event) -> Answer<()> {
    let bad = |m: &str| Err(Refusal::BadReply(m.to_string()));
    if reply.kind.as_u16() != protocol::workflow::MESSAGE_KIND {
        return bad("reply must be a kind 9");
    }
    if reply.pubkey.to_bytes() != d.target {
        return bad("reply must be signed by the delivery's target");
    }
    if crate::store::channels::h_tag(reply) != Some(d.channel.as_str()) {
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
) -> Result<Answer<Finished>, StoreError> {
    let now = tx.now().await?;
    let Some((d, member)) = load_with_membership(tx, community, id).await? else {
        return Ok(Err(Refusal::NoDelivery));
    };
    if d.target != caller.to_bytes() {
        return Ok(Err(Refusal::NotTarget));
    }
    // The same finish again, after it succeeded: the same answer.
    if d.finished_token.as_deref() == Some(req.claim_token.as_str())
        && d.finished_outcome == Some(req.outcome)
    {
        let status = d.finished_status.unwrap_or(d.status);
        return Ok(Ok(Finished {
            status,
            published: Vec::new(),
        }));
    }
    let d = match check_fence(d, caller, &req.claim_token, now) {
        Ok(d) => d,
        Err(r) => return Ok(Err(r)),
    };
    let mut published = Vec::new();
    let mut reply_id: Option<[u8; 32]> = None;
    if let Some(reply) = &req.reply {
        if let Err(r) = check_reply(&d, member, reply) {
            return Ok(Err(r));
        }
        let raw = serde_json::to_string(reply).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        match insert_event_tx(tx, community, reply, &raw, Some(&d.channel)).await? {
            InsertOutcome::Stored => published.push((reply.clone(), raw)),
            InsertOutcome::Duplicate => {}
            InsertOutcome::Rejected(why) => return Ok(Err(Refusal::BadReply(why))),
        }
        reply_id = Some(reply.id.to_bytes());
    }
    faults::check("finish:after_reply")?;
    let status = match req.outcome {
        // The status and the finish record below in one statement.
        Outcome::Delivered => Status::Delivered,
        Outcome::Retry if d.attempt < d.max_attempts => {
            let attempt = u32::try_from(d.attempt).unwrap_or(u32::MAX);
            let next = now + i64::try_from(cfg.backoff_secs(attempt)).unwrap_or(i64::MAX);
            tx.exec(
                Q::new(
                    "UPDATE workflow_agent_deliveries SET status = 'pending', claim_token = NULL, \
                     claim_expires_at = NULL, next_attempt_at = $3, updated_at = $4 \
                     WHERE community_id = $1 AND id = $2",
                )
                .bind(community)
                .bind(id)
                .bind(next)
                .bind(now),
            )
            .await?;
            Status::Pending
        }
        Outcome::Retry => {
            published.push(
                fail(
                    tx,
                    community,
                    keys,
                    &d,
                    Status::Failed,
                    "attempts_exhausted",
                    None,
                    now,
                )
                .await?,
            );
            Status::Failed
        }
        Outcome::Failed => {
            let code = req
                .failure_code
                .as_deref()
                .filter(|c| !c.is_empty() && c.len() <= 64)
                .unwrap_or("agent_failed");
            let message = req
                .failure_message
                .as_deref()
                .map(|m| m.chars().take(1000).collect::<String>());
            published.push(
                fail(
                    tx,
                    community,
                    keys,
                    &d,
                    Status::Failed,
                    code,
                    message.as_deref(),
                    now,
                )
                .await?,
            );
            Status::Failed
        }
    };
    // A delivered row leaves `claimed` here; the other outcomes moved above.
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
    faults::check("finish:after_status")?;
    Ok(Ok(Finished { status, published }))
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
    tx.lock(&super::sqlstore::author_lock_key(community, &keys.public_key()))
        .await?;
    let now = tx.now().await?;
    let mut published = Vec::new();
    let batch = i64::from(cfg.sweep_batch);
    let lock = if tx.dialect() == Dialect::Postgres {
        " FOR UPDATE SKIP LOCKED"
    } else {
        ""
    };
    let expired = tx
        .all(
            Q::new(format!(
                "SELECT {COLS} FROM workflow_agent_deliveries WHERE community_id = $1 AND status = 'pending' \
                 AND expires_at <= $2 ORDER BY expires_at LIMIT $3{lock}"
            ))
            .bind(community)
            .bind(now)
            .bind(batch),
        )
        .await?;
    for r in &expired {
        let d = delivery(r)?;
        published.push(fail(tx, community, keys, &d, Status::Expired, "expired", None, now).await?);
        faults::check("sweep:after_transition")?;
    }
    let lapsed = tx
        .all(
            Q::new(format!(
                "SELECT {COLS} FROM workflow_agent_deliveries WHERE community_id = $1 AND status = 'claimed' \
                 AND claim_expires_at <= $2 ORDER BY claim_expires_at LIMIT $3{lock}"
            ))
            .bind(community)
            .bind(now)
            .bind(batch),
        )
        .await?;
    for r in &lapsed {
        let d = delivery(r)?;
        let wrote = tx
            .exists(
                Q::new(
                    "SELECT 1 FROM delivery_operations WHERE community_id = $1 AND delivery_id = $2 \
                     AND attempt = $3 AND effect = 'write'",
                )
                .bind(community)
                .bind(d.id.as_str())
                .bind(d.attempt),
            )
            .await?;
        if d.records_operations && !wrote && d.attempt < d.max_attempts && d.expires_at > now {
            // Nothing was done: redelivery is safe.
            tx.exec(
                Q::new(
                    "UPDATE workflow_agent_deliveries SET status = 'pending', claim_token = NULL, \
                     claim_expires_at = NULL, next_attempt_at = $3, updated_at = $3 \
                     WHERE community_id = $1 AND id = $2",
                )
                .bind(community)
                .bind(d.id.as_str())
                .bind(now),
            )
            .await?;
        } else {
            published.push(
                fail(
                    tx,
                    community,
                    keys,
                    &d,
                    Status::Failed,
                    "lease_expired",
                    None,
                    now,
                )
                .await?,
            );
        }
        faults::check("sweep:after_transition")?;
    }
    Ok(published)
}

/// The caller's own deliveries, newest first.
pub async fn list_own(
    tx: &mut Tx<'_>,
    community: &str,
    target: Option<&PublicKey>,
    status: Option<Status>,
    before: Option<i64>,
    limit: u32,
) -> Result<Vec<Delivery>, StoreError> {
    let mut q = Q::new(format!(
        "SELECT {COLS} FROM workflow_agent_deliveries WHERE community_id = $1"
    ))
    .bind(community);
    if let Some(t) = target {
        q.sql
            .push_str(&format!(" AND target_pubkey = ${}", q.binds.len() + 1));
        q = q.bind(t.to_bytes());
    }
    if let Some(s) = status {
        q.sql.push_str(&format!(" AND status = ${}", q.binds.len() + 1));
        q = q.bind(s.as_str());
    }
    if let Some(b) = before {
        q.sql
            .push_str(&format!(" AND created_at < ${}", q.binds.len() + 1));
        q = q.bind(b);
    }
    q.sql.push_str(&format!(
        " ORDER BY created_at DESC, id DESC LIMIT ${}",
        q.binds.len() + 1
    ));
    q = q.bind(i64::from(limit));
    tx.all(q).await?.iter().map(delivery).collect()
}

/// One delivery by id (operators).
pub async fn show(tx: &mut Tx<'_>, community: &str, id: &str) -> Result<Option<Delivery>, StoreError> {
    load(tx, community, id).await
}

#[cfg(test)]
mod tests {
    use super::{COLS, COLS_N};

    #[test]
    fn cols_n_counts_cols() {
        assert_eq!(COLS.split(',').count(), COLS_N);
    }
}
