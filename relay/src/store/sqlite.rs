//! Embedded SQLite backend (the default).
//!
//! WAL journal, a busy timeout, and every write in `BEGIN IMMEDIATE`, so a
//! writer takes the database lock before it reads what it decides on (no
//! lock upgrade, no SQLITE_BUSY halfway through a decision).

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use nostr::prelude::{Event, Filter};
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{Arguments, Row, Sqlite, Transaction};

use super::sql::{self, Bind, Dialect, Sql};
use super::{
    address_key, deletion_targets, expiration, indexed_tags, replacement_key, CommunityRecord, InsertOutcome,
    ReadScope, Store, StoreError, StoredEvent,
};
use crate::config::SqliteConfig;

/// The SQLite store.
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the database file and migrates it.
    pub async fn open(url: &str, cfg: &SqliteConfig) -> Result<Self, StoreError> {
        let synchronous = match cfg.synchronous.as_str() {
            "full" => SqliteSynchronous::Full,
            _ => SqliteSynchronous::Normal,
        };
        let opts = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(synchronous)
            .busy_timeout(Duration::from_millis(cfg.busy_timeout_ms))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(cfg.pool_size)
            .connect_with(opts)
            .await?;
        sqlx::migrate!("../migrations/sqlite").run(&pool).await?;
        Ok(Self { pool })
    }

    async fn immediate(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }
}

fn arguments(binds: Vec<Bind>) -> Result<SqliteArguments, StoreError> {
    let mut args = SqliteArguments::default();
    for b in binds {
        let r = match b {
            Bind::Int(v) => args.add(v),
            Bind::Text(v) => args.add(v),
            Bind::Blob(v) => args.add(v),
        };
        r.map_err(|e| StoreError::Corrupt(format!("bind: {e}")))?;
    }
    Ok(args)
}

fn build(s: Sql) -> Result<(String, SqliteArguments), StoreError> {
    let args = arguments(s.binds)?;
    Ok((s.text, args))
}

