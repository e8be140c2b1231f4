//! PostgreSQL backend: several relay processes on one database.
//!
//! - Events are partitioned by month of `created_at`; the relay creates
//!   partitions ahead of time (`ensure_partitions`), and anything else lands
//!   in the default partition.
//! - Writes by one author are serialised with a transaction-scoped advisory
//!   lock on (community, pubkey): every storage rule (duplicate, deletion,
//!   replacement) is about one author's events, so this is exactly the
//!   serialisation the rules need, across processes.
//! - Live fan-out between processes is `NOTIFY` sent inside the writing
//!   transaction (so it is delivered if and only if the event committed);
//!   each process `LISTEN`s once and ignores its own notifications.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use nostr::prelude::{Event, Filter};
use serde_json::json;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{Arguments, PgConnection, Row};
use tokio::sync::mpsc;

use super::sql::{self, value_hash, Bind, Dialect, Sql};
use super::{
    address_key, deletion_targets, expiration, indexed_tags, replacement_key, CommunityRecord, InsertOutcome,
    ReadScope, RemoteEvent, Store, StoreError, StoredEvent,
};
use crate::config::PostgresConfig;

/// NOTIFY channel for live events.
const FANOUT_CHANNEL: &str = "relay_events";
/// Largest NOTIFY payload we send inline (PostgreSQL's limit is 8000 bytes).
const MAX_INLINE_PAYLOAD_BYTES: usize = 7_000;
/// Advisory lock key serialising partition maintenance.
const PARTITION_LOCK_KEY: i64 = 0x7265_6c61_7970_6172; // "relaypar"

/// The PostgreSQL store.
pub struct PgStore {
    pool: PgPool,
    /// Identifies this process in NOTIFY payloads.
    origin: String,
    months_ahead: u32,
}

impl PgStore {
    /// Connects, migrates and creates partitions.
    pub async fn open(url: &str, cfg: &PostgresConfig) -> Result<Self, StoreError> {
        let opts = PgConnectOptions::from_str(url)?
            .options([("statement_timeout", format!("{}ms", cfg.statement_timeout_ms))])
            .application_name("relay");
        let pool = PgPoolOptions::new()
            .max_connections(cfg.pool_size)
            .acquire_timeout(Duration::from_millis(cfg.acquire_timeout_ms))
            .test_before_acquire(true)
            .connect_with(opts)
            .await?;
        {
            // Several processes may start at once: migrate under a lock.
            let mut conn = pool.acquire().await?;
            sqlx::query("SELECT pg_advisory_lock($1)")
                .bind(PARTITION_LOCK_KEY)
                .execute(&mut *conn)
                .await?;
            let migrated = sqlx::migrate!("../migrations/postgres").run(&mut *conn).await;
            sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(PARTITION_LOCK_KEY)
                .execute(&mut *conn)
                .await?;
            migrated?;
        }
        let store = Self {
            pool,
            origin: hex::encode(rand::random::<[u8; 8]>()),
            months_ahead: cfg.partition_months_ahead,
        };
        store.ensure_partitions(crate::state::unix_now()).await?;
        Ok(store)
    }

    /// Creates monthly partitions from the current month to `months_ahead`
    /// months ahead. A month whose rows already sit in the default partition
    /// is left there (moving rows would break foreign keys to them).
    pub async fn ensure_partitions(&self, now: u64) -> Result<u32, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(PARTITION_LOCK_KEY)
            .execute(&mut *tx)
            .await?;
        let mut created = 0;
        for (name, lo, hi) in month_ranges(now, self.months_ahead) {
            let exists: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = $1)")
                    .bind(&name)
                    .fetch_one(&mut *tx)
                    .await?;
            if exists {
                continue;
            }
            let in_default: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM events_default WHERE created_at >= $1 AND created_at < $2)",
            )
            .bind(lo)
            .bind(hi)
            .fetch_one(&mut *tx)
            .await?;
            if in_default {
                tracing::warn!(partition = %name, "rows for this month are already in the default partition; not creating it");
                continue;
            }
            let ddl = format!("CREATE TABLE {name} PARTITION OF events FOR VALUES FROM ({lo}) TO ({hi})");
            sqlx::query(sqlx::AssertSqlSafe(ddl)).execute(&mut *tx).await?;
            created += 1;
        }
        tx.commit().await?;
        Ok(created)
    }

    async fn notify(
        conn: &mut PgConnection,
        origin: &str,
        community: &str,
        raw: &str,
    ) -> Result<(), StoreError> {
        let inline = json!({"o": origin, "c": community, "r": raw}).to_string();
        let payload = if inline.len() <= MAX_INLINE_PAYLOAD_BYTES {
            inline
        } else {
            let seq: i64 = sqlx::query_scalar(
                "INSERT INTO fanout_spill (community_id, raw) VALUES ($1, $2) RETURNING seq",
            )
            .bind(community)
            .bind(raw)
            .fetch_one(&mut *conn)
            .await?;
            json!({"o": origin, "c": community, "s": seq}).to_string()
        };
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(FANOUT_CHANNEL)
            .bind(payload)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    async fn hosts_of(&self, id: &str) -> Result<Vec<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT host FROM community_hosts WHERE community_id = $1 ORDER BY host")
                .bind(id)
                .fetch_all(&self.pool)
                .await?,
        )
    }
}

