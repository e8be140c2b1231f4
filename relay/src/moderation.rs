//! A community's moderation (its bans and NIP-11 text, set over NIP-86) as
//! this process sees it: loaded from the store on demand, forgotten when
//! the relay's management notice for the community is published here
//! (made here, or by another process and received through the fan-out),
//! and loaded again when older than [`MAX_AGE`], so that a lost
//! notification delays a ban by that much at most.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use nostr::prelude::{Event, PublicKey};

use crate::admin::manage::Moderation;
use crate::community::Community;
use crate::store::Store;

/// The longest a process uses a community's moderation without reading it again.
pub const MAX_AGE: Duration = Duration::from_secs(2);
/// Communities kept (the map is cleared beyond: a bound, not an eviction policy).
const MAX_COMMUNITIES: usize = 10_000;

struct Entry {
    moderation: Arc<Moderation>,
    /// The community key that signs its notices (a notice by any other
    /// author forgets nothing).
    key: PublicKey,
    loaded: Instant,
}

pub struct ModerationCache {
    store: Arc<Store>,
    map: RwLock<HashMap<String, Entry>>,
    /// Bumped by every `forget`: a load that straddles one is not kept.
    epoch: AtomicU64,
    /// One load at a time: connections that find an entry stale together
    /// wait for one read instead of each making its own.
    loading: tokio::sync::Mutex<()>,
}

impl ModerationCache {
    pub fn new(store: Arc<Store>) -> Self {
        Self {
            store,
            map: RwLock::new(HashMap::new()),
            epoch: AtomicU64::new(0),
            loading: tokio::sync::Mutex::new(()),
        }
    }

    fn fresh(&self, community: &str) -> Option<Arc<Moderation>> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        map.get(community)
            .filter(|e| e.loaded.elapsed() < MAX_AGE)
            .map(|e| e.moderation.clone())
    }

    /// The community's moderation now. When the store cannot answer, the
    /// last one loaded (or none) stands.
    pub async fn get(&self, community: &Community) -> Arc<Moderation> {
        match self.fresh(&community.id) {
            Some(m) => m,
            // Boxed: the store's read is a large future, and this one is
            // part of every connection's task (awaited for each EVENT),
            // which would otherwise be that much larger while idle.
            None => Box::pin(self.load(community)).await,
        }
    }

    /// Reads the community's moderation from the store (one load at a time).
    async fn load(&self, community: &Community) -> Arc<Moderation> {
        let _one = self.loading.lock().await;
        if let Some(m) = self.fresh(&community.id) {
            return m;
        }
        let epoch = self.epoch.load(Ordering::SeqCst);
        match self.store.moderation(&community.id).await {
            Ok(m) => {
                let m = Arc::new(m);
                let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
                if self.epoch.load(Ordering::SeqCst) == epoch {
                    if map.len() >= MAX_COMMUNITIES {
                        map.clear();
                    }
                    let entry = Entry {
                        moderation: m.clone(),
                        key: *community.pubkey(),
                        loaded: Instant::now(),
                    };
                    map.insert(community.id.clone(), entry);
                }
                m
            }
            Err(e) => {
                tracing::warn!(error = %e, community = %community.id, "loading moderation failed");
                let map = self.map.read().unwrap_or_else(|p| p.into_inner());
                map.get(&community.id)
                    .map(|e| e.moderation.clone())
                    .unwrap_or_default()
            }
        }
    }

    /// Forgets a community's moderation when `event` is its relay's
    /// management notice (a NIP-32 label in the `nip86` namespace by the
    /// community key).
    pub fn observe(&self, community: &str, event: &Event) {
        if event.kind.as_u16() != protocol::kinds::LABEL {
            return;
        }
        let ours = event.tags.iter().any(|t| {
            let v = t.as_slice();
            v.len() >= 2 && v[0] == "L" && v[1] == crate::events::notices::MANAGEMENT_NAMESPACE
        });
        if !ours {
            return;
        }
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        // A load under way read what may predate this notice: not kept.
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if map.get(community).is_some_and(|e| e.key == event.pubkey) {
            map.remove(community);
        }
    }
}
