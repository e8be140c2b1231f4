//! Statements on rusqlite connections, run on the caller's thread: the
//! binding of [`Q`]'s values, rows as neutral [`Row`]s, and the one SQLite
//! writer connection with its transactions.
//!
//! Why the writer is not a sqlx connection: sqlx-sqlite runs a connection
//! on a worker thread of its own, so every statement of a transaction is a
//! hand-off to that thread and a wake back, and every row one more.
//! perf on the delivery benchmark: the context switches of those
//! hand-offs were a quarter of the relay's CPU, more than SQLite's own
//! work. The callers that write (the two store writers and the workflow
//! engine, each on a thread of its own, `dedicated.rs`; now and then an
//! HTTP handler) now run each statement themselves, microseconds each.
//!
//! The connection is behind an async mutex: whoever holds it (a
//! transaction, or the call writer across a run of batches) is the one
//! writer, as the one-connection sqlx pool was before.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags, Statement};
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::config::SqliteConfig;
use crate::persistence::page::{Bounds, Collector, Wants};
use crate::persistence::row::{Names, Row, Val};
use crate::persistence::sql::{Bind, Q};
use crate::persistence::StoreError;

/// Prepared statements the writer keeps (every statement the store writes
/// with; their texts vary with the number of rows of a multi-row insert).
const WRITER_STATEMENTS: usize = 512;

pub(crate) fn error(e: rusqlite::Error) -> StoreError {
    StoreError::Sqlite(e.to_string())
}

/// Binds `binds` to `stmt`'s parameters as sqlx-sqlite did, which the
/// store's statements are written for: `$N` (or `?N`) is the N-th value,
/// wherever and however often it appears (SQLite numbers named parameters
/// by first appearance, not by their name); a bare `?` takes the value
/// after the one the previous bare `?` took.
pub(crate) fn bind_all(stmt: &mut Statement<'_>, binds: &[Bind]) -> Result<(), StoreError> {
    let mut bare = 0usize;
    for at in 1..=stmt.parameter_count() {
        let n = match stmt.parameter_name(at) {
            None => {
                bare += 1;
                bare
            }
            Some(name) => name
                .strip_prefix('$')
                .or_else(|| name.strip_prefix('?'))
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| StoreError::Corrupt(format!("bind: unsupported parameter {name}")))?,
        };
        let b = n
            .checked_sub(1)
            .and_then(|i| binds.get(i))
            .ok_or_else(|| StoreError::Corrupt(format!("bind: no value for parameter {n}")))?;
        let r = match b {
            Bind::Int(v) => stmt.raw_bind_parameter(at, v),
            Bind::OptInt(v) => stmt.raw_bind_parameter(at, v),
            Bind::Text(v) => stmt.raw_bind_parameter(at, v),
            Bind::OptText(v) => stmt.raw_bind_parameter(at, v),
            Bind::Blob(v) => stmt.raw_bind_parameter(at, v),
            Bind::OptBlob(v) => stmt.raw_bind_parameter(at, v),
            Bind::Bool(v) => stmt.raw_bind_parameter(at, v),
            Bind::TextArray(_) | Bind::IntArray(_) | Bind::BlobArray(_) => {
                return Err(StoreError::Corrupt("bind: SQLite has no array parameters".into()))
            }
        };
        r.map_err(|e| StoreError::Corrupt(format!("bind: {e}")))?;
    }
    Ok(())
}

/// The column names of `stmt`'s result set.
pub(crate) fn names_of(stmt: &Statement<'_>) -> Names {
    stmt.column_names()
        .into_iter()
        .map(Box::from)
        .collect::<Arc<[_]>>()
}

