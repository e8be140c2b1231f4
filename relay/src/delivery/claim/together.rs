//! Several callers' claims by name in one statement: a call writer
//! batch's (`store/group.rs`), made before its calls run. The claim rule
//! is the parent's `claim_sql(CLAIM_RULE)`, with each claim's values in
//! the statement's `claims` columns.

use std::sync::LazyLock;

use nostr::prelude::PublicKey;

use super::{claim_sql, delivery, lease_of, ClaimBinds, Grant, Reach, Turn, CLAIM_RULE, COLS};
use crate::config::DeliveryConfig;
use crate::faults;
use crate::persistence::db::{Dialect, Tx, Q};
use crate::persistence::sql::Bind;
use crate::persistence::StoreError;
use protocol::api::{ClaimRequest, Expected, MENTION_STEP};

/// A claim by name as its wake said (with its expected bindings), one of
/// several that a batch makes in one statement ([`claim_together`]).
pub struct NamedClaim<'a> {
    pub community: &'a str,
    pub caller: &'a PublicKey,
    pub req: &'a ClaimRequest,
}

/// What [`claim_together`] binds for one claim: where its row is, what it
/// grants and what the row must be bound to.
struct Together<'a> {
    claim: &'a NamedClaim<'a>,
    id: &'a str,
    expected: &'a Expected,
    definition: Vec<u8>,
    message: Vec<u8>,
    grant: Grant,
}

impl<'a> Together<'a> {
    /// The claim, if it is one [`claim_together`] may make: named, with
    /// its expected bindings, not a mention's (a conversation is looked at
    /// first) and with a lease the relay grants. Any other is left to
    /// [`claim`](super::claim), which refuses it or claims it on its own.
    fn of(claim: &'a NamedClaim<'a>, cfg: &DeliveryConfig, now: i64) -> Option<Self> {
        let (id, expected) = (claim.req.delivery_id.as_deref()?, claim.req.expected.as_ref()?);
        if expected.step_id == MENTION_STEP {
            return None;
        }
        let lease = lease_of(claim.req.lease_seconds, cfg).ok()?;
        Some(Together {
            claim,
            id,
            expected,
            definition: hex::decode(&expected.definition_event_id).ok()?,
            message: hex::decode(&expected.message_event_id).ok()?,
            grant: Grant::new(claim.req, lease, now, cfg),
        })
    }

    fn bind(self, q: Q) -> Q {
        let g = self.grant;
        q.bind(self.claim.community)
            .bind(self.id)
            .bind(g.token)
            .bind(g.claim_expires_at)
            .bind(g.records_operations)
            .bind(g.now)
            .bind(self.claim.caller.to_bytes())
            .bind(self.expected.run_id.as_str())
            .bind(self.expected.step_id.as_str())
            .bind(self.expected.channel.as_str())
            .bind(self.definition)
            .bind(self.message)
            .bind(g.agent_cap.unwrap_or(0))
            .bind(g.waited_since)
    }
}

/// The claims of a statement column by column, each bound as one array
/// on PostgreSQL ([`UNNESTED`]): one statement text for any number of
/// claims, where a `VALUES` list was a statement of its own (parsed and
/// planned again on every connection) for every length.
#[derive(Default)]
struct Columns {
    community: Vec<String>,
    id: Vec<String>,
    token: Vec<String>,
    lease_end: Vec<i64>,
    records: Vec<i64>,
    now: Vec<i64>,
    caller: Vec<Vec<u8>>,
    run: Vec<String>,
    step: Vec<String>,
    channel: Vec<String>,
    definition: Vec<Vec<u8>>,
    message: Vec<Vec<u8>>,
    cap: Vec<i64>,
    waited: Vec<i64>,
}

impl Columns {
    /// Appends one claim's values, as [`Together::bind`] binds them.
    fn push(&mut self, row: Together<'_>) {
        let g = row.grant;
        self.community.push(row.claim.community.to_string());
        self.id.push(row.id.to_string());
        self.token.push(g.token);
        self.lease_end.push(g.claim_expires_at);
        self.records.push(i64::from(g.records_operations));
        self.now.push(g.now);
        self.caller.push(row.claim.caller.to_bytes().to_vec());
        self.run.push(row.expected.run_id.clone());
        self.step.push(row.expected.step_id.clone());
        self.channel.push(row.expected.channel.clone());
        self.definition.push(row.definition);
        self.message.push(row.message);
        self.cap.push(g.agent_cap.unwrap_or(0));
        self.waited.push(g.waited_since);
    }

    /// The arrays, in [`TOGETHER_COLUMNS`]' order (and [`ARRAY_TYPES`]').
    fn bind(self, q: Q) -> Q {
        q.bind(Bind::TextArray(self.community))
            .bind(Bind::TextArray(self.id))
            .bind(Bind::TextArray(self.token))
            .bind(Bind::IntArray(self.lease_end))
            .bind(Bind::IntArray(self.records))
            .bind(Bind::IntArray(self.now))
            .bind(Bind::BlobArray(self.caller))
            .bind(Bind::TextArray(self.run))
            .bind(Bind::TextArray(self.step))
            .bind(Bind::TextArray(self.channel))
            .bind(Bind::BlobArray(self.definition))
            .bind(Bind::BlobArray(self.message))
            .bind(Bind::IntArray(self.cap))
            .bind(Bind::IntArray(self.waited))
    }
}

/// The PostgreSQL type of each array [`Columns::bind`] binds.
const ARRAY_TYPES: [&str; 14] = [
    "text", "text", "text", "bigint", "bigint", "bigint", "bytea", "text", "text", "text", "bytea", "bytea",
    "bigint", "bigint",
];

