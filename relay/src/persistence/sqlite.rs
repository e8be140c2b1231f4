//! Embedded SQLite: opening the file, and checkpointing it.
//!
//! WAL journal, a busy timeout, foreign keys on; every write transaction is
//! `BEGIN IMMEDIATE` (see [`super::db::Pool::begin`]), so a writer takes the
//! database lock before it reads what it decides on.
//!
//! Checkpoints (copying the WAL back into the database file, with its
//! fsyncs) are taken off the write path: SQLite's automatic checkpoint runs
//! inside the commit that crosses the threshold, which stalled the batch
//! writer for tens of milliseconds each time. A background task runs a
//! PASSIVE checkpoint every `checkpoint_interval_ms` (it never blocks
//! readers or the writer); the automatic one stays as a backstop at
//! `wal_autocheckpoint_pages`, far above what the task leaves behind.
//! Both are sized for sustained writes: a PASSIVE checkpoint never resets
//! the WAL while the writer keeps appending, so the WAL grows until the
//! backstop, and each time the backstop fires the writer copies whatever
//! the task has not and fsyncs, while every write waits for it. With
//! a checkpoint each second and a backstop at 20,000 pages the writer did
//! that several times a second (27% of its time in fsync, the full ingest
//! benchmark at 8-9k events/s from 16 connections); every 100 ms and at
//! 100,000 pages, 11-12k.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::config::SqliteConfig;
use crate::persistence::lite::Writer;
use crate::persistence::readers::Readers;
use crate::persistence::OpenMode;
use crate::persistence::StoreError;

/// The connections of an open SQLite database.
pub struct Opened {
    /// sqlx's readers (`query_only`), for the relay's own reads.
    pub read: SqlitePool,
    /// The one writer connection.
    pub writer: Writer,
    /// The REQ, COUNT and NIP-77 readers (`pool_size` threads).
    pub readers: Arc<Readers>,
}

/// Opens (with [`OpenMode::Create`], creating if missing) the database
/// file and migrates it (through a sqlx connection, closed after).
pub async fn open(url: &str, cfg: &SqliteConfig, mode: OpenMode) -> Result<Opened, StoreError> {
    let synchronous = match cfg.synchronous.as_str() {
        "full" => SqliteSynchronous::Full,
        _ => SqliteSynchronous::Normal,
    };
    let opts = SqliteConnectOptions::from_str(url)?;
    let path = opts.get_filename().to_path_buf();
    check_path(&path, mode)?;
    without_memory_statistics();
    let opts = opts
        .create_if_missing(mode == OpenMode::Create)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(synchronous)
        .busy_timeout(Duration::from_millis(cfg.busy_timeout_ms))
        .foreign_keys(true)
        // Reads through a shared memory map instead of copying every page
        // into each connection's cache.
        .pragma("mmap_size", cfg.mmap_size_bytes.to_string())
        // Negative: a size in KiB (per connection).
        .pragma("cache_size", format!("-{}", cfg.cache_size_kib))
        .pragma("wal_autocheckpoint", cfg.wal_autocheckpoint_pages.to_string())
        .pragma("temp_store", "memory");
    // No ping before handing out a connection (sqlx's default): an
    // in-process SQLite connection cannot go stale, and the ping was a
    // round trip to the connection's worker thread on every acquire.
    let migrator = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(opts.clone())
        .await?;
    sqlx::migrate!("../migrations/sqlite").run(&migrator).await?;
    migrator.close().await;
    let writer = Writer::open(&path, cfg)?;
    // Readers refuse writes: every write must go through the writer.
    let read = SqlitePoolOptions::new()
        .max_connections(cfg.pool_size)
        .test_before_acquire(false)
        .connect_with(opts.pragma("query_only", "true"))
        .await?;
    let readers = Arc::new(Readers::start(&path, cfg)?);
    Ok(Opened {
        read,
        writer,
        readers,
    })
}

/// Turns SQLite's memory statistics off, once per process, before its
/// first connection. With them on (the bundled library's default), every
/// allocation and free inside SQLite takes one process-wide mutex: under
/// the query benchmark the readers' worker threads spent more CPU waiting
/// on it (`__lll_lock_wait` under `sqlite3Malloc` and `sqlite3_free`, one
/// per column value of every row) than SQLite spent reading. The relay
/// never reads the statistics (`sqlite3_memory_used` and the soft heap
/// limit need them; neither is used).
fn without_memory_statistics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: sqlite3_config must not run while another thread uses
        // SQLite. Every connection of the relay is opened here, after this
        // call returns (`call_once` holds other openers until it has). If
        // SQLite was already initialised in this process (another user of
        // the library opened a database first), the call changes nothing
        // and returns SQLITE_MISUSE, which is harmless.
        let rc = unsafe {
            libsqlite3_sys::sqlite3_config(libsqlite3_sys::SQLITE_CONFIG_MEMSTATUS, 0 as std::ffi::c_int)
        };
        if rc != libsqlite3_sys::SQLITE_OK {
            tracing::debug!(
                rc,
                "SQLite was initialised before the relay: memory statistics left on"
            );
        }
    });
}

/// Fails at once, naming the file, where SQLite would fail later or
/// vaguely: a database to read that is not there, or one to create in a
/// directory that is not there (sqlx's "unable to open database file",
/// retried for the whole start-up wait, named neither).
fn check_path(path: &Path, mode: OpenMode) -> Result<(), StoreError> {
    if path == Path::new(":memory:") {
        return Err(StoreError::Missing(
            "an in-memory SQLite database cannot serve the relay: its writer and readers are \
             separate connections, and each would see a database of its own; name a file"
                .into(),
        ));
    }
    let shown = path.display();
    match mode {
        OpenMode::Existing if !path.is_file() => Err(StoreError::Missing(format!(
            "no relay database at {shown}: `relay serve` creates it; run this command where the relay \
             runs, or name the database with --database-url"
        ))),
        OpenMode::Create => match path.parent().filter(|d| !d.as_os_str().is_empty()) {
            Some(dir) if !dir.is_dir() => Err(StoreError::Missing(format!(
                "cannot create the SQLite database {shown}: directory {} does not exist",
                dir.display()
            ))),
            _ => Ok(()),
        },
        OpenMode::Existing => Ok(()),
    }
}

/// Runs a PASSIVE checkpoint every `every`, forever (the caller aborts it
/// at shutdown). A failure is logged and retried at the next tick: the WAL
/// only grows meanwhile, and the automatic checkpoint bounds it.
pub async fn checkpointer(pool: SqlitePool, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&pool).await {
            Ok(_) => {}
            Err(sqlx::Error::PoolClosed) => return,
            Err(e) => tracing::warn!(error = %e, "WAL checkpoint failed"),
        }
    }
}