/// `r` as a neutral row. SQLite's own types: booleans are integers (the
/// row's readers take either).
pub(crate) fn neutral(r: &rusqlite::Row<'_>, names: &Names) -> Result<Row, StoreError> {
    let mut vals = Vec::with_capacity(names.len());
    for i in 0..names.len() {
        vals.push(match r.get_ref(i).map_err(error)? {
            ValueRef::Null => Val::Null,
            ValueRef::Integer(v) => Val::Int(v),
            ValueRef::Text(t) => Val::Text(
                std::str::from_utf8(t)
                    .map_err(|_| StoreError::Corrupt(format!("column {i}: text is not UTF-8")))?
                    .to_owned(),
            ),
            ValueRef::Blob(b) => Val::Blob(b.to_vec()),
            ValueRef::Real(_) => return Err(StoreError::Corrupt(format!("column {i}: unexpected real"))),
        });
    }
    Ok(Row::of(names.clone(), vals))
}

/// The rows of `q` on `conn` in order within `bounds`; also whether the
/// statement had no more rows. One row past the page is read to tell. A statement that writes runs to its end either way: SQLite
/// completes a `RETURNING` statement's changes at its first step.
pub(crate) fn page(conn: &Connection, q: &Q, bounds: Bounds) -> Result<(Vec<Row>, bool), StoreError> {
    let mut stmt = conn.prepare_cached(&q.sql).map_err(error)?;
    bind_all(&mut stmt, &q.binds)?;
    let names = names_of(&stmt);
    let mut cursor = stmt.raw_query();
    let mut page = Collector::new(bounds);
    while let Some(r) = cursor.next().map_err(error)? {
        if page.is_full() || page.offer(neutral(r, &names)?)? == Wants::Nothing {
            return Ok(page.finish(false));
        }
    }
    Ok(page.finish(true))
}

/// Runs `q` to its end; the rows it changed.
fn execute(conn: &Connection, q: &Q) -> Result<u64, StoreError> {
    let mut stmt = conn.prepare_cached(&q.sql).map_err(error)?;
    bind_all(&mut stmt, &q.binds)?;
    let mut rows = stmt.raw_query();
    while rows.next().map_err(error)?.is_some() {}
    drop(rows);
    Ok(conn.changes())
}

/// What a connection may do: the writer's, or a reader's (opened
/// read-only, so a write sent to it fails instead of bypassing the writer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Write,
    Read,
}

/// A connection to the database file at `path` (which exists, with its
/// journal mode set to WAL by the sqlx connection that migrated it), with
/// the store's settings: the busy timeout, the memory map and page cache,
/// `synchronous`, foreign keys, the checkpoint backstop, and room for
/// `statements` prepared statements.
pub(crate) fn connect(
    path: &Path,
    cfg: &SqliteConfig,
    access: Access,
    statements: usize,
) -> Result<Connection, StoreError> {
    let flags = match access {
        Access::Write => OpenFlags::SQLITE_OPEN_READ_WRITE,
        Access::Read => OpenFlags::SQLITE_OPEN_READ_ONLY,
    } | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(error)?;
    conn.busy_timeout(Duration::from_millis(cfg.busy_timeout_ms))
        .map_err(error)?;
    let synchronous = if cfg.synchronous == "full" {
        "FULL"
    } else {
        "NORMAL"
    };
    let settings = format!(
        "PRAGMA synchronous = {synchronous}; PRAGMA foreign_keys = ON; PRAGMA mmap_size = {}; \
         PRAGMA cache_size = -{}; PRAGMA wal_autocheckpoint = {}; PRAGMA temp_store = MEMORY;",
        cfg.mmap_size_bytes, cfg.cache_size_kib, cfg.wal_autocheckpoint_pages
    );
    conn.execute_batch(&settings).map_err(error)?;
    // Plans that do not depend on bound values. Without it SQLite marks a
    // cached statement to be prepared again on its next binding whenever
    // its plan looked at a parameter's value: a bound `LIMIT`, a parameter
    // compared with a partial index's condition (`trigger = $3` against
    // `WHERE trigger = 'schedule'`). In the delivery benchmark a third of
    // the readers' CPU went to preparing the engine's due-run statements
    // again on every pass. No statement here needs a value-dependent plan:
    // every partial index's condition is a literal in the statements that
    // use it, and REQs write their `LIMIT` in the SQL.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(error)?;
    conn.set_prepared_statement_cache_capacity(statements);
    Ok(conn)
}

/// The one writer connection of a SQLite database.
#[derive(Clone, Debug)]
pub struct Writer {
    conn: Arc<Mutex<Connection>>,
}