/// [`claim_together`]'s statement on PostgreSQL: `claims` from the
/// arrays of [`Columns::bind`] (`c_records` bound as 0 or 1). The
/// writers' connections keep one plan per statement
/// (`persistence::pinned`): with PostgreSQL's own choice this text was
/// planned at every run.
static UNNESTED: LazyLock<String> = LazyLock::new(|| {
    let arrays: Vec<String> = ARRAY_TYPES
        .iter()
        .enumerate()
        .map(|(i, ty)| format!("${}::{ty}[]", i + 1))
        .collect();
    let picked: Vec<String> = TOGETHER_COLUMNS
        .iter()
        .map(|c| match *c {
            "c_records" => "u.c_records <> 0".to_string(),
            c => format!("u.{c}"),
        })
        .collect();
    format!(
        "WITH claims ({}) AS (SELECT {} FROM unnest({}) AS u ({})",
        TOGETHER_COLUMNS.join(", "),
        picked.join(", "),
        arrays.join(", "),
        TOGETHER_COLUMNS.join(", "),
    ) + TOGETHER.as_str()
});

/// The columns of [`claim_together`]'s `claims`, in [`Together::bind`]'s
/// order.
const TOGETHER_COLUMNS: [&str; 14] = [
    "c_community",
    "c_id",
    "c_token",
    "c_lease_end",
    "c_records",
    "c_now",
    "c_caller",
    "c_run",
    "c_step",
    "c_channel",
    "c_definition",
    "c_message",
    "c_cap",
    "c_waited",
];

/// The statement of [`claim_together`] after its `VALUES`: the claim
/// rule on each named row, with the claim's values in `claims`' columns.
static TOGETHER: LazyLock<String> = LazyLock::new(|| {
    let rule = claim_sql(
        &CLAIM_RULE,
        &ClaimBinds {
            caller: "c_caller",
            now: "c_now",
            lease_end: "c_lease_end",
            agent_cap: "c_cap",
            waited_since: "c_waited",
        },
        Reach::ByKey,
    );
    format!(
        ") UPDATE workflow_agent_deliveries SET status = 'claimed', attempt = attempt + 1, \
         claim_token = c_token, claim_expires_at = c_lease_end, records_operations = c_records, \
         updated_at = c_now FROM claims WHERE community_id = c_community AND id = c_id AND {rule} \
         AND concurrency IS NULL AND conversation = '' AND run_id = c_run AND step_id = c_step \
         AND channel = c_channel AND definition_event_id = c_definition AND message_event_id = c_message \
         RETURNING {COLS}"
    )
});

/// Makes several callers' claims by name in one statement (a call
/// writer's batch: a statement each was most of a burst's wait on
/// PostgreSQL). Each named row that meets the claim rule and is bound as
/// its wake said is claimed, as [`claim`](super::claim) would; `None` for any other,
/// which the caller's own [`claim`](super::claim) then decides (a refusal, a row of
/// another binding, a mention's turn).
///
/// One statement sees the rows as they were before it, so it takes only
/// what no other claim of it can change: no two claims of one caller (its
/// agent's cap counts its claimed rows; asserted), and no row of a
/// workflow with a concurrency cap (its claimed rows are counted: those
/// are left to [`claim`](super::claim), one by one). `now`: the database clock.
pub async fn claim_together(
    tx: &mut Tx<'_>,
    claims: &[NamedClaim<'_>],
    cfg: &DeliveryConfig,
    now: i64,
) -> Result<Vec<Option<Turn>>, StoreError> {
    let mut claimed: Vec<Option<Turn>> = claims.iter().map(|_| None).collect();
    let callers: std::collections::HashSet<[u8; 32]> = claims.iter().map(|c| c.caller.to_bytes()).collect();
    assert_eq!(callers.len(), claims.len(), "one claim a caller in one statement");
    let rows: Vec<Together<'_>> = claims.iter().filter_map(|c| Together::of(c, cfg, now)).collect();
    if rows.is_empty() {
        return Ok(claimed);
    }
    faults::check("claim:error")?;
    let q = match tx.dialect() {
        Dialect::Postgres => {
            let mut columns = Columns::default();
            rows.into_iter().for_each(|row| columns.push(row));
            columns.bind(Q::new(UNNESTED.as_str()))
        }
        d @ Dialect::Sqlite => {
            let mut q = Q::new(format!(
                "WITH claims ({}) AS (VALUES ",
                TOGETHER_COLUMNS.join(", ")
            ));
            for (k, row) in rows.into_iter().enumerate() {
                d.push_values_row(&mut q.sql, k, TOGETHER_COLUMNS.len());
                q = row.bind(q);
            }
            q.sql.push_str(&TOGETHER);
            q
        }
    };
    for row in tx.all(q).await? {
        let turn = Turn::alone(delivery(&row)?);
        // Each claim is of another caller, and a row is only its target's.
        let i = claims
            .iter()
            .position(|c| c.caller.to_bytes() == turn.lead.target);
        let i = i.expect("a claimed row is one of the statement's callers'");
        debug_assert!(
            claimed[i].is_none() && claims[i].req.delivery_id.as_deref() == Some(turn.lead.id.as_str())
        );
        claimed[i] = Some(turn);
    }
    tracing::debug!(
        claims = claims.len(),
        claimed = claimed.iter().flatten().count(),
        "claims made in one statement"
    );
    Ok(claimed)
}
