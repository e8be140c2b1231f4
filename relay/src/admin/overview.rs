//! What the dashboard reads (`protocol::dashboard`): counts, the last
//! hour, workflows, agents and channels, for the whole community (an
//! admin) or narrowed to one owner. Single statements on the read pool;
//! every list is bounded.

use protocol::api::{DeliveryStatus, RunStatus};
use protocol::dashboard::{
    AgentView, ChannelSummary, Minute, RunStats, WorkflowDetail, WorkflowSummary, RUN_STATS_WINDOW,
};

use crate::persistence::db::{named, Tx, Q};
use crate::persistence::StoreError;
use crate::workflow::definitions as workflows;

/// What the metrics read from the database, per community.
#[derive(Debug, Default, Clone)]
pub struct Gauges {
    /// (status, rows), only statuses that have rows.
    pub deliveries: Vec<(String, i64)>,
    /// Seconds since the oldest pending delivery was created (0: none).
    pub oldest_pending_secs: i64,
    /// (status, runs), only statuses that have runs.
    pub runs: Vec<(String, i64)>,
}

/// Most rows a dashboard list answers.
pub const MAX_ROWS: i64 = 500;

/// Counts, oldest pending and the last hour of a community (or of the
/// workflows `owner` owns).
pub struct Counts {
    pub deliveries: Vec<(String, u64)>,
    pub oldest_pending_secs: Option<i64>,
    pub runs: Vec<(String, u64)>,
    pub last_hour: Vec<Minute>,
}

/// `AND workflow_id IN (<the owner's workflows>)` when `owner` is given
/// (bound as `$2`, the community as `$1`).
fn owned_by(owner: Option<&[u8; 32]>) -> &'static str {
    if owner.is_some() {
        " AND workflow_id IN (SELECT w.id FROM workflows w WHERE w.community_id = $1 AND w.owner = $2)"
    } else {
        ""
    }
}

fn bound(q: Q, community: &str, owner: Option<&[u8; 32]>) -> Q {
    let q = q.bind(community);
    match owner {
        Some(o) => q.bind(*o),
        None => q,
    }
}

/// Counts by name, every name of `all` present (zero included).
fn by_name(rows: Vec<crate::persistence::db::Row>, all: &[&str]) -> Result<Vec<(String, u64)>, StoreError> {
    let mut counts: Vec<(String, u64)> = all.iter().map(|s| (s.to_string(), 0)).collect();
    for r in rows {
        let (name, n) = (r.text(0)?, u64::try_from(r.int(1)?).unwrap_or(0));
        if let Some(c) = counts.iter_mut().find(|(s, _)| *s == name) {
            c.1 = n;
        }
    }
    Ok(counts)
}

pub async fn counts(
    tx: &mut Tx<'_>,
    community: &str,
    owner: Option<&[u8; 32]>,
    now: i64,
) -> Result<Counts, StoreError> {
    let filter = owned_by(owner);
    let next = if owner.is_some() { 3 } else { 2 };
    let q = Q::new(format!(
        "SELECT status, COUNT(*) FROM workflow_agent_deliveries WHERE community_id = $1{filter} GROUP BY status"
    ));
    let statuses: Vec<&str> = DeliveryStatus::ALL.iter().map(|s| s.as_str()).collect();
    let deliveries = by_name(tx.all(bound(q, community, owner)).await?, &statuses)?;
    let q = Q::new(format!(
        "SELECT MIN(created_at) FROM workflow_agent_deliveries WHERE community_id = $1 AND status = 'pending'{filter}"
    ));
    let oldest = tx
        .one(bound(q, community, owner))
        .await?
        .map(|r| r.opt_int(0))
        .transpose()?
        .flatten();
    let q = Q::new(format!(
        "SELECT status, COUNT(*) FROM workflow_runs WHERE community_id = $1{filter} GROUP BY status"
    ));
    let statuses: Vec<&str> = RunStatus::ALL.iter().map(|s| s.as_str()).collect();
    let runs = by_name(tx.all(bound(q, community, owner)).await?, &statuses)?;
    let first = (now - now.rem_euclid(60)) - 59 * 60;
    let of_owner = if owner.is_some() {
        " AND a.delivery_id IN (SELECT d.id FROM workflow_agent_deliveries d WHERE d.community_id = $1 \
         AND d.workflow_id IN (SELECT w.id FROM workflows w WHERE w.community_id = $1 AND w.owner = $2))"
    } else {
        ""
    };
    let q = Q::new(format!(
        "SELECT a.finished_at / 60, a.outcome, COUNT(*) FROM delivery_attempts a WHERE a.community_id = $1 \
         AND a.finished_at >= ${next}{of_owner} GROUP BY a.finished_at / 60, a.outcome"
    ));
    let mut last_hour: Vec<Minute> = (0..60)
        .map(|i| Minute {
            at: first + i * 60,
            delivered: 0,
            failed: 0,
        })
        .collect();
    for r in tx.all(bound(q, community, owner).bind(first)).await? {
        let (minute, outcome, n) = (
            r.int(0)? * 60,
            r.opt_text(1)?,
            u64::try_from(r.int(2)?).unwrap_or(0),
        );
        let Some(m) = last_hour.iter_mut().find(|m| m.at == minute) else {
            continue;
        };
        match outcome.as_deref() {
            Some("delivered") => m.delivered += n,
            Some("failed" | "expired" | "lease_expired") => m.failed += n,
            _ => {}
        }
    }
    Ok(Counts {
        deliveries,
        oldest_pending_secs: oldest.map(|t| (now - t).max(0)),
        runs,
        last_hour,
    })
}

