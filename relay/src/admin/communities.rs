//! Communities (tenants) and the hosts that name them.

use crate::persistence::db::{Pool, Q};
use crate::persistence::StoreError;

/// A community as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommunityRecord {
    /// Operator-chosen id (`[a-z0-9_-]{1,64}`).
    pub id: String,
    /// Public relay URL (`ws://` or `wss://`).
    pub relay_url: String,
    /// Hex secret key the relay signs this community's events with, or
    /// `file:<public key hex>` when the key is kept in a key file
    /// (`crate::keys`).
    pub secret_key_hex: String,
    /// Normalised hosts bound to the community.
    pub hosts: Vec<String>,
}

/// The community a `Host` header names: the host as given, or without its
/// port; the longer match wins.
pub(crate) async fn for_host(pool: &Pool, host: &str) -> Result<Option<CommunityRecord>, StoreError> {
    let bare = protocol::host::without_port(host).to_string();
    let q = Q::new(
        "SELECT c.id, c.relay_url, c.secret_key_hex FROM community_hosts h \
         JOIN communities c ON c.id = h.community_id \
         WHERE h.host IN ($1, $2) ORDER BY length(h.host) DESC LIMIT 1",
    )
    .bind(host)
    .bind(bare);
    Ok(rows(pool, q).await?.into_iter().next())
}

/// Adds a community with its hosts; a taken id or host is a conflict and
/// adds nothing.
pub(crate) async fn add(pool: &Pool, c: &CommunityRecord) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    let now = tx.now().await?;
    let inserted = tx
        .exec(
            Q::new(
                "INSERT INTO communities (id, relay_url, secret_key_hex, created_at) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(c.id.as_str())
            .bind(c.relay_url.as_str())
            .bind(c.secret_key_hex.as_str())
            .bind(now),
        )
        .await?;
    if inserted == 0 {
        return Err(StoreError::Conflict(format!(
            "community {:?} already exists",
            c.id
        )));
    }
    for host in &c.hosts {
        let bound = tx
            .exec(
                Q::new("INSERT INTO community_hosts (host, community_id) VALUES ($1, $2) ON CONFLICT (host) DO NOTHING")
                    .bind(host)
                    .bind(c.id.as_str()),
            )
            .await?;
        if bound == 0 {
            return Err(StoreError::Conflict(format!(
                "host {host:?} is bound to another community"
            )));
        }
    }
    tx.commit().await
}

pub(crate) async fn list(pool: &Pool) -> Result<Vec<CommunityRecord>, StoreError> {
    rows(
        pool,
        Q::new("SELECT id, relay_url, secret_key_hex FROM communities ORDER BY id"),
    )
    .await
}

/// Replaces a community's stored key (as `keys.rs` stores it); whether the
/// community exists.
pub(crate) async fn set_key(pool: &Pool, id: &str, stored: &str) -> Result<bool, StoreError> {
    let n = pool
        .exec(
            Q::new("UPDATE communities SET secret_key_hex = $2 WHERE id = $1")
                .bind(id)
                .bind(stored),
        )
        .await?;
    Ok(n == 1)
}

/// Communities (id, relay URL, key) selected by `q`, each with its hosts.
async fn rows(pool: &Pool, q: Q) -> Result<Vec<CommunityRecord>, StoreError> {
    let mut out = Vec::new();
    for row in pool.all(q).await? {
        let id = row.text("id")?;
        out.push(CommunityRecord {
            hosts: hosts_of(pool, &id).await?,
            relay_url: row.text("relay_url")?,
            secret_key_hex: row.text("secret_key_hex")?,
            id,
        });
    }
    Ok(out)
}

async fn hosts_of(pool: &Pool, id: &str) -> Result<Vec<String>, StoreError> {
    let rows = pool
        .all(Q::new("SELECT host FROM community_hosts WHERE community_id = $1 ORDER BY host").bind(id))
        .await?;
    rows.iter().map(|r| r.text(0)).collect()
}
