//! Bulk cancellation: the open rows of one workflow, channel, run or
//! step, or a departed member's mentions, cancelled with a code in one
//! statement and counted in `relay_delivery_transitions_total`. Their
//! holders' finishes then answer 410 `cancelled` (the machine's fence).

use nostr::prelude::PublicKey;

use crate::persistence::db::{Tx, Q};
use crate::persistence::StoreError;

/// The deliveries still open (pending or claimed), written as an OR so that
/// each arm reads its own partial index (`deliveries_due` or
/// `deliveries_pending_expiry`, and `deliveries_claimed`; a bitmap OR on
/// PostgreSQL): the cancellations touch only open rows, without an index of
/// their own (migration 0005 on PostgreSQL, 0007 on SQLite, says why).
/// These are the states the machine cancels (`machine::Event::Cancel`;
/// the test below holds the two together).
pub(crate) const ACTIVE_ROWS: &str = "(status = 'pending' OR status = 'claimed')";

/// Which open rows a cancellation takes (in one community).
#[derive(Debug, Clone, Copy)]
pub enum Open<'a> {
    /// A workflow's (disabled or deleted).
    Workflow(&'a str),
    /// A channel's (deleted).
    Channel(&'a str),
    /// A run's (cancelled).
    Run(&'a str),
    /// A run's step's (answered by another, or timed out).
    Step { run: &'a str, step: &'a str },
    /// The mentions in `channel` that `departed` wrote or that are
    /// addressed to it (it left the channel or was removed).
    MentionsOf {
        channel: &'a str,
        departed: &'a PublicKey,
    },
}

impl Open<'_> {
    /// Its condition; its values are bound from `$4`.
    fn clause(self) -> &'static str {
        match self {
            Open::Workflow(_) => "workflow_id = $4",
            Open::Channel(_) => "channel = $4",
            Open::Run(_) => "run_id = $4",
            Open::Step { .. } => "run_id = $4 AND step_id = $5",
            Open::MentionsOf { .. } => {
                "channel = $4 AND source = 'mention' AND (target_pubkey = $5 OR EXISTS (SELECT 1 FROM events e \
                 WHERE e.community_id = $1 AND e.created_at = message_created_at AND e.id = message_event_id \
                 AND e.pubkey = $5))"
            }
        }
    }

    fn bind(self, q: Q) -> Q {
        match self {
            Open::Workflow(v) | Open::Channel(v) | Open::Run(v) => q.bind(v),
            Open::Step { run, step } => q.bind(run).bind(step),
            Open::MentionsOf { channel, departed } => q.bind(channel).bind(departed.to_bytes()),
        }
    }
}

/// Cancels the `open` rows of `community` with failure `code`; returns
/// how many.
pub async fn cancel_open(
    tx: &mut Tx<'_>,
    community: &str,
    open: Open<'_>,
    code: &str,
    now: i64,
) -> Result<u64, StoreError> {
    let q = Q::new(format!(
        "UPDATE workflow_agent_deliveries SET status = 'cancelled', failure_code = $2, claim_token = NULL, \
         updated_at = $3 WHERE community_id = $1 AND {ACTIVE_ROWS} AND {}",
        open.clause()
    ))
    .bind(community)
    .bind(code)
    .bind(now);
    let cancelled = tx.exec(open.bind(q)).await?;
    crate::telemetry::count_transitions("cancelled", code, cancelled);
    Ok(cancelled)
}

#[cfg(test)]
mod tests {
    use protocol::api::DeliveryStatus;

    use super::ACTIVE_ROWS;
    use crate::delivery::machine::{transition, Event, State, Transition};

    #[test]
    fn bulk_cancellation_touches_the_states_the_machine_cancels() {
        for status in DeliveryStatus::ALL {
            let row = State {
                status: *status,
                attempt: 1,
                max_attempts: 3,
                claim_token: Some("t"),
                claim_expires_at: Some(10),
                next_attempt_at: 0,
                expires_at: 100,
                records_operations: false,
                revising: false,
                in_flight: Default::default(),
                conversation_busy: false,
            };
            let cancels = transition(&row, Event::Cancel, 5) == Ok(Transition::Cancel);
            let touched = ACTIVE_ROWS.contains(&format!("'{}'", status.as_str()));
            assert_eq!(cancels, touched, "{status:?}");
        }
    }
}
