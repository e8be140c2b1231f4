//! Claims: the one statement per claim that the machine's claim rule
//! (`machine::CLAIM_RULE`) is written into, clause by clause, and the
//! named claim the machine decides from the loaded row.
//!
//! Its one write is its last statement, after every refusal (the call
//! writer runs it without a savepoint: `refuses_before_writing` in
//! `store/group.rs`).

use nostr::prelude::PublicKey;
use std::sync::LazyLock;

use crate::config::DeliveryConfig;
use crate::delivery::machine;
use crate::delivery::machine::{Claimable, Event as On, Transition, CLAIM_RULE};
use crate::faults;
use crate::persistence::db::{Dialect, Tx, Q};
use crate::persistence::StoreError;
use protocol::api::{MAX_TURN_DELIVERIES, MENTION_STEP};

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

/// The order in which a claim without a name takes the caller's
/// claimable rows: highest priority, then the oldest due.
const CLAIM_ORDER: &str = "ORDER BY priority DESC, next_attempt_at, created_at, id";

/// Where a claim statement binds the values the claim rule compares.
struct ClaimBinds {
    caller: &'static str,
    now: &'static str,
    lease_end: &'static str,
    /// The relay's `agent_concurrency` (0: no cap).
    agent_cap: &'static str,
    /// The clock less `deliveries.mention_max_wait_secs`: a mention stored
    /// by then has waited long enough for its conversation to go quiet.
    waited_since: &'static str,
}

/// How a claim statement reaches its row: by its key (the status test that
/// no partial index's predicate follows from, [`IS_PENDING`]), or through
/// the index of pending rows.
#[derive(Clone, Copy)]
enum Reach {
    ByKey,
    ByPendingIndex,
}

/// The `WHERE` conditions of `rule` ([`CLAIM_RULE`], or the part of it a
/// row joining a turn must meet, [`JOIN_RULE`]), clause by clause: the
/// claim statements' only statement of the rule the machine decides with.
fn claim_sql(rule: &[Claimable], b: &ClaimBinds, reach: Reach) -> String {
    let clause = |c: Claimable| match c {
        Claimable::Target => format!("target_pubkey = {}", b.caller),
        Claimable::Pending => match reach {
            Reach::ByKey => IS_PENDING.to_string(),
            Reach::ByPendingIndex => "status = 'pending'".to_string(),
        },
        Claimable::Due => format!("next_attempt_at <= {}", b.now),
        Claimable::LeaseFits => format!("expires_at >= {}", b.lease_end),
        Claimable::NotRevising => "output_errors IS NULL".to_string(),
        Claimable::WorkflowRoom => format!(
            "(concurrency IS NULL OR concurrency > {})",
            held_by("workflow_id")
        ),
        Claimable::AgentRoom => format!(
            "({cap} = 0 OR {cap} > {})",
            held_by("target_pubkey"),
            cap = b.agent_cap
        ),
        Claimable::ConversationFree => {
            let row = "workflow_agent_deliveries";
            let busy = busy_sql(
                &Talk {
                    community: &format!("{row}.community_id"),
                    target: &format!("{row}.target_pubkey"),
                    conversation: &format!("{row}.conversation"),
                    id: &format!("{row}.id"),
                },
                b.now,
                b.waited_since,
            );
            format!("({row}.conversation = '' OR NOT {busy})")
        }
    };
    rule.iter().map(|c| clause(*c)).collect::<Vec<_>>().join(" AND ")
}

/// The clauses a row joining another's turn must meet (the claimed row
/// met all of [`CLAIM_RULE`]; a mention has no workflow cap, and the
/// turn is one claim of its agent's and holds its conversation).
const JOIN_RULE: [Claimable; 5] = [
    Claimable::Target,
    Claimable::Pending,
    Claimable::Due,
    Claimable::LeaseFits,
    Claimable::NotRevising,
];