const SUMMARY: &str = "SELECT w.id, w.channel, w.owner, w.trigger, w.enabled, w.paused, w.updated_at, \
    w.definition_event_id, \
    (SELECT r.status FROM workflow_runs r WHERE r.community_id = w.community_id AND r.workflow_id = w.id \
     ORDER BY r.created_at DESC, r.id DESC LIMIT 1) AS last_status, \
    (SELECT MAX(r.created_at) FROM workflow_runs r WHERE r.community_id = w.community_id AND r.workflow_id = w.id) AS last_at, \
    (SELECT COUNT(*) FROM workflow_runs r WHERE r.community_id = w.community_id AND r.workflow_id = w.id) AS runs \
    FROM workflows w WHERE w.community_id = $1 AND NOT w.deleted";

async fn summary(
    tx: &mut Tx<'_>,
    community: &str,
    r: &crate::persistence::db::Row,
) -> Result<(WorkflowSummary, [u8; 32]), StoreError> {
    let definition = r.id32("definition_event_id")?;
    let name = workflows::load_definition(tx, community, &definition)
        .await?
        .map(|d| d.name)
        .unwrap_or_default();
    let s = WorkflowSummary {
        id: r.text("id")?,
        name,
        channel: r.text("channel")?,
        owner: hex::encode(r.id32("owner")?),
        trigger: r.text("trigger")?,
        enabled: r.bool("enabled")?,
        paused: r.bool("paused")?,
        updated_at: r.int("updated_at")?,
        last_run_status: r.opt_text("last_status")?,
        last_run_at: r.opt_int("last_at")?,
        runs: u64::try_from(r.int("runs")?).unwrap_or(0),
    };
    Ok((s, definition))
}

/// The community's workflows (or `owner`'s), by id.
pub async fn workflows(
    tx: &mut Tx<'_>,
    community: &str,
    owner: Option<&[u8; 32]>,
) -> Result<Vec<WorkflowSummary>, StoreError> {
    let filter = if owner.is_some() { " AND w.owner = $2" } else { "" };
    let q = Q::new(format!("{SUMMARY}{filter} ORDER BY w.id LIMIT {MAX_ROWS}"));
    let rows = tx.all(bound(q, community, owner)).await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        out.push(summary(tx, community, r).await?.0);
    }
    Ok(out)
}

/// One workflow with its definition.
pub async fn workflow(
    tx: &mut Tx<'_>,
    community: &str,
    id: &str,
) -> Result<Option<WorkflowDetail>, StoreError> {
    let q = Q::new(format!("{SUMMARY} AND w.id = $2"))
        .bind(community)
        .bind(id);
    let Some(r) = tx.one(q).await? else {
        return Ok(None);
    };
    let (summary, definition_id) = summary(tx, community, &r).await?;
    let q = Q::new("SELECT raw FROM events WHERE community_id = $1 AND id = $2")
        .bind(community)
        .bind(definition_id);
    let content = match tx.one(q).await? {
        Some(row) => serde_json::from_str::<nostr::prelude::Event>(&row.text(0)?)
            .map(|e| e.content)
            .unwrap_or_default(),
        None => String::new(),
    };
    let definition = serde_json::from_str(&content).unwrap_or(serde_json::Value::Null);
    Ok(Some(WorkflowDetail {
        summary,
        definition_event_id: hex::encode(definition_id),
        definition,
        stats: run_stats(tx, community, id).await?,
    }))
}

/// How the workflow's latest ended runs (at most [`RUN_STATS_WINDOW`])
/// ended and took.
async fn run_stats(tx: &mut Tx<'_>, community: &str, id: &str) -> Result<RunStats, StoreError> {
    let q = Q::new(format!(
        "SELECT status, updated_at - created_at FROM workflow_runs \
         WHERE community_id = $1 AND workflow_id = $2 AND status IN ('completed', 'failed', 'cancelled') \
         ORDER BY updated_at DESC LIMIT {RUN_STATS_WINDOW}"
    ))
    .bind(community)
    .bind(id);
    let mut ended = Vec::new();
    for r in tx.all(q).await? {
        ended.push((named(&r.text(0)?, RunStatus::parse)?, r.int(1)?));
    }
    Ok(RunStats::of(&ended))
}

