//! Embedded SQLite: opening the file.
//!
//! WAL journal, a busy timeout, foreign keys on; every write transaction is
//! `BEGIN IMMEDIATE` (see [`super::db::Pool::begin`]), so a writer takes the
//! database lock before it reads what it decides on.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::StoreError;
use crate::config::SqliteConfig;

/// Opens (creating if missing) the database file and migrates it.
pub async fn open(url: &str, cfg: &SqliteConfig) -> Result<SqlitePool, StoreError> {
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
    Ok(pool)
}