/// A row whose conversation is looked at, as SQL expressions (its
/// columns, or binds).
struct Talk<'a> {
    community: &'a str,
    target: &'a str,
    conversation: &'a str,
    id: &'a str,
}

/// Whether `row`'s conversation is busy at `now` (an SQL condition): another
/// row of it is claimed (a turn holds it), or one is pending but not yet
/// due (the conversation is still speaking: its debounce, or a backoff)
/// while none of its pending rows was stored by `waited_since` (one that
/// waited that long has the conversation taken even while it goes on).
fn busy_sql(row: &Talk<'_>, now: &str, waited_since: &str) -> String {
    let Talk {
        community,
        target,
        conversation,
        id,
    } = row;
    let rows = "SELECT 1 FROM workflow_agent_deliveries talk";
    let of_it = format!(
        "talk.community_id = {community} AND talk.target_pubkey = {target} \
         AND talk.conversation = {conversation} AND talk.conversation <> ''"
    );
    format!(
        "(EXISTS ({rows} WHERE {of_it} AND talk.id <> {id} AND talk.status = 'claimed') \
         OR (EXISTS ({rows} WHERE {of_it} AND talk.id <> {id} AND talk.status = 'pending' \
         AND talk.next_attempt_at > {now}) \
         AND NOT EXISTS ({rows} WHERE {of_it} AND talk.status = 'pending' AND talk.created_at <= {waited_since})))"
    )
}

/// The claimed rows that share the claimed row's `column` (its workflow,
/// its agent) in its community, counted through `deliveries_in_flight`.
/// (A turn's rows count each: the rows that join a claimed row's turn
/// are not held back by the agent's cap, at most
/// `MAX_TURN_DELIVERIES` - 1 of them.)
fn held_by(column: &str) -> String {
    let row = "workflow_agent_deliveries";
    held_like(&format!("{row}.community_id"), column, &format!("{row}.{column}"))
}

/// The claimed rows of `community` whose `column` is `value` (SQL
/// expressions), as a counting subquery.
fn held_like(community: &str, column: &str, value: &str) -> String {
    format!(
        "(SELECT COUNT(*) FROM workflow_agent_deliveries held WHERE held.community_id = {community} \
         AND held.{column} = {value} AND held.status = 'claimed')"
    )
}

/// The claim of a named row whose bindings are as a wake said: `$1`
/// community, `$2` id, the grant `$3`..`$6`, `$7` caller, `$8`..`$12` the
/// expected run, step, channel, definition and message, `$13` the agent
/// cap.
static CLAIM_AS_EXPECTED: LazyLock<String> = LazyLock::new(|| {
    let rule = claim_sql(
        &CLAIM_RULE,
        &ClaimBinds {
            caller: "$7",
            now: "$6",
            lease_end: "$4",
            agent_cap: "$13",
            waited_since: "$14",
        },
        Reach::ByKey,
    );
    // A mention's row (a conversation) is claimed with its turn, from the
    // loaded row (`claim_named`).
    format!(
        "UPDATE workflow_agent_deliveries {CLAIM_SET} WHERE community_id = $1 AND id = $2 AND {rule} \
         AND conversation = '' AND run_id = $8 AND step_id = $9 AND channel = $10 AND definition_event_id = $11 \
         AND message_event_id = $12 RETURNING {COLS}"
    )
});

/// The claim of the caller's first claimable row, highest priority and
/// oldest first: `$1` community, `$2` caller, the grant `$3`..`$6`, `$7`
/// the agent cap; `{skip}` is where PostgreSQL skips rows another claim
/// holds. A workflow at its cap is walked past row by row (the bound is
/// its pending rows in the caller's backlog).
fn claim_oldest_sql(skip: &str) -> String {
    let rule = claim_sql(
        &CLAIM_RULE,
        &ClaimBinds {
            caller: "$2",
            now: "$6",
            lease_end: "$4",
            agent_cap: "$7",
            waited_since: "$8",
        },
        Reach::ByPendingIndex,
    );
    format!(
        "UPDATE workflow_agent_deliveries {CLAIM_SET} WHERE community_id = $1 AND {IS_PENDING} AND id = (\
         SELECT id FROM workflow_agent_deliveries WHERE community_id = $1 AND {rule} AND conversation = '' \
         {CLAIM_ORDER} LIMIT 1{skip}) RETURNING {COLS}"
    )
}

