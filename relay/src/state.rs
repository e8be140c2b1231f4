//! Shared state of a running relay process.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use std::collections::HashMap;
use std::sync::Mutex;

use nostr::prelude::Event;

use crate::channels::rules as channels;
use crate::channels::state::ChannelView;
use crate::community::{Communities, Community};
use crate::config::Config;
use crate::hub::Hub;
use crate::store::Store;

/// Wakes the workflow engine early (a run may have started); the engine
/// waits on it between passes.
#[derive(Default)]
pub struct Kick(tokio::sync::Notify);

impl Kick {
    pub fn kick(&self) {
        self.0.notify_one();
    }

    /// Resolves at the next kick (or at once if one is pending).
    pub async fn kicked(&self) {
        self.0.notified().await;
    }
}

/// Everything a connection or HTTP handler needs, shared behind one `Arc`.
pub struct AppState {
    pub cfg: Arc<Config>,
    pub store: Arc<Store>,
    pub communities: Communities,
    pub hub: Hub,
    /// Cancelled once on SIGTERM/SIGINT: stop accepting, finish, close.
    pub shutdown: CancellationToken,
    /// Connection tasks, awaited (bounded by `shutdown_grace_ms`) on shutdown.
    pub tracker: TaskTracker,
    /// Channel state for live read checks.
    pub channels: ChannelCache,
    /// Wakes the workflow engine (a run may have started).
    pub kick: Kick,
    /// HTTP API rate limits by (community, pubkey).
    pub api_limits: crate::ratelimit::KeyedLimiter,
    /// Failed webhook calls by (community, caller address).
    pub webhook_failures: crate::ratelimit::KeyedLimiter,
    /// Bytes queued for every connection's socket together.
    pub output: Arc<crate::budget::Budget>,
    /// Seals and opens the owners' workflow secrets.
    pub secrets: crate::secrets::SecretsKey,
    /// Sends `call_webhook` steps' requests.
    pub outcaller: Arc<crate::outcall::Outcaller>,
    /// When the workflow engine last began a pass (unix milliseconds; 0:
    /// not yet): `/readyz` reads it to tell a running engine from one that
    /// stopped.
    pub engine_beat: std::sync::atomic::AtomicU64,
    /// Each community's bans and NIP-11 text, cached.
    pub moderation: crate::moderation::ModerationCache,
    /// Live search filters and words held by every connection together.
    pub live_searches: Arc<crate::livesearch::SearchLoad>,
    /// Where runs' spans go (`otlp_endpoint`), or nowhere.
    pub spans: crate::spans::Spans,
}

/// How long the hub keeps recent events: with standbys serving reads,
/// the lag bound and a second more (a standby that serves a read is
/// never further behind); else not at all.
fn recent_for(cfg: &Config) -> std::time::Duration {
    if cfg.read_database_urls.is_empty() {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::from_millis(cfg.postgres.standby_max_lag_ms) + std::time::Duration::from_secs(1)
}

impl AppState {
    pub fn new(
        cfg: Config,
        store: Arc<Store>,
        secrets: crate::secrets::SecretsKey,
        outcaller: crate::outcall::Outcaller,
    ) -> Self {
        let capacity = cfg.limits.fanout_buffer_events;
        let (api_rate, api_burst) = (cfg.limits.api_requests_per_second, cfg.limits.api_burst);
        let l = &cfg.limits;
        let webhook_failures =
            crate::ratelimit::KeyedLimiter::new(l.webhook_failures_per_second, l.webhook_failures_burst);
        let output = crate::budget::Budget::new(l.max_outbound_bytes_total);
        let live_searches =
            crate::livesearch::SearchLoad::new(l.max_live_search_filters, l.max_live_search_words);
        let keys_dir = cfg.keys_dir.clone();
        let recent = recent_for(&cfg);

        Self {
            cfg: Arc::new(cfg),
            communities: Communities::new(store.clone(), keys_dir),
            moderation: crate::moderation::ModerationCache::new(store.clone()),
            store,
            hub: Hub::new(capacity, output.clone(), recent),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            channels: ChannelCache::new(CHANNEL_CACHE_ENTRIES),
            kick: Kick::default(),
            api_limits: crate::ratelimit::KeyedLimiter::new(api_rate, api_burst),
            webhook_failures,
            output,
            secrets,
            outcaller: Arc::new(outcaller),
            engine_beat: std::sync::atomic::AtomicU64::new(0),
            live_searches,
            spans: crate::spans::Spans::default(),
        }
    }

    /// Announces an accepted event to live subscribers of this process,
    /// first forgetting cached state of a channel the event changes. Every
    /// local and remote event goes through here.
    pub fn publish(&self, community: &str, event: Arc<Event>, raw: Arc<str>) {
        self.moderation.observe(community, &event);
        if channels::changes_channel(event.kind.as_u16()) {
            if let Some(ch) = channel_of(&event) {
                self.channels.forget(community, ch);
            }
        }
        self.hub.publish(community, event, raw);
    }
}

pub use protocol::nip29::channel_of;

/// (community, channel) -> state, `None` for "no such channel".
type ChannelMap = HashMap<(String, String), Option<Arc<ChannelView>>>;

/// How many channels' state a process keeps in memory.
const CHANNEL_CACHE_ENTRIES: usize = 10_000;

/// Channel state by (community, channel), loaded on demand and forgotten
/// whenever an event that changes the channel is published (locally or by
/// another process), so it is never staler than the live stream itself.
pub struct ChannelCache {
    map: Mutex<ChannelMap>,
    /// Bumped by every `forget`: a load that straddles one is not cached.
    epoch: std::sync::atomic::AtomicU64,
    max_entries: usize,
}

impl ChannelCache {
    fn new(max_entries: usize) -> Self {
        assert!(max_entries > 0);
        Self {
            map: Mutex::new(HashMap::new()),
            epoch: std::sync::atomic::AtomicU64::new(0),
            max_entries,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ChannelMap> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn forget(&self, community: &str, channel: &str) {
        let mut map = self.lock();
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        map.remove(&(community.to_string(), channel.to_string()));
    }

    /// The channel, or `None` when it does not exist or cannot be read now
    /// (callers treat that as "not visible": fail closed).
    pub async fn get(&self, store: &Store, community: &Community, channel: &str) -> Option<Arc<ChannelView>> {
        let key = (community.id.clone(), channel.to_string());
        if let Some(v) = self.lock().get(&key) {
            return v.clone();
        }
        // Boxed: the store's read is a large future, and this one is part
        // of every subscribed connection's task (awaited for each live
        // channel event), which would otherwise be that much larger.
        Box::pin(self.load(store, community, channel, key)).await
    }

    /// Reads a channel the cache does not hold, and keeps it.
    async fn load(
        &self,
        store: &Store,
        community: &Community,
        channel: &str,
        key: (String, String),
    ) -> Option<Arc<ChannelView>> {
        let epoch = self.epoch.load(std::sync::atomic::Ordering::SeqCst);
        let loaded = match store.channel(&community.id, channel).await {
            Ok(v) => v.map(Arc::new),
            Err(e) => {
                tracing::warn!(error = %e, "channel lookup failed");
                return None;
            }
        };
        let mut map = self.lock();
        if self.epoch.load(std::sync::atomic::Ordering::SeqCst) == epoch {
            if map.len() >= self.max_entries {
                map.clear();
            }
            map.insert(key, loaded.clone());
        }
        loaded
    }
}
