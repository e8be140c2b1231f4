//! PostgreSQL specifics: opening (with migrations under a lock), monthly
//! partitions made ahead of time, and live fan-out between relay processes.
//!
//! - Events are partitioned by month of `created_at`; anything outside the
//!   prepared months lands in the default partition.
//! - Live fan-out is `NOTIFY` sent inside the writing transaction (so it is
//!   delivered if and only if the event committed); each process `LISTEN`s on
//!   one connection and ignores its own notifications.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions};
use sqlx::Connection;
use tokio::sync::mpsc;

use crate::config::PostgresConfig;
use crate::persistence::db::{Tx, Q};
use crate::persistence::hosts::redacted;
use crate::persistence::pinned::{Pinned, GENERIC_PLANS};
use crate::persistence::primary;
use crate::persistence::standbys::Standbys;
use crate::persistence::OpenMode;
use crate::persistence::RemoteEvent;
use crate::persistence::StoreError;

/// Prepared statements kept per connection (see [`open`]).
const STATEMENT_CACHE: usize = 400;

/// NOTIFY channel for live events.
const FANOUT_CHANNEL: &str = "relay_events";
/// Largest NOTIFY payload sent inline (PostgreSQL's limit is 8000 bytes).
const MAX_INLINE_PAYLOAD_BYTES: usize = 7_000;
/// A pooled connection idle this long is pinged before it is handed out.
const PING_IDLE_AFTER: Duration = Duration::from_secs(1);
/// Advisory lock key serialising migrations and partition maintenance.
const SCHEMA_LOCK_KEY: i64 = 0x7265_6c61_7970_6172; // "relaypar"