/// `(name, lo, hi)` of the monthly partitions from `now`'s month on.
fn month_ranges(now: u64, months_ahead: u32) -> Vec<(String, i64, i64)> {
    let now = time::OffsetDateTime::from_unix_timestamp(i64::try_from(now).unwrap_or(0))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let (mut year, mut month) = (now.year(), now.month());
    let mut out = Vec::new();
    for _ in 0..=months_ahead {
        let (next_year, next_month) = if month == time::Month::December {
            (year + 1, time::Month::January)
        } else {
            (year, month.next())
        };
        let start = first_of_month(year, month);
        let end = first_of_month(next_year, next_month);
        out.push((format!("events_y{year:04}m{:02}", u8::from(month)), start, end));
        (year, month) = (next_year, next_month);
    }
    out
}

fn first_of_month(year: i32, month: time::Month) -> i64 {
    time::Date::from_calendar_date(year, month, 1)
        .map(|d| d.midnight().assume_utc().unix_timestamp())
        .unwrap_or(0)
}

fn arguments(binds: Vec<Bind>) -> Result<PgArguments, StoreError> {
    let mut args = PgArguments::default();
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

fn build(s: Sql) -> Result<(String, PgArguments), StoreError> {
    let args = arguments(s.binds)?;
    Ok((s.text, args))
}

fn to_id(bytes: Vec<u8>) -> Result<[u8; 32], StoreError> {
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| StoreError::Corrupt("event id is not 32 bytes".into()))
}