fn to_id(bytes: Vec<u8>) -> Result<[u8; 32], StoreError> {
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| StoreError::Corrupt("event id is not 32 bytes".into()))
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn community_for_host(&self, host: &str) -> Result<Option<CommunityRecord>, StoreError> {
        let bare = protocol::host::without_port(host);
        let row = sqlx::query(
            "SELECT c.id, c.relay_url, c.secret_key_hex FROM community_hosts h \
             JOIN communities c ON c.id = h.community_id \
             WHERE h.host IN (?1, ?2) ORDER BY length(h.host) DESC LIMIT 1",
        )
        .bind(host)
        .bind(bare)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let id: String = row.get(0);
        let hosts =
            sqlx::query_scalar("SELECT host FROM community_hosts WHERE community_id = ?1 ORDER BY host")
                .bind(&id)
                .fetch_all(&self.pool)
                .await?;
        Ok(Some(CommunityRecord {
            id,
            relay_url: row.get(1),
            secret_key_hex: row.get(2),
            hosts,
        }))
    }

    async fn add_community(&self, c: &CommunityRecord) -> Result<(), StoreError> {
        let mut tx = self.immediate().await?;
        let taken: Option<i64> = sqlx::query_scalar("SELECT 1 FROM communities WHERE id = ?1")
            .bind(&c.id)
            .fetch_optional(&mut *tx)
            .await?;
        if taken.is_some() {
            return Err(StoreError::Conflict(format!(
                "community {:?} already exists",
                c.id
            )));
        }
        sqlx::query("INSERT INTO communities (id, relay_url, secret_key_hex, created_at) VALUES (?1, ?2, ?3, unixepoch())")
            .bind(&c.id)
            .bind(&c.relay_url)
            .bind(&c.secret_key_hex)
            .execute(&mut *tx)
            .await?;
        for host in &c.hosts {
            let owner: Option<String> =
                sqlx::query_scalar("SELECT community_id FROM community_hosts WHERE host = ?1")
                    .bind(host)
                    .fetch_optional(&mut *tx)
                    .await?;
            if let Some(owner) = owner {
                return Err(StoreError::Conflict(format!(
                    "host {host:?} is bound to community {owner:?}"
                )));
            }
            sqlx::query("INSERT INTO community_hosts (host, community_id) VALUES (?1, ?2)")
                .bind(host)
                .bind(&c.id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn list_communities(&self) -> Result<Vec<CommunityRecord>, StoreError> {
        let rows = sqlx::query("SELECT id, relay_url, secret_key_hex FROM communities ORDER BY id")
            .fetch_all(&self.pool)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let id: String = row.get(0);
            let hosts =
                sqlx::query_scalar("SELECT host FROM community_hosts WHERE community_id = ?1 ORDER BY host")
                    .bind(&id)
                    .fetch_all(&self.pool)
                    .await?;
            out.push(CommunityRecord {
                id,
                relay_url: row.get(1),
                secret_key_hex: row.get(2),
                hosts,
            });
        }
        Ok(out)
    }

    async fn insert_event(
        &self,
        community: &str,
        event: &Event,
        raw: &str,
    ) -> Result<InsertOutcome, StoreError> {
        let id = event.id.as_bytes().to_vec();
        let pubkey = event.pubkey.to_bytes().to_vec();
        let created_at = i64::try_from(event.created_at.as_secs()).unwrap_or(i64::MAX);
        let kind = i64::from(event.kind.as_u16());
        let d_tag = replacement_key(event);

        let mut tx = self.immediate().await?;

        let exists: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM events WHERE community_id = ?1 AND id = ?2")
                .bind(community)
                .bind(&id)
                .fetch_optional(&mut *tx)
                .await?;
        if exists.is_some() {
            return Ok(InsertOutcome::Duplicate);
        }

        // NIP-09: an event its author deleted stays deleted.
        let address = d_tag.as_ref().map(|d| address_key(event.kind.as_u16(), d));
        let deleted: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM deletions WHERE community_id = ?1 AND pubkey = ?2 \
             AND (target = ?3 OR (target = ?4 AND deleted_until >= ?5)) LIMIT 1",
        )
        .bind(community)
        .bind(&pubkey)
        .bind(event.id.to_hex())
        .bind(address.as_deref().unwrap_or(""))
        .bind(created_at)
        .fetch_optional(&mut *tx)
        .await?;
        if deleted.is_some() {
            return Ok(InsertOutcome::Rejected(
                "blocked: this event was deleted by its author".into(),
            ));
        }

        // Replaceable and addressable: keep only the newest (ties: lowest id).
        if let Some(d) = &d_tag {
            let rows = sqlx::query(
                "SELECT id, created_at FROM events WHERE community_id = ?1 AND pubkey = ?2 AND kind = ?3 AND d_tag = ?4",
            )
            .bind(community)
            .bind(&pubkey)
            .bind(kind)
            .bind(d)
            .fetch_all(&mut *tx)
            .await?;
            for row in &rows {
                let old_id: Vec<u8> = row.get(0);
                let old_created: i64 = row.get(1);
                if old_created > created_at || (old_created == created_at && old_id < id) {
                    return Ok(InsertOutcome::Rejected(
                        "duplicate: a newer version of this replaceable event is stored".into(),
                    ));
                }
            }
            for row in rows {
                let old_id: Vec<u8> = row.get(0);
                sqlx::query("DELETE FROM events WHERE community_id = ?1 AND id = ?2")
                    .bind(community)
                    .bind(old_id)
                    .execute(&mut *tx)
                    .await?;
            }
        }

        sqlx::query(
            "INSERT INTO events (community_id, id, pubkey, created_at, kind, d_tag, expires_at, raw) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )
        .bind(community)
        .bind(&id)
        .bind(&pubkey)
        .bind(created_at)
        .bind(kind)
        .bind(&d_tag)
        .bind(expiration(event))
        .bind(raw)
        .execute(&mut *tx)
        .await?;
        for (name, value) in indexed_tags(event) {
            sqlx::query(
                "INSERT INTO event_tags (community_id, event_id, name, value, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .bind(community)
            .bind(&id)
            .bind(name)
            .bind(value)
            .bind(created_at)
            .execute(&mut *tx)
            .await?;
        }

        if event.kind.as_u16() == protocol::kinds::DELETION {
            let targets = deletion_targets(event);
            for target in targets.ids {
                sqlx::query(
                    "DELETE FROM events WHERE community_id = ?1 AND id = ?2 AND pubkey = ?3 AND kind <> ?4",
                )
                .bind(community)
                .bind(target.to_vec())
                .bind(&pubkey)
                .bind(i64::from(protocol::kinds::DELETION))
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO deletions (community_id, pubkey, target, deleted_until) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (community_id, pubkey, target) DO NOTHING",
                )
                .bind(community)
                .bind(&pubkey)
                .bind(hex::encode(target))
                .bind(created_at)
                .execute(&mut *tx)
                .await?;
            }
            for (k, d) in targets.addresses {
                sqlx::query(
                    "DELETE FROM events WHERE community_id = ?1 AND pubkey = ?2 AND kind = ?3 AND d_tag = ?4 AND created_at <= ?5",
                )
                .bind(community)
                .bind(&pubkey)
                .bind(i64::from(k))
                .bind(&d)
                .bind(created_at)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO deletions (community_id, pubkey, target, deleted_until) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (community_id, pubkey, target) DO UPDATE SET deleted_until = max(deleted_until, excluded.deleted_until)",
                )
                .bind(community)
                .bind(&pubkey)
                .bind(address_key(k, &d))
                .bind(created_at)
                .execute(&mut *tx)
                .await?;
            }
        }

        tx.commit().await?;
        Ok(InsertOutcome::Stored)
    }

    async fn query(
        &self,
        community: &str,
        filter: &Filter,
        limit: usize,
        scope: &ReadScope,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let (text, args) = build(sql::select_events(
            Dialect::Sqlite,
            community,
            filter,
            limit,
            scope,
        ))?;
        let rows = sqlx::query_with(sqlx::AssertSqlSafe(text), args)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|row| {
                Ok(StoredEvent {
                    raw: row.get(0),
                    created_at: row.get(1),
                    id: to_id(row.get(2))?,
                })
            })
            .collect()
    }

    async fn count(&self, community: &str, filters: &[Filter], scope: &ReadScope) -> Result<u64, StoreError> {
        let (text, args) = build(sql::count_events(Dialect::Sqlite, community, filters, scope))?;
        let n: i64 = sqlx::query_scalar_with(sqlx::AssertSqlSafe(text), args)
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn purge_expired(&self, now: u64) -> Result<u64, StoreError> {
        let mut tx = self.immediate().await?;
        let r = sqlx::query("DELETE FROM events WHERE expires_at IS NOT NULL AND expires_at <= ?1")
            .bind(i64::try_from(now).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(r.rows_affected())
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}