/// The caller's first claimable mention (a row with a conversation), read
/// to be claimed with its turn: `$1` community, `$2` caller, `$3` the
/// clock, `$4` the lease's end, `$5` the agent cap; `{skip}` as in
/// [`claim_oldest_sql`].
fn oldest_turn_sql(skip: &str) -> String {
    let rule = claim_sql(
        &CLAIM_RULE,
        &ClaimBinds {
            caller: "$2",
            now: "$3",
            lease_end: "$4",
            agent_cap: "$5",
            waited_since: "$6",
        },
        Reach::ByPendingIndex,
    );
    format!(
        "SELECT id FROM workflow_agent_deliveries WHERE community_id = $1 AND {rule} AND conversation <> '' \
         {CLAIM_ORDER} LIMIT 1{skip}"
    )
}

static CLAIM_OLDEST_SQLITE: LazyLock<String> = LazyLock::new(|| claim_oldest_sql(""));
static CLAIM_OLDEST_POSTGRES: LazyLock<String> =
    LazyLock::new(|| claim_oldest_sql(" FOR UPDATE SKIP LOCKED"));
static OLDEST_TURN_SQLITE: LazyLock<String> = LazyLock::new(|| oldest_turn_sql(""));
static OLDEST_TURN_POSTGRES: LazyLock<String> = LazyLock::new(|| oldest_turn_sql(" FOR UPDATE SKIP LOCKED"));

/// What one claim took: the claimed row and, for a mention, the due rows
/// of its conversation it took with it (same token and lease), oldest
/// first: a turn.
#[derive(Debug)]
pub struct Turn {
    pub lead: Delivery,
    pub joined: Vec<Delivery>,
}

impl Turn {
    fn alone(lead: Delivery) -> Self {
        Turn {
            lead,
            joined: Vec::new(),
        }
    }

    /// Every row of the turn, the claimed one first.
    pub fn rows(&self) -> impl Iterator<Item = &Delivery> {
        std::iter::once(&self.lead).chain(&self.joined)
    }
}

/// Claims a delivery: the one named (with its expected bindings), or the
/// oldest due one of the caller, with its turn. `Ok(None)` is "nothing to
/// claim" (no change).
///
/// Every refusal comes before its first write, and no refusal after it
/// (the call writer runs it without a savepoint on SQLite: `group.rs`).
pub async fn claim(
    tx: &mut Tx<'_>,
    community: &str,
    caller: &PublicKey,
    req: &ClaimRequest,
    cfg: &DeliveryConfig,
) -> Answer<Option<Turn>> {
    let lease = lease_of(req.lease_seconds, cfg)?;
    let now = tx.now().await?;
    // Test-only: a claim that fails in the database (see `group::run_batch`).
    faults::check("claim:error")?;
    let grant = Grant::new(req, lease, now, cfg);
    match &req.delivery_id {
        None => claim_first(tx, community, caller, lease, &grant).await,
        Some(id) => claim_by_name(tx, community, caller, id, req.expected.as_ref(), lease, &grant).await,
    }
}

/// A claim without a name: the caller's first claimable row with no
/// conversation (one statement), else its first claimable mention with
/// its turn.
async fn claim_first(
    tx: &mut Tx<'_>,
    community: &str,
    caller: &PublicKey,
    lease: i64,
    grant: &Grant,
) -> Answer<Option<Turn>> {
    if let Some(d) = claim_oldest(tx, community, caller, grant).await? {
        return Ok(Some(Turn::alone(d)));
    }
    let Some(id) = oldest_turn(tx, community, caller, grant).await? else {
        return Ok(None);
    };
    claim_named(tx, community, caller, &id, None, lease, grant).await
}

