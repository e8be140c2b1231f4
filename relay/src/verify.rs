//! Event id and signature checks.
//!
//! A Schnorr verification costs tens of microseconds of CPU. A WebSocket
//! connection can send thousands of events in a row: their checks go to
//! rayon's pool (one thread per core), several in flight at once, and the
//! connection awaits each result in arrival order ([`verify`]). An HTTP
//! call checks one or two signatures (its NIP-98 header, a finish's reply):
//! those run where the request is handled ([`verify_now`]), as its JSON is
//! parsed there; the hop to the pool and back cost more than the check
//! (measured in the delivery benchmark: 4% of the relay's CPU).

use std::sync::Arc;

use nostr::prelude::Event;
use tokio::sync::oneshot;

/// Why an event failed verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyError {
    BadId,
    BadSignature,
    PoolGone,
}

impl VerifyError {
    /// The machine-readable answer for a client.
    pub fn message(self) -> &'static str {
        match self {
            VerifyError::BadId => "invalid: event id does not match its content",
            VerifyError::BadSignature => "invalid: signature verification failed",
            VerifyError::PoolGone => "error: verification unavailable",
        }
    }
}

/// Checks an event's id and signature synchronously (for callers already off
/// the executor).
pub fn verify_now(event: &Event) -> Result<(), VerifyError> {
    if !event.verify_id() {
        Err(VerifyError::BadId)
    } else if !event.verify_signature() {
        Err(VerifyError::BadSignature)
    } else {
        Ok(())
    }
}

/// How an event's id is known to be right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdCheck {
    /// Hash the event as the `nostr` crate holds it.
    Recompute,
    /// Already checked on the event as its author wrote it
    /// (`protocol::message::Verbatim`: tags the crate cannot hold).
    Verbatim { id_ok: bool },
}

/// Checks an event's id and signature on the verification pool.
pub async fn verify(event: Arc<Event>, id: IdCheck) -> Result<(), VerifyError> {
    let (tx, rx) = oneshot::channel();
    rayon::spawn(move || {
        let result = match id {
            IdCheck::Recompute => verify_now(&event),
            IdCheck::Verbatim { id_ok: false } => Err(VerifyError::BadId),
            IdCheck::Verbatim { id_ok: true } if !event.verify_signature() => Err(VerifyError::BadSignature),
            IdCheck::Verbatim { id_ok: true } => Ok(()),
        };
        let _ = tx.send(result);
    });
    rx.await.unwrap_or(Err(VerifyError::PoolGone))
}