/// Registered agents (or those `owner` owns): last claim, deliveries held.
pub async fn agents(
    tx: &mut Tx<'_>,
    community: &str,
    owner: Option<&[u8; 32]>,
) -> Result<Vec<AgentView>, StoreError> {
    let filter = if owner.is_some() { " AND g.owner = $2" } else { "" };
    let q = Q::new(format!(
        "SELECT g.pubkey, g.owner, g.registered_at, \
         (SELECT MAX(a.claimed_at) FROM delivery_attempts a JOIN workflow_agent_deliveries d \
          ON d.community_id = a.community_id AND d.id = a.delivery_id \
          WHERE d.community_id = g.community_id AND d.target_pubkey = g.pubkey) AS last_claimed_at, \
         (SELECT COUNT(*) FROM workflow_agent_deliveries d WHERE d.community_id = g.community_id \
          AND d.target_pubkey = g.pubkey AND d.status = 'claimed') AS in_flight \
         FROM agents g WHERE g.community_id = $1{filter} ORDER BY g.registered_at, g.pubkey LIMIT {MAX_ROWS}"
    ));
    let rows = tx.all(bound(q, community, owner)).await?;
    let mut agents = rows
        .iter()
        .map(|r| {
            Ok(AgentView {
                pubkey: hex::encode(r.id32("pubkey")?),
                owner: hex::encode(r.id32("owner")?),
                registered_at: r.int("registered_at")?,
                last_claimed_at: r.opt_int("last_claimed_at")?,
                in_flight: u64::try_from(r.int("in_flight")?).unwrap_or(0),
                mentions: Vec::new(),
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    for (agent, channel) in mention_settings(tx, community, owner).await? {
        if let Some(a) = agents.iter_mut().find(|a| a.pubkey == agent) {
            a.mentions.push(channel);
        }
    }
    Ok(agents)
}

/// Where the agents (those `owner` owns) take mentions: (agent, channel)
/// by channel, `""` for every channel; at most `MAX_LIST_MENTIONS`.
async fn mention_settings(
    tx: &mut Tx<'_>,
    community: &str,
    owner: Option<&[u8; 32]>,
) -> Result<Vec<(String, String)>, StoreError> {
    let filter = if owner.is_some() { " AND g.owner = $2" } else { "" };
    let q = Q::new(format!(
        "SELECT m.agent_pubkey, m.channel FROM agent_mentions m JOIN agents g \
         ON g.community_id = m.community_id AND g.pubkey = m.agent_pubkey \
         WHERE m.community_id = $1{filter} ORDER BY m.channel, m.agent_pubkey LIMIT {}",
        protocol::nip86::MAX_LIST_MENTIONS
    ));
    let rows = tx.all(bound(q, community, owner)).await?;
    rows.iter()
        .map(|r| Ok((hex::encode(r.id32("agent_pubkey")?), r.text("channel")?)))
        .collect()
}

/// Channels (or those `member` is in), by id.
pub async fn channels(
    tx: &mut Tx<'_>,
    community: &str,
    member: Option<&[u8; 32]>,
) -> Result<Vec<ChannelSummary>, StoreError> {
    let filter = if member.is_some() {
        " AND EXISTS (SELECT 1 FROM channel_members m WHERE m.community_id = c.community_id \
         AND m.channel_id = c.id AND m.pubkey = $2)"
    } else {
        ""
    };
    let q = Q::new(format!(
        "SELECT c.id, c.name, c.private, c.closed, \
         (SELECT COUNT(*) FROM channel_members m WHERE m.community_id = c.community_id AND m.channel_id = c.id) AS members, \
         (SELECT COUNT(*) FROM workflows w WHERE w.community_id = c.community_id AND w.channel = c.id AND NOT w.deleted) AS workflows \
         FROM channels c WHERE c.community_id = $1 AND NOT c.deleted{filter} ORDER BY c.id LIMIT {MAX_ROWS}"
    ));
    let rows = tx.all(bound(q, community, member)).await?;
    rows.iter()
        .map(|r| {
            Ok(ChannelSummary {
                id: r.text("id")?,
                name: r.text("name")?,
                private: r.bool("private")?,
                closed: r.bool("closed")?,
                members: u64::try_from(r.int("members")?).unwrap_or(0),
                workflows: u64::try_from(r.int("workflows")?).unwrap_or(0),
            })
        })
        .collect()
}