/// A claim of a named row: in one statement when it is bound as expected
/// and has no conversation, else from the loaded row.
async fn claim_by_name(
    tx: &mut Tx<'_>,
    community: &str,
    caller: &PublicKey,
    id: &str,
    expected: Option<&Expected>,
    lease: i64,
    grant: &Grant,
) -> Answer<Option<Turn>> {
    // A mention's is never claimed in one statement (its conversation is
    // looked at first): not worth trying.
    let mention = expected.is_some_and(|e| e.step_id == MENTION_STEP);
    if !mention {
        if let Some(d) = claim_as_expected(tx, community, caller, id, expected, grant).await? {
            return Ok(Some(Turn::alone(d)));
        }
    }
    claim_named(tx, community, caller, id, expected, lease, grant).await
}

/// What a claim grants: the new token and lease.
struct Grant {
    token: String,
    claim_expires_at: i64,
    records_operations: bool,
    /// The database clock.
    now: i64,
    /// The claimed rows the caller may hold in the community
    /// (`deliveries.agent_concurrency`; `None`: no cap).
    agent_cap: Option<i64>,
    /// A mention stored by then has waited long enough
    /// (`deliveries.mention_max_wait_secs`, [`ClaimBinds::waited_since`]).
    waited_since: i64,
}

/// The `SET` of a claim; its binds are `$3`..`$6` ([`Grant::bind`]).
const CLAIM_SET: &str = "SET status = 'claimed', attempt = attempt + 1, claim_token = $3, \
                         claim_expires_at = $4, records_operations = $5, updated_at = $6";

impl Grant {
    /// A fresh token, and a lease of `lease` seconds from the database
    /// clock `now`.
    fn new(req: &ClaimRequest, lease: i64, now: i64, cfg: &DeliveryConfig) -> Self {
        Grant {
            token: hex::encode(rand::random::<[u8; 32]>()),
            claim_expires_at: now + lease,
            records_operations: req.records_operations.unwrap_or(false),
            now,
            agent_cap: cfg.agent_cap(),
            waited_since: cfg.waited_since(now),
        }
    }

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
        .bind(msg)
        .bind(grant.agent_cap.unwrap_or(0))
        .bind(grant.waited_since);
    tx.one(q).await?.as_ref().map(delivery).transpose()
}

/// A named claim, from the loaded row: the machine decides, and the
/// expected bindings must match. A mention's row is claimed with its
/// turn, while its conversation is free; a claim that finds another
/// taking the same conversation at this moment (PostgreSQL, another
/// process) claims nothing.
async fn claim_named(
    tx: &mut Tx<'_>,
    community: &str,
    caller: &PublicKey,
    id: &str,
    expected: Option<&Expected>,
    lease: i64,
    grant: &Grant,
) -> Answer<Option<Turn>> {
    let d = load(tx, community, id).await?.ok_or(Refusal::NoDelivery)?;
    let asked = On::Claim {
        is_target: d.for_caller(caller),
        lease_secs: lease,
    };
    // Another agent's, or cancelled: refused before anything of the row is
    // compared (the caller learns nothing of its bindings).
    let mut state = d.state();
    state.in_flight = in_flight(tx, community, &d, grant.agent_cap).await?;
    let mut decided = machine::transition(&state, asked, grant.now);
    if let Err(r @ (Refusal::NotTarget | Refusal::Cancelled)) = decided {
        return Err(r.into());
    }
    if expected.is_some_and(|e| !d.bound_as(e)) {
        return Ok(None);
    }
    let in_turn = !d.conversation.is_empty();
    if in_turn && matches!(decided, Ok(Transition::Claim { .. })) {
        if !tx.try_lock(&turn_key(community, &d)).await? {
            return Ok(None);
        }
        state.conversation_busy = conversation_busy(tx, community, &d, grant).await?;
        decided = machine::transition(&state, asked, grant.now);
    }
    match decided? {
        Transition::NotDue => return Ok(None),
        t => debug_assert!(matches!(t, Transition::Claim { .. }), "{t:?}"),
    }
    if in_turn {
        return Ok(claim_turn(tx, community, &d, grant).await?);
    }
    let q = Q::new(format!(
        "UPDATE workflow_agent_deliveries {CLAIM_SET} WHERE community_id = $1 AND id = $2 AND {IS_PENDING} \
         RETURNING {COLS}"
    ))
    .bind(community)
    .bind(id);
    let claimed = tx.one(grant.bind(q)).await?.as_ref().map(delivery).transpose()?;
    Ok(claimed.map(Turn::alone))
}

