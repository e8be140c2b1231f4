//! NIP-77 negentropy sync: a client (or another relay) reconciles its set
//! of events with the relay's set for one filter, exchanging fingerprints
//! of ranges instead of the events, with the `negentropy` crate (the
//! reference protocol, version 1).
//!
//! A session holds the `(created_at, id)` of every event its filter
//! matches under the read rules (40 bytes each), read once at `NEG-OPEN`.
//! Bounds: at most `limits.max_sync_events` events per session (more is
//! refused, not cut: a partial set would tell the client that events are
//! missing when they are not), `limits.max_sync_sessions` sessions per
//! connection, frames of at most [`FRAME_BYTES`], and the reconciliation
//! itself runs on the blocking pool (it is CPU work: tens of milliseconds
//! for a million events).

use negentropy::{Id, Negentropy, NegentropyStorageVector};
use nostr::prelude::Filter;

use crate::state::AppState;
use crate::store::ReadScope;

/// Largest message the relay sends (bytes before hex encoding): under the
/// client messages it accepts (`protocol::message::MAX_NEG_MESSAGE_BYTES`).
pub const FRAME_BYTES: u64 = 64 * 1024;

/// One open sync.
pub type Session = Negentropy<'static, NegentropyStorageVector>;

/// Why a sync cannot go on: the `NEG-ERR` reason.
pub type Refused = String;

/// Opens a session for `filter` and answers the client's first message.
pub async fn open(
    state: &AppState,
    community: &str,
    filter: &Filter,
    scope: &ReadScope,
    message: Vec<u8>,
) -> Result<(Box<Session>, Vec<u8>), Refused> {
    let max = state.cfg.limits.max_sync_events;
    let items = state
        .store
        .sync_items(community, filter, scope, max + 1)
        .await
        .map_err(|e| {
            tracing::error!(community = %community, error = %e, "sync query failed");
            "error: the query failed; try again".to_string()
        })?;
    if items.len() > max {
        return Err(format!(
            "blocked: more than {max} events match (max_sync_events); sync a narrower filter"
        ));
    }
    // One hop to the blocking pool builds the set and answers the first message.
    on_pool(move || answer(build(items)?, &message)).await
}

/// Answers one more client message of an open session.
pub async fn step(session: Box<Session>, message: Vec<u8>) -> Result<(Box<Session>, Vec<u8>), Refused> {
    on_pool(move || answer(session, &message)).await
}

fn build(items: Vec<(u64, [u8; 32])>) -> Result<Box<Session>, Refused> {
    let mut storage = NegentropyStorageVector::with_capacity(items.len());
    for (created_at, id) in items {
        storage
            .insert(created_at, Id::from_byte_array(id))
            .map_err(|e| format!("error: {e}"))?;
    }
    storage.seal().map_err(|e| format!("error: {e}"))?;
    let session = Negentropy::owned(storage, FRAME_BYTES).map_err(|e| format!("error: {e}"))?;
    Ok(Box::new(session))
}

/// The session's reply to one client message.
fn answer(mut session: Box<Session>, message: &[u8]) -> Result<(Box<Session>, Vec<u8>), Refused> {
    let reply = session.reconcile(message).map_err(|e| format!("invalid: {e}"))?;
    Ok((session, reply))
}

/// Runs CPU work of a sync on the blocking pool.
async fn on_pool<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Refused> + Send + 'static,
) -> Result<T, Refused> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|_| "error: sync failed".to_string())?
}
