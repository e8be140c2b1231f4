//! Event id and signature checks, off the async executor.
//!
//! A Schnorr verification costs tens of microseconds of CPU; doing it on a
//! tokio worker would stall every other connection on that worker. The work
//! goes to rayon's pool (one thread per core) and the caller awaits the result.

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

/// Checks an event's id and signature on the verification pool.
pub async fn verify(event: Arc<Event>) -> Result<(), VerifyError> {
    let (tx, rx) = oneshot::channel();
    rayon::spawn(move || {
        let _ = tx.send(verify_now(&event));
    });
    rx.await.unwrap_or(Err(VerifyError::PoolGone))
}

/// Runs CPU-bound work (signature checks) on the verification pool and
/// awaits it; `None` only if the pool dropped the work.
pub async fn off_executor<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = oneshot::channel();
    rayon::spawn(move || {
        let _ = tx.send(work());
    });
    rx.await.ok()
}