/// The lock one claim of a conversation holds while it decides and takes
/// the turn (PostgreSQL: two processes of one agent never take one
/// conversation at once).
fn turn_key(community: &str, d: &Delivery) -> String {
    format!("turn:{community}:{}:{}", hex::encode(d.target), d.conversation)
}

/// Whether another row of `d`'s conversation holds it: claimed, or
/// pending but not yet due (the conversation is still speaking).
async fn conversation_busy(
    tx: &mut Tx<'_>,
    community: &str,
    d: &Delivery,
    grant: &Grant,
) -> Result<bool, StoreError> {
    static BUSY: LazyLock<String> = LazyLock::new(|| {
        let row = Talk {
            community: "$1",
            target: "$2",
            conversation: "$3",
            id: "$4",
        };
        format!("SELECT 1 WHERE {}", busy_sql(&row, "$5", "$6"))
    });
    let q = Q::new(BUSY.as_str())
        .bind(community)
        .bind(d.target.to_vec())
        .bind(d.conversation.as_str())
        .bind(d.id.as_str())
        .bind(grant.now)
        .bind(grant.waited_since);
    tx.exists(q).await
}

/// Claims `d` (claimable, its conversation free and locked) with the due
/// rows of its conversation, up to [`MAX_TURN_DELIVERIES`] in all, oldest
/// message first, in one statement.
async fn claim_turn(
    tx: &mut Tx<'_>,
    community: &str,
    d: &Delivery,
    grant: &Grant,
) -> Result<Option<Turn>, StoreError> {
    static TURN: LazyLock<String> = LazyLock::new(|| {
        let joins = claim_sql(
            &JOIN_RULE,
            &ClaimBinds {
                caller: "$2",
                now: "$6",
                lease_end: "$4",
                agent_cap: "0",
                waited_since: "0",
            },
            Reach::ByPendingIndex,
        );
        // The rows that join are found through `deliveries_conversation`
        // (its predicate follows from the clauses); an `OR` with the
        // claimed row's key would walk the community's rows instead.
        format!(
            "UPDATE workflow_agent_deliveries {CLAIM_SET} WHERE community_id = $1 AND {IS_PENDING} AND id IN (\
             SELECT $7 UNION ALL SELECT id FROM (SELECT id FROM workflow_agent_deliveries \
             WHERE community_id = $1 AND target_pubkey = $2 AND conversation = $8 AND conversation <> '' \
             AND id <> $7 AND {joins} ORDER BY message_created_at, created_at, id LIMIT $9) AS joining) \
             RETURNING {COLS}"
        )
    });
    let limit = i64::try_from(MAX_TURN_DELIVERIES - 1).unwrap_or(0);
    let q = Q::new(TURN.as_str()).bind(community).bind(d.target.to_vec());
    let q = grant
        .bind(q)
        .bind(d.id.as_str())
        .bind(d.conversation.as_str())
        .bind(limit);
    let mut rows = tx
        .all(q)
        .await?
        .iter()
        .map(delivery)
        .collect::<Result<Vec<_>, _>>()?;
    rows.sort_by(|a, b| (a.id != d.id, a.created_at, &a.id).cmp(&(b.id != d.id, b.created_at, &b.id)));
    let mut rows = rows.into_iter();
    Ok(rows.next().map(|lead| {
        debug_assert_eq!(lead.id, d.id, "the loaded row is held");
        Turn {
            lead,
            joined: rows.collect(),
        }
    }))
}