/// The writer connection, held (see [`Writer::hold`]).
pub struct Held(OwnedMutexGuard<Connection>);

impl Writer {
    /// Opens the writer connection of the database file at `path`.
    pub fn open(path: &Path, cfg: &SqliteConfig) -> Result<Self, StoreError> {
        let conn = connect(path, cfg, Access::Write, WRITER_STATEMENTS)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Waits for the connection and keeps it until the [`Held`] is dropped.
    pub async fn hold(&self) -> Held {
        Held(self.conn.clone().lock_owned().await)
    }

    /// A write transaction (`BEGIN IMMEDIATE`) on the connection, held
    /// until it ends.
    pub async fn begin(&self) -> Result<WriteTx<'static>, StoreError> {
        WriteTx::begin(Guard::Owned(self.hold().await.0))
    }

    /// One statement in a transaction of its own (autocommit).
    pub async fn exec(&self, q: &Q) -> Result<u64, StoreError> {
        let held = self.hold().await;
        execute(&held.0, q)
    }
}

impl Held {
    /// A write transaction on the held connection.
    pub fn begin(&mut self) -> Result<WriteTx<'_>, StoreError> {
        WriteTx::begin(Guard::Borrowed(&mut self.0))
    }
}

enum Guard<'c> {
    Owned(OwnedMutexGuard<Connection>),
    Borrowed(&'c mut Connection),
}

impl Guard<'_> {
    fn conn(&self) -> &Connection {
        match self {
            Guard::Owned(g) => g,
            Guard::Borrowed(c) => c,
        }
    }
}

/// An open write transaction; rolled back when dropped uncommitted (an
/// error, or the task that held it aborted).
pub struct WriteTx<'c> {
    guard: Guard<'c>,
    open: bool,
    /// Statements to run, once each, just before `COMMIT`
    /// ([`WriteTx::before_commit`]); bounded by the distinct ones a
    /// transaction registers.
    before_commit: Vec<&'static str>,
}

impl WriteTx<'_> {
    fn begin(guard: Guard<'_>) -> Result<WriteTx<'_>, StoreError> {
        guard.conn().execute_batch("BEGIN IMMEDIATE").map_err(error)?;
        Ok(WriteTx {
            guard,
            open: true,
            before_commit: Vec::new(),
        })
    }

    /// Runs `sql` (statements without parameters) once, just before this
    /// transaction commits, however often it is registered. A caller
    /// whose savepoint is later rolled back leaves it registered: what it
    /// runs must then find nothing to do.
    pub fn before_commit(&mut self, sql: &'static str) {
        if !self.before_commit.contains(&sql) {
            self.before_commit.push(sql);
        }
    }

    pub fn exec(&mut self, q: &Q) -> Result<u64, StoreError> {
        execute(self.guard.conn(), q)
    }

    pub fn one(&mut self, q: &Q) -> Result<Option<Row>, StoreError> {
        Ok(page(self.guard.conn(), q, Bounds::first_rows(1))?
            .0
            .into_iter()
            .next())
    }

    pub fn all(&mut self, q: &Q) -> Result<Vec<Row>, StoreError> {
        Ok(page(self.guard.conn(), q, Bounds::ALL)?.0)
    }

    pub fn commit(mut self) -> Result<(), StoreError> {
        let conn = self.guard.conn();
        for sql in &self.before_commit {
            // An error leaves the transaction open: dropping `self` rolls
            // it back.
            conn.execute_batch(sql).map_err(error)?;
        }
        match conn.execute_batch("COMMIT") {
            Ok(()) => {
                self.open = false;
                Ok(())
            }
            // Dropping `self` rolls back whatever is left open.
            Err(e) => Err(error(e)),
        }
    }
}

impl Drop for WriteTx<'_> {
    fn drop(&mut self) {
        let conn = self.guard.conn();
        if self.open && !conn.is_autocommit() {
            if let Err(e) = conn.execute_batch("ROLLBACK") {
                tracing::error!(error = %e, "rolling back a SQLite write transaction failed");
            }
        }
    }
}
