//! Approvals by people: one request per `request_approval` step, decided
//! once. A NIP-25 reaction by an approver on the request decides it in the
//! transaction that stores the reaction (`on_reaction`), only while the
//! database clock is before the request's deadline; from the deadline on,
//! the engine decides it `timed_out` (`time_out`), whenever its pass
//! comes. Either is one UPDATE that requires no decision yet, so the first
//! wins across relay processes and the loser changes nothing. The engine
//! reads the decision from the store (never from live traffic), so a
//! decision stored while no engine looked is found when one does.

use nostr::prelude::{Event, PublicKey};
use protocol::api::ApprovalView;
use protocol::approval::{self, Decision};

use crate::persistence::db::{Tx, Q};
use crate::persistence::StoreError;

/// A decided request, as the engine reads it.
#[derive(Debug, Clone)]
pub struct Decided {
    pub decision: Decision,
    /// Hex pubkey of the approver (empty when timed out).
    pub by: String,
    /// Hex id of the deciding reaction (empty when timed out).
    pub event_id: String,
    /// Hex id of the request message.
    pub request_event_id: String,
}

/// Records the request a step just posted, open until `deadline` (unix
/// seconds, exclusive).
#[allow(clippy::too_many_arguments)]
pub async fn record_request(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    step_id: &str,
    channel: &str,
    request: &Event,
    approvers: &[PublicKey],
    deadline: i64,
) -> Result<(), StoreError> {
    let list: Vec<String> = approvers.iter().map(PublicKey::to_hex).collect();
    let list = serde_json::to_string(&list).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    tx.exec(
        Q::new(
            "INSERT INTO workflow_approvals (community_id, request_event_id, run_id, step_id, channel, \
             approvers, created_at, deadline) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT DO NOTHING",
        )
        .bind(community)
        .bind(request.id.to_bytes())
        .bind(run_id)
        .bind(step_id)
        .bind(channel)
        .bind(list)
        .bind(crate::events::rules::created_at_of(request))
        .bind(deadline),
    )
    .await?;
    Ok(())
}

/// A reaction stored in `channel`: when it is an approver's decision on an
/// open request there, before the request's deadline by the database
/// clock (never by the reaction's own `created_at`, which its author
/// chose), it decides the request (the first one only) and returns the
/// run to wake (the caller pokes it in the same transaction). Any other
/// reaction, and one that comes late, changes nothing here.
pub async fn on_reaction(
    tx: &mut Tx<'_>,
    community: &str,
    reaction: &Event,
    channel: &str,
) -> Result<Option<String>, StoreError> {
    let Some(decision) = Decision::of_reaction(&reaction.content) else {
        return Ok(None);
    };
    let Some(request) = approval::reacted_to(reaction).and_then(crate::events::rules::id_of_hex) else {
        return Ok(None);
    };
    let now = tx.now().await?;
    let row = tx
        .one(
            Q::new(
                "SELECT run_id, approvers FROM workflow_approvals WHERE community_id = $1 \
                 AND request_event_id = $2 AND channel = $3 AND decision IS NULL \
                 AND (deadline IS NULL OR deadline > $4)",
            )
            .bind(community)
            .bind(request)
            .bind(channel)
            .bind(now),
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let approvers: Vec<String> = serde_json::from_str(&row.text("approvers")?)
        .map_err(|e| StoreError::Corrupt(format!("approvers: {e}")))?;
    let author = reaction.pubkey.to_hex();
    if !approvers.iter().any(|a| a.eq_ignore_ascii_case(&author)) {
        return Ok(None);
    }
    let decided = tx
        .exec(
            Q::new(
                "UPDATE workflow_approvals SET decision = $3, decided_by = $4, decision_event_id = $5, \
                 decided_at = $6 WHERE community_id = $1 AND request_event_id = $2 AND decision IS NULL",
            )
            .bind(community)
            .bind(request)
            .bind(decision.as_str())
            .bind(reaction.pubkey.to_bytes())
            .bind(reaction.id.to_bytes())
            .bind(crate::events::rules::created_at_of(reaction)),
        )
        .await?;
    if decided == 1 {
        return Ok(Some(row.text("run_id")?));
    }
    Ok(None)
}

/// The step's deadline passed: decides its request `timed_out` unless an
/// approver decided first.
pub async fn time_out(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    step_id: &str,
    now: i64,
) -> Result<(), StoreError> {
    tx.exec(
        Q::new(
            "UPDATE workflow_approvals SET decision = 'timed_out', decided_at = $4 \
             WHERE community_id = $1 AND run_id = $2 AND step_id = $3 AND decision IS NULL",
        )
        .bind(community)
        .bind(run_id)
        .bind(step_id)
        .bind(now),
    )
    .await?;
    Ok(())
}

/// The decision on a step's request, if there is one yet.
pub async fn decided(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    step_id: &str,
) -> Result<Option<Decided>, StoreError> {
    let row = tx
        .one(
            Q::new(
                "SELECT decision, decided_by, decision_event_id, request_event_id FROM workflow_approvals \
                 WHERE community_id = $1 AND run_id = $2 AND step_id = $3 AND decision IS NOT NULL",
            )
            .bind(community)
            .bind(run_id)
            .bind(step_id),
        )
        .await?;
    let Some(r) = row else { return Ok(None) };
    let hex_of = |col: &str| -> Result<String, StoreError> {
        Ok(r.opt_blob(col)?.map(hex::encode).unwrap_or_default())
    };
    Ok(Some(Decided {
        decision: crate::persistence::db::named(&r.text("decision")?, Decision::parse)?,
        by: hex_of("decided_by")?,
        event_id: hex_of("decision_event_id")?,
        request_event_id: hex_of("request_event_id")?,
    }))
}

/// A step's approval request while it waits for its decision (none once
/// decided): what to react to, its text, who may decide and until when.
pub async fn waiting(
    tx: &mut Tx<'_>,
    community: &str,
    run_id: &str,
    step_id: &str,
) -> Result<Option<ApprovalView>, StoreError> {
    let row = tx
        .one(
            Q::new(
                "SELECT a.request_event_id, a.approvers, a.deadline, e.raw FROM workflow_approvals a \
                 LEFT JOIN events e ON e.community_id = a.community_id AND e.id = a.request_event_id \
                 WHERE a.community_id = $1 AND a.run_id = $2 AND a.step_id = $3 AND a.decision IS NULL",
            )
            .bind(community)
            .bind(run_id)
            .bind(step_id),
        )
        .await?;
    let Some(r) = row else { return Ok(None) };
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(format!("approval request: {e}"));
    let approvers: Vec<String> = serde_json::from_str(&r.text("approvers")?).map_err(corrupt)?;
    let text = match r.opt_text("raw")? {
        Some(raw) => serde_json::from_str::<serde_json::Value>(&raw).map_err(corrupt)?["content"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        None => String::new(),
    };
    Ok(Some(ApprovalView {
        request_event_id: hex::encode(r.id32("request_event_id")?),
        text,
        approvers,
        deadline: r.int("deadline")?,
    }))
}
