//! Communities (tenants) and the host -> community resolution (docs/protocol.md, "Communities").
//!
//! Resolution fails closed: an empty, malformed or unknown host gets no
//! community, and the HTTP layer answers 404 / refuses the upgrade.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use nostr::prelude::{Keys, PublicKey};

use crate::store::{CommunityRecord, Store, StoreError};

/// A community as the running relay uses it.
#[derive(Debug)]
pub struct Community {
    pub id: String,
    /// Configured public URL; its scheme (`ws`/`wss`) is the one clients must
    /// use in NIP-42 `relay` tags (and `http`/`https` in NIP-98 `u` tags).
    pub relay_url: String,
    /// The community's own signing key.
    pub keys: Keys,
    /// Its public half (NIP-11 `self`), computed once.
    public_key: PublicKey,
}

impl Community {
    fn from_record(r: &CommunityRecord, keys_dir: Option<&std::path::Path>) -> Result<Self, StoreError> {
        let keys = crate::keys::load(r, keys_dir).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        Ok(Self {
            id: r.id.clone(),
            relay_url: r.relay_url.clone(),
            public_key: keys.public_key(),
            keys,
        })
    }

    /// The community's public key: the author of everything the relay signs.
    pub fn pubkey(&self) -> &PublicKey {
        &self.public_key
    }

    /// `true` when the configured URL is `wss://` (so HTTP calls are `https://`).
    pub fn is_secure(&self) -> bool {
        self.relay_url.starts_with("wss://") || self.relay_url.starts_with("https://")
    }

    /// The URL a NIP-42 `relay` tag must name for a connection made to `host`.
    pub fn websocket_url(&self, host: &str) -> String {
        let scheme = if self.is_secure() { "wss" } else { "ws" };
        format!("{scheme}://{host}")
    }
}

/// Host -> community, cached in memory over the store.
///
/// The cache is keyed by binding (a host as configured), so its size is
/// bounded by the number of bindings, not by what clients send.
pub struct Communities {
    store: Arc<Store>,
    keys_dir: Option<std::path::PathBuf>,
    by_binding: RwLock<HashMap<String, Arc<Community>>>,
}

impl Communities {
    pub fn new(store: Arc<Store>, keys_dir: Option<std::path::PathBuf>) -> Self {
        Self {
            store,
            keys_dir,
            by_binding: RwLock::new(HashMap::new()),
        }
    }

    /// The community a raw `Host` header value names, if any.
    pub async fn resolve(&self, raw_host: &str) -> Result<Option<(Arc<Community>, String)>, StoreError> {
        let Some(host) = protocol::host::normalize(raw_host) else {
            return Ok(None);
        };
        let bare = protocol::host::without_port(&host).to_string();
        if let Some(c) = self.cached(&host).or_else(|| self.cached(&bare)) {
            return Ok(Some((c, host)));
        }
        let Some(record) = self.store.community_for_host(&host).await? else {
            return Ok(None);
        };
        let binding = if record.hosts.contains(&host) {
            host.clone()
        } else {
            bare
        };
        let community = Arc::new(Community::from_record(&record, self.keys_dir.as_deref())?);
        if let Ok(mut map) = self.by_binding.write() {
            map.insert(binding, community.clone());
        }
        Ok(Some((community, host)))
    }

    fn cached(&self, binding: &str) -> Option<Arc<Community>> {
        self.by_binding.read().ok()?.get(binding).cloned()
    }
}

/// Checks an operator-chosen community id.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Builds the record for a new community with a fresh signing key.
pub fn new_record(id: &str, relay_url: &str, hosts: &[String]) -> Result<CommunityRecord, String> {
    if !valid_id(id) {
        return Err(format!("community id {id:?} must match [a-z0-9_-]{{1,64}}"));
    }
    let url = url::Url::parse(relay_url).map_err(|e| format!("relay URL {relay_url:?}: {e}"))?;
    if !matches!(url.scheme(), "ws" | "wss") {
        return Err(format!("relay URL {relay_url:?} must start with ws:// or wss://"));
    }
    if hosts.is_empty() {
        return Err("a community needs at least one host".into());
    }
    let mut normalized = Vec::with_capacity(hosts.len());
    for h in hosts {
        let n = protocol::host::normalize(h).ok_or_else(|| format!("host {h:?} is not a valid host name"))?;
        if !normalized.contains(&n) {
            normalized.push(n);
        }
    }
    let keys = Keys::generate();
    Ok(CommunityRecord {
        id: id.to_string(),
        relay_url: relay_url.to_string(),
        secret_key_hex: keys.secret_key().to_secret_hex(),
        hosts: normalized,
    })
}