#[async_trait]
impl Store for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn community_for_host(&self, host: &str) -> Result<Option<CommunityRecord>, StoreError> {
        let bare = protocol::host::without_port(host);
        let row = sqlx::query(
            "SELECT c.id, c.relay_url, c.secret_key_hex FROM community_hosts h \
             JOIN communities c ON c.id = h.community_id \
             WHERE h.host IN ($1, $2) ORDER BY length(h.host) DESC LIMIT 1",
        )
        .bind(host)
        .bind(bare)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let id: String = row.get(0);
        let hosts = self.hosts_of(&id).await?;
        Ok(Some(CommunityRecord {
            id,
            relay_url: row.get(1),
            secret_key_hex: row.get(2),
            hosts,
        }))
    }

    async fn add_community(&self, c: &CommunityRecord) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO communities (id, relay_url, secret_key_hex) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING",
        )
        .bind(&c.id)
        .bind(&c.relay_url)
        .bind(&c.secret_key_hex)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!(
                "community {:?} already exists",
                c.id
            )));
        }
        for host in &c.hosts {
            let r = sqlx::query("INSERT INTO community_hosts (host, community_id) VALUES ($1, $2) ON CONFLICT (host) DO NOTHING")
                .bind(host)
                .bind(&c.id)
                .execute(&mut *tx)
                .await?;
            if r.rows_affected() == 0 {
                return Err(StoreError::Conflict(format!(
                    "host {host:?} is bound to another community"
                )));
            }
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
            let hosts = self.hosts_of(&id).await?;
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
        let kind = i32::from(event.kind.as_u16());
        let d_tag = replacement_key(event);

        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!("{community}:{}", event.pubkey.to_hex()))
            .execute(&mut *tx)
            .await?;

        let exists: Option<i32> = sqlx::query_scalar(
            "SELECT 1 FROM events WHERE community_id = $1 AND created_at = $2 AND id = $3",
        )
        .bind(community)
        .bind(created_at)
        .bind(&id)
        .fetch_optional(&mut *tx)
        .await?;
        if exists.is_some() {
            return Ok(InsertOutcome::Duplicate);
        }

        let address = d_tag.as_ref().map(|d| address_key(event.kind.as_u16(), d));
        let deleted: Option<i32> = sqlx::query_scalar(
            "SELECT 1 FROM deletions WHERE community_id = $1 AND pubkey = $2 \
             AND (target = $3 OR (target = $4 AND deleted_until >= $5)) LIMIT 1",
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

        if let Some(d) = &d_tag {
            let rows = sqlx::query(
                "SELECT id, created_at FROM events WHERE community_id = $1 AND pubkey = $2 AND kind = $3 AND d_tag = $4",
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
                let old_created: i64 = row.get(1);
                sqlx::query("DELETE FROM events WHERE community_id = $1 AND created_at = $2 AND id = $3")
                    .bind(community)
                    .bind(old_created)
                    .bind(old_id)
                    .execute(&mut *tx)
                    .await?;
            }
        }

        sqlx::query(
            "INSERT INTO events (community_id, created_at, id, pubkey, kind, d_tag, expires_at, raw) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(community)
        .bind(created_at)
        .bind(&id)
        .bind(&pubkey)
        .bind(kind)
        .bind(&d_tag)
        .bind(expiration(event))
        .bind(raw)
        .execute(&mut *tx)
        .await?;
        for (name, value) in indexed_tags(event) {
            sqlx::query(
                "INSERT INTO event_tags (community_id, event_created_at, event_id, name, value, value_hash) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
            )
            .bind(community)
            .bind(created_at)
            .bind(&id)
            .bind(&name)
            .bind(&value)
            .bind(value_hash(&value).to_vec())
            .execute(&mut *tx)
            .await?;
        }

        if event.kind.as_u16() == protocol::kinds::DELETION {
            let targets = deletion_targets(event);
            for target in targets.ids {
                sqlx::query(
                    "DELETE FROM events WHERE community_id = $1 AND id = $2 AND pubkey = $3 AND kind <> $4",
                )
                .bind(community)
                .bind(target.to_vec())
                .bind(&pubkey)
                .bind(i32::from(protocol::kinds::DELETION))
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO deletions (community_id, pubkey, target, deleted_until) VALUES ($1, $2, $3, $4) \
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
                    "DELETE FROM events WHERE community_id = $1 AND pubkey = $2 AND kind = $3 AND d_tag = $4 AND created_at <= $5",
                )
                .bind(community)
                .bind(&pubkey)
                .bind(i32::from(k))
                .bind(&d)
                .bind(created_at)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO deletions (community_id, pubkey, target, deleted_until) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (community_id, pubkey, target) DO UPDATE SET deleted_until = GREATEST(deletions.deleted_until, EXCLUDED.deleted_until)",
                )
                .bind(community)
                .bind(&pubkey)
                .bind(address_key(k, &d))
                .bind(created_at)
                .execute(&mut *tx)
                .await?;
            }
        }

        Self::notify(&mut tx, &self.origin, community, raw).await?;
        tx.commit().await?;
        Ok(InsertOutcome::Stored)
    }

    async fn publish_ephemeral(&self, community: &str, raw: &str) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await?;
        Self::notify(&mut conn, &self.origin, community, raw).await
    }

    async fn subscribe_remote(
        &self,
        capacity: usize,
    ) -> Result<Option<mpsc::Receiver<RemoteEvent>>, StoreError> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(FANOUT_CHANNEL).await?;
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let origin = self.origin.clone();
        let pool = self.pool.clone();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(100);
            loop {
                match listener.try_recv().await {
                    Ok(Some(n)) => {
                        backoff = Duration::from_millis(100);
                        let Some(remote) = decode_notification(&pool, &origin, n.payload()).await else {
                            continue;
                        };
                        if tx.send(remote).await.is_err() {
                            return; // the relay is shutting down
                        }
                    }
                    Ok(None) => tracing::warn!("fan-out listener lost its connection; reconnecting"),
                    Err(e) => {
                        if tx.is_closed() {
                            return;
                        }
                        tracing::warn!(error = %e, "fan-out listener cannot reconnect yet");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        });
        Ok(Some(rx))
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
            Dialect::Postgres,
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
        let (text, args) = build(sql::count_events(Dialect::Postgres, community, filters, scope))?;
        let n: i64 = sqlx::query_scalar_with(sqlx::AssertSqlSafe(text), args)
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn purge_expired(&self, now: u64) -> Result<u64, StoreError> {
        let now = i64::try_from(now).unwrap_or(i64::MAX);
        let r = sqlx::query("DELETE FROM events WHERE expires_at IS NOT NULL AND expires_at <= $1")
            .bind(now)
            .execute(&self.pool)
            .await?;
        sqlx::query("DELETE FROM fanout_spill WHERE created_at < $1")
            .bind(now - 60)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected())
    }

    async fn maintain(&self, now: u64) -> Result<(), StoreError> {
        self.ensure_partitions(now).await.map(|_| ())
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}

async fn decode_notification(pool: &PgPool, own_origin: &str, payload: &str) -> Option<RemoteEvent> {
    let v: serde_json::Value = serde_json::from_str(payload).ok()?;
    if v["o"].as_str() == Some(own_origin) {
        return None;
    }
    let community = v["c"].as_str()?.to_string();
    let raw = match (v["r"].as_str(), v["s"].as_i64()) {
        (Some(raw), _) => raw.to_string(),
        (None, Some(seq)) => sqlx::query_scalar("SELECT raw FROM fanout_spill WHERE seq = $1")
            .bind(seq)
            .fetch_optional(pool)
            .await
            .ok()??,
        _ => return None,
    };
    Some(RemoteEvent { community, raw })
}
