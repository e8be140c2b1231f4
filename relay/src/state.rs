//! Shared state of a running relay process.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::community::Communities;
use crate::config::Config;
use crate::hub::Hub;
use crate::store::Store;

/// Everything a connection or HTTP handler needs, shared behind one `Arc`.
pub struct AppState {
    pub cfg: Arc<Config>,
    pub store: Arc<dyn Store>,
    pub communities: Communities,
    pub hub: Hub,
    /// Cancelled once on SIGTERM/SIGINT: stop accepting, finish, close.
    pub shutdown: CancellationToken,
    /// Connection tasks, awaited (bounded by `shutdown_grace_ms`) on shutdown.
    pub tracker: TaskTracker,
}

impl AppState {
    pub fn new(cfg: Config, store: Arc<dyn Store>) -> Self {
        let capacity = cfg.limits.fanout_buffer_events;
        Self {
            cfg: Arc::new(cfg),
            communities: Communities::new(store.clone()),
            store,
            hub: Hub::new(capacity),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
        }
    }
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