/// Connects and migrates (several processes may start at once: under a
/// lock). Returns the main pool and the query pool (REQ and COUNT).
///
/// The query pool's connections keep one plan per statement
/// (`plan_cache_mode = force_generic_plan`). PostgreSQL's own choice,
/// after five executions, compares the cached plan's estimated cost with
/// the plans made for actual values, and with time partitions the cached
/// plan (which must cover every partition) always lost: each REQ was
/// planned again, 0.15-0.37 ms of CPU of a query's 0.5-0.9 ms in the
/// database on 1M events. The statements sent there are built so that a
/// cached plan is a good one (`sql::plan_depends_on_values`).
///
/// A URL naming several hosts (`persistence::hosts`) opens the pools on
/// the first host that answers, or with `target_session_attrs=read-write`
/// the first that accepts writes, and follows it (`persistence::primary`).
///
/// `read_urls` (`read_database_urls`, one host each) are the standbys
/// that may serve REQ and COUNT (`persistence::standbys`), with the query
/// pool's settings; their watcher runs until the main pool is closed.
///
/// `pinned` of `cfg.pool_size` connections are the writers' own
/// (`persistence::pinned`); the main pool has the rest.
pub async fn open(
    url: &str,
    read_urls: &[String],
    cfg: &PostgresConfig,
    pinned: u32,
    mode: OpenMode,
) -> Result<Opened, StoreError> {
    assert!(
        pinned < cfg.pool_size,
        "the configuration leaves the main pool a connection"
    );
    let hosts = super::hosts::parse(url).map_err(StoreError::Conflict)?;
    let options = hosts
        .urls
        .iter()
        .map(|u| {
            let main = main_options(u, cfg)?;
            let generic = main.clone().options([("plan_cache_mode", GENERIC_PLANS)]);
            Ok((main, generic))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let standbys = read_urls
        .iter()
        .map(|u| {
            let one = super::hosts::parse(u).map_err(StoreError::Conflict)?;
            if one.urls.len() != 1 {
                return Err(StoreError::Conflict(format!(
                    "read_database_urls: {} names several hosts; give each standby its own URL",
                    redacted(u)
                )));
            }
            let opts = main_options(u, cfg)?.options([("plan_cache_mode", GENERIC_PLANS)]);
            Ok((redacted(u), opts))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let chosen = primary::choose_host(&hosts).await?;
    let url = hosts.urls[chosen].clone();
    let url = url.as_str();
    let epoch = primary::Epoch::new();
    let (opts, generic) = options[chosen].clone();
    let pool = connect(pool_options(cfg.pool_size - pinned, cfg, &epoch), opts, url).await?;
    let queries = connect(pool_options(cfg.query_pool_size, cfg, &epoch), generic, url).await?;
    let settings = {
        let (cfg, epoch) = (cfg.clone(), epoch.clone());
        Box::new(move |size| pool_options(size, &cfg, &epoch))
    };
    let pinned = Arc::new(Pinned::new(settings, pinned as usize));
    if hosts.urls.len() > 1 {
        let following = primary::Following {
            hosts,
            options,
            current: chosen.into(),
            epoch,
        };
        let pools = primary::Pools {
            main: pool.clone(),
            queries: queries.clone(),
            pinned: pinned.clone(),
        };
        tokio::spawn(primary::watch(Arc::new(following), pools));
    }
    migrate(&pool, url, mode).await?;
    let standbys = (!standbys.is_empty()).then(|| {
        let never_moves = primary::Epoch::new();
        Standbys::open(
            standbys,
            || pool_options(cfg.query_pool_size, cfg, &never_moves),
            cfg,
        )
    });
    if let Some(s) = &standbys {
        tokio::spawn(s.clone().watch(pool.clone()));
    }
    Ok(Opened {
        main: pool,
        queries,
        standbys,
        pinned,
    })
}

/// The pools [`open`] made.
pub struct Opened {
    pub main: PgPool,
    pub queries: PgPool,
    pub standbys: Option<Arc<Standbys>>,
    pub pinned: Arc<Pinned>,
}

/// The main pool's options for the host of `url`.
fn main_options(url: &str, cfg: &PostgresConfig) -> Result<PgConnectOptions, StoreError> {
    Ok(PgConnectOptions::from_str(url)?
        .options([("statement_timeout", format!("{}ms", cfg.statement_timeout_ms))])
        .application_name("relay")
        // Prepared statements kept per connection. sqlx's 100 is about
        // what one connection of the main pool runs in rotation (the auth
        // records' insert alone has a text per batch size, 1 to 64): at
        // 100, a few statements more (the membership checks) made every
        // statement be prepared and planned again, twice as often, in the
        // delivery benchmark (pg_stat_statements: 138-147 plans a
        // statement where there had been 72-82).
        .statement_cache_capacity(STATEMENT_CACHE))
}

/// Checks the schema (`Existing`) or migrates it, under a lock: several
/// processes may start at once.
async fn migrate(pool: &PgPool, url: &str, mode: OpenMode) -> Result<(), StoreError> {
    let mut conn = pool.acquire().await?;
    if mode == OpenMode::Existing {
        let schema: bool = sqlx::query_scalar("SELECT to_regclass('communities') IS NOT NULL")
            .fetch_one(&mut *conn)
            .await?;
        if !schema {
            return Err(StoreError::Missing(format!(
                "database {} has no relay tables: `relay serve` creates them",
                redacted(url)
            )));
        }
    }
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(SCHEMA_LOCK_KEY)
        .execute(&mut *conn)
        .await?;
    let migrated = sqlx::migrate!("../migrations/postgres").run(&mut *conn).await;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(SCHEMA_LOCK_KEY)
        .execute(&mut *conn)
        .await?;
    migrated?;
    Ok(())
}

/// How long the one direct connection that explains an unreachable
/// server may take.
const EXPLAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A pool and its first connection, or why there is none: sqlx says only
/// "pool timed out" when the server cannot be reached, so one direct
/// connection is tried to say why (refused, unknown host, a password).
async fn connect(options: PgPoolOptions, opts: PgConnectOptions, url: &str) -> Result<PgPool, StoreError> {
    match options.connect_with(opts.clone()).await {
        Ok(pool) => Ok(pool),
        Err(sqlx::Error::PoolTimedOut) => {
            let why = match tokio::time::timeout(EXPLAIN_TIMEOUT, PgConnection::connect_with(&opts)).await {
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(_)) => "it answered only after the pool's acquire_timeout_ms".to_string(),
                Err(_) => format!("no answer within {EXPLAIN_TIMEOUT:?}"),
            };
            Err(StoreError::Unreachable(format!(
                "PostgreSQL at {}: {why}",
                redacted(url)
            )))
        }
        Err(e) => Err(e.into()),
    }
}

/// A pool's options; a connection opened before the pools last moved to
/// another host (`epoch`) is dropped when next taken.
fn pool_options(size: u32, cfg: &PostgresConfig, epoch: &Arc<primary::Epoch>) -> PgPoolOptions {
    let epoch = epoch.clone();
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_millis(cfg.acquire_timeout_ms))
        // A connection idle for a while is pinged before use, so that one
        // broken by a server restart is replaced rather than failing a
        // request; one in steady use is not (a ping per acquire was a
        // round trip more for every transaction and read).
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            let before_move = epoch.predates_move(meta.age);
            Box::pin(async move {
                if before_move {
                    return Ok(false);
                }
                if meta.idle_for >= PING_IDLE_AFTER {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
}

/// Creates monthly partitions from `now`'s month to `months_ahead` months
/// ahead. A month whose rows already sit in the default partition is left
/// there (moving rows would break foreign keys to them). Returns how many
/// partitions were created.
pub async fn ensure_partitions(pool: &PgPool, now: u64, months_ahead: u32) -> Result<u32, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(SCHEMA_LOCK_KEY)
        .execute(&mut *tx)
        .await?;
    let mut created = 0;
    for (name, lo, hi) in month_ranges(now, months_ahead) {
        let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = $1)")
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

/// Rows a table must have changed since its statistics were gathered
/// before [`refresh_statistics`] gathers them again, and how many times
/// the rows the statistics counted.
const STATS_MIN_CHANGED_ROWS: i64 = 500;
const STATS_GROWTH_FACTOR: i64 = 2;
/// Most tables one [`refresh_statistics`] analyzes.
const STATS_MAX_TABLES: i64 = 8;

/// Gathers the statistics (`ANALYZE`) of the relay's tables that changed
/// by more than [`STATS_GROWTH_FACTOR`] times the rows their statistics
/// counted (at least [`STATS_MIN_CHANGED_ROWS`]): a young table that grew
/// from nothing. Autovacuum does this within its nap (60 s), and until
/// then each connection keeps the plans it made while the table was
/// empty, for which every index beginning with `community_id` is as good
/// as the key: a lookup by key walked every run, every delivery of the
/// community (800-2,100 blocks a call in the fairness benchmark's flood).
/// The analysis makes those plans be made again. A grown table is
/// analyzed again only after changing twice its size (autovacuum, at 10%,
/// comes first), so this acts in a database's first minutes. Returns the
/// tables analyzed; `SKIP_LOCKED`, so that relay processes sharing the
/// database do not wait for each other.
pub async fn refresh_statistics(pool: &PgPool) -> Result<Vec<String>, StoreError> {
    let stale: Vec<String> = sqlx::query_scalar(
        "SELECT s.relname::text FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid \
         WHERE s.schemaname = current_schema() AND s.n_mod_since_analyze >= $1 \
         AND s.n_mod_since_analyze > $2 * GREATEST(c.reltuples, 0) \
         ORDER BY s.n_mod_since_analyze DESC LIMIT $3",
    )
    .bind(STATS_MIN_CHANGED_ROWS)
    .bind(STATS_GROWTH_FACTOR)
    .bind(STATS_MAX_TABLES)
    .fetch_all(pool)
    .await?;
    for table in &stale {
        let quoted = table.replace('"', "\"\"");
        let sql = format!("ANALYZE (SKIP_LOCKED) \"{quoted}\"");
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await?;
    }
    Ok(stale)
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

/// Announces events (community, JSON) to the other relay processes, inside
/// `tx` (delivered on commit, dropped on rollback).
pub async fn notify(tx: &mut Tx<'_>, origin: &str, events: &[(&str, &str)]) -> Result<(), StoreError> {
    let mut payloads = Vec::with_capacity(events.len());
    for &(community, raw) in events {
        let inline = json!({"o": origin, "c": community, "r": raw}).to_string();
        payloads.push(if inline.len() <= MAX_INLINE_PAYLOAD_BYTES {
            inline
        } else {
            let row = tx
                .one(
                    Q::new("INSERT INTO fanout_spill (community_id, raw) VALUES ($1, $2) RETURNING seq")
                        .bind(community)
                        .bind(raw),
                )
                .await?
                .ok_or_else(|| StoreError::Corrupt("spill insert returned nothing".into()))?;
            json!({"o": origin, "c": community, "s": row.int(0)?}).to_string()
        });
    }
    if payloads.is_empty() {
        return Ok(());
    }
    // One statement for all of them: a step's wakes and a batch's replies
    // were a round trip each. `unnest` returns the array's elements in
    // order, so the notifications are queued (and delivered) in the order
    // given; one statement text whatever their number.
    let q = Q::new("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p")
        .bind(FANOUT_CHANNEL)
        .bind(payloads);
    tx.exec(q).await?;
    Ok(())
}

/// Starts listening for other processes' events.
pub async fn listen(
    pool: &PgPool,
    origin: String,
    capacity: usize,
) -> Result<mpsc::Receiver<RemoteEvent>, StoreError> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(FANOUT_CHANNEL).await?;
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let pool = pool.clone();
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(100);
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) => {
                    backoff = Duration::from_millis(100);
                    let Some(remote) = decode(&pool, &origin, n.payload()).await else {
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
    Ok(rx)
}

async fn decode(pool: &PgPool, own_origin: &str, payload: &str) -> Option<RemoteEvent> {
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