/// The caller's first claimable mention, read (and held, on PostgreSQL)
/// to be claimed with its turn.
async fn oldest_turn(
    tx: &mut Tx<'_>,
    community: &str,
    caller: &PublicKey,
    grant: &Grant,
) -> Result<Option<String>, StoreError> {
    let sql = match tx.dialect() {
        Dialect::Postgres => OLDEST_TURN_POSTGRES.as_str(),
        Dialect::Sqlite => OLDEST_TURN_SQLITE.as_str(),
    };
    let q = Q::new(sql)
        .bind(community)
        .bind(caller.to_bytes())
        .bind(grant.now)
        .bind(grant.claim_expires_at)
        .bind(grant.agent_cap.unwrap_or(0))
        .bind(grant.waited_since);
    tx.one(q).await?.map(|r| r.text("id")).transpose()
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
    let q = grant
        .bind(q)
        .bind(grant.agent_cap.unwrap_or(0))
        .bind(grant.waited_since);
    tx.one(q).await?.as_ref().map(delivery).transpose()
}

/// The row a claim by `agent` without a name would take now, read
/// without claiming it (to wake its agent when a cap frees a slot): the
/// claim rule's clauses for a lease that ends now, in the claim's order.
pub async fn next_claimable(
    tx: &mut Tx<'_>,
    community: &str,
    agent: &[u8; 32],
    cfg: &DeliveryConfig,
) -> Result<Option<Delivery>, StoreError> {
    static NEXT: LazyLock<String> = LazyLock::new(|| {
        let rule = claim_sql(
            &CLAIM_RULE,
            &ClaimBinds {
                caller: "$2",
                now: "$3",
                lease_end: "$3",
                agent_cap: "$4",
                waited_since: "$5",
            },
            Reach::ByPendingIndex,
        );
        format!(
            "SELECT {COLS} FROM workflow_agent_deliveries WHERE community_id = $1 AND {rule} \
             {CLAIM_ORDER} LIMIT 1"
        )
    });
    let now = tx.now().await?;
    let q = Q::new(NEXT.as_str())
        .bind(community)
        .bind(agent.to_vec())
        .bind(now)
        .bind(cfg.agent_cap().unwrap_or(0))
        .bind(cfg.waited_since(now));
    tx.one(q).await?.as_ref().map(delivery).transpose()
}

/// The claimed rows of `d`'s workflow and of its agent, with their caps
/// (not counted when neither has a cap).
async fn in_flight(
    tx: &mut Tx<'_>,
    community: &str,
    d: &Delivery,
    agent_cap: Option<i64>,
) -> Result<machine::InFlight, StoreError> {
    let mut counts = machine::InFlight {
        workflow_cap: d.concurrency,
        agent_cap,
        ..Default::default()
    };
    if counts.workflow_cap.is_none() && counts.agent_cap.is_none() {
        return Ok(counts);
    }
    static COUNTS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {} AS workflow, {} AS agent",
            held_like("$1", "workflow_id", "$2"),
            held_like("$1", "target_pubkey", "$3")
        )
    });
    let q = Q::new(COUNTS.as_str())
        .bind(community)
        .bind(d.workflow_id.as_str())
        .bind(d.target.to_vec());
    if let Some(row) = tx.one(q).await? {
        counts.workflow = row.int("workflow")?;
        counts.agent = row.int("agent")?;
    }
    Ok(counts)
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

mod together;
pub use together::{claim_together, NamedClaim};

#[cfg(test)]
mod claim_rule;
