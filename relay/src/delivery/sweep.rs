//! The sweeper: unclaimed rows past their lifetime expire, lapsed leases
//! end (redelivered when nothing can have been done), each as the machine
//! decides, with its notice. Safe in several processes at once: every
//! transition re-checks the state it leaves.

use nostr::prelude::{Event, Keys};

use crate::config::DeliveryConfig;
use crate::delivery::machine;
use crate::delivery::machine::{Event as On, Transition};
use crate::events::rules::author_lock_key;
use crate::faults;
use crate::persistence::db::{Dialect, Tx, Q};
use crate::persistence::StoreError;

use super::deliveries::apply;
use super::rows::{delivery, Delivery, COLS};

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
