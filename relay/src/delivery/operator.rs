//! What an admin or a workflow's owner does to a delivery row through
//! management: cancel it or retry it, as edges of the machine.

use protocol::api::DeliveryStatus as Status;

use crate::delivery::machine;
use crate::delivery::machine::{Event as On, Transition};
use crate::persistence::db::{Tx, Q};
use crate::persistence::StoreError;
use crate::refusal::Answer;

use super::deliveries::counted;
use super::rows::Delivery;

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
             failure_code = NULL, failure_message = NULL, output_errors = NULL, updated_at = $5 \
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
