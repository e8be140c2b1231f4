//! The relay-wide output budget: bytes queued for all connections'
//! sockets together, against `limits.max_outbound_bytes_total`. The hub
//! charges each live event's JSON once while it lives; each connection's
//! queue charges what it owns (see `outbound`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Bytes queued for all connections together, against one limit.
#[derive(Debug)]
pub struct Budget {
    used: AtomicUsize,
    pub(crate) limit: usize,
    /// Tasks waiting for room (`Outbound::wait_room`); releases notify
    /// only when some wait.
    pub(crate) waiting: AtomicUsize,
    pub(crate) drained: Notify,
}

impl Budget {
    pub fn new(limit: usize) -> Arc<Self> {
        assert!(limit > 0, "validated at load");
        Arc::new(Self {
            used: AtomicUsize::new(0),
            limit,
            waiting: AtomicUsize::new(0),
            drained: Notify::new(),
        })
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    /// Charges `n` bytes (always: the caller decided they are queued).
    pub fn charge(&self, n: usize) {
        self.used.fetch_add(n, Ordering::SeqCst);
    }

    /// Releases `n` bytes charged before.
    pub fn release(&self, n: usize) {
        let before = self.used.fetch_sub(n, Ordering::SeqCst);
        debug_assert!(before >= n, "released more than was charged");
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.drained.notify_waiters();
        }
    }

    /// Bytes that may still be charged.
    pub fn room(&self) -> usize {
        self.limit.saturating_sub(self.used())
    }
}
